"""The TFDS metadata files a commit publishes beside ``manifest.json``.

``stage_tfds_files`` writes ``codec.tfds_metadata.tfds_metadata(manifest)`` (the
manifest as published: its JSON read back) into the run's temporary folder and
returns the moves the commit makes, with what its journal records of each (size,
SHA-256), as ``label_map.pbtxt`` is published (``annotated_output.stage_label_map``):
moved after the shards, journalled, ownership-checked (``transforms.io.commit.publish``).
What proves such a file this product's is in ``transforms.io.ownership``
(``tfds_digests``). ``tfds_problems`` is ``verify``'s check of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from beam_tfrecords.schemas.manifest import MANIFEST_NAME
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_metadata
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.ownership import Claim, file_claim

__all__ = ["stage_tfds_files", "tfds_problems"]


def stage_tfds_files(output: str, temp_dir: str, manifest: Mapping
                     ) -> list[tuple[str, str, Claim]]:
    """Writes the TFDS metadata of ``manifest`` into ``temp_dir`` (a file already
    holding its bytes, a retry's, is not written again); returns ``(staged path, final
    path, claim)`` of each, in name order."""
    moves = []
    for name, data in sorted(tfds_metadata(manifest).items()):
        staged, final = files.join(temp_dir, name), files.join(output, name)
        if files.read_bytes_if_exists(staged) != data:
            files.write_bytes(staged, data)
        moves.append((staged, final, file_claim(name, data)))
    return moves


def tfds_problems(folder: str, manifest: Mapping) -> list[tuple[str, str]]:
    """What ``verify`` says of the TFDS metadata of the dataset in ``folder``:
    ``(path, why)`` for each file ``tfds_metadata(manifest)`` gives that is missing or
    holds other bytes (recomputed and compared), ``[]`` when all hold. A folder with
    none of them (a dataset written before they were) is not checked."""
    expected = tfds_metadata(manifest)
    found = {name: files.read_bytes_if_exists(files.join(folder, name)) for name in expected}
    if all(data is None for data in found.values()):
        return []
    problems = []
    for name, data in sorted(found.items()):
        path = files.join(folder, name)
        if data is None:
            problems.append((path, f"TFDS metadata file missing (the others are there; convert "
                                   f"writes it from {MANIFEST_NAME})"))
        elif data != expected[name]:
            problems.append((path, f"TFDS metadata differs from what {MANIFEST_NAME} gives "
                                   f"({len(data)} bytes, expected {len(expected[name])}; recomputed from it)"))
    return problems
