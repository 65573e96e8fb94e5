"""The run report typed (``schemas.report``) and the commit's three steps
(``transforms.commit_step``: ``summarize_run``, ``decide_status``, ``publish_run``) on
their own, with plain values.

The expected bytes below were written by the dict code that built the report before
``RunReport`` (issue 20): ``_REPORT_OK`` and ``_REPORT_CLASH`` as the commit (then ``finalize``)
serialized them (``json.dumps(indent=2, ensure_ascii=False)`` and a newline),
``_REPORT_FAILED`` as the launcher wrote a failed run's report and ``_REPORT_SKIPPED``
as ``--report_json`` wrote a skipped run's (``json.dumps(indent=2)``); the three
``_REAL_REPORTS`` are the reports of three of ``tests/test_golden_outputs.py``'s runs.
"""

import dataclasses
import hashlib
import itertools
import json
import os

import google_crc32c
import pytest

from beam_tfrecords.schemas.elements import InputSummary, ShardResult
from beam_tfrecords.schemas.manifest import ErrorBudget
from beam_tfrecords.schemas.report import Failure, RunReport, Status
from beam_tfrecords.schemas.shards import ShardBand, ShardTarget
from beam_tfrecords.transforms.commit_step import (
    CommitSettings,
    StatusFacts,
    decide_status,
    publish_run,
    summarize_run,
)
from beam_tfrecords.transforms.io.commit import stored_object

pytestmark = pytest.mark.unit

_REPORT_OK = """\
{
  "status": "ok",
  "run_id": "20261126T105152Z-0c952f0b",
  "output": "/data/out-é",
  "manifest": "/data/out-é/manifest.json",
  "records": 32,
  "bytes": 382597,
  "shards": 8,
  "bad_records": {
    "corrupt_jpeg": 1,
    "empty_file": 1
  },
  "dead_letter_files": [
    "dead_letter/test-00002-of-00004.jsonl"
  ],
  "error_budget": {
    "max_bad_fraction": 0.5,
    "bad": 2,
    "inputs": 34,
    "bad_fraction": 0.058824,
    "exceeded": false
  },
  "verification_failures": [],
  "shards_outside_band": [
    "train-00001-of-00004.tfrecord"
  ],
  "removed_stale_shards": [
    "train-00000-of-00009.tfrecord"
  ],
  "splits": {
    "train": {
      "records": 32,
      "shards": 8,
      "bytes": 382597,
      "seconds": 0.005
    }
  },
  "dropped_columns": [
    "note",
    "späť"
  ],
  "late_columns": {
    "späť": "data.csv:7"
  },
  "image_bytes": {
    "converted_to_png": {
      "cmyk_jpeg": 2
    },
    "kept": {
      "png_16_bit": 1
    }
  },
  "skipped": {
    "by_reason": {
      "symlink_outside": 1
    },
    "file": "skipped.jsonl"
  },
  "duplicates_dropped": 3,
  "duplicates": {
    "groups": 2,
    "images": 5,
    "across_splits": 1,
    "within_split": 1
  },
  "rows": {
    "in": 34,
    "written": 32,
    "dead_lettered": 2,
    "blank_skipped": 0,
    "lines": {
      "in": 35,
      "accounted_for": 35
    },
    "multiline_rows": {
      "rows": 0,
      "largest_span": 0,
      "first": []
    },
    "accounted": true
  },
  "update": {
    "action": "part",
    "part": "part-00001"
  },
  "part": "part-00001",
  "drift": {
    "status": "passed",
    "message": "no drift"
  },
  "manifest_sha256": "4128aad0ae715be4d0f474281a1a9f1ddfbd67672c32b7f32e3c8e6525c130a7",
  "removed_parts": [
    "part-00000"
  ]
}
"""

_REPORT_CLASH = """\
{
  "status": "split_name_clash",
  "run_id": "20261126T105152Z-0c952f0b",
  "output": "/data/out-é",
  "manifest": "/data/out-é/manifest.json",
  "records": 32,
  "bytes": 382597,
  "shards": 8,
  "bad_records": {
    "corrupt_jpeg": 1,
    "empty_file": 1
  },
  "dead_letter_files": [
    "dead_letter/test-00002-of-00004.jsonl"
  ],
  "error_budget": {
    "max_bad_fraction": 0.5,
    "bad": 2,
    "inputs": 34,
    "bad_fraction": 0.058824,
    "exceeded": false
  },
  "verification_failures": [],
  "shards_outside_band": [
    "train-00001-of-00004.tfrecord"
  ],
  "removed_stale_shards": [
    "train-00000-of-00009.tfrecord"
  ],
  "splits": {
    "train": {
      "records": 32,
      "shards": 8,
      "bytes": 382597,
      "seconds": 0.005
    }
  },
  "split_name_clash": [
    {
      "Train": 3,
      "train": 29
    }
  ]
}
"""

_REPORT_FAILED = r"""{
  "status": "failed",
  "output": "/data/out-\u00e9",
  "manifest": null,
  "error": "OSError: [Errno 28] No space left",
  "run_id": "20261126T105152Z-0c952f0b"
}"""

_REPORT_SKIPPED = """{
  "status": "skipped",
  "output": "/data/out",
  "manifest": "/data/out/manifest.json",
  "reason": "nothing new",
  "update": {
    "action": "skip"
  }
}"""

_REAL_REPORTS = (
    """\
{
  "status": "ok",
  "run_id": "20261126T105152Z-0c952f0b",
  "output": "/data/class_folders_with_bad_files/out",
  "manifest": "/data/class_folders_with_bad_files/out/manifest.json",
  "records": 32,
  "bytes": 382597,
  "shards": 8,
  "bad_records": {
    "corrupt_jpeg": 1,
    "empty_file": 1
  },
  "dead_letter_files": [
    "dead_letter/test-00002-of-00004.jsonl",
    "dead_letter/train-00003-of-00004.jsonl"
  ],
  "error_budget": {
    "max_bad_fraction": 0.5,
    "bad": 2,
    "inputs": 34,
    "bad_fraction": 0.058824,
    "exceeded": false
  },
  "verification_failures": [],
  "shards_outside_band": [
    "train-00001-of-00004.tfrecord"
  ],
  "removed_stale_shards": [],
  "splits": {
    "test": {
      "records": 16,
      "shards": 4,
      "bytes": 185725,
      "seconds": 0.007
    },
    "train": {
      "records": 16,
      "shards": 4,
      "bytes": 196872,
      "seconds": 0.005
    }
  },
  "manifest_sha256": "4128aad0ae715be4d0f474281a1a9f1ddfbd67672c32b7f32e3c8e6525c130a7",
  "removed_parts": []
}
""",
    """\
{
  "status": "ok",
  "run_id": "20261126T105153Z-eddda11f",
  "output": "/data/incremental_part/out/part-00001",
  "manifest": "/data/incremental_part/out/part-00001/manifest.json",
  "records": 2,
  "bytes": 9187,
  "shards": 1,
  "bad_records": {},
  "dead_letter_files": [],
  "error_budget": {
    "max_bad_fraction": 0.01,
    "bad": 0,
    "inputs": 2,
    "bad_fraction": 0.0,
    "exceeded": false
  },
  "verification_failures": [],
  "shards_outside_band": [],
  "removed_stale_shards": [],
  "splits": {
    "train": {
      "records": 2,
      "shards": 1,
      "bytes": 9187,
      "seconds": 0.004
    }
  },
  "update": {
    "action": "part",
    "reason": "2 new, 0 changed, 0 deleted, 4 unchanged: converting 2 into part part-00001",
    "part": "part-00001",
    "inputs": {
      "new": 2,
      "changed": 0,
      "deleted": 0,
      "unchanged": 4,
      "touched": 0
    }
  },
  "part": "part-00001",
  "manifest_sha256": "09e2ea4c3a477cde3434b85f96c37b91977735d91f929b0a540ab9ffb7892957"
}
""",
    """\
{
  "status": "ok",
  "run_id": "20261126T105155Z-9ea30e7b",
  "output": "/data/table_ratio_splits/out",
  "manifest": "/data/table_ratio_splits/out/manifest.json",
  "records": 60,
  "bytes": 6410,
  "shards": 2,
  "bad_records": {},
  "dead_letter_files": [],
  "error_budget": {
    "max_bad_fraction": 0.01,
    "bad": 0,
    "inputs": 60,
    "bad_fraction": 0.0,
    "exceeded": false
  },
  "verification_failures": [],
  "shards_outside_band": [],
  "removed_stale_shards": [],
  "splits": {
    "test": {
      "records": 11,
      "shards": 1,
      "bytes": 1174,
      "seconds": 0.001
    },
    "train": {
      "records": 49,
      "shards": 1,
      "bytes": 5236,
      "seconds": 0.001
    }
  },
  "rows": {
    "in": 60,
    "written": 60,
    "dead_lettered": 0,
    "blank_skipped": 0,
    "lines": {
      "in": 61,
      "accounted_for": 61
    },
    "multiline_rows": {
      "rows": 0,
      "largest_span": 0,
      "first": []
    },
    "accounted": true
  },
  "manifest_sha256": "fcf2c10032a5f00fc80621e8344b47371738b9a1c1c4ac71a57a49cae4fe57d3",
  "removed_parts": []
}
""",
)

_RUN_ID = "20261126T105152Z-0c952f0b"


def _report(**fields) -> RunReport:
    """A commit's report with every key the old dict code could write, as it built it."""
    values = dict(
        status=Status.OK, run_id=_RUN_ID, output="/data/out-é", manifest="/data/out-é/manifest.json",
        records=32, bytes=382597, shards=8, bad_records={"corrupt_jpeg": 1, "empty_file": 1},
        dead_letter_files=("dead_letter/test-00002-of-00004.jsonl",),
        error_budget=ErrorBudget(0.5, 2, 34), verification_failures=(),
        shards_outside_band=("train-00001-of-00004.tfrecord",),
        removed_stale_shards=("train-00000-of-00009.tfrecord",),
        splits={"train": {"records": 32, "shards": 8, "bytes": 382597, "seconds": 0.005}},
        dropped_columns=("note", "späť"), late_columns={"späť": "data.csv:7"},
        image_bytes={"converted_to_png": {"cmyk_jpeg": 2}, "kept": {"png_16_bit": 1}},
        skipped={"by_reason": {"symlink_outside": 1}, "file": "skipped.jsonl"},
        duplicates_dropped=3, duplicates={"groups": 2, "images": 5, "across_splits": 1, "within_split": 1},
        rows={"in": 34, "written": 32, "dead_lettered": 2, "blank_skipped": 0,
              "lines": {"in": 35, "accounted_for": 35},
              "multiline_rows": {"rows": 0, "largest_span": 0, "first": []}, "accounted": True},
        update={"action": "part", "part": "part-00001"}, part="part-00001",
        drift={"status": "passed", "message": "no drift"},
        manifest_sha256="4128aad0ae715be4d0f474281a1a9f1ddfbd67672c32b7f32e3c8e6525c130a7",
        removed_parts=("part-00000",), manifest_json={"not": "written"})
    values.update(fields)
    return RunReport(**values)


def test_a_report_is_written_byte_for_byte_as_the_dict_code_wrote_it():
    assert _report().to_bytes() == _REPORT_OK.encode("utf-8")
    # Keys absent from a report are left out; the status a failing step sets is in its place.
    clash = RunReport(**{f.name: getattr(_report(), f.name) for f in dataclasses.fields(RunReport)
                         if f.name in ("run_id", "output", "manifest", "records", "bytes", "shards",
                                       "bad_records", "dead_letter_files", "error_budget",
                                       "verification_failures", "shards_outside_band",
                                       "removed_stale_shards", "splits")},
                      status=Status.SPLIT_NAME_CLASH, split_name_clash=({"Train": 3, "train": 29},))
    assert clash.to_bytes() == _REPORT_CLASH.encode("utf-8")
    # The launcher's reports: a failed run's (written by the launcher), a skipped run's.
    failed = RunReport(Status.FAILED, "/data/out-é", None, run_id=_RUN_ID,
                       error="OSError: [Errno 28] No space left")
    assert json.dumps(failed.to_dict(), indent=2).encode() == _REPORT_FAILED.encode()
    skipped = RunReport(Status.SKIPPED, "/data/out", "/data/out/manifest.json", reason="nothing new",
                        update={"action": "skip"})
    assert json.dumps(skipped.to_dict(), indent=2) == _REPORT_SKIPPED


@pytest.mark.parametrize("text", [*_REAL_REPORTS, _REPORT_OK, _REPORT_CLASH])
def test_a_report_read_and_written_again_keeps_its_bytes(text):
    data = text.encode("utf-8")
    report = RunReport.from_json(data)
    assert report.to_bytes() == data
    assert report.status == json.loads(text)["status"] and isinstance(report.status, Status)


def test_a_report_reads_by_attribute():
    report = RunReport.from_json(_REPORT_FAILED)
    assert (report.status, report.run_id, report.manifest, report.records) == (
        Status.FAILED, _RUN_ID, None, None)
    assert json.dumps(report.to_dict(), indent=2) == _REPORT_FAILED
    report = RunReport.from_json(_REAL_REPORTS[0])
    assert report.ok and report.error_budget == ErrorBudget(0.5, 2, 34)
    assert report.dead_letter_files == ("dead_letter/test-00002-of-00004.jsonl",
                                        "dead_letter/train-00003-of-00004.jsonl")
    assert f"{report.status}" == str(report.status) == "ok"
    # A key this version does not know is kept, last; the in-memory manifest is never written.
    newer = RunReport.from_dict({**json.loads(_REPORT_FAILED), "later": [1]})
    assert newer.extra == (("later", [1]),) and newer.to_dict()["later"] == [1]
    assert "manifest_json" not in _report().to_dict()
    with pytest.raises(ValueError, match="status"):
        RunReport.from_dict({"records": 3})
    failed = RunReport(Status.VERIFICATION_FAILED, "/out", records=0,
                       verification_failures=(Failure("/out/a", "CRC"),))
    assert failed.failure_line() == "the run published nothing (verification_failed) in /out: /out/a: CRC"


# decide_status: each condition, and for every two that can hold together, the one that wins.
_PRIORITY = (
    (dict(split_name_clash=True), Status.SPLIT_NAME_CLASH),
    (dict(rows_accounted=False), Status.ACCOUNTING_FAILED),
    (dict(verification_failed=True), Status.VERIFICATION_FAILED),
    (dict(records=0), Status.NO_RECORDS),
    (dict(budget_exceeded=True), Status.ERROR_BUDGET_EXCEEDED),
    (dict(leakage=True), Status.LEAKAGE_FOUND),
    (dict(drift_failed=True), Status.DRIFT_FOUND),
)


def test_decide_status_takes_each_status_in_its_priority_order():
    asked = []

    def taken() -> bool:
        asked.append(True)
        return True

    assert decide_status(StatusFacts()) == Status.OK
    assert decide_status(StatusFacts(), taken) == Status.OUTPUT_EXISTS and asked == [True]
    for facts, status in _PRIORITY:
        asked.clear()
        assert decide_status(StatusFacts(**facts), taken) == status
        assert asked == []  # The output is read only when nothing else decided.
    for (first, status), (second, _) in itertools.combinations(_PRIORITY, 2):
        assert decide_status(StatusFacts(**first, **second), taken) == status, (first, second)
    every = {key: value for facts, _ in _PRIORITY for key, value in facts.items()}
    assert decide_status(StatusFacts(**every), taken) == Status.SPLIT_NAME_CLASH


def _shard(target: ShardTarget, split: str, index: int, data: bytes, **fields) -> ShardResult:
    """A shard written at its temporary name and verified (as ``VerifyShards`` records it)."""
    name = f"{split}-{index:05d}-of-00001.tfrecord"
    temp = target.temp_path(name)
    os.makedirs(os.path.dirname(temp), exist_ok=True)
    with open(temp, "wb") as f:
        f.write(data)
    crc = google_crc32c.Checksum()
    crc.update(data)
    return ShardResult(split, index, 1, target.final_path(name), 3, len(data), crc.hexdigest().decode(),
                       hashlib.sha256(data).hexdigest(), len(data), verified=True, temp_path=temp,
                       verified_as=stored_object(temp), **fields)


def _summary(root: str, **fields) -> InputSummary:
    return InputSummary(root=root, layout="class_folders", input_files=7, input_bytes=700,
                        ignored_files=0, vocabulary=("a", "b"), **fields)


def test_summarize_run_counts_the_shards_and_the_listing(tmp_path):
    target = ShardTarget(str(tmp_path / "out"), run_id="r1")
    train = _shard(target, "train", 0, b"t" * 40, bad_counts=(("corrupt_jpeg", 1),),
                   dead_letter_path="dead_letter/train-00000-of-00001.jsonl")
    test = dataclasses.replace(_shard(target, "test", 0, b"s" * 20), verified=False, verify_error="CRC")
    settings = CommitSettings(target, ShardBand(1, 1 << 20), 0.1, dropped_columns=("x",),
                              update=json.dumps({"action": "part"}), part="part-00001")
    run = summarize_run(settings, [train, test], _summary(str(tmp_path / "in"), bad_counts=(("empty_file", 1),)))
    report = run.report
    assert (report.status, report.records, report.bytes, report.shards) == (Status.OK, 6, 60, 2)
    assert report.bad_records == {"corrupt_jpeg": 1, "empty_file": 1}
    assert report.error_budget == ErrorBudget(0.1, 2, 8) and report.error_budget.exceeded
    assert report.verification_failures == (Failure(test.path, "CRC"),)
    assert report.dead_letter_files == ("dead_letter/train-00000-of-00001.jsonl",)
    assert (report.dropped_columns, report.update, report.part) == (("x",), {"action": "part"}, "part-00001")
    assert report.rows is None and report.duplicates is None and report.manifest is None
    assert [r.split for r in run.results] == ["test", "train"]
    assert run.facts == StatusFacts(verification_failed=True, records=6, budget_exceeded=True)
    assert decide_status(run.facts) == Status.VERIFICATION_FAILED


def test_publish_run_moves_the_shards_and_writes_the_manifest(tmp_path):
    target = ShardTarget(str(tmp_path / "out"), run_id="r2")
    shards = [_shard(target, "train", 0, b"t" * 40), _shard(target, "test", 0, b"s" * 20)]
    settings = CommitSettings(target, ShardBand(1, 1 << 20), 0.0)
    run = summarize_run(settings, shards, _summary(str(tmp_path / "in")))
    assert decide_status(run.facts) == Status.OK
    report = publish_run(settings, run)
    manifest_path = os.path.join(target.output, "manifest.json")
    with open(manifest_path, "rb") as f:
        manifest_bytes = f.read()
    assert report.status == Status.OK and report.manifest == manifest_path
    assert report.manifest_sha256 == hashlib.sha256(manifest_bytes).hexdigest()
    assert report.manifest_json == json.loads(manifest_bytes)
    assert {name: info["records"] for name, info in report.manifest_json["splits"].items()} == {
        "test": 3, "train": 3}
    for shard in shards:  # At its final name, byte for byte as verified.
        with open(shard.path, "rb") as f:
            assert len(f.read()) == shard.bytes
        assert not os.path.exists(shard.temp_path)
    assert report.removed_parts == () and report.removed_stale_shards == ()
