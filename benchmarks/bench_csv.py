"""CSV benchmark: our converter against the naive Beam baseline.

    .venv/bin/python benchmarks/bench_csv.py [--workdir DIR] [--rows 1000000]
                                             [--only ours|baseline]

The table (built once by ``datasets_csv.py`` as ``WORKDIR/data/csv/tabular.csv``
with ``schema.yaml`` beside it) is read once to warm the page cache, then ours
(``python -m beam_tfrecords convert --schema``) and the baseline
(``benchmarks/baseline_csv.py``) run one after the other as subprocesses, each
into an emptied ``WORKDIR/out/csv/<run>``. Each run is measured by
``bench_images.bench_run`` (wall time, peak RSS of the process tree, main
process ``ru_maxrss``, records and bytes written); rows/s is the number of
input rows over the wall time, and the rows not written are reported as
dropped.

Results are printed as a table and written to ``WORKDIR/results_csv.json``;
stdout and stderr of each run are kept in ``WORKDIR/logs/csv-<run>.{out,err}``.
"""

import argparse
import json
import os
import sys
import time

import bench_images
import datasets_csv

BASELINE = os.path.join(bench_images.REPO, "benchmarks", "baseline_csv.py")
RUNS = bench_images.RUNS
MB = bench_images.MB


def ours_command(csv_path, schema_path, out_dir):
    """Returns the command line of our converter."""
    return [sys.executable, "-m", "beam_tfrecords", "convert", "--input", csv_path,
            "--schema", schema_path, "--output", out_dir, "--overwrite"]


def baseline_command(csv_path, schema_path, out_dir):
    """Returns the command line of the naive baseline, which hard-codes the schema."""
    del schema_path  # The baseline knows the columns.
    return [sys.executable, BASELINE, "--input", csv_path, "--output", out_dir]


def print_results(result):
    """Prints the table of ``bench_images`` plus rows/s and dropped rows per run."""
    inp = result["input"]
    bench_images.print_table(
        "csv", result, title=f"{inp['rows']:,} rows, {inp['bytes'] / MB:.1f} MB input")
    for run, r in result["runs"].items():
        if r["status"] == "ok":
            print(f"{run:<9} {r['rows_per_s']:.0f} rows/s; {r['records']:,} records "
                  f"written of {inp['rows']:,} rows ({r['rows_dropped']:,} dropped)")


def main(argv=None):
    """Builds the table, runs the benchmark, prints and saves the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", choices=RUNS, help="run only this converter")
    args = parser.parse_args(argv)
    commands = {"ours": ours_command, "baseline": baseline_command}
    runs = [args.only] if args.only else list(RUNS)
    os.makedirs(os.path.join(args.workdir, "logs"), exist_ok=True)

    print("\ncsv: building the table", flush=True)
    started = time.perf_counter()
    csv_path, schema_path = datasets_csv.make_tabular_csv(
        os.path.join(args.workdir, "data", "csv", "tabular.csv"), rows=args.rows)
    generate_s = time.perf_counter() - started
    print("csv: warming the page cache", flush=True)
    result = {"input": {"path": csv_path, "schema": schema_path, "rows": args.rows,
                        "generate_s": generate_s, **bench_images.warm_up(csv_path)},
              "runs": {}}
    for run in runs:
        out_dir = os.path.join(args.workdir, "out", "csv", run)
        r = bench_images.bench_run(
            run, commands[run](csv_path, schema_path, out_dir), out_dir,
            os.path.join(args.workdir, "logs", f"csv-{run}"), result["input"]["bytes"])
        ok = r["status"] == "ok"
        r["rows_per_s"] = args.rows / r["wall_s"] if ok else None
        r["rows_dropped"] = args.rows - r["records"] if ok else None
        result["runs"][run] = r
    result["ratios"] = bench_images.ratios(result["runs"])
    print_results(result)

    path = os.path.join(args.workdir, "results_csv.json")
    with open(path, "w") as f:
        json.dump({**bench_images.run_info(args.workdir), **result}, f, indent=2)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
