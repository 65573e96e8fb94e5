"""Typed Arrow columns (from Parquet or JSON Lines) to the cell text of a CSV.

The table encoder (``table_rows``) reads cells as text, as a CSV holds them. A
typed column is turned into the text a CSV of the same table would hold, so
the same encoder, split hashing and record bytes apply to every table format:

* integers: their decimal digits (exact, any width);
* floats: the shortest text that reads back as the same float64 (a float32 is
  widened to float64 first, so it reads back as the same float32);
* bools: ``true``/``false``; strings: as they are; binary: base64 for a
  ``bytes`` column, else UTF-8 text (a cell that is not UTF-8 costs its row);
* lists: their elements' text joined by the schema column's ``delimiter``;
* null: an empty cell (missing, exactly as an empty CSV cell);
* anything else (dates, timestamps, decimals): Arrow's text for it; structs
  and maps: JSON text.

A value that has no cell text (a list where the schema has one value, a null
inside a list, a list element holding the delimiter) costs its row: it is
reported per row with a reason, never written as something else.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import ColumnSpec

__all__ = ["LIST_DELIMITER", "cell_text", "text_batch"]

# Joins the values of a list column no schema column describes (a split or key column).
LIST_DELIMITER = ";"

# {row: (reason, message)} of rows whose cells have no text.
RowProblems = dict[int, tuple[str, str]]


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def _empty(length: int) -> pa.Array:
    return pa.array([""] * length, type=pa.string())


def _scalar_text(array: pa.Array, spec: ColumnSpec | None, name: str,
                 problems: RowProblems, rows: pa.Array | None = None) -> pa.Array:
    """Text of one-value cells; nulls stay null. ``rows`` maps a list's flattened
    elements back to their rows (for problems)."""
    kind = array.type
    if pa.types.is_dictionary(kind):
        return _scalar_text(array.dictionary_decode(), spec, name, problems, rows)
    if pa.types.is_null(kind):
        return pa.nulls(len(array), type=pa.string())
    if pa.types.is_string(kind):
        return array
    if pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        return array.cast(pa.string())
    if pa.types.is_floating(kind):
        # Widened first: a float32's shortest text would read back via float64 and could,
        # in rare cases, round to a neighbouring float32.
        return pc.cast(pc.cast(array, pa.float64()), pa.string())
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_decimal(kind) \
            or pa.types.is_temporal(kind):
        return pc.cast(array, pa.string())
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind) \
            or pa.types.is_binary_view(kind):
        cells = array.to_pylist()
        if spec is not None and spec.type == "bytes":
            return pa.array([None if c is None else base64.b64encode(c).decode("ascii") for c in cells],
                            type=pa.string())
        out = []
        for i, cell in enumerate(cells):
            try:
                out.append(None if cell is None else cell.decode("utf-8"))
            except UnicodeDecodeError:
                problems.setdefault(_row(rows, i), ("invalid_utf8", f"column {name!r} is not valid UTF-8 text"))
                out.append(None)
        return pa.array(out, type=pa.string())
    if _is_list(kind):
        for i in range(len(array)):
            if array[i].is_valid:
                problems.setdefault(_row(rows, i), ("bad_value", f"column {name!r}: a list inside a list "
                                                    "cannot be one cell"))
        return pa.nulls(len(array), type=pa.string())
    # Structs, maps, unions: their JSON text.
    return pa.array([None if c is None else json.dumps(c, ensure_ascii=False, sort_keys=True, default=str)
                     for c in array.to_pylist()], type=pa.string())


def _row(rows: pa.Array | None, i: int) -> int:
    return i if rows is None else rows[i].as_py()


def _list_text(array: pa.Array, spec: ColumnSpec | None, name: str, problems: RowProblems) -> pa.Array:
    """Text of list cells: the elements' text joined by the column's delimiter."""
    if pa.types.is_fixed_size_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    delimiter = spec.delimiter if spec is not None and spec.is_list else LIST_DELIMITER
    if spec is not None and not spec.is_list:
        lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False)
        for row in range(len(array)):
            if array[row].is_valid and lengths[row] > 1:
                problems.setdefault(row, (
                    "bad_value", f"column {name!r} ({spec.type}): {int(lengths[row])} values where the "
                    "schema has one (give the column a 'delimiter' to make it a list)"))
    flat = pc.list_flatten(array)
    parents = pc.list_parent_indices(array)
    text = _scalar_text(flat, spec, name, problems, parents)
    if flat.null_count:
        for i in pc.indices_nonzero(pc.is_null(flat)).to_pylist():
            problems.setdefault(parents[i].as_py(), (
                "bad_value", f"column {name!r}: a list holds a null (a list cell cannot leave out a value)"))
    holds = pc.match_substring(text, delimiter)
    if pc.any(holds).as_py():
        for i in pc.indices_nonzero(pc.fill_null(holds, False)).to_pylist():
            problems.setdefault(parents[i].as_py(), (
                "bad_value", f"column {name!r}: a value holds the list delimiter {delimiter!r}; "
                "choose another 'delimiter' in the schema"))
    # Offsets into the flattened text (a sliced array's own offsets do not start at 0,
    # and a null list may own elements that flattening drops).
    lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy(zero_copy_only=False)
    offsets = pa.array(np.concatenate(([0], np.cumsum(lengths))), type=pa.int32())
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, pc.fill_null(text, "")), delimiter)
    # A null list stays null (missing); an empty list joins to "" (missing too).
    return pc.if_else(pc.is_valid(array), joined, pa.scalar(None, pa.string()))


def cell_text(array: pa.Array, spec: ColumnSpec | None, name: str,
              problems: RowProblems) -> pa.Array:
    """One column's cells as CSV text (a string array without nulls).

    Args:
      array: the typed column.
      spec: the schema's column (its type and delimiter), or ``None`` for a column
        the schema does not keep.
      name: the column's name (for messages).
      problems: ``{row: (reason, message)}``, added to for cells with no text.
    """
    if isinstance(array, pa.ChunkedArray):  # (combine_chunks copies even one chunk)
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if _is_list(array.type) or pa.types.is_large_list(array.type):
        if pa.types.is_large_list(array.type):
            array = array.cast(pa.list_(array.type.value_type))
        text = _list_text(array, spec, name, problems)
    else:
        text = _scalar_text(array, spec, name, problems)
    return pc.fill_null(text, "")


def text_batch(table: pa.Table | pa.RecordBatch, header: Sequence[str],
               specs: Mapping[str, ColumnSpec]) -> tuple[pa.RecordBatch, RowProblems]:
    """A typed table as a batch of CSV text, one string column per ``header`` name
    (a column the table lacks is all empty), and the rows whose cells have no text.

    Args:
      table: the typed rows.
      header: the columns to give, in order.
      specs: the schema's kept columns by name.
    """
    problems: RowProblems = {}
    names = set(table.schema.names)
    columns = [
        cell_text(table.column(name), specs.get(name), name, problems) if name in names
        else _empty(table.num_rows)
        for name in header
    ]
    return pa.RecordBatch.from_arrays(columns, names=list(header)), problems
