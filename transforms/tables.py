"""Tables: CSV, Parquet and JSON Lines files → spooled records → size-banded shards.

Row sizes are unknown until rows are encoded, so each file is read once
(pyarrow's streaming CSV reader a block at a time; Parquet a batch of a row
group at a time; JSON Lines a block of lines at a time), its rows encoded in
batches (typed Parquet and JSON values are first written as the cell text a CSV
of the same table holds, see ``codec.table_cells``, so every format gives the
same records),
and the framed records appended to spool files, one per (file, split), in row
order, each record's framed size to the spool's sidecar (``<spool>.sizes``).
Only small metadata leaves that step: each spool's record and byte totals.
Shards are planned by streaming the sidecars (the same cuts as one array of all
sizes would give, in bounded memory) and built by copying byte ranges out of the
spools (a TFRecord file is a plain concatenation of framed records), in file and
row order, so a rerun gives the same bytes.

A row longer than a block is read and encoded alone, in this process, each copy
let go before the next (about three times the row at most); one longer than
``table_readers.MAX_ROW_BYTES`` is dead-lettered without being read into memory.
"""

from __future__ import annotations

import codecs
import collections
import csv
import dataclasses
import functools
import hashlib
import io
import itertools
import json
import logging
import pickle
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from beam_tfrecords.schemas.config import CsvDialect, TableLayout
from beam_tfrecords.schemas.elements import DeadLetter, InputSummary
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.codec.table_batches import (
    BAD,
    BLANK,
    EncodedBatch,
    TableTask,
    encode_table_batch,
    sequence_table_batch,
)
from beam_tfrecords.transforms.codec.table_cells import text_batch
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.codec.tfrecord import ObservingReader
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.helpers import ordered_map, ready_helper_pool
from beam_tfrecords.transforms.io.table_readers import (
    JsonLinesReader,
    ParquetReader,
    arrow_error_text,
    max_row_bytes,
    table_columns,
    table_format,
)
from beam_tfrecords.transforms.quality.statistics import (
    TableStatistics,
    merge_table_statistics,
    table_batch_statistics,
)
from beam_tfrecords.transforms.spools import SIZES_SUFFIX, SpoolInfo, plan_table_shards

__all__ = [
    "EncodeTables",
    "PlanTableShards",
    "RowsToExamples",
    "csv_header",
    "plan_table_shards",
    "table_files",
    "table_header",
]

ROWS_TAG = "rows"
_BLOCK_BYTES = 4 << 20
# A row longer than the block is found by its bytes and read alone (_EncodeCsvFn._long_row);
# one longer than max_row_bytes() is dead-lettered, streamed past, never held.
# A batch this large whose rows are long (a long row's, read alone) is encoded in this
# process: a helper would take a pickled copy in and give one back.
_HELPER_BATCH_BYTES = 16 << 20
_SCAN_BYTES = 1 << 20  # How much of a long row is looked at, at a time.
_MULTILINE_SAMPLES = 5
# How far (in blocks) the CSV reader may read ahead of the batches taken (see _ReadAhead).
_READ_AHEAD_BLOCKS = 4
_READ_AHEAD_STALL_SECONDS = 2.0
_log = logging.getLogger(__name__)


def table_files(pattern: str) -> list[tuple[str, int]]:
    """The table files (CSV, Parquet, JSON Lines) a path or glob names, sorted, with sizes."""
    return sorted(files.list_files(pattern))


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


def csv_header(dialect: CsvDialect, path: str) -> list[str]:
    """The column names of a CSV file: its first record, or the dialect's ``columns``.

    Raises:
      ValueError: if the file is empty, its first record cannot be parsed, or it
        names a column twice.
    """
    if dialect.no_header:
        names, where = list(dialect.columns), "--columns"
    else:
        with files.open_read(path) as stream:
            head = stream.read(1 << 20).decode(dialect.encoding, errors="replace").lstrip("\ufeff")
        reader = csv.reader(io.StringIO(head, newline=""), delimiter=dialect.delimiter,
                            quotechar=dialect.quote)
        try:
            names, where = [name.strip() for name in next(reader)], f"{path}: the header"
        except (StopIteration, csv.Error) as err:
            raise ValueError(f"{path}: cannot read a header row ({str(err) or 'the file is empty'})") from None
    twice = {name: [i + 1 for i, n in enumerate(names) if n == name]
             for name in dict.fromkeys(names) if names.count(name) > 1}
    if twice:
        listed = "; ".join(f"{name!r} in columns {', '.join(map(str, at))}" for name, at in twice.items())
        raise ValueError(f"{where} names a column more than once ({listed}): a feature needs one "
                         "column; rename the columns, or pass --no_header --columns with unique names")
    return names


class _SpoolSink:
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
class _FileState:
    """What reading one CSV file has found so far, across its segments."""

    path: str
    file_index: int
    header: list[str]
    task_bytes: bytes
    counts: _FileCounts
    index: _LineIndex | None = None
    # A second reader of line starts, for the last lines of rows that span lines
    # (a _LineIndex only moves forward; these run ahead of ``index``).
    close_index: _LineIndex | None = None
    dead: list = dataclasses.field(default_factory=list)
    sinks: dict = dataclasses.field(default_factory=dict)  # split → _SpoolSink
    rows_in: int = 0
    blank: int = 0
    lines_done: int = 0
    multiline_rows: int = 0
    largest_span: int = 0
    multiline_lines: list = dataclasses.field(default_factory=list)
    statistics: dict = dataclasses.field(default_factory=dict)  # split → TableStatistics
    late_columns: dict = dataclasses.field(default_factory=dict)  # column → "path:line" first seen

    def note_multiline(self, line: int, span: int) -> None:
        self.multiline_rows += 1
        self.largest_span = max(self.largest_span, span)
        if len(self.multiline_lines) < _MULTILINE_SAMPLES:
            self.multiline_lines.append(f"{self.path}:{line}")


class _LineTracker:
    """Physical line numbers of rows, counting newlines inside quoted cells.

    pyarrow numbers rows (1 = the header when there is one), not lines; a row
    holding quoted newlines spans several lines. Rows that pyarrow refuses
    (wrong cell count) arrive out of band with their number and text. One
    tracker follows one segment of a file (see ``_EncodeCsvFn``).
    """

    def __init__(self, header_lines: int, first_line: int = 1):
        self.next_row = 1 + header_lines
        self.next_line = first_line + header_lines
        self.invalid: list[tuple[int, str]] = []  # (row number, text), appended by pyarrow

    def _take_invalid(self, upto_row: int | None, out: list) -> None:
        while self.invalid and (upto_row is None or self.invalid[0][0] <= upto_row):
            number, text = self.invalid.pop(0)
            out.append((self.next_line, text))
            self.next_line += 1 + text.count("\n")
            self.next_row = number + 1

    def batch(self, embedded_newlines: np.ndarray) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Lines of a batch's valid rows, and (line, text) of invalid rows before them."""
        invalid_out: list[tuple[int, str]] = []
        lines = np.empty(len(embedded_newlines), dtype=np.int64)
        i = 0
        while i < len(lines):
            if self.invalid and self.invalid[0][0] == self.next_row:
                self._take_invalid(self.next_row, invalid_out)
                continue
            # Valid rows up to the next invalid one: vectorised.
            stop = len(lines)
            if self.invalid:
                stop = min(stop, i + (self.invalid[0][0] - self.next_row))
            span = embedded_newlines[i:stop]
            steps = 1 + span
            lines[i:stop] = self.next_line + np.concatenate(([0], np.cumsum(steps)[:-1]))
            self.next_line += int(steps.sum())
            self.next_row += stop - i
            i = stop
        return lines, invalid_out

    def rest(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        self._take_invalid(None, out)
        return out


class _FileCounts:
    """Newlines and quote characters of one file, counted from its raw bytes, apart
    from the parser: the lines a run must account for."""

    def __init__(self, quote: bytes):
        self.quote = quote
        self.counted_to = 0  # Bytes of the file counted so far (segments re-read some).
        self.newlines = 0
        self.last_byte = b""

    @property
    def lines(self) -> int:
        """Physical lines: newlines, plus a last line without one."""
        return self.newlines + (1 if self.last_byte not in (b"", b"\n") else 0)


class _ReadAhead:
    """Holds pyarrow's CSV reader at most ``blocks`` blocks ahead of the batches taken.

    ``pacsv.open_csv`` reads its stream on a thread of its own up to 32 blocks
    ahead of the batches taken (Arrow's ``MakeBackgroundGenerator`` default, which
    pyarrow does not expose: ARROW-12090), each block a ``bytes`` held until it is
    parsed: 128 MB at 4 MB blocks whenever encoding is slower than reading, which
    it is; only files longer than 32 blocks reach that, so the launcher's peak grew
    with the file. The reader makes one batch of each block (an empty one when
    every row was set aside) and reads on only to end a batch's last row, so a few
    blocks ahead do not starve it. The gate counts the file's bytes, so it paces
    UTF-8 files only (a transcoded file's block is not a block of its bytes), and
    only segments read in blocks (a long row's, read alone, is one block). Should
    the consumer ever wait on the reader
    ``_READ_AHEAD_STALL_SECONDS`` while the gate holds it (a block parses in
    milliseconds), the gate opens for good: the memory of before, never a hang.
    """

    def __init__(self, block_bytes: int, blocks: int = _READ_AHEAD_BLOCKS):
        self._changed = threading.Condition()
        self._block = block_bytes
        self._blocks = blocks
        self._read = 0  # Bytes read.
        self._taken = 0  # Batches taken.
        self._waiting_since: float | None = None  # When the consumer began waiting on the reader.
        self._open = False

    def before_read(self) -> None:
        """Called by the reader's thread before each read: waits for its turn."""
        with self._changed:
            while not self._open and self._read >= (self._taken + self._blocks) * self._block:
                self._changed.wait(0.25)
                since = self._waiting_since
                if since is not None and time.monotonic() - since >= _READ_AHEAD_STALL_SECONDS:
                    self._open = True

    def after_read(self, asked: int, size: int) -> None:
        """Called by the reader's thread with the bytes a read gave (none: the end)."""
        with self._changed:
            self._read += size
            self._open = self._open or (asked > 0 and not size)

    def waiting(self, waiting: bool) -> None:
        """Called by the consumer as it begins and ends waiting on the reader."""
        with self._changed:
            self._waiting_since = time.monotonic() if waiting else None

    def took(self) -> None:
        """Called by the consumer as it takes a batch."""
        with self._changed:
            self._taken += 1
            self._changed.notify_all()

    def release(self) -> None:
        """Lets the reader's thread read on (the segment is done with the reader)."""
        with self._changed:
            self._open = True
            self._changed.notify_all()


class _CountingReader(ObservingReader):
    """Passes a stream through (from byte ``start`` of its file), counting the
    segment's quote characters (an odd count at its end means a quote was never
    closed) and the file's newlines (each byte once, whatever segments re-read);
    ``ahead`` (optional) paces the reads: see ``waiting`` and ``release``."""

    def __init__(self, source, start: int, counts: _FileCounts, ahead: _ReadAhead | None = None):
        super().__init__(source, self._count)
        self._position = start
        self._counts = counts
        self.quotes = 0
        self.ahead = ahead
        self._stopped = False

    def readinto(self, buffer) -> int:
        if self.ahead is None:
            return 0 if self._stopped else super().readinto(buffer)
        self.ahead.before_read()
        size = 0 if self._stopped else super().readinto(buffer)
        self.ahead.after_read(len(buffer), size)
        return size

    def read(self, size: int = -1) -> bytes:
        """The source's bytes as they come (pyarrow reads through this: no copy into a
        buffer and out again, which cost a long row's block twice)."""
        if self.ahead is not None:
            self.ahead.before_read()
        data = b"" if self._stopped else self._source.read(size)
        if self.ahead is not None:
            self.ahead.after_read(size, len(data))
        if data:
            self._count(data)
        return data

    def waiting(self, waiting: bool) -> None:
        """The consumer begins (``True``) or ends waiting on the reader."""
        if self.ahead is not None:
            self.ahead.waiting(waiting)

    def took(self) -> None:
        """The consumer took a batch of the reader."""
        if self.ahead is not None:
            self.ahead.took()

    def release(self, stop: bool = False) -> None:
        """The segment is done with the reader: stop pacing its reads; ``stop``: the
        stream ends here for it (its thread reads no further ahead: past a long row's
        start, the rest is read from there)."""
        self._stopped = self._stopped or stop
        if self.ahead is not None:
            self.ahead.release()

    def _count(self, data: bytes) -> None:
        self.quotes += data.count(self._counts.quote)
        counts = self._counts
        end = self._position + len(data)
        if end > counts.counted_to:
            fresh = data[max(0, counts.counted_to - self._position):]
            counts.newlines += fresh.count(b"\n")
            counts.last_byte = fresh[-1:]
            counts.counted_to = end
        self._position = end

    def close(self) -> None:
        self.release()
        self._source.close()
        super().close()


def _text_after_close(text: str, delimiter: str, quote: str) -> str | None:
    """For the last line of a row whose quoted cell began on an earlier line: the
    text right after the quote that closes that cell, when it is not a delimiter
    or the end of the line (so not CSV: a stray quote merged lines), else ``None``."""
    i = 0
    while i < len(text):
        if text[i] == quote:
            if text[i + 1:i + 2] == quote:
                i += 2
                continue
            after = text[i + 1:].rstrip("\r")
            return after[:40] if after and not after.startswith(delimiter) else None
        i += 1
    return None


class _LineIndex:
    """Byte offsets of line starts, found by reading forward (queries only move on).

    The line breaks of each chunk read are found at once (numpy) and kept as file
    offsets; the bytes are not kept, so moving past a line of any length holds one
    chunk. A line's text is read where it starts.
    """

    def __init__(self, path: str):
        self._path = path
        self._stream = files.open_read(path)
        self._text_stream = None  # Opened for text_of.
        self._line, self._offset = 1, 0  # The current line and where it starts.
        self._read_to = 0  # File offset of the next byte to read.
        self._breaks = np.empty(0, dtype=np.int64)  # File offsets of b"\n"s not yet passed.
        self._next = 0  # Index in _breaks of the first break at or after the current line.

    def _read(self, size: int) -> bool:
        more = self._stream.read(size)
        if not more:
            return False
        found = self._read_to + np.flatnonzero(np.frombuffer(more, dtype=np.uint8) == 10)
        self._breaks = np.concatenate((self._breaks[self._next:], found))
        self._next = 0
        self._read_to += len(more)
        return True

    def offset_of(self, line: int) -> int:
        while self._line < line:
            available = len(self._breaks) - self._next
            if not available:
                if not self._read(1 << 20):
                    return self._read_to
                continue
            step = min(line - self._line, available)
            self._next += step
            self._line += step
            self._offset = int(self._breaks[self._next - 1]) + 1
        return self._offset

    def skip_to(self, line: int, offset: int) -> None:
        """Moves on to ``line``, known to start at byte ``offset`` (past a long row,
        which is then not read again)."""
        if line <= self._line:
            return
        self._stream.seek(offset)
        self._line, self._offset, self._read_to = line, offset, offset
        self._breaks, self._next = np.empty(0, dtype=np.int64), 0

    def text_of(self, line: int, limit: int = 4096) -> str:
        """The line's text (cut to ``limit`` bytes), decoded leniently."""
        offset = self.offset_of(line)
        if self._text_stream is None:
            self._text_stream = files.open_read(self._path)
        self._text_stream.seek(offset)
        return self._text_stream.read(limit).split(b"\n", 1)[0].decode("utf-8", errors="replace")

    def close(self) -> None:
        self._stream.close()
        if self._text_stream is not None:
            self._text_stream.close()


@dataclasses.dataclass(frozen=True)
class _RowExtent:
    """Where a row ends, from its bytes (``_row_extent``).

    Attributes:
      size: its bytes, with the newline that ends it.
      newlines: the newlines inside its quoted cells (it spans ``newlines + 1`` lines).
      closed: whether its quotes close (else the file ends inside a quoted cell).
      more: whether the file goes on after it.
    """

    size: int
    newlines: int
    closed: bool
    more: bool


_FIELD_START, _FIELD, _QUOTED, _QUOTE_PENDING = range(4)


def _row_extent(read, quote: bytes, delimiter: bytes) -> _RowExtent:
    """Finds the end of the row that ``read`` (``read(n) -> bytes``) starts at, as
    pyarrow's CSV reader does (a quote opens a quoted cell only at a cell's start;
    ``""`` inside one is a quote; a newline outside one ends the row), looking at
    ``_SCAN_BYTES`` at a time: memory does not grow with the row."""
    size = newlines = 0
    state = _FIELD_START
    opening = delimiter + quote
    q = quote[0]
    while chunk := read(_SCAN_BYTES):
        n, pos, newline = len(chunk), 0, -2  # newline: the next b"\n" at or after pos (-1: none).
        while pos < n:
            if state == _QUOTE_PENDING:  # The last chunk ended with a quote.
                state = _QUOTED if chunk[pos] == q else _FIELD
                pos += state == _QUOTED
                continue
            if state == _FIELD_START:
                if chunk[pos] == q:
                    state, pos = _QUOTED, pos + 1
                    continue
                state = _FIELD
            if state == _QUOTED:
                close = chunk.find(quote, pos)
                newlines += chunk.count(b"\n", pos, n if close < 0 else close)
                if close < 0 or close + 1 == n:
                    state = _QUOTED if close < 0 else _QUOTE_PENDING
                    break
                state, pos = (_QUOTED, close + 2) if chunk[close + 1] == q else (_FIELD, close + 1)
                continue
            if newline != -1 and newline < pos:
                newline = chunk.find(b"\n", pos)
            opens = chunk.find(opening, pos, n if newline < 0 else newline)
            if opens >= 0:
                state, pos = _FIELD_START, opens + 1
                continue
            if newline >= 0:
                size += newline + 1
                return _RowExtent(size, newlines, True, newline + 1 < n or bool(read(1)))
            state = _FIELD_START if chunk[n - 1:] == delimiter else _FIELD
            break
        size += n
    return _RowExtent(size, newlines, state in (_FIELD_START, _FIELD), False)


class _Window:
    """The first ``size`` bytes of a stream, then its end."""

    def __init__(self, source, size: int):
        self._source = source
        self._left = size

    def read(self, size: int = -1) -> bytes:
        size = self._left if size is None or size < 0 else min(size, self._left)
        data = self._source.read(size) if size else b""
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._source.close()


@dataclasses.dataclass(frozen=True)
class _LongRowAt:
    """A segment's outcome: the row from ``line`` is longer than a block."""

    line: int


def _ascii_structure(dialect: CsvDialect) -> bool:
    """Whether newlines, quotes and delimiters are their single ASCII bytes in the
    file's encoding (UTF-8, Latin-1, ...; not UTF-16), so rows can be found in its bytes."""
    probe = "a\n" + dialect.quote + dialect.delimiter
    try:
        return probe.encode(dialect.encoding).endswith(probe.encode("ascii"))
    except (UnicodeError, LookupError):
        return False


class _Batches:
    """A reader's batches; an unreadable block ends the iteration and is kept in ``error``.
    ``counting`` (a ``_CountingReader``), if given, hears of each wait and batch taken."""

    def __init__(self, reader, counting=None):
        self._reader = reader
        self._counting = counting
        self.error: Exception | None = None

    def drain(self) -> _Batches:
        """Reads every batch now and lets the reader go (a long row's reader holds its
        block, the whole row, while it lives); returns ``self``, to iterate them."""
        self._reader, self._counting = list(self), None
        return self

    def __iter__(self):
        if self._counting is None:
            try:
                yield from self._reader
            except (pa.ArrowInvalid, UnicodeDecodeError) as err:
                self.error = err
            return
        batches = iter(self._reader)
        try:
            while True:
                self._counting.waiting(True)
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                finally:
                    self._counting.waiting(False)
                self._counting.took()
                yield batch
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            self.error = err


def _utf8_columns(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, dict[int, str]]:
    """Binary columns as UTF-8 strings; ``{row: column}`` of cells that are not UTF-8
    (blanked here; their rows become dead letters)."""
    columns, bad = [], {}
    for name, column in zip(batch.schema.names, batch.columns):
        try:
            columns.append(column.cast(pa.string()))
            continue
        except pa.ArrowInvalid:
            pass
        cells = column.to_pylist()
        for row, cell in enumerate(cells):
            try:
                cell.decode("utf-8")
            except UnicodeDecodeError:
                bad.setdefault(row, name)
                cells[row] = b""
        columns.append(pa.array([c.decode("utf-8") for c in cells], type=pa.string()))
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names), bad


def _drop_rows(encoded: EncodedBatch, drops: dict[int, tuple[str, str] | None]) -> EncodedBatch:
    """The batch with rows taken out: ``{row: (reason, message)}`` turns a row into an
    error (a dead letter); ``{row: None}`` removes it without one (it is accounted for
    elsewhere). Their records, or sequence rows, are removed."""
    if not drops:
        return encoded
    status = encoded.status.copy()
    errors = [e for e in encoded.errors if e[0] not in drops]
    errors += [(row, *drop) for row, drop in sorted(drops.items()) if drop is not None]
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
    return batch.nbytes > max(_HELPER_BATCH_BYTES, batch.num_rows * _BLOCK_BYTES)


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


class _EncodeCsvFn(beam.DoFn):
    """``(file_index, path, size)`` → one ``SpoolInfo`` per split with rows."""

    def __init__(self, schema: TableSchema, dialect: CsvDialect, layout: TableLayout, output: str,
                 spool_dir: str, helper_processes: int):
        self._schema = schema
        self._dialect = dialect
        self._layout = layout
        self._output = output
        self._spool_dir = spool_dir
        self._processes = helper_processes

    def _batches(self, reader, task_bytes: bytes) -> Iterator[tuple[pa.RecordBatch, np.ndarray, EncodedBatch]]:
        """``(batch, embedded newlines per row, encoded)``, in order, encoded in helper
        processes when the config allows (the reader stays a batch or two ahead); a
        batch of long rows (``_long_rows``) is encoded here, once those before it are done."""
        encode = sequence_table_batch if self._layout.sequence_key else encode_table_batch
        processes = self._processes
        pool = ready_helper_pool(processes) if processes > 0 else None
        if pool is None:
            for batch in reader:
                encoded = _encode_here(encode, task_bytes, batch)
                yield batch, encoded.newlines, encoded
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
                yield in_flight.popleft(), encoded.newlines, encoded
            if run.large is None:
                return
            batch, run.large = run.large, None
            encoded = _encode_here(encode, task_bytes, batch)
            yield batch, encoded.newlines, encoded
            del batch, encoded

    def process(self, element: tuple[int, str, int]) -> Iterator[SpoolInfo]:
        file_index, path, size = element
        if table_format(path) != "csv":
            yield from self._process_typed(element)
            return
        dialect = self._dialect
        start = time.monotonic()
        hold_point("listing")
        header = csv_header(dialect, path)
        layout = self._layout
        task = TableTask(self._schema, tuple(header), layout.split_column, layout.splits,
                         layout.key_column, dialect.delimiter, dialect.quote,
                         layout.sequence_key, layout.sequence_order)
        RowEncoder(self._schema, header)  # Fails here, with the columns named, on a wrong header.
        state = _FileState(path, file_index, header, pickle.dumps(task),
                           _FileCounts(dialect.quote.encode(dialect.encoding)))
        # A file is read in segments: the first from its start; the next from the line
        # after one set aside (a quote never closed, an unreadable stretch), so one bad
        # line never costs the rows after it.
        line = 1
        try:
            while line is not None:
                line = yield from self._segment(state, line)
        finally:
            for sink in state.sinks.values():
                sink.close()
            for index in (state.index, state.close_index):
                if index is not None:
                    index.close()
        _log.info("Encoded %s: %d rows (%d lines), %d dead-lettered, %d blank, in %.1f s", path,
                  state.rows_in, state.counts.lines, len(state.dead), state.blank, time.monotonic() - start)
        if state.lines_done != state.counts.lines:
            _log.error("%s: %d physical lines, but the rows read account for %d", path,
                       state.counts.lines, state.lines_done)
        yield from self._infos(state, size, state.counts.lines)

    def _infos(self, state: _FileState, size: int, lines_in: int) -> list[SpoolInfo]:
        """The file's ``SpoolInfo``s (its totals on the first), its dead letters written."""
        path, file_index = state.path, state.file_index
        # In line order: letters are found as rows are read and as batches come back encoded.
        dead = sorted(state.dead, key=lambda d: int(d.source.rsplit(":", 1)[1]))
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        dead_path = write_dead_letters(self._output, f"{stem}-{file_index:05d}", dead)
        bad = tuple(sorted(Counter(d.error for d in dead).items()))
        beam.metrics.Metrics.counter("table", "rows").inc(state.rows_in)
        progress.inputs_at(id(state), state.rows_in, state.counts.counted_to, done=True)
        beam.metrics.Metrics.counter("table", "dead_letter").inc(len(dead))
        infos = [
            SpoolInfo(split, file_index, sink.path, sink.records, sink.bytes,
                      statistics=state.statistics.get(split))
            for split, sink in sorted(state.sinks.items())
        ]
        totals = dict(rows_in=state.rows_in, dead=len(dead), blank=state.blank, bad_counts=bad,
                      dead_letter_path=dead_path, source_bytes=size, lines_in=lines_in,
                      lines_accounted=state.lines_done, multiline_rows=state.multiline_rows,
                      largest_span=state.largest_span, multiline_first_lines=tuple(state.multiline_lines),
                      late_columns=tuple(state.late_columns.items()))
        if infos:
            infos[0] = dataclasses.replace(infos[0], **totals)
        else:  # No good row: still report the file's counts.
            infos = [SpoolInfo("", file_index, "", **totals)]
        return infos

    def _process_typed(self, element: tuple[int, str, int]) -> Iterator:
        """A Parquet or JSON Lines file: typed pieces → cell text → the CSV encoder.

        Its "lines" are, for Parquet, the rows its metadata counts; for JSON Lines,
        its physical lines. Each must be covered by a row written, dead-lettered or
        blank, or by a stretch that could not be read.
        """
        file_index, path, size = element
        start = time.monotonic()
        hold_point("listing")
        schema, layout = self._schema, self._layout
        kind = table_format(path)
        try:
            header = table_header(self._dialect, path)
        except ValueError:
            if kind != "jsonl":
                raise
            header = []  # Empty, or no object in its first lines: each line is read on its own.
        if kind == "jsonl":  # Objects may leave keys out: a column no early object names is empty.
            needed = [c.name for c in schema.kept] + [c for c in (
                layout.split_column, layout.key_column, layout.sequence_key, layout.sequence_order) if c]
            header += [name for name in dict.fromkeys(needed) if name not in header]
        task = TableTask(schema, tuple(header), layout.split_column, layout.splits,
                         layout.key_column, ",", '"', layout.sequence_key, layout.sequence_order)
        RowEncoder(schema, header)  # Fails here, with the columns named, on a wrong header.
        state = _FileState(path, file_index, header, pickle.dumps(task), _FileCounts(b'"'))
        specs = {c.name: c for c in schema.kept}
        known = set(header)
        reader = ParquetReader(path, header) if kind == "parquet" else JsonLinesReader(path, _json_types(schema))
        pending: collections.deque = collections.deque()  # (piece, problems) of each batch sent

        def text_batches():
            for piece in reader:
                for stretch in piece.unreadable:
                    stage = "validate" if stretch.reason == "bad_value" else "read"
                    state.dead.append(DeadLetter(f"{path}:{stretch.number}", stage, stretch.reason,
                                                 stretch.message))
                    state.rows_in += 1
                    state.lines_done += stretch.covers
                state.blank += piece.blank
                state.lines_done += piece.blank
                if piece.table.num_rows:
                    batch, problems = text_batch(piece.table, header, specs)
                    self._late_columns(state, piece, known, problems)
                    pending.append((piece, problems))
                    yield batch

        try:
            for batch, _, encoded in self._batches(text_batches(), state.task_bytes):
                piece, problems = pending.popleft()
                if problems:
                    encoded = _drop_rows(encoded, problems)
                numbers = piece.numbers
                self._take_batch(state, batch, numbers, [], np.zeros(len(numbers), dtype=np.int64),
                                 encoded)
                state.lines_done += len(numbers)
                yield from self._sequence_rows(state, numbers, encoded)
        finally:
            for sink in state.sinks.values():
                sink.close()
            reader.close()
        pa.default_memory_pool().release_unused()  # A long line's memory, kept by Arrow's pool.
        lines_in = reader.rows if kind == "parquet" else reader.lines
        what = "rows in its metadata" if kind == "parquet" else "lines"
        _log.info("Encoded %s: %d rows (%d %s), %d dead-lettered, %d blank, in %.1f s", path,
                  state.rows_in, lines_in, what, len(state.dead), state.blank, time.monotonic() - start)
        if state.lines_done != lines_in:
            _log.error("%s: %d %s, but the rows read account for %d", path, lines_in, what,
                       state.lines_done)
        yield from self._infos(state, size, lines_in)

    def _late_columns(self, state: _FileState, piece, known: set, problems: dict) -> None:
        """Notes the columns of a piece that the header did not have (JSON Lines keys
        first seen past its sample): they are not written, so the report names them;
        with ``--strict_schema`` the rows holding one are dead-lettered."""
        for name in piece.table.column_names:
            if name in known:
                continue
            present = np.nonzero(pc.is_valid(piece.table.column(name)).to_numpy(zero_copy_only=False))[0]
            if not present.size:
                continue
            state.late_columns.setdefault(name, f"{state.path}:{piece.numbers[present[0]]}")
            if self._layout.strict_columns:
                why = (f"key {name!r} is not in the schema (--strict_schema refuses columns it "
                       "does not name)")
                for row in present.tolist():
                    problems.setdefault(row, ("unknown_column", why))

    def _open(self, state: _FileState, line: int, window: int | None = None):
        """A reader of the file from ``line`` on (the header is read only from line 1), in
        blocks of ``_BLOCK_BYTES``; or, with ``window``, of that many bytes, one block."""
        dialect = self._dialect
        offset = 0
        if line > 1:
            if state.index is None:
                state.index = _LineIndex(state.path)
            offset = state.index.offset_of(line)
        stream = files.open_read(state.path)
        if offset:
            stream.seek(offset)
        utf8 = codecs.lookup(dialect.encoding).name in ("utf-8", "utf-8-sig")
        if window is None:
            block = _BLOCK_BYTES
            counting = _CountingReader(stream, offset, state.counts, _ReadAhead(block) if utf8 else None)
        else:  # Transcoded to UTF-8 (the block pyarrow parses), a byte may take up to 3.
            block = min(window * (1 if utf8 else 3) + 1, 2**31 - 1)
            counting = _CountingReader(_Window(stream, window), offset, state.counts)
        tracker = _LineTracker(0 if dialect.no_header or line > 1 else 1, line)

        def on_invalid(row) -> str:
            tracker.invalid.append((row.number, row.text or ""))
            return "skip"

        counting.waiting(True)  # open_csv reads the first batch.
        try:
            reader = self._open_csv(counting, state, line, block, on_invalid)
        except BaseException:
            counting.release()
            raise
        finally:
            counting.waiting(False)
        return counting, tracker, reader

    def _open_csv(self, counting, state: _FileState, line: int, block: int, on_invalid):
        dialect = self._dialect
        return pacsv.open_csv(
            counting,
            read_options=pacsv.ReadOptions(
                use_threads=False, block_size=block, encoding=dialect.encoding,
                column_names=list(state.header) if dialect.no_header or line > 1 else None,
            ),
            parse_options=pacsv.ParseOptions(
                delimiter=dialect.delimiter, quote_char=dialect.quote,
                newlines_in_values=True, ignore_empty_lines=False,
                invalid_row_handler=on_invalid,
            ),
            # Bytes, not text: a cell that is not UTF-8 costs its row, not the file.
            convert_options=pacsv.ConvertOptions(
                column_types={name: pa.binary() for name in state.header},
                strings_can_be_null=False, quoted_strings_can_be_null=False,
            ),
        )

    def _set_aside(self, state: _FileState, line: int, reason: str, message: str) -> None:
        """Dead-letters one physical line (by its number: the letter holds none of its text)."""
        state.dead.append(DeadLetter(f"{state.path}:{line}", "read", reason, message))
        state.rows_in += 1

    def _segment(self, state: _FileState, first_line: int):
        """Reads the file from ``first_line``; yields sequence rows, spools records.

        Returns:
          The line where reading goes on, or ``None`` at the end.
        """
        outcome = None
        try:
            counting, tracker, reader = self._open(state, first_line)
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            outcome = self._after_read_error(state, first_line, err, "read")
            if outcome == first_line + 1 and not (first_line < state.counts.lines or first_line == 1):
                return None  # The file's last line: nothing follows it.
        else:
            try:
                outcome = yield from self._read_segment(state, counting, tracker, _Batches(reader, counting))
            finally:  # Before the reader is dropped: its thread may wait on the gate.
                counting.release(stop=isinstance(outcome, _LongRowAt))
            del counting, tracker, reader  # Its blocks go before a long row is read.
        if isinstance(outcome, _LongRowAt):
            return (yield from self._long_row(state, outcome.line))
        return outcome

    def _after_read_error(self, state: _FileState, line: int, err: BaseException, doing: str,
                          long_rows: bool = True) -> int | _LongRowAt:
        """Where reading goes on after pyarrow failed at ``line``: a row longer than its block
        ("straddling") is read alone (``_LongRowAt``); any other error sets the line aside."""
        if long_rows and "straddl" in str(err):
            state.lines_done = line - 1
            return _LongRowAt(line)
        self._set_aside(state, line, "unreadable", f"the line cannot be {doing}: {arrow_error_text(err)}")
        state.lines_done = line
        return line + 1

    def _long_row(self, state: _FileState, line: int):
        """The row from ``line``, longer than a block: its end is found from its bytes
        (one chunk at a time); up to ``max_row_bytes()`` it is read alone, as one block,
        and encoded here, else dead-lettered (``unreadable``) without being held. A
        quote it opens that never closes costs its first line, as in any segment.

        Returns:
          The line where reading goes on, or ``None`` at the end.
        """
        dialect = self._dialect
        path = state.path
        if state.index is None:
            state.index = _LineIndex(path)
        offset = state.index.offset_of(line)
        if not _ascii_structure(dialect):
            self._set_aside(state, line, "unreadable", (
                f"the row is longer than the CSV reader's block ({_BLOCK_BYTES >> 20} MB); rows that "
                f"long are read only in encodings where newlines, quotes and delimiters are single "
                f"bytes (UTF-8, Latin-1, ...), not {dialect.encoding}"))
            state.lines_done = line
            return line + 1
        stream = files.open_read(path)
        try:
            stream.seek(offset)
            extent = _row_extent(_CountingReader(stream, offset, state.counts).read,
                                 dialect.quote.encode("ascii"), dialect.delimiter.encode("ascii"))
        finally:
            stream.close()
        last = line + extent.newlines
        after = None if not extent.more else last + 1
        if not extent.closed:
            self._set_aside(state, line, "unterminated_quote", (
                "a quote opened in the row starting here is never closed, so the rest of "
                f"the file would be one cell; this line is set aside and reading goes on "
                f"at line {line + 1}"))
            state.lines_done = line
            return line + 1 if extent.newlines else None
        limit = max_row_bytes()
        if extent.size > limit:
            lines = f"line {line}" if line == last else f"lines {line}-{last}"
            self._set_aside(state, line, "unreadable", (
                f"the row ({lines}) is {extent.size:,} bytes long, more than the "
                f"{limit:,} a row may be; it is set aside unread and reading goes on "
                f"at the next row"))
            state.lines_done = last
            if after is not None:
                state.index.skip_to(after, offset + extent.size)
            return after
        _log.info("%s: the row from line %d is %.1f MB long: read alone", path, line, extent.size / 1e6)
        counting, tracker, reader = self._open(state, line, window=extent.size)
        batches = _Batches(reader, counting).drain()
        del reader  # It holds its block (the whole row) while it lives.
        outcome = yield from self._read_segment(state, counting, tracker, batches, closed=True)
        del batches
        pa.default_memory_pool().release_unused()  # The row's memory, kept by Arrow's pool.
        if outcome is None and after is not None:
            state.index.skip_to(after, offset + extent.size)
            return after
        return outcome

    def _read_segment(self, state: _FileState, counting, tracker, batches: _Batches, closed: bool = False):
        """``_segment`` once its reader is open; ``closed``: the stream ends where a row
        does, its quotes closed (a long row's window)."""
        unicode_errors: collections.deque = collections.deque()

        def as_text():
            for raw in batches:
                batch, bad = _utf8_columns(raw)
                unicode_errors.append(bad)
                yield batch

        # One batch is held back: at the end, its last row may turn out to hold a
        # quote never closed, which swallowed the rest of the file.
        held, swallowed = None, None
        for item in itertools.chain(self._batches(as_text(), state.task_bytes), [None]):
            if held is None:
                held = item
                continue
            batch, newlines, encoded = held
            held = item
            bad_text = unicode_errors.popleft()
            if bad_text:
                encoded = _drop_rows(encoded, {
                    row: ("invalid_utf8", f"column {column!r} is not valid UTF-8 text")
                    for row, column in bad_text.items()})
            lines, invalid = tracker.batch(newlines)
            if not self._dialect.quoted_newlines and newlines.any():
                encoded = _drop_rows(encoded, {int(row): (
                    "quoted_newline", "a quoted cell holds a newline (--no_quoted_newlines)")
                    for row in np.nonzero(newlines)[0]})
            stray = self._stray_quote(state, lines, newlines)
            if stray is not None:
                row, _ = stray
                first, last = int(lines[row]), int(lines[row] + newlines[row])
                later = range(row, len(newlines))
                encoded = _drop_rows(encoded, dict.fromkeys(later))
                newlines = newlines.copy()
                newlines[row:] = 0
                invalid = [(line, text) for line, text in invalid if line < lines[row]]
                self._take_batch(state, batch, lines, invalid, newlines, encoded)
                state.rows_in -= len(later)  # Read again from the next segment.
                yield from self._sequence_rows(state, lines, encoded)
                message = (f"a quoted cell opened here closes at line {last} followed by text "
                           "other than a delimiter, which is not CSV: a stray quote would merge lines "
                           f"{first}-{last} into one cell; this line is set aside and reading "
                           f"goes on at line {first + 1}")
                self._set_aside(state, first, "bad_quoting", message)
                state.lines_done = first
                return first + 1
            final = item is None and batches.error is None and not closed
            if (final and counting.quotes % 2 and not tracker.invalid and newlines.size
                    and newlines[-1]):
                swallowed = int(lines[-1])
                encoded = _drop_rows(encoded, {len(newlines) - 1: None})
                newlines = newlines.copy()
                newlines[-1] = 0  # Set aside: not a row that spans lines.
                state.rows_in -= 1  # Counted again when its first line is set aside.
            self._take_batch(state, batch, lines, invalid, newlines, encoded)
            yield from self._sequence_rows(state, lines, encoded)
        rest = tracker.rest()
        if (swallowed is None and batches.error is None and not closed and counting.quotes % 2
                and rest and "\n" in rest[-1][1]):
            swallowed = rest.pop()[0]
        self._take_invalid(state, rest)
        if swallowed is not None:
            message = ("a quote opened in the row starting here is never closed, so the rest of "
                       f"the file would be one cell; this line is set aside and reading goes on "
                       f"at line {swallowed + 1}")
            self._set_aside(state, swallowed, "unterminated_quote", message)
            state.lines_done = swallowed
            return swallowed + 1
        if batches.error is not None:
            return self._after_read_error(state, tracker.next_line, batches.error, "parsed",
                                          long_rows=not closed)
        state.lines_done = tracker.next_line - 1
        return None

    def _stray_quote(self, state: _FileState, lines, newlines) -> tuple[int, str] | None:
        """The first row of a batch whose multi-line quoted cell closes with text
        after the quote (``(row, that text)``), or ``None``."""
        spans = np.nonzero(newlines)[0]
        if not len(spans):
            return None
        if state.close_index is None:
            state.close_index = _LineIndex(state.path)
        for row in spans:
            last = int(lines[row] + newlines[row])
            after = _text_after_close(state.close_index.text_of(last), self._dialect.delimiter,
                                      self._dialect.quote)
            if after is not None:
                return int(row), after
        return None

    def _take_batch(self, state, batch, lines, invalid, newlines, encoded) -> None:
        path, header = state.path, state.header
        state.dead.extend(self._invalid_rows(path, invalid, len(header)))
        state.rows_in += sum(1 for _, text in invalid if text.strip())
        for line, text in invalid:
            if "\n" in text:
                state.note_multiline(line, 1 + text.count("\n"))
        spans = np.nonzero(newlines)[0]
        for row in spans[:_MULTILINE_SAMPLES]:
            state.note_multiline(int(lines[row]), 1 + int(newlines[row]))
        if len(spans) > _MULTILINE_SAMPLES:
            state.multiline_rows += len(spans) - _MULTILINE_SAMPLES
            state.largest_span = max(state.largest_span, 1 + int(newlines[spans].max()))
        state.blank += int((encoded.status == BLANK).sum())
        state.rows_in += int((encoded.status != BLANK).sum())
        for row, reason, message in encoded.errors:
            state.dead.append(DeadLetter(f"{path}:{int(lines[row])}", "validate", reason, message))
        for split, blob, sizes in zip(encoded.splits, encoded.blobs, encoded.sizes):
            if not len(sizes):
                continue
            if split not in state.sinks:
                state.sinks[split] = _SpoolSink(
                    files.join(self._spool_dir, f"{state.file_index:05d}-{split}.spool"))
            state.sinks[split].write(blob, sizes)
        if not self._layout.sequence_key:
            parts = encoded.statistics
            if parts is None:  # Rows were dropped after encoding: summarise those written.
                parts = table_batch_statistics(self._schema, batch, encoded.status, encoded.splits)
            for split, part in parts.items():
                state.statistics.setdefault(split, TableStatistics()).merge(part)
        progress.inputs_at(id(state), state.rows_in, progress.bytes_taken(state.counts, lines))

    def _sequence_rows(self, state, lines, encoded) -> Iterator:
        for key, group in encoded.groups.items():
            # (key, [(order, file index, line, split, values), ...]) for GroupByKey.
            yield beam.pvalue.TaggedOutput(ROWS_TAG, (key, [
                (order, state.file_index, int(lines[row]), split, values)
                for order, row, split, values in group
            ]))

    def _take_invalid(self, state, rest) -> None:
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


def _json_types(schema: TableSchema) -> dict[str, pa.DataType]:
    """The Arrow types JSON values of int64 and float columns are read as (so an
    integer never goes through a float, and a value of another type costs its line)."""
    scalar = {"int64": pa.int64(), "float": pa.float64()}
    return {c.name: pa.list_(scalar[c.type]) if c.is_list else scalar[c.type]
            for c in schema.kept if c.type in scalar}


class EncodeTables(beam.PTransform):
    """Table files (CSV, Parquet, JSON Lines) → ``SpoolInfo`` per (file, split): rows
    encoded into spool files.

    Args:
      inputs: the table files, ``(path, size)``, in order.
      schema: the table schema.
      dialect: how the files are written.
      layout: splits and sequences.
      output: the output folder (for dead letters).
      spool_dir: where to spool the framed records.
      helper_processes: helper processes that encode batches (0: this process).
    """

    def __init__(self, inputs: Sequence[tuple[str, int]], schema: TableSchema, dialect: CsvDialect,
                 layout: TableLayout, output: str, spool_dir: str, helper_processes: int = 0):
        super().__init__()
        self._inputs = list(inputs)
        self._fn = _EncodeCsvFn(schema, dialect, layout, output, spool_dir, helper_processes)

    def expand(self, pbegin):
        """Returns a ``DoOutputsTuple``: ``.infos`` (``SpoolInfo``), and with a
        sequence key also ``.rows`` (rows grouped by key within a batch)."""
        inputs = [(i, path, size) for i, (path, size) in enumerate(self._inputs)]
        files_in = pbegin | "Files" >> beam.Create(inputs)
        if len(inputs) > 1:  # Spread the files over workers; one file needs no shuffle.
            files_in = files_in | "Spread" >> beam.Reshuffle()
        return (
            files_in
            | "EncodeRows" >> beam.ParDo(self._fn).with_outputs(ROWS_TAG, main="infos")
        )


def table_summary(
    infos: Sequence[SpoolInfo],
    root: str,
    schema: TableSchema,
    sequences: bool = False,
    grouped: tuple[int, tuple[str, ...]] = (0, ()),
) -> InputSummary:
    """The input summary of a table run.

    Args:
      infos: every file's ``SpoolInfo``.
      root: the input (path or glob), as the manifest records it.
      schema: the schema used.
      sequences: whether rows were grouped into sequences.
      grouped: with sequences: rows that went into them, and the sequence spools.
    """
    bad: Counter = Counter()
    for info in infos:
        bad.update(dict(info.bad_counts))
    features, sequence_features = [], []
    for column in schema.kept:
        entry = (column.feature_name, column.dtype, tuple(column.feature_shape()))
        (sequence_features if sequences and column.sequence else features).append(entry)
        if column.shape is not None and column.encoding == "flat":
            features.append((f"{column.feature_name}/shape", "int64", (len(column.shape),)))
    return InputSummary(
        root=root,
        layout="table",
        input_files=len({i.file_index for i in infos}),
        input_bytes=sum(i.source_bytes for i in infos),
        ignored_files=0,
        vocabulary=(),
        bad_counts=tuple(sorted(bad.items())),
        dead_letter_path="",
        rows_in=sum(i.rows_in for i in infos),
        blank_rows=sum(i.blank for i in infos),
        features=tuple(sorted(features)),
        dead_letter_paths=tuple(sorted(i.dead_letter_path for i in infos if i.dead_letter_path)),
        spools=tuple(sorted([*(p for i in infos if i.path for p in (i.path, i.sizes_path)),
                             *grouped[1]])),
        schema=json.dumps(schema.to_dict()),
        sequence_features=tuple(sorted(sequence_features)),
        rows_grouped=grouped[0],
        lines_in=sum(i.lines_in for i in infos),
        lines_accounted=sum(i.lines_accounted for i in infos),
        multiline=(sum(i.multiline_rows for i in infos),
                   max((i.largest_span for i in infos), default=0),
                   tuple(where for i in sorted(infos, key=lambda i: i.file_index)
                         for where in i.multiline_first_lines)[:_MULTILINE_SAMPLES]),
        statistics=() if sequences else merge_table_statistics((i.split, i.statistics) for i in infos),
        late_columns=_first_seen(infos),
    )


def _first_seen(infos: Sequence[SpoolInfo]) -> tuple[tuple[str, str], ...]:
    """Each late column once, where the first file in input order has it."""
    seen: dict[str, str] = {}
    for info in sorted(infos, key=lambda i: i.file_index):
        for name, where in info.late_columns:
            seen.setdefault(name, where)
    return tuple(seen.items())


class PlanTableShards(beam.PTransform):
    """``SpoolInfo``s → ``ShardSpec`` per shard (main) and one ``InputSummary``.

    Args:
      band: the shard size band.
      compression: ``none`` or ``gzip``.
      root: the input, as the manifest records it.
      schema: the schema used.
    """

    def __init__(self, band: ShardBand, compression: str, root: str, schema: TableSchema):
        super().__init__()
        self._band = band
        self._compression = compression
        self._root = root
        self._schema = schema

    def expand(self, infos):
        collected = infos | "Collect" >> beam.combiners.ToList()
        specs = (
            collected
            | "Cut" >> beam.FlatMap(plan_table_shards, self._band, self._compression)
            | "Spread" >> beam.Reshuffle()
        )
        summary = collected | "Summarize" >> beam.Map(table_summary, self._root, self._schema)
        return specs, summary


class _RowsToExamplesFn(beam.DoFn):
    """Rows (dicts, or cell sequences in ``columns`` order) → ``(key, Example bytes)``,
    encoded a batch at a time by the CLI's own table codec."""

    _BATCH = 4096

    def __init__(self, schema: TableSchema, columns: Sequence[str], key_column: str | None):
        self._columns = tuple(columns)
        self._key_column = key_column
        self._task = pickle.dumps(TableTask(schema, self._columns, statistics=False))
        self._rows: list[list[str]] = []

    def start_bundle(self):
        self._rows = []

    def _cells(self, row) -> list[str]:
        if isinstance(row, dict):
            values = [row.get(name) for name in self._columns]
        else:
            values = list(row)
            if len(values) != len(self._columns):
                raise ValueError(f"a row has {len(values)} cells; columns are {list(self._columns)}")
        return ["" if v is None else v if isinstance(v, str) else str(v) for v in values]

    def process(self, row) -> Iterator:
        self._rows.append(self._cells(row))
        if len(self._rows) >= self._BATCH:
            yield from self._flush()

    def finish_bundle(self):
        for output in self._flush():
            value = output.value if isinstance(output, beam.pvalue.TaggedOutput) else output
            window = beam.transforms.window.GlobalWindow()
            timestamp = beam.utils.timestamp.MIN_TIMESTAMP
            windowed = beam.utils.windowed_value.WindowedValue(value, timestamp, [window])
            if isinstance(output, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(output.tag, windowed)
            else:
                yield windowed

    def _flush(self) -> Iterator:
        rows, self._rows = self._rows, []
        if not rows:
            return
        batch = pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in rows], type=pa.string()) for i in range(len(self._columns))],
            names=list(self._columns))
        encoded = encode_table_batch(self._task, batch)
        errors = {row: (reason, message) for row, reason, message in encoded.errors}
        offsets = [0] * len(encoded.splits)
        counters = [0] * len(encoded.splits)
        key_at = self._columns.index(self._key_column) if self._key_column else None
        for number, status in enumerate(encoded.status.tolist()):
            if status == BLANK:
                continue
            if status == BAD:
                reason, message = errors.get(number, ("bad_row", "the row cannot be encoded"))
                beam.metrics.Metrics.counter("rows", "dead_letter").inc()
                yield beam.pvalue.TaggedOutput(ROWS_DEAD_LETTER_TAG, DeadLetter(
                    f"row:{rows[number][key_at] if key_at is not None else number}", "validate",
                    reason, message))
                continue
            size = int(encoded.sizes[status][counters[status]])
            start = offsets[status]
            record = bytes(encoded.blobs[status][start + 12:start + size - 4])  # Unframed.
            offsets[status] += size
            counters[status] += 1
            key = rows[number][key_at] if key_at is not None else hashlib.sha256(record).hexdigest()
            yield key, record


ROWS_DEAD_LETTER_TAG = "dead_letter"


class RowsToExamples(beam.PTransform):
    """Table rows → ``(key, serialized tf.train.Example)``, typed by a table schema.

    The same codec as ``convert`` on a CSV: every schema type, lists, shapes,
    defaults and required cells; a row whose cells do not fit the schema is
    counted (metric ``rows/dead_letter``) and goes to ``.dead_letter`` (a
    PCollection of ``DeadLetter``, set when the transform is applied).

    Args:
      schema: a ``TableSchema``, or the text of a YAML/JSON schema.
      columns: the column names, in cell order (for rows given as sequences);
        default: the schema's column names.
      key_column: the column whose cell is the record's key (orders records in
        ``WriteVerifiedShards``); default: the SHA-256 of the record.
    """

    def __init__(self, schema, columns: Sequence[str] | None = None, key_column: str | None = None):
        super().__init__()
        if isinstance(schema, str):
            schema = load_schema(schema)
        names = tuple(columns) if columns else tuple(c.name for c in schema.columns)
        if key_column is not None and key_column not in names:
            raise ValueError(f"key_column {key_column!r} is not one of the columns {list(names)}")
        RowEncoder(schema, names)  # Fails here, naming the columns, when they do not fit.
        self._fn = _RowsToExamplesFn(schema, names, key_column)
        self.dead_letter = None

    def expand(self, rows):
        outputs = rows | "Encode" >> beam.ParDo(self._fn).with_outputs(ROWS_DEAD_LETTER_TAG, main="examples")
        self.dead_letter = outputs[ROWS_DEAD_LETTER_TAG]
        return outputs.examples
