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
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from beam_tfrecords.schemas.shards import ShardBand

__all__ = [
    "assign_shards",
    "cut_shard_runs",
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
    return num_shards, _shard_of(np.cumsum(sizes), sizes, num_shards, total)


def _shard_of(ends: np.ndarray, sizes: np.ndarray, num_shards: int, total: int) -> np.ndarray:
    """Each record's shard, from its end offset in the split and its size."""
    if total == 0:
        return np.zeros(len(sizes), dtype=np.int64)
    # A record goes where its byte midpoint falls (float64 is exact below 2**53 bytes).
    midpoints = ends - sizes / 2
    return np.minimum(midpoints * num_shards // total, num_shards - 1).astype(np.int64)


def cut_shard_runs(chunks: Iterable[np.ndarray], total: int, num_shards: int, before: int = 0
                   ) -> Iterator[tuple[int, np.ndarray]]:
    """``cut_shards`` for a split read a chunk of sizes at a time, in bounded memory.

    Args:
      chunks: the split's record sizes, in order, in consecutive pieces.
      total: the sum of all sizes (``choose_num_shards`` gives ``num_shards`` from it).
      num_shards: how many shards.
      before: the bytes of the split's records ahead of the first chunk (the
        records of one part of a split can be cut on their own).

    Yields:
      ``(shard, sizes)``: consecutive runs of records with one shard index, in
      order (a shard's records may come in several runs); the indices are those
      ``cut_shards`` gives the whole array.
    """
    for sizes in chunks:
        sizes = np.asarray(sizes, dtype=np.int64)
        if not len(sizes):
            continue
        ends = np.cumsum(sizes)
        ends += before
        before = int(ends[-1])
        shard_of = _shard_of(ends, sizes, num_shards, total)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(shard_of)) + 1, [len(sizes)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
            yield int(shard_of[a]), sizes[a:b]


def stable_key(split: str, relative_path: str) -> str:
    """The ordering key of a record: a hash, so neighbours in a shard are unrelated."""
    return hashlib.sha256(f"{split}\0{relative_path}".encode()).hexdigest()[:32]


