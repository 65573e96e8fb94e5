"""Reading one CSV file in segments, for the table encode step (``transforms.tables``).

pyarrow's streaming CSV reader reads a file a block at a time (``io.csv_stream``:
counted, paced, each row given its physical line); each batch is encoded and taken
into the file's spools (``transforms.table_spooling``). A file is read in
segments: the first from its start; the next from the line after one set aside (a
quote never closed, a stray quote that would merge lines, an unreadable stretch),
so one bad line never costs the rows after it.

A row longer than a block is found by its bytes (``io.csv_stream.row_extent``) and
read alone, in this process, each copy let go before the next (about three times
the row at most); one longer than ``table_readers.MAX_ROW_BYTES`` is dead-lettered
without being read into memory.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import itertools
import logging
import pickle
import time
from collections.abc import Generator
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.transforms.codec.table_batches import TableTask
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.io import csv_stream, files
from beam_tfrecords.transforms.io.csv_stream import (
    Batches,
    CountingReader,
    FileCounts,
    LineIndex,
    LineTracker,
    ReadAhead,
    RefusedRow,
    Window,
    ascii_structure,
    csv_header,
    open_csv,
    row_extent,
    text_after_close,
    utf8_columns,
)
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.table_readers import arrow_error_text, max_row_bytes
from beam_tfrecords.transforms.table_spooling import FileState, TableFileReader, drop_rows

__all__ = ["CsvSegmentReader"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _LongRowAt:
    """A segment's outcome: the row from ``line`` is longer than a block."""

    line: int


class _Segment(NamedTuple):
    """A segment's reader, open: the counted stream, the rows' lines, pyarrow's reader."""

    counting: CountingReader
    tracker: LineTracker
    reader: object


class _StrayQuote(NamedTuple):
    """The row of a batch whose multi-line quoted cell closes with text after the quote."""

    row: int
    after: str


class CsvSegmentReader(TableFileReader):
    """Reads CSV files in segments (see the module's text)."""

    def read(self, file_index: int, path: str) -> Generator[object, None, FileState]:
        """Reads one CSV file whole; yields sequence rows (with a sequence key).

        Returns:
          The file's ``FileState``, its spools closed.
        """
        dialect = self._dialect
        start = time.monotonic()
        hold_point("listing")
        header = csv_header(dialect, path)
        layout = self._layout
        task = TableTask(self._schema, tuple(header), layout.split_column, layout.splits,
                         layout.key_column, dialect.delimiter, dialect.quote,
                         layout.sequence_key, layout.sequence_order)
        RowEncoder(self._schema, header)  # Fails here, with the columns named, on a wrong header.
        state = FileState(path, file_index, header, pickle.dumps(task),
                           FileCounts(dialect.quote.encode(dialect.encoding)))
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
        state.lines_in = state.counts.lines
        return state

    def _open(self, state: FileState, line: int, window: int | None = None) -> _Segment:
        """A reader of the file from ``line`` on (the header is read only from line 1), in
        blocks of ``csv_stream.BLOCK_BYTES``; or, with ``window``, of that many bytes, one block."""
        dialect = self._dialect
        offset = 0
        if line > 1:
            if state.index is None:
                state.index = LineIndex(state.path)
            offset = state.index.offset_of(line)
        stream = files.open_read(state.path)
        if offset:
            stream.seek(offset)
        utf8 = codecs.lookup(dialect.encoding).name in ("utf-8", "utf-8-sig")
        if window is None:
            block = csv_stream.BLOCK_BYTES
            ahead = ReadAhead(block, csv_stream.READ_AHEAD_BLOCKS) if utf8 else None
            counting = CountingReader(stream, offset, state.counts, ahead)
        else:  # Transcoded to UTF-8 (the block pyarrow parses), a byte may take up to 3.
            block = min(window * (1 if utf8 else 3) + 1, 2**31 - 1)
            counting = CountingReader(Window(stream, window), offset, state.counts)
        tracker = LineTracker(0 if dialect.no_header or line > 1 else 1, line)

        def on_invalid(row) -> str:
            tracker.invalid.append(RefusedRow(row.number, row.text or ""))
            return "skip"

        counting.waiting(True)  # open_csv reads the first batch.
        try:
            reader = open_csv(counting, self._dialect, state.header, line, block, on_invalid)
        except BaseException:
            counting.release()
            raise
        finally:
            counting.waiting(False)
        return _Segment(counting, tracker, reader)

    def _set_aside(self, state: FileState, line: int, reason: str, message: str) -> None:
        """Dead-letters one physical line (by its number: the letter holds none of its text)."""
        state.dead.append(DeadLetter(f"{state.path}:{line}", "read", reason, message))
        state.rows_in += 1

    def _segment(self, state: FileState, first_line: int):
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
                outcome = yield from self._read_segment(state, counting, tracker, Batches(reader, counting))
            finally:  # Before the reader is dropped: its thread may wait on the gate.
                counting.release(stop=isinstance(outcome, _LongRowAt))
            del counting, tracker, reader  # Its blocks go before a long row is read.
        if isinstance(outcome, _LongRowAt):
            return (yield from self._long_row(state, outcome.line))
        return outcome

    def _after_read_error(self, state: FileState, line: int, err: BaseException, doing: str,
                          long_rows: bool = True) -> int | _LongRowAt:
        """Where reading goes on after pyarrow failed at ``line``: a row longer than its block
        ("straddling") is read alone (``_LongRowAt``); any other error sets the line aside."""
        if long_rows and "straddl" in str(err):
            state.lines_done = line - 1
            return _LongRowAt(line)
        self._set_aside(state, line, "unreadable", f"the line cannot be {doing}: {arrow_error_text(err)}")
        state.lines_done = line
        return line + 1

    def _long_row(self, state: FileState, line: int):
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
            state.index = LineIndex(path)
        offset = state.index.offset_of(line)
        if not ascii_structure(dialect):
            self._set_aside(state, line, "unreadable", (
                f"the row is longer than the CSV reader's block ({csv_stream.BLOCK_BYTES >> 20} MB); rows that "
                f"long are read only in encodings where newlines, quotes and delimiters are single "
                f"bytes (UTF-8, Latin-1, ...), not {dialect.encoding}"))
            state.lines_done = line
            return line + 1
        stream = files.open_read(path)
        try:
            stream.seek(offset)
            extent = row_extent(CountingReader(stream, offset, state.counts).read,
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
        batches = Batches(reader, counting).drain()
        del reader  # It holds its block (the whole row) while it lives.
        outcome = yield from self._read_segment(state, counting, tracker, batches, closed=True)
        del batches
        pa.default_memory_pool().release_unused()  # The row's memory, kept by Arrow's pool.
        if outcome is None and after is not None:
            state.index.skip_to(after, offset + extent.size)
            return after
        return outcome

    def _read_segment(self, state: FileState, counting, tracker, batches: Batches, closed: bool = False):
        """``_segment`` once its reader is open; ``closed``: the stream ends where a row
        does, its quotes closed (a long row's window)."""
        unicode_errors: collections.deque = collections.deque()

        def as_text():
            for raw in batches:
                batch, bad = utf8_columns(raw)
                unicode_errors.append(bad)
                yield batch

        # One batch is held back: at the end, its last row may turn out to hold a
        # quote never closed, which swallowed the rest of the file.
        held, swallowed = None, None
        for item in itertools.chain(self._spooler.encoded(as_text(), state.task_bytes), [None]):
            if held is None:
                held = item
                continue
            batch, newlines, encoded = held
            held = item
            bad_text = unicode_errors.popleft()
            if bad_text:
                encoded = drop_rows(encoded, {
                    row: ("invalid_utf8", f"column {column!r} is not valid UTF-8 text")
                    for row, column in bad_text.items()})
            lines, invalid = tracker.batch(newlines)
            if not self._dialect.quoted_newlines and newlines.any():
                encoded = drop_rows(encoded, {int(row): (
                    "quoted_newline", "a quoted cell holds a newline (--no_quoted_newlines)")
                    for row in np.nonzero(newlines)[0]})
            stray = self._stray_quote(state, lines, newlines)
            if stray is not None:
                row = stray.row
                first, last = int(lines[row]), int(lines[row] + newlines[row])
                later = range(row, len(newlines))
                encoded = drop_rows(encoded, dict.fromkeys(later))
                newlines = newlines.copy()
                newlines[row:] = 0
                invalid = [(line, text) for line, text in invalid if line < lines[row]]
                self._spooler.take_batch(state, batch, lines, invalid, newlines, encoded)
                state.rows_in -= len(later)  # Read again from the next segment.
                yield from self._spooler.sequence_rows(state, lines, encoded)
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
                encoded = drop_rows(encoded, {len(newlines) - 1: None})
                newlines = newlines.copy()
                newlines[-1] = 0  # Set aside: not a row that spans lines.
                state.rows_in -= 1  # Counted again when its first line is set aside.
            self._spooler.take_batch(state, batch, lines, invalid, newlines, encoded)
            yield from self._spooler.sequence_rows(state, lines, encoded)
        rest = tracker.rest()
        if (swallowed is None and batches.error is None and not closed and counting.quotes % 2
                and rest and "\n" in rest[-1][1]):
            swallowed = rest.pop()[0]
        self._spooler.take_invalid(state, rest)
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

    def _stray_quote(self, state: FileState, lines, newlines) -> _StrayQuote | None:
        """The first row of a batch whose multi-line quoted cell closes with text
        after the quote, or ``None``."""
        spans = np.nonzero(newlines)[0]
        if not len(spans):
            return None
        if state.close_index is None:
            state.close_index = LineIndex(state.path)
        for row in spans:
            last = int(lines[row] + newlines[row])
            after = text_after_close(state.close_index.text_of(last), self._dialect.delimiter,
                                      self._dialect.quote)
            if after is not None:
                return _StrayQuote(int(row), after)
        return None

