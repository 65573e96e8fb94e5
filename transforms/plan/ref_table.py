"""Image references as columns: a listing of millions of files in flat memory.

A ``RefTable`` holds what ``ImageRef`` objects hold, for the folder layouts
(``class_folders``, ``cifar``: every path is ``ROOT/<relative path>``, no extra
features), in a few numpy arrays: the relative paths as one UTF-8 blob with
offsets, sizes, split and label codes, and the 128-bit ordering keys. That is
about 70 bytes plus the path per image, against ~2 KB for the objects (ImageRef,
its strings, the pickled copy); keys sort with ``numpy.lexsort``. It is a
``Sequence[ImageRef]``: indexing or iterating makes the objects one at a time,
so code written for a list of references works on it unchanged.

``class_folder_table`` and ``cifar_table`` build one from a stream of
``(path, size)`` or ``(path, size, stamp, crc)`` (``files.list_stamped``: the
input fingerprint's time or generation and crc32c, kept in columns so that
``inputs.jsonl`` is written from them) without holding the stream;
``split_orders`` gives each split's rows in key order (the order a list's
references are cut in, by ``plan.shard_cuts.split_specs``), and ``rows`` gives a
shard its rows as a table of their own. ``transforms/worker_listing.py`` spreads the listing over
workers, a table per folder, joined with ``concat_tables`` (``docs/scaling.md``).
"""

from __future__ import annotations

import hashlib
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, RefColumns
from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.transforms.codec.image_inspection import IMAGE_EXTENSIONS
from beam_tfrecords.transforms.plan.names import check_names
from beam_tfrecords.transforms.plan.path_buffer import PathBuffer

__all__ = ["FileBatch", "PathBuffer", "RefTable", "TableListing", "cifar_batches", "cifar_table", "class_folder_batches",
           "class_folder_table", "concat_tables", "file_batches", "split_orders"]

_CIFAR_NAME = re.compile(r"^(?P<id>[^_/]+)_(?P<cls>[^/]+)\.[A-Za-z0-9]+$")
# ``_CIFAR_NAME`` on each line of names joined by line breaks (none holds one).
_CIFAR_LINES = re.compile(r"^[^_/\n]+_([^/\n]+)\.[A-Za-z0-9]+$", re.MULTILINE)
_BLOCK = 1 << 16  # Paths encoded into the blob a block at a time.
_SORT_BYTES = 2 << 30  # Largest padded copy of the paths ``path_order`` makes.


class RefTable(Sequence):
    """Image references of one root, as columns (see the module docstring).

    Attributes:
      root: the input root; an image's path is ``root/ + filename``.
      blob, offsets: the UTF-8 relative paths, concatenated; image ``i``'s is
        ``blob[offsets[i]:offsets[i + 1]]``.
      sizes: file sizes (int64).
      split_codes, split_names: each image's split, as an index into ``split_names``.
      labels: each image's class index (int32); its class name is ``vocabulary[label]``.
      keys: ``(n, 2)`` uint64, the ordering key (``stable_key``) as two big-endian halves.
      stamps: what the listing said of each file besides its size (int64; 0 when
        not known): its modification time in ns (local files) or its GCS
        generation (``gs://`` roots), as ``schemas.inputs.InputFile`` records it.
      crcs: each ``gs://`` object's CRC-32C as listed (int64; -1 when not known).
      annotations: ``None`` (no image has any), or each image's ``ImageRef.annotation``
        as ``(blob, offsets)`` like the paths (``with_annotations`` adds them).
    """

    annotations: tuple[bytes, np.ndarray] | None = None  # What a table pickled without them gets.

    def __init__(self, root: str, blob: bytes, offsets: np.ndarray, sizes: np.ndarray,
                 split_codes: np.ndarray, split_names: Sequence[str], labels: np.ndarray,
                 vocabulary: Sequence[str], keys: np.ndarray, stamps: np.ndarray | None = None,
                 crcs: np.ndarray | None = None, annotations: tuple[bytes, np.ndarray] | None = None):
        self.root = root
        self.blob = blob
        self.offsets = offsets
        self.sizes = sizes
        self.split_codes = split_codes
        self.split_names = tuple(split_names)
        self.labels = labels
        self.vocabulary = tuple(vocabulary)
        self.keys = keys
        self.stamps = np.zeros(len(sizes), np.int64) if stamps is None else stamps
        self.crcs = np.full(len(sizes), -1, np.int64) if crcs is None else crcs
        if annotations is not None:  # Left unset when none: a table pickles as it did before them.
            self.annotations = annotations
        self._prefix = root.rstrip("/") + "/"

    def with_annotations(self, annotations: Sequence[bytes]) -> RefTable:
        """The same images, each with its annotation bytes (``ImageRef.annotation``;
        ``b""`` for an image without)."""
        if len(annotations) != len(self):
            raise ValueError(f"{len(annotations)} annotations for {len(self)} images")
        lengths = np.fromiter(map(len, annotations), dtype=np.int64, count=len(annotations))
        offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
        return RefTable(self.root, self.blob, self.offsets, self.sizes, self.split_codes, self.split_names,
                        self.labels, self.vocabulary, self.keys, self.stamps, self.crcs,
                        (b"".join(annotations), offsets) if lengths.any() else None)

    def _annotations(self, indices: np.ndarray) -> list[bytes]:
        if self.annotations is None:
            return [b""] * len(indices)
        blob, offsets = self.annotations
        return [blob[b:e] for b, e in zip(offsets[indices].tolist(), offsets[indices + 1].tolist())]

    def __len__(self) -> int:
        return len(self.sizes)

    def filename(self, i: int) -> str:
        return self.blob[self.offsets[i]:self.offsets[i + 1]].decode("utf-8")

    def take(self, indices) -> list[ImageRef]:
        """The references at ``indices``, as objects, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        begins = self.offsets[indices].tolist()
        ends = self.offsets[indices + 1].tolist()
        blob = self.blob
        rels = [blob[b:e].decode("utf-8") for b, e in zip(begins, ends)]
        splits = [self.split_names[code] for code in self.split_codes[indices].tolist()]
        labels = self.labels[indices].tolist()
        keys = self.keys[indices].astype(">u8").tobytes().hex()  # Each key: 32 hex digits.
        if self._prefix.startswith("gs://"):  # The generation an object is read at, and its CRC-32C.
            stamps, crcs = self.stamps[indices].tolist(), self.crcs[indices].tolist()
        else:  # A local file's stamp is its modification time, not a generation.
            stamps, crcs = [0] * len(indices), [-1] * len(indices)
        notes = self._annotations(indices)
        prefix, vocabulary = self._prefix, self.vocabulary
        return [ImageRef(split, keys[32 * i:32 * i + 32], rel, prefix + rel, size, label, vocabulary[label], (),
                         stamp, crc, note)
                for i, (rel, split, size, label, stamp, crc, note)
                in enumerate(zip(rels, splits, self.sizes[indices].tolist(), labels, stamps, crcs, notes))]

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.take(np.arange(len(self))[index])
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.take([index])[0]

    def __iter__(self) -> Iterator[ImageRef]:
        for start in range(0, len(self), _BLOCK):
            yield from self.take(np.arange(start, min(start + _BLOCK, len(self))))

    def __eq__(self, other):
        if isinstance(other, RefTable | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    @property
    def nbytes(self) -> int:
        """Bytes the columns hold."""
        notes = 0 if self.annotations is None else len(self.annotations[0]) + self.annotations[1].nbytes
        columns = (self.offsets, self.sizes, self.split_codes, self.labels, self.keys, self.stamps, self.crcs)
        return len(self.blob) + notes + sum(a.nbytes for a in columns)

    def name_lengths(self) -> np.ndarray:
        """Each relative path's length in UTF-8 bytes."""
        return np.diff(self.offsets)

    def annotation_lengths(self) -> np.ndarray:
        """Each image's annotation length in bytes (int64; zeros when none has any):
        a record's planned size counts it (``io.image_records.estimated_record_size``)."""
        if self.annotations is None:
            return np.zeros(len(self), np.int64)
        return np.diff(self.annotations[1])

    def select(self, mask: np.ndarray) -> RefTable:
        """The images where ``mask`` is true, in order."""
        return self.rows(np.flatnonzero(mask))

    def rows(self, indices) -> RefTable:
        """The images at ``indices`` (in that order), as a table of their own: what
        a shard plan hands its writer (the references are made where it reads them)."""
        indices = np.asarray(indices, dtype=np.int64)
        blob, offsets = _gather(self.blob, self.offsets, indices)
        notes = None if self.annotations is None else _gather(*self.annotations, indices)
        return RefTable(self.root, blob, offsets, self.sizes[indices], self.split_codes[indices],
                        self.split_names, self.labels[indices], self.vocabulary, self.keys[indices],
                        self.stamps[indices], self.crcs[indices], notes)

    def with_splits(self, split_of: Callable[[str], str]) -> RefTable:
        """The same images with the split ``split_of(filename)`` and its keys."""
        names: dict[str, int] = {}
        codes = np.empty(len(self), dtype=np.int32)
        for i in range(len(self)):
            codes[i] = names.setdefault(split_of(self.filename(i)), len(names))
        split_names = tuple(names)
        keys = _keys(self.blob, self.offsets, codes, split_names)
        return RefTable(self.root, self.blob, self.offsets, self.sizes, codes, split_names,
                        self.labels, self.vocabulary, keys, self.stamps, self.crcs, self.annotations)

    def split_counts(self) -> dict[str, int]:
        counts = np.bincount(self.split_codes, minlength=len(self.split_names))
        return {name: int(n) for name, n in zip(self.split_names, counts.tolist()) if n}

    def label_counts(self) -> dict[str, int]:
        counts = np.bincount(self.labels, minlength=len(self.vocabulary))
        return {name: int(n) for name, n in zip(self.vocabulary, counts.tolist()) if n}

    def by_filename(self) -> list[ImageRef]:
        """Every reference, as objects, sorted by relative path (then size)."""
        order = sorted(range(len(self)), key=lambda i: (self.blob[self.offsets[i]:self.offsets[i + 1]],
                                                        int(self.sizes[i])))
        return self.take(order)

    def path_order(self) -> np.ndarray:
        """Row indices in the order of the relative paths (UTF-8 bytes, which is the
        order of the strings): a listing that came sorted (GCS lists by name) is
        only checked; else the paths are sorted as fixed-width rows, a block of
        them padded at a time (``n * longest`` bytes; longer names sort in Python)."""
        n = len(self)
        lengths = self.name_lengths()
        width = int(lengths.max()) if n else 0
        if n < 2:
            return np.arange(n, dtype=np.int64)
        if n * width > _SORT_BYTES:
            view = memoryview(self.blob)
            ends = self.offsets.tolist()
            return np.array(sorted(range(n), key=lambda i: view[ends[i]:ends[i + 1]].tobytes()),
                            dtype=np.int64)
        padded = np.zeros((n, width), np.uint8)
        data = np.frombuffer(self.blob, np.uint8)
        for start in range(0, n, _BLOCK * 4):
            stop = min(start + _BLOCK * 4, n)
            begin, end = int(self.offsets[start]), int(self.offsets[stop])
            run = lengths[start:stop]
            rows = np.repeat(np.arange(start, stop), run)
            cols = np.arange(end - begin) - np.repeat(self.offsets[start:stop] - begin, run)
            padded[rows, cols] = data[begin:end]
        names = padded.view(f"S{width}").ravel()
        if bool(np.all(names[:-1] <= names[1:])):
            return np.arange(n, dtype=np.int64)
        return np.argsort(names, kind="stable")

    def span(self, start: int, stop: int) -> RefTable:
        """Rows ``start:stop`` as a table of their own, its columns slices of these
        (what a helper process is handed a batch of images as)."""
        start, stop, _ = slice(start, stop).indices(len(self))
        stop = max(start, stop)
        begin, end = int(self.offsets[start]), int(self.offsets[stop])
        notes = None
        if self.annotations is not None:
            blob, offsets = self.annotations
            first, last = int(offsets[start]), int(offsets[stop])
            notes = blob[first:last], offsets[start:stop + 1] - first
        return RefTable(self.root, self.blob[begin:end], self.offsets[start:stop + 1] - begin,
                        self.sizes[start:stop], self.split_codes[start:stop], self.split_names,
                        self.labels[start:stop], self.vocabulary, self.keys[start:stop],
                        self.stamps[start:stop], self.crcs[start:stop], notes)

    def ref_columns(self) -> RefColumns:
        """Every reference, in order, as ``RefColumns``: the references ``take``
        makes, with a list per field made from the arrays at once (what a helper
        process makes its batch's references from)."""
        count = len(self)
        ends = self.offsets.tolist()
        if self.blob.isascii():  # Byte offsets are character offsets.
            text = self.blob.decode("ascii")
            names = [text[b:e] for b, e in zip(ends, ends[1:])]
        else:
            view = memoryview(self.blob)
            names = [str(view[b:e], "utf-8") for b, e in zip(ends, ends[1:])]
        hexed = self.keys.astype(">u8").tobytes().hex()
        keys = [hexed[i:i + 32] for i in range(0, 32 * count, 32)]
        on_gcs = self._prefix.startswith("gs://")  # See ``take``: a local file's stamp is no generation.
        notes = self._annotations(np.arange(count)) if self.annotations is not None else None
        columns = (list(map(self.split_names.__getitem__, self.split_codes.tolist())), keys, names, None,
                   self.sizes.tolist(), self.labels.tolist(),
                   list(map(self.vocabulary.__getitem__, self.labels.tolist())), None,
                   self.stamps.tolist() if on_gcs else None, self.crcs.tolist() if on_gcs else None,
                   notes if notes is not None and any(notes) else None)
        return RefColumns(columns, count, self._prefix)

    @classmethod
    def from_columns(cls, refs: RefColumns) -> RefTable | None:
        """The same references as a table (iterating it makes references equal to
        ``refs``'), when a table can hold them: every path the root plus the file
        name, no extra features, no generation or CRC-32C, keys of 32 lowercase hex
        digits, one class text a label; else ``None``."""
        count, prefix = len(refs), refs.path_prefix
        if (not count or prefix is None or prefix.rstrip("/") + "/" != prefix
                or not all(refs.is_default(name) for name in ("extra", "generation", "crc32c"))):
            return None
        joined = "".join(refs.column("key"))
        try:
            raw = bytes.fromhex(joined) if len(joined) == 32 * count else b""
        except ValueError:
            return None
        labels, texts = refs.column("label"), refs.column("label_text")
        vocabulary = dict(zip(labels, texts))
        if raw.hex() != joined or min(labels) < 0 or len(set(zip(labels, texts))) != len(vocabulary):
            return None
        names = refs.column("filename")
        try:
            encoded = [name.encode("utf-8") for name in names] if not "".join(names).isascii() else names
        except UnicodeEncodeError:
            return None
        blob = b"".join(encoded) if encoded is not names else "".join(names).encode("ascii")
        lengths = np.fromiter(map(len, encoded), np.int64, count)
        splits = refs.column("split")
        split_names = tuple(dict.fromkeys(splits))
        codes = {name: code for code, name in enumerate(split_names)}
        table = cls(prefix[:-1] or "/", blob, np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                    np.array(refs.column("size"), np.int64),
                    np.fromiter(map(codes.__getitem__, splits), np.int32, count), split_names,
                    np.array(labels, np.int32),
                    tuple(vocabulary.get(label, "") for label in range(max(labels) + 1)),
                    np.frombuffer(raw, ">u8").astype(np.uint64).reshape(-1, 2))
        return table if refs.is_default("annotation") else table.with_annotations(refs.column("annotation"))

    def gather(self, indices) -> RefTable:
        """``rows(indices)`` (one numpy gather of the paths and annotations)."""
        return self.rows(indices)


def _gather(blob: bytes, offsets: np.ndarray, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The values at ``indices`` of a blob with offsets, as a blob and offsets of their own
    (one numpy gather of the bytes: no object per value)."""
    starts, ends = offsets[indices], offsets[indices + 1]
    lengths = ends - starts
    gathered = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)  # O(rows), not O(table)
    if not len(indices):
        return b"", gathered
    data = np.frombuffer(blob, np.uint8)
    at = np.repeat(starts - gathered[:-1], lengths) + np.arange(int(gathered[-1]), dtype=np.int64)
    return data[at].tobytes(), gathered


def _keys(blob: bytes, offsets: np.ndarray, codes: np.ndarray, split_names: Sequence[str]) -> np.ndarray:
    """``stable_key`` of every image, as ``(n, 2)`` uint64 (``sha256(split \\0 rel)[:16]``)."""
    heads = [hashlib.sha256(name.encode("utf-8") + b"\0") for name in split_names]
    view = memoryview(blob)
    ends = offsets.tolist()
    digests = []
    for i, code in enumerate(codes.tolist()):
        h = heads[code].copy()
        h.update(view[ends[i]:ends[i + 1]])
        digests.append(h.digest()[:16])
    return np.frombuffer(b"".join(digests), dtype=">u8").astype(np.uint64).reshape(-1, 2)


class FileBatch(NamedTuple):
    """Files of one folder under a root, as lists (``folder_walk.FolderFiles``, relative).

    Attributes:
      folder: the folder's path relative to the root, with a trailing ``/`` (``""``:
        the root); a file's relative path is ``folder + name``.
      names, sizes: the files' names and sizes.
      stamps: each file's modification time in ns or GCS generation (0: not known).
      crcs: each ``gs://`` object's CRC-32C (-1: not known); ``None``: none known.
    """

    folder: str
    names: list[str]
    sizes: list[int]
    stamps: list[int]
    crcs: list[int] | None = None


class TableListing:
    """What building a table found besides the images (see ``plan.layouts.Listing``)."""

    def __init__(self, table: RefTable, vocabulary: list[str], ignored: int,
                 dead_letters: list[DeadLetter], split_source: str):
        self.table = table
        self.vocabulary = vocabulary
        self.ignored = ignored
        self.dead_letters = dead_letters
        self.split_source = split_source


class _Columns:
    """Relative paths, sizes and numbers gathered from batches of files, a folder's at a time."""

    def __init__(self, root: str):
        self.root = root
        self.blobs: list[bytes] = []
        self.lengths: list[np.ndarray] = []
        self.sizes = array("q")
        self.stamps = array("q")
        self.crcs: array | None = None  # None while no file has a CRC-32C.
        self.ignored = 0
        self._finished: tuple | None = None

    def add(self, batch: FileBatch) -> list[str]:
        """The names of the image files of ``batch`` (kept); other files are counted
        as ignored."""
        folder, names, sizes, stamps, crcs = batch
        images = _image_names(names)
        if not all(images):
            self.ignored += images.count(False)
            rows = [i for i, image in enumerate(images) if image]
            names, sizes, stamps = [names[i] for i in rows], [sizes[i] for i in rows], [stamps[i] for i in rows]
            crcs = None if crcs is None else [crcs[i] for i in rows]
        if not names:
            return names
        text = folder + folder.join(names) if folder else "".join(names)  # Each ``folder + name``.
        blob = text.encode("utf-8")
        if len(blob) == len(text):  # ASCII: a character is a byte.
            lengths = np.fromiter(map(len, names), np.int64, len(names)) + len(folder)
        else:
            lengths = np.fromiter((len((folder + name).encode("utf-8")) for name in names), np.int64, len(names))
        self.lengths.append(lengths)
        self.blobs.append(blob)
        if crcs is not None and self.crcs is None:
            self.crcs = array("q", [-1]) * len(self.sizes)
        self.sizes.extend(sizes)
        self.stamps.extend(stamps)
        if self.crcs is not None:
            self.crcs.extend(array("q", [-1]) * len(names) if crcs is None else crcs)
        return names

    def finish(self) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(blob, offsets, sizes, stamps, crcs)`` of every image added."""
        if self._finished is None:
            lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
            offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
            sizes, stamps = (np.frombuffer(column, np.int64).copy() if len(column) else np.zeros(0, np.int64)
                             for column in (self.sizes, self.stamps))
            crcs = (np.full(len(sizes), -1, np.int64) if self.crcs is None
                    else np.frombuffer(self.crcs, np.int64).copy())
            self._finished = (b"".join(self.blobs), offsets, sizes, stamps, crcs)
            self.blobs, self.lengths, self.sizes, self.stamps, self.crcs = [], [], array("q"), array("q"), None
        return self._finished

    def path_key(self) -> Callable[[int], tuple]:
        """A sort key for image ``i``: ``(relative path, size)``."""
        blob, offsets, sizes, _, _ = self.finish()
        ends, sizes = offsets.tolist(), sizes.tolist()
        return lambda i: (blob[ends[i]:ends[i + 1]], sizes[i])


_IMAGE_ENDINGS = tuple(sorted(IMAGE_EXTENSIONS))


def _image_names(names: list[str]) -> list[bool]:
    """Whether each name has an image extension, as ``is_image_filename`` tells
    (``posixpath.splitext``: the last dot and what follows, when a character other
    than a dot comes before it), for a folder's names at once."""
    lowered = "\0".join(names).lower().split("\0")
    if len(lowered) != len(names):  # A NUL in a name (not on a local disk).
        lowered = [name.lower() for name in names]
    images = [name.endswith(_IMAGE_ENDINGS) for name in lowered]
    if "\0." in "\0" + "\0".join(names):  # Names starting with a dot: ".png" has no extension.
        images = [image and "." in name.lstrip(".") for image, name in zip(images, names)]
    return images


def _table_listing(columns: _Columns, split_of: np.ndarray, split_names: list[str],
                   class_of: np.ndarray, class_names: list[str], vocabulary: list[str],
                   dead: list[tuple[int, str, str]], split_source: str) -> TableListing:
    """The table of the images with a known class and a valid split; the others dead-lettered
    in the order of ``dead`` (each ``(index, error, message)``), then bad splits."""
    blob, offsets, sizes, stamps, crcs = columns.finish()
    index = {name: i for i, name in enumerate(vocabulary)}
    labels = np.array([index.get(name, -1) for name in class_names], dtype=np.int32)
    label_of = np.where(class_of >= 0, labels[np.maximum(class_of, 0)] if len(labels) else -1, -1)
    keep = (class_of >= 0) & (label_of >= 0)
    rel = lambda i: blob[offsets[i]:offsets[i + 1]].decode("utf-8")  # noqa: E731
    # A dead letter names its image relative to the input root, as image/filename does.
    letters = [DeadLetter(rel(i), "list", error, message) for i, error, message in dead]
    bad_codes = [code for code, name in enumerate(split_names) if not is_valid_split_name(name)]
    if bad_codes:
        bad = keep & np.isin(split_of, bad_codes)
        for i in sorted(np.flatnonzero(bad).tolist(), key=lambda i: (rel(i), int(sizes[i]))):
            letters.append(DeadLetter(rel(i), "list", "bad_split",
                                      f"split {split_names[split_of[i]]!r} cannot name a shard "
                                      "file: use letters, digits, '_' and '.'"))
        keep &= ~bad
    codes = split_of.astype(np.int32)
    table = RefTable(columns.root, blob, offsets, sizes, codes, split_names,
                     label_of.astype(np.int32), vocabulary, np.zeros((len(sizes), 2), np.uint64),
                     stamps, crcs)
    if not keep.all():
        table = table.select(keep)
    table.keys = _keys(table.blob, table.offsets, table.split_codes, table.split_names)
    return TableListing(table, vocabulary, columns.ignored, letters, split_source)


def _code(codes: dict[str, int], name: str) -> int:
    code = codes.get(name)
    if code is None:
        code = codes[name] = len(codes)
    return code


def file_batches(root: str, files: Iterable[tuple]) -> Iterator[FileBatch]:
    """A stream of ``(path, size)`` or ``(path, size, stamp, crc)`` under ``root``
    as ``FileBatch``es, a run of files of one folder (at most ``_BLOCK``) at a time.

    Raises:
      ValueError: for a path not under ``root``.
    """
    prefix = root.rstrip("/") + "/"
    batch = FileBatch("", [], [], [], [])
    for item in files:
        path = item[0]
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not under the input root {root}")
        cut = path.rfind("/") + 1
        folder = path[len(prefix):cut]
        if folder != batch.folder or len(batch.names) >= _BLOCK:
            if batch.names:
                yield batch
            batch = FileBatch(folder, [], [], [], [])
        batch.names.append(path[cut:])
        batch.sizes.append(item[1])
        batch.stamps.append(item[2] if len(item) > 2 else 0)
        batch.crcs.append(item[3] if len(item) > 3 else -1)
    if batch.names:
        yield batch


def class_folder_table(root: str, files: Iterable[tuple[str, int]], labels: Sequence[str] | None,
                       folders_are_splits: Callable[[str, set[str]], bool],
                       default_split: str) -> TableListing:
    """Images under ``ROOT/<class>/`` or ``ROOT/<split>/<class>/``, as a table (the
    rules of ``plan.layouts.list_class_folders``; ``folders_are_splits`` decides
    from the top-level folders holding images whether they are splits), from a
    stream of ``(path, size)`` or ``(path, size, stamp, crc)``."""
    return class_folder_batches(root, file_batches(root, files), labels, folders_are_splits, default_split)


def class_folder_batches(root: str, batches: Iterable[FileBatch], labels: Sequence[str] | None,
                         folders_are_splits: Callable[[str, set[str]], bool],
                         default_split: str) -> TableListing:
    """``class_folder_table`` of the files as ``FileBatch``es (the folders of a batch
    are read once for all its files)."""
    columns = _Columns(root)
    folders: dict[str, int] = {}  # Names of the first two folder levels, coded.
    first, second, depth = array("i"), array("i"), array("b")
    for batch in batches:
        count = len(columns.add(batch))
        if not count:
            continue
        parts = batch.folder.split("/", 2)  # As a path's ``rel.split("/", 2)`` is, but its name.
        first.extend(array("i", [_code(folders, parts[0]) if len(parts) >= 2 else -1]) * count)
        second.extend(array("i", [_code(folders, parts[1]) if len(parts) >= 3 else -1]) * count)
        depth.extend(array("b", [len(parts)]) * count)
    n = len(depth)
    first = np.array(first, np.int32)
    second = np.array(second, np.int32)
    depth = np.array(depth, np.int8)
    names = list(folders)
    top = {names[c] for c in np.unique(first[first >= 0]).tolist()}
    check_names("top-level folders", top)
    by_split = folders_are_splits(root, top)
    split_names = list(dict.fromkeys([default_split] + [name for name in names if by_split and name in top]))
    split_code = {name: i for i, name in enumerate(split_names)}
    remap = np.array([split_code.get(name, 0) for name in names] or [0], dtype=np.int32)
    if by_split:
        split_of = np.where(depth >= 2, remap[np.maximum(first, 0)], 0)
        class_of = np.where(depth >= 3, second, -1)
    else:
        split_of = np.zeros(n, np.int32)
        class_of = np.where(depth >= 2, first, -1)
    used = sorted({names[c] for c in np.unique(class_of[class_of >= 0]).tolist()})
    check_names("class folders", used)
    if labels is not None:
        check_names("class names (folders and the labels)", set(used) | set(labels))
    vocabulary = list(labels) if labels is not None else used
    known = set(vocabulary)
    blob_rel = columns.path_key()
    no_class = np.flatnonzero(class_of < 0).tolist()
    known_codes = [c for c, name in enumerate(names) if name in known]
    unknown = np.flatnonzero((class_of >= 0) & ~np.isin(class_of, known_codes)).tolist()
    dead = ([(i, "no_class_folder", "image is not inside a class folder (expected ROOT/<class>/<file>)")
             for i in sorted(no_class, key=blob_rel)]
            + [(i, "unknown_class", f"class folder {names[class_of[i]]!r} is not in the labels file")
               for i in sorted(unknown, key=blob_rel)])
    listing = _table_listing(columns, split_of, split_names, class_of, names, vocabulary, dead, "")
    listing.split_source = "split folders" if by_split else ""
    return listing


def cifar_table(root: str, files: Iterable[tuple[str, int]], vocabulary: list[str],
                labels_file: str, default_split: str) -> TableListing:
    """Images named ``ROOT/<split>/<ID>_<CLASS>.<ext>``, as a table (the rules of
    ``plan.layouts.list_cifar``), from a stream of ``(path, size)`` or ``(path,
    size, stamp, crc)``."""
    return cifar_batches(root, file_batches(root, files), vocabulary, labels_file, default_split)


def cifar_batches(root: str, batches: Iterable[FileBatch], vocabulary: list[str],
                  labels_file: str, default_split: str) -> TableListing:
    """``cifar_table`` of the files as ``FileBatch``es."""
    columns = _Columns(root)
    splits: dict[str, int] = {}
    classes: dict[str, int] = {}
    split_of, class_of = array("i"), array("i")
    for batch in batches:
        names = columns.add(batch)
        if not names:
            continue
        parts = batch.folder.split("/")  # ``<split>/``: two parts, as a path's ``rel.split("/")``.
        found = _cifar_classes(names) if len(parts) == 2 else [None] * len(names)
        split = _code(splits, parts[0]) if any(name is not None for name in found) else 0
        for name in dict.fromkeys(found):  # Coded in the order they first appear.
            if name is not None:
                _code(classes, name)
        if None in found:
            split_of.extend(array("i", [0 if name is None else split for name in found]))
            class_of.extend(array("i", [-1 if name is None else classes[name] for name in found]))
        else:
            split_of.extend(array("i", [split]) * len(found))
            class_of.extend(array("i", map(classes.__getitem__, found)))
    split_of = np.array(split_of, np.int32)
    class_of = np.array(class_of, np.int32)
    class_names = list(classes)
    check_names("split folders", splits)
    check_names("classes in file names", class_names)
    check_names(f"class names (file names and {labels_file})", set(class_names) | set(vocabulary))
    known = set(vocabulary)
    key = columns.path_key()
    dead = []
    for i in sorted(np.flatnonzero((class_of < 0) | ~np.isin(
            class_of, [c for c, name in enumerate(class_names) if name in known])).tolist(), key=key):
        if class_of[i] < 0:
            dead.append((i, "unlabeled", "expected ROOT/<split>/<ID>_<CLASS>.<ext> in the CIFAR layout"))
        else:
            dead.append((i, "unknown_class", f"class {class_names[class_of[i]]!r} is not in {labels_file}"))
    split_names = list(splits) or [default_split]
    return _table_listing(columns, split_of, split_names, class_of, class_names, list(vocabulary),
                          dead, "split folders")


def _cifar_classes(names: list[str]) -> list[str | None]:
    """The CLASS of each ``<ID>_<CLASS>.<ext>`` name (``None`` for a name not so
    formed): one search over the folder's names when every one is so formed (no
    name holds a line break), else name by name."""
    text = "\n".join(names)
    if text.count("\n") == len(names) - 1:
        found = _CIFAR_LINES.findall(text)
        if len(found) == len(names):
            return found
    return [None if match is None else match["cls"] for match in map(_CIFAR_NAME.match, names)]


def split_orders(table: RefTable) -> Iterator[tuple[str, np.ndarray]]:
    """Each split (by name) that holds rows, with its rows in key order (indices into
    ``table``), the order its shards are cut in."""
    for code in sorted(range(len(table.split_names)), key=lambda c: table.split_names[c]):
        members = np.flatnonzero(table.split_codes == code)
        if not len(members):
            continue
        keys = table.keys[members]
        yield table.split_names[code], members[np.lexsort((keys[:, 1], keys[:, 0]))]


def concat_tables(tables: Sequence[RefTable]) -> RefTable:
    """The rows of ``tables`` (one root, one vocabulary), in order, as one table;
    each table's split codes are mapped to the names they stand for."""
    if not tables:
        raise ValueError("concat_tables needs at least one table")
    first = tables[0]
    names: dict[str, int] = {}
    codes, offsets, ends = [], [], 0
    for table in tables:
        if table.root != first.root or table.vocabulary != first.vocabulary:
            raise ValueError("tables of different roots or vocabularies cannot be joined")
        remap = np.array([_code(names, name) for name in table.split_names] or [0], np.int32)
        codes.append(remap[table.split_codes])
        begin, end = int(table.offsets[0]), int(table.offsets[-1])
        offsets.append(table.offsets[1:] - begin + ends)
        ends += end - begin
    return RefTable(first.root, b"".join(t.blob[int(t.offsets[0]):int(t.offsets[-1])] for t in tables),
                    np.concatenate([np.zeros(1, np.int64)] + offsets).astype(np.int64),
                    np.concatenate([t.sizes for t in tables]), np.concatenate(codes), tuple(names),
                    np.concatenate([t.labels for t in tables]), first.vocabulary,
                    np.concatenate([t.keys for t in tables]).reshape(-1, 2),
                    np.concatenate([t.stamps for t in tables]), np.concatenate([t.crcs for t in tables]),
                    _joined_annotations(tables))


def _joined_annotations(tables: Sequence[RefTable]) -> tuple[bytes, np.ndarray] | None:
    """The annotations of ``tables``' rows, in order (``None`` when no table has any)."""
    if all(table.annotations is None for table in tables):
        return None
    notes = [table.annotations or (b"", np.zeros(len(table) + 1, np.int64)) for table in tables]
    lengths = np.concatenate([np.diff(offsets) for _, offsets in notes])
    blob = b"".join(blob[int(offsets[0]):int(offsets[-1])] for blob, offsets in notes)
    return blob, np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
