"""What ``convert`` shows on the console while it runs and when it ends.

While it runs: one line for the whole job, redrawn in place on a terminal
(``converting: 2,310/3,142 images read · 1,904 records written · 412 MB ·
96 MB/s · shards 3/4 · ETA 0:11``), or, when stderr is not a terminal (a log
file, CI), the same as a log line every ``--progress_seconds``. The numbers are
the counters of ``transforms.io.progress``, which the steps bump in this process
on the in-process DirectRunner. Where the steps run in other processes
(Dataflow, the DirectRunner's ``multi_processing`` mode) this process's
counters stay at zero, so nothing is drawn here: each worker logs its own
counts, and Dataflow shows the ``progress`` counters.

When it ends: a table per split of records, shards, MB and time, from the run
report (``summary_table``), then what the run found and, when it published
nothing, why (``print_summary``).

Also: ``quiet_logs`` drops log lines a user cannot act on (Beam saying it
chose the DirectRunner because no ``--runner`` was given); ``printable`` and
``EscapingStream`` keep control characters (and every other character a terminal
would act on or hide) in file names and values from reaching the terminal raw:
they are printed as escapes (``\x1b``, ``\u202e``).
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Sequence

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_tfrecords.schemas.annotations import PROBLEM_REASONS
from beam_tfrecords.schemas.manifest import REPORT_NAME
from beam_tfrecords.schemas.options import PROGRESS_MODES
from beam_tfrecords.schemas.report import RunReport, Status
from beam_tfrecords.transforms.commit_step import RunFailed
from beam_tfrecords.transforms.io import files, progress

__all__ = [
    "PROGRESS_MODES",
    "EscapingFormatter",
    "EscapingStream",
    "Reporter",
    "clear_line",
    "print_summary",
    "printable",
    "quiet_logs",
    "summary_table",
]

# PROGRESS_MODES: --progress's choices, declared with it (schemas.options).
_BAR_SECONDS = 0.25  # Redraws of the terminal line: at most 4 a second.
_RATE_WINDOW = 5.0  # Seconds over which the rate is measured.
_log = logging.getLogger("beam_tfrecords.progress")
_active: Reporter | None = None
# The progress line's lock while this process forks (``_hold_line``).
_held_for_fork: list = []


def _hold_line() -> None:
    """Before a fork (helper processes, ``transforms.io.helpers``): the progress
    line's lock is taken, so that the child does not start with it held by a thread
    it does not have (a log line the child writes would wait for it forever)."""
    reporter = _active
    if reporter is not None:
        reporter._lock.acquire()  # pylint: disable=protected-access
        _held_for_fork.append(reporter._lock)  # pylint: disable=protected-access


def _release_line() -> None:
    """After a fork, in the parent and in the child: the lock ``_hold_line`` took."""
    while _held_for_fork:
        _held_for_fork.pop().release()


os.register_at_fork(before=_hold_line, after_in_parent=_release_line, after_in_child=_release_line)


def printable(text: str, keep: str = "\n") -> str:
    """``text`` safe to show on a terminal: every character that is not printable
    (control characters such as ESC or CR, format characters such as U+202E, line
    separators, the lone surrogates an undecodable file name is read as, unassigned
    code points) is written as an escape: ``\\x1b``, ``\\u202e``; the characters
    of ``keep`` (newlines) pass as they are."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable() or char in keep:
            out.append(char)
        else:
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
    return "".join(out)


class EscapingStream:
    """A text stream whose writes pass through ``printable`` (newlines kept): the
    CLI's stdout and stderr, so that no name or value printed reaches the terminal
    raw. ``raw`` is the stream underneath (the progress line draws there)."""

    def __init__(self, stream):
        self.raw = stream

    def write(self, text: str) -> int:
        self.raw.write(printable(text))
        return len(text)

    def __getattr__(self, name):
        return getattr(self.raw, name)


def raw_stream(stream):
    """The stream underneath an ``EscapingStream``, else ``stream`` itself."""
    return stream.raw if isinstance(stream, EscapingStream) else stream


class EscapingFormatter(logging.Formatter):
    """Log records with ``printable`` text (tracebacks keep their newlines)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


class _NotForUsers(logging.Filter):
    """Drops log records that are not about the user's data and that a user
    cannot act on, and Beam's log of the commit's verdict (``RunFailed``, which the
    commit raises so that the job ends failed, and which Beam logs as an ERROR of
    the step): the launcher ends the run with that verdict, in one line."""

    _MESSAGES = (
        # Beam, on every run without --runner: the DirectRunner is the documented default.
        "Missing pipeline option (runner)",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, RunFailed) or (
                record.exc_info and isinstance(record.exc_info[1], RunFailed)):
            return False
        message = record.msg if isinstance(record.msg, str) else ""
        return not message.startswith(self._MESSAGES)


def quiet_logs() -> None:
    """Installs the filter of lines not for users on the root logger's handlers."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _NotForUsers) for f in handler.filters):
            handler.addFilter(_NotForUsers())


def runs_in_process(beam_args: Sequence[str]) -> bool:
    """Whether the runner runs every step in this process (the DirectRunner's
    in-memory and multi-threading modes), where this process's counters see them."""
    options = PipelineOptions(list(beam_args))
    runner = options.view_as(StandardOptions).runner
    mode = options.view_as(DirectOptions).direct_running_mode
    return runner in (None, "DirectRunner", "direct") and mode in (None, "in_memory", "multi_threading")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return (f"{hours}:" if hours else "") + (f"{rest // 60:02d}" if hours else f"{rest // 60}") + f":{rest % 60:02d}"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:,.0f} MB" if nbytes >= 10e6 else f"{nbytes / 1e6:.1f} MB"


class Reporter:
    """Shows a run's progress from ``transforms.io.progress`` while it runs.

    Args:
      mode: ``bar`` (one line redrawn in place), ``log`` (a log line every
        ``seconds``) or ``off``; ``auto``: ``bar`` when ``stream`` is a terminal,
        else ``log``. ``seconds`` 0 is ``off``.
      seconds: seconds between log lines (and between workers' own lines).
      in_process: whether the steps run in this process (see ``runs_in_process``);
        when not, nothing is shown here.
      stream: where the line goes (default: stderr).
    """

    def __init__(self, mode: str = "auto", seconds: float = 30.0, in_process: bool = True,
                 stream=None):
        if mode not in PROGRESS_MODES:
            raise ValueError(f"--progress must be one of {', '.join(PROGRESS_MODES)}; got {mode!r}")
        if seconds < 0:
            raise ValueError(f"--progress_seconds must be 0 (no progress) or more; got {seconds:g}")
        # The line's own control codes (CR, erase to the end) must reach the terminal.
        self._stream = stream if stream is not None else raw_stream(sys.stderr)
        if mode == "auto":
            terminal = getattr(self._stream, "isatty", lambda: False)()
            mode = "bar" if terminal else "log"
        self.mode = "off" if seconds == 0 else mode
        self.seconds = seconds
        self.in_process = in_process
        self.unit = "images"
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = ""  # The line on screen ('' when none).
        self._started = time.monotonic()
        self._first_input: float | None = None
        self._samples: collections.deque = collections.deque()
        self._handlers: list[tuple[logging.Handler, object, logging.Filter]] = []
        self._sep = " · "
        try:
            self._sep.encode(getattr(self._stream, "encoding", None) or "ascii")
        except (UnicodeEncodeError, LookupError):
            self._sep = " | "

    @property
    def elapsed(self) -> float:
        """Seconds since the reporter was made (the run's wall time, for the CLI)."""
        return time.monotonic() - self._started

    def on_plan(self, show_plan: Callable) -> Callable:
        """``convert``'s ``on_plan``: calls ``show_plan(plan)``, then starts showing."""

        def planned(plan) -> None:
            show_plan(plan)
            self.start(plan)

        return planned

    def start(self, plan=None) -> None:
        """Starts showing progress (of a run planned as ``plan``, a ``RunPlan``)."""
        global _active  # pylint: disable=global-statement
        progress.reset()
        progress.set_interval(0 if self.mode == "off" else self.seconds)
        if plan is not None and plan.is_table:
            self.unit = "rows"
            progress.plan(input_bytes=sum(size for _, size in plan.table_inputs))
        if self.mode == "off":
            progress.watch(True)  # Nor do the steps log their own lines here.
            return
        if not self.in_process:
            _log.info("progress: this runner runs the steps in other processes; each logs its "
                      "progress every %g s (Dataflow also shows the 'progress' counters)",
                      self.seconds)
            return
        progress.watch(True)
        if self.mode == "bar":
            self._wrap_log_handlers()
        _active = self
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops showing progress; the terminal line is cleared."""
        global _active  # pylint: disable=global-statement
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            # The last state is shown even when a run ends within a tick.
            if self.mode == "bar":
                self._draw(progress.snapshot())
            elif self.mode == "log":
                _log.info("%s", self.line(progress.snapshot(), sep=", "))
        self.clear()
        for handler, stream, log_filter in self._handlers:
            handler.removeFilter(log_filter)
            handler.setStream(stream)
        self._handlers = []
        progress.watch(False)
        if _active is self:
            _active = None

    # --- the line ---------------------------------------------------------------------

    def fields(self, snap: progress.Snapshot, now: float | None = None) -> list[tuple[int, str]]:
        """The pieces of the progress line, ``(priority, text)``, in order; the
        lowest priorities are left out first when the line is too wide."""
        now = time.monotonic() if now is None else now
        if self._first_input is None and (snap.inputs or snap.input_bytes):
            self._first_input = now
        rate = self._rate(now, snap.input_bytes if self.unit == "rows" else snap.bytes)
        eta = self._eta(snap, now)
        speed = []
        if rate is not None and (self._fraction(snap) or 0) < 1:  # None once all is read.
            speed = [(2, f"{rate / 1e6:,.0f} MB/s" if rate >= 10e6 else f"{rate / 1e6:.1f} MB/s")]
        if self.unit == "rows":  # The rate is of the input taken.
            fields = [(9, f"{snap.inputs:,} rows read")]
            if snap.planned_input_bytes:
                fields.append((5, f"{snap.input_bytes / 1e6:,.0f}/{_mb(snap.planned_input_bytes)} read"))
            fields += [*speed, (4, f"{snap.records:,} records written"), (6, _mb(snap.bytes))]
        else:  # The rate is of the records written.
            total = f"/{snap.planned_inputs:,}" if snap.planned_inputs is not None else ""
            fields = [(9, f"{snap.inputs:,}{total} images read"), (4, f"{snap.records:,} records written"),
                      (6, _mb(snap.bytes)), *speed]
        shards = f"/{snap.planned_shards}" if snap.planned_shards is not None else ""
        fields.append((7, f"shards {snap.shards}{shards}"))
        if eta:
            fields.append((8, eta))
        return fields

    def line(self, snap: progress.Snapshot, width: int | None = None, sep: str | None = None,
             now: float | None = None) -> str:
        """The progress line, at most ``width`` characters (unbounded when ``None``)."""
        sep = self._sep if sep is None else sep
        fields = self.fields(snap, now)
        if snap == progress.Snapshot():
            return "converting: starting"
        text = "converting: " + sep.join(t for _, t in fields)
        while width is not None and len(text) > width and len(fields) > 1:
            fields.remove(min(fields, key=lambda f: f[0]))
            text = "converting: " + sep.join(t for _, t in fields)
        return text[:width] if width is not None else text

    def _rate(self, now: float, value: int) -> float | None:
        samples = self._samples
        samples.append((now, value))
        while len(samples) > 2 and now - samples[1][0] >= _RATE_WINDOW:
            samples.popleft()
        (then, before) = samples[0]
        return (value - before) / (now - then) if now - then >= 1.0 else None

    @staticmethod
    def _fraction(snap: progress.Snapshot) -> float | None:
        """How much of the input is taken (by bytes when known); ``None``: unknown."""
        if snap.planned_input_bytes:
            return snap.input_bytes / snap.planned_input_bytes
        if snap.planned_inputs:
            return snap.inputs / snap.planned_inputs
        return None

    def _eta(self, snap: progress.Snapshot, now: float) -> str:
        done = self._fraction(snap)
        if done is None:
            return ""
        if done >= 1:
            return "finishing" if snap.planned_shards is None or snap.shards < snap.planned_shards else ""
        if self._first_input is None or done <= 0 or now - self._first_input < 2.0:
            return ""
        return f"ETA {_duration((now - self._first_input) * (1 - done) / done)}"

    # --- drawing ----------------------------------------------------------------------

    def _run(self) -> None:
        # Sampled every tick in both modes, so that a log line has a rate and an ETA.
        next_log = time.monotonic() + self.seconds
        while not self._stop.wait(_BAR_SECONDS):
            snap, now = progress.snapshot(), time.monotonic()
            if self.mode == "bar":
                self._draw(snap)
            elif now >= next_log:
                next_log = now + self.seconds
                _log.info("%s", self.line(snap, sep=", ", now=now))
            else:
                self.fields(snap, now)

    def _draw(self, snap: progress.Snapshot) -> None:
        width = shutil.get_terminal_size((80, 24)).columns - 1
        text = self.line(snap, width)
        with self._lock:
            if text == self._shown:
                return
            self._stream.write("\r" + printable(text, keep="") + "\x1b[K")
            self._stream.flush()
            self._shown = text

    def clear(self) -> None:
        """Clears the line on the terminal, if one is shown (the next tick redraws it)."""
        with self._lock:
            if self._shown:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
                self._shown = ""

    def _wrap_log_handlers(self) -> None:
        """Log records to the terminal clear the line first; the run's own INFO lines
        (each step's start and end) are left out, since the line and the summary say
        the same; warnings and errors stay."""
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self._stream:
                log_filter = _StepLines()
                handler.addFilter(log_filter)
                self._handlers.append((handler, handler.setStream(_LineAware(self._stream, self)),
                                       log_filter))


class _StepLines(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("beam_tfrecords")


class _LineAware:
    """A stream whose writes clear the reporter's line first."""

    def __init__(self, stream, reporter: Reporter):
        self._stream = stream
        self._reporter = reporter

    def write(self, text: str) -> int:
        with self._reporter._lock:  # pylint: disable=protected-access
            self._reporter.clear()
            return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def clear_line() -> None:
    """Clears the progress line of the running reporter, if any (before a last message)."""
    if _active is not None:
        _active.clear()


# --- the summary ----------------------------------------------------------------------


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 100 else _duration(value)


def summary_table(report: RunReport, seconds: float | None = None) -> list[str]:
    """The lines of the end-of-run table: records, shards, MB and time per split
    (from the run report's ``splits``), and the total (the run's wall time,
    ``seconds``, when given). Without ``splits`` (an older report), one line."""
    splits = report.splits
    if splits is None:
        return [f"records: {report.records} in {report.shards} shards, "
                f"{report.bytes / 1e6:.1f} MB"]
    rows = [("split", "records", "shards", "MB", "time")]
    for split, values in sorted(splits.items()):
        rows.append((split, f"{values['records']:,}", f"{values['shards']:,}",
                     f"{values['bytes'] / 1e6:,.1f}", _seconds(values["seconds"])))
    rows.append(("total", f"{report.records:,}", f"{report.shards:,}",
                 f"{report.bytes / 1e6:,.1f}", _seconds(seconds) if seconds is not None else ""))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join([row[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(row[1:], widths[1:]))]).rstrip()
             for row in rows]
    return [*lines, "(time: a split's from its first shard's write to its last's; total: the whole run)"]


def print_summary(report: RunReport, seconds: float | None, drift_exit: int) -> None:
    """Prints the end of a run: what was written (``summary_table``), what was found,
    and why nothing was published, if so (``drift_exit``: the exit status of
    ``drift_found``, which the line names)."""
    if report.status == Status.FAILED:
        where = (f"report: {files.join(report.output, REPORT_NAME)}"
                 if report.report_not_written is None else "no report could be written there")
        print(f"status: failed\noutput: {report.output} (nothing published; {where})")
        print(f"RUN FAILED: {report.error}")
        return
    budget = report.error_budget
    print(f"status: {report.status.value}")
    print(f"output: {report.output}")
    print(f"manifest: {report.manifest or 'not written'}")
    print("\n".join(summary_table(report, seconds)))
    print(f"bad inputs: {budget.bad} of {budget.total} "
          f"({round(budget.bad_fraction, 6):.2%}; budget {budget.max_bad_fraction:.2%})")
    for reason, count in report.bad_records.items():
        print(f"  {reason}: {count}")
    _print_rows(report.rows)
    _print_images(report)
    _print_findings(report)
    _print_verdict(report, drift_exit)


def _print_rows(rows) -> None:
    """A table's rows and lines, as the report accounts for them."""
    if not rows:
        return
    lines = rows.get("lines", {})
    print(f"rows: {rows['in']} in = {rows.get('written', rows.get('in_sequences'))} "
          f"{'written' if 'written' in rows else 'in sequences'} + {rows['dead_lettered']} "
          f"dead-lettered ({rows['blank_skipped']} blank skipped); lines: {lines.get('in')} "
          f"in the files, {lines.get('accounted_for')} accounted for")
    multiline = rows.get("multiline_rows") or {}
    if multiline.get("rows"):
        print(f"note: {multiline['rows']} rows hold quoted newlines (the longest spans "
              f"{multiline['largest_span']} lines; first at {', '.join(multiline['first'])}); "
              "--no_quoted_newlines makes them errors if your data has none")


def _print_images(report: RunReport) -> None:
    """Images reshaped, converted to PNG or kept as stored; their duplicates."""
    image_bytes = report.image_bytes or {}
    reshaped = image_bytes.get("reshape")
    if reshaped:
        print(f"images reshaped: {', '.join(f'{what} {n}' for what, n in reshaped.items())}")
    converted = image_bytes.get("converted_to_png")
    if converted:
        print(f"converted to PNG (tf.io.decode_image cannot read them as stored): "
              f"{', '.join(f'{why} {n}' for why, n in converted.items())}")
    kept = image_bytes.get("kept")
    if kept:
        print(f"kept as they are: {', '.join(f'{why} {n}' for why, n in kept.items())}"
              + (" (16-bit PNGs decode to uint16 with dtype=tf.uint16)" if "png_16_bit" in kept else ""))
    duplicates = report.duplicates
    if duplicates:
        print(f"duplicates: {duplicates['images']} images share their content with another "
              f"({duplicates['groups']} groups; {duplicates['across_splits']} across splits, "
              f"{duplicates['within_split']} within one split); listed in the manifest's "
              "'duplicates'" + ("" if report.status == Status.LEAKAGE_FOUND else
                                (" (--fail_on_leakage refuses copies across splits)"
                                 if duplicates["across_splits"] else "")))
    if report.duplicates_dropped:
        print(f"left out as copies of other images: {report.duplicates_dropped} "
              "(--drop_duplicates; listed in the manifest's input.duplicates_dropped)")


def _print_findings(report: RunReport) -> None:
    """Columns dropped, paths passed over, dead letters, failures, shards outside the band."""
    if report.dropped_columns:
        late = report.late_columns or {}
        names = [f"{name} (first at {late[name]})" if name in late else name
                 for name in report.dropped_columns]
        print(f"columns dropped (not in the schema): {', '.join(names)} "
              "(--strict_schema refuses them; 'skip: true' in the schema drops one on purpose)")
    skipped = report.skipped
    paths = {reason: count for reason, count in (skipped or {}).get("by_reason", {}).items()
             if report.annotations is None or reason not in PROBLEM_REASONS}  # Not paths: _print_annotations.
    if paths:
        reasons = ", ".join(f"{reason} {count}" for reason, count in paths.items())
        print(f"paths passed over while listing (not inputs): {reasons}; see "
              f"{files.join(report.output, skipped['file'])}")
    _print_annotations(report)
    for path in report.dead_letter_files:
        print(f"dead letter: {files.join(report.output, path)}")
    for failure in report.failures:
        if report.status == Status.COMMIT_FAILED:
            print(f"COMMIT FAILED: {failure.error}")
        else:
            print(f"VERIFICATION FAILED: {failure.path}: {failure.error}")
    for path in report.shards_outside_band:
        print(f"warning: shard outside the size band: {path}")


# Problems that refuse an image (the bad inputs' lines count them) or pass one over
# (--masks: an image without a mask); every other reason of PROBLEM_REASONS leaves
# out an object (or a part of one) and keeps the image. Reasons outside
# PROBLEM_REASONS are what the workers counted (box_clipped, exif_rotated, ...).
_IMAGE_REFUSED = ("bad_annotation_file", "image_not_found", "annotation_not_found", "bad_image_entry",
                  "annotation_size_mismatch", "mask_size_mismatch", "bad_mask")
_IMAGE_PASSED_OVER = ("mask_not_found",)
# Problems that leave out no object: a segmentation not rendered (the object kept, its
# mask empty), an image the layout put in two splits (kept in the first).
_KEPT_WHOLE = ("segmentation_invalid", "split_conflict")


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 'es' if word.endswith('x') else 's'}"


def _annotations_line(accounting) -> str | None:
    """The summary's line of an annotated run (``RunReport.annotations``): objects left
    out by reason, what was counted (boxes clipped, EXIF orientations), images passed
    over and without objects; ``None`` for a plain run."""
    if not accounting:
        return None
    problems = dict(accounting.get("problems") or {})
    left = {r: n for r, n in problems.items()
            if r in PROBLEM_REASONS and r not in _IMAGE_REFUSED + _IMAGE_PASSED_OVER + _KEPT_WHOLE}
    parts = [f"{_plural(sum(left.values()), 'object')} left out ({', '.join(f'{r} {n:,}' for r, n in left.items())})"
             ] if left else []
    clipped = problems.get("box_clipped", 0)
    if clipped:
        parts.append(f"{_plural(clipped, 'box')} clipped to the image")
    counted = {r: n for r, n in problems.items()
               if (r not in PROBLEM_REASONS or r in _KEPT_WHOLE) and r != "box_clipped"}
    if counted:
        parts.append("counted: " + ", ".join(f"{r} {n:,}" for r, n in counted.items()))
    passed = sum(problems.get(r, 0) for r in _IMAGE_PASSED_OVER)
    if passed:
        parts.append(f"{_plural(passed, 'image')} without a mask, not converted")
    listed, dropped = accounting.get("listed_without_objects", 0), accounting.get("dropped_empty", 0)
    written = accounting.get("images_without_objects", 0)
    parts.append(f"{_plural(listed, 'image')} without objects listed, {dropped:,} left out (--drop_empty)"
                 if dropped else f"{_plural(written, 'image')} without objects written")
    if not left:
        parts.insert(0, "no object left out")
    return f"annotations: {'; '.join(parts)}" + ("; see dead_letter/" if left or passed else "")


def _print_annotations(report: RunReport) -> None:
    line = _annotations_line(report.annotations)
    if line:
        print(line)
        if (report.annotations.get("problems") or {}).get("exif_orientation_not_applied"):
            print("  exif_orientation_not_applied: images with an EXIF orientation other than 1 whose "
                  "annotations state no size (or the stored one): stored as in the file, boxes as given "
                  "(TensorFlow ignores EXIF orientation)")


def _print_verdict(report: RunReport, drift_exit: int) -> None:
    """Why nothing was published (one line per reason), and the drift gate's verdict."""
    if report.status == Status.ACCOUNTING_FAILED:
        print("ACCOUNTING FAILED: the rows read do not account for every line of the input "
              "(see rows and lines above), so nothing was published; check the file's line "
              "endings and quoting")
    if report.status == Status.SPLIT_NAME_CLASH:
        clashes = "; ".join(" and ".join(f"'{name}' ({count:,} record{'' if count == 1 else 's'})"
                                         for name, count in group.items())
                            for group in report.split_name_clash)
        print(f"SPLIT NAMES CLASH: splits {clashes} differ only in case: their shard files would be "
              "one file on a case-insensitive file system, so nothing was published; give each "
              "split one spelling (a table: in its --split_column cells) and run again")
    if report.status == Status.LEAKAGE_FOUND:
        groups = report.leakage["groups"]
        print(f"LEAKAGE FOUND: {groups} image{'s have' if groups > 1 else ' has'} copies in more "
              "than one split (see run_report.json 'leakage'), so nothing was published "
              "(--fail_on_leakage); remove the copies (--drop_duplicates drops files with "
              "equal bytes; copies stored alike from different files, such as one picture "
              "as PNG and TIFF, need removing by hand)")
    drift = report.drift
    if drift and drift["status"] == "failed" and report.status == Status.DRIFT_FOUND:
        print(f"drift: {drift['message']}; DRIFT FOUND, so nothing was published (exit "
              f"{drift_exit}; every check is in run_report.json 'drift')")
    elif drift:
        print(f"drift: {drift['message']}")
    if report.status == Status.NO_RECORDS:
        print("NO RECORDS WRITTEN: no input image or row could be converted; no manifest was written")
    if report.error_budget.exceeded:
        print("ERROR BUDGET EXCEEDED: too many inputs were bad, so nothing was published "
              "(no manifest, no shard at a final name); see the dead letter files, fix the "
              "inputs or raise --max_bad_fraction, and run again")
