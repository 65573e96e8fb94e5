"""Verification in parallel pieces between writer-reported record boundaries."""

import concurrent.futures
import os

import pytest

from beam_tfrecords.transforms.codec.record_offsets import checkpoints
from beam_tfrecords.transforms.codec.tfrecord import TFRecordWriter, frame_record
from beam_tfrecords.transforms.io.helpers import ready_helper_pool
from beam_tfrecords.transforms.shard_engine import verify_shard

pytestmark = pytest.mark.unit


@pytest.fixture
def shard(tmp_path):
    path = str(tmp_path / "s.tfrecord")
    records = [bytes([i % 251]) * (50 + i % 97) for i in range(3000)]
    with open(path, "wb") as f:
        writer = TFRecordWriter(f)
        for record in records:
            writer.write(record)
        digest = writer.close()
    sizes = [len(frame_record(r)) for r in records]
    return path, digest, checkpoints(sizes, every=20_000), sizes


@pytest.fixture(params=["threads", "helper-processes"])
def pool(request):
    if request.param == "threads":
        with concurrent.futures.ThreadPoolExecutor(2) as executor:
            yield executor
    else:
        yield ready_helper_pool(2)


def test_checkpoints_are_record_boundaries(shard):
    _, digest, boundaries, sizes = shard
    assert len(boundaries) >= 5
    ends = {sum(sizes[:i]): i for i in range(len(sizes) + 1)}
    for offset, index in boundaries:
        assert ends[offset] == index
    assert all(0 < offset < digest.bytes for offset, _ in boundaries)


def test_pieces_agree_with_a_sequential_scan(shard, pool):
    path, digest, boundaries, _ = shard
    assert verify_shard(path, "none", digest, boundaries, pool) == (digest, "")
    assert verify_shard(path, "none", digest) == (digest, "")


def test_pieces_name_the_corrupt_record(shard, pool):
    path, digest, boundaries, sizes = shard
    index = 2000
    offset = sum(sizes[:index])
    with open(path, "r+b") as f:
        f.seek(offset + 20)
        byte = f.read(1)
        f.seek(offset + 20)
        f.write(bytes([byte[0] ^ 0x10]))
    _, error = verify_shard(path, "none", digest, boundaries, pool)
    assert error == f"record {index} at byte offset {offset}: data CRC mismatch (corrupt record data)"


def test_a_wrong_boundary_fails(shard, pool):
    path, digest, boundaries, _ = shard
    offset, index = boundaries[1]
    shifted = (boundaries[0], (offset + 1, index), *boundaries[2:])
    _, error = verify_shard(path, "none", digest, shifted, pool)
    assert error
    miscounted = (boundaries[0], (offset, index + 1), *boundaries[2:])
    _, error = verify_shard(path, "none", digest, miscounted, pool)
    assert "records between byte" in error


def test_truncated_shard_fails_in_pieces(shard, pool):
    path, digest, boundaries, _ = shard
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 7)
    _, error = verify_shard(path, "none", digest, boundaries, pool)
    assert "stream ends inside the record" in error
