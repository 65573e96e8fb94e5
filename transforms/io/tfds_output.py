"""The TFDS metadata files a commit publishes beside ``manifest.json``.

``stage_tfds_files`` writes ``codec.tfds_metadata.tfds_metadata(manifest)`` (the
manifest as published: its JSON read back) into the run's temporary folder and
returns the moves the commit makes, with what its journal records of each (size,
SHA-256), as ``label_map.pbtxt`` is published (``annotated_output.stage_label_map``):
moved after the shards, journalled, ownership-checked (``transforms.io.commit.publish``).
What proves such a file this product's is in ``transforms.io.ownership``
(``tfds_digests``). ``with_tfds_entry`` records their names in the manifest;
``tfds_problems`` is ``verify``'s check of them.
"""

from __future__ import annotations

from collections.abc import Mapping

from beam_tfrecords.schemas.manifest import MANIFEST_NAME, shown_value
from beam_tfrecords.transforms.codec.tfds_metadata import is_tfds_file, tfds_entry, tfds_metadata
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.ownership import Claim, file_claim

__all__ = ["stage_tfds_files", "tfds_problems", "with_tfds_entry"]


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


def with_tfds_entry(manifest: dict) -> dict:
    """``manifest`` with its ``tfds`` entry (``codec.tfds_metadata.tfds_entry``): the names
    of the TFDS files the commit publishes beside it, or why there are none."""
    return {**manifest, "tfds": tfds_entry(manifest)}


def tfds_problems(folder: str, manifest: Mapping) -> list[tuple[str, str]]:
    """What ``verify`` says of the TFDS metadata of the dataset in ``folder``:
    ``(path, why)`` for each file ``tfds_metadata(manifest)`` gives that is missing or
    holds other bytes (recomputed and compared), ``[]`` when all hold. A manifest with a
    ``tfds`` entry (this version's) is held to it: every file it names must be there,
    and no other TFDS-named file (``is_tfds_file``: TFDS would read it). One without
    (a dataset written before it was recorded) is checked for the files it has."""
    expected = tfds_metadata(manifest)
    found = {name: files.read_bytes_if_exists(files.join(folder, name)) for name in expected}
    entry = manifest.get("tfds")
    if not isinstance(entry, Mapping):
        if all(data is None for data in found.values()):
            return []
        problems, missing = [], "the others are there; convert writes it from " + MANIFEST_NAME
    else:
        problems, missing = _entry_problems(folder, entry, expected), f"{MANIFEST_NAME} lists it in tfds.files"
    for name, data in sorted(found.items()):
        path = files.join(folder, name)
        if data is None:
            problems.append((path, f"TFDS metadata file missing ({missing})"))
        elif data != expected[name]:
            problems.append((path, f"TFDS metadata differs from what {MANIFEST_NAME} gives "
                                   f"({len(data)} bytes, expected {len(expected[name])}; recomputed from it)"))
    return problems


def _entry_problems(folder: str, entry: Mapping, expected: Mapping) -> list[tuple[str, str]]:
    """The manifest's ``tfds`` entry against what it implies, and the TFDS-named files in
    ``folder`` it does not imply."""
    listed = sorted(entry.get("files") or []) if entry.get("written") else []
    problems = []
    if listed != sorted(expected):
        problems.append((files.join(folder, MANIFEST_NAME),
                         f"tfds.files is {shown_value(listed)}; its splits and features give "
                         f"{shown_value(sorted(expected))}"))
    said = (f"its tfds.files: {', '.join(listed)}" if entry.get("written")
            else f"no TFDS metadata was written: {shown_value(entry.get('why'))}")
    for path, _ in files.list_files(files.join(folder, "*")):
        name = path.rsplit("/", 1)[-1]
        if is_tfds_file(name) and name not in expected and path == files.join(folder, name):
            problems.append((path, f"TFDS metadata file that {MANIFEST_NAME} does not imply ({said}); "
                                   f"TFDS would read it: remove it"))
    return sorted(problems)
