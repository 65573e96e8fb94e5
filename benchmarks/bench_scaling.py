"""Ours on one core and on two (``taskset``), net of start-up: the issue-23 scaling check.

    .venv/bin/python benchmarks/bench_scaling.py [--quick] [--repeat 5]
                                                 [--sets cifar,photo_x1,table]
                                                 [--workdir DIR] [--cores1 0] [--cores2 0,1]

Every run is ``python -m beam_tfrecords convert`` (DirectRunner, default mode)
under ``taskset -c 0`` (1 core) or ``taskset -c 0,1`` (2 cores), measured by
``bench_images.run_measured``: wall time, peak PSS and RSS of the process tree (sampled
every 0.2 s), CPU (user + sys of the process and of every helper process it
reaped: ``wait4``'s usage). After every run the records are counted by walking
the TFRecord framing of the output and checked against the input count
(``bench_suite.measure``); a run that does not write every input is not ok and
gives no figure.

Sets (the data builders of ``bench_suite.build_sets``, reused when complete):
``cifar`` (60,000 32x32 PNGs), ``photo_x1`` (~600 MB of JPEGs), ``table``
(1,000,000 CSV rows); ``--quick``: 600 PNGs, 6 MB of photos, 10,000 rows, one
run each (it checks that the script works; its verdicts mean nothing). Two
start-up runs: 9 PNGs laid out as the cifar set (``WORKDIR/data/startup_png9``)
for the image sets, a 10-row table for the table.

Per set, after the input is read once to warm the page cache, the runs go in
rounds: each round runs the start-up run then the set on 1 core, then both on 2
cores, the next round 2 cores first, so that drift in the machine's load (this
VM has slow and fast phases of ~15%) spreads over both core counts, and each
set's start-up figure is measured beside it, not minutes before. Every figure
is the median of ``--repeat`` rounds (5). Printed per set: its start-up runs,
wall on 1 and 2 cores, the speed-up net of start-up ``(t1 - s1) / (t2 - s2)``
(``s`` the start-up run on the same cores) with the lowest and highest of the
rounds' own speed-ups, CPU on 2 cores, CPU per input net of start-up
``(cpu - cpu_s) / (n - n_s)`` in microseconds, peak PSS and RSS; then PASS/FAIL
lines for ">= 1.8x on each set" and "<= 60 us of CPU per tiny PNG". Results go to ``WORKDIR/results_scaling.json``
(``results_scaling_quick.json`` with ``--quick``); logs of every run under
``WORKDIR/logs/scaling[_quick]/``.
"""

import argparse
import json
import os
import shutil
import statistics
import time

import bench_images
import bench_suite
import datasets

MB = bench_images.MB
SPEEDUP_MIN = 1.8
CPU_PER_PNG_MAX_US = 60.0
SETS = ("cifar", "photo_x1", "table")
STARTUP_IMAGES = 9


def _startup_sets(data_dir, wanted):
    """The start-up inputs: ``{"images": BenchSet, "table": BenchSet}`` as needed."""
    out = {}
    if any(n != "table" for n in wanted):
        root = datasets.make_cifar_like(os.path.join(data_dir, "startup_png9"),
                                        n=STARTUP_IMAGES)
        out["images"] = bench_suite.BenchSet("startup_images", "images", root, None,
                                             STARTUP_IMAGES, ("ours",))
    return out


def build(data_dir, quick, wanted):
    """The sets to measure, each with its start-up set: ``[(BenchSet, startup BenchSet)]``."""
    sets, _ = bench_suite.build_sets(data_dir, quick, wanted)
    by_name = {s.name: s for s in sets}
    startup = _startup_sets(data_dir, wanted)
    if "startup_table" in by_name:
        startup["table"] = by_name["startup_table"]
    return [(by_name[name], startup[by_name[name].kind]) for name in wanted]


def _input(bench_set):
    """The input's description, its files read once to warm the page cache."""
    s = bench_set
    print(f"\n{s.name}: warming the page cache ({s.path})", flush=True)
    return {"path": s.path, "kind": s.kind, "items": s.items, **bench_images.warm_up(s.path)}


def _measure(bench_set, inp, cores, round_, args, dirs):
    """One run of ours on ``cores`` ("1" or "2"), printed as it ends."""
    s = bench_set
    cpus = args.cores1 if cores == "1" else args.cores2
    out_dir = os.path.join(dirs["out"], s.name, f"cores{cores}")
    prefix = os.path.join(dirs["logs"], f"{s.name}-cores{cores}-{round_ + 1}")
    r = bench_suite.measure("ours", s, inp, out_dir, prefix, False, False, wrap=("taskset", "-c", cpus))
    check = r.get("check")
    note = f"{check['written']:,}/{check['expected']:,} {check['unit']}" if check else r.get("output_error", "")
    print(f"  {s.name:<14} {cores} core{'s' if cores == '2' else ' '} run {round_ + 1}/{args.repeat}: "
          f"{r['status']:<11} {r['wall_s']:7.2f} s  CPU {r['cpu_main_s']:6.2f} s  "
          f"{r['peak_rss_tree_bytes'] / MB:6.0f} MB  {note}", flush=True)
    if r["status"] == "failed":
        print("".join(f"    | {line}\n" for line in r["stderr_tail"].rstrip().splitlines()), end="", flush=True)
    return r


def run_set(bench_set, startup_set, args, dirs):
    """Runs ours on one set and on its start-up set ``--repeat`` times on each core
    count, in alternating rounds (the start-up run just before the set's, on the same cores)."""
    inp, startup_inp = _input(bench_set), _input(startup_set)
    runs = {"1": [], "2": []}
    startup_runs = {"1": [], "2": []}
    for round_ in range(args.repeat):
        for cores in ("1", "2") if round_ % 2 == 0 else ("2", "1"):
            startup_runs[cores].append(_measure(startup_set, startup_inp, cores, round_, args, dirs))
            runs[cores].append(_measure(bench_set, inp, cores, round_, args, dirs))
    return {"input": inp, "runs": runs, "cores": {c: summarise(rs) for c, rs in runs.items()},
            "startup": {"name": startup_set.name, "input": startup_inp, "runs": startup_runs,
                        "cores": {c: summarise(rs) for c, rs in startup_runs.items()}}}


def summarise(runs):
    """Medians over one core count's runs; ``None`` figures when a run was not ok."""
    ok = all(r["status"] == "ok" for r in runs)
    return {"status": "ok" if ok else next(r["status"] for r in runs if r["status"] != "ok"),
            "wall_median_s": statistics.median(r["wall_s"] for r in runs) if ok else None,
            "cpu_median_s": statistics.median(r["cpu_main_s"] for r in runs) if ok else None,
            "walls_s": [r["wall_s"] for r in runs],
            "cpus_s": [r["cpu_main_s"] for r in runs],
            "peak_rss_tree_bytes": max(r["peak_rss_tree_bytes"] for r in runs),
            "peak_pss_tree_bytes": (None if any(r.get("peak_pss_tree_bytes") is None for r in runs)
                                    else max(r["peak_pss_tree_bytes"] for r in runs)),
            "records": runs[-1].get("records")}


def _round_speedups(result):
    """Each round's own speed-up net of its start-up runs (``[]`` when a run was not ok)."""
    runs, startup = result["runs"], result["startup"]["runs"]
    out = []
    for t1, t2, s1, s2 in zip(runs["1"], runs["2"], startup["1"], startup["2"]):
        if all(r["status"] == "ok" for r in (t1, t2, s1, s2)) and t2["wall_s"] > s2["wall_s"]:
            out.append((t1["wall_s"] - s1["wall_s"]) / (t2["wall_s"] - s2["wall_s"]))
    return out


def figures(result):
    """Speed-up net of start-up and CPU per input net of start-up for one set."""
    startup = result["startup"]
    c1, c2 = result["cores"]["1"], result["cores"]["2"]
    s1, s2 = startup["cores"]["1"], startup["cores"]["2"]
    out = {"wall_1_s": c1["wall_median_s"], "wall_2_s": c2["wall_median_s"],
           "cpu_1_s": c1["cpu_median_s"], "cpu_2_s": c2["cpu_median_s"],
           "startup_1_s": s1["wall_median_s"], "startup_2_s": s2["wall_median_s"],
           "peak_rss_bytes": max(c1["peak_rss_tree_bytes"], c2["peak_rss_tree_bytes"]),
           "peak_pss_bytes": (None if None in (c1["peak_pss_tree_bytes"], c2["peak_pss_tree_bytes"])
                              else max(c1["peak_pss_tree_bytes"], c2["peak_pss_tree_bytes"])),
           "items": result["input"]["items"], "speedup_net": None, "cpu_per_item_net_us": None,
           "round_speedups": _round_speedups(result)}
    walls = (c1["wall_median_s"], c2["wall_median_s"], s1["wall_median_s"], s2["wall_median_s"])
    if None not in walls and walls[1] > walls[3]:
        out["speedup_net"] = (walls[0] - walls[2]) / (walls[1] - walls[3])
    items = result["input"]["items"] - startup["input"]["items"]
    if None not in (c2["cpu_median_s"], s2["cpu_median_s"]) and items > 0:
        out["cpu_per_item_net_us"] = (c2["cpu_median_s"] - s2["cpu_median_s"]) / items * 1e6
    return out


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def report(results, plan, quick):
    """Prints the table and the verdicts; returns ``(table, checks)`` for the JSON."""
    table = {s.name: figures(results[s.name]) for s, _ in plan}
    print("\n" + "=" * 30 + " SCALING " + "=" * 30)
    for s, startup in plan:
        c = results[s.name]["startup"]["cores"]
        print(f"{s.name}'s start-up runs, {startup.name} ({startup.items} inputs): 1 core "
              f"{_fmt(c['1']['wall_median_s'], '.2f')} s, 2 cores {_fmt(c['2']['wall_median_s'], '.2f')} s, "
              f"CPU {_fmt(c['2']['cpu_median_s'], '.2f')} s, peak PSS "
              f"{_fmt(c['2']['peak_pss_tree_bytes'] and c['2']['peak_pss_tree_bytes'] / MB, '.0f')} MB "
              f"(RSS summed {c['2']['peak_rss_tree_bytes'] / MB:.0f} MB)")
    print(f"{'set':<10}{'inputs':>10}{'1 core s':>10}{'2 cores s':>10}{'speed-up':>9}{'rounds':>12}"
          f"{'CPU s':>8}{'CPU/input':>11}{'PSS MB':>8}{'RSS MB':>8}")
    for name, f in table.items():
        spread = f["round_speedups"]
        rounds = f"{min(spread):.2f}..{max(spread):.2f}" if spread else "-"
        print(f"{name:<10}{f['items']:>10,}{_fmt(f['wall_1_s'], '10.2f')}{_fmt(f['wall_2_s'], '10.2f')}"
              f"{_fmt(f['speedup_net'], '.2f') + 'x':>9}{rounds:>12}{_fmt(f['cpu_2_s'], '8.2f')}"
              f"{_fmt(f['cpu_per_item_net_us'], '.1f') + ' us':>11}"
              f"{_fmt(f['peak_pss_bytes'] and f['peak_pss_bytes'] / MB, '8.0f')}{f['peak_rss_bytes'] / MB:8.0f}")
    print("(speed-up = (t1 - s1) / (t2 - s2) of the medians, s the set's start-up runs on the same cores; "
          "rounds: the lowest and highest of the rounds' own speed-ups; CPU is user+sys of the process "
          "tree on 2 cores; CPU/input is net of the start-up runs' CPU; PSS and RSS are the process "
          "tree's peak, PSS counting a page its processes share once)")
    checks = []
    for name, f in table.items():
        x = f["speedup_net"]
        checks.append((f"{name}: 1 -> 2 cores >= {SPEEDUP_MIN}x net of start-up",
                       "n/a" if x is None else "PASS" if x >= SPEEDUP_MIN else "FAIL",
                       "no figure" if x is None else f"{x:.2f}x"))
    if "cifar" in table:
        us = table["cifar"]["cpu_per_item_net_us"]
        checks.append((f"cifar: <= {CPU_PER_PNG_MAX_US:.0f} us of CPU per tiny PNG (net of start-up)",
                       "n/a" if us is None else "PASS" if us <= CPU_PER_PNG_MAX_US else "FAIL",
                       "no figure" if us is None else f"{us:.1f} us"))
    print("\n== Must show (issue 23, scaling)" + (" -- QUICK RUN: sizes too small, verdicts "
                                                  "not meaningful" if quick else "") + " ==")
    for target, verdict, evidence in checks:
        print(f"{verdict:<5} {target}: {evidence}")
    return table, checks


def main(argv=None):
    """Builds the sets, runs ours pinned to 1 and 2 cores, prints and saves the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--quick", action="store_true",
                        help="small sets (600 PNGs, 6 MB of photos, 10k rows), one run each: "
                             "checks the script, not speed")
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated subset of the default")
    parser.add_argument("--repeat", type=int, help="rounds per set and core count (5; 1 with --quick)")
    parser.add_argument("--cores1", default="0", help="taskset CPU list of the 1-core runs (0)")
    parser.add_argument("--cores2", default="0,1", help="taskset CPU list of the 2-core runs (0,1)")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    wanted = args.sets.split(",")
    if not set(wanted) <= set(SETS):
        parser.error(f"unknown set in --sets {args.sets}; allowed: {','.join(SETS)}")
    if shutil.which("taskset") is None:
        parser.error("taskset is not on PATH (util-linux); it pins the runs to cores")
    for cpus in (args.cores1, args.cores2):
        if not {int(c) for c in cpus.split(",")} <= os.sched_getaffinity(0):
            parser.error(f"CPUs {cpus} are not all available here "
                         f"(available: {sorted(os.sched_getaffinity(0))})")
    tag = "scaling_quick" if args.quick else "scaling"
    dirs = {"out": os.path.join(args.workdir, "out", tag),
            "logs": os.path.join(args.workdir, "logs", tag)}
    os.makedirs(dirs["logs"], exist_ok=True)
    started = time.perf_counter()
    print("building the data sets (reused when complete)", flush=True)
    plan = build(os.path.join(args.workdir, "data"), args.quick, wanted)
    results = {}
    for s, startup in plan:
        results[s.name] = run_set(s, startup, args, dirs)
    shutil.rmtree(dirs["out"], ignore_errors=True)
    table, checks = report(results, plan, args.quick)
    runs_s = time.perf_counter() - started
    print(f"\ntime: {runs_s / 60:.1f} min")
    path = os.path.join(args.workdir, f"results_{tag}.json")
    with open(path, "w") as f:
        json.dump({**bench_images.run_info(args.workdir), "args": vars(args), "runs_s": runs_s,
                   "sets": results, "scaling": table,
                   "must_show": [{"target": t, "verdict": v, "evidence": e}
                                 for t, v, e in checks]}, f, indent=2)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
