"""The process-wide pool of helper processes, and the check of a shard's byte range.

This module imports no Beam at load time, so the shard writer's helper
processes start in a fraction of a second: they only need ``schemas`` and what
their tasks preload (the image record builder, ``io.image_records``; the table
encoder). A ``gs://`` shard is read through Beam's filesystems, imported on
first use.

Helpers are spawned: a fresh interpreter that imports what its tasks need, ~0.15 s
of CPU each. The CLI's own process (``allow_forked_helpers``: its threads are
known) forks them instead when a run starts them before its runner starts
(``helper_pool(..., fork=True)``): a copy of the launcher, its modules loaded, for a
few ms each.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import fcntl
import gc
import hashlib
import importlib
import io
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from beam_tfrecords.transforms.codec.record_index import RecordIndex, index_lines
from beam_tfrecords.transforms.codec.tfrecord import RecordError, scan_range, scan_records

__all__ = [
    "HELPER_MIN_FILES",
    "HELPER_MIN_TABLE_BYTES",
    "SMALL_FILE_BYTES",
    "helper_pool",
    "helpers_pay",
    "index_local_ranges",
    "live_helper_pool",
    "ordered_map",
    "ready_helper_pool",
    "drop_early",
    "retire_helper_pool",
    "submit_early",
    "take_early",
    "verify_piece",
    "verify_range",
]

# Below this mean file size, per-file Python work dominates a shard's cost and
# helper processes pay off; above it the work is reading, hashing and copying,
# which threads do in parallel without the GIL.
SMALL_FILE_BYTES = 64 << 10

# A helper costs ~0.15 s of CPU to spawn and import its codecs; threads encode a
# small file for ~0.1 ms. Below this many files a run's helpers never pay back
# their start (a 9-image run spent 0.55 s of CPU and 0.35 s of wall on them).
HELPER_MIN_FILES = 2048
# A table is encoded in batches of a CSV block (4 MiB): below two blocks a helper
# would encode the only batch while this process waits.
HELPER_MIN_TABLE_BYTES = 8 << 20

_START_TIMEOUT_SECONDS = 120
# A helper's collector runs once this many more objects live than at its last pass
# (``_start_helper``); Python's default is 700.
_HELPER_GC_OBJECTS = 100_000
_INDEX_BLOCK = 1 << 20  # Bytes read at a time by ``index_local_ranges``.
# Whether this process may fork its helpers (``allow_forked_helpers``).
_fork_allowed = False
_log = logging.getLogger(__name__)
_pool_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_size = 0
_pool_broken = False
_warmups: list[concurrent.futures.Future] = []
# Tasks submitted before the step that needs them asks (``submit_early``), by the
# digest of the task pickled: ``ordered_map`` takes their futures instead of running
# them again.
_early: dict[bytes, tuple[concurrent.futures.Executor, concurrent.futures.Future]] = {}


def verify_range(path: str, start: int, end: int, first_index: int,
                 index: bool = False) -> int | tuple[int, bytes]:
    """Checks the records in bytes ``[start, end)`` of a shard; returns their count
    (with ``index``, and their index lines as bytes: ``record_index.index_lines``).

    Raises:
      RecordError: at the first faulty record (file index and offset).
    """
    offsets: list[int] | None = [] if index else None
    if "://" in path:
        from beam_tfrecords.transforms.io import files  # pylint: disable=import-outside-toplevel

        with files.open_read(path) as stream:
            stream.seek(start)
            data = stream.read(end - start)
        count = scan_records(data, first_index, start, offsets)
    else:
        # Read a block at a time (``scan_range``): the piece is never all in memory,
        # and no fresh pages are zeroed for it (130 MB read whole cost more CPU in
        # page faults than its records' checks).
        fd = os.open(path, os.O_RDONLY)
        at = start

        def read(n: int) -> bytes:
            nonlocal at
            data = os.pread(fd, min(n, end - at), at) if at < end else b""
            at += len(data)
            return data

        try:
            count = scan_range(read, end - start, first_index, start, offsets)
        finally:
            os.close(fd)
    if offsets is None:
        return count
    return count, index_lines(offsets, end - start, start).encode("ascii")


def verify_piece(task: tuple[str, int, int, int, bool]) -> int | tuple[int, bytes]:
    """``verify_range(*task)``: one piece of a shard as a single item (what
    ``submit_early`` and ``take_early`` file a task under)."""
    return verify_range(*task)


def index_local_ranges(ranges: Sequence[tuple[str, int, int]]) -> tuple[bytes, int, int]:
    """The index lines (``codec.record_index``) of the records in the byte ranges
    ``(path, begin, end)`` of local files, taken in order as one stream: ``(lines,
    records, bytes)``. A shard copied from spools has its index made here, in a
    helper, from the spools' bytes, while the writer copies them.

    Raises:
      RecordError: the ranges do not end at a record boundary.
      OSError: a file cannot be read.
    """
    sink = io.BytesIO()
    index = RecordIndex(sink)
    for path, begin, end in ranges:
        fd = os.open(path, os.O_RDONLY)
        try:
            at = begin
            while at < end:
                block = os.pread(fd, min(_INDEX_BLOCK, end - at), at)
                if not block:
                    raise RecordError("truncated", index.records, at, f"{path} ends at byte {at}, before {end}")
                index.feed(block)
                at += len(block)
        finally:
            os.close(fd)
    digest = index.finish()
    return sink.getvalue(), digest.records, sum(end - begin for _, begin, end in ranges)


@contextlib.contextmanager
def _stand_in_main():
    """Makes ``transforms.io.helper_main`` the ``__main__`` that spawned children load."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = importlib.import_module("beam_tfrecords.transforms.io.helper_main")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _preload(modules: tuple[str, ...]) -> None:
    """Runs in a new helper: imports what its tasks will need, ahead of them (with
    the collector off: imports make no garbage; what they made is then frozen, out
    of the sight of the collections that the tasks' work triggers)."""
    gc.disable()
    try:
        for module in modules:
            importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()


def _start_helper(parent: int) -> None:
    """Runs in each new helper: a thread that ends the helper as soon as the
    process that started it is gone (killed with SIGKILL, say, when no cleanup
    runs), so no helper outlives a run. Ctrl-C (SIGINT, sent by a terminal to
    the whole process group) is left to the parent, which reports it in one
    line and ends its helpers; SIGTERM ends a helper at once (a forked one has its
    parent's handler, which would clean up the parent's run).

    A task's objects live until its result is sent, and make no cycles: the
    collector's default (a pass each time 700 more objects live than before) walked
    them over and over, ~0.8 us of a tiny image's ~40. A pass now waits for
    ``_HELPER_GC_OBJECTS`` more: garbage cycles, should a task make them, are still
    collected, after fewer tasks' worth of them than that."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    gc.set_threshold(_HELPER_GC_OBJECTS, *gc.get_threshold()[1:])

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)  # pylint: disable=protected-access

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


# Linux's F_SETPIPE_SZ (fcntl.F_SETPIPE_SZ from Python 3.10 on).
_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# The pipe the helpers' results come back through: 1 MiB (an unprivileged process's
# limit, /proc/sys/fs/pipe-max-size), not the 64 KiB default. A task's results (a
# few hundred tiny images' records, ~0.6 MB) then pass in one or two reads, not ten,
# each of which the reading thread must win the GIL back for.
_RESULT_PIPE_BYTES = 1 << 20


def _widen_result_pipe(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Widens the pipe of ``pool``'s results (``_RESULT_PIPE_BYTES``), where the
    system allows; left as it is where not (no fcntl limit to raise, another OS)."""
    reader = getattr(getattr(pool, "_result_queue", None), "_reader", None)
    if reader is None:
        return
    try:
        fcntl.fcntl(reader.fileno(), _SETPIPE_SZ, _RESULT_PIPE_BYTES)
    except OSError as err:  # EPERM above the limit, EINVAL where pipes do not resize.
        _log.debug("The helpers' result pipe keeps its size: %s", err)


def helpers_pay(files: int, total_bytes: int) -> bool:
    """Whether helper processes pay off for ``files`` inputs of ``total_bytes`` in all:
    enough files, and small ones (``SMALL_FILE_BYTES`` on average; larger files are
    read, hashed and copied by threads in parallel, without the GIL)."""
    return files >= HELPER_MIN_FILES and total_bytes < SMALL_FILE_BYTES * files


def _task_key(fn: Callable, item) -> bytes:
    """What ``submit_early`` files a task under: the SHA-256 of ``(fn, item)`` pickled
    (equal tasks pickle to equal bytes; a task that differs in anything is another)."""
    return hashlib.sha256(pickle.dumps((fn, item), protocol=pickle.HIGHEST_PROTOCOL)).digest()


def submit_early(pool: concurrent.futures.Executor, fn: Callable, items: Iterable) -> int:
    """Runs ``fn`` on each of ``items`` on ``pool`` now, before the step that needs
    them asks: ``ordered_map(pool, fn, ...)`` then takes these futures for the same
    ``(fn, item)`` instead of running them again (the local runner's first shard is
    encoded while the runner starts). Returns how many were submitted. Results never
    asked for are dropped with the pool (``retire_helper_pool``)."""
    count = 0
    for item in items:
        key = _task_key(fn, item)
        with _pool_lock:
            if key not in _early:
                _early[key] = (pool, pool.submit(fn, item))
                count += 1
    return count


def drop_early() -> None:
    """Forgets the tasks ``submit_early`` started that nothing took (a run that ended
    before its writer asked): those not begun are cancelled, their results dropped."""
    with _pool_lock:
        for _, future in _early.values():
            future.cancel()
        _early.clear()


def take_early(pool: concurrent.futures.Executor, fn: Callable, item) -> concurrent.futures.Future | None:
    """The future ``submit_early`` made for ``fn(item)`` on ``pool``, taken (once); else ``None``."""
    if not _early:
        return None
    key = _task_key(fn, item)
    with _pool_lock:
        found = _early.get(key)
        if found is None or found[0] is not pool:
            return None
        del _early[key]
    return found[1]


def ordered_map(pool: concurrent.futures.Executor, fn: Callable, items: Iterable,
                window: int) -> Iterator:
    """``map(fn, items)`` on a pool, in order, with at most ``window`` tasks in flight
    (so a reader stays a few items ahead of its consumer, never the whole input).

    Tasks ``submit_early`` already started are taken, not run again, while they come
    in a row: from the first item that was not started early on, every item is
    submitted (none is pickled a second time to look it up)."""
    pending: collections.deque = collections.deque()
    iterator = iter(items)
    looking = [bool(_early)]

    def submit(item) -> concurrent.futures.Future:
        if looking[0]:
            found = take_early(pool, fn, item)
            if found is not None:
                return found
            looking[0] = False
        return pool.submit(fn, item)

    for item in itertools.islice(iterator, window):
        pending.append(submit(item))
    while pending:
        done = pending.popleft()
        for item in itertools.islice(iterator, 1):
            pending.append(submit(item))
        yield done.result()


def allow_forked_helpers() -> None:
    """Lets this process fork its helpers where ``helper_pool`` is asked to
    (``fork=True``: before the runner starts). Only the CLI calls it: at that
    point its threads are its own (the progress line, pyarrow's allocator), none
    of which a helper needs, and the locks a helper could meet are renewed in it
    (``os.register_at_fork``: logging's, this module's, the progress line's). A
    library caller's process may run threads of its own: its helpers are spawned.
    Linux only (elsewhere fork is unsafe with system libraries' threads)."""
    global _fork_allowed  # pylint: disable=global-statement
    _fork_allowed = sys.platform.startswith("linux") and hasattr(os, "fork")


def helper_pool(
    processes: int, preload: tuple[str, ...] = ("beam_tfrecords.transforms.io.image_records",),
    fork: bool = False,
) -> concurrent.futures.ProcessPoolExecutor | None:
    """The process-wide pool of helper processes, started on first call.

    One pool serves every shard writer in the process. Its processes start at
    once, so calling this as soon as small files are known to be coming hides
    their start-up. They are spawned, each importing ``preload`` first; with
    ``fork`` (a caller before the runner starts) in a process that allows it
    (``allow_forked_helpers``), forked instead, with what this process loaded.

    Returns:
      The pool, or ``None`` when helper processes could not start before (see
      ``ready_helper_pool``); callers then use threads.
    """
    global _pool, _pool_size, _pool_broken  # pylint: disable=global-statement
    with _pool_lock:
        if _pool_broken:
            return None
        if _pool is None or _pool_size != processes:
            if _pool is not None:
                _pool.shutdown(wait=False)
                _early.clear()
            forked = fork and _fork_allowed
            _pool = concurrent.futures.ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("fork" if forked else "spawn"),
                initializer=_start_helper, initargs=(os.getpid(),),
            )
            _pool_size = processes
            _widen_result_pipe(_pool)
            _warmups.clear()
            # Spawned: each submit starts one process, now, with an empty stand-in main
            # module. Forked: the first submit forks them all, before the pool's threads start.
            with contextlib.nullcontext() if forked else _stand_in_main():
                _warmups.extend(_pool.submit(_preload, preload) for _ in range(processes))
        return _pool


def _renew_in_child() -> None:
    """After a fork, in the child: this process's pool is its parent's, not its own
    (a helper starts none), and the pool's lock may have been held by the forking
    thread; the standard streams are made anew (``_fresh_streams``)."""
    global _pool, _pool_lock, _pool_size  # pylint: disable=global-statement
    _pool_lock = threading.Lock()
    _pool, _pool_size = None, 0
    _warmups.clear()
    _early.clear()
    _fresh_streams()


def _fresh_streams() -> None:
    """``sys.stdout`` and ``sys.stderr`` opened anew on their descriptors, and the log
    handlers that wrote to them switched to the new ones: a thread of the parent may
    have been writing to one at the fork, holding its lock, and the child does not
    have that thread (a warning the child logged would wait for the lock forever).
    A stream that is not a file (a caller's capture) is left as it is."""
    for name in ("stdout", "stderr"):
        old = getattr(sys, name)
        try:
            fd = old.fileno()
            new = open(fd, "w", buffering=1, encoding=old.encoding, errors=old.errors,  # noqa: SIM115  # pylint: disable=consider-using-with
                       closefd=False)
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            continue
        setattr(sys, name, new)
        for handler in logging.getLogger().handlers:
            if getattr(handler, "stream", None) is old:
                handler.stream = new  # Not setStream: it would flush the old stream.


os.register_at_fork(after_in_child=_renew_in_child)


def live_helper_pool() -> concurrent.futures.ProcessPoolExecutor | None:
    """The process's helper pool while it runs (before ``retire_helper_pool``); ``None``
    when there is none. Never starts one."""
    with _pool_lock:
        return None if _pool_broken else _pool


def ready_helper_pool(processes: int) -> concurrent.futures.ProcessPoolExecutor | None:
    """``helper_pool``, once its processes have answered; ``None`` if they cannot."""
    global _pool_broken  # pylint: disable=global-statement
    pool = helper_pool(processes)
    if pool is None:
        return None
    try:
        for warmup in list(_warmups):
            warmup.result(timeout=_START_TIMEOUT_SECONDS)
    except (concurrent.futures.process.BrokenProcessPool, concurrent.futures.TimeoutError) as err:
        _log.warning("Helper processes could not start (%s); encoding in threads instead", err)
        with _pool_lock:
            _pool_broken = True
            _early.clear()
        pool.shutdown(wait=False, cancel_futures=True)
        return None
    return pool


def retire_helper_pool() -> None:
    """Tells the helper processes to end, without waiting for them, once a run needs
    them no more (its commit): they exit while the commit and the summary go on,
    not when the process ends (the executor's exit hook still joins them then, so
    none outlives this process). A later ``helper_pool`` starts a new pool."""
    global _pool  # pylint: disable=global-statement
    with _pool_lock:
        if _pool is not None:
            _pool.shutdown(wait=False, cancel_futures=True)
            _pool = None
            _warmups.clear()
        _early.clear()


@atexit.register
def _shutdown_helper_pool() -> None:
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)

