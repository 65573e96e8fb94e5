"""Tests for transforms.codec.tfrecord: framing, the checksumming writer and the reader.

Golden bytes come from the TFRecord format itself (see the module docstring of
transforms.codec.tfrecord), computed with a bitwise CRC-32C written here, never from
google_crc32c or from our writer.
"""

import gzip
import hashlib
import io
import random
import struct

import pytest

from beam_tfrecords.schemas.shards import COMPRESSIONS, shard_suffix
from beam_tfrecords.transforms.codec.tfrecord import (
    RECORD_OVERHEAD,
    FileDigest,
    RecordError,
    TFRecordWriter,
    frame_record,
    iter_records,
    masked_crc32c,
    scan_stream,
)

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------
# Reference CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit.
# --------------------------------------------------------------------------


def ref_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def ref_masked(data: bytes) -> int:
    crc = ref_crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def ref_frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", ref_masked(length)) + data + struct.pack("<I", ref_masked(data))


# Golden framings, computed once with ref_frame and pasted here.
#   length (u64 LE) | masked crc of length (u32 LE) | data | masked crc of data (u32 LE)
GOLDEN_EMPTY = bytes.fromhex(
    "0000000000000000"  # length 0
    "29039807"  # masked crc32c of 8 zero bytes
    ""  # no data
    "d8ea82a2"  # masked crc32c(b"") = mask(0) = 0xa282ead8
)
GOLDEN_HELLO = bytes.fromhex(
    "0500000000000000"  # length 5
    "eab2043e"  # masked crc32c of the length field
    "68656c6c6f"  # b"hello"
    "bb1f1c19"  # masked crc32c(b"hello")
)
GOLDEN_HELLO_THEN_EMPTY = bytes.fromhex(
    "0500000000000000eab2043e68656c6c6fbb1f1c19"
    "000000000000000029039807d8ea82a2"
)


def test_reference_crc32c_check_value():
    assert ref_crc32c(b"123456789") == 0xE3069283
    assert ref_crc32c(b"") == 0


@pytest.mark.parametrize(
    "data",
    [b"", b"\x00", b"123456789", b"hello", bytes(range(256)), b"\xff" * 1000],
)
def test_masked_crc32c_matches_reference(data):
    assert masked_crc32c(data) == ref_masked(data)
    assert masked_crc32c(memoryview(data)) == ref_masked(data)


def test_mask_of_zero_crc_is_the_mask_delta():
    assert masked_crc32c(b"") == 0xA282EAD8


@pytest.mark.parametrize(
    "data, golden",
    [(b"", GOLDEN_EMPTY), (b"hello", GOLDEN_HELLO)],
    ids=["empty", "hello"],
)
def test_frame_record_golden(data, golden):
    assert ref_frame(data) == golden
    assert frame_record(data) == golden
    assert len(golden) == len(data) + RECORD_OVERHEAD


def test_two_record_golden_is_concatenation():
    assert ref_frame(b"hello") + ref_frame(b"") == GOLDEN_HELLO_THEN_EMPTY
    assert GOLDEN_HELLO + GOLDEN_EMPTY == GOLDEN_HELLO_THEN_EMPTY


@pytest.mark.parametrize("data", [b"x", b"a" * 300, bytes(range(256)) * 3])
def test_frame_record_matches_reference(data):
    assert frame_record(data) == ref_frame(data)


# --------------------------------------------------------------------------
# Writer
# --------------------------------------------------------------------------


def _write(records, compression="none", framed=False):
    sink = io.BytesIO()
    writer = TFRecordWriter(sink, compression)
    sizes = []
    for record in records:
        if framed:
            writer.write_framed(frame_record(record))
        else:
            sizes.append(writer.write(record))
    digest = writer.close()
    return sink.getvalue(), digest, sizes


def _expected_digest(stored: bytes, records: int) -> FileDigest:
    return FileDigest(
        records=records,
        bytes=len(stored),
        crc32c=f"{ref_crc32c(stored):08x}",
        sha256=hashlib.sha256(stored).hexdigest(),
    )


def test_writer_output_equals_golden():
    stored, digest, sizes = _write([b"hello", b""])
    assert stored == GOLDEN_HELLO_THEN_EMPTY
    assert sizes == [21, 16]
    assert digest == _expected_digest(GOLDEN_HELLO_THEN_EMPTY, 2)


def test_write_framed_equals_write():
    stored, digest, _ = _write([b"hello", b""], framed=True)
    assert stored == GOLDEN_HELLO_THEN_EMPTY
    assert digest.records == 2


def test_writer_with_no_records():
    stored, digest, _ = _write([])
    assert stored == b""
    assert digest == FileDigest(0, 0, "00000000", hashlib.sha256(b"").hexdigest())


def test_writer_does_not_close_sink_and_close_is_idempotent():
    sink = io.BytesIO()
    writer = TFRecordWriter(sink, "gzip")
    writer.write(b"abc")
    assert writer.records == 1
    first = writer.close()
    assert not sink.closed
    assert writer.close() == first
    with pytest.raises(ValueError, match=r"write\(\) on a closed TFRecordWriter"):
        writer.write(b"more")
    with pytest.raises(ValueError, match=r"write_framed\(\) on a closed TFRecordWriter"):
        writer.write_framed(frame_record(b"more"))


@pytest.mark.parametrize("compression", ["zlib", "", "GZIP", None])
def test_bad_compression_is_refused(compression):
    with pytest.raises(ValueError, match=r"compression must be one of \('none', 'gzip'\), got "):
        TFRecordWriter(io.BytesIO(), compression)
    with pytest.raises(ValueError, match=r"compression must be one of \('none', 'gzip'\), got "):
        scan_stream(io.BytesIO(b""), compression)
    with pytest.raises(ValueError, match=r"compression must be one of \('none', 'gzip'\), got "):
        shard_suffix(compression)


@pytest.mark.parametrize("compression, suffix", [("none", ".tfrecord"), ("gzip", ".tfrecord.gz")])
def test_shard_suffix(compression, suffix):
    assert compression in COMPRESSIONS
    assert shard_suffix(compression) == suffix


def test_gzip_writer_is_deterministic_and_decompresses_to_framing():
    records = [b"hello", b"", b"world" * 100]
    first, digest1, _ = _write(records, "gzip")
    second, digest2, _ = _write(records, "gzip")
    assert first == second
    assert digest1 == digest2
    assert first[:2] == b"\x1f\x8b"
    assert first[3] & 0x08 == 0  # FNAME flag unset: no file name stored.
    assert first[4:8] == b"\x00\x00\x00\x00"  # MTIME is zero.
    assert gzip.decompress(first) == b"".join(ref_frame(r) for r in records)
    assert digest1 == _expected_digest(first, 3)


def test_large_write_crosses_the_internal_batch_size():
    rng = random.Random(7)
    records = [rng.randbytes(rng.randrange(0, 400_000)) for _ in range(12)]
    expected = b"".join(frame_record(r) for r in records)
    for compression in COMPRESSIONS:
        stored, digest, sizes = _write(records, compression)
        plain = gzip.decompress(stored) if compression == "gzip" else stored
        assert plain == expected
        assert sizes == [len(r) + 16 for r in records]  # framed sizes, before compression
        assert digest.records == len(records)
        assert digest.bytes == len(stored)
        assert digest.sha256 == hashlib.sha256(stored).hexdigest()


# --------------------------------------------------------------------------
# Reader
# --------------------------------------------------------------------------

RECORDS = [b"first", b"", b"the third record", b"x" * 200, b"last"]


def _offset(k: int) -> int:
    return sum(16 + len(r) for r in RECORDS[:k])


def _stream() -> bytearray:
    return bytearray(b"".join(ref_frame(r) for r in RECORDS))


def _read_all(data: bytes, check_crc=True):
    return list(iter_records(io.BytesIO(bytes(data)), check_crc=check_crc))


def test_reader_reads_golden_and_written_streams():
    assert _read_all(GOLDEN_HELLO_THEN_EMPTY) == [b"hello", b""]
    assert _read_all(_stream()) == RECORDS


def test_reader_empty_stream_has_no_records():
    assert _read_all(b"") == []


@pytest.mark.parametrize("k", [k for k, r in enumerate(RECORDS) if r])
def test_flipped_data_byte_is_data_crc(k):
    data = _stream()
    data[_offset(k) + 12 + len(RECORDS[k]) // 2] ^= 0x01
    with pytest.raises(RecordError, match="data CRC mismatch") as err:
        _read_all(data)
    assert (err.value.kind, err.value.index, err.value.offset) == ("data_crc", k, _offset(k))
    assert f"record {k}" in str(err.value)
    assert str(_offset(k)) in str(err.value)
    # Without CRC checks the corrupt record is returned as is.
    assert len(_read_all(data, check_crc=False)) == len(RECORDS)


@pytest.mark.parametrize("k", range(len(RECORDS)))
def test_flipped_data_crc_byte_is_data_crc(k):
    data = _stream()
    data[_offset(k) + 12 + len(RECORDS[k])] ^= 0x80
    with pytest.raises(RecordError, match="data CRC mismatch") as err:
        _read_all(data)
    assert (err.value.kind, err.value.index, err.value.offset) == ("data_crc", k, _offset(k))


@pytest.mark.parametrize("k", range(len(RECORDS)))
@pytest.mark.parametrize("pos", [0, 3, 7, 8, 11], ids=lambda p: f"header_byte{p}")
def test_flipped_header_byte_is_length_crc(k, pos):
    data = _stream()
    data[_offset(k) + pos] ^= 0x04
    with pytest.raises(RecordError, match="length CRC mismatch") as err:
        _read_all(data)
    assert (err.value.kind, err.value.index, err.value.offset) == ("length_crc", k, _offset(k))


@pytest.mark.parametrize("k", range(len(RECORDS)))
def test_cut_inside_record_body_is_truncated(k):
    data = _stream()
    cut = _offset(k) + 12 + (len(RECORDS[k]) + 4) // 2
    with pytest.raises(RecordError, match="stream ends inside the record:") as err:
        _read_all(data[:cut])
    assert (err.value.kind, err.value.index, err.value.offset) == ("truncated", k, _offset(k))


@pytest.mark.parametrize("k", range(len(RECORDS)))
@pytest.mark.parametrize("into_header", [1, 8, 11])
def test_cut_inside_header_is_truncated(k, into_header):
    data = _stream()
    with pytest.raises(RecordError, match="stream ends inside the 12-byte header") as err:
        _read_all(data[: _offset(k) + into_header])
    assert (err.value.kind, err.value.index, err.value.offset) == ("truncated", k, _offset(k))


def test_cut_at_record_boundary_is_a_shorter_valid_stream():
    data = _stream()
    assert _read_all(data[: _offset(3)]) == RECORDS[:3]


def test_cut_in_last_crc_is_truncated():
    data = _stream()
    k = len(RECORDS) - 1
    with pytest.raises(RecordError, match="stream ends inside the record:") as err:
        _read_all(data[:-1])
    assert (err.value.kind, err.value.index) == ("truncated", k)


def test_record_error_is_a_value_error():
    err = RecordError("data_crc", 3, 120, "boom")
    assert isinstance(err, ValueError)
    assert (err.kind, err.index, err.offset) == ("data_crc", 3, 120)


def test_reader_yields_one_record_at_a_time():
    it = iter_records(io.BytesIO(bytes(_stream()[: _offset(2) + 5])))  # record 2 is cut
    assert next(it) == RECORDS[0]
    assert next(it) == RECORDS[1]
    with pytest.raises(RecordError, match="stream ends inside the 12-byte header"):
        next(it)


# --------------------------------------------------------------------------
# scan_stream against the writer's digest
# --------------------------------------------------------------------------


@pytest.mark.parametrize("compression", COMPRESSIONS)
@pytest.mark.parametrize(
    "records",
    [[], [b""], [b"hello", b""], RECORDS, [bytes(range(256)) * 40] * 30],
    ids=["none", "one_empty", "hello_empty", "five", "big"],
)
def test_scan_stream_equals_writer_digest(compression, records):
    stored, digest, _ = _write(records, compression)
    scanned = scan_stream(io.BytesIO(stored), compression)
    assert scanned == digest
    assert scanned.records == len(records)
    assert scanned.bytes == len(stored)
    assert scanned.sha256 == hashlib.sha256(stored).hexdigest()
    if len(stored) < 20_000:
        assert scanned.crc32c == f"{ref_crc32c(stored):08x}"


def test_scan_stream_reports_corruption_with_decompressed_offset():
    data = _stream()
    data[_offset(2) + 14] ^= 0xFF
    stored = gzip.compress(bytes(data), mtime=0)
    with pytest.raises(RecordError, match="data CRC mismatch") as err:
        scan_stream(io.BytesIO(stored), "gzip")
    assert (err.value.kind, err.value.index, err.value.offset) == ("data_crc", 2, _offset(2))
    with pytest.raises(RecordError, match="data CRC mismatch") as err:
        scan_stream(io.BytesIO(bytes(data)), "none")
    assert (err.value.kind, err.value.index, err.value.offset) == ("data_crc", 2, _offset(2))


@pytest.mark.parametrize("keep", [10, 0.5, -4, -1], ids=["header", "half", "no_size", "last_byte"])
def test_scan_stream_on_truncated_gzip_raises_eof(keep):
    stored, _, _ = _write(RECORDS * 10, "gzip")
    cut = int(len(stored) * keep) if isinstance(keep, float) else keep
    with pytest.raises(EOFError, match="Compressed file ended before the end-of-stream marker"):
        scan_stream(io.BytesIO(stored[:cut]), "gzip")


def test_scan_stream_of_uncompressed_stream_read_as_gzip_raises():
    with pytest.raises(OSError, match="Not a gzipped file"):
        scan_stream(io.BytesIO(GOLDEN_HELLO_THEN_EMPTY), "gzip")
