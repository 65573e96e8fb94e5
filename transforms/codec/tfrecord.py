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
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import struct
from collections.abc import Iterator, Sequence
from typing import BinaryIO

import google_crc32c
import numpy as np

from beam_tfrecords.schemas.shards import check_compression

__all__ = [
    "RECORD_OVERHEAD",
    "FileDigest",
    "ObservingReader",
    "RecordError",
    "TFRecordWriter",
    "checkpoints",
    "frame_parts",
    "frame_record",
    "iter_records",
    "mask_crc",
    "masked_crc32c",
    "digest_stream",
    "scan_records",
    "scan_stream",
]

RECORD_OVERHEAD = 16  # 8-byte length + 4-byte length CRC + 4-byte data CRC.

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")
_READ_CHUNK = 1 << 20
_SCAN_BLOCK = 1 << 20
# frame_parts joins a record's pieces below this size.
_JOIN_BELOW = 64 << 10
_crc32c = google_crc32c.value
_crc32c_extend = google_crc32c.extend


def mask_crc(crc: int) -> int:
    """TFRecord's mask of a CRC-32C: ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` mod 2**32."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


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
    length = _LENGTH.pack(size)
    if size < _JOIN_BELOW:  # Small: one join and one CRC call cost less than a call per piece.
        data = b"".join(parts)
        return [length, _FOOTER.pack(mask_crc(_crc32c(length))), data, _FOOTER.pack(mask_crc(_crc32c(data)))]
    crc = 0
    for part in parts:
        crc = _crc32c_extend(crc, part)
    return [length, _FOOTER.pack(mask_crc(_crc32c(length))), *parts, _FOOTER.pack(mask_crc(crc))]


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


class TFRecordWriter:
    """Writes framed records to a binary stream and digests the bytes written.

    The writer does not own ``sink``: ``close()`` flushes everything (including the
    gzip trailer) and returns the digest, and the caller closes ``sink``.

    Args:
      sink: a binary stream opened for writing (a local file, or a Beam
        ``FileSystems.create`` handle).
      compression: ``'none'`` or ``'gzip'``. Gzip output carries no file name and
        a zero timestamp, so equal input gives equal bytes.
    """

    def __init__(self, sink: BinaryIO, compression: str = "none"):
        check_compression(compression)
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
        self._records += records
        self._pending.append(framed)
        self._pending_bytes += len(framed)
        if self._pending_bytes >= _READ_CHUNK:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if self._pending:
            self._out.write(b"".join(self._pending) if len(self._pending) > 1 else self._pending[0])
            self._pending = []
            self._pending_bytes = 0

    def close(self) -> FileDigest:
        """Flushes all output and returns the digest of the bytes written."""
        if not self._closed:
            self._flush_pending()
            if self._out is not self._hashing:
                self._out.close()  # Writes the gzip trailer; leaves the sink open.
            self._closed = True
        crc, sha = self._hashing.digests()
        return FileDigest(records=self._records, bytes=self._hashing.bytes, crc32c=crc, sha256=sha)


class RecordError(ValueError):
    """A fault in a TFRecord stream.

    Attributes:
      kind: ``'truncated'``, ``'length_crc'`` or ``'data_crc'``.
      index: 0-based index of the faulty record.
      offset: byte offset of the record's start in the (uncompressed) stream.
    """

    def __init__(self, kind: str, index: int, offset: int, detail: str):
        self.kind = kind
        self.index = index
        self.offset = offset
        self.detail = detail
        super().__init__(f"record {index} at byte offset {offset}: {detail}")

    def __reduce__(self):  # Crosses process boundaries whole (parallel verification).
        return RecordError, (self.kind, self.index, self.offset, self.detail)


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

    def drain(self) -> None:
        """Reads whatever the consumer left unread in ``source``, observing it too."""
        while data := self._source.read(_READ_CHUNK):
            self._observe(data)


class _HashingReader(ObservingReader, _Digests):
    """A read-only stream that hashes every byte read from ``source``."""

    def __init__(self, source: BinaryIO):
        _Digests.__init__(self)
        ObservingReader.__init__(self, source, self.update)


def iter_records(stream: BinaryIO, check_crc: bool = True) -> Iterator[bytes]:
    """Yields the records of an uncompressed TFRecord stream, one at a time.

    Args:
      stream: a binary stream positioned at the start of a record.
      check_crc: verify both CRCs of every record.

    Yields:
      The data of each record.

    Raises:
      RecordError: on a truncated record or a CRC mismatch; it names the record
        index and the byte offset of the record's start.
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
        body = read(length + 4)
        if len(body) < length + 4:
            raise RecordError(
                "truncated",
                index,
                offset,
                f"stream ends inside the record: {length + 4} bytes of data and CRC expected, "
                f"{len(body)} present",
            )
        data = body[:length]
        if check_crc and masked_crc32c(data) != _FOOTER.unpack_from(body, length)[0]:
            raise RecordError("data_crc", index, offset, "data CRC mismatch (corrupt record data)")
        yield data
        index += 1
        offset += length + RECORD_OVERHEAD


def scan_stream(source: BinaryIO, compression: str = "none") -> FileDigest:
    """Reads a whole TFRecord file, checking every record, and digests its bytes.

    Args:
      source: a binary stream of the file as stored (compressed bytes for gzip).
      compression: ``'none'`` or ``'gzip'``.

    Returns:
      The record count and the size, CRC-32C and SHA-256 of the stored bytes.

    Raises:
      RecordError: on the first faulty record (for gzip, offsets are in the
        decompressed stream).
      OSError, EOFError: when a gzip stream is corrupt or truncated.
    """
    check_compression(compression)
    if compression == "none":
        return _scan_plain(source)
    hashing = _HashingReader(source)
    buffered = io.BufferedReader(hashing, buffer_size=_READ_CHUNK)
    stream: BinaryIO = gzip.GzipFile(fileobj=buffered, mode="rb") if compression == "gzip" else buffered
    records = 0
    for _ in iter_records(stream):
        records += 1
    hashing.drain()
    crc, sha = hashing.digests()
    return FileDigest(records=records, bytes=hashing.bytes, crc32c=crc, sha256=sha)


def scan_records(data: bytes, first_index: int = 0, base_offset: int = 0) -> int:
    """Checks every record of a block that starts and ends at record boundaries.

    The same checks as ``iter_records`` over bytes already in memory, without
    copying records out; a shard can be checked in pieces, in parallel, when its
    record boundaries at a few offsets are known.

    Args:
      data: whole records, back to back.
      first_index, base_offset: the first record's index and byte offset in its
        file, for error messages.

    Returns:
      The number of records.

    Raises:
      RecordError: naming the index and file offset of the first faulty record;
        a block that ends inside a record is ``truncated``.
    """
    return _scan_block(data, first_index, base_offset, final=True)[0]


def _scan_block(data: bytes, first_index: int, base_offset: int, final: bool) -> tuple[int, int]:
    """``scan_records``; unless ``final``, a record the block ends inside is left
    for the next block (once its length field is proved). Returns ``(records,
    bytes checked)``."""
    unpack, value, end = _HEADER.unpack_from, google_crc32c.value, len(data)
    footer = _FOOTER.unpack_from
    offset = index = 0
    try:
        while offset < end:
            if not final and end - offset < 12:
                break
            length, length_crc = unpack(data, offset)
            if mask_crc(value(data[offset:offset + 8])) != length_crc:
                raise RecordError("length_crc", first_index + index, base_offset + offset,
                                  "length CRC mismatch (corrupt length field)")
            start = offset + 12
            if start + length + 4 > end:
                if not final:
                    break
                raise RecordError("truncated", first_index + index, start - 12 + base_offset,
                                  f"stream ends inside the record: {length + 4} bytes of data "
                                  f"and CRC expected, {end - start} present")
            next_offset = start + length + 4
            if mask_crc(value(data[start:next_offset - 4])) != footer(data, next_offset - 4)[0]:
                raise RecordError("data_crc", first_index + index, start - 12 + base_offset,
                                  "data CRC mismatch (corrupt record data)")
            offset = next_offset
            index += 1
    except struct.error:  # Fewer than 12 bytes left for a header.
        raise RecordError("truncated", first_index + index, base_offset + offset,
                          f"stream ends inside the 12-byte header ({end - offset} bytes)") from None
    return index, offset


def _scan_plain(source: BinaryIO) -> FileDigest:
    """``scan_stream`` of an uncompressed file in one pass of large reads: each
    block is digested and its whole records checked in place; the bytes of a
    record that spans blocks are carried into the next."""
    digests = _Digests()
    records = 0
    carried = b""
    offset = 0  # File offset of carried[0].
    while block := source.read(_SCAN_BLOCK):
        digests.update(block)
        data = carried + block if carried else block
        count, used = _scan_block(data, records, offset, final=False)
        records += count
        offset += used
        carried = data[used:] if used < len(data) else b""
    if carried:
        _scan_block(carried, records, offset, final=True)  # Raises: the file ends inside a record.
    crc, sha = digests.digests()
    return FileDigest(records=records, bytes=digests.bytes, crc32c=crc, sha256=sha)


def digest_stream(source: BinaryIO) -> tuple[int, str, str]:
    """``(bytes, crc32c, sha256)`` of a whole stream, read in large blocks."""
    hashing = _HashingReader(source)
    hashing.drain()
    crc, sha = hashing.digests()
    return hashing.bytes, crc, sha


def checkpoints(sizes: Sequence[int], every: int = 16 << 20) -> tuple[tuple[int, int], ...]:
    """Record boundaries about every ``every`` bytes: ``((offset, index), ...)``.

    ``sizes`` are framed record sizes in file order; the result leaves out the
    file's start and end. A verifier can check the pieces between boundaries in
    parallel (see ``scan_records``).
    """
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    if len(ends) < 2:
        return ()
    # The first record boundary at or after each multiple of ``every``.
    targets = np.arange(every, int(ends[-1]), every)
    after = np.unique(np.searchsorted(ends, targets))
    after = after[after < len(ends) - 1]
    return tuple((int(ends[i]), int(i) + 1) for i in after)
