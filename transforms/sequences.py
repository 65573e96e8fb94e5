"""BuildSequences, PlanSequenceShards: rows grouped by ``--sequence_key`` into
``tf.train.SequenceExample`` records, in shards ordered by key.

Rows of one key may sit in several batches and files, so they meet in a
GroupByKey (rows are small: parsed values, not records). Each key's rows are
sorted (by ``--sequence_order``, then file and line), become one record, and are
spooled by the worker that built them; only each record's key, split and size
leave that step. Shards are then cut from the records sorted by a hash of their
key, and copied out of the spools by offset, so reruns give the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_tfrecords.schemas.elements import ShardSpec, SpoolSegments
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec.record_offsets import checkpoints
from beam_tfrecords.transforms.codec.sequence import encode_sequence_example
from beam_tfrecords.transforms.codec.tfrecord import TFRecordWriter, frame_record
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.plan.shard_cuts import split_specs

__all__ = ["BuildSequences", "PlanSequenceShards", "SequenceSpool", "plan_sequence_shards"]


@dataclasses.dataclass(frozen=True)
class SequenceSpool:
    """Records one worker spooled: per record its split, key hash and size."""

    path: str
    splits: tuple[str, ...]
    keys: tuple[str, ...]
    sizes: bytes  # little-endian int64 per record, in spool order
    rows: int  # rows that went into these records


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


class _BuildSequencesFn(beam.DoFn):
    """``(key, [[row, ...], ...])`` → records in a spool; one ``SequenceSpool`` per bundle."""

    def __init__(self, schema: TableSchema, spool_dir: str):
        self._context = [c for c in schema.kept if not c.sequence]
        self._lists = [c for c in schema.kept if c.sequence]
        self._positions = {c.name: i for i, c in enumerate(schema.kept)}
        self._spool_dir = spool_dir
        self._state = None

    def start_bundle(self):
        self._state = None

    def _open(self):
        path = files.join(self._spool_dir, f"seq-{uuid.uuid4().hex}.spool")
        stream = files.open_write(path)
        self._state = (path, stream, TFRecordWriter(stream), [], [], [], [0])

    def process(self, element: tuple[str, Sequence[list]]) -> Iterator:
        key, batches = element
        rows = sorted((row for batch in batches for row in batch), key=lambda r: r[:3])
        first = rows[0][4]
        pos = self._positions
        record = encode_sequence_example(
            [(c.feature_name, c.dtype, first[pos[c.name]]) for c in self._context],
            [(c.feature_name, c.dtype, [row[4][pos[c.name]] for row in rows]) for c in self._lists],
        )
        framed = frame_record(record)
        if self._state is None:
            self._open()
        _, _, writer, splits, keys, sizes, count = self._state
        writer.write_framed(framed)
        splits.append(rows[0][3])
        keys.append(_key_hash(key))
        sizes.append(len(framed))
        count[0] += len(rows)
        return iter(())

    def finish_bundle(self):
        if self._state is None:
            return
        path, stream, writer, splits, keys, sizes, count = self._state
        writer.close()
        stream.close()
        self._state = None
        spool = SequenceSpool(path, tuple(splits), tuple(keys),
                              np.asarray(sizes, dtype="<i8").tobytes(), count[0])
        yield WindowedValue(spool, MIN_TIMESTAMP, [GlobalWindow()])


class BuildSequences(beam.PTransform):
    """Rows keyed by sequence key → ``SequenceSpool`` per worker bundle."""

    def __init__(self, schema: TableSchema, spool_dir: str):
        super().__init__()
        self._schema = schema
        self._spool_dir = spool_dir

    def expand(self, rows):
        return (
            rows
            | "GroupRowsByKey" >> beam.GroupByKey()
            | "Build" >> beam.ParDo(_BuildSequencesFn(self._schema, self._spool_dir))
        )


def plan_sequence_shards(spools: Sequence[SequenceSpool], band: ShardBand,
                         compression: str) -> list[ShardSpec]:
    """Per split, records sorted by key hash, cut into shards of nearly equal bytes."""
    entries: dict[str, list[tuple[str, str, int, int]]] = {}  # split → (key, spool, start, end)
    for spool in spools:
        sizes = np.frombuffer(spool.sizes, dtype="<i8")
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        for split, key, start, size in zip(spool.splits, spool.keys, starts, sizes):
            entries.setdefault(split, []).append((key, spool.path, int(start), int(start + size)))
    specs = []
    for split in sorted(entries):
        records = sorted(entries[split])
        specs.extend(split_specs(
            split, [end - start for _, _, start, end in records], band, compression,
            lambda a, b, records=records: _segments(records[a:b]),
            checkpoints if compression == "none" else None))
    progress.plan(shards=len(specs))
    return specs


def _segments(records: Sequence[tuple[str, str, int, int]]) -> SpoolSegments:
    """``(key, spool, start, end)`` of a shard's records, in order → its spool
    segments (neighbours in one spool joined)."""
    run: list[list] = []
    for _, path, start, end in records:
        if run and run[-1][0] == path and run[-1][2] == start:
            run[-1][2] = end
            run[-1][3] += 1
        else:
            run.append([path, start, end, 1])
    return SpoolSegments(tuple(tuple(s) for s in run))


class PlanSequenceShards(beam.PTransform):
    """``SequenceSpool``s → ``ShardSpec`` per shard, and the rows grouped."""

    def __init__(self, band: ShardBand, compression: str = "none"):
        super().__init__()
        self._band = band
        self._compression = compression

    def expand(self, spools):
        collected = spools | "Collect" >> beam.combiners.ToList()
        specs = (
            collected
            | "Cut" >> beam.FlatMap(plan_sequence_shards, self._band, self._compression)
            | "Spread" >> beam.Reshuffle()
        )
        grouped = collected | "CountRows" >> beam.Map(
            lambda spools: (sum(s.rows for s in spools), tuple(s.path for s in spools))
        )
        return specs, grouped
