"""Hashing on workers (issue 19): ``--drop_duplicates`` and ``--split_by content``
hash the images in the pipeline (``transforms.image_contents.HashImages``), never
on the launcher; the dataset is the one the launcher's hashing made, and a file
that cannot be read to hash is a dead letter the error budget counts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from beam_tfrecords.preflight import plan_run
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.image_steps import drop_listing, list_images
from tests.conftest import dead_letters, load_manifest, read_dataset, sha256_file
from tests.harness.attack_table import cli_env

SPLITS = (("train", 0.7), ("val", 0.3))
HASHING = ["--drop_duplicates", "--splits", "train=0.7,val=0.3", "--split_by", "content"]
VANISHES = "c1/vanishes.png"

# Every file the interpreter opens while ``_OPENED`` is a list (an audit hook cannot be
# removed: it is added once and records only while a test asks).
_OPENED: list | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_audit)


def _opened_during(call):
    """``call()``'s result and the real paths of the files it opened."""
    global _OPENED  # pylint: disable=global-statement
    _OPENED = []
    try:
        result = call()
        return result, list(_OPENED)
    finally:
        _OPENED = None


@pytest.fixture
def copies(tmp_path) -> Path:
    """24 images in 3 classes, 5 copies of some under other names (across classes),
    and one more image holding bytes of its own (``VANISHES``)."""
    root = tmp_path / "in"
    for i in range(24):
        (root / f"c{i % 3}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (6, 4), (i * 9, 7, 200 - i)).save(root / f"c{i % 3}" / f"img{i:02d}.png")
    for i in range(5):
        shutil.copy(root / f"c{i % 3}" / f"img{i:02d}.png", root / f"c{(i + 1) % 3}" / f"copy{i}.png")
    Image.new("RGB", (6, 4), (1, 2, 3)).save(root / VANISHES)
    return root


@pytest.mark.unit
def test_the_launcher_opens_no_image_when_the_workers_hash_them(copies, tmp_path):
    images = {os.path.realpath(p) for p in copies.rglob("*.png")}
    config = ConvertConfig(input=str(copies), output=str(tmp_path / "out"), drop_duplicates=True,
                           splits=SPLITS, split_by="content")
    plan, opened = _opened_during(lambda: plan_run(config))
    drop_listing(plan.listing)
    assert not images & set(opened), sorted(images & set(opened))
    assert plan.contents_on_workers
    # The same watch sees the launcher's hashing (still used with --incremental): every image.
    _, opened = _opened_during(lambda: list_images(str(copies), splits=SPLITS, split_by="content",
                                                   drop_duplicates=True))
    assert images <= set(opened)


def _run_deleting_at_listing(tmp_path: Path, root: Path, out: Path, doomed: Path) -> int:
    """The real CLI, held where the pipeline's listing step starts (the launcher has
    listed and planned); ``doomed`` is deleted there, then the run goes on."""
    hold = tmp_path / "hold"
    hold.mkdir()
    env = cli_env(BEAM_TFRECORDS_HOLD_AT="listing", BEAM_TFRECORDS_HOLD_DIR=str(hold),
                  BEAM_TFRECORDS_TEST_HOOKS="1")
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", str(root),
                             "--output", str(out), *HASHING, "--max_bad_fraction", "0.1"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (hold / "listing").exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"no hold (exit {proc.returncode})"
            time.sleep(0.05)
        doomed.unlink()
        (hold / "listing").unlink()
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.e2e
def test_workers_hashing_makes_the_launchers_dataset_and_dead_letters_a_vanished_file(copies, tmp_path):
    out = tmp_path / "out"
    assert _run_deleting_at_listing(tmp_path, copies, out, copies / VANISHES) == 0
    # What the launcher's hashing makes of the files left: the same records in the same
    # splits, the same copies dropped, the same inputs.jsonl.
    expected = list_images(str(copies), splits=SPLITS, split_by="content", drop_duplicates=True)
    assert len(expected.duplicates_dropped) == 5
    by_split: dict[str, list] = {}
    for ref in expected.refs:
        by_split.setdefault(ref.split, []).append(ref.filename)
    written: dict[str, list] = {}
    for shard, records in read_dataset(str(out)).items():
        written.setdefault(shard.split("-")[0], []).extend(r["image/filename"][0].decode() for r in records)
    assert {s: sorted(n) for s, n in written.items()} == {s: sorted(n) for s, n in by_split.items()}
    manifest = load_manifest(str(out))
    assert manifest["input"]["duplicates_dropped"] == [
        {"filename": name, "split": split, "copy_of": kept} for name, split, kept in expected.duplicates_dropped]
    with open(out / "inputs.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert [(e["path"], e["sha256"]) for e in lines] == sorted(
        (ref.filename, sha256_file(str(copies / ref.filename))) for ref in expected.refs)
    assert manifest["input"]["files_list"]["files"] == len(expected.refs)
    # The file deleted after the launcher listed it: one dead letter, counted by the budget.
    (letter,) = dead_letters(str(out))
    assert (letter["source"], letter["stage"], letter["error"]) == (VANISHES, "read", "read_error")
    assert manifest["error_budget"]["bad"] == 1
    assert manifest["bad_records"]["by_reason"] == {"read_error": 1}
    assert manifest["bad_records"]["dead_letter_files"] == ["dead_letter/contents.jsonl"]
