"""Planning shards by bytes: how many, and which record goes where.

Records are ordered by a stable key (a hash of split and relative path), so
classes mix across shards and the same input always gives the same plan. The key
order is then cut into ``n`` contiguous runs of (nearly) equal bytes, with ``n``
chosen so that the mean shard sits in the middle of the byte band. Every input
kind (images, table rows, sequences, a user's records) is cut by ``cut_shards``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

from beam_tfrecords.schemas.shards import ShardBand

__all__ = [
    "assign_shards",
    "cut_shards",
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


def cut_shards(sizes: Sequence[int] | np.ndarray, band: ShardBand) -> tuple[int, np.ndarray]:
    """Cuts one split's records, in their order, into band-sized shards.

    Args:
      sizes: the size each record is planned at, in order (framed bytes, or an
        estimate of them made before the record exists).
      band: the shard size band.

    Returns:
      ``(num_shards, shard_of)``: the shard count, and each record's shard index
      (non-decreasing), the same as ``assign_shards`` gives.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    num_shards = choose_num_shards(total, band)
    if total == 0:
        return num_shards, np.zeros(len(sizes), dtype=np.int64)
    # A record goes where its byte midpoint falls (float64 is exact below 2**53 bytes).
    midpoints = np.cumsum(sizes) - sizes / 2
    shard_of = np.minimum(midpoints * num_shards // total, num_shards - 1).astype(np.int64)
    return num_shards, shard_of


def stable_key(split: str, relative_path: str) -> str:
    """The ordering key of a record: a hash, so neighbours in a shard are unrelated."""
    return hashlib.sha256(f"{split}\0{relative_path}".encode()).hexdigest()[:32]


