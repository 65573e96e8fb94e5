"""Where each record of a TFRecord shard starts: from its index file, or from its framing.

A map-style reader (``beam_tfrecords.DataSource``) reads record ``i`` of a shard at
its byte offset. The offsets come from the shard's index file when the manifest
lists one (one line per record, ``"{offset} {length}\\n"``: the offset of the
record's first byte and the length of the whole framed record, 16 bytes of framing
included; DALI's ``tfrecord2idx`` format), else from one pass over the shard's
framing (``FramingScanner``: each record's 12-byte header, its length CRC checked,
the data skipped). Pure: bytes in, offsets out, no I/O.

A record read at an offset is checked whole by ``unframe``: both CRCs, and that
its length field says what the offsets say.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

import google_crc32c
import numpy as np

from beam_tfrecords.transforms.codec.tfrecord import CHECKPOINT_BYTES, RECORD_OVERHEAD, RecordError, mask_crc

__all__ = ["FramingScanner", "RecordOffsets", "checkpoints", "parse_index", "unframe"]

_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


@dataclasses.dataclass(frozen=True)
class RecordOffsets:
    """Where a shard's records are: ``starts[i]`` is record ``i``'s first byte,
    ``lengths[i]`` its framed length (data + 16)."""

    starts: np.ndarray
    lengths: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


def parse_index(data: bytes, shard_bytes: int, records: int) -> RecordOffsets:
    """The offsets an index file gives, checked against the shard they index: one
    line per record, in order, back to back from byte 0 to the shard's end.

    Args:
      data: the index file's bytes.
      shard_bytes: the shard's size, as the manifest lists it.
      records: the shard's record count, as the manifest lists it.

    Raises:
      ValueError: when a line is not two whole numbers, or the offsets do not tile
        the shard (saying which line).
    """
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if len(lines) != records:
        raise ValueError(f"it has {len(lines)} lines for the {records} records of its shard")
    try:
        table = np.array([line.split(b" ") for line in lines], dtype=np.int64).reshape(records, 2)
    except ValueError:
        raise ValueError("a line is not two whole numbers 'offset length'") from None
    starts, lengths = table[:, 0].copy(), table[:, 1].copy()
    ends = starts + lengths
    expected = np.concatenate(([0], ends[:-1])) if records else starts
    wrong = np.flatnonzero((starts != expected) | (lengths < RECORD_OVERHEAD))
    if len(wrong):
        raise ValueError(f"line {int(wrong[0]) + 1} does not follow the record before it")
    if records and int(ends[-1]) != shard_bytes:
        raise ValueError(f"its records end at byte {int(ends[-1])}, the shard at {shard_bytes}")
    return RecordOffsets(starts, lengths)


class FramingScanner:
    """Finds the records of an uncompressed shard from its bytes, fed in order in
    blocks of any size: each header's length CRC is checked, the data is skipped.

    Usage: ``scanner.feed(block)`` for every block, then ``scanner.finish()``.
    """

    def __init__(self):
        self._starts: list[int] = []
        self._lengths: list[int] = []
        self._next = 0  # Offset of the next record's header in the stream.
        self._seen = 0  # Bytes fed so far.
        self._head = b""  # A header split between two blocks.

    def feed(self, block: bytes) -> None:
        """Takes the next ``len(block)`` bytes of the shard.

        Raises:
          RecordError: a header whose length CRC does not hold.
        """
        base = self._seen
        self._seen += len(block)
        while self._next < self._seen:
            at = self._next - base
            if self._head or at + 12 > len(block):
                self._head += block[max(at, 0):max(at, 0) + 12 - len(self._head)]
                if len(self._head) < 12:
                    return
                header, self._head = self._head, b""
            else:
                header = block[at:at + 12]
            length, length_crc = _HEADER.unpack(header)
            if mask_crc(google_crc32c.value(header[:8])) != length_crc:
                raise RecordError("length_crc", len(self._starts), self._next,
                                  "length CRC mismatch (corrupt length field)")
            self._starts.append(self._next)
            self._lengths.append(length + RECORD_OVERHEAD)
            self._next += length + RECORD_OVERHEAD

    def finish(self) -> RecordOffsets:
        """The records found, once every byte was fed.

        Raises:
          RecordError: when the shard ends inside a record.
        """
        if self._head or self._next != self._seen:
            index = len(self._starts) - (0 if self._head else 1)
            start = self._next if self._head else self._starts[-1]
            raise RecordError("truncated", index, start, "the shard ends inside this record")
        return RecordOffsets(np.array(self._starts, dtype=np.int64),
                             np.array(self._lengths, dtype=np.int64))


def unframe(framed: bytes, index: int, offset: int) -> bytes:
    """The data of one framed record read at its offset, both CRCs checked.

    Raises:
      RecordError: naming ``index`` and ``offset``, when the length field or a CRC
        does not hold.
    """
    if len(framed) < RECORD_OVERHEAD:
        raise RecordError("truncated", index, offset, f"only {len(framed)} bytes at its offset")
    length, length_crc = _HEADER.unpack_from(framed)
    if mask_crc(google_crc32c.value(framed[:8])) != length_crc:
        raise RecordError("length_crc", index, offset, "length CRC mismatch (corrupt length field)")
    if length + RECORD_OVERHEAD != len(framed):
        raise RecordError("length_crc", index, offset,
                          f"its length field says {length} bytes of data, the offsets "
                          f"{len(framed) - RECORD_OVERHEAD}")
    data = framed[12:12 + length]
    if mask_crc(google_crc32c.value(data)) != _FOOTER.unpack_from(framed, 12 + length)[0]:
        raise RecordError("data_crc", index, offset, "data CRC mismatch (corrupt record data)")
    return data


def checkpoints(sizes: Sequence[int], every: int = CHECKPOINT_BYTES) -> tuple[tuple[int, int], ...]:
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
