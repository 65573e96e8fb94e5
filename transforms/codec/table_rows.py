"""Rows of a table to ``tf.train.Example`` records, a column at a time.

A batch of rows arrives as columns of raw cell strings. Each column becomes its
rows' serialized feature entries: one-value and number-list columns with Arrow
and numpy (``codec.table_columns``), any cell those leave aside, and the other
columns (shapes, tensors, string and bytes lists, bytes), by the per-cell parser
here, which is the reference for what a cell means. A row's record is its
entries in feature-name order, framed (``table_columns.frame_examples``). Cells
that do not parse, floats that are not finite where the column does not allow them,
and empty required cells, mark their row bad with a reason. A reason's message
names the column and describes the cell by its kind and size (``describe_text``),
never by its content: a table's cells may hold what must not reach a log.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import struct
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import ColumnSpec, TableSchema, parse_bool
from beam_tfrecords.transforms.codec.example import feature_entry
from beam_tfrecords.transforms.codec.table_columns import column_entries, frame_examples, vectorized
from beam_tfrecords.transforms.codec.tensors import encode_tensor

__all__ = ["ColumnValues", "RowEncoder", "RowError", "describe_text", "parse_column"]

_INT_CHARS = frozenset("+-0123456789")


@dataclasses.dataclass(frozen=True)
class RowError:
    """Why a row cannot become a record."""

    row: int
    reason: str
    message: str


def describe_text(text: str) -> str:
    """A cell described by its kind and size, never its content: ``a 12-character text``."""
    return f"a {len(text):,}-character text"


# The parsers' errors say what is wrong, not what the cell holds: the caller puts a
# description of the cell before them (``describe_text``).


def _parse_int(piece: str) -> int:
    text = piece.strip()
    if not text or not set(text) <= _INT_CHARS:
        raise ValueError("is not an integer")
    try:
        value = int(text)
    except ValueError:  # Signs only, or a sign inside.
        raise ValueError("is not an integer") from None
    if not -(2**63) <= value < 2**63:
        raise ValueError("does not fit in int64")
    return value


def _parse_float(piece: str) -> float:
    """A float64 (not finite ones too: the column decides, see ``ColumnSpec.float_refusal``)."""
    text = piece.strip()
    if "_" in text:
        raise ValueError("is not a number")
    try:
        return float(text)
    except ValueError:
        raise ValueError("is not a number") from None


def _parse_bytes(piece: str) -> bytes:
    try:
        return base64.b64decode(piece.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("is not valid base64") from None


_PARSERS = {
    "int64": _parse_int,
    "float": _parse_float,
    "bool": parse_bool,
    "string": str,
    "bytes": _parse_bytes,
}


ColumnValues = list  # Per row: a list of values, or None when the row is bad.


def parse_column(spec: ColumnSpec, cells: Sequence[str]) -> tuple[ColumnValues, list[RowError]]:
    """Parses one column's cells into value lists.

    Returns:
      Per row the list of values (one for a scalar), or ``None`` for a bad
      cell; and the errors, one per bad cell.
    """
    parse = _PARSERS[spec.type]
    default = None
    if spec.default is not None:
        default = spec.default if isinstance(spec.default, list) else [spec.default]
    size = math.prod(spec.shape) if spec.shape is not None else None
    memo: dict[str, list | RowError] = {}
    values: ColumnValues = []
    errors: list[RowError] = []
    for row, cell in enumerate(cells):
        parsed = memo.get(cell)
        if parsed is None:
            parsed = _parse_cell(spec, cell, parse, default, size)
            memo[cell] = parsed
        if isinstance(parsed, RowError):
            errors.append(dataclasses.replace(parsed, row=row))
            values.append(None)
        else:
            values.append(parsed)
    return values, errors


def _parse_cell(spec, cell, parse, default, size) -> list | RowError:
    empty = cell == "" if spec.type == "string" else cell.strip() == ""
    if empty:
        if spec.required:
            return RowError(0, "missing_required", f"column {spec.name!r} is required but empty")
        return list(default) if default is not None else []
    pieces = cell.split(spec.delimiter) if spec.is_list else [cell]
    values = []
    for i, piece in enumerate(pieces):
        try:
            value = parse(piece)
        except ValueError as err:
            return _value_error(spec, pieces, i, "bad_value", str(err))
        if spec.type == "float":
            refusal = spec.float_refusal(value)
            if refusal is not None:
                return _value_error(spec, pieces, i, *refusal)
        values.append(value)
    if size is not None and len(values) != size:
        return RowError(0, "wrong_length", f"column {spec.name!r}: {len(values)} values, shape "
                        f"{list(spec.shape)} needs {size}")
    return values


def _value_error(spec: ColumnSpec, pieces: list[str], i: int, reason: str, phrase: str) -> RowError:
    """The error of a cell's ``i``-th value: the column, which value, what kind of text."""
    which = f"value {i + 1} of {len(pieces)}: " if len(pieces) > 1 else ""
    # A value read (it is a number), but not finite: what it reads as is what matters.
    what = "the value" if reason == "non_finite_value" else describe_text(pieces[i])
    return RowError(0, reason, f"column {spec.name!r} ({spec.type}): {which}{what} {phrase}")


def _tensor_entry(spec: ColumnSpec, values: list) -> bytes:
    dtype = {"int64": np.int64, "float": np.float32, "bool": np.bool_}.get(spec.type)
    array = np.array(values, dtype=dtype if dtype is not None else object).reshape(spec.shape)
    return feature_entry(spec.feature_name, "string", (encode_tensor(array),))


class RowEncoder:
    """Encodes batches of rows of one table layout into framed records.

    Args:
      schema: the table schema.
      header: the CSV's column names, in file order.

    Raises:
      ValueError: if a schema column is not in the header.
    """

    def __init__(self, schema: TableSchema, header: Sequence[str]):
        missing = [c.name for c in schema.kept if c.name not in header]
        if missing:
            raise ValueError(f"schema columns {missing} are not in the CSV header {list(header)}")
        self.schema = schema
        self.columns = schema.kept
        # Feature items of a record must be in name order, shape features included.
        names = []
        for column in self.columns:
            names.append((column.feature_name, column.name, "values"))
            if column.shape is not None and column.encoding == "flat":
                names.append((f"{column.feature_name}/shape", column.name, "shape"))
        self._order = sorted(names)
        # The entry of an empty cell of each vectorized column (None: an error).
        self._empty = {}
        for column in self.columns:
            if vectorized(column):
                entry = self._cell_entry(column, "")
                self._empty[column.name] = None if isinstance(entry, RowError) else entry

    @staticmethod
    def _cell_entry(column: ColumnSpec, cell: str) -> bytes | RowError:
        """One cell of a column without a shape: its serialized entry, or why it has none."""
        default = None
        if column.default is not None:
            default = column.default if isinstance(column.default, list) else [column.default]
        parsed = _parse_cell(column, cell, _PARSERS[column.type], default, None)
        if isinstance(parsed, RowError):
            return parsed
        return feature_entry(column.feature_name, column.dtype, parsed)

    def _items(self, column: ColumnSpec, values: ColumnValues) -> dict[str, list]:
        """Feature name → per-row serialized items (None for bad rows)."""
        name, dtype = column.feature_name, column.dtype
        memo: dict = {}
        items = []
        for row_values in values:
            if row_values is None:
                items.append(None)
                continue
            # Floats by their bits: 0.0 == -0.0, but they are written differently.
            key = struct.pack(f"<{len(row_values)}d", *row_values) if column.type == "float" else tuple(row_values)
            item = memo.get(key)
            if item is None:
                if column.encoding == "tensor":
                    item = _tensor_entry(column, row_values)
                else:
                    item = feature_entry(name, dtype, row_values)
                if len(memo) < 100_000:
                    memo[key] = item
            items.append(item)
        out = {name: items}
        if column.shape is not None and column.encoding == "flat":
            shape_item = feature_entry(f"{name}/shape", "int64", column.shape)
            out[f"{name}/shape"] = [None if v is None else shape_item for v in values]
        return out

    def parse(self, cells: Mapping[str, Sequence[str]]) -> tuple[dict[str, ColumnValues], list[RowError]]:
        """Parses every kept column; returns values by column name and all errors."""
        values, errors = {}, []
        for column in self.columns:
            values[column.name], column_errors = parse_column(column, cells[column.name])
            errors.extend(column_errors)
        return values, errors

    def _column_entries(self, column: ColumnSpec, cells) -> tuple[dict[str, pa.Array], list[RowError]]:
        """Feature name → each row's entry (a placeholder in a bad row); and the errors."""
        if vectorized(column):
            array = cells if isinstance(cells, pa.Array) else pa.array(cells, type=pa.string())
            if array.type != pa.string():
                array = array.cast(pa.string())
            if array.null_count:  # A missing cell is an empty one.
                array = pc.fill_null(array, "")
            entries, rest = column_entries(column, array, self._empty[column.name])
            errors: list[RowError] = []
            if rest.any():
                # Cells Arrow does not read as the per-cell parser would: encoded one by one.
                memo: dict[str, bytes | RowError] = {}
                replacements = []
                for row, cell in zip(np.nonzero(rest)[0].tolist(), array.filter(pa.array(rest)).to_pylist()):
                    entry = memo.get(cell)
                    if entry is None:
                        entry = memo[cell] = self._cell_entry(column, cell)
                    if isinstance(entry, RowError):
                        errors.append(dataclasses.replace(entry, row=row))
                        entry = b""
                    replacements.append(entry)
                entries = pc.replace_with_mask(entries, pa.array(rest),
                                               pa.array(replacements, type=pa.large_binary()))
            return {column.feature_name: entries}, errors
        if isinstance(cells, pa.Array):
            cells = cells.to_pylist()
        values, errors = parse_column(column, cells)
        return {name: pa.array([b"" if item is None else item for item in items], type=pa.large_binary())
                for name, items in self._items(column, values).items()}, errors

    def entries(self, cells: Mapping[str, Sequence[str] | pa.Array], rows: int
                ) -> tuple[list[pa.Array], np.ndarray, list[RowError]]:
        """Every row's serialized feature entries.

        Args:
          cells: column name → the batch's raw cells (at least the kept columns),
            as Arrow string arrays (lists of strings are taken too).
          rows: number of rows in the batch.

        Returns:
          Per feature, in name order, each row's entry (a large_binary array, for
          ``table_columns.frame_examples``); per row whether it is bad; and the
          errors, one per bad row (the first column that failed, in schema order),
          in row order.
        """
        by_name: dict[str, pa.Array] = {}
        errors: list[RowError] = []
        for column in self.columns:
            column_entries_, column_errors = self._column_entries(column, cells[column.name])
            by_name.update(column_entries_)
            errors.extend(column_errors)
        first: dict[int, RowError] = {}
        for error in errors:
            first.setdefault(error.row, error)
        bad = np.zeros(rows, dtype=bool)
        bad[list(first)] = True
        return [by_name[name] for name, _, _ in self._order], bad, [first[row] for row in sorted(first)]

    def encode(
        self, cells: Mapping[str, Sequence[str] | pa.Array], rows: int
    ) -> tuple[list[bytes | None], list[RowError]]:
        """Framed records for a batch of rows.

        Args:
          cells: column name → the batch's raw cells (at least the kept columns),
            as lists of strings or Arrow string arrays.
          rows: number of rows in the batch.

        Returns:
          Per row its framed record, or ``None`` when the row is bad; and the
          errors, one per bad row (the first column that failed, in schema order).
        """
        entries, bad, errors = self.entries(cells, rows)
        good = np.nonzero(~bad)[0]
        if bad.any():
            keep = pa.array(~bad)
            entries = [e.filter(keep) for e in entries]
        records: list[bytes | None] = [None] * rows
        for row, record in zip(good.tolist(), frame_examples(entries, len(good)).to_pylist()):
            records[row] = record
        return records, errors
