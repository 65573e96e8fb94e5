"""Issue 19: the commit step survives retries (a runner runs a step at least once).

One real conversion is planned, its output taken (lock, temporaries) and its
pipeline run in this process up to the commit step, whose inputs (settings, shard
results, summary) are kept instead of committed. The output folder as it was then
is saved, and, for each case, put back (its shards' ``verified_as`` read again:
a copy has new inodes) into one of three states: a fresh folder; an older dataset
there whose shards have other names (another size band); an older dataset whose
shards have the same names and other bytes (other inputs).

Then ``commit_run`` runs, is stopped by a crash (an exception no handler catches,
raised at a hold point: before the first move, before each move, half way, after
the last, after the manifest, before the report, after it, after the temporaries
went, and, where a new shard takes an old one's name, after each old file is kept
aside) and runs again, as the runner would. At the crash, a reader trusting
``manifest.json`` finds the old dataset whole or the new one whole (or, only where
new shards replace files of the old one under their names, no manifest at all,
and the old dataset whole kept: its manifest byte for byte and each file it lists,
with its SHA-256, at its name or in ``tmp-<run>/previous/``; a person who moves
those back as the README says gets a folder that ``verify`` passes); after the
retry the folder holds exactly what an undisturbed commit publishes: the same
shards, ``inputs.jsonl`` and report, and the manifest the first attempt staged,
byte for byte; no lock, temporaries (nothing kept aside) or journal are left, and
``verify`` passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import io
import json
import os
import shutil
import types

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.pipeline import build_pipeline, convert
from beam_tfrecords.preflight import plan_run, take_output
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import ShardSpec
from beam_tfrecords.schemas.report import RunReport, Status
from beam_tfrecords.schemas.shards import WORK_DIR, ShardTarget, shard_name
from beam_tfrecords.transforms import commit_step
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_metadata
from beam_tfrecords.transforms.commit_step import RunFailed, commit_run
from beam_tfrecords.transforms.io import commit, commit_moves
from beam_tfrecords.transforms.io.commit import (
    KEPT_ASIDE,
    publish,
    remove_run_folder,
    remove_stale_temporaries,
    stored_object,
)
from beam_tfrecords.transforms.io.ownership import claim_output
from beam_tfrecords.transforms.shard_engine import FramedRecords, verify_shard, write_shard

pytestmark = pytest.mark.beam

BIG_BAND = {"shard_min_mb": 1.0, "shard_max_mb": 2.0}  # One shard a split.
SMALL_BAND = {"shard_min_mb": 0.01, "shard_max_mb": 0.02}  # Several a split.
STATES = {  # What a reader may find at a crash, by the output's state before the commit.
    "fresh": {"none", "new"},
    "other-names": {"old", "new"},
    "same-names": {"old", "kept", "new"},  # kept: no manifest, the old dataset whole aside.
}
AFTER_PUBLISHING = ("manifest_published", "before_report", "report_written", "temporaries_removed")


class Crash(BaseException):
    """A crash at a hold point: nothing of the step catches it (it is no ``Exception``)."""


@dataclasses.dataclass
class Captured:
    out: str
    settings: commit_step.CommitSettings
    results: list
    summary: object
    variants: dict[str, str]  # state name -> a saved copy of the output folder
    old: dict[str, bytes]  # state name -> the old manifest's bytes
    gathered: object = None  # What the gathering step gave the commit (its files in the folder).
    parts: list = dataclasses.field(default_factory=list)  # What the gathering step sent the commit.


def _config(root: str, out: str, **band) -> ConvertConfig:
    return ConvertConfig(input=root, output=out, encode_processes=0, overwrite=True, **band)


def _copy_dataset(dataset: str, into: str) -> bytes:
    """Puts a published dataset's files (not its report) into ``into``; returns its manifest."""
    for name in os.listdir(dataset):
        if name != WORK_DIR and name != "run_report.json":
            src = os.path.join(dataset, name)
            (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, os.path.join(into, name))
    with open(os.path.join(dataset, "manifest.json"), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Captured:
    base = tmp_path_factory.mktemp("retry")
    root, other_root = str(base / "in"), str(base / "in-other")
    make_class_folder_sample(root, per_class=3, size_range=(24, 48), seed=1)
    make_class_folder_sample(other_root, per_class=3, size_range=(24, 48), seed=2)
    out = str(base / "out")
    plan = plan_run(_config(root, out, **BIG_BAND), PipelineOptions([]))
    take_output(plan)
    kept = {}

    def keep(settings, results, summary, gathered=None):
        # The gathering step's inputs.jsonl stays in the temporary folder, saved with it.
        kept.update(settings=settings, results=list(results), summary=summary, gathered=gathered)
        return RunReport(status=Status.OK, output=out)  # Nothing committed: the folder stays as the commit finds it.

    real_join = commit_step.join_gathered

    def join(parts, *args):
        parts = list(parts)
        kept.update(parts=parts)  # What the gathering step sent, to send it again.
        return real_join(parts, *args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(commit_step, "commit_run", keep)
        patch.setattr(commit_step, "join_gathered", join)
        build_pipeline(plan).run().wait_until_finish()
    assert len(kept["results"]) == 3 and all(r.verified for r in kept["results"])
    variants, old = {"fresh": str(base / "fresh")}, {}
    shutil.copytree(out, variants["fresh"], symlinks=True)
    for state, source, band in (("other-names", root, SMALL_BAND), ("same-names", other_root, BIG_BAND)):
        dataset = str(base / f"old-{state}")
        assert convert(_config(source, dataset, **band)).ok
        variants[state] = str(base / state)
        shutil.copytree(out, variants[state], symlinks=True)
        old[state] = _copy_dataset(dataset, variants[state])
    return Captured(out, kept["settings"], kept["results"], kept["summary"], variants, old, kept["gathered"], kept["parts"])


def _restore(cap: Captured, state: str) -> list:
    """The output folder as the commit found it, in ``state``; the shard results, each
    verified as its file there now."""
    shutil.rmtree(cap.out, ignore_errors=True)
    shutil.copytree(cap.variants[state], cap.out, symlinks=True)
    return [dataclasses.replace(r, verified_as=stored_object(r.temp_path),
                                index_verified_as=stored_object(r.index_path) if r.index_path else None)
            for r in cap.results]


@contextlib.contextmanager
def crash_at(point: str, nth: int = 1):
    """Raises ``Crash`` the ``nth`` time the commit step reaches ``point`` (a hold point
    of ``transforms.io.faults``, stubbed in the three modules of the step: the commit
    step, the commit's protocol and its moves)."""
    seen = []

    def hold(name: str) -> None:
        if name == point:
            seen.append(name)
            if len(seen) == nth:
                raise Crash(f"{point} #{nth}")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(commit, "hold_point", hold)
        patch.setattr(commit_moves, "hold_point", hold)
        patch.setattr(commit_step, "hold_point", hold)
        yield seen


class _Later(datetime.datetime):
    """A clock a year ahead."""

    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.now(tz) + datetime.timedelta(days=365)


@contextlib.contextmanager
def _later():
    """The commit step's clock, a year ahead (a retry runs later than its first attempt)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(commit_step, "datetime", types.SimpleNamespace(datetime=_Later,
                                                                   timezone=datetime.timezone))
        yield


def _sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _files(out: str) -> dict[str, bytes]:
    """Every file of the output, by relative path (the work folder included)."""
    found = {}
    for folder, _, names in os.walk(out):
        for name in names:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, out)] = f.read()
    return found


def _published(out: str) -> dict:
    """What a reader of the dataset gets, ``created`` and the report's manifest digest
    (which depends on it) left out."""
    found = _files(out)
    manifest = json.loads(found.pop("manifest.json"))
    manifest.pop("created")
    report = json.loads(found.pop("run_report.json"))
    report.pop("manifest_sha256")
    return {"files": {k: hashlib.sha256(v).hexdigest() for k, v in found.items()},
            "manifest": manifest, "report": report}


def _whole(out: str, manifest: dict) -> bool:
    """Whether every file the manifest lists with a checksum holds those bytes."""
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            path = os.path.join(out, shard["path"])
            if not os.path.exists(path) or _sha(path) != shard["sha256"]:
                return False
    listing = manifest["input"].get("files_list")
    return not listing or _sha(os.path.join(out, listing["path"])) == listing["sha256"]


def _kept_whole(out: str, temp_dir: str, old: bytes) -> bool:
    """Whether the old dataset can be put back whole: its manifest, byte for byte, at
    ``manifest.json`` or kept aside, and every file it lists with a checksum, with that
    checksum, at its final name or kept aside under the same relative name."""
    aside = os.path.join(temp_dir, KEPT_ASIDE)
    manifest = json.loads(old)
    listed = [(s["path"], s["sha256"]) for split in manifest["splits"].values() for s in split["shards"]]
    if manifest["input"].get("files_list"):
        listed.append((manifest["input"]["files_list"]["path"], manifest["input"]["files_list"]["sha256"]))
    return any(os.path.exists(p) and _sha(p) == hashlib.sha256(old).hexdigest()
               for p in (os.path.join(out, "manifest.json"), os.path.join(aside, "manifest.json"))) and all(
        any(os.path.exists(p) and _sha(p) == sha for p in (os.path.join(out, rel), os.path.join(aside, rel)))
        for rel, sha in listed)


def _restored_by_hand(out: str, temp_dir: str, into: str) -> str:
    """A copy of ``out`` where a person put back what was kept aside, as the README says
    (every file under ``previous/`` moved to the same name in the output folder)."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(out, into, symlinks=True)
    aside = os.path.join(into, os.path.relpath(temp_dir, out), KEPT_ASIDE)
    for folder, _, names in os.walk(aside):
        for name in names:
            kept = os.path.join(folder, name)
            os.replace(kept, os.path.join(into, os.path.relpath(kept, aside)))
    return into


def _state(out: str, old: bytes | None, new: dict, temp_dir: str = "") -> str:
    """``none``, ``kept`` (no manifest; the old dataset whole, partly kept aside),
    ``old`` or ``new`` (whole), or ``broken``: what a reader finds."""
    path = os.path.join(out, "manifest.json")
    if not os.path.exists(path):
        return "kept" if old is not None and temp_dir and _kept_whole(out, temp_dir, old) else "none"
    with open(path, "rb") as f:
        data = f.read()
    manifest = json.loads(data)
    if data == old:
        return "old" if _whole(out, manifest) else "broken"
    same = {k: v for k, v in manifest.items() if k != "created"} == new
    return "new" if same and _whole(out, manifest) else "broken"


def _verifies(out: str) -> bool:
    with contextlib.redirect_stdout(io.StringIO()):
        return cli_main(["verify", out]) == 0


def _points(moves: int, kept: int) -> list[tuple[str, int]]:
    return [("before_commit", 1), *(("rename", n) for n in range(1, moves + 1)),
            *(("kept_aside", n) for n in range(1, kept + 1)), ("mid_commit", 1),
            ("manifest_staged", 1), *((point, 1) for point in AFTER_PUBLISHING)]


@pytest.mark.parametrize("state", sorted(STATES))
def test_a_commit_crashed_anywhere_then_run_again_publishes_the_undisturbed_dataset(captured, state):
    cap = captured
    with crash_at("kept_aside", nth=-1) as kept:  # Never crashes: counts the files kept aside.
        undisturbed = commit_run(cap.settings, _restore(cap, state), cap.summary, cap.gathered)
    assert undisturbed.status == "ok"
    reference = _published(cap.out)
    # Where new shards take the old ones' names, each of those and inputs.jsonl is kept, each
    # index file of other bytes than the old one of its name, and the old TFDS metadata the new
    # one changes (issue 22).
    old_indexes = {s["path"]: s["index"]["sha256"] for info in json.loads(cap.old.get(state) or b"{}").get(
        "splits", {}).values() for s in info["shards"]}
    other_indexes = sum(old_indexes.get(r.path.rsplit("/", 1)[1], r.index_sha256) != r.index_sha256
                        for r in cap.results)
    old_tfds = tfds_metadata(json.loads(cap.old[state])) if state == "same-names" else {}
    changed = sum(old_tfds.get(n) not in (None, d) for n, d in tfds_metadata(reference["manifest"]).items())
    assert len(kept) == (len(cap.results) + 1 + other_indexes + changed if state == "same-names" else 0), kept
    new = reference["manifest"]
    moves = 2 * len(cap.results) + 1  # The shards, their index files and inputs.jsonl.
    temp_dir = cap.settings.target.temp_dir
    staged_path = os.path.join(temp_dir, "manifest.json")
    for point, nth in _points(moves, len(kept)):
        where = f"{state}, crashed at {point} #{nth}"
        results = _restore(cap, state)
        with crash_at(point, nth) as seen, pytest.raises(Crash):
            commit_run(cap.settings, results, cap.summary, cap.gathered)
        assert len(seen) == nth, where
        # At the crash: the old dataset whole, or the new one (or, where new shards take
        # the old ones' names, no manifest, with the old one in the journal).
        found = _state(cap.out, cap.old.get(state), new, temp_dir)
        assert found in STATES[state], f"{where}: {found}"
        assert (found == "new") is (point in AFTER_PUBLISHING), f"{where}: {found}"
        if point == "before_commit" and state != "fresh":
            assert found == "old", where
        if state == "other-names":
            assert found == ("new" if point in AFTER_PUBLISHING else "old"), where
        if found == "kept":  # A person puts the old dataset back by hand: it verifies.
            journal = os.path.join(cap.out, WORK_DIR, "journal")
            [record] = [n for n in os.listdir(journal) if n.startswith("commit-")]
            with open(os.path.join(journal, record), "rb") as f:
                assert json.dumps(json.load(f)["replaces"]) == json.dumps(json.loads(cap.old[state])), where
            put_back = _restored_by_hand(cap.out, temp_dir, cap.out + "-by-hand")
            assert _state(put_back, cap.old[state], new) == "old" and _verifies(put_back), where
            # A launcher ending the run here (no retry) keeps the temporary folder; the
            # next run (with or without --overwrite) finds nothing foreign, and removes it.
            assert remove_run_folder(cap.out, temp_dir) and os.path.isdir(temp_dir), where
            next_run = shutil.copytree(cap.out, cap.out + "-next", symlinks=True, dirs_exist_ok=True)
            assert claim_output(next_run).refusal() == "", where
            assert remove_stale_temporaries(next_run, "next") and not os.path.exists(
                os.path.join(next_run, WORK_DIR, os.path.basename(temp_dir))), where
            shutil.rmtree(next_run)
        staged = None
        if os.path.exists(staged_path):
            with open(staged_path, "rb") as f:
                staged = f.read()
        # Run again, as the runner retries the step: later (another created time).
        with _later():
            report = commit_run(cap.settings, results, cap.summary, cap.gathered)
        assert report.status == "ok", f"{where}: {report}"
        assert _published(cap.out) == reference, where
        if staged is not None:  # The retry published what the first attempt staged.
            with open(os.path.join(cap.out, "manifest.json"), "rb") as f:
                assert f.read() == staged, where
        assert not os.path.exists(os.path.join(cap.out, WORK_DIR)), f"{where}: {_files(cap.out).keys()}"
        assert _verifies(cap.out), where


def test_a_commit_run_twice_changes_nothing_the_second_time(captured):
    cap = captured
    results = _restore(cap, "same-names")
    first = commit_run(cap.settings, results, cap.summary, cap.gathered)
    published = _files(cap.out)
    with _later():
        second = commit_run(cap.settings, results, cap.summary, cap.gathered)
    assert first.status == "ok" and second.to_bytes() == first.to_bytes()
    assert _files(cap.out) == published  # Byte for byte: manifest, shards, report.
    # The commit step itself retried (its temporary folder and the gathered files gone
    # with the run): it finds the report, yields it, and the job ends done.
    group = [("result", r) for r in results] + [("summary", cap.summary)] + cap.parts
    assert any(kind == "piece" for kind, _ in cap.parts)
    with beam.Pipeline() as p:
        reports = p | beam.Create([(None, group)]) | beam.ParDo(commit_step._CommitFn(cap.settings))
        assert_that(reports | beam.Map(lambda report: str(report.status)), equal_to(["ok"]))
    assert _files(cap.out) == published
    assert _verifies(cap.out)


def test_a_retried_commit_that_published_keeps_the_dataset_without_the_report_guard(captured):
    """Past the publication, a retry that does not find the report (crashed before it)
    goes through every step again: it leaves the published manifest alone (never
    removing it first) and publishes nothing else."""
    cap = captured
    results = _restore(cap, "other-names")
    with crash_at("before_report"), pytest.raises(Crash):
        commit_run(cap.settings, results, cap.summary, cap.gathered)
    manifest = os.path.join(cap.out, "manifest.json")
    before = os.stat(manifest)
    with crash_at("report_written"), pytest.raises(Crash):
        commit_run(cap.settings, results, cap.summary, cap.gathered)
    after = os.stat(manifest)
    assert (before.st_ino, before.st_mtime_ns) == (after.st_ino, after.st_mtime_ns)  # Not rewritten.
    assert commit_run(cap.settings, results, cap.summary, cap.gathered).status == "ok"
    assert _verifies(cap.out)


def test_a_failed_commit_raises_after_its_report_and_a_retry_raises_again(captured, tmp_path):
    """The job must end failed: the commit step raises once its report is written; a
    retry finds that report and raises again, touching nothing."""
    cap = captured
    results = _restore(cap, "other-names")
    bad = [dataclasses.replace(results[0], verified=False, verify_error="a test's failure"), *results[1:]]

    def run_commit_step() -> None:
        with beam.Pipeline() as p:
            summary = p | "Summary" >> beam.Create([cap.summary])
            _ = p | beam.Create(bad) | commit_step.Commit(cap.settings, summary)

    def retry_commit_step() -> None:
        """What a runner retries: the commit step's bundle, its group as it came (the
        steps before it are done; the temporary folder is gone with the failed run)."""
        group = [("result", r) for r in bad] + [("summary", cap.summary)] + cap.parts
        with beam.Pipeline() as p:
            _ = p | beam.Create([(None, group)]) | beam.ParDo(commit_step._CommitFn(cap.settings))

    with pytest.raises(RunFailed, match=r"published nothing \(verification_failed\)"):
        run_commit_step()
    with open(os.path.join(cap.out, "run_report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert report["status"] == "verification_failed" and report["run_id"] == cap.settings.target.run_id
    published = _files(cap.out)
    with pytest.raises(RunFailed, match=r"published nothing \(verification_failed\)"):
        retry_commit_step()  # The retry: the same report, nothing touched, failed again.
    assert _files(cap.out) == published
    assert _state(cap.out, cap.old["other-names"], {}) == "old"  # The old dataset, untouched.


def test_each_attempt_writes_its_own_temporary_file_and_the_commit_moves_the_verified_one(tmp_path):
    """Two attempts at one shard (a retry, or a worker that lost its lease): each writes
    a file of its own; the verified one is published even after the other attempt,
    still running, writes its file again."""
    out = str(tmp_path / "out")
    target = ShardTarget(out, run_id="attempts")
    spec = ShardSpec("train", 0, 1, shard_name("train", 0, 1, "none"), 64, (b"record one", b"record two"))
    lost, kept = (write_shard(spec, target, FramedRecords()) for _ in range(2))
    assert lost.temp_path != kept.temp_path
    for result in (lost, kept):
        folder, name = os.path.split(result.temp_path)
        assert folder == target.temp_dir and name.startswith(spec.name + ".")
    assert verify_shard(kept.temp_path, "none")[1] == ""
    kept = dataclasses.replace(kept, verified=True, verified_as=stored_object(kept.temp_path),
                               index_verified_as=stored_object(kept.index_path))
    with open(kept.temp_path, "rb") as f:
        verified_bytes = f.read()
    late = ShardSpec(spec.split, 0, 1, spec.name, 64, (b"late bytes",))
    with open(lost.temp_path, "wb") as f:  # The lost attempt writes on, to its own name.
        f.write(FramedRecords().chunks(late).__next__().framed)
    publish(out, target.temp_dir, [(kept.temp_path, kept.path)], b"{}\n", {kept.temp_path: kept.verified_as})
    with open(kept.path, "rb") as f:
        assert f.read() == verified_bytes
    assert os.path.exists(lost.temp_path)  # Left for the temporary folder's removal.
