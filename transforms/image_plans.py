"""Shards of images planned from a listing: each split, in key order, cut into
shards of nearly equal bytes (``plan_image_shards``), the largest written first on
the local runner (``largest_first``); and the first shard started early there
(``start_first_shard``: its files are encoded on the helper processes while the
runner starts, and ``PlanImageShards`` takes the plan made for it, not a second one).

The steps that use these are in ``transforms.image_steps``.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np

from beam_tfrecords.schemas.elements import ImageRef, ImageRefs, RefColumns, ShardSpec
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.image_listing import pack_refs
from beam_tfrecords.transforms.io import progress
from beam_tfrecords.transforms.io.helpers import drop_early
from beam_tfrecords.transforms.io.image_batches import planned_sizes
from beam_tfrecords.transforms.io.image_records import estimated_record_size, record_overheads
from beam_tfrecords.transforms.plan.ref_table import RefTable, split_orders
from beam_tfrecords.transforms.plan.shard_cuts import split_specs

__all__ = ["EARLY_BYTES", "forget_first_shard", "image_shards", "largest_first", "listing_element",
           "plan_image_shards", "start_first_shard"]

_log = logging.getLogger(__name__)


class EarlySource(Protocol):
    """A record source that can start a shard's first files early (``ImageRecords``)."""

    def start_early(self, spec: ShardSpec, most_bytes: int) -> int: ...


def listing_element(refs: Sequence[ImageRef]) -> ImageRefs:
    """A listing's references as the one element its shards are planned from: as a
    table, or else columns (no object per reference pickled, nor made to plan)."""
    if isinstance(refs, RefTable):
        return pack_refs(refs)
    columns = RefColumns.of(refs)
    table = RefTable.from_columns(columns)
    return pack_refs(table) if table is not None else ImageRefs.pack_columns(columns)


def plan_image_shards(images: ImageRefs, band: ShardBand, compression: str) -> list[ShardSpec]:
    """Cuts each split, in key order, into shards of nearly equal bytes.

    Args:
      images: every image of every split.
      band: the shard size band.
      compression: ``none`` or ``gzip`` (names the files; sizes are planned on
        uncompressed bytes, since encoded images barely compress).

    Returns:
      One spec per shard, split by split, in index order.
    """
    return list(image_shards(images, band, compression))


def image_shards(images: ImageRefs, band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """``plan_image_shards``, one spec at a time. The plan of a ``RefTable`` makes
    no reference object: each spec's ``ImageRefs`` holds its rows as a table of
    their own (its writer iterates them as references, in order)."""
    refs = images.unpack()
    start = time.monotonic()
    count = shards = 0
    for spec in _specs_of(refs, band, compression):
        yield spec
        count += spec.records.count
        shards += 1
    _log.info("Planned %d shards for %d images in %.1f s", shards, count, time.monotonic() - start)
    progress.plan(shards=shards)


def _specs_of(refs: Sequence[ImageRef], band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    if isinstance(refs, RefTable):
        return _table_specs(refs, band, compression)
    if isinstance(refs, RefColumns):
        return _column_specs(refs, band, compression)
    return _ref_specs(refs, band, compression)


def largest_first(images: ImageRefs, band: ShardBand, compression: str) -> list[ShardSpec]:
    """``image_shards``, the largest planned first (equal ones in plan order). A runner
    that writes the shards one after another, as the local one does (the spread keeps
    their order), then ends on a small one: the last shard's write, contents list
    and verification, which no other shard's work overlaps, are the shortest (on
    60k tiny PNGs: the 10k-image test split last, not the 50k-image train split).

    The plan ``start_first_shard`` made of the same element is taken, not made again."""
    key = _plan_key(images, band, compression) if _EARLY_PLANS else None
    early = _EARLY_PLANS.pop(key, None) if key is not None else None
    if early is None:
        return sorted(image_shards(images, band, compression), key=lambda spec: -spec.planned_bytes)
    specs, seconds = early
    _log.info("Planned %d shards for %d images in %.1f s", len(specs), sum(s.records.count for s in specs),
              seconds)
    progress.plan(shards=len(specs))
    return specs


# The plan ``start_first_shard`` made, by ``_plan_key``: at most one.
_EARLY_PLANS: dict[tuple, tuple[list[ShardSpec], float]] = {}
# The first shard's files encoded early: about this many bytes of them (~13k tiny
# PNGs, ~0.35 s of a helper's CPU, ~40 MB of records held until its writer starts).
EARLY_BYTES = 32 << 20


def _plan_key(images: ImageRefs, band: ShardBand, compression: str) -> tuple:
    return hashlib.sha256(images.packed).digest(), images.count, band, compression


def start_first_shard(refs: Sequence[ImageRef], band: ShardBand, compression: str, source: EarlySource,
                      most_bytes: int = EARLY_BYTES) -> int:
    """Plans the shards of a listing's references (``refs``) as ``PlanImageShards``
    will, and starts encoding the first shard's first ``most_bytes`` of files on the
    helper processes now (``ImageRecords.start_early``), while the local runner
    starts: its writer then takes what they made. The plan is kept for
    ``PlanImageShards`` to take (the same element, by digest), not made twice.
    Returns how many files were started (0: helpers do not write that shard)."""
    images = listing_element(refs)
    started = time.monotonic()
    specs = sorted(_specs_of(images.unpack(), band, compression), key=lambda spec: -spec.planned_bytes)
    _EARLY_PLANS.clear()
    _EARLY_PLANS[_plan_key(images, band, compression)] = (specs, time.monotonic() - started)
    return source.start_early(specs[0], most_bytes) if specs else 0


def _ref_specs(refs: Sequence[ImageRef], band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """The specs of a list of references, split by split."""
    by_split: dict[str, list[ImageRef]] = {}
    for ref in refs:
        by_split.setdefault(ref.split, []).append(ref)
    for split in sorted(by_split):
        items = sorted(by_split[split], key=lambda r: (r.key, r.filename))
        yield from split_specs(split, [estimated_record_size(r) for r in items], band, compression,
                               lambda a, b, items=items: ImageRefs.pack(items[a:b]))


def _column_specs(refs: RefColumns, band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """``_ref_specs`` of references held as columns, planned on the columns: each
    spec's references are columns of their own (no ``ImageRef`` is made here)."""
    if not len(refs):
        return
    splits = refs.column("split")
    split_of = np.array(splits)
    keys = np.array(refs.column("key"))
    names = np.array(refs.column("filename"))
    planned = np.array(planned_sizes(refs), dtype=np.int64)
    for split in sorted(set(splits)):
        members = np.flatnonzero(split_of == split)
        # Key order, then name (as ``sorted(key=(key, filename))``: lexsort is stable).
        order = members[np.lexsort((names[members], keys[members]))].tolist()
        yield from split_specs(split, planned[order], band, compression,
                               lambda a, b, order=order: ImageRefs.pack_columns(refs.take(order[a:b])))


def _table_specs(table: RefTable, band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """The specs of a table, split by split (each spec's rows a table of their own)."""
    planned = (record_overheads(table.vocabulary)[table.labels] + table.sizes + table.name_lengths()
                  + table.annotation_lengths())
    for split, order in split_orders(table):
        yield from split_specs(split, planned[order], band, compression,
                               lambda a, b, order=order: pack_refs(table.gather(order[a:b])))


def forget_first_shard() -> None:
    """Drops what ``start_first_shard`` made that the run did not take (its plan, its
    tasks' results): called once the local runner's run has ended, however it ended."""
    _EARLY_PLANS.clear()
    drop_early()
