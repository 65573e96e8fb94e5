"""Planning shards by bytes: how many, and which record goes where.

Records are ordered by a stable key (a hash of split and relative path), so
classes mix across shards and the same input always gives the same plan. The key
order is then cut into ``n`` contiguous runs of (nearly) equal bytes, with ``n``
chosen so that the mean shard sits in the middle of the byte band (and no more
shards than records). Every input kind (images, table rows, sequences, a user's
records) is cut by ``cut_shards`` (or, a chunk of sizes at a time, by
``StreamedCut``), and every ``ShardSpec`` is made by ``shard_spec`` (a whole
split's at once by ``split_specs``).

No shard is ever left empty: a record goes to the shard its byte midpoint falls
in, except where that would skip a shard (a record larger than ``total / n``),
where the cut moves on one shard at a time instead and keeps enough shards for
the records left (``_no_gaps``).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from beam_tfrecords.schemas.elements import ShardSpec
from beam_tfrecords.schemas.shards import ShardBand, shard_name

__all__ = [
    "StreamedCut",
    "assign_shards",
    "choose_num_shards",
    "cut_bounds",
    "cut_shards",
    "shard_spec",
    "split_specs",
    "stable_key",
]


def choose_num_shards(total_bytes: int, band: ShardBand, records: int | None = None) -> int:
    """How many shards a split of ``total_bytes`` gets.

    The mean shard is put as close to the band's middle as the count allows, and
    never outside the band when some count keeps it inside; never more shards
    than ``records`` (when given), so that none is empty.
    """
    count = _band_count(total_bytes, band)
    return count if records is None else max(1, min(count, records))


def _band_count(total_bytes: int, band: ShardBand) -> int:
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
    """Cuts one split's records, in their order, into band-sized shards, none empty.

    Args:
      sizes: the size each record is planned at, in order (framed bytes, or an
        estimate of them made before the record exists).
      band: the shard size band.

    Returns:
      ``(num_shards, shard_of)``: the shard count (at most one a record), and each
      record's shard index (non-decreasing, every index from 0 to ``num_shards - 1``
      used): the one ``assign_shards`` gives wherever that leaves no shard empty.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    num_shards = choose_num_shards(total, band, len(sizes))
    shard_of, _ = _no_gaps(_shard_of(np.cumsum(sizes), sizes, num_shards, total), 0, len(sizes),
                           num_shards, 0)
    return num_shards, shard_of


def cut_bounds(sizes: Sequence[int] | np.ndarray, band: ShardBand) -> np.ndarray:
    """``cut_shards`` as bounds: shard ``s`` holds records ``bounds[s]:bounds[s + 1]``
    (``len(bounds)`` is the shard count plus one)."""
    num_shards, shard_of = cut_shards(sizes, band)
    return np.searchsorted(shard_of, np.arange(num_shards + 1), side="left")


def _shard_of(ends: np.ndarray, sizes: np.ndarray, num_shards: int, total: int) -> np.ndarray:
    """Each record's shard by its byte midpoint, from its end offset in the split and its size."""
    if total == 0:
        return np.zeros(len(sizes), dtype=np.int64)
    # A record goes where its byte midpoint falls (float64 is exact below 2**53 bytes).
    midpoints = ends - sizes / 2
    return np.minimum(midpoints * num_shards // total, num_shards - 1).astype(np.int64)


def _no_gaps(raw: np.ndarray, first: int, records: int, num_shards: int, lowest: int
             ) -> tuple[np.ndarray, int]:
    """The midpoint shards ``raw`` of records ``first, first + 1, ...`` of a split of
    ``records``, moved so that no shard is empty (``num_shards <= records``).

    Each record takes ``max(num_shards - (records - i), min(raw_i, previous + 1))``:
    at most one shard past the previous record's, and no fewer shards left than
    records. Where the midpoints skip no shard this is ``raw`` itself. Unrolled,
    record ``i`` takes ``i + max(num_shards - records, min(0, min over j <= i of
    raw_j - j))``, so a chunk is done at once given ``lowest``, that minimum over
    the records before it (0 at the split's start).

    Returns:
      ``(shards, lowest)``: the chunk's shards, and ``lowest`` for the next chunk.
    """
    if not len(raw) or num_shards > records:
        return raw, lowest
    index = np.arange(first, first + len(raw), dtype=np.int64)
    running = np.minimum.accumulate(np.concatenate(([lowest], raw - index)))[1:]
    return index + np.maximum(num_shards - records, running), int(running[-1])


class StreamedCut:
    """``cut_shards`` for a split read a chunk of sizes at a time, in bounded memory.

    Args:
      total: the sum of all the split's sizes.
      records: how many records the split holds.
      band: the shard size band (``num_shards`` is chosen from it, as
        ``cut_shards`` does).
    """

    def __init__(self, total: int, records: int, band: ShardBand):
        self.total, self.records = total, records
        self.num_shards = choose_num_shards(total, band, records)
        self._bytes = self._count = self._lowest = 0

    def runs(self, sizes: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
        """The next records' ``sizes`` (in order) as ``(shard, sizes)``: consecutive
        runs with one shard index (a shard's records may come in several runs);
        the indices are those ``cut_shards`` gives the whole array."""
        sizes = np.asarray(sizes, dtype=np.int64)
        if not len(sizes):
            return
        ends = np.cumsum(sizes)
        ends += self._bytes
        self._bytes = int(ends[-1])
        raw = _shard_of(ends, sizes, self.num_shards, self.total)
        shard_of, self._lowest = _no_gaps(raw, self._count, self.records, self.num_shards, self._lowest)
        self._count += len(sizes)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(shard_of)) + 1, [len(sizes)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
            yield int(shard_of[a]), sizes[a:b]


def shard_spec(split: str, index: int, num_shards: int, compression: str, planned_bytes: int,
               records: object, checkpoints: Sequence[tuple[int, int]] = ()) -> ShardSpec:
    """The ``ShardSpec`` of shard ``index`` of ``num_shards`` of ``split``, named as
    every shard is (``schemas.shards.shard_name``); the one place specs are made.

    Args:
      split, index, num_shards: the shard's place.
      compression: ``none`` or ``gzip`` (names the file).
      planned_bytes: the bytes the plan expects the shard to hold.
      records: what its record source reads (see ``ShardSpec``).
      checkpoints: ``(offset, index)`` record boundaries known in advance.
    """
    return ShardSpec(split, index, num_shards, shard_name(split, index, num_shards, compression),
                     int(planned_bytes), records, tuple(checkpoints))


def split_specs(split: str, sizes: Sequence[int] | np.ndarray, band: ShardBand, compression: str,
                records_of: Callable[[int, int], object],
                checkpoints_of: Callable[[np.ndarray], Sequence[tuple[int, int]]] | None = None,
                ) -> Iterator[ShardSpec]:
    """One split's records, in order, cut (``cut_shards``) into specs, in index order.

    Args:
      split: the split.
      sizes: each record's planned size, in order.
      band, compression: the shard size band; ``none`` or ``gzip``.
      records_of: ``(start, stop)`` → what a shard of records ``start:stop`` reads.
      checkpoints_of: a shard's record sizes → its checkpoints (none when ``None``).
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    bounds = cut_bounds(sizes, band).tolist()
    running = np.concatenate(([0], np.cumsum(sizes))).tolist()
    num_shards = len(bounds) - 1
    for index in range(num_shards):
        start, stop = bounds[index], bounds[index + 1]
        yield shard_spec(split, index, num_shards, compression, running[stop] - running[start],
                         records_of(start, stop),
                         checkpoints_of(sizes[start:stop]) if checkpoints_of is not None else ())


def stable_key(split: str, relative_path: str) -> str:
    """The ordering key of a record: a hash, so neighbours in a shard are unrelated."""
    return hashlib.sha256(f"{split}\0{relative_path}".encode()).hexdigest()[:32]


