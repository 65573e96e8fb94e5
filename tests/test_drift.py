"""The drift gate (--compare_to): the comparison as a pure function, and whole runs
that must publish nothing when the data moved (exit status 3 on the CLI)."""

import csv
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from beam_tfrecords.pipeline import ConvertError
from beam_tfrecords.schemas.report import Status
from beam_tfrecords.transforms.quality.drift import DriftGate, baseline_of, compare
from tests.conftest import load_manifest

# --- unit: the comparison -------------------------------------------------------------


def _numeric(mean, std, missing=0, count=100):
    return {"kind": "numeric", "count": count, "missing": missing, "non_finite": 0, "min": 0,
            "max": 1, "mean": mean, "std": std}


def _manifest(features, split_stats):
    return {"features": features,
            "splits": {split: {"records": stats["records"], "statistics": stats}
                       for split, stats in split_stats.items()}}


_SPEC = {"age": {"dtype": "int64", "shape": []}}


@pytest.mark.unit
@pytest.mark.parametrize("new_mean, failed", [(40.0, False), (45.0, False), (59.9, False),
                                              (60.1, True), (10.0, True)])
def test_mean_shift_in_old_standard_deviations(new_mean, failed):
    old = _manifest(_SPEC, {"train": {"records": 100, "features": {"age": _numeric(40.0, 10.0)}}})
    gate = DriftGate("old", "old/manifest.json", baseline_of(old))
    report = compare(gate, _SPEC, {"train": {"records": 100, "features": {"age": _numeric(new_mean, 3.0)}}})
    assert report["status"] == ("failed" if failed else "passed")
    [mean] = [c for c in report["checks"] if c["check"] == "mean"]
    assert mean["shift_std"] == pytest.approx(abs(new_mean - 40.0) / 10.0)
    assert (mean["old"], mean["new"], mean["threshold"]) == (40.0, new_mean, 2.0)
    if failed:
        assert report["message"] == (f"feature 'age' mean moved {abs(new_mean - 40) / 10:.1f} std "
                                     "(limit 2.0)")


@pytest.mark.unit
def test_missing_rate_class_share_and_values():
    old_stats = {"records": 100, "features": {
        "age": _numeric(1.0, 1.0, missing=1),
        "city": {"kind": "string", "count": 100, "missing": 0, "distinct": 2, "distinct_exact": True,
                 "top_values": [{"value": "a", "count": 60}, {"value": "b", "count": 40}],
                 "top_values_exact": True}},
        "images": {"classes": {"cat": 50, "dog": 50}}}
    new_stats = {"records": 100, "features": {
        "age": _numeric(1.0, 1.0, missing=30),
        "city": {"kind": "string", "count": 100, "missing": 0, "distinct": 2, "distinct_exact": True,
                 "top_values": [{"value": "a", "count": 45}, {"value": "c", "count": 55}],
                 "top_values_exact": True}},
        "images": {"classes": {"cat": 70, "dog": 30}}}
    spec = {**_SPEC, "city": {"dtype": "string", "shape": []}}
    report = compare(DriftGate("old", "m.json", baseline_of(_manifest(spec, {"train": old_stats}))),
                     spec, {"train": new_stats})
    assert report["status"] == "failed"
    failures = report["failures"]
    assert "feature 'age' missing rate moved 0.29 (0.01 -> 0.30; limit 0.1)" in failures
    assert "class 'cat' share moved 0.20 (0.50 -> 0.70; limit 0.1)" in failures
    assert "feature 'city' value 'a' share moved 0.15 (0.60 -> 0.45; limit 0.1)" in failures
    assert "feature 'city' value 'b' share moved 0.40 (0.40 -> 0.00; limit 0.1)" in failures
    assert "feature 'city' value 'c' share moved 0.55 (0.00 -> 0.55; limit 0.1)" in failures
    assert all(c["verdict"] in ("passed", "failed") for c in report["checks"])


@pytest.mark.unit
def test_schema_changes_fail_and_missing_baselines_pass():
    old = _manifest({"a": {"dtype": "int64", "shape": []}, "b": {"dtype": "string", "shape": []}},
                    {"train": {"records": 1}})
    new_spec = {"a": {"dtype": "float32", "shape": []}, "c": {"dtype": "int64", "shape": [None]}}
    report = compare(DriftGate("old", "m.json", baseline_of(old)), new_spec, {"train": {"records": 1}})
    assert report["failures"] == ["feature 'a' changed from int64 [] to float32 []",
                                  "feature 'b' was removed (was string [])",
                                  "feature 'c' was added (int64 [None])"]
    old["splits"]["train"]["statistics"] = None  # A manifest made before statistics.
    report = compare(DriftGate("old", "m.json", baseline_of(old)), old["features"],
                     {"train": {"records": 1}, "test": {"records": 2}})
    assert report["status"] == "passed"
    assert [c["verdict"] for c in report["checks"] if c["check"] in ("split", "statistics")] == [
        "not_compared", "not_compared"]
    skipped = compare(DriftGate("previous", note="nothing yet"), {}, {})
    assert (skipped["status"], skipped["message"]) == ("skipped", "nothing yet")


# --- whole runs -----------------------------------------------------------------------


def _table(path, seed, rows=2000, shift=0.0, missing=0.01, score_type="float"):
    rng = np.random.default_rng(seed)
    ages = rng.normal(40 + shift, 10, rows)
    scores = rng.normal(0.5, 0.2, rows)
    cities = rng.choice(["Paris", "Rome", "Oslo"], rows, p=[.5, .3, .2])
    empty = rng.random(rows) < missing
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["age", "score", "city"])
        for i in range(rows):
            writer.writerow([f"{ages[i]:.0f}", "" if empty[i] else f"{scores[i]:.4f}", cities[i]])
    schema = os.path.join(os.path.dirname(path), "schema.yaml")
    with open(schema, "w", encoding="utf-8") as f:
        f.write(f"columns:\n  - {{name: age, type: int64}}\n  - {{name: score, type: {score_type}}}\n"
                "  - {name: city, type: string}\n")
    return schema


def _published(out):
    """sha256 of every file a reader of the dataset sees (the run report aside)."""
    digests = {}
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if os.path.isfile(path) and name != "run_report.json":
            with open(path, "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
    return digests


@pytest.fixture
def dataset(tmp_path, run_convert):
    """A published table dataset (seed 1, mean age 40, 1% of scores missing)."""
    out = str(tmp_path / "out")
    src = str(tmp_path / "v1" / "t.csv")
    os.makedirs(os.path.dirname(src))
    schema = _table(src, seed=1)
    assert run_convert(src, out, schema=schema).ok
    return out


def _again(tmp_path, run_convert, out, name, compare_to="previous", **table):
    src = str(tmp_path / name / "t.csv")
    os.makedirs(os.path.dirname(src))
    schema = _table(src, **table)
    return run_convert(src, out, schema=schema, overwrite=True, compare_to=compare_to)


@pytest.mark.e2e
def test_mean_shift_of_three_std_fails_and_publishes_nothing(tmp_path, run_convert, dataset):
    before = _published(dataset)
    result = _again(tmp_path, run_convert, dataset, "v2", seed=2, shift=30.0)
    assert result.report.status == Status.DRIFT_FOUND
    assert result.report.manifest is None
    drift = result.report.drift
    assert drift["status"] == "failed"
    assert len(drift["failures"]) == 1
    [mean] = [c for c in drift["checks"] if c["check"] == "mean" and c["feature"] == "age"]
    assert mean["verdict"] == "failed" and 2.7 < mean["shift_std"] < 3.3  # 3 std, sampled.
    assert drift["failures"][0] == f"feature 'age' mean moved {mean['shift_std']:.1f} std (limit 2.0)"
    # Every feature was checked, each with old, new, threshold and verdict.
    checked = {(c["check"], c.get("feature")) for c in drift["checks"]}
    assert {("schema", f) for f in ("age", "score", "city")} <= checked
    assert {("missing_rate", f) for f in ("age", "score", "city")} <= checked
    assert {("mean", "age"), ("mean", "score")} <= checked
    assert _published(dataset) == before  # The old manifest and shards, byte for byte.
    work = os.path.join(dataset, ".beam-tfrecords")
    assert not any(n.startswith("tmp-") for n in (os.listdir(work) if os.path.isdir(work) else []))


@pytest.mark.e2e
def test_missing_rate_jump_fails_naming_the_feature(tmp_path, run_convert, dataset):
    before = _published(dataset)
    result = _again(tmp_path, run_convert, dataset, "v2", seed=3, missing=0.30)
    assert result.report.status == Status.DRIFT_FOUND
    [failure] = result.report.drift["failures"]
    assert failure.startswith("feature 'score' missing rate moved 0.")
    assert _published(dataset) == before


@pytest.mark.e2e
def test_schema_change_fails(tmp_path, run_convert, dataset):
    before = _published(dataset)
    result = _again(tmp_path, run_convert, dataset, "v2", seed=1, score_type="string")
    assert result.report.status == Status.DRIFT_FOUND
    assert "feature 'score' changed from float32 [None] to string [None]" in result.report.drift["failures"]
    assert _published(dataset) == before


@pytest.mark.e2e
def test_same_distribution_passes_and_publishes(tmp_path, run_convert, dataset):
    old = load_manifest(dataset)
    result = _again(tmp_path, run_convert, dataset, "v2", seed=99)  # Another sample, same law.
    assert result.ok, result.report
    assert result.report.drift["status"] == "passed"
    assert result.report.drift["failures"] == []
    assert load_manifest(dataset)["created"] >= old["created"]
    # The identical table, compared with the dataset folder by path: passes too.
    copy = str(tmp_path / "copy")
    result = _again(tmp_path, run_convert, copy, "v3", compare_to=dataset, seed=99)
    assert result.ok, result.report
    assert result.report.drift["message"].endswith(f"against {dataset}/manifest.json")
    assert all(c["verdict"] != "failed" for c in result.report.drift["checks"])
    shifts = [c["shift_std"] for c in result.report.drift["checks"] if c["check"] == "mean"]
    assert shifts and all(s == 0 for s in shifts)


@pytest.mark.e2e
def test_previous_without_a_dataset_passes_with_a_note(tmp_path, run_convert):
    result = _again(tmp_path, run_convert, str(tmp_path / "new"), "v1", seed=1)
    assert result.ok
    assert result.report.drift["status"] == "skipped"
    assert "nothing to compare with" in result.report.drift["note"]


@pytest.mark.e2e
def test_compare_to_a_missing_dataset_is_refused_before_the_run(tmp_path, run_convert):
    src = str(tmp_path / "v1" / "t.csv")
    os.makedirs(os.path.dirname(src))
    schema = _table(src, seed=1)
    with pytest.raises(ConvertError, match="--compare_to .*does not exist"):
        run_convert(src, str(tmp_path / "out"), schema=schema, compare_to=str(tmp_path / "nowhere"))
    assert not os.path.exists(tmp_path / "out" / "run_report.json")


@pytest.mark.e2e
def test_cli_exit_status_and_one_line(tmp_path, dataset):
    before = _published(dataset)
    src = str(tmp_path / "v2" / "t.csv")
    os.makedirs(os.path.dirname(src))
    schema = _table(src, seed=4, shift=30.0)
    run = subprocess.run(
        [sys.executable, "-m", "beam_tfrecords", "convert", "--input", src, "--schema", schema,
         "--output", dataset, "--overwrite", "--compare_to", os.path.join(dataset, "manifest.json"),
         "--drift_max_mean_shift", "2.5", "--progress", "off"],
        capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 3, run.stdout + run.stderr
    [line] = [line for line in run.stdout.splitlines() if line.startswith("drift:")]
    assert "feature 'age' mean moved 3." in line and "(limit 2.5)" in line
    assert "nothing was published" in line
    assert "status: drift_found" in run.stdout
    assert _published(dataset) == before
    bad = subprocess.run(
        [sys.executable, "-m", "beam_tfrecords", "convert", "--input", src, "--schema", schema,
         "--output", str(tmp_path / "x"), "--drift_max_missing_change", "0.2"],
        capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2
    assert "--drift_max_missing_change applies only with --compare_to" in bad.stderr
