"""One table file's rows on their way to its spools: what the CSV segment reader
(``transforms.csv_segments``) and the Parquet and JSON Lines reader
(``transforms.typed_tables``) share, below the encode step (``transforms.tables``).

- ``FileState``: what reading one file has found so far (counts, dead letters,
  its spools, statistics, the lines it accounts for).
- ``TableSpooler`` encodes a file's batches (in helper processes when the config
  allows; ``encoded``) and takes each encoded batch into the file's state:
  records appended to one spool per split (``SpoolSink``), dead letters, counts,
  statistics; with a sequence key, the rows go out grouped (``sequence_rows``).
- ``drop_rows`` takes rows out of an encoded batch after the fact (a cell not
  UTF-8, a stray quote, a column the schema does not name).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Generator, Iterator
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa

from beam_tfrecords.schemas.config import CsvDialect, TableLayout
from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec.table_batches import (
    BAD,
    BLANK,
    EncodedBatch,
    RowError,
    encode_table_batch,
    sequence_table_batch,
)
from beam_tfrecords.transforms.io import csv_stream, files, progress
from beam_tfrecords.transforms.io.csv_stream import (
    FileCounts,
    LineIndex,
    RowText,
    csv_header,
)
from beam_tfrecords.transforms.io.helpers import ordered_map, ready_helper_pool
from beam_tfrecords.transforms.io.table_readers import table_columns, table_format
from beam_tfrecords.transforms.quality.statistics import TableStatistics, table_batch_statistics
from beam_tfrecords.transforms.spools import SIZES_SUFFIX

__all__ = [
    "MULTILINE_SAMPLES",
    "ROWS_TAG",
    "Encoded",
    "FileState",
    "SpoolSink",
    "TableFileReader",
    "TableSpooler",
    "drop_rows",
    "table_header",
]

ROWS_TAG = "rows"
MULTILINE_SAMPLES = 5
# A batch this large whose rows are long (a long row's, read alone) is encoded in this
# process: a helper would take a pickled copy in and give one back.
_HELPER_BATCH_BYTES = 16 << 20


def table_header(dialect: CsvDialect, path: str) -> list[str]:
    """The column names of a table file: a CSV's header (see ``csv_header``), a
    Parquet file's schema, or the keys of a JSON Lines file's first objects.

    Raises:
      ValueError: if the file cannot be read, has no columns, or names a column twice.
    """
    if table_format(path) == "csv":
        return csv_header(dialect, path)
    names = table_columns(path)
    if not names:
        raise ValueError(f"{path}: no columns (no JSON object in its first lines)")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{path} names columns more than once ({', '.join(twice)}): a feature "
                         "needs one column")
    return names


class SpoolSink:
    """One (file, split)'s spool being written: framed records, and their sizes
    to the sidecar."""

    def __init__(self, path: str):
        self.path = path
        self.records = 0
        self.bytes = 0
        self._stream = files.open_write(path)
        self._sizes = files.open_write(path + SIZES_SUFFIX)

    def write(self, blob, sizes: np.ndarray) -> None:
        self._stream.write(blob)  # Already framed; the shard's copy is what gets digested.
        self._sizes.write(np.asarray(sizes, dtype="<i8").tobytes())
        self.records += len(sizes)
        self.bytes += int(np.sum(sizes))

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._sizes.close()


@dataclasses.dataclass
class FileState:
    """What reading one table file has found so far (a CSV file: across its segments)."""

    path: str
    file_index: int
    header: list[str]
    task_bytes: bytes
    counts: FileCounts
    index: LineIndex | None = None
    # A second reader of line starts, for the last lines of rows that span lines
    # (a LineIndex only moves forward; these run ahead of ``index``).
    close_index: LineIndex | None = None
    dead: list = dataclasses.field(default_factory=list)
    sinks: dict = dataclasses.field(default_factory=dict)  # split → SpoolSink
    rows_in: int = 0
    blank: int = 0
    lines_done: int = 0
    multiline_rows: int = 0
    largest_span: int = 0
    multiline_lines: list = dataclasses.field(default_factory=list)
    statistics: dict = dataclasses.field(default_factory=dict)  # split → TableStatistics
    late_columns: dict = dataclasses.field(default_factory=dict)  # column → "path:line" first seen
    lines_in: int = 0  # Once read: its lines (Parquet: the rows its metadata counts).

    def note_multiline(self, line: int, span: int) -> None:
        self.multiline_rows += 1
        self.largest_span = max(self.largest_span, span)
        if len(self.multiline_lines) < MULTILINE_SAMPLES:
            self.multiline_lines.append(f"{self.path}:{line}")


def drop_rows(encoded: EncodedBatch, drops: dict[int, tuple[str, str] | None]) -> EncodedBatch:
    """The batch with rows taken out: ``{row: (reason, message)}`` turns a row into an
    error (a dead letter); ``{row: None}`` removes it without one (it is accounted for
    elsewhere). Their records, or sequence rows, are removed."""
    if not drops:
        return encoded
    status = encoded.status.copy()
    errors = [e for e in encoded.errors if e.row not in drops]
    errors += [RowError(row, *drop) for row, drop in sorted(drops.items()) if drop is not None]
    errors.sort()
    if encoded.groups:
        groups = {key: [r for r in rows if r[1] not in drops] for key, rows in encoded.groups.items()}
        for row in drops:
            status[row] = BAD
        return dataclasses.replace(encoded, status=status, errors=errors,
                                   groups={key: rows for key, rows in groups.items() if rows})
    blobs, sizes = list(encoded.blobs), list(encoded.sizes)
    for k in range(len(blobs)):
        rows = np.nonzero(encoded.status == k)[0]
        keep = np.array([int(r) not in drops for r in rows], dtype=bool)
        if keep.all():
            continue
        ends = np.cumsum(sizes[k])
        starts = ends - sizes[k]
        blobs[k] = b"".join(blobs[k][int(s):int(e)] for s, e, kept in zip(starts, ends, keep) if kept)
        sizes[k] = sizes[k][keep]
    for row in drops:
        status[row] = BAD
    return dataclasses.replace(encoded, status=status, blobs=blobs, sizes=sizes, errors=errors,
                               statistics=None)


class _HelperRun:
    """Batches from ``batches`` up to (not with) the first of long rows (``_long_rows``),
    which it keeps in ``large`` (``None`` once ``batches`` ended without one)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches = batches
        self.large: pa.RecordBatch | None = None

    def __iter__(self):
        return self

    def __next__(self) -> pa.RecordBatch:
        if self.large is not None:
            raise StopIteration
        batch = next(self._batches)
        if _long_rows(batch):
            self.large = batch
            raise StopIteration
        return batch


def _long_rows(batch: pa.RecordBatch) -> bool:
    """Whether a batch is over ``_HELPER_BATCH_BYTES`` and its rows over a block each
    (on average): a long row's, read alone (not a batch of many wide rows)."""
    return batch.nbytes > max(_HELPER_BATCH_BYTES, batch.num_rows * csv_stream.BLOCK_BYTES)


def _encode_here(encode, task_bytes: bytes, batch: pa.RecordBatch) -> EncodedBatch:
    """``encode`` in this process; before a long row's batch, the memory its reading
    freed goes back to the system (Arrow's pool keeps freed blocks)."""
    if _long_rows(batch):
        pa.default_memory_pool().release_unused()
    return encode(task_bytes, batch)


def _kept(batches, kept: collections.deque):
    """``batches``, each appended to ``kept`` as it passes."""
    for batch in batches:
        kept.append(batch)
        yield batch


class Encoded(NamedTuple):
    """A batch as read, with what encoding it gave."""

    batch: pa.RecordBatch
    newlines: np.ndarray  # The newlines inside each row's quoted cells.
    encoded: EncodedBatch


class TableSpooler:
    """Encodes a table file's batches and takes them into its ``FileState``: records
    to the spools under ``spool_dir``, dead letters, counts and statistics.

    Args:
      schema: the table schema.
      layout: splits and sequences.
      spool_dir: where to spool the framed records.
      helper_processes: helper processes that encode batches (0: this process).
    """

    def __init__(self, schema: TableSchema, layout: TableLayout, spool_dir: str, helper_processes: int):
        self._schema = schema
        self._layout = layout
        self._spool_dir = spool_dir
        self._processes = helper_processes

    def encoded(self, reader, task_bytes: bytes) -> Iterator[Encoded]:
        """The batches of ``reader`` and their encoding, in order, encoded in helper
        processes when the config allows (the reader stays a batch or two ahead); a
        batch of long rows (``_long_rows``) is encoded here, once those before it are done."""
        encode = sequence_table_batch if self._layout.sequence_key else encode_table_batch
        processes = self._processes
        pool = ready_helper_pool(processes) if processes > 0 else None
        if pool is None:
            for batch in reader:
                encoded = _encode_here(encode, task_bytes, batch)
                yield Encoded(batch, encoded.newlines, encoded)
            return
        # The reader runs at most processes + 1 batches ahead; ``in_flight`` holds
        # those few. (Not ``itertools.tee``: it frees its items 57 at a time, so it
        # held up to 57 batches, ~300 MB, whatever the window.)
        in_flight: collections.deque = collections.deque()
        batches = iter(reader)
        while True:
            run = _HelperRun(batches)
            for encoded in ordered_map(pool, functools.partial(encode, task_bytes), _kept(run, in_flight),
                                       processes + 1):
                yield Encoded(in_flight.popleft(), encoded.newlines, encoded)
            if run.large is None:
                return
            batch, run.large = run.large, None
            encoded = _encode_here(encode, task_bytes, batch)
            yield Encoded(batch, encoded.newlines, encoded)
            del batch, encoded


    def take_batch(self, state: FileState, batch, lines, invalid: list[RowText], newlines,
                   encoded: EncodedBatch) -> None:
        """Takes an encoded batch (its rows at ``lines``; ``invalid``: the rows pyarrow
        refused before them) into the file's state and spools."""
        path, header = state.path, state.header
        state.dead.extend(self._invalid_rows(path, invalid, len(header)))
        state.rows_in += sum(1 for _, text in invalid if text.strip())
        for line, text in invalid:
            if "\n" in text:
                state.note_multiline(line, 1 + text.count("\n"))
        spans = np.nonzero(newlines)[0]
        for row in spans[:MULTILINE_SAMPLES]:
            state.note_multiline(int(lines[row]), 1 + int(newlines[row]))
        if len(spans) > MULTILINE_SAMPLES:
            state.multiline_rows += len(spans) - MULTILINE_SAMPLES
            state.largest_span = max(state.largest_span, 1 + int(newlines[spans].max()))
        state.blank += int((encoded.status == BLANK).sum())
        state.rows_in += int((encoded.status != BLANK).sum())
        for row, reason, message in encoded.errors:
            state.dead.append(DeadLetter(f"{path}:{int(lines[row])}", "validate", reason, message))
        for split, blob, sizes in zip(encoded.splits, encoded.blobs, encoded.sizes):
            if not len(sizes):
                continue
            if split not in state.sinks:
                state.sinks[split] = SpoolSink(
                    files.join(self._spool_dir, f"{state.file_index:05d}-{split}.spool"))
            state.sinks[split].write(blob, sizes)
        if not self._layout.sequence_key:
            parts = encoded.statistics
            if parts is None:  # Rows were dropped after encoding: summarise those written.
                parts = table_batch_statistics(self._schema, batch, encoded.status, encoded.splits)
            for split, part in parts.items():
                state.statistics.setdefault(split, TableStatistics()).merge(part)
        progress.inputs_at(id(state), state.rows_in, progress.bytes_taken(state.counts, lines))

    def sequence_rows(self, state: FileState, lines, encoded: EncodedBatch) -> Iterator:
        """With a sequence key: the batch's rows, by key, for the sequences' GroupByKey."""
        for key, group in encoded.groups.items():
            # (key, [(order, file index, line, split, values), ...]) for GroupByKey.
            yield beam.pvalue.TaggedOutput(ROWS_TAG, (key, [
                (order, state.file_index, int(lines[row]), split, values)
                for order, row, split, values in group
            ]))

    def take_invalid(self, state: FileState, rest: list[RowText]) -> None:
        """Takes the rows pyarrow refused after a segment's last batch."""
        for line, text in rest:
            state.dead.extend(self._invalid_rows(state.path, [(line, text)], len(state.header)))
            state.rows_in += 1 if text.strip() else 0
            if "\n" in text:
                state.note_multiline(line, 1 + text.count("\n"))

    def _invalid_rows(self, path: str, invalid, expected: int) -> list[DeadLetter]:
        letters = []
        for line, text in invalid:
            if not text.strip():
                continue
            letters.append(DeadLetter(
                f"{path}:{line}", "read", "bad_row",
                f"the row ({len(text):,} characters) does not split into {expected} cells (wrong "
                "cell count, or broken quoting)",
            ))
        return letters




class TableFileReader:
    """What reads one table file whole for the encode step: ``read`` yields the rows
    grouped for sequences (with a sequence key) and returns the file's ``FileState``,
    its spools closed; its batches are encoded and taken in by ``spooler``.

    Args:
      schema: the table schema.
      dialect: how CSV files are written.
      layout: splits and sequences.
      spooler: encodes the batches and takes them into the file's state.
    """

    def __init__(self, schema: TableSchema, dialect: CsvDialect, layout: TableLayout,
                 spooler: TableSpooler):
        self._schema = schema
        self._dialect = dialect
        self._layout = layout
        self._spooler = spooler

    def read(self, file_index: int, path: str) -> Generator[object, None, FileState]:
        """Reads the file ``path``, ``file_index`` in the input order."""
        raise NotImplementedError
