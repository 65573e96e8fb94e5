"""Issue 23: a shard copied from spools has its index made by a helper, from the spools.

The index file of a table's shard (one line per record) was made in the writer's
process from the bytes as they passed: for a 1M-row table, 0.12 s of the 0.2 s its
copy took, with the helper processes idle. A helper now makes it from the spools'
bytes while the writer copies them; it must be the index of the bytes written, and a
helper that cannot make it leaves it to the writer.
"""

from __future__ import annotations

import concurrent.futures
import io
import os
import subprocess
import sys

import pytest

from beam_tfrecords.schemas.elements import ShardSpec, SpoolSegments
from beam_tfrecords.transforms import shard_engine
from beam_tfrecords.transforms.codec.record_index import RecordIndex
from beam_tfrecords.transforms.codec.tfrecord import FileDigest, RecordError, frame_record
from beam_tfrecords.transforms.io.helpers import HELPER_MIN_TABLE_BYTES, index_local_ranges
from tests.harness.cli_probe import run_noted


def _index_of(data: bytes) -> bytes:
    sink = io.BytesIO()
    index = RecordIndex(sink)
    index.feed(data)
    index.finish()
    return sink.getvalue()


def _spools(tmp_path) -> tuple[list, bytes]:
    """Two spool files of framed records; the ranges a shard takes of them, and its bytes."""
    first = b"".join(frame_record(b"r" * (i % 7)) for i in range(500))
    second = b"".join(frame_record(b"s" * (i % 300)) for i in range(400))
    (tmp_path / "a.spool").write_bytes(first)
    (tmp_path / "b.spool").write_bytes(second)
    cut = len(frame_record(b"")) + len(frame_record(b"r"))  # After the first two records.
    ranges = [(str(tmp_path / "a.spool"), cut, len(first)), (str(tmp_path / "b.spool"), 0, len(second))]
    return ranges, first[cut:] + second


@pytest.mark.unit
def test_the_index_of_spool_ranges_is_the_index_of_their_bytes(tmp_path, monkeypatch):
    from beam_tfrecords.transforms.io import helpers  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(helpers, "_INDEX_BLOCK", 333)  # Records cut between reads.
    ranges, data = _spools(tmp_path)
    lines, records, size = index_local_ranges(ranges)
    assert lines == _index_of(data) and records == 898 and size == len(data)
    with pytest.raises(RecordError):  # A range that ends inside a record.
        index_local_ranges([(ranges[0][0], ranges[0][1], ranges[0][2] - 3)])


def _spec(ranges) -> ShardSpec:
    segments = SpoolSegments(tuple((path, begin, end, 0) for path, begin, end in ranges), ())
    return ShardSpec("train", 0, 1, "train-00000-of-00001.tfrecord", 0, segments)


def _failed() -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(concurrent.futures.process.BrokenProcessPool("a helper died"))
    return future


@pytest.mark.unit
def test_a_helper_that_cannot_index_leaves_it_to_the_writer_and_a_wrong_index_fails(tmp_path):
    ranges, data = _spools(tmp_path)
    spec = _spec(ranges)
    written = FileDigest(898, len(data), "", "")
    sink = io.BytesIO()
    index = RecordIndex(sink)
    shard_engine._add_index(index, _failed(), spec, written)  # pylint: disable=protected-access
    index.finish()
    assert sink.getvalue() == _index_of(data)
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(index_local_ranges(ranges[1:]))  # The index of other bytes than the shard's.
    with pytest.raises(ValueError, match="records"):
        shard_engine._add_index(RecordIndex(), done, spec, written)  # pylint: disable=protected-access


@pytest.mark.e2e
def test_a_tables_shard_index_is_made_by_a_helper_and_indexes_the_shard(tmp_path):
    table = tmp_path / "rows.csv"
    _table_of_rows(table)
    out = tmp_path / "out"
    done, made = run_noted("beam_tfrecords.transforms.shard_engine", "_add_index", "2.name",
                           "convert", "--input", str(table), "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    shards = sorted(name for name in os.listdir(out) if name.endswith(".tfrecord"))
    assert shards and made == shards  # Each shard's index made by a helper.
    for name in shards:
        assert (out / (name + ".idx")).read_bytes() == _index_of((out / name).read_bytes())
    verify = subprocess.run([sys.executable, "-m", "beam_tfrecords", "verify", str(out)], capture_output=True,
                            text=True, timeout=300, check=False)
    assert verify.returncode == 0, verify.stdout[-2000:] + verify.stderr[-2000:]


@pytest.mark.unit
def test_an_index_started_when_the_shards_are_planned_is_taken_by_their_writer(tmp_path):
    from beam_tfrecords.transforms.io import helpers  # pylint: disable=import-outside-toplevel

    ranges, data = _spools(tmp_path)
    first, second = _spec(ranges), _spec(ranges[1:])
    assert helpers.ready_helper_pool(1) is not None
    try:
        shard_engine.SpoolCopy.index_early([first], most=2)
        started = dict(helpers._early)  # pylint: disable=protected-access
        assert len(started) == 1
        made = shard_engine.SpoolCopy().index_job(first)
        assert made is next(iter(started.values()))[1] and not helpers._early  # pylint: disable=protected-access
        assert made.result()[0] == _index_of(data)
        other = shard_engine.SpoolCopy().index_job(second)  # Not started early: made now.
        assert other.result()[0] == _index_of(data[len(data) - (ranges[1][2] - ranges[1][1]):])
    finally:
        helpers.retire_helper_pool()


def _table_of_rows(path) -> None:
    rows, size = ["id,n,text"], 0
    while size < HELPER_MIN_TABLE_BYTES + (1 << 20):
        rows.append(f"{len(rows)},{len(rows) * 7 % 1000},row {len(rows)} {'x' * (len(rows) % 40)}")
        size += len(rows[-1]) + 1
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")


@pytest.mark.e2e
def test_a_tables_shard_index_begins_when_it_is_planned(tmp_path):
    table = tmp_path / "rows.csv"
    _table_of_rows(table)
    done, taken = run_noted("beam_tfrecords.transforms.shard_engine", "take_early", "result",
                            "convert", "--input", str(table), "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert taken and "None" not in taken  # The writer took the index the plan started.
