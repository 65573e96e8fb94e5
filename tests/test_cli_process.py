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


def test_help_version_and_a_misspelt_command():
    helped = _run(SCRIPT, "--help")
    assert helped.returncode == 0
    for command in ("convert", "verify", "inspect", "infer-schema"):
        assert f"  {command} " in helped.stdout
    version = _run(SCRIPT, "--version")
    assert version.returncode == 0 and version.stdout.startswith("beam-tfrecords 0.")
    misspelt = _run(SCRIPT, "convrt", "--input", "x")
    assert misspelt.returncode == 2
    assert "unknown command 'convrt' (did you mean 'convert'?)" in misspelt.stderr


def test_ctrl_c_exits_130_with_one_line_and_publishes_nothing(tmp_path):
    import signal  # pylint: disable=import-outside-toplevel
    import time  # pylint: disable=import-outside-toplevel

    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=20, splits=None)  # 80 files: a shard of 2 chunks.
    env = {**os.environ, "BEAM_TFRECORDS_HOLD_AT": "mid_write", "BEAM_TFRECORDS_HOLD_DIR": str(tmp_path),
           "BEAM_TFRECORDS_TEST_HOOKS": "1"}
    proc = subprocess.Popen([SCRIPT, "convert", "--input", root, "--output", out,
                             "--encode_processes", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(tmp_path / "mid_write") and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    try:
        _, stderr = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 130, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("beam-tfrecords convert: interrupted; nothing was published"), last
    assert "Traceback" not in stderr
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert not [name for name in os.listdir(out) if ".tfrecord" in name]


def test_an_unwritable_report_path_is_refused_before_running(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=1, splits=None)
    refused = _run(SCRIPT, "convert", "--input", root, "--output", out,
                   "--report_json", str(tmp_path / "missing" / "report.json"))
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith(
        "beam-tfrecords convert: error: --report_json: cannot write")
    assert not os.path.exists(out)  # Refused before anything ran.
