"""File access on any Beam filesystem (local paths, ``gs://``), one code path for all.

Beam's ``FileSystems`` is used for everything; plain local paths take a direct
``open`` where it saves per-call overhead on datasets of many small files.
Compression is never inferred from file names: shards are read and written as
the bytes they are.
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import itertools
import os
import posixpath
import re
import shutil
import stat
from collections.abc import Iterator

from apache_beam.io.filesystem import BeamIOError, CompressionTypes, FileSystem
from apache_beam.io.filesystems import FileSystems

# Imported for its effect: with STORAGE_EMULATOR_HOST set, every process that reaches
# GCS through this module (CLI, Beam workers, shard-writer helpers) connects to the
# emulator anonymously at once, instead of 15-30 s of Beam credential retries.
from beam_tfrecords.transforms.io import gcs as _gcs  # noqa: F401  pylint: disable=unused-import
from beam_tfrecords.transforms.io.folder_walk import FolderFiles, take_early_walk, walk_folder

__all__ = [
    "delete_files",
    "exists",
    "folder_batches",
    "is_local",
    "join",
    "link_outside",
    "list_files",
    "list_stamped",
    "list_under",
    "list_unit",
    "listing_units",
    "open_read",
    "open_write",
    "read_bytes",
    "read_bytes_if_exists",
    "read_range",
    "read_text",
    "read_text_if_exists",
    "write_bytes",
]

_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")
_GLOB = re.compile(r"[*?\[]")
_RAW = CompressionTypes.UNCOMPRESSED


def is_local(path: str) -> bool:
    """Whether ``path`` is a plain local path (no ``scheme://``)."""
    return not _URI.match(path)


def join(base: str, *parts: str) -> str:
    """Joins with '/', for local paths and URIs alike."""
    return posixpath.join(base.rstrip("/") if len(base) > 1 else base, *parts)


def open_read(path: str):
    """A binary stream of the file's stored bytes (a ``gs://`` object through the
    process's one storage client: ``gcs.open_object``, whose errors name the object)."""
    if is_local(path):
        return open(path, "rb")  # noqa: SIM115 - the caller closes it.
    if _gcs.is_gcs(path):
        return _gcs.open_object(path)
    return FileSystems.open(path, compression_type=_RAW)


def read_range(path: str, start: int, end: int, block: int = 1 << 20) -> Iterator[bytes]:
    """Bytes ``[start, end)`` of ``path``, at most ``block`` at a time.

    Raises:
      OSError: when the file ends before ``end``.
    """
    with open_read(path) as stream:
        stream.seek(start)
        left = end - start
        while left > 0:
            data = stream.read(min(block, left))
            if not data:
                raise OSError(f"{path} ends before byte {end}")
            left -= len(data)
            yield data


def open_write(path: str):
    """A binary stream that creates (or replaces) the file; parents are created."""
    return FileSystems.create(path, mime_type="application/octet-stream", compression_type=_RAW)


def read_bytes(path: str) -> bytes:
    """The whole file."""
    with open_read(path) as stream:
        return stream.read()


def read_text(path: str) -> str:
    """The whole file as UTF-8 text (a leading BOM is dropped)."""
    return read_bytes(path).decode("utf-8-sig")


def read_text_if_exists(path: str) -> str | None:
    """The file as UTF-8 text, or ``None`` when there is no such file."""
    data = read_bytes_if_exists(path)
    return None if data is None else data.decode("utf-8-sig")


def read_bytes_if_exists(path: str) -> bytes | None:
    """The file's bytes, or ``None`` when there is no such file."""
    try:
        return read_bytes(path)
    except FileNotFoundError:
        return None
    except Exception as err:  # pylint: disable=broad-except
        # GCS reports a missing object as google.api_core's NotFound (a 404).
        if getattr(err, "code", None) == 404 or type(err).__name__ == "NotFound":
            return None
        raise


def write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` as the whole file."""
    with open_write(path) as stream:
        stream.write(data)


def exists(path: str) -> bool:
    """Whether the file exists."""
    return FileSystems.exists(path)


def _walk_local(folder: str, skipped: list | None = None, stamped: bool = False,
                follow_outside: bool = True) -> Iterator[tuple]:
    """``(path, size)`` of every regular file under a local folder, each file once
    (``stamped``: ``(path, size, mtime_ns, -1)``, see ``list_stamped``), in the
    order and with the notes of ``folder_walk.walk_folder``."""
    for batch in walk_folder(folder, skipped, follow_outside):
        paths = map(batch.prefix.__add__, batch.names)
        if stamped:
            yield from zip(paths, batch.sizes, batch.stamps, itertools.repeat(-1))
        else:
            yield from zip(paths, batch.sizes)


def folder_batches(pattern: str, skipped: list | None = None,
                   follow_outside: bool = False) -> Iterator[FolderFiles] | None:
    """``list_stamped`` of a whole local folder (``FOLDER/**``) as the files of one
    folder at a time (``folder_walk.walk_folder``): the same files, in the same
    order, with the same notes in ``skipped``; ``None`` for any other pattern.
    The walk the launcher started early for that folder and ``follow_outside``
    (``folder_walk.walk_early``), if any, gives them."""
    if not (is_local(pattern) and pattern.endswith("/**")) or _GLOB.search(pattern[:-3]):
        return None
    folder = os.path.dirname(pattern[:-2]) or "."
    if pattern != folder + "/**":
        return None
    early = take_early_walk(folder, follow_outside, skipped)
    return early if early is not None else walk_folder(folder, skipped, follow_outside)


def list_files(pattern: str, limit: int | None = None, skipped: list | None = None,
               follow_outside: bool = True) -> list[tuple[str, int]]:
    """``(path, size)`` of files matching a glob (``**`` crosses folders).

    Patterns follow Beam's ``FileSystems.match`` (``*`` stays inside a folder).
    Local globs are matched with the same rules but walked directly, which is
    several times faster on folders of many small files; there, what is passed
    over (links met twice, link loops, FIFOs and devices, unreadable folders, and
    without ``follow_outside`` links leading outside the walked folder) is added
    to ``skipped`` as ``(path, reason, message)`` (see ``_walk_local``).
    """
    if is_local(pattern) and _GLOB.search(pattern):
        folder = os.path.dirname(re.match(r"^[^[*?]*", pattern).group(0)) or "."
        found = _walk_local(folder, skipped, follow_outside=follow_outside)
        if pattern != folder + "/**":  # Everything under the folder matches that one.
            matches = re.compile(FileSystem.translate_pattern(pattern)).match
            found = (item for item in found if matches(item[0]))
        return list(itertools.islice(found, limit))
    result = FileSystems.match([pattern], limits=[limit] if limit is not None else None)[0]
    return [(m.path, m.size_in_bytes) for m in result.metadata_list]


def list_stamped(pattern: str, skipped: list | None = None,
                 follow_outside: bool = False) -> Iterator[tuple[str, int, int, int]]:
    """``(path, size, stamp, crc)`` of files matching a glob, as a stream: what
    ``list_files`` finds, with what the listing says of each file besides its size.

    ``stamp`` is a local file's modification time in ns, or a ``gs://`` object's
    generation; ``crc`` a ``gs://`` object's CRC-32C (as an int; -1 elsewhere).
    These are the input fingerprint's entries (``schemas.inputs``), taken from
    the one listing, so nothing is listed or stat-ed twice. On GCS the objects
    under the pattern's fixed prefix are listed a page at a time and matched
    with Beam's rules (``FileSystem.translate_pattern``); on other file systems
    the stamp is 0. A local walk passes over links that lead outside the folder
    above the pattern's first wildcard unless ``follow_outside`` (these are the
    inputs: ``--follow_links_outside``).
    """
    if is_local(pattern) and _GLOB.search(pattern):
        folder = os.path.dirname(re.match(r"^[^[*?]*", pattern).group(0)) or "."
        found = _walk_local(folder, skipped, stamped=True, follow_outside=follow_outside)
        if pattern != folder + "/**":
            matches = re.compile(FileSystem.translate_pattern(pattern)).match
            found = (item for item in found if matches(item[0]))
        return found
    if _gcs.is_gcs(pattern) and _GLOB.search(pattern):
        return _list_gcs(pattern)
    return ((path, size, 0, -1) for path, size in list_files(pattern, skipped=skipped))


# Listing a gs:// glob: the prefixes under its fixed part are listed side by side
# (GCS pages a listing 1,000 objects at a time, each page a round trip), by this
# many threads, once the folders found down to _PREFIX_DEPTH levels are at least
# _MIN_PREFIXES (fewer: one listing, as before).
LIST_THREADS = 8
_MIN_PREFIXES = 4
_PREFIX_DEPTH = 3
# Only what list_stamped reads of an object: a smaller page to send and to parse.
_LIST_FIELDS = "items(name,size,generation,crc32c),prefixes,nextPageToken"


def _stamped_blob(blob, head: str) -> tuple[str, int, int, int]:
    crc = int.from_bytes(base64.b64decode(blob.crc32c), "big") if blob.crc32c else -1
    return head + blob.name, int(blob.size or 0), int(blob.generation or 0), crc


def _gcs_pattern(pattern: str):
    """``(bucket, fixed prefix, matches, head)`` of a ``gs://`` glob."""
    bucket, _, prefix = re.match(r"^[^[*?]*", pattern).group(0)[len("gs://"):].partition("/")
    return bucket, prefix, re.compile(FileSystem.translate_pattern(pattern)).match, f"gs://{bucket}/"


def _gcs_listed(client, bucket: str, head: str, unit: str, delimiter: str | None = None):
    """``(objects, subfolders)`` under the name prefix ``unit`` (objects as ``list_stamped``
    gives them; subfolders only with a ``delimiter``)."""
    pages = client.list_blobs(bucket, prefix=unit, delimiter=delimiter, fields=_LIST_FIELDS)
    found = [_stamped_blob(blob, head) for blob in pages]
    return found, sorted(pages.prefixes) if delimiter else []


def _gcs_units(client, pool, bucket: str, prefix: str, head: str, min_units: int,
               depth: int = _PREFIX_DEPTH) -> list[tuple[str, list | None]]:
    """The listing units under ``prefix``, in name order: ``(folder, None)`` for a
    folder to list whole, ``(name, [object])`` for an object found beside the
    folders. Folders are found with delimiter listings, level by level, down to
    ``depth`` levels or until there are ``min_units``; listing the units in this
    order gives the order of one listing of the prefix (the objects under a
    folder ``p/`` sort together; an object beside them sorts by its own name)."""
    units: list[tuple[str, list | None]] = []
    folders = [prefix]
    for _ in range(depth):
        below = []
        for objects, subfolders in pool.map(lambda unit: _gcs_listed(client, bucket, head, unit, "/"),
                                            folders):
            units += [(item[0][len(head):], [item]) for item in objects]
            below += subfolders
        folders = below
        if len(folders) >= min_units or not folders:
            break
    units += [(folder, None) for folder in folders]
    units.sort(key=lambda unit: unit[0])
    return units


def _list_gcs(pattern: str, threads: int | None = None) -> Iterator[tuple[str, int, int, int]]:
    """``list_stamped`` of a ``gs://`` glob, in the order GCS lists (by name).

    The folders under the glob's fixed prefix are found with delimiter listings
    (``_gcs_units``), then each is listed whole by a pool of ``threads``, and
    they are yielded in name order: the order of one listing of the bucket.
    """
    bucket, prefix, matches, head = _gcs_pattern(pattern)
    threads = LIST_THREADS if threads is None else threads
    try:
        client = _gcs.storage_client()
        if threads <= 1:
            units: list[tuple[str, object]] = [(prefix, None)]
        else:
            with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="list-gcs") as pool:
                units = _gcs_units(client, pool, bucket, prefix, head, _MIN_PREFIXES)
        with concurrent.futures.ThreadPoolExecutor(max(threads, 1), thread_name_prefix="list-gcs") as pool:
            # A window of folders listed ahead of the one yielded: memory stays that of
            # a few folders' objects, not of the bucket's.
            ahead: collections.deque = collections.deque()
            remaining = iter(units)
            while True:
                for unit, objects in itertools.islice(remaining, max(2 * threads, 1) - len(ahead)):
                    ahead.append(objects if objects is not None else
                                 pool.submit(_gcs_listed, client, bucket, head, unit))
                if not ahead:
                    break
                first = ahead.popleft()
                for item in first if isinstance(first, list) else first.result()[0]:
                    if matches(item[0]):
                        yield item
    except Exception as err:  # pylint: disable=broad-except  # As FileSystems.match reports it.
        raise BeamIOError("List operation failed", {pattern: err}) from err


# --list_on_workers: a folder holding more objects than this directly (not in
# subfolders) is a unit of its own, listed whole by a worker; the launcher lists
# no further into it.
UNIT_OBJECTS = 1000
# Objects met beside the folders travel in the job's graph: past this many, the
# level that met them is left to the workers.
INLINE_OBJECTS = 10_000


def _folder_level(client, bucket: str, head: str, folder: str, limit: int):
    """``(objects, subfolders)`` directly in ``folder`` (a delimiter listing, page by
    page); ``None`` once it has more than ``limit`` objects (a unit of its own)."""
    objects: list = []
    subfolders: list[str] = []
    pages = client.list_blobs(bucket, prefix=folder, delimiter="/", fields=_LIST_FIELDS)
    for page in pages.pages:
        objects += [_stamped_blob(blob, head) for blob in page]
        subfolders += page.prefixes
        if len(objects) > limit:
            return None
    return objects, sorted(subfolders)


def listing_units(pattern: str, min_units: int, limit: int | None = None
                  ) -> list[tuple[str, tuple | None]]:
    """A ``gs://`` glob's objects as units for workers to list side by side:
    ``(folder, None)`` for a folder a worker lists whole, or ``(first name,
    objects)`` for a run of consecutive objects the launcher met (only those the
    glob matches). In order, the units' objects are ``list_stamped(pattern)``.

    Folders are listed with a delimiter, level by level (down to
    ``_PREFIX_DEPTH`` levels), while there are fewer than ``min_units`` units;
    a folder with more than ``limit`` objects directly in it (default
    ``UNIT_OBJECTS``) is not listed further: it is a unit. A level below the
    first that finds no folder, or that brings the objects met past
    ``INLINE_OBJECTS``, is undone: its folders are units. So the launcher lists
    the folder tree and the few objects beside it, never a large folder's objects,
    and at most ``INLINE_OBJECTS`` objects go into the job.
    """
    bucket, prefix, matches, head = _gcs_pattern(pattern)
    limit = UNIT_OBJECTS if limit is None else limit
    found: list[tuple[str, list | None]] = []
    try:
        client = _gcs.storage_client()
        with concurrent.futures.ThreadPoolExecutor(LIST_THREADS, thread_name_prefix="list-gcs") as pool:
            folders = [prefix]
            for depth in range(_PREFIX_DEPTH):
                if not folders or sum(o is None for _, o in found) + len(folders) >= min_units:
                    break
                before = list(found)
                below: list[str] = []
                for folder, level in zip(folders, pool.map(
                        lambda f: _folder_level(client, bucket, head, f, limit), folders)):
                    if level is None:
                        found.append((folder, None))
                    else:
                        found += [(item[0][len(head):], [item]) for item in level[0]]
                        below += level[1]
                inline = sum(objects is not None for _, objects in found)
                if depth and (not below or inline > INLINE_OBJECTS):
                    # Leaf folders (or too many objects met): workers list these folders
                    # whole; the objects met stay out of the job's graph.
                    found = before
                    break
                folders = below
            found += [(folder, None) for folder in folders]
    except Exception as err:  # pylint: disable=broad-except
        raise BeamIOError("List operation failed", {pattern: err}) from err
    found.sort(key=lambda unit: unit[0])
    units: list[tuple[str, tuple | None]] = []
    run: list = []
    for name, objects in found + [("", None)]:
        if objects is not None:
            run += [item for item in objects if matches(item[0])]
            continue
        if run:  # Objects between two folders: one unit.
            units.append((run[0][0][len(head):], tuple(run)))
            run = []
        if name:
            units.append((name, None))
    return units


def list_unit(pattern: str, unit: tuple[str, tuple | None]) -> Iterator[tuple[str, int, int, int]]:
    """``list_stamped`` of one unit of ``listing_units(pattern, ...)``."""
    name, objects = unit
    if objects is not None:
        return iter(objects)
    bucket, _, matches, head = _gcs_pattern(pattern)
    try:
        client = _gcs.storage_client()
        found, _ = _gcs_listed(client, bucket, head, name)
    except Exception as err:  # pylint: disable=broad-except
        raise BeamIOError("List operation failed", {f"gs://{bucket}/{name}": err}) from err
    return (item for item in found if matches(item[0]))


def delete_files(paths: list[str]) -> None:
    """Deletes the files, each by its literal path (never as a glob: a ``[`` in a
    name is a ``[``); missing ones are not an error. A local symbolic link is
    removed itself, never what it points to."""
    other = []
    for path in paths:
        if not is_local(path):
            other.append(path)
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            shutil.rmtree(path)  # A real folder (a link is unlinked above); links inside stay links.
    objects = [p for p in other if _gcs.is_gcs(p)]
    if objects:  # One request per object, by name (see gcs.delete_objects), not Beam's batches.
        _gcs.delete_objects(objects)
    present = [p for p in other if not _gcs.is_gcs(p) and FileSystems.exists(p)]
    if present:
        FileSystems.delete(present)


def link_outside(folder: str, path: str) -> str:
    """Where a local ``path`` inside ``folder`` really leads when symbolic links
    take it outside ``folder`` (both resolved; a dangling link by its target),
    else ``''``: also off the local disk, where there are no links.
    """
    if not (is_local(folder) and is_local(path)):
        return ""
    base = os.path.realpath(folder)
    target = os.path.realpath(path)
    if target == base or target.startswith(base.rstrip("/") + "/"):
        return ""
    return target


def list_under(folder: str) -> list[tuple[str, int]]:
    """``(path, size)`` of every file under ``folder``, sorted, the folder's name taken
    literally (never a glob). Locally, links are not followed: a symbolic link is
    listed as itself with size ``-1``, never what it points to."""
    if is_local(folder):
        found = []
        for root, dirs, names in os.walk(folder):  # followlinks=False: links are not entered.
            for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = os.path.join(root, name)
                try:
                    info = os.lstat(path)
                except FileNotFoundError:
                    continue
                found.append((path, -1 if stat.S_ISLNK(info.st_mode) else info.st_size))
        return sorted(found)
    if _gcs.is_gcs(folder):
        bucket, _, prefix = folder[len("gs://"):].partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        try:
            client = _gcs.storage_client()
            return sorted((f"gs://{bucket}/{blob.name}", int(blob.size or 0))
                          for blob in client.list_blobs(bucket, prefix=prefix))
        except Exception as err:  # pylint: disable=broad-except
            raise BeamIOError("List operation failed", {folder: err}) from err
    return list_files(join(folder, "**"))
