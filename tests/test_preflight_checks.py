"""What the preflight decides and says before a run, and what it refuses.

The plan summary (layout, splits, classes with counts, label source, features,
inputs left out), columns a schema does not name (listed, or refused with
``--strict_schema``), duplicate header columns, schemas nested too deeply,
``gs://`` buckets that do not answer in bounded time, and a pipeline that fails
mid-run (a full disk): a run report, one line, exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from PIL import Image

from beam_tfrecords.pipeline import convert
from beam_tfrecords.preflight import ConvertError, plan_run
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.table_schema import load_schema
from beam_tfrecords.transforms import image_listing as images_module
from beam_tfrecords.transforms.io import gcs
from tests.conftest import load_manifest, read_dataset

TRACEBACK = "Traceback (most recent call last)"


def _cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "beam_tfrecords", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def _imagenet(root, per_class=(("train", 3), ("val", 1)), classes=("cat", "dog", "owl")):
    for split, count in per_class:
        for index, cls in enumerate(classes):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(count + index):  # Class sizes differ, so the counts say something.
                Image.new("RGB", (6, 5), (i * 40, index * 60, 9)).save(folder / f"{i}.png")
    (root / "train" / "README.txt").write_text("not an image")
    return root


def _table(path, rows=5, columns=("id", "score", "name", "note")):
    lines = [",".join(columns)]
    lines += [",".join([str(i), f"{i / 2}", f"n{i}", f"x{i}"][:len(columns)]) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


# -- the plan, before running -------------------------------------------------


@pytest.mark.unit
def test_plan_of_imagenet_style_folders_names_splits_classes_counts_and_what_is_left_out(tmp_path):
    root = _imagenet(tmp_path / "in")
    plan = plan_run(ConvertConfig(input=str(root), output=str(tmp_path / "out")))
    text = "\n".join(plan.describe())
    assert "images: 18 in layout class folders; splits: train (12), val (6)" in text
    assert "labels from folder names: 3 classes: cat (4), dog (6), owl (8)" in text
    assert "image/encoded" in text and "image/class/text" in text
    assert "left out: 1 file that is not an image (by extension)" in text
    assert "train (" in text and "classes: train" not in text


@pytest.mark.unit
def test_plan_notes_an_input_folder_named_like_a_split(tmp_path):
    root = _imagenet(tmp_path / "in")
    plan = plan_run(ConvertConfig(input=str(root / "val"), output=str(tmp_path / "out")))
    text = "\n".join(plan.describe())
    assert "splits: train (6)" in text
    assert "note: --input is a folder named 'val', but its images go to split 'train'" in text


@pytest.mark.unit
def test_plan_of_a_table_lists_schema_features_dropped_columns_and_splits(tmp_path):
    table = _table(tmp_path / "t.csv")
    schema = tmp_path / "s.yaml"
    schema.write_text("columns:\n  - {name: id, type: int64}\n  - {name: note, skip: true}\n")
    plan = plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "out"), schema=str(schema),
                                  splits=(("train", 0.8), ("test", 0.2)), key_column="id"))
    assert plan.dropped_columns == ("score", "name")
    text = "\n".join(plan.describe())
    assert "table: 1 CSV file" in text and "4 columns" in text
    assert f"schema --schema {schema}: 1 features: id:int64" in text
    assert "columns dropped: note (skip: true); score, name (not in --schema" in text
    assert "splits: by ratio train=0.8,test=0.2, hashing column 'id'" in text


@pytest.mark.unit
def test_strict_schema_refuses_columns_the_schema_does_not_name(tmp_path):
    table = _table(tmp_path / "t.csv")
    schema = tmp_path / "s.yaml"
    schema.write_text("columns:\n  - {name: id, type: int64}\n")
    with pytest.raises(ConvertError, match=r"--strict_schema: .* \['score', 'name', 'note'\]"):
        plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "out"), schema=str(schema),
                               strict_schema=True))
    # Every column named (one skipped on purpose): strict passes.
    schema.write_text("columns: [{name: id, type: int64}, {name: score, type: float}, "
                      "{name: name}, {name: note, skip: true}]\n")
    plan = plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "out"), schema=str(schema),
                                  strict_schema=True))
    assert plan.dropped_columns == ()


@pytest.mark.unit
def test_every_file_of_a_table_glob_has_its_header_checked(tmp_path):
    # A column only the second file has is dropped: reported, not unseen; strict refuses it.
    folder = tmp_path / "in"
    folder.mkdir()
    _table(folder / "a.csv", columns=("id", "score"))
    _table(folder / "b.csv", columns=("id", "score", "name"))
    config = ConvertConfig(input=str(folder / "*.csv"), output=str(tmp_path / "out"))
    assert plan_run(config).dropped_columns == ("name",)
    with pytest.raises(ConvertError, match=r"--strict_schema: .*b\.csv has columns the schema does not name: \['name'\]"):
        plan_run(ConvertConfig(input=config.input, output=config.output, strict_schema=True))
    # A later file without a column the schema needs: refused before anything runs.
    _table(folder / "c.csv", columns=("id",))
    with pytest.raises(ConvertError, match=r"c\.csv has no column 'score', which the schema "
                                           r"inferred from .*a\.csv needs \(its columns: id\)"):
        plan_run(config)
    # An empty JSON Lines file in a glob has no header, and no rows: it is planned.
    (folder / "a.jsonl").write_text('{"id": 1, "score": 2.5}\n')
    (folder / "b.jsonl").write_text("")
    plan = plan_run(ConvertConfig(input=str(folder / "*.jsonl"), output=str(tmp_path / "jsonl")))
    assert [path.rsplit("/", 1)[-1] for path, _ in plan.table_inputs] == ["a.jsonl", "b.jsonl"]


@pytest.mark.e2e
def test_json_lines_keys_first_seen_late_are_reported_or_dead_lettered(tmp_path):
    # The header is the keys of the first 10,000 objects; 'z' first appears after them.
    rows = [{"x": i} for i in range(10_500)]
    for i in (10_100, 10_400):
        rows[i]["z"] = "late"
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = _cli("convert", "--input", str(table), "--output", str(tmp_path / "out"), "--progress", "off")
    assert done.returncode == 0, done.stderr
    assert f"columns dropped (not in the schema): z (first at {table}:10101)" in done.stdout
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    assert report["dropped_columns"] == ["z"] and report["late_columns"] == {"z": f"{table}:10101"}
    assert report["rows"]["written"] == 10_500
    strict = _cli("convert", "--input", str(table), "--output", str(tmp_path / "strict"),
                  "--strict_schema", "--progress", "off")
    assert strict.returncode == 0, strict.stderr
    report = json.loads((tmp_path / "strict" / "run_report.json").read_text())
    assert (report["rows"]["written"], report["rows"]["dead_lettered"]) == (10_498, 2)
    letters = [json.loads(line) for path in (tmp_path / "strict" / "dead_letter").iterdir()
               for line in path.read_text().splitlines()]
    assert sorted((d["source"], d["error"]) for d in letters) == [
        (f"{table}:10101", "unknown_column"), (f"{table}:10401", "unknown_column")]


@pytest.mark.unit
def test_strict_schema_is_refused_on_images(tmp_path):
    root = _imagenet(tmp_path / "in")
    with pytest.raises(ConvertError, match=r"--strict_schema applies only to tables"):
        plan_run(ConvertConfig(input=str(root), output=str(tmp_path / "out"), strict_schema=True))


@pytest.mark.e2e
def test_cli_prints_the_plan_before_running_and_the_dropped_columns_after(tmp_path):
    table = _table(tmp_path / "t.csv")
    schema = tmp_path / "s.yaml"
    schema.write_text("columns:\n  - {name: id, type: int64}\n")
    out = tmp_path / "out"
    done = _cli("convert", "--input", str(table), "--schema", str(schema), "--output", str(out))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"plan: {table} -> {out}"
    assert lines.index("status: ok") > lines.index("  splits: one split, 'train'")
    assert ("columns dropped (not in the schema): score, name, note (--strict_schema refuses "
            "them; 'skip: true' in the schema drops one on purpose)") in lines
    report = json.loads((out / "run_report.json").read_text())
    assert report["dropped_columns"] == ["score", "name", "note"]
    records = read_dataset(str(out))["train-00000-of-00001.tfrecord"]
    assert sorted(records, key=lambda r: r["id"]) == [{"id": [i]} for i in range(5)]
    refused = _cli("convert", "--input", str(table), "--schema", str(schema), "--strict_schema",
                   "--output", str(tmp_path / "strict"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "beam-tfrecords convert: error: --strict_schema:")
    assert not (tmp_path / "strict").exists()


@pytest.mark.beam
def test_the_run_converts_the_listing_the_preflight_showed(tmp_path):
    root = _imagenet(tmp_path / "in")
    shown = []
    result = convert(ConvertConfig(input=str(root), output=str(tmp_path / "out")),
                     on_plan=lambda plan: shown.append(plan))
    assert result.ok
    assert shown and shown[0].listing
    assert shown[0].listing not in images_module._kept_listings  # Taken by the listing step.
    manifest = load_manifest(str(tmp_path / "out"))
    assert {s: v["records"] for s, v in manifest["splits"].items()} == {"train": 12, "val": 6}
    assert manifest["labels"]["vocabulary"] == ["cat", "dog", "owl"]


# -- refused before running ---------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("header, given", [("a,b,c,a", None), ("a,b,a", "a"), ("image,label,image", None)])
def test_a_header_naming_a_column_twice_is_refused(tmp_path, header, given):
    table = tmp_path / "t.csv"
    table.write_text(header + "\n" + ",".join("1" * len(header.split(","))) + "\n")
    schema = None
    if given:
        schema = tmp_path / "s.yaml"
        schema.write_text(f"columns: [{{name: {given}, type: int64}}]\n")
    twice = header.split(",")[0]
    with pytest.raises(ConvertError, match=rf"the header names a column more than once \('{twice}' in "
                       rf"columns 1, {len(header.split(','))}\)"):
        plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "out"),
                               schema=str(schema) if schema else None))


@pytest.mark.unit
def test_columns_flag_naming_a_column_twice_is_refused(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("1,2\n")
    with pytest.raises(ConvertError, match=r"--columns names a column more than once \('x' in columns 1, 2\)"):
        plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "out"), layout="table",
                               no_header=True, columns=("x", "x")))


@pytest.mark.unit
@pytest.mark.parametrize("text", [
    "columns: " + "[" * 5000 + "]" * 5000,
    '{"columns": ' + "[" * 100000 + "]" * 100000 + "}",
    "columns:\n" + "".join("  " * i + "- \n" for i in range(1, 3000)),
])
def test_a_schema_nested_too_deeply_is_a_value_error(text):
    with pytest.raises(ValueError, match=r"s\.yaml is nested too deeply to be a schema"):
        load_schema(text, "s.yaml")


@pytest.mark.e2e
def test_cli_refuses_a_deep_schema_and_duplicate_columns_in_one_line(tmp_path):
    table = _table(tmp_path / "t.csv")
    deep = tmp_path / "deep.yaml"
    deep.write_text("columns: " + "[" * 5000 + "]" * 5000 + "\n")
    done = _cli("convert", "--input", str(table), "--schema", str(deep), "--output", str(tmp_path / "o"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"beam-tfrecords convert: error: --schema {deep} is nested too deeply to be a schema (a "
        "schema is a mapping with a 'columns' list of flat mappings)"]
    twice = tmp_path / "twice.csv"
    twice.write_text("a,b,a\n1,2,3\n")
    done = _cli("convert", "--input", str(twice), "--output", str(tmp_path / "o"))
    assert done.returncode == 2 and TRACEBACK not in done.stderr
    assert "the header names a column more than once ('a' in columns 1, 3)" in done.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.unit
def test_an_unreachable_gcs_is_refused_within_the_bounded_time(tmp_path, monkeypatch):
    monkeypatch.setenv(gcs.EMULATOR_ENV, "http://127.0.0.1:9")  # Nothing listens on port 9.
    monkeypatch.setattr(gcs, "_gcsio", None)
    gcs.use_anonymous_credentials()
    table = _table(tmp_path / "t.csv")
    started = time.monotonic()
    with pytest.raises(ConvertError, match=r"--output gs://bucket/out: gs://bucket \(storage emulator "
                       r"http://127.0.0.1:9\) could not be reached within 2 s"):
        gcs_seconds = "2"
        monkeypatch.setenv(gcs.PROBE_ENV, gcs_seconds)
        plan_run(ConvertConfig(input=str(table), output="gs://bucket/out"))
    assert time.monotonic() - started < 10
    monkeypatch.setattr(gcs, "_gcsio", None)


@pytest.mark.unit
def test_a_gcs_probe_that_hangs_is_cut_at_the_bound(monkeypatch):
    monkeypatch.setattr(gcs, "_probe", lambda *args: time.sleep(30))
    monkeypatch.delenv(gcs.EMULATOR_ENV, raising=False)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"gs://b did not answer within 1 s; check the network"):
        gcs.check_reachable("gs://b/x", seconds=1)
    assert time.monotonic() - started < 5


# -- a pipeline that fails mid-run --------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A 3 MB tmpfs (needs root, as on CI machines of this kind)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.e2e
def test_disk_full_fails_the_run_in_one_line_with_a_report_and_frees_the_space(tmp_path, small_disk):
    table = tmp_path / "big.csv"
    with open(table, "w") as f:
        f.write("id,score,name\n")
        for i in range(200_000):
            f.write(f"{i},{i * 0.37},name-{i:07d}\n")
    out = small_disk / "out"
    done = _cli("convert", "--input", str(table), "--output", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert TRACEBACK not in done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("RUN FAILED: OSError: [Errno 28] No space left on device (the disk "
                           "holding --output, or its temporaries, is full"), last
    # No manifest, no shard, temporaries gone; the journal records the report (issue 18).
    assert sorted(os.listdir(out)) == [".beam-tfrecords", "run_report.json"]
    assert os.listdir(out / ".beam-tfrecords") == ["journal"]
    report = json.loads((out / "run_report.json").read_text())
    assert report["status"] == "failed" and "No space left on device" in report["error"]


@pytest.mark.beam
def test_a_run_refused_after_planning_keeps_no_listing_in_memory(tmp_path):
    root = _imagenet(tmp_path / "in")
    out = tmp_path / "out"
    assert convert(ConvertConfig(input=str(root), output=str(out))).ok
    before = dict(images_module._kept_listings)
    with pytest.raises(ConvertError, match=r"already holds a dataset"):
        convert(ConvertConfig(input=str(root), output=str(out)))
    assert images_module._kept_listings == before
