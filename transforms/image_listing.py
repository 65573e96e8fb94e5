"""Listing images: what ``ListImages`` (and the preflight, before it) lists, and how a
listing made in one process reaches the listing step in another.

``list_images`` lists and labels the images an input names (a folder, a glob, a CSV
manifest; class folders or CIFAR), reading no image unless splits by content or
``--drop_duplicates`` ask for its bytes. A listing made by the preflight is kept in
this process (``keep_listing``) or written beside the run (``write_listing``) under its
``ListingIdentity``: the listing step takes it only when its own identity is the same
(``listing_for``), else it lists again. No Beam transform here.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import os
import pickle
import stat
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS
from beam_tfrecords.schemas.config import DEFAULT_MAX_FILE_BYTES
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, ImageRefs, ListingPart
from beam_tfrecords.transforms.annotated_inputs import AnnotationArgs, list_annotated
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input, sha256_input
from beam_tfrecords.transforms.io.fingerprint import relative_path
from beam_tfrecords.transforms.io.gcs import is_gcs, object_info
from beam_tfrecords.transforms.io.image_records import read_failure
from beam_tfrecords.transforms.plan import handoff
from beam_tfrecords.transforms.plan.handoff import (
    HANDOFF_NAME,
    HandoffError,
    check_digest,
    decode_listing,
    decode_part,
    encode_listing,
    encode_part,
    listing_parts,
    part_name,
)
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    Listing,
    detect_layout,
    list_cifar,
    list_class_folders,
    list_csv_manifest,
    parse_labels_text,
    resolve_input,
)
from beam_tfrecords.transforms.plan.names import check_names
from beam_tfrecords.transforms.plan.ref_table import FileBatch, PathBuffer, RefTable, concat_tables
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from beam_tfrecords.transforms.quality.duplicates import keep_first
from beam_tfrecords.transforms.quality.splits import split_of

__all__ = [
    "COMPACT_LISTING_REFS", "LISTING_NAME", "HeldImages", "ListingIdentity", "content_key", "drop_listing",
    "input_bytes", "joined_parts", "keep_listing", "kept_refs", "list_images", "listing_for", "listing_size",
    "pack_refs", "part_refs", "path_text", "read_labels_text", "read_listing", "write_listing"
]


class ListingIdentity(NamedTuple):
    """What a listing was made with: a listing step takes a listing made before it
    (the preflight's) only when its own identity equals that one's; else it lists
    again. ``list_images(*identity)`` makes the listing. A named tuple: the hand-off
    records it as a list (``plan.handoff.graph_args``), and an equal plain tuple of
    the same fields in the same order is the same identity.
    """

    input_path: str
    layout: str
    labels_path: str | None
    image_column: str | None
    label_column: str | None
    splits: tuple
    split_by: str
    drop_duplicates: bool
    vocabulary: tuple[str, ...]
    only: tuple[str, ...]
    follow_links_outside: bool
    max_file_bytes: int
    annotations: tuple = ()

    @classmethod
    def of(cls, config, vocabulary: tuple[str, ...] = (), only: tuple[str, ...] = ()) -> ListingIdentity:
        """The identity of a conversion's listing (``config``: a ``ConvertConfig``), as
        both the preflight and the pipeline's listing step make it."""
        return cls(config.input, config.layout, config.labels, config.image_column,
                   config.label_column, tuple(config.splits), config.split_by,
                   config.drop_duplicates, tuple(vocabulary), tuple(only),
                   config.follow_links_outside, config.max_file_bytes,
                   tuple(AnnotationArgs.of(config)) if config.layout in ANNOTATION_LAYOUTS else ())


# A folder layout listing more images than this keeps them as columns (a ``RefTable``,
# in path order); at most this many, a list of ``ImageRef`` (the same references in the
# same order, the same records either way). 0: a table, unless it is empty.
COMPACT_LISTING_REFS = 0


def list_images(input_path: str, layout: str = "auto", labels_path: str | None = None,
                image_column: str | None = None, label_column: str | None = None,
                splits: tuple[tuple[str, float], ...] = (), split_by: str = "path",
                drop_duplicates: bool = False, vocabulary: tuple[str, ...] = (),
                only: tuple[str, ...] = (), follow_links_outside: bool = False,
                max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, annotations: tuple = (), *,
                held: HeldImages | None = None, contents_on_workers: bool = False) -> Listing:
    """Lists and labels the images that ``input_path`` names.

    Args:
      input_path: a folder, a glob or a CSV manifest.
      layout: ``auto``, ``class_folders``, ``cifar`` or ``csv``.
      labels_path: a labels file (class names in label order), or ``None``.
      image_column, label_column: a CSV manifest's columns (default: by name).
      splits: ratio splits ``((name, share), ...)``, each image's picked by a
        hash (see ``quality.splits``) of its relative path, or, with
        ``split_by='content'``, of its bytes (every file is read once more).
      drop_duplicates: leave out every image whose bytes equal another's, keeping
        the first by ordering key (every file is read once more).
      vocabulary: class names in label order when there is no labels file (an
        incremental run labels as the dataset it adds to did).
      only: when given, keep only the images of these ``image/filename`` values
        (an incremental run's new and changed files).
      follow_links_outside: follow links inside a local input folder that lead
        outside it (else they are passed over: ``link_outside_input``).
      max_file_bytes: a file larger than this is dead-lettered (``file_too_large``)
        unread.
      annotations: an annotated layout's flags (``annotated_inputs.AnnotationArgs``):
        the listing is ``annotated_inputs.list_annotated``'s.
      held: with ``drop_duplicates``, the images the dataset an incremental run
        adds to already holds: they win over copies, and a new file holding one
        of their contents is left out as a copy (not given to the listing step:
        the preflight, which lists with it, hands its listing over).
      contents_on_workers: read no file here: the pipeline's ``HashImages`` step
        picks splits by content and drops copies on the workers (``held`` is then
        not used; a split by content is left to it, ``split_source`` says so).

    Raises:
      ValueError: when the labels file or CSV manifest cannot be used, when two
        class or split names differ only in Unicode normalization or letter case
        (``plan.names``), or when ``splits`` are given for an input that names its
        splits (these are caught before the pipeline runs, by the preflight).
    """
    if layout in ANNOTATION_LAYOUTS:
        listing = list_annotated(input_path, layout, labels_path, image_column, label_column,
                                 tuple(splits), follow_links_outside, AnnotationArgs(*annotations))
        _refuse_large_files(listing, max_file_bytes)
        return listing
    listing = _list_images(input_path, layout, labels_path, image_column, label_column,
                           vocabulary, follow_links_outside)
    _refuse_large_files(listing, max_file_bytes)
    if only:
        wanted = set(only)
        listing.refs = [ref for ref in listing.refs if ref.filename in wanted]
    if splits and listing.split_source:
        raise ValueError(f"--splits: the input already names its splits "
                         f"({listing.split_source}); use one or the other")
    contents = None
    if contents_on_workers and splits and split_by == "content":
        # Each image's split is picked from its bytes by the pipeline's HashImages step.
        listing.split_source = "--splits, by content (on the workers)"
        splits = ()
    if ((splits and split_by == "content") or drop_duplicates) and not contents_on_workers:
        if isinstance(listing.refs, RefTable):  # Every file is read anyway.
            listing.refs = listing.refs.by_filename()
        contents = _contents(listing, max_file_bytes)
    if splits and isinstance(listing.refs, RefTable) and contents is None:
        listing.refs = listing.refs.with_splits(lambda name: split_of(name, splits))
        listing.split_source = "--splits, by path"
    elif splits:
        keys = contents if split_by == "content" else [ref.filename for ref in listing.refs]
        refs = []
        for ref, key in zip(listing.refs, keys):
            split = split_of(key, splits)
            refs.append(dataclasses.replace(ref, split=split, key=stable_key(split, ref.filename)))
        listing.refs = refs
        listing.split_source = f"--splits, by {'content' if split_by == 'content' else 'path'}"
    if drop_duplicates and not contents_on_workers:
        _drop_copies(listing, contents, held or HeldImages())
    return listing


@dataclasses.dataclass(frozen=True)
class HeldImages:
    """What the dataset an incremental run adds to holds, for ``--drop_duplicates``.

    Attributes:
      names: the ``image/filename`` of every image it holds from this input root.
      contents: ``{sha256 of the file's bytes: image/filename}`` of the images it
        holds (from every root it was made from).
    """

    names: frozenset[str] = frozenset()
    contents: dict[str, str] = dataclasses.field(default_factory=dict)


def _drop_copies(listing: Listing, contents: list[str], held: HeldImages) -> None:
    """Leaves out every image whose bytes equal another's: of each content the one
    the dataset already holds is kept, else the first by ordering key; a file the
    dataset does not hold whose content it holds under another name is a copy
    of that one (so an incremental run stores no copy of what the dataset holds,
    and never drops a file it holds in favour of a new copy)."""
    order = ((ref.filename not in held.names, ref.key) for ref in listing.refs)
    kept, dropped = keep_first(zip(contents, order, zip(listing.refs, contents)))
    copies = [(copy[0], keeper[0].filename) for copy, keeper in dropped]
    refs = []
    for ref, content in kept:
        holder = held.contents.get(content)
        if holder is not None and ref.filename not in held.names:
            copies.append((ref, holder))
        else:
            refs.append(ref)
    listing.refs = refs
    listing.duplicates_dropped = sorted((copy.filename, copy.split, holder) for copy, holder in copies)


def _refuse_large_files(listing: Listing, max_file_bytes: int) -> None:
    """Moves images larger than ``max_file_bytes`` from the references to the dead
    letters (``file_too_large``), unread."""
    refs = listing.refs
    if isinstance(refs, RefTable):
        large = refs.sizes > max_file_bytes
        if not large.any():
            return
        letters = [_too_large(ref, max_file_bytes) for ref in refs.take(np.flatnonzero(large))]
        listing.refs = refs.select(~large)
    else:
        if not any(ref.size > max_file_bytes for ref in refs):
            return
        letters = [_too_large(ref, max_file_bytes) for ref in refs if ref.size > max_file_bytes]
        listing.refs = [ref for ref in refs if ref.size <= max_file_bytes]
    listing.dead_letters.extend(sorted(letters, key=lambda d: d.source))


def _too_large(ref: ImageRef, max_file_bytes: int) -> DeadLetter:
    return DeadLetter(ref.filename, "list", "file_too_large", f"the file is {ref.size:,} bytes, more "
                      f"than --max_file_bytes ({max_file_bytes:,}); not read")


def content_key(ref: ImageRef, max_file_bytes: int) -> str | DeadLetter:
    """The SHA-256 of an image's bytes, or the dead letter of a file that cannot be
    read to hash (stage ``read``)."""
    try:
        return sha256_input(ref.path, ref.size, max_file_bytes, ref.generation, ref.crc32c)
    except InputRefused as refused:
        return DeadLetter(ref.filename, "read", refused.reason, refused.message)
    except (OSError, BeamIOError) as err:
        return DeadLetter(ref.filename, "read", "read_error", read_failure(err))


def _contents(listing: Listing, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> list[str]:
    """The SHA-256 of every listed image (read a block at a time, with 16 threads);
    images that cannot be read move from the listing to its dead letters."""
    with concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="hash-image") as pool:
        digests = list(pool.map(functools.partial(content_key, max_file_bytes=max_file_bytes),
                                listing.refs))
    refs, contents = [], []
    for ref, digest in zip(listing.refs, digests):
        if isinstance(digest, DeadLetter):
            listing.dead_letters.append(digest)
        else:
            refs.append(ref)
            contents.append(digest)
    listing.refs = refs
    return contents


def _list_images(input_path: str, layout: str, labels_path: str | None,
                 image_column: str | None, label_column: str | None,
                 vocabulary: tuple[str, ...] = (), follow_links_outside: bool = False) -> Listing:
    layout, root, pattern = resolve_input(input_path, layout)
    labels = parse_labels_text(read_labels_text(labels_path)) if labels_path else None
    if labels is None and vocabulary:
        labels = list(vocabulary)
    if layout == "csv":
        # A bucket's folder is listed once (a lookup per row would be a request per
        # row); a local file is looked up by itself, and so is a gs:// row outside that
        # folder (one metadata request). Never a glob: a row's path is a name. A gs://
        # row's object is then read at the generation listed here.
        listed: dict[str, tuple[int, int, int]] = {}  # path: (size, generation, crc32c)
        if files.is_local(root):
            pass
        elif is_gcs(root):
            listed = {path: (size, generation, crc) for path, size, generation, crc
                      in files.list_stamped(files.join(root, "**"))}
        else:
            listed = {path: (size, 0, -1) for path, size in files.list_files(files.join(root, "**"))}

        def size_of(path: str) -> int | None:
            if path not in listed and is_gcs(path):
                stamp = _object_stamp(path)
                if stamp is not None:
                    listed[path] = stamp
            if path in listed:
                return listed[path][0]
            return _literal_size(path)

        listing = list_csv_manifest(input_path, files.read_text(input_path), size_of, labels,
                                    image_column, label_column)
        if any(stamp[1] for stamp in listed.values()):
            listing.refs = [_pinned(ref, listed.get(ref.path)) for ref in listing.refs]
        if labels is None:
            check_names("labels in the CSV manifest", listing.vocabulary)
        check_names("splits in the CSV manifest's 'split' column", {ref.split for ref in listing.refs})
        return listing
    skipped: list = []
    batches = files.folder_batches(pattern, skipped, follow_links_outside)
    if batches is None:
        found, bad_names = _buffered(root, files.list_stamped(pattern, skipped=skipped,
                                                              follow_outside=follow_links_outside))
        if layout == "auto":
            layout = detect_layout(root, (item[0] for item in found))
    else:
        found, bad_names, has_labels = _folder_files(root, batches)
        if layout == "auto":
            layout = "cifar" if has_labels else "class_folders"
    if layout == "cifar":
        labels_text = "\n".join(labels) if labels else read_labels_text(files.join(root, CIFAR_LABELS_FILE))
        listing = list_cifar(root, found, labels_text, compact=True, batched=batches is not None)
    else:
        listing = list_class_folders(root, found, labels, compact=True, batched=batches is not None)
    del found
    listing.refs = _in_path_order(listing.refs)
    listing.files = listing.refs  # The fingerprint's columns (stamps from this listing).
    if len(listing.refs) <= COMPACT_LISTING_REFS:
        listing.refs = listing.refs.by_filename()
    listing.skipped = [DeadLetter(_published(root, path), "list", reason, message)
                       for path, reason, message in skipped]
    listing.dead_letters.extend(bad_names)
    return listing


def _buffered(root: str, items) -> tuple[PathBuffer, list[DeadLetter]]:
    """A listing's ``(path, size, stamp, crc)`` held compactly, and the dead letters
    of the files whose names are not UTF-8 text."""
    found, bad_names = PathBuffer(root), []
    for item in items:
        try:  # item: (path, size, stamp, crc)
            found.add(*item)
        except UnicodeEncodeError:
            bad_names.append(_bad_name(root, item[0]))
    return found, bad_names


def _bad_name(root: str, path: str) -> DeadLetter:
    """A file whose name is not UTF-8 cannot be a feature's text."""
    return DeadLetter(_published(root, path), "list", "bad_file_name",
                      "the file name is not UTF-8 text; rename the file")


def _folder_files(root: str, batches) -> tuple[Iterator[FileBatch], list[DeadLetter], bool]:
    """The files of a local folder's walk (``files.folder_batches``) as ``FileBatch``es
    relative to ``root`` (given up as they are read), the dead letters of the files
    whose names are not UTF-8 text, and whether ``ROOT/labels.txt`` is among them
    (the CIFAR layout's, ``detect_layout``)."""
    prefix = root.rstrip("/") + "/"
    found, bad_names, has_labels = [], [], False
    for batch in batches:
        names, sizes, stamps = batch.names, batch.sizes, batch.stamps
        if not batch.prefix.startswith(prefix):
            raise ValueError(f"{batch.prefix} is not under the input root {root}")
        try:
            (batch.prefix + "".join(names)).encode("utf-8")
        except UnicodeEncodeError:
            rows = _utf8_rows(root, batch.prefix, names, bad_names)
            names, sizes, stamps = [names[i] for i in rows], [sizes[i] for i in rows], [stamps[i] for i in rows]
        has_labels = has_labels or (batch.prefix == prefix and CIFAR_LABELS_FILE in names)
        found.append(FileBatch(batch.prefix[len(prefix):], names, sizes, stamps))
    found.reverse()
    return (found.pop() for _ in range(len(found))), bad_names, has_labels


def _utf8_rows(root: str, prefix: str, names: list[str], bad_names: list[DeadLetter]) -> list[int]:
    """The indices of the names that are UTF-8 text; the others dead-lettered."""
    rows = []
    for i, name in enumerate(names):
        try:
            (prefix + name).encode("utf-8")
        except UnicodeEncodeError:
            bad_names.append(_bad_name(root, prefix + name))
            continue
        rows.append(i)
    return rows


def _in_path_order(table: RefTable) -> RefTable:
    """A listing's table with its rows in the order of their relative paths (the
    order of ``RefTable.by_filename``: a path is listed once)."""
    order = table.path_order()
    return table if bool((np.diff(order) == 1).all()) else table.rows(order)


def _pinned(ref: ImageRef, listed: tuple[int, int, int] | None) -> ImageRef:
    """``ref`` with the generation and CRC-32C its object was listed with (when it
    was, at the size it has)."""
    if listed is None or listed[0] != ref.size or not listed[1]:
        return ref
    return dataclasses.replace(ref, generation=listed[1], crc32c=listed[2])


def _object_stamp(path: str) -> tuple[int, int, int] | None:
    """``(size, generation, crc32c)`` of the ``gs://`` object a CSV manifest's row names
    (one metadata request); ``None`` when there is none, or it may not be read."""
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import Forbidden, Unauthorized

    try:
        info = object_info(path)
    except (FileNotFoundError, Forbidden, Unauthorized):
        return None
    return info.size, info.generation, int(info.crc32c, 16) if info.crc32c else -1


def _literal_size(path: str) -> int | None:
    """The size of the file a CSV manifest's row names, looked up by its exact name
    (``*``, ``?`` and ``[`` are characters, not a pattern); ``None`` when there is
    no such file (or it is a folder).

    Raises:
      ValueError: for a scheme no file system of this run reads (``x://a.jpg``).
    """
    if files.is_local(path):
        try:
            info = os.stat(path)
        except (OSError, ValueError):  # ValueError: a NUL in the name.
            return None
        return None if stat.S_ISDIR(info.st_mode) else info.st_size
    try:
        filesystem = FileSystems.get_filesystem(path)
    except ValueError:
        raise ValueError("no file system of this run reads its scheme") from None
    try:
        return filesystem.metadata(path).size_in_bytes
    except BeamIOError:
        return None


# Listings made before a pipeline was built (the preflight's), for the listing step
# to take when it runs in the same process (the DirectRunner), instead of listing
# again. Elsewhere (Dataflow workers) the step lists the input itself.
_kept_listings: dict[str, tuple[tuple, Listing]] = {}
_kept_lock = threading.Lock()


def keep_listing(listing: Listing, args: tuple) -> str:
    """Holds a listing for the ``ListImages`` step of this process; returns its token.

    ``args`` are the listing's arguments ``(input_path, layout, labels_path,
    image_column, label_column, splits, split_by, drop_duplicates, vocabulary,
    only, follow_links_outside, max_file_bytes, annotations)``: a step lists again
    unless its own match.
    """
    token = uuid.uuid4().hex
    with _kept_lock:
        _kept_listings[token] = (tuple(args), listing)
    return token


def drop_listing(token: str | None) -> None:
    """Forgets a kept listing the listing step did not take (a run that never got
    that far)."""
    if token:
        with _kept_lock:
            _kept_listings.pop(token, None)


# The file, in a run's temporary folder, that hands the preflight's listing to a
# listing step running in another process (Dataflow workers, multi-process runners):
# data only (an Arrow IPC file, see transforms.plan.handoff), checked by its SHA-256.
LISTING_NAME = HANDOFF_NAME


class _HashingSink:
    """A binary stream that passes what is written on and hashes it (SHA-256)."""

    def __init__(self, stream):
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.closed = False

    def write(self, data) -> int:
        self.sha256.update(data)
        if self._stream is not None:
            self._stream.write(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _kept(token: str) -> tuple[tuple, Listing]:
    with _kept_lock:
        args, listing = _kept_listings[token]
    return args, dataclasses.replace(listing, files=None)  # The fingerprint's columns: not needed there.


def write_listing(path: str | None, token: str, part_rows: int | None = None) -> str:
    """Writes the listing kept under ``token`` to ``path`` (the run's temporary
    folder) and its parts beside it (``transforms.plan.handoff``), for a listing
    step in another process to read instead of listing again: the run then
    converts exactly the files the preflight described and ``inputs.jsonl``
    records, even when files arrive while it starts.

    Returns:
      The SHA-256 (hex) of the hand-off, for the job graph: the step reads it only
      if it still has it (``read_listing``), and each part only if it has the
      digest the hand-off names. With ``path=None`` nothing is written (a dry run
      builds the same job).
    """
    args, listing = _kept(token)
    folder = path.rsplit("/", 1)[0] if path is not None else None
    index = []
    for number, refs in enumerate(listing_parts(listing.refs, part_rows or handoff.PART_ROWS)):
        name = part_name(number)
        index.append((name, len(refs), _written(None if folder is None else files.join(folder, name),
                                                 lambda sink, refs=refs: encode_part(refs, sink))))
    return _written(path, lambda sink: encode_listing(args, listing, sink, index))


def _written(path: str | None, encode) -> str:
    """Runs ``encode(sink)`` into ``path`` (or nowhere); returns the SHA-256 of the bytes."""
    if path is None:
        sink = _HashingSink(None)
        encode(sink)
        return sink.sha256.hexdigest()
    with files.open_write(path) as stream:
        sink = _HashingSink(stream)
        encode(sink)
    return sink.sha256.hexdigest()


def read_listing(path: str, args: tuple, sha256: str) -> Listing:
    """The listing ``write_listing`` wrote for the listing arguments ``args``, every
    part read.

    The file's SHA-256 is checked against ``sha256`` (from the job graph) before
    any of it is parsed, and each part's against the digest it names.

    Raises:
      HandoffError: when the file is not the one written (another digest), not
        such a listing, or made for other arguments; or a part is not the one
        it names.
    """
    listing, parts, _ = _read_handoff(path, args, sha256)
    refs = [part_refs(part) for part in _handed_parts(path, parts)]
    if refs and all(isinstance(r, RefTable) for r in refs):
        listing.refs = refs[0] if len(refs) == 1 else concat_tables(refs)
    else:
        listing.refs = [ref for part in refs for ref in part]
    return listing


def _read_handoff(path: str, args: tuple, sha256: str):
    data = files.read_bytes(path)
    check_digest(data, sha256, path)
    try:
        return decode_listing(data, args)
    except HandoffError as err:
        raise HandoffError(f"{path}: {err}") from err


def _handed_parts(path: str, parts) -> list[ListingPart]:
    folder = path.rsplit("/", 1)[0]
    return [ListingPart(number, count, files.join(folder, name), digest)
            for number, (name, count, digest) in enumerate(parts)]


def part_refs(part: ListingPart) -> Sequence[ImageRef]:
    """The references of a listing part: its own, or its hand-off file's (checked by
    its digest before it is parsed).

    Raises:
      HandoffError: when the file is not the one the hand-off names.
    """
    if part.refs is not None:
        return part.refs.unpack()
    return decode_part(files.read_bytes(part.path), part.sha256, part.path)


def joined_parts(parts: Sequence[ListingPart]) -> ImageRefs:
    """Listing parts as one element of all their references, in part order (for a
    step that needs them all: ``SpoolImages``)."""
    refs = [part_refs(part) for part in sorted(parts, key=lambda p: p.index)]
    tables = [r for r in refs if len(r)]
    if tables and all(isinstance(r, RefTable) for r in tables):
        return pack_refs(tables[0] if len(tables) == 1 else concat_tables(tables))
    return ImageRefs.pack([ref for part in refs for ref in part])


def listing_size(token: str | None) -> int:
    """The references a kept listing holds (0 when there is none)."""
    return len(kept_refs(token) or ())


def kept_refs(token: str | None) -> Sequence[ImageRef] | None:
    """The references of a kept listing, which stays kept (``None`` when there is none)."""
    if not token:
        return None
    with _kept_lock:
        kept = _kept_listings.get(token)
    return kept[1].refs if kept else None


def _take_listing(token: str | None, args: tuple) -> Listing | None:
    if not token:
        return None
    with _kept_lock:
        kept = _kept_listings.pop(token, None)
    return kept[1] if kept and kept[0] == tuple(args) else None


# A labels file is a few KB; more than this is not one (and is not read whole).
_LABELS_BYTES = 16 << 20


def read_labels_text(path: str) -> str:
    """A labels file's text, read as inputs are (``io.bounded_read``: a regular
    file only, at most 16 MiB).

    Raises:
      ValueError: when it is not a regular file, or is larger.
      OSError: when it cannot be read (``FileNotFoundError`` when missing).
    """
    try:
        data = read_input(path, None, _LABELS_BYTES)
    except InputRefused as refused:
        raise ValueError(f"the labels file {path.rsplit('/', 1)[-1]}: {refused.message}") from None
    return data.decode("utf-8-sig")


def path_text(path: str) -> str:
    """A path as text, whatever bytes its name holds (undecodable ones escaped)."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _published(root: str, path: str) -> str:
    """A listed path as dead letters name it: relative to the input root (as
    ``image/filename``), undecodable bytes escaped."""
    return path_text(relative_path(root, path))


def input_bytes(refs: Sequence[ImageRef]) -> int:
    """The bytes of the images a listing holds."""
    if isinstance(refs, RefTable):
        return int(refs.sizes.sum())
    return sum(ref.size for ref in refs)


def pack_refs(refs: Sequence[ImageRef]) -> ImageRefs:
    """A listing's references as one element: a ``RefTable`` pickles as its columns."""
    if isinstance(refs, RefTable):
        return ImageRefs(pickle.dumps(refs, protocol=pickle.HIGHEST_PROTOCOL), len(refs))
    return ImageRefs.pack(refs)


def listing_for(identity: ListingIdentity, kept: str | None, path: str | None, sha256: str,
                part_rows: int, contents_on_workers: bool = False):
    """The listing a listing step uses: ``(listing, parts, images, bytes, reused)``.

    The one kept under ``kept`` when its identity is ``identity``; else the one
    written at ``path`` (checked by ``sha256``; with ``part_rows``, only its index is
    read and ``parts`` are its parts, ``listing.refs`` then empty); else listed now.
    ``parts`` is ``None`` unless so.
    """
    listing = _take_listing(kept, identity)
    if listing is None and path and part_rows:
        listing, parts, total = _read_handoff(path, identity, sha256)
        parts = _handed_parts(path, parts)
        return listing, parts, sum(p.count for p in parts), total, True
    reused = listing is not None
    if listing is None and path:
        listing = read_listing(path, identity, sha256)
        reused = True
    listing = listing or list_images(*identity, contents_on_workers=contents_on_workers)
    return listing, None, len(listing.refs), input_bytes(listing.refs), reused
