"""Fingerprints of input files: sizes and times from the file system or the GCS
listing, content hashes of local files (see ``schemas.inputs``)."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence

import numpy as np

from beam_tfrecords.schemas.inputs import InputFile, encode_inputs_chunks, file_line
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.bounded_read import InputRefused, sha256_input
from beam_tfrecords.transforms.io.early_hash import take_early_hash
from beam_tfrecords.transforms.io.gcs import crc32c_gcs_to_hex, is_gcs, storage_client

__all__ = ["file_entries", "hash_entries", "local_sha256", "published_entry", "published_input",
           "published_path", "published_root", "relative_path", "role_entry", "root_identity", "table_entries",
           "table_lines", "write_inputs"]

_encode_text = json.encoder.encode_basestring  # What file_line quotes a path with.

def relative_path(root: str, path: str) -> str:
    """``path`` relative to ``root`` ('/'-separated), or ``path`` itself outside it."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def root_identity(root: str) -> str:
    """What names an input root whatever path reached it: ``sha256:`` and the hex
    SHA-256 of its resolved path (a local folder's ``realpath``, so a symlinked
    root is the folder it leads to; a ``gs://`` root as written, without a final
    slash). Published in the manifest (``input.root_id``) instead of the path,
    and compared by ``--skip_unchanged`` and ``--incremental``."""
    resolved = os.path.realpath(root) if files.is_local(root) else root.rstrip("/")
    return "sha256:" + hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()


def published_root(root: str) -> str:
    """How a manifest names an input root: a local folder by its name only (the
    folders above it are the machine's, not the dataset's, and a published
    dataset must not carry them: user names, mount points); a ``gs://`` root as
    written (the same place for every reader). ``root_identity`` tells roots apart."""
    if not files.is_local(root):
        return root.rstrip("/")
    return os.path.basename(os.path.normpath(root)) or "/"


def published_path(root: str, path: str | None) -> str | None:
    """How published files name an input path: relative to ``root`` when under it,
    a ``gs://`` path as written, another local path by its file name only."""
    if path is None:
        return None
    relative = relative_path(root, path)
    if relative != path or not files.is_local(path):
        return relative
    return os.path.basename(path.rstrip("/")) or path


def published_input(root: str, path: str) -> str:
    """How the manifest's options name ``--input``: the root as ``published_root``
    names it, then the rest of the path (a glob's pattern, a CSV manifest's name)."""
    name = published_root(root)
    rest = relative_path(root, path)
    if rest == path:  # The root itself (or outside it: named as other inputs are).
        return name if path.rstrip("/") == root.rstrip("/") else published_path(root, path)
    return f"{name.rstrip('/')}/{rest}"


def published_entry(entry: InputFile, root: str) -> InputFile:
    """A fingerprint entry as ``inputs.jsonl`` publishes it (``published_path``)."""
    return dataclasses.replace(entry, path=published_path(root, entry.path))


def local_sha256(path: str, size: int | None = None) -> str:
    """SHA-256 of a local file's bytes, hex, read a block at a time: a regular file
    only (a FIFO or device raises ``OSError``, unread) and, with ``size`` (the
    listed size), at most that plus one byte (another count raises ``OSError``)."""
    try:
        return sha256_input(path, size)
    except InputRefused as refused:
        raise OSError(refused.message) from None


def _gcs_listing(root: str) -> dict[str, tuple[int, str, str]]:
    """``{gs://path: (size, generation, crc32c hex)}`` of every object under ``root``."""
    bucket, _, prefix = root[len("gs://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    found = {}
    for blob in storage_client().list_blobs(bucket, prefix=prefix):
        crc = crc32c_gcs_to_hex(blob.crc32c) if blob.crc32c else ""
        found[f"gs://{bucket}/{blob.name}"] = (int(blob.size or 0), str(blob.generation or ""), crc)
    return found


def _gcs_object(path: str) -> tuple[int, str, str] | None:
    """``(size, generation, crc32c hex)`` of one ``gs://`` object, ``None`` when absent
    or refused (403: the object's read then says so, as a dead letter)."""
    from google.api_core.exceptions import Forbidden, Unauthorized  # pylint: disable=import-outside-toplevel

    bucket, _, name = path[len("gs://"):].partition("/")
    try:
        blob = storage_client().bucket(bucket).get_blob(name)
    except (Forbidden, Unauthorized):
        return None
    if blob is None:
        return None
    return int(blob.size or 0), str(blob.generation or ""), (crc32c_gcs_to_hex(blob.crc32c) if blob.crc32c else "")


def file_entries(root: str, paths: Sequence[tuple[str, int]], names: Sequence[str] | None = None
                 ) -> list[InputFile]:
    """Entries (size and time, or GCS generation and crc32c) of ``(path, size)``
    files, named by ``names`` (default: relative to ``root``). Content hashes of
    local files are not computed here."""
    names = names or [relative_path(root, path) for path, _ in paths]
    # A local CSV manifest's gs:// rows are looked up one by one (its folder is no bucket).
    listing = _gcs_listing(root) if is_gcs(root) and any(is_gcs(path) for path, _ in paths) else {}
    entries = []
    for (path, size), name in zip(paths, names):
        if is_gcs(path):
            found = listing.get(path)
            if found is None:  # Outside the root (a CSV manifest may point anywhere).
                found = _gcs_object(path) or (size, "", "")
            entries.append(InputFile(name, found[0], generation=found[1], crc32c=found[2]))
        elif files.is_local(path):
            try:
                info = os.stat(path)
            except OSError:
                entries.append(InputFile(name, size))
                continue
            entries.append(InputFile(name, info.st_size, info.st_mtime_ns))
        else:
            entries.append(InputFile(name, size))
    return entries


def hash_entries(entries: Sequence[InputFile], paths: Sequence[str], threads: int = 8) -> list[InputFile]:
    """The entries with the SHA-256 of each local file (read with ``threads``; one the
    CLI hashed at its start, unchanged since, is not read again: ``io.early_hash``)."""
    def one(item):
        entry, path = item
        if entry.sha256 or not files.is_local(path):
            return entry
        early = "" if entry.role else take_early_hash(path, entry.size, entry.mtime_ns)
        try:
            return InputFile(entry.path, entry.size, entry.mtime_ns,
                             early or local_sha256(path, None if entry.role else entry.size), role=entry.role)
        except OSError:
            return entry
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="hash-input") as pool:
        return list(pool.map(one, zip(entries, paths)))


def _stamp_columns(table) -> tuple[str, np.ndarray, np.ndarray]:
    """Which field a table's stamps are (``mtime_ns``, ``generation`` or '')."""
    kind = "generation" if is_gcs(table.root) else "mtime_ns" if files.is_local(table.root) else ""
    return kind, table.stamps, table.crcs


def _rows(table, rows: np.ndarray, block: int = 1 << 16):
    """``(path, size, mtime_ns, generation, crc32c)`` of a table's ``rows``, a block at a time
    (the listing's stamps, as ``file_entries`` would find them)."""
    kind, stamps, crcs = _stamp_columns(table)
    view = memoryview(table.blob)
    for start in range(0, len(rows), block):
        part = rows[start:start + block]
        begins = table.offsets[part].tolist()
        ends = table.offsets[part + 1].tolist()
        sizes = table.sizes[part].tolist()
        marks = stamps[part].tolist() if kind else [0] * len(part)
        crc = crcs[part].tolist()
        for b, e, size, mark, c in zip(begins, ends, sizes, marks, crc):
            name = str(view[b:e], "utf-8")
            if kind == "generation":
                yield name, size, 0, str(mark) if mark else "", "%08x" % c if c >= 0 else ""
            else:
                yield name, size, mark, "", ""


def table_entries(table, rows: np.ndarray | None = None) -> list[InputFile]:
    """The fingerprint entries of a ``RefTable``'s images (of ``rows``, default all),
    from what the listing said of each file: what ``file_entries`` gives for them,
    without a second listing or a ``stat`` per file."""
    rows = np.arange(len(table)) if rows is None else np.asarray(rows, np.int64)
    return [InputFile(name, size, mtime, generation=gen, crc32c=crc)
            for name, size, mtime, gen, crc in _rows(table, rows)]


def table_lines(table, rows: np.ndarray | None = None) -> Iterator[str]:
    """``inputs.jsonl`` lines of a table's images (``rows``, default all), in path
    order (``schemas.inputs.file_line``), made a block at a time."""
    order = table.path_order()
    if rows is not None:
        order = order[np.isin(order, rows)]
    return (file_line(*row) for row in _rows(table, order))


def write_inputs(path: str, roles: Sequence[InputFile], table, rows: np.ndarray | None = None) -> None:
    """Writes ``inputs.jsonl`` of the files with a role and a table's images as a stream:
    the bytes ``encode_inputs`` makes of their entries, without holding them (a local
    listing's lines made a block of 8,192 rows' columns at a time, ``_local_blocks``).

    Raises:
      ValueError: when an entry of ``roles`` has no role.
    """
    kind = _stamp_columns(table)[0]
    with files.open_write(path) as stream:
        if kind != "mtime_ns":
            for chunk in encode_inputs_chunks(roles, table_lines(table, rows)):
                stream.write(chunk)
            return
        for chunk in encode_inputs_chunks(roles, iter(())):  # The check, then the role files' lines.
            stream.write(chunk)
        order = table.path_order()
        if rows is not None:
            order = order[np.isin(order, rows)]
        for block in _local_blocks(table, order):
            stream.write(block)


def _local_blocks(table, rows: np.ndarray, block: int = 1 << 13) -> Iterator[bytes]:
    """``file_line`` of a local listing's ``rows``, a block of rows at a time, as UTF-8:
    each line one f-string of its columns (paths as JSON strings in one call each)."""
    view = memoryview(table.blob)
    for start in range(0, len(rows), block):
        part = rows[start:start + block]
        marks = table.stamps[part]
        if not marks.all():  # A time of 0 is left out of its line: line by line.
            yield "".join(file_line(*row) for row in _rows(table, part)).encode("utf-8")
            continue
        names = [str(view[b:e], "utf-8") for b, e in zip(table.offsets[part].tolist(),
                                                          table.offsets[part + 1].tolist())]
        yield "".join([f'{{"path": {name}, "size": {size}, "mtime_ns": {mark}}}\n' for name, size, mark in
                       zip(map(_encode_text, names), table.sizes[part].tolist(), marks.tolist())]).encode("utf-8")


def role_entry(path: str, role: str) -> InputFile:
    """The entry of a file that shapes the records (labels, schema, CSV manifest):
    its content hash always (they are small)."""
    if is_gcs(path):
        size, generation, crc = _gcs_object(path) or (0, "", "")
        return InputFile(path, size, generation=generation, crc32c=crc, role=role)
    info = os.stat(path)
    return InputFile(path, info.st_size, info.st_mtime_ns, local_sha256(path), role=role)
