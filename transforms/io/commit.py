"""The commit protocol of an output folder: one run at a time, shards published by
rename, ``manifest.json`` last, every step safe to run again.

A run takes the folder's lock (``OUT/.beam-tfrecords/lock.json``, created only if
absent: ``O_EXCL`` locally, a generation precondition on GCS), removes what
killed runs left in ``OUT/.beam-tfrecords/``, and writes every shard under
``OUT/.beam-tfrecords/tmp-<run_id>/``, one file per attempt
(``<shard>.<attempt id>``). Only when every shard verified does ``publish`` move
them to their final names and write the manifest (see ``publish`` for the steps):
the manifest and what the commit will remove are staged in the temporary folder;
the journal records every file about to reach a final name; every shard is
checked to be the stored object its verification read (``stored_object``: a GCS
generation; a local file's device, inode, size and times); the moves are made
(locally a rename right after the ``lstat`` is checked again; on GCS a
server-side copy of the verified generation, then a delete, many at a time); the
manifest is published (an atomic rename locally, one object write on GCS); then
what the old dataset had and the new one has not is removed.

A runner runs the commit at least once (Dataflow retries a step after a lost
worker, or an exception), so ``publish`` can run again after a crash anywhere
in it and ends with the same published dataset: a move whose source is gone and
whose destination holds the verified size and CRC-32C (the journal's record) was
made (as Beam's ``FileBasedSink`` treats it); a ``manifest.json`` that already
holds the new bytes is never touched; a retry staging the same manifest keeps
the first attempt's decisions and journal record.

The old manifest stays until the new one replaces it, unless a move would put
other bytes where it lists a file (a shard of the same name): then it is moved
right before those moves into the temporary folder
(``tmp-<run_id>/previous/manifest.json``), so that no manifest ever lists a file
being replaced, and each file it lists is moved there too
(``previous/<relative name>``) right before the new file takes its name (locally a
rename; on GCS a server-side copy, which the new file's copy then overwrites). A
reader that trusts only ``manifest.json`` therefore sees the old dataset whole or
the new one, never a partial or torn shard; in that one case (shard names the old
dataset used, other bytes), a process killed before the new manifest is published
leaves no manifest (``verify`` fails the folder), verified shards at final names,
and the old dataset whole: its manifest and the files replaced in ``previous/``,
the others at their names. A retry of the commit finishes it (what is kept aside
is never kept again nor replaced, and a new file never goes aside); the folder,
``previous/`` with it, goes only after the new manifest and the report (or with
the next run's cleanup of a killed run's temporaries).
Files at final names are this product's by the journal (``transforms.io.ownership``),
which records them, with their size and checksums, and the manifest replaced,
before the first move; cleanup removes only what is proved so (never a user's
file of a shard-like name, never a user's ``part-*`` folder), by literal path, and
never through a symbolic link.

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
import hashlib
import json
import logging
import os
import socket
import stat
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence

import google_crc32c
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.elements import StoredObject
from beam_tfrecords.schemas.inputs import INPUTS_NAME, PART_PREFIX
from beam_tfrecords.schemas.manifest import MANIFEST_NAME
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
    ObjectInfo,
    copy_generation,
    create_if_absent,
    delete_generation,
    is_gcs,
    list_objects,
    object_info,
    parallel,
    read_generation,
    replace_generation,
)
from beam_tfrecords.transforms.io.ownership import (
    Claim,
    OutputClaims,
    OutputNotOurs,
    claim_output,
    commit_journaled,
    commit_replaces,
    file_claim,
    is_shard_like,
    journal_commit,
    remove_tree,
    temporary_folders,
    write_atomic,
)

__all__ = [
    "COMMIT_STATE",
    "KEPT_ASIDE",
    "LOCK_NAME",
    "OutputBusyError",
    "OutputNotOurs",
    "ShardChangedError",
    "acquire_lock",
    "holds_lock",
    "new_run_id",
    "publish",
    "record_job",
    "register_part",
    "release_lock",
    "remove_folder",
    "remove_run_folder",
    "remove_stale_temporaries",
    "stored_object",
]

LOCK_NAME = "lock.json"


class OutputBusyError(RuntimeError):
    """Another run holds the output folder's lock."""


class ShardChangedError(OSError):
    """A shard in the run's temporary folder is not the object its verification read."""


def new_run_id() -> str:
    """A run id that sorts by start time: ``20261123T051200Z-1a2b3c4d``."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


_log = logging.getLogger(__name__)
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


def remove_stale_temporaries(output: str, run_id: str) -> list[str]:
    """Deletes what other (killed) runs left in the work folder; returns those folders.
    That includes what a killed commit kept of the dataset it was replacing
    (``previous/``, see ``publish``): a run that takes the lock replaces it.

    Call only while holding the lock: then no other run is writing there.
    """
    own = files.join(output, WORK_DIR, f"tmp-{run_id}")
    stale = [folder for folder in temporary_folders(output) if folder != own]
    for folder in stale:
        kept = files.list_under(files.join(folder, KEPT_ASIDE))
        if kept:
            _log.warning("Removing %s, where a killed commit had kept %d files of the dataset "
                         "it was replacing; this run replaces that dataset", folder, len(kept))
        remove_folder(folder)
    return stale


def remove_folder(folder: str) -> None:
    """Deletes ``folder`` and everything under it, by literal path and never through a
    link (a link is unlinked, what it points to is not touched); locally, also the
    work folder above a run's temporary folder when nothing else is left in it."""
    remove_tree(folder)
    if files.is_local(folder):
        parent = os.path.dirname(folder.rstrip("/"))
        if os.path.basename(parent) == WORK_DIR:
            try:
                os.rmdir(parent)
            except OSError:
                pass  # The lock, or another run's files, are still there.


@dataclasses.dataclass(frozen=True)
class Published:
    """What ``publish`` did: the manifest's path, and the stale shards and part folders
    it removed (as its first attempt found them: the same on a retry)."""

    manifest_path: str
    removed_stale_shards: tuple[str, ...]
    removed_parts: tuple[str, ...] = ()


def stored_object(path: str) -> StoredObject:
    """Which object ``path`` names now: a ``gs://`` object's generation, a local
    file's device, inode and times (its ``lstat``: a link is not followed); on
    another store only its size.

    Raises:
      FileNotFoundError: when there is nothing at ``path``.
      OSError: when a local ``path`` is not a regular file (a link, a FIFO, ...).
    """
    if is_gcs(path):
        info = object_info(path)
        return StoredObject(info.size, generation=info.generation)
    if not files.is_local(path):  # Another store Beam knows: its size is all we can tell.
        [match] = FileSystems.match([path])
        if not match.metadata_list:
            raise FileNotFoundError(f"{path} does not exist")
        return StoredObject(match.metadata_list[0].size_in_bytes)
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file")
    return StoredObject(st.st_size, device=st.st_dev, inode=st.st_ino, mtime_ns=st.st_mtime_ns,
                        ctime_ns=st.st_ctime_ns)


COMMIT_STATE = "commit.json"
# In a run's temporary folder: what its commit kept of the published dataset before
# replacing it (``manifest.json``, and each replaced file under its relative name).
KEPT_ASIDE = "previous"
_NOT_PUBLISHED = "nothing was published"
_MID_COMMIT = "no manifest written; a retry of the commit, or the next run, replaces what is at final names"


@dataclasses.dataclass(frozen=True)
class _CommitState:
    """What a commit decided before it moved anything, kept beside the staged manifest
    (``tmp-<run>/commit.json``) so that a retry decides the same: the manifest it
    publishes (its SHA-256), and what it removes once that is published, as the
    first attempt found them (a retry would find only what is left)."""

    manifest_sha256: str
    stale_shards: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    stale_files: tuple[str, ...] = ()

    def to_bytes(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), indent=1) + "\n").encode("utf-8", "surrogateescape")

    @classmethod
    def from_bytes(cls, data: bytes | None) -> _CommitState | None:
        try:
            value = json.loads(data.decode("utf-8", "surrogateescape")) if data else None
            return cls(value["manifest_sha256"], *(tuple(value[k]) for k in ("stale_shards", "parts",
                                                                             "stale_files")))
        except (ValueError, TypeError, KeyError):
            return None


def _stage(output: str, temp_dir: str, manifest: bytes, renames: Sequence[tuple[str, str]],
           claims: OutputClaims, remove_parts: bool, remove_inputs: bool) -> _CommitState:
    """Stages the manifest and the commit's decisions in the temporary folder, or, on a
    retry that stages the same manifest, returns what the first attempt decided."""
    state_path, staged = files.join(temp_dir, COMMIT_STATE), files.join(temp_dir, MANIFEST_NAME)
    digest = hashlib.sha256(manifest).hexdigest()
    earlier = _CommitState.from_bytes(files.read_bytes_if_exists(state_path))
    if earlier is not None and earlier.manifest_sha256 == digest \
            and files.read_bytes_if_exists(staged) == manifest:
        return earlier
    keep = {_relative(output, dst) for _, dst in renames}
    state = _CommitState(
        digest,
        tuple(sorted(n for n in claims.owned if is_shard_like(n) and n not in keep)),
        tuple(sorted(n.rstrip("/") for n in claims.owned if n.startswith(PART_PREFIX)
                     and n.endswith("/") and n.count("/") == 1)) if remove_parts else (),
        (INPUTS_NAME,) if remove_inputs and claims.owns(INPUTS_NAME) and INPUTS_NAME not in keep else ())
    files.write_bytes(staged, manifest)
    write_atomic(state_path, state.to_bytes())  # Written after the manifest it names.
    return state


def _relative(output: str, path: str) -> str:
    prefix = files.join(output, "")
    return path[len(prefix):] if path.startswith(prefix) else path


def holds_lock(output: str, run_id: str) -> bool | None:
    """Whether ``run_id`` holds the output's lock: ``None`` when there is no lock."""
    path = _lock_path(output)
    if not (is_gcs(path) or files.is_local(path)):
        return None
    seen = _read_lock(path)
    return None if seen is None else seen.holder.get("run_id") == run_id


def _check_verified(path: str, verified: StoredObject | None, after: str,
                    now: StoredObject | None = None) -> None:
    """Raises ``ShardChangedError`` unless ``path`` still is the object ``verified``
    (``now``: what a listing found there, instead of asking the store again)."""
    name = path.rsplit("/", 1)[-1]
    if verified is None:
        raise ShardChangedError(f"shard {name} has no record of the object its verification read; "
                                f"nothing is published unverified ({after})")
    try:
        now = now if now is not None else stored_object(path)
    except OSError as err:
        raise ShardChangedError(f"shard {name} in the temporary folder is not the file that was "
                                f"verified ({err}): {after}") from err
    if now != verified:
        changed = [field.name for field in dataclasses.fields(StoredObject)
                   if getattr(now, field.name) != getattr(verified, field.name)]
        raise ShardChangedError(f"shard {name} in the temporary folder was replaced or changed "
                                f"after it was verified ({', '.join(changed)} differ): {after}")


@dataclasses.dataclass(frozen=True)
class _Move:
    """One file of the commit still to move to its final name.

    Attributes:
      src, dst: its temporary and final paths.
      verified: the object its verification read (a shard; ``None`` otherwise).
      checked: a shard: moved only if it is ``verified``.
      claim: the size and checksum of what goes to ``dst`` (the journal's record).
      generation: on GCS, the generation to copy (the verified one, for a shard).
      aside: where the file at ``dst`` (the published dataset's, other bytes) is kept
        before the move replaces it ('' when it replaces none).
      aside_generation: on GCS, the generation of ``dst`` to copy to ``aside`` (0 when
        there is none, it is kept already, or ``dst`` holds the new bytes already).
    """

    src: str
    dst: str
    verified: StoredObject | None
    checked: bool
    claim: Claim | None
    generation: int = 0
    aside: str = ""
    aside_generation: int = 0


def _crc32c_of(path: str) -> str:
    """The CRC-32C (hex) of a file's bytes, '' when it cannot be read."""
    crc = google_crc32c.Checksum()
    try:
        with files.open_read(path) as stream:
            for block in iter(lambda: stream.read(4 << 20), b""):
                crc.update(block)
    except OSError:
        return ""
    return crc.hexdigest().decode()


def _holds(dst: str, claim: Claim | None, listed: Mapping[str, ObjectInfo] | None) -> bool:
    """Whether ``dst`` holds what ``claim`` records (size, then CRC-32C or SHA-256):
    a move whose source is gone and whose destination holds that was made."""
    if claim is None:
        return False
    if is_gcs(dst):
        info = (listed or {}).get(dst)
        if info is None or info.size != claim.size:
            return False
        if claim.crc32c:
            return info.crc32c == claim.crc32c
    elif files.is_local(dst):
        try:
            st = os.lstat(dst)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != claim.size:
            return False
        if claim.crc32c:
            return _crc32c_of(dst) == claim.crc32c
    if claim.crc32c:
        return _crc32c_of(dst) == claim.crc32c
    data = files.read_bytes_if_exists(dst)
    return data is not None and len(data) == claim.size and hashlib.sha256(data).hexdigest() == claim.sha256


def _pending_moves(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
                   verified: Mapping[str, StoredObject | None], digests: Mapping[str, Claim],
                   sources: Mapping[str, ObjectInfo]) -> list[_Move]:
    """The moves still to make, each checked before anything moves: a shard still in
    the temporary folder must be the object verified; a file whose source is gone
    must be, by size and checksum, at its final name (a move an earlier attempt of
    this commit made). On GCS, two listings answer for every file (``sources``: the
    temporary folder's, and, when a source is gone, the output's).

    Raises:
      ShardChangedError: naming the first file that is neither.
    """
    gcs = is_gcs(temp_dir)
    finals: dict[str, ObjectInfo] | None = None
    moves, problems, made = [], [], 0
    for src, dst in renames:
        if src == dst:
            continue
        checked, claim = src in verified, digests.get(dst)
        if gcs:
            info = sources.get(src)
            present, now = info is not None, StoredObject(info.size, generation=info.generation) if info else None
        elif files.is_local(src):
            present, now = os.path.lexists(src), None
        else:
            present, now = files.exists(src), None
        if present:
            moves.append(_Move(src, dst, verified.get(src), checked, claim, now.generation if now else 0))
            if checked:
                try:
                    _check_verified(src, verified[src], "", now)
                except ShardChangedError:
                    problems.append((src, dst, now, True))
            continue
        if gcs and finals is None:
            finals = list_objects(output, below=False)
        if _holds(dst, claim, finals):
            made += 1
            continue
        problems.append((src, dst, None, False))
    if problems:
        src, dst, now, present = problems[0]
        after = _MID_COMMIT if made else _NOT_PUBLISHED
        if present:
            _check_verified(src, verified[src], after, now)  # Raises, saying what changed.
        name = src.rsplit("/", 1)[-1]
        raise ShardChangedError(f"{'shard ' if src in verified else ''}{name} is neither in the "
                                f"temporary folder nor, as verified, at its final name {dst}: {after}")
    return moves


def _listed_content(manifest: dict | None) -> dict[str, tuple[int | None, str, str]]:
    """``{path: (size, crc32c, sha256)}`` of what a manifest lists with checksums (its
    shards and ``inputs.jsonl``)."""
    found: dict[str, tuple[int | None, str, str]] = {}
    if not isinstance(manifest, dict):
        return found
    for info in (manifest.get("splits") or {}).values():
        for shard in (info.get("shards") or []) if isinstance(info, dict) else []:
            if isinstance(shard, dict) and isinstance(shard.get("path"), str):
                found[shard["path"]] = (shard.get("bytes"), str(shard.get("crc32c") or ""),
                                        str(shard.get("sha256") or ""))
    listing = (manifest.get("input") or {}).get("files_list") if isinstance(manifest.get("input"), dict) else None
    if isinstance(listing, dict) and isinstance(listing.get("path"), str):
        found[listing["path"]] = (None, "", str(listing.get("sha256") or ""))
    return found


def _replaces_listed(output: str, move: _Move, listed: Mapping[str, tuple[int | None, str, str]]) -> bool:
    """Whether ``move`` puts other bytes where the published manifest lists a file."""
    entry = listed.get(_relative(output, move.dst))
    if entry is None:
        return False
    size, crc, sha = entry
    claim = move.claim
    same = claim is not None and (size is None or size == claim.size) and (
        (bool(crc) and crc == claim.crc32c) or (bool(sha) and sha == claim.sha256))
    return not same


def _move_one(move: _Move) -> None:
    """Moves one file to its final name; a ``checked`` shard only as the object verified.

    Raises:
      ShardChangedError: the shard is not the object verified.
      OSError: the store refused (naming both paths).
    """
    src, dst = move.src, move.dst
    hold_point("rename")
    if move.aside:
        _keep_aside(dst, move.aside, move.aside_generation)
        hold_point("kept_aside")
    try:
        if files.is_local(src):
            if move.checked:
                # Checked right before the rename. What remains is the window between
                # this lstat and os.replace (microseconds), open only to someone who can
                # write to the run's temporary folder, who could as well change a
                # published shard afterwards (which `verify` finds).
                _check_verified(src, move.verified, _MID_COMMIT)
            os.replace(src, dst)
        elif is_gcs(src):
            try:  # The generation listed: for a shard, the one verified (checked before).
                copy_generation(src, dst, move.generation)
            except FileNotFoundError as err:
                raise ShardChangedError(f"shard {src.rsplit('/', 1)[-1]} in the temporary folder was "
                                        f"replaced after it was verified ({err}): {_MID_COMMIT}") from err
            hold_point("rename_copied")
            delete_generation(src, move.generation)  # If that fails, the folder's removal takes it.
        else:
            FileSystems.rename([src], [dst])
    except ShardChangedError:
        raise
    except Exception as err:  # The store's error names no object (a GCS batch request).
        raise OSError(f"cannot move {src} to {dst} ({_MID_COMMIT}): {type(err).__name__}: {err}") from err


def _keep_aside(path: str, aside: str, generation: int = 0) -> None:
    """Keeps the file at ``path`` (the published dataset's, about to be replaced) at
    ``aside``, in this run's temporary folder. Locally a rename, made only when there
    is a file at ``path`` and none at ``aside`` (a file kept by an earlier attempt is
    never replaced); on GCS a server-side copy of ``generation`` of it (0: nothing to
    copy, as ``_asides`` found); on another store a copy, made as locally.

    Raises:
      OSError: the store refused (naming both paths), before ``path`` was replaced.
    """
    try:
        if files.is_local(path):
            if os.path.lexists(path) and not os.path.lexists(aside):
                os.makedirs(os.path.dirname(aside), exist_ok=True)
                os.replace(path, aside)
        elif is_gcs(path):
            if generation:
                copy_generation(path, aside, generation)
        elif files.exists(path) and not files.exists(aside):
            FileSystems.copy([path], [aside])
    except Exception as err:  # pylint: disable=broad-except
        raise OSError(f"cannot keep {path} aside at {aside} ({_MID_COMMIT}): "
                      f"{type(err).__name__}: {err}") from err


def _aside_path(output: str, temp_dir: str, path: str) -> str:
    return files.join(temp_dir, KEPT_ASIDE, _relative(output, path))


def _asides(output: str, temp_dir: str, moves: Sequence[_Move],
            sources: Mapping[str, ObjectInfo]) -> tuple[list[_Move], int]:
    """``moves`` (each replacing a file the published manifest lists, with other bytes),
    each with where that file is kept aside before it is replaced; and on GCS the
    generation of ``manifest.json`` to keep aside before it is removed (0: none to
    copy). On GCS, what to copy is decided from the temporary folder's listing
    (``sources``, ``previous/`` with it) and one of the output's top: nothing kept
    already is copied again (a retry), and a final name that holds its new file's
    size and CRC-32C already (copied, its source not yet deleted) is not kept: a new
    file never goes aside."""
    if not moves:
        return [], 0
    finals = list_objects(output, below=False) if is_gcs(output) else {}

    def generation(path: str, aside: str, source: str = "") -> int:
        info, new = finals.get(path), sources.get(source)
        if info is None or aside in sources:
            return 0
        if new is not None and info.crc32c and (info.size, info.crc32c) == (new.size, new.crc32c):
            return 0
        return info.generation

    asides = []
    for move in moves:
        aside = _aside_path(output, temp_dir, move.dst)
        asides.append(dataclasses.replace(move, aside=aside,
                                          aside_generation=generation(move.dst, aside, move.src)))
    manifest = files.join(output, MANIFEST_NAME)
    return asides, generation(manifest, _aside_path(output, temp_dir, manifest))


def _keep_manifest_aside(output: str, temp_dir: str, generation: int) -> None:
    """Moves the published ``manifest.json`` to ``previous/`` in the temporary folder
    (``_keep_aside``; then, on GCS, the delete of the original)."""
    path = files.join(output, MANIFEST_NAME)
    _keep_aside(path, _aside_path(output, temp_dir, path), generation)
    files.delete_files([path])  # Locally gone already, unless something was kept before it.


def _kept_aside(output: str, temp_dir: str) -> list[str]:
    """The files of the old dataset that a commit of this run kept aside in
    ``temp_dir/previous/`` and that are still its only copy: all of them while
    ``manifest.json`` is not the manifest this run staged; none once it is."""
    kept = [path for path, _ in files.list_under(files.join(temp_dir, KEPT_ASIDE))]
    if not kept:
        return []
    staged = files.read_bytes_if_exists(files.join(temp_dir, MANIFEST_NAME))
    published = files.read_bytes_if_exists(files.join(output, MANIFEST_NAME))
    return [] if staged is not None and staged == published else kept


def remove_run_folder(output: str, temp_dir: str) -> list[str]:
    """Removes a run's temporary folder when its run has ended, unless a commit of that
    run kept files of the old dataset there and did not publish the new one: then
    the folder stays (a person restores the old dataset from it, see the README; the
    next run into ``output`` removes it) and those files are returned."""
    kept = _kept_aside(output, temp_dir)
    if kept:
        _log.warning("Kept %s: it holds the old dataset's manifest and the %d files of it that the "
                     "unfinished commit replaced (see the README on restoring it)", temp_dir,
                     len(kept) - any(p.endswith("/" + MANIFEST_NAME) for p in kept))
        return kept
    remove_folder(temp_dir)
    return []


def _move_all(moves: Sequence[_Move]) -> None:
    """Makes the moves: locally one by one (a rename each), on GCS ``gcs.THREADS`` at a
    time (a copy of the listed generation and a delete each, through one storage
    client); every move ends before the first failure is raised."""
    if not moves:
        return
    if not is_gcs(moves[0].src):
        for move in moves:
            _move_one(move)
        return
    failed = [err for _, err in parallel(_move_one, moves)]
    if failed:
        changed = [err for err in failed if isinstance(err, ShardChangedError)]
        first = (changed or failed)[0]
        if len(failed) > 1:
            raise type(first)(f"{first} (and {len(failed) - 1} more moves failed)") from first
        raise first


def _journal_renames(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
                     claims: OutputClaims | None,
                     digests: Mapping[str, Claim] | None) -> tuple[OutputClaims, dict | None]:
    """Refuses an output holding files this product cannot prove it wrote; then records,
    before anything moves, what is about to reach a final name (size and checksums,
    where from) and the manifest it replaces. A retry keeps the first attempt's
    record. Returns the claims, and the manifest the commit replaces (a retry's: the
    one its first attempt recorded, which it may have kept aside since)."""
    claims = claims if claims is not None else claim_output(output)
    if claims.refusal():
        raise OutputNotOurs(claims.refusal())
    run_id = temp_dir.rstrip("/").rsplit("/", 1)[-1].removeprefix("tmp-")
    if commit_journaled(output, run_id):
        return claims, commit_replaces(output, run_id)
    prefix = files.join(output, "")
    recorded = []
    for src, dst in renames:
        if dst.startswith(prefix):
            claim = (digests or {}).get(dst)
            if claim is None:
                data = files.read_bytes_if_exists(src)
                if data is None:
                    continue  # Moved by an earlier attempt, whose record was pruned since.
                claim = file_claim("", data)
            recorded.append(dataclasses.replace(claim, path=dst[len(prefix):], source=src[len(prefix):]))
    journal_commit(output, run_id, recorded, claims.manifest)
    return claims, claims.manifest


def _publish_manifest(output: str, temp_dir: str, manifest: bytes) -> str:
    """Puts ``manifest`` at ``OUT/manifest.json`` whole: locally a rename of a copy in
    the temporary folder (the staged one stays, for a retry), on GCS one object write."""
    path = files.join(output, MANIFEST_NAME)
    if files.is_local(path):
        publishing = files.join(temp_dir, MANIFEST_NAME + ".publish")
        files.write_bytes(publishing, manifest)
        os.replace(publishing, path)
    else:
        files.write_bytes(path, manifest)
    return path


def publish(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
            manifest: bytes, verified: Mapping[str, StoredObject | None] | None = None,
            claims: OutputClaims | None = None,
            digests: Mapping[str, Claim] | None = None,
            remove_parts: bool = False, remove_inputs: bool = False) -> Published:
    """Moves verified shards to their final names, publishes the manifest, then removes
    what the old dataset had that the new one does not. Safe to run again after a
    crash or a retry at any point, with the same arguments: it ends with the same
    published dataset.

    In order:

    1. the manifest and the commit's decisions (what it will remove) are staged in
       the temporary folder (a retry staging the same manifest keeps the first
       attempt's decisions); the journal records what will reach a final name;
    2. every file still in the temporary folder is checked to be the object its
       verification read, and every file no longer there to be, by size and
       checksum, at its final name (moved by an earlier attempt); either failing
       stops the commit here;
    3. the moves that replace nothing the published manifest lists are made (locally
       a rename each; on GCS a copy of the verified generation and a delete, many at
       a time); then, only if some move would put other bytes where the published
       manifest lists a file, that manifest is moved to ``tmp-<run>/previous/`` (no
       manifest may list a file being replaced) and those moves are made, each
       after the file it replaces is kept there too (locally a rename; on GCS a
       copy of the listed generation: one request more a file); a retry uses the
       manifest its first attempt recorded in the journal, keeps nothing twice
       (what is in ``previous/`` stays as it is) and never keeps a new file;
    4. the manifest is published (skipped when ``manifest.json`` already holds these
       bytes: a finished commit is never unpublished);
    5. the stale shards, part folders and files decided in step 1 are removed.

    The temporary folder is left for the caller, to remove after its report.

    Args:
      output: the output folder.
      temp_dir: this run's temporary folder (holds the shards; the manifest and
        ``commit.json`` are staged there).
      renames: ``(temp_path, final_path)`` of every shard (and ``inputs.jsonl``).
      manifest: the manifest's bytes.
      verified: ``{temp_path: StoredObject}`` of the shards, as their verification
        read them. Each is moved only if its temporary file still is that object
        (checked before anything moves, and again as it moves: locally its ``lstat``
        right before the rename; on GCS the copy names the verified generation). A
        temporary path not in it (the run's own ``inputs.jsonl``) is moved as it
        is; one mapped to ``None`` is refused.
      claims: what of ``output`` this product wrote, found before the commit
        (``claim_output``; found here when ``None``).
      digests: by final path, the size and checksums of what goes there (the
        journal records them, and a retry recognizes a move already made by them).
      remove_parts: remove the output's part folders once published (a full run).
      remove_inputs: remove the output's ``inputs.jsonl`` once published (a run
        that writes none).

    Raises:
      OutputNotOurs: the output holds files this product cannot prove it wrote
        where the commit would put or remove its own (nothing was moved).
      ShardChangedError: a shard is not the object verified (see ``verified``).
      OSError: a move failed (no manifest written).
    """
    verified, digests = verified or {}, digests or {}
    claims = claims if claims is not None else claim_output(output)
    state = _stage(output, temp_dir, manifest, renames, claims, remove_parts, remove_inputs)
    claims, old = _journal_renames(output, temp_dir, renames, claims, digests)
    hold_point("before_commit")
    manifest_path = files.join(output, MANIFEST_NAME)
    if files.read_bytes_if_exists(manifest_path) != manifest:
        sources = list_objects(temp_dir) if is_gcs(temp_dir) else {}
        moves = _pending_moves(output, temp_dir, renames, verified, digests, sources)
        listed = _listed_content(old)
        replaces = [_replaces_listed(output, m, listed) for m in moves]
        first = [m for m, replacing in zip(moves, replaces) if not replacing]
        replacing, manifest_generation = _asides(output, temp_dir,
                                                 [m for m, r in zip(moves, replaces) if r], sources)
        ordered = first + replacing
        half = len(ordered) // 2
        cuts = sorted({0, len(first), half, len(ordered)})
        for begin, end in zip(cuts, cuts[1:]):
            if begin == len(first):
                _keep_manifest_aside(output, temp_dir, manifest_generation)
            if begin == half and begin:
                hold_point("mid_commit")
            _move_all(ordered[begin:end])
        hold_point("manifest_staged")
        _publish_manifest(output, temp_dir, manifest)
    hold_point("manifest_published")
    files.delete_files([files.join(output, name) for name in state.stale_shards + state.stale_files])
    for part in state.parts:
        remove_folder(files.join(output, part))
    return Published(manifest_path, state.stale_shards, state.parts)


def register_part(output: str, entry: dict) -> str:
    """Lists a published part in the dataset's ``manifest.json`` (replaced whole:
    an atomic rename locally, one object write on GCS), with the dataset's totals;
    returns the new manifest's SHA-256. Listing the same part again (a retried
    commit) changes nothing: a manifest that already says so is not written again.

    Call only while holding the dataset's lock, after the part's own manifest was
    published: a part the root manifest does not list is not part of the dataset
    (the next incremental run removes such a folder).
    """
    path = files.join(output, MANIFEST_NAME)
    current = files.read_bytes(path)
    manifest = json.loads(current.decode("utf-8-sig"))
    parts = [p for p in manifest.get("parts", []) if p.get("path") != entry["path"]] + [entry]
    manifest["parts"] = parts
    splits: dict[str, dict] = {}
    for source in [{"splits": {k: {"records": v["records"], "num_shards": v["num_shards"]}
                               for k, v in manifest["splits"].items()}}, *parts]:
        for split, info in source["splits"].items():
            total = splits.setdefault(split, {"records": 0, "num_shards": 0})
            total["records"] += info["records"]
            total["num_shards"] += info["num_shards"]
    manifest["dataset"] = {"parts": len(parts), "records": sum(s["records"] for s in splits.values()),
                           "splits": dict(sorted(splits.items()))}
    data = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    if data == current:
        return hashlib.sha256(data).hexdigest()
    if files.is_local(path):
        staged = files.join(output, WORK_DIR, f"{MANIFEST_NAME}.{uuid.uuid4().hex[:8]}")
        files.write_bytes(staged, data)
        os.replace(staged, path)
    else:
        files.write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()
