"""PlanShards, WriteShards, VerifyShards: from image references to proved shards.

Only metadata is planned and moved between steps; payloads are streamed by the
one DoFn call that writes a shard, one small batch of files at a time, so peak
memory does not grow with the dataset.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, ImageRefs, ShardResult, ShardSpec
from beam_tfrecords.schemas.shards import ShardBand, shard_name
from beam_tfrecords.transforms.codec.image_example import image_example_size
from beam_tfrecords.transforms.codec.tfrecord import (
    RECORD_OVERHEAD,
    FileDigest,
    RecordError,
    TFRecordWriter,
    digest_stream,
    scan_stream,
)
from beam_tfrecords.transforms.images import DEAD_LETTER_DIR
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.gcs import object_crc32c
from beam_tfrecords.transforms.io.helpers import (
    SMALL_FILE_BYTES,
    encode_chunk,
    ready_helper_pool,
    verify_range,
)
from beam_tfrecords.transforms.plan.shards import assign_shards, choose_num_shards

__all__ = [
    "PlanShards",
    "VerifyShards",
    "WriteShards",
    "plan_image_shards",
    "storage_crc32c_check",
    "verify_shard",
]

_log = logging.getLogger(__name__)
# Dimensions assumed when sizing a record before its header is read: they change
# the estimate by a few bytes per record.
_TYPICAL_SIDE = 1024
_TYPICAL_CHANNELS = 3
# Length varints that grow with the file size and name: 4 entries, 4 extra bytes each at most.
_VARINT_SLACK = 16
_CHUNK_FILES = 64
_CHUNK_BYTES = 4 << 20
_PROGRESS_SECONDS = 10.0
# Record boundaries are reported about this often, for parallel verification.
_CHECKPOINT_BYTES = 16 << 20


@functools.lru_cache(maxsize=4096)
def _record_overhead(label: int, label_text: str, extra: tuple) -> int:
    """Record size less the file's bytes and name, at their varints' widest."""
    return RECORD_OVERHEAD + _VARINT_SLACK + image_example_size(
        0, "jpeg", _TYPICAL_SIDE, _TYPICAL_SIDE, _TYPICAL_CHANNELS, label, label_text, "", extra
    )


def estimated_record_size(ref: ImageRef) -> int:
    """Framed size of the record an image becomes, before its header is read.

    At most a few bytes above the true size (see ``image_example_size`` for the
    exact figure), which is all a plan needs.
    """
    overhead = _record_overhead(ref.label, ref.label_text, ref.extra)
    return overhead + ref.size + len(ref.filename.encode("utf-8"))


def plan_image_shards(
    images: ImageRefs, band: ShardBand, output: str, compression: str
) -> list[ShardSpec]:
    """Cuts each split, in key order, into shards of nearly equal bytes.

    Args:
      images: every image of every split.
      band: the shard size band.
      output: the output folder.
      compression: ``none`` or ``gzip`` (names the files; sizes are planned on
        uncompressed bytes, since encoded images barely compress).

    Returns:
      One spec per shard, split by split, in index order.
    """
    by_split: dict[str, list[ImageRef]] = collections.defaultdict(list)
    for ref in images.unpack():
        by_split[ref.split].append(ref)
    specs = []
    start = time.monotonic()
    for split in sorted(by_split):
        items = sorted(by_split[split], key=lambda r: (r.key, r.filename))
        sizes = [estimated_record_size(r) for r in items]
        num_shards = choose_num_shards(sum(sizes), band)
        assignment = assign_shards(sizes, num_shards)
        grouped = itertools.groupby(zip(assignment, items, sizes), key=lambda t: t[0])
        members = {index: list(group) for index, group in grouped}
        for index in range(num_shards):
            group = members.get(index, [])
            specs.append(
                ShardSpec(
                    split=split,
                    index=index,
                    num_shards=num_shards,
                    path=files.join(output, shard_name(split, index, num_shards, compression)),
                    refs=ImageRefs.pack([item for _, item, _ in group]),
                    planned_bytes=sum(size for _, _, size in group),
                )
            )
    _log.info("Planned %d shards for %d images in %.1f s", len(specs),
              sum(s.refs.count for s in specs), time.monotonic() - start)
    return specs


class PlanShards(beam.PTransform):
    """``ImageRefs`` → one ``ShardSpec`` per shard, spread over workers."""

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, refs):
        config = self._config
        return (
            refs
            | "CutSplits" >> beam.FlatMap(
                plan_image_shards, config.band, config.output, config.compression
            )
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


def _ordered_map(
    pool: concurrent.futures.Executor, fn: Callable, items: Iterable, window: int
) -> Iterator:
    """``map(fn, items)`` on a pool, in order, with at most ``window`` in flight."""
    pending: collections.deque = collections.deque()
    iterator = iter(items)
    for item in itertools.islice(iterator, window):
        pending.append(pool.submit(fn, item))
    while pending:
        done = pending.popleft()
        for item in itertools.islice(iterator, 1):
            pending.append(pool.submit(fn, item))
        yield done.result()


class _Progress:
    """Logs records, rate and ETA of one shard every few seconds."""

    def __init__(self, spec: ShardSpec):
        self._spec = spec
        self.start = self._last = time.monotonic()

    def update(self, done: int, written_bytes: int) -> None:
        now = time.monotonic()
        if now - self._last < _PROGRESS_SECONDS:
            return
        self._last = now
        total = self._spec.refs.count
        rate = done / max(now - self.start, 1e-9)
        _log.info(
            "%s shard %d/%d: %d/%d records, %.0f records/s, %.1f MB/s, ETA %.0f s",
            self._spec.split, self._spec.index + 1, self._spec.num_shards, done, total, rate,
            written_bytes / max(now - self.start, 1e-9) / 1e6, (total - done) / max(rate, 1e-9),
        )


def _stem(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.split(".tfrecord", 1)[0]


class _WriteShardFn(beam.DoFn):
    """``ShardSpec`` → ``ShardResult``: streams the shard's images into its file.

    Images are read, checked and encoded a chunk at a time by a pool, at most a
    few chunks ahead of the writer, in key order: threads, or, for shards of
    small files when ``encode_processes`` > 0, the process-wide helper pool (see
    ``transforms.io.helpers``), which is how the DirectRunner gets every core working.
    """

    def __init__(self, config: ConvertConfig):
        self._config = config
        self._threads = None

    def setup(self):
        self._threads = concurrent.futures.ThreadPoolExecutor(
            self._config.read_threads, thread_name_prefix="read-image"
        )

    def teardown(self):
        if self._threads is not None:
            self._threads.shutdown(wait=True)
            self._threads = None

    def _pool_for(self, spec: ShardSpec) -> tuple[concurrent.futures.Executor, int]:
        """The pool for this shard's files, and how many tasks it runs at once."""
        config = self._config
        if config.encode_processes > 0 and spec.planned_bytes < SMALL_FILE_BYTES * spec.refs.count:
            pool = ready_helper_pool(config.encode_processes)
            if pool is not None:
                return pool, config.encode_processes
        return self._threads, config.read_threads

    def process(self, spec: ShardSpec) -> Iterator[ShardResult]:
        config = self._config
        labels: Counter = Counter()
        dead: list[DeadLetter] = []
        progress = _Progress(spec)
        done = written = last_checkpoint = 0
        checkpoints: list[tuple[int, int]] = []
        with files.open_write(spec.path) as sink:
            writer = TFRecordWriter(sink, config.compression)
            pool, workers = self._pool_for(spec)
            chunks = list(_chunks(spec.refs.unpack()))
            encode = functools.partial(encode_chunk, validate=config.validate)
            for chunk, (framed, outcomes) in zip(
                chunks, _ordered_map(pool, encode, chunks, workers + 2)
            ):
                good = 0
                for ref, outcome in zip(chunk, outcomes):
                    if isinstance(outcome, DeadLetter):
                        dead.append(outcome)
                    else:
                        good += 1
                        labels[ref.label_text or str(ref.label)] += 1
                writer.write_framed(framed, good)
                written += len(framed)
                done += len(chunk)
                if written - last_checkpoint >= _CHECKPOINT_BYTES and done < spec.refs.count:
                    checkpoints.append((written, writer.records))
                    last_checkpoint = written
                progress.update(done, written)
            digest = writer.close()
        _log.info("Wrote %s: %d records, %.1f MB in %.1f s", spec.path.rsplit("/", 1)[-1],
                  digest.records, digest.bytes / 1e6, time.monotonic() - progress.start)
        dead_path = ""
        if dead:
            dead_path = f"{DEAD_LETTER_DIR}/{_stem(spec.path)}.jsonl"
            files.write_bytes(files.join(config.output, dead_path),
                              "".join(d.to_json_line() for d in dead).encode("utf-8"))
        beam.metrics.Metrics.counter("write", "records").inc(digest.records)
        beam.metrics.Metrics.counter("write", "dead_letter").inc(len(dead))
        beam.metrics.Metrics.counter("write", "bytes").inc(digest.bytes)
        yield ShardResult(
            split=spec.split,
            index=spec.index,
            num_shards=spec.num_shards,
            path=spec.path,
            records=digest.records,
            bytes=digest.bytes,
            crc32c=digest.crc32c,
            sha256=digest.sha256,
            planned_bytes=spec.planned_bytes,
            label_counts=tuple(sorted(labels.items())),
            bad_counts=tuple(sorted(Counter(d.error for d in dead).items())),
            dead_letter_path=dead_path,
            checkpoints=tuple(checkpoints) if config.compression == "none" else (),
        )


class WriteShards(beam.PTransform):
    """``ShardSpec`` → ``ShardResult`` (as written, not yet verified)."""

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, specs):
        return specs | "Write" >> beam.ParDo(_WriteShardFn(self._config))


def storage_crc32c_check(path: str, written_crc32c: str) -> tuple[str | None, str]:
    """For an object on GCS: the CRC-32C the store reports, and an error unless it
    equals the one computed while writing. ``(None, '')`` off GCS.

    This proves end to end, without reading the object back, that what GCS holds
    is what was written; the re-read that follows checks every record as well.
    """
    try:
        stored = object_crc32c(path)
    except FileNotFoundError:
        return None, f"{path} is not in the store"
    if stored is not None and stored != written_crc32c:
        return stored, (f"GCS reports crc32c {stored} for the object, but {written_crc32c} "
                        "was written: the object changed or was damaged in storage")
    return stored, ""


def _scan_in_pieces(
    path: str, expected: FileDigest, boundaries: Sequence[tuple[int, int]],
    pool: concurrent.futures.Executor,
) -> FileDigest:
    """Checks the records between known boundaries in parallel, while this thread
    reads the whole file once for its size and checksums.

    Raises:
      RecordError: at the first faulty record, or where a piece does not hold
        the records its boundaries say.
    """
    edges = [(0, 0), *boundaries, (expected.bytes, expected.records)]
    pieces = [pool.submit(verify_range, path, start, end, index)
              for (start, index), (end, _) in zip(edges, edges[1:])]
    with files.open_read(path) as stream:
        size, crc, sha = digest_stream(stream)
    records = 0
    for (start, index), (_, next_index), piece in zip(edges, edges[1:], pieces):
        count = piece.result()
        if count != next_index - index:
            raise RecordError("truncated", index + count, start,
                              f"{count} records between byte {start} and the next boundary, "
                              f"{next_index - index} written")
        records += count
    return FileDigest(records, size, crc, sha)


def verify_shard(
    path: str,
    compression: str,
    expected: FileDigest | None = None,
    boundaries: Sequence[tuple[int, int]] = (),
    pool: concurrent.futures.Executor | None = None,
) -> tuple[FileDigest | None, str]:
    """Re-reads a shard from where it is stored and checks every record.

    Args:
      path: the shard's path or URI.
      compression: ``none`` or ``gzip``.
      expected: what the file should hold; ``None`` for a CRC scan only.
      boundaries: ``(offset, index)`` of record boundaries the writer reported;
        with ``pool``, the pieces between them are checked in parallel
        (uncompressed shards only). A wrong boundary fails the check.
      pool: where to check pieces (helper processes).

    Returns:
      ``(digest, error)``: the digest read back (``None`` if the file could not
      be read) and ``''`` when everything matched, else what did not.
    """
    try:
        if boundaries and pool is not None and compression == "none" and expected is not None:
            digest = _scan_in_pieces(path, expected, boundaries, pool)
        else:
            with files.open_read(path) as stream:
                digest = scan_stream(stream, compression)
    except RecordError as err:
        return None, str(err)
    except (OSError, EOFError, BeamIOError) as err:
        return None, f"cannot read: {err}"
    if expected is None:
        return digest, ""
    mismatches = [
        f"{field} {getattr(digest, field)} != expected {getattr(expected, field)}"
        for field in ("records", "bytes", "crc32c", "sha256")
        if getattr(digest, field) != getattr(expected, field)
    ]
    return digest, "; ".join(mismatches)


class _VerifyShardFn(beam.DoFn):
    """``ShardResult`` → the same, with ``verified`` and ``verify_error`` set.

    Re-reading runs on a background thread, so a shard is checked while the
    writer, fused before this step, writes the next one; results come out as
    checks finish, and all of them by the end of the bundle.
    """

    def __init__(self, config: ConvertConfig):
        self._compression = config.compression
        self._processes = config.encode_processes
        self._pool = None
        self._pending: list[concurrent.futures.Future] = []

    def setup(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="verify-shard")

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def start_bundle(self):
        self._pending = []

    def _verify(self, result: ShardResult) -> ShardResult:
        expected = FileDigest(result.records, result.bytes, result.crc32c, result.sha256)
        start = time.monotonic()
        stored, error = storage_crc32c_check(result.path, result.crc32c)
        if error:
            _log.error("Verification failed for %s: %s", result.path, error)
            return dataclasses.replace(result, verified=False, verify_error=error,
                                       storage_crc32c=stored or "")
        many_small = result.records and result.bytes < SMALL_FILE_BYTES * result.records
        helpers = None
        if result.checkpoints and many_small and self._processes > 0:
            helpers = ready_helper_pool(self._processes)  # Per-record checks dominate: split them.
        _, error = verify_shard(result.path, self._compression, expected, result.checkpoints, helpers)
        _log.info("Verified %s in %.1f s: %s", result.path.rsplit("/", 1)[-1],
                  time.monotonic() - start, error or "every record and checksum matches")
        return dataclasses.replace(result, verified=not error, verify_error=error,
                                   storage_crc32c=stored or "")

    def _done(self, wait: bool) -> list[ShardResult]:
        finished = [f for f in self._pending if wait or f.done()]
        self._pending = [f for f in self._pending if f not in finished]
        results = [f.result() for f in finished]
        for result in results:
            # Counted here, on the bundle's thread: Beam's metrics are per thread.
            beam.metrics.Metrics.counter("verify", "shards" if result.verified else "failed").inc()
        return results

    def process(self, result: ShardResult) -> Iterator[ShardResult]:
        self._pending.append(self._pool.submit(self._verify, result))
        yield from self._done(wait=False)

    def finish_bundle(self):
        for result in self._done(wait=True):
            yield WindowedValue(result, MIN_TIMESTAMP, [GlobalWindow()])


class VerifyShards(beam.PTransform):
    """Re-reads each written shard from storage and proves it against the writer."""

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, results):
        return results | "ReRead" >> beam.ParDo(_VerifyShardFn(self._config))
