"""Dead letters are staged with the shards: a failed run leaves the published ones alone.

Every run writes its dead letters in its temporary folder
(``OUT/.beam-tfrecords/tmp-<run>/dead_letter/``); only the commit moves them to
``OUT/dead_letter/``, journalled and kept aside like the shards. Through the real
CLI: (a) a failed ``--overwrite`` run (error budget exceeded) leaves the published
dataset's dead-letter file byte-identical, and ``verify`` checks the dead-letter
files its manifest lists; (b) a run killed inside its commit (every file moved,
the manifest not yet published) keeps the old dead-letter file aside, and the next
run publishes a dataset whose manifest and dead letters agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from tests.harness.attack_table import cli, cli_env

pytestmark = pytest.mark.e2e

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
