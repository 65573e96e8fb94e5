"""gs:// -> gs:// conversions with storage faults injected between the client and GCS.

Every conversion here runs in this process (``cli.main``, ``--encode_processes 0``:
no helper process with a stale environment) with ``STORAGE_EMULATOR_HOST`` naming
a ``FaultProxy`` in front of the emulator (``tests/harness/fault_proxy.py``); each test
checks from the proxy's log that the run's traffic went through it. What the
emulator holds is read back directly, not through the proxy.

Each fault must end one of two ways:

- survived: exit 0, and every shard byte-identical (SHA-256) to a fault-free run
  of the same input, with the manifest recording those digests; or
- a clean failure: exit 1, one ``VERIFICATION FAILED:`` line naming the object
  (as ``run_report.json``'s ``verification_failures`` does), no ``manifest.json``,
  no shard at a final name, no temporary left, the lock released.

A fault during the commit's renames (after every shard verified) is the one
documented window: no manifest, but shards already moved stay at their final
names until the next run, which needs no ``--overwrite`` and finishes the dataset.

google-cloud-storage retries 429/5xx for up to 120 s by itself, so sustained
failures use 403 (not retried: a persistent per-object refusal), and the one 503
outage is removed ~3 s after it first hits. Beam's GCS client retries after about
1 s, 2 s, ...; the engine retries a whole shard after 1 s, then 2 s.
"""

from __future__ import annotations

import csv
import gc
import hashlib
import json
import logging
import re
import threading
import time
from collections import Counter
from typing import NamedTuple

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from tests.harness.fault_proxy import (
    FaultProxy,
    Match,
    RequestInfo,
    downloads,
    object_name_contains,
    upload_completions,
)
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

# A Beam/BlobWriter whose close() failed tries again when garbage-collected and
# raises ("Upload is in an invalid state"); that is the failed attempt we retried.
UNRAISABLE_FAILED_WRITER = "ignore:Exception ignored in.*BlobWriter:pytest.PytestUnraisableExceptionWarning"
pytestmark = [pytest.mark.emulator, pytest.mark.filterwarnings(UNRAISABLE_FAILED_WRITER)]

BUCKET = "gs://faults"
# --reread: these runs re-read every shard they verify (the reads the faults hit).
FLAGS = ["--shard_min_mb", "0.01", "--shard_max_mb", "0.05", "--encode_processes", "0", "--reread"]
# A hang guard, not a speed check: each run takes 2-8 s, a run stuck retrying never ends.
RUN_LIMIT_SECONDS = 300
FINAL_NAME = re.compile(r"^[A-Za-z0-9_.]+-\d{5}-of-\d{5}\.tfrecord(\.gz)?$")
SHARD_1 = "train-00001-of-"  # A shard every input here has (3 or 4 shards each).


class Run(NamedTuple):
    code: int
    out: str      # What the CLI printed on stdout (the summary).
    err: str      # ... and on stderr.
    seconds: float


def _reset_gcs_clients() -> None:
    """Drops clients made for another endpoint: ``transforms.io.gcs`` keeps one GcsIO per
    process (Beam's FileSystems makes a fresh client per call, reading the variable)."""
    from beam_tfrecords.transforms.io import gcs as gcs_module  # pylint: disable=import-outside-toplevel

    gcs_module._gcsio = None  # pylint: disable=protected-access


def _convert(src: str, out: str, capsys) -> Run:
    capsys.readouterr()
    start = time.monotonic()
    code = main(["convert", "--input", src, "--output", out, *FLAGS])
    seconds = time.monotonic() - start
    captured = capsys.readouterr()
    summary = [line for line in captured.out.splitlines() if line.startswith("status: ")]
    first = summary or (captured.out.strip() or captured.err.strip()).splitlines()[:1]
    with capsys.disabled():
        print(f"\n[fault run] {out}: exit {code} in {seconds:.2f} s; {first[0] if first else ''}")
    assert seconds < RUN_LIMIT_SECONDS
    return Run(code, captured.out, captured.err, seconds)


def _name(gs_path: str) -> str:
    return gs_path[len(BUCKET) + 1:]


def _final_shards(gcs, out: str) -> dict[str, str]:
    """SHA-256 of every object at a final shard name directly under ``out``."""
    found = {}
    for path in gcs.list(out + "/"):
        rel = path[len(out) + 1:]
        if FINAL_NAME.match(rel):
            found[rel] = hashlib.sha256(gcs.download(path)).hexdigest()
    return found


@pytest.fixture(scope="module")
def inputs(gcs_emulator, tmp_path_factory):
    """Eight images in four classes, and a CSV table of 1000 rows, on the emulator."""
    local = str(tmp_path_factory.mktemp("fault-images") / "images")
    make_class_folder_sample(local, per_class=2, splits=None)
    gcs_emulator.upload_tree(local, f"{BUCKET}/images")
    table = str(tmp_path_factory.mktemp("fault-table") / "table.csv")
    with open(table, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "score", "text"])
        for i in range(1000):
            writer.writerow([i, f"{(i * 37 % 101) / 7:.4f}", f"row {i} " + "x" * (i % 50)])
    with open(table, "rb") as f:
        gcs_emulator.upload_bytes(f"{BUCKET}/table.csv", f.read())
    return {"images": f"{BUCKET}/images", "table": f"{BUCKET}/table.csv"}


@pytest.fixture(scope="module")
def reference(gcs_emulator, inputs):
    """Fault-free runs of each input, straight to the emulator (module scope: made
    before any test's proxy): ``reference[kind]`` is ``{shard name: sha256}``."""
    made = {}
    for kind, src in inputs.items():
        out = f"{BUCKET}/reference-{kind}"
        assert main(["convert", "--input", src, "--output", out, *FLAGS]) == 0
        made[kind] = _final_shards(gcs_emulator, out)
        assert len(made[kind]) >= 3, made[kind]  # SHARD_1 exists.
    return made


@pytest.fixture
def proxy(gcs, monkeypatch):
    """A FaultProxy that every GCS call of this process goes through, for one test."""
    with FaultProxy(gcs.url, upstream_timeout=20) as fault_proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        _reset_gcs_clients()
        try:
            yield fault_proxy
        finally:
            injected = Counter(e.outcome for e in fault_proxy.faults())
            print(f"[fault run] faults injected: {dict(injected)}; requests: {len(fault_proxy.log)}")
            fault_proxy.clear()
            _reset_gcs_clients()  # Made for the proxy; the next one is made after monkeypatch undoes.
            gc.collect()  # Failed writers of this test (see UNRAISABLE_FAILED_WRITER).
    assert fault_proxy.upstream_errors == []


def _assert_through_proxy(proxy, out: str) -> None:
    """The run's own objects were written and read through the proxy."""
    names = [e.object_name for e in proxy.log if e.object_name]
    assert any(n.startswith(_name(out) + "/.beam-tfrecords/tmp-") for n in names), "no shard traffic via proxy"


def _assert_survived(gcs, run: Run, out: str, expected: dict[str, str]) -> None:
    assert run.code == 0, run.out + run.err
    assert "\nstatus: ok\n" in run.out
    assert _final_shards(gcs, out) == expected
    manifest = json.loads(gcs.download(f"{out}/manifest.json"))
    recorded = {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}
    assert recorded == expected
    left = [p for p in gcs.list(out + "/") if "/.beam-tfrecords/" in p]
    assert left == []  # No temporary, no lock.


def _assert_failed_cleanly(gcs, run: Run, out: str, shard_prefix: str) -> dict:
    """Exit 1, one line naming the shard, nothing published; returns the failure."""
    assert run.code == 1, run.out + run.err
    assert "\nstatus: verification_failed\n" in run.out
    report = json.loads(gcs.download(f"{out}/run_report.json"))
    assert report["status"] == "verification_failed" and report["manifest"] is None
    [failure] = report["verification_failures"]
    assert failure["path"].startswith(f"{out}/{shard_prefix}")
    shard = failure["path"].rsplit("/", 1)[1]
    assert "/.beam-tfrecords/tmp-" in failure["error"] and shard in failure["error"]  # The object.
    lines = [line for line in run.out.splitlines() if line.startswith("VERIFICATION FAILED:")]
    assert lines == [f"VERIFICATION FAILED: {failure['path']}: {failure['error']}"]
    assert not gcs.exists(f"{out}/manifest.json")
    assert _final_shards(gcs, out) == {}
    left = [p for p in gcs.list(out + "/") if "/.beam-tfrecords/" in p]
    # The run's temporaries removed, its lock released; only the journal is left, which
    # records the report (so that the next run can prove it this product's).
    assert [p for p in left if "/.beam-tfrecords/journal/" not in p] == []
    assert {c["path"] for p in left for c in json.loads(gcs.download(p))["claims"]} == {"run_report.json"}
    return failure


def _shard_object(shard_prefix: str) -> Match:
    """Requests on a shard object whose name holds ``shard_prefix``; not its index file
    (``<shard>.idx``, issue 22), which is written beside it and would take the fault."""
    return Match(lambda i: i.object_name is not None and shard_prefix in i.object_name
                 and not i.object_name.endswith(".idx"), f"shard object {shard_prefix!r}")


def _shard_log(proxy, out: str, shard_prefix: str) -> list:
    """Requests on the run's temporary shard objects (their index files, ``.idx``, left out)."""
    prefix = _name(out) + "/.beam-tfrecords/tmp-"
    return [e for e in proxy.log if e.object_name and e.object_name.startswith(prefix)
            and e.object_name.rsplit("/", 1)[1].startswith(shard_prefix)
            and not e.object_name.endswith(".idx")]


def _open_writers(out: str) -> list[str]:
    """Object names of google-cloud-storage writers on ``out`` that are still open."""
    from google.cloud.storage.fileio import BlobWriter  # pylint: disable=import-outside-toplevel

    return [w._blob.name for w in gc.get_objects()  # pylint: disable=protected-access
            if isinstance(w, BlobWriter) and not w.closed and w._blob.name.startswith(_name(out) + "/")]


def _is_session_start(entry) -> bool:
    return entry.method == "POST" and "uploadType=resumable" in entry.target and "upload_id=" not in entry.target


class _Messages(logging.Handler):
    """Keeps the text of the shard engine's warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.warnings: list[str] = []

    def emit(self, record):
        if record.levelno == logging.WARNING:
            self.warnings.append(record.getMessage())


@pytest.fixture
def engine_log():
    """The shard engine's warnings (its retries) during the test, as text."""
    logger = logging.getLogger("beam_tfrecords.transforms.shard_engine")
    handler = _Messages()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _retry_warnings(engine_log, verb: str) -> list[str]:
    return [m for m in engine_log.warnings if m.startswith(f"{verb} ")]


# -- 1. bursts: absorbed by the client's own retries -------------------------------------


@pytest.mark.parametrize("kind, upload_status, download_status", [
    ("images", 503, 429),
    ("table", 429, 503),
])
def test_status_bursts_on_uploads_and_downloads_are_survived(
        gcs, inputs, reference, proxy, capsys, engine_log, kind, upload_status, download_status):
    expected = reference[kind]
    out = f"{BUCKET}/burst-{kind}"
    shards = object_name_contains(_name(out) + "/.beam-tfrecords/tmp-") & object_name_contains(".tfrecord")
    on_upload = proxy.status_burst(upload_status, 2, match=shards & upload_completions())
    on_download = proxy.status_burst(download_status, 2, match=shards & downloads())

    run = _convert(inputs[kind], out, capsys)

    _assert_survived(gcs, run, out, expected)
    _assert_through_proxy(proxy, out)
    assert (on_upload.fired, on_download.fired) == (2, 2)
    outcomes = [e.outcome for e in proxy.faults()]
    assert outcomes.count(f"status_burst:{upload_status}") == 2
    assert outcomes.count(f"status_burst:{download_status}") == 2
    # The client's retries absorbed them: the engine never had to retry a shard.
    assert _retry_warnings(engine_log, "Writing") == [] and _retry_warnings(engine_log, "Verifying") == []


# -- 2. a reset after the emulator stored a shard: our whole-shard retry -------------------


def test_reset_after_upload_completion_is_survived_by_rewriting_the_shard(
        gcs, inputs, reference, proxy, capsys, engine_log):
    out = f"{BUCKET}/reset"
    rule = proxy.reset_after_forward(1, match=_shard_object(SHARD_1) & upload_completions())

    run = _convert(inputs["images"], out, capsys)

    _assert_survived(gcs, run, out, reference["images"])
    assert rule.fired == 1
    # The client's retried PUT finds the finished session gone (the emulator's 404),
    # the write fails, and the engine writes the shard again in a fresh upload.
    entries = _shard_log(proxy, out, SHARD_1)
    assert sum(_is_session_start(e) for e in entries) == 2
    puts = [e.outcome for e in entries if e.method == "PUT"]
    assert puts == ["reset_after_forward:200", 404, 200]
    [warning] = _retry_warnings(engine_log, "Writing")
    assert SHARD_1 in warning and "(attempt 1 of 3), retrying in 1 s" in warning


# -- 3. a cut verification read: resumed by the client ----------------------------------


def test_truncated_verification_read_is_survived(gcs, inputs, reference, proxy, capsys, engine_log):
    out = f"{BUCKET}/truncate"
    rule = proxy.truncate_download(1, match=object_name_contains(_name(out) + "/.beam-tfrecords/tmp-")
                                   & _shard_object(SHARD_1))

    run = _convert(inputs["table"], out, capsys)

    _assert_survived(gcs, run, out, reference["table"])
    assert rule.fired == 1
    reads = [e for e in _shard_log(proxy, out, SHARD_1) if e.method == "GET" and "alt=media" in e.target]
    assert str(reads[0].outcome).startswith("truncate_download:")
    assert reads[1].outcome == 206 and reads[1].headers["range"].startswith("bytes=")
    assert _retry_warnings(engine_log, "Verifying") == []  # The client resumed the read itself.


# -- 4. a sustained refusal of one shard: bounded retries, then a clean failure -------------


def test_sustained_403_on_one_shards_writes_fails_the_run_cleanly(gcs, inputs, proxy, capsys, engine_log):
    out = f"{BUCKET}/refused-write"
    rule = proxy.outage(match=_shard_object(SHARD_1), status=403)

    run = _convert(inputs["images"], out, capsys)

    failure = _assert_failed_cleanly(gcs, run, out, SHARD_1)
    _assert_through_proxy(proxy, out)
    assert failure["error"].startswith(f"cannot write {out}/.beam-tfrecords/tmp-")
    assert "(tried 3 times)" in failure["error"] and "403" in failure["error"]
    # Three attempts, each a fresh upload session refused at once, 1 s and 2 s apart.
    entries = _shard_log(proxy, out, SHARD_1)
    assert [e.outcome for e in entries] == ["outage:403"] * 3 and all(map(_is_session_start, entries))
    assert rule.fired == 3
    warnings = _retry_warnings(engine_log, "Writing")
    assert [w.split("(attempt ")[1][:6] for w in warnings] == ["1 of 3", "2 of 3"]
    assert run.seconds >= 3.0
    # The failed writers are inert: a BlobWriter whose close() failed and that is
    # still open uploads its buffered bytes afresh when garbage-collected, at any
    # later moment (after the run, or over a retry's verified object).
    proxy.remove(rule)
    assert _open_writers(out) == []
    gc.collect()
    assert sum(map(_is_session_start, _shard_log(proxy, out, SHARD_1))) == 3


def test_sustained_403_on_one_shards_reads_fails_the_run_cleanly(gcs, inputs, proxy, capsys, engine_log):
    out = f"{BUCKET}/refused-read"
    rule = proxy.outage(match=object_name_contains(_name(out) + "/.beam-tfrecords/tmp-")
                        & _shard_object(SHARD_1) & downloads(), status=403)

    run = _convert(inputs["table"], out, capsys)

    failure = _assert_failed_cleanly(gcs, run, out, SHARD_1)
    assert failure["error"].startswith("cannot read: Forbidden: 403 GET ")
    assert rule.fired == 3  # One re-read per verification attempt.
    assert len(_retry_warnings(engine_log, "Verifying")) == 2
    assert run.seconds >= 3.0


# -- 5. a 503 outage that ends: ridden out by the client's retries ------------------------------


def test_short_503_outage_on_one_shard_is_survived(gcs, inputs, reference, proxy, capsys, engine_log):
    out = f"{BUCKET}/outage"
    outage_seconds = 3.0
    hit = object_name_contains(_name(out) + "/.beam-tfrecords/tmp-") & _shard_object("train-00002-of-")
    timers: list[threading.Timer] = []
    holder: list = []

    def starts_timer(info: RequestInfo) -> bool:
        if not hit(info):
            return False
        if not timers:  # The outage lasts outage_seconds from its first hit.
            timers.append(threading.Timer(outage_seconds, proxy.remove, holder))
            timers[0].daemon = True
            timers[0].start()
        return True

    rule = proxy.outage(match=Match(starts_timer, "train-00002 for ~3 s"), status=503)
    holder.append(rule)
    try:
        run = _convert(inputs["images"], out, capsys)
    finally:
        for timer in timers:
            timer.cancel()
        proxy.remove(rule)

    _assert_survived(gcs, run, out, reference["images"])
    assert rule.fired >= 2  # Retried inside the outage ...
    assert run.seconds >= outage_seconds
    entries = _shard_log(proxy, out, "train-00002-of-")
    assert entries[0].outcome == "outage:503" and [e for e in entries if e.outcome == 200]
    assert _retry_warnings(engine_log, "Writing") == []  # ... by the client, not by a shard rewrite.


# -- 6. a failure inside the commit's renames ---------------------------------------------------


def _copy_of_second_shard() -> Match:
    """The request that copies the second shard to its final name.

    On GCS each of the commit's renames is a server-side rewrite of the verified
    generation (``.../o/<temporary name>/rewriteTo/b/...``), then a delete of the
    temporary object; the renames run side by side."""

    def test(info: RequestInfo) -> bool:
        name = info.object_name or ""
        return (info.method == "POST" and "/rewriteTo/b/" in info.path
                and "/.beam-tfrecords/tmp-" in name and f"/{SHARD_1}00004.tfrecord." in name
                and not name.endswith(".idx"))  # Not its index file (issue 22).

    return Match(test, "the rewrite copying the second shard")


def test_failed_copy_during_commit_publishes_no_manifest_and_next_run_recovers(
        gcs, inputs, reference, proxy, capsys):
    expected = reference["images"]
    out = f"{BUCKET}/commit"
    rule = proxy.outage(match=_copy_of_second_shard(), status=403)

    run = _convert(inputs["images"], out, capsys)

    assert rule.fired == 1
    assert run.code == 1
    # One line naming the shard it could not move, and a report that says so.
    [line] = [ln for ln in run.out.splitlines() if ln.startswith("COMMIT FAILED: cannot move ")]
    # The verified attempt's object (<shard>.<attempt id>) to the shard's final name.
    assert re.search(rf"{SHARD_1}00004\.tfrecord\.[0-9a-f]+ to {out}/{SHARD_1}00004\.tfrecord ", line), line
    assert "403" in line
    assert "Traceback" not in run.err
    report = json.loads(gcs.download(f"{out}/run_report.json"))
    assert report["status"] == "commit_failed" and report["manifest"] is None
    assert not gcs.exists(f"{out}/manifest.json")
    # The documented window: the shard moved beside the failed one (the moves run side by
    # side, half of them at a time) is at its final name (verified, byte-identical), the
    # failed one is not, nor those of the half after it; the lock is released.
    final = _final_shards(gcs, out)
    assert "train-00000-of-00004.tfrecord" in final and not [k for k in final if k.startswith(SHARD_1)]
    assert all(expected[k] == v for k, v in final.items()) and len(final) < len(expected)
    assert not gcs.exists(f"{out}/.beam-tfrecords/lock.json")
    capsys.readouterr()
    assert main(["verify", out]) == 1  # A folder without a manifest is not a dataset.

    proxy.remove(rule)
    rerun = _convert(inputs["images"], out, capsys)  # No --overwrite needed: no manifest.
    _assert_survived(gcs, rerun, out, expected)
