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
import functools
import math
import re
import struct
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import ColumnSpec, TableSchema, parse_bool
from beam_tfrecords.transforms.codec.example import (
    _VARINT_TABLE,
    _entry_prefix,
    _varint,
    bytes_entry_parts,
    feature_entry,
)
from beam_tfrecords.transforms.codec.tensors import encode_tensor
from beam_tfrecords.transforms.codec.tfrecord import frame_record

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

    @staticmethod
    def _scalar_item(column: ColumnSpec, cell: str) -> bytes | RowError:
        """The serialized item of one cell of a one-value column, or why it has none."""
        name, kind = column.feature_name, column.type
        if cell == "" or (kind != "string" and not cell.strip()):
            default = None if column.default is None else [column.default]
            parsed = _parse_cell(column, cell, _PARSERS[kind], default, None)
            return parsed if isinstance(parsed, RowError) else feature_entry(name, column.dtype, parsed)
        if kind == "string":
            return _string_item(name, cell)
        try:
            value = _PARSERS[kind](cell)
        except ValueError as err:
            return RowError(0, "bad_value", f"column {column.name!r} ({kind}): {err}")
        return _float_item(name, value) if kind == "float" else feature_entry(name, column.dtype, (value,))

    def _scalar_items(self, column: ColumnSpec, cells) -> tuple[list, list[RowError]]:
        """Per-row items of a one-value column: each distinct cell encoded once.

        Arrow finds the distinct cells (``dictionary_encode``); rows then pick
        their item by index. Plain lists are memoised while they look categorical.
        """
        if isinstance(cells, pa.Array):
            errors: list[RowError] = []
            encoded = pc.dictionary_encode(cells)
            distinct = [self._scalar_item(column, c) for c in encoded.dictionary.to_pylist()]
            indices = encoded.indices.to_numpy(zero_copy_only=False)
            items = [distinct[i] for i in indices.tolist()]
            for k, item in enumerate(distinct):
                if isinstance(item, RowError):
                    for row in np.nonzero(indices == k)[0].tolist():
                        errors.append(dataclasses.replace(item, row=row))
                        items[row] = None
            errors.sort(key=lambda e: e.row)
            return items, errors
        return _memoised_items(cells, lambda cell: self._scalar_item(column, cell))

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

    def _float_items(self, column: ColumnSpec, cells) -> tuple[list, list[RowError]] | None:
        """Per-row items of a one-value float column, parsed by Arrow in one call;
        ``None`` when a cell needs the per-cell path (bad values, empty required)."""
        if not isinstance(cells, pa.Array):
            return None
        text = pc.utf8_trim_whitespace(cells)
        empty = pc.equal(text, "").to_numpy(zero_copy_only=False)
        if column.required and empty.any():
            return None
        try:
            values = pc.cast(pc.if_else(pc.equal(text, ""), "0", text), pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        numbers = values.to_numpy(zero_copy_only=False)
        if (np.isfinite(numbers) & (np.abs(numbers) > _FLOAT32_MAX)).any():
            return None
        raw = numbers.astype("<f4").tobytes()
        head = _float_head(column.feature_name)
        items = [head + raw[i:i + 4] for i in range(0, len(raw), 4)]
        if empty.any():
            fill = feature_entry(column.feature_name, "float32",
                                 [] if column.default is None else [column.default])
            for row in np.nonzero(empty)[0]:
                items[row] = fill
        return items, []

    def _arrow_int_list_items(self, column: ColumnSpec, cells) -> tuple[list, list[RowError]] | None:
        """Per-row items of an int64 list column, split and parsed by Arrow in a few
        calls; ``None`` when a cell needs the per-cell path (bad values, empty
        required, values outside 0..2**21)."""
        if not isinstance(cells, pa.Array):
            return None
        text = pc.utf8_trim_whitespace(cells)
        empty = pc.equal(text, "").to_numpy(zero_copy_only=False)
        if column.required and empty.any():
            return None
        lists = pc.split_pattern(pc.if_else(pc.equal(text, ""), "0", text), pattern=column.delimiter)
        try:
            values = pc.cast(pc.utf8_trim_whitespace(pc.list_flatten(lists)), pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        numbers = values.to_numpy(zero_copy_only=False)
        if numbers.size and (numbers.min() < 0 or numbers.max() >= 1 << 21):
            return None
        # Every value's varint (1 to 3 bytes), laid end to end.
        widths = 1 + (numbers >= 1 << 7) + (numbers >= 1 << 14)
        ends = np.cumsum(widths)
        encoded = np.zeros(int(ends[-1]) if ends.size else 0, dtype=np.uint8)
        starts = ends - widths
        for byte in range(3):
            has = widths > byte
            more = widths > byte + 1
            encoded[starts[has] + byte] = ((numbers[has] >> (7 * byte)) & 0x7F) | (more[has] << 7)
        blob = encoded.tobytes()
        bounds = np.concatenate(([0], ends))[lists.offsets.to_numpy()]
        name = column.feature_name
        prefix = _entry_prefix(name)
        fill = None
        items: list = []
        for row in range(len(cells)):
            if empty[row]:
                if fill is None:
                    fill = feature_entry(name, "int64", [] if column.default is None else column.default)
                items.append(fill)
                continue
            items.append(_int_list_item(prefix, blob[bounds[row]:bounds[row + 1]]))
        return items, []

    def _int_list_items(self, column: ColumnSpec, cells: Sequence[str]) -> tuple[list, list[RowError]]:
        """Per-row items of an int64 list column (no shape)."""
        name, delimiter = column.feature_name, column.delimiter
        valid = _int_list_pattern(delimiter).fullmatch
        default = None if column.default is None else list(column.default)
        prefix = _entry_prefix(name)
        table = _VARINT_TABLE

        def item_of(cell: str) -> bytes | RowError:
            values = list(map(int, cell.split(delimiter))) if valid(cell) else None
            if values is None or (len(cell) > 18 and (min(values) < -(2**63) or max(values) >= 2**63)):
                parsed = _parse_cell(column, cell, _parse_int, default, None)
                return parsed if isinstance(parsed, RowError) else feature_entry(name, "int64", parsed)
            return _int_list_item(prefix, b"".join([table[v] if 0 <= v < 16384 else _varint(v)
                                                    for v in values]))

        return _memoised_items(cells, item_of)

    def encode(
        self, cells: Mapping[str, Sequence[str]], rows: int
    ) -> tuple[list[bytes | None], list[RowError]]:
        """Framed records for a batch of rows.

        Args:
          cells: column name → the batch's raw cells (at least the kept columns),
            as lists of strings or Arrow string arrays (faster for float columns).
          rows: number of rows in the batch.

        Returns:
          Per row its framed record, or ``None`` when the row is bad; and the
          errors, one per bad row (the first column that failed, in schema order).
        """
        items: dict[str, list] = {}
        errors: list[RowError] = []
        for column in self.columns:
            column_cells = cells[column.name]
            fast = None
            if not column.is_list and column.shape is None and column.type == "float":
                fast = self._float_items(column, column_cells)
            elif column.is_list and column.shape is None and column.type == "int64":
                fast = self._arrow_int_list_items(column, column_cells)
            if fast is not None:
                items[column.feature_name], column_errors = fast
            elif not column.is_list and column.shape is None and column.encoding == "flat":
                items[column.feature_name], column_errors = self._scalar_items(column, column_cells)
            else:
                if isinstance(column_cells, pa.Array):
                    column_cells = column_cells.to_pylist()
                if column.is_list and column.type == "int64" and column.shape is None:
                    items[column.feature_name], column_errors = self._int_list_items(column, column_cells)
                else:
                    values, column_errors = parse_column(column, column_cells)
                    items.update(self._items(column, values))
            errors.extend(column_errors)
        ordered = [items[name] for name, _, _ in self._order]
        records: list[bytes | None] = []
        for row_items in zip(*ordered) if ordered else ([()] * rows):
            if None in row_items:
                records.append(None)
                continue
            size = sum(map(len, row_items))
            example = b"".join((b"\x0a", _SMALL[size] if size < 0x80 else _varint(size), *row_items))
            records.append(frame_record(example))
        first: dict[int, RowError] = {}
        for error in errors:
            first.setdefault(error.row, error)
        return records, [first[row] for row in sorted(first)]


_SMALL = tuple(bytes((i,)) for i in range(128))


def _memoised_items(cells: Sequence[str], item_of) -> tuple[list, list[RowError]]:
    """``item_of(cell)`` per row (``None`` and an error for a bad cell); equal cells are
    encoded once while the column looks categorical, then the memo is dropped."""
    memo: dict[str, bytes | RowError] = {}
    use_memo = True
    items: list = []
    errors: list[RowError] = []
    for row, cell in enumerate(cells):
        item = memo.get(cell) if use_memo else None
        if item is None:
            item = item_of(cell)
            if use_memo:
                memo[cell] = item
                if row == 1023 and len(memo) > 256:
                    use_memo = False
                    memo.clear()
        if isinstance(item, RowError):
            errors.append(dataclasses.replace(item, row=row))
            items.append(None)
        else:
            items.append(item)
    return items, errors


def _int_list_item(prefix: bytes, packed: bytes) -> bytes:
    """An int64 list's feature item from its entry prefix and packed varints."""
    inner = b"".join((b"\x0a", _varint(len(packed)), packed))
    feature = b"".join((b"\x1a", _varint(len(inner)), inner))
    entry = b"".join((prefix, _varint(len(feature)), feature))
    return b"".join((b"\x0a", _varint(len(entry)), entry))


def _string_item(name: str, cell: str) -> bytes:
    """``feature_entry(name, 'string', [cell])``, without the general machinery."""
    return b"".join(bytes_entry_parts(name, cell)[0])




@functools.lru_cache(maxsize=64)
def _int_list_pattern(delimiter: str) -> re.Pattern:
    """Cells of ASCII integers separated by ``delimiter`` (spaces around allowed)."""
    number = r"\s*[+-]?[0-9]+\s*"
    return re.compile(f"{number}(?:{re.escape(delimiter)}{number})*")


def _float_head(name: str) -> bytes:
    head = _FLOAT_HEADS.get(name)
    if head is None:
        head = feature_entry(name, "float32", [0.0])[:-4]
        _FLOAT_HEADS[name] = head
    return head


_FLOAT_HEADS: dict[str, bytes] = {}


def _float_item(name: str, value: float) -> bytes:
    """``feature_entry(name, 'float32', [value])``: a fixed head and 4 bytes."""
    return _float_head(name) + struct.pack("<f", value)
