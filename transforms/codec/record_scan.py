"""TFRecord records checked in place: the scanner that ``codec.tfrecord``'s readers
and the verification of shards run.

A block of whole records is checked without copying records out
(``scan_records``); a file or a byte range of one is checked a block at a time
(``scan_range``), the record a block ends inside completed from the next block's
first bytes, a record longer than a block streamed through the CRC in pieces
(``RECORD_PIECE`` bytes at most): no read is sized by a length field alone. Every
fault names the record's index and byte offset (``RecordError``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import google_crc32c

__all__ = ["CRC_FIELD", "HEADER_FIELDS", "LENGTH_FIELD", "RECORD_OVERHEAD", "RECORD_PIECE", "RecordError",
           "ends_inside", "mask_crc", "read_exact", "scan_range", "scan_records"]

RECORD_OVERHEAD = 16  # 8-byte length + 4-byte length CRC + 4-byte data CRC.
# A record longer than this is read in pieces of this size, its CRC computed piece by
# piece: no read is sized by a length field alone.
RECORD_PIECE = 1 << 20
_SCAN_BLOCK = 1 << 20
# Bytes past a record's header taken to complete it when the header itself straddles two blocks.
_STRADDLE_GUESS = 64 << 10
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
# A record's length field; its length field and that field's masked CRC; a masked CRC.
LENGTH_FIELD, HEADER_FIELDS, CRC_FIELD = struct.Struct("<Q"), struct.Struct("<QI"), struct.Struct("<I")
_LENGTH, _HEADER, _FOOTER = LENGTH_FIELD, HEADER_FIELDS, CRC_FIELD
_crc32c_extend = google_crc32c.extend


class RecordError(ValueError):
    """A fault in a TFRecord stream.

    Attributes:
      kind: ``'truncated'``, ``'length_crc'``, ``'data_crc'`` or ``'too_large'``
        (a record longer than a reader's ``max_record``).
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


def ends_inside(index: int, offset: int, length: int, present: int) -> RecordError:
    """The fault of a stream that ends ``present`` bytes into a record's data and CRC."""
    return RecordError("truncated", index, offset,
                       f"stream ends inside the record: {length + 4} bytes of data and CRC "
                       f"expected, {present} present")


def read_exact(read, n: int) -> bytes:
    """Up to ``n`` bytes: fewer only at the end of the stream."""
    data = read(n)
    if len(data) == n or not data:
        return data
    parts = [data]
    got = len(data)
    while got < n and (more := read(n - got)):
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def mask_crc(crc: int) -> int:
    """TFRecord's mask of a CRC-32C: ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` mod 2**32."""
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def scan_records(data: bytes, first_index: int = 0, base_offset: int = 0,
                 offsets: list[int] | None = None) -> int:
    """Checks every record of a block that starts and ends at record boundaries.

    The same checks as ``iter_records`` over bytes already in memory, without
    copying records out; a shard can be checked in pieces, in parallel, when its
    record boundaries at a few offsets are known.

    Args:
      data: whole records, back to back.
      first_index, base_offset: the first record's index and byte offset in its
        file, for error messages.
      offsets: where each record checked starts in ``data`` is appended to it (for
        an index of the block: ``codec.record_index.index_lines``).

    Returns:
      The number of records.

    Raises:
      RecordError: naming the index and file offset of the first faulty record;
        a block that ends inside a record is ``truncated``.
    """
    return _scan_block(data, first_index, base_offset, final=True, offsets=offsets)[0]


def _scan_block(data: bytes, first_index: int, base_offset: int, final: bool,
                offsets: list[int] | None = None, begin: int = 0) -> tuple[int, int]:
    """``scan_records`` of ``data`` from ``begin`` on (``base_offset``: the file offset
    of ``data[0]``); unless ``final``, a record the block ends inside is left for the
    next block (once its length field is proved). Returns ``(records, offset in
    data where checking stopped)``."""
    unpack, value, end = _HEADER.unpack_from, google_crc32c.value, len(data)
    footer = _FOOTER.unpack_from
    # A length field's CRC depends on the length alone: one proved for a length is
    # the one every record of that length must store (small records repeat lengths).
    proved: dict[int, int] = {}
    offset, index = begin, 0
    try:
        while offset < end:
            if not final and end - offset < 12:
                break
            length, length_crc = unpack(data, offset)
            if proved.get(length) != length_crc:
                # mask_crc, inline (a call a check was a quarter of the scan's time on small records).
                crc = value(data[offset:offset + 8])
                if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32 != length_crc:
                    raise RecordError("length_crc", first_index + index, base_offset + offset,
                                      "length CRC mismatch (corrupt length field)")
                proved[length] = length_crc
            start = offset + 12
            if start + length + 4 > end:
                if not final:
                    break
                raise RecordError("truncated", first_index + index, start - 12 + base_offset,
                                  f"stream ends inside the record: {length + 4} bytes of data "
                                  f"and CRC expected, {end - start} present")
            next_offset = start + length + 4
            crc = value(data[start:next_offset - 4])
            if (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32 != footer(data, next_offset - 4)[0]:
                raise RecordError("data_crc", first_index + index, start - 12 + base_offset,
                                  "data CRC mismatch (corrupt record data)")
            if offsets is not None:
                offsets.append(offset)
            offset = next_offset
            index += 1
    except struct.error:  # Fewer than 12 bytes left for a header.
        raise RecordError("truncated", first_index + index, base_offset + offset,
                          f"stream ends inside the 12-byte header ({end - offset} bytes)") from None
    return index, offset


def scan_range(read: Callable[[int], bytes], size: int | None, first_index: int = 0, base_offset: int = 0,
               offsets: list[int] | None = None, observe: Callable[[bytes], None] | None = None) -> int:
    """``scan_records`` of the bytes ``read(n)`` returns a block at a time (at most
    ``n`` a call, ``b""`` at their end), in one linear pass holding a block or two.

    Each block is checked in place (``_scan_block``); the record a block ends inside
    is completed from the next block's first bytes, or, when it does not end in the
    next block, streamed through the CRC piece by piece (``_stream_record``): no
    byte is copied more than a few times and no read is sized by a length field alone.

    Args:
      read: returns the next bytes, ``b""`` past their end.
      size: their length when known: a record claiming more than is left fails at once.
      first_index, base_offset: the first record's index and byte offset in its
        file, for error messages.
      offsets: where each record starts (from the first byte read) is appended to it.
      observe: called with every piece of bytes read, in order (or ``None``).

    Returns:
      The number of records.

    Raises:
      RecordError: as ``scan_records``.
    """
    records = 0
    carried = b""
    offset = 0  # Stream offset of the first byte not checked (carried[0] when there is one).
    starts: list[int] | None = [] if offsets is not None else None
    while block := read(_SCAN_BLOCK):
        if observe:
            observe(block)
        data, base, begin = block, offset, 0  # base: the stream offset of data[0].
        if carried:
            # The record the last block ended inside, completed from this block's first
            # bytes: a record's worth joined, not the whole block copied behind it.
            head = carried + block[:_straddle(carried, len(block))]
            count, used = _scan_block(head, first_index + records, base_offset + offset, final=False,
                                      offsets=starts)
            if used:  # It ended there (the records that fit with it are checked too).
                records += count
                begin = used - len(carried)
                base = offset + len(carried)
            else:  # Its length field ended there, not the record: the block joined whole.
                data = carried + block
            if starts:
                offsets.extend(map(offset.__add__, starts))
                starts.clear()
        count, used = _scan_block(data, first_index + records, base_offset + base, final=False, offsets=starts,
                                  begin=begin)
        if starts:
            offsets.extend(map(base.__add__, starts))
            starts.clear()
        records += count
        offset = base + used
        left = len(data) - used
        if left >= 12:  # The next record's length field is whole and proved.
            length = _LENGTH.unpack_from(data, used)[0]
            if size is not None and length + 4 > size - offset - 12:
                raise ends_inside(first_index + records, base_offset + offset, length, size - offset - 12)
            if length + 16 - left > _SCAN_BLOCK:  # It does not end in the next block.
                _stream_record(read, observe, data[used + 12:], length, first_index + records,
                               base_offset + offset)
                if offsets is not None:
                    offsets.append(offset)
                records += 1
                offset += length + RECORD_OVERHEAD
                carried = b""
                continue
        carried = data[used:] if left else b""
    if carried:  # Raises: the file ends inside a record.
        _scan_block(carried, first_index + records, base_offset + offset, final=True)
    return records


def _straddle(carried: bytes, available: int) -> int:
    """How many bytes of the next block complete the record ``carried`` starts (at
    most ``available``; when ``carried`` holds less than its 12-byte header, enough
    for the header and ``_STRADDLE_GUESS`` bytes more). The length field sizes a
    slice of bytes already read, so it needs no proof here."""
    if len(carried) >= 12:
        return min(available, _LENGTH.unpack_from(carried)[0] + RECORD_OVERHEAD - len(carried))
    return min(available, 12 - len(carried) + _STRADDLE_GUESS)


def _stream_record(read, observe, head: bytes, length: int, index: int, offset: int) -> None:
    """Checks a long record's data CRC without holding it: ``head`` is what of its
    data was read already (less than ``length``); the rest is read in pieces."""
    crc = _crc32c_extend(0, head)
    got = len(head)
    while got < length:
        piece = read(min(RECORD_PIECE, length - got))
        if not piece:
            raise ends_inside(index, offset, length, got)
        if observe:
            observe(piece)
        crc = _crc32c_extend(crc, piece)
        got += len(piece)
    footer = read_exact(read, 4)
    if observe and footer:
        observe(footer)
    if len(footer) < 4:
        raise ends_inside(index, offset, length, got + len(footer))
    if mask_crc(crc) != _FOOTER.unpack(footer)[0]:
        raise RecordError("data_crc", index, offset, "data CRC mismatch (corrupt record data)")
