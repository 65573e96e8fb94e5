"""The shard engine's verifier: each written shard re-read from storage and proved.

``WriteShards`` (``transforms.shard_engine``) writes a shard under its temporary name
with the digest of what it wrote (records, bytes, CRC-32C, SHA-256) and the
record boundaries it noted; ``VerifyShards`` reads the stored object back, checks
every record against that digest (the pieces between boundaries in parallel, in
helper processes, for shards of many small records), and records which stored
object it read (``schemas.elements.StoredObject``), so that the commit
(``transforms.commit_step``) moves only that object. ``verify_shard`` and
``storage_crc32c_check`` are the same checks for one path, as ``verify`` uses them.

An uncompressed shard's index file (``<shard>.idx``, written beside it) is proved
with it: the re-read computes the index of the bytes it reads
(``codec.record_index.RecordIndex``), which must be the index written, and the stored
index file must hold those bytes; the object read is recorded too
(``ShardResult.index_verified_as``), and the commit moves only that.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
import zlib
from collections.abc import Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_tfrecords.schemas.elements import ShardResult, StoredObject
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.tfrecord import (
    FileDigest,
    RecordError,
    digest_stream,
    scan_stream,
)
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io import progress as run_progress
from beam_tfrecords.transforms.io.commit import stored_object
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.gcs import is_gcs, object_crc32c, object_info
from beam_tfrecords.transforms.io.helpers import (
    SMALL_FILE_BYTES,
    live_helper_pool,
    ready_helper_pool,
    submit_early,
    take_early,
    verify_piece,
)
from beam_tfrecords.transforms.io.retry import retried
from beam_tfrecords.transforms.io.storage_errors import STORAGE_ERRORS

__all__ = [
    "PiecesAhead",
    "VerifyShards",
    "storage_crc32c_check",
    "verify_shard",
]

# The shard engine's log, named as before the verifier had a module of its own
# (a run's log lines and the retries' warnings keep their logger).
_log = logging.getLogger("beam_tfrecords.transforms.shard_engine")


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
    return stored, _crc32c_error(stored, written_crc32c)


def _crc32c_error(stored: str | None, written_crc32c: str) -> str:
    if stored is not None and stored != written_crc32c:
        return (f"GCS reports crc32c {stored} for the object, but {written_crc32c} "
                "was written: the object changed or was damaged in storage")
    return ""


def _stored(path: str) -> tuple[StoredObject, str | None]:
    """The object at ``path`` (see ``stored_object``) and, on GCS, the CRC-32C the
    store computed of it (hex), from one metadata request."""
    if is_gcs(path):
        info = object_info(path)
        return StoredObject(info.size, generation=info.generation), info.crc32c
    return stored_object(path), None


def _many_small(records: int, size: int) -> bool:
    """Whether a shard's pieces are checked by the helpers: per-record checks dominate."""
    return bool(records) and size < SMALL_FILE_BYTES * records


def _piece_tasks(path: str, boundaries: Sequence[tuple[int, int]], end: tuple[int, int] | None,
                 indexed: bool) -> list[tuple[str, int, int, int, bool]]:
    """The ``verify_piece`` tasks of a shard: a piece between each two boundaries,
    from the start, to ``end`` (``(bytes, records)``: the file's end) when given."""
    edges = [(0, 0), *boundaries, *([end] if end is not None else [])]
    return [(path, start, stop, index, indexed) for (start, index), (stop, _) in zip(edges, edges[1:])]


class PiecesAhead:
    """Pieces of a local, uncompressed shard checked while the writer still writes
    the rest: each piece between two of the shard's boundaries (known before the
    write: a table's, planned from its spools) goes to the helpers once the file
    holds it, and ``VerifyShards`` takes those checks (``helpers.take_early``)
    instead of reading the piece again; it still re-reads the whole file for its
    size and checksums, after the write, so a byte changed since a piece was
    checked fails the shard. A table's one shard of 1M rows: its ~0.4 s of
    checks, on two cores, began after the ~0.25 s copy, in which a core was idle.

    Nothing is sent once the file cannot be looked at or the pool stopped taking
    tasks (another run in this process ended its helpers): verification then
    checks those pieces itself, as before. A write that fails drops the checks it
    sent (``forget``); a retry writes, and sends, under another name.
    """

    def __init__(self, path: str, boundaries: Sequence[tuple[int, int]],
                 pool: concurrent.futures.Executor):
        self._path = path
        self._boundaries = tuple(boundaries)
        self._tasks = _piece_tasks(path, boundaries, None, True)  # Between boundaries; not the last.
        self._pool: concurrent.futures.Executor | None = pool
        self._sent: list[tuple] = []

    @classmethod
    def ahead(cls, path: str, boundaries: Sequence[tuple[int, int]], records: int,
              size: int) -> PiecesAhead | None:
        """For a shard of ``records`` records in ``size`` bytes, as ``VerifyShards``
        will check it: ``None`` where it checks no pieces with the helpers (or there
        is no live helper pool)."""
        if not (boundaries and _many_small(records, size) and files.is_local(path)):
            return None
        pool = live_helper_pool()
        return cls(path, boundaries, pool) if pool is not None else None

    def written(self, written: int) -> None:
        """``written`` bytes were handed to the writer: the pieces the file holds go."""
        if self._pool is None or len(self._sent) >= len(self._tasks) or written < self._tasks[len(self._sent)][2]:
            return
        try:
            on_disk = os.stat(self._path).st_size
        except OSError:  # Gone or unreadable: verification says so; nothing more goes ahead.
            self.forget()
            return
        # What the file holds of this writer's bytes (it writes them in the background and
        # only appends; a file made longer by anyone else holds no more of them).
        self._send(self._tasks, min(on_disk, written))

    def closed(self, digest: FileDigest) -> None:
        """The writer closed the file: every piece left goes, the last to its end."""
        if self._pool is not None:
            self._send(_piece_tasks(self._path, self._boundaries, (digest.bytes, digest.records), True),
                       digest.bytes)

    def forget(self) -> None:
        """Drops the checks sent and sends no more (the write failed, or cannot be followed)."""
        pool, self._pool = self._pool, None
        for task in self._sent:
            found = take_early(pool, verify_piece, task)
            if found is not None:
                found.cancel()

    def _send(self, tasks: list, held: int) -> None:
        ready = [task for task in tasks[len(self._sent):] if task[2] <= held]
        self._sent += ready
        try:
            submit_early(self._pool, verify_piece, ready)
        except RuntimeError:  # The pool was shut down (BrokenProcessPool is one too).
            self.forget()


def _scan_in_pieces(
    path: str, expected: FileDigest, boundaries: Sequence[tuple[int, int]],
    pool: concurrent.futures.Executor, reread: RecordIndex | None = None,
) -> FileDigest:
    """Checks the records between known boundaries in parallel, while this thread
    reads the whole file once for its size and checksums (pieces the writer sent
    ahead, ``PiecesAhead``, are taken, not checked again).

    Raises:
      RecordError: at the first faulty record, or where a piece does not hold
        the records its boundaries say.
    """
    # The index of the bytes read back (``reread``, when given): each piece's lines
    # made where its records are checked, taken in order.
    indexed = reread is not None
    tasks = _piece_tasks(path, boundaries, (expected.bytes, expected.records), indexed)
    pieces = [take_early(pool, verify_piece, task) or pool.submit(verify_piece, task) for task in tasks]
    with files.open_read(path) as stream:
        size, crc, sha = digest_stream(stream)
    records = 0
    for (_, start, end, index, _), next_task, piece in zip(tasks, [*tasks[1:], None], pieces):
        count = piece.result()
        if indexed:
            count, lines = count
            reread.add_lines(lines, count, end)
        expected_count = (next_task[3] if next_task is not None else expected.records) - index
        if count != expected_count:
            raise RecordError("truncated", index + count, start,
                              f"{count} records between byte {start} and the next boundary, "
                              f"{expected_count} written")
        records += count
    return FileDigest(records, size, crc, sha)


def verify_shard(
    path: str,
    compression: str,
    expected: FileDigest | None = None,
    boundaries: Sequence[tuple[int, int]] = (),
    pool: concurrent.futures.Executor | None = None,
    index: FileDigest | None = None,
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
      index: for an uncompressed shard, the digest of the index file written
        with it: the index of the bytes read back (every record's offset and
        length, ``RecordIndex``) must have that digest.

    Returns:
      ``(digest, error)``: the digest read back (``None`` if the file could not
      be read) and ``''`` when everything matched, else what did not.
    """
    reread = RecordIndex() if index is not None and compression == "none" else None
    try:
        if boundaries and pool is not None and compression == "none" and expected is not None:
            digest = _scan_in_pieces(path, expected, boundaries, pool, reread)
        else:
            with files.open_read(path) as stream:
                digest = scan_stream(stream, compression, reread.feed if reread is not None else None)
        found = reread.finish() if reread is not None else None
    except RecordError as err:
        return None, str(err)
    except zlib.error as err:  # A damaged gzip stream: a fault of the shard, not of the store.
        return None, f"corrupt gzip stream: {err}"
    except (OSError, EOFError, BeamIOError) as err:
        return None, f"cannot read: {err}"
    if expected is None:
        return digest, ""
    mismatches = [
        f"{field} {getattr(digest, field)} != expected {getattr(expected, field)}"
        for field in ("records", "bytes", "crc32c", "sha256")
        if getattr(digest, field) != getattr(expected, field)
    ]
    if found is not None and not mismatches and (found.bytes, found.sha256) != (index.bytes, index.sha256):
        mismatches.append(f"the index of the records read back ({found.records} lines, {found.bytes} "
                          f"bytes, sha256 {found.sha256}) is not the index written ({index.bytes} "
                          f"bytes, sha256 {index.sha256})")
    return digest, "; ".join(mismatches)


def _index_digest(result: ShardResult) -> FileDigest | None:
    """The digest of the index file written with the shard (``None`` without one)."""
    if not result.index_path:
        return None
    return FileDigest(result.records, result.index_bytes, result.index_crc32c, result.index_sha256)


class _VerifyShardFn(beam.DoFn):
    """``ShardResult`` → the same, with ``verified`` and ``verify_error`` set.

    Re-reading runs on a background thread, so a shard is checked while the
    writer, fused before this step, writes the next one; results come out as
    checks finish, and all of them by the end of the bundle. A shard whose
    write already failed passes through unchanged. A ``gs://`` shard is re-read
    only with ``reread``; otherwise the CRC-32C and size GCS reports (computed by
    the store from the bytes it received) must equal the writer's.
    """

    def __init__(self, compression: str, helper_processes: int, reread: bool = True):
        self._compression = compression
        self._processes = helper_processes
        self._reread = reread
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

    def _verify_once(self, result: ShardResult, path: str
                     ) -> tuple[str | None, str, StoredObject | None]:
        """``(crc32c GCS reports, error, the object read)``: the object is the same
        (``stored_object``) before the first byte is read and after the last, or
        the check fails."""
        expected = FileDigest(result.records, result.bytes, result.crc32c, result.sha256)
        try:
            before, stored = _stored(path)
        except FileNotFoundError:
            return None, f"{path} is not in the store", None
        except OSError as err:  # Not a regular file (a link put in its place, ...).
            return None, str(err), None
        error = _crc32c_error(stored, result.crc32c)
        if error:
            return stored, error, None
        if stored is not None and not self._reread:
            # GCS computed this CRC-32C from the bytes it stored; equal to the writer's
            # (and the size too), the object holds what was written and framed.
            if before.size != result.bytes:
                return stored, (f"GCS holds {before.size} bytes for the object, but "
                                f"{result.bytes} were written"), None
            return stored, "", before
        helpers = None
        if result.checkpoints and _many_small(result.records, result.bytes) and self._processes > 0:
            helpers = ready_helper_pool(self._processes)  # Per-record checks dominate: split them.
        hold_point("mid_verify")
        _, error = verify_shard(path, self._compression, expected, result.checkpoints, helpers,
                                _index_digest(result))
        if error:
            return stored, error, None
        try:
            after = stored_object(path)
        except OSError as err:
            after = err
        if after != before:
            return stored, "the file was replaced or changed while it was verified", None
        return stored, "", before

    def _verify_index(self, result: ShardResult) -> tuple[str, StoredObject | None]:
        """``(error, the stored index file read)``: the index file beside the shard's
        temporary file holds the bytes written (their size and SHA-256, the same the
        shard's re-read found; on GCS without ``reread``, the size and CRC-32C the store
        reports), and stays the same object from its first byte to its last."""
        path = result.index_path
        try:
            before, stored = _stored(path)
        except FileNotFoundError:
            return f"its index file {path} is not in the store", None
        except OSError as err:
            return f"its index file: {err}", None
        if stored is not None and not self._reread:
            if (before.size, stored) != (result.index_bytes, result.index_crc32c):
                return (f"GCS holds {before.size} bytes, crc32c {stored} for its index file, but "
                        f"{result.index_bytes} bytes, crc32c {result.index_crc32c} were written"), None
            return "", before
        with files.open_read(path) as stream:
            size, _, sha = digest_stream(stream)
        if (size, sha) != (result.index_bytes, result.index_sha256):
            return (f"its index file holds {size} bytes, sha256 {sha}, not the index of its "
                    f"records ({result.index_bytes} bytes, sha256 {result.index_sha256})"), None
        try:
            after = stored_object(path)
        except OSError as err:
            after = err
        if after != before:
            return "its index file was replaced or changed while it was verified", None
        return "", before

    def _verify(self, result: ShardResult) -> ShardResult:
        if result.verify_error:
            return result
        path = result.temp_path or result.path
        start = time.monotonic()
        index_read: list[StoredObject | None] = [None]

        def attempt() -> tuple:
            try:
                outcome = self._verify_once(result, path)
                if not outcome[1] and result.index_path:
                    error, index_read[0] = self._verify_index(result)
                    if error:
                        return outcome[0], error, None
                return outcome
            except STORAGE_ERRORS as err:  # The store refused or failed the read (a GCS 403, ...).
                return None, f"cannot read: {type(err).__name__}: {err}", None

        def failure(outcome: tuple) -> str:
            # A read that failed, or anything odd on a remote store, is read again:
            # a flaky connection must not fail a good shard. A local mismatch is final.
            error = outcome[1]
            return error if error.startswith("cannot read") or (error and not files.is_local(path)) else ""

        stored, error, read = retried(attempt, failure, lambda _: f"Verifying {path}", "re-reading", _log)
        if error:
            _log.error("Verification failed for %s: %s", path, error)
        else:
            _log.info("Verified %s in %.1f s: every record and checksum matches",
                      path.rsplit("/", 1)[-1], time.monotonic() - start)
        return dataclasses.replace(result, verified=not error, verify_error=error,
                                   storage_crc32c=stored or "", verified_as=read,
                                   index_verified_as=None if error else index_read[0])

    def _checked(self, result: ShardResult) -> ShardResult:
        """``_verify``, the shard then shown done by the progress line at once, not when
        the bundle next yields (after the next shard's write); its Beam metric
        follows on the bundle's thread (``_done``)."""
        checked = self._verify(result)
        run_progress.add(shards=1, metrics=False)
        return checked

    def _done(self, wait: bool) -> list[ShardResult]:
        finished = [f for f in self._pending if wait or f.done()]
        self._pending = [f for f in self._pending if f not in finished]
        results = [f.result() for f in finished]
        for result in results:
            # Counted here, on the bundle's thread: Beam's metrics are per thread.
            beam.metrics.Metrics.counter("verify", "shards" if result.verified else "failed").inc()
        run_progress.add(shards=len(results), counters=False)
        return results

    def process(self, result: ShardResult) -> Iterator[ShardResult]:
        self._pending.append(self._pool.submit(self._checked, result))
        yield from self._done(wait=False)

    def finish_bundle(self):
        for result in self._done(wait=True):
            yield WindowedValue(result, MIN_TIMESTAMP, [GlobalWindow()])


class VerifyShards(beam.PTransform):
    """Re-reads each written shard from storage and proves it against the writer.

    Args:
      compression: ``none`` or ``gzip``.
      helper_processes: helper processes that may check pieces of shards of many
        small records in parallel (0: none).
      reread: re-read ``gs://`` shards too (default). ``False`` trusts, on GCS, the
        CRC-32C and size the store reports for the object when they equal the
        writer's (one metadata request, nothing downloaded); local shards are
        always re-read.
    """

    def __init__(self, compression: str = "none", helper_processes: int = 0, reread: bool = True):
        super().__init__()
        self._compression = compression
        self._processes = helper_processes
        self._reread = reread

    def expand(self, results):
        return results | "ReRead" >> beam.ParDo(
            _VerifyShardFn(self._compression, self._processes, self._reread))
