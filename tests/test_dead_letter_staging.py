"""Dead letters are staged with the shards: a failed run leaves the published ones alone.

Every run writes its dead letters in its temporary folder
(``OUT/.beam-tfrecords/tmp-<run>/dead_letter/``); only the commit moves them to
``OUT/dead_letter/``, journalled and kept aside like the shards. Through the real
CLI: (a) a failed ``--overwrite`` run (error budget exceeded) leaves the published
dataset's dead-letter file byte-identical, and ``verify`` checks the dead-letter
files its manifest lists; (b) a run killed inside its commit (every file moved,
the manifest not yet published) keeps the old dead-letter file aside, and the next
run publishes a dataset whose manifest and dead letters agree; and on ``gs://``
(the emulator, the commit step in this process) a failed run and a commit crashed
while keeping the old files aside, or before its manifest, then retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from PIL import Image

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.schemas.elements import DeadLetter, InputSummary, ShardSpec
from beam_tfrecords.schemas.shards import ShardBand, ShardTarget, shard_name
from beam_tfrecords.transforms.commit_step import CommitSettings, commit_run
from beam_tfrecords.transforms.io.commit import acquire_lock, stored_object
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.shard_engine import FramedRecords, write_shard
from tests.harness.attack_table import cli, cli_env
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)
from tests.test_dataflow_commit_retry import Crash, crash_at

LETTERS = "dead_letter/train-00000-of-00001.jsonl"
HOLD_TIMEOUT = 120.0  # A small run reaches its commit in well under this.


def _images(root: Path, bad: int) -> None:
    """20 small PNGs in ``cat/`` and ``dog/``, and ``bad`` JPEG names holding random bytes."""
    for folder, blue in (("cat", 100), ("dog", 200)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(10):
            Image.new("RGB", (8, 8), (i * 20, 50, blue)).save(root / folder / f"{i}.png")
    for i in range(bad):
        (root / "cat" / f"bad{i}.jpg").write_bytes(hashlib.sha256(b"%d" % i).digest() * 8)


def _published(out: Path) -> dict[str, str]:
    """SHA-256 of every file of the dataset but the run report and the work folder."""
    found = {}
    for path in sorted(out.rglob("*")):
        relative = path.relative_to(out).as_posix()
        if path.is_file() and not relative.startswith(".beam-tfrecords/") and relative != "run_report.json":
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _lines(path: Path) -> int:
    return len(path.read_bytes().splitlines())


def _convert(work: Path, inp: Path, out: Path, *flags: str):
    return cli(work, "convert", "--input", str(inp), "--output", str(out), "--max_bad_fraction", "0.1",
               *flags)


@pytest.mark.e2e
def test_failed_overwrite_keeps_the_published_dead_letters_and_verify_checks_them(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    _images(inp, bad=1)
    assert _convert(tmp_path, inp, out).exit == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bad_records"]["dead_letter_files"] == [LETTERS]
    assert manifest["bad_records"]["total"] == _lines(out / LETTERS) == 1
    before = _published(out)

    _images(inp, bad=7)  # 7 of 27 inputs bad: over the 10 % budget.
    failed = _convert(tmp_path, inp, out, "--overwrite")
    assert failed.exit == 1, failed.stdout + failed.stderr
    assert "ERROR BUDGET EXCEEDED" in failed.stdout
    # The published dataset, its dead letters with it, is byte for byte what it was.
    after = _published(out)
    kept = {name: digest for name, digest in after.items() if name in before}
    assert kept == before
    # The failed run's 7 letters are there to read, beside it, under a name of their own.
    [extra] = sorted(set(after) - set(before))
    assert extra.startswith("dead_letter/train-00000-of-00001.run-") and extra.endswith(".jsonl")
    assert _lines(out / extra) == 7
    assert f"dead letter: {out / extra}" in failed.stdout

    good = cli(tmp_path, "verify", str(out))
    assert good.exit == 0, good.stdout

    with open(out / LETTERS, "a", encoding="utf-8") as f:  # A letter planted after publishing.
        f.write('{"source": "cat/planted.jpg", "error": "not_an_image"}\n')
    bad = cli(tmp_path, "verify", str(out))
    assert bad.exit == 1
    [line] = [line for line in bad.stdout.splitlines() if "FAIL" in line]
    assert LETTERS in line and "holds 2 letters" in line and "bad_records.total counts 1" in line


@contextlib.contextmanager
def _held_at(point: str, work: Path, argv: list[str]):
    """A convert started with the test hooks on, once it waits at ``point``; its
    process tree is killed when the block ends, whatever happened."""
    flag = work / "hold" / point
    flag.parent.mkdir()
    env = cli_env(BEAM_TFRECORDS_TEST_HOOKS="1", BEAM_TFRECORDS_HOLD_AT=point,
                  BEAM_TFRECORDS_HOLD_DIR=str(flag.parent))
    with open(work / "held.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", *argv], cwd=work, env=env,
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + HOLD_TIMEOUT
        while not flag.exists():
            assert proc.poll() is None, (work / "held.log").read_text()
            assert time.monotonic() < deadline, (work / "held.log").read_text()
            time.sleep(0.05)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.e2e
def test_a_commit_killed_before_its_manifest_recovers_with_matching_dead_letters(tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    _images(inp, bad=1)
    assert _convert(tmp_path, inp, out).exit == 0
    old_letters = (out / LETTERS).read_bytes()
    old_manifest = (out / "manifest.json").read_bytes()

    _images(inp, bad=2)  # 2 of 22 bad: within the budget; same names, another dead-letter file.
    argv = ["convert", "--input", str(inp), "--output", str(out), "--max_bad_fraction", "0.1",
            "--overwrite"]
    with _held_at("manifest_staged", tmp_path, argv):
        # Every file moved, no manifest published: the new dead letters are at their
        # final name, and the old ones kept aside with the old manifest.
        assert _lines(out / LETTERS) == 2
        assert not (out / "manifest.json").exists()
        [temp] = (out / ".beam-tfrecords").glob("tmp-*")
        assert (temp / "previous" / LETTERS).read_bytes() == old_letters
        assert (temp / "previous" / "manifest.json").read_bytes() == old_manifest
        [record] = (out / ".beam-tfrecords" / "journal").glob("commit-*.json")
        claims = {c["path"]: c for c in json.loads(record.read_text())["claims"]}
        assert claims[LETTERS]["sha256"] == hashlib.sha256((out / LETTERS).read_bytes()).hexdigest()

    # The next run recovers: its manifest and the dead letters it lists agree.
    again = _convert(tmp_path, inp, out)
    assert again.exit == 0, again.stdout + again.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bad_records"]["dead_letter_files"] == [LETTERS]
    assert manifest["bad_records"]["total"] == _lines(out / LETTERS) == 2
    assert sorted(p.name for p in (out / "dead_letter").iterdir()) == [LETTERS.split("/")[1]]
    assert not (out / ".beam-tfrecords").exists()
    assert cli(tmp_path, "verify", str(out)).exit == 0

    # A run without bad inputs removes the dead letters the new manifest does not list.
    for bad in (inp / "cat").glob("bad*.jpg"):
        bad.unlink()
    assert _convert(tmp_path, inp, out, "--overwrite").exit == 0
    assert json.loads((out / "manifest.json").read_text())["bad_records"]["dead_letter_files"] == []
    assert not (out / "dead_letter").exists()


# --- gs:// (gcp-storage-emulator), the commit step in this process ----------------------


def _gcs_run(out: str, letters: int, budget: float):
    """A run's lock taken, one shard written and verified and ``letters`` dead letters
    staged under ``out`` (by the product's writers); what its commit step receives."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    acquire_lock(out, run_id)
    target = ShardTarget(out, "none", run_id)
    records = tuple(f"record {i} ".encode() * 40 for i in range(5))
    spec = ShardSpec("train", 0, 1, shard_name("train", 0, 1, "none"), 1000, records)
    written = write_shard(spec, target, FramedRecords())
    dead = [DeadLetter(f"cat/bad{i}.jpg", "validate", "not_an_image", "random bytes") for i in range(letters)]
    result = dataclasses.replace(
        written, verified=True, verified_as=stored_object(written.temp_path), bad_counts=(("not_an_image", letters),),
        index_verified_as=stored_object(written.index_path),
        dead_letter_path=write_dead_letters(target.temp_dir, "train-00000-of-00001", dead))
    summary = InputSummary(root="", layout="records", input_files=0, input_bytes=0, ignored_files=0,
                           vocabulary=())
    return CommitSettings(target, ShardBand(1, 1 << 20), budget, release_lock=run_id), [result], summary


@pytest.mark.emulator
@pytest.mark.parametrize("end", ["failed", "kept_aside", "manifest_staged"])
def test_on_gcs_the_published_dead_letters_survive_a_failed_run_and_a_crashed_commit(gcs, end):
    gcs.create_bucket("dead-letters")
    out = f"gs://dead-letters/{end}"
    assert commit_run(*_gcs_run(out, 1, 0.5)).status == "ok"
    old = {name: gcs.download(f"{out}/{name}") for name in ("manifest.json", LETTERS)}
    settings, results, summary = _gcs_run(out, 2, 0.5 if end != "failed" else 0.1)
    if end == "failed":  # 2 of 7 bad: over the budget, nothing published.
        report = commit_run(settings, results, summary)
        assert report.status == "error_budget_exceeded"
        assert {name: gcs.download(f"{out}/{name}") for name in old} == old
        [kept] = report.dead_letter_files
        assert kept == f"dead_letter/train-00000-of-00001.run-{settings.target.run_id}.jsonl"
        assert len(gcs.download(f"{out}/{kept}").splitlines()) == 2
    else:
        with crash_at(end) as seen, pytest.raises(Crash):
            commit_run(settings, results, summary)
        assert seen
        aside = f"{settings.target.temp_dir}/previous"
        # The old dead-letter file is at its name or kept aside, byte for byte.
        assert old[LETTERS] in (gcs.download(f"{aside}/{LETTERS}"), gcs.download(f"{out}/{LETTERS}"))
        assert commit_run(settings, results, summary).status == "ok"  # The retry.
        manifest = json.loads(gcs.download(f"{out}/manifest.json"))
        assert manifest["bad_records"]["dead_letter_files"] == [LETTERS]
        assert manifest["bad_records"]["total"] == len(gcs.download(f"{out}/{LETTERS}").splitlines()) == 2
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli_main(["verify", out]) == 0
