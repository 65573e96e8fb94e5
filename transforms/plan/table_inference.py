"""Inferring a table schema from sample rows, for ``infer-schema`` and for tables
converted without ``--schema``: from cell text (CSV), or from the column types
a Parquet or JSON Lines file holds.

An inferred schema never dead-letters the rows it was inferred from: once the
types are chosen, each number column's sampled cells are parsed as the converter
parses them. A float column whose sample holds NaN or infinities allows them
(``allow_nan``, ``allow_infinite``); any other column a sampled cell does not fit
(a number outside float32 or int64) becomes a string column. Each such decision,
and each column whose sample holds values of several types, is said in a note
(``notes``) that the plan prints.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import FALSE_WORDS, TRUE_WORDS, ColumnSpec, TableSchema
from beam_tfrecords.transforms.codec.table_cells import text_batch
from beam_tfrecords.transforms.codec.table_columns import column_entries, vectorized
from beam_tfrecords.transforms.codec.table_rows import parse_column

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


def _fit(spec: ColumnSpec, cells: Sequence[str], notes: list[str] | None) -> ColumnSpec:
    """``spec``, changed so that every sampled cell fits it (see the module docstring)."""
    if spec.type not in ("int64", "float"):
        return spec  # Strings take any text; bool and bytes are inferred only when every cell fits.
    loose = dataclasses.replace(spec, allow_nan=True, allow_infinite=True) if spec.type == "float" else spec
    if vectorized(loose):  # Arrow finds the few cells the per-cell parser must see.
        _, rest = column_entries(loose, pa.array(cells, type=pa.string()), b"")
        cells = [cell for cell, left in zip(cells, rest.tolist()) if left]
    values, errors = parse_column(loose, cells)
    if not errors:
        if spec.type != "float":
            return spec
        numbers = [v for row in values if row for v in row]
        nan = any(math.isnan(v) for v in numbers)
        infinite = any(math.isinf(v) for v in numbers)
        if not (nan or infinite):
            return spec
        keys = [key for key, on in (("allow_nan", nan), ("allow_infinite", infinite)) if on]
        what = " and ".join(w for w, on in (("NaN", nan), ("infinite values", infinite)) if on)
        if notes is not None:
            notes.append(f"column {spec.name!r}: its sampled rows hold {what}, so the schema allows "
                         f"them ({', '.join(k + ': true' for k in keys)}); give --schema without "
                         "that to dead-letter such rows instead")
        return dataclasses.replace(spec, allow_nan=nan, allow_infinite=infinite)
    if notes is not None:
        kind = f"{spec.type}{' list' if spec.is_list else ''}"
        notes.append(f"column {spec.name!r}: a sampled cell does not fit {kind} "
                     f"({errors[0].message.split(': ', 1)[-1]}), so it is a string "
                     f"{'list ' if spec.is_list else ''}column")
    return ColumnSpec(name=spec.name, type="string", delimiter=spec.delimiter, shape=spec.shape,
                      required=spec.required)


def infer_schema(header: Sequence[str], rows: Iterable[Sequence[str]],
                 notes: list[str] | None = None) -> TableSchema:
    """A schema that fits every sampled row.

    Types widen int64 < float < string; a column whose every value is a boolean
    word (true/false, yes/no, ...) is bool; 0/1 columns stay int64. A column whose
    cells are numbers joined by ``;``, ``|`` or a space (``3;17;42``) is an int64 or
    float list with that delimiter, of fixed shape ``[n]`` when every sampled cell
    holds ``n`` values. A column with an empty cell is optional (no default),
    others are required. Number columns are then fitted to their cells (see the
    module docstring).

    Args:
      header: the column names.
      rows: the sampled rows' cells.
      notes: if given, appended with a line per column the fitting changed.
    """
    kinds: list[set[str]] = [set() for _ in header]
    empty = [False] * len(header)
    texts: list[list[str]] = [[] for _ in header]
    cells: list[list[str]] = [[] for _ in header]
    for row in rows:
        for i, cell in enumerate(row[: len(header)]):
            cells[i].append(cell)
            if cell.strip() == "":
                empty[i] = True
            else:
                kinds[i].add(_cell_type(cell))
                if "string" in kinds[i]:
                    texts[i].append(cell)
    columns = []
    for name, seen, has_empty, strings, sampled in zip(header, kinds, empty, texts, cells):
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
                columns.append(_fit(_list_spec(name, list_kind, delimiter, counts, has_empty),
                                    sampled, notes))
                continue
        if kind == "string" and len(seen) > 1 and notes is not None:
            notes.append(f"column {name!r}: its sampled cells hold values of several types "
                         f"({', '.join(sorted(seen))}), so it is a string column")
        columns.append(_fit(ColumnSpec(name=name, type=kind, required=not has_empty), sampled, notes))
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


def infer_typed_schema(header: Sequence[str], tables: Sequence[pa.Table],
                       notes: list[str] | None = None) -> TableSchema:
    """A schema from the column types of a Parquet or JSON Lines sample.

    The file's types decide: integers are int64, floats and decimals float, bools
    bool, binary bytes, strings (and dates, times, structs) string; a list of one
    of those is a list column (delimiter ``;``, or another its values never hold),
    of fixed shape ``[n]`` when every sampled row holds ``n`` values. JSON Lines
    pieces may type a column differently: integers and floats widen to float, a
    number and a list of numbers to a list, anything else to string (a note
    says so). A column with a null, an empty value or an absent key is optional;
    others are required. Number columns are then fitted to their cells (see the
    module docstring).

    Args:
      header: the columns, in order.
      tables: the sampled rows, in pieces.
      notes: if given, appended with a line per column of several types, and per
        column the fitting changed.
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
        if len(kinds) > 1 and notes is not None:
            notes.append(f"column {name!r}: its sampled rows hold values of several types "
                         f"({', '.join(sorted(kinds))}), so it is a string {'list ' if lists else ''}"
                         "column")
        kind = kinds.pop() if len(kinds) == 1 else "string"
        if lists and kind in ("int64", "float", "bool", "string", "bytes"):
            counts.discard(0)
            if kind == "string":
                delimiter = next((d for d in _TYPED_LIST_DELIMITERS if not any(d in v for v in values)),
                                 _TYPED_LIST_DELIMITERS[0])
            else:
                delimiter = _TYPED_LIST_DELIMITERS[0]
            spec = _list_spec(name, kind, delimiter, counts or {0}, has_empty)
        else:
            spec = ColumnSpec(name=name, type=kind, required=not has_empty)
        columns.append(_fit(spec, _sample_text(tables, spec), notes))
    return TableSchema(tuple(columns))


def _sample_text(tables: Sequence[pa.Table], spec: ColumnSpec) -> list[str]:
    """A column's sampled cells as the converter reads them (``codec.table_cells``)."""
    if spec.type not in ("int64", "float"):
        return []
    cells: list[str] = []
    for table in tables:
        if spec.name in table.schema.names and table.num_rows:
            batch, _ = text_batch(table.select([spec.name]), [spec.name], {spec.name: spec})
            cells += batch.column(0).to_pylist()
    return cells
