"""Table schemas: which CSV column becomes which typed feature, and how.

A schema is a YAML or JSON document::

    columns:
      - {name: age, type: int64, required: true}
      - {name: score, type: float, default: 0.0}
      - {name: tags, type: string, delimiter: ";"}
      - {name: pixels, type: float, delimiter: " ", shape: [2, 3], encoding: tensor}
      - {name: note, skip: true}

Per column: ``name`` (the CSV header), ``type`` (int64, float, bytes (base64 in
the cell), string, bool), ``feature`` (default: the column name), ``delimiter``
(a list column), ``shape`` (a fixed shape; a list must hold exactly that many
values), ``encoding`` for shaped columns (``flat``: the values plus a
``<feature>/shape`` feature; ``tensor``: one serialized TensorProto that
``tf.io.parse_tensor`` reads), ``default`` (for empty cells), ``required`` (an
empty cell sends the row to the dead letter), ``skip``, and ``sequence`` (with
``--sequence_key``: a per-row feature list rather than a context feature).

A float column refuses values that are not finite (``nan``, ``inf``, ``1e400``,
which overflows to infinity; also NaN and infinities in Parquet and JSON Lines):
their rows go to the dead letter (``non_finite_value``). ``allow_nan: true`` keeps
NaN, ``allow_infinite: true`` keeps +/-infinity, each as float32 in the record.
A finite value outside the float32 range is always refused.

An optional column without a default gives an empty list for an empty cell, so
its feature is variable-length (shape ``[None]``).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping

import yaml

__all__ = [
    "COLUMN_TYPES",
    "ColumnSpec",
    "TableSchema",
    "dump_schema",
    "load_schema",
    "FLOAT32_MAX",
    "parse_bool",
]

COLUMN_TYPES = ("int64", "float", "bytes", "string", "bool")
ENCODINGS = ("flat", "tensor")
_FEATURE_DTYPE = {"int64": "int64", "float": "float32", "bytes": "string", "string": "string",
                  "bool": "int64"}
TRUE_WORDS = frozenset({"true", "t", "yes", "y", "1"})
FALSE_WORDS = frozenset({"false", "f", "no", "n", "0"})
_KEYS = ("name", "type", "feature", "delimiter", "shape", "encoding", "default", "required",
         "skip", "sequence", "allow_nan", "allow_infinite")
# The largest finite float32; a finite value beyond it has no float32.
FLOAT32_MAX = 3.4028234663852886e38


def parse_bool(cell: str) -> bool:
    """``true/false``, ``t/f``, ``yes/no``, ``y/n``, ``1/0``, any case.

    Raises:
      ValueError: for anything else (its message does not quote the cell).
    """
    value = cell.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError("is not a boolean (true/false, yes/no, 1/0)")


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    """How one CSV column becomes one feature (see the module docstring)."""

    name: str
    type: str = "string"
    feature: str = ""
    delimiter: str | None = None
    shape: tuple[int, ...] | None = None
    encoding: str = "flat"
    default: object = None
    required: bool = False
    skip: bool = False
    sequence: bool = False
    allow_nan: bool = False
    allow_infinite: bool = False

    def __post_init__(self):
        where = f"column {self.name!r}"
        if not self.name:
            raise ValueError("every column needs a non-empty 'name' (its CSV header)")
        if self.skip:
            return
        if self.type not in COLUMN_TYPES:
            raise ValueError(f"{where}: type must be one of {', '.join(COLUMN_TYPES)}; got {self.type!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"{where}: encoding must be one of {', '.join(ENCODINGS)}; got {self.encoding!r}")
        if self.delimiter is not None and (not isinstance(self.delimiter, str) or not self.delimiter):
            raise ValueError(f"{where}: delimiter must be a non-empty string")
        if self.shape is not None:
            if not all(isinstance(d, int) and d > 0 for d in self.shape):
                raise ValueError(f"{where}: shape must be a list of positive integers; got {list(self.shape)}")
            if self.delimiter is None and math.prod(self.shape) != 1:
                raise ValueError(f"{where}: a shape of {list(self.shape)} needs a 'delimiter' "
                                 "to split the cell into values")
        if self.encoding == "tensor" and self.shape is None:
            raise ValueError(f"{where}: encoding 'tensor' needs a 'shape'")
        if self.encoding == "tensor" and self.type not in ("int64", "float", "bool", "string"):
            raise ValueError(f"{where}: encoding 'tensor' supports int64, float, bool and string")
        for key in ("allow_nan", "allow_infinite"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{where}: {key} must be true or false; got {getattr(self, key)!r}")
            if getattr(self, key) and self.type != "float":
                raise ValueError(f"{where}: {key} applies only to float columns (this one is "
                                 f"{self.type})")
        if self.required and self.default is not None:
            raise ValueError(f"{where}: a column cannot be both 'required' and have a 'default'")
        if self.default is not None:
            self.check_default()

    @property
    def feature_name(self) -> str:
        return self.feature or self.name

    @property
    def is_list(self) -> bool:
        return self.delimiter is not None

    @property
    def dtype(self) -> str:
        """The feature's dtype as TensorFlow names it."""
        return "string" if self.encoding == "tensor" else _FEATURE_DTYPE[self.type]

    def feature_shape(self) -> list:
        """The feature's shape for the manifest's feature spec."""
        if self.encoding == "tensor":
            return []
        if self.shape is not None:
            return [math.prod(self.shape)]
        if self.is_list or (not self.required and self.default is None):
            return [None]
        return []

    def float_refusal(self, value: float) -> tuple[str, str] | None:
        """Why this float column refuses a parsed value: ``(reason, phrase)`` (the phrase
        follows a description of the value, never the value itself), or ``None``."""
        if math.isnan(value):
            if self.allow_nan:
                return None
            return ("non_finite_value", "reads as NaN, which the column does not allow (add "
                    "'allow_nan: true' to the column to keep NaN)")
        if math.isinf(value):
            if self.allow_infinite:
                return None
            sign = "-" if value < 0 else "+"
            return ("non_finite_value", f"reads as {sign}infinity, which the column does not allow "
                    "(add 'allow_infinite: true' to the column to keep infinities)")
        if abs(value) > FLOAT32_MAX:
            return "bad_value", "is outside the float32 range"
        return None

    def check_default(self) -> None:
        """Raises ValueError if ``default`` does not fit the column."""
        values = self.default if isinstance(self.default, list) else [self.default]
        if not self.is_list and isinstance(self.default, list):
            raise ValueError(f"column {self.name!r}: a scalar column's default cannot be a list")
        for value in values:
            ok = {
                "int64": isinstance(value, int) and not isinstance(value, bool),
                "float": isinstance(value, (int, float)) and not isinstance(value, bool),
                "bool": isinstance(value, bool),
                "string": isinstance(value, str),
                "bytes": isinstance(value, str),
            }[self.type]
            if not ok:
                raise ValueError(f"column {self.name!r}: default {value!r} is not a {self.type}")
            refusal = None
            if self.type == "float":
                try:
                    refusal = self.float_refusal(float(value))
                except OverflowError:  # An int too large for a float64.
                    refusal = ("bad_value", "is outside the float32 range")
            if refusal is not None:
                raise ValueError(f"column {self.name!r}: default {value!r} {refusal[1]}")
        if self.shape is not None and len(values) != math.prod(self.shape):
            raise ValueError(f"column {self.name!r}: default has {len(values)} values, shape "
                             f"{list(self.shape)} needs {math.prod(self.shape)}")

    def to_dict(self) -> dict:
        """The column as the schema file writes it (defaults left out)."""
        out: dict = {"name": self.name}
        if self.skip:
            out["skip"] = True
            return out
        out["type"] = self.type
        for key in ("feature", "delimiter", "default"):
            if getattr(self, key) not in ("", None):
                out[key] = getattr(self, key)
        if self.type == "float" and self.default is not None:  # NaN and infinities as YAML words.
            out["default"] = ([_float_text(v) for v in self.default] if isinstance(self.default, list)
                              else _float_text(self.default))
        if self.shape is not None:
            out["shape"] = list(self.shape)
            out["encoding"] = self.encoding
        for key in ("required", "sequence", "allow_nan", "allow_infinite"):
            if getattr(self, key):
                out[key] = True
        return out


# A float default that is not finite: written as YAML's words (strict JSON has none),
# read from those and the usual spellings.
_FLOAT_WORDS = {word: value for words, value in (
    ((".nan", "nan"), math.nan),
    ((".inf", "+.inf", "inf", "+inf", "infinity", "+infinity"), math.inf),
    (("-.inf", "-inf", "-infinity"), -math.inf)) for word in words}


def _float_text(value):
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    return value


def _float_value(value):
    """A float column's default as a schema holds it: the words above as those floats."""
    if isinstance(value, list):
        return [_float_value(v) for v in value]
    if isinstance(value, str):
        return _FLOAT_WORDS.get(value.strip().lower(), value)
    return value


@dataclasses.dataclass(frozen=True)
class TableSchema:
    """The columns of a table, in CSV order."""

    columns: tuple[ColumnSpec, ...]

    def __post_init__(self):
        if not self.columns:
            raise ValueError("the schema has no columns")
        names = [c.name for c in self.columns]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"columns named more than once: {twice}")
        features = [c.feature_name for c in self.kept]
        clash = sorted({f for f in features if features.count(f) > 1})
        shape_names = {f"{c.feature_name}/shape" for c in self.kept
                       if c.shape is not None and c.encoding == "flat"}
        clash += sorted(shape_names & set(features))
        if clash:
            raise ValueError(f"feature names used more than once: {clash}; set 'feature' to rename")
        if not self.kept:
            raise ValueError("every column is skipped: nothing to write")

    @property
    def kept(self) -> list[ColumnSpec]:
        """The columns that become features."""
        return [c for c in self.columns if not c.skip]

    def column(self, name: str) -> ColumnSpec:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {"columns": [c.to_dict() for c in self.columns]}

    @classmethod
    def from_dict(cls, data: object, source: str = "schema") -> TableSchema:
        """Builds a schema from a parsed YAML/JSON document.

        Raises:
          ValueError: naming the column and key to change.
        """
        if not isinstance(data, Mapping) or not isinstance(data.get("columns"), list):
            raise ValueError(f"{source}: a schema is a mapping with a 'columns' list")
        columns = []
        for i, item in enumerate(data["columns"]):
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, Mapping):
                raise ValueError(f"{source}: columns[{i}] must be a mapping like {{name: ..., type: ...}}")
            unknown = sorted(set(item) - set(_KEYS))
            if unknown:
                raise ValueError(f"{source}: columns[{i}] ({item.get('name')!r}) has unknown keys "
                                 f"{unknown}; allowed: {list(_KEYS)}")
            fields = dict(item)
            if "name" in fields:
                fields["name"] = str(fields["name"])
            if fields.get("shape") is not None:
                if not isinstance(fields["shape"], list):
                    raise ValueError(f"{source}: column {fields.get('name')!r}: shape must be a list")
                fields["shape"] = tuple(fields["shape"])
            if fields.get("type") == "float" and "default" in fields:
                fields["default"] = _float_value(fields["default"])
            try:
                columns.append(ColumnSpec(**fields))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{source}: {err}") from None
        unknown_top = sorted(set(data) - {"columns", "format_version"})
        if unknown_top:
            raise ValueError(f"{source}: unknown top-level keys {unknown_top}; allowed: columns")
        try:
            return cls(tuple(columns))
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None


def load_schema(text: str, source: str = "schema") -> TableSchema:
    """Parses a YAML or JSON schema (JSON is YAML too, but its errors read better).

    Raises:
      ValueError: on a document that is not a valid schema.
    """
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{source} is neither valid JSON nor YAML: {err}") from None
    except RecursionError:
        raise ValueError(f"{source} is nested too deeply to be a schema (a schema is a mapping "
                         "with a 'columns' list of flat mappings)") from None
    return TableSchema.from_dict(data, source)


def dump_schema(schema: TableSchema) -> str:
    """The schema as YAML, one column per line, in a form ``load_schema`` reads."""
    lines = ["columns:"]
    for column in schema.columns:
        lines.append("  - " + json.dumps(column.to_dict(), ensure_ascii=False))
    return "\n".join(lines) + "\n"
