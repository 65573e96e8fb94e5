"""The block scanner (``scan_stream``, ``scan_range``) at every block boundary.

A file is checked a block at a time; a record the block ends inside is completed
from the next block's first bytes (its header split, its body split, a record
longer than a block streamed through the CRC). Shrinking the block to a few
bytes puts a boundary at every position of a small file: every count, record
start, error kind, record index and offset must equal the check of the whole
file in memory (``scan_records``).
"""

from __future__ import annotations

import io

import pytest

from beam_tfrecords.transforms.codec import record_scan
from beam_tfrecords.transforms.codec.tfrecord import (
    RecordError,
    frame_record,
    scan_range,
    scan_records,
    scan_stream,
)

pytestmark = pytest.mark.unit

SIZES = (0, 1, 5, 11, 12, 13, 40, 3, 100, 0, 27, 250, 7)
BLOCKS = (1, 5, 11, 12, 13, 16, 17, 28, 29, 40, 64, 100, 1000)


def _stream() -> tuple[bytes, list[int]]:
    records = [bytes((i * 7 + j) % 251 for j in range(size)) for i, size in enumerate(SIZES)]
    starts, at = [], 0
    for record in records:
        starts.append(at)
        at += len(record) + 16
    return b"".join(frame_record(r) for r in records), starts


DATA, STARTS = _stream()


@pytest.fixture(params=BLOCKS)
def block(request, monkeypatch):
    monkeypatch.setattr(record_scan, "_SCAN_BLOCK", request.param)
    monkeypatch.setattr(record_scan, "_STRADDLE_GUESS", 3)  # The header-split path, often.
    monkeypatch.setattr(record_scan, "RECORD_PIECE", 9)  # A long record streamed in many pieces.
    return request.param


def _reader(data: bytes):
    stream = io.BytesIO(data)
    return stream.read


def _fault(call) -> tuple | None:
    try:
        call()
    except RecordError as err:
        return err.kind, err.index, err.offset
    return None


def test_every_boundary_gives_the_counts_starts_and_digest_of_the_whole(block):
    offsets: list[int] = []
    assert scan_range(_reader(DATA), len(DATA), 0, 0, offsets) == len(SIZES)
    assert offsets == STARTS
    digest = scan_stream(io.BytesIO(DATA))
    assert (digest.records, digest.bytes) == (len(SIZES), len(DATA))


def test_a_range_reports_indexes_and_offsets_in_its_file(block):
    offsets: list[int] = []
    assert scan_range(_reader(DATA), len(DATA), 100, 5000, offsets) == len(SIZES)
    assert offsets == STARTS  # Offsets in the range; messages name the file's.
    damaged = bytearray(DATA)
    damaged[STARTS[8] + 20] ^= 0x01
    assert _fault(lambda: scan_range(_reader(bytes(damaged)), len(DATA), 100, 5000)) == (
        "data_crc", 108, 5000 + STARTS[8])


def test_every_flipped_byte_fails_as_the_whole_file_check_does(block):
    for position in range(len(DATA)):
        damaged = bytearray(DATA)
        damaged[position] ^= 0x20
        damaged = bytes(damaged)
        expected = _fault(lambda: scan_records(damaged))  # noqa: B023
        assert expected is not None
        assert _fault(lambda: scan_range(_reader(damaged), len(damaged))) == expected, position  # noqa: B023
        assert _fault(lambda: scan_stream(io.BytesIO(damaged))) == expected, position  # noqa: B023


def test_every_cut_fails_as_truncated_at_the_record_it_cuts(block):
    for cut in range(1, len(DATA)):
        short = DATA[:cut]
        expected = _fault(lambda: scan_records(short))  # noqa: B023
        if cut in STARTS:
            assert expected is None
            assert scan_range(_reader(short), cut) == STARTS.index(cut)
            continue
        assert expected is not None and expected[0] == "truncated"
        assert _fault(lambda: scan_range(_reader(short), cut)) == expected, cut  # noqa: B023
        assert _fault(lambda: scan_stream(io.BytesIO(short))) == expected, cut  # noqa: B023
