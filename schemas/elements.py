"""The small values that travel through the pipeline: references, plans, results.

All are frozen dataclasses that check themselves, carry no payload bytes, and
pickle cheaply, so grouping them costs memory in proportion to the file count,
never to the data size.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import pickle
from collections.abc import Iterator, Sequence
from operator import attrgetter

__all__ = [
    "DEAD_LETTER_STAGES",
    "CompletedInputs",
    "DeadLetter",
    "ImageRef",
    "ImageRefs",
    "InputSummary",
    "ListingPart",
    "RefColumns",
    "ShardResult",
    "ShardSpec",
    "SpoolSegments",
    "StoredObject",
]

# "object": one object of an annotated image dropped (its box has no area, ...), the
# image kept; the error budget, which counts images, does not count these.
DEAD_LETTER_STAGES = ("list", "read", "validate", "encode", "object")
MAX_ROW_CHARS = 4096
_EXTRA_DTYPES = ("string", "int64", "float32")


@dataclasses.dataclass(frozen=True)
class ImageRef:
    """One image to convert, with everything known before its bytes are read.

    Attributes:
      split: the split it belongs to (``train``, ``test``, ...).
      key: stable ordering key (see ``transforms.plan.shards.stable_key``).
      filename: path relative to the input root, '/'-separated; stored as
        ``image/filename``.
      path: where to read it (local path or URI).
      size: file size in bytes.
      label: class index.
      label_text: class name ('' when unknown).
      extra: extra scalar features, ``((name, dtype, value), ...)``, sorted by name.
      generation: a ``gs://`` object's generation as listed (0: not known, or not
        on GCS); the image is read at exactly that generation.
      crc32c: a ``gs://`` object's CRC-32C as listed (-1: not known); bytes read
        that do not match it are not converted.
      annotation: the image's annotations (an annotated layout's boxes, labels,
        masks), as ``transforms.codec.annotation_bytes`` encodes one
        ``schemas.annotations.ImageAnnotations`` (plain JSON, never code: it travels
        through the listing's hand-off); ``b""`` for an image without. Left out of
        the pickled state when empty, so a reference without annotations pickles
        to the same bytes as before the field existed.
    """

    split: str
    key: str
    filename: str
    path: str
    size: int
    label: int
    label_text: str
    extra: tuple[tuple[str, str, object], ...] = ()
    generation: int = 0
    crc32c: int = -1
    annotation: bytes = b""

    def __post_init__(self):
        if not isinstance(self.annotation, bytes):
            raise ValueError(f"{self.path}: annotation must be bytes, got {type(self.annotation).__name__}")
        if self.size < 0:
            raise ValueError(f"{self.path}: size must be >= 0, got {self.size}")
        for name, dtype, _ in self.extra:
            if dtype not in _EXTRA_DTYPES:
                raise ValueError(f"extra feature {name!r}: dtype must be one of {_EXTRA_DTYPES}")

    def __getstate__(self):
        state = dict(self.__dict__)
        if not state.get("annotation"):  # The class default stands in for it when unpickled.
            state.pop("annotation", None)
        return state


@dataclasses.dataclass(frozen=True)
class ImageRefs:
    """Image references packed into one bytes value.

    A pipeline element made of tens of thousands of objects is costly to move:
    Beam pickles it at every step boundary and again whenever it samples element
    sizes. Packed, each of those is a copy of one bytes value; the references
    are unpacked once, where they are used.
    """

    packed: bytes
    count: int

    @classmethod
    def pack(cls, refs: Sequence[ImageRef]) -> ImageRefs:
        return cls(pickle.dumps(tuple(refs), protocol=pickle.HIGHEST_PROTOCOL), len(refs))

    @classmethod
    def pack_columns(cls, refs: Sequence[ImageRef]) -> ImageRefs:
        """``refs`` packed as columns (``RefColumns``): a list per field, pickled at C
        speed both ways, where ``pack`` pickles an object per reference; ``unpack``
        gives them back as a ``RefColumns`` (a sequence of ``ImageRef``)."""
        columns = refs if isinstance(refs, RefColumns) else RefColumns.of(refs)
        return cls(pickle.dumps(columns, protocol=pickle.HIGHEST_PROTOCOL), len(columns))

    def unpack(self) -> Sequence[ImageRef]:
        """The references: a tuple of ``ImageRef`` (``pack``), a ``RefColumns``
        (``pack_columns``) or whatever sequence of them was pickled (a ``RefTable``)."""
        return pickle.loads(self.packed)


_REF_FIELDS = tuple(field.name for field in dataclasses.fields(ImageRef))
# Fields whose column is left out (``None``) when every reference holds the default.
_REF_DEFAULTS = {"extra": (), "generation": 0, "crc32c": -1, "annotation": b""}
_PATH = _REF_FIELDS.index("path")
_new_object = object.__new__


def _common_prefix(paths: list[str], names: list[str]) -> str | None:
    """The prefix every path is of its file name (``path == prefix + name``), if one is."""
    if not paths or not paths[0].endswith(names[0]):
        return None
    prefix = paths[0][:len(paths[0]) - len(names[0])]
    return prefix if list(map(prefix.__add__, names)) == paths else None


def _ref_of(values: tuple) -> ImageRef:
    """An ``ImageRef`` of field values taken from references already made (and so
    already checked by ``ImageRef.__post_init__``), without checking them again."""
    ref = _new_object(ImageRef)
    ref.__dict__.update(zip(_REF_FIELDS, values))
    return ref


def _ref_columns(blobs: tuple[bytes | None, ...], count: int, path_prefix: str | None = None) -> RefColumns:
    """A ``RefColumns`` unpickled (see ``RefColumns.__reduce__``)."""
    return RefColumns(tuple(None if blob is None else pickle.loads(blob) for blob in blobs), count,
                      path_prefix)


class RefColumns(Sequence):
    """Image references as columns: one list per ``ImageRef`` field (``None`` for a
    field every reference leaves at its default). A sequence of ``ImageRef``:
    indexing or iterating makes the objects; ``column``, ``take`` and ``span`` work
    on the lists, so planning and handing references to helper processes make no
    object per reference, and pickling is of plain lists (C speed). When every
    path is one prefix plus the file name (a folder's images), the paths are
    held as that prefix (``path_prefix``; the path column is then ``None``)."""

    __slots__ = ("_columns", "_count", "_path_prefix")

    def __init__(self, columns: tuple[list | None, ...], count: int, path_prefix: str | None = None):
        if len(columns) != len(_REF_FIELDS):
            raise ValueError(f"{len(columns)} columns for {len(_REF_FIELDS)} fields")
        if (columns[_PATH] is None) == (path_prefix is None):
            raise ValueError("the paths are held either as a column or as a prefix")
        self._columns = tuple(columns)
        self._count = count
        self._path_prefix = path_prefix

    @classmethod
    def of(cls, refs: Sequence[ImageRef]) -> RefColumns:
        """The columns of ``refs``, in order."""
        refs = refs if isinstance(refs, list | tuple) else list(refs)
        count = len(refs)
        columns = []
        for name in _REF_FIELDS:
            values = list(map(attrgetter(name), refs))
            if name in _REF_DEFAULTS and values.count(_REF_DEFAULTS[name]) == count:
                values = None
            columns.append(values)
        prefix = _common_prefix(columns[_PATH], columns[_REF_FIELDS.index("filename")])
        if prefix is not None:
            columns[_PATH] = None
        return cls(tuple(columns), count, prefix)

    def __reduce__(self):
        # Each column pickled on its own: one pickle's memo of every string is
        # slower to keep than a few small ones (~2x for tens of thousands).
        blobs = tuple(None if values is None else pickle.dumps(values, protocol=pickle.HIGHEST_PROTOCOL)
                      for values in self._columns)
        return _ref_columns, (blobs, self._count, self._path_prefix)

    def __len__(self) -> int:
        return self._count

    @property
    def path_prefix(self) -> str | None:
        """The prefix every path is of its file name, when the paths are held so."""
        return self._path_prefix

    def is_default(self, name: str) -> bool:
        """Whether every reference leaves field ``name`` at its default."""
        return name in _REF_DEFAULTS and self._columns[_REF_FIELDS.index(name)] is None

    def column(self, name: str) -> list:
        """The values of field ``name``, one a reference (a list; do not change it)."""
        index = _REF_FIELDS.index(name)
        values = self._columns[index]
        if values is None and index == _PATH:
            return list(map(self._path_prefix.__add__, self._columns[_REF_FIELDS.index("filename")]))
        return [_REF_DEFAULTS[name]] * self._count if values is None else values

    def take(self, indices: Sequence[int]) -> RefColumns:
        """The references at ``indices`` (ints), in that order, as columns."""
        indices = list(indices)
        return RefColumns(tuple(None if values is None else list(map(values.__getitem__, indices))
                                for values in self._columns), len(indices), self._path_prefix)

    def span(self, start: int, stop: int) -> RefColumns:
        """References ``start:stop``, as columns."""
        start, stop, _ = slice(start, stop).indices(self._count)
        return RefColumns(tuple(None if values is None else values[start:stop]
                                for values in self._columns), max(0, stop - start), self._path_prefix)

    def __iter__(self) -> Iterator[ImageRef]:
        columns = [values if values is not None else self.column(name) if name == "path"
                   else itertools.repeat(_REF_DEFAULTS[name], self._count)
                   for name, values in zip(_REF_FIELDS, self._columns)]
        return map(_ref_of, zip(*columns))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self.take(range(self._count)[index]))
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        return next(iter(self.span(index, index + 1)))

    def __eq__(self, other):
        if isinstance(other, RefColumns | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None


@dataclasses.dataclass(frozen=True)
class ListingPart:
    """One part of a listing's references, in listing order (a large listing travels
    as parts, so that a step reads only the part it works on).

    Attributes:
      index: the part's place in the listing; count: its references.
      path, sha256: the hand-off file that holds them and its SHA-256, checked
        before it is parsed (``transforms.plan.handoff``); or
      refs: the references themselves ('' path).
    """

    index: int
    count: int
    path: str = ""
    sha256: str = ""
    refs: ImageRefs | None = None


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A bad input: where it came from, at which stage it failed, and why.

    Attributes:
      source: path or URI of the input (with ``:LINE`` for a CSV row).
      stage: one of ``DEAD_LETTER_STAGES``.
      error: short reason code, e.g. ``truncated_jpeg``; bad-record counts are keyed by it.
      message: a sentence a person can act on.
      row: for a line of a CSV image manifest, its text (cut to ``MAX_ROW_CHARS``); else
        ''. A table's dead letters never set it: they name the line and column, and
        describe the value, never quote it.
    """

    source: str
    stage: str
    error: str
    message: str
    row: str = ""

    def __post_init__(self):
        if self.stage not in DEAD_LETTER_STAGES:
            raise ValueError(f"stage must be one of {DEAD_LETTER_STAGES}, got {self.stage!r}")
        if len(self.row) > MAX_ROW_CHARS:
            object.__setattr__(self, "row", self.row[:MAX_ROW_CHARS] + "...")

    def to_json_line(self) -> str:
        """One JSON object on one line, keys in a fixed order (``row`` only for rows)."""
        record = dataclasses.asdict(self)
        if not self.row:
            del record["row"]
        return json.dumps(record, ensure_ascii=False) + "\n"


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One shard to write: its place in the split and where its records come from.

    Attributes:
      split, index, num_shards: the shard's place; ``name`` is its file name.
      planned_bytes: the bytes the plan expects it to hold.
      records: what the record source reads, in order: ``ImageRefs`` for images,
        ``SpoolSegments`` for records already framed in spool files, or a tuple
        of serialized records (``WriteVerifiedShards``, after the shuffle).
      checkpoints: ``(offset, index)`` of record boundaries known in advance
        (for parallel verification); the writer adds its own when empty.
    """

    split: str
    index: int
    num_shards: int
    name: str
    planned_bytes: int
    records: object
    checkpoints: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        if not 0 <= self.index < self.num_shards:
            raise ValueError(f"shard index {self.index} outside 0..{self.num_shards - 1}")
        if "/" in self.name:
            raise ValueError(f"a shard name is a file name, not a path: {self.name!r}")


@dataclasses.dataclass(frozen=True)
class SpoolSegments:
    """Byte ranges of spool files that hold a shard's framed records, in order:
    ``((spool_path, start, end, records), ...)``; for images also, per segment,
    ``(labels, notes, contents, images)`` of its records (see ``Chunk``)."""

    segments: tuple[tuple[str, int, int, int], ...]
    extras: tuple[tuple[tuple, tuple, tuple, tuple], ...] = ()

    @property
    def count(self) -> int:
        return sum(records for *_, records in self.segments)


@dataclasses.dataclass(frozen=True)
class ImageSpool:
    """Images encoded ahead of planning (when they are resized or re-encoded, so
    their records' sizes are only known then): one spool file of framed records.

    Attributes:
      split: the split; ``file_index``: the spool's place in the split's key order.
      path: the spool file ('' when no image of the unit was good).
      sizes: framed size of each record, as little-endian int64 bytes.
      labels, notes, contents, images: per record, its class text (the tuple of its
        texts for several labels per image), its note ('' for
        none), ``(sha256, image/filename)`` and ``(format, mode, width, height)``.
      bad_counts, dead_letter_path: the unit's dead letters.
      annotations: per record, its annotation facts (``io.annotated_output.image_facts``,
        ``None`` for a record without), or ``()`` when no record had any.
    """

    split: str
    file_index: int
    path: str
    sizes: bytes
    labels: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    contents: tuple[tuple[str, str, str], ...] = ()
    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    images: tuple[tuple[str, str, int, int], ...] = ()
    annotations: tuple = ()

    def record_sizes(self):
        import numpy as np  # pylint: disable=import-outside-toplevel

        return np.frombuffer(self.sizes, dtype="<i8")


@dataclasses.dataclass(frozen=True)
class StoredObject:
    """Which stored object a path named when it was read: what the commit checks
    before it publishes a verified shard (the object verified, not one put in its
    place since).

    Attributes:
      size: its size in bytes.
      generation: for a ``gs://`` object, its generation (0 elsewhere).
      device, inode, mtime_ns, ctime_ns: for a local file, its ``lstat`` identity
        and times (the change time moves on any write, and no user can set it).
    """

    size: int
    generation: int = 0
    device: int = 0
    inode: int = 0
    mtime_ns: int = 0
    ctime_ns: int = 0


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What was written to one shard, and what re-reading it found.

    Attributes:
      split, index, num_shards: which shard.
      path: its final path; ``temp_path``: where it was written and verified,
        before the commit moved it to ``path``.
      records, bytes, crc32c, sha256: as computed while writing.
      planned_bytes: the size the plan expected.
      label_counts: ``((label_text, count), ...)`` of records written.
      note_counts: ``((note, count), ...)`` of records a manifest counts apart
        (images converted to PNG, 16-bit PNGs; see ``Chunk.notes``).
      contents, contents_path, contents_sha256, contents_count: for images,
        ``(sha256 hex, image/filename, sha256 of the file's bytes or '' when the
        same)`` of every record, in order: in ``contents`` when the shard holds a
        few (at most ``transforms.io.contents.INLINE_ENTRIES``), else in a side file
        in the run's temporary folder (``contents_path``, its SHA-256; see
        ``transforms.io.contents``); ``contents_count`` entries either way. The
        steps before the commit find duplicates and complete ``inputs.jsonl`` from
        them; the commit sees the results without them, so no step holds every
        record's entry.
      bad_counts: ``((reason, count), ...)`` of inputs sent to the dead letter.
      dead_letter_path: the shard's dead-letter file, '' when none.
      verified: whether the re-read matched, record by record and byte by byte.
      verify_error: what did not match ('' when verified).
      checkpoints: ``(offset, index)`` of some record boundaries, so the shard
        can be verified in pieces, in parallel (uncompressed shards only).
      storage_crc32c: for objects on GCS, the CRC-32C the store reports (hex);
        it must equal ``crc32c``.
      temp_path: see ``path``.
      write_span: wall-clock ``(start, end)`` of its write, in seconds since the
        epoch (for the run report's time per split); ``()`` when unknown.
      verified_as: the stored object (at ``temp_path``) that verification read,
        unchanged from its first byte to its last; ``None`` until verified. The
        commit publishes that object only.
    """

    split: str
    index: int
    num_shards: int
    path: str
    records: int
    bytes: int
    crc32c: str
    sha256: str
    planned_bytes: int
    label_counts: tuple[tuple[str, int], ...] = ()
    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    verified: bool = False
    verify_error: str = ""
    checkpoints: tuple[tuple[int, int], ...] = ()
    storage_crc32c: str = ""
    temp_path: str = ""
    note_counts: tuple[tuple[str, int], ...] = ()
    # Images: ``(("format/jpeg", n), ("mode/RGB", n), ("width/32", n), ...)`` of the
    # records written (see ``transforms.quality.statistics.image_counts``).
    image_counts: tuple[tuple[str, int], ...] = ()
    write_span: tuple[float, float] = ()
    verified_as: StoredObject | None = None
    contents: tuple[tuple[str, str, str], ...] = ()
    contents_path: str = ""
    contents_sha256: str = ""
    contents_count: int = 0
    # Annotated images (issue 21): the shard's ``quality.annotation_stats.AnnotationStatistics``
    # (``None`` when no record had annotations), and its dead letters of stage
    # ``object`` (objects dropped, images kept; not in ``bad_counts``).
    annotations: object = None
    objects_dead_lettered: int = 0
    # Issue 22: an uncompressed shard's index file (``<shard>.idx``), written beside it
    # at ``index_path`` (its temporary name; '' for gzip), with its size and checksums;
    # ``index_verified_as``: the stored index file the verification read and proved
    # equal to the index of the shard it re-read (the commit moves that object only).
    index_path: str = ""
    index_bytes: int = 0
    index_crc32c: str = ""
    index_sha256: str = ""
    index_verified_as: StoredObject | None = None


@dataclasses.dataclass(frozen=True)
class CompletedInputs:
    """The run's ``inputs.jsonl`` with every converted image's content hash, staged
    in the run's temporary folder for the commit to publish (see
    ``transforms.gather``).

    Attributes:
      path: the staged file; size, sha256: its bytes and their SHA-256 (hex).
      files: entries without a role (input files).
      fingerprint: the input fingerprint of the entries (``schemas.inputs``).
    """

    path: str
    size: int
    sha256: str
    files: int
    fingerprint: str


@dataclasses.dataclass(frozen=True)
class InputSummary:
    """What the listing found, minus the per-file references.

    Attributes:
      root: the input root; ``image/filename`` is relative to it.
      layout: the layout used.
      input_files, input_bytes: input files and their bytes (the input fingerprint):
        images found, or CSV files for tables.
      ignored_files: files skipped as plainly not images.
      vocabulary: class names in label order.
      extra_features: ``{name: dtype}`` of extra scalar features (CSV columns).
      bad_counts: ``((reason, count), ...)`` of inputs refused while listing.
      dead_letter_path: where those were written ('' when none).
      rows_in, blank_rows: for tables, rows read and blank rows skipped.
      features: for tables, ``(name, dtype, shape)`` of every feature.
      dead_letter_paths: for tables, every input file's dead-letter file.
      spools: for tables, the spool files to remove at the end.
      schema: for tables, the schema used, as JSON.
      sequence_features: with ``--sequence_key``, ``(name, dtype, step shape)`` of
        every feature list (``features`` then holds the context features).
      rows_grouped: with ``--sequence_key``, rows that went into sequences.
      lines_in, lines_accounted: for tables, physical lines counted from the bytes,
        and lines the rows read account for (equal when nothing was lost).
      multiline: for tables, ``(rows, largest span, first lines)`` of rows whose
        quoted cells hold newlines.
      late_columns: for tables, ``(column, "path:line")`` of columns first met
        past the header the run planned with (JSON Lines keys no object of the
        sampled first lines has): not written, so reported.
      duplicates_dropped: ``(filename, split, filename it copies)`` of images left
        out as copies of another (``--drop_duplicates``).
      skipped, skipped_path: ``((reason, count), ...)`` of paths passed over while
        listing (links met twice, link loops, FIFOs, ...; not bad inputs), and the
        file that lists them.
    """

    root: str
    layout: str
    input_files: int
    input_bytes: int
    ignored_files: int
    vocabulary: tuple[str, ...]
    extra_features: tuple[tuple[str, str], ...] = ()
    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    # Tables only.
    rows_in: int = 0
    blank_rows: int = 0
    features: tuple[tuple[str, str, tuple], ...] = ()
    dead_letter_paths: tuple[str, ...] = ()
    spools: tuple[str, ...] = ()
    schema: str = ""
    sequence_features: tuple[tuple[str, str, tuple], ...] = ()
    rows_grouped: int = 0
    lines_in: int = 0
    lines_accounted: int = 0
    multiline: tuple = (0, 0, ())
    late_columns: tuple[tuple[str, str], ...] = ()
    skipped: tuple[tuple[str, int], ...] = ()
    skipped_path: str = ""
    duplicates_dropped: tuple[tuple[str, str, str], ...] = ()
    # Tables: ``((split, TableStatistics), ...)`` of the rows written (see
    # ``transforms.quality.statistics``; record counts only with sequences).
    statistics: tuple = ()
