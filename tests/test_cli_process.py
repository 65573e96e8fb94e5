"""The installed command line, run as real processes: exit codes and output."""

import os
import subprocess
import sys

import pytest

from beam_tfrecords.samples import make_class_folder_sample

pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(os.path.dirname(sys.executable), "beam-tfrecords")


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def test_module_and_console_script_convert_and_verify(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=2, splits=None)
    converted = _run(sys.executable, "-m", "beam_tfrecords", "convert", "--input", root, "--output", out)
    assert converted.returncode == 0, converted.stderr
    assert f"manifest: {out}/manifest.json" in converted.stdout

    verified = _run(SCRIPT, "verify", out)
    assert verified.returncode == 0, verified.stderr
    assert "1 of 1 files OK" in verified.stdout

    refused = _run(SCRIPT, "convert", "--input", root, "--output", out)
    assert refused.returncode == 2
    assert "--overwrite" in refused.stderr


def test_no_command_is_a_usage_error():
    result = _run(SCRIPT)
    assert result.returncode == 2
    assert "convert" in result.stderr and "verify" in result.stderr
