"""Duplicates and leakage: planted copies are all reported with both paths;
``--fail_on_leakage`` and ``--drop_duplicates`` do what they say."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from beam_tfrecords.transforms.quality.duplicates import duplicate_report, keep_first
from tests.conftest import read_dataset

CROSS, WITHIN = 5, 7


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("dups") / "in"
    originals = []
    for split, count in (("train", 30), ("test", 10)):
        for i in range(count):
            cls = f"c{i % 3}"
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            path = root / split / cls / f"{split}{i:02d}.png"
            Image.new("RGB", (6, 4), (i, 7 if split == "train" else 99, i * 3)).save(path)
            originals.append(path)
    cross, within = [], []
    for i in range(CROSS):  # A training image copied into test, under another name.
        source = root / "train" / f"c{i % 3}" / f"train{i:02d}.png"
        copy = root / "test" / f"c{(i + 1) % 3}" / f"leaked{i}.png"
        shutil.copy(source, copy)
        cross.append({f"train/{source.parent.name}/{source.name}", f"test/{copy.parent.name}/{copy.name}"})
    for i in range(WITHIN):  # A training image copied within train.
        source = root / "train" / f"c{(10 + i) % 3}" / f"train{10 + i:02d}.png"
        copy = root / "train" / f"c{(11 + i) % 3}" / f"again{i}.png"
        shutil.copy(source, copy)
        within.append({f"train/{source.parent.name}/{source.name}", f"train/{copy.parent.name}/{copy.name}"})
    return root, len(originals) + CROSS + WITHIN, cross, within


def _manifest(out) -> dict:
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def _groups(section: dict) -> list[set]:
    return [{f["filename"] for f in group["files"]} for group in section["list"]]


@pytest.mark.e2e
def test_every_planted_copy_is_reported_with_both_paths(planted, tmp_path):
    root, total, cross, within = planted
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root), "--output", out]) == 0
    duplicates = _manifest(out)["duplicates"]
    assert (duplicates["groups"], duplicates["images"]) == (CROSS + WITHIN, 2 * (CROSS + WITHIN))
    assert duplicates["across_splits"]["groups"] == CROSS
    assert sorted(map(sorted, _groups(duplicates["across_splits"]))) == sorted(map(sorted, cross))
    assert duplicates["within_split"]["groups"] == WITHIN
    assert sorted(map(sorted, _groups(duplicates["within_split"]))) == sorted(map(sorted, within))
    assert sum(len(r) for r in read_dataset(out).values()) == total  # Reported, not removed.


@pytest.mark.e2e
def test_fail_on_leakage_publishes_nothing_and_names_the_copies(planted, tmp_path, capsys):
    root, _, cross, _ = planted
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root), "--output", out, "--fail_on_leakage"]) == 1
    printed = capsys.readouterr().out
    assert printed.strip().splitlines()[-1].startswith(
        f"LEAKAGE FOUND: {CROSS} images have copies in more than one split")
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert not [n for n in os.listdir(out) if ".tfrecord" in n]
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert report["status"] == "leakage_found"
    assert sorted(map(sorted, _groups(report["leakage"]))) == sorted(map(sorted, cross))


@pytest.mark.e2e
def test_drop_duplicates_keeps_the_first_by_key_of_each_content(planted, tmp_path):
    root, total, cross, within = planted
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root), "--output", out, "--drop_duplicates"]) == 0
    manifest = _manifest(out)
    assert "duplicates" not in manifest  # What is left is unique.
    dropped = manifest["input"]["duplicates_dropped"]
    assert len(dropped) == CROSS + WITHIN
    for entry in dropped:
        pair = {entry["filename"], entry["copy_of"]}
        assert pair in cross or pair in within
        kept_split = entry["copy_of"].split("/")[0]
        assert stable_key(kept_split, entry["copy_of"]) < stable_key(entry["split"], entry["filename"])
    written = {r["image/filename"][0].decode() for rs in read_dataset(out).values() for r in rs}
    assert len(written) == total - CROSS - WITHIN
    assert not written & {e["filename"] for e in dropped}


@pytest.mark.unit
def test_duplicate_report_groups_and_sorts():
    records = [("a", "train", "x"), ("b", "train", "y"), ("a", "test", "z"), ("c", "train", "w"),
               ("c", "train", "v"), ("a", "train", "u")]
    report = duplicate_report(records)
    assert (report["groups"], report["images"]) == (2, 5)
    assert report["across_splits"]["list"] == [{"sha256": "a", "files": [
        {"split": "test", "filename": "z"}, {"split": "train", "filename": "u"},
        {"split": "train", "filename": "x"}]}]
    assert report["within_split"]["list"][0]["files"] == [
        {"split": "train", "filename": "v"}, {"split": "train", "filename": "w"}]
    assert duplicate_report([("a", "t", "x"), ("b", "t", "y")]) == {}


@pytest.mark.unit
def test_keep_first_keeps_the_smallest_key_and_the_given_order():
    kept, dropped = keep_first([("h1", "k3", "a"), ("h2", "k1", "b"), ("h1", "k2", "c"), ("h1", "k9", "d")])
    assert kept == ["b", "c"]
    assert dropped == [("a", "c"), ("d", "c")]
