"""What changed between the inputs a dataset was made from and the inputs now.

Pure: the caller lists and stats the files (``transforms.io.fingerprint``) and
hands in how to hash one when its time moved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from beam_tfrecords.schemas.inputs import InputFile

__all__ = ["Changes", "compare_inputs", "same_file"]


@dataclasses.dataclass(frozen=True)
class Changes:
    """The difference, by path.

    Attributes:
      new: files not in the dataset.
      changed: ``(old, now)`` of files whose content differs.
      deleted: files of the dataset that are gone.
      unchanged: files whose content is the same.
      touched: of those, files whose time moved but whose content hash held.
      now: the entries of every current file, content hashes filled in where
        this comparison computed them.
    """

    new: tuple[InputFile, ...] = ()
    changed: tuple[tuple[InputFile, InputFile], ...] = ()
    deleted: tuple[InputFile, ...] = ()
    unchanged: int = 0
    touched: int = 0
    now: tuple[InputFile, ...] = ()

    @property
    def any(self) -> bool:
        return bool(self.new or self.changed or self.deleted)

    def summary(self) -> str:
        """``2 new, 1 changed, 0 deleted, 997 unchanged`` (and how many were touched)."""
        text = (f"{len(self.new)} new, {len(self.changed)} changed, {len(self.deleted)} deleted, "
                f"{self.unchanged} unchanged")
        if self.touched:
            text += f" ({self.touched} with a new time but the same content)"
        return text


def same_file(old: InputFile, now: InputFile, mode: str,
              hash_now: Callable[[InputFile], str]) -> tuple[bool, InputFile]:
    """Whether ``now`` has the content ``old`` had, and ``now`` with its hash when
    one was computed.

    ``stat``: the same size and, locally, the same time (else the same content
    hash, computed now); on GCS the same crc32c. ``content``: the same content
    hash, always computed for a local file.
    """
    if old.size != now.size:
        return False, now
    if now.crc32c or old.crc32c:
        return bool(now.crc32c) and now.crc32c == old.crc32c, now
    if mode == "stat" and old.mtime_ns and old.mtime_ns == now.mtime_ns:
        return True, dataclasses.replace(now, sha256=now.sha256 or old.sha256)
    if not old.sha256:
        return False, now  # Nothing to compare the bytes with: count it changed.
    hashed = now if now.sha256 else dataclasses.replace(now, sha256=hash_now(now))
    return hashed.sha256 == old.sha256, hashed


def compare_inputs(old: Mapping[str, InputFile] | Iterable[InputFile], now: Sequence[InputFile],
                   mode: str, hash_now: Callable[[InputFile], str]) -> Changes:
    """Compares the files of a dataset (by path) with the files now (see ``same_file``)."""
    if not isinstance(old, Mapping):
        old = {entry.path: entry for entry in old}
    new, changed, current = [], [], []
    unchanged = touched = 0
    for entry in now:
        before = old.get(entry.path)
        if before is None:
            new.append(entry)
            current.append(entry)
            continue
        same, entry = same_file(before, entry, mode, hash_now)
        current.append(entry)
        if same:
            unchanged += 1
            touched += bool(before.mtime_ns and entry.mtime_ns and before.mtime_ns != entry.mtime_ns)
        else:
            changed.append((before, entry))
    seen = {entry.path for entry in now}
    deleted = tuple(entry for path, entry in sorted(old.items()) if path not in seen)
    return Changes(tuple(new), tuple(changed), deleted, unchanged, touched, tuple(current))
