"""Rows of a table to ``tf.train.Example`` records, a column at a time.

A batch of rows arrives as columns of raw cell strings. Each column is parsed
and turned into its serialized feature items in one pass, with equal cells
encoded once (categorical columns cost a dictionary lookup per row); a row's
record is then the concatenation of its items in feature-name order. Cells that
do not parse, and empty required cells, mark their row bad with a reason.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import struct
from collections.abc import Mapping, Sequence

from schemas.features import example_from_entries, feature_entry
from schemas.table_schema import ColumnSpec, TableSchema, parse_bool
from schemas.tensors import encode_tensor
from schemas.tfrecord import frame_record

__all__ = ["ColumnValues", "RowEncoder", "RowError", "parse_column"]

_INT_CHARS = frozenset("+-0123456789")


@dataclasses.dataclass(frozen=True)
class RowError:
    """Why a row cannot become a record."""

    row: int
    reason: str
    message: str


def _parse_int(piece: str) -> int:
    text = piece.strip()
    if not text or not set(text) <= _INT_CHARS:
        raise ValueError(f"{piece!r} is not an integer")
    value = int(text)
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{piece!r} does not fit in int64")
    return value


_FLOAT32_MAX = 3.4028234663852886e38


def _parse_float(piece: str) -> float:
    text = piece.strip()
    if "_" in text:
        raise ValueError(f"{piece!r} is not a number")
    value = float(text)
    if math.isfinite(value) and abs(value) > _FLOAT32_MAX:
        raise ValueError(f"{piece!r} is outside the float32 range")
    return value


def _parse_bytes(piece: str) -> bytes:
    try:
        return base64.b64decode(piece.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{piece[:40]!r} is not valid base64") from None


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
    try:
        values = [parse(p) for p in pieces]
    except ValueError as err:
        return RowError(0, "bad_value", f"column {spec.name!r} ({spec.type}): {err}")
    if size is not None and len(values) != size:
        return RowError(0, "wrong_length", f"column {spec.name!r}: {len(values)} values, shape "
                        f"{list(spec.shape)} needs {size}")
    return values


def _tensor_entry(spec: ColumnSpec, values: list) -> bytes:
    import numpy as np  # pylint: disable=import-outside-toplevel

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

    def _items(self, column: ColumnSpec, values: ColumnValues) -> dict[str, list]:
        """Feature name → per-row serialized items (None for bad rows)."""
        name, dtype = column.feature_name, column.dtype
        memo: dict = {}
        items = []
        for row_values in values:
            if row_values is None:
                items.append(None)
                continue
            key = tuple(row_values)
            item = memo.get(key)
            if item is None:
                if column.encoding == "tensor":
                    item = _tensor_entry(column, row_values)
                elif column.type == "float" and len(row_values) == 1:
                    item = _float_item(name, row_values[0])
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

    def encode(self, cells: Mapping[str, Sequence[str]], rows: int) -> tuple[list[bytes | None], list[RowError]]:
        """Framed records for a batch of rows.

        Args:
          cells: column name → the batch's raw cells (at least the kept columns).
          rows: number of rows in the batch.

        Returns:
          Per row its framed record, or ``None`` when the row is bad; and the
          errors, one per bad row (the first column that failed, in schema order).
        """
        values, errors = self.parse(cells)
        items: dict[str, list] = {}
        for column in self.columns:
            items.update(self._items(column, values[column.name]))
        ordered = [items[name] for name, _, _ in self._order]
        records: list[bytes | None] = []
        for row_items in zip(*ordered) if ordered else ([()] * rows):
            if None in row_items:
                records.append(None)
            else:
                records.append(frame_record(example_from_entries(row_items)))
        first: dict[int, RowError] = {}
        for error in errors:
            first.setdefault(error.row, error)
        return records, [first[row] for row in sorted(first)]


_FLOAT_HEADS: dict[str, bytes] = {}


def _float_item(name: str, value: float) -> bytes:
    """``feature_entry(name, 'float32', [value])``: a fixed head and 4 bytes."""
    head = _FLOAT_HEADS.get(name)
    if head is None:
        head = feature_entry(name, "float32", [0.0])[:-4]
        _FLOAT_HEADS[name] = head
    return head + struct.pack("<f", value)
