"""Issue 19 on ``gs://`` (gcp-storage-emulator, every request through a ``FaultProxy``
whose log counts them): the commit retried after a crash at each point inside it,
its requests (one listing instead of a metadata request per shard; a copy and a
delete per shard, many at a time), and a shard verified by the CRC-32C GCS reports
instead of a download (``--reread`` off).

The shards are written by the product's own writer (``write_shard``) under their
per-attempt temporary names and proved as the verifier would (``stored_object``);
the commit is ``commit_run``, as the pipeline's last step runs it. "An older dataset"
is one published there first, with three shards; the new one has six (other names):
at every crash the old dataset is whole or the new one is. Where the new one has
three shards too (the same names, other bytes), the old manifest and each shard
replaced are copied to ``tmp-<run>/previous/`` first: at every crash the old
dataset is whole there or at its names.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import uuid
from collections import Counter

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.schemas.elements import InputSummary, ShardSpec
from beam_tfrecords.schemas.shards import WORK_DIR, ShardBand, ShardTarget, shard_name
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_metadata
from beam_tfrecords.transforms.commit_step import CommitSettings, commit_run
from beam_tfrecords.transforms.io import gcs as gcs_io
from beam_tfrecords.transforms.io.commit import KEPT_ASIDE, acquire_lock, stored_object
from beam_tfrecords.transforms.shard_engine import FramedRecords, VerifyShards, write_shard
from tests.harness.fault_proxy import FaultProxy, request_kind
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)
from tests.test_dataflow_commit_retry import Crash, crash_at

pytestmark = pytest.mark.emulator

BUCKET = "gs://commit-retry"
POINTS = (("before_commit", 1), ("rename", 1), ("rename_copied", 1), ("mid_commit", 1),
          ("manifest_staged", 1), ("manifest_published", 1), ("before_report", 1), ("report_written", 1))


@pytest.fixture
def proxy(gcs, monkeypatch):
    """Every GCS call of this process goes through a FaultProxy (its log counts them)."""
    with FaultProxy(gcs.url) as fault_proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        monkeypatch.setattr(gcs_io, "_gcsio", None)
        yield fault_proxy
        gcs_io._gcsio = None  # pylint: disable=protected-access  # Made for the proxy.


def _prepared(out: str, shards: int, tag: str = "") -> tuple[CommitSettings, list, InputSummary]:
    """A run's lock taken and its shards written and verified under ``out`` (records
    told apart by ``tag``); what its commit step receives."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    acquire_lock(out, run_id)
    target = ShardTarget(out, "none", run_id)
    results = []
    for index in range(shards):
        records = tuple(f"record {index}.{i}{tag} ".encode() * 40 for i in range(5))
        spec = ShardSpec("train", index, shards, shard_name("train", index, shards, "none"), 1000, records)
        written = write_shard(spec, target, FramedRecords())
        results.append(dataclasses.replace(written, verified=True,
                                           verified_as=stored_object(written.temp_path),
                                           index_verified_as=stored_object(written.index_path)))
    summary = InputSummary(root="", layout="records", input_files=0, input_bytes=0, ignored_files=0,
                           vocabulary=())
    return CommitSettings(target, ShardBand(1, 1 << 20), 0.0, release_lock=run_id), results, summary


def _read(gcs, path: str) -> bytes | None:
    return gcs.download(path) if gcs.exists(path) else None


def _whole(gcs, out: str, manifest: bytes | None, shards: int) -> bool:
    """Whether ``manifest`` lists ``shards`` shards and every one holds its bytes."""
    if manifest is None:
        return False
    listed = json.loads(manifest)["splits"]["train"]["shards"]
    return len(listed) == shards and all(
        hashlib.sha256(_read(gcs, f"{out}/{s['path']}") or b"").hexdigest() == s["sha256"] for s in listed)


def _verifies(out: str) -> bool:
    with contextlib.redirect_stdout(io.StringIO()):
        return cli_main(["verify", out]) == 0


def test_a_gcs_commit_crashed_anywhere_then_run_again_keeps_one_whole_dataset(gcs):
    gcs.create_bucket(BUCKET[len("gs://"):])
    for point, nth in POINTS:
        out = f"{BUCKET}/{point}-{nth}"
        old_settings, old_results, summary = _prepared(out, 3)
        assert commit_run(old_settings, old_results, summary).status == "ok"
        old = gcs.download(f"{out}/manifest.json")
        settings, results, _ = _prepared(out, 6)
        with crash_at(point, nth) as seen, pytest.raises(Crash):
            commit_run(settings, results, summary)
        assert seen, point
        now = _read(gcs, f"{out}/manifest.json")
        published = point in ("manifest_published", "before_report", "report_written")
        assert _whole(gcs, out, now, 6 if published else 3), point
        assert (now == old) is not published, point  # The old manifest stays until replaced.
        staged = _read(gcs, f"{settings.target.temp_dir}/manifest.json")
        retried = commit_run(settings, results, summary)  # The retry.
        assert retried.status == "ok", (point, retried.verification_failures)
        final = gcs.download(f"{out}/manifest.json")
        assert _whole(gcs, out, final, 6) and final == staged, point
        left = gcs.list(f"{out}/")
        assert not [p for p in left if f"/{WORK_DIR}/" in p], (point, left)
        assert sorted(p.rsplit("/", 1)[1] for p in left) == sorted(
            ["manifest.json", "run_report.json", *(r.path.rsplit("/", 1)[1] for r in results),
             *(r.path.rsplit("/", 1)[1] + ".idx" for r in results),  # Each shard's index too.
             *tfds_metadata(json.loads(final))]), point  # dataset_info.json, ... (issue 22)
        assert _verifies(out), point


def test_a_gcs_commit_lists_once_and_moves_side_by_side(gcs, proxy):
    """Before issue 19 the commit asked for every shard's metadata (a GET each) before
    moving it, and moved shard by shard; now one listing answers for them all, and each
    shard costs its copy and its delete, made many at a time."""
    gcs.create_bucket(BUCKET[len("gs://"):])
    out = f"{BUCKET}/counted"
    shards = 24
    settings, results, summary = _prepared(out, shards)
    proxy.clear_log()
    assert commit_run(settings, results, summary).status == "ok"
    kinds = Counter(request_kind(e.method, e.target) for e in proxy.log)
    print(f"\n[commit of {shards} shards on gs://] requests: {dict(sorted(kinds.items()))}")
    shard_requests = Counter(request_kind(e.method, e.target) for e in proxy.log
                             if e.object_name and ".tfrecord." in e.object_name  # <shard>.<attempt>
                             and not e.object_name.endswith(".idx"))
    assert shard_requests == {"rewrite": shards, "delete": shards}, shard_requests
    tfds_files = len(tfds_metadata(json.loads(gcs.download(f"{out}/manifest.json"))))  # (issue 22)
    assert kinds["rewrite"] == 2 * shards + tfds_files  # Each shard, its index file, the TFDS files.
    assert kinds["batch"] == 0
    assert kinds["list"] <= 8
    assert kinds["delete"] >= shards
    assert _verifies(out)


@pytest.mark.parametrize("reread", [False, True], ids=["crc32c", "reread"])
def test_a_gcs_shard_is_proved_by_its_stored_crc32c_unless_reread_is_asked(gcs, proxy, reread):
    """Without --reread a shard is proved by the CRC-32C and size GCS reports (a damaged
    object fails on them), and nothing is downloaded; with it, the shard is read back."""
    gcs.create_bucket(BUCKET[len("gs://"):])
    out = f"{BUCKET}/verify-{reread}"
    _, results, _ = _prepared(out, 1 if reread else 2)
    shards = [dataclasses.replace(r, verified=False, verified_as=None) for r in results]
    expected = [(0, True, "", True)]
    if not reread:  # The second one damaged in storage: same size, other bytes.
        gcs.overwrite_object(shards[1].temp_path, b"\x00" * shards[1].bytes)
        expected.append((1, False, "GCS reports crc32c", False))
    proxy.clear_log()
    with beam.Pipeline() as p:
        verdicts = (p | beam.Create(shards) | VerifyShards(reread=reread)
                    | beam.Map(lambda r: (r.index, r.verified, r.verify_error[:18],
                                          bool(r.verified_as and r.verified_as.generation))))
        assert_that(verdicts, equal_to(expected))
    downloaded = {e.object_name for e in proxy.log if request_kind(e.method, e.target) == "download"}
    # Re-read: the shard, and its index file (issue 22); else nothing (GCS's crc32c of both).
    assert downloaded == ({results[0].temp_path.split("/", 3)[3], results[0].index_path.split("/", 3)[3]}
                          if reread else set())


SAME_NAMES_POINTS = (("before_commit", 1), ("rename", 1), ("kept_aside", 1), ("rename_copied", 1),
                     ("kept_aside", 3), ("manifest_staged", 1), ("manifest_published", 1))


def _kept_whole(gcs, out: str, temp_dir: str, old: bytes) -> bool:
    """Whether the old dataset's manifest (byte for byte) and every shard it lists (by
    SHA-256) are at their names or kept aside in ``temp_dir/previous/``."""
    aside = f"{temp_dir}/{KEPT_ASIDE}"
    return old in (_read(gcs, f"{out}/manifest.json"), _read(gcs, f"{aside}/manifest.json")) and all(
        s["sha256"] in (hashlib.sha256(_read(gcs, f"{folder}/{s['path']}") or b"").hexdigest()
                        for folder in (out, aside))
        for s in json.loads(old)["splits"]["train"]["shards"])


def test_a_gcs_commit_over_shards_of_the_same_names_keeps_the_old_ones_aside_until_published(gcs, proxy):
    """Undisturbed, each replaced shard costs one request more (its copy aside) and the
    manifest one (its copy aside); crashed anywhere, the old dataset is whole at its
    names or aside, and the retry publishes the new one with nothing kept."""
    gcs.create_bucket(BUCKET[len("gs://"):])
    for point, nth in (("undisturbed", 0), *SAME_NAMES_POINTS):
        out = f"{BUCKET}/same-{point}-{nth}"
        old_settings, old_results, summary = _prepared(out, 3)
        assert commit_run(old_settings, old_results, summary).status == "ok"
        old = gcs.download(f"{out}/manifest.json")
        settings, results, _ = _prepared(out, 3, tag="new")
        assert [r.path for r in results] == [r.path for r in old_results]  # The same names.
        temp_dir = settings.target.temp_dir
        if not nth:
            proxy.clear_log()
            assert commit_run(settings, results, summary).status == "ok"
            kinds = Counter(request_kind(e.method, e.target) for e in proxy.log)
            print(f"\n[commit of 3 shards over 3 of the same names on gs://] requests: "
                  f"{dict(sorted(kinds.items()))}")
            # Each shard and its index file in, each old one aside (their records differ in
            # length, so the index files too), the manifest aside; the TFDS metadata in, and
            # the old one aside where it changes (issue 22).
            new_tfds, old_tfds = (tfds_metadata(json.loads(m)) for m in (gcs.download(f"{out}/manifest.json"), old))
            changed = sum(old_tfds.get(n) not in (None, d) for n, d in new_tfds.items())
            assert kinds["rewrite"] == 4 * 3 + 1 + len(new_tfds) + changed, kinds
        else:
            with crash_at(point, nth) as seen, pytest.raises(Crash):
                commit_run(settings, results, summary)
            assert seen, point
            published = point == "manifest_published"
            now = _read(gcs, f"{out}/manifest.json")
            assert now in ((None, old) if not published else (_read(gcs, f"{temp_dir}/manifest.json"),)), point
            assert _kept_whole(gcs, out, temp_dir, old) if not published else _whole(gcs, out, now, 3), point
            if point == "kept_aside":  # The first shard replaced, at least, is kept aside.
                assert len(gcs.list(f"{temp_dir}/{KEPT_ASIDE}/")) >= 2, point
            assert commit_run(settings, results, summary).status == "ok", point  # The retry.
        assert _whole(gcs, out, gcs.download(f"{out}/manifest.json"), 3), point
        assert not [p for p in gcs.list(f"{out}/") if f"/{WORK_DIR}/" in p], point  # Nothing kept.
        assert _verifies(out), point
