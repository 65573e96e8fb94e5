"""Fingerprints of input files: sizes and times from the file system or the GCS
listing, content hashes of local files (see ``schemas.inputs``)."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
from collections.abc import Iterator, Sequence

import numpy as np

from beam_tfrecords.schemas.inputs import InputFile, encode_inputs_chunks, file_line
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.gcs import _client, crc32c_gcs_to_hex, is_gcs

__all__ = ["file_entries", "hash_entries", "local_sha256", "relative_path", "role_entry",
           "table_entries", "table_lines", "write_inputs"]

_HASH_BLOCK = 1 << 20


def relative_path(root: str, path: str) -> str:
    """``path`` relative to ``root`` ('/'-separated), or ``path`` itself outside it."""
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def local_sha256(path: str) -> str:
    """SHA-256 of a local file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _gcs_listing(root: str) -> dict[str, tuple[int, str, str]]:
    """``{gs://path: (size, generation, crc32c hex)}`` of every object under ``root``."""
    bucket, _, prefix = root[len("gs://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    found = {}
    for blob in _client().client.list_blobs(bucket, prefix=prefix):
        crc = crc32c_gcs_to_hex(blob.crc32c) if blob.crc32c else ""
        found[f"gs://{bucket}/{blob.name}"] = (int(blob.size or 0), str(blob.generation or ""), crc)
    return found


def _gcs_object(path: str) -> tuple[int, str, str] | None:
    """``(size, generation, crc32c hex)`` of one ``gs://`` object, ``None`` when absent."""
    bucket, _, name = path[len("gs://"):].partition("/")
    blob = _client().client.bucket(bucket).get_blob(name)
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
    """The entries with the SHA-256 of each local file (read with ``threads``)."""
    def one(item):
        entry, path = item
        if entry.sha256 or not files.is_local(path):
            return entry
        try:
            return InputFile(entry.path, entry.size, entry.mtime_ns, local_sha256(path),
                             role=entry.role)
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
    the bytes ``encode_inputs`` makes of their entries, without holding them."""
    with files.open_write(path) as stream:
        for chunk in encode_inputs_chunks(roles, table_lines(table, rows)):
            stream.write(chunk)


def role_entry(path: str, role: str) -> InputFile:
    """The entry of a file that shapes the records (labels, schema, CSV manifest):
    its content hash always (they are small)."""
    if is_gcs(path):
        size, generation, crc = _gcs_object(path) or (0, "", "")
        return InputFile(path, size, generation=generation, crc32c=crc, role=role)
    info = os.stat(path)
    return InputFile(path, info.st_size, info.st_mtime_ns, local_sha256(path), role=role)
