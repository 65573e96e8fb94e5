"""The output folder's lock: one run at a time writes an output folder.

A run takes the folder's lock (``OUT/.beam-tfrecords/lock.json``, created only if
absent: ``O_EXCL`` locally, a generation precondition on GCS) before anything
else, and releases it last (``transforms.io.commit`` holds the rest of the commit
protocol).

The lock (``acquire_lock``) names its holder by run id, host, machine id, boot
id, pid namespace and pid; a gone holder's lock is taken over only with a
precondition on the version read (``_take_over``), so one run of several wins.
A run on Dataflow also names its job: project and region when it takes the
lock, the job id once the job is submitted (``record_job``, a rewrite with the
same precondition). Such a lock follows the job, not the launcher: it is taken
over only when the Dataflow API says the job has ended
(``transforms.io.dataflow_jobs``), never because its launcher is gone; a lock
whose launcher stopped while submitting (no job id) is never taken over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import socket
import time
from collections.abc import Iterator

from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.dataflow_jobs import (
    ENDED_STATES,
    DataflowApi,
    DataflowJob,
    JobQueryError,
    job_state,
)
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.gcs import (
    create_if_absent,
    delete_generation,
    is_gcs,
    read_generation,
    replace_generation,
)

__all__ = [
    "LOCK_NAME",
    "OutputBusyError",
    "acquire_lock",
    "holds_lock",
    "record_job",
    "release_lock",
]

LOCK_NAME = "lock.json"


class OutputBusyError(RuntimeError):
    """Another run holds the output folder's lock."""


# The commit's log, named as before the lock had a module of its own (a run's log
# lines keep their logger).
_log = logging.getLogger("beam_tfrecords.transforms.io.commit")
_LOCK_ATTEMPTS = 5
# The longest a takeover of a local lock waits for another one (each lasts milliseconds).
_TAKEOVER_WAIT_SECONDS = 10.0
_TAKEOVER_SUFFIX = ".takeover"


def _lock_path(output: str) -> str:
    return files.join(output, WORK_DIR, LOCK_NAME)


def _process_start(pid: int) -> str:
    """The start time of a local process (``/proc``), '' when unknown or gone
    (a zombie, killed but not yet reaped by its parent, is gone: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except (OSError, IndexError):
        return ""


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip()[:64]
    except OSError:
        return ""


def _machine() -> dict[str, str]:
    """This machine and process namespace, as a lock records them: a host name is
    not enough (containers share names, and a pid means something only in its
    pid namespace). ``machine``: ``/etc/machine-id`` ('' when there is none, as in
    many containers); ``boot``: the kernel's boot id (new at every boot, shared by
    the containers of one kernel); ``pid_ns``: this process's pid namespace."""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = ""
    return {"machine": _first_line("/etc/machine-id") or _first_line("/var/lib/dbus/machine-id"),
            "boot": _first_line("/proc/sys/kernel/random/boot_id"), "pid_ns": namespace}


def _holder(run_id: str, job: DataflowJob | None = None) -> dict:
    pid = os.getpid()
    holder = {
        "run_id": run_id,
        "host": socket.gethostname(),
        **_machine(),
        "pid": pid,
        "pid_start": _process_start(pid),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if job is not None:
        holder["dataflow"] = job.to_json()
    return holder


def _encode(holder: dict) -> bytes:
    return (json.dumps(holder, indent=2) + "\n").encode("utf-8")


def _is_gone(holder: dict) -> bool:
    """Whether the holder provably no longer runs: a process of this machine (same
    host name and machine or boot id) and pid namespace that is not running, or
    any process of this machine before its last boot. Anything else (another
    machine, another container, a lock without those ids) is not taken over."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    here = _machine()
    if here["machine"] and holder.get("machine") == here["machine"] and holder.get("boot") \
            and here["boot"] and holder["boot"] != here["boot"]:
        return True  # This machine, booted again since: every process of before is gone.
    if not here["boot"] or holder.get("boot") != here["boot"] or holder.get("pid_ns") != here["pid_ns"]:
        return False
    start = _process_start(holder["pid"])
    return not start or start != holder.get("pid_start", start)


def _create(path: str, data: bytes) -> bool:
    if is_gcs(path):
        return create_if_absent(path, data)
    if not files.is_local(path):
        raise ValueError(f"cannot lock {path}: only local folders and gs:// are supported")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


@dataclasses.dataclass(frozen=True)
class _Lock:
    """A lock as read: what it says, and which version of the lock it is (a
    ``gs://`` object's generation; a local file's device, inode, size and times)."""

    holder: dict
    version: tuple


def _parse_holder(data: bytes) -> dict:
    try:
        holder = json.loads(data.decode("utf-8"))
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _local_version(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read_lock(path: str) -> _Lock | None:
    """The lock at ``path`` and its version; ``None`` when there is none."""
    if is_gcs(path):
        read = read_generation(path)
        return None if read is None else _Lock(_parse_holder(read[0]), (read[1],))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:  # A link or worse where the lock should be: nobody can take that over.
        return _Lock({}, ())
    with os.fdopen(fd, "rb") as f:
        version = _local_version(os.fstat(f.fileno()))
        return _Lock(_parse_holder(f.read(1 << 20)), version)


@contextlib.contextmanager
def _takeover_guard(path: str) -> Iterator[None]:
    """Lets one process at a time take over the local lock ``path``: an exclusive
    ``flock`` on ``path.takeover``, which the kernel drops when its process dies
    (a takeover killed halfway never blocks the next). The file is removed after
    use; a process that locked a file removed meanwhile tries again.

    Raises:
      TimeoutError: when another takeover held it for ``_TAKEOVER_WAIT_SECONDS``.
      OSError: when the file system has no locks (``ENOLCK``, ``EOPNOTSUPP``).
    """
    import fcntl  # pylint: disable=import-outside-toplevel

    guard = path + _TAKEOVER_SUFFIX
    deadline = time.monotonic() + _TAKEOVER_WAIT_SECONDS
    while True:
        fd = os.open(guard, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"another run is taking over {path}") from None
                    time.sleep(0.01)
            try:
                current = os.stat(guard, follow_symlinks=False)
                mine = os.fstat(fd)
                same = (current.st_dev, current.st_ino) == (mine.st_dev, mine.st_ino)
            except FileNotFoundError:
                same = False
            if same:
                try:
                    yield
                finally:
                    os.unlink(guard)  # Still holding it: whoever waits on it tries again.
                return
        finally:
            os.close(fd)


def _take_over(path: str, seen: _Lock, data: bytes) -> bool:
    """Replaces the lock ``seen`` (a gone holder's) with ``data``, only if it is still
    that version: of two runs that read the same lock, at most one succeeds.

    On GCS one write with ``ifGenerationMatch`` of the generation read. Locally,
    under ``_takeover_guard``: the lock is removed only if it still is the file
    read (device, inode, size and times), then created with ``O_EXCL``.
    """
    if is_gcs(path):
        return replace_generation(path, data, seen.version[0])
    with _takeover_guard(path):
        try:
            now = _local_version(os.stat(path, follow_symlinks=False))
        except FileNotFoundError:
            now = None
        if now != seen.version:
            return False  # Taken over, or released, since it was read.
        os.unlink(path)
        return _create(path, data)


def _busy(output: str, path: str, other: dict, why: str = "") -> OutputBusyError:
    return OutputBusyError(
        f"--output {output} is being written by another run "
        f"(run {other.get('run_id', '?')}, pid {other.get('pid', '?')} on "
        f"{other.get('host', '?')}, since {other.get('started', '?')}){why}; wait for it to "
        f"finish, or delete {path} if that run is gone"
    )


def _held_by_job(output: str, path: str, holder: dict, api: DataflowApi) -> OutputBusyError | None:
    """Why a lock that names a Dataflow job (``holder["dataflow"]``) may not be taken
    over; ``None`` when the API says that job has ended."""
    run = holder.get("run_id", "?")
    job = DataflowJob.from_json(holder["dataflow"])
    if job is None:
        return OutputBusyError(f"--output {output} is locked by run {run}, which names a Dataflow job "
                               f"this version cannot read; delete {path} if that job has ended")
    if not job.job_id:
        if not _is_gone(holder):
            return _busy(output, path, holder, f"; submitting a job to Dataflow project {job.project}")
        return OutputBusyError(
            f"--output {output} is locked by run {run}, whose launcher (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}) stopped while submitting a Dataflow job (project "
            f"{job.project}, region {job.region}, since {holder.get('started', '?')}); if no job of "
            f"that run is running (gcloud dataflow jobs list --status=active --region {job.region} "
            f"--project {job.project}), delete {path}")
    try:
        state = job_state(job, api)
    except JobQueryError as err:
        return OutputBusyError(
            f"--output {output} is locked by run {run} for {job.describe()}, whose state could not be "
            f"asked of the Dataflow API ({err}); run again once it can be, or, if that job has "
            f"ended, delete {path}")
    if state in ENDED_STATES:
        _log.warning("The lock of run %s names %s, which ended (%s)", run, job.describe(), state)
        return None
    return OutputBusyError(
        f"--output {output} is being written by {job.describe()}, which is {state} (run {run}; "
        f"{job.console_url}); wait for it to end, or cancel it ({job.cancel_command}) and run again")


def acquire_lock(output: str, run_id: str, job: DataflowJob | None = None,
                 api: DataflowApi | None = None) -> dict:
    """Takes the output folder's lock for ``run_id``.

    A lock left by a process of this machine that no longer runs (killed, or
    crashed; see ``_is_gone``) is taken over, with a precondition on the lock
    that was read (``_take_over``): when several runs find the same dead
    holder, one takes the lock and the others are refused, naming it. A lock
    that names a Dataflow job is taken over only when the Dataflow API says that
    job has ended (``_held_by_job``), whatever its launcher became.

    Args:
      output: the output folder.
      run_id: this run.
      job: for a run on Dataflow, its project and region (the job id is recorded
        once the job is submitted: ``record_job``).
      api: how to ask the Dataflow API about a job a lock names (Google's
        endpoint, application-default credentials when ``None``).

    Returns:
      What the lock file now says.

    Raises:
      OutputBusyError: naming the run, or the Dataflow job, that holds it.
    """
    path = _lock_path(output)
    holder = _holder(run_id, job)
    data = _encode(holder)
    seen = None
    for _ in range(_LOCK_ATTEMPTS):
        if _create(path, data):
            return holder
        seen = _read_lock(path)
        if seen is None:
            continue  # Released between our attempt and our read.
        if seen.holder.get("run_id") == run_id:
            return holder  # Ours: a create retried after its answer was lost.
        if "dataflow" in seen.holder:
            refused = _held_by_job(output, path, seen.holder, api or DataflowApi())
            if refused is not None:
                raise refused
        elif not (seen.holder and _is_gone(seen.holder)):
            raise _busy(output, path, seen.holder)
        hold_point("lock_takeover")  # Tests: another run may take it over meanwhile.
        try:
            taken = _take_over(path, seen, data)
        except (TimeoutError, OSError) as err:
            why = (f"; its holder is gone, but the lock could not be taken over "
                   f"({type(err).__name__}: {err})")
            raise _busy(output, path, seen.holder, why) from err
        if taken:
            _log.warning("Took over the lock of run %s (pid %s on %s), %s", seen.holder.get("run_id"),
                         seen.holder.get("pid"), seen.holder.get("host"),
                         "whose Dataflow job ended" if "dataflow" in seen.holder else "which is gone")
            return holder
        # Another run took it over first (or it changed): read it again.
    if seen is not None:
        raise _busy(output, path, seen.holder)
    raise OutputBusyError(f"--output {output}: could not take the lock {path}")


def record_job(output: str, run_id: str, job: DataflowJob) -> bool:
    """Writes the submitted Dataflow job into the lock ``run_id`` holds, only if the
    lock is still the version read (a generation precondition on GCS; locally a
    rewrite under the takeover guard): another run's lock is never overwritten,
    and a lock the job's last step already released is not written again.

    Returns:
      Whether the lock now names the job.
    """
    path = _lock_path(output)
    seen = _read_lock(path)
    if seen is None or seen.holder.get("run_id") != run_id:
        return False
    data = _encode({**seen.holder, "dataflow": job.to_json()})
    hold_point("lock_record")  # Tests: another run may replace the lock meanwhile.
    if is_gcs(path):
        return replace_generation(path, data, seen.version[0])
    with _takeover_guard(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        with os.fdopen(fd, "wb") as f:
            if _local_version(os.fstat(f.fileno())) != seen.version:
                return False
            f.write(data)  # A reader meanwhile sees a torn lock: one nobody takes over.
            f.truncate()
        return True


def release_lock(output: str, run_id: str) -> None:
    """Removes the lock if ``run_id`` holds it (so releasing twice is harmless); on
    GCS only the generation read (a lock taken over meanwhile stays)."""
    path = _lock_path(output)
    if not (is_gcs(path) or files.is_local(path)):
        return
    seen = _read_lock(path)
    if seen is None or seen.holder.get("run_id") != run_id:
        return
    if is_gcs(path):
        delete_generation(path, seen.version[0])
        return
    files.delete_files([path])
    try:  # The work folder goes too when nothing else is in it.
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass


def holds_lock(output: str, run_id: str) -> bool | None:
    """Whether ``run_id`` holds the output's lock: ``None`` when there is no lock."""
    path = _lock_path(output)
    if not (is_gcs(path) or files.is_local(path)):
        return None
    seen = _read_lock(path)
    return None if seen is None else seen.holder.get("run_id") == run_id
