"""Issue 18, "the output folder is ours only where we can prove it", through the real CLI.

Every end-to-end test runs ``python -m beam_tfrecords convert`` as a subprocess
(``tests.harness.attack_table.cli``) and checks the exit status, the first line the user
reads, every file of the output before and after (SHA-256, or a link's target:
what must be kept is byte-identical) and the records counted from the shards at
final names. Covered: a foreign shard-named file and a user's ``part-00001/``
(refused, exit 2, with and without ``--overwrite``), an unrelated file (left
alone, listed in the plan), re-runs over our own failed run and over a commit
killed half way (cleaned and replaced, a foreign file beside them still
refused), links where our folders go (refused, targets intact) and inside a part
folder we remove (unlinked, target intact), ``$TMPDIR`` empty after every kind
of run, and an input named with ``[`` and a control character.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_tfrecords.console import EscapingStream, printable
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.codec.tfrecord import frame_record, iter_records
from beam_tfrecords.transforms.io.commit import remove_folder
from beam_tfrecords.transforms.io.dead_letters import safe_name
from beam_tfrecords.transforms.io.ownership import claim_output, write_owned
from tests.conftest import load_manifest, read_dataset
from tests.harness.attack_table import TRACEBACK, cli, cli_env
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

PER_CLASS = 5  # Four classes: 20 images.
IMAGES = 4 * PER_CLASS
BAND = ("--shard_min_mb", "0.01", "--shard_max_mb", "0.02")  # Several shards of 20 small images.
QUIET = ("--progress", "off")
FOREIGN_RECORDS = 3


# --- helpers ------------------------------------------------------------------------


def tree(folder: str) -> dict[str, str]:
    """Every entry under ``folder``, links not followed: file -> SHA-256, link ->
    '-> target', empty folder -> '/'."""
    found: dict[str, str] = {}
    for root, dirs, names in os.walk(folder):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder)
            if os.path.islink(path):
                found[rel] = "-> " + os.readlink(path)
            else:
                with open(path, "rb") as f:
                    found[rel] = hashlib.sha256(f.read()).hexdigest()
        if not names and not dirs and root != folder:
            found[os.path.relpath(root, folder) + "/"] = "/"
    return found


def shard_records(out: str) -> int:
    """Records in the TFRecord files at the output's top, counted from their framing."""
    count = 0
    for name in sorted(os.listdir(out)):
        if ".tfrecord" in name and not name.endswith(".idx") and os.path.isfile(os.path.join(out, name)):
            with open(os.path.join(out, name), "rb") as f:
                data = f.read()
            count += sum(1 for _ in iter_records(io.BytesIO(gzip.decompress(data) if name.endswith(".gz") else data)))
    return count


def example_records(out: str) -> int:
    """Records at the output's top that parse as tf.train.Example (ours do)."""
    return sum(len(records) for records in read_dataset(out).values())


def every_image_once(out: str, root: str) -> None:
    """Each image under ``root`` is one record at a final name, found by its name; the
    manifest counts them and README.txt as the one file ignored (the attack table's
    accounting, tests/harness/attack_table.py ``account_files``)."""
    names = sorted(os.path.relpath(os.path.join(folder, name), root) for folder, _, files in os.walk(root)
                   for name in files if name != "README.txt")
    records = [r for rs in read_dataset(out).values() for r in rs]
    assert sorted(r["image/filename"][0].decode() for r in records) == names
    manifest = load_manifest(out)
    assert sum(s["records"] for s in manifest["splits"].values()) == len(records)
    assert manifest["input"]["ignored_files"] == 1


def clean(run) -> None:
    """No traceback, and stderr holds only log records and the one-line verdict (the
    attack table's rule for every run, tests/harness/attack_table.py ``Case.run``)."""
    assert TRACEBACK not in run.stdout + run.stderr, run.stderr[-3000:]
    assert not run.stray_stderr, run.stray_stderr


def foreign_shard(path: Path) -> bytes:
    """A TFRecord file another tool wrote, with a shard-like name."""
    data = b"".join(frame_record(f"another tool's record {i}".encode()) for i in range(FOREIGN_RECORDS))
    path.write_bytes(data)
    return data


def convert(work: Path, src: str, out: str, *flags: str, env: dict | None = None):
    return cli(work, "convert", "--input", src, "--output", out, *BAND, *QUIET, *flags, env=env)


@pytest.fixture
def images(tmp_path) -> str:
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=PER_CLASS, splits=None, size_range=(40, 80))
    return root


def _not_ours_line(run, *names: str) -> None:
    assert run.exit == 2, run.stdout + run.stderr
    assert run.message.startswith("beam-tfrecords convert: error: --output "), run.message
    assert "cannot prove it wrote" in run.message and "with or without --overwrite" in run.message
    for name in names:
        assert name in run.message, run.message
    verdicts = [line for line in run.stderr.splitlines() if line.startswith("beam-tfrecords ")]
    assert verdicts == [run.message]
    clean(run)


# --- foreign files: refused before the run, kept byte for byte ------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_a_foreign_shard_named_file_is_refused_and_kept(tmp_path, images, overwrite):
    out = tmp_path / "out"
    out.mkdir()
    foreign_shard(out / "train-00000-of-00003.tfrecord")
    before = tree(str(out))
    run = convert(tmp_path, images, str(out), *overwrite)
    _not_ours_line(run, "train-00000-of-00003.tfrecord", "holds 1 file ")
    assert tree(str(out)) == before  # Byte-identical; no lock, no journal, no report.
    assert shard_records(str(out)) == FOREIGN_RECORDS


@pytest.mark.e2e
@pytest.mark.parametrize("overwrite", [(), ("--overwrite",)], ids=["plain", "overwrite"])
def test_a_users_part_folder_is_refused_and_kept(tmp_path, images, overwrite):
    out = tmp_path / "out"
    (out / "part-00001").mkdir(parents=True)
    (out / "part-00001" / "results.csv").write_text("epoch,loss\n1,0.5\n")
    foreign_shard(out / "part-00001" / "eval.tfrecord")
    before = tree(str(out))
    run = convert(tmp_path, images, str(out), *overwrite)
    _not_ours_line(run, "part-00001/", "holds 1 folder ")
    assert tree(str(out)) == before


@pytest.mark.e2e
def test_a_user_file_at_one_of_our_fixed_names_is_refused(tmp_path, images):
    """run_report.json, inputs.jsonl and dead_letter/*.jsonl that the product cannot
    prove it wrote: the first few named, and the count."""
    out = tmp_path / "out"
    (out / "dead_letter").mkdir(parents=True)
    (out / "run_report.json").write_text('{"mine": true}\n')
    (out / "inputs.jsonl").write_text('{"path": "x"}\n')
    for i in range(6):
        (out / "dead_letter" / f"notes-{i}.jsonl").write_text("{}\n")
    before = tree(str(out))
    run = convert(tmp_path, images, str(out), "--overwrite")
    _not_ours_line(run, "holds 8 files", "dead_letter/notes-0.jsonl", "(8 in all)")
    assert tree(str(out)) == before


@pytest.mark.e2e
def test_an_unrelated_file_is_left_alone_and_listed_in_the_plan(tmp_path, images):
    out = tmp_path / "out"
    (out / "docs").mkdir(parents=True)
    (out / "notes.txt").write_text("what this dataset is for\n")
    (out / "docs" / "card.md").write_text("# card\n")
    kept = {k: v for k, v in tree(str(out)).items()}
    run = convert(tmp_path, images, str(out))
    assert run.exit == 0 and run.message == "status: ok", run.stdout + run.stderr
    clean(run)
    plan = run.stdout.split("status: ", 1)[0]
    assert "  output: left alone (not part of the dataset): docs/, notes.txt" in plan.splitlines()
    after = tree(str(out))
    assert {k: after.get(k) for k in kept} == kept
    every_image_once(str(out), images)
    again = convert(tmp_path, images, str(out), "--overwrite", "--shard_max_mb", "1")
    assert again.exit == 0, again.stdout + again.stderr
    after = tree(str(out))
    assert {k: after.get(k) for k in kept} == kept and example_records(str(out)) == IMAGES
    assert not os.path.exists(out / WORK_DIR)


# --- our own leftovers: cleaned and replaced -----------------------------------------


def _add_copies(root: str) -> None:
    """Every image once more, under a new name (new inputs for an incremental run)."""
    for folder in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, folder)):
            for name in sorted(os.listdir(os.path.join(root, folder))):
                with open(os.path.join(root, folder, name), "rb") as f:
                    data = f.read()
                with open(os.path.join(root, folder, "copy_" + name), "wb") as f:
                    f.write(data)


def _break(root: str, count: int) -> None:
    for i in range(count):
        Path(root, "circles", f"broken_{i}.jpg").write_bytes(b"not a picture\n")


@pytest.mark.e2e
def test_a_rerun_cleans_our_failed_runs_leftovers(tmp_path, images):
    out = str(tmp_path / "out")
    _break(images, 3)
    failed = convert(tmp_path, images, out, "--max_bad_fraction", "0")
    assert failed.exit == 1 and failed.message.startswith("ERROR BUDGET EXCEEDED"), failed.stdout
    left = tree(out)
    letters = sorted(k for k in left if k.startswith("dead_letter/"))
    assert letters and "run_report.json" in left and shard_records(out) == 0
    assert sorted(os.listdir(os.path.join(out, WORK_DIR))) == ["journal"]
    for name in os.listdir(images + "/circles"):
        if name.startswith("broken_"):
            os.remove(os.path.join(images, "circles", name))
    fixed = convert(tmp_path, images, out)  # No --overwrite: nothing was published.
    assert fixed.exit == 0 and fixed.message == "status: ok", fixed.stdout + fixed.stderr
    clean(failed)
    clean(fixed)
    assert "unfinished run of this product left (proved by its journal or its run report): dead_letter/" in fixed.stdout
    after = tree(out)
    assert not [k for k in after if k.startswith(("dead_letter/", WORK_DIR))]
    assert after["run_report.json"] != left["run_report.json"]
    every_image_once(out, images)


def _earlier_version_failed(out: Path, output_named: str) -> None:
    """What a failed run of a version before the journal left: its report (no
    ``manifest_sha256``, no manifest) and the dead-letter file it lists."""
    (out / "dead_letter").mkdir(parents=True)
    (out / "dead_letter" / "train-00000-of-00001.jsonl").write_text(
        json.dumps({"source": "circles/broken_0.jpg", "stage": "read", "error": "not_an_image",
                    "message": "the file seems to be text"}) + "\n")
    (out / "run_report.json").write_text(json.dumps({
        "status": "error_budget_exceeded", "output": output_named, "manifest": None, "records": 0,
        "dead_letter_files": ["dead_letter/train-00000-of-00001.jsonl"]}, indent=2) + "\n")


@pytest.mark.e2e
def test_a_rerun_after_an_upgrade_cleans_an_earlier_versions_failed_run(tmp_path, images):
    """A failed run of a version before the journal left no journal: its report, naming
    this folder and no manifest, vouches for itself and the dead letters it lists."""
    out = tmp_path / "out"
    _earlier_version_failed(out, str(out))
    run = convert(tmp_path, images, str(out))
    assert run.exit == 0 and run.message == "status: ok", run.stdout + run.stderr
    assert "left (proved by its journal or its run report): dead_letter/train-00000-of-00001.jsonl, " \
           "run_report.json" in run.stdout
    assert not (out / "dead_letter").exists()  # No bad input this time: the old letter is gone.
    assert json.loads((out / "run_report.json").read_text())["status"] == "ok"
    assert example_records(str(out)) == IMAGES


@pytest.mark.e2e
def test_a_report_naming_another_folder_vouches_for_nothing(tmp_path, images):
    out = tmp_path / "out"
    _earlier_version_failed(out, str(tmp_path / "elsewhere"))
    before = tree(str(out))
    run = convert(tmp_path, images, str(out), "--overwrite")
    _not_ours_line(run, "dead_letter/train-00000-of-00001.jsonl", "run_report.json", "holds 2 files ")
    assert tree(str(out)) == before


def _hold(tmp_path: Path, point: str, argv: list[str]) -> subprocess.Popen:
    hold_dir = tmp_path / f"hold-{point}"
    hold_dir.mkdir()
    env = cli_env(BEAM_TFRECORDS_HOLD_AT=point, BEAM_TFRECORDS_HOLD_DIR=str(hold_dir),
                  BEAM_TFRECORDS_TEST_HOOKS="1")
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (hold_dir / point).exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the run did not reach {point} (exit {proc.returncode})")
        time.sleep(0.05)
    return proc


@pytest.mark.e2e
def test_a_commit_killed_half_way_is_ours_and_a_foreign_file_beside_it_is_not(tmp_path, images):
    out = str(tmp_path / "out")
    first = convert(tmp_path, images, out, "--shard_min_mb", "1", "--shard_max_mb", "2")
    assert first.exit == 0, first.stdout + first.stderr
    old = {k for k in tree(out) if ".tfrecord" in k}
    proc = _hold(tmp_path, "mid_commit", ["convert", "--input", images, "--output", out, *BAND,
                                          *QUIET, "--overwrite"])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # Some new shards at final names beside the old ones, under other names, so the old
    # manifest still stands (issue 19: it goes only before a move that replaces a file it
    # lists); the journal records the new ones (size and checksums) and the manifest
    # they replace.
    journal = os.path.join(out, WORK_DIR, "journal")
    [commit] = [n for n in os.listdir(journal) if n.startswith("commit-")]
    with open(os.path.join(journal, commit), encoding="utf-8") as f:
        recorded = json.load(f)
    assert recorded["replaces"]["splits"]["train"]["shards"]
    assert json.loads(Path(out, "manifest.json").read_text()) == recorded["replaces"]
    claims = {c["path"]: c for c in recorded["claims"]}
    assert all(c["crc32c"] and c["sha256"] and c["size"] > 0 for p, c in claims.items() if ".tfrecord" in p)
    now = tree(out)
    moved = {k for k in now if ".tfrecord" in k and k not in old and "/" not in k}
    assert moved and moved <= set(claims)
    for name in moved:
        assert now[name] == claims[name]["sha256"]
    # A foreign file dropped beside the leftovers: refused, naming it alone.
    foreign_shard(Path(out) / "extra-00000-of-00001.tfrecord")
    before = tree(out)
    refused = convert(tmp_path, images, out, "--overwrite")
    _not_ours_line(refused, "extra-00000-of-00001.tfrecord", "holds 1 file ")
    assert tree(out) == before  # Ours and theirs, byte for byte (the refusal took no lock).
    os.remove(os.path.join(out, "extra-00000-of-00001.tfrecord"))
    # Without it, the next run replaces and removes ours.
    done = convert(tmp_path, images, out, "--overwrite")
    assert done.exit == 0 and done.message == "status: ok", done.stdout + done.stderr
    listed = json.loads(Path(out, "manifest.json").read_text())["splits"]["train"]["shards"]
    manifest_shards = {s["path"] for s in listed} | {s["index"]["path"] for s in listed}  # Index files too.
    assert {k for k in tree(out) if ".tfrecord" in k} == manifest_shards
    assert example_records(out) == IMAGES and not os.path.exists(os.path.join(out, WORK_DIR))


@pytest.mark.e2e
def test_a_part_folder_journalled_before_it_was_created_is_removed_by_the_next_run(tmp_path, images):
    """An incremental run killed between publishing its part and listing it: the
    part folder (no manifest lists it) is proved ours by the journal."""
    out = str(tmp_path / "out")
    assert convert(tmp_path, images, out).exit == 0
    _add_copies(images)
    proc = _hold(tmp_path, "before_register", ["convert", "--input", images, "--output", out,
                                               *BAND, *QUIET, "--incremental"])
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert os.path.exists(os.path.join(out, "part-00001", "manifest.json"))
    assert "parts" not in json.loads(Path(out, "manifest.json").read_text())
    assert claim_output(out).leftovers == ("part-00001/",)
    done = convert(tmp_path, images, out, "--incremental")
    assert done.exit == 0, done.stdout + done.stderr
    assert [p["path"] for p in json.loads(Path(out, "manifest.json").read_text())["parts"]] == ["part-00001"]
    assert example_records(out) + example_records(os.path.join(out, "part-00001")) == 2 * IMAGES


# --- links: never deleted through -----------------------------------------------------


def _target(tmp_path: Path) -> Path:
    target = tmp_path / "precious"
    (target / "sub").mkdir(parents=True)
    (target / "a.bin").write_bytes(os.urandom(1000))
    (target / "sub" / "b.txt").write_text("keep me\n")
    foreign_shard(target / "train-00000-of-00001.tfrecord")
    return target


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["part-00007", f"{WORK_DIR}/tmp-x", "dead_letter"])
def test_a_link_where_our_folder_goes_is_refused_and_its_target_kept(tmp_path, images, where):
    out = tmp_path / "out"
    assert convert(tmp_path, images, str(out)).exit == 0  # A dataset, replaced with --overwrite.
    target = _target(tmp_path)
    kept = tree(str(target))
    (out / where).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, out / where)
    before = tree(str(out))
    run = convert(tmp_path, images, str(out), "--overwrite")
    assert run.exit == 2, run.stdout + run.stderr
    assert run.message == (f"beam-tfrecords convert: error: --output {out}: {where} is a symbolic "
                           "link where this product keeps a folder of its own, and a cleanup would "
                           "delete through it; remove the link (what it points to is not touched), "
                           "or choose another --output")
    assert tree(str(target)) == kept and tree(str(out)) == before
    clean(run)
    every_image_once(str(out), images)


@pytest.mark.e2e
def test_a_link_inside_a_part_folder_we_remove_is_unlinked_not_followed(tmp_path, images):
    """A full run removes the dataset's parts; a link a user put inside one is
    removed itself, and the folder it points to keeps every byte."""
    out = tmp_path / "out"
    assert convert(tmp_path, images, str(out)).exit == 0
    _add_copies(images)
    assert convert(tmp_path, images, str(out), "--incremental").exit == 0
    target = _target(tmp_path)
    kept = tree(str(target))
    os.symlink(target, out / "part-00001" / "linked")
    os.symlink(target / "a.bin", out / "part-00001" / "file-link")
    run = convert(tmp_path, images, str(out), "--overwrite")
    assert run.exit == 0 and run.message == "status: ok", run.stdout + run.stderr
    assert not os.path.lexists(out / "part-00001")
    assert tree(str(target)) == kept
    assert example_records(str(out)) == 2 * IMAGES


@pytest.mark.unit
def test_remove_folder_unlinks_links_and_never_enters_them(tmp_path):
    target = _target(tmp_path)
    kept = tree(str(target))
    folder = tmp_path / "out" / "part-00003"
    (folder / "deep").mkdir(parents=True)
    (folder / "deep" / "x").write_text("ours\n")
    os.symlink(target, folder / "deep" / "to-folder")
    os.symlink(target / "a.bin", folder / "to-file")
    remove_folder(str(folder))
    assert not os.path.lexists(folder) and tree(str(target)) == kept
    link = tmp_path / "out" / "part-00004"
    os.symlink(target, link)
    remove_folder(str(link))  # A folder that is a link: the link goes, never what it holds.
    assert not os.path.lexists(link) and tree(str(target)) == kept


# --- temporary folders ---------------------------------------------------------------


@pytest.mark.e2e
def test_tmpdir_is_empty_after_ok_failed_and_refused_runs(tmp_path, images):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    env = cli_env(TMPDIR=str(tmp))
    out = str(tmp_path / "out")
    ok = convert(tmp_path, images, out, env=env)
    assert ok.exit == 0 and os.listdir(tmp) == [], os.listdir(tmp)
    refused = convert(tmp_path, images, out, env=env)  # A dataset is there: no --overwrite.
    assert refused.exit == 2 and "already holds a dataset" in refused.message
    assert os.listdir(tmp) == []
    _break(images, 2)
    failed = convert(tmp_path, images, out, "--overwrite", "--max_bad_fraction", "0", env=env)
    assert failed.exit == 1 and os.listdir(tmp) == [], os.listdir(tmp)
    assert failed.message.startswith("ERROR BUDGET EXCEEDED:"), failed.message
    clean(failed)
    assert example_records(out) == IMAGES  # The first dataset stays.
    helpers = convert(tmp_path, images, str(tmp_path / "out2"), "--encode_processes", "2",
                      "--max_bad_fraction", "0.5", env=env)
    assert helpers.exit == 0 and os.listdir(tmp) == [], os.listdir(tmp)


@pytest.mark.e2e
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])
def test_tmpdir_is_empty_after_an_interrupted_run(tmp_path, images, signum, status):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    env = cli_env(TMPDIR=str(tmp), BEAM_TFRECORDS_TEST_HOOKS="1", BEAM_TFRECORDS_HOLD_AT="mid_verify",
                  BEAM_TFRECORDS_HOLD_DIR=str(hold_dir))
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", images,
                             "--output", str(tmp_path / "out"), *BAND, *QUIET], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (hold_dir / "mid_verify").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no hold"
            time.sleep(0.05)
        assert os.listdir(tmp)  # The run's folder, with Beam's inside.
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=30) == status
    finally:
        if proc.poll() is None:
            proc.kill()
    assert os.listdir(tmp) == []


@pytest.mark.e2e
def test_a_folder_left_by_kill_9_is_removed_by_the_next_run(tmp_path, images):
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    left = tmp / f"beam-tfrecords-run-{dead.stdout.strip()}-abcd1234"
    (left / "tmpx").mkdir(parents=True)
    (left / ".beam-tfrecords-scratch").write_text(dead.stdout)
    stranger = tmp / "beam-tfrecords-run-1-notours"  # No marker: not ours to remove.
    stranger.mkdir()
    run = convert(tmp_path, images, str(tmp_path / "out"), env=cli_env(TMPDIR=str(tmp)))
    assert run.exit == 0 and os.listdir(tmp) == [stranger.name]


# --- names from inputs ---------------------------------------------------------------

NASTY = "a[1]\x1b[31mb"  # A glob character and a terminal escape.


@pytest.mark.e2e
def test_an_input_named_with_a_bracket_and_a_control_character(tmp_path):
    src = tmp_path / "tables"
    src.mkdir()
    table = src / f"{NASTY}.csv"
    table.write_text("id,x\n" + "".join(f"{i},{i}\n" if i != 7 else "7,1,2\n" for i in range(50)))
    out = str(tmp_path / "out")
    run = convert(tmp_path, str(src / "*.csv"), out, "--max_bad_fraction", "0.1")
    assert run.exit == 0 and run.message == "status: ok", run.stdout + run.stderr
    name = f"{safe_name(NASTY + '-00000')}.jsonl"
    assert name.startswith("a_1___31mb-00000-") and os.listdir(os.path.join(out, "dead_letter")) == [name]
    assert shard_records(out) == 49
    clean(run)
    # Every row accounted for, by id (row 7, line 9, the one dead letter) and in the summary.
    assert sorted(r["id"][0] for rs in read_dataset(out).values() for r in rs) == [i for i in range(50) if i != 7]
    [letter] = [json.loads(line) for line in Path(out, "dead_letter", name).read_text().splitlines()]
    assert letter["source"].endswith(".csv:9"), letter["source"]
    assert "rows: 50 in = 49 written + 1 dead-lettered (0 blank skipped); lines: 51 in the files, " \
           "51 accounted for" in run.stdout.splitlines(), run.stdout
    # Nothing raw reaches the terminal: the escape is printed as text.
    assert "\x1b" not in run.stdout + run.stderr
    assert "a[1]\\x1b[31mb.csv" in run.stdout
    # A failed re-run leaves the published dead letters as they are and puts its own
    # beside them; a fixed one removes both (literal paths).
    published = Path(out, "dead_letter", name).read_bytes()
    failed = convert(tmp_path, str(src / "*.csv"), out, "--overwrite", "--max_bad_fraction", "0")
    assert failed.exit == 1 and Path(out, "dead_letter", name).read_bytes() == published
    [own] = set(os.listdir(os.path.join(out, "dead_letter"))) - {name}
    assert own.startswith(name.removesuffix(".jsonl") + ".run-"), own
    table.write_text("id,x\n" + "".join(f"{i},{i}\n" for i in range(50)))
    fixed = convert(tmp_path, str(src / "*.csv"), out, "--overwrite")
    assert fixed.exit == 0, fixed.stdout + fixed.stderr
    assert not os.path.exists(os.path.join(out, "dead_letter")) or os.listdir(
        os.path.join(out, "dead_letter")) == []
    assert shard_records(out) == 50


# --- units ---------------------------------------------------------------------------


@pytest.mark.unit
def test_safe_names_keep_safe_ones_and_tell_escaped_ones_apart():
    assert safe_name("train-00003-of-00010") == "train-00003-of-00010"
    assert safe_name("my_table.v2-00001") == "my_table.v2-00001"
    escaped = {safe_name(n) for n in ("a[1]-00000", "a]1[-00000", "a 1 -00000", "a_1_-00000")}
    assert len(escaped) == 4
    for name in escaped:
        assert name.isprintable() and not set(name) & set("[]*?/\\ \x1b")
    assert not safe_name(".hidden").startswith(".")
    assert len(safe_name("x" * 500)) < 140


@pytest.mark.unit
def test_printable_escapes_what_a_terminal_would_act_on():
    assert printable("plain café 猫\nnext") == "plain café 猫\nnext"
    assert printable("a\x1b[2Jb\rc\x07") == "a\\x1b[2Jb\\x0dc\\x07"
    assert printable("evil\u202etxt.exe") == "evil\\u202etxt.exe"
    assert printable("undecodable \udcff") == "undecodable \\udcff"
    sink = []

    class Sink:
        def write(self, text):
            sink.append(text)

    assert EscapingStream(Sink()).write("x\x1by\n") == 4 and sink == ["x\\x1by\n"]


@pytest.mark.unit
def test_claims_sort_an_output(tmp_path):
    out = tmp_path / "out"
    (out / "dead_letter").mkdir(parents=True)
    (out / "part-00002").mkdir()
    (out / "notes.txt").write_text("x")
    foreign_shard(out / "val-00000-of-00001.tfrecord")
    (out / "dead_letter" / "readme.md").write_text("x")
    write_owned(str(out), "dead_letter/listing.jsonl", b'{"a": 1}\n')  # Journalled: ours.
    (out / "dead_letter" / "theirs.jsonl").write_text("{}\n")
    claims = claim_output(str(out))
    assert claims.owned == ("dead_letter/listing.jsonl",)
    assert claims.leftovers == ("dead_letter/listing.jsonl",)
    assert claims.foreign == ("dead_letter/theirs.jsonl", "part-00002/", "val-00000-of-00001.tfrecord")
    assert claims.unrelated == ("dead_letter/readme.md", "notes.txt")
    # Proof is by content: the same name with other bytes is not ours.
    (out / "dead_letter" / "listing.jsonl").write_text('{"a": 2}\n')
    assert "dead_letter/listing.jsonl" in claim_output(str(out)).foreign


# --- gs:// (the emulator on loopback; the CLI in this process) ----------------------


@pytest.mark.emulator
def test_on_gcs_foreign_objects_are_refused_and_our_leftovers_replaced(gcs, tmp_path, capsys, images):
    from beam_tfrecords.cli import main  # pylint: disable=import-outside-toplevel

    gcs.create_bucket("harm")
    out = "gs://harm/out"
    foreign = b"".join(frame_record(b"another tool's") for _ in range(2))
    for name in ("train-00000-of-00003.tfrecord", "part-00001/eval.tfrecord", "notes.txt"):
        gcs.upload_bytes(f"{out}/{name}", foreign)
    flags = ["convert", "--input", images, "--output", out, *BAND, *QUIET]
    assert main([*flags, "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "holds 2 files and folders this product cannot prove it wrote" in err
    assert "part-00001/, train-00000-of-00003.tfrecord" in err
    assert sorted(gcs.list(out + "/")) == sorted(f"{out}/{n}" for n in (
        "train-00000-of-00003.tfrecord", "part-00001/eval.tfrecord", "notes.txt"))
    assert all(gcs.download(p) == foreign for p in gcs.list(out + "/"))
    gcs.delete(f"{out}/train-00000-of-00003.tfrecord")
    gcs.delete(f"{out}/part-00001/eval.tfrecord")
    # A failed run: its report and dead letters are recorded in the journal ...
    _break(images, 3)
    assert main([*flags, "--max_bad_fraction", "0"]) == 1
    printed = capsys.readouterr().out
    assert "left alone (not part of the dataset): notes.txt" in printed
    journal = [p for p in gcs.list(out + "/") if "/.beam-tfrecords/" in p]
    assert journal and all("/.beam-tfrecords/journal/" in p for p in journal)
    # ... so the next run replaces them, and leaves notes.txt as it is.
    for name in os.listdir(os.path.join(images, "circles")):
        if name.startswith("broken_"):
            os.remove(os.path.join(images, "circles", name))
    assert main(flags) == 0
    left = sorted(p[len(out) + 1:] for p in gcs.list(out + "/"))
    assert not [p for p in left if p.startswith(("dead_letter/", WORK_DIR))], left
    assert gcs.download(f"{out}/notes.txt") == foreign
    report = json.loads(gcs.download(f"{out}/run_report.json"))
    assert report["status"] == "ok"
    assert report["manifest_sha256"] == hashlib.sha256(gcs.download(f"{out}/manifest.json")).hexdigest()
    assert main([*flags, "--overwrite"]) == 0  # Our own dataset: replaced.
