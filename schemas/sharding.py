"""Planning shards by bytes: how many, which record goes where, what they are called.

Records are ordered by a stable key (a hash of split and relative path), so
classes mix across shards and the same input always gives the same plan. The key
order is then cut into ``n`` contiguous runs of (nearly) equal bytes, with ``n``
chosen so that the mean shard sits in the middle of the byte band.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Sequence

from schemas.tfrecord import shard_suffix

__all__ = [
    "MB",
    "ShardBand",
    "assign_shards",
    "choose_num_shards",
    "is_valid_split_name",
    "parse_shard_name",
    "shard_name",
    "stable_key",
]

MB = 1_000_000
_SPLIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.]*")
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


def choose_num_shards(total_bytes: int, band: ShardBand) -> int:
    """How many shards a split of ``total_bytes`` gets.

    The mean shard is put as close to the band's middle as the count allows, and
    never outside the band when some count keeps it inside.
    """
    if total_bytes <= band.min_bytes:
        return 1
    middle = (band.min_bytes + band.max_bytes) / 2
    fewest = math.ceil(total_bytes / band.max_bytes)
    most = max(1, total_bytes // band.min_bytes)
    if fewest > most:  # A band narrower than the records allow: stay under the cap.
        return fewest
    ideal = total_bytes / middle
    candidates = {min(max(n, fewest), most) for n in (math.floor(ideal), math.ceil(ideal))}
    return min(candidates, key=lambda n: (abs(total_bytes / n - middle), n))


def assign_shards(sizes: Sequence[int], num_shards: int) -> list[int]:
    """Cuts records, in key order, into ``num_shards`` runs of nearly equal bytes.

    A record goes to the shard its byte midpoint falls in, so each shard differs
    from ``total / num_shards`` by less than one record's size.

    Args:
      sizes: serialized size of each record, in key order.
      num_shards: how many shards to cut into.

    Returns:
      The shard index of each record (non-decreasing).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}")
    total = sum(sizes)
    if total == 0:
        return [0] * len(sizes)
    shards = []
    before = 0
    for size in sizes:
        shards.append(min(num_shards - 1, int((before + size / 2) * num_shards // total)))
        before += size
    return shards


def stable_key(split: str, relative_path: str) -> str:
    """The ordering key of a record: a hash, so neighbours in a shard are unrelated."""
    return hashlib.sha256(f"{split}\0{relative_path}".encode()).hexdigest()[:32]


def is_valid_split_name(split: str) -> bool:
    """Whether ``split`` can start a shard file name (letters, digits, '_', '.')."""
    return bool(_SPLIT_NAME.fullmatch(split))


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
