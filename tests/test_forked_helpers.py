"""Issue 23: the CLI forks its helper processes; nothing of the parent runs in them.

A spawned helper costs ~0.15 s of CPU to start (a fresh interpreter importing
numpy, Pillow and the codecs); the CLI's process forks them before its runner
starts instead (``helpers.allow_forked_helpers``), for a few ms each. A forked
helper is a copy of the launcher: the launcher's SIGTERM handler (which cleans up
the run) must not run in it, and a lock a launcher's thread held at the fork (the
progress line's) must not be held in it.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from beam_tfrecords.transforms.io.helpers import HELPER_MIN_FILES

# The CLI's entry point as the ``beam-tfrecords`` script runs it, noting how each
# helper pool it starts makes its processes.
_CLI = textwrap.dedent("""
    import concurrent.futures, sys
    from beam_tfrecords import __main__ as entry

    made = []

    class Noted(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs):
            made.append(kwargs["mp_context"].get_start_method())
            super().__init__(*args, **kwargs)

    concurrent.futures.ProcessPoolExecutor = Noted
    sys.argv = ["beam-tfrecords", "convert", *sys.argv[1:]]
    code = entry.run()
    print("pools", *made)
    sys.exit(code)
""")


def _png_folder(root, count: int) -> str:
    for index in range(count):
        buffer = io.BytesIO()
        Image.new("RGB", (2 + index % 5, 3), (index % 251, 2, 3)).save(buffer, "PNG")
        folder = root / ("cat" if index % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:05d}.png").write_bytes(buffer.getvalue())
    return str(root)


def _published(folder: str) -> dict:
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder)) if name.endswith(".tfrecord") or name == "inputs.jsonl"}


@pytest.mark.e2e
def test_the_cli_forks_its_helpers_and_writes_what_threads_write(tmp_path):
    root = _png_folder(tmp_path / "in", HELPER_MIN_FILES)
    runs = {}
    for name, extra in (("forked", []), ("threads", ["--encode_processes", "0"])):
        out = str(tmp_path / name)
        done = subprocess.run([sys.executable, "-c", _CLI, "--input", root, "--output", out, *extra],
                              capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = done.stdout.splitlines()[-1], _published(out)
    assert runs["forked"][0] == "pools fork"  # One pool, forked; none spawned.
    assert runs["threads"][0] == "pools"
    assert runs["forked"][1] and runs["forked"][1] == runs["threads"][1]


_SIGTERM = textwrap.dedent("""
    import os, signal, sys, time
    from beam_tfrecords.transforms.io import helpers

    marker = sys.argv[1]
    def cleanup(signum, frame):  # As the CLI's: it would clean up the run.
        with open(marker, "w") as out:
            out.write(str(os.getpid()))
    signal.signal(signal.SIGTERM, cleanup)
    helpers.allow_forked_helpers()
    pool = helpers.helper_pool(1, (), fork=True)
    pid = pool.submit(os.getpid).result(timeout=60)
    process = pool._processes[pid]
    os.kill(pid, signal.SIGTERM)
    for _ in range(200):  # The pool's own thread may reap it first: its exit code shows then.
        if process.exitcode is not None:
            break
        time.sleep(0.05)
    print(pool._mp_context.get_start_method(), process.exitcode)
""")


@pytest.mark.beam
def test_a_forked_helper_ends_by_sigterm_without_its_parents_handler(tmp_path):
    marker = tmp_path / "handler-ran"
    done = subprocess.run([sys.executable, "-c", _SIGTERM, str(marker)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["fork", "-15"]
    assert not marker.exists()


_LINE_LOCK = textwrap.dedent("""
    import os, threading, time
    from beam_tfrecords import console

    reporter = console.Reporter(mode="log", seconds=1)
    console._active = reporter
    held = threading.Event()

    def draw():  # The progress thread, drawing the line while the launcher forks.
        with reporter._lock:
            held.set()
            time.sleep(0.3)

    threading.Thread(target=draw).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        os._exit(0 if reporter._lock.acquire(timeout=3) else 3)
    print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
""")


def _printed(script: str) -> list[str]:
    """What a script run in a Python of its own prints (it must exit 0)."""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.unit
def test_a_fork_never_leaves_the_progress_lines_lock_held_in_the_child():
    assert _printed(_LINE_LOCK) == ["child", "0"]


@pytest.mark.unit
def test_helpers_that_read_or_check_gcs_objects_are_not_forked():
    from beam_tfrecords.job_graph import helpers_may_fork  # pylint: disable=import-outside-toplevel

    def plan(source, output):
        return type("Plan", (), {"config": type("Config", (), {"input": source, "output": output})()})()

    assert helpers_may_fork(plan("/data/images", "/data/out"))
    assert not helpers_may_fork(plan("gs://b/images", "/data/out"))
    assert not helpers_may_fork(plan("/data/images", "gs://b/out"))


_CLIENT = textwrap.dedent("""
    import os
    from beam_tfrecords.transforms.io import gcs

    gcs._gcsio = object()  # The parent's client, its connections open.
    pid = os.fork()
    if pid == 0:
        os._exit(0 if gcs._gcsio is None and not gcs._lock.locked() else 3)
    print("child", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), gcs._gcsio is not None)
""")


@pytest.mark.unit
def test_a_forked_child_makes_its_own_storage_client():
    assert _printed(_CLIENT) == ["child", "0", "True"]


_STDERR = textwrap.dedent("""
    import os, signal, sys, threading, time
    from beam_tfrecords.transforms.io import helpers  # Its at-fork hook, as in the CLI.

    end, start = os.pipe()
    os.dup2(start, 2)
    sys.stderr = open(2, "w", buffering=1, closefd=False)

    def flood():  # Blocks writing to the full pipe, holding the stream's lock.
        sys.stderr.write("x" * (1 << 20))
        sys.stderr.flush()

    threading.Thread(target=flood, daemon=True).start()
    time.sleep(0.5)
    pid = os.fork()
    if pid == 0:
        signal.alarm(10)  # Without fresh streams: blocked on the lock for good.
        sys.stderr.write("the child's warning\\n")
        os._exit(0)
    read = []
    def drain():
        while chunk := os.read(end, 1 << 16):
            read.append(chunk)
    threading.Thread(target=drain, daemon=True).start()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    time.sleep(0.3)
    print("child", code, b"the child's warning" in b"".join(read))
""")


@pytest.mark.unit
def test_a_forked_child_writes_to_stderr_that_a_parents_thread_held_at_the_fork():
    assert _printed(_STDERR) == ["child", "0", "True"]
