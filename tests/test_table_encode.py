"""RowEncoder against a plain reference: every fast path gives protobuf's bytes."""

import pyarrow as pa
import pytest

from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.codec.example import encode_example
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.codec.tfrecord import frame_record

pytestmark = pytest.mark.unit

SCHEMA = load_schema("""
columns:
  - {name: f, type: float, required: true, allow_nan: true}
  - {name: g, type: float, default: 0.5}
  - {name: h, type: float}
  - {name: n, type: int64, required: true}
  - {name: ids, type: int64, delimiter: ";"}
  - {name: s, type: string}
  - {name: b, type: bool, required: true}
""")
CELLS = {
    "f": ["1.5", " -2 ", "1e-3", "3.4e38", "nan", "0"],
    "g": ["", "2", "", "-0.0", "7", "1"],
    "h": ["", "1", "", "2", "", "3"],
    "n": ["0", "127", "128", "-1", "9223372036854775807", "16384"],
    "ids": ["", "1;2;3", " 4 ; -5 ", "16383;16384", "0", "9223372036854775807;-9223372036854775808"],
    "s": ["cat", "", "héllo, world", "x" * 200, "cat", "dog"],
    "b": ["true", "no", "1", "F", "YES", "0"],
}


def _reference(row):
    def floats(cell, default=None):
        return [float(cell)] if cell.strip() else ([] if default is None else [default])
    ids = CELLS["ids"][row]
    return frame_record(encode_example([
        ("f", "float32", floats(CELLS["f"][row])),
        ("g", "float32", floats(CELLS["g"][row], 0.5)),
        ("h", "float32", floats(CELLS["h"][row])),
        ("n", "int64", [int(CELLS["n"][row])]),
        ("ids", "int64", [int(x) for x in ids.split(";")] if ids.strip() else []),
        ("s", "string", [CELLS["s"][row]] if CELLS["s"][row] else []),
        ("b", "int64", [CELLS["b"][row].lower() in ("true", "1", "yes")]),
    ]))


@pytest.mark.parametrize("arrow", [False, True], ids=["lists", "arrow-floats"])
def test_fast_paths_match_the_reference(arrow):
    encoder = RowEncoder(SCHEMA, list(CELLS))
    cells = {k: (pa.array(v) if arrow and k in "fgh" else v) for k, v in CELLS.items()}
    records, errors = encoder.encode(cells, 6)
    assert errors == []
    assert records == [_reference(row) for row in range(6)]


def test_bad_cells_fall_back_and_name_the_row():
    schema = TableSchema.from_dict({"columns": [
        {"name": "f", "type": "float", "required": True},
        {"name": "ids", "type": "int64", "delimiter": ";"},
    ]})
    encoder = RowEncoder(schema, ["f", "ids"])
    cells = {"f": pa.array(["1", "x", "", "1e39", "2"]), "ids": ["1", "2", "3", "4", "1;a"]}
    records, errors = encoder.encode(cells, 5)
    assert [r is not None for r in records] == [True, False, False, False, False]
    assert [(e.row, e.reason) for e in errors] == [
        (1, "bad_value"), (2, "missing_required"), (3, "bad_value"), (4, "bad_value")]


@pytest.mark.parametrize("name", ["tutorial", "sensors", "shaped"])
def test_shipped_example_schemas_load(name):
    import os  # pylint: disable=import-outside-toplevel

    from beam_tfrecords import schemas  # pylint: disable=import-outside-toplevel

    path = os.path.join(os.path.dirname(schemas.__file__), "examples", f"{name}.yaml")
    with open(path, encoding="utf-8") as f:
        schema = load_schema(f.read(), path)
    assert schema.kept


def test_arrow_int_lists_match_the_reference():
    schema = TableSchema.from_dict({"columns": [
        {"name": "ids", "type": "int64", "delimiter": ";"},
        {"name": "more", "type": "int64", "delimiter": " ", "default": [7, 8]},
    ]})
    ids = ["1;2;3", "", " 127 ; 128 ", "16383;16384;2097151", "0", "5"]
    more = ["1 2", "", "300", "", "0 0 0", "9"]
    encoder = RowEncoder(schema, ["ids", "more"])
    arrow, _ = encoder.encode({"ids": pa.array(ids), "more": pa.array(more)}, 6)
    lists, _ = encoder.encode({"ids": ids, "more": more}, 6)

    def parse(cell, default=()):
        return [int(x) for x in cell.split(";" if ";" in cell else " ")] if cell.strip() else list(default)

    reference = [frame_record(encode_example([
        ("ids", "int64", parse(i)), ("more", "int64", parse(m, [7, 8]))])) for i, m in zip(ids, more)]
    assert arrow == lists == reference
    # Outside the vectorized range (negative, 2**21 and up): the per-cell path, same bytes.
    big = ["-1;5", "2097152", "9223372036854775807"]
    arrow, _ = encoder.encode({"ids": pa.array(big), "more": pa.array(["1"] * 3)}, 3)
    lists, _ = encoder.encode({"ids": big, "more": ["1"] * 3}, 3)
    assert arrow == lists


def test_arrow_scalar_columns_match_lists_including_errors():
    schema = TableSchema.from_dict({"columns": [
        {"name": "n", "type": "int64", "required": True},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bool", "default": False},
    ]})
    cells = {"n": ["1", "x", "1", "", "2"], "s": ["a", "", "a", "b", "c"], "b": ["yes", "", "no", "maybe", "1"]}
    encoder = RowEncoder(schema, list(cells))
    by_lists = encoder.encode(cells, 5)
    by_arrow = encoder.encode({k: pa.array(v) for k, v in cells.items()}, 5)
    assert by_arrow == by_lists
    records, errors = by_arrow
    assert [r is not None for r in records] == [True, False, True, False, True]
    assert [(e.row, e.reason) for e in errors] == [(1, "bad_value"), (3, "missing_required")]
