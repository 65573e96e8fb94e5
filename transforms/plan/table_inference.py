"""Inferring a table schema from sample rows, for ``infer-schema`` and for tables
converted without ``--schema``: from cell text (CSV), or from the column types
a Parquet or JSON Lines file holds."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import FALSE_WORDS, TRUE_WORDS, ColumnSpec, TableSchema
from beam_tfrecords.transforms.codec.table_cells import text_batch

__all__ = ["LIST_DELIMITERS", "infer_schema", "infer_typed_schema"]

_WIDENING = ("bool", "int64", "float", "string")
# Delimiters of number lists in a cell (``3;17;42``), tried in this order. A comma is
# not one: ``1,5`` is as often a decimal comma as a list.
LIST_DELIMITERS = (";", "|", " ")
# Delimiters for a typed list column's inferred schema: the first its values never hold.
_TYPED_LIST_DELIMITERS = (";", "|", "\t", "\x1f")


def _cell_type(cell: str) -> str:
    value = cell.strip()
    if value.lower() in TRUE_WORDS | FALSE_WORDS and not value.lstrip("+-").isdigit():
        return "bool"
    try:
        int(value)
        return "int64" if "_" not in value else "string"
    except ValueError:
        pass
    try:
        float(value)
        return "float" if "_" not in value else "string"
    except ValueError:
        return "string"


def _number_list(cells: Sequence[str]) -> tuple[str, str, set[int]] | None:
    """``(delimiter, type, value counts)`` when every cell is numbers joined by one
    of ``LIST_DELIMITERS`` (as the converter splits them) and some cell holds two
    or more; else ``None``."""
    for delimiter in LIST_DELIMITERS:
        if not any(delimiter in cell for cell in cells):
            continue
        kinds, counts = set(), set()
        for cell in cells:
            pieces = cell.split(delimiter)
            kinds.update(_cell_type(p) if p.strip() else "string" for p in pieces)
            counts.add(len(pieces))
            if not kinds <= {"int64", "float"}:
                break
        else:
            return delimiter, ("float" if "float" in kinds else "int64"), counts
    return None


def _list_spec(name: str, kind: str, delimiter: str, counts: set[int], has_empty: bool) -> ColumnSpec:
    """A list column: a fixed shape when every sampled row holds the same number of
    values (and none is empty: an empty cell would give a record of no values)."""
    fixed = len(counts) == 1 and not has_empty and min(counts) > 1
    return ColumnSpec(name=name, type=kind, delimiter=delimiter,
                      shape=(min(counts),) if fixed else None, required=not has_empty)


def infer_schema(header: Sequence[str], rows: Iterable[Sequence[str]]) -> TableSchema:
    """A schema that fits every sampled row.

    Types widen int64 < float < string; a column whose every value is a boolean
    word (true/false, yes/no, ...) is bool; 0/1 columns stay int64. A column whose
    cells are numbers joined by ``;``, ``|`` or a space (``3;17;42``) is an int64 or
    float list with that delimiter, of fixed shape ``[n]`` when every sampled cell
    holds ``n`` values. A column with an empty cell is optional (no default),
    others are required.
    """
    kinds: list[set[str]] = [set() for _ in header]
    empty = [False] * len(header)
    texts: list[list[str]] = [[] for _ in header]
    for row in rows:
        for i, cell in enumerate(row[: len(header)]):
            if cell.strip() == "":
                empty[i] = True
            else:
                kinds[i].add(_cell_type(cell))
                if "string" in kinds[i]:
                    texts[i].append(cell)
    columns = []
    for name, seen, has_empty, strings in zip(header, kinds, empty, texts):
        if not seen:
            kind = "string"
        elif seen == {"bool"}:
            kind = "bool"
        elif "bool" in seen or "string" in seen:
            kind = "string"
        else:
            kind = max(seen, key=_WIDENING.index)
        if kind == "string" and seen <= {"int64", "float", "string"}:
            found = _number_list(strings)
            if found is not None:
                delimiter, list_kind, counts = found
                # Cells of one number are lists of one value.
                list_kind = "float" if "float" in seen else list_kind
                if seen - {"string"}:
                    counts = counts | {1}
                columns.append(_list_spec(name, list_kind, delimiter, counts, has_empty))
                continue
        columns.append(ColumnSpec(name=name, type=kind, required=not has_empty))
    return TableSchema(tuple(columns))


def _arrow_kind(kind: pa.DataType) -> str:
    if pa.types.is_dictionary(kind):
        return _arrow_kind(kind.value_type)
    if pa.types.is_boolean(kind):
        return "bool"
    if pa.types.is_integer(kind):
        return "int64"
    if pa.types.is_floating(kind) or pa.types.is_decimal(kind):
        return "float"
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_fixed_size_binary(kind):
        return "bytes"
    return "string"


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)


def infer_typed_schema(header: Sequence[str], tables: Sequence[pa.Table]) -> TableSchema:
    """A schema from the column types of a Parquet or JSON Lines sample.

    The file's types decide: integers are int64, floats and decimals float, bools
    bool, binary bytes, strings (and dates, times, structs) string; a list of one
    of those is a list column (delimiter ``;``, or another its values never hold),
    of fixed shape ``[n]`` when every sampled row holds ``n`` values. JSON Lines
    pieces may type a column differently: integers and floats widen to float, a
    number and a list of numbers to a list, anything else to string. A column
    with a null, an empty value or an absent key is optional; others are required.

    Args:
      header: the columns, in order.
      tables: the sampled rows, in pieces.
    """
    columns = []
    for name in header:
        kinds, lists, counts, has_empty = set(), False, set(), False
        values: list = []
        for table in tables:
            if name not in table.schema.names:
                has_empty = has_empty or table.num_rows > 0
                continue
            array = table.column(name)
            kind = array.type
            if pa.types.is_null(kind):
                has_empty = has_empty or table.num_rows > 0
                continue
            text = text_batch(table.select([name]), [name], {})[0].column(0)
            has_empty = has_empty or bool(pc.any(pc.equal(text, "")).as_py())
            if _is_list(kind):
                lists = True
                element = kind.value_type
                if not pa.types.is_null(element):
                    kinds.add(_arrow_kind(element))
                lengths = pc.list_value_length(array.combine_chunks()).to_numpy(zero_copy_only=False)
                counts.update(int(n) for n in np.unique(lengths[~np.isnan(lengths.astype(float))]))
                if kinds == {"string"}:
                    values.extend(v for v in pc.list_flatten(array).to_pylist() if v is not None)
            else:
                kinds.add(_arrow_kind(kind))
                counts.add(1)
        if kinds <= {"int64", "float"} and len(kinds) == 2:
            kinds = {"float"}
        kind = kinds.pop() if len(kinds) == 1 else "string"
        if lists and kind in ("int64", "float", "bool", "string", "bytes"):
            counts.discard(0)
            if kind == "string":
                delimiter = next((d for d in _TYPED_LIST_DELIMITERS if not any(d in v for v in values)),
                                 _TYPED_LIST_DELIMITERS[0])
            else:
                delimiter = _TYPED_LIST_DELIMITERS[0]
            columns.append(_list_spec(name, kind, delimiter, counts or {0}, has_empty))
        else:
            columns.append(ColumnSpec(name=name, type=kind, required=not has_empty))
    return TableSchema(tuple(columns))
