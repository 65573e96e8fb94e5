"""Issue 23 (start-up): the launcher walks a local input folder while it imports.

``python -m beam_tfrecords convert --input FOLDER`` forks a walk of the folder
before the CLI and Beam are imported (``folder_walk.walk_early``); the preflight's
listing takes its result only for the same folder and ``--follow_links_outside``,
and it must be exactly what the listing would have walked.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.folder_walk import take_early_walk, walk_early, walk_folder
from tests.harness.attack_table import cli_env

# The CLI as it was before: imported and run with no early walk.
_NO_EARLY_WALK = ("import gc, sys; gc.disable(); from beam_tfrecords.cli import main; "
                  "gc.freeze(); gc.enable(); sys.exit(main())")


def _tree(root: Path) -> Path:
    """An input folder with what the walk notes: a folder link met twice, a link
    outside, a FIFO, a folder named like an image, a name that is not UTF-8."""
    folder = root / "in"
    outside = root / "elsewhere"
    for index, where in enumerate((folder / "cat", folder / "dog.png", outside)):
        where.mkdir(parents=True)
        for n in range(3):
            Image.new("RGB", (4 + n, 4), (index * 60, n * 40, 9)).save(where / f"{n}.png")
    (folder / "cat2").symlink_to(folder / "cat")
    (folder / "outside").symlink_to(outside)
    os.mkfifo(folder / "cat" / "pipe.png")
    (folder / os.fsdecode(b"bad\xff.png")).write_bytes(b"x")
    return folder


@pytest.mark.unit
@pytest.mark.parametrize("follow_outside", [False, True])
def test_early_walk_gives_what_the_walk_gives(tmp_path, follow_outside):
    folder = str(_tree(tmp_path))
    walked_notes: list = []
    walked = list(walk_folder(folder, walked_notes, follow_outside))
    walk_early(folder, follow_outside)
    notes: list = []
    taken = list(files.folder_batches(folder + "/**", notes, follow_outside))
    assert taken == walked and notes == walked_notes
    assert len(walked_notes) >= (3 if follow_outside else 4)  # The walk noted what it passed over.
    assert take_early_walk(folder, follow_outside, []) is None  # Taken once.


@pytest.mark.unit
def test_an_early_walk_of_other_flags_is_dropped_and_reaped(tmp_path):
    folder = str(_tree(tmp_path))
    children_file = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    before = set(children_file.read_text().split())  # Other tests' children (an emulator) are not the walk.
    walk_early(folder, True)
    children = [int(pid) for pid in set(children_file.read_text().split()) - before]
    assert len(children) == 1
    assert take_early_walk(folder, False, []) is None  # Another --follow_links_outside: not used.
    for pid in children:
        with pytest.raises(ChildProcessError):  # Killed and reaped already.
            os.waitpid(pid, os.WNOHANG)


def _shards(out: Path) -> dict[str, str]:
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in out.rglob("*.tfrecord*") if path.is_file()}


@pytest.mark.e2e
def test_cli_lists_the_same_with_the_early_walk(tmp_path):
    folder = _tree(tmp_path)
    runs = {}
    for name, command in (("early", ["-m", "beam_tfrecords"]), ("late", ["-c", _NO_EARLY_WALK])):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, *command, "convert", "--input", str(folder),
                               "--output", str(out), "--max_bad_fraction", "0.5"], env=cli_env(), capture_output=True,
                              text=True, timeout=300, check=False)
        runs[name] = (proc.returncode, _shards(out),
                      sorted(path.relative_to(out).as_posix() for path in out.rglob("*.jsonl")),
                      (out / "dead_letter" / "skipped.jsonl").read_bytes())
    assert runs["early"] == runs["late"]
    assert runs["early"][0] == 0 and runs["early"][1] and b"link_outside_input" in runs["early"][3]


@pytest.mark.e2e
def test_bad_flags_exit_2_with_one_line_and_leave_no_walk(tmp_path):
    folder = _tree(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", str(folder),
                             "--output", str(tmp_path / "out"), "--no_such_flag"], env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--no_such_flag" in err
    with pytest.raises(ProcessLookupError):  # Nothing of the run's process group is left.
        os.killpg(proc.pid, 0)
