"""Crash safety of the commit protocol, with real processes killed at every hold point.

Each convert runs as ``python -m beam_tfrecords convert`` in a session of its own
(``start_new_session=True``: its pid is the session and process group id), so the
whole tree (the main process, its spawned helper processes and multiprocessing's
resource tracker) can be killed with one ``killpg`` and found again by session id
in ``/proc``. ``BEAM_TFRECORDS_HOLD_AT``/``BEAM_TFRECORDS_HOLD_DIR`` (see
``transforms.io.faults``) stop the run at a named point; the test waits for the
hold file, kills, and checks what a reader and the next run see:

* no ``manifest.json`` (none of the points is after publication);
* nothing at a final shard name, except where the design puts verified shards
  there (``mid_commit``: some; ``manifest_staged``: all), and then only bytes
  identical to an undisturbed run's;
* ``verify OUT`` fails (exit 1: no manifest, not a finished dataset);
* no process of the tree left 5 s after the kill;
* the next run, without ``--overwrite``, takes over the dead run's lock, removes
  its temporaries, and publishes shards byte-identical to an undisturbed run's.
"""

from __future__ import annotations

import ast
import contextlib
import csv
import dataclasses
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.shards import WORK_DIR, parse_shard_name
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_metadata
from beam_tfrecords.transforms.io import faults
from beam_tfrecords.transforms.io.faults import POINTS

pytestmark = pytest.mark.e2e

HOLD_TIMEOUT = 60.0  # A run reaches any hold point in well under this.
GONE_TIMEOUT = 5.0  # Every process of a killed tree is gone within this.
RUN_TIMEOUT = 180.0  # A whole (small) conversion.
HOLD_ENV = ("BEAM_TFRECORDS_HOLD_AT", "BEAM_TFRECORDS_HOLD_DIR", "BEAM_TFRECORDS_TEST_HOOKS")

# Where the verified shards are when a run is killed at each point, by design
# (transforms/io/commit.py): nowhere final, some at final names, or all of them.
AT_FINAL_NAMES = {
    "listing": "none",
    "mid_write": "none",
    "mid_verify": "none",
    "before_commit": "none",
    "mid_commit": "some",
    "manifest_staged": "all",
}


@dataclasses.dataclass(frozen=True)
class Kind:
    """One input kind: its convert flags and an undisturbed run's shard digests."""

    name: str
    flags: tuple[str, ...]
    reference: dict[str, str]  # shard file name -> sha256


# --- processes ------------------------------------------------------------------------


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in HOLD_ENV}
    env.update(extra)
    return env


def _convert_argv(kind: Kind | tuple[str, ...], out: str) -> list[str]:
    flags = kind.flags if isinstance(kind, Kind) else kind
    return [sys.executable, "-m", "beam_tfrecords", "convert", *flags, "--output", out]


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    """A convert to the end (no hold), in its own session."""
    return subprocess.run(argv, env=_clean_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, check=False, start_new_session=True)


def _stat(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from the state field on, ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _session(sid: int) -> dict[int, str]:
    """Live processes of session ``sid`` (zombies, already dead, excluded): pid -> cmdline."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields and int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            found[int(entry)] = _cmdline(int(entry))
    return found


def _wait_session_gone(sid: int, timeout: float = GONE_TIMEOUT) -> dict[int, str]:
    """Waits (bounded) until no live process of the session is left; returns those left."""
    deadline = time.monotonic() + timeout
    while True:
        left = _session(sid)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@dataclasses.dataclass
class Held:
    proc: subprocess.Popen
    point: str
    flag: str
    log: str

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 30) -> str:
        with open(self.log, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])


@pytest.fixture
def hold(tmp_path):
    """``hold(kind, out, point)`` starts a convert that stops at ``point`` and returns
    once it is there. Every tree started is killed at teardown, whatever happened."""
    started: list[subprocess.Popen] = []

    def start(kind: Kind, out: str, point: str) -> Held:
        folder = tmp_path / f"hold-{len(started)}"
        folder.mkdir()
        log = str(folder / "convert.log")
        with open(log, "wb") as sink:
            proc = subprocess.Popen(
                _convert_argv(kind, out), stdout=sink, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                env=_clean_env(BEAM_TFRECORDS_HOLD_AT=point, BEAM_TFRECORDS_HOLD_DIR=str(folder),
                               BEAM_TFRECORDS_TEST_HOOKS="1"),
            )
        started.append(proc)
        held = Held(proc, point, str(folder / point), log)
        deadline = time.monotonic() + HOLD_TIMEOUT
        while not os.path.exists(held.flag):
            if proc.poll() is not None:
                pytest.fail(f"convert exited {proc.returncode} before reaching {point}:\n"
                            f"{held.log_tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"convert did not reach {point} in {HOLD_TIMEOUT:.0f} s:\n"
                            f"{held.log_tail()}")
            time.sleep(0.05)
        return held

    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # The group outlives a dead leader.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _kill_tree(held: Held) -> dict[int, str]:
    """``kill -9`` of the whole tree; returns what is still alive 5 s later."""
    os.killpg(held.pid, signal.SIGKILL)
    left = _wait_session_gone(held.pid)
    held.proc.wait(timeout=GONE_TIMEOUT)  # Reap the leader, as a shell would.
    return left


# --- output folders -------------------------------------------------------------------


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _final_shards(out: str) -> dict[str, str]:
    """Files at final shard names in ``out``: name -> sha256."""
    if not os.path.isdir(out):
        return {}
    return {name: _sha256(os.path.join(out, name))
            for name in sorted(os.listdir(out)) if parse_shard_name(name)}


def _temp_folders(out: str) -> list[str]:
    work = os.path.join(out, WORK_DIR)
    if not os.path.isdir(work):
        return []
    return sorted(os.path.join(work, n) for n in os.listdir(work) if n.startswith("tmp-"))


def _journal_claims(out: str) -> dict[str, dict]:
    """What the output's journal records, by path (``transforms.io.ownership``)."""
    folder = os.path.join(out, WORK_DIR, "journal")
    claims = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            claims.update({c["path"]: c for c in json.load(f)["claims"]})
    return claims


def _lock(out: str) -> dict | None:
    path = os.path.join(out, WORK_DIR, "lock.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _verify(out: str) -> tuple[int, str]:
    """``verify OUT``: its exit status and what it printed (run in this process: the
    CLI's ``main`` returns the status ``python -m beam_tfrecords verify`` exits with)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = cli_main(["verify", out])
    return status, printed.getvalue()


def _assert_next_run_recovers(kind: Kind, out: str) -> None:
    """The next run, with no --overwrite and no hold, publishes exactly the undisturbed
    run's shards and leaves no work folder (dead lock and stale temporaries removed)."""
    done = _run(_convert_argv(kind, out))
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert _final_shards(out) == kind.reference
    assert not os.path.exists(os.path.join(out, WORK_DIR)), os.listdir(os.path.join(out, WORK_DIR))
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        tfds_files = tfds_metadata(json.load(f))  # dataset_info.json, ... (issue 22)
    assert sorted(os.listdir(out)) == sorted([*kind.reference, *(n + ".idx" for n in kind.reference),
                                              "inputs.jsonl", "manifest.json", "run_report.json",
                                              *tfds_files])
    status, printed = _verify(out)
    assert status == 0, printed


# --- inputs and undisturbed reference runs --------------------------------------------


def _write_table(path: str, rows: int) -> None:
    rng = np.random.default_rng(0)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text", "score"])
        for i in range(rows):
            writer.writerow([str(i), "word " * int(rng.integers(5, 40)), f"{rng.normal():.6f}"])


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, Kind]:
    """Both input kinds, each converted once, undisturbed, for reference.

    Images: 600 small files (helper processes encode them), about 150 per shard,
    so each shard takes several chunks (``mid_write`` holds after the second).
    Table: 24,000 rows, 3 shards of about 1.4 MB (a spool copy moves 1 MiB a
    chunk, so ``mid_write`` needs shards over 1 MiB).
    """
    base = tmp_path_factory.mktemp("crash")
    images, table = str(base / "images"), str(base / "table.csv")
    make_class_folder_sample(images, per_class=150, splits=None, size_range=(16, 40))
    _write_table(table, 24_000)
    flags = {
        "images": ("--input", images, "--shard_min_mb", "0.15", "--shard_max_mb", "0.3",
                   "--encode_processes", "2"),
        "table": ("--input", table, "--shard_min_mb", "1.1", "--shard_max_mb", "2",
                  "--encode_processes", "2"),
    }
    found = {}
    for name, kind_flags in flags.items():
        out = str(base / f"reference-{name}")
        done = _run(_convert_argv(kind_flags, out))
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        reference = _final_shards(out)
        assert len(reference) >= 3, reference
        found[name] = Kind(name, kind_flags, reference)
    return found


# --- 1. kill -9 of the whole tree at every hold point ---------------------------------


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("beam_pipeline", "transforms", "schemas")
HOLD_SWITCHES = {"BEAM_TFRECORDS_HOLD_AT", "hold_point"}  # Set in an env, or patched.


def _modules(*folders: str, mentioning: tuple[str, ...] = ()) -> dict[str, ast.Module]:
    """Every ``.py`` file under ``folders`` (relative to the repo) whose text holds one of
    ``mentioning`` (any, when empty), parsed, by path."""
    found = {}
    for top in folders:
        for folder, _, names in os.walk(os.path.join(REPO, top)):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    with open(path, encoding="utf-8") as f:
                        text = f.read()
                    if not mentioning or any(word in text for word in mentioning):
                        found[os.path.relpath(path, REPO)] = ast.parse(text, path)
    return found


def _hold_points_in_product() -> dict[str, list[str]]:
    """Every ``hold_point("...")`` call of the product, by point: where it is."""
    found: dict[str, list[str]] = {}
    for path, tree in _modules(*PRODUCT, mentioning=("hold_point",)).items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if called != "hold_point":
                continue
            where = f"{path}:{node.lineno}"
            arg = node.args[0] if node.args else None
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), \
                f"{where}: a hold point is named by a literal string, or this test cannot see it"
            found.setdefault(arg.value, []).append(where)
    return found


def _hold_points_named_by_tests(points: set[str]) -> dict[str, set[str]]:
    """By hold point, the test modules that stop a run there.

    A module stops runs at hold points when it sets ``BEAM_TFRECORDS_HOLD_AT`` or patches
    ``hold_point``, or imports from a test module that does; it stops at the points it
    names as strings, and at all of ``faults.POINTS`` or ``faults.COMMIT_POINTS`` when it
    imports and uses them.
    """
    trees = _modules("tests", mentioning=tuple(HOLD_SWITCHES))
    strings = {path: {n.value for n in ast.walk(t) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
               | {n.arg for n in ast.walk(t) if isinstance(n, ast.keyword) and n.arg}
               for path, t in trees.items()}
    stoppers = {path for path, found in strings.items() if found & HOLD_SWITCHES}
    stopper_modules = {path[:-3].replace(os.sep, ".") for path in stoppers}
    trees.update(_modules("tests", mentioning=tuple(f"from {name} import" for name in stopper_modules)))
    strings.update({path: {n.value for n in ast.walk(t) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
                    for path, t in trees.items() if path not in strings})
    named: dict[str, set[str]] = {}
    for path, tree in trees.items():
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        if path not in stoppers and not any(n.module in stopper_modules for n in imports):
            continue
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        lists = {alias.asname or alias.name: getattr(faults, alias.name)
                 for n in imports if n.module == faults.__name__ for alias in n.names
                 if alias.name in ("POINTS", "COMMIT_POINTS")}
        here = strings[path].union(*(points_ for name, points_ in lists.items() if name in used))
        for point in here & points:
            named.setdefault(point, set()).add(path)
    return named


def test_every_hold_point_is_covered():
    """Every point the product holds at is one a test stops a run at; the kill -9 test
    below knows what each of ``faults.POINTS`` leaves at final names."""
    in_product = _hold_points_in_product()
    declared = set(faults.POINTS) | set(faults.COMMIT_POINTS)
    assert declared <= set(in_product), f"declared, held nowhere: {sorted(declared - set(in_product))}"
    named = _hold_points_named_by_tests(set(in_product))
    missing = {point: where for point, where in in_product.items() if point not in named}
    assert not missing, f"hold points no test stops a run at: {missing}"
    assert set(POINTS) == set(AT_FINAL_NAMES)


# Which kind is killed where: the images (the kind with helper processes) at every point;
# the table at the points whose code is its own, its listing (transforms/csv_segments.py)
# and its writer's spool copy (mid_write). Verification and the commit (mid_verify,
# before_commit, mid_commit, manifest_staged) take shards as files whatever the input kind
# (transforms/shard_verification.py, transforms/io/commit.py, commit_moves.py): a table
# killed there would repeat the images' case at a conversion's cost each.
KILLS = [*(("images", point) for point in POINTS), ("table", "listing"), ("table", "mid_write")]


@pytest.mark.parametrize("kind_name, point", KILLS, ids=[f"{kind}-{point}" for kind, point in KILLS])
def test_kill_tree_at_hold_point_then_next_run_recovers(kinds, hold, tmp_path, kind_name, point):
    kind = kinds[kind_name]
    out = str(tmp_path / "out")
    held = hold(kind, out, point)
    assert held.proc.poll() is None
    assert held.pid in _session(held.pid)

    left = _kill_tree(held)
    assert not left, f"alive {GONE_TIMEOUT:.0f} s after kill -9 of the tree: {left}"

    # (a) Nothing is published: there is no manifest.
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    # The dead run's lock is still there, for the next run to take over.
    lock = _lock(out)
    assert lock is not None and lock["pid"] == held.pid, lock

    # (b) Final shard names hold nothing, or, where the design moves verified shards
    # there before the manifest (mid_commit: some; manifest_staged: all), exactly the
    # undisturbed run's bytes.
    final = _final_shards(out)
    expected = AT_FINAL_NAMES[point]
    if expected == "none":
        assert final == {}, f"shards at final names after a kill at {point}: {sorted(final)}"
    elif expected == "some":  # Half way through the commit's moves (the TFDS metadata's last, issue 22).
        pending = [n for n in _journal_claims(out) if not os.path.exists(os.path.join(out, n))]
        assert final and pending, (sorted(final), pending)
    else:
        assert set(final) == set(kind.reference)
    for name, digest in final.items():
        assert digest == kind.reference[name], f"{name} at its final name differs"
    # Whatever sits at a final name was recorded, by checksum, in the journal before it
    # was moved there: the next run can prove it its own (issue 18).
    recorded = _journal_claims(out)
    for name, digest in final.items():
        assert recorded[name]["sha256"] == digest, name
    temps = _temp_folders(out)
    if point != "listing":
        assert len(temps) == 1, temps  # The killed run's temporaries, still there.
    if point in ("before_commit", "mid_commit", "manifest_staged"):
        assert os.path.exists(os.path.join(temps[0], "manifest.json"))  # Staged, not published.
    if point == "before_commit":
        # Each written under a name of its own attempt: <shard>.<attempt id>.
        staged = {n.rsplit(".", 1)[0]: _sha256(os.path.join(temps[0], n))
                  for n in os.listdir(temps[0]) if parse_shard_name(n.rsplit(".", 1)[0])}
        assert staged == kind.reference  # Every shard written and verified, none moved.

    # (c) verify fails a folder without a manifest (it does not CRC-scan what is there,
    # temporaries or shards at final names, into a pass).
    status, printed = _verify(out)
    assert status == 1, printed
    assert "no manifest.json" in printed and "OK " not in printed, printed

    # (e) The next run needs no --overwrite, and recovers completely.
    _assert_next_run_recovers(kind, out)


# --- 2. killing only the main process: the helpers follow ------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_helpers_die_with_the_main_process(kinds, hold, tmp_path, signum):
    kind = kinds["images"]
    out = str(tmp_path / "out")
    held = hold(kind, out, "mid_write")
    helpers = {pid: cmd for pid, cmd in _session(held.pid).items()
               if pid != held.pid and "multiprocessing.spawn" in cmd}
    assert len(helpers) >= 2, _session(held.pid)  # --encode_processes 2, used for small files.

    os.kill(held.pid, signum)  # The main process only, not the group.
    left = _wait_session_gone(held.pid)
    assert not left, f"alive {GONE_TIMEOUT:.0f} s after {signum.name} to the main process: {left}"

    # The main process is dead but not reaped yet (a zombie): its lock is a dead
    # holder's all the same, and the next run takes it over.
    state = _stat(held.pid)
    assert state is not None and state[0] == "Z", state
    assert _lock(out)["pid"] == held.pid
    _assert_next_run_recovers(kind, out)
    assert held.proc.wait(timeout=GONE_TIMEOUT) == -signum


# --- 3. two runs, one output folder ----------------------------------------------------


def test_second_run_is_refused_while_the_first_lives_then_takes_over(kinds, hold, tmp_path):
    kind = kinds["images"]
    out = str(tmp_path / "out")
    first = hold(kind, out, "mid_write")
    lock_path = os.path.join(out, WORK_DIR, "lock.json")
    with open(lock_path, "rb") as f:
        lock_bytes = f.read()
    holder = json.loads(lock_bytes)
    assert holder["pid"] == first.pid
    temps = _temp_folders(out)
    assert len(temps) == 1 and temps[0].endswith(f"tmp-{holder['run_id']}")

    second = _run(_convert_argv(kind, out))
    assert second.returncode == 2, second.stdout + second.stderr[-3000:]
    lines = [line for line in second.stderr.splitlines() if "being written by another run" in line]
    assert len(lines) == 1, second.stderr
    assert "error:" in lines[0]
    assert f"run {holder['run_id']}" in lines[0] and f"pid {first.pid}" in lines[0], lines[0]

    # A live holder on this host is not taken over: its lock, temporaries and
    # process are untouched, and nothing was published.
    with open(lock_path, "rb") as f:
        assert f.read() == lock_bytes
    assert _temp_folders(out) == temps
    assert first.proc.poll() is None
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert _final_shards(out) == {}

    # The first run cannot be released from its hold: kill it. The next run takes
    # over the dead holder's lock and publishes a dataset that verifies.
    left = _kill_tree(first)
    assert not left, left
    _assert_next_run_recovers(kind, out)
