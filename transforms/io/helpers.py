"""Turning one image file into one framed record, or into a dead letter.

This module imports no Beam at load time, so the shard writer's helper
processes start in a fraction of a second: they only need ``schemas``. A
``gs://`` image is read through the process's one storage client
(``gcs.storage_client``), other ``scheme://`` paths through Beam's filesystems,
each imported on first use.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import concurrent.futures.process
import contextlib
import hashlib
import importlib
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator

from beam_tfrecords.schemas.config import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, ImageReshape
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.codec.image_example import image_example_parts
from beam_tfrecords.transforms.codec.images import ImageError, inspect_image, quiet_message
from beam_tfrecords.transforms.codec.readable import readable_image
from beam_tfrecords.transforms.codec.reshape import reshape_decodes, reshape_image
from beam_tfrecords.transforms.codec.tfrecord import RECORD_OVERHEAD, frame_parts, scan_records
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input

__all__ = [
    "SMALL_FILE_BYTES",
    "encode_chunk",
    "encode_image",
    "helper_pool",
    "image_example",
    "ordered_map",
    "read_failure",
    "ready_helper_pool",
    "verify_range",
]

# Below this mean file size, per-file Python work dominates a shard's cost and
# helper processes pay off; above it the work is reading, hashing and copying,
# which threads do in parallel without the GIL.
SMALL_FILE_BYTES = 64 << 10

_START_TIMEOUT_SECONDS = 120
_log = logging.getLogger(__name__)
_pool_lock = threading.Lock()
_pool: concurrent.futures.ProcessPoolExecutor | None = None
_pool_size = 0
_pool_broken = False
_warmups: list[concurrent.futures.Future] = []


def read_failure(err: BaseException) -> str:
    """A read error's dead-letter message: what went wrong, without the path (a
    dead letter names its file relative to the input root) or any content."""
    return f"cannot read the file: {getattr(err, 'strerror', None) or type(err).__name__}"


def verify_range(path: str, start: int, end: int, first_index: int) -> int:
    """Checks the records in bytes ``[start, end)`` of a shard; returns their count.

    Raises:
      RecordError: at the first faulty record (file index and offset).
    """
    if "://" in path:
        from beam_tfrecords.transforms.io import files  # pylint: disable=import-outside-toplevel

        with files.open_read(path) as stream:
            stream.seek(start)
            data = stream.read(end - start)
    else:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
    return scan_records(data, first_index, start)


def _read_errors() -> tuple[type[BaseException], ...]:
    try:
        from apache_beam.io.filesystem import BeamIOError  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover - Beam is a dependency.
        return (OSError,)
    return (OSError, BeamIOError)


def encode_image(ref: ImageRef, validate: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                 image_bytes: str = "readable", reshape: ImageReshape | None = None,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> tuple | DeadLetter:
    """Reads, checks and encodes one image: ``(framed record, note, sha256, source
    sha256, image)`` (see ``image_example``), or why it was refused."""
    outcome = _framed_image(ref, validate, max_pixels, image_bytes, reshape, max_file_bytes)
    if isinstance(outcome, DeadLetter):
        return outcome
    return b"".join(outcome[0]), *outcome[2:]


def _framed_image(ref: ImageRef, validate: str, max_pixels: int, image_bytes: str,
                  reshape: ImageReshape | None, max_file_bytes: int) -> tuple | DeadLetter:
    """``encode_image`` with the framed record as pieces (the file's bytes among
    them, not copied) and its size: ``(pieces, size, note, ...)``.

    The file is read bounded (``bounded_read.read_input``: a regular file only, at
    most its listed size plus one byte, nothing of one over ``max_file_bytes``; a
    ``gs://`` object in one GET of its listed generation, and one deleted, replaced
    or refused since is a ``read_error``). Dead letters name the image by
    ``ref.filename`` (relative to the input root). A storage failure (GCS answering
    429/5xx past its retries) is raised: it fails the shard's attempt, as a failed
    write does, and is never taken for a bad image.
    """
    try:
        data = read_input(ref.path, ref.size, max_file_bytes, ref.generation, ref.crc32c)
    except InputRefused as refused:
        return DeadLetter(ref.filename, "read", refused.reason, refused.message)
    except _read_errors() as err:
        return DeadLetter(ref.filename, "read", "read_error", read_failure(err))
    outcome = _example_parts(ref, data, validate, max_pixels, image_bytes, reshape)
    if isinstance(outcome, DeadLetter):
        return outcome
    parts, size = outcome[0]
    return frame_parts(parts, size), size + RECORD_OVERHEAD, *outcome[1:]


def image_example(ref: ImageRef, data: bytes, validate: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                  image_bytes: str = "readable",
                  reshape: ImageReshape | None = None) -> tuple | DeadLetter:
    """Checks and encodes an image's bytes: ``(serialized Example, note, sha256 of
    the stored image, sha256 of the file's bytes)``, or why it was refused (the two
    digests differ only for an image stored converted or reshaped; the second is
    the input fingerprint's content hash), and the stored image's ``(format, mode,
    width, height)`` (for the statistics; ``ImageInfo.mode``).

    With ``image_bytes='readable'``, an image ``tf.io.decode_image`` cannot read as
    stored is stored as a lossless PNG (see ``codec.readable``). The note says what
    a manifest should count: ``converted_to_png/<why>``, ``kept/<why>`` (an image
    kept as it is that a reader should know about: ``png_16_bit``, or, with
    ``original``, the reason TensorFlow cannot read it), or ''. With an active
    ``reshape`` the image is resized and re-encoded as it says (see
    ``codec.reshape``; always readable) and the note is ``reshape/<what>``.
    """
    outcome = _example_parts(ref, data, validate, max_pixels, image_bytes, reshape)
    if isinstance(outcome, DeadLetter):
        return outcome
    parts, _ = outcome[0]
    return b"".join(parts), *outcome[1:]


def _example_parts(ref: ImageRef, data: bytes, validate: str, max_pixels: int, image_bytes: str,
                   reshape: ImageReshape | None) -> tuple | DeadLetter:
    """``image_example`` with the Example as ``(pieces, size)`` (see
    ``image_example_parts``)."""
    source = data
    try:
        note = ""
        if reshape is not None and reshape.active:
            info = inspect_image(data, "headers", max_pixels)
            if validate != "headers" and not (info.format == "jpeg" and reshape_decodes(info, reshape)):
                # A JPEG that is decoded anyway is checked by that decode (every
                # entropy-coded byte is read at any scale); the rest as asked.
                info = inspect_image(data, validate, max_pixels)
            data, info, note = reshape_image(data, info, reshape)
        else:
            info = inspect_image(data, validate, max_pixels)
            if info.unreadable and image_bytes == "readable":
                note = f"converted_to_png/{info.unreadable}"
                data, info = readable_image(data, info)
            elif info.unreadable:
                note = f"kept/{info.unreadable}"
            elif info.bit_depth == 16:
                note = "kept/png_16_bit"
    except ImageError as err:
        return DeadLetter(ref.filename, "validate", err.reason, quiet_message(err.message))
    except (ValueError, OSError, TypeError, MemoryError) as err:  # Pillow, converting or resizing.
        return DeadLetter(ref.filename, "encode", "conversion_error",
                          quiet_message(f"the image could not be converted: {type(err).__name__}: {err}"))
    # The one content hash: the image/key/sha256 feature, the duplicates report and
    # (the file's own bytes) the input fingerprint.
    digest = hashlib.sha256(data).hexdigest()
    source_digest = digest if data is source else hashlib.sha256(source).hexdigest()
    try:
        example = image_example_parts(
            data, info, ref.label, ref.label_text, ref.filename, ref.extra, digest
        )
    except (ValueError, TypeError, OverflowError) as err:
        return DeadLetter(ref.filename, "encode", "encode_error",
                          quiet_message(f"cannot encode the record: {err}"))
    return example, note, digest, source_digest, (info.format, info.mode, info.width, info.height)


def encode_chunk(chunk: list[ImageRef], validate: str, max_pixels: int = DEFAULT_MAX_PIXELS,
                 image_bytes: str = "readable", reshape: ImageReshape | None = None,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 ) -> tuple[bytes, list[tuple[int, str, str] | DeadLetter]]:
    """``encode_image`` over a run of files: one task for a thread or a process.

    Returns:
      The framed records of the good files, concatenated in order (one object to
      pass back instead of many; each file's bytes are copied once, into it), and
      per file either ``(framed size, note, sha256, source sha256, (format, mode,
      width, height))`` or its dead letter.
    """
    pieces: list[bytes] = []
    outcomes: list = []
    for ref in chunk:
        outcome = _framed_image(ref, validate, max_pixels, image_bytes, reshape, max_file_bytes)
        if isinstance(outcome, DeadLetter):
            outcomes.append(outcome)
        else:
            pieces += outcome[0]
            outcomes.append(outcome[1:])
    return b"".join(pieces), outcomes


@contextlib.contextmanager
def _stand_in_main():
    """Makes ``transforms.io.helper_main`` the ``__main__`` that spawned children load."""
    real = sys.modules["__main__"]
    sys.modules["__main__"] = importlib.import_module("beam_tfrecords.transforms.io.helper_main")
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _preload(modules: tuple[str, ...]) -> None:
    """Runs in a new helper: imports what its tasks will need, ahead of them."""
    for module in modules:
        importlib.import_module(module)


def _die_with_parent(parent: int) -> None:
    """Runs in each new helper: a thread that ends the helper as soon as the
    process that started it is gone (killed with SIGKILL, say, when no cleanup
    runs), so no helper outlives a run. Ctrl-C (SIGINT, sent by a terminal to
    the whole process group) is left to the parent, which reports it in one
    line and ends its helpers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)  # pylint: disable=protected-access

    threading.Thread(target=watch, name="watch-parent", daemon=True).start()


def ordered_map(pool: concurrent.futures.Executor, fn: Callable, items: Iterable,
                window: int) -> Iterator:
    """``map(fn, items)`` on a pool, in order, with at most ``window`` tasks in flight
    (so a reader stays a few items ahead of its consumer, never the whole input)."""
    pending: collections.deque = collections.deque()
    iterator = iter(items)
    for item in itertools.islice(iterator, window):
        pending.append(pool.submit(fn, item))
    while pending:
        done = pending.popleft()
        for item in itertools.islice(iterator, 1):
            pending.append(pool.submit(fn, item))
        yield done.result()


def helper_pool(
    processes: int, preload: tuple[str, ...] = ("beam_tfrecords.transforms.io.helpers",)
) -> concurrent.futures.ProcessPoolExecutor | None:
    """The process-wide pool of helper processes, started on first call.

    One pool serves every shard writer in the process. Its processes are spawned
    (not forked: the runner has threads) and start at once, so calling this as
    soon as small files are known to be coming hides their start-up. Each
    helper first imports ``preload``.

    Returns:
      The pool, or ``None`` when helper processes could not start before (see
      ``ready_helper_pool``); callers then use threads.
    """
    global _pool, _pool_size, _pool_broken  # pylint: disable=global-statement
    with _pool_lock:
        if _pool_broken:
            return None
        if _pool is None or _pool_size != processes:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = concurrent.futures.ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context("spawn"),
                initializer=_die_with_parent, initargs=(os.getpid(),),
            )
            _pool_size = processes
            _warmups.clear()
            # Each submit spawns one process, now, with an empty stand-in main module.
            with _stand_in_main():
                _warmups.extend(_pool.submit(_preload, preload) for _ in range(processes))
        return _pool


def ready_helper_pool(processes: int) -> concurrent.futures.ProcessPoolExecutor | None:
    """``helper_pool``, once its processes have answered; ``None`` if they cannot."""
    global _pool_broken  # pylint: disable=global-statement
    pool = helper_pool(processes)
    if pool is None:
        return None
    try:
        for warmup in list(_warmups):
            warmup.result(timeout=_START_TIMEOUT_SECONDS)
    except (concurrent.futures.process.BrokenProcessPool, concurrent.futures.TimeoutError) as err:
        _log.warning("Helper processes could not start (%s); encoding in threads instead", err)
        with _pool_lock:
            _pool_broken = True
        pool.shutdown(wait=False, cancel_futures=True)
        return None
    return pool


@atexit.register
def _shutdown_helper_pool() -> None:
    if _pool is not None:
        _pool.shutdown(wait=True, cancel_futures=True)

