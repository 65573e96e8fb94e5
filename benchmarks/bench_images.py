"""Image benchmark: our converter against the naive Beam baseline.

    .venv/bin/python benchmarks/bench_images.py [--workdir DIR] [--sets cifar,photo]
                                                [--photo_mb 600] [--only ours|baseline]

For each set (built once by ``datasets.py`` under ``WORKDIR/data``) the input
is read once to warm the page cache, then ours
(``python -m beam_tfrecords convert``) and the baseline
(``benchmarks/baseline_images.py``) run one after the other as subprocesses,
each into an emptied ``WORKDIR/out/<set>/<run>``. For every run we measure:

* wall time, from start to reaping the process;
* peak memory of the process tree: every 0.2 s the RSS and the PSS of the process
  and all its descendants (found by scanning ``/proc``) are summed, and the maxima
  kept. In the RSS sum a page shared between processes counts once per process
  (forked helpers share most of theirs with the launcher); in the PSS sum
  (``/proc/<pid>/smaps_rollup``: each shared page split among its sharers) it counts
  once: the tree's memory;
* ``ru_maxrss`` of the main process, from ``os.wait4``;
* records written (by walking the TFRecord framing of every ``*.tfrecord*``
  file) and bytes written.

Results are printed as a table per set and written to ``WORKDIR/results.json``;
stdout and stderr of each run are kept in ``WORKDIR/logs``.
"""

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import threading
import time

import datasets

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(REPO, "benchmarks", "baseline_images.py")
RUNS = ("ours", "baseline")
POLL_SECONDS = 0.2
STDERR_TAIL_LINES = 30
MB = 1e6


def ours_command(set_dir, out_dir):
    """Returns the command line of our converter."""
    return [sys.executable, "-m", "beam_tfrecords", "convert",
            "--input", set_dir, "--output", out_dir, "--overwrite"]


def baseline_command(set_dir, out_dir):
    """Returns the command line of the naive baseline."""
    return [sys.executable, BASELINE, "--input", set_dir, "--output", out_dir]


def build_set(name, data_dir, photo_mb):
    """Builds (or reuses) one input set.

    Args:
        name: ``"cifar"`` or ``"photo"``.
        data_dir: Folder holding the sets.
        photo_mb: Size of the photo set in MB.

    Returns:
        ``(set_dir, seconds)``; seconds is near zero when the set is reused.
    """
    started = time.perf_counter()
    set_dir = os.path.join(data_dir, name)
    if name == "cifar":
        datasets.make_cifar_like(set_dir)
    else:
        datasets.make_photo_like(set_dir, total_mb=photo_mb)
    return set_dir, time.perf_counter() - started


def warm_up(set_dir):
    """Reads every file of a set once so that all runs find it in the page cache.

    Args:
        set_dir: Folder of the set, whose completion marker is not counted, or
            a single file.

    Returns:
        ``{"files": count, "bytes": total, "seconds": read time}``.
    """
    started = time.perf_counter()
    files = total = 0
    if os.path.isfile(set_dir):
        walk = [(os.path.dirname(set_dir), [], [os.path.basename(set_dir)])]
    else:
        walk = os.walk(set_dir)
    for folder, _, names in walk:
        for name in names:
            if name == datasets.MARKER:
                continue
            with open(os.path.join(folder, name), "rb") as f:
                while chunk := f.read(1 << 20):
                    total += len(chunk)
            files += 1
    return {"files": files, "bytes": total, "seconds": time.perf_counter() - started}


def _parents():
    """Maps each live pid to its parent pid, from ``/proc/<pid>/stat``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue  # Exited meanwhile.
            # The command name may hold spaces and parentheses; ppid follows state.
            parents[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    return parents


def tree_memory_bytes(root_pid):
    """Sums RSS and PSS over a process and all its descendants.

    Args:
        root_pid: Pid at the top of the tree.

    Returns:
        ``(rss, pss)`` in bytes (0 once the tree is gone); PSS is ``None`` where
        ``/proc/<pid>/smaps_rollup`` is missing (Linux before 4.14).
    """
    children = {}
    for pid, ppid in _parents().items():
        children.setdefault(ppid, []).append(pid)
    rss, pss, todo = 0, 0, [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
                        break
        except FileNotFoundError:
            if not os.path.exists("/proc/self/smaps_rollup"):
                pss = None
                rss += _status_rss(pid)
        except OSError:
            pass  # Exited meanwhile.
    return rss, pss


def _status_rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss_bytes(root_pid):
    """The RSS of a process and all its descendants, summed (``tree_memory_bytes``)."""
    return tree_memory_bytes(root_pid)[0]


def run_measured(cmd, log_prefix):
    """Runs a command to completion while sampling its process tree's memory.

    Args:
        cmd: Command line.
        log_prefix: Path prefix for the ``.out`` and ``.err`` logs.

    Returns:
        A dict with exit code, wall time, peak tree RSS, main-process
        ``ru_maxrss`` and CPU time, the log paths and the load before the start.
    """
    peak = peak_pss = 0
    done = threading.Event()

    def sample(pid):
        nonlocal peak, peak_pss
        while not done.is_set():
            rss, pss = tree_memory_bytes(pid)
            peak = max(peak, rss)
            peak_pss = None if pss is None or peak_pss is None else max(peak_pss, pss)
            done.wait(POLL_SECONDS)

    load = os.getloadavg()[0]
    with open(log_prefix + ".out", "wb") as out, open(log_prefix + ".err", "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err)
        sampler = threading.Thread(target=sample, args=(proc.pid,), daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)  # Reaped above, not by Popen.
    return {
        "command": cmd,
        "exit_code": proc.returncode,
        "wall_s": wall,
        "peak_rss_tree_bytes": peak,
        "peak_pss_tree_bytes": peak_pss,
        "ru_maxrss_main_bytes": usage.ru_maxrss * 1024,  # Linux reports KiB.
        "cpu_main_s": usage.ru_utime + usage.ru_stime,
        "loadavg_1min_before": load,
        "stdout_log": log_prefix + ".out",
        "stderr_log": log_prefix + ".err",
    }


def count_records(path):
    """Counts the records of a TFRecord file by walking its length fields.

    Each record is a little-endian uint64 length, a uint32 masked CRC, the data
    and another uint32 masked CRC; the CRCs are skipped, not checked. Files
    ending in ``.gz`` are read through gzip.

    Raises:
        ValueError: If the framing does not end exactly at the end of the file.
    """
    opener = gzip.open if path.endswith(".gz") else open
    records = 0
    with opener(path, "rb") as f:
        while header := f.read(12):
            if len(header) < 12:
                raise ValueError(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", header[:8])
            f.seek(length, os.SEEK_CUR)
            if len(f.read(4)) < 4:
                raise ValueError(f"{path}: record {records} runs past the end")
            records += 1
    return records


def output_stats(out_dir):
    """Describes what a run wrote.

    Returns:
        ``{"bytes_written", "records", "shards": [{"path", "bytes", "records"}]}``
        where shards are the files with ``.tfrecord`` in their name (not the
        ``.idx`` index files written beside them) and
        bytes_written counts every file under ``out_dir``.
    """
    written, shards = 0, []
    for folder, _, names in os.walk(out_dir):
        for name in sorted(names):
            path = os.path.join(folder, name)
            size = os.path.getsize(path)
            written += size
            if ".tfrecord" in name and not name.endswith(".idx"):  # Not the index beside it.
                shards.append({"path": os.path.relpath(path, out_dir), "bytes": size,
                               "records": count_records(path)})
    return {"bytes_written": written,
            "records": sum(s["records"] for s in shards),
            "shards": shards}


def bench_run(name, cmd, out_dir, log_prefix, input_bytes):
    """Runs one converter into an emptied folder and summarises the run.

    Args:
        name: ``"ours"`` or ``"baseline"``.
        cmd: Command line.
        out_dir: Output folder, emptied first.
        log_prefix: Path prefix for the logs.
        input_bytes: Size of the input, for MB/s.

    Returns:
        The measurements of ``run_measured`` plus status, output statistics
        and rates (None unless the run succeeded).
    """
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"  {name}: {' '.join(cmd)}", flush=True)
    result = run_measured(cmd, log_prefix)
    result["status"] = "ok" if result["exit_code"] == 0 else "failed"
    if result["status"] == "failed":
        with open(result["stderr_log"], errors="replace") as f:
            tail = f.readlines()[-STDERR_TAIL_LINES:]
        print(f"  {name} FAILED (exit {result['exit_code']}); stderr tail:\n"
              + "".join("    | " + line for line in tail).rstrip(), flush=True)
    try:
        result.update(output_stats(out_dir))
    except (ValueError, OSError, EOFError) as error:  # Bad framing or bad gzip.
        result["output_error"] = str(error)
        result["status"] = "bad output" if result["status"] == "ok" else result["status"]
        print(f"  {name}: bad output: {error}", flush=True)
    ok = result["status"] == "ok"
    result["records_per_s"] = result["records"] / result["wall_s"] if ok else None
    result["input_mb_per_s"] = input_bytes / MB / result["wall_s"] if ok else None
    return result


def ratios(runs):
    """Ours against the baseline, when both succeeded; otherwise None."""
    if any(runs.get(name, {}).get("status") != "ok" for name in RUNS):
        return None
    ours, base = runs["ours"], runs["baseline"]
    return {"speedup": base["wall_s"] / ours["wall_s"],
            "rss_ratio": ours["peak_rss_tree_bytes"] / base["peak_rss_tree_bytes"]}


def print_table(name, result, title=None):
    """Prints the results of one set.

    Args:
        name: Name of the set.
        result: Its ``{"input", "runs", "ratios"}``.
        title: Description after the name; by default the input's file count
            and size.
    """
    inp = result["input"]
    title = title or f"{inp['files']} files, {inp['bytes'] / MB:.1f} MB input"
    print(f"\n== {name}: {title} ==")
    print(f"{'run':<9} {'status':<10} {'wall s':>8} {'records':>8} {'rec/s':>8} "
          f"{'in MB/s':>8} {'RSS MB tree':>11} {'maxrss MB':>9} {'shards':>6} "
          f"{'out MB':>8}")
    for run, r in result["runs"].items():
        ok = r["status"] == "ok"
        rec_s = f"{r['records_per_s']:8.0f}" if ok else f"{'-':>8}"
        mb_s = f"{r['input_mb_per_s']:8.1f}" if ok else f"{'-':>8}"
        print(f"{run:<9} {r['status']:<10} {r['wall_s']:8.1f} {r.get('records', 0):8d} "
              f"{rec_s} {mb_s} "
              f"{r['peak_rss_tree_bytes'] / MB:11.0f} {r['ru_maxrss_main_bytes'] / MB:9.0f} "
              f"{len(r.get('shards', [])):6d} {r.get('bytes_written', 0) / MB:8.1f}")
        sizes = [s["bytes"] / MB for s in r.get("shards", [])]
        if sizes:
            print(f"{'':<9} shard MB min/median/max {min(sizes):.1f}/"
                  f"{statistics.median(sizes):.1f}/{max(sizes):.1f}")
    if result["ratios"]:
        print(f"ours/baseline: speed-up {result['ratios']['speedup']:.2f}x "
              f"(baseline time / our time), peak RSS ratio "
              f"{result['ratios']['rss_ratio']:.2f} (ours / baseline)")


def run_info(workdir):
    """Returns the workdir, the start time and a description of the machine."""
    return {"workdir": workdir, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()}}


def main(argv=None):
    """Builds the sets, runs the benchmark, prints and saves the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--sets", default="cifar,photo",
                        help="comma-separated subset of cifar,photo")
    parser.add_argument("--photo_mb", type=int, default=600)
    parser.add_argument("--only", choices=RUNS, help="run only this converter")
    args = parser.parse_args(argv)
    sets = args.sets.split(",")
    if not set(sets) <= {"cifar", "photo"}:
        parser.error(f"unknown set in --sets {args.sets}")
    commands = {"ours": ours_command, "baseline": baseline_command}
    runs = [args.only] if args.only else list(RUNS)
    os.makedirs(os.path.join(args.workdir, "logs"), exist_ok=True)

    results = {**run_info(args.workdir), "sets": {}}
    for name in sets:
        print(f"\n{name}: building the input set", flush=True)
        set_dir, generate_s = build_set(name, os.path.join(args.workdir, "data"),
                                        args.photo_mb)
        print(f"{name}: warming the page cache", flush=True)
        result = {"input": {"dir": set_dir, "generate_s": generate_s, **warm_up(set_dir)},
                  "runs": {}}
        for run in runs:
            out_dir = os.path.join(args.workdir, "out", name, run)
            result["runs"][run] = bench_run(
                run, commands[run](set_dir, out_dir), out_dir,
                os.path.join(args.workdir, "logs", f"{name}-{run}"),
                result["input"]["bytes"])
        result["ratios"] = ratios(result["runs"])
        results["sets"][name] = result
        print_table(name, result)

    path = os.path.join(args.workdir, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=2)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
