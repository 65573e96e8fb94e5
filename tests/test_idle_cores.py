"""Issue 23 (no idle cores): what keeps the local runner's cores busy at a run's end.

* Shards are written largest first, so the last one, whose write, contents and
  verification nothing else overlaps, is a small one.
* The helpers' results come back through a 1 MiB pipe, not a 64 KiB one.
* The local runner's per-step timers end within 10 ms of a bundle's end, not 200.
* A helper's numpy starts no OpenBLAS threads (~0.1 s of CPU per helper).
* The local runner's first shard is encoded on the helpers while the runner starts
  (its tasks are taken by its writer, not run again; the bytes are the same), and
  ``inputs.jsonl``'s pieces are completed on them (the same file and fingerprint).
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.counters import CounterFactory

from beam_tfrecords import job_graph
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms import image_plans, image_steps
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
    ordered = [_facts(s) for s in image_steps.largest_first(packed, BAND, "none")]
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
    assert _SEEN == [_facts(s) for s in image_steps.largest_first(packed, BAND, "none")]


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
def test_a_helper_starts_no_openblas_threads_and_collects_rarely(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")  # The parent's setting is not the helpers'.
    helpers.retire_helper_pool()
    pool = helpers.ready_helper_pool(1)  # Its helper has imported numpy (the image record builder).
    try:
        loaded = pool.submit(eval, "'numpy' in __import__('sys').modules").result(timeout=120)
        setting = pool.submit(os.getenv, "OPENBLAS_NUM_THREADS").result(timeout=120)
        threads = pool.submit(os.listdir, "/proc/self/task").result(timeout=120)
        collector = pool.submit(gc.get_threshold).result(timeout=120)
    finally:
        helpers.retire_helper_pool()
    assert loaded and setting == "1"
    assert collector[0] >= 10_000, "a helper's collector does not walk each task's objects again and again"
    assert len(threads) == 2, "a helper runs its tasks and the thread that watches its parent, nothing else"


@pytest.mark.unit
def test_the_local_runner_samples_step_times_every_10_ms():
    from apache_beam.runners.worker import statesampler  # pylint: disable=import-outside-toplevel

    job_graph._local_runner(PipelineOptions([]))
    job_graph._local_runner(PipelineOptions([]))  # Twice: not a subclass of a subclass.
    sampler = statesampler.StateSampler("step", CounterFactory())
    assert sampler.sampling_period_ms == 10
    assert statesampler.StateSampler.__mro__[2].__name__ == "StateSampler"
    assert statesampler.StateSampler("step", CounterFactory(), 500).sampling_period_ms == 10


def _png_folder(root, count):
    import io  # pylint: disable=import-outside-toplevel

    from PIL import Image  # pylint: disable=import-outside-toplevel

    buffer = io.BytesIO()
    Image.new("RGB", (2, 2), (1, 2, 3)).save(buffer, "PNG")
    for index in range(count):
        folder = root / ("cat" if index % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{index:05d}.png").write_bytes(buffer.getvalue())
    return str(root)


@pytest.mark.beam
def test_local_image_runs_skip_type_inference_and_large_tables_keep_it(tmp_path):
    """Beam's type inference traces every step's code before the first image is read;
    a local image run of any size skips it, a large local table keeps it (its
    coders)."""
    from apache_beam.options.pipeline_options import TypeOptions  # pylint: disable=import-outside-toplevel

    from beam_tfrecords import ConvertConfig, build_pipeline  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms.io.helpers import HELPER_MIN_FILES, HELPER_MIN_TABLE_BYTES

    images = _png_folder(tmp_path / "images", HELPER_MIN_FILES)
    table = tmp_path / "rows.csv"
    row = "1,some words to fill the row up to a size\n"
    table.write_text("n,text\n" + row * (HELPER_MIN_TABLE_BYTES // len(row) + 1))
    checked = {}
    for name, config, flags in (
            ("images", ConvertConfig(input=images, output=str(tmp_path / "a")), []),
            ("table", ConvertConfig(input=str(table), output=str(tmp_path / "b")), [])):
        options = PipelineOptions(flags)
        build_pipeline(config, options)
        checked[name] = options.view_as(TypeOptions).pipeline_type_check
    assert checked == {"images": False, "table": True}


def _square(value: int) -> int:
    _CALLS.append(value)
    return value * value


_CALLS: list = []


@pytest.mark.unit
def test_tasks_started_early_are_taken_not_run_again():
    import concurrent.futures  # pylint: disable=import-outside-toplevel

    _CALLS.clear()
    with concurrent.futures.ThreadPoolExecutor(2) as pool, concurrent.futures.ThreadPoolExecutor(1) as other:
        try:
            assert helpers.submit_early(pool, _square, [1, 2, 3]) == 3
            assert helpers.submit_early(pool, _square, [3]) == 0  # Started already.
            assert helpers.submit_early(other, _square, [9]) == 1
            for future in list(helpers._early.values()):  # pylint: disable=protected-access
                future[1].result(timeout=60)
            assert sorted(_CALLS) == [1, 2, 3, 9]
            # The same tasks in a row are taken; from the first other one, all run.
            assert list(helpers.ordered_map(pool, _square, [1, 2, 5, 3], 2)) == [1, 4, 25, 9]
            assert sorted(_CALLS) == [1, 2, 3, 3, 5, 9]
            # A task started on another pool is not taken from this one.
            assert list(helpers.ordered_map(pool, _square, [9], 2)) == [81]
            assert sorted(_CALLS) == [1, 2, 3, 3, 5, 9, 9]
        finally:
            helpers.retire_helper_pool()
    assert not helpers._early  # pylint: disable=protected-access


@pytest.mark.unit
def test_the_plan_made_to_start_the_first_shard_is_the_one_the_step_takes():
    packed = _packed()
    refs = packed.unpack()
    _NoStart.asked.clear()
    started = image_steps.start_first_shard(refs, BAND, "none", _NoStart())
    assert started == 0
    taken = image_steps.largest_first(image_steps.listing_element(refs), BAND, "none")
    assert [_facts(s) for s in taken] == [_facts(s) for s in image_steps.largest_first(packed, BAND, "none")]
    assert image_plans._EARLY_PLANS == {}  # pylint: disable=protected-access
    assert len(_NoStart.asked) == 1 and _NoStart.asked[0] is taken[0]  # Taken, not made again.


class _NoStart:
    asked: list = []

    def start_early(self, spec, most_bytes):
        assert most_bytes == image_plans.EARLY_BYTES
        _NoStart.asked.append(spec)
        return 0


_EARLY_RUN = textwrap.dedent("""
    import sys
    from beam_tfrecords import ConvertConfig, convert
    from beam_tfrecords.transforms import gather, image_steps
    from beam_tfrecords.transforms.io import helpers
    root, out = sys.argv[1], sys.argv[2]
    counts = {"early": 0, "taken": 0, "pieces": 0}
    live = gather.live_helper_pool
    def counted_live():
        pool = live()
        counts["pieces"] += pool is not None
        return pool
    gather.live_helper_pool = counted_live
    submit, take = helpers.submit_early, helpers.take_early
    def counted_submit(pool, fn, items):
        n = submit(pool, fn, items)
        counts["early"] += n
        return n
    def counted_take(pool, fn, item):
        found = take(pool, fn, item)
        counts["taken"] += found is not None
        return found
    image_steps.submit_early = counted_submit
    helpers.take_early = counted_take
    for name, processes in (("auto", -1), ("threads", 0)):
        result = convert(ConvertConfig(input=root, output=out + "/" + name, encode_processes=processes))
        print(name, result.ok, result.report.records, counts["early"], counts["taken"], len(helpers._early),
              counts["pieces"])
""")


@pytest.mark.e2e
def test_the_first_shard_is_encoded_while_the_runner_starts_with_the_same_bytes(tmp_path):
    from beam_tfrecords.transforms.io.helpers import HELPER_MIN_FILES  # pylint: disable=import-outside-toplevel

    root = _png_folder(tmp_path / "in", HELPER_MIN_FILES)
    out = str(tmp_path / "out")
    done = subprocess.run([sys.executable, "-c", _EARLY_RUN, root, out], capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    auto = next(line for line in lines if line.startswith("auto ")).split()
    # Every task started early was taken by the shard's writer; none is left.
    assert auto[:3] == ["auto", "True", str(HELPER_MIN_FILES)] and int(auto[3]) > 0
    assert auto[4] == auto[3] and auto[5] == "0", done.stdout
    # inputs.jsonl's piece was completed on a helper, then none with threads only.
    assert auto[6] == "1" and f"threads True {HELPER_MIN_FILES} {auto[3]} {auto[3]} 0 1" in lines, done.stdout

    def published(name):
        folder = os.path.join(out, name)
        with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        return {n: hashlib.sha256(open(os.path.join(folder, n), "rb").read()).hexdigest()
                for n in sorted(os.listdir(folder)) if n.endswith(".tfrecord") or n == "inputs.jsonl"}, \
            manifest["input"]

    assert published("auto")[0] and published("auto") == published("threads")
