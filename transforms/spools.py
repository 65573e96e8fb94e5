"""Spools: the files the encode steps append framed records to before the plan
(one per input file and split, each record's size in a sidecar), and the plan that
cuts them into shards of byte ranges.

``transforms.tables`` writes a table's spools (``SpoolInfo``), ``transforms.image_steps``
spools images it read on the launcher (``ImageSpool``); ``plan_table_shards`` cuts
either kind, streaming the sidecars, and ``transforms.shard_engine`` copies the ranges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from beam_tfrecords.schemas.elements import ImageSpool, ShardSpec, SpoolSegments
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.codec.tfrecord import CHECKPOINT_BYTES
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.plan.shard_cuts import StreamedCut, shard_spec

__all__ = ["SIZES_SUFFIX", "SpoolInfo", "plan_table_shards"]

SIZES_SUFFIX = ".sizes"  # A spool's sidecar: its records' framed sizes.


@dataclasses.dataclass(frozen=True)
class SpoolInfo:
    """What one CSV file gave one split: records spooled, in row order.

    Attributes:
      split: the split.
      file_index: the CSV's place in the sorted input list (orders spools).
      path: the spool file; each record's framed size is in its sidecar,
        ``sizes_path`` (little-endian int64s), not here: 8 bytes a row would
        otherwise travel through the pipeline and be gathered in one place.
      records, bytes: how many records the spool holds, and their framed bytes.
      rows_in, dead, blank: rows read (all splits: set on the file's first
        spool only), rows dead-lettered, blank rows skipped.
      bad_counts, dead_letter_path: the file's dead letters.
      source_bytes: the CSV's size (on the first spool only).
      lines_in, lines_accounted: the file's physical lines, counted from its bytes,
        and the lines its rows (written, dead-lettered, blank), header and set-aside
        lines cover; they must be equal.
      multiline_rows, largest_span, multiline_first_lines: rows whose quoted
        cells hold newlines: how many, the most lines one spans, the first few.
      statistics: the ``quality.statistics.TableStatistics`` of the rows spooled
        (``None`` with sequences, or when no row was).
      late_columns: ``(column, "path:line")`` of columns first seen past the
        header the run planned with (JSON Lines keys no early object has): not
        written, so reported (on the first spool only).
    """

    split: str
    file_index: int
    path: str
    records: int = 0
    bytes: int = 0
    rows_in: int = 0
    dead: int = 0
    blank: int = 0
    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    source_bytes: int = 0
    lines_in: int = 0
    lines_accounted: int = 0
    multiline_rows: int = 0
    largest_span: int = 0
    multiline_first_lines: tuple[str, ...] = ()
    statistics: object = None
    late_columns: tuple[tuple[str, str], ...] = ()

    @property
    def sizes_path(self) -> str:
        return self.path + SIZES_SUFFIX if self.path else ""

    def record_sizes(self, chunk: int = 1 << 18) -> Iterator[np.ndarray]:
        """The framed size of each record, in order, ``chunk`` records at a time."""
        left = self.records
        with files.open_read(self.sizes_path) as stream:
            while left:
                data = stream.read(8 * min(chunk, left))
                if not data or len(data) % 8:
                    raise OSError(f"{self.sizes_path} holds fewer than {self.records} record sizes")
                sizes = np.frombuffer(data, dtype="<i8")
                left -= len(sizes)
                yield sizes


def plan_table_shards(infos: Sequence[SpoolInfo | ImageSpool], band: ShardBand,
                      compression: str) -> list[ShardSpec]:
    """Cuts each split, in (file, row) order, into shards of nearly equal bytes,
    each a list of byte ranges of the spools.

    The shard count comes from the spools' byte totals; the cuts from their
    record sizes, a chunk at a time (a ``SpoolInfo``'s are read from its sidecar:
    no split's sizes are ever held whole), and are the ones ``cut_shards`` gives
    all of a split's sizes. ``ImageSpool``s (spooled images) carry their sizes.
    """
    specs = []
    by_split: dict[str, list[SpoolInfo]] = {}
    for info in infos:
        if info.path:
            by_split.setdefault(info.split, []).append(info)
    for split in sorted(by_split):
        spools = sorted(by_split[split], key=lambda i: i.file_index)
        totals = [_spool_bytes(s) for s in spools]
        cut = StreamedCut(sum(totals), sum(_spool_records(s) for s in spools), band)
        num_shards = cut.num_shards
        shard = _ShardBuilder(split, 0, num_shards, compression)
        for spool, spool_bytes in zip(spools, totals):
            position = 0  # Byte offset in the spool.
            chunks = spool.record_sizes()
            if isinstance(chunks, np.ndarray):  # An ImageSpool's, whole.
                chunks = [chunks]
            for chunk in chunks:
                for index, sizes in cut.runs(chunk):
                    if shard.index < index:  # The cut leaves no shard empty: the next one.
                        specs.append(shard.spec())
                        shard = _ShardBuilder(split, index, num_shards, compression)
                    position = shard.add(spool.path, position, sizes)
            if position != spool_bytes:
                raise ValueError(f"{spool.path}: record sizes add up to {position} bytes, "
                                 f"the spool holds {spool_bytes}")
        specs.append(shard.spec())
    progress.plan(shards=len(specs))
    return specs


def _spool_bytes(spool: SpoolInfo | ImageSpool) -> int:
    """A spool's framed bytes: a ``SpoolInfo`` counts them; an ``ImageSpool``'s are summed."""
    if isinstance(spool, SpoolInfo):
        return spool.bytes
    return int(spool.record_sizes().sum())


def _spool_records(spool: SpoolInfo | ImageSpool) -> int:
    """A spool's records: a ``SpoolInfo`` counts them; an ``ImageSpool``'s sizes do."""
    if isinstance(spool, SpoolInfo):
        return spool.records
    return len(spool.record_sizes())


class _ShardBuilder:
    """One shard of a plan, gathered a run of records at a time: its spool
    segments, bytes and (uncompressed) verification checkpoints, the ones
    ``codec.record_offsets.checkpoints`` gives all its sizes."""

    def __init__(self, split: str, index: int, num_shards: int, compression: str):
        self.split, self.index, self.num_shards = split, index, num_shards
        self._compression = compression
        self._segments: list[list] = []  # [spool, start, end, records]
        self._bytes = 0
        self._records = 0
        self._next_target = CHECKPOINT_BYTES
        self._checkpoints: list[tuple[int, int]] = []

    def add(self, spool: str, start: int, sizes: np.ndarray) -> int:
        """Adds records ``sizes`` that start at byte ``start`` of ``spool``; returns their end."""
        run = int(sizes.sum())
        last = self._segments[-1] if self._segments else None
        if last is not None and last[0] == spool and last[2] == start:
            last[2] += run
            last[3] += len(sizes)
        else:
            self._segments.append([spool, start, start + run, len(sizes)])
        if self._compression == "none":
            ends = np.cumsum(sizes)
            ends += self._bytes
            if self._next_target <= ends[-1]:
                # The first record boundary at or after each multiple of the spacing.
                targets = np.arange(self._next_target, int(ends[-1]) + 1, CHECKPOINT_BYTES)
                for i in np.unique(np.searchsorted(ends, targets)).tolist():
                    point = (int(ends[i]), self._records + i + 1)
                    if not self._checkpoints or self._checkpoints[-1] != point:
                        self._checkpoints.append(point)
                self._next_target = int(targets[-1]) + CHECKPOINT_BYTES
        self._bytes += run
        self._records += len(sizes)
        return start + run

    def spec(self) -> ShardSpec:
        # The file's end is no checkpoint (nor is a lone record's).
        points = tuple(p for p in self._checkpoints if p[1] < self._records)
        return shard_spec(self.split, self.index, self.num_shards, self._compression, self._bytes,
                          SpoolSegments(tuple(tuple(s) for s in self._segments)), points)
