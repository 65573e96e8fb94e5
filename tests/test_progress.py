"""Progress while a run goes (one line on a terminal, log lines elsewhere, Beam
counters) and the summary table at its end (issue 10)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
from apache_beam.metrics.metric import MetricsFilter

from beam_tfrecords import console
from beam_tfrecords.cli import main
from beam_tfrecords.pipeline import build_pipeline
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.report import RunReport, Status
from beam_tfrecords.transforms.io import progress

_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO beam_tfrecords\.progress: "
                       r"converting: ")


def _table(path, rows: int = 3000) -> str:
    with open(path, "w", encoding="utf-8") as f:
        f.write("id,score,name,split\n")
        for i in range(rows):
            f.write(f"{i},{i * 0.5},name-{i},{'train' if i % 4 else 'test'}\n")
    return str(path)


def _cli(*argv, **kwargs):
    return subprocess.run([sys.executable, "-m", "beam_tfrecords", *argv], capture_output=True,
                          text=True, timeout=300, check=False, **kwargs)


def _report(out) -> RunReport:
    with open(os.path.join(out, "run_report.json"), "rb") as f:
        return RunReport.from_json(f.read())


def _table_rows(stdout: str) -> dict[str, list[str]]:
    """The summary table's rows, by first cell (``split`` is the header)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["split", "records"])
    rows = {}
    for line in lines[start:]:
        if line.startswith("("):
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    return rows


# --- unit: the line and the table ------------------------------------------------------


@pytest.mark.unit
def test_the_line_fits_the_width_and_keeps_what_matters_most():
    reporter = console.Reporter("bar", 30, stream=open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115
    snap = progress.Snapshot(inputs=2310, input_bytes=400_000_000, records=1904, bytes=412_000_000,
                             shards=3, planned_inputs=6300, planned_input_bytes=1_200_000_000,
                             planned_shards=12)
    start = time.monotonic()
    reporter.line(snap, now=start - 30)  # Seen 30 s ago: a rate and an ETA can be told.
    full = reporter.line(snap, sep=" | ", now=start)
    assert full.startswith("converting: 2,310/6,300 images read | 1,904 records written | 412 MB")
    assert "shards 3/12" in full and "ETA " in full
    for width in (20, 40, 60, 79):
        narrow = reporter.line(snap, width, sep=" | ", now=start)
        assert len(narrow) <= width
    assert reporter.line(snap, 60, sep=" | ", now=start).startswith("converting: 2,310/6,300 images read")


@pytest.mark.unit
def test_a_table_line_counts_rows_and_input_bytes():
    reporter = console.Reporter("log", 30)
    reporter.unit = "rows"
    line = reporter.line(progress.Snapshot(inputs=412_000, input_bytes=31_000_000,
                                           planned_input_bytes=74_000_000), sep=", ")
    assert line.startswith("converting: 412,000 rows read, 31/74 MB read, 0 records written")
    assert reporter.line(progress.Snapshot()) == "converting: starting"


@pytest.mark.unit
def test_progress_flags_are_checked():
    with pytest.raises(ValueError, match="--progress_seconds"):
        console.Reporter("log", -1)
    with pytest.raises(ValueError, match="--progress must be one of"):
        console.Reporter("fancy", 30)
    assert console.Reporter("bar", 0).mode == "off"
    assert console.Reporter("auto", 30, stream=open(os.devnull, "w", encoding="utf-8")).mode == "log"  # noqa: SIM115


@pytest.mark.unit
def test_only_an_in_process_runner_is_watched_from_the_launcher():
    assert console.runs_in_process([])
    assert console.runs_in_process(["--direct_running_mode=multi_threading"])
    assert not console.runs_in_process(["--direct_running_mode=multi_processing"])
    assert not console.runs_in_process(["--runner=DataflowRunner"])
    reporter = console.Reporter("bar", 30, in_process=False)
    reporter.start()
    try:
        assert reporter._thread is None  # pylint: disable=protected-access
    finally:
        reporter.stop()


@pytest.mark.unit
def test_a_failed_shard_attempt_is_taken_back():
    progress.reset()
    progress.writing(10, 1000)
    progress.write_failed()
    progress.writing(10, 1000)
    progress.writing(5, 500)
    progress.written(15, 900)  # As stored (e.g. compressed).
    snap = progress.snapshot()
    assert (snap.records, snap.bytes) == (15, 900)
    progress.inputs_at("file", 100, 40)
    progress.inputs_at("file", 90, 60)  # Rows read again: the count goes back.
    progress.inputs_at("file", 120, 80, done=True)
    assert (progress.snapshot().inputs, progress.snapshot().input_bytes) == (120, 80)


@pytest.mark.unit
def test_the_summary_table_without_per_split_totals_is_one_line():
    report = RunReport(Status.OK, "out", records=5, shards=1, bytes=2_000_000)
    assert console.summary_table(report) == ["records: 5 in 1 shards, 2.0 MB"]


# --- beam: the Beam counters ---------------------------------------------------------


@pytest.mark.beam
def test_beam_counters_count_what_was_written(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=3, splits=None)
    result = build_pipeline(ConvertConfig(input=root, output=out)).run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in
                result.metrics().query(MetricsFilter().with_namespace("progress"))["counters"]}
    report = _report(out)
    assert counters["records_written"] == report.records
    assert counters["bytes_written"] == report.bytes
    assert counters["shards_done"] == report.shards
    assert counters["inputs_read"] == report.error_budget.total
    # What the plan expects, beside them (a runner's UI: shards done of planned).
    assert counters["shards_planned"] == counters["shards_done"]
    assert counters["inputs_planned"] == counters["inputs_read"]
    assert counters["input_bytes_planned"] == counters["input_bytes_read"] > 0


# --- e2e: whole runs ------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["images", "table"])
def test_the_counters_add_up_to_the_report(tmp_path, kind):
    out = str(tmp_path / "out")
    if kind == "images":
        source = str(tmp_path / "in")
        make_class_folder_sample(source, per_class=6, splits=("train", "test"))
    else:
        source = _table(tmp_path / "t.csv")
    flags = ["--split_column", "split"] if kind == "table" else []
    assert main(["convert", "--input", source, "--output", out, "--progress", "log", *flags]) == 0
    snap, report = progress.snapshot(), _report(out)
    assert (snap.records, snap.bytes, snap.shards) == (report.records, report.bytes, report.shards)
    assert snap.planned_shards == report.shards
    assert snap.inputs == report.error_budget.total
    assert snap.input_bytes == snap.planned_input_bytes > 0
    if kind == "table":
        assert snap.inputs == report.rows["in"] == 3000
        assert snap.input_bytes == os.path.getsize(source)
    assert sorted(report.splits) == ["test", "train"]
    assert sum(s["records"] for s in report.splits.values()) == report.records


@pytest.mark.e2e
def test_log_mode_logs_the_line_every_n_seconds_and_the_table_matches_the_report(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=8, splits=("train", "test"))
    # Held while writing until several 0.2 s ticks have passed (a run this small takes
    # less than one): a line per tick, then the last state.
    hold = tmp_path / "hold"
    hold.mkdir()
    env = {**os.environ, "BEAM_TFRECORDS_TEST_HOOKS": "1", "BEAM_TFRECORDS_HOLD_AT": "before_commit",
           "BEAM_TFRECORDS_HOLD_DIR": str(hold)}
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", root,
                             "--output", out, "--progress_seconds", "0.2", "--encode_processes", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (hold / "before_commit").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    (hold / "before_commit").unlink()
    stdout, stderr = proc.communicate(timeout=300)
    run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stderr.splitlines() if _LOG_LINE.match(line)]
    assert len(lines) >= 2, run.stderr  # A line every 0.2 s while held, and the last state.
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        final = json.load(f)
    assert f"{final['records']:,} records written" in lines[-1], lines[-1]
    assert "\r" not in run.stderr and "\x1b[" not in run.stderr
    assert "Missing pipeline option" not in run.stderr

    report = _report(out)
    rows = _table_rows(run.stdout)
    assert rows["split"] == ["records", "shards", "MB", "time"]
    for split, values in report.splits.items():
        records, shards, mb, seconds, unit = rows[split]
        assert (int(records.replace(",", "")), int(shards)) == (values["records"], values["shards"])
        assert float(mb.replace(",", "")) == round(values["bytes"] / 1e6, 1)
        assert (float(seconds), unit) == (round(values["seconds"], 1), "s")
    records, shards, mb = rows["total"][:3]
    assert (int(records.replace(",", "")), int(shards)) == (report.records, report.shards)
    assert float(mb.replace(",", "")) == round(report.bytes / 1e6, 1)
    assert run.stdout.splitlines()[0].startswith("plan: ") and "status: ok" in run.stdout


@pytest.mark.e2e
def test_progress_off_prints_no_progress_lines(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=8, splits=None)
    run = _cli("convert", "--input", root, "--output", out, "--progress", "off",
               env={**os.environ, progress.INTERVAL_ENV: "0.1"})
    assert run.returncode == 0, run.stderr
    assert "converting:" not in run.stdout + run.stderr
    assert "progress (process" not in run.stderr
    assert "\r" not in run.stderr


@pytest.mark.e2e
def test_a_terminal_gets_one_line_updated_in_place_and_cleared(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=40, splits=None)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 70, 0, 0))
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    # Held after the first chunk of the shard for a second (a run this small takes less
    # than one redraw): the line is drawn then, and again as the run goes on.
    hold = tmp_path / "hold"
    hold.mkdir()
    env.update(BEAM_TFRECORDS_TEST_HOOKS="1", BEAM_TFRECORDS_HOLD_AT="mid_write",
               BEAM_TFRECORDS_HOLD_DIR=str(hold))
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", root,
                             "--output", out, "--encode_processes", "0"],
                            stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)

    def release():
        deadline = time.monotonic() + 120
        while not (hold / "mid_write").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        if (hold / "mid_write").exists():
            (hold / "mid_write").unlink()

    releaser = threading.Thread(target=release, daemon=True)
    releaser.start()
    captured = b""
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal.
            break
        if not data:
            break
        captured += data
    os.close(master)
    assert proc.wait(timeout=300) == 0, captured.decode(errors="replace")[-2000:]
    text = captured.decode("utf-8")
    frames = re.findall(r"\r(converting: [^\r\x1b]*)\x1b\[K", text)
    assert len(frames) >= 2, text[-2000:]
    assert all(len(frame) <= 69 for frame in frames)  # Never wider than the terminal.
    assert any("images read" in frame for frame in frames)
    assert "\r\x1b[Kstatus: ok" in text  # The line is cleared before the summary.
    assert "INFO beam_tfrecords" not in text  # Steps' lines: the line and the table say it.
