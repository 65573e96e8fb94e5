"""Reading Parquet and JSON Lines tables a piece at a time, with row numbers.

Both give typed Arrow tables (``codec.table_cells`` turns them into the cell
text the table encoder reads) in pieces of bounded size: Parquet a batch of a
row group at a time, JSON Lines a block of whole lines at a time. Every piece
carries the number of each of its rows (Parquet: the row, from 1; JSON Lines:
the line), and what could not be read is reported as ``Unreadable`` with the
rows or line it covers, so a run can account for every row the file holds.
Messages describe a value by its kind and size, never quote it.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import io
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.faults import HOOKS_ENV, test_hooks_on

__all__ = [
    "JSONL_SUFFIXES",
    "MAX_ROW_BYTES",
    "SAMPLE_ROW_BYTES",
    "PARQUET_SUFFIXES",
    "JsonLinesReader",
    "ParquetReader",
    "TablePiece",
    "Unreadable",
    "arrow_error_text",
    "describe_json",
    "csv_sample_lines",
    "max_row_bytes",
    "table_columns",
    "table_format",
    "typed_sample",
]

PARQUET_SUFFIXES = (".parquet", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz")
_BLOCK_BYTES = 4 << 20
_BATCH_ROWS = 32_768
# Lines of a JSON Lines file whose keys name its columns.
_COLUMN_LINES = 1000
# The longest row (a CSV row's lines, a JSON line) a run reads; a longer one is
# dead-lettered as ``unreadable`` without being held (README: Limits).
MAX_ROW_BYTES = 256_000_000
# Rows longer than this (a block) are left out of the samples that schema inference
# and header checks read.
SAMPLE_ROW_BYTES = 4 << 20
# Test hooks: a lower row limit, honoured only under the test switch (faults.HOOKS_ENV).
_TEST_MAX_ROW_ENV = "BEAM_TFRECORDS_TEST_MAX_ROW_BYTES"
_log = logging.getLogger(__name__)
_said: set[int] = set()


def max_row_bytes() -> int:
    """``MAX_ROW_BYTES``, or the lower limit a test sets with
    ``BEAM_TFRECORDS_TEST_MAX_ROW_BYTES=N`` under the test switch
    ``BEAM_TFRECORDS_TEST_HOOKS=1`` (logged as a warning); never higher, nor lower than
    two 4 MB blocks (a shorter row may be read with the block before it, unmeasured)."""
    asked = os.environ.get(_TEST_MAX_ROW_ENV)
    if not asked or not test_hooks_on():
        return MAX_ROW_BYTES
    try:
        limit = min(MAX_ROW_BYTES, max(2 * _BLOCK_BYTES, int(asked)))
    except ValueError:
        return MAX_ROW_BYTES
    if limit not in _said:
        _said.add(limit)
        _log.warning("Test hook: rows longer than %d bytes are dead-lettered (%s, %s=1)",
                     limit, _TEST_MAX_ROW_ENV, HOOKS_ENV)
    return limit


# Arrow's messages that go on to quote the data they could not read: cut before it.
_QUOTING_ERRORS = re.compile(r"(Expected \d+ columns, got \d+|couldn't parse|Invalid value)\s*:.*", re.S)


def arrow_error_text(err: BaseException) -> str:
    """An Arrow (or other reader) error as one line that quotes no data: its first line,
    cut where Arrow would quote the row or value it could not read."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    text = _QUOTING_ERRORS.sub(r"\1", text)
    return text if len(text) <= 200 else text[:199] + "…"


def describe_json(value) -> str:
    """A parsed JSON value described by its kind and size, never its content."""
    if isinstance(value, bool):
        return "a JSON true/false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return "a JSON number that is NaN" if math.isnan(value) else "a JSON number that overflows to infinity"
        return "a JSON number"
    if isinstance(value, str):
        return f"a {len(value):,}-character JSON string"
    if isinstance(value, list):
        return f"a JSON array of {len(value):,} value{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return f"a JSON object of {len(value):,} key{'' if len(value) == 1 else 's'}"
    return "a JSON null"


def table_format(path: str) -> str:
    """``parquet``, ``jsonl`` or ``csv``, by the file's extension."""
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if lower.endswith(JSONL_SUFFIXES):
        return "jsonl"
    return "csv"


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """A stretch of a file that cannot be read: one dead letter.

    Attributes:
      number: its first row (Parquet) or line (JSON Lines).
      covers: how many rows or lines it covers.
      reason, message: why.
      text: the line's text (JSON Lines), or ``''``.
    """

    number: int
    covers: int
    reason: str
    message: str
    text: str = ""


@dataclasses.dataclass
class TablePiece:
    """Consecutive rows of a file.

    Attributes:
      table: the rows, typed as the file holds them.
      numbers: each row's number (row from 1, or line).
      lines: JSON Lines: each row's line text (for dead letters); else ``None``.
      unreadable: what could not be read since the previous piece.
      blank: blank lines skipped since the previous piece (JSON Lines).
    """

    table: pa.Table
    numbers: np.ndarray
    lines: list[bytes] | None = None
    unreadable: list[Unreadable] = dataclasses.field(default_factory=list)
    blank: int = 0


class ParquetReader:
    """A Parquet file's rows, a batch of a row group at a time.

    Attributes:
      rows: the rows its metadata counts (the rows a run must account for).
    """

    def __init__(self, path: str, columns: Sequence[str] | None = None, batch_rows: int = _BATCH_ROWS):
        self._path = path
        self._stream = None if files.is_local(path) else files.open_read(path)
        # No pre-buffering: pages are read as batches need them (flat memory).
        self._file = pq.ParquetFile(path if self._stream is None else self._stream,
                                    pre_buffer=False, buffer_size=1 << 20)
        names = self._file.schema_arrow.names
        self._columns = [c for c in columns if c in names] if columns is not None else None
        self._batch_rows = batch_rows
        self.rows = self._file.metadata.num_rows

    def __iter__(self) -> Iterator[TablePiece]:
        first = 1
        metadata = self._file.metadata
        for group in range(metadata.num_row_groups):
            group_rows = metadata.row_group(group).num_rows
            done = 0
            batches = self._file.iter_batches(batch_size=self._batch_rows, row_groups=[group],
                                              columns=self._columns, use_threads=False)
            batch, error = None, None
            while True:
                # One batch read ahead: after a row group's last batch, the group's reader
                # (its decoded pages and dictionaries: twice a long value) is let go
                # before the batch is used.
                try:
                    following = next(batches, None)
                except (pa.ArrowException, OSError, ValueError) as err:
                    following, error = None, err
                if batch is not None:
                    numbers = np.arange(first + done, first + done + batch.num_rows, dtype=np.int64)
                    done += batch.num_rows
                    table = pa.Table.from_batches([batch])
                    batch = None
                    ranges = _long_rows_apart(table)
                    for start, stop, long in ranges:
                        part = table.slice(start, stop - start)
                        if len(ranges) > 1 and not long:  # Its own buffers: a slice pickles
                            part = part.take(pa.array(np.arange(stop - start)))  # them whole.
                        yield TablePiece(part, numbers[start:stop])
                        del part
                    del table
                if following is None:
                    break
                batch = following
                del following
            if error is not None:
                yield TablePiece(pa.table({}), np.empty(0, dtype=np.int64), unreadable=[Unreadable(
                    first + done, group_rows - done, "unreadable",
                    f"rows {first + done}-{first + group_rows - 1} (row group {group}) cannot be "
                    f"read: {arrow_error_text(error)}")])
                done = group_rows
            if done != group_rows:  # Fewer rows than the metadata says.
                yield TablePiece(pa.table({}), np.empty(0, dtype=np.int64), unreadable=[Unreadable(
                    first + done, group_rows - done, "unreadable",
                    f"row group {group} holds {done} rows, its metadata {group_rows}")])
            first += group_rows

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


def _long_rows_apart(table: pa.Table) -> list[tuple[int, int, bool]]:
    """``(start, stop, long)`` row ranges covering a table, each row whose string and
    binary values hold over a block (``_BLOCK_BYTES``) alone in its range (so it is
    encoded alone: Arrow's joins over a batch grow their output by doubling)."""
    rows = table.num_rows
    if table.nbytes <= _BLOCK_BYTES:
        return [(0, rows, False)]
    sizes = np.zeros(rows, dtype=np.int64)
    for column in table.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
                or pa.types.is_large_binary(kind):
            sizes += pc.fill_null(pc.binary_length(column), 0).to_numpy().astype(np.int64)
    long = sizes > _BLOCK_BYTES
    cuts = sorted({0, rows, *(int(r) for r in np.flatnonzero(long) for r in (r, r + 1))})
    return [(start, stop, bool(long[start])) for start, stop in zip(cuts[:-1], cuts[1:])]


def _open_lines(path: str):
    stream = files.open_read(path)
    if path.lower().endswith(".gz"):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return stream


class JsonLinesReader:
    """A JSON Lines file's rows, a block of whole lines at a time.

    A line that is not one JSON object, or whose value does not fit the type
    asked for in ``types``, is ``Unreadable`` (one line), and costs no other line.

    A line longer than a block is read alone: its end is found first, reading on
    unkept, then it is read in one piece (a gzip file's, which cannot go back cheaply,
    is gathered as it is read); one longer than ``max_line`` (``max_row_bytes()``
    unless given) is ``Unreadable`` (``unreadable``), read past without being held
    (a gzip file's: not past ``max_line``).

    Args:
      path: the file (``.gz``: gzip).
      types: column name → Arrow type to read it as (int64 and float columns:
        read as such, so a big integer is never rounded through a float).
      max_line: the longest line read, in bytes.

    Attributes:
      lines: physical lines read so far (after the end: the file's lines).
    """

    def __init__(self, path: str, types: dict[str, pa.DataType] | None = None,
                 block_bytes: int = _BLOCK_BYTES, max_line: int | None = None):
        self._path = path
        self._stream = _open_lines(path)
        self._types = dict(types or {})
        self._block_bytes = block_bytes
        self._max_line = max_row_bytes() if max_line is None else max_line
        self.lines = 0

    def __iter__(self) -> Iterator[TablePiece]:
        carry = b""
        number = 1
        seekable = not self._path.lower().endswith(".gz") and getattr(self._stream, "seekable", bool)()
        long = _LongLine(self._max_line)  # A line longer than a block, as it is gathered.
        while True:
            data = self._stream.read(self._block_bytes)
            if not data:
                if long.started:
                    self.lines += 1
                    yield from self._long_pieces(long, number)
                elif carry:
                    self.lines += 1
                    yield from self._pieces(carry.split(b"\n"), number)
                return
            if long.started:
                end = data.find(b"\n")
                if end < 0:
                    long.add(data)
                    continue
                long.add(data[:end + 1])  # With its newline (dropped in take).
                data = data[end + 1:]
                self.lines += 1
                yield from self._long_pieces(long, number)
                number += 1
                long = _LongLine(self._max_line)
            buffer = carry + data if carry else data
            cut = buffer.rfind(b"\n")
            if cut < 0:
                carry = b""
                if seekable:
                    start = self._stream.tell() - len(buffer)
                    del data, buffer
                    self.lines += 1
                    yield from self._line_at(start, number)
                    number += 1
                elif buffer:
                    long.add(buffer)
                continue
            block, carry = buffer[:cut], buffer[cut + 1:]
            lines = block.split(b"\n")
            self.lines += len(lines)
            yield from self._pieces(lines, number)
            number += len(lines)

    def _line_at(self, start: int, number: int) -> Iterator[TablePiece]:
        """The pieces of the line from byte ``start``, longer than a block (what was
        read of it is past): its end is found reading on, unkept; then the line is
        read in one piece, or is ``Unreadable`` if longer than ``max_line``."""
        end = None
        while end is None and (data := self._stream.read(self._block_bytes)):
            newline = data.find(b"\n")
            end = None if newline < 0 else self._stream.tell() - len(data) + newline + 1
        size = (self._stream.tell() if end is None else end) - start  # With its newline.

        def read() -> bytes:  # (Unbound here: the line goes once its table is made.)
            self._stream.seek(start)
            return self._stream.read(size - (end is not None))
        yield from self._long_line(size, number, read)
        self._stream.seek(start + size)

    def _long_pieces(self, long: _LongLine, number: int) -> Iterator[TablePiece]:
        """The pieces of one line longer than a block, gathered (its parts then let go)."""
        yield from self._long_line(long.size, number, long.take)

    def _long_line(self, size: int, number: int, read: Callable[[], bytes]) -> Iterator[TablePiece]:
        """The one recovery from a line longer than a block (``size`` bytes with its newline):
        past ``max_line`` an ``Unreadable``, never read; else ``read()``, parsed alone."""
        if size > self._max_line:
            yield self._too_long(size, number)
            return
        yield from self._one_line(read(), number)

    def _too_long(self, size: int, number: int) -> TablePiece:
        return TablePiece(pa.table({}), np.empty(0, dtype=np.int64), [], [Unreadable(
            number, 1, "unreadable", f"the line is {size:,} bytes long, more than the "
            f"{self._max_line:,} a row may be; it is set aside unread")])

    def _one_line(self, line: bytes, number: int) -> Iterator[TablePiece]:
        pieces = collections.deque(self._pieces([line], number))
        del line
        _without_lines(pieces)  # Not a second copy of the line beside its table.
        while pieces:
            yield pieces.popleft()  # Held here no longer than by the reader.

    def _pieces(self, lines: list[bytes], first: int) -> Iterator[TablePiece]:
        kept = [(first + i, line) for i, line in enumerate(lines) if not _blank(line)]
        blank = len(lines) - len(kept)
        pieces: list[TablePiece] = []
        self._parse(kept, pieces)
        if not pieces:
            pieces.append(TablePiece(pa.table({}), np.empty(0, dtype=np.int64), []))
        pieces[0].blank = blank
        yield from pieces

    def _read(self, lines: list[bytes]) -> pa.Table:
        data = b"\n".join(lines)
        known = {name: kind for name, kind in self._types.items()}
        options = pajson.ParseOptions(explicit_schema=pa.schema(known) if known else None,
                                      newlines_in_values=False)
        table = pajson.read_json(io.BytesIO(data), read_options=pajson.ReadOptions(
            use_threads=False, block_size=len(data) + 1), parse_options=options)
        table.validate(full=True)  # Arrow's JSON reader lets bytes that are not UTF-8 into strings.
        return table

    def _parse(self, kept: list[tuple[int, bytes]], out: list[TablePiece]) -> None:
        """Parses lines into pieces; a part that fails is halved until the lines that
        cannot be read are found (each then one ``Unreadable``)."""
        if not kept:
            return
        lines = [line for _, line in kept]
        try:
            table = self._read(lines)
            error = None if table.num_rows == len(lines) else (
                "the line holds more than one JSON value")
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            table, error = None, str(err)
        if error is None:
            out.append(TablePiece(table.combine_chunks(), np.array([n for n, _ in kept], dtype=np.int64),
                                  lines))
            return
        if len(kept) > 1:
            half = len(kept) // 2
            self._parse(kept[:half], out)
            self._parse(kept[half:], out)
            return
        number, line = kept[0]
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict) and _is_utf8(line):
            table = self._read_normalized(value)
            if table is not None:
                out.append(TablePiece(table, np.array([number], dtype=np.int64), [line]))
                return
        misfit = self._misfit(value) if isinstance(value, dict) else None
        if not _is_utf8(line):
            reason, message = "invalid_utf8", "the line is not valid UTF-8 text"
        elif misfit is not None:
            reason, message = "bad_value", misfit
        elif isinstance(value, dict):
            reason, message = "bad_value", f"a value does not fit the schema: {arrow_error_text(error)}"
        else:
            reason, message = "bad_json", f"the line is not one JSON object: {arrow_error_text(error)}"
        unreadable = Unreadable(number, 1, reason, message)
        if out and out[-1].table.num_rows == 0:
            out[-1].unreadable.append(unreadable)
        else:
            out.append(TablePiece(pa.table({}), np.empty(0, dtype=np.int64), [], [unreadable]))

    def _read_normalized(self, value: dict) -> pa.Table | None:
        """One line Arrow refused, read again as JSON Arrow takes: a list whose values are
        of several kinds (``[1, "a", 2.5]``) as a list of their text (``["1", "a",
        "2.5"]``), and a number too large for a float64 (``1e400``) as ``Infinity``
        (its column then refuses it, unless it allows infinities). ``None`` if Arrow
        still refuses it."""
        try:
            data = json.dumps(_normalized(value), ensure_ascii=False).encode("utf-8")
            table = self._read([data])
        except (pa.ArrowInvalid, UnicodeError, ValueError, RecursionError):
            return None
        return table.combine_chunks() if table.num_rows == 1 else None

    def _misfit(self, value: dict) -> str | None:
        """Which typed column a parsed line's value does not fit, said as the CSV
        encoder says it; ``None`` if none is found."""
        for name, kind in self._types.items():
            cell = value.get(name)
            want = kind.value_type if pa.types.is_list(kind) else kind
            items = cell if pa.types.is_list(kind) and isinstance(cell, list) else [cell]
            label = "int64" if pa.types.is_integer(want) else "float"
            for item in items:
                if item is None:
                    continue
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    what = "an integer" if label == "int64" else "a number"
                    return f"column {name!r} ({label}): {describe_json(item)} is not {what}"
                if label == "int64" and not isinstance(item, int):
                    return f"column {name!r} ({label}): {describe_json(item)} is not an integer"
                if label == "int64" and not -(2**63) <= item < 2**63:
                    return f"column {name!r} ({label}): a JSON number of {len(str(abs(item)))} digits does not fit in int64"
            if pa.types.is_list(kind) and cell is not None and not isinstance(cell, list):
                return f"column {name!r} ({label} list): {describe_json(cell)} is not a JSON array"
        return None

    def close(self) -> None:
        self._stream.close()


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def _text(value) -> str:
    """A JSON value's text, as a cell of a string column holds it."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return json.dumps(value)


def _normalized(value):
    """``value`` with every list of values of several kinds (nulls aside) made a list of
    their text, at any depth."""
    if isinstance(value, dict):
        return {key: _normalized(item) for key, item in value.items()}
    if isinstance(value, list):
        if len({_kind(item) for item in value if item is not None}) > 1:
            return [None if item is None else _text(item) for item in value]
        return [_normalized(item) for item in value]
    return value


def _without_lines(pieces) -> None:
    for piece in pieces:
        if piece.table.num_rows:
            piece.lines = None


class _LongLine:
    """A line longer than a block, gathered a block at a time; past ``limit`` bytes
    (its newline included) only counted (its parts dropped)."""

    def __init__(self, limit: int):
        self._limit = limit
        self._parts: list[bytes] = []
        self.size = 0
        self.started = False

    def add(self, data: bytes) -> None:
        self.started = True
        self.size += len(data)
        if self.size > self._limit:
            self._parts = []
        else:
            self._parts.append(data)

    def take(self) -> bytes:
        """The line (without a newline), its parts let go."""
        parts, self._parts = self._parts, []
        if parts and parts[-1].endswith(b"\n"):
            parts[-1] = parts[-1][:-1]
        return parts[0] if len(parts) == 1 else b"".join(parts)


def _blank(line: bytes) -> bool:
    """Whether a line holds only white space (without copying a long one)."""
    return not line[:256].strip() and not line.strip()


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def table_columns(path: str, limit: int = _COLUMN_LINES) -> list[str]:
    """The column names of a Parquet file (its schema), or of a JSON Lines file
    (the keys of its first ``limit`` objects, in order of first appearance).

    Raises:
      ValueError: if the file cannot be read as its extension says.
    """
    kind = table_format(path)
    try:
        if kind == "parquet":
            reader = ParquetReader(path)
            try:
                return list(reader._file.schema_arrow.names)  # pylint: disable=protected-access
            finally:
                reader.close()
        names: dict[str, None] = {}
        with _open_lines(path) as stream:
            for line in _first_lines(stream, limit):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    names.update(dict.fromkeys(value))
    except (pa.ArrowException, OSError, EOFError) as err:
        raise ValueError(f"{path}: cannot read it as {kind}: {err}") from None
    return list(names)


def _first_lines(stream, limit: int) -> Iterator[bytes]:
    """The first ``limit`` lines that are not blank, leaving out (unread, one chunk at a
    time) those longer than ``SAMPLE_ROW_BYTES``."""
    count = 0
    while line := stream.readline(SAMPLE_ROW_BYTES + 1):
        if len(line) > SAMPLE_ROW_BYTES and not line.endswith(b"\n"):
            while (rest := stream.readline(1 << 20)) and not rest.endswith(b"\n"):
                pass
            continue
        if not _blank(line):
            yield line
            count += 1
            if count >= limit:
                return


def typed_sample(path: str, limit: int) -> list[pa.Table]:
    """Up to ``limit`` rows of a Parquet or JSON Lines file, typed as the file holds
    them (JSON Lines: typed per block, so the pieces' types may differ), leaving out
    rows longer than ``SAMPLE_ROW_BYTES`` (JSON Lines: unread; Parquet: a row with a
    longer string or binary value, once read)."""
    reader = (ParquetReader(path) if table_format(path) == "parquet"
              else JsonLinesReader(path, max_line=SAMPLE_ROW_BYTES))
    out, rows = [], 0
    try:
        for piece in reader:
            if piece.table.num_rows:
                out.append(_short_rows(piece.table).slice(0, limit - rows))
                rows += out[-1].num_rows
            if rows >= limit:
                break
    except (pa.ArrowException, OSError, EOFError) as err:
        raise ValueError(f"{path}: cannot read it: {err}") from None
    finally:
        reader.close()
        pa.default_memory_pool().release_unused()  # What reading a long value took.
    return out


def _short_rows(table: pa.Table) -> pa.Table:
    """The rows whose string and binary values are at most ``SAMPLE_ROW_BYTES`` each."""
    long = None
    for column in table.columns:
        kind = column.type
        if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) \
                or pa.types.is_large_binary(kind):
            over = pc.fill_null(pc.greater(pc.binary_length(column), SAMPLE_ROW_BYTES), False)
            long = over if long is None else pc.or_(long, over)
    if long is None or not pc.any(long).as_py():
        return table
    return table.filter(pc.invert(long))


class _Quotes:
    """Whether a CSV's text has a quoted cell open, followed as Python's ``csv`` (and
    pyarrow) read it: a quote opens a quoted cell only at a cell's start; inside one,
    a doubled quote is a quote and a single one closes it."""

    def __init__(self, quote: str, delimiter: str):
        self._quote, self._delimiter = quote, delimiter
        self.inside = False
        self._start = True  # At a cell's start.
        self._pending = False  # The last text ended with a quote, inside a quoted cell.

    def feed(self, text: str) -> None:
        q, pos, n = self._quote, 0, len(text)
        if self._pending and n:
            self._pending = False
            if text[0] == q:
                pos = 1
            else:
                self.inside, self._start = False, False
        while pos < n:
            if self.inside:
                close = text.find(q, pos)
                if close < 0:
                    return
                if close + 1 == n:
                    self._pending = True
                    return
                if text[close + 1] == q:
                    pos = close + 2
                    continue
                self.inside, self._start, pos = False, False, close + 1
                continue
            if self._start and text[pos] == q:
                self.inside, pos = True, pos + 1
                continue
            after = text.find(self._delimiter, pos)
            if after < 0:
                self._start = text[-1] in "\n\r"
                return
            pos, self._start = after + 1, True


def csv_sample_lines(text, quote: str, delimiter: str, cells: int) -> Iterator[str]:
    """The lines of a CSV's ``text`` (a text stream, ``newline=""``) for ``csv.reader``,
    without the text of rows longer than ``SAMPLE_ROW_BYTES`` characters: their lines
    are read past (a megabyte at a time) and each replaced by a few characters that
    leave the quotes as the line did and give the row more than ``cells`` cells, so a
    sample that keeps rows of ``cells`` cells leaves it out. One line out per line in."""
    quotes = _Quotes(quote, delimiter)
    row = 0  # Characters of the row so far.
    while line := text.readline(SAMPLE_ROW_BYTES + 1):
        row += len(line)
        if row <= SAMPLE_ROW_BYTES:
            quotes.feed(line)
        else:
            inside = quotes.inside
            quotes.feed(line)
            while not line.endswith(("\n", "\r")) and (line := text.readline(1 << 20)):
                quotes.feed(line)
            line = (quote if inside else "") + delimiter * (cells + 1) + (quote if quotes.inside else "") + "\n"
        if not quotes.inside:
            row = 0
        yield line
