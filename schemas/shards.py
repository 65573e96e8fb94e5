"""The shard contract: the size band, the compressions, and how shard files are named.

``<split>-00000-of-00004.tfrecord`` (``.tfrecord.gz`` with gzip): readers glob these
names, ``verify`` recognizes them, and a rerun finds an earlier run's shards by them.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Iterable

__all__ = [
    "COMPRESSIONS",
    "INDEX_SUFFIX",
    "MB",
    "check_compression",
    "ShardBand",
    "ShardTarget",
    "WORK_DIR",
    "clashing_split_names",
    "is_valid_split_name",
    "parse_shard_name",
    "shard_name",
    "shard_suffix",
]

COMPRESSIONS = ("none", "gzip")
# The hidden folder of an output where runs keep their lock and unfinished shards;
# readers that glob ``OUT/*.tfrecord`` never see inside it.
WORK_DIR = ".beam-tfrecords"
MB = 1_000_000
# An uncompressed shard's index file is its name with this appended
# (``train-00000-of-00004.tfrecord.idx``); gzip shards have none.
INDEX_SUFFIX = ".idx"
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*")
_ATTEMPT = re.compile(r"[0-9a-f]{8,32}")
_SHARD_NAME = re.compile(
    r"(?P<split>[A-Za-z0-9][A-Za-z0-9_.]*)-(?P<index>\d{5,})-of-(?P<count>\d{5,})"
    r"\.tfrecord(?:\.gz)?"
)


@dataclasses.dataclass(frozen=True)
class ShardBand:
    """The size every shard of a split must land in, in bytes.

    A split smaller than ``min_bytes`` becomes one shard below the band.
    """

    min_bytes: int
    max_bytes: int

    def __post_init__(self):
        if self.min_bytes <= 0:
            raise ValueError(f"shard minimum must be positive, got {self.min_bytes} bytes")
        if self.max_bytes < self.min_bytes:
            raise ValueError(
                f"shard maximum ({self.max_bytes} bytes) is below the minimum ({self.min_bytes} bytes)"
            )

    @classmethod
    def from_mb(cls, min_mb: float, max_mb: float) -> ShardBand:
        """A band given in megabytes (10**6 bytes)."""
        return cls(int(min_mb * MB), int(max_mb * MB))

    def holds(self, size: int) -> bool:
        """Whether ``size`` lies inside the band."""
        return self.min_bytes <= size <= self.max_bytes


def shard_suffix(compression: str) -> str:
    """Returns the file suffix for a compression: ``.tfrecord`` or ``.tfrecord.gz``."""
    check_compression(compression)
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def check_compression(compression: str) -> None:
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")


def is_valid_split_name(split: str) -> bool:
    """Whether ``split`` can start a shard file name (letters, digits, '_', '.')."""
    return bool(_SPLIT_NAME.fullmatch(split))


def clashing_split_names(names: Iterable[str]) -> list[tuple[str, ...]]:
    """Groups of split names that differ only in Unicode normalization or case (``TRAIN``
    and ``train``): their shard files would be one file on a case-insensitive file
    system (macOS, Windows). Each group sorted, groups in order of their first name."""
    groups: dict[str, set[str]] = {}
    for name in names:
        groups.setdefault(unicodedata.normalize("NFC", name).casefold(), set()).add(name)
    return sorted(tuple(sorted(group)) for group in groups.values() if len(group) > 1)


def shard_name(split: str, index: int, num_shards: int, compression: str) -> str:
    """``<split>-00000-of-00004.tfrecord`` (``.tfrecord.gz`` with gzip)."""
    if not _SPLIT_NAME.fullmatch(split):
        raise ValueError(
            f"split name {split!r} cannot name a file: use letters, digits, '_' and '.'"
        )
    if not 0 <= index < num_shards:
        raise ValueError(f"shard index {index} is outside 0..{num_shards - 1}")
    return f"{split}-{index:05d}-of-{num_shards:05d}{shard_suffix(compression)}"


def parse_shard_name(name: str) -> tuple[str, int, int] | None:
    """``(split, index, num_shards)`` for a shard file name, else ``None``."""
    match = _SHARD_NAME.fullmatch(name)
    if not match or int(match["index"]) >= int(match["count"]):
        return None
    return match["split"], int(match["index"]), int(match["count"])


@dataclasses.dataclass(frozen=True)
class ShardTarget:
    """Where a run's shards go: written and verified under a temporary name in
    the output's work folder (one per attempt, see ``attempt_path``), then moved
    to their final names by the commit.

    Attributes:
      output: the output folder (local path or URI).
      compression: ``none`` or ``gzip``.
      run_id: this run's id; it names the temporary folder.
    """

    output: str
    compression: str = "none"
    run_id: str = "run"

    def __post_init__(self):
        check_compression(self.compression)
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.run_id):
            raise ValueError(f"run_id {self.run_id!r}: use letters, digits, '_', '.', '-'")

    @property
    def temp_dir(self) -> str:
        """This run's temporary folder: ``OUT/.beam-tfrecords/tmp-<run_id>``."""
        return _join(self.output, WORK_DIR, f"tmp-{self.run_id}")

    def final_path(self, name: str) -> str:
        return _join(self.output, name)

    def temp_path(self, name: str) -> str:
        return _join(self.temp_dir, name)

    def attempt_path(self, name: str, attempt: str) -> str:
        """Where one attempt at writing shard ``name`` writes it:
        ``OUT/.beam-tfrecords/tmp-<run_id>/<name>.<attempt>``. Every attempt (a retry
        in the writer, or a worker the runner started again) has a name of its own,
        so a writer that lost its lease cannot overwrite the file another attempt
        wrote and verified; the commit moves the one named in the verified result.

        Raises:
          ValueError: when ``attempt`` is not 8 to 32 lower-case hex digits.
        """
        if not _ATTEMPT.fullmatch(attempt):
            raise ValueError(f"attempt id {attempt!r}: use 8 to 32 lower-case hex digits")
        return _join(self.temp_dir, f"{name}.{attempt}")


def _join(base: str, *parts: str) -> str:
    return "/".join([base.rstrip("/") if len(base) > 1 else base, *parts])
