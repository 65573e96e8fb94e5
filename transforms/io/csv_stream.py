"""Reading a CSV file's bytes: what the table encoder's segment reader
(``transforms.csv_segments``) stands on. Nothing here imports Beam.

- ``csv_header``: a file's column names.
- ``CountingReader`` passes the file's bytes to pyarrow's streaming CSV reader,
  counting newlines and quotes (``FileCounts``: the lines a run must account for),
  paced by ``ReadAhead`` (pyarrow would read 32 blocks ahead).
- ``LineTracker`` gives each row pyarrow reads its physical line; ``LineIndex``
  finds where a line starts, reading forward.
- ``row_extent`` finds where a row ends from its bytes (a row longer than a block,
  read alone through ``Window``); ``text_after_close`` spots a stray quote.
- ``open_csv`` opens pyarrow's reader the one way the encoder reads; ``Batches``
  iterates it, keeping an unreadable block's error; ``utf8_columns`` turns its
  binary cells into text, noting the cells that are not UTF-8.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import threading
import time
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from beam_tfrecords.schemas.config import CsvDialect
from beam_tfrecords.transforms.codec.tfrecord import ObservingReader
from beam_tfrecords.transforms.io import files

__all__ = [
    "BLOCK_BYTES",
    "READ_AHEAD_BLOCKS",
    "Batches",
    "CountingReader",
    "FileCounts",
    "LineIndex",
    "LineTracker",
    "ReadAhead",
    "RefusedRow",
    "RowExtent",
    "RowText",
    "Window",
    "ascii_structure",
    "csv_header",
    "open_csv",
    "row_extent",
    "text_after_close",
    "utf8_columns",
]

BLOCK_BYTES = 4 << 20  # pyarrow's CSV block; a row longer than it is read alone.
_SCAN_BYTES = 1 << 20  # How much of a long row is looked at, at a time.
# How far (in blocks) the CSV reader may read ahead of the batches taken (see ReadAhead).
READ_AHEAD_BLOCKS = 4
_READ_AHEAD_STALL_SECONDS = 2.0


class RefusedRow(NamedTuple):
    """A row pyarrow refused (wrong cell count): its row number (pyarrow's, 1 = the
    header when there is one) and its text."""

    row: int
    text: str


class RowText(NamedTuple):
    """A row's first physical line and its text (a refused row, once placed)."""

    line: int
    text: str


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

class LineTracker:
    """Physical line numbers of rows, counting newlines inside quoted cells.

    pyarrow numbers rows (1 = the header when there is one), not lines; a row
    holding quoted newlines spans several lines. Rows that pyarrow refuses
    (wrong cell count) arrive out of band with their number and text. One
    tracker follows one segment of a file (see ``transforms.csv_segments``).
    """

    def __init__(self, header_lines: int, first_line: int = 1):
        self.next_row = 1 + header_lines
        self.next_line = first_line + header_lines
        self.invalid: list[RefusedRow] = []  # Appended by pyarrow's invalid row handler.

    def _take_invalid(self, upto_row: int | None, out: list) -> None:
        while self.invalid and (upto_row is None or self.invalid[0].row <= upto_row):
            number, text = self.invalid.pop(0)
            out.append(RowText(self.next_line, text))
            self.next_line += 1 + text.count("\n")
            self.next_row = number + 1

    def batch(self, embedded_newlines: np.ndarray) -> tuple[np.ndarray, list[RowText]]:
        """Lines of a batch's valid rows, and the invalid rows before them."""
        invalid_out: list[RowText] = []
        lines = np.empty(len(embedded_newlines), dtype=np.int64)
        i = 0
        while i < len(lines):
            if self.invalid and self.invalid[0].row == self.next_row:
                self._take_invalid(self.next_row, invalid_out)
                continue
            # Valid rows up to the next invalid one: vectorised.
            stop = len(lines)
            if self.invalid:
                stop = min(stop, i + (self.invalid[0].row - self.next_row))
            span = embedded_newlines[i:stop]
            steps = 1 + span
            lines[i:stop] = self.next_line + np.concatenate(([0], np.cumsum(steps)[:-1]))
            self.next_line += int(steps.sum())
            self.next_row += stop - i
            i = stop
        return lines, invalid_out

    def rest(self) -> list[RowText]:
        """The invalid rows not placed yet (after the last batch)."""
        out: list[RowText] = []
        self._take_invalid(None, out)
        return out


class FileCounts:
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


class ReadAhead:
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

    def __init__(self, block_bytes: int, blocks: int = READ_AHEAD_BLOCKS):
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


class CountingReader(ObservingReader):
    """Passes a stream through (from byte ``start`` of its file), counting the
    segment's quote characters (an odd count at its end means a quote was never
    closed) and the file's newlines (each byte once, whatever segments re-read);
    ``ahead`` (optional) paces the reads: see ``waiting`` and ``release``."""

    def __init__(self, source, start: int, counts: FileCounts, ahead: ReadAhead | None = None):
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


def text_after_close(text: str, delimiter: str, quote: str) -> str | None:
    """For the last line of a row whose quoted cell began on an earlier line: the
    text right after the quote that closes that cell, when it is not a delimiter
    or the end of the line (so not CSV: a stray quote merged lines), else ``None``."""
    i = text.find(quote)
    while i >= 0:
        if text[i + 1:i + 2] == quote:  # A doubled quote: a quote inside the cell.
            i = text.find(quote, i + 2)
            continue
        after = text[i + 1:].rstrip("\r")
        return after[:40] if after and not after.startswith(delimiter) else None
    return None


class LineIndex:
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
        """The line's text (cut to ``limit`` bytes), decoded leniently. Lines are read
        with ``readline``: queries move on, so most land in the stream's buffer (no read)."""
        offset = self.offset_of(line)
        if self._text_stream is None:
            self._text_stream = files.open_read(self._path)
        self._text_stream.seek(offset)
        text = self._text_stream.readline(limit)
        if text.endswith(b"\n"):
            text = text[:-1]
        return text.decode("utf-8", errors="replace")

    def close(self) -> None:
        self._stream.close()
        if self._text_stream is not None:
            self._text_stream.close()


@dataclasses.dataclass(frozen=True)
class RowExtent:
    """Where a row ends, from its bytes (``row_extent``).

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


def row_extent(read, quote: bytes, delimiter: bytes) -> RowExtent:
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
                return RowExtent(size, newlines, True, newline + 1 < n or bool(read(1)))
            state = _FIELD_START if chunk[n - 1:] == delimiter else _FIELD
            break
        size += n
    return RowExtent(size, newlines, state in (_FIELD_START, _FIELD), False)


class Window:
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


def ascii_structure(dialect: CsvDialect) -> bool:
    """Whether newlines, quotes and delimiters are their single ASCII bytes in the
    file's encoding (UTF-8, Latin-1, ...; not UTF-16), so rows can be found in its bytes."""
    probe = "a\n" + dialect.quote + dialect.delimiter
    try:
        return probe.encode(dialect.encoding).endswith(probe.encode("ascii"))
    except (UnicodeError, LookupError):
        return False


class Batches:
    """A reader's batches; an unreadable block ends the iteration and is kept in ``error``.
    ``counting`` (a ``CountingReader``), if given, hears of each wait and batch taken."""

    def __init__(self, reader, counting=None):
        self._reader = reader
        self._counting = counting
        self.error: Exception | None = None

    def drain(self) -> Batches:
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


def utf8_columns(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, dict[int, str]]:
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




def open_csv(stream, dialect: CsvDialect, header: list[str], line: int, block: int, on_invalid):
    """pyarrow's streaming reader of a CSV file's rows from ``line`` on (the header is
    read only from line 1), in blocks of ``block`` bytes, every cell as bytes;
    ``on_invalid`` hears of each row that does not split into the header's cells."""
    return pacsv.open_csv(
        stream,
        read_options=pacsv.ReadOptions(
            use_threads=False, block_size=block, encoding=dialect.encoding,
            column_names=list(header) if dialect.no_header or line > 1 else None,
        ),
        parse_options=pacsv.ParseOptions(
            delimiter=dialect.delimiter, quote_char=dialect.quote,
            newlines_in_values=True, ignore_empty_lines=False,
            invalid_row_handler=on_invalid,
        ),
        # Bytes, not text: a cell that is not UTF-8 costs its row, not the file.
        convert_options=pacsv.ConvertOptions(
            column_types={name: pa.binary() for name in header},
            strings_can_be_null=False, quoted_strings_can_be_null=False,
        ),
    )
