"""Per-split statistics: the mergeable summaries (against numpy), and whole runs whose
manifest statistics are checked against numpy on the same data."""

import csv
import os

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from beam_tfrecords.schemas.table_schema import ColumnSpec, TableSchema
from beam_tfrecords.transforms.quality.statistics import (
    SKETCH_SIZE,
    TOP_CAPACITY,
    NumericSummary,
    StringSummary,
    TableStatistics,
    _quantiles,
    image_counts,
    image_statistics_json,
    merge_table_statistics,
    string_hashes,
    table_batch_statistics,
)
from tests.conftest import load_manifest

# --- unit: summaries -------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("cuts", [(), (1,), (10, 500), (0, 0, 999)])
def test_numeric_merge_equals_numpy(cuts):
    values = np.random.default_rng(3).normal(7.0, 3.0, 1000)
    parts = np.split(values, list(cuts))
    merged = NumericSummary()
    for part in parts:
        merged.merge(NumericSummary.of(part, missing=1, integer=False))
    out = merged.to_json()
    assert out["count"] == 1000 and out["missing"] == len(parts)
    assert out["min"] == values.min() and out["max"] == values.max()
    assert out["mean"] == pytest.approx(values.mean(), rel=1e-12)
    assert out["std"] == pytest.approx(values.std(), rel=1e-9)


@pytest.mark.unit
def test_numeric_non_finite_and_empty():
    out = NumericSummary.of(np.array([1.0, np.nan, np.inf, 3.0]), 0, integer=False).to_json()
    assert (out["count"], out["non_finite"], out["min"], out["max"], out["mean"]) == (2, 2, 1.0, 3.0, 2.0)
    empty = NumericSummary.of(np.array([], dtype=np.int64), 5, integer=True).to_json()
    assert empty == {"kind": "numeric", "count": 0, "missing": 5, "non_finite": 0, "min": None,
                     "max": None, "mean": None, "std": None}


@pytest.mark.unit
def test_string_hashes_are_per_value_and_slice_safe():
    values = pa.array(["", "a", "b", "ab", "ba", "a", "héllo", "x" * 300])
    hashes = string_hashes(values)
    assert hashes.dtype == np.uint64
    assert hashes[1] == hashes[5]
    assert len(set(hashes.tolist())) == 7
    assert string_hashes(values.slice(3, 4)).tolist() == hashes[3:7].tolist()
    assert string_hashes(pa.array([b"ab"], type=pa.binary())).tolist() == [hashes[3]]
    # Over a megabyte of text is hashed a slice at a time, to the same values.
    big = pa.array([f"{i}-" + "y" * (i % 5000) for i in range(2000)])
    whole = string_hashes(big)
    assert whole.tolist() == [string_hashes(big.slice(i, 1))[0] for i in range(2000)]
    assert whole[1:].tolist() == string_hashes(big.slice(1)).tolist()


@pytest.mark.unit
def test_string_exact_counts_merge():
    words = np.random.default_rng(0).choice(["cat", "dog", "owl", "emu"], 5000, p=[.4, .3, .2, .1])
    merged = StringSummary()
    for part in np.array_split(words, 7):
        merged.merge(StringSummary.of(pa.array(part.tolist()), missing=2))
    out = merged.to_json()
    names, counts = np.unique(words, return_counts=True)
    expected = sorted(zip(names.tolist(), counts.tolist()), key=lambda p: -p[1])
    assert out["top_values"] == [{"value": v, "count": c} for v, c in expected]
    assert (out["count"], out["missing"], out["distinct"]) == (5000, 14, 4)
    assert out["distinct_exact"] and out["top_values_exact"]


@pytest.mark.unit
def test_string_many_values_sketch_and_misra_gries():
    rng = np.random.default_rng(1)
    rare = [f"id-{i}" for i in range(60_000)]
    heavy = ["hot"] * 5000 + ["warm"] * 3000
    values = np.array(rare + heavy, dtype=object)
    rng.shuffle(values)
    merged = StringSummary()
    for part in np.array_split(values, 9):
        merged.merge(StringSummary.of(pa.array(part.tolist()), missing=0))
    out = merged.to_json()
    assert not out["distinct_exact"] and not out["top_values_exact"]
    assert abs(out["distinct"] - 60_002) / 60_002 < 0.1  # KMV, k = SKETCH_SIZE: ~3% error.
    top = {entry["value"]: entry["count"] for entry in out["top_values"]}
    assert list(top)[:2] == ["hot", "warm"]
    # Misra-Gries counts are lower bounds, off by at most values / (capacity + 1).
    bound = len(values) / (TOP_CAPACITY + 1)
    assert 5000 - bound <= top["hot"] <= 5000 and 3000 - bound <= top["warm"] <= 3000
    assert len(merged.sketch) == SKETCH_SIZE and len(merged.top_counts) <= TOP_CAPACITY


@pytest.mark.unit
def test_bytes_have_no_top_values():
    out = StringSummary.of(pa.array(["QQ==", "Qg==", "QQ=="]), 1, with_top=False).to_json()
    assert out == {"kind": "bytes", "count": 3, "missing": 1, "distinct": 2, "distinct_exact": True}


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(5))
def test_quantiles_are_numpy_inverted_cdf(seed):
    sizes = np.random.default_rng(seed).integers(1, 50, int(np.random.default_rng(seed).integers(1, 300)))
    values, counts = np.unique(sizes, return_counts=True)
    got = _quantiles(dict(zip(values.tolist(), counts.tolist())))
    for q in (0, 5, 50, 95, 100):
        assert got[f"p{q}"] == int(np.percentile(sizes, q, method="inverted_cdf")), q


@pytest.mark.unit
def test_image_statistics_json():
    counts = image_counts([("jpeg", "RGB", 10, 20), ("png", "L", 30, 20), ("jpeg", "RGB", 10, 5)])
    out = image_statistics_json(counts, {"dog": 1, "cat": 2})
    assert out["formats"] == {"jpeg": 2, "png": 1} and out["modes"] == {"L": 1, "RGB": 2}
    assert out["width"] == {"p0": 10, "p5": 10, "p50": 10, "p95": 30, "p100": 30}
    assert out["height"]["p0"] == 5 and out["classes"] == {"cat": 2, "dog": 1}


@pytest.mark.unit
def test_table_batch_statistics_split_lists_defaults():
    schema = TableSchema((
        ColumnSpec("n", "int64"), ColumnSpec("f", "float", default=1.5),
        ColumnSpec("ok", "bool"), ColumnSpec("tags", "string", delimiter="|"),
        ColumnSpec("ids", "int64", delimiter=";", feature="id_list"), ColumnSpec("note", skip=True),
    ))
    batch = pa.RecordBatch.from_pydict({
        "n": [" +4", "", "7", "bad", "9"], "f": ["0.1", "", "2", "x", "3"],
        "ok": ["yes", "0", "TRUE", "", "no"], "tags": ["a|b", "", "b", "", "a"],
        "ids": ["1; 2", "3", "", "", "4;5;6"], "note": ["", "", "", "", ""]})
    # Row 3 was dead-lettered; rows 0 and 1 went to train, 2 and 4 to test.
    parts = table_batch_statistics(schema, batch, np.array([0, 0, 1, -1, 1]), ["train", "test"])
    train, test = parts["train"].to_json(), parts["test"].to_json()
    assert parts["train"].rows == 2 and parts["test"].rows == 2
    assert train["n"] == {"kind": "numeric", "count": 1, "missing": 1, "non_finite": 0,
                        "min": 4, "max": 4, "mean": 4.0, "std": 0.0}
    assert train["f"]["count"] == 2 and train["f"]["missing"] == 1  # The default fills the empty cell.
    assert train["f"]["mean"] == pytest.approx((np.float32(0.1) + 1.5) / 2)
    assert (test["ok"]["mean"], train["ok"]["mean"]) == (0.5, 0.5)
    assert train["tags"]["top_values"] == [{"value": "a", "count": 1}, {"value": "b", "count": 1}]
    assert train["tags"]["missing"] == 1 and test["tags"]["count"] == 2
    assert train["id_list"]["count"] == 3 and train["id_list"]["max"] == 3
    assert test["id_list"]["missing"] == 1 and test["id_list"]["mean"] == 5.0
    assert "note" not in train
    merged = dict(merge_table_statistics([("train", parts["train"]), ("train", parts["test"]),
                                          ("test", None)]))
    assert list(merged) == ["train"] and merged["train"].rows == 4
    assert parts["train"].rows == 2  # The parts merged are left as they were.
    assert isinstance(merged["train"], TableStatistics)


# --- whole runs -----------------------------------------------------------------------


def _table(path, rng, rows=3000):
    ages = rng.normal(40, 10, rows).round().astype(np.int64)
    scores = rng.normal(0.5, 0.2, rows)
    cities = rng.choice(["Paris", "Rome", "Oslo", "Lima"], rows, p=[.4, .3, .2, .1])
    age_cells = [str(a) if rng.random() > 0.05 else "" for a in ages]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["age", "score", "city", "ids"])
        for i in range(rows):
            writer.writerow([age_cells[i], f"{scores[i]:.6f}", cities[i], f"{i % 7};{i % 11}"])
        writer.writerow(["not-a-number", "1.0", "Paris", "1"])  # Dead-lettered: not counted.
    return age_cells, scores, cities


@pytest.mark.e2e
def test_table_statistics_match_numpy(tmp_path, run_convert):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    age_cells, scores, cities = _table(src, np.random.default_rng(7))
    schema = tmp_path / "schema.yaml"
    schema.write_text("columns:\n  - {name: age, type: int64}\n  - {name: score, type: float}\n"
                      "  - {name: city, type: string}\n  - {name: ids, type: int64, delimiter: ';'}\n")
    result = run_convert(src, out, ["--direct_num_workers", "1"], schema=str(schema),
                         max_bad_fraction=0.5)
    assert result.ok, result.report
    stats = load_manifest(out)["splits"]["train"]["statistics"]
    assert stats["records"] == 3000
    features = stats["features"]
    ages = np.array([int(a) for a in age_cells if a])
    assert features["age"]["missing"] == sum(1 for a in age_cells if not a)
    assert features["age"]["count"] == len(ages)
    assert (features["age"]["min"], features["age"]["max"]) == (ages.min(), ages.max())
    assert features["age"]["mean"] == pytest.approx(ages.mean(), rel=1e-12)
    assert features["age"]["std"] == pytest.approx(ages.std(), rel=1e-9)
    written = np.array([float(f"{s:.6f}") for s in scores], dtype=np.float32).astype(np.float64)
    assert (features["score"]["min"], features["score"]["max"]) == (written.min(), written.max())
    assert features["score"]["mean"] == pytest.approx(written.mean(), rel=1e-12)
    assert features["score"]["std"] == pytest.approx(written.std(), rel=1e-9)
    assert features["score"]["missing"] == 0
    names, counts = np.unique(cities, return_counts=True)
    assert features["city"]["top_values"] == [
        {"value": n, "count": c} for n, c in sorted(zip(names.tolist(), counts.tolist()),
                                                    key=lambda p: -p[1])]
    assert features["city"]["distinct"] == 4 and features["city"]["distinct_exact"]
    ids = np.array([[i % 7, i % 11] for i in range(3000)]).ravel()
    assert features["ids"]["count"] == 6000
    assert features["ids"]["mean"] == pytest.approx(ids.mean(), rel=1e-12)


@pytest.mark.e2e
def test_table_statistics_per_split_add_up(tmp_path, run_convert):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    age_cells, _, _ = _table(src, np.random.default_rng(8), rows=2000)
    schema = tmp_path / "schema.yaml"
    schema.write_text("columns:\n  - {name: age, type: int64}\n  - {name: score, type: float}\n"
                      "  - {name: city, type: string}\n  - {name: ids, type: string}\n")
    result = run_convert(src, out, schema=str(schema), splits=(("train", 0.7), ("test", 0.3)),
                         max_bad_fraction=0.5)
    assert result.ok, result.report
    splits = load_manifest(out)["splits"]
    assert sum(s["statistics"]["records"] for s in splits.values()) == 2000
    for info in splits.values():
        assert info["statistics"]["records"] == info["records"]
    missing = sum(s["statistics"]["features"]["age"]["missing"] for s in splits.values())
    assert missing == sum(1 for a in age_cells if not a)


@pytest.mark.e2e
@pytest.mark.parametrize("reshape", [{}, {"max_side": 16}])
def test_image_statistics_match_the_files(tmp_path, run_convert, reshape):
    root, out = tmp_path / "in", str(tmp_path / "out")
    rng = np.random.default_rng(5)
    widths, heights, modes, formats = [], [], [], []
    for label, count in (("cat", 9), ("dog", 4)):
        os.makedirs(root / label)
        for i in range(count):
            w, h = int(rng.integers(8, 60)), int(rng.integers(8, 60))
            mode = "L" if i % 3 == 0 else "RGB"
            shape = (h, w) if mode == "L" else (h, w, 3)
            image = Image.fromarray(rng.integers(0, 255, shape, dtype=np.uint8), mode)
            image.save(root / label / f"{i}.{'png' if i % 2 else 'jpg'}")
            if reshape:
                scale = min(1.0, 16 / max(w, h))
                w, h = max(1, round(w * scale)), max(1, round(h * scale))
            widths.append(w)
            heights.append(h)
            modes.append(mode)
            formats.append("png" if i % 2 else "jpeg")
    (root / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff nothing")  # Dead-lettered.
    result = run_convert(str(root), out, max_bad_fraction=0.5, **reshape)
    assert result.ok, result.report
    images = load_manifest(out)["splits"]["train"]["statistics"]["images"]
    assert images["classes"] == {"cat": 9, "dog": 4}
    assert images["modes"] == {m: modes.count(m) for m in sorted(set(modes))}
    assert images["formats"] == {f: formats.count(f) for f in sorted(set(formats))}
    for name, sizes in (("width", widths), ("height", heights)):
        expected = {f"p{q}": int(np.percentile(sizes, q, method="inverted_cdf"))
                    for q in (0, 5, 50, 95, 100)}
        if reshape:  # Resizing rounds as Pillow does: within a pixel.
            assert all(abs(images[name][k] - v) <= 1 for k, v in expected.items()), name
        else:
            assert images[name] == expected, name
