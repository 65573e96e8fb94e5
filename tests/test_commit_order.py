"""The order of the commit, watched from outside at its hold points.

A rerun with ``--overwrite`` into a finished dataset: until the commit starts, the
old dataset stays whole (its manifest verifies), and, when the new shards replace no
file the old manifest lists, until the new manifest replaces it; shards of the old
run that the new one does not rewrite are removed only after the new manifest is
published.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from tests.conftest import load_manifest, sha256_file

pytestmark = pytest.mark.e2e

OLD_BAND = ["--shard_min_mb", "0.3", "--shard_max_mb", "0.6"]
NEW_BAND = ["--shard_min_mb", "0.15", "--shard_max_mb", "0.3"]


def _shard_names(out: str) -> set[str]:
    return {n for n in os.listdir(out) if ".tfrecord" in n and not n.endswith(".idx")}


def _hold(root: str, out: str, point: str, hold_dir: str, *flags: str) -> subprocess.Popen:
    """Starts a convert that stops at ``point``; returns once it is there."""
    env = {**os.environ, "BEAM_TFRECORDS_HOLD_AT": point, "BEAM_TFRECORDS_HOLD_DIR": hold_dir,
           "BEAM_TFRECORDS_TEST_HOOKS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", root,
                             "--output", out, *flags], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(hold_dir, point)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the run did not reach {point} (exit {proc.returncode})")
        time.sleep(0.05)
    return proc


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture()
def old_dataset(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=20, splits=None, size_range=(120, 200), seed=5)
    assert main(["convert", "--input", root, "--output", out, *OLD_BAND]) == 0
    return root, out, _shard_names(out)


def test_the_old_dataset_stays_whole_until_the_commit(old_dataset, tmp_path):
    root, out, old = old_dataset
    proc = _hold(root, out, "before_commit", str(tmp_path), "--overwrite", *NEW_BAND)
    try:
        # Every new shard is written and verified, but only under the work folder.
        assert _shard_names(out) == old
        assert main(["verify", out]) == 0
    finally:
        _kill(proc)


def test_stale_shards_are_removed_only_after_the_new_manifest(old_dataset, tmp_path):
    root, out, old = old_dataset
    proc = _hold(root, out, "manifest_staged", str(tmp_path), "--overwrite", *NEW_BAND)
    try:
        names = _shard_names(out)
        new = {n for n in names if n not in old}
        assert new and len(new) > len(old)  # The new run cuts more, smaller shards.
        assert old <= names  # Not one old shard removed yet.
        # No new shard replaced a file the old manifest lists, so the old manifest stays
        # until the new one replaces it (issue 19): the old dataset is whole.
        listed = load_manifest(out)["splits"]["train"]["shards"]
        assert {s["path"] for s in listed} == old
        assert all(sha256_file(os.path.join(out, s["path"])) == s["sha256"] for s in listed)
        # The manifest the commit replaces is in its journal: the old shards stay provably
        # this product's, so the next run may remove them (issue 18).
        journal = os.path.join(out, ".beam-tfrecords", "journal")
        [commit] = [n for n in os.listdir(journal) if n.startswith("commit-")]
        with open(os.path.join(journal, commit), encoding="utf-8") as f:
            replaced = json.load(f)["replaces"]
        assert {s["path"] for s in replaced["splits"]["train"]["shards"]} == old
    finally:
        _kill(proc)
    # The next run finishes the job (the old dataset still published: with --overwrite).
    assert main(["convert", "--input", root, "--output", out, *NEW_BAND]) == 2
    assert main(["convert", "--input", root, "--output", out, "--overwrite", *NEW_BAND]) == 0
    listed = {s["path"] for s in load_manifest(out)["splits"]["train"]["shards"]}
    assert _shard_names(out) == listed and not (old & listed)
    assert main(["verify", out]) == 0
