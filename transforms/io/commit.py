"""The commit protocol of an output folder: one run at a time, shards published by
rename, ``manifest.json`` last.

A run takes the folder's lock (``OUT/.beam-tfrecords/lock.json``, created only if
absent: ``O_EXCL`` locally, a generation precondition on GCS), removes what
killed runs left in ``OUT/.beam-tfrecords/``, and writes every shard under
``OUT/.beam-tfrecords/tmp-<run_id>/``. Only when every shard verified does
``publish`` move them to their final names and write the manifest:

1. the new manifest is staged in the run's temporary folder;
2. the old ``manifest.json`` (if any) is removed, so no manifest ever lists a
   shard that is being replaced;
3. each shard is renamed to its final name (a metadata operation locally; a
   server-side copy on GCS);
4. the manifest is published: an atomic rename locally, one object write on GCS.

A reader that trusts only ``manifest.json`` therefore never sees a partial or
torn shard. A process killed inside step 3 leaves a folder without a manifest
(``verify`` fails it) whose final names hold some verified shards; the next
run, which needs no ``--overwrite`` there, replaces or removes them: before
step 2, the commit records in the output's journal (``transforms.io.ownership``)
every file it is about to put at a final name, with its size and checksums, and
the manifest it replaces, so that the next run can prove those files are this
product's. Cleanup removes only what is proved so (never a user's file of a
shard-like name, never a user's ``part-*`` folder), by literal path, and never
through a symbolic link.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import socket
import uuid
from collections.abc import Mapping, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.inputs import PART_PREFIX
from beam_tfrecords.schemas.manifest import MANIFEST_NAME
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.gcs import create_if_absent, is_gcs
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
    "acquire_lock",
    "new_run_id",
    "publish",
    "register_part",
    "release_lock",
    "remove_folder",
    "remove_parts",
    "remove_stale_shards",
    "remove_stale_temporaries",
]

LOCK_NAME = "lock.json"


class OutputBusyError(RuntimeError):
    """Another run holds the output folder's lock."""


def new_run_id() -> str:
    """A run id that sorts by start time: ``20261123T051200Z-1a2b3c4d``."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


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


def _holder(run_id: str) -> dict:
    pid = os.getpid()
    return {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _process_start(pid),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _is_gone(holder: dict) -> bool:
    """Whether the holder was a process on this machine that no longer runs."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
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


def acquire_lock(output: str, run_id: str) -> dict:
    """Takes the output folder's lock for ``run_id``.

    A lock left by a process of this machine that no longer runs (killed, or
    crashed) is taken over.

    Returns:
      What the lock file now says.

    Raises:
      OutputBusyError: naming the run that holds it.
    """
    path = _lock_path(output)
    holder = _holder(run_id)
    data = (json.dumps(holder, indent=2) + "\n").encode("utf-8")
    for _ in range(2):
        if _create(path, data):
            return holder
        text = files.read_text_if_exists(path)
        if text is None:
            continue  # Released between our attempt and our read.
        try:
            other = json.loads(text)
        except ValueError:
            other = {}
        if isinstance(other, dict) and other and _is_gone(other):
            files.delete_files([path])
            continue
        other = other if isinstance(other, dict) else {}
        raise OutputBusyError(
            f"--output {output} is being written by another run "
            f"(run {other.get('run_id', '?')}, pid {other.get('pid', '?')} on "
            f"{other.get('host', '?')}, since {other.get('started', '?')}); wait for it to "
            f"finish, or delete {path} if that run is gone"
        )
    raise OutputBusyError(f"--output {output}: could not take the lock {path}")


def release_lock(output: str, run_id: str) -> None:
    """Removes the lock if ``run_id`` holds it (so releasing twice is harmless)."""
    path = _lock_path(output)
    text = files.read_text_if_exists(path)
    try:
        holder = json.loads(text) if text else {}
    except ValueError:
        return
    if isinstance(holder, dict) and holder.get("run_id") == run_id:
        files.delete_files([path])
        if files.is_local(path):
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
            manifest: bytes, claims: OutputClaims | None = None,
            digests: Mapping[str, Claim] | None = None) -> Published:
    """Moves verified shards to their final names and publishes the manifest.

    Args:
      output: the output folder.
      temp_dir: this run's temporary folder (holds the shards; the manifest is
        staged there).
      renames: ``(temp_path, final_path)`` of every shard.
      manifest: the manifest's bytes.
      claims: what of ``output`` this product wrote, found before the commit
        (``claim_output``; found here when ``None``).
      digests: by final path, the size and checksums of what goes there (the
        journal records them; a file without one is read and hashed).

    Raises:
      OutputNotOurs: the output holds files this product cannot prove it wrote
        where the commit would put or remove its own (nothing was moved).
    """
    manifest_path = files.join(output, MANIFEST_NAME)
    staged = files.join(temp_dir, MANIFEST_NAME)
    files.write_bytes(staged, manifest)
    claims = _journal_renames(output, temp_dir, renames, claims, digests)
    hold_point("before_commit")
    files.delete_files([manifest_path])
    moves = [(src, dst) for src, dst in renames if src != dst]
    for number, (src, dst) in enumerate(moves):
        if number == len(moves) // 2 and number:
            hold_point("mid_commit")
        if files.is_local(src):
            os.replace(src, dst)
        else:
            try:
                FileSystems.rename([src], [dst])
            except Exception as err:  # The store's error names no object (a GCS batch request).
                raise OSError(f"cannot move {src} to {dst} (no manifest written; a rerun "
                              f"replaces what is at final names): {type(err).__name__}: {err}") from err
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
