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

The lock (``acquire_lock``, which names its holder and, on Dataflow, its job) is
in ``transforms.io.output_lock``; the checks and the moves of step 2 and 3 of
``publish``, and the keeping aside of the old dataset, in
``transforms.io.commit_moves``. Their public names are imported here as well.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Mapping, Sequence

from beam_tfrecords.schemas.annotations import LABEL_MAP_NAME
from beam_tfrecords.schemas.elements import StoredObject
from beam_tfrecords.schemas.inputs import INPUTS_NAME, PART_PREFIX
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.codec.tfds_metadata import is_tfds_file
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.commit_moves import (
    KEPT_ASIDE,
    ShardChangedError,
    move_to_final_names,
    relative_name,
    stored_object,
)
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.output_lock import (
    LOCK_NAME,
    OutputBusyError,
    acquire_lock,
    holds_lock,
    record_job,
    release_lock,
)
from beam_tfrecords.transforms.io.ownership import (
    Claim,
    OutputClaims,
    OutputNotOurs,
    claim_output,
    commit_claims,
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


def new_run_id() -> str:
    """A run id that sorts by start time: ``20261123T051200Z-1a2b3c4d``."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{uuid.uuid4().hex[:8]}"


_log = logging.getLogger(__name__)


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


COMMIT_STATE = "commit.json"


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
    keep = {relative_name(output, dst) for _, dst in renames}
    letters = tuple(sorted(n for n in claims.owned if n.startswith(DEAD_LETTER_DIR + "/") and n not in keep))
    state = _CommitState(
        digest,
        tuple(sorted(n for n in claims.owned if is_shard_like(n) and n not in keep)),
        tuple(sorted(n.rstrip("/") for n in claims.owned if n.startswith(PART_PREFIX)
                     and n.endswith("/") and n.count("/") == 1)) if remove_parts else (),
        ((INPUTS_NAME,) if remove_inputs and claims.owns(INPUTS_NAME) and INPUTS_NAME not in keep
         else ()) + letters
        # An annotated dataset's label map, replaced by a dataset without one.
        + ((LABEL_MAP_NAME,) if remove_parts and claims.owns(LABEL_MAP_NAME) and LABEL_MAP_NAME not in keep
           else ())
        # TFDS metadata the new dataset does not have (a gzip run, a class feature renamed).
        + tuple(sorted(n for n in claims.owned if is_tfds_file(n) and n not in keep)))
    files.write_bytes(staged, manifest)
    write_atomic(state_path, state.to_bytes())  # Written after the manifest it names.
    return state


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


def _journaled_digests(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
                       digests: Mapping[str, Claim]) -> Mapping[str, Claim]:
    """``digests``, with what the journal recorded of the moves it lacks (a retry's
    dead-letter files, moved by its first attempt: the journal knows their checksums)."""
    if all(dst in digests for _, dst in renames):
        return digests
    run_id = temp_dir.rstrip("/").rsplit("/", 1)[-1].removeprefix("tmp-")
    return {**{files.join(output, c.path): c for c in commit_claims(output, run_id)}, **digests}


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
    5. the stale shards, part folders and files decided in step 1 are removed (the
       old dataset's dead-letter files this commit does not replace among them).

    The temporary folder is left for the caller, to remove after its report.

    Args:
      output: the output folder.
      temp_dir: this run's temporary folder (holds the shards; the manifest and
        ``commit.json`` are staged there).
      renames: ``(temp_path, final_path)`` of every shard (and ``inputs.jsonl``, and
        the dead-letter files, staged in ``tmp-<run>/dead_letter/``).
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
    digests = _journaled_digests(output, temp_dir, renames, digests)
    hold_point("before_commit")
    manifest_path = files.join(output, MANIFEST_NAME)
    if files.read_bytes_if_exists(manifest_path) != manifest:
        move_to_final_names(output, temp_dir, renames, verified, digests, old)
        hold_point("manifest_staged")
        _publish_manifest(output, temp_dir, manifest)
    hold_point("manifest_published")
    files.delete_files([files.join(output, name) for name in state.stale_shards + state.stale_files])
    _remove_empty_letters(output, state)
    for part in state.parts:
        remove_folder(files.join(output, part))
    return Published(manifest_path, state.stale_shards, state.parts)


def _remove_empty_letters(output: str, state: _CommitState) -> None:
    """Locally, ``dead_letter/`` once the commit removed the last file in it (a user's
    file in it keeps it)."""
    if files.is_local(output) and any(n.startswith(DEAD_LETTER_DIR + "/") for n in state.stale_files):
        try:
            os.rmdir(files.join(output, DEAD_LETTER_DIR))
        except OSError:
            pass


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
