"""A shard's index file: one line per record, ``"{offset} {length}\\n"``.

The format DALI's ``tfrecord2idx`` and the ``tfrecord`` package's
``tfrecord.tools.tfrecord2idx.create_index`` write, byte for byte: the offset of
each record's first byte and the length of the whole framed record (8-byte
length, 4-byte length CRC, the data, 4-byte data CRC), in ASCII decimal, one
record a line, in file order. With it, DALI reads a shard at any record and the
``tfrecord`` package gives each of N workers its own share of the records.

``RecordIndex`` builds it from the bytes of a stream as they pass (what the
writer writes, or what the verifier reads back: the same code over other bytes);
``first_index_fault`` says which line of an index file does not match its shard.
Gzip shards have none: a compressed stream cannot be read at an offset.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import BinaryIO

import google_crc32c
import numpy as np

from beam_tfrecords.transforms.codec.tfrecord import RECORD_OVERHEAD, FileDigest, RecordError

__all__ = ["RecordIndex", "first_index_fault", "index_lines"]

_LENGTH = struct.Struct("<Q")


class RecordIndex:
    """A TFRecord stream's index file, built from the stream's bytes as they pass.

    One line per record, ``"{offset} {length}\\n"`` in ASCII decimal: the offset of
    the record's first byte and the length of the whole framed record (12 bytes of
    header, the data, 4 bytes of footer). This is the format DALI's
    ``tfrecord2idx`` and the ``tfrecord`` package's ``create_index`` write, byte
    for byte. The offsets come from the length fields of the bytes fed, in order,
    so the same class indexes what a writer writes and what a verifier reads back.

    Args:
      sink: where the index's bytes go (a binary stream); ``None`` to digest them only.
    """

    def __init__(self, sink: BinaryIO | None = None):
        self._sink = sink
        self._sha = hashlib.sha256()
        self._crc = google_crc32c.Checksum()
        self._bytes = 0
        self._next = 0  # Stream offset of the next record's header.
        self._seen = 0  # Bytes fed so far.
        self._head = b""  # The start of a length field cut between two pieces.
        self._last = 0  # Offset of the last record seen.
        self.records = 0

    def feed(self, data: bytes) -> None:
        """Takes the next bytes of the (uncompressed) stream."""
        start = self._seen
        self._seen += len(data)
        text = ""
        if self._head:
            self._head += data[:8 - len(self._head)]
            if len(self._head) < 8:
                return
            length = _LENGTH.unpack(self._head)[0] + RECORD_OVERHEAD
            text = f"{self._next} {length}\n"
            self.records += 1
            self._last = self._next
            self._next += length
            self._head = b""
        # One step per record (where its header says the next starts); the lines are
        # then made of the offsets in bulk, by one format of all of them.
        unpack, end, overhead = _LENGTH.unpack_from, len(data), RECORD_OVERHEAD
        position = self._next - start
        offsets: list[int] = []
        note = offsets.append
        while position + 8 <= end:
            note(position)
            position += unpack(data, position)[0] + overhead
        if offsets:
            count = len(offsets)
            text += index_lines(offsets, position, start)
            self.records += count
            self._last = start + offsets[-1]
            self._next = start + position
        if 0 <= position < end:
            self._head = bytes(data[position:])
        if text:
            data = text.encode("ascii")
            self._sha.update(data)
            self._crc.update(data)
            self._bytes += len(data)
            if self._sink is not None:
                self._sink.write(data)

    def add_lines(self, text: bytes, records: int, end: int) -> None:
        """Takes the index lines of the next ``records`` records, made elsewhere from
        the same stream (``index_lines``), which end at stream offset ``end``; in
        place of ``feed`` of their bytes."""
        if self._head or self._next != self._seen:
            raise ValueError("index lines can follow whole records only")
        self._sha.update(text)
        self._crc.update(text)
        self._bytes += len(text)
        if self._sink is not None:
            self._sink.write(text)
        self.records += records
        self._next = self._seen = end

    def finish(self) -> FileDigest:
        """The index's digest (records, bytes, CRC-32C, SHA-256).

        Raises:
          RecordError: the stream fed does not end at a record boundary.
        """
        if self._head or self._next != self._seen:
            cut = self._head or self.records == 0
            raise RecordError("truncated", self.records if cut else self.records - 1,
                              self._next if cut else self._last,
                              f"the stream ends inside a record's header ({self._seen} bytes)" if cut
                              else f"the stream ends inside a record ({self._seen} bytes; the record "
                              f"ends at byte {self._next})")
        return FileDigest(records=self.records, bytes=self._bytes,
                          crc32c=self._crc.hexdigest().decode("ascii"), sha256=self._sha.hexdigest())




def index_lines(offsets: Sequence[int], end: int, base: int = 0) -> str:
    """The index lines of records starting at ``offsets`` (in order) whose last one
    ends at ``end``, every offset moved by ``base``: made by one format call."""
    count = len(offsets)
    if not count:
        return ""
    bounds = np.array([*offsets, end], dtype=np.int64)
    bounds += base
    pairs = np.empty(2 * count, dtype=np.int64)
    pairs[0::2] = bounds[:-1]
    pairs[1::2] = np.diff(bounds)
    return ("%d %d\n" * count) % tuple(pairs.tolist())


def first_index_fault(shard: BinaryIO, index: BinaryIO) -> str:
    """The first line of an index file that does not match its shard's framing, said
    in one line ('' when every line does and none is missing or left over).

    Each line must be ``"{offset} {length}\\n"`` where ``offset`` is where the
    shard's next record starts (0, then each record's end) and ``length`` that
    record's length field plus 16; one 8-byte read of the shard per line.

    Args:
      shard: the shard's uncompressed bytes, seekable.
      index: the index file's bytes.
    """
    offset = number = 0
    for number, line in enumerate(index, 1):
        shard.seek(offset)
        header = _read_header(shard)
        if len(header) < 8:
            shown = line[:40].decode("ascii", "replace").rstrip("\n")
            return (f"line {number} ({shown!r}) names a record past the shard's last one "
                    f"(which ends at byte {offset})")
        length = _LENGTH.unpack(header)[0] + RECORD_OVERHEAD
        if line != f"{offset} {length}\n".encode("ascii"):
            shown = line[:40].decode("ascii", "replace").rstrip("\n")
            return (f"line {number} reads {shown!r}, but the shard's record {number - 1} is "
                    f"'{offset} {length}' (offset, framed length)")
        offset += length
    shard.seek(offset)
    if shard.read(1):
        return f"it ends after {number} lines, but the shard holds a record at byte {offset}"
    return ""


def _read_header(shard: BinaryIO) -> bytes:
    """Up to 8 bytes of a record's length field: fewer only at the end of the shard."""
    data = shard.read(8)
    while 0 < len(data) < 8 and (more := shard.read(8 - len(data))):
        data += more
    return data
