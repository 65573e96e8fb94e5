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

import dataclasses
import gzip
import io
import json
import math
import re
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from beam_tfrecords.transforms.io import files

__all__ = [
    "JSONL_SUFFIXES",
    "PARQUET_SUFFIXES",
    "JsonLinesReader",
    "ParquetReader",
    "TablePiece",
    "Unreadable",
    "arrow_error_text",
    "describe_json",
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
            try:
                for batch in self._file.iter_batches(batch_size=self._batch_rows, row_groups=[group],
                                                     columns=self._columns, use_threads=False):
                    numbers = np.arange(first + done, first + done + batch.num_rows, dtype=np.int64)
                    done += batch.num_rows
                    yield TablePiece(pa.Table.from_batches([batch]), numbers)
            except (pa.ArrowException, OSError, ValueError) as err:
                yield TablePiece(pa.table({}), np.empty(0, dtype=np.int64), unreadable=[Unreadable(
                    first + done, group_rows - done, "unreadable",
                    f"rows {first + done}-{first + group_rows - 1} (row group {group}) cannot be "
                    f"read: {arrow_error_text(err)}")])
                done = group_rows
            if done != group_rows:  # Fewer rows than the metadata says.
                yield TablePiece(pa.table({}), np.empty(0, dtype=np.int64), unreadable=[Unreadable(
                    first + done, group_rows - done, "unreadable",
                    f"row group {group} holds {done} rows, its metadata {group_rows}")])
            first += group_rows

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()


def _open_lines(path: str):
    stream = files.open_read(path)
    if path.lower().endswith(".gz"):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    return stream


class JsonLinesReader:
    """A JSON Lines file's rows, a block of whole lines at a time.

    A line that is not one JSON object, or whose value does not fit the type
    asked for in ``types``, is ``Unreadable`` (one line), and costs no other line.

    Args:
      path: the file (``.gz``: gzip).
      types: column name → Arrow type to read it as (int64 and float columns:
        read as such, so a big integer is never rounded through a float).

    Attributes:
      lines: physical lines read so far (after the end: the file's lines).
    """

    def __init__(self, path: str, types: dict[str, pa.DataType] | None = None,
                 block_bytes: int = _BLOCK_BYTES):
        self._path = path
        self._stream = _open_lines(path)
        self._types = dict(types or {})
        self._block_bytes = block_bytes
        self.lines = 0

    def __iter__(self) -> Iterator[TablePiece]:
        carry = b""
        number = 1
        while True:
            data = self._stream.read(self._block_bytes)
            if not data:
                if carry:
                    self.lines += 1
                    yield from self._pieces(carry.split(b"\n"), number)
                return
            buffer = carry + data
            cut = buffer.rfind(b"\n")
            if cut < 0:
                carry = buffer
                continue
            block, carry = buffer[:cut], buffer[cut + 1:]
            lines = block.split(b"\n")
            self.lines += len(lines)
            yield from self._pieces(lines, number)
            number += len(lines)

    def _pieces(self, lines: list[bytes], first: int) -> Iterator[TablePiece]:
        kept = [(first + i, line) for i, line in enumerate(lines) if line.strip()]
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
    count = 0
    for line in stream:
        if line.strip():
            yield line
            count += 1
            if count >= limit:
                return


def typed_sample(path: str, limit: int) -> list[pa.Table]:
    """Up to ``limit`` rows of a Parquet or JSON Lines file, typed as the file holds
    them (JSON Lines: typed per block, so the pieces' types may differ)."""
    reader = ParquetReader(path) if table_format(path) == "parquet" else JsonLinesReader(path)
    out, rows = [], 0
    try:
        for piece in reader:
            if piece.table.num_rows:
                out.append(piece.table.slice(0, limit - rows))
                rows += out[-1].num_rows
            if rows >= limit:
                break
    except (pa.ArrowException, OSError, EOFError) as err:
        raise ValueError(f"{path}: cannot read it: {err}") from None
    finally:
        reader.close()
    return out
