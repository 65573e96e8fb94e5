"""Dead letters: one JSON line per bad input, in ``OUT/dead_letter/<name>.jsonl``.

``<name>`` is made from the input (a table file's name, a split and shard): it is
made safe first (``safe_name``), so a file name never holds a glob character, a
path separator or a control character.

A run writes its dead letters in its temporary folder
(``tmp-<run>/dead_letter/<name>.jsonl``, ``write_dead_letters``), never at their
final names: the published dataset's dead letters stay as they are until a commit
replaces the dataset. A commit moves them to ``OUT/dead_letter/`` with the shards,
journalled like them (``staged_moves``; see ``transforms.io.commit``). A run that
publishes nothing puts its dead letters where the user can read them
(``keep_failed_letters``): at their final names, each recorded in the output's
journal first (``transforms.io.ownership``) so that the next run can tell it from a
user's file and remove it; under another name (``<name>.run-<run id>.jsonl``) where
the published manifest lists a file of the same name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence

from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME
from beam_tfrecords.schemas.report import RunReport
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.gcs import is_gcs, list_objects
from beam_tfrecords.transforms.io.ownership import Claim, file_claim, listed_paths, write_atomic, write_owned

__all__ = ["failed_run_letters", "keep_failed_letters", "safe_name", "staged_letters", "staged_moves",
           "write_dead_letters"]

# Letters and digits (any script), '_', '-' and '.' are kept; everything else is replaced.
_UNSAFE = re.compile(r"[^\w.-]")
_MAX_CHARS = 120


def safe_name(name: str) -> str:
    """``name`` as a file name: letters and digits (any script), '_', '-' and '.'
    are kept; anything else ('[', '*', '/', spaces, control characters, ...)
    becomes '_' (a leading '.' is dropped), and then the first 8 hex digits of the
    name's SHA-256 are added, so that two names that differ only there stay two
    files (``a[1]-00000`` -> ``a_1_-00000-460ac966``). A name that is safe
    already (and at most 120 characters) stays as it is."""
    safe = _UNSAFE.sub("_", name).lstrip(".")
    if safe == name and len(name) <= _MAX_CHARS:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{safe[:_MAX_CHARS]}-{digest}"


def write_dead_letters(temp_dir: str, name: str, letters: Sequence[DeadLetter]) -> str:
    """Writes ``letters`` to ``<temp_dir>/dead_letter/<safe_name(name)>.jsonl``, in the
    run's temporary folder (``ShardTarget.temp_dir``), whole (``write_atomic``).

    Returns:
      The file's path relative to its folder, which is also where the commit puts it
      relative to the output (``dead_letter/<name>.jsonl``); ``''`` when there are no
      letters (no file is written).
    """
    if not letters:
        return ""
    relative = f"{DEAD_LETTER_DIR}/{safe_name(name)}.jsonl"
    write_atomic(files.join(temp_dir, relative),
                 "".join(d.to_json_line() for d in letters).encode("utf-8"))
    return relative


def staged_moves(output: str, temp_dir: str, paths: Sequence[str]
                 ) -> tuple[list[tuple[str, str]], dict[str, Claim]]:
    """The commit's moves of a run's dead-letter files (``paths``, relative) from
    ``temp_dir`` to ``output``, and by final path the size and checksum of each still
    staged, which the journal records (on GCS the CRC-32C of one listing, instead of
    a download each; a retry whose file moved already finds it in the journal)."""
    listed = list_objects(files.join(temp_dir, DEAD_LETTER_DIR)) if is_gcs(temp_dir) and paths else {}
    renames, digests = [], {}
    for relative in paths:
        src, dst = files.join(temp_dir, relative), files.join(output, relative)
        renames.append((src, dst))
        info = listed.get(src)
        if info is not None and info.crc32c:
            digests[dst] = Claim(relative, info.size, crc32c=info.crc32c)
            continue
        data = None if listed else files.read_bytes_if_exists(src)
        if data is not None:
            digests[dst] = file_claim(relative, data)
    return renames, digests


def keep_failed_letters(output: str, temp_dir: str, paths: Sequence[str], run_id: str) -> dict[str, str]:
    """Puts the dead letters of a run that published nothing (``paths``, staged in
    ``temp_dir``) in ``output``, for the user to read: each at its final name,
    recorded in the journal first (``write_owned``), or, where the published
    ``manifest.json`` lists a file of that name, at ``<name>.run-<run_id>.jsonl``
    (the published dataset's file stays as it is). A file no longer staged is left out.

    Returns:
      ``{staged path: where it is now}``, relative to ``output``.
    """
    try:
        manifest = json.loads(files.read_bytes_if_exists(files.join(output, MANIFEST_NAME)) or b"null")
    except ValueError:
        manifest = None
    listed = listed_paths(manifest)
    kept = {}
    for relative in paths:
        data = files.read_bytes_if_exists(files.join(temp_dir, relative))
        if data is None:
            continue
        final = f"{relative.removesuffix('.jsonl')}.run-{run_id}.jsonl" if relative in listed else relative
        write_owned(output, final, data)
        kept[relative] = final
    return kept


def staged_letters(report: RunReport) -> tuple[str, ...]:
    """A run's dead-letter files and its ``skipped.jsonl``, relative (as its report
    names them; staged in its temporary folder until the commit moves them)."""
    skipped = (report.skipped or {}).get("file")
    return tuple(report.dead_letter_files or ()) + ((skipped,) if skipped else ())


def failed_run_letters(report: RunReport, temp_dir: str) -> RunReport:
    """``report`` (of a run that published nothing) naming where its dead letters were
    put for the user (``keep_failed_letters``: never over the published dataset's)."""
    kept = keep_failed_letters(report.output, temp_dir, staged_letters(report), report.run_id)
    skipped = dict(report.skipped) if report.skipped else None
    if skipped and skipped.get("file") in kept:
        skipped["file"] = kept[skipped["file"]]
    return dataclasses.replace(report, skipped=skipped, dead_letter_files=tuple(
        kept[p] for p in report.dead_letter_files or () if p in kept))
