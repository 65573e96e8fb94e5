"""Images: list and label them (``ListImages``), plan their shards from metadata
(``PlanImageShards``), read and encode them while a shard is written
(``ImageRecords``), and, for users' own pipelines, ``ImagesToExamples``.

The listing is metadata only (path, size, split, label), so it costs memory in
proportion to the file count: about 100 bytes per image plus its path once a
folder layout lists more than ``COMPACT_LISTING_REFS`` images (held as columns,
a ``RefTable``, and cut with a sort of 128-bit keys; see
``benchmarks/bench_planning.py``), ~2 KB below that (a list of ``ImageRef``).
It runs in one worker, as a file match does (``worker_listing`` spreads it over
workers, for ``--list_on_workers``); everything after it is spread over shards,
one element per shard.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import logging
import os
import pickle
import stat
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.config import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, ImageReshape
from beam_tfrecords.schemas.elements import (
    DeadLetter,
    ImageRef,
    ImageRefs,
    ImageSpool,
    InputSummary,
    ListingPart,
    ShardSpec,
    SpoolSegments,
)
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input, sha256_input
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.fingerprint import relative_path
from beam_tfrecords.transforms.io.gcs import is_gcs, object_info
from beam_tfrecords.transforms.io.helpers import SMALL_FILE_BYTES, helper_pool, ordered_map, ready_helper_pool
from beam_tfrecords.transforms.io.image_records import (
    Attachment,
    ImageRecordBuilder,
    estimated_record_size,
    read_failure,
    record_overheads,
)
from beam_tfrecords.transforms.plan import handoff
from beam_tfrecords.transforms.plan.handoff import (
    HANDOFF_NAME,
    HandoffError,
    check_digest,
    decode_listing,
    decode_part,
    encode_listing,
    encode_part,
    graph_args,
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
from beam_tfrecords.transforms.plan.ref_table import PathBuffer, RefTable, concat_tables, split_orders
from beam_tfrecords.transforms.plan.shards import split_specs, stable_key
from beam_tfrecords.transforms.quality.duplicates import keep_first
from beam_tfrecords.transforms.quality.splits import split_of
from beam_tfrecords.transforms.shards import Chunk, RecordSource
from beam_tfrecords.transforms.spools import plan_table_shards

__all__ = [
    "HeldImages",
    "LISTING_NAME",
    "ImageRecords",
    "ImagesToExamples",
    "ListImages",
    "PlanImageShards",
    "SpoolImages",
    "add_spool_dead_letters",
    "plan_spooled_images",
    "estimated_record_size",
    "drop_listing",
    "content_key",
    "image_shards",
    "input_bytes",
    "joined_parts",
    "listing_size",
    "pack_refs",
    "part_refs",
    "path_text",
    "keep_listing",
    "list_images",
    "read_labels_text",
    "record_overheads",
    "plan_image_shards",
    "read_listing",
    "write_listing",
]

SUMMARY_TAG = "summary"
DEAD_LETTER_TAG = "dead_letter"
_log = logging.getLogger(__name__)
_CHUNK_FILES = 64
_CHUNK_BYTES = 4 << 20
# A folder layout listing more images than this keeps them as columns (a ``RefTable``):
# below it, the list of ``ImageRef`` of before (the same records either way).
COMPACT_LISTING_REFS = 200_000


def list_images(input_path: str, layout: str = "auto", labels_path: str | None = None,
                image_column: str | None = None, label_column: str | None = None,
                splits: tuple[tuple[str, float], ...] = (), split_by: str = "path",
                drop_duplicates: bool = False, vocabulary: tuple[str, ...] = (),
                only: tuple[str, ...] = (), follow_links_outside: bool = False,
                max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, *,
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
    found, bad_names = PathBuffer(root), []
    for item in files.list_stamped(pattern, skipped=skipped, follow_outside=follow_links_outside):
        try:  # item: (path, size, stamp, crc)
            found.add(*item)
        except UnicodeEncodeError:  # A name that is not UTF-8 cannot be a feature's text.
            bad_names.append(DeadLetter(_published(root, item[0]), "list", "bad_file_name",
                                        "the file name is not UTF-8 text; rename the file"))
    if layout == "auto":
        layout = detect_layout(root, (item[0] for item in found))
    if layout == "cifar":
        labels_text = "\n".join(labels) if labels else read_labels_text(files.join(root, CIFAR_LABELS_FILE))
        listing = list_cifar(root, found, labels_text, compact=True)
    else:
        listing = list_class_folders(root, found, labels, compact=True)
    del found
    listing.files = listing.refs  # The fingerprint's columns (stamps from this listing).
    if len(listing.refs) <= COMPACT_LISTING_REFS:
        listing.refs = listing.refs.by_filename()
    listing.skipped = [DeadLetter(_published(root, path), "list", reason, message)
                       for path, reason, message in skipped]
    listing.dead_letters.extend(bad_names)
    return listing


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
    only, follow_links_outside, max_file_bytes)``: a step lists again unless its
    own match.
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
    if not token:
        return 0
    with _kept_lock:
        kept = _kept_listings.get(token)
    return len(kept[1].refs) if kept else 0


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


class _ListImagesFn(beam.DoFn):
    """Impulse → one ``ImageRefs`` of all images, or with ``part_rows`` one
    ``ListingPart`` per part of at most that many (main); and one ``InputSummary``
    (tagged ``summary``)."""

    def __init__(self, input_path: str, layout: str, labels_path: str | None, output: str,
                 helper_processes: int, columns: tuple[str | None, str | None] = (None, None),
                 kept: str | None = None, splits: tuple = (), split_by: str = "path",
                 drop_duplicates: bool = False, vocabulary: tuple[str, ...] = (),
                 only: tuple[str, ...] = (), listing_path: str | None = None,
                 follow_links_outside: bool = False, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 listing_sha256: str = "", part_rows: int = 0, contents_on_workers: bool = False):
        if listing_path and not listing_sha256:
            raise ValueError("a listing handed over through storage needs its SHA-256")
        self._kept = kept
        self._listing_path = listing_path
        self._listing_sha256 = listing_sha256
        self._part_rows = part_rows
        self._contents_on_workers = contents_on_workers
        self._splits = (tuple(splits), split_by, drop_duplicates, tuple(vocabulary), tuple(only),
                        follow_links_outside, max_file_bytes)
        if listing_path:  # The names are in the hand-off; the job graph holds their digest.
            self._splits = graph_args((None,) * 5 + self._splits)[5:]
        self._input = input_path
        self._layout = layout
        self._labels = labels_path
        self._columns = columns
        self._output = output
        self._processes = helper_processes

    def _listing(self, args: tuple):
        """``(listing, parts, images, bytes, reused)``: ``parts`` the hand-off's parts when
        only its index was read (``listing.refs`` is then empty), else ``None``."""
        listing = _take_listing(self._kept, args)
        if listing is None and self._listing_path and self._part_rows:
            listing, parts, total = _read_handoff(self._listing_path, args, self._listing_sha256)
            parts = _handed_parts(self._listing_path, parts)
            return listing, parts, sum(p.count for p in parts), total, True
        reused = listing is not None
        if listing is None and self._listing_path:
            listing = read_listing(self._listing_path, args, self._listing_sha256)
            reused = True
        listing = listing or list_images(*args, contents_on_workers=self._contents_on_workers)
        return listing, None, len(listing.refs), input_bytes(listing.refs), reused

    def process(self, _):
        hold_point("listing")
        args = (self._input, self._layout, self._labels, *self._columns, *self._splits)
        listing, parts, count, total_bytes, reused = self._listing(args)
        if self._processes > 0 and count and total_bytes < SMALL_FILE_BYTES * count:
            # Small files: start the shard writers' helper processes while planning runs.
            helper_pool(self._processes)
        _, root, _ = resolve_input(self._input, self._layout)
        dead_path = write_dead_letters(self._output, "listing", listing.dead_letters)
        skipped_path = write_dead_letters(self._output, "skipped", listing.skipped)
        bad = Counter(d.error for d in listing.dead_letters)
        images = count + len(listing.dead_letters) + len(listing.duplicates_dropped)
        _log.info(
            "Listed %d images (%d refused, %d other files ignored, %d paths passed over) in "
            "layout %s%s", images, len(listing.dead_letters), listing.ignored, len(listing.skipped),
            listing.layout, " (the preflight's listing)" if reused else "",
        )
        beam.metrics.Metrics.counter("list", "images").inc(count)
        beam.metrics.Metrics.counter("list", "dead_letter").inc(len(listing.dead_letters))
        progress.plan(inputs=count, input_bytes=total_bytes)
        yield beam.pvalue.TaggedOutput(
            SUMMARY_TAG,
            InputSummary(
                root=root,
                layout=listing.layout,
                input_files=images,
                input_bytes=total_bytes,
                ignored_files=listing.ignored,
                vocabulary=tuple(listing.vocabulary),
                extra_features=tuple(listing.extra_features.items()),
                bad_counts=tuple(sorted(bad.items())),
                dead_letter_path=dead_path,
                skipped=tuple(sorted(Counter(s.error for s in listing.skipped).items())),
                skipped_path=skipped_path,
                duplicates_dropped=tuple(listing.duplicates_dropped),
            ),
        )
        if parts is not None:  # Each part is read where it is used.
            yield from parts
        elif self._part_rows:
            for number, refs in enumerate(listing_parts(listing.refs, self._part_rows)):
                yield ListingPart(number, len(refs), refs=pack_refs(refs))
        else:
            yield pack_refs(listing.refs)


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


class ListImages(beam.PTransform):
    """Lists and labels the images of a dataset, without reading them.

    Args:
      input_path: a folder, a glob or a CSV manifest.
      layout: ``auto``, ``class_folders``, ``cifar`` or ``csv``.
      labels_path: a labels file, or ``None``.
      output: the output folder (inputs refused while listing are dead-lettered there).
      helper_processes: helper processes the shard writers will use (started early).
      image_column, label_column: a CSV manifest's columns (default: by name).
      kept: a token from ``keep_listing``: the listing already made, used when the
        step runs in the process that made it.
      listing_path: else, a file ``write_listing`` wrote: that listing is used (the
        step lists again only when neither is given).
      listing_sha256: the SHA-256 ``write_listing`` returned for ``listing_path``;
        the step refuses a file without it (``HandoffError``, one line) before
        parsing anything.
      splits, split_by, drop_duplicates, vocabulary, only, follow_links_outside,
        max_file_bytes: see ``list_images``.
      part_rows: when given, the references come as parts of at most this many
        (``ListingPart``; a handed-over listing's parts are read where they are
        used, ``part_refs``), for ``PlanListingParts``.
      contents_on_workers: a listing made by this step leaves splits by content
        and dropping copies to the pipeline's ``HashImages`` step (see ``list_images``).

    Returns a ``DoOutputsTuple``: ``.refs`` holds one ``ImageRefs`` element (or the
    ``ListingPart`` s); ``.summary`` holds one ``InputSummary``.
    """

    def __init__(self, input_path: str, layout: str, labels_path: str | None, output: str,
                 helper_processes: int = 0, image_column: str | None = None,
                 label_column: str | None = None, kept: str | None = None,
                 splits: tuple = (), split_by: str = "path", drop_duplicates: bool = False,
                 vocabulary: tuple[str, ...] = (), only: tuple[str, ...] = (),
                 listing_path: str | None = None, follow_links_outside: bool = False,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, listing_sha256: str = "",
                 part_rows: int = 0, contents_on_workers: bool = False):
        super().__init__()
        self._fn = _ListImagesFn(input_path, layout, labels_path, output, helper_processes,
                                 (image_column, label_column), kept, splits, split_by,
                                 drop_duplicates, vocabulary, only, listing_path,
                                 follow_links_outside, max_file_bytes, listing_sha256, part_rows,
                                 contents_on_workers)

    def expand(self, pbegin):
        return (
            pbegin
            | "Impulse" >> beam.Create([None])
            | "ListAndLabel" >> beam.ParDo(self._fn).with_outputs(SUMMARY_TAG, main="refs")
        )



def plan_image_shards(images: ImageRefs, band: ShardBand, compression: str) -> list[ShardSpec]:
    """Cuts each split, in key order, into shards of nearly equal bytes.

    Args:
      images: every image of every split.
      band: the shard size band.
      compression: ``none`` or ``gzip`` (names the files; sizes are planned on
        uncompressed bytes, since encoded images barely compress).

    Returns:
      One spec per shard, split by split, in index order.
    """
    return list(image_shards(images, band, compression))


def image_shards(images: ImageRefs, band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """``plan_image_shards``, one spec at a time. The plan of a ``RefTable`` makes
    no reference object: each spec's ``ImageRefs`` holds its rows as a table of
    their own (its writer iterates them as references, in order)."""
    refs = images.unpack()
    start = time.monotonic()
    count = shards = 0
    for spec in (_table_specs(refs, band, compression) if isinstance(refs, RefTable)
                 else _ref_specs(refs, band, compression)):
        yield spec
        count += spec.records.count
        shards += 1
    _log.info("Planned %d shards for %d images in %.1f s", shards, count, time.monotonic() - start)
    progress.plan(shards=shards)


def _ref_specs(refs: Sequence[ImageRef], band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """The specs of a list of references, split by split."""
    by_split: dict[str, list[ImageRef]] = {}
    for ref in refs:
        by_split.setdefault(ref.split, []).append(ref)
    for split in sorted(by_split):
        items = sorted(by_split[split], key=lambda r: (r.key, r.filename))
        yield from split_specs(split, [estimated_record_size(r) for r in items], band, compression,
                               lambda a, b, items=items: ImageRefs.pack(items[a:b]))


def _table_specs(table: RefTable, band: ShardBand, compression: str) -> Iterator[ShardSpec]:
    """The specs of a table, split by split (each spec's rows a table of their own)."""
    planned = record_overheads(table.vocabulary)[table.labels] + table.sizes + table.name_lengths()
    for split, order in split_orders(table):
        yield from split_specs(split, planned[order], band, compression,
                               lambda a, b, order=order: pack_refs(table.rows(order[a:b])))


class PlanImageShards(beam.PTransform):
    """``ImageRefs`` → one ``ShardSpec`` per shard, spread over workers."""

    def __init__(self, band: ShardBand, compression: str = "none"):
        super().__init__()
        self._band = band
        self._compression = compression

    def expand(self, refs):
        return (
            refs
            | "CutSplits" >> beam.FlatMap(image_shards, self._band, self._compression)
            # One element per shard: spread them so each worker writes some.
            | "Spread" >> beam.Reshuffle()
        )


def _chunks(items: Sequence[ImageRef]) -> Iterator[list[ImageRef]]:
    """Consecutive runs of at most _CHUNK_FILES files and about _CHUNK_BYTES bytes."""
    chunk, size = [], 0
    for item in items:
        if chunk and (len(chunk) >= _CHUNK_FILES or size + item.size > _CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += item.size
    if chunk:
        yield chunk


class ImageRecords(RecordSource):
    """A shard's images, read, checked and encoded a chunk at a time.

    A pool works at most a few chunks ahead of the writer, in key order: threads,
    or, for shards of small files when ``helper_processes`` > 0, the process-wide
    helper pool (see ``transforms.io.helpers``), which is how the DirectRunner
    gets every core working.

    Args:
      validate: ``headers``, ``structure`` or ``decode`` (see ``inspect_image``).
      read_threads: threads reading and checking images.
      helper_processes: helper processes for shards of small files (0: none).
      max_pixels: images declaring more pixels are dead-lettered (``too_many_pixels``).
      image_bytes: ``readable`` (images tf.io.decode_image cannot read are stored
        as PNG) or ``original`` (every file's bytes as they are).
      reshape: how images are resized and re-encoded (``None``: not at all).
      max_file_bytes: a file larger than this is dead-lettered unread
        (``file_too_large``); every file is read as ``io.bounded_read`` says (a
        regular file only, at most its listed size plus one byte).
      attach: per image, what side data adds to its record (``Attachment``; see
        ``io.image_records``, which builds every image record); picklable.
    """

    def __init__(self, validate: str = "structure", read_threads: int = 4, helper_processes: int = 0,
                 max_pixels: int = DEFAULT_MAX_PIXELS, image_bytes: str = "readable",
                 reshape: ImageReshape | None = None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 attach: Callable[[ImageRef], Attachment | None] | None = None):
        self._builder = ImageRecordBuilder(validate, max_pixels, image_bytes,
                                           reshape if reshape is not None and reshape.active else None,
                                           max_file_bytes, attach)
        self._read_threads = read_threads
        self._processes = helper_processes
        self._threads = None

    def setup(self) -> None:
        self._threads = concurrent.futures.ThreadPoolExecutor(
            self._read_threads, thread_name_prefix="read-image")

    def teardown(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    def __getstate__(self):
        return {**self.__dict__, "_threads": None}

    def _pool_for(self, spec: ShardSpec) -> tuple[concurrent.futures.Executor, int]:
        """The pool for this shard's files, and how many tasks it runs at once."""
        if self._processes > 0 and spec.planned_bytes < SMALL_FILE_BYTES * spec.records.count:
            pool = ready_helper_pool(self._processes)
            if pool is not None:
                return pool, self._processes
        return self._threads, self._read_threads

    def chunks(self, spec: ShardSpec) -> Iterator[Chunk]:
        pool, workers = self._pool_for(spec)
        chunks = list(_chunks(spec.records.unpack()))
        encoded = ordered_map(pool, self._builder.chunk, chunks, workers + 2)
        for chunk, (framed, outcomes) in zip(chunks, encoded):
            progress.add(inputs=len(chunk), input_bytes=sum(ref.size for ref in chunk))
            dead, labels, notes, contents, images = [], [], [], [], []
            for ref, outcome in zip(chunk, outcomes):
                if isinstance(outcome, DeadLetter):
                    dead.append(outcome)
                else:
                    labels.append(ref.label_text or str(ref.label))
                    contents.append((outcome.sha256, ref.filename,
                                     outcome.source_sha256 if outcome.source_sha256 != outcome.sha256 else ""))
                    notes.append(outcome.note)
                    images.append(outcome.image)
            yield Chunk(framed, len(labels), tuple(dead), tuple(labels), len(chunk), tuple(notes),
                        tuple(contents), tuple(images))


class _ImageToExampleFn(beam.DoFn):
    """path | (path, label) → ``(key, Example bytes, plan size)``; bad images tagged
    ``dead_letter``."""

    def __init__(self, root: str | None, split: str, labels: Sequence[str] | None, validate: str,
                 max_pixels: int = DEFAULT_MAX_PIXELS, image_bytes: str = "readable",
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 attach: Callable[[ImageRef], Attachment | None] | None = None):
        self._builder = ImageRecordBuilder(validate, max_pixels, image_bytes, None, max_file_bytes, attach)
        self._root = root.rstrip("/") + "/" if root else None
        self._split = split
        self._labels = list(labels) if labels is not None else None
        self._index = {name: i for i, name in enumerate(self._labels or ())}

    def _label(self, path: str, given) -> tuple[int, str] | str:
        if given is None:  # Class-per-folder: the parent folder names the class.
            given = path.rsplit("/", 2)[-2] if path.count("/") else ""
        if isinstance(given, int) and not isinstance(given, bool):
            text = self._labels[given] if self._labels and 0 <= given < len(self._labels) else ""
            return given, text
        if isinstance(given, str) and given in self._index:
            return self._index[given], given
        return f"class {given!r} is not in the labels {self._labels}"

    def process(self, element) -> Iterator:
        path, given = (element, None) if isinstance(element, str) else element
        if self._root and path.startswith(self._root):
            relative = path[len(self._root):]
        else:
            relative = path.rsplit("/", 1)[-1]
        label = self._label(path, given)
        if isinstance(label, str):
            beam.metrics.Metrics.counter("images", "dead_letter").inc()
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTER_TAG, DeadLetter(path, "list", "unknown_class", label))
            return
        try:
            data = read_input(path, None, self._builder.max_file_bytes)
        except (InputRefused, OSError, BeamIOError) as err:
            beam.metrics.Metrics.counter("images", "dead_letter").inc()
            letter = (DeadLetter(path, "read", err.reason, err.message) if isinstance(err, InputRefused)
                      else DeadLetter(path, "read", "read_error", read_failure(err)))
            yield beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, letter)
            return
        ref = ImageRef(self._split, stable_key(self._split, relative), relative, path, len(data),
                       label[0], label[1])
        example = self._builder.example(ref, data)
        if isinstance(example, DeadLetter):
            beam.metrics.Metrics.counter("images", "dead_letter").inc()
            # Your pipeline's dead letters name the path it gave.
            yield beam.pvalue.TaggedOutput(DEAD_LETTER_TAG, dataclasses.replace(example, source=path))
            return
        yield ref.key, example[0], estimated_record_size(ref)


class ImagesToExamples(beam.PTransform):
    """Image paths (or ``(path, label)``) → ``(key, serialized tf.train.Example, plan_size)``.

    Each record holds the same features as the CLI writes (``image/encoded`` with
    the file's own bytes, format, height, width, channels, label, class text,
    file name relative to ``root``, SHA-256), so
    ``paths | ImagesToExamples(root=...) | WriteVerifiedShards(out)`` gives the
    CLI's shards: keys are the CLI's ordering keys and ``plan_size`` the size the
    CLI plans an image at.

    Args:
      root: the folder ``image/filename`` is relative to (default: the file name).
      split: the split (part of the ordering key).
      labels: class names in label order; a label given as a name, or taken from
        the parent folder's name when none is given, is its index here.
      validate: ``headers``, ``structure`` or ``decode`` (see ``inspect_image``).
      max_pixels: images declaring more pixels are dead-lettered (``too_many_pixels``).
      image_bytes: ``readable`` (default: an image tf.io.decode_image cannot read
        as stored, such as TIFF or CMYK JPEG, is stored as a lossless PNG) or
        ``original`` (every file's own bytes).
      max_file_bytes: a file larger than this is not read (``file_too_large``).
      attach: per image, what side data adds to its record (see ``io.image_records``).

    Returns the examples. Images that cannot be read, checked or labelled are
    counted (metric ``images/dead_letter``) and go to ``.dead_letter``, a
    PCollection of ``DeadLetter`` (source, stage, reason) set when the transform
    is applied: write it wherever your pipeline keeps rejects.
    """

    def __init__(self, root: str | None = None, split: str = "train",
                 labels: Sequence[str] | None = None, validate: str = "structure",
                 max_pixels: int = DEFAULT_MAX_PIXELS, image_bytes: str = "readable",
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 attach: Callable[[ImageRef], Attachment | None] | None = None):
        super().__init__()
        self._fn = _ImageToExampleFn(root, split, labels, validate, max_pixels, image_bytes,
                                     max_file_bytes, attach)
        self.dead_letter = None

    def expand(self, paths):
        outputs = paths | "Encode" >> beam.ParDo(self._fn).with_outputs(DEAD_LETTER_TAG, main="examples")
        self.dead_letter = outputs[DEAD_LETTER_TAG]
        return outputs.examples


# Images per spool unit when they are encoded ahead of planning (SpoolImages):
# enough to keep a worker's helper processes busy, few enough to spread.
_UNIT_FILES = 512
_UNIT_BYTES = 256 << 20


def _units(images: ImageRefs) -> Iterator[tuple[str, int, ImageRefs]]:
    """Each split's images, in key order, as consecutive units ``(split, index, refs)``."""
    by_split: dict[str, list[ImageRef]] = {}
    for ref in images.unpack():
        by_split.setdefault(ref.split, []).append(ref)
    for split in sorted(by_split):
        unit, size, index = [], 0, 0
        for ref in sorted(by_split[split], key=lambda r: r.key):
            if unit and (len(unit) >= _UNIT_FILES or size + ref.size > _UNIT_BYTES):
                yield split, index, ImageRefs.pack(unit)
                unit, size, index = [], 0, index + 1
            unit.append(ref)
            size += ref.size
        if unit:
            yield split, index, ImageRefs.pack(unit)


def _framed_sizes(framed: bytes) -> list[int]:
    """The size of each framed record in a run of them (length, CRC, data, CRC)."""
    sizes, offset = [], 0
    while offset < len(framed):
        size = 16 + int.from_bytes(framed[offset:offset + 8], "little")
        sizes.append(size)
        offset += size
    return sizes


class _SpoolUnitFn(beam.DoFn):
    """``(split, index, refs)`` → one ``ImageSpool``: the unit's records, encoded."""

    def __init__(self, source: ImageRecords, spool_dir: str, output: str):
        self._source = source
        self._spool_dir = spool_dir
        self._output = output

    def setup(self):
        self._source.setup()

    def teardown(self):
        self._source.teardown()

    def process(self, element):
        split, index, refs = element
        spec = ShardSpec(split, 0, 1, f"{split}-unit-{index:05d}", sum(r.size for r in refs.unpack()),
                         refs)
        path = files.join(self._spool_dir, f"{split}-{index:05d}.spool")
        sizes, labels, notes, contents, images, dead = [], [], [], [], [], []
        with files.open_write(path) as stream:
            for chunk in self._source.chunks(spec):
                stream.write(chunk.framed)
                sizes.extend(_framed_sizes(chunk.framed))
                labels.extend(chunk.labels)
                notes.extend(chunk.notes)
                contents.extend(chunk.contents)
                images.extend(chunk.images)
                dead.extend(chunk.dead)
        dead_path = write_dead_letters(self._output, f"{split}-unit-{index:05d}", dead)
        beam.metrics.Metrics.counter("images", "spooled").inc(len(sizes))
        yield ImageSpool(split, index, path if sizes else "", np.asarray(sizes, "<i8").tobytes(),
                         tuple(labels), tuple(notes), tuple(contents),
                         tuple(sorted(Counter(d.error for d in dead).items())), dead_path,
                         tuple(images))


def plan_spooled_images(spools: Sequence[ImageSpool], band: ShardBand,
                        compression: str) -> list[ShardSpec]:
    """Shards cut from spooled images by their exact sizes, in key order, each
    segment carrying its records' labels, notes, contents and image facts."""
    by_path = {spool.path: spool for spool in spools if spool.path}
    offsets = {path: np.concatenate(([0], np.cumsum(s.record_sizes()))) for path, s in by_path.items()}
    specs = []
    for spec in plan_table_shards(list(by_path.values()), band, compression):
        extras = []
        for path, begin, end, _ in spec.records.segments:
            spool = by_path[path]
            first, last = np.searchsorted(offsets[path], [begin, end])
            extras.append((spool.labels[first:last], spool.notes[first:last],
                           spool.contents[first:last], spool.images[first:last]))
        specs.append(dataclasses.replace(
            spec, records=SpoolSegments(spec.records.segments, tuple(extras))))
    return specs


def _with_spool_dead_letters(summary: InputSummary, spools: Sequence[ImageSpool]) -> InputSummary:
    """The listing's summary plus what encoding the spools refused."""
    bad = Counter(dict(summary.bad_counts))
    for spool in spools:
        bad.update(dict(spool.bad_counts))
    return dataclasses.replace(
        summary, bad_counts=tuple(sorted(bad.items())),
        dead_letter_paths=tuple(sorted(s.dead_letter_path for s in spools if s.dead_letter_path)))


class SpoolImages(beam.PTransform):
    """Images encoded before their shards are planned, for records whose size is
    only known once encoded (resized or re-encoded images): ``ImageRefs`` → spool
    files of framed records (``ImageSpool``), in units spread over workers, then
    ``ShardSpec`` s cut by exact sizes (read them with ``SpoolCopy``).

    Args:
      source: the ``ImageRecords`` that reads, checks and encodes the images.
      spool_dir: where the spool files go (the run's temporary folder).
      output: the output folder (dead letters go there).
      band, compression: the shard size band; the shards' compression.

    Returns ``(specs, spools)``: one ``ShardSpec`` per shard, and the list of
    ``ImageSpool`` (one element; see ``add_spool_dead_letters``).
    """

    def __init__(self, source: ImageRecords, spool_dir: str, output: str, band: ShardBand,
                 compression: str = "none"):
        super().__init__()
        self._fn = _SpoolUnitFn(source, spool_dir, output)
        self._band = band
        self._compression = compression

    def expand(self, refs):
        spools = (
            refs
            | "Units" >> beam.FlatMap(_units)
            | "SpreadUnits" >> beam.Reshuffle()
            | "Encode" >> beam.ParDo(self._fn)
            | "Collect" >> beam.combiners.ToList()
        )
        specs = (
            spools
            | "Cut" >> beam.FlatMap(plan_spooled_images, self._band, self._compression)
            | "Spread" >> beam.Reshuffle()
        )
        return specs, spools


def add_spool_dead_letters(summary, spools):
    """``summary`` (one ``InputSummary``) with the dead letters of ``spools`` (the
    list ``SpoolImages`` gives) added: for the commit."""
    return summary | "AddSpoolDeadLetters" >> beam.Map(
        _with_spool_dead_letters, beam.pvalue.AsSingleton(spools))
