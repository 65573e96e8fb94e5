"""Progress of a run: process-wide counters the steps bump, mirrored as Beam metrics.

Steps bump them a chunk or a batch at a time, never per record: inputs read
(images, or table rows) and their bytes, records and bytes written, shards done
(re-read, whether they proved or not). Planning sets what is expected: inputs
and input bytes (the listing, or the table files' sizes) and shards (when the
shards are cut). Every bump also goes to a Beam counter of namespace
``progress`` (``inputs_read``, ``input_bytes_read``, ``records_written``,
``bytes_written``, ``shards_done``), which a runner with a UI (Dataflow) shows.

On the in-process DirectRunner every step runs in the launcher's process, where
the CLI's reporter (``beam_pipeline.console``) reads ``snapshot()`` and says
``watch(True)``. In a process nobody watches (a Dataflow worker, a worker of the
DirectRunner's multi_processing mode, a library caller's process), the counters
log themselves instead: one line per process every ``interval()`` seconds
(``BEAM_TFRECORDS_PROGRESS_SECONDS`` in the process's environment, else the job's
``--progress_seconds`` pipeline option (``ProgressOptions``), else 30; 0: never).

What the plan expects is counted too, once, by the step that finds it out:
``inputs_planned``, ``input_bytes_planned`` (images) and ``shards_planned``, so a
runner's UI shows ``shards_done`` of ``shards_planned``.

A step that runs long without emitting (a large shard being written, the commit)
makes Beam's SDK harness log "Operation ongoing ... without outputting or
completing" with the step's stack trace, every 5 minutes per worker process while
it lasts. Importing this module (every step's module does) keeps that line and
drops its stack trace (``quiet_lull_logs``): the step's own progress lines say what
it is doing.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Hashable, Iterable

from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.options.value_provider import RuntimeValueProvider

__all__ = [
    "INTERVAL_ENV",
    "ProgressOptions",
    "Snapshot",
    "add",
    "bytes_taken",
    "inputs_at",
    "interval",
    "plan",
    "quiet_lull_logs",
    "reset",
    "set_interval",
    "snapshot",
    "split_totals",
    "watch",
    "write_failed",
    "writing",
    "written",
]

INTERVAL_ENV = "BEAM_TFRECORDS_PROGRESS_SECONDS"
_DEFAULT_INTERVAL = 30.0
_log = logging.getLogger(__name__)
_FIELDS = ("inputs", "input_bytes", "records", "bytes", "shards")
_METRICS = {
    field: Metrics.counter("progress", name) for field, name in zip(_FIELDS, (
        "inputs_read", "input_bytes_read", "records_written", "bytes_written", "shards_done"))
}
_PLANNED = {field: Metrics.counter("progress", f"{field}_planned")
            for field in ("inputs", "input_bytes", "shards")}


class ProgressOptions(PipelineOptions):
    """``--progress_seconds`` as a pipeline option: the job carries it to the
    processes that run its steps (a Dataflow worker has no other way to learn it)."""

    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--progress_seconds", type=float, default=None,
                            help="seconds between the progress lines each worker process "
                            "logs (default 30; 0: none)")


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The counters at one moment; ``planned_*`` are ``None`` until known."""

    inputs: int = 0
    input_bytes: int = 0
    records: int = 0
    bytes: int = 0
    shards: int = 0
    planned_inputs: int | None = None
    planned_input_bytes: int | None = None
    planned_shards: int | None = None


class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = dict.fromkeys(_FIELDS, 0)
        self.planned: dict[str, int] = {}
        self.settled: dict[Hashable, int] = {}
        self.watched = False
        self.interval: float | None = None
        self.last_log = time.monotonic()


_state = _State()
_attempt = threading.local()  # Per writer thread: what the shard being written added so far.


def interval() -> float:
    """Seconds between the lines an unwatched process logs (0: none): as set here,
    else ``BEAM_TFRECORDS_PROGRESS_SECONDS``, else the job's ``--progress_seconds``
    (the options a worker was started with), else 30."""
    if _state.interval is None:
        given = os.environ.get(INTERVAL_ENV)
        if given is None:
            given = (RuntimeValueProvider.runtime_options or {}).get("progress_seconds")
        try:
            _state.interval = max(0.0, float(_DEFAULT_INTERVAL if given is None else given))
        except (TypeError, ValueError):
            _state.interval = _DEFAULT_INTERVAL
    return _state.interval


def set_interval(seconds: float) -> None:
    """Sets ``interval()`` for this process and the processes it starts (the
    environment carries it to the DirectRunner's worker processes)."""
    _state.interval = max(0.0, float(seconds))
    os.environ[INTERVAL_ENV] = f"{_state.interval:g}"


def watch(watched: bool) -> None:
    """Whether a reporter reads this process's counters (then they do not log)."""
    _state.watched = watched
    _state.last_log = time.monotonic()


def reset() -> None:
    """Zeroes the counters and forgets the plan (a new run in this process)."""
    with _state.lock:
        _state.counts = dict.fromkeys(_FIELDS, 0)
        _state.planned = {}
        _state.settled = {}
        _state.last_log = time.monotonic()


def add(inputs: int = 0, input_bytes: int = 0, records: int = 0, bytes: int = 0,  # pylint: disable=redefined-builtin
        shards: int = 0, counters: bool = True, metrics: bool = True) -> None:
    """Adds to the counters (and to their Beam metrics, when called in a step).

    Args:
      counters: add to the process's counters (what the progress line shows).
      metrics: add to the Beam metrics; ``False`` on a thread of a step's own
        (Beam's metrics are per bundle thread), whose caller adds them later on
        the bundle's thread with ``counters=False``.
    """
    deltas = (inputs, input_bytes, records, bytes, shards)
    if counters:
        with _state.lock:
            counts = _state.counts
            for field, delta in zip(_FIELDS, deltas):
                counts[field] += delta
    for field, delta in zip(_FIELDS, deltas):
        if delta and metrics:
            _METRICS[field].inc(delta)
    if not _state.watched and interval() and time.monotonic() - _state.last_log >= interval():
        _log_unwatched()


def plan(inputs: int | None = None, input_bytes: int | None = None,
         shards: int | None = None) -> None:
    """Sets what the run expects (each value once it is known), and counts it in
    the Beam counter ``progress/<field>_planned`` when called in a step."""
    with _state.lock:
        for field, value in (("inputs", inputs), ("input_bytes", input_bytes), ("shards", shards)):
            if value is not None:
                _state.planned[field] = int(value)
    for field, value in (("inputs", inputs), ("input_bytes", input_bytes), ("shards", shards)):
        if value:
            _PLANNED[field].inc(int(value))


def inputs_at(key: Hashable, count: int, input_bytes: int | None = None, done: bool = False) -> None:
    """Says that the reader ``key`` (e.g. one file's state) has taken ``count``
    inputs, and ``input_bytes`` of its input (``None``: as before), so far: these
    may go back and forth while it reads (rows read again, an estimate made
    exact), and the counters follow. ``done``: its last word."""
    with _state.lock:
        before_count, before_bytes = _state.settled.get(key, (0, 0))
        input_bytes = before_bytes if input_bytes is None else int(input_bytes)
        if done:
            _state.settled.pop(key, None)
        else:
            _state.settled[key] = (count, input_bytes)
    add(inputs=count - before_count, input_bytes=input_bytes - before_bytes)


def bytes_taken(counts, lines) -> int | None:
    """An estimate of the bytes of a text file that its parser's consumer has
    taken: the reader reads ahead (``counts.counted_to`` bytes holding
    ``counts.newlines`` lines), the consumer has reached line ``lines[-1]``.
    ``None`` without lines."""
    if not len(lines):
        return None
    taken = int(lines[-1])
    return counts.counted_to * min(taken, counts.newlines) // max(counts.newlines, 1)


def writing(records: int, nbytes: int) -> None:
    """A writer wrote ``records`` and ``nbytes`` more of the shard it is writing."""
    _attempt.records = getattr(_attempt, "records", 0) + records
    _attempt.bytes = getattr(_attempt, "bytes", 0) + nbytes
    add(records=records, bytes=nbytes)


def written(records: int, nbytes: int) -> None:
    """The shard this thread was writing holds ``records`` and ``nbytes`` (as
    stored, compressed or not): the counters take these in place of its pieces."""
    add(records=records - getattr(_attempt, "records", 0), bytes=nbytes - getattr(_attempt, "bytes", 0))
    _attempt.records = _attempt.bytes = 0


def write_failed() -> None:
    """The shard this thread was writing failed and will be written again."""
    written(0, 0)


def snapshot() -> Snapshot:
    """The counters now."""
    with _state.lock:
        counts, planned = dict(_state.counts), dict(_state.planned)
    return Snapshot(**counts, **{f"planned_{k}": v for k, v in planned.items()})


def _log_unwatched() -> None:
    with _state.lock:
        now = time.monotonic()
        if now - _state.last_log < interval():
            return
        _state.last_log = now
        counts = dict(_state.counts)
    _log.info("progress (process %d): %s inputs read (%.0f MB), %s records written (%.0f MB), "
              "%s shards done", os.getpid(), f"{counts['inputs']:,}", counts["input_bytes"] / 1e6,
              f"{counts['records']:,}", counts["bytes"] / 1e6, f"{counts['shards']:,}")


def split_totals(results: Iterable) -> dict:
    """``{split: {records, shards, bytes, seconds}}`` of shard results (``ShardResult``),
    for the run report; ``seconds`` spans the split's shard writes, from the first
    one's start to the last one's end (0 when unknown)."""
    totals: dict[str, dict] = {}
    spans: dict[str, list] = {}
    for result in sorted(results, key=lambda r: (r.split, r.index)):
        split = totals.setdefault(result.split, {"records": 0, "shards": 0, "bytes": 0})
        split["records"] += result.records
        split["shards"] += 1
        split["bytes"] += result.bytes
        span = getattr(result, "write_span", ())
        if span:
            spans.setdefault(result.split, []).append(span)
    for split, values in totals.items():
        found = spans.get(split)
        values["seconds"] = round(max(e for _, e in found) - min(s for s, _ in found), 3) if found else 0.0
    return totals


_LULL_LOGGER = "apache_beam.runners.worker.worker_status"
_STACK = "Current Traceback:\n%s"


class _LullWithoutStack(logging.Filter):
    """Beam's "Operation ongoing ... Current Traceback: <stack>" warning (and the
    like) without the stack: every frame of the step's thread, each time."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.msg if isinstance(record.msg, str) else ""
        if record.levelno < logging.ERROR and text.endswith(_STACK) and isinstance(record.args, tuple):
            record.msg = text[:-len(_STACK)].rstrip() + (
                " (stack trace left out by beam-tfrecords: this worker's progress lines say "
                "what the step is doing)")
            record.args = record.args[:-1]
        return True


def quiet_lull_logs() -> None:
    """Makes Beam's SDK harness log a long-running step without its stack trace, in
    this process (once; done on import)."""
    logger = logging.getLogger(_LULL_LOGGER)
    if not any(isinstance(f, _LullWithoutStack) for f in logger.filters):
        logger.addFilter(_LullWithoutStack())


quiet_lull_logs()
