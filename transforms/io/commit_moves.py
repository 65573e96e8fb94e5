"""The moves of a commit: the verified files from the run's temporary folder to their
final names, and the published dataset's files they replace kept aside.

``transforms.io.commit`` runs the commit protocol (see there, and its ``publish``,
for the order of the steps); ``move_to_final_names`` is its step 2 and 3: every
file checked before anything moves (a shard still in the temporary folder is the
stored object its verification read, ``stored_object``; a file no longer there is,
by size and checksum, at its final name), then the moves made, locally a rename
each and on GCS a server-side copy of the verified generation and a delete, many
at a time. A move that would put other bytes where the published manifest lists
a file comes last, after that manifest is moved to ``tmp-<run>/previous/``, and
each keeps the file it replaces there first (``KEPT_ASIDE``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence

import google_crc32c
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.elements import ShardResult, StoredObject
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME
from beam_tfrecords.schemas.shards import INDEX_SUFFIX
from beam_tfrecords.transforms.codec.tfds_metadata import tfds_digests
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.gcs import (
    ObjectInfo,
    copy_generation,
    delete_generation,
    is_gcs,
    list_objects,
    object_info,
    parallel,
)
from beam_tfrecords.transforms.io.ownership import Claim

__all__ = [
    "KEPT_ASIDE",
    "ShardChangedError",
    "move_to_final_names",
    "relative_name",
    "shard_moves",
    "stored_object",
]

# In a run's temporary folder: what its commit kept of the published dataset before
# replacing it (``manifest.json``, and each replaced file under its relative name).
KEPT_ASIDE = "previous"
_NOT_PUBLISHED = "nothing was published"
_MID_COMMIT = "no manifest written; a retry of the commit, or the next run, replaces what is at final names"


def shard_moves(results: Sequence[ShardResult]) -> tuple[list[tuple[str, str]], dict[str, Claim],
                                                          dict[str, StoredObject | None]]:
    """The commit's moves of verified shards: each shard to its final name, its index file
    (``<shard>.idx``, uncompressed shards) right after it; what the journal records of each
    (``{final path: Claim}``); and the stored object verification read of each
    (``{temporary path: StoredObject}``), the only one the commit may publish."""
    renames, digests, verified = [], {}, {}
    for r in results:
        renames.append((r.temp_path or r.path, r.path))
        digests[r.path] = Claim(r.path, r.bytes, r.sha256, r.crc32c)
        verified[r.temp_path or r.path] = r.verified_as
        if r.index_path:
            renames.append((r.index_path, r.path + INDEX_SUFFIX))
            digests[r.path + INDEX_SUFFIX] = Claim(r.path + INDEX_SUFFIX, r.index_bytes,
                                                   r.index_sha256, r.index_crc32c)
            verified[r.index_path] = r.index_verified_as
    return renames, digests, verified


class ShardChangedError(OSError):
    """A shard in the run's temporary folder is not the object its verification read."""


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


def relative_name(output: str, path: str) -> str:
    """``path`` relative to the output folder, or ``path`` itself outside it."""
    prefix = files.join(output, "")
    return path[len(prefix):] if path.startswith(prefix) else path


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


def _final_objects(output: str, renames: Sequence[tuple[str, str]]) -> dict[str, ObjectInfo]:
    """On GCS, the objects at the output's top, and in its ``dead_letter/`` when a move
    goes there: one listing each."""
    finals = list_objects(output, below=False)
    letters = files.join(output, DEAD_LETTER_DIR)
    if any(dst.startswith(letters + "/") for _, dst in renames):
        finals.update(list_objects(letters, below=False))
    return finals


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
            finals = _final_objects(output, renames)
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
    """``{path: (size, crc32c, sha256)}`` of what a manifest lists: its shards and
    ``inputs.jsonl`` with checksums, its dead-letter files (``skipped.jsonl`` too)
    without (``(None, '', '')``)."""
    found: dict[str, tuple[int | None, str, str]] = {}
    if not isinstance(manifest, dict):
        return found
    for info in (manifest.get("splits") or {}).values():
        for shard in (info.get("shards") or []) if isinstance(info, dict) else []:
            if isinstance(shard, dict) and isinstance(shard.get("path"), str):
                found[shard["path"]] = (shard.get("bytes"), str(shard.get("crc32c") or ""),
                                        str(shard.get("sha256") or ""))
            index = shard.get("index") if isinstance(shard, dict) else None
            if isinstance(index, dict) and isinstance(index.get("path"), str):  # Its index file.
                found[index["path"]] = (index.get("bytes"), "", str(index.get("sha256") or ""))
    listing = (manifest.get("input") or {}).get("files_list") if isinstance(manifest.get("input"), dict) else None
    if isinstance(listing, dict) and isinstance(listing.get("path"), str):
        found[listing["path"]] = (None, "", str(listing.get("sha256") or ""))
    annotations = manifest.get("annotations")
    label_map = annotations.get("label_map") if isinstance(annotations, dict) else None
    if isinstance(label_map, dict) and isinstance(label_map.get("path"), str):  # An annotated dataset's.
        found[label_map["path"]] = (None, "", str(label_map.get("sha256") or ""))
    bad = manifest.get("bad_records")
    skipped = (manifest.get("input") or {}).get("skipped") if isinstance(manifest.get("input"), dict) else None
    letters = [*(bad.get("dead_letter_files") or [] if isinstance(bad, dict) else []),
               *([skipped.get("file")] if isinstance(skipped, dict) else [])]
    for path in letters:  # Listed without checksums: their content is unknown.
        if isinstance(path, str):
            found.setdefault(path, (None, "", ""))
    return found


def _replaces_listed(output: str, move: _Move, listed: Mapping[str, tuple[int | None, str, str]]) -> bool:
    """Whether ``move`` puts other bytes where the published manifest lists a file."""
    entry = listed.get(relative_name(output, move.dst))
    if entry is None:
        return False
    size, crc, sha = entry
    claim = move.claim
    if not crc and not sha:  # A dead-letter file: other bytes unless proved the same (locally).
        return not (files.is_local(move.dst) and _holds(move.dst, claim, None))
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
            os.makedirs(os.path.dirname(dst), exist_ok=True)  # dead_letter/, the first time.
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
    return files.join(temp_dir, KEPT_ASIDE, relative_name(output, path))


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
    finals = _final_objects(output, [(m.src, m.dst) for m in moves]) if is_gcs(output) else {}

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


def move_to_final_names(output: str, temp_dir: str, renames: Sequence[tuple[str, str]],
                        verified: Mapping[str, StoredObject | None], digests: Mapping[str, Claim],
                        old: dict | None) -> None:
    """Steps 2 and 3 of ``commit.publish``: checks every move (``_pending_moves``),
    makes those that replace nothing the published manifest (``old``) lists, then
    moves that manifest aside and makes the others, each after the file it replaces
    is kept aside (``_asides``). The hold point ``mid_commit`` is half way through.

    Raises:
      ShardChangedError: a file is neither the object verified nor, as verified, at
        its final name (before anything moved), or changed before its move.
      OSError: a move failed.
    """
    sources = list_objects(temp_dir) if is_gcs(temp_dir) else {}
    moves = _pending_moves(output, temp_dir, renames, verified, digests, sources)
    listed = _listed_content(old)
    replaces = [_replaces_listed(output, m, listed) for m in moves]
    if any(replaces):  # The old dataset goes aside: its TFDS metadata too, to restore it whole.
        implied = {name: (None, "", sha) for name, sha in tfds_digests(old).items()}
        replaces = [r or _replaces_listed(output, m, implied) for m, r in zip(moves, replaces)]
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
