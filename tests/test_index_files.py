"""Index files (issue 22): ``<shard>.idx`` beside every uncompressed shard.

The bytes of an index for known records (derived by hand from the format: one line
``"{offset} {length}\\n"`` per record, ``length`` = data + 16 bytes of framing);
``verify`` failing a flipped byte, a missing and a truncated index with one line
and exit 1; the verification re-read failing a run whose index was changed after it
was written; gzip shards without one (plan, manifest, files); a user's file of an
index's name refused, and an index at a final name after ``kill -9`` mid-commit
proved the run's own by the journal, the next run recovering it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.record_offsets import checkpoints
from beam_tfrecords.transforms.codec.tfrecord import TFRecordWriter, frame_record
from beam_tfrecords.transforms.shard_verification import verify_shard

FLAGS = ("--shard_min_mb", "0.006", "--shard_max_mb", "0.012")
HOLD_TIMEOUT = 60.0
RUN_TIMEOUT = 180.0

# Four records of 0, 1, 300 and 5 data bytes: framed 16, 17, 316 and 21 bytes.
KNOWN_RECORDS = (b"", b"a", b"x" * 300, b"hello")
KNOWN_INDEX = b"0 16\n16 17\n33 316\n349 21\n"


@pytest.mark.unit
def test_the_index_of_known_records_is_the_bytes_the_format_gives():
    shard, index = io.BytesIO(), io.BytesIO()
    built = RecordIndex(index)
    writer = TFRecordWriter(shard, observe=built.feed)
    writer.write(KNOWN_RECORDS[0])
    writer.write_framed(b"".join(frame_record(r) for r in KNOWN_RECORDS[1:]), 3)
    writer.close()
    digest = built.finish()
    assert index.getvalue() == KNOWN_INDEX
    assert (digest.records, digest.bytes, digest.sha256) == (4, 25, hashlib.sha256(KNOWN_INDEX).hexdigest())
    # Fed a byte at a time (every length field cut), the same index.
    again = RecordIndex(io.BytesIO())
    for i in range(len(shard.getvalue())):
        again.feed(shard.getvalue()[i:i + 1])
    assert again.finish() == digest


@pytest.mark.unit
@pytest.mark.parametrize("in_pieces", [False, True], ids=["one-pass", "in-pieces"])
def test_the_re_read_recomputes_the_index_and_refuses_another(tmp_path, in_pieces):
    path, built = str(tmp_path / "s.tfrecord"), RecordIndex()
    with open(path, "wb") as f:
        writer = TFRecordWriter(f, observe=built.feed)
        sizes = [writer.write(b"r" * (i % 97)) for i in range(2000)]
        digest = writer.close()
    index = built.finish()
    boundaries = checkpoints(sizes, every=10_000) if in_pieces else ()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        assert verify_shard(path, "none", digest, boundaries, pool, index) == (digest, "")
        other = dataclasses.replace(index, sha256="0" * 64)  # An index of other lines, same size.
        _, error = verify_shard(path, "none", digest, boundaries, pool, other)
    assert error.startswith(f"the index of the records read back (2000 lines, {index.bytes} bytes, "
                            f"sha256 {index.sha256}) is not the index written"), error


# --- a dataset, and verify --------------------------------------------------------------


def _convert_argv(images: str, out: str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "beam_tfrecords", "convert", "--input", images, "--output", out,
            *FLAGS, *flags]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BEAM_TFRECORDS_HOLD")}
    env.pop("BEAM_TFRECORDS_TEST_HOOKS", None)
    return {**env, **extra}


def _tree(out: str) -> dict[str, str]:
    """sha256 of every file at the output's top."""
    found = {}
    for name in sorted(os.listdir(out)):
        path = os.path.join(out, name)
        if os.path.isfile(path) and name != "run_report.json":
            with open(path, "rb") as f:
                found[name] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``(images, out)``: a small image dataset in several shards, converted undisturbed."""
    base = tmp_path_factory.mktemp("index-files")
    images, out = str(base / "images"), str(base / "out")
    make_class_folder_sample(images, per_class=3, splits=None, seed=5, size_range=(16, 40))
    assert cli_main(["convert", "--input", images, "--output", out, *FLAGS]) == 0
    return images, out


def _verify(out: str, capsys) -> tuple[int, list[str]]:
    capsys.readouterr()
    status = cli_main(["verify", out])
    return status, [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]


@pytest.mark.e2e
@pytest.mark.parametrize("damage, says", [
    ("flip", "line 2 reads"),
    ("missing", "(listed in manifest.json) is missing"),
    ("truncated", "it ends after"),
], ids=["flipped-byte", "missing", "truncated"])
def test_verify_fails_a_damaged_index_in_one_line(reference, tmp_path, capsys, damage, says):
    _, made = reference
    out = str(tmp_path / "out")
    shutil.copytree(made, out)
    assert _verify(out, capsys) == (0, [])
    manifest = json.loads(open(os.path.join(out, "manifest.json"), encoding="utf-8").read())
    shard = max((s for info in manifest["splits"].values() for s in info["shards"]), key=lambda s: s["records"])
    assert shard["records"] >= 2 and shard["index"]["path"] == shard["path"] + ".idx"
    index = os.path.join(out, shard["index"]["path"])
    data = open(index, "rb").read()
    if damage == "flip":  # The first digit of line 2 (the second record's offset).
        start = data.index(b"\n") + 1
        data = data[:start] + bytes([data[start] ^ 0x01]) + data[start + 1:]
    elif damage == "truncated":  # The last line is lost.
        data = data[:data.rindex(b"\n", 0, len(data) - 1) + 1]
    if damage == "missing":
        os.remove(index)
    else:
        with open(index, "wb") as f:
            f.write(data)
    status, failed = _verify(out, capsys)
    assert status == 1
    assert len(failed) == 1 and shard["path"] in failed[0] and says in failed[0], failed
    if damage != "missing":
        assert "is not the one manifest.json records (sha256)" in failed[0]


# --- the writer and the verification re-read ------------------------------------------------


def _hold(argv: list[str], point: str, folder: str) -> subprocess.Popen:
    """A convert that stops at hold point ``point`` (``transforms.io.faults``), once it is there."""
    os.makedirs(folder, exist_ok=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=_env(BEAM_TFRECORDS_HOLD_AT=point,
                                                             BEAM_TFRECORDS_HOLD_DIR=folder,
                                                             BEAM_TFRECORDS_TEST_HOOKS="1"))
    deadline = time.monotonic() + HOLD_TIMEOUT
    while not os.path.exists(os.path.join(folder, point)):
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"convert did not hold at {point}: {proc.communicate()[0][-3000:]!r}")
        time.sleep(0.05)
    return proc


def _tamper_when_held(out: str, flag: str, changed: list[str]) -> None:
    """Once the run holds at ``flag``: one line more (a record the shard does not hold) in
    every index file written so far; then lets the run go on."""
    deadline = time.monotonic() + HOLD_TIMEOUT
    while not os.path.exists(flag) and time.monotonic() < deadline:
        time.sleep(0.05)
    for root, _, names in os.walk(os.path.join(out, WORK_DIR)):
        for name in names:
            if name.endswith(".idx"):
                with open(os.path.join(root, name), "ab") as f:
                    f.write(b"999999 16\n")
                changed.append(name)
    with contextlib.suppress(FileNotFoundError):
        os.remove(flag)


@pytest.mark.e2e
def test_an_index_changed_after_it_was_written_fails_the_run(reference, tmp_path, monkeypatch, caplog):
    images, _ = reference
    out, hold = str(tmp_path / "out"), str(tmp_path / "hold")
    os.makedirs(hold)
    for name, value in (("BEAM_TFRECORDS_HOLD_AT", "mid_verify"), ("BEAM_TFRECORDS_HOLD_DIR", hold),
                        ("BEAM_TFRECORDS_TEST_HOOKS", "1")):
        monkeypatch.setenv(name, value)
    changed: list[str] = []
    helper = threading.Thread(target=_tamper_when_held, args=(out, os.path.join(hold, "mid_verify"), changed))
    helper.start()
    try:
        status = cli_main(["convert", "--input", images, "--output", out, *FLAGS])
    finally:
        helper.join()
    assert changed, "no index file beside the shards being verified"
    assert status == 1
    assert any("its index file holds" in r.getMessage() and "not the index of its records" in r.getMessage()
               for r in caplog.records), [r.getMessage()[:300] for r in caplog.records if r.levelname == "ERROR"]
    assert not [n for n in os.listdir(out) if ".tfrecord" in n or n == "manifest.json"]


# --- gzip, and what is the run's own --------------------------------------------------------


@pytest.mark.e2e
def test_gzip_shards_get_none_and_replace_an_uncompressed_dataset_index_files_too(reference, tmp_path, capsys):
    images, made = reference
    out = str(tmp_path / "out")
    shutil.copytree(made, out)
    capsys.readouterr()
    assert cli_main(["convert", "--input", images, "--output", out, *FLAGS, "--compression", "gzip",
                     "--overwrite"]) == 0
    assert "  index files: none (gzip shards cannot be read at an offset" in capsys.readouterr().out
    names = os.listdir(out)
    assert [n for n in names if n.endswith(".tfrecord.gz")]
    assert not [n for n in names if n.endswith(".idx")], names  # The old dataset's went with it.
    manifest = json.loads(open(os.path.join(out, "manifest.json"), encoding="utf-8").read())
    assert manifest["index_files"] == {"format": "offset length", "written": False,
                                       "why": "gzip shards cannot be read at an offset"}
    assert not [s for info in manifest["splits"].values() for s in info["shards"] if "index" in s]


@pytest.mark.e2e
def test_a_users_file_of_an_index_name_is_refused_and_kept(reference, tmp_path, capsys):
    images, _ = reference
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000-of-00003.tfrecord.idx").write_bytes(b"mine\n")
    capsys.readouterr()
    assert cli_main(["convert", "--input", images, "--output", str(out), *FLAGS, "--overwrite"]) == 2
    assert "train-00000-of-00003.tfrecord.idx" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["train-00000-of-00003.tfrecord.idx"]
    assert (out / "train-00000-of-00003.tfrecord.idx").read_bytes() == b"mine\n"


@pytest.mark.e2e
def test_kill_9_with_every_index_at_its_final_name_then_the_next_run_recovers(reference, tmp_path):
    images, made = reference
    expected = _tree(made)
    out = str(tmp_path / "out")
    proc = _hold(_convert_argv(images, out), "manifest_staged", str(tmp_path / "hold"))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # Every shard and index at its final name, no manifest: each index the reference's
    # bytes, and recorded by the journal (size and sha256) before it was moved there.
    at_final = _tree(out)
    assert "manifest.json" not in at_final
    indexes = {n: d for n, d in at_final.items() if n.endswith(".idx")}
    assert indexes and indexes == {n: d for n, d in expected.items() if n.endswith(".idx")}
    journal = os.path.join(out, WORK_DIR, "journal")
    claims = {c["path"]: c for name in os.listdir(journal)
              for c in json.load(open(os.path.join(journal, name), encoding="utf-8"))["claims"]}
    assert all(claims[n]["sha256"] == d and claims[n]["size"] == os.path.getsize(os.path.join(out, n))
               for n, d in indexes.items())
    # The next run, without --overwrite, proves them its own and publishes the same dataset.
    assert cli_main(["convert", "--input", images, "--output", out, *FLAGS]) == 0
    assert {n: d for n, d in _tree(out).items() if n != "manifest.json"} == {
        n: d for n, d in expected.items() if n != "manifest.json"}
    assert cli_main(["verify", out]) == 0
