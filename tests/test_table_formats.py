"""Parquet and JSON Lines tables: the same table as a CSV gives the same records.

One table of a few thousand rows (nulls, int and float lists, strings with
quotes, commas, newlines and unicode, floats of 17 digits, negative and extreme
ints, one cell that does not fit the schema) is written as CSV, Parquet and
JSON Lines; each is converted by the CLI and the records of every split are
compared byte for byte, the dead letters row by row, and the row accounting.
"""

from __future__ import annotations

import csv
import gzip
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.schemas.table_schema import ColumnSpec, TableSchema
from beam_tfrecords.transforms.codec.table_cells import text_batch
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from beam_tfrecords.transforms.plan.table_inference import infer_schema, infer_typed_schema
from tests.conftest import dead_letters, load_manifest, read_dataset
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

ROWS = 3000
BAD_ROW = 1234  # 1-based data row whose "n" cell is not an integer in every format.
SCHEMA = {"columns": [
    {"name": "id", "type": "int64", "required": True},
    {"name": "x", "type": "float"},
    {"name": "n", "type": "int64"},
    {"name": "s", "type": "string"},
    {"name": "ints", "type": "int64", "delimiter": ";"},
    {"name": "floats", "type": "float", "delimiter": ";"},
    {"name": "pair", "type": "float", "delimiter": ";", "shape": [2], "encoding": "tensor"},
    {"name": "flag", "type": "bool"},
    {"name": "opt", "type": "float", "default": -1.0},
]}
WORDS = ["plain", 'a "quoted" word', "comma, inside", "ünïcødé ✓", "new\nline", "semi;colon", " spaced "]


def _table_rows(n=ROWS, seed=7):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 5))
        rows.append({
            "id": i,
            "x": None if i % 11 == 0 else float(rng.standard_normal() * 10.0 ** int(rng.integers(-8, 9))),
            "n": [-(2**63), 2**63 - 1, -i, 0][i % 4] if i % 13 else None,
            "s": None if i % 17 == 0 else f"{WORDS[i % len(WORDS)]} {i}",
            "ints": [int(v) for v in rng.integers(-1000, 1000, k)] if i % 7 else None,
            "floats": [float(v) for v in rng.random(k)],
            "pair": [float(rng.random()), -1.5],
            "flag": None if i % 5 == 0 else bool(i % 2),
            "opt": None if i % 3 else 0.1 * i,
        })
    rows[BAD_ROW - 1]["n"] = "12x"  # Not an integer: dead-lettered in every format.
    return rows


def _csv_cell(value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ";".join(_csv_cell(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def _write_all(folder, rows):
    os.makedirs(folder, exist_ok=True)
    names = list(rows[0])
    paths = {fmt: os.path.join(folder, f"t.{fmt}") for fmt in ("csv", "parquet", "jsonl")}
    with open(paths["csv"], "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(names)
        writer.writerows([_csv_cell(r[name]) for name in names] for r in rows)
    with open(paths["jsonl"], "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    typed = pa.table({
        "id": pa.array([r["id"] for r in rows], pa.int64()),
        "x": pa.array([r["x"] for r in rows], pa.float64()),
        "n": pa.array([None if r["n"] is None else str(r["n"]) for r in rows], pa.string()),
        "s": pa.array([r["s"] for r in rows], pa.string()),
        "ints": pa.array([r["ints"] for r in rows], pa.list_(pa.int64())),
        "floats": pa.array([r["floats"] for r in rows], pa.list_(pa.float64())),
        "pair": pa.array([r["pair"] for r in rows], pa.list_(pa.float64(), 2)),
        "flag": pa.array([r["flag"] for r in rows], pa.bool_()),
        "opt": pa.array([r["opt"] for r in rows], pa.float64()),
    })
    pq.write_table(typed, paths["parquet"], row_group_size=700)  # Several row groups.
    return paths


def _split_records(out):
    records = {}
    for name in sorted(os.listdir(out)):
        if ".tfrecord" in name and not name.endswith(".idx"):
            with open(os.path.join(out, name), "rb") as f:
                records.setdefault(name.split("-", 1)[0], []).extend(iter_records(f))
    return records


_dead = dead_letters


def _report(out):
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    folder = tmp_path_factory.mktemp("formats")
    paths = _write_all(str(folder / "in"), _table_rows())
    schema = folder / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    return paths, str(schema), folder


def _convert(path, schema, out, *flags):
    return main(["convert", "--input", path, "--schema", schema, "--output", out,
                 "--max_bad_fraction", "0.01", *flags])


@pytest.mark.e2e
@pytest.mark.parametrize("flags", [
    ["--splits", "train=0.7,valid=0.2,test=0.1", "--key_column", "id"],
    [],  # One split.
])
def test_parquet_and_jsonl_give_the_csv_records(tables, tmp_path, flags):
    paths, schema, _ = tables
    outputs = {}
    for fmt, path in paths.items():
        out = str(tmp_path / fmt)
        assert _convert(path, schema, out, *flags) == 0, fmt
        outputs[fmt] = out
    reference = _split_records(outputs["csv"])
    assert len(reference) == (3 if flags else 1)
    assert sum(map(len, reference.values())) == ROWS - 1
    for fmt in ("parquet", "jsonl"):
        records = _split_records(outputs[fmt])
        assert records.keys() == reference.keys(), fmt
        for split in reference:
            assert len(records[split]) == len(reference[split]), (fmt, split)
            for k, (ours, theirs) in enumerate(zip(records[split], reference[split])):
                assert ours == theirs, (fmt, split, k)
    # The bad cell costs the same row in every format; CSV numbers lines from its header.
    rows = _table_rows()
    csv_line = 2 + sum(1 + (r["s"] or "").count("\n") for r in rows[:BAD_ROW - 1])  # After the header.
    where = {fmt: [d["source"].rsplit(":", 1)[1] for d in _dead(out)] for fmt, out in outputs.items()}
    assert where == {"csv": [str(csv_line)], "parquet": [str(BAD_ROW)], "jsonl": [str(BAD_ROW)]}
    for fmt, out in outputs.items():
        (letter,) = _dead(out)
        # The cell described by its kind and size, never quoted.
        assert letter["error"] == "bad_value" and "is not an integer" in letter["message"], fmt
        assert "12x" not in json.dumps(letter), fmt
        rows = _report(out)["rows"]
        assert rows["accounted"] is True, fmt
        assert rows["in"] == ROWS and rows["dead_lettered"] == 1, fmt
    assert _report(outputs["parquet"])["rows"]["lines"] == {"in": ROWS, "accounted_for": ROWS}
    assert _report(outputs["jsonl"])["rows"]["lines"] == {"in": ROWS, "accounted_for": ROWS}
    assert load_manifest(outputs["parquet"])["features"] == load_manifest(outputs["csv"])["features"]


@pytest.mark.e2e
def test_values_read_back(tables, tmp_path):
    paths, schema, _ = tables
    out = str(tmp_path / "pq")
    assert _convert(paths["parquet"], schema, out) == 0
    records = [r for shard in read_dataset(out).values() for r in shard]
    expected = [r for r in _table_rows() if r["id"] != BAD_ROW - 1]
    assert len(records) == len(expected)
    for got, want in zip(records[:200], expected[:200]):
        assert got["id"] == [want["id"]]
        assert got["x"] == ([] if want["x"] is None else [np.float32(want["x"])])
        assert got["n"] == ([] if want["n"] is None else [want["n"]])
        assert got["s"] == ([] if want["s"] is None else [want["s"].encode()])
        assert got["ints"] == (want["ints"] or [])
        assert got["flag"] == ([] if want["flag"] is None else [int(want["flag"])])
        assert got["opt"] == ([-1.0] if want["opt"] is None else [np.float32(want["opt"])])


@pytest.mark.e2e
def test_sequences_and_split_column_match_csv(tmp_path):
    rows = [{"user": f"u{i % 40}", "t": i, "v": float(i) / 3, "tag": ["a", "b", "c"][i % 3],
             "split": "train" if i % 40 < 30 else "test"} for i in range(600)]
    folder = str(tmp_path / "in")
    os.makedirs(folder)
    with open(os.path.join(folder, "s.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(list(rows[0]))
        writer.writerows([_csv_cell(v) for v in r.values()] for r in rows)
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(folder, "s.parquet"), row_group_size=128)
    with gzip.open(os.path.join(folder, "s.jsonl.gz"), "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"columns": [
        {"name": "user", "type": "string"}, {"name": "t", "type": "int64", "sequence": True},
        {"name": "v", "type": "float", "sequence": True}, {"name": "tag", "type": "string"},
        {"name": "split", "skip": True}]}))
    outputs = {}
    for name in ("s.csv", "s.parquet", "s.jsonl.gz"):
        out = str(tmp_path / name.replace(".", "_"))
        assert main(["convert", "--input", os.path.join(folder, name), "--schema", str(schema),
                     "--output", out, "--sequence_key", "user", "--sequence_order", "t",
                     "--split_column", "split"]) == 0, name
        outputs[name] = _split_records(out)
    assert set(outputs["s.csv"]) == {"train", "test"}
    assert len(outputs["s.csv"]["train"]) == 30
    assert outputs["s.parquet"] == outputs["s.csv"]
    assert outputs["s.jsonl.gz"] == outputs["s.csv"]


@pytest.mark.e2e
def test_bad_json_lines_and_blank_lines_are_accounted(tmp_path):
    src = tmp_path / "t.jsonl"
    lines = ['{"a": 1, "b": "x"}', "", '{"a": 2, "b": "y"', '[1, 2]', '{"a": 3.5, "b": "z"}',
             '{"a": 4}{"a": 5}', "   ", '{"a": 99999999999999999999, "b": "w"}', "{}", '{"a": 6, "b": "ok"}']
    # Line 11 holds bytes that are not UTF-8 inside a string; no newline after it.
    src.write_bytes("\n".join(lines).encode() + b'\n{"a": 7, "b": "bad \xff\xfe"}')
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"columns": [{"name": "a", "type": "int64"}, {"name": "b"}]}))
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(src), "--schema", str(schema), "--output", out,
                 "--max_bad_fraction", "0.9"]) == 0
    records = [r for shard in read_dataset(out).values() for r in shard]
    assert records == [{"a": [1], "b": [b"x"]}, {"a": [6], "b": [b"ok"]}]
    dead = {d["source"].rsplit(":", 1)[1]: d for d in _dead(out)}
    assert sorted(dead, key=int) == ["3", "4", "5", "6", "8", "11"]
    assert dead["11"]["error"] == "invalid_utf8"
    assert dead["3"]["error"] == "bad_json" and dead["4"]["error"] == "bad_json"
    assert dead["5"]["error"] == "bad_value" and "a JSON number is not an integer" in dead["5"]["message"]
    assert "row" not in dead["5"] and "3.5" not in dead["5"]["message"]
    assert dead["8"]["error"] == "bad_value" and "does not fit in int64" in dead["8"]["message"]
    rows = _report(out)["rows"]
    # 11 lines: 2 written, 6 dead-lettered, 3 blank ("", "   ", "{}").
    assert rows["lines"] == {"in": 11, "accounted_for": 11}
    assert (rows["written"], rows["dead_lettered"], rows["blank_skipped"]) == (2, 6, 3)
    assert rows["accounted"] is True


@pytest.mark.e2e
def test_parquet_cells_that_do_not_fit_are_dead_lettered(tmp_path):
    src = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({
        "a": pa.array([1, 2, 3, 4]),
        "l": pa.array([[1, 2], [None], [3], []], pa.list_(pa.int64())),
        "s": pa.array([["x"], ["y;z"], ["p", "q"], None], pa.list_(pa.string())),
        "raw": pa.array([b"\x00\xff", b"ok", None, b"\xfe"], pa.binary()),
    }), src)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"columns": [
        {"name": "a", "type": "int64"}, {"name": "l", "type": "int64", "delimiter": ";"},
        {"name": "s", "type": "string"}, {"name": "raw", "type": "bytes"}]}))
    out = str(tmp_path / "out")
    assert main(["convert", "--input", src, "--schema", str(schema), "--output", out,
                 "--max_bad_fraction", "0.9"]) == 0
    records = [r for shard in read_dataset(out).values() for r in shard]
    assert records == [{"a": [1], "l": [1, 2], "s": [b"x"], "raw": [b"\x00\xff"]},
                       {"a": [4], "l": [], "s": [], "raw": [b"\xfe"]}]
    dead = {d["source"].rsplit(":", 1)[1]: d["message"] for d in _dead(out)}
    assert "holds a null" in dead["2"]
    assert "2 values where the schema has one" in dead["3"]
    rows = _report(out)["rows"]
    assert rows["lines"] == {"in": 4, "accounted_for": 4} and rows["accounted"] is True


@pytest.mark.e2e
def test_a_corrupt_parquet_row_group_is_dead_lettered_and_accounted(tmp_path):
    src = str(tmp_path / "t.parquet")
    pq.write_table(pa.table({"a": pa.array(range(3000), pa.int64())}), src, row_group_size=1000,
                   compression="snappy")
    metadata = pq.ParquetFile(src).metadata
    chunk = metadata.row_group(1).column(0)
    with open(src, "r+b") as f:  # Scramble the middle row group's data page.
        start = chunk.data_page_offset + 40
        f.seek(start)
        f.write(b"\xff" * 64)
    out = str(tmp_path / "out")
    main(["convert", "--input", src, "--output", out, "--max_bad_fraction", "0.9"])
    rows = _report(out)["rows"]
    assert rows["lines"]["in"] == 3000
    assert rows["lines"]["accounted_for"] == 3000
    assert rows["accounted"] is True
    letters = _dead(out)
    assert letters and all(d["error"] in ("unreadable", "bad_value") for d in letters)


@pytest.mark.unit
def test_infer_schema_finds_number_lists_and_shapes():
    header = ["semi", "pipe", "space", "ragged", "floats", "words", "decimal_comma", "one"]
    rows = [["3;17;42", "1|2", "0.5 1.5 2", "1;2", "1.5;2", "a;b", "1,5", "7"],
            ["-1;0;9", "3|4", "1 2 3", "5", "3;4.25", "c", "2,5", "8"],
            ["5;6;7", "5|6", "4 5 6", "", "", "d;e", "3,5", "9"]]
    schema = infer_schema(header, rows)
    got = {c.name: (c.type, c.delimiter, c.shape, c.required) for c in schema.columns}
    assert got == {
        "semi": ("int64", ";", (3,), True),
        "pipe": ("int64", "|", (2,), True),
        "space": ("float", " ", (3,), True),
        "ragged": ("int64", ";", None, False),
        "floats": ("float", ";", None, False),
        "words": ("string", None, None, True),
        "decimal_comma": ("string", None, None, True),
        "one": ("int64", None, None, True),
    }


@pytest.mark.unit
def test_infer_typed_schema_from_arrow_types():
    table = pa.table({
        "i": pa.array([1, 2], pa.int32()), "f": pa.array([1.0, None]), "b": [True, False],
        "s": ["1", "2"], "raw": pa.array([b"x", b"y"]), "l": pa.array([[1, 2], [3, 4]]),
        "lv": pa.array([[1.5], [2.5, 3.5]]), "ls": pa.array([["a;b"], ["c"]]),
        "fixed": pa.array([[1, 2, 3], [4, 5, 6]], pa.list_(pa.int64(), 3)),
    })
    schema = infer_typed_schema(table.schema.names, [table])
    got = {c.name: (c.type, c.delimiter, c.shape, c.required) for c in schema.columns}
    assert got == {
        "i": ("int64", None, None, True), "f": ("float", None, None, False),
        "b": ("bool", None, None, True), "s": ("string", None, None, True),
        "raw": ("bytes", None, None, True), "l": ("int64", ";", (2,), True),
        "lv": ("float", ";", None, True), "ls": ("string", "|", None, True),
        "fixed": ("int64", ";", (3,), True),
    }
    # JSON Lines pieces typed differently widen.
    pieces = [pa.table({"v": pa.array([1, 2])}), pa.table({"v": pa.array([0.5])}),
              pa.table({"w": pa.array([[1]])}), pa.table({"w": pa.array([2])})]
    widened = {c.name: (c.type, c.delimiter, c.required)
               for c in infer_typed_schema(["v", "w"], pieces).columns}
    assert widened == {"v": ("float", None, False), "w": ("int64", ";", False)}


@pytest.mark.unit
@pytest.mark.parametrize("value", [0.1, 1e-7, 123456789.12345679, 1.0000000000000002, 5e-324,
                                   -0.0, 3.4028234663852886e38, 1.17549435e-38])
def test_float_text_reads_back_as_the_same_float(value):
    batch, problems = text_batch(pa.table({"x": pa.array([value])}), ["x"], {})
    assert not problems and float(batch.column(0)[0].as_py()) == value
    as32 = pa.array([value], pa.float32())
    batch, _ = text_batch(pa.table({"x": as32}), ["x"], {})
    assert np.float32(float(batch.column(0)[0].as_py())) == as32[0].as_py() or value == -0.0


@pytest.mark.unit
def test_cell_text_of_lists_nulls_and_other_types():
    spec = ColumnSpec("l", "int64", delimiter="|")
    table = pa.table({"l": pa.array([[1, 2], None, [], [3]]).slice(0),
                      "d": pa.array([1, None, 3, 4], pa.int8()).dictionary_encode(),
                      "st": pa.array([{"k": 1}, None, {"k": 2}, {"k": 3}])})
    batch, problems = text_batch(table, ["l", "d", "st", "absent"], {"l": spec})
    assert batch.to_pylist() == [
        {"l": "1|2", "d": "1", "st": '{"k": 1}', "absent": ""},
        {"l": "", "d": "", "st": "", "absent": ""},
        {"l": "", "d": "3", "st": '{"k": 2}', "absent": ""},
        {"l": "3", "d": "4", "st": '{"k": 3}', "absent": ""},
    ]
    assert not problems
    sliced, _ = text_batch(table.slice(2), ["l"], {"l": spec})
    assert sliced.column(0).to_pylist() == ["", "3"]
    assert TableSchema((spec,)).kept == [spec]


@pytest.mark.e2e
def test_infer_schema_cli_on_each_format(tables, capsys):
    paths, _, _ = tables
    texts = {}
    for fmt, path in paths.items():
        assert main(["infer-schema", "--input", path]) == 0
        # Notes (what the sample decided beyond the types) are comments before the schema.
        texts[fmt] = "".join(line for line in capsys.readouterr().out.splitlines(True)
                             if not line.startswith("# note: "))
    parquet = {c["name"]: c for c in (json.loads(line.strip()[2:]) for line in texts["parquet"].splitlines()[1:])}
    assert parquet["ints"] == {"name": "ints", "type": "int64", "delimiter": ";"}
    assert parquet["pair"]["shape"] == [2] and parquet["pair"]["type"] == "float"
    assert parquet["id"] == {"name": "id", "type": "int64", "required": True}
    assert texts["jsonl"] == texts["parquet"]
    csv_schema = {c["name"]: c for c in (json.loads(line.strip()[2:]) for line in texts["csv"].splitlines()[1:])}
    assert csv_schema["ints"]["delimiter"] == ";" and csv_schema["ints"]["type"] == "int64"
    assert csv_schema["floats"]["type"] == "float" and csv_schema["pair"]["shape"] == [2]


@pytest.mark.e2e
def test_csv_dialect_flags_are_refused_for_parquet(tables, tmp_path, capsys):
    paths, schema, _ = tables
    code = main(["convert", "--input", paths["parquet"], "--schema", schema,
                 "--output", str(tmp_path / "o"), "--csv_delimiter", ";"])
    assert code == 2
    assert "--csv_delimiter applies only to CSV tables" in capsys.readouterr().err


@pytest.mark.emulator
def test_parquet_and_jsonl_on_gcs(gcs, tables, tmp_path):
    paths, schema, _ = tables
    for fmt in ("parquet", "jsonl"):
        with open(paths[fmt], "rb") as f:
            gcs.upload_bytes(f"gs://formats/in/t.{fmt}", f.read())
        local, remote = str(tmp_path / f"local-{fmt}"), f"gs://formats/out-{fmt}"
        assert _convert(paths[fmt], schema, local) == 0
        assert _convert(f"gs://formats/in/t.{fmt}", schema, remote) == 0
        report = json.loads(gcs.download(f"{remote}/run_report.json"))
        assert report["rows"]["accounted"] is True and report["rows"]["dead_lettered"] == 1
        names = [n for n in gcs.list(remote + "/") if ".tfrecord" in n]
        assert names
        for name in names:
            with open(os.path.join(local, name.rsplit("/", 1)[1]), "rb") as f:
                assert gcs.download(name) == f.read(), name
