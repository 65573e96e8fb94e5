"""Issue 23: a table's shard is checked piece by piece while the writer writes the rest.

A 1M-row table's one shard was copied from its spools in ~0.25 s with a core idle, and
only then were its pieces (16 MB between planned record boundaries) checked by the
helpers. The writer now sends each piece to the helpers once the file holds it
(``shard_verification.PiecesAhead``), and verification takes those checks. What must
hold: a piece is never read before the file holds all of it; verification takes every
piece sent and checks none twice; a byte changed after its piece was checked still
fails the shard (the whole file is re-read for its checksums after the write).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import subprocess
import sys

import pytest

from beam_tfrecords.transforms import shard_verification
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.tfrecord import FileDigest, digest_stream, frame_record
from beam_tfrecords.transforms.io import helpers
from tests.harness.cli_probe import run_noted


def _records(count: int) -> list[bytes]:
    return [frame_record(b"row %d " % i + b"x" * (i % 50)) for i in range(count)]


def _boundaries(framed: list[bytes], every: int) -> list[tuple[int, int]]:
    """``(offset, index)`` of every ``every``-th record's start."""
    out, offset = [], 0
    for index, record in enumerate(framed):
        if index and index % every == 0:
            out.append((offset, index))
        offset += len(record)
    return out


def _shard(tmp_path, count: int, every: int) -> tuple[bytes, list[tuple[int, int]], object, FileDigest]:
    """A shard of ``count`` records with a boundary every ``every`` records: its bytes,
    boundaries, path (not written yet) and digest."""
    framed = _records(count)
    data = b"".join(framed)
    digest = FileDigest(len(framed), len(data), *digest_stream(io.BytesIO(data))[1:])
    return data, _boundaries(framed, every), tmp_path / "shard.tfrecord", digest


def _index_digest(data: bytes) -> FileDigest:
    index = RecordIndex()
    index.feed(data)
    return index.finish()


@pytest.fixture(name="pool")
def _pool():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        yield pool
    helpers.drop_early()


@pytest.mark.unit
def test_a_piece_goes_only_once_the_file_holds_it_and_verification_takes_each_once(tmp_path, pool):
    framed = _records(3000)
    data = b"".join(framed)
    boundaries = _boundaries(framed, 500)  # Five boundaries: six pieces.
    path = str(tmp_path / "shard.tfrecord")
    ahead = shard_verification.PiecesAhead(path, boundaries, pool)
    with open(path, "wb") as sink:
        sink.write(data[:boundaries[1][0] + 5])  # Two pieces and 5 bytes of the third.
        sink.flush()
        ahead.written(len(data))  # Handed to the writer: all of it; in the file: not yet.
        early = dict(helpers._early)  # pylint: disable=protected-access
        assert len(early) == 2
        sink.write(data[boundaries[1][0] + 5:])
    digest = FileDigest(len(framed), len(data), *digest_stream(open(path, "rb"))[1:])
    ahead.closed(digest)
    assert len(helpers._early) == 6  # pylint: disable=protected-access

    taken = []
    real = shard_verification.take_early

    def counted(*args):
        found = real(*args)
        taken.append(found is not None)
        return found

    shard_verification.take_early = counted
    try:
        checked, error = shard_verification.verify_shard(path, "none", digest, boundaries, pool,
                                                         _index_digest(data))
    finally:
        shard_verification.take_early = real
    assert error == "" and checked == digest
    assert taken == [True] * 6 and not helpers._early  # pylint: disable=protected-access
    assert all(future.done() for _, future in early.values())


@pytest.mark.unit
def test_a_byte_changed_after_its_piece_was_checked_still_fails_the_shard(tmp_path, pool):
    data, boundaries, path, digest = _shard(tmp_path, 2000, 400)
    path.write_bytes(data)
    ahead = shard_verification.PiecesAhead(str(path), boundaries, pool)
    ahead.closed(digest)
    for _, future in list(helpers._early.values()):  # pylint: disable=protected-access
        assert future.result()[0] == 400  # Each piece checked, on the bytes as written.
    changed = bytearray(data)
    changed[100] ^= 0x01  # In the first piece (record 4's length field).
    path.write_bytes(bytes(changed))
    _, error = shard_verification.verify_shard(str(path), "none", digest, boundaries, pool,
                                               _index_digest(data))
    assert "crc32c" in error and "sha256" in error
    # Without pieces sent ahead the same change is found by the record check itself.
    _, error = shard_verification.verify_shard(str(path), "none", digest, boundaries, pool,
                                               _index_digest(data))
    assert error.startswith("record 4 at byte offset 94: length CRC mismatch")


@contextlib.contextmanager
def helpers_started():
    """A helper pool of one process for the ``with`` block."""
    assert helpers.ready_helper_pool(1) is not None
    try:
        yield
    finally:
        helpers.retire_helper_pool()


@pytest.mark.unit
def test_no_pieces_go_without_a_helper_pool_or_for_a_shard_of_large_records(tmp_path):
    path = str(tmp_path / "shard.tfrecord")
    assert helpers.live_helper_pool() is None
    assert shard_verification.PiecesAhead.ahead(path, [(100, 1)], 1000, 100_000) is None
    with helpers_started():
        assert shard_verification.PiecesAhead.ahead(path, [(100, 1)], 1000, 100_000) is not None
        assert shard_verification.PiecesAhead.ahead(path, [(100, 1)], 10, 100 * helpers.SMALL_FILE_BYTES) is None
        assert shard_verification.PiecesAhead.ahead(path, (), 1000, 100_000) is None
        assert shard_verification.PiecesAhead.ahead("gs://bucket/shard", [(100, 1)], 1000, 100_000) is None


@pytest.mark.e2e
def test_a_tables_shard_has_every_piece_checked_ahead_and_the_same_bytes(tmp_path):
    # ~26 MB of records: a shard with a planned boundary (every 16 MB) and two pieces at least.
    table = tmp_path / "rows.csv"
    with open(table, "w", encoding="utf-8") as sink:
        sink.write("id,n,text\n")
        for i in range(260_000):
            sink.write(f"{i},{i * 7 % 1000},row {i} {'x' * (i % 40)}\n")
    out = tmp_path / "out"
    done, taken = run_noted("beam_tfrecords.transforms.shard_verification", "take_early", "result",
                            "convert", "--input", str(table), "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(taken) >= 2 and "None" not in taken, taken  # Every piece taken, none checked twice.
    threads = tmp_path / "threads"
    done = subprocess.run([sys.executable, "-m", "beam_tfrecords", "convert", "--input", str(table), "--output",
                           str(threads), "--encode_processes", "0"], capture_output=True, text=True, timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    shards = sorted(name for name in os.listdir(out) if name.endswith((".tfrecord", ".idx")))
    assert shards and shards == sorted(name for name in os.listdir(threads) if name.endswith((".tfrecord", ".idx")))
    for name in shards:
        assert (out / name).read_bytes() == (threads / name).read_bytes()


@pytest.mark.unit
def test_a_pool_shut_down_or_a_file_gone_mid_write_sends_nothing_more_and_raises_nothing(tmp_path):
    data, boundaries, path, digest = _shard(tmp_path, 3000, 500)
    path.write_bytes(data)
    # Another run in this process ended the helpers (its commit): the writer goes on, and
    # verification checks every piece itself, on a pool of its own.
    pool = concurrent.futures.ThreadPoolExecutor(1)
    ahead = shard_verification.PiecesAhead(str(path), boundaries, pool)
    pool.shutdown()
    ahead.written(len(data))
    ahead.closed(digest)
    assert not helpers._early  # pylint: disable=protected-access
    with concurrent.futures.ThreadPoolExecutor(2) as fresh:
        assert shard_verification.verify_shard(str(path), "none", digest, boundaries, fresh,
                                               _index_digest(data)) == (digest, "")
    # The file gone mid-write: nothing goes ahead, and the checks sent before are dropped.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        ahead = shard_verification.PiecesAhead(str(path), boundaries, pool)
        ahead.written(boundaries[1][0])
        assert len(helpers._early) == 2  # pylint: disable=protected-access
        path.unlink()
        ahead.written(len(data))
        ahead.closed(digest)
        assert not helpers._early  # pylint: disable=protected-access


@pytest.mark.unit
def test_only_the_bytes_the_writer_wrote_go_ahead_and_a_failed_write_drops_its_checks(tmp_path, pool):
    data, boundaries, path, _ = _shard(tmp_path, 3000, 500)
    # Someone made the file longer than the writer's bytes: no piece past them goes.
    path.write_bytes(data[:boundaries[0][0]] + b"\0" * len(data))
    ahead = shard_verification.PiecesAhead(str(path), boundaries, pool)
    ahead.written(boundaries[0][0] + 10)
    assert len(helpers._early) == 1  # pylint: disable=protected-access
    ahead.forget()  # The write failed: a retry writes another file.
    assert not helpers._early  # pylint: disable=protected-access
    ahead.written(len(data))
    assert not helpers._early  # pylint: disable=protected-access


@pytest.mark.unit
def test_a_failed_write_of_a_table_shard_drops_the_checks_it_sent(tmp_path, monkeypatch):
    from beam_tfrecords.schemas.elements import ShardSpec, SpoolSegments  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms import shard_engine  # pylint: disable=import-outside-toplevel

    framed = [frame_record(b"row %d " % i + b"x" * 200) for i in range(60_000)]  # ~13 MB.
    data = b"".join(framed)
    spool = tmp_path / "a.spool"
    spool.write_bytes(data)
    boundaries = tuple(_boundaries(framed, 8000))
    spec = ShardSpec("train", 0, 1, "train-00000-of-00001.tfrecord", len(data),
                     SpoolSegments(((str(spool), 0, len(data), len(framed)),)), boundaries)
    sent = []

    def failing_writes(self, framed_bytes, records=1):
        if helpers._early:  # pylint: disable=protected-access  # A piece went ahead: the disk fills.
            sent.append(len(helpers._early))  # pylint: disable=protected-access
            raise OSError("the disk is full")
        return real(self, framed_bytes, records)

    real = shard_engine.TFRecordWriter.write_framed
    monkeypatch.setattr(shard_engine.TFRecordWriter, "write_framed", failing_writes)
    with helpers_started():
        with pytest.raises(OSError, match="disk is full"):
            shard_engine._write_once(spec, str(tmp_path / "shard.tmp"), "none",  # pylint: disable=protected-access
                                     shard_engine.SpoolCopy(check_ahead=True))
        assert sent and not helpers._early  # pylint: disable=protected-access
