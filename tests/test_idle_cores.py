"""Issue 23 (no idle cores): what keeps the local runner's cores busy at a run's end.

* Shards are written largest first, so the last one, whose write, contents and
  verification nothing else overlaps, is a small one.
* The helpers' results come back through a 1 MiB pipe, not a 64 KiB one.
* The local runner's per-step timers end within 10 ms of a bundle's end, not 200.
"""

from __future__ import annotations

import fcntl

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.counters import CounterFactory

from beam_tfrecords import job_graph
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms import image_steps
from beam_tfrecords.transforms.image_steps import PlanImageShards, image_shards, pack_refs
from beam_tfrecords.transforms.io import helpers
from beam_tfrecords.transforms.plan.layouts import list_class_folders

ROOT = "gs://b/data"
BAND = ShardBand(200_000, 400_000)
_SEEN: list = []


def _packed():
    """A listing of three splits of 40, 400 and 2,000 files (sizes 500-900 bytes)."""
    files = [(f"{ROOT}/{split}/c{i % 3}/{i:05d}.jpg", 500 + (i * 37) % 400)
             for split, count in (("val", 40), ("test", 400), ("train", 2000)) for i in range(count)]
    return pack_refs(list_class_folders(ROOT, iter(files), compact=True).refs)


def _facts(spec):
    return spec.split, spec.index, spec.planned_bytes, spec.records.count


def _see(spec):
    _SEEN.append(_facts(spec))


@pytest.mark.unit
def test_shards_are_planned_largest_first():
    packed = _packed()
    planned = [_facts(s) for s in image_shards(packed, BAND, "none")]
    ordered = [_facts(s) for s in image_steps._largest_first(packed, BAND, "none")]
    assert sorted(ordered) == sorted(planned) and len(planned) >= 4
    assert planned != ordered  # The plan itself goes split by split, val's small shard early.
    assert [f[2] for f in ordered] == sorted((f[2] for f in planned), reverse=True)
    assert ordered[-1][0] == "val"


@pytest.mark.beam
def test_the_local_runner_writes_them_in_that_order():
    """The spread after the plan keeps the order on the local runner: the shard
    writer gets the largest first."""
    packed = _packed()
    options = PipelineOptions([])
    _SEEN.clear()
    with beam.Pipeline(runner=job_graph._local_runner(options), options=options) as pipeline:
        _ = (pipeline | beam.Create([packed]) | PlanImageShards(BAND)
             | beam.Map(_see))
    assert _SEEN == [_facts(s) for s in image_steps._largest_first(packed, BAND, "none")]


@pytest.mark.beam
def test_the_helpers_results_come_through_a_wide_pipe():
    pool = helpers.helper_pool(1, ())
    try:
        reader = pool._result_queue._reader  # pylint: disable=protected-access
        assert fcntl.fcntl(reader.fileno(), fcntl.F_GETPIPE_SZ) == 1 << 20
        assert pool.submit(sum, [1, 2]).result(timeout=120) == 3
    finally:
        helpers.retire_helper_pool()


@pytest.mark.unit
def test_the_local_runner_samples_step_times_every_10_ms():
    from apache_beam.runners.worker import statesampler  # pylint: disable=import-outside-toplevel

    job_graph._local_runner(PipelineOptions([]))
    job_graph._local_runner(PipelineOptions([]))  # Twice: not a subclass of a subclass.
    sampler = statesampler.StateSampler("step", CounterFactory())
    assert sampler.sampling_period_ms == 10
    assert statesampler.StateSampler.__mro__[2].__name__ == "StateSampler"
    assert statesampler.StateSampler("step", CounterFactory(), 500).sampling_period_ms == 10
