"""TFRecord framing: masked CRC-32C, a checksumming writer and a streaming reader.

A TFRecord file is a plain sequence of records, each framed as::

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

all little-endian, where ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8``
(mod 2**32) and the CRC is CRC-32C (Castagnoli). A ``.tfrecord.gz`` file is the
same byte stream compressed as one gzip member.

The writer computes, while it writes, the CRC-32C and SHA-256 of the bytes that
land on storage (after compression), so a shard can be proved against what was
written without a second pass over the source data. The reader streams records
one at a time and names the record index and byte offset of any fault.

A record's 8-byte length is never trusted for an allocation: ``scan_stream``
(what ``verify`` runs) checks it against what is left of a plain file before
reading on, and streams a record longer than a block through the CRC in pieces
(``RECORD_PIECE`` bytes at most), holding about ``SCAN_MEMORY_BYTES`` per file
whatever the file says, in one linear pass; ``iter_records``, which yields whole
records, reads a long one in pieces too, so it holds no more than the stream
actually has, and refuses one longer than the stream's known size or the
caller's ``max_record`` before reading it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import gzip
import hashlib
import io
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import google_crc32c

from beam_tfrecords.schemas.shards import check_compression
from beam_tfrecords.transforms.codec.record_scan import (
    CRC_FIELD,
    HEADER_FIELDS,
    LENGTH_FIELD,
    RECORD_OVERHEAD,
    RECORD_PIECE,
    RecordError,
    ends_inside,
    mask_crc,
    read_exact,
    scan_range,
    scan_records,
)

__all__ = [
    "CHECKPOINT_BYTES",
    "RECORD_OVERHEAD",
    "RECORD_PIECE",
    "SCAN_MEMORY_BYTES",
    "FileDigest",
    "ObservingReader",
    "RecordError",
    "TFRecordWriter",
    "frame_parts",
    "frame_record",
    "iter_records",
    "mask_crc",
    "masked_crc32c",
    "digest_stream",
    "scan_range",
    "scan_records",
    "scan_stream",
    "stream_size",
]

# A shard's record boundaries are reported about this often (``checkpoints``), so
# that its verification can check the pieces between them in parallel; every
# planner and writer uses this one spacing.
CHECKPOINT_BYTES = 16 << 20

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH, _HEADER, _FOOTER = LENGTH_FIELD, HEADER_FIELDS, CRC_FIELD
_READ_CHUNK = 1 << 20
# What scan_stream holds for one file, whatever its length fields say: a block, a
# record carried into the next block (under two blocks), the two joined, a piece
# of a long record (twice, inside gzip's reader), and gzip's own buffers.
SCAN_MEMORY_BYTES = 16 << 20
# frame_parts joins a record's pieces below this size.
_JOIN_BELOW = 64 << 10
# Blocks a background writer holds beyond the one being written (see ``_InOrder``).
_IN_FLIGHT = 1
_crc32c = google_crc32c.value
# frame_parts' record heads by size (``_record_head``), at most this many kept.
_HEADS: dict[int, bytes] = {}
_HEADS_KEPT = 1 << 16
_crc32c_extend = google_crc32c.extend


def masked_crc32c(data: bytes | memoryview) -> int:
    """Returns the masked CRC-32C of ``data``, as TFRecord stores it."""
    return mask_crc(google_crc32c.value(bytes(data) if isinstance(data, memoryview) else data))


def frame_record(data: bytes) -> bytes:
    """Returns ``data`` framed as one TFRecord record (``len(data) + 16`` bytes).

    The one framing of the package: every writer, and the table encoder's hot loop,
    frames through here.
    """
    length = _LENGTH.pack(len(data))
    return b"".join((length, _FOOTER.pack(mask_crc(_crc32c(length))), data,
                     _FOOTER.pack(mask_crc(_crc32c(data)))))


def frame_parts(parts: Sequence[bytes], size: int) -> list[bytes]:
    """``frame_record(b"".join(parts))`` as pieces, without joining ``parts``.

    For a record holding one large value (an image): the CRC runs over the pieces
    in place, so a caller that joins many records' pieces at once copies each
    byte once. ``size`` is the total length of ``parts``.
    """
    head = _HEADS.get(size)
    if head is None:
        head = _record_head(size)
    if size < _JOIN_BELOW:  # Small: one join and one CRC call cost less than a call per piece.
        data = b"".join(parts)
        crc = _crc32c_extend(0, data)  # As _crc32c(data), with less overhead per call.
        return [head, data, _FOOTER.pack((((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32)]
    crc = 0
    for part in parts:
        crc = _crc32c_extend(crc, part)
    return [head, *parts, _FOOTER.pack(mask_crc(crc))]


def _record_head(size: int) -> bytes:
    """A record's length and its masked CRC-32C (12 bytes), kept for the next record
    of that size (most records of a run share a few thousand sizes)."""
    length = _LENGTH.pack(size)
    head = length + _FOOTER.pack(mask_crc(_crc32c(length)))
    if len(_HEADS) >= _HEADS_KEPT:
        _HEADS.clear()
    _HEADS[size] = head
    return head


@dataclasses.dataclass(frozen=True)
class FileDigest:
    """What a TFRecord file holds, as written or as read back.

    Attributes:
      records: number of records.
      bytes: size of the file on storage (compressed size for gzip).
      crc32c: CRC-32C of the whole file, 8 lower-case hex digits.
      sha256: SHA-256 of the whole file, 64 lower-case hex digits.
    """

    records: int
    bytes: int
    crc32c: str
    sha256: str


class _Digests:
    """Running size, CRC-32C and SHA-256 of the bytes of a file, in order."""

    def __init__(self):
        self._crc = google_crc32c.Checksum()
        self._sha = hashlib.sha256()
        self.bytes = 0

    def update(self, data: bytes) -> None:
        self._crc.update(data)
        self._sha.update(data)
        self.bytes += len(data)

    def digests(self) -> tuple[str, str]:
        return self._crc.hexdigest().decode("ascii"), self._sha.hexdigest()


class _HashingWriter(io.RawIOBase, _Digests):
    """A write-only stream that forwards to ``sink`` and hashes what passes."""

    def __init__(self, sink: BinaryIO):
        io.RawIOBase.__init__(self)
        _Digests.__init__(self)
        self._sink = sink

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self._sink.write(data)
        self.update(data)
        return len(data)


class _InOrder:
    """Writes blocks to a stream on a thread of its own, in order, at most
    ``_IN_FLIGHT`` behind the caller: the compression, the digests and the write
    (zlib, hashlib and file writes release the GIL) run beside the caller's own
    work. A failed write raises in the caller at its next ``write`` or ``wait``."""

    def __init__(self, out):
        self._out = out
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shard-digest")
        self._inflight: collections.deque = collections.deque()

    def write(self, data: bytes) -> None:
        while len(self._inflight) >= _IN_FLIGHT:
            self._inflight.popleft().result()
        self._inflight.append(self._pool.submit(self._out.write, data))

    def wait(self) -> None:
        """Returns once every block is written (raising the first write's error)."""
        try:
            while self._inflight:
                self._inflight[0].result()
                self._inflight.popleft()
        finally:
            if not self._inflight:
                self._pool.shutdown(wait=True)

    def stop(self) -> None:
        """Waits for the blocks in flight, whatever their outcome (before the stream closes)."""
        self._pool.shutdown(wait=True)
        self._inflight.clear()


class TFRecordWriter:
    """Writes framed records to a binary stream and digests the bytes written.

    The writer does not own ``sink``: ``close()`` flushes everything (including the
    gzip trailer) and returns the digest, and the caller closes ``sink``.

    Args:
      sink: a binary stream opened for writing (a local file, or a Beam
        ``FileSystems.create`` handle).
      compression: ``'none'`` or ``'gzip'``. Gzip output carries no file name and
        a zero timestamp, so equal input gives equal bytes.
      observe: called with the framed records' bytes, in order, before any
        compression (``codec.record_index.RecordIndex.feed`` builds the index file).
      background: compress, digest and write large blocks on a thread of the
        writer's own while the caller goes on; the caller must then call
        ``stop()`` before it closes ``sink`` on a path that skips ``close()``.
    """

    def __init__(self, sink: BinaryIO, compression: str = "none",
                 observe: Callable[[bytes], None] | None = None, background: bool = False):
        check_compression(compression)
        self._observe = observe
        self._background = background
        self._thread: _InOrder | None = None
        self._hashing = _HashingWriter(sink)
        self._records = 0
        self._closed = False
        if compression == "gzip":
            self._out = gzip.GzipFile(
                filename="", mode="wb", fileobj=self._hashing, mtime=0, compresslevel=6
            )
        else:
            self._out = self._hashing
        # Small records are batched into one write to keep per-record overhead low.
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    @property
    def records(self) -> int:
        """Records written so far."""
        return self._records

    def write(self, data: bytes) -> int:
        """Frames and writes one record; returns the framed size in bytes."""
        if self._closed:
            raise ValueError("write() on a closed TFRecordWriter")
        framed = frame_record(data)
        if self._observe is not None:
            self._observe(framed)
        self._records += 1
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        if self._pending_bytes >= _READ_CHUNK:
            self._flush_pending()
        return len(framed)

    def write_framed(self, framed: bytes, records: int = 1) -> None:
        """Writes ``records`` records that are already framed (see ``frame_record``)
        and concatenated."""
        if self._closed:
            raise ValueError("write_framed() on a closed TFRecordWriter")
        if self._observe is not None:
            self._observe(framed)
        self._records += records
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        if self._pending_bytes >= _READ_CHUNK:
            self._flush_pending()

    def _flush_pending(self, last: bool = False) -> None:
        if self._pending:
            block = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
            if self._background and self._thread is None and not last:
                self._thread = _InOrder(self._out)  # Once a shard has more than one block.
            (self._thread or self._out).write(block)
            self._pending = []
            self._pending_bytes = 0

    def stop(self) -> None:
        """Waits for blocks written in the background, whatever their outcome; for a
        caller that drops the stream after an error, before it closes ``sink``."""
        if self._thread is not None:
            self._thread.stop()

    def close(self) -> FileDigest:
        """Flushes all output and returns the digest of the bytes written."""
        if not self._closed:
            self._flush_pending(last=True)
            if self._thread is not None:
                self._thread.wait()
                self._thread = None
            if self._out is not self._hashing:
                self._out.close()  # Writes the gzip trailer; leaves the sink open.
            self._closed = True
        crc, sha = self._hashing.digests()
        return FileDigest(records=self._records, bytes=self._hashing.bytes, crc32c=crc, sha256=sha)


class ObservingReader(io.RawIOBase):
    """A read-only stream that passes ``source`` through and shows ``observe`` every
    piece of bytes read, in order (to hash or count what a parser consumes)."""

    def __init__(self, source: BinaryIO, observe):
        super().__init__()
        self._source = source
        self._observe = observe

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._source.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        if n:
            self._observe(data)
        return n

    def read(self, size: int = -1) -> bytes:
        """What ``readinto`` gives, without copying the bytes through a buffer."""
        data = self._source.read(size)
        if data:
            self._observe(data)
        return data

    def drain(self) -> None:
        """Reads whatever the consumer left unread in ``source``, observing it too."""
        while data := self._source.read(_READ_CHUNK):
            self._observe(data)


class _HashingReader(ObservingReader, _Digests):
    """A read-only stream that hashes every byte read from ``source``."""

    def __init__(self, source: BinaryIO):
        _Digests.__init__(self)
        ObservingReader.__init__(self, source, self.update)


def iter_records(stream: BinaryIO, check_crc: bool = True, size: int | None = None,
                 max_record: int | None = None) -> Iterator[bytes]:
    """Yields the records of an uncompressed TFRecord stream, one at a time.

    A record longer than ``RECORD_PIECE`` is read in pieces, so a length field
    that claims more than the stream holds costs no more memory than the stream
    has before it fails as truncated.

    Args:
      stream: a binary stream positioned at the start of a record.
      check_crc: verify both CRCs of every record.
      size: the stream's length in bytes, when known (a plain file's size): a
        record that claims more than is left fails before anything is read.
      max_record: refuse (``too_large``) a record whose length field claims more
        data bytes than this, before reading it.

    Yields:
      The data of each record.

    Raises:
      RecordError: on a truncated record, a CRC mismatch or a record over
        ``max_record``; it names the record index and the byte offset of the
        record's start.
    """
    index = 0
    offset = 0
    read = stream.read
    while True:
        header = read(12)
        if not header:
            return
        if len(header) < 12:
            raise RecordError(
                "truncated", index, offset, f"stream ends inside the 12-byte header ({len(header)} bytes)"
            )
        length, length_crc = _HEADER.unpack(header)
        if check_crc and masked_crc32c(header[:8]) != length_crc:
            raise RecordError("length_crc", index, offset, "length CRC mismatch (corrupt length field)")
        if size is not None and length + 4 > size - offset - 12:
            raise ends_inside(index, offset, length, max(0, size - offset - 12))
        if max_record is not None and length > max_record:
            raise RecordError("too_large", index, offset,
                              f"the record claims {length:,} bytes, more than the {max_record:,} "
                              "read here")
        if length + 4 <= RECORD_PIECE:
            body = read(length + 4)
            if len(body) < length + 4:
                raise ends_inside(index, offset, length, len(body))
            data = body[:length]
            crc = _FOOTER.unpack_from(body, length)[0]
            if check_crc and masked_crc32c(data) != crc:
                raise RecordError("data_crc", index, offset, "data CRC mismatch (corrupt record data)")
        else:
            data, crc, computed = _read_long(read, index, offset, length)
            if check_crc and mask_crc(computed) != crc:
                raise RecordError("data_crc", index, offset, "data CRC mismatch (corrupt record data)")
        yield data
        index += 1
        offset += length + RECORD_OVERHEAD


def _read_long(read, index: int, offset: int, length: int) -> tuple[bytes, int, int]:
    """A long record's data (read in pieces of ``RECORD_PIECE``), its stored CRC
    and the CRC-32C computed over the pieces."""
    pieces, got, crc = [], 0, 0
    while got < length:
        piece = read(min(RECORD_PIECE, length - got))
        if not piece:
            raise ends_inside(index, offset, length, got)
        crc = _crc32c_extend(crc, piece)
        pieces.append(piece)
        got += len(piece)
    footer = read_exact(read, 4)
    if len(footer) < 4:
        raise ends_inside(index, offset, length, got + len(footer))
    return b"".join(pieces), _FOOTER.unpack(footer)[0], crc


def scan_stream(source: BinaryIO, compression: str = "none",
                observe: Callable[[bytes], None] | None = None) -> FileDigest:
    """Reads a whole TFRecord file, checking every record, and digests its bytes.

    One linear pass holding at most about ``SCAN_MEMORY_BYTES`` whatever the
    file's length fields claim: records are checked in place in blocks of 1 MB,
    and a record longer than that is streamed through the CRC in pieces. A plain
    file's record that claims more bytes than are left fails before it is read.

    Args:
      source: a binary stream of the file as stored (compressed bytes for gzip).
      compression: ``'none'`` or ``'gzip'``.
      observe: for ``'none'``, called with every piece of bytes read, in order
        (``codec.record_index.RecordIndex.feed``: the index of the file as stored).

    Returns:
      The record count and the size, CRC-32C and SHA-256 of the stored bytes.

    Raises:
      RecordError: on the first faulty record (for gzip, offsets are in the
        decompressed stream).
      OSError, EOFError: when a gzip stream is corrupt or truncated.
    """
    check_compression(compression)
    if compression == "none":
        return _scan_plain(source, observe)
    hashing = _HashingReader(source)
    buffered = io.BufferedReader(hashing, buffer_size=_READ_CHUNK)
    with gzip.GzipFile(fileobj=buffered, mode="rb") as stream:
        records = scan_range(stream.read, None)
    hashing.drain()
    crc, sha = hashing.digests()
    return FileDigest(records=records, bytes=hashing.bytes, crc32c=crc, sha256=sha)


def stream_size(source: BinaryIO) -> int | None:
    """Bytes left in a stored file's stream (its size from its descriptor, or by
    seeking), ``None`` when it cannot be known without reading. For the stored
    bytes only: a ``GzipFile`` would decompress everything to seek to its end."""
    try:
        info = os.fstat(source.fileno())
        if stat.S_ISREG(info.st_mode):
            return max(0, info.st_size - source.tell())
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        pass
    try:
        if not source.seekable():
            return None
        here = source.tell()
        end = source.seek(0, io.SEEK_END)
        source.seek(here)
        return end - here
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _scan_plain(source: BinaryIO, observe: Callable[[bytes], None] | None = None) -> FileDigest:
    """``scan_stream`` of an uncompressed file: every byte read is digested (and observed)."""
    digests = _Digests()
    both = digests.update
    if observe is not None:
        def both(data: bytes) -> None:
            digests.update(data)
            observe(data)
    records = scan_range(source.read, stream_size(source), observe=both)
    crc, sha = digests.digests()
    return FileDigest(records=records, bytes=digests.bytes, crc32c=crc, sha256=sha)


def digest_stream(source: BinaryIO) -> tuple[int, str, str]:
    """``(bytes, crc32c, sha256)`` of a whole stream, read in large blocks."""
    hashing = _HashingReader(source)
    hashing.drain()
    crc, sha = hashing.digests()
    return hashing.bytes, crc, sha
