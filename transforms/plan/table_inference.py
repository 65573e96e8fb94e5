"""Inferring a table schema from sample rows, for ``infer-schema`` and for tables
converted without ``--schema``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from beam_tfrecords.schemas.table_schema import FALSE_WORDS, TRUE_WORDS, ColumnSpec, TableSchema

__all__ = ["infer_schema"]

_WIDENING = ("bool", "int64", "float", "string")


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


def infer_schema(header: Sequence[str], rows: Iterable[Sequence[str]]) -> TableSchema:
    """A schema that fits every sampled row.

    Types widen int64 < float < string; a column whose every value is a boolean
    word (true/false, yes/no, ...) is bool; 0/1 columns stay int64. A column with
    an empty cell is optional (no default), others are required.
    """
    kinds: list[set[str]] = [set() for _ in header]
    empty = [False] * len(header)
    for row in rows:
        for i, cell in enumerate(row[: len(header)]):
            if cell.strip() == "":
                empty[i] = True
            else:
                kinds[i].add(_cell_type(cell))
    columns = []
    for name, seen, has_empty in zip(header, kinds, empty):
        if not seen:
            kind = "string"
        elif seen == {"bool"}:
            kind = "bool"
        elif "bool" in seen or "string" in seen:
            kind = "string"
        else:
            kind = max(seen, key=_WIDENING.index)
        columns.append(ColumnSpec(name=name, type=kind, required=not has_empty))
    return TableSchema(tuple(columns))
