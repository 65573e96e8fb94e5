"""Issue 18, tables: publish only the values the schema allows, and never quote them.

Each test runs the real CLI as a subprocess (``tests.harness.attack_table.cli``) and reads
what it left: the exit status, the first line the user reads, the files in the
output folder, the records counted and parsed from the shards, the dead letters'
reasons. Pure functions (the drift comparison, split-name folding, the schema keys)
are held to the same rules without a run.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.shards import clashing_split_names
from beam_tfrecords.schemas.table_schema import TableSchema, dump_schema, load_schema
from beam_tfrecords.transforms.codec.table_rows import parse_column
from beam_tfrecords.transforms.quality.drift import DriftGate, baseline_of, compare
from tests.conftest import dead_letters, load_manifest
from tests.harness.attack_table import EXIT_FAILED, EXIT_OK, EXIT_USAGE, TRACEBACK, cli, cli_env, tally

EXIT_DRIFT = 3
SECRET = "SECRET-7f3a9-hunter2@example.com"


# --- helpers --------------------------------------------------------------------------


def _convert(work: Path, src, out, *flags):
    return cli(work, "convert", "--input", str(src), "--output", str(out), *flags)


def _clean(run) -> None:
    """No traceback, and stderr holds only log records and the one-line verdict (the
    attack table's rule for every run, tests/harness/attack_table.py ``Case.run``)."""
    assert TRACEBACK not in run.stdout + run.stderr, run.stderr[-3000:]
    assert not run.stray_stderr, run.stray_stderr


def _schema(work: Path, text: str) -> str:
    path = work / "schema.yaml"
    path.write_text(text)
    return str(path)


def _ids(out) -> list[int]:
    return sorted(r["id"][0] for r in tally(str(out)).records)


def _by_id(out) -> dict[int, dict]:
    return {r["id"][0]: r for r in tally(str(out)).records}


def _reasons(out) -> dict[int, str]:
    """Dead letters by the line (or row) their source names: ``{number: reason}``."""
    return {int(d["source"].rsplit(":", 1)[1]): d["error"] for d in dead_letters(str(out))}


def _published(out) -> dict[str, str]:
    """sha256 of every file of a dataset folder a reader sees (the run report aside)."""
    return {name: hashlib.sha256((Path(out) / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(out))
            if (Path(out) / name).is_file() and name != "run_report.json"}


# --- 1. values: floats that are not finite ----------------------------------------------

# Per format: the rows (id, the float as the file holds it), and which ids hold NaN,
# +inf, -inf. Parquet cannot hold 1e400 (it is a float64: +inf is what it would be).
CSV_ROWS = [(1, "0.5"), (2, "1e400"), (3, "inf"), (4, "-Infinity"), (5, "nan"), (6, "NaN"),
            (7, "-2.25"), (8, "1e39"), (9, " 3 ")]
JSONL_ROWS = [(1, "0.5"), (2, "1e400"), (3, "Infinity"), (4, "-Infinity"), (5, "NaN"), (6, "NaN"),
              (7, "-2.25"), (8, "1e39"), (9, "3")]
PARQUET_ROWS = [(1, 0.5), (2, math.inf), (3, math.inf), (4, -math.inf), (5, math.nan), (6, math.nan),
                (7, -2.25), (8, 1e39), (9, 3.0)]
NAN, POS_INF, NEG_INF = {5, 6}, {2, 3}, {4}
FINITE = {1: 0.5, 7: -2.25, 9: 3.0}  # 8 (1e39) has no float32: refused whatever the schema.


def _write_floats(work: Path, fmt: str) -> tuple[Path, dict[int, int]]:
    """The table, and each id's line (or Parquet row) number."""
    if fmt == "csv":
        src = work / "t.csv"
        src.write_text("id,x\n" + "".join(f'{i},"{x}"\n' for i, x in CSV_ROWS))
        return src, {i: n + 2 for n, (i, _) in enumerate(CSV_ROWS)}
    if fmt == "jsonl":
        src = work / "t.jsonl"
        src.write_text("".join(f'{{"id": {i}, "x": {x}}}\n' for i, x in JSONL_ROWS))
        return src, {i: n + 1 for n, (i, _) in enumerate(JSONL_ROWS)}
    src = work / "t.parquet"
    pq.write_table(pa.table({"id": [i for i, _ in PARQUET_ROWS],
                             "x": pa.array([x for _, x in PARQUET_ROWS], pa.float64())}), src)
    return src, {i: n + 1 for n, (i, _) in enumerate(PARQUET_ROWS)}


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl"])
@pytest.mark.parametrize("allowed", [False, True], ids=["refused", "allowed"])
def test_non_finite_floats_publish_only_when_the_schema_allows_them(tmp_path, fmt, allowed):
    src, number = _write_floats(tmp_path, fmt)
    allow = ", allow_nan: true, allow_infinite: true" if allowed else ""
    schema = _schema(tmp_path, f"columns:\n  - {{name: id, type: int64}}\n  - {{name: x, type: float{allow}}}\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out, "--schema", schema, "--max_bad_fraction", "0.9")
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert run.message == "status: ok"
    _clean(run)
    assert {"manifest.json", "run_report.json", "train-00000-of-00001.tfrecord"} <= set(os.listdir(out))
    records = _by_id(out)
    non_finite = NAN | POS_INF | NEG_INF
    kept = set(FINITE) | (non_finite if allowed else set())
    assert sorted(records) == sorted(kept)  # Counted from the shard.
    for i, value in FINITE.items():
        assert records[i]["x"] == [value]
    if allowed:
        for i in NAN:
            assert math.isnan(records[i]["x"][0])
        for i in POS_INF | NEG_INF:
            assert records[i]["x"] == [math.inf if i in POS_INF else -math.inf]
    expected = {number[8]: "bad_value"}  # Outside float32: refused even when infinities are allowed.
    if not allowed:
        expected.update({number[i]: "non_finite_value" for i in non_finite})
    assert _reasons(out) == expected
    letters = {int(d["source"].rsplit(":", 1)[1]): d for d in dead_letters(str(out))}
    for i in non_finite if not allowed else ():
        message = letters[number[i]]["message"]
        assert message.startswith("column 'x' (float): the value reads as ")
        assert ("allow_nan: true" if i in NAN else "allow_infinite: true") in message
    stats = load_manifest(out)["splits"]["train"]["statistics"]["features"]["x"]
    assert stats["non_finite"] == (len(non_finite) if allowed else 0)
    assert stats["count"] == len(FINITE)


@pytest.mark.e2e
def test_non_finite_in_lists_sequences_and_defaults(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,user,t,v,l\n1,a,1,0.5,1;2\n2,a,2,nan,1;2\n3,b,1,1,1;inf\n4,b,2,2,3;4\n5,c,1,,5;6\n")
    schema = _schema(tmp_path, "columns:\n  - {name: id, type: int64}\n  - {name: user, type: string}\n"
                     "  - {name: t, type: int64, sequence: true}\n"
                     "  - {name: v, type: float, sequence: true, default: 1.5}\n"
                     "  - {name: l, type: float, delimiter: ';', sequence: true}\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out, "--schema", schema, "--sequence_key", "user", "--sequence_order", "t",
                   "--max_bad_fraction", "0.9")
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert _reasons(out) == {3: "non_finite_value", 4: "non_finite_value"}
    letters = dead_letters(str(out))
    assert "column 'l' (float): value 2 of 2: the value reads as +infinity" in letters[1]["message"]
    manifest = load_manifest(out)
    assert sum(s["records"] for s in manifest["splits"].values()) == 3  # Users a, b and c, a row each.
    # A default that is not finite needs the column to allow it; outside float32, never.
    bad = _schema(tmp_path, "columns:\n  - {name: id, type: int64}\n  - {name: v, type: float, default: .nan}\n")
    run = _convert(tmp_path, src, tmp_path / "out2", "--schema", bad)
    assert run.exit == EXIT_USAGE
    assert "default nan reads as NaN" in run.message and "allow_nan: true" in run.message
    assert not (tmp_path / "out2").exists()


@pytest.mark.unit
def test_schema_keys_validate_and_round_trip():
    schema = load_schema("columns:\n  - {name: x, type: float, allow_nan: true, allow_infinite: true, default: .inf}\n"
                         "  - {name: y, type: float}\n")
    again = load_schema(dump_schema(schema))
    assert again == schema and again.column("x").allow_nan and again.column("x").allow_infinite
    assert "allow_nan" not in dump_schema(schema).splitlines()[2]
    for text, error in [("{name: n, type: int64, allow_nan: true}", "allow_nan applies only to float"),
                        ("{name: n, type: float, allow_infinite: 'yes'}", "allow_infinite must be true or false"),
                        ("{name: n, type: float, default: .nan}", "reads as NaN"),
                        ("{name: n, type: float, default: 1.0e+39}", "outside the float32 range"),
                        ("{name: n, type: float, default: 100000000000000000000000000000000000000000000000000}",
                         "outside the float32 range")]:
        with pytest.raises(ValueError, match=error):
            load_schema(f"columns:\n  - {text}\n")


@pytest.mark.e2e
def test_rows_to_examples_refuses_non_finite(tmp_path):
    """The public PTransform, in a pipeline of its own (a script run as a subprocess)."""
    script = tmp_path / "p.py"
    script.write_text(f"""
import apache_beam as beam, json, sys
from beam_tfrecords import RowsToExamples
schema = "columns: [{{name: id, type: int64}}, {{name: x, type: float}}, {{name: secret, skip: true}}]"
rows = [{{"id": "1", "x": 0.5}}, {{"id": "2", "x": float("nan")}}, {{"id": "3", "x": float("inf")}},
        {{"id": "4", "x": "1e400", "secret": "{SECRET}"}}]
encode = RowsToExamples(schema, key_column="id")
with beam.Pipeline() as p:
    _ = p | beam.Create(rows) | encode | beam.Map(lambda kv: print("record", kv[0]))
    _ = encode.dead_letter | beam.Map(lambda d: print("dead", d.to_json_line().strip()))
""")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env=cli_env())
    assert done.returncode == 0, done.stderr
    records = sorted(line.split()[1] for line in done.stdout.splitlines() if line.startswith("record "))
    dead = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("dead ")]
    assert records == ["1"]
    assert sorted((d["source"], d["error"]) for d in dead) == [
        ("row:2", "non_finite_value"), ("row:3", "non_finite_value"), ("row:4", "non_finite_value")]
    assert SECRET not in done.stdout + done.stderr and all("row" not in d for d in dead)


# --- 2. the drift gate ------------------------------------------------------------------


def _nan_table(path: Path, rows: int, nan_every: int | None) -> None:
    """``id,x``: x is 40 + (i % 7) (a spread), NaN on every ``nan_every``-th row (none: never)."""
    lines = ["id,x"]
    for i in range(rows):
        nan = nan_every is not None and i % nan_every != 0
        lines.append(f"{i},{'nan' if nan else 40 + (i % 7)}")
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.e2e
def test_drift_gate_fails_a_feature_that_turned_98_percent_nan(tmp_path):
    schema = _schema(tmp_path, "columns:\n  - {name: id, type: int64}\n"
                     "  - {name: x, type: float, allow_nan: true}\n")
    out = tmp_path / "out"
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    _nan_table(tmp_path / "v1" / "t.csv", 1000, None)  # 0% NaN.
    first = _convert(tmp_path, tmp_path / "v1" / "t.csv", out, "--schema", schema)
    assert first.exit == EXIT_OK, first.stdout + first.stderr
    before = _published(out)
    _nan_table(tmp_path / "v2" / "t.csv", 1000, 50)  # 98% NaN; the 2% left keep a like mean.
    second = _convert(tmp_path, tmp_path / "v2" / "t.csv", out, "--schema", schema, "--overwrite",
                      "--compare_to", "previous")
    assert second.exit == EXIT_DRIFT, second.stdout + second.stderr
    assert second.message == "status: drift_found"
    _clean(first)
    _clean(second)
    line = next(x for x in second.stdout.splitlines() if x.startswith("drift: "))
    assert line.startswith("drift: feature 'x' non-finite share moved 0.98 (0.00 -> 0.98; limit 0.1); "
                           "DRIFT FOUND, so nothing was published (exit 3")
    assert _published(out) == before  # The old dataset, byte for byte.
    assert len(tally(str(out)).records) == 1000  # Counted from its shards.
    report = json.loads((out / "run_report.json").read_text())
    [mean] = [c for c in report["drift"]["checks"] if c["check"] == "mean" and c["feature"] == "x"]
    assert mean["verdict"] == "passed"  # The mean alone would have let it through.


@pytest.mark.unit
def test_drift_never_counts_a_comparison_it_could_not_make_as_passed():
    def numeric(mean, std, missing=0, count=100, non_finite=0):
        return {"kind": "numeric", "count": count, "missing": missing, "non_finite": non_finite,
                "min": 0, "max": 1, "mean": mean, "std": std}

    spec = {"x": {"dtype": "float32", "shape": [None]}, "s": {"dtype": "string", "shape": [None]},
            "y": {"dtype": "float32", "shape": [None]}}
    top = {"kind": "string", "count": 100, "missing": 0, "distinct": 5000, "distinct_exact": False,
           "top_values": [{"value": "a", "count": 60}], "top_values_exact": False}
    old = {"features": spec, "splits": {"train": {"records": 100, "statistics": {"records": 100, "features": {
        "x": numeric(1.0, 1.0), "s": top, "y": numeric(5.0, 1.0)}}}}}
    gate = DriftGate("old", "old/manifest.json", baseline_of(old))
    # x: every value NaN now (no mean); s: top values not exact; y: statistics gone.
    new = {"train": {"records": 100, "features": {"x": numeric(None, None, count=0, non_finite=100),
                                                  "s": top}}}
    report = compare(gate, spec, new)
    verdicts = {(c["check"], c.get("feature")): c["verdict"] for c in report["checks"]}
    assert verdicts[("mean", "x")] == "not_compared"
    assert verdicts[("value_share", "s")] == "not_compared"
    assert verdicts[("statistics", "y")] == "not_compared"
    assert verdicts[("non_finite_rate", "x")] == "failed"
    assert report["failures"] == ["feature 'x' non-finite share moved 1.00 (0.00 -> 1.00; limit 0.1)"]
    assert all(c.get("note") for c in report["checks"] if c["verdict"] == "not_compared")
    # Passing: the message counts what was compared apart from what was not.
    same = {"train": {"records": 100, "features": {"x": numeric(1.0, 1.0), "s": top}}}
    report = compare(gate, spec, same)
    passed = sum(c["verdict"] == "passed" for c in report["checks"])
    apart = sum(c["verdict"] == "not_compared" for c in report["checks"])
    assert report["status"] == "passed" and (report["passed"], report["not_compared"]) == (passed, apart)
    assert apart == 2 and report["message"] == (
        f"{passed} checks passed, 2 not compared (see 'checks') against old/manifest.json")
    # Counts an old manifest does not hold are not read as zero.
    old["splits"]["train"]["statistics"]["features"]["x"].pop("missing")
    report = compare(DriftGate("old", "m.json", baseline_of(old)), spec, same)
    [rate] = [c for c in report["checks"] if c["check"] == "missing_rate" and c["feature"] == "x"]
    assert rate["verdict"] == "not_compared"


# --- 3. inference never dead-letters the rows it inferred from ---------------------------


@pytest.mark.e2e
def test_a_mixed_type_jsonl_sample_lands_whole(tmp_path):
    src = tmp_path / "t.jsonl"
    lines = ['{"id": 1, "a": [1, "a", 2.5], "b": 1, "x": 0.5}',
             '{"id": 2, "a": [3], "b": "two", "x": NaN}',
             '{"id": 3, "a": [4, 5], "b": 3.5, "x": 1e400}',
             '{"id": 4, "a": ["z"], "b": true, "x": 2}']
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out)
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert run.message == "status: ok"
    _clean(run)
    notes = [x.strip() for x in run.stdout.splitlines() if x.strip().startswith("note: ")]
    assert "note: column 'a': its sampled rows hold values of several types (int64, string), so it is a " \
           "string list column" in notes
    assert any(n.startswith("note: column 'b': its sampled rows hold values of several types") for n in notes)
    assert any(n.startswith("note: column 'x': its sampled rows hold NaN and infinite values, so the "
                            "schema allows them") for n in notes)
    records = _by_id(out)
    assert sorted(records) == [1, 2, 3, 4] and not dead_letters(str(out))  # Every sampled row.
    assert records[1]["a"] == [b"1", b"a", b"2.5"] and records[2]["a"] == [b"3"]
    assert [records[i]["b"] for i in (1, 2, 3, 4)] == [[b"1"], [b"two"], [b"3.5"], [b"true"]]
    assert math.isnan(records[2]["x"][0]) and records[3]["x"] == [math.inf]
    schema = {c["name"]: c for c in load_manifest(out)["schema"]["columns"]}
    assert schema["a"]["type"] == "string" and schema["a"]["delimiter"] == ";"
    assert schema["x"] == {"name": "x", "type": "float", "required": True, "allow_nan": True,
                           "allow_infinite": True}


@pytest.mark.e2e
def test_a_csv_sample_that_does_not_fit_a_number_type_lands_whole(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,big,tiny,f,mixed\n1,12,1e39,0.5,3\n2,99999999999999999999,2,nan,x\n3,7,3,1,4\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out)
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert _ids(out) == [1, 2, 3] and not dead_letters(str(out))
    notes = "\n".join(x for x in run.stdout.splitlines() if "note: " in x)
    assert "column 'big': a sampled cell does not fit int64" in notes
    assert "column 'tiny': a sampled cell does not fit float" in notes
    assert "column 'f': its sampled rows hold NaN" in notes
    assert "column 'mixed': its sampled cells hold values of several types" in notes
    assert "99999999999999999999" not in run.stdout + run.stderr  # Described, not quoted.
    records = _by_id(out)
    assert records[2]["big"] == [b"99999999999999999999"] and records[1]["tiny"] == [b"1e39"]
    # infer-schema writes the same schema, its notes as comments it reads back.
    schema_file = tmp_path / "s.yaml"
    run = cli(tmp_path, "infer-schema", "--input", str(src), "--output", str(schema_file))
    assert run.exit == EXIT_OK and "note: column 'big'" in run.stdout
    text = schema_file.read_text()
    assert text.startswith("# note: ")
    assert load_schema(text).to_dict() == load_manifest(out)["schema"]


# --- 4. split names that differ only in case ---------------------------------------------


@pytest.mark.e2e
def test_split_column_spellings_that_differ_in_case_publish_nothing(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,split\n" + "".join(f"{i},{['train', 'TRAIN', 'test'][i % 3]}\n" for i in range(30)))
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out, "--split_column", "split")
    assert run.exit == EXIT_FAILED, run.stdout + run.stderr
    _clean(run)
    assert run.message == ("SPLIT NAMES CLASH: splits 'TRAIN' (10 records) and 'train' (10 records) differ "
                           "only in case: their shard files would be one file on a case-insensitive file "
                           "system, so nothing was published; give each split one spelling (a table: in "
                           "its --split_column cells) and run again")
    # No shard, no manifest, no temporaries: only the report, and the journal recording it.
    assert sorted(os.listdir(out)) == [".beam-tfrecords", "run_report.json"]
    assert os.listdir(out / ".beam-tfrecords") == ["journal"]
    report = json.loads((out / "run_report.json").read_text())
    assert report["status"] == "split_name_clash"
    assert report["split_name_clash"] == [{"TRAIN": 10, "train": 10}]


@pytest.mark.e2e
def test_splits_flag_names_that_differ_in_case_are_refused(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id\n1\n2\n")
    run = _convert(tmp_path, src, tmp_path / "out", "--splits", "train=0.5,Train=0.5")
    assert run.exit == EXIT_USAGE
    _clean(run)
    assert run.message.startswith("beam-tfrecords convert: error: --splits names 'Train' and 'train', "
                                  "which differ only in case")
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
def test_split_names_fold_case_and_unicode_normalization():
    assert clashing_split_names(["train", "TRAIN", "test", "Test", "val"]) == [("TRAIN", "train"),
                                                                            ("Test", "test")]
    assert clashing_split_names(["caf\u00e9", "cafe\u0301", "x"]) == [("cafe\u0301", "caf\u00e9")]
    assert clashing_split_names(["train", "test"]) == []
    with pytest.raises(ValueError, match="differ only in case"):
        ConvertConfig(input="t.csv", output="o", splits=(("a", 0.5), ("A", 0.5)))


# --- 5. messages: nothing of a user's table is quoted -----------------------------------


def _grep_everything(out: Path, run, secret: str) -> list[str]:
    """Every file under ``out`` (and the run's stdout and stderr) that holds ``secret``."""
    found = []
    for folder, _, names in os.walk(out):
        for name in names:
            path = Path(folder) / name
            if secret.encode() in path.read_bytes():
                found.append(str(path))
    for what, text in (("stdout", run.stdout), ("stderr", run.stderr)):
        if secret in text:
            found.append(what)
    return found


@pytest.mark.e2e
def test_a_secret_in_bad_rows_reaches_no_file_and_no_line(tmp_path):
    src = tmp_path / "t.csv"
    s = SECRET
    rows = [
        f"1,30,{s},ok,train",              # Good row: its skipped column holds the secret.
        f"2,{s},{s},bad int,train",         # Not an int64.
        f"3,31,{s},bad split,{s}",          # A split cell that cannot name a file.
        f"4,1e400,{s},not finite,train",    # Not finite.
        f"5,32,{s},too,many,cells,{s}",     # Wrong cell count.
        f'6,33,{s},"{s}\n{s}" tail {s},train',  # A stray quote: lines 7 and 8.
        "7,34,x,fine,train",
        f'8,35,{s},"never closed {s}',      # A quote never closed: 4 cells, the last line.
    ]
    src.write_text("id,age,email,note,split\n" + "\n".join(rows) + "\n")
    schema = _schema(tmp_path, "columns:\n  - {name: id, type: int64}\n  - {name: age, type: float}\n"
                     "  - {name: email, skip: true}\n  - {name: note, type: string}\n"
                     "  - {name: split, type: string}\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out, "--schema", schema, "--split_column", "split",
                   "--max_bad_fraction", "0.9")
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    _clean(run)
    assert _ids(out) == [1, 7]
    assert _reasons(out) == {3: "bad_value", 4: "bad_split", 5: "non_finite_value", 6: "bad_row",
                             7: "bad_quoting", 8: "bad_row", 10: "bad_row"}
    assert _grep_everything(out, run, s) == []
    assert _grep_everything(out, run, "hunter2") == []
    # The summary accounts for every line, the stray quote's two included.
    assert "rows: 9 in = 2 written + 7 dead-lettered (0 blank skipped); lines: 10 in the files, " \
           "10 accounted for" in run.stdout.splitlines(), run.stdout
    assert all(set(d) == {"source", "stage", "error", "message"} for d in dead_letters(str(out)))


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_secret_in_bad_typed_rows_reaches_no_file_and_no_line(tmp_path, fmt):
    s = SECRET
    if fmt == "jsonl":
        src = tmp_path / "t.jsonl"
        src.write_text("\n".join([
            f'{{"id": 1, "age": 30, "email": "{s}"}}',
            f'{{"id": 2, "age": "{s}", "email": "{s}"}}',          # A string in a float column.
            f'{{"id": 3, "age": [1, "{s}"], "email": "{s}"}}',     # A mixed list in a float column.
            f'{{"id": 4, "age": NaN, "email": "{s}"}}',            # Not finite.
            f'{{"id": 5, "age": 1, "email": "{s}"',                # Not JSON.
            f'["{s}"]',                                            # Not an object.
        ]) + "\n")
    else:
        src = tmp_path / "t.parquet"
        pq.write_table(pa.table({"id": [1, 2, 3], "age": pa.array([30.0, math.inf, math.nan]),
                                 "email": [s, s, s]}), src)
    schema = _schema(tmp_path, "columns:\n  - {name: id, type: int64}\n  - {name: age, type: float}\n"
                     "  - {name: email, skip: true}\n")
    out = tmp_path / "out"
    run = _convert(tmp_path, src, out, "--schema", schema, "--max_bad_fraction", "0.9")
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert _ids(out) == [1]
    assert len(dead_letters(str(out))) == (5 if fmt == "jsonl" else 2)
    assert _grep_everything(out, run, s) == []


@pytest.mark.e2e
def test_a_table_with_image_paths_is_refused_naming_the_line_not_the_cell(tmp_path):
    src = tmp_path / "t.csv"
    src.write_text("id,photo\n1,\n2,private/SECRET-face.jpg\n3,private/b.jpg\n")
    run = _convert(tmp_path, src, tmp_path / "out")
    assert run.exit == EXIT_USAGE
    assert "column 'photo' holds image paths (e.g. on line 3)" in run.message
    assert "SECRET" not in run.stdout + run.stderr


@pytest.mark.unit
def test_schema_parse_messages_do_not_quote_cells():
    s = SECRET
    schema = TableSchema.from_dict({"columns": [
        {"name": "n", "type": "int64"}, {"name": "b", "type": "bool"}, {"name": "raw", "type": "bytes"},
        {"name": "l", "type": "float", "delimiter": ";"}]})
    cells = {"n": [s, "--5", "9" * 30], "b": [s, "maybe", "y"], "raw": [s, "!!", "QQ=="],
             "l": [f"1;{s}", "1;nan", "2;1e39"]}
    for column in schema.kept:
        _, errors = parse_column(column, cells[column.name])
        for error in errors:
            assert s not in error.message and "maybe" not in error.message and "--5" not in error.message
            assert error.message.startswith(f"column '{column.name}' ({column.type}): ")
    _, errors = parse_column(schema.column("l"), cells["l"])
    assert [e.message.split(": ", 1)[1] for e in errors] == [
        f"value 2 of 2: a {len(s)}-character text is not a number",
        "value 2 of 2: the value reads as NaN, which the column does not allow (add 'allow_nan: true' "
        "to the column to keep NaN)",
        "value 2 of 2: a 4-character text is outside the float32 range"]


@pytest.mark.unit
def test_image_manifest_columns_holding_non_finite_numbers_stay_text():
    from beam_tfrecords.transforms.plan.layouts import list_csv_manifest  # pylint: disable=import-outside-toplevel

    text = ("image,label,score,big,ok,n\na.jpg,0,nan,1e39,0.5,1\nb.jpg,1,1.5,2,1,99999999999999999999\n"
            "c.jpg,0,inf,3,2,3\n")
    listing = list_csv_manifest("/m/x.csv", text, lambda p: 7)
    assert listing.extra_features == {"score": "string", "big": "string", "ok": "float32", "n": "float32"}
