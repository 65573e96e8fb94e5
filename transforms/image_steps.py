"""Images: list and label them (``ListImages``, over ``image_listing``), plan their
shards from metadata (``PlanImageShards``), read and encode them while a shard is
written (``ImageRecords``, with the one record builder, ``io.image_records``), and,
for users' own pipelines, ``ImagesToExamples``.

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
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import BeamIOError

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
from beam_tfrecords.transforms.image_listing import (
    COMPACT_LISTING_REFS,
    LISTING_NAME,
    HeldImages,
    ListingIdentity,
    content_key,
    drop_listing,
    input_bytes,
    joined_parts,
    keep_listing,
    kept_refs,
    list_images,
    listing_for,
    listing_size,
    pack_refs,
    part_refs,
    path_text,
    read_labels_text,
    read_listing,
    write_listing,
)
from beam_tfrecords.transforms.image_plans import (
    forget_first_shard,
    image_shards,
    largest_first,
    listing_element,
    plan_image_shards,
    start_first_shard,
)
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.annotated_output import image_bad_counts
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.helpers import (
    SMALL_FILE_BYTES,
    helper_pool,
    ordered_map,
    ready_helper_pool,
    submit_early,
)
from beam_tfrecords.transforms.io.image_batches import (
    ImageBatchTask,
    chunk_fields,
    shard_tasks,
)
from beam_tfrecords.transforms.io.image_records import (
    Attachment,
    ImageRecordBuilder,
    estimated_record_size,
    read_failure,
    record_overheads,
)
from beam_tfrecords.transforms.plan.handoff import graph_args, listing_parts
from beam_tfrecords.transforms.plan.layouts import resolve_input
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from beam_tfrecords.transforms.shard_engine import Chunk, RecordSource
from beam_tfrecords.transforms.spools import plan_table_shards

__all__ = [
    "COMPACT_LISTING_REFS",
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
    "forget_first_shard",
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
    "kept_refs",
    "list_images",
    "listing_element",
    "read_labels_text",
    "record_overheads",
    "plan_image_shards",
    "read_listing",
    "start_first_shard",
    "write_listing",
]

SUMMARY_TAG = "summary"
DEAD_LETTER_TAG = "dead_letter"
_log = logging.getLogger(__name__)
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
                 listing_sha256: str = "", part_rows: int = 0, contents_on_workers: bool = False,
                 annotations: tuple = ()):
        if listing_path and not listing_sha256:
            raise ValueError("a listing handed over through storage needs its SHA-256")
        self._kept = kept
        self._listing_path = listing_path
        self._listing_sha256 = listing_sha256
        self._part_rows = part_rows
        self._contents_on_workers = contents_on_workers
        self._identity = ListingIdentity(
            input_path=input_path, layout=layout, labels_path=labels_path, image_column=columns[0],
            label_column=columns[1], splits=tuple(splits), split_by=split_by,
            drop_duplicates=drop_duplicates, vocabulary=tuple(vocabulary), only=tuple(only),
            follow_links_outside=follow_links_outside, max_file_bytes=max_file_bytes,
            annotations=tuple(annotations))
        if listing_path:  # The names are in the hand-off; the job graph holds their digest.
            self._identity = ListingIdentity(*graph_args(self._identity))
        self._input = input_path
        self._layout = layout
        self._output = output
        self._processes = helper_processes

    def process(self, _):
        hold_point("listing")
        listing, parts, count, total_bytes, reused = listing_for(
            self._identity, self._kept, self._listing_path, self._listing_sha256, self._part_rows,
            self._contents_on_workers)
        if self._processes > 0 and count and total_bytes < SMALL_FILE_BYTES * count:
            # Small files: start the shard writers' helper processes while planning runs.
            helper_pool(self._processes, ("beam_tfrecords.transforms.io.image_batches",))
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
            yield listing_element(listing.refs)


class ListImages(beam.PTransform):
    """Lists and labels the images of a dataset, without reading them.

    Args:
      input_path: a folder, a glob or a CSV manifest.
      layout: ``auto``, ``class_folders``, ``cifar``, ``csv`` or an annotated layout.
      labels_path: a labels file, or ``None``.
      output: where inputs refused while listing are dead-lettered: the run's temporary
        folder (``ShardTarget.temp_dir``; the commit moves them to the output).
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
      annotations: an annotated layout's flags (``ListingIdentity.annotations``).

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
                 part_rows: int = 0, contents_on_workers: bool = False, annotations: tuple = ()):
        super().__init__()
        self._fn = _ListImagesFn(input_path, layout, labels_path, output, helper_processes,
                                 (image_column, label_column), kept, splits, split_by,
                                 drop_duplicates, vocabulary, only, listing_path,
                                 follow_links_outside, max_file_bytes, listing_sha256, part_rows,
                                 contents_on_workers, annotations)

    def expand(self, pbegin):
        return (
            pbegin
            | "Impulse" >> beam.Create([None])
            | "ListAndLabel" >> beam.ParDo(self._fn).with_outputs(SUMMARY_TAG, main="refs")
        )



class PlanImageShards(beam.PTransform):
    """``ImageRefs`` → one ``ShardSpec`` per shard, spread over workers."""

    def __init__(self, band: ShardBand, compression: str = "none"):
        super().__init__()
        self._band = band
        self._compression = compression

    def expand(self, refs):
        return (
            refs
            | "CutSplits" >> beam.FlatMap(largest_first, self._band, self._compression)
            # One element per shard: spread them so each worker writes some.
            | "Spread" >> beam.Reshuffle()
        )


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
      names: ``--feature_names``, ``((canonical, output), ...)`` (``()``: none).
    """

    def __init__(self, validate: str = "structure", read_threads: int = 4, helper_processes: int = 0,
                 max_pixels: int = DEFAULT_MAX_PIXELS, image_bytes: str = "readable",
                 reshape: ImageReshape | None = None, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 attach: Callable[[ImageRef], Attachment | None] | None = None,
                 names: tuple[tuple[str, str], ...] = ()):
        self._builder = ImageRecordBuilder(validate, max_pixels, image_bytes, reshape, max_file_bytes,
                                           attach, tuple(names))
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

    def start_early(self, spec: ShardSpec, most_bytes: int) -> int:
        """Starts encoding the first ``most_bytes`` (about) of ``spec``'s files on the
        helper processes now, when they are to write it (``helpers.submit_early``):
        ``chunks`` takes those tasks' results. Returns the files started."""
        count = spec.records.count
        if not (self._processes > 0 and count and spec.planned_bytes < SMALL_FILE_BYTES * count):
            return 0
        pool = helper_pool(self._processes)
        if pool is None:
            return 0
        most_files = max(1, most_bytes * count // max(1, spec.planned_bytes))
        items, files = [], 0
        for item in shard_tasks(spec.records.unpack(), self._processes):
            if files >= most_files:
                break
            items.append(item)
            files += item[1][-1]
        submit_early(pool, ImageBatchTask(self._builder), items)
        return files

    def chunks(self, spec: ShardSpec) -> Iterator[Chunk]:
        pool, workers = self._pool_for(spec)
        # Each batch is one task; what it hands back is the chunk's fields already.
        task = ImageBatchTask(self._builder)
        for batches in ordered_map(pool, task, shard_tasks(spec.records.unpack(), workers), workers + 2):
            progress.add(inputs=sum(b.inputs for b in batches), input_bytes=sum(b.input_bytes for b in batches))
            for batch in batches:
                yield Chunk(*chunk_fields(batch))


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
                yield split, index, ImageRefs.pack_columns(unit)
                unit, size, index = [], 0, index + 1
            unit.append(ref)
            size += ref.size
        if unit:
            yield split, index, ImageRefs.pack_columns(unit)


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
        sizes, labels, notes, contents, images, dead, facts = [], [], [], [], [], [], []
        with files.open_write(path) as stream:
            for chunk in self._source.chunks(spec):
                stream.write(chunk.framed)
                sizes.extend(_framed_sizes(chunk.framed))
                labels.extend(chunk.labels)
                notes.extend(chunk.notes)
                contents.extend(chunk.contents)
                images.extend(chunk.images)
                facts.extend(chunk.annotations or (None,) * chunk.records)
                dead.extend(chunk.dead)
        dead_path = write_dead_letters(self._output, f"{split}-unit-{index:05d}", dead)
        beam.metrics.Metrics.counter("images", "spooled").inc(len(sizes))
        yield ImageSpool(split, index, path if sizes else "", np.asarray(sizes, "<i8").tobytes(),
                         tuple(labels), tuple(notes), tuple(contents), image_bad_counts(dead), dead_path,
                         tuple(images), tuple(facts) if any(facts) else ())


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
                           spool.contents[first:last], spool.images[first:last])
                          + ((spool.annotations[first:last],) if spool.annotations else ()))
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
      output: where dead letters are written: the run's temporary folder
        (``ShardTarget.temp_dir``; the commit moves them to the output).
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
