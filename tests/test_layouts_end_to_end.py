"""One whole conversion per input layout: every record read back and checked.

Expected values come from the source files (bytes, Pillow's reading of the
header, hashlib), never from the code under test.
"""

import os

import pytest

from beam_tfrecords.samples import (
    CLASSES,
    make_cifar_sample,
    make_class_folder_sample,
    make_csv_manifest_sample,
)
from tests.conftest import expected_features, load_manifest, read_dataset

pytestmark = pytest.mark.e2e


def _records_by_filename(output):
    records = {}
    for shard, examples in read_dataset(output).items():
        split = shard.split("-", 1)[0]
        for features in examples:
            name = features["image/filename"][0].decode()
            assert name not in records, f"{name} written twice"
            records[name] = (split, features)
    return records


def test_class_folders_with_splits(tmp_path, run_convert):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    written = make_class_folder_sample(root, per_class=3, formats=("jpeg", "png", "gif"))
    result = run_convert(root, out)
    assert result.ok, result.report

    records = _records_by_filename(out)
    assert sorted(records) == written
    vocabulary = sorted(CLASSES)
    for rel, (split, features) in records.items():
        split_dir, cls, _ = rel.split("/")
        assert split == split_dir
        expected = expected_features(root, rel, vocabulary.index(cls), cls)
        assert features == expected, rel
    manifest = load_manifest(out)
    assert manifest["input"]["layout"] == "class_folders"
    assert manifest["input"]["ignored_files"] == 1  # README.txt
    assert manifest["labels"]["vocabulary"] == vocabulary
    assert manifest["labels"]["counts"]["validation"] == {c: 3 for c in vocabulary}
    assert sorted(manifest["splits"]) == ["test", "train", "validation"]


def test_class_folders_without_splits_and_labels_file(tmp_path, run_convert):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    written = make_class_folder_sample(root, per_class=2, splits=None)
    labels = tmp_path / "labels.txt"
    order = ["triangles", "stripes", "squares", "circles"]
    labels.write_text("\n".join(order) + "\n")
    result = run_convert(root, out, labels=str(labels))
    assert result.ok, result.report

    records = _records_by_filename(out)
    assert sorted(records) == written
    for rel, (split, features) in records.items():
        cls = rel.split("/")[0]
        assert split == "train"
        assert features == expected_features(root, rel, order.index(cls), cls), rel
    assert load_manifest(out)["labels"]["vocabulary"] == order


def test_cifar_layout(tmp_path, run_convert):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    order = ["stripes", "circles", "triangles", "squares"]  # Not sorted: labels.txt decides.
    written = make_cifar_sample(root, {"train": 12, "test": 5}, classes=order)
    result = run_convert(root, out)
    assert result.ok, result.report

    records = _records_by_filename(out)
    assert sorted(records) == written
    for rel, (split, features) in records.items():
        cls = os.path.splitext(rel.split("/")[1])[0].split("_", 1)[1]
        assert split == rel.split("/")[0]
        assert features == expected_features(root, rel, order.index(cls), cls), rel
    manifest = load_manifest(out)
    assert manifest["input"]["layout"] == "cifar"
    assert manifest["labels"]["vocabulary"] == order
    assert manifest["splits"]["train"]["records"] == 12
    assert manifest["splits"]["test"]["records"] == 5


def test_csv_manifest_layout(tmp_path, run_convert):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    rows = make_csv_manifest_sample(root, n=10)
    result = run_convert(os.path.join(root, "manifest.csv"), out)
    assert result.ok, result.report

    records = _records_by_filename(out)
    assert sorted(records) == sorted(r["image"] for r in rows)
    vocabulary = sorted({r["label"] for r in rows})
    for row in rows:
        split, features = records[row["image"]]
        assert split == row["split"]
        expected = expected_features(root, row["image"], vocabulary.index(row["label"]), row["label"])
        expected["weight"] = [float(row["weight"])]
        expected["source_id"] = [int(row["source_id"])]
        expected["note"] = [row["note"].encode()]
        assert features.keys() == expected.keys()
        for name, value in expected.items():
            if name == "weight":
                assert abs(features[name][0] - value[0]) < 1e-6
            else:
                assert features[name] == value, (row["image"], name)
    manifest = load_manifest(out)
    assert manifest["input"]["layout"] == "csv"
    assert manifest["features"]["weight"] == {"dtype": "float32", "shape": []}
    assert manifest["features"]["source_id"] == {"dtype": "int64", "shape": []}
    assert manifest["features"]["note"] == {"dtype": "string", "shape": []}
    assert manifest["features"]["image/encoded"] == {"dtype": "string", "shape": []}
