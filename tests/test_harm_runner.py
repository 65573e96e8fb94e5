"""The DirectRunner never fetches and runs code at run time (issue 18, "do no harm").

Beam 2.77's DirectRunner first tries the Prism runner, which downloads a binary from
GitHub when the machine can reach it (offline, as here, the download fails and it
falls back). The product picks the DirectRunner's in-process engine itself, so a run
on a laptop with network access runs what was tested, in this process.
"""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_tfrecords.pipeline import build_pipeline
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig

pytestmark = pytest.mark.beam


@pytest.mark.parametrize("flags", [[], ["--runner", "DirectRunner"], ["--runner", "direct"],
                                   ["--direct_running_mode", "multi_processing"]])
def test_the_direct_runner_is_the_in_process_engine_never_prism(tmp_path, flags):
    make_class_folder_sample(str(tmp_path / "in"), per_class=2, splits=None)
    pipeline = build_pipeline(ConvertConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out")),
                              PipelineOptions(flags))
    assert type(pipeline.runner).__name__ == "FnApiRunner"


def test_another_runner_is_left_as_the_options_name_it(tmp_path):
    make_class_folder_sample(str(tmp_path / "in"), per_class=2, splits=None)
    pipeline = build_pipeline(ConvertConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out")),
                              PipelineOptions(["--runner", "BundleBasedDirectRunner"]))
    assert type(pipeline.runner).__name__ == "BundleBasedDirectRunner"
