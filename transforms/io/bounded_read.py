"""Reading an input file, bounded: only a regular file, never more than its listed
size plus one byte, and nothing of a file larger than the limit.

A listing gives each input its size. Reading takes the file at most that size
plus one byte (one more tells a file that grew from one that did not), so a file
that grows while the run reads it, or a path that now leads to ``/dev/zero``,
costs one bounded read, not the machine's memory. A FIFO, socket or device is
never read: it is opened without blocking (``O_NONBLOCK``: a FIFO without a writer
would otherwise hold the run forever) and refused on its ``fstat``. Paths with a
``scheme://`` are read through Beam's file systems (imported on first use, so the
helper processes that import this module start without Beam).

Beam-free at load time; pure apart from the reads.
"""

from __future__ import annotations

import hashlib
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


def _open_regular(path: str) -> tuple[int, int]:
    """``(fd, size)`` of a local regular file, opened without blocking.

    Raises:
      InputRefused: ``not_a_regular_file`` for a FIFO, socket or device.
      OSError: when it cannot be opened.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputRefused("not_a_regular_file", _NOT_A_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd, info.st_size


def _read_local(path: str, size: int | None, max_bytes: int) -> bytes:
    fd, now = _open_regular(path)
    try:
        listed = now if size is None else size
        if listed > max_bytes:
            raise _too_large(listed, max_bytes)
        want = listed + 1
        data = os.read(fd, min(want, _MOST_PER_CALL))
        if len(data) != listed:  # Grew (one byte more than listed), or a short read.
            parts = [data]
            got = len(data)
            while got < want and (chunk := os.read(fd, min(want - got, _MOST_PER_CALL))):
                parts.append(chunk)
                got += len(chunk)
            data = b"".join(parts)
        if len(data) != listed:
            raise _changed(listed, len(data))
        return data
    finally:
        os.close(fd)


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


def read_input(path: str, size: int | None, max_bytes: int) -> bytes:
    """The bytes of an input file whose listing gave ``size`` (``None``: not listed;
    a local file's size now is taken).

    Raises:
      InputRefused: ``file_too_large`` (more than ``max_bytes``; nothing read),
        ``not_a_regular_file``, ``changed_while_reading`` (not ``size`` bytes).
      OSError, BeamIOError: when the file cannot be read.
    """
    if size is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    if "://" in path:
        return _read_remote(path, size, max_bytes)
    return _read_local(path, size, max_bytes)


def sha256_input(path: str, size: int | None = None, max_bytes: int | None = None) -> str:
    """SHA-256 (hex) of an input file's bytes, read a block at a time (memory stays
    a block whatever the size).

    ``size``: the listed size (at most that plus one byte is read; another count
    is ``changed_while_reading``). ``max_bytes``: a larger file is refused unread.

    Raises:
      InputRefused: as ``read_input``.
      OSError, BeamIOError: when the file cannot be read.
    """
    if size is not None and max_bytes is not None and size > max_bytes:
        raise _too_large(size, max_bytes)
    digest = hashlib.sha256()
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
