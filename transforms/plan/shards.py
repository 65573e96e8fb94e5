"""Planning shards by bytes: how many, which record goes where, what they are called.

Records are ordered by a stable key (a hash of split and relative path), so
classes mix across shards and the same input always gives the same plan. The key
order is then cut into ``n`` contiguous runs of (nearly) equal bytes, with ``n``
chosen so that the mean shard sits in the middle of the byte band.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

from beam_tfrecords.schemas.shards import ShardBand

__all__ = [
    "assign_shards",
    "choose_num_shards",
    "stable_key",
]


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


