"""Row memory benchmark: the peak memory of one very long row (CSV, JSON Lines, Parquet).

    .venv/bin/python benchmarks/bench_row_memory.py [--sizes 0,100,250,300]
                                                    [--formats csv,jsonl,parquet]
                                                    [--workdir DIR] [--kill_above_gb 14]

For each format and size ``S`` (MB = 10^6 bytes) a table is written under a
temporary folder (``--workdir`` to keep it elsewhere): a header (CSV), 1,000
ordinary rows, one row whose ``text`` cell is ``S`` MB of seeded text (commas
in it, so a CSV quotes it; no newline), then 1,000 ordinary rows. It is
converted as a user would, schema inferred (``python -m beam_tfrecords convert
--input FILE --output OUT``, a subprocess in a session of its own), while the
resident memory of every process of that session (the CLI and its helper
processes) is read from ``/proc/<pid>/statm`` every 50 ms and summed; the
largest sum is the peak. Pages shared between processes count once per
process. A run whose sum passes ``--kill_above_gb`` is killed (and reported so).

A row up to the README's row limit (256 MB) must be converted: the record is
present and its ``text`` is the row's cell, byte for byte (compared by SHA-256).
A longer one must be dead-lettered (``unreadable``, ``source`` = its line),
with the 2,000 other rows written and the manifest's accounting closed
(``in = written + dead_lettered``, lines in = lines accounted for). A Parquet
file (the same rows, one row group, pyarrow's defaults) is read as it holds its
rows: its long row is converted whatever its size. The row
``0`` is the same table without the long row: the floor (the largest of those
runs) that the other rows' ``extra`` (peak minus floor) and ``x row`` (extra over
the row's size) are measured from.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.tfrecord import iter_records

MB = 10**6
ROW_LIMIT_MB = 256  # The README's "a row may be up to 256 MB".
CONTEXT_ROWS = 1000  # Ordinary rows before and after the long one.
POLL_SECONDS = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE")
_WORDS = [w.encode() for w in ("alpha", "beta", "gamma", "delta", "epsilon", "zeta,", "eta",
                               "theta", "iota", "kappa,", "lambda", "mu")]


def _long_text(size: int, seed: int):
    """``size`` bytes of seeded words (some with commas), in chunks of about 1 MB."""
    rng = random.Random(seed)
    block = b" ".join(rng.choice(_WORDS) for _ in range(200_000))[: 1 << 20]
    left = size
    while left:
        take = min(left, len(block))
        yield block[:take]
        left -= take
        block = block[7:] + block[:7]  # Not the same megabyte twice.


def _ordinary(i: int, fmt: str) -> bytes:
    text = f"row {i}, ordinary"
    if fmt == "csv":
        return f'{i},"{text}",{i / 8}\n'.encode()
    return (json.dumps({"id": i, "text": text, "score": i / 8}) + "\n").encode()


def make_table(folder: str, fmt: str, size_mb: int) -> tuple[str, str, int]:
    """Writes the table; returns ``(path, sha256 of the long cell, line of the long row)``
    (Parquet: its row number, from 1)."""
    if fmt == "parquet":
        return _make_parquet(folder, size_mb)
    path = os.path.join(folder, f"long-{size_mb}mb.{'csv' if fmt == 'csv' else 'jsonl'}")
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        line = 1
        if fmt == "csv":
            f.write(b"id,text,score\n")
            line += 1
        for i in range(CONTEXT_ROWS):
            f.write(_ordinary(i, fmt))
        long_line = line + CONTEXT_ROWS
        if size_mb:
            f.write(b'1000000,"' if fmt == "csv" else b'{"id": 1000000, "text": "')
            for chunk in _long_text(size_mb * MB, size_mb):
                digest.update(chunk)
                f.write(chunk)
            f.write(b'",0.5\n' if fmt == "csv" else b'", "score": 0.5}\n')
        for i in range(CONTEXT_ROWS, 2 * CONTEXT_ROWS):
            f.write(_ordinary(i, fmt))
    return path, digest.hexdigest(), long_line


def _make_parquet(folder: str, size_mb: int) -> tuple[str, str, int]:
    """The same rows as one Parquet row group (pyarrow's defaults: snappy, dictionary
    pages tried first)."""
    import pyarrow as pa  # pylint: disable=import-outside-toplevel
    import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

    path = os.path.join(folder, f"long-{size_mb}mb.parquet")
    long = b"".join(_long_text(size_mb * MB, size_mb)) if size_mb else b""
    digest = hashlib.sha256(long).hexdigest()
    ids = [*range(CONTEXT_ROWS), *([1000000] if size_mb else []), *range(CONTEXT_ROWS, 2 * CONTEXT_ROWS)]
    texts = pa.array([*(f"row {i}, ordinary" for i in range(CONTEXT_ROWS)), *([long.decode()] if size_mb else []),
                      *(f"row {i}, ordinary" for i in range(CONTEXT_ROWS, 2 * CONTEXT_ROWS))])
    del long
    scores = [0.5 if i == 1000000 else i / 8 for i in ids]
    pq.write_table(pa.table({"id": ids, "text": texts, "score": scores}), path)
    return path, digest, CONTEXT_ROWS + 1


def _session_rss(session: int) -> tuple[int, int]:
    """``(processes, resident bytes summed)`` of the live processes of a session."""
    count = total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if int(stat[stat.rfind(")") + 2:].split()[3]) != session:
                continue
            with open(f"/proc/{entry}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
            count += 1
        except (OSError, ValueError, IndexError):
            continue  # Gone meanwhile.
    return count, total


def run_measured(cmd: list[str], cwd: str, kill_above: int) -> dict:
    """Runs ``cmd`` in a session of its own, sampling the session's memory."""
    peak = {"bytes": 0, "at": 0.0, "processes": 0, "killed": False}
    done = threading.Event()
    with open(os.path.join(cwd, "stdout.txt"), "wb") as out, \
            open(os.path.join(cwd, "stderr.txt"), "wb") as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, start_new_session=True,
                                env={**os.environ, "PYTHONHASHSEED": "0"})

        def sample() -> None:
            while not done.is_set():
                processes, rss = _session_rss(proc.pid)
                if rss > peak["bytes"]:
                    peak.update(bytes=rss, at=time.monotonic() - started, processes=processes)
                if rss > kill_above and not peak["killed"]:
                    peak["killed"] = True
                    os.killpg(proc.pid, signal.SIGKILL)
                done.wait(POLL_SECONDS)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - started
        done.set()
        sampler.join()
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Whatever of the session is left.
        except (ProcessLookupError, PermissionError):
            pass
    with open(os.path.join(cwd, "stdout.txt"), encoding="utf-8", errors="replace") as f:
        stdout = f.read()
    with open(os.path.join(cwd, "stderr.txt"), encoding="utf-8", errors="replace") as f:
        stderr = f.read()
    return {"exit": os.waitstatus_to_exitcode(status), "wall_s": wall,
            "cpu_main_s": usage.ru_utime + usage.ru_stime, "peak": peak["bytes"],
            "peak_at_s": peak["at"], "peak_processes": peak["processes"], "killed": peak["killed"],
            "stdout": stdout, "stderr": stderr}


def check_output(out: str, long_sha: str, long_line: int, size_mb: int, input_path: str, fmt: str) -> tuple[str, int, int, list[str]]:
    """Reads the output back: ``(outcome, records, dead letters, problems)``."""
    problems: list[str] = []
    records, long_found = 0, None
    ids = set()
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if ".tfrecord" not in name:
            continue
        with open(os.path.join(out, name), "rb") as f:
            for data in iter_records(f):
                values = example_to_dict(data)
                records += 1
                ident = values["id"][0]
                ids.add(ident)
                if ident == 1000000:
                    long_found = hashlib.sha256(values["text"][0]).hexdigest()
    dead = []
    folder = os.path.join(out, "dead_letter")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".jsonl") and name != "skipped.jsonl":
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                dead += [json.loads(line) for line in f if line.strip()]
    if set(range(2 * CONTEXT_ROWS)) - ids:
        problems.append(f"{len(set(range(2 * CONTEXT_ROWS)) - ids)} ordinary rows missing")
    manifest_path = os.path.join(out, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path, encoding="utf-8") as f:
            rows = json.load(f)["input"]["rows"]
        lines = rows.get("lines", {})
        if not (rows.get("accounted") and rows["in"] == rows["written"] + rows["dead_lettered"]
                and lines.get("in") == lines.get("accounted_for")):
            problems.append(f"accounting not closed: {rows}")
    else:
        problems.append("no manifest.json")
    if size_mb == 0:
        outcome = "floor"
        if dead:
            problems.append(f"{len(dead)} dead letters")
    elif size_mb <= ROW_LIMIT_MB or fmt == "parquet":  # A Parquet file's rows are read as it holds them.
        outcome = "converted"
        if long_found != long_sha:
            problems.append("the long row's record is missing" if long_found is None
                            else "the long row's text differs from its cell")
        if dead:
            problems.append(f"{len(dead)} dead letters: {[d.get('error') for d in dead]}")
    else:
        outcome = "dead-lettered"
        want = f"{input_path}:{long_line}"
        mine = [d for d in dead if d.get("source", "").endswith(f":{long_line}")]
        if long_found is not None:
            problems.append("the long row was written")
        if len(dead) != 1 or not mine or mine[0].get("error") != "unreadable":
            problems.append(f"expected one 'unreadable' dead letter for {want}, found "
                            f"{[(d.get('source'), d.get('error')) for d in dead]}")
        elif len(json.dumps(mine[0])) > 64 << 10:
            problems.append(f"the dead letter is {len(json.dumps(mine[0])):,} bytes long")
    return outcome, records, len(dead), problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="0,100,250,300", help="long-row sizes in MB (0: none)")
    parser.add_argument("--formats", default="csv,jsonl,parquet")
    parser.add_argument("--workdir", help="where to write the tables (default: a temporary folder)")
    parser.add_argument("--kill_above_gb", type=float, default=14.0,
                        help="kill a run whose process tree passes this resident size")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    formats = args.formats.split(",")
    work = args.workdir or tempfile.mkdtemp(prefix="bench-row-memory-")
    os.makedirs(work, exist_ok=True)
    results = []
    try:
        for fmt in formats:
            for size_mb in sizes:
                case = os.path.join(work, f"{fmt}-{size_mb}")
                shutil.rmtree(case, ignore_errors=True)
                os.makedirs(case)
                path, sha, long_line = make_table(case, fmt, size_mb)
                with open(path, "rb") as f:  # Into the page cache.
                    while f.read(16 << 20):
                        pass
                out = os.path.join(case, "out")
                cmd = [sys.executable, "-m", "beam_tfrecords", "convert", "--input", path,
                       "--output", out]
                print(f"{fmt} {size_mb} MB: {' '.join(cmd)}", file=sys.stderr, flush=True)
                run = run_measured(cmd, case, int(args.kill_above_gb * 1e9))
                outcome, records, dead, problems = check_output(out, sha, long_line, size_mb, path, fmt)
                if run["killed"]:
                    problems.insert(0, f"killed above {args.kill_above_gb:g} GB")
                elif run["exit"] != 0:
                    tail = [x for x in run["stderr"].splitlines() if x.strip()][-1:]
                    problems.insert(0, f"exit {run['exit']}: {tail}")
                results.append({"format": fmt, "row_mb": size_mb, "outcome": outcome,
                                "records": records, "dead_letters": dead, "problems": problems,
                                **{k: v for k, v in run.items() if k not in ("stdout", "stderr")}})
                print(f"  peak {run['peak'] / MB:,.0f} MB at {run['peak_at_s']:.1f} s, "
                      f"exit {run['exit']}, {run['wall_s']:.1f} s, {problems or 'as expected'}",
                      file=sys.stderr, flush=True)
                shutil.rmtree(case, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r["problems"] for r in results) else 0


def table(results: list[dict]) -> str:
    """The results as a markdown table."""
    # The runs without a long row differ by the ~45 MB of a helper process starting,
    # when a sample catches it: the largest is every format's floor.
    floor = max((r["peak"] for r in results if r["row_mb"] == 0), default=None)
    out = io.StringIO()
    out.write("| format | row MB | expected | exit | records | dead letters | peak RSS tree MB "
              "| extra MB | x row | peak at s | wall s | CPU s (main) | as expected |\n")
    out.write("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for r in results:
        extra = r["peak"] - floor if floor is not None and r["row_mb"] else None
        ratio = f"{extra / (r['row_mb'] * MB):.2f}" if extra is not None else "-"
        peak = f"{r['peak'] / MB:,.0f}" + (" (killed)" if r["killed"] else "")
        out.write(f"| {r['format']} | {r['row_mb']} | {r['outcome']} | {r['exit']} | {r['records']} "
                  f"| {r['dead_letters']} | {peak} | {'-' if extra is None else f'{extra / MB:,.0f}'} "
                  f"| {ratio} | {r['peak_at_s']:.1f} | {r['wall_s']:.1f} | {r['cpu_main_s']:.1f} "
                  f"| {'; '.join(r['problems']) or 'yes'} |\n")
    return out.getvalue()


if __name__ == "__main__":
    sys.exit(main())
