"""Per-shard content lists: what the commit learns of every record, kept out of its memory.

Each image record has a content entry ``(sha256 of the record's image, image/filename,
sha256 of the file's bytes or '' when the same)``. The shard writer puts its
shard's entries in a side file in the run's temporary folder
(``<temp>/contents/<shard>.<token>.json``, one JSON array of the entries' arrays,
ASCII, encoded and parsed by one call each) and
the shard's result carries only the file's path, its SHA-256 and the entry
count; a shard of at most ``INLINE_ENTRIES`` records (a few KB of entries)
carries them itself instead, which saves three storage requests per shard
(write, read, delete) on runs of many small shards. The steps that find
duplicates and complete ``inputs.jsonl`` (``transforms.gather``) read them on
the workers (``shard_contents``), a side file checked against its digest before
a byte of it is parsed; the commit sees every result without them. The
temporary folder, and the side files with it, go when the run ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import hmac
import itertools
import json
import uuid
from collections.abc import Iterator, Sequence

from beam_tfrecords.schemas.elements import ShardResult
from beam_tfrecords.transforms.io import files

__all__ = ["CONTENTS_DIR", "INLINE_ENTRIES", "ContentsError", "paused_gc", "read_contents",
           "shard_contents", "stripped", "write_contents"]

CONTENTS_DIR = "contents"
# A shard of at most this many records keeps their entries in its result (~20 KB).
INLINE_ENTRIES = 128


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic garbage collection inside: for steps that make an object or three per
    record (entries, lines) and no cycles. In a process that holds a run's plan,
    each collection the allocations would set off walks every object it holds;
    they are left to the next collection after the step (reference counting frees
    what the step drops, as ever)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class ContentsError(ValueError):
    """A side file that is not the one its shard's writer wrote."""


_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"))


def _encoded(contents: Sequence[tuple[str, str, str]]) -> bytes:
    """``[[sha256, filename, source], ...]`` and a newline: one encoder call for the shard."""
    return (_ENCODER.encode(contents if isinstance(contents, list) else list(contents)) + "\n").encode("ascii")


def write_contents(temp_dir: str, shard: str, contents: Sequence[tuple[str, str, str]]
                   ) -> tuple[str, str, int]:
    """Writes a shard's content entries to a side file of its own (a fresh name per
    call, so a retried or second attempt never writes over another's), unless they
    are at most ``INLINE_ENTRIES`` (the result carries them: see ``ShardResult``).

    Returns:
      ``(path, sha256 hex, entries)``; ``("", "", entries)`` when no file was written.
    """
    if len(contents) <= INLINE_ENTRIES:
        return "", "", len(contents)
    data = _encoded(contents)
    stem = shard.split(".tfrecord", 1)[0]
    path = files.join(temp_dir, CONTENTS_DIR, f"{stem}.{uuid.uuid4().hex[:12]}.json")
    files.write_bytes(path, data)
    return path, hashlib.sha256(data).hexdigest(), len(contents)


def read_contents(path: str, sha256: str, count: int) -> Iterator[tuple[str, str, str]]:
    """The entries ``write_contents`` wrote to ``path``.

    Raises:
      ContentsError: when the file's SHA-256 is not ``sha256``, or it does not
        hold ``count`` entries of three strings (nothing of it is parsed first).
      OSError: when it cannot be read.
    """
    if not path:
        return iter(())
    data = files.read_bytes(path)
    actual = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(actual, str(sha256).lower()):
        raise ContentsError(f"the content list {path} is not the one its shard's writer wrote "
                            f"(its SHA-256 is {actual[:16]}..., the shard's result says "
                            f"{str(sha256)[:16]}...): it was changed in the output's temporary "
                            "folder during the run, so it was not read; check who else can write "
                            "to the output")
    return _parsed(data, path, count)


def _parsed(data: bytes, path: str, count: int) -> Iterator[tuple[str, str, str]]:
    """The entries of a side file, each checked to be three strings (lists of three:
    callers unpack them)."""
    try:
        entries = json.loads(data)
    except ValueError as err:
        raise ContentsError(f"{path}: not a content list ({err})") from None
    if type(entries) is not list or len(entries) != count:
        raise ContentsError(f"{path}: {len(entries) if type(entries) is list else 'no'} entries, "
                            f"the shard wrote {count}")
    # Every entry a list of three, every field a string: counted in C, not checked one by one.
    if (sum(map(_is_entry, entries)) != count
            or sum(map(str.__instancecheck__, itertools.chain.from_iterable(entries))) != 3 * count):
        raise ContentsError(f"{path}: an entry is not three strings")
    return iter(entries)


def _is_entry(entry) -> bool:
    return type(entry) is list and len(entry) == 3


def shard_contents(result: ShardResult) -> Iterator[tuple[str, str, str]]:
    """The content entries of a shard's records, in order (its own, or its side
    file's, checked: see ``read_contents``)."""
    if result.contents_path:
        return read_contents(result.contents_path, result.contents_sha256, result.contents_count)
    return iter(result.contents)


def stripped(result: ShardResult) -> ShardResult:
    """``result`` without the content entries it carries (what the commit keeps)."""
    return dataclasses.replace(result, contents=()) if result.contents else result
