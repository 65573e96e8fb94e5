"""Reading an input file, bounded: only a regular file, never more than its listed
size plus one byte, and nothing of a file larger than the limit.

A listing gives each input its size. Reading takes the file at most that size
plus one byte (one more tells a file that grew from one that did not), so a file
that grows while the run reads it, or a path that now leads to ``/dev/zero``,
costs one bounded read, not the machine's memory. A FIFO, socket or device is
never read: it is opened without blocking (``O_NONBLOCK``: a FIFO without a writer
would otherwise hold the run forever) and refused on its ``fstat``.

A ``gs://`` object is read with one media GET of the generation the listing gave,
for at most the listed size plus one byte (``gcs.read_object``): one that was
deleted, replaced or locked (401/403) since is a ``read_error`` saying so, never a
failed run; 429/5xx are retried, then raised as a storage error. Paths with another
``scheme://`` are read through Beam's file systems. Both are imported on first use,
so the helper processes that import this module start without Beam.

Beam-free at load time; pure apart from the reads.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat

__all__ = ["InputRefused", "read_input", "sha256_input"]

_NOT_A_FILE = "a FIFO, socket or device, not a file; not read"
_BLOCK = 1 << 20
# One read call asks for at most this much (Linux returns at most ~2 GiB a call).
_MOST_PER_CALL = 1 << 30


class InputRefused(Exception):
    """An input that is not read: why (``reason``, a dead letter's error) and a
    message for people (never the file's content)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _too_large(size: int, max_bytes: int) -> InputRefused:
    return InputRefused("file_too_large", f"the file is {size:,} bytes, more than --max_file_bytes "
                        f"({max_bytes:,}); not read")


def _changed(listed: int, found: int) -> InputRefused:
    how = f"more than {listed:,}" if found > listed else f"{found:,}"
    return InputRefused("changed_while_reading", f"the listing gave {listed:,} bytes, reading found "
                        f"{how}: the file changed while the run read it; not converted")


# Without blocking (a FIFO without a writer), never a controlling terminal, not inherited.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_regular(path: str) -> tuple[int, int]:
    """``(fd, size)`` of a local regular file, opened without blocking.

    Raises:
      InputRefused: ``not_a_regular_file`` for a FIFO, socket or device.
      OSError: when it cannot be opened.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputRefused("not_a_regular_file", _NOT_A_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _read_local(path: str, size: int | None, max_bytes: int) -> bytes:
    """A local file's bytes: open, ``fstat`` (a regular file only), one read of the
    listed size plus one byte (more reads only for a short read), close."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputRefused("not_a_regular_file", _NOT_A_FILE)
        listed = info.st_size if size is None else size
        if listed > max_bytes:
            raise _too_large(listed, max_bytes)
        want = listed + 1
        data = os.read(fd, want if want < _MOST_PER_CALL else _MOST_PER_CALL)
        if len(data) != listed:  # Grew (one byte more than listed), or a short read.
            data = _read_rest(fd, data, want)
            if len(data) != listed:
                raise _changed(listed, len(data))
        return data
    finally:
        os.close(fd)


def _read_rest(fd: int, data: bytes, want: int) -> bytes:
    """``data`` (the first read) and what follows it, up to ``want`` bytes in all."""
    parts = [data]
    got = len(data)
    while got < want and (chunk := os.read(fd, min(want - got, _MOST_PER_CALL))):
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class _Feed:
    """A sink whose ``write`` is ``feed`` (a digest's ``update``)."""

    def __init__(self, feed):
        self.write = feed


def _moved(listed: int, found: int, generation: int) -> InputRefused:
    """A read that found another size than listed: of a pinned generation (which
    never changes), another object was served in its place."""
    if not generation:
        return _changed(listed, found)
    how = f"more than {listed:,}" if found > listed else f"{found:,}"
    return InputRefused("read_error", f"the object changed since the listing (the listing gave "
                        f"{listed:,} bytes, reading found {how}); not converted")


def _read_gcs(path: str, sink, size: int | None, max_bytes: int | None, generation: int,
              crc32c: int) -> int:
    """Writes at most ``size`` (or ``max_bytes``) plus one bytes of a ``gs://`` object to
    ``sink``, from one GET of ``generation``; returns how many."""
    from beam_tfrecords.transforms.io import gcs  # pylint: disable=import-outside-toplevel

    limit = (size if size is not None else max_bytes if max_bytes is not None else 1 << 62) + 1
    try:
        got = gcs.read_object(path, sink, limit, generation, crc32c)
    except gcs.ObjectUnreadable as err:
        if size is None and err.why != "changed":  # Not a listed input (a labels file): as open() says.
            error = FileNotFoundError if err.why == "gone" else PermissionError
            raise error(f"{path}: {err.message.split(';')[0]}") from None
        raise InputRefused("read_error", err.message) from None
    if size is not None and got != size:
        raise _moved(size, got, generation)
    if size is None and max_bytes is not None and got > max_bytes:
        raise InputRefused("file_too_large", f"the file is more than --max_file_bytes "
                           f"({max_bytes:,}) bytes; not read")
    return got


def _read_remote(path: str, size: int | None, max_bytes: int) -> bytes:
    from beam_tfrecords.transforms.io import files  # pylint: disable=import-outside-toplevel

    with files.open_read(path) as stream:
        data = stream.read((max_bytes if size is None else size) + 1)
    if size is None:
        if len(data) > max_bytes:
            raise InputRefused("file_too_large", f"the file is more than --max_file_bytes "
                               f"({max_bytes:,}) bytes; not read")
    elif len(data) != size:
        raise _changed(size, len(data))
    return data


def read_input(path: str, size: int | None, max_bytes: int, generation: int = 0,
               crc32c: int = -1) -> bytes:
    """The bytes of an input file whose listing gave ``size`` (``None``: not listed;
    a local file's size now is taken) and, for a ``gs://`` object, ``generation``
    and ``crc32c`` (0 and -1: not known; the live object is read).

    Raises:
      InputRefused: ``file_too_large`` (more than ``max_bytes``; nothing read),
        ``not_a_regular_file``, ``changed_while_reading`` (not ``size`` bytes),
        ``read_error`` (a ``gs://`` object deleted, replaced or refused since the
        listing).
      OSError, BeamIOError: when the file cannot be read.
      google.api_core.exceptions.GoogleAPIError: when GCS failed (429/5xx after
        ``gcs.READ_RETRY_SECONDS`` of retries): a storage error, not the input's.
    """
    if size is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    if path.startswith("gs://"):
        buffer = io.BytesIO()
        _read_gcs(path, buffer, size, max_bytes, generation, crc32c)
        return buffer.getvalue()
    if "://" in path:
        return _read_remote(path, size, max_bytes)
    return _read_local(path, size, max_bytes)


def sha256_input(path: str, size: int | None = None, max_bytes: int | None = None,
                 generation: int = 0, crc32c: int = -1) -> str:
    """SHA-256 (hex) of an input file's bytes, read a block at a time (memory stays
    a block whatever the size).

    ``size``: the listed size (at most that plus one byte is read; another count
    is ``changed_while_reading``). ``max_bytes``: a larger file is refused unread.
    ``generation``, ``crc32c``: a ``gs://`` object's, as listed (see ``read_input``).

    Raises:
      InputRefused: as ``read_input``.
      OSError, BeamIOError, GoogleAPIError: as ``read_input``.
    """
    if size is not None and max_bytes is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    digest = hashlib.sha256()
    if path.startswith("gs://"):  # Hashed as the one GET streams in.
        _read_gcs(path, _Feed(digest.update), size, max_bytes, generation, crc32c)
        return digest.hexdigest()
    if "://" in path:
        from beam_tfrecords.transforms.io import files  # pylint: disable=import-outside-toplevel

        stream, now = files.open_read(path), None
        read = stream.read
    else:
        fd, now = _open_regular(path)
        stream = None
        read = lambda n: os.read(fd, n)  # noqa: E731
    try:
        listed = size if size is not None else now
        if listed is not None and max_bytes is not None and listed > max_bytes:
            raise _too_large(listed, max_bytes)
        limit = listed + 1 if listed is not None else (max_bytes + 1 if max_bytes is not None else None)
        got = 0
        while limit is None or got < limit:
            block = read(_BLOCK if limit is None else min(_BLOCK, limit - got))
            if not block:
                break
            digest.update(block)
            got += len(block)
    finally:
        if stream is not None:
            stream.close()
        else:
            os.close(fd)
    if listed is not None and got != listed:
        raise _changed(listed, got)
    if listed is None and max_bytes is not None and got > max_bytes:
        raise InputRefused("file_too_large", f"the file is more than --max_file_bytes "
                           f"({max_bytes:,}) bytes; not read")
    return digest.hexdigest()
