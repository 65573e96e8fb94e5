"""Issue 20, "one of each": one shard cut that leaves no shard empty, whichever
planner (whole split, streamed a chunk at a time, through ``convert``) uses it."""

import json
import logging
import os

import numpy as np
import pytest

from beam_tfrecords.pipeline import convert
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import ImageSpool
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.io import retry
from beam_tfrecords.transforms.plan.shard_cuts import StreamedCut, assign_shards, cut_shards
from beam_tfrecords.transforms.tables import plan_table_shards


def _random_sizes(rng, trial: int) -> np.ndarray:
    count = int(rng.integers(1, 300))
    if trial % 3 == 0:
        return rng.integers(1, 10_000, count)
    if trial % 3 == 1:
        return rng.lognormal(8, 2, count).astype(np.int64) + 1  # Heavy tail: giants among small.
    return rng.integers(16, 40, count) * np.where(rng.random(count) < 0.1, 1000, 1)


@pytest.mark.unit
@pytest.mark.parametrize("sizes, band", [
    ([20_000] * 16, ShardBand(2_000, 4_000)),  # Every record over the band (today: 80 shards).
    ([100, 1, 1], ShardBand(1, 40)),  # The first record's midpoint skips shard 0.
    ([1, 1, 100], ShardBand(1, 40)),  # The last record's midpoint falls short of the last shard.
    ([1, 500, 1, 1, 500, 1], ShardBand(1, 100)),
])
def test_a_band_narrower_than_the_records_leaves_no_shard_empty(sizes, band):
    num_shards, shard_of = cut_shards(sizes, band)
    assert num_shards <= len(sizes)
    assert np.bincount(shard_of, minlength=num_shards).min() >= 1


@pytest.mark.unit
def test_the_cut_is_the_midpoint_rule_wherever_that_leaves_no_shard_empty_and_streams_alike():
    rng = np.random.default_rng(20)
    moved = 0
    for trial in range(600):
        sizes = _random_sizes(rng, trial)
        low = int(rng.integers(1, 50_000))
        band = ShardBand(low, low + int(rng.integers(0, 50_000)))
        num_shards, shard_of = cut_shards(sizes, band)
        assert 1 <= num_shards <= len(sizes)
        steps = np.diff(shard_of)
        assert shard_of[0] == 0 and shard_of[-1] == num_shards - 1 and steps.min(initial=0) >= 0
        assert steps.max(initial=0) <= 1, "a shard is empty"
        midpoint = np.asarray(assign_shards(sizes.tolist(), num_shards))
        if len(set(midpoint.tolist())) == num_shards:
            assert (midpoint == shard_of).all()
        else:
            moved += 1
        cut = StreamedCut(int(sizes.sum()), len(sizes), band)
        assert cut.num_shards == num_shards
        streamed = []
        edges = sorted({0, len(sizes), *rng.integers(0, len(sizes), 4).tolist()})
        for start, stop in zip(edges[:-1], edges[1:]):
            for index, run in cut.runs(sizes[start:stop]):
                streamed += [index] * len(run)
        assert streamed == shard_of.tolist()
    assert moved > 50  # The property was tested where the midpoint rule skips shards too.


@pytest.mark.unit
def test_the_streamed_table_plan_has_no_empty_shard(tmp_path):
    """Spools of records larger than the band: one record a shard, none without."""
    sizes = np.array([5_000, 20, 20, 9_000, 20, 7_000, 30], "<i8")
    spools = [ImageSpool("train", k, str(tmp_path / f"{k}.spool"), part.tobytes())
              for k, part in enumerate((sizes[:3], sizes[3:]))]
    specs = plan_table_shards(spools, ShardBand(100, 200), "none")
    assert [s.records.count for s in specs] and min(s.records.count for s in specs) >= 1
    assert sum(s.records.count for s in specs) == len(sizes)
    assert sum(s.planned_bytes for s in specs) == int(sizes.sum())
    assert len(specs) == specs[0].num_shards == cut_shards(sizes, ShardBand(100, 200))[0]


@pytest.mark.e2e
def test_convert_with_records_larger_than_the_band_publishes_no_empty_shard(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=4, splits=None, seed=1)
    convert(ConvertConfig(input=root, output=out, encode_processes=0, shard_min_mb=0.002,
                          shard_max_mb=0.004))
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    shards = [s for split in manifest["splits"].values() for s in split["shards"]]
    assert sorted(os.listdir(out)).count("manifest.json") == 1
    assert sum(s["records"] for s in shards) == 16
    assert [s["records"] for s in shards] == [1] * 16  # Before: 66 shards, 50 of them empty.
    assert sorted(n for n in os.listdir(out) if n.endswith(".tfrecord")) == sorted(s["path"] for s in shards)


@pytest.mark.unit
@pytest.mark.parametrize("failures, calls, warnings", [(0, 1, 0), (2, 3, 2), (5, 3, 2)])
def test_one_retry_loop_tries_until_nothing_is_to_retry_or_attempts_run_out(
        monkeypatch, caplog, failures, calls, warnings):
    monkeypatch.setattr(retry, "BACKOFF_SECONDS", 0.0)
    tries = []

    def attempt() -> int:
        tries.append(len(tries) + 1)
        return len(tries)

    log = logging.getLogger("test_one_of_each")
    with caplog.at_level(logging.WARNING, logger=log.name):
        last = retry.retried(attempt, lambda n: f"failure {n}" if n <= failures else "",
                             lambda n: f"Trying #{n}", "retrying", log)
    assert (last, tries) == (calls, list(range(1, calls + 1)))
    assert [r.getMessage() for r in caplog.records] == [
        f"Trying #{n} failed (attempt {n} of 3), retrying in 0 s: failure {n}" for n in range(1, warnings + 1)]
