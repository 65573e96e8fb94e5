"""The columnar table encoder against per-row references, over randomized tables.

References: the per-cell parser (``table_rows.parse_column``, which says what a
cell means and why a bad one costs its row), protobuf's own serializer and
parser (``schemas/proto/example_pb2``) for an Example's bytes, and
``tfrecord.frame_record`` / ``iter_records`` for the frame.
"""

import io
import pickle
import random
import struct

import numpy as np
import pyarrow as pa
import pytest

from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec import table_columns
from beam_tfrecords.transforms.codec.example import (
    bytes_feature,
    float_feature,
    int64_feature,
    make_example,
    serialize_example,
)
from beam_tfrecords.transforms.codec.table_batches import TableTask, encode_table_batch
from beam_tfrecords.transforms.codec.table_rows import RowEncoder, parse_column
from beam_tfrecords.transforms.codec.tfrecord import frame_record, iter_records

pytestmark = pytest.mark.unit

SCHEMA = TableSchema.from_dict({"columns": [
    {"name": "flag", "type": "bool"},
    {"name": "count", "type": "int64", "required": True},
    {"name": "animal", "type": "string"},
    {"name": "score", "type": "float"},
    {"name": "comment", "type": "string", "default": "none"},
    {"name": "maybe", "type": "float", "default": 0.0},
    {"name": "ids", "type": "int64", "delimiter": ";"},
    {"name": "weights", "type": "float", "delimiter": " ", "default": [1.5, -2.0]},
    {"name": "more", "type": "int64", "default": 7, "feature": "a_more"},
    {"name": "tags", "type": "string", "delimiter": "|"},  # Not vectorized: the per-cell path.
]})

BIG = [str(2**63 - 1), str(-(2**63)), str(2**63), str(-(2**63) - 1), "9" * 18, "-" + "9" * 18,
       "0000000000000000000000012", "123456789012345678"]
BAD_NUMBERS = ["x", "0x1F", "1_0", "--5", "5-", "1.5.5", "", " ", "\u00a0", "1e", "١٢"]


def _int_cell(rng):
    return rng.choice([str(rng.randint(-300, 300)), str(rng.randint(-(2**40), 2**40)), rng.choice(BIG),
                       f" {rng.randint(0, 99)}\t", f"+{rng.randint(0, 99)}", "\u00a07",
                       str(rng.choice([0, 127, 128, 16383, 16384, 2097151, 2097152])), rng.choice(BAD_NUMBERS)])


def _float_cell(rng):
    return rng.choice([f"{rng.uniform(-1e6, 1e6):.6f}", f"{rng.uniform(-1, 1):.3e}", "nan", "-nan", "inf",
                       "-Infinity", "1e400", "3.5e38", "-3.4e38", "1e-50", ".5", "5.", "+2.25", " 3 ", "0",
                       "-0.0", "1" * 40, rng.choice(BAD_NUMBERS)])


def _text(rng):
    alphabet = "abc xyz,\"'\n\té€😀\u00a0"
    size = rng.choice([0, 1, 5, 30, 127, 128, 200, 16383, 16384, 20000])
    chunk = "".join(rng.choice(alphabet) for _ in range(min(size, 64)))
    return (chunk * (size // 64 + 1))[:size]


def _list(rng, cell, delimiter):
    if rng.random() < 0.15:
        return rng.choice(["", "  ", f"1{delimiter}{delimiter}2", f"{delimiter}1", "1;x"])
    return delimiter.join(cell(rng) for _ in range(rng.randint(1, 6)))


def _table(rng, rows, bad=True):
    out = {name: [] for name in ("flag", "count", "animal", "score", "comment", "maybe", "ids",
                                 "weights", "more", "tags")}
    for _ in range(rows):
        out["flag"].append(rng.choice(["true", "False", " yes ", "N", "1", "0", "", "maybe" if bad else "t",
                                       "TRUE", "\u00a0y"]))
        out["count"].append(_int_cell(rng) if bad else str(rng.randint(-5, 5)))
        out["animal"].append(rng.choice(["cat", "dog", "", "ünïcode", _text(rng)]))
        out["score"].append(_float_cell(rng) if bad else f"{rng.random():.4f}")
        out["comment"].append(rng.choice(["", _text(rng), "x" * 300]))
        out["maybe"].append(rng.choice(["", _float_cell(rng)]))
        out["ids"].append(_list(rng, lambda r: rng.choice([str(r.randint(0, 200)), str(r.randint(-5, 5)),
                                                           f" {r.randint(0, 9)} ", rng.choice(BIG)]), ";"))
        out["weights"].append(_list(rng, lambda r: f"{r.uniform(-10, 10):.3f}", " "))
        out["more"].append(rng.choice(["", "  ", _int_cell(rng)]))
        out["tags"].append(rng.choice(["", "a|b", "x", "é|ü|"]))
    return out


_FEATURES = {"string": bytes_feature, "float": float_feature, "int64": int64_feature, "bool": int64_feature}


def _reference(schema, cells, rows):
    """Per row its framed record (or None) and the first error's (row, reason, message)."""
    values, errors = {}, {}
    for column in schema.kept:
        values[column.name], column_errors = parse_column(column, cells[column.name])
        for error in column_errors:
            errors.setdefault(error.row, (error.row, error.reason, error.message))
    records = []
    for row in range(rows):
        if row in errors:
            records.append(None)
            continue
        records.append(frame_record(serialize_example(make_example({
            c.feature_name: _FEATURES[c.type](values[c.name][row]) for c in schema.kept}))))
    return records, [errors[row] for row in sorted(errors)]


def _check_with_protobuf(schema, cells, records):
    """Protobuf parses each record to the parsed cells, and serializes it to the same bytes."""
    values = {c.name: parse_column(c, cells[c.name])[0] for c in schema.kept}
    for row, record in enumerate(records):
        if record is None:
            continue
        data = record[12:-4]
        example = example_pb2.Example.FromString(data)
        assert example.SerializeToString(deterministic=True) == data
        for column in schema.kept:
            feature = example.features.feature[column.feature_name]
            kind = feature.WhichOneof("kind")
            got = list(getattr(feature, kind).value) if kind else []
            want = values[column.name][row]
            if column.type == "string":
                want = [v.encode("utf-8") for v in want]
            elif column.type == "float":
                want = [struct.unpack("<f", struct.pack("<f", v))[0] for v in want]
                got, want = np.array(got, dtype=np.float32).tobytes(), np.array(want, dtype=np.float32).tobytes()
            else:
                want = [int(v) for v in want]
            assert got == want, (row, column.name)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rows", [0, 1, 57, 600])
def test_random_tables_match_the_per_row_reference(seed, rows):
    rng = random.Random(seed * 1000 + rows)
    cells = _table(rng, rows)
    expected, expected_errors = _reference(SCHEMA, cells, rows)
    encoder = RowEncoder(SCHEMA, list(cells))
    for given in (cells, {k: pa.array(v, type=pa.string()) for k, v in cells.items()}):
        records, errors = encoder.encode(given, rows)
        assert [(e.row, e.reason, e.message) for e in errors] == expected_errors
        assert records == expected
    _check_with_protobuf(SCHEMA, cells, records)


def test_categorical_columns_take_the_dictionary_path_with_bad_cells_late():
    # Few distinct cells in the first rows: encoded per distinct cell; bad ones after the sample.
    rows = 5000
    rng = random.Random(5)
    cells = _table(rng, rows, bad=False)
    cells["flag"] = [rng.choice(["true", "false", "1"]) for _ in range(rows)]
    cells["count"] = [rng.choice(["1", "-2", "300"]) for _ in range(rows)]
    cells["score"] = [rng.choice(["0.5", "1e3", ""]) for _ in range(rows)]
    for row in (4000, 4500, 4999):
        cells["flag"][row], cells["count"][row], cells["score"][row] = "maybe", "0x10", "1e39"
    expected, expected_errors = _reference(SCHEMA, cells, rows)
    records, errors = RowEncoder(SCHEMA, list(cells)).encode(
        {k: pa.array(v, type=pa.string()) for k, v in cells.items()}, rows)
    assert [(e.row, e.reason, e.message) for e in errors] == expected_errors
    assert {4000, 4500, 4999} <= {e[0] for e in expected_errors}
    assert records == expected


@pytest.mark.parametrize("value", [0, 1, 127, 128, 16383, 16384, 2**21, 2**35, 2**56, 2**63 - 1, -1, -(2**63)])
def test_varints_of_every_width(value):
    schema = TableSchema.from_dict({"columns": [{"name": "n", "type": "int64"},
                                                {"name": "l", "type": "int64", "delimiter": ","}]})
    cells = {"n": [str(value), "5"], "l": [f"{value},{value},1", str(value)]}
    records, errors = RowEncoder(schema, ["n", "l"]).encode(cells, 2)
    assert not errors
    assert records == _reference(schema, cells, 2)[0]


def test_zero_rows_and_zero_features_frame():
    assert table_columns.frame_examples([], 0).to_pylist() == []
    assert table_columns.frame_examples([], 2).to_pylist() == [frame_record(b"\x0a\x00")] * 2


def test_batches_give_the_reference_blob_per_split():
    rng = random.Random(11)
    rows = 400
    cells = _table(rng, rows)
    header = list(cells)
    for row in range(0, rows, 37):  # Blank rows are skipped, not dead-lettered.
        for name in header:
            cells[name][row] = ""
    batch = pa.RecordBatch.from_arrays([pa.array(cells[n], type=pa.string()) for n in header], names=header)
    expected, expected_errors = _reference(SCHEMA, cells, rows)
    blank = [all(cells[n][row] == "" for n in header) for row in range(rows)]
    task = TableTask(SCHEMA, tuple(header), splits=(("train", 0.7), ("test", 0.3)), key_column="animal")
    encoded = encode_table_batch(pickle.dumps(task), batch)
    assert encoded.errors == [e for e in expected_errors if not blank[e[0]]]
    assert set(encoded.splits) <= {"train", "test"}
    for k in range(len(encoded.splits)):
        rows_k = [row for row in range(rows) if encoded.status[row] == k]
        assert encoded.blobs[k] == b"".join(expected[row] for row in rows_k)
        assert encoded.sizes[k].tolist() == [len(expected[row]) for row in rows_k]
        assert list(iter_records(io.BytesIO(encoded.blobs[k]))) == [expected[row][12:-4] for row in rows_k]
    written = {row for row in range(rows) if encoded.status[row] >= 0}
    assert written == {row for row in range(rows) if expected[row] is not None and not blank[row]}


def test_float32_bytes_round_as_struct_does():
    values = np.array([0.1, -0.0, 1e-46, 3.4028234663852886e38, 1.0000000596046448, float("inf")])
    raw = table_columns._float32_bytes(values).tobytes()  # pylint: disable=protected-access
    assert raw == struct.pack("<6f", *values)


def test_string_hashes_are_the_documented_polynomial():
    from beam_tfrecords.transforms.quality import statistics  # pylint: disable=import-outside-toplevel

    def reference(value: bytes) -> int:
        h = sum((b + 1) * pow(0x100000001B3, i, 2**64) for i, b in enumerate(value)) % 2**64
        h ^= len(value) * 0xC2B2AE3D27D4EB4F % 2**64
        h = (h + 0x9E3779B97F4A7C15) % 2**64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) % 2**64
        return h ^ (h >> 31)

    values = ["", "a", "héllo", "x" * 300, "😀" * 50, "tail"]
    array = pa.array(["skip", *values], type=pa.string()).slice(1)
    assert statistics.string_hashes(array).tolist() == [reference(v.encode("utf-8")) for v in values]


def test_line_index_finds_line_starts(tmp_path):
    from beam_tfrecords.transforms.io.csv_stream import LineIndex  # pylint: disable=import-outside-toplevel

    rng = random.Random(2)
    lines = [b"x" * rng.choice([0, 1, 80, 70_000]) for _ in range(300)]
    data = b"\n".join(lines)
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    index = LineIndex(str(path))
    for line in sorted(rng.sample(range(1, 301), 60)):
        assert index.offset_of(line) == starts[line - 1]
        assert index.text_of(line, 100) == lines[line - 1][:100].decode()
    assert index.offset_of(400) == len(data)
    index.close()


def test_per_cell_columns_keep_negative_zero_apart():
    # Shaped columns go cell by cell; equal values share an entry, but 0.0 == -0.0 must not.
    schema = TableSchema.from_dict({"columns": [
        {"name": "v", "type": "float", "delimiter": " ", "shape": [2]},
        {"name": "w", "type": "float", "delimiter": ";"},
    ]})
    cells = {"v": ["0 1", "-0 1", "0 1"], "w": ["0;-0", "-0;0", "0;-0"]}
    records, errors = RowEncoder(schema, ["v", "w"]).encode(cells, 3)
    assert not errors
    values = {c.name: parse_column(c, cells[c.name])[0] for c in schema.kept}
    for row, record in enumerate(records):
        example = example_pb2.Example.FromString(record[12:-4])
        for name in ("v", "w"):
            got = np.array(example.features.feature[name].float_list.value, dtype=np.float32)
            assert got.tobytes() == np.array(values[name][row], dtype=np.float32).tobytes()
    assert records[0] == records[2] != records[1]
