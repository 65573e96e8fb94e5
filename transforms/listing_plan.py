"""Planning the shards of a large listing from its parts, so that no step holds
the whole listing (``PlanListingParts``).

A listing of more than ``handoff.PART_ROWS`` images travels as parts
(``ListingPart``: at most that many references each, read from the hand-off
file only where a step works on that part). Then:

1. **Thin**: each part sends each split it holds the split's rows' 128-bit
   ordering keys and planned record sizes (24 bytes a file; no paths).
2. **Cut**, one split per call: the rows of every part (in part order, so ties
   fall as in one list), sorted by key and cut with ``cut_shards``: the same
   cuts as ``images.image_shards`` makes of the whole listing.
3. **Assign**: each part sends each group of ``SHARDS_PER_GROUP`` consecutive
   shards the rows it holds of them; a ``GroupByKey`` per group joins them in
   key order into the ``ShardSpec`` s the one-step plan makes (same records, same
   order, same planned bytes).

The cut of a split holds ~60 bytes per file of that split at its peak (keys,
sizes, the sort), not the paths; a part's step holds one part
(``benchmarks/bench_planning.py --parts`` measures both).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np

from beam_tfrecords.schemas.elements import ImageRef, ImageRefs, ListingPart, ShardSpec
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.image_listing import pack_refs, part_refs
from beam_tfrecords.transforms.io import progress
from beam_tfrecords.transforms.io.image_records import estimated_record_size, record_overheads
from beam_tfrecords.transforms.plan.ref_table import RefTable, concat_tables
from beam_tfrecords.transforms.plan.shard_cuts import cut_shards, shard_spec

__all__ = ["PlanListingParts", "SHARDS_PER_GROUP", "SplitCut", "cut_split", "part_columns"]

_log = logging.getLogger(__name__)
# Shards a part sends its rows to in one piece (as ``worker_listing`` does).
SHARDS_PER_GROUP = 64


@dataclasses.dataclass(frozen=True)
class _Thin:
    """What the cut needs of one split's rows in one part: their keys ``(n, 2)``
    uint64 and planned record sizes, in the part's order."""

    part: int
    keys: np.ndarray
    planned: np.ndarray


@dataclasses.dataclass(frozen=True)
class SplitCut:
    """One split's cut: its shard count, and each part's rows' shards (the rows of
    the split in the part's order: ``shards[part][i]`` is the shard of its i-th)."""

    split: str
    num_shards: int
    shards: dict[int, np.ndarray]

    @property
    def groups(self) -> int:
        return -(-self.num_shards // SHARDS_PER_GROUP)


def part_columns(refs: Sequence[ImageRef]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """``(split names, split code of each row, keys (n, 2) uint64, planned sizes)`` of a
    part's references (a table's from its columns; a list's from its objects).

    Raises:
      ValueError: when a reference's key is not a ``stable_key`` (32 hex digits).
    """
    if isinstance(refs, RefTable):
        planned = (record_overheads(refs.vocabulary)[refs.labels] + refs.sizes + refs.name_lengths()
                      + refs.annotation_lengths())
        return list(refs.split_names), refs.split_codes, refs.keys.reshape(-1, 2), planned.astype(np.int64)
    names: dict[str, int] = {}
    codes = np.empty(len(refs), np.int32)
    keys = np.empty((len(refs), 2), np.uint64)
    planned = np.empty(len(refs), np.int64)
    for i, ref in enumerate(refs):
        codes[i] = names.setdefault(ref.split, len(names))
        if len(ref.key) != 32:
            raise ValueError(f"{ref.filename}: ordering key {ref.key!r} is not a stable_key")
        keys[i] = int(ref.key[:16], 16), int(ref.key[16:], 16)
        planned[i] = estimated_record_size(ref)
    return list(names), codes, keys, planned


def _thin(part: ListingPart) -> Iterator[tuple[str, _Thin]]:
    """A part → ``(split, _Thin)`` for each split it holds."""
    names, codes, keys, planned = part_columns(part_refs(part))
    for code, split in enumerate(names):
        rows = np.flatnonzero(codes == code)
        if len(rows):
            yield split, _Thin(part.index, keys[rows], planned[rows])


def cut_split(split: str, thins: Sequence[_Thin], band: ShardBand) -> SplitCut:
    """The cut of one split from every part's thin columns: sorted by key (ties in
    part order, then row order), cut into band-sized shards."""
    thins = sorted(thins, key=lambda t: t.part)
    keys = np.concatenate([t.keys for t in thins]).reshape(-1, 2)
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    del keys
    planned = np.concatenate([t.planned for t in thins])[order]
    count, shard_of = cut_shards(planned, band)
    del planned
    assigned = np.empty(len(order), np.int32)
    assigned[order] = shard_of
    del order, shard_of
    shards, start = {}, 0
    for t in thins:
        shards[t.part] = assigned[start:start + len(t.planned)]
        start += len(t.planned)
    return SplitCut(split, count, shards)


def _cut(element, band: ShardBand) -> SplitCut:
    split, thins = element
    cut = cut_split(split, list(thins), band)
    _log.info("Cut split %s into %d shards", split, cut.num_shards)
    return cut


def _every_group(cut: SplitCut) -> Iterator:
    """An empty piece for each group of the split, so that every shard is written."""
    for group in range(cut.groups):
        yield (cut.split, group), None


class _AssignFn(beam.DoFn):
    """A part → ``((split, group), packed (part, rows, their shards))`` for each
    group of shards it holds rows of."""

    def process(self, part: ListingPart, cuts: list[SplitCut]) -> Iterator:
        progress.plan(shards=sum(cut.num_shards for cut in cuts))
        refs = part_refs(part)
        names, codes, _, _ = part_columns(refs)
        for cut in cuts:
            shards = cut.shards.get(part.index)
            if shards is None or cut.split not in names:
                continue
            rows = np.flatnonzero(codes == names.index(cut.split))
            groups = shards // SHARDS_PER_GROUP
            order = np.argsort(groups, kind="stable")
            for run in np.split(order, np.flatnonzero(np.diff(groups[order])) + 1):
                members = refs.rows(rows[run]) if isinstance(refs, RefTable) else [refs[i] for i in rows[run]]
                piece = pickle.dumps((part.index, members, shards[run]), protocol=pickle.HIGHEST_PROTOCOL)
                yield (cut.split, int(groups[run[0]])), piece


class _ShardSpecsFn(beam.DoFn):
    """A group's pieces → the ``ShardSpec`` of each of its shards, rows in key order."""

    def __init__(self, compression: str):
        self._compression = compression

    def process(self, element, cuts: list[SplitCut]) -> Iterator[ShardSpec]:
        (split, group), pieces = element
        num_shards = next(cut.num_shards for cut in cuts if cut.split == split)
        pieces = sorted((pickle.loads(p) for p in pieces if p is not None), key=lambda p: p[0])
        runs: dict[int, list] = {}
        if pieces:
            members = _joined([m for _, m, _ in pieces])
            shard = np.concatenate([s for _, _, s in pieces])
            _, _, keys, planned = part_columns(members)
            order = np.lexsort((keys[:, 1], keys[:, 0], shard))
            for rows in np.split(order, np.flatnonzero(np.diff(shard[order])) + 1):
                runs[int(shard[rows[0]])] = rows
        first = group * SHARDS_PER_GROUP
        for index in range(first, min(first + SHARDS_PER_GROUP, num_shards)):
            rows = runs.get(index)
            if rows is None:
                records, planned_bytes = ImageRefs.pack(()), 0
            elif isinstance(members, RefTable):
                records, planned_bytes = pack_refs(members.rows(rows)), int(planned[rows].sum())
            else:
                records = ImageRefs.pack([members[i] for i in rows])
                planned_bytes = int(planned[rows].sum())
            yield shard_spec(split, index, num_shards, self._compression, planned_bytes, records)


def _joined(parts: list) -> Sequence[ImageRef]:
    if all(isinstance(p, RefTable) for p in parts):
        return parts[0] if len(parts) == 1 else concat_tables(parts)
    return [ref for part in parts for ref in part]


class PlanListingParts(beam.PTransform):
    """``ListingPart`` s → one ``ShardSpec`` per shard, spread over workers: the specs
    ``images.PlanImageShards`` makes of the whole listing, planned without any
    step holding it (see the module docstring).

    Args:
      band: the shard size band.
      compression: ``none`` or ``gzip`` (names the files).
    """

    def __init__(self, band: ShardBand, compression: str = "none"):
        super().__init__()
        self._band = band
        self._compression = compression

    def expand(self, parts):
        cuts = (
            parts
            | "Thin" >> beam.FlatMap(_thin)
            | "BySplit" >> beam.GroupByKey()
            | "Cut" >> beam.Map(_cut, self._band)
        )
        cuts_side = beam.pvalue.AsList(cuts)
        pieces = parts | "Assign" >> beam.ParDo(_AssignFn(), cuts_side)
        return (
            (pieces, cuts | "EveryGroup" >> beam.FlatMap(_every_group))
            | "Pieces" >> beam.Flatten()
            | "ByGroup" >> beam.GroupByKey()
            | "Specs" >> beam.ParDo(_ShardSpecsFn(self._compression), cuts_side)
            | "Spread" >> beam.Reshuffle()
        )
