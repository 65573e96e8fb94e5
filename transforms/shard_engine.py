"""The shard engine: one writer, one verifier, and the public ``WriteVerifiedShards``.

Every input kind ends here. A plan (``ShardSpec`` per shard, cut by
``plan.shard_cuts.cut_shards``) says which records each shard holds; a
``RecordSource`` turns a spec into framed records (images read and encoded,
byte ranges copied out of spools, or records that came through a shuffle);
``WriteShards`` streams them into the shard's temporary file while digesting it
(and, for an uncompressed shard, writes its index file beside it from the same
bytes: ``codec.record_index``);
``VerifyShards`` (``transforms.shard_verification``, imported here as before)
re-reads each file from storage and proves it; the commit step
(``transforms.commit_step``) publishes the shards and the manifest.

Only metadata is planned and moved between steps on the CLI's paths; payloads
are streamed by the one DoFn call that writes a shard, so peak memory does not
grow with the dataset.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import apache_beam as beam

from beam_tfrecords.schemas.elements import (
    DeadLetter,
    InputSummary,
    ShardResult,
    ShardSpec,
    SpoolSegments,
)
from beam_tfrecords.schemas.report import RunReport
from beam_tfrecords.schemas.shards import (
    COMPRESSIONS,
    INDEX_SUFFIX,
    ShardBand,
    ShardTarget,
    is_valid_split_name,
)
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.tfrecord import (
    CHECKPOINT_BYTES,
    RECORD_OVERHEAD,
    FileDigest,
    RecordError,
    TFRecordWriter,
    frame_record,
)
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io import progress as run_progress
from beam_tfrecords.transforms.io.annotated_output import OBJECT_STAGE, fold_facts, image_bad_counts
from beam_tfrecords.transforms.io.contents import write_contents
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.helpers import (
    index_local_ranges,
    live_helper_pool,
    submit_early,
    take_early,
)
from beam_tfrecords.transforms.io.retry import ATTEMPTS, retried
from beam_tfrecords.transforms.io.storage_errors import STORAGE_ERRORS
from beam_tfrecords.transforms.plan.shard_cuts import cut_shards, shard_spec
from beam_tfrecords.transforms.quality.annotation_stats import AnnotationStatistics
from beam_tfrecords.transforms.quality.statistics import image_counts
from beam_tfrecords.transforms.shard_verification import (
    PiecesAhead,
    VerifyShards,
    storage_crc32c_check,
    verify_shard,
)

__all__ = [
    "Chunk",
    "FramedRecords",
    "RecordSource",
    "SpoolCopy",
    "VerifyShards",
    "WriteShards",
    "WriteVerifiedShards",
    "storage_crc32c_check",
    "verify_shard",
    "write_shard",
]

_log = logging.getLogger(__name__)
_CHUNK_BYTES = 4 << 20
_COPY_BYTES = 1 << 20


class Chunk(NamedTuple):
    """A piece of a shard, as a record source produces it.

    Attributes:
      framed: framed records (or, for a spool copy, part of them), in order.
      records: records that end inside this piece.
      dead: inputs refused while making this piece (dead letters).
      labels: the class text of each record written (for per-class counts); a
        record with several labels (``multi_label``) has the tuple of their texts.
      inputs: inputs consumed (for progress).
      notes: what the manifest counts about some records (e.g. images converted
        to PNG: ``converted_to_png/tiff``); '' for a record without one.
      contents: for images, ``(sha256 hex, image/filename, sha256 of the file's bytes or '' when
        the same)`` of each record
        written (for the duplicates and leakage report).
      images: for images, ``(format, mode, width, height)`` of each record written
        (for the statistics; see ``quality.statistics.image_counts``).
      annotations: for annotated images, each record's facts
        (``io.annotated_output.image_facts``; ``None`` for one without), or ``()``.
    """

    framed: bytes
    records: int
    dead: tuple[DeadLetter, ...] = ()
    labels: tuple[str, ...] = ()
    inputs: int = 0
    notes: tuple[str, ...] = ()
    contents: tuple[tuple[str, str, str], ...] = ()
    images: tuple[tuple[str, str, int, int], ...] = ()
    annotations: tuple = ()


class RecordSource:
    """How the records of a shard are produced; one per writer, set up per worker.

    ``aligned`` says whether every chunk ends on a record boundary (the writer
    then notes boundaries for parallel verification by itself). ``check_ahead``:
    whether the writer sends the pieces between a shard's planned boundaries to
    be checked while it writes the rest (``PiecesAhead``; set where ``VerifyShards``
    checks pieces with the helpers).
    """

    aligned = True
    check_ahead = False

    def setup(self) -> None:
        """Creates per-worker resources (pools, clients)."""

    def teardown(self) -> None:
        """Releases them."""

    def count(self, spec: ShardSpec) -> int:
        """Inputs the spec names (for progress)."""
        return getattr(spec.records, "count", 0)

    def chunks(self, spec: ShardSpec) -> Iterator[Chunk]:
        """The shard's records, in order."""
        raise NotImplementedError

    def index_job(self, spec: ShardSpec) -> concurrent.futures.Future | None:
        """The shard's index lines, made elsewhere while it is written (a future of
        ``helpers.index_local_ranges``' result), or ``None``: the writer makes them
        from the bytes as they pass."""
        return None


class FramedRecords(RecordSource):
    """``spec.records`` is a sequence of serialized records: frame them in order."""

    def count(self, spec: ShardSpec) -> int:
        return len(spec.records)

    def chunks(self, spec: ShardSpec) -> Iterator[Chunk]:
        parts, size = [], 0
        for record in spec.records:
            framed = frame_record(record)
            parts.append(framed)
            size += len(framed)
            if size >= _CHUNK_BYTES:
                yield Chunk(b"".join(parts), len(parts), inputs=len(parts))
                parts, size = [], 0
        if parts:
            yield Chunk(b"".join(parts), len(parts), inputs=len(parts))


class SpoolCopy(RecordSource):
    """``spec.records`` is ``SpoolSegments``: copy those byte ranges of framed records.

    With local spools and the helper processes of a local run still up, a helper
    makes the shard's index from the spools' bytes while this process copies them
    (one record at a time, the index is most of a copy's work for small records:
    0.12 s of the 0.2 s a 1M-row table's shard took)."""

    aligned = False

    def __init__(self, check_ahead: bool = False):
        self.check_ahead = check_ahead

    @staticmethod
    def _local_ranges(spec: ShardSpec) -> list[tuple[str, int, int]]:
        """``(spool, begin, end)`` of the shard's bytes; ``[]`` unless all are local."""
        ranges = [(spool, begin, end) for spool, begin, end, _ in spec.records.segments]
        return ranges if all(files.is_local(path) for path, _, _ in ranges) else []

    @classmethod
    def index_early(cls, specs: Sequence[ShardSpec], most: int = 2) -> None:
        """Starts the index of the first ``most`` shards of ``specs`` on the live helpers as
        soon as they are planned (a table's: the runner then takes ~0.07 s to hand the
        specs to the writer, in which the helpers had nothing to do); ``index_job`` takes
        them (a shard written later, or elsewhere, has its own made then)."""
        pool = live_helper_pool()
        if pool is not None:
            submit_early(pool, index_local_ranges, [r for r in map(cls._local_ranges, specs[:most]) if r])

    def index_job(self, spec: ShardSpec) -> concurrent.futures.Future | None:
        ranges = self._local_ranges(spec)
        pool = live_helper_pool() if ranges else None
        if pool is None:
            return None
        return take_early(pool, index_local_ranges, ranges) or pool.submit(index_local_ranges, ranges)

    def chunks(self, spec: ShardSpec) -> Iterator[Chunk]:
        segments: SpoolSegments = spec.records
        extras = segments.extras
        for number, (spool, begin, end, records) in enumerate(segments.segments):
            labels, notes, contents, images, *facts = extras[number] if extras else ((), (), (), ())
            last = None  # The segment's last block carries its records' counts.
            for block in files.read_range(spool, begin, end, _COPY_BYTES):
                if last is not None:
                    yield Chunk(last, 0)
                last = block
            if last is not None:
                yield Chunk(last, records, (), tuple(labels), records, tuple(notes),
                            tuple(contents), tuple(images), tuple(facts[0]) if facts else ())


class _Progress:
    """When one shard's write started (the run's progress: ``io.progress``)."""

    def __init__(self, spec: ShardSpec, total: int):
        self._spec = spec
        self._total = total
        self.start = time.monotonic()


@dataclasses.dataclass
class _Written:
    digest: FileDigest
    labels: Counter
    dead: list[DeadLetter]
    checkpoints: tuple[tuple[int, int], ...]
    notes: Counter
    contents: list
    images: Counter
    annotations: AnnotationStatistics | None = None
    index: FileDigest | None = None  # The shard's index file (uncompressed shards).


@dataclasses.dataclass(frozen=True)
class _Attempt:
    """One try at writing a shard: its temporary name, what it wrote, or its storage error."""

    temp: str
    written: _Written | None = None
    contents: tuple[str, str, int] | None = None
    error: BaseException | None = None


@contextlib.contextmanager
def _discarded_on_failure(sink) -> Iterator[None]:
    """Drops the bytes of a write stream whose write or close failed.

    A GCS writer (google-cloud-storage's ``BlobWriter``) whose ``close()`` failed
    keeps its buffer, and when garbage-collected, at any later moment, closes
    again: a fresh upload of those bytes to the shard's temporary name, perhaps
    after a retry's object was verified, or after the run ended. A closed buffer
    makes it inert.
    """
    try:
        yield
    except BaseException:
        buffer = getattr(sink, "_buffer", None)  # BlobWriter's; other streams have none.
        if buffer is not None and not buffer.closed:
            buffer.close()
        raise


def _write_once(spec: ShardSpec, temp: str, compression: str, source: RecordSource) -> _Written:
    labels: Counter = Counter()
    notes: Counter = Counter()
    contents: list = []
    kinds: Counter = Counter()  # (format, mode, width, height) -> records
    annotations = None  # AnnotationStatistics, once a record has annotation facts.
    dead: list[DeadLetter] = []
    progress = _Progress(spec, source.count(spec))
    done = written = last_checkpoint = 0
    checkpoints: list[tuple[int, int]] = []
    with contextlib.ExitStack() as stack:
        sink = stack.enter_context(_opened(temp))
        # The index file, beside the shard, written from the same bytes as they pass.
        index = RecordIndex(stack.enter_context(_opened(temp + INDEX_SUFFIX))) if compression == "none" else None
        made = source.index_job(spec) if index is not None else None
        ahead = (PiecesAhead.ahead(temp, spec.checkpoints, source.count(spec), spec.planned_bytes)
                 if source.check_ahead and index is not None else None)
        if ahead is not None:  # A write that fails drops the checks it sent.
            stack.push(lambda failed, *_: ahead.forget() if failed is not None else None)
        writer = TFRecordWriter(sink, compression, index.feed if index is not None and made is None else None,
                                background=True)
        stack.callback(writer.stop)  # Runs first: nothing is written to the sink once it closes.
        for number, chunk in enumerate(source.chunks(spec)):
            dead.extend(chunk.dead)
            # '': a detection record; a tuple: a record's several labels, each counted.
            _count_names(labels, chunk.labels)
            _count_names(notes, chunk.notes)
            contents.extend(chunk.contents)
            kinds.update(chunk.images)
            annotations = fold_facts(chunk.annotations, annotations)
            writer.write_framed(chunk.framed, chunk.records)
            written += len(chunk.framed)
            done += chunk.inputs
            if ahead is not None:
                ahead.written(written)
            if (source.aligned and written - last_checkpoint >= CHECKPOINT_BYTES):
                checkpoints.append((written, writer.records))
                last_checkpoint = written
            if number == 1:
                hold_point("mid_write")
            run_progress.writing(chunk.records, len(chunk.framed))
        digest = writer.close()
        if made is not None:
            _add_index(index, made, spec, digest)
        index_digest = index.finish() if index is not None else None
    if ahead is not None:  # The file closed: all of it is there to read.
        ahead.closed(digest)
    if checkpoints and checkpoints[-1] == (digest.bytes, digest.records):
        checkpoints.pop()  # The end of the file is not a boundary to check between.
    # Counted per kind of image, not per record: most records share a few kinds.
    images: Counter = Counter()
    for kind, count in kinds.items():
        for key in image_counts((kind,)):
            images[key] += count
    _log.info("Wrote %s: %d records, %.1f MB in %.1f s", spec.name, digest.records,
              digest.bytes / 1e6, time.monotonic() - progress.start)
    return _Written(digest, labels, dead, tuple(checkpoints), notes, contents, images, annotations,
                    index_digest)


def _add_index(index: RecordIndex, made: concurrent.futures.Future, spec: ShardSpec, digest: FileDigest) -> None:
    """Adds to ``index`` the lines a helper made of the spools' bytes (made again here
    if the helper could not); they must index as many records and bytes as were written.

    Raises:
      RecordError: the spools' bytes do not end at a record boundary.
      ValueError: the lines index other records than the shard's.
    """
    try:
        lines, records, size = made.result()
    except RecordError:
        raise
    except Exception as err:  # pylint: disable=broad-exception-caught  # A helper gone: made here.
        _log.debug("Indexing %s in this process (%s)", spec.name, err)
        lines, records, size = index_local_ranges([(p, b, e) for p, b, e, _ in spec.records.segments])
    if (records, size) != (digest.records, digest.bytes):
        raise ValueError(f"the index made of {spec.name}'s spools holds {records} records of {size} bytes; "
                         f"{digest.records} of {digest.bytes} were written")
    index.add_lines(lines, records, size)


def _count_names(counter: Counter, names: Sequence) -> None:
    """Counts each non-empty name of ``names``; an item that is a tuple (a record's
    several labels) counts each of its names."""
    if not names:
        return
    if all(map(str.__instancecheck__, names)):  # One name a record: counted in C.
        counter.update(names)
        counter.pop("", None)  # Never counted (only this function fills the counters).
        return
    counter.update(name for item in names for name in ((item,) if isinstance(item, str) else item) if name)


@contextlib.contextmanager
def _opened(path: str) -> Iterator:
    """A write stream at ``path``, closed on exit, its bytes dropped if the write failed."""
    sink = files.open_write(path)
    with _discarded_on_failure(sink), sink:
        yield sink


def write_shard(spec: ShardSpec, target: ShardTarget, source: RecordSource,
                attempts: int = ATTEMPTS) -> ShardResult:
    """Writes one shard under its temporary name; the one writer of every input kind.

    A storage error retries the whole shard (``attempts`` in all, with backoff),
    each attempt under a temporary name of its own (``ShardTarget.attempt_path``);
    bad inputs go to ``OUT/dead_letter/<shard>.jsonl``.

    Returns:
      The shard as written (not yet verified). When storage kept failing, a result
      with ``verified=False`` and the error, so the run fails naming the shard.
    """
    final = target.final_path(spec.name)
    started = time.time()
    def attempt() -> _Attempt:
        # A name of its own for every attempt: nothing an earlier attempt (or another
        # worker writing the same shard) still sends can land on what this one verifies.
        temp = target.attempt_path(spec.name, uuid.uuid4().hex[:12])
        try:
            written = _write_once(spec, temp, target.compression, source)
            # The records' content entries go to a side file; the result carries its digest.
            return _Attempt(temp, written, write_contents(target.temp_dir, spec.name, written.contents))
        except STORAGE_ERRORS as err:
            run_progress.write_failed()
            return _Attempt(temp, error=err)

    tried = retried(attempt, lambda a: "" if a.error is None else str(a.error) or type(a.error).__name__,
                    lambda a: f"Writing {a.temp}", "retrying", _log, attempts)
    temp = tried.temp
    if tried.error is not None:
        message = f"cannot write {temp} (tried {attempts} times): {tried.error}"
        _log.error("%s", message)
        return ShardResult(spec.split, spec.index, spec.num_shards, final, 0, 0, "", "",
                           spec.planned_bytes, verified=False, verify_error=message, temp_path=temp)
    written = tried.written
    contents_path, contents_sha256, contents_count = tried.contents
    stem = spec.name.split(".tfrecord", 1)[0]
    dead_path = write_dead_letters(target.temp_dir, stem, written.dead)
    beam.metrics.Metrics.counter("write", "records").inc(written.digest.records)
    run_progress.written(written.digest.records, written.digest.bytes)
    beam.metrics.Metrics.counter("write", "dead_letter").inc(len(written.dead))
    beam.metrics.Metrics.counter("write", "bytes").inc(written.digest.bytes)
    digest = written.digest
    compressed = target.compression != "none"
    return ShardResult(
        split=spec.split,
        index=spec.index,
        num_shards=spec.num_shards,
        path=final,
        records=digest.records,
        bytes=digest.bytes,
        crc32c=digest.crc32c,
        sha256=digest.sha256,
        planned_bytes=spec.planned_bytes,
        label_counts=tuple(sorted(written.labels.items())),
        note_counts=tuple(sorted(written.notes.items())),
        image_counts=tuple(sorted(written.images.items())),
        bad_counts=image_bad_counts(written.dead),  # Images: dropped objects apart.
        dead_letter_path=dead_path,
        checkpoints=() if compressed else (spec.checkpoints or written.checkpoints),
        temp_path=temp,
        write_span=(started, time.time()),
        contents=() if contents_path else tuple(written.contents),
        contents_path=contents_path,
        contents_sha256=contents_sha256,
        contents_count=contents_count,
        annotations=written.annotations,
        objects_dead_lettered=sum(d.stage == OBJECT_STAGE for d in written.dead),
        **({} if written.index is None else {
            "index_path": temp + INDEX_SUFFIX, "index_bytes": written.index.bytes,
            "index_crc32c": written.index.crc32c, "index_sha256": written.index.sha256}),
    )


class _WriteShardFn(beam.DoFn):
    """``ShardSpec`` → ``ShardResult``, records from ``source``."""

    def __init__(self, target: ShardTarget, source: RecordSource):
        self._target = target
        self._source = source

    def setup(self):
        self._source.setup()

    def teardown(self):
        self._source.teardown()

    def process(self, spec: ShardSpec) -> Iterator[ShardResult]:
        yield write_shard(spec, self._target, self._source)


class WriteShards(beam.PTransform):
    """``ShardSpec`` → ``ShardResult``: each shard written under its temporary name.

    Args:
      target: the output folder, compression and run.
      source: how a spec becomes records (``FramedRecords``, ``SpoolCopy``, or an
        input kind's own, such as images read and encoded).
    """

    def __init__(self, target: ShardTarget, source: RecordSource):
        super().__init__()
        self._target = target
        self._source = source

    def expand(self, specs):
        return specs | "Write" >> beam.ParDo(_WriteShardFn(self._target, self._source))


# --- WriteVerifiedShards: the engine for a user's own pipeline --------------------


def _ordering_key(key) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    raise TypeError(f"a record's key must be str or bytes, got {type(key).__name__}")


def _keyed(element, split: str) -> tuple[str, bytes, bytes, int]:
    """``bytes`` | ``(key, bytes)`` | ``(key, bytes, plan_size)`` → ``(split, key, record, size)``."""
    if isinstance(element, bytes):
        record, key, size = element, hashlib.sha256(element).digest(), None
    elif isinstance(element, tuple) and len(element) in (2, 3) and isinstance(element[1], bytes):
        key, record = _ordering_key(element[0]), element[1]
        size = element[2] if len(element) == 3 else None
    else:
        raise TypeError("WriteVerifiedShards takes serialized records (bytes), (key, bytes) or "
                        f"(key, bytes, plan_size); got {type(element).__name__}")
    return split, key, record, int(size) if size is not None else len(record) + RECORD_OVERHEAD


def _plan_splits(sizes: Sequence[tuple[str, bytes, int]], band: ShardBand) -> dict:
    """``{split: (num_shards, first_keys)}`` from every record's ``(split, key, size)``.

    Records are cut in key order; equal keys are one unit, so a key never spans
    two shards and each shard starts at the first key listed for it.
    """
    by_split: dict[str, dict[bytes, int]] = {}
    for split, key, size in sizes:
        units = by_split.setdefault(split, {})
        units[key] = units.get(key, 0) + size
    plan = {}
    for split, units in sorted(by_split.items()):
        keys = sorted(units)
        num_shards, shard_of = cut_shards([units[k] for k in keys], band)
        first_keys = [b""] * num_shards
        seen = set()
        for key, index in zip(keys, shard_of.tolist()):
            if index not in seen:
                seen.add(index)
                first_keys[index] = key
        plan[split] = (num_shards, tuple(first_keys))
    return plan


def _assign(element: tuple[str, bytes, bytes, int], plan: Mapping) -> tuple:
    split, key, record, _ = element
    num_shards, first_keys = plan[split]
    index = max(0, bisect.bisect_right(first_keys, key) - 1)
    return (split, index), (key, record)


class _WriteGroupFn(beam.DoFn):
    """``((split, index), [(key, record), ...])`` → ``ShardResult``: records sorted by key."""

    def __init__(self, target: ShardTarget):
        self._target = target
        self._source = FramedRecords()

    def process(self, element, plan: Mapping) -> Iterator[ShardResult]:
        (split, index), members = element
        records = tuple(record for _, record in sorted(members))
        num_shards = plan[split][0]
        spec = shard_spec(split, index, num_shards, self._target.compression,
                          sum(len(r) + RECORD_OVERHEAD for r in records), records)
        yield write_shard(spec, self._target, self._source)


class _EmptyShardsFn(beam.DoFn):
    """Shards the plan names that no record reached, written empty so that every
    name ``-of-N`` exists: a guard only (``plan.shard_cuts.cut_shards`` leaves no shard
    without a unit of equal keys)."""

    def __init__(self, target: ShardTarget):
        self._target = target

    def process(self, written: list, plan: Mapping) -> Iterator[ShardResult]:
        have = {(r.split, r.index) for r in written}
        for split, (num_shards, _) in sorted(plan.items()):
            for index in range(num_shards):
                if (split, index) not in have:
                    spec = shard_spec(split, index, num_shards, self._target.compression, 0, ())
                    yield write_shard(spec, self._target, FramedRecords())


class WriteVerifiedShards(beam.PTransform):
    """Ends a pipeline with band-sized, verified TFRecord shards and a manifest.

    Takes a PCollection of serialized records (``bytes``), of ``(key, bytes)`` (the
    key, ``str`` or ``bytes``, orders records within the split, so the output is
    the same on every run), or of ``(key, bytes, plan_size)`` (cut the shards as if
    each record had ``plan_size`` bytes, e.g. to match a plan made before the
    records existed); or a dict ``{split: PCollection}`` for several splits. Bare
    records are ordered by their SHA-256.

    Shards are named like the CLI's (``<split>-00000-of-00004.tfrecord``), written
    under a temporary name in ``OUT/.beam-tfrecords/``, re-read and proved, then
    moved to their final names, and ``manifest.json`` is written last. Returns a
    PCollection with one element: the manifest (a dict). When a shard cannot be
    written or proved, nothing is published and the pipeline fails with a
    ``RuntimeError`` naming the shard; ``OUT/run_report.json`` says the same.

    Memory: records reach their shard through a GroupByKey, so on Dataflow they
    go through the shuffle service; on the DirectRunner everything grouped is held
    in memory at once (the whole dataset), as with Beam's own ``WriteToTFRecord``
    with a fixed shard count. For datasets larger than memory on one machine, use
    the CLI, which plans from metadata and streams payloads. Planning collects
    one ``(split, key, size)`` per record in one worker (~100 bytes each).

    Args:
      output: the output folder (local path or ``gs://``).
      split: the split name, for a single PCollection.
      shard_min_mb, shard_max_mb: the size band (MB = 10**6 bytes).
      compression: ``none`` or ``gzip``.
      overwrite: replace a dataset already in ``output`` (default: fail).
      features: ``{name: (dtype, shape)}`` to record in the manifest (optional).
    """

    def __init__(self, output: str, split: str = "train", shard_min_mb: float = 100.0,
                 shard_max_mb: float = 200.0, compression: str = "none", overwrite: bool = False,
                 features: Mapping[str, tuple[str, Sequence]] | None = None):
        super().__init__()
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}; got {compression!r}")
        if not is_valid_split_name(split):
            raise ValueError(f"split {split!r} cannot name a shard file; use letters, digits, '_', '.'")
        self._band = ShardBand.from_mb(shard_min_mb, shard_max_mb)
        self._target = ShardTarget(output, compression, f"wvs-{uuid.uuid4().hex[:12]}")
        self._split = split
        self._overwrite = overwrite
        self._features = dict(features or {})
        self._options = {"split": split, "shard_min_mb": shard_min_mb,
                         "shard_max_mb": shard_max_mb, "compression": compression}

    def expand(self, records):
        # pylint: disable=import-outside-toplevel
        from beam_tfrecords.transforms.commit_step import Commit, CommitSettings

        inputs = records if isinstance(records, dict) else {self._split: records}
        for split in inputs:
            if not is_valid_split_name(split):
                raise ValueError(f"split {split!r} cannot name a shard file")
        pipeline = next(iter(inputs.values())).pipeline
        keyed = [
            pcoll | f"Key[{split}]" >> beam.Map(_keyed, split)
            for split, pcoll in sorted(inputs.items())
        ]
        flat = keyed[0] if len(keyed) == 1 else tuple(keyed) | "AllSplits" >> beam.Flatten()
        plan = (
            flat
            | "Sizes" >> beam.Map(lambda e: (e[0], e[1], e[3]))
            | "CollectSizes" >> beam.combiners.ToList()
            | "Cut" >> beam.Map(_plan_splits, self._band)
        )
        plan_side = beam.pvalue.AsSingleton(plan)
        written = (
            flat
            | "Assign" >> beam.Map(_assign, plan_side)
            | "GroupByShard" >> beam.GroupByKey()
            | "Write" >> beam.ParDo(_WriteGroupFn(self._target), plan_side)
        )
        empty = (
            written
            | "CollectWritten" >> beam.combiners.ToList()
            | "WriteEmpty" >> beam.ParDo(_EmptyShardsFn(self._target), plan_side)
        )
        verified = (
            (written, empty)
            | "AllShards" >> beam.Flatten()
            | "VerifyShards" >> VerifyShards(self._target.compression)
        )
        summary = pipeline | "Summary" >> beam.Create([InputSummary(
            root="", layout="records", input_files=0, input_bytes=0, ignored_files=0,
            vocabulary=(), features=tuple(sorted(
                (name, dtype, tuple(shape)) for name, (dtype, shape) in self._features.items())),
        )])
        settings = CommitSettings(self._target, self._band, max_bad_fraction=0.0,
                                  options=tuple(sorted(self._options.items())),
                                  overwrite=self._overwrite)
        return (
            verified
            | "Commit" >> Commit(settings, summary)
            | "Manifest" >> beam.Map(_manifest_or_raise)
        )


def _manifest_or_raise(report: RunReport) -> dict:
    """The published manifest; a run that published nothing fails the pipeline."""
    if report.manifest_json is None:
        failures = "; ".join(f"{f.path}: {f.error}" for f in report.verification_failures or ())
        raise RuntimeError(f"WriteVerifiedShards published nothing ({report.status}) in "
                           f"{report.output}" + (f": {failures}" if failures else ""))
    return dict(report.manifest_json)
