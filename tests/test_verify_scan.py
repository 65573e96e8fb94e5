"""``verify`` fails what is not one dataset: extra TFRecord files beside a manifest,
and, scanning a folder without one, empty files and incomplete or mixed shard sets."""

from __future__ import annotations

import os
import shutil

import pytest

from beam_tfrecords.transforms.codec.tfrecord import frame_record
from beam_tfrecords.verify import verify_dataset


def _shard(path, records=3):
    path.write_bytes(b"".join(frame_record(b"record %d" % i) for i in range(records)))


def _verdicts(report) -> dict[str, str]:
    return {c.path.rsplit("/", 1)[-1]: ("OK" if c.ok else c.error) for c in report.checks}


@pytest.mark.unit
def test_a_complete_shard_set_scans_ok(tmp_path):
    for i in range(3):
        _shard(tmp_path / f"train-{i:05d}-of-00003.tfrecord")
    _shard(tmp_path / "test-00000-of-00001.tfrecord")
    report = verify_dataset(str(tmp_path), scan_only=True)
    assert report.ok, report.lines()
    assert len(report.checks) == 4


@pytest.mark.unit
def test_scan_fails_an_empty_file(tmp_path):
    _shard(tmp_path / "train-00000-of-00002.tfrecord")
    (tmp_path / "train-00001-of-00002.tfrecord").write_bytes(b"")
    report = verify_dataset(str(tmp_path), scan_only=True)
    assert not report.ok
    assert _verdicts(report) == {
        "train-00000-of-00002.tfrecord": "OK",
        "train-00001-of-00002.tfrecord": "empty file (0 bytes): a shard holds at least one record",
    }


@pytest.mark.unit
def test_scan_fails_a_mixed_and_an_incomplete_shard_set(tmp_path):
    _shard(tmp_path / "train-00000-of-00002.tfrecord")
    _shard(tmp_path / "train-00001-of-00002.tfrecord")
    _shard(tmp_path / "train-00003-of-00004.tfrecord")  # Left by an older run.
    _shard(tmp_path / "val-00001-of-00003.tfrecord")  # 0 and 2 missing.
    report = verify_dataset(str(tmp_path), scan_only=True)
    verdicts = _verdicts(report)
    mixed = "split 'train' mixes shard sets of 2 and 4 shards (old and new runs?)"
    assert verdicts == {
        "train-00000-of-00002.tfrecord": mixed,
        "train-00001-of-00002.tfrecord": mixed,
        "train-00003-of-00004.tfrecord": mixed,
        "val-00001-of-00003.tfrecord": "split 'val' is incomplete: 2 of its 3 shards missing (e.g. index 0)",
    }
    assert report.lines()[-1] == "0 of 4 files OK; 4 failed"


@pytest.mark.unit
def test_shard_sets_are_judged_per_folder(tmp_path):
    for run in ("a", "b"):
        (tmp_path / run).mkdir()
        for i in range(2 if run == "a" else 1):
            _shard(tmp_path / run / f"train-{i:05d}-of-0000{2 if run == 'a' else 1}.tfrecord")
    report = verify_dataset(str(tmp_path), scan_only=True)
    verdicts = {os.path.relpath(c.path, tmp_path): ("OK" if c.ok else c.error) for c in report.checks}
    assert verdicts == {
        "a/train-00000-of-00002.tfrecord": "OK",
        "a/train-00001-of-00002.tfrecord": "OK",
        "b/train-00000-of-00001.tfrecord": "OK",
    }
    assert [c.records for c in report.checks] == [3, 3, 3]
    assert report.ok and report.lines()[-1] == "3 of 3 files OK"


@pytest.mark.unit
def test_a_single_empty_file_given_by_name_is_a_valid_empty_tfrecord(tmp_path):
    empty = tmp_path / "x.tfrecord"
    empty.write_bytes(b"")
    report = verify_dataset(str(empty))
    assert report.ok and report.checks[0].records == 0


@pytest.mark.e2e
def test_any_tfrecord_beside_a_manifest_that_it_does_not_list_fails(tmp_path, run_convert):
    from PIL import Image

    images = tmp_path / "in" / "cat"
    images.mkdir(parents=True)
    for i in range(3):
        Image.new("RGB", (4, 4), (i, 0, 0)).save(images / f"{i}.png")
    out = tmp_path / "out"
    assert run_convert(str(tmp_path / "in"), str(out)).ok
    assert verify_dataset(str(out)).ok
    shutil.copy(out / "train-00000-of-00001.tfrecord", out / "extra.tfrecord")
    (out / "train-00001-of-00002.tfrecord").write_bytes(b"")
    report = verify_dataset(str(out))
    assert not report.ok
    assert _verdicts(report) == {
        "extra.tfrecord": "TFRecord file not listed in manifest.json",
        "train-00000-of-00001.tfrecord": "OK",
        "train-00001-of-00002.tfrecord": "TFRecord file not listed in manifest.json",
    }
