"""Issue 23 (start-up): a small run leaves its files to threads, with the same bytes.

Helper processes cost ~0.15 s of CPU each to start; with ``--encode_processes -1``
(the default) a run the preflight lists under ``HELPER_MIN_FILES`` images starts
none, while a count given is used whatever the run's size.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from beam_tfrecords.transforms.io.helpers import HELPER_MIN_FILES, SMALL_FILE_BYTES, helpers_pay

_RUNS = textwrap.dedent("""
    import multiprocessing, multiprocessing.process, sys
    from beam_tfrecords import ConvertConfig, convert
    root, out = sys.argv[1], sys.argv[2]
    counter = multiprocessing.process._process_counter  # Counts every Process made.
    for name, processes in (("auto", -1), ("two", 2)):
        before = next(counter)
        result = convert(ConvertConfig(input=root, output=out + "/" + name, encode_processes=processes))
        started = next(counter) - before - 1
        print(name, result.ok, result.report.records, started)
""")


@pytest.mark.unit
def test_helpers_pay_only_for_many_small_files():
    assert not helpers_pay(HELPER_MIN_FILES - 1, 1000)
    assert helpers_pay(HELPER_MIN_FILES, HELPER_MIN_FILES * 1000)
    assert not helpers_pay(HELPER_MIN_FILES, HELPER_MIN_FILES * SMALL_FILE_BYTES)


def _shards(out: str) -> dict[str, str]:
    digests = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".tfrecord"):
            with open(os.path.join(out, name), "rb") as f:
                digests[name] = hashlib.sha256(f.read()).hexdigest()
    return digests


@pytest.mark.e2e
def test_a_small_run_starts_no_helpers_and_writes_what_helpers_write(tmp_path):
    root = tmp_path / "in"
    for index in range(12):
        folder = root / ("cat" if index % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        Image.new("RGB", (4 + index, 3), (index * 20, 7, 200 - index)).save(buffer, "PNG")
        (folder / f"{index:02d}.png").write_bytes(buffer.getvalue())
    out = str(tmp_path / "out")
    done = subprocess.run([sys.executable, "-c", _RUNS, str(root), out], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.split("\n")
    # auto: no helper process started; an explicit count: its helpers.
    assert "auto True 12 0" in lines and "two True 12 2" in lines, done.stdout
    auto, two = _shards(os.path.join(out, "auto")), _shards(os.path.join(out, "two"))
    assert auto and auto == two


_LEFT_OUT = textwrap.dedent("""
    import sys
    from beam_tfrecords import __main__ as entry
    with entry._connectors_left_out():
        import beam_tfrecords.cli
    print("loaded", "apache_beam" in sys.modules, "apache_beam.io.gcp.bigquery" in sys.modules)
    import apache_beam.io.gcp.bigquery as bigquery  # By name, afterwards: as always.
    print("later", bigquery.WriteToBigQuery.__name__)
""")


@pytest.mark.unit
def test_the_cli_loads_beam_without_its_bigquery_block_which_still_loads_by_name():
    done = subprocess.run([sys.executable, "-c", _LEFT_OUT], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["loaded True False", "later WriteToBigQuery"], done.stdout


@pytest.mark.e2e
def test_a_cli_run_imports_no_bigquery_connector(tmp_path):
    root = tmp_path / "in" / "cat"
    root.mkdir(parents=True)
    buffer = io.BytesIO()
    Image.new("RGB", (4, 3), (9, 7, 200)).save(buffer, "PNG")
    (root / "a.png").write_bytes(buffer.getvalue())
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "beam_tfrecords", "convert", "--input",
                           str(tmp_path / "in"), "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # "import time: self | cumulative | name": the connector's import is tried (and fails
    # at once, in microseconds); nothing of it loads.
    imported = {line.rsplit("|", 1)[-1].strip(): int(line.split("|")[1])
                for line in done.stderr.split("\n") if line.startswith("import time:") and "|" in line
                and line.split("|")[1].strip().isdigit()}
    assert "apache_beam.runners.portability.fn_api_runner.fn_runner" in imported
    loaded = {name for name in imported if "bigquery" in name or "pubsub" in name}
    assert loaded <= {"apache_beam.io.gcp.bigquery"} and imported.get("apache_beam.io.gcp.bigquery", 0) < 1000
