"""The PTransforms on their own: planning, verification catching changed shards,
finalizing without a manifest, and the pipeline's counters."""

import dataclasses
import json
import os

import apache_beam as beam
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from beam_tfrecords.pipeline import build_pipeline
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import InputSummary, ShardResult
from beam_tfrecords.schemas.manifest import REPORT_NAME
from beam_tfrecords.schemas.report import Failure
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.transforms.commit_step import CommitSettings, commit_run
from beam_tfrecords.transforms.image_steps import ImageRecords, ListImages, PlanImageShards
from beam_tfrecords.transforms.shard_engine import VerifyShards, WriteShards


def _config(tmp_path, **options):
    return ConvertConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                         encode_processes=0, **options)


def _list(config):
    return ListImages(config.input, config.layout, config.labels, config.output)


def _write(config):
    return WriteShards(ShardTarget(config.output, config.compression, "test"), ImageRecords())


@pytest.mark.beam
def test_plan_shards_places_every_image_once(tmp_path):
    written = make_class_folder_sample(str(tmp_path / "in"), per_class=5)
    config = _config(tmp_path, shard_min_mb=0.05, shard_max_mb=0.1)
    with BeamTestPipeline() as p:
        specs = p | _list(config)
        planned = specs.refs | PlanImageShards(config.band)
        placed = planned | beam.FlatMap(lambda s: [r.filename for r in s.records.unpack()])
        assert_that(placed, equal_to(written), label="EveryImageOnce")
        names = planned | beam.Map(lambda s: (s.split, s.index, s.num_shards))
        counts = (
            names
            | beam.Map(lambda t: (t[0], t[2]))
            | beam.combiners.Count.PerElement()
            | beam.Map(lambda kv: kv[0][1] == kv[1])  # num_shards specs in every split
        )
        assert_that(counts, equal_to([True, True, True]), label="IndexesComplete")


@pytest.mark.beam
def test_verify_step_catches_a_shard_changed_after_writing(tmp_path):
    make_class_folder_sample(str(tmp_path / "in"), per_class=3, splits=None)
    config = _config(tmp_path)

    def corrupt(result):
        with open(result.temp_path, "r+b") as f:
            f.seek(result.bytes // 2)
            byte = f.read(1)
            f.seek(result.bytes // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
        return result

    with BeamTestPipeline() as p:
        results = (
            p | _list(config)
        ).refs | PlanImageShards(config.band) | _write(config) | beam.Map(corrupt) | VerifyShards()
        verdicts = results | beam.Map(lambda r: (r.verified, "CRC mismatch" in r.verify_error))
        assert_that(verdicts, equal_to([(False, True)]))


@pytest.mark.unit
def test_the_commit_writes_no_manifest_when_a_shard_failed(tmp_path):
    config = _config(tmp_path)
    os.makedirs(config.output)
    good = ShardResult("train", 0, 2, f"{config.output}/train-00000-of-00002.tfrecord",
                       10, 1000, "00000000", "0" * 64, 1000, verified=True)
    bad = dataclasses.replace(good, index=1, path=f"{config.output}/train-00001-of-00002.tfrecord",
                              verified=False, verify_error="record 3 at byte offset 99: data CRC mismatch")
    summary = InputSummary(root=config.input, layout="class_folders", input_files=20,
                           input_bytes=2000, ignored_files=0, vocabulary=("a",))
    settings = CommitSettings(ShardTarget(config.output), config.band, config.max_bad_fraction)
    report = commit_run(settings, [good, bad], summary)
    assert report.status == "verification_failed"
    assert report.manifest is None
    assert report.verification_failures == (Failure(bad.path, bad.verify_error),)
    assert not os.path.exists(os.path.join(config.output, "manifest.json"))
    with open(os.path.join(config.output, REPORT_NAME), encoding="utf-8") as f:
        assert json.load(f)["status"] == "verification_failed"


@pytest.mark.beam
def test_pipeline_counters(tmp_path):
    make_class_folder_sample(str(tmp_path / "in"), per_class=4, splits=None)
    with open(tmp_path / "in" / "circles" / "bad.png", "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n truncated")
    config = _config(tmp_path, max_bad_fraction=0.5)
    result = build_pipeline(config).run()
    result.wait_until_finish()

    def counter(namespace, name):
        query = result.metrics().query(MetricsFilter().with_namespace(namespace).with_name(name))
        return sum(c.committed for c in query["counters"])

    assert counter("list", "images") == 17
    assert counter("write", "records") == 16
    assert counter("write", "dead_letter") == 1
    assert counter("verify", "shards") == 1
    assert counter("verify", "failed") == 0
