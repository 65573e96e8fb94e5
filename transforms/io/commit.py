"""The commit protocol of an output folder: one run at a time, shards published by
rename, ``manifest.json`` last.

A run takes the folder's lock (``OUT/.beam-tfrecords/lock.json``, created only if
absent: ``O_EXCL`` locally, a generation precondition on GCS), removes what
killed runs left in ``OUT/.beam-tfrecords/``, and writes every shard under
``OUT/.beam-tfrecords/tmp-<run_id>/``. Only when every shard verified does
``publish`` move them to their final names and write the manifest:

1. the new manifest is staged in the run's temporary folder;
2. every shard is checked to be the stored object its verification read
   (``stored_object``: a GCS generation; a local file's device, inode, size and
   times): one that is not stops the commit here, with nothing published;
3. the old ``manifest.json`` (if any) is removed, so no manifest ever lists a
   shard that is being replaced;
4. each shard is renamed to its final name, only as the object verified (locally
   a rename right after its ``lstat`` is checked again; on GCS a server-side copy
   of the verified generation, then a delete of that generation);
5. the manifest is published: an atomic rename locally, one object write on GCS.

A reader that trusts only ``manifest.json`` therefore never sees a partial or
torn shard. A process killed inside step 4 leaves a folder without a manifest
(``verify`` fails it) whose final names hold some verified shards; the next
run, which needs no ``--overwrite`` there, replaces or removes them: before
step 2, the commit records in the output's journal (``transforms.io.ownership``)
every file it is about to put at a final name, with its size and checksums, and
the manifest it replaces, so that the next run can prove those files are this
product's. Cleanup removes only what is proved so (never a user's file of a
shard-like name, never a user's ``part-*`` folder), by literal path, and never
through a symbolic link.

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

from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.elements import StoredObject
from beam_tfrecords.schemas.inputs import PART_PREFIX
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
    copy_generation,
    create_if_absent,
    delete_generation,
    is_gcs,
    object_info,
    read_generation,
    replace_generation,
)
from beam_tfrecords.transforms.io.ownership import (
    Claim,
    OutputClaims,
    OutputNotOurs,
    claim_output,
    file_claim,
    is_shard_like,
    journal_commit,
    remove_tree,
    temporary_folders,
)

__all__ = [
    "LOCK_NAME",
    "OutputBusyError",
    "OutputNotOurs",
    "ShardChangedError",
    "acquire_lock",
    "new_run_id",
    "publish",
    "record_job",
    "register_part",
    "release_lock",
    "remove_folder",
    "remove_parts",
    "remove_stale_shards",
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

    Call only while holding the lock: then no other run is writing there.
    """
    own = files.join(output, WORK_DIR, f"tmp-{run_id}")
    stale = [folder for folder in temporary_folders(output) if folder != own]
    for folder in stale:
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


def remove_stale_shards(output: str, keep: set[str], claims: OutputClaims | None = None) -> list[str]:
    """Deletes the shard files in ``output`` that are not in ``keep`` and that this
    product can prove it wrote (``claims``: what ``claim_output`` found before the
    commit; found now when ``None``); returns their names. A shard-like file it
    cannot prove stays where it is."""
    claims = claims if claims is not None else claim_output(output)
    stale = [files.join(output, name) for name in claims.owned
             if is_shard_like(name) and files.join(output, name) not in keep]
    files.delete_files(stale)
    return [path.rsplit("/", 1)[-1] for path in stale]


@dataclasses.dataclass(frozen=True)
class Published:
    """What ``publish`` did: the manifest's path and the stale shards removed."""

    manifest_path: str
    removed_stale_shards: tuple[str, ...]


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


def _check_verified(path: str, verified: StoredObject | None, after: str) -> None:
    """Raises ``ShardChangedError`` unless ``path`` still is the object ``verified``."""
    name = path.rsplit("/", 1)[-1]
    if verified is None:
        raise ShardChangedError(f"shard {name} has no record of the object its verification read; "
                                f"nothing is published unverified ({after})")
    try:
        now = stored_object(path)
    except OSError as err:
        raise ShardChangedError(f"shard {name} in the temporary folder is not the file that was "
                                f"verified ({err}): {after}") from err
    if now != verified:
        changed = [field.name for field in dataclasses.fields(StoredObject)
                   if getattr(now, field.name) != getattr(verified, field.name)]
        raise ShardChangedError(f"shard {name} in the temporary folder was replaced or changed "
                                f"after it was verified ({', '.join(changed)} differ): {after}")


def _move(src: str, dst: str, verified: StoredObject | None, checked: bool) -> None:
    """Moves one file of the commit to its final name; a ``checked`` shard only if it
    is the object ``verified``."""
    after = "no manifest written; a rerun replaces what is at final names"
    if files.is_local(src):
        if checked:
            # Checked right before the rename. What remains is the window between
            # this lstat and os.replace (microseconds), open only to someone who can
            # write to the run's temporary folder, who could as well change a
            # published shard afterwards (which `verify` finds).
            _check_verified(src, verified, after)
        os.replace(src, dst)
        return
    try:
        if is_gcs(src):
            if checked and verified is None:
                _check_verified(src, verified, after)
            generation = verified.generation if checked else object_info(src).generation
            try:
                copy_generation(src, dst, generation)
            except FileNotFoundError as err:
                raise ShardChangedError(f"shard {src.rsplit('/', 1)[-1]} in the temporary folder was "
                                        f"replaced after it was verified ({err}): {after}") from err
            delete_generation(src, generation)  # If that fails, the folder's removal takes it.
        else:
            FileSystems.rename([src], [dst])
    except ShardChangedError:
        raise
    except Exception as err:  # The store's error names no object (a GCS batch request).
        raise OSError(f"cannot move {src} to {dst} ({after}): {type(err).__name__}: {err}") from err


def _journal_renames(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
                     claims: OutputClaims | None, digests: Mapping[str, Claim] | None) -> OutputClaims:
    """Refuses an output holding files this product cannot prove it wrote; then records,
    before anything moves, what is about to reach a final name (size and checksums,
    where from) and the manifest it replaces. Returns the claims."""
    claims = claims if claims is not None else claim_output(output)
    if claims.refusal():
        raise OutputNotOurs(claims.refusal())
    prefix = files.join(output, "")
    recorded = []
    for src, dst in renames:
        if dst.startswith(prefix):
            claim = (digests or {}).get(dst) or file_claim("", files.read_bytes(src))
            recorded.append(dataclasses.replace(claim, path=dst[len(prefix):], source=src[len(prefix):]))
    run_id = temp_dir.rstrip("/").rsplit("/", 1)[-1].removeprefix("tmp-")
    journal_commit(output, run_id, recorded, claims.manifest)
    return claims


def publish(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
            manifest: bytes, verified: Mapping[str, StoredObject | None] | None = None,
            claims: OutputClaims | None = None,
            digests: Mapping[str, Claim] | None = None) -> Published:
    """Moves verified shards to their final names and publishes the manifest.

    Args:
      output: the output folder.
      temp_dir: this run's temporary folder (holds the shards; the manifest is
        staged there).
      renames: ``(temp_path, final_path)`` of every shard.
      manifest: the manifest's bytes.
      verified: ``{temp_path: StoredObject}`` of the shards, as their verification
        read them. Each is moved only if its temporary file still is that object:
        all are checked before anything is touched (so a shard replaced after its
        verification publishes nothing, and the old manifest stays), and each again
        as it moves (locally its ``lstat`` right before the rename; on GCS the copy
        names the verified generation). A temporary path not in it (the run's own
        ``inputs.jsonl``) is moved as it is; one mapped to ``None`` is refused.
      claims: what of ``output`` this product wrote, found before the commit
        (``claim_output``; found here when ``None``).
      digests: by final path, the size and checksums of what goes there (the
        journal records them; a file without one is read and hashed).

    Raises:
      OutputNotOurs: the output holds files this product cannot prove it wrote
        where the commit would put or remove its own (nothing was moved).
      ShardChangedError: a shard is not the object verified (see ``verified``).
      OSError: a move failed (no manifest written).
    """
    verified = verified or {}
    manifest_path = files.join(output, MANIFEST_NAME)
    staged = files.join(temp_dir, MANIFEST_NAME)
    files.write_bytes(staged, manifest)
    claims = _journal_renames(output, temp_dir, renames, claims, digests)
    hold_point("before_commit")
    moves = [(src, dst) for src, dst in renames if src != dst]
    for src, _ in moves:
        if src in verified:
            _check_verified(src, verified[src], "nothing was published")
    files.delete_files([manifest_path])
    for number, (src, dst) in enumerate(moves):
        if number == len(moves) // 2 and number:
            hold_point("mid_commit")
        _move(src, dst, verified.get(src), src in verified)
    hold_point("manifest_staged")
    if files.is_local(staged):
        os.replace(staged, manifest_path)
    else:
        files.write_bytes(manifest_path, manifest)
    removed = remove_stale_shards(output, {dst for _, dst in renames}, claims)
    remove_folder(temp_dir)
    return Published(manifest_path, tuple(removed))


def register_part(output: str, entry: dict) -> str:
    """Lists a published part in the dataset's ``manifest.json`` (replaced whole:
    an atomic rename locally, one object write on GCS), with the dataset's totals;
    returns the new manifest's SHA-256.

    Call only while holding the dataset's lock, after the part's own manifest was
    published: a part the root manifest does not list is not part of the dataset
    (the next incremental run removes such a folder).
    """
    path = files.join(output, MANIFEST_NAME)
    manifest = json.loads(files.read_text(path))
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
    if files.is_local(path):
        staged = files.join(output, WORK_DIR, f"{MANIFEST_NAME}.{uuid.uuid4().hex[:8]}")
        files.write_bytes(staged, data)
        os.replace(staged, path)
    else:
        files.write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def remove_parts(output: str, claims: OutputClaims | None = None) -> list[str]:
    """Deletes the incremental part folders (``part-NNNNN/``) of ``output`` that this
    product can prove it wrote (``claims``, found before the commit; found now when
    ``None``); returns their names (a full run replaces the whole dataset)."""
    claims = claims if claims is not None else claim_output(output)
    names = sorted(name.rstrip("/") for name in claims.owned
                   if name.startswith(PART_PREFIX) and name.endswith("/") and name.count("/") == 1)
    for name in names:
        remove_folder(files.join(output, name))
    return names
