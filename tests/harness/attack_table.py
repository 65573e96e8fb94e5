"""A seeded table of attacks on the command line (issue "No silent wrongness").

Every case builds its inputs (fixed seeds) in a fresh folder, runs the real CLI as a
subprocess (``python -m beam_tfrecords ...`` with ``PYTHONHASHSEED=0``) and counts
what came out from the files themselves, never from the product's own report:

exit
    the exit status (``None``: killed at the case's time limit).
first line (``Run.message``), the one line the user is meant to read, found in this order:
    1. stderr: the last line starting with ``beam-tfrecords `` (the CLI's own verdict,
       ``beam-tfrecords <cmd>: error: ...`` or ``beam-tfrecords <cmd>: interrupted; ...``;
       log lines start with a timestamp and never match);
    2. stdout: the first verdict line of the summary: ``dry run: ...``, an all-capitals
       phrase ending in a colon (``RUN FAILED:``, ``ERROR BUDGET EXCEEDED:``,
       ``ACCOUNTING FAILED:``, ``NO RECORDS WRITTEN:``, ``VERIFICATION FAILED:``,
       ``COMMIT FAILED:``), or a ``verify`` line starting with ``FAIL``;
    3. stdout: the summary's ``status: ...`` line;
    4. the last non-empty line of stdout (else of stderr), or ``""``.
in
    rows: the data lines after the header (blank lines included); files: every entry
    the case created under the input folder (non-images and odd entries included), or
    the rows of an image manifest.
written
    records read back from the shards at final names (``OUT/*.tfrecord*``).
dead-lettered
    lines of ``OUT/dead_letter/*.jsonl``, ``skipped.jsonl`` excepted.
skipped
    tables: blank rows, plus rows that CSV quoting put inside another row's cell (kept,
    not lost); folders: lines of ``dead_letter/skipped.jsonl`` plus plainly-not-image
    files (the manifest's ``input.ignored_files``).
nothing lost
    a published run (``manifest.json`` present): ``in == written + dead-lettered +
    skipped`` and every input is found, by identity (a row's id or line number, a
    file's name), exactly once among them; a run that published nothing: no
    ``manifest.json`` and no shard at a final name.

Every case also fails on a ``Traceback (most recent call last)`` anywhere in stdout
or stderr, on an exit 0 that published something with a row or file missing, and
on its own extra checks (``Outcome.problems``).

``python tests/harness/attack_table.py [--out FILE.md] [--only SUBSTRING]`` prints the table
(exit 1 when a case is not as expected); ``tests/test_attacks.py`` runs each case as
a test.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

if __package__ in (None, ""):  # Run as a script: make ``tests`` (and the repo) importable.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# pylint: disable=wrong-import-position
from beam_tfrecords.samples import make_class_folder_sample, make_csv_manifest_sample
from tests.conftest import load_manifest, read_dataset
from tests.test_image_safety import BOMBS, _mutants, _pillow_decodes
from tests.test_input_kinds import _rewrite_csv
from tests.test_odd_paths import SECRET

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
RUN_TIMEOUT = 300.0  # seconds for one CLI run: generous, runs take 2-10 s
TRACEBACK = "Traceback (most recent call last)"
CONVERT_ERROR = r"^beam-tfrecords convert: error: "
STATUS_OK = r"^status: ok$"
_VERDICT = re.compile(r"^(dry run:|[A-Z]{2,}(?: [A-Z]{2,})*:|\s*FAIL\s)")
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
_ROWS_LINE = re.compile(r"^rows: (\d+) in = (\d+) written \+ (\d+) dead-lettered \((\d+) blank "
                        r"skipped\); lines: (\d+) in the files, (\d+) accounted for$", re.M)


class Skip(Exception):
    """The case cannot run here (e.g. no permission to mount a tmpfs)."""


# --------------------------------------------------------------------------------------
# runs
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    argv: list[str]
    exit: int | None
    stdout: str
    stderr: str
    elapsed: float

    @property
    def message(self) -> str:
        """The first line of the message the user sees (see the module docstring)."""
        err = [line for line in self.stderr.splitlines() if line.startswith("beam-tfrecords ")]
        if err:
            return err[-1]
        out = self.stdout.splitlines()
        for line in out:
            if _VERDICT.match(line):
                return line.strip()
        for line in out:
            if line.startswith("status: "):
                return line
        for lines in (out, self.stderr.splitlines()):
            nonempty = [line for line in lines if line.strip()]
            if nonempty:
                return nonempty[-1].strip()
        return ""

    @property
    def stray_stderr(self) -> list[str]:
        """Lines of stderr that are neither log records nor the CLI's one-line verdict
        (a traceback, a Python warning, a helper process's noise)."""
        verdict = self.message
        return [line for line in self.stderr.splitlines()
                if line.strip() and not _LOG_RECORD.match(line) and line != verdict]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of every run: ours, minus test hooks and emulator settings
    inherited from elsewhere, plus a fixed hash seed."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("BEAM_TFRECORDS_") and k != "STORAGE_EMULATOR_HOST"}
    env["PYTHONHASHSEED"] = "0"
    env.update(extra)
    return env


def cli(work: Path, *argv: str, env: dict[str, str] | None = None,
        timeout: float = RUN_TIMEOUT) -> Run:
    """``python -m beam_tfrecords ARGV`` in ``work``, to its end (or its time limit)."""
    command = [sys.executable, "-m", "beam_tfrecords", *argv]
    start = time.monotonic()
    with open(work / "stdout.txt", "w+", encoding="utf-8") as out, \
            open(work / "stderr.txt", "w+", encoding="utf-8") as err:
        proc = subprocess.Popen(command, cwd=work, env=env or cli_env(), stdout=out, stderr=err,
                                text=True, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_session(proc)
        out.seek(0)
        err.seek(0)
        return Run(command[3:], code, out.read(), err.read(), time.monotonic() - start)


def _kill_session(proc: subprocess.Popen) -> None:
    """Ends what is left of a run we started (its own session: helpers included)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


# --------------------------------------------------------------------------------------
# what a run left behind
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    """An output folder, read back."""

    manifest: dict | None
    shards: list[str]
    records: list[dict]  # every record of every shard at a final name, parsed
    dead: list[dict]     # dead letters, skipped.jsonl excepted
    skipped: list[dict]  # lines of dead_letter/skipped.jsonl

    @property
    def published(self) -> bool:
        return self.manifest is not None

    @property
    def nothing_published(self) -> bool:
        return self.manifest is None and not self.shards


def tally(out: str) -> Tally:
    if out.startswith("gs://") or not os.path.isdir(out):
        return Tally(None, [], [], [], [])
    manifest = load_manifest(out) if os.path.exists(os.path.join(out, "manifest.json")) else None
    shards = sorted(n for n in os.listdir(out) if ".tfrecord" in n)
    records = [r for name, rs in read_dataset(out).items() for r in rs] if shards else []
    dead, skipped = [], []
    folder = os.path.join(out, "dead_letter")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                letters = [json.loads(line) for line in f if line.strip()]
            (skipped if name == "skipped.jsonl" else dead).extend(letters)
    return Tally(manifest, shards, records, dead, skipped)


@dataclasses.dataclass
class Outcome:
    case: str
    runs: list[Run]
    n_in: int | None = None
    written: int | None = None
    dead: int | None = None
    skipped: int | None = None
    nothing_lost: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    skip_reason: str | None = None
    published: bool = False  # manifest.json was written

    @property
    def run(self) -> Run:
        return self.runs[-1]

    @property
    def ok(self) -> bool:
        return not self.problems

    def found(self, out: str) -> Tally:
        found = tally(out)
        self.published = found.published
        for what, letters in (("dead letters", found.dead), ("listed skips", found.skipped)):
            if letters:
                reasons = Counter(d["error"] for d in letters)
                self.notes.append(f"{what}: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())))
        return found

    def describe(self) -> str:
        run = self.run if self.runs else None
        lines = [f"case {self.case}: " + ("as expected" if self.ok else "NOT as expected")]
        lines += [f"  problem: {p}" for p in self.problems] + [f"  note: {n}" for n in self.notes]
        if run:
            lines += [f"  argv: {' '.join(run.argv)}", f"  exit: {run.exit} after {run.elapsed:.1f} s",
                      f"  first line: {run.message}",
                      "  stdout (tail):", *("    " + x for x in run.stdout.splitlines()[-12:]),
                      "  stderr (tail):", *("    " + x[:300] for x in run.stderr.splitlines()[-12:])]
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# inputs (seeded)
# --------------------------------------------------------------------------------------

TABLE_COLUMNS = ("id", "int", "float", "text")


@dataclasses.dataclass
class Table:
    path: str
    rows: int                    # data lines after the header, blank ones included
    ids_by_line: dict[int, int]  # physical line number -> the id written on it
    blank: int

    @property
    def lines(self) -> int:
        return self.rows + 1


def make_table(path: Path, rows: int, replace: dict[int, bytes] | None = None,
               columns: tuple[str, ...] = TABLE_COLUMNS, pad: str = "", seed: int = 1) -> Table:
    """``id`` then ``columns[1:]`` (``int``, ``float``, ``text`` or any other name: an
    int); row ``i`` holds id ``i``; ``replace`` swaps row ``i``'s line for other bytes
    (whose id is still ``i`` when it starts with ``i,``; an empty line is a blank row)."""
    rng = random.Random(seed)
    make = {"int": lambda i: str(rng.randrange(-1000, 1000)),
            "float": lambda i: f"{rng.random():.6f}",
            "text": lambda i: f"text {i}{pad}"}
    lines = [",".join(columns).encode()]
    for i in range(rows):
        cells = [str(i)] + [make.get(c, lambda i: str(rng.randrange(10**6)))(i) for c in columns[1:]]
        lines.append(",".join(cells).encode())
    for row, data in (replace or {}).items():
        lines[row + 1] = data
    path.write_bytes(b"\n".join(lines) + b"\n")
    ids = {}
    for number, line in enumerate(lines[1:], start=2):
        head = line.split(b",", 1)[0]
        if line.strip() and head.isdigit():
            ids[number] = int(head)
    return Table(str(path), rows, ids, sum(1 for line in lines[1:] if not line.strip()))


def _relative(source: str, root) -> str:
    """A dead letter's source relative to ``root`` (sources are relative to the input
    root; earlier versions wrote absolute ones)."""
    return os.path.relpath(source, root) if os.path.isabs(source) else source


def _line_of(letter: dict) -> int:
    return int(letter["source"].rsplit(":", 1)[1])


def account_table(outcome: Outcome, out: str, table: Table) -> Tally:
    """Fills in/written/dead/skipped and nothing_lost for a table run, by row id."""
    found = outcome.found(out)
    outcome.n_in, outcome.written, outcome.dead = table.rows, len(found.records), len(found.dead)
    absorbed = []  # ids of rows that quoting put inside another row's cell
    for record in found.records:
        for values in record.values():
            for value in values:
                if isinstance(value, bytes) and b"\n" in value:
                    absorbed += [int(m.group(1)) for m in
                                 re.finditer(rb"\n(\d+),", value)]
    outcome.skipped = table.blank + len(absorbed)
    if absorbed:
        outcome.notes.append(f"{len(absorbed)} rows were read into another row's quoted cell "
                             f"(lines {min(absorbed) + 2}-{max(absorbed) + 2}); exit "
                             f"{outcome.run.exit}, '{outcome.run.message}'")
    if not found.published:
        outcome.nothing_lost = found.nothing_published
        return found
    seen = Counter(r["id"][0] for r in found.records if "id" in r)
    seen.update(absorbed)
    seen.update(table.ids_by_line.get(_line_of(d), -_line_of(d)) for d in found.dead)
    expected = Counter(table.ids_by_line.values())
    missing, extra = expected - seen, seen - expected
    counts_close = table.rows == outcome.written + outcome.dead + outcome.skipped
    outcome.nothing_lost = counts_close and not missing and not extra
    if missing:
        outcome.problems.append(f"{sum(missing.values())} rows neither written nor dead-lettered "
                                f"(ids {sorted(missing)[:5]}...)")
    if extra:
        outcome.problems.append(f"rows found more than once or unknown: {sorted(extra)[:5]}")
    rows = (found.manifest.get("input") or {}).get("rows") or {}
    lines = rows.get("lines") or {}
    if lines and not lines.get("in") == lines.get("accounted_for") == table.lines:
        outcome.problems.append(f"manifest lines {lines} but the file has {table.lines} lines")
    printed = _ROWS_LINE.search(outcome.run.stdout)
    if not printed:
        outcome.problems.append("no 'rows: N in = W written + D dead-lettered ...; lines: ...' "
                                "line in the summary")
    else:
        p_in, p_w, p_d, p_blank, l_in, l_acc = map(int, printed.groups())
        if (p_in != p_w + p_d or (p_w, p_d) != (outcome.written, outcome.dead)
                or p_blank != table.blank or not l_in == l_acc == table.lines):
            outcome.problems.append(f"summary '{printed.group(0)}' does not match the files: "
                                    f"{outcome.written} written, {outcome.dead} dead-lettered, "
                                    f"{table.blank} blank, {table.lines} lines")
    return found


def _escaped(name: str) -> str:
    """A path as the product prints one that is not UTF-8 (``caf\\xe9.jpg``)."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def account_files(outcome: Outcome, out: str, root: Path, images: list[str],
                  others: int = 0) -> Tally:
    """Files under ``root``: ``images`` (relative paths, each to be written, dead-lettered
    or listed as skipped exactly once) and ``others`` plainly-not-image files (ignored)."""
    found = outcome.found(out)
    listed = found.skipped
    ignored = (found.manifest or {}).get("input", {}).get("ignored_files", 0) if found.manifest else 0
    outcome.n_in = len(images) + others
    outcome.written, outcome.dead = len(found.records), len(found.dead)
    outcome.skipped = len(listed) + ignored
    if not found.published:
        outcome.nothing_lost = found.nothing_published
        return found
    prefix = str(root) + "/"

    def rel(source: str) -> str:
        return source[len(prefix):] if source.startswith(prefix) else source

    seen = Counter(r["image/filename"][0].decode() for r in found.records)
    seen.update(rel(d["source"]) for d in found.dead)
    seen.update(rel(d["source"]) for d in listed)
    expected = Counter(_escaped(name) for name in images)
    missing, extra = expected - seen, seen - expected
    counts_close = outcome.n_in == outcome.written + outcome.dead + outcome.skipped
    outcome.nothing_lost = counts_close and not missing and not extra and ignored == others
    if missing:
        outcome.problems.append(f"files neither written, dead-lettered nor skipped: {sorted(missing)[:5]}")
    if extra:
        outcome.problems.append(f"files found twice or unknown: {sorted(extra)[:5]}")
    if ignored != others:
        outcome.problems.append(f"{ignored} files ignored as non-images; {others} expected")
    return found


def account_refused(outcome: Outcome, out: str, n_in: int | None = None) -> Tally:
    found = outcome.found(out)
    outcome.n_in, outcome.written, outcome.dead = n_in, len(found.records), len(found.dead)
    outcome.skipped = len(found.skipped) if found.skipped else None
    outcome.nothing_lost = found.nothing_published
    return found


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    title: str
    expect_exit: int
    expect_message: str  # a regex, searched in Run.message
    body: Callable[[Path, Outcome], None]
    max_seconds: float | None = None  # a bound on the (last) run's wall time

    def run(self, work: Path) -> Outcome:
        outcome = Outcome(self.name, [])
        try:
            self.body(work, outcome)
        except Skip as skip:
            outcome.skip_reason = str(skip)
            return outcome
        run = outcome.run
        if run.exit != self.expect_exit:
            outcome.problems.append(f"exit {run.exit}, expected {self.expect_exit}")
        if not re.search(self.expect_message, run.message):
            outcome.problems.append(f"first line {run.message!r} does not match {self.expect_message!r}")
        for each in outcome.runs:
            if TRACEBACK in each.stdout + each.stderr:
                outcome.problems.append(f"a traceback in the output of {' '.join(each.argv[:1])}")
            if each.stray_stderr:
                outcome.problems.append(
                    f"{len(each.stray_stderr)} lines on stderr besides log records and the one-line "
                    f"verdict, first: {each.stray_stderr[0][:200]!r}")
        if not outcome.nothing_lost:
            outcome.problems.append(
                "nothing lost does not hold: " + (
                    f"exit {run.exit} and published, but not every input is accounted for"
                    if outcome.published else "a run that published no manifest left shards at "
                    "final names"))
        if run.exit == 0 and not outcome.published and not run.message.startswith("dry run"):
            outcome.problems.append("exit 0 but no manifest.json: every input is missing")
        if self.max_seconds is not None and run.elapsed > self.max_seconds:
            outcome.problems.append(f"took {run.elapsed:.1f} s, more than {self.max_seconds:.0f} s")
        return outcome


CASES: list[Case] = []


def case(name: str, title: str, expect_exit: int, expect_message: str, **kwargs):
    def register(body):
        CASES.append(Case(name, title, expect_exit, expect_message, body, **kwargs))
        return body
    return register


def _convert(work: Path, outcome: Outcome, src: str, out: str, *flags: str, **kwargs) -> Run:
    run = cli(work, "convert", "--input", src, "--output", out, *flags, **kwargs)
    outcome.runs.append(run)
    return run


def _manifest_total(outcome: Outcome, found: Tally) -> None:
    if found.manifest:
        total = sum(s["records"] for s in found.manifest["splits"].values())
        if total != outcome.written:
            outcome.problems.append(f"manifest says {total} records, the shards hold {outcome.written}")


# --- 1-4: a 20,000-row table with damaged rows ------------------------------------------

ROWS = 20_000
EARLY, LATE = 100, 19_000


def _table_case(name, title, replace, rows=ROWS, flags=(), **make):
    @case(name, title, EXIT_OK, STATUS_OK)
    def body(work, outcome):
        table = make_table(work / "t.csv", rows, replace, **make)
        out = str(work / "out")
        _convert(work, outcome, table.path, out, *flags)
        _manifest_total(outcome, account_table(outcome, out, table))


_table_case("csv-quote-early", f"unterminated quote at row {EARLY} of {ROWS:,}",
            {EARLY: f'{EARLY},1,0.5,"never closed'.encode()})
_table_case("csv-quote-late", f"unterminated quote at row {LATE:,} of {ROWS:,}",
            {LATE: f'{LATE},1,0.5,"never closed'.encode()})
_table_case("csv-quote-early-and-late", f"unterminated quotes at rows {EARLY} and {LATE:,} "
            "(one file)", {EARLY: f'{EARLY},1,0.5,"never closed'.encode(),
                           LATE: f'{LATE},1,0.5,"never closed either'.encode()})
_table_case("csv-invalid-utf8", "invalid UTF-8 at rows 10 and 19,990",
            {10: b"10,1,0.5,caf\xe9\xff", 19_990: b"19990,1,0.5,\xc3\x28 bad"})
_table_case("csv-50mb-field", "a 50 MB quoted field in row 100 of 2,000",
            {100: b'100,1,0.5,"' + b"x" * (50 << 20) + b'"'}, rows=2000)
_table_case("csv-cell-counts", "rows with too few / too many cells, and a blank row",
            {50: b"50,1", 60: b"60,1,0.5,x,extra", 70: b"", 80: b"80"})


# --- 5: duplicate header columns ----------------------------------------------------------


def _dup_case(name, title, with_schema):
    @case(name, title, EXIT_USAGE, CONVERT_ERROR + r".*'a'")
    def body(work, outcome):
        src = work / "dup.csv"
        src.write_text("a,b,c,a\n" + "".join(f"{i},{i + 1},{i + 2},{i + 3}\n" for i in range(5)))
        flags = []
        if with_schema:
            (work / "s.yaml").write_text("columns:\n  - {name: a, type: int64}\n")
            flags = ["--schema", str(work / "s.yaml")]
        out = str(work / "out")
        _convert(work, outcome, str(src), out, *flags)
        account_refused(outcome, out, 5)
    return body


_dup_case("csv-duplicate-header", "header a,b,c,a", False)
_dup_case("csv-duplicate-header-schema", "header a,b,c,a with --schema naming a", True)


# --- 6, 8: image manifests ----------------------------------------------------------------

MANIFEST_ROWS, BROKEN_ROW = 200, 50


def _manifest_rows_accounting(outcome, out, root: Path, csv_path: Path, image_key: str):
    """Each row of an image manifest: its image written, or its line dead-lettered."""
    with open(csv_path, encoding="utf-8", newline="") as f:
        lines = f.read().splitlines()
    header = lines[0].split(",")
    images_by_line = {n: line.lstrip('"').split(",")[header.index(image_key)]
                      for n, line in enumerate(lines[1:], start=2)}
    found = outcome.found(out)
    outcome.n_in, outcome.written, outcome.dead = len(images_by_line), len(found.records), len(found.dead)
    outcome.skipped = 0
    if not found.published:
        outcome.nothing_lost = found.nothing_published
        return found
    seen = Counter(r["image/filename"][0].decode() for r in found.records)
    for letter in found.dead:
        path, _, line = letter["source"].rpartition(":")
        seen[images_by_line.get(int(line), letter["source"]) if path == str(csv_path)
             else _relative(letter["source"], root)] += 1
    expected = Counter(images_by_line.values())
    missing, extra = expected - seen, seen - expected
    outcome.nothing_lost = (outcome.n_in == outcome.written + outcome.dead) and not missing and not extra
    if missing or extra:
        outcome.problems.append(f"rows missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}")
    _manifest_total(outcome, found)
    return found


@case("manifest-quote", f"image manifest ({MANIFEST_ROWS} images), unterminated quote in row "
      f"{BROKEN_ROW}", EXIT_OK, STATUS_OK)
def _manifest_quote(work, outcome):
    root = work / "in"
    rows = make_csv_manifest_sample(str(root), n=MANIFEST_ROWS)
    csv_path = root / "manifest.csv"
    lines = csv_path.read_text(encoding="utf-8").splitlines()
    row = rows[BROKEN_ROW]
    lines[BROKEN_ROW + 1] = (f"{row['image']},{row['label']},{row['split']},{row['weight']},"
                             f"{row['source_id']},\"{row['note']} never closed")
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out)
    found = _manifest_rows_accounting(outcome, out, root, csv_path, "image")
    if found.published and not any(_line_of(d) == BROKEN_ROW + 2 for d in found.dead):
        outcome.notes.append(f"line {BROKEN_ROW + 2} was not dead-lettered")


@case("manifest-tfrecorder", "TFRecorder manifest image_uri,label,split", EXIT_OK, STATUS_OK)
def _tfrecorder(work, outcome):
    root = work / "in"
    csv_path = root / "manifest.csv"
    rows = make_csv_manifest_sample(str(root), n=MANIFEST_ROWS)
    _rewrite_csv(str(csv_path), rename={"image": "image_uri"}, keep=["image", "label", "split"])
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out)
    found = _manifest_rows_accounting(outcome, out, root, csv_path, "image_uri")
    if found.manifest:
        manifest = found.manifest
        splits = {s: v["records"] for s, v in manifest["splits"].items()}
        want = Counter(r["split"] for r in rows)
        if manifest["input"]["layout"] != "csv" or splits != dict(want):
            outcome.problems.append(f"layout {manifest['input']['layout']}, splits {splits}; "
                                    f"expected csv, {dict(want)}")
        if manifest["labels"]["vocabulary"] != sorted({r["label"] for r in rows}):
            outcome.problems.append(f"vocabulary {manifest['labels']['vocabulary']}")


# --- 7, 9: image folders ------------------------------------------------------------------

SYNSETS = ("n01440764", "n01443537", "n01484850")


def _imagenet(root: Path) -> list[str]:
    return make_class_folder_sample(str(root), per_class=4, splits=("train", "val"),
                                    classes=SYNSETS, size_range=(24, 40))


@case("imagenet-splits", "ROOT/train/<class>/, ROOT/val/<class>/", EXIT_OK, STATUS_OK)
def _imagenet_splits(work, outcome):
    root = work / "in"
    images = _imagenet(root)
    out = str(work / "out")
    _convert(work, outcome, str(root), out)
    found = account_files(outcome, out, root, images, others=1)  # README.txt
    _manifest_total(outcome, found)
    if found.manifest:
        splits = sorted(found.manifest["splits"])
        vocabulary = found.manifest["labels"]["vocabulary"]
        if splits != ["train", "val"] or vocabulary != sorted(SYNSETS):
            outcome.problems.append(f"splits {splits}, classes {vocabulary}; expected "
                                    f"['train', 'val'], {sorted(SYNSETS)}")
        for record in found.records:
            split = record["image/filename"][0].decode().split("/")[0]
            text = record["image/class/text"][0].decode()
            if text not in SYNSETS or not record["image/filename"][0].decode().startswith(split):
                outcome.problems.append(f"record {record['image/filename'][0]!r} has class {text}")
                break


# --splits applies to images too, but not to folders that already name their splits.
for _flags, _named in ((["--splits", "train=0.8,test=0.2"], "--input [^:]+: --splits"),
                       (["--split_column", "x"], "--split_column"),
                       (["--sequence_key", "k"], "--sequence_key")):
    def _table_flag(work, outcome, flags=tuple(_flags)):
        root = work / "in"
        _imagenet(root)
        out = str(work / "out")
        _convert(work, outcome, str(root), out, *flags)
        account_refused(outcome, out, None)

    _flag = _named.rsplit(" ", 1)[-1]
    case(f"folder-flag-{_flag.lstrip('-')}", f"table flag {_flag} on an image folder", EXIT_USAGE,
         CONVERT_ERROR + _named.replace("--splits", re.escape("--splits")) + r"\b")(_table_flag)


# --- 10: a partial schema -----------------------------------------------------------------

WIDE = ("id", *(f"c{i}" for i in range(1, 9)))


def _partial_schema(work: Path, outcome: Outcome, strict: bool) -> None:
    table = make_table(work / "wide.csv", 50, columns=WIDE)
    schema = work / "s.yaml"
    schema.write_text("columns:\n  - {name: id, type: int64, required: true}\n")
    out = str(work / "out")
    _convert(work, outcome, table.path, out, "--schema", str(schema),
             *(["--strict_schema"] if strict else []))
    if strict:
        account_refused(outcome, out, table.rows)
        return
    account_table(outcome, out, table)
    dropped = [line for line in outcome.run.stdout.splitlines() if re.search(r"(?i)dropped", line)]
    if not dropped or not all(c in dropped[0] for c in WIDE[1:]):
        outcome.problems.append("no summary line matching /dropped/i naming c1..c8 "
                                f"(lines naming c1: {[x for x in outcome.run.stdout.splitlines() if 'c1' in x]})")


case("schema-partial", "CSV of 9 columns, --schema names 1", EXIT_OK, STATUS_OK)(
    lambda work, outcome: _partial_schema(work, outcome, False))
case("schema-partial-strict", "the same with --strict_schema", EXIT_USAGE,
     CONVERT_ERROR + r".*\bc1\b")(lambda work, outcome: _partial_schema(work, outcome, True))


# --- 11-13: hostile images and paths ------------------------------------------------------

_BOMB_EXT = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "webp": "webp", "tiff": "tif"}


@case("image-bombs", f"{len(BOMBS)} decompression bombs among 40 good images", EXIT_OK, STATUS_OK)
def _bombs(work, outcome):
    root = work / "in"
    images = make_class_folder_sample(str(root), per_class=10, splits=None, size_range=(24, 48))
    bombs = []
    for name, (build, _, _) in sorted(BOMBS.items()):
        rel = f"circles/bomb-{name}.{_BOMB_EXT[name.split('-')[0]]}"
        (root / rel).write_bytes(build())
        bombs.append(rel)
    out = str(work / "out")
    _convert(work, outcome, str(root), out, "--max_bad_fraction", "0.5")
    found = account_files(outcome, out, root, images + bombs, others=1)
    _manifest_total(outcome, found)
    if found.published:
        reasons = {_relative(d["source"], root): d["error"] for d in found.dead}
        wrong = {b: reasons.get(b) for b in bombs if reasons.get(b) != "too_many_pixels"}
        if wrong:
            outcome.problems.append(f"bombs not dead-lettered as too_many_pixels: {wrong}")
        written = {r["image/filename"][0].decode() for r in found.records}
        if written != set(images):
            outcome.problems.append(f"good images not written: {sorted(set(images) - written)[:5]}")


FUZZ = 300


@case("image-fuzz", f"{FUZZ} fuzzed JPEGs + {FUZZ} fuzzed PNGs (seeded)", EXIT_OK, STATUS_OK)
def _fuzz(work, outcome):
    root = work / "in"
    sources = {}
    for fmt, ext in (("JPEG", "jpg"), ("PNG", "png")):
        (root / ext).mkdir(parents=True)
        for i, data in enumerate(_mutants(fmt, FUZZ)):
            rel = f"{ext}/{i:04d}.{ext}"
            (root / rel).write_bytes(data)
            sources[rel] = data
    out = str(work / "out")
    _convert(work, outcome, str(root), out, "--max_bad_fraction", "1.0")
    found = account_files(outcome, out, root, sorted(sources))
    _manifest_total(outcome, found)
    undecodable, altered = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for record in found.records:
            name, data = record["image/filename"][0].decode(), record["image/encoded"][0]
            if data != sources.get(name):
                altered.append(name)
            if not _pillow_decodes(data):
                undecodable.append(name)
        pillow = Counter(name.split("/")[0] for name, data in sources.items() if _pillow_decodes(data))
    by_kind = Counter(r["image/filename"][0].decode().split("/")[0] for r in found.records)
    outcome.notes.append(f"written: {by_kind['jpg']} JPEGs, {by_kind['png']} PNGs (a full Pillow "
                         f"decode accepts {pillow['jpg']} and {pillow['png']} of the files); in shards "
                         f"but not fully decodable by Pillow: {len(undecodable)}")
    if undecodable:
        outcome.problems.append(f"{len(undecodable)} records Pillow cannot fully decode: {undecodable[:5]}")
    if altered:
        outcome.problems.append(f"records whose bytes differ from their file: {altered[:5]}")


def make_odd_tree(root: Path, secret_dir: Path) -> tuple[list[str], list[str]]:
    """The tree of tests/test_odd_paths.py: 20 images, and a symlinked folder, a link
    loop, a FIFO, a folder named like an image, a link to a text file named .jpg and a
    file name that is not UTF-8. Returns (images, odd entries), relative to ``root``."""
    images = make_class_folder_sample(str(root), per_class=5, splits=None)
    os.symlink(root / "circles", root / "circles_again")
    os.symlink(root, root / "squares" / "loop")
    os.mkfifo(root / "stripes" / "pipe.jpg")
    os.mkdir(root / "stripes" / "folder.jpg")
    (secret_dir / "secret.txt").write_text(SECRET)
    os.symlink(secret_dir / "secret.txt", root / "triangles" / "leak.jpg")
    bad_name = os.fsencode(str(root / "triangles")) + b"/caf\xe9.jpg"
    with open(bad_name, "wb") as f, open(root / images[0], "rb") as good:
        f.write(good.read())
    odd = ["circles_again", "squares/loop", "stripes/pipe.jpg", "stripes/folder.jpg",
           "triangles/leak.jpg", os.fsdecode(b"triangles/caf\xe9.jpg")]
    return images, odd


@case("odd-paths", "non-UTF-8 name, link loop, linked folder, FIFO, folder x.jpg", EXIT_OK, STATUS_OK)
def _odd_paths(work, outcome):
    root = work / "in"
    images, odd = make_odd_tree(root, work)
    out = str(work / "out")
    _convert(work, outcome, str(root), out, "--max_bad_fraction", "0.2")
    found = account_files(outcome, out, root, images + odd, others=1)
    _manifest_total(outcome, found)
    written = sorted(r["image/filename"][0].decode() for r in found.records)
    if found.published and written != sorted(images):
        outcome.problems.append(f"written {len(written)} records, expected each of the "
                                f"{len(images)} images once")
    if SECRET in json.dumps(found.dead) or "hunter2" in outcome.run.stdout + outcome.run.stderr:
        outcome.problems.append("a file's content was echoed")


# --- 14-19: the environment ---------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(mountpoint: Path, size: str):
    mountpoint.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mountpoint)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise Skip(f"cannot mount a {size} tmpfs: {(done.stderr or done.stdout).strip()}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", str(mountpoint)], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)


@case("disk-full", "~6 MB CSV into a 3 MB tmpfs", EXIT_FAILED, r"(?i)no space left|disk")
def _disk_full(work, outcome):
    table = make_table(work / "big.csv", 80_000, pad=" " + "y" * 40)
    with tmpfs(work / "mnt", "3m") as mnt:
        out = str(mnt / "out")
        _convert(work, outcome, table.path, out)
        account_table(outcome, out, table)


@case("report-json-unwritable", "--report_json /nonexistent/dir/r.json", EXIT_USAGE,
      CONVERT_ERROR + r"--report_json: .*/nonexistent/dir/r\.json")
def _report_json(work, outcome):
    root = work / "in"
    images = make_class_folder_sample(str(root), per_class=1, splits=None)
    out = str(work / "out")
    _convert(work, outcome, str(root), out, "--report_json", "/nonexistent/dir/r.json")
    account_refused(outcome, out, len(images))
    if os.path.exists(out):
        outcome.problems.append("the output folder was created")


for _command, _argv in (("convert", ["--input", "{missing}", "--output", "{work}/out"]),
                        ("verify", ["{missing}"]),
                        ("inspect", ["{missing}"]),
                        ("infer-schema", ["--input", "{missing}.csv"])):
    def _missing(work, outcome, command=_command, argv=tuple(_argv)):
        missing = str(work / "no" / "such")
        run = cli(work, command, *(a.format(missing=missing, work=work) for a in argv))
        outcome.runs.append(run)
        account_refused(outcome, str(work / "out"), None)
        if missing not in run.message:
            outcome.problems.append(f"the first line does not name {missing}")

    case(f"missing-path-{_command}", f"{_command} of a path that does not exist", EXIT_USAGE,
         rf"^beam-tfrecords {_command}: error: ")(_missing)


def _ctrl_c(work: Path, outcome: Outcome, group: bool) -> None:
    table = make_table(work / "big.csv", 80_000, pad=" " + "y" * 40)
    out, hold = str(work / "out"), work / "hold"
    hold.mkdir()
    env = cli_env(BEAM_TFRECORDS_HOLD_AT="mid_write", BEAM_TFRECORDS_HOLD_DIR=str(hold),
                  BEAM_TFRECORDS_TEST_HOOKS="1")
    argv = ["convert", "--input", table.path, "--output", out]
    start = time.monotonic()
    with open(work / "stdout.txt", "w+", encoding="utf-8") as so, \
            open(work / "stderr.txt", "w+", encoding="utf-8") as se:
        proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", *argv], cwd=work, env=env,
                                stdout=so, stderr=se, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (hold / "mid_write").exists() and proc.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                if group:  # what a terminal's Ctrl-C does: the whole foreground group
                    os.killpg(proc.pid, signal.SIGINT)
                else:
                    proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = None
        finally:
            _kill_session(proc)
        so.seek(0)
        se.seek(0)
        run = Run(argv, code, so.read(), se.read(), time.monotonic() - start)
    outcome.runs.append(run)
    if not (hold / "mid_write").exists():
        outcome.problems.append("the run never reached the mid_write hold point")
    account_table(outcome, out, table)


case("ctrl-c", "SIGINT to the process group (a terminal's Ctrl-C) mid-write", EXIT_INTERRUPTED,
     r"^beam-tfrecords convert: interrupted")(lambda w, o: _ctrl_c(w, o, True))
case("ctrl-c-main-only", "SIGINT to the main process only, mid-write", EXIT_INTERRUPTED,
     r"^beam-tfrecords convert: interrupted")(lambda w, o: _ctrl_c(w, o, False))


@case("dataflow-dry-run", "convert --runner DataflowRunner --dry_run=True, local --input and --output",
      EXIT_USAGE, CONVERT_ERROR + r"--input .*, --output .*: Dataflow's workers cannot see this "
      r"machine's disk; use gs:// paths")
def _dry_run(work, outcome):
    from tests.test_dataflow import DRY_RUN_FLAGS  # pylint: disable=import-outside-toplevel

    root = work / "in"
    make_class_folder_sample(str(root), per_class=2, splits=None)
    (work / "gcloud").mkdir()
    env = cli_env(NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(work / "gcloud"),
                  GOOGLE_APPLICATION_CREDENTIALS=str(work / "no-such-credentials.json"),
                  TMPDIR=str(work))
    out = str(work / "out")
    _convert(work, outcome, str(root), out, *DRY_RUN_FLAGS, env=env)
    account_refused(outcome, out, None)
    if os.path.exists(out):
        outcome.problems.append("the refused run created --output")


@case("gcs-unreachable", "--output gs://bucket/out, emulator host 127.0.0.1:9 (nothing there)",
      EXIT_USAGE, CONVERT_ERROR + r".*gs://bucket", max_seconds=30)
def _gcs_unreachable(work, outcome):
    table = make_table(work / "t.csv", 100)
    env = cli_env(STORAGE_EMULATOR_HOST="http://127.0.0.1:9", BEAM_TFRECORDS_GCS_PROBE_SECONDS="3",
                  NO_GCE_CHECK="true")
    _convert(work, outcome, table.path, "gs://bucket/out", env=env, timeout=90)
    account_refused(outcome, "gs://bucket/out", table.rows)


# --- issue 18: tables (values, drift, inference, splits, messages) ---

TABLE_SCHEMA = ("columns:\n  - {name: id, type: int64}\n  - {name: int, type: int64}\n"
                "  - {name: float, type: float%s}\n  - {name: text, type: string}\n")


def _write_schema(work: Path, allow: str = "") -> str:
    path = work / "schema.yaml"
    path.write_text(TABLE_SCHEMA % allow)
    return str(path)


def _reasons_are(outcome: Outcome, found: Tally, expected: dict[str, int]) -> None:
    got = dict(Counter(d["error"] for d in found.dead))
    if got != expected:
        outcome.problems.append(f"dead letters by reason {got}, expected {expected}")


def _float_values(found: Tally, ids) -> list[float]:
    by_id = {r["id"][0]: r for r in found.records if "id" in r}
    return [by_id[i]["float"][0] for i in ids if i in by_id and by_id[i].get("float")]


def _non_finite_case(name, title, cells: dict[int, str], allow: str, expect: dict[str, int],
                     schema: bool = True, rows: int = 2000):
    @case(name, title, EXIT_OK, STATUS_OK)
    def body(work, outcome):
        table = make_table(work / "t.csv", rows,
                           {row: f"{row},1,{cell},text {row}".encode() for row, cell in cells.items()})
        out = str(work / "out")
        flags = ["--schema", _write_schema(work, allow)] if schema else []
        _convert(work, outcome, table.path, out, *flags, "--max_bad_fraction", "0.5")
        found = account_table(outcome, out, table)
        _manifest_total(outcome, found)
        _reasons_are(outcome, found, expect)
        values = _float_values(found, cells)
        if any(v == v and abs(v) != float("inf") for v in values):
            outcome.problems.append(f"a not-finite cell was written as a finite value: {values}")
        if not allow and schema and values:
            outcome.problems.append(f"not-finite values published without the schema allowing them: {values}")
    return body


_non_finite_case("table-1e400-past-the-sample", f"1e400 at row {LATE:,} of {ROWS:,}, schema inferred",
                 {LATE: "1e400"}, "", {"non_finite_value": 1}, schema=False, rows=ROWS)
# table-nonfinite-refused, table-nonfinite-allowed, table-1e39, parquet-nonfinite,
# jsonl-nonfinite, jsonl-mixed-sample, drift-nan-98, split-case-clash, splits-flag-case-clash and
# secret-in-bad-rows were the scenarios of tests/test_harm_tables.py (non-finite floats per
# format, the 98 % NaN drift, split-name clashes, a secret in bad rows), which assert them
# more closely; they are asserted there only (with this table's checks on every run).


# --- issue 18: storage (trust nothing storage hands back) ---


def held_cli(work: Path, argv: list[str], point: str, act: Callable[[], None],
             env: dict[str, str] | None = None, timeout: float = RUN_TIMEOUT) -> Run:
    """``cli`` of a run held at hold point ``point`` (under the test switch): once it
    holds, ``act()`` runs, then the run is released (its hold file deleted) and goes
    on to its end. ``act`` does not run when the run ends without holding."""
    hold = work / f"hold-{point}"
    hold.mkdir()
    env = dict(env or cli_env(), BEAM_TFRECORDS_HOLD_AT=point, BEAM_TFRECORDS_HOLD_DIR=str(hold),
               BEAM_TFRECORDS_TEST_HOOKS="1")
    ended, failed = threading.Event(), []

    def release() -> None:
        while not ended.is_set():
            if (hold / point).exists():
                try:
                    act()
                except BaseException as err:  # pylint: disable=broad-except
                    failed.append(err)
                (hold / point).unlink()
                return
            time.sleep(0.05)

    helper = threading.Thread(target=release, name=f"release-{point}", daemon=True)
    helper.start()
    try:
        return cli(work, *argv, env=env, timeout=timeout)
    finally:
        ended.set()
        helper.join()
        if failed:
            raise failed[0]


# shard-swapped-before-commit, hold-hook-without-test-switch and gcs-two-runs-one-output
# are asserted in tests/test_harm_storage.py only (a shard swapped after verification, a hold
# point without the test switch, two runs into one gs:// output; with this table's checks).


# --- issue 18: output ownership, links, temporary folders, odd names ---

_OWN_IMAGES = 5  # per class (four classes); a README.txt beside them is ignored.


def _files_of(folder: str) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed): its bytes, or a link's target."""
    found = {}
    for root, dirs, names in os.walk(folder):
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            if os.path.islink(path):
                found[os.path.relpath(path, folder)] = ("-> " + os.readlink(path)).encode()
            else:
                with open(path, "rb") as f:
                    found[os.path.relpath(path, folder)] = f.read()
    return found


def _kept(outcome: Outcome, what: str, before: dict[str, bytes], folder: str) -> None:
    after = _files_of(folder)
    changed = sorted(k for k in before if after.get(k) != before[k])
    if changed:
        outcome.problems.append(f"{what} changed or removed: {changed[:5]}")


def _refused_untouched(outcome: Outcome, out: str, before: dict[str, bytes], images: int) -> None:
    """A refused run: the output is as it was, byte for byte, and holds no dataset of ours."""
    _kept(outcome, "files in --output", before, out)
    if set(_files_of(out)) != set(before):
        outcome.problems.append(f"files appeared: {sorted(set(_files_of(out)) - set(before))[:5]}")
    outcome.n_in, outcome.written, outcome.dead, outcome.skipped = images, 0, 0, None
    outcome.nothing_lost = not os.path.exists(os.path.join(out, "manifest.json"))


def _foreign_shard(path: Path) -> None:
    from beam_tfrecords.transforms.codec.tfrecord import frame_record  # pylint: disable=import-outside-toplevel
    path.write_bytes(b"".join(frame_record(b"another tool's record") for _ in range(3)))


# output-foreign-shard(-overwrite), output-user-part-folder(-overwrite), output-unrelated-file,
# output-rerun-after-failed-run, output-symlinked-part, tmpdir-left-empty and
# input-name-bracket-control are asserted in tests/test_harm_output.py only (the same
# scenarios, byte for byte, with this table's accounting and checks on every run).


@case("output-symlinked-tmp", "a manifest-less --output whose .beam-tfrecords/tmp-x is a link",
      EXIT_USAGE, CONVERT_ERROR + r".*is a symbolic link where this product keeps")
def _output_symlinked_tmp(work, outcome):
    root, out, target = work / "in", work / "out", work / "precious"
    images = make_class_folder_sample(str(root), per_class=_OWN_IMAGES, splits=None)
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "keep.txt").write_text("keep me\n")
    _foreign_shard(target / "train-00000-of-00001.tfrecord")
    (out / ".beam-tfrecords").mkdir(parents=True)
    os.symlink(target, out / ".beam-tfrecords" / "tmp-x")
    kept = _files_of(str(target))
    before = _files_of(str(out))
    _convert(work, outcome, str(root), str(out), "--overwrite")
    _kept(outcome, "the link's target", kept, str(target))
    _refused_untouched(outcome, str(out), before, len(images))



# --- issue 18: row memory ---


@case("csv-300mb-line", "one 300 MB line (row 1,000 of 2,000), past the 256 MB a row may be",
      EXIT_OK, STATUS_OK, max_seconds=90)
def _csv_300mb_line(work, outcome):
    path, rows, long_row = work / "t.csv", 2000, 1000
    rng = random.Random(18)
    chunk = ",".join(rng.choice(("alpha", "beta", "gamma delta")) for _ in range(200_000)).encode()
    with open(path, "wb") as f:  # Written a megabyte at a time: never held whole here either.
        f.write(b"id,int,float,text\n")
        for i in range(rows):
            if i != long_row:
                f.write(f"{i},{i % 7},{i / 8},text {i}\n".encode())
                continue
            f.write(f'{i},1,0.5,"'.encode())
            left = 300_000_000
            while left:
                f.write(chunk[:min(left, 1 << 20)])
                left -= min(left, 1 << 20)
            f.write(b'"\n')
    table = Table(str(path), rows, {i + 2: i for i in range(rows)}, 0)
    out = str(work / "out")
    _convert(work, outcome, table.path, out)
    found = account_table(outcome, out, table)
    letters = [(_line_of(d), d["error"]) for d in found.dead]
    if letters != [(long_row + 2, "unreadable")]:
        outcome.problems.append(f"dead letters {letters}, expected one 'unreadable' at line {long_row + 2}")
    if any(len(json.dumps(d)) > 64 << 10 for d in found.dead):
        outcome.problems.append("a dead letter holds the long row")




# --------------------------------------------------------------------------------------
# the table
# --------------------------------------------------------------------------------------


def _cell(value) -> str:
    text = "-" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(outcomes: list[Outcome]) -> str:
    head = ["case", "exit", "first line", "in", "written", "dead-lettered", "skipped",
            "nothing lost", "as expected"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for o in outcomes:
        if o.skip_reason:
            lines.append(f"| {o.case} | - | skipped: {_cell(o.skip_reason)[:100]} | - | - | - | - | - | skipped |")
            continue
        message = o.run.message
        message = message if len(message) <= 100 else message[:99] + "…"
        lines.append("| " + " | ".join(_cell(v) for v in (
            o.case, o.run.exit, f"`{message}`" if message else "", o.n_in, o.written, o.dead,
            o.skipped, "yes" if o.nothing_lost else "NO", "yes" if o.ok else "NO")) + " |")
    return "\n".join(lines)


def run_case(one: Case, work: Path | None = None) -> Outcome:
    if work is not None:
        return one.run(work)
    with tempfile.TemporaryDirectory(prefix=f"attack-{one.name}-") as tmp:
        return one.run(Path(tmp))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", help="also write the markdown table (and details) to this file")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args(argv)
    outcomes, start = [], time.monotonic()
    for one in CASES:
        if args.only not in one.name:
            continue
        began = time.monotonic()
        outcome = run_case(one)
        outcomes.append(outcome)
        verdict = ("skipped: " + outcome.skip_reason if outcome.skip_reason
                   else "ok" if outcome.ok else "NOT AS EXPECTED")
        print(f"{one.name}: {verdict} ({time.monotonic() - began:.1f} s)", file=sys.stderr, flush=True)
    table = markdown(outcomes)
    details = "\n\n".join(o.describe() for o in outcomes if o.problems or o.notes)
    total = f"{len(outcomes)} cases in {time.monotonic() - start:.0f} s; " \
            f"{sum(not o.ok for o in outcomes if not o.skip_reason)} not as expected"
    print(table)
    print()
    print(total)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(table + "\n\n" + total + "\n\n```\n" + details + "\n```\n")
    if details:
        print("\n" + details, file=sys.stderr)
    return 1 if any(not o.ok for o in outcomes if not o.skip_reason) else 0



# --- issue 18: image inputs (read only what is the input, once, and name it rightly) ---
# Its cases (link-out-of-input(-followed), real-folder-over-link, class-nfc-nfd, class-case,
# split-case, labels-blank-line, incremental-symlinked-root, drop-duplicates-incremental,
# fifo-and-dev-zero, manifest-fifo-and-dev-zero, max-file-bytes, text-named-jpg,
# no-absolute-input-path) were the scenarios of tests/test_harm_images.py, which asserts
# them there only (with this table's accounting and checks on every run).


# --- issue 18: readers ---
# Its cases (manifest-shard-dotdot, manifest-shard-absolute, inspect-split-escape,
# manifest-no-shards, hostile-gz-shard, hostile-2e40-shard, csv-rows-outside-refused,
# csv-rows-outside-allowed, csv-row-glob, csv-row-unknown-scheme) were the scenarios of
# tests/test_harm_readers.py, which asserts them there only (its one_line() holds this
# table's checks on every run; a shared dataset instead of one conversion per case).


# --- issue 21: annotated inputs ---

from tests.harness import annotated_sets  # noqa: E402  pylint: disable=wrong-import-position


@dataclasses.dataclass(frozen=True)
class Letter:
    """A dead letter an annotated case expects: its reason, a piece of its source (the
    annotation: file, line or id), and the image it stands for when that image is not
    written (``None``: an annotation or an object, its image written or non-existent)."""

    reason: str
    source: str
    image: str | None = None


def _manifest_count(manifest: dict, name: str):
    """A count of the manifest by dotted name (``annotations.problems.box_clipped``,
    ``bad_records.by_reason.image_not_found``); ``None`` when absent."""
    node = manifest
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def account_annotated(outcome: Outcome, out: str, images: list[str], kept: list[str],
                      letters: list[Letter], counted: dict[str, int] | None = None,
                      left_out: list[str] = ()) -> Tally:
    """An annotated run: every image file (``images``, as ``image/filename`` names it)
    written (``kept``), dead-lettered (a ``Letter`` with its ``image``) or left out
    (``left_out``: ``--drop_empty``); every expected letter found once, by reason and
    source, among the dead letters or the objects passed over (``skipped.jsonl``), and
    no other; the manifest's counts ``counted`` (dotted names). ``in``
    counts the images and the annotations refused besides them."""
    found = outcome.found(out)
    outcome.n_in = len(images) + sum(letter.image is None for letter in letters)
    outcome.written, outcome.dead = len(found.records), len(found.dead)
    outcome.skipped = len(found.skipped)
    if not found.published:
        outcome.nothing_lost = found.nothing_published
        return found
    names = Counter(r["image/filename"][0].decode() for r in found.records)
    if names != Counter(kept):
        outcome.problems.append(f"records {sorted(names)}, expected {sorted(kept)}")
    unmatched = [("dead letter", d) for d in found.dead] + [("skipped.jsonl", d) for d in found.skipped]
    for letter in letters:
        match = next((m for m in unmatched if m[1].get("error") == letter.reason
                      and letter.source in m[1].get("source", "")), None)
        if match is None:
            outcome.problems.append(f"no dead letter {letter.reason} naming {letter.source!r}")
            continue
        unmatched.remove(match)
        outcome.notes.append(f"dead letter: {match[1]['source']}: {match[1]['error']} [{match[0]}"
                             + (f"; {letter.image} not written]" if letter.image else "]"))
    for image in left_out:  # Listed as passed over, or only counted.
        match = next((m for m in unmatched if m[0] == "skipped.jsonl" and image in m[1].get("source", "")), None)
        if match is not None:
            unmatched.remove(match)
        else:
            outcome.skipped += 1
        outcome.notes.append(f"left out: {image}" + (f" ({match[1].get('error')}, skipped.jsonl)" if match else ""))
    if unmatched:
        outcome.problems.append("unexpected letters: " + "; ".join(
            f"{where} {d.get('source')}: {d.get('error')}" for where, d in unmatched[:5]))
    missing = set(images) - set(kept) - {letter.image for letter in letters if letter.image} - set(left_out)
    if missing:
        outcome.problems.append(f"images neither written, dead-lettered nor left out: {sorted(missing)[:5]}")
    outcome.nothing_lost = (names == Counter(kept) and not unmatched and not missing
                            and outcome.n_in == outcome.written + outcome.dead + outcome.skipped)
    for name, n in (counted or {}).items():
        got = _manifest_count(found.manifest, name)
        if got != n:
            outcome.problems.append(f"the manifest's {name} is {got}, expected {n}")
        else:
            outcome.notes.append(f"manifest: {name} {n}")
    outcome.notes.append(f"kept: {outcome.written} records")
    _manifest_total(outcome, found)
    return found


def _box_csv_faults(work: Path, rows: list[str], exif: bool = False) -> tuple[Path, list[str]]:
    """``in/boxes.csv`` of ``annotated_sets.make_box_csv`` with ``rows`` added; returns
    the CSV and the images (as records name them)."""
    made = annotated_sets.make_box_csv(work / "in", exif=exif)
    csv_path = work / "in" / "boxes.csv"
    if rows:
        csv_path.write_text(csv_path.read_text(encoding="utf-8") + "\n".join(rows) + "\n", encoding="utf-8")
    return csv_path, sorted(made.records)


def _csv_line(csv_path: Path, text: str) -> int:
    """The line number of the first line of ``csv_path`` starting with ``text``."""
    lines = csv_path.read_text(encoding="utf-8").splitlines()
    return next(n for n, line in enumerate(lines, start=1) if line.startswith(text))


def _record(found: Tally, filename: str) -> dict:
    return next((r for r in found.records if r["image/filename"][0].decode() == filename), {})


@case("annot-box-past-edge", "box CSV: a box past the right edge (clipped), an image without objects "
      "(kept)", EXIT_OK, STATUS_OK)
def _annot_box_past_edge(work, outcome):
    csv_path, images = _box_csv_faults(work, ["images/c.png,64,40,cat,40,10,80,20"])
    # images/c.png had a negative row; a box row now gives it one object: use d as the empty one.
    lines = csv_path.read_text(encoding="utf-8").splitlines()
    csv_path.write_text("\n".join(line for line in lines if not line.startswith("images/sub/d.png"))
                        + "\nimages/sub/d.png,32,32,,,,,\n", encoding="utf-8")
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out)
    found = account_annotated(outcome, out, images, images, [],
                              {"annotations.problems.box_clipped": 1, "annotations.images_without_objects": 1,
                               "bad_records.total": 0})
    record = _record(found, "images/c.png")
    if [record.get(f"image/object/bbox/{k}") for k in ("xmin", "xmax")] != [[0.625], [1.0]]:
        outcome.problems.append("the box past the edge is not clipped to xmax 1.0: "
                                f"{record.get('image/object/bbox/xmin')}..{record.get('image/object/bbox/xmax')}")
    if _record(found, "images/sub/d.png").get("image/object/bbox/xmin", None) != []:
        outcome.problems.append("the image without objects is not a record with empty box lists")


@case("annot-box-empty-not-finite", "box CSV: a box without area, a box with a NaN coordinate",
      EXIT_OK, STATUS_OK)
def _annot_box_empty(work, outcome):
    csv_path, images = _box_csv_faults(work, ["images/a.png,48,32,cat,10,10,10,20",
                                              "images/b.png,40,56,dog,nan,1,5,5"])
    empty, nan = _csv_line(csv_path, "images/a.png,48,32,cat,10,10,10"), _csv_line(csv_path, "images/b.png,40,56,dog,nan")
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out)
    found = account_annotated(outcome, out, images, images,
                              [Letter("box_empty", f"boxes.csv:{empty}"), Letter("box_not_finite", f"boxes.csv:{nan}")],
                              {"annotations.problems.box_empty": 1, "annotations.problems.box_not_finite": 1,
                               "annotations.objects_dead_lettered": 1, "bad_records.total": 0})
    objects = {name: len(_record(found, name).get("image/object/class/label", [])) for name in ("images/a.png", "images/b.png")}
    if objects != {"images/a.png": 3, "images/b.png": 2}:
        outcome.problems.append(f"objects kept {objects}, expected a 3 and b 2 (the bad ones dropped)")


@case("annot-missing-file", "box CSV: rows for an image that does not exist", EXIT_OK, STATUS_OK)
def _annot_missing_file(work, outcome):
    csv_path, images = _box_csv_faults(work, ["images/missing.png,48,32,cat,1,1,9,9"])
    line = _csv_line(csv_path, "images/missing.png")
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out, "--max_bad_fraction", "0.5")
    account_annotated(outcome, out, images, images, [Letter("image_not_found", f"boxes.csv:{line}")],
                      {"bad_records.by_reason.image_not_found": 1})


def _coco_faults(work: Path, annotation: dict) -> tuple[list[str], list[str], int]:
    made = annotated_sets.make_coco(work / "in")
    path = work / "in" / "instances.json"
    document = json.loads(path.read_text(encoding="utf-8"))
    document["annotations"].insert(2, dict(annotation, id=9001))
    path.write_text(json.dumps(document), encoding="utf-8")
    return made.flags, sorted(e.path for e in made.records.values()), 9001


@case("annot-coco-unknown-image-id", "COCO: an annotation whose image_id is in no image entry",
      EXIT_OK, STATUS_OK)
def _annot_coco_unknown_image(work, outcome):
    flags, images, number = _coco_faults(work, {"image_id": 999, "category_id": 3, "bbox": [1, 1, 5, 5],
                                                "area": 25.0, "iscrowd": 0, "segmentation": []})
    out = str(work / "out")
    # An orphan annotation names no image: passed over and counted, not a bad input (the
    # default budget of 1 % holds).
    run = cli(work, "convert", *flags, "--output", out)
    outcome.runs.append(run)
    account_annotated(outcome, out, images, images,
                      [Letter("unknown_image_id", f"instances.json: annotation {number}")],
                      {"annotations.problems.unknown_image_id": 1, "bad_records.total": 0})


@case("annot-coco-unknown-category", "COCO: an annotation whose category_id is not a category",
      EXIT_OK, STATUS_OK)
def _annot_coco_unknown_category(work, outcome):
    flags, images, number = _coco_faults(work, {"image_id": 101, "category_id": 99, "bbox": [1, 1, 5, 5],
                                                "area": 25.0, "iscrowd": 0, "segmentation": []})
    out = str(work / "out")
    run = cli(work, "convert", *flags, "--output", out)
    outcome.runs.append(run)
    found = account_annotated(outcome, out, images, images,
                              [Letter("unknown_category", f"instances.json: annotation {number}")],
                              {"annotations.problems.unknown_category": 1, "bad_records.total": 0})
    if _record(found, "1.png").get("image/object/class/label") != [3, 7]:
        outcome.problems.append("image 101 does not keep exactly its two known objects")


@case("annot-yolo-bad-line", "YOLO: a label line that does not parse", EXIT_OK, STATUS_OK)
def _annot_yolo_bad_line(work, outcome):
    made = annotated_sets.make_yolo(work / "in")
    label = work / "in" / "labels" / "train" / "a.txt"
    label.write_text(label.read_text(encoding="utf-8") + "1 0.5 abc 0.2 0.2\n", encoding="utf-8")
    images = sorted(made.records)
    out = str(work / "out")
    _convert(work, outcome, str(work / "in"), out)
    found = account_annotated(outcome, out, images, images, [Letter("bad_label_line", "labels/train/a.txt:3")],
                              {"annotations.problems.bad_label_line": 1, "bad_records.total": 0})
    if len(_record(found, "images/train/a.png").get("image/object/class/label", [])) != 2:
        outcome.problems.append("images/train/a.png does not keep its two good objects")


@case("annot-voc-bad-xml", "Pascal VOC: an annotation XML that does not parse", EXIT_OK, STATUS_OK)
def _annot_voc_bad_xml(work, outcome):
    made = annotated_sets.make_voc(work / "in")
    xml = work / "in" / "Annotations" / "2008_000002.xml"
    xml.write_bytes(xml.read_bytes()[:120])
    images = sorted(made.records)
    out = str(work / "out")
    _convert(work, outcome, str(work / "in"), out, "--max_bad_fraction", "0.5")
    bad = "JPEGImages/2008_000002.jpg"
    account_annotated(outcome, out, images, [i for i in images if i != bad],
                      [Letter("bad_annotation_file", "Annotations/2008_000002.xml", bad)],
                      {"bad_records.by_reason.bad_annotation_file": 1})


@case("annot-size-mismatch", "box CSV: a stated size that is not the image's; an EXIF-turned photo "
      "whose stated size is its displayed one", EXIT_OK, STATUS_OK)
def _annot_size_mismatch(work, outcome):
    csv_path, images = _box_csv_faults(work, [], exif=True)
    text = csv_path.read_text(encoding="utf-8").replace("images/c.png,64,40,", "images/c.png,60,40,")
    csv_path.write_text(text, encoding="utf-8")
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out, "--max_bad_fraction", "0.5")
    bad = "images/c.png"
    found = account_annotated(outcome, out, images, [i for i in images if i != bad],
                              [Letter("annotation_size_mismatch", bad, bad)], {"annotations.problems.exif_rotated": 1,
                               "bad_records.by_reason.annotation_size_mismatch": 1})
    record = _record(found, "images/photo_exif.jpg")
    if (record.get("image/width"), record.get("image/height")) != ([24], [40]):
        outcome.problems.append("the EXIF-turned photo is not stored as displayed (24x40): "
                                f"{record.get('image/width')}x{record.get('image/height')}")


@case("annot-mask-wrong-size", "semantic masks: a mask of another size than its image", EXIT_OK, STATUS_OK)
def _annot_mask_wrong_size(work, outcome):
    made = annotated_sets.make_semantic_masks(work / "in")
    from PIL import Image  # pylint: disable=import-outside-toplevel

    Image.new("L", (10, 10)).save(work / "in" / "masks" / "a.png", format="PNG")
    images = sorted(made.records)
    out = str(work / "out")
    _convert(work, outcome, str(work / "in" / "images"), out, "--masks", str(work / "in" / "masks"),
             "--max_bad_fraction", "0.5")
    account_annotated(outcome, out, images, [i for i in images if i != "a.png"],
                      [Letter("mask_size_mismatch", "a.png", "a.png")], {"bad_records.by_reason.mask_size_mismatch": 1})


@case("annot-drop-empty", "box CSV with an image without objects, --drop_empty", EXIT_OK, STATUS_OK)
def _annot_drop_empty(work, outcome):
    csv_path, images = _box_csv_faults(work, [])
    out = str(work / "out")
    _convert(work, outcome, str(csv_path), out, "--drop_empty")
    account_annotated(outcome, out, images, [i for i in images if i != "images/c.png"], [],
                      {"annotations.dropped_empty": 1, "annotations.images_without_objects": 0},
                      left_out=["images/c.png"])


# Every case is registered above this line (a case added below would not run as a script).
CASES_BY_NAME = {c.name: c for c in CASES}
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"


if __name__ == "__main__":
    sys.exit(main())
