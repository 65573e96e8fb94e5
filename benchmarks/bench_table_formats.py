"""Table formats benchmark: the same table as CSV, Parquet and JSON Lines.

    .venv/bin/python benchmarks/bench_table_formats.py [--workdir DIR] [--rows 1000000]
                                                       [--only csv|parquet|jsonl]

The CSV is ``datasets_csv.py``'s table (``WORKDIR/data/csv/tabular.csv``, with
``schema.yaml``). The same rows are written, once, as
``WORKDIR/data/formats/tabular.parquet`` (row groups of 131,072 rows; ``flag``
bool, ``count`` int64, ``score``/``maybe`` float64 with nulls, ``ids``
list<int64>) and ``tabular.jsonl`` (one object per line, Python's ``json``);
a ``.complete`` marker holding the row count makes later runs reuse them.
Every float is the float64 that the CSV's text reads as, so the three files
hold the same values.

Each file is converted with ``python -m beam_tfrecords convert --schema
schema.yaml --splits train=0.8,test=0.2 --key_column comment`` in a subprocess,
measured by ``bench_images.bench_run`` (wall time, peak RSS of the process tree).
Then the records of the three outputs are read back, split by split and shard
by shard in name order, and compared byte for byte.

Results are printed as a table and written to ``WORKDIR/results_table_formats.json``.
"""

import argparse
import json
import os
import sys
import time

import bench_images
import datasets_csv
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from beam_tfrecords.transforms.codec.tfrecord import iter_records

FORMATS = ("csv", "parquet", "jsonl")
MB = bench_images.MB
ROW_GROUP_ROWS = 131_072


def _typed_table(csv_path):
    """The CSV's rows, typed as the schema says (floats from the CSV's own text)."""
    text = pacsv.read_csv(csv_path, convert_options=pacsv.ConvertOptions(
        column_types={c: pa.string() for c in datasets_csv.COLUMNS}, strings_can_be_null=False))
    maybe = text.column("maybe")
    ids = text.column("ids")
    return pa.table({
        "flag": pc.equal(text.column("flag"), "True"),
        "count": pc.cast(text.column("count"), pa.int64()),
        "animal": text.column("animal"),
        "score": pc.cast(text.column("score"), pa.float64()),
        "comment": text.column("comment"),
        "maybe": pc.cast(pc.if_else(pc.equal(maybe, ""), None, maybe), pa.float64()),
        "ids": pc.cast(pc.if_else(pc.equal(ids, ""), None, pc.split_pattern(ids, ";")),
                       pa.list_(pa.int64())),
    })


def make_formats(data_dir, csv_path, rows):
    """Writes the Parquet and JSON Lines copies of the CSV unless already complete."""
    parquet = os.path.join(data_dir, "tabular.parquet")
    jsonl = os.path.join(data_dir, "tabular.jsonl")
    marker = os.path.join(data_dir, "tabular.complete")
    params = {"rows": rows, "csv": os.path.abspath(csv_path)}
    try:
        with open(marker) as f:
            if json.load(f) == params and os.path.exists(parquet) and os.path.exists(jsonl):
                return parquet, jsonl
    except (OSError, ValueError):
        pass
    os.makedirs(data_dir, exist_ok=True)
    table = _typed_table(csv_path)
    pq.write_table(table, parquet, row_group_size=ROW_GROUP_ROWS)
    with open(jsonl, "w", encoding="utf-8") as f:
        for batch in table.to_batches(max_chunksize=65_536):
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist())
    with open(marker, "w") as f:
        json.dump(params, f)
    return parquet, jsonl


def convert_command(path, schema_path, out_dir):
    return [sys.executable, "-m", "beam_tfrecords", "convert", "--input", path,
            "--schema", schema_path, "--output", out_dir, "--overwrite",
            "--splits", "train=0.8,test=0.2", "--key_column", "comment"]


def split_records(out_dir):
    """``{split: [record bytes, ...]}``, shards in name order."""
    out = {}
    for name in sorted(os.listdir(out_dir)):
        if ".tfrecord" not in name:
            continue
        with open(os.path.join(out_dir, name), "rb") as f:
            out.setdefault(name.split("-", 1)[0], []).extend(iter_records(f))
    return out


def compare(outputs):
    """Per-record equality of every output against the CSV's."""
    reference = split_records(outputs["csv"])
    result = {}
    for fmt, out_dir in outputs.items():
        if fmt == "csv":
            continue
        records = split_records(out_dir)
        differ = sum(a != b for split in reference for a, b in zip(reference[split], records.get(split, [])))
        counts_equal = {s: len(r) for s, r in reference.items()} == {s: len(r) for s, r in records.items()}
        result[fmt] = {"equal": counts_equal and differ == 0, "records_differing": differ,
                       "records": {s: len(r) for s, r in records.items()}}
    result["csv"] = {"records": {s: len(r) for s, r in reference.items()}}
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", choices=FORMATS)
    args = parser.parse_args(argv)
    os.makedirs(os.path.join(args.workdir, "logs"), exist_ok=True)
    started = time.perf_counter()
    csv_path, schema_path = datasets_csv.make_tabular_csv(
        os.path.join(args.workdir, "data", "csv", "tabular.csv"), rows=args.rows)
    parquet, jsonl = make_formats(os.path.join(args.workdir, "data", "formats"), csv_path, args.rows)
    print(f"inputs ready in {time.perf_counter() - started:.1f} s", flush=True)
    paths = {"csv": csv_path, "parquet": parquet, "jsonl": jsonl}
    runs, outputs = {}, {}
    for fmt in [args.only] if args.only else FORMATS:
        path = paths[fmt]
        bench_images.warm_up(path)
        out_dir = os.path.join(args.workdir, "out", "formats", fmt)
        outputs[fmt] = out_dir
        runs[fmt] = bench_images.bench_run(fmt, convert_command(path, schema_path, out_dir), out_dir,
                                           os.path.join(args.workdir, "logs", f"formats-{fmt}"),
                                           os.path.getsize(path))
        runs[fmt]["input_bytes"] = os.path.getsize(path)
    equality = compare(outputs) if "csv" in outputs and len(outputs) > 1 else {}
    print(f"\n== table formats: {args.rows:,} rows ==")
    print(f"{'format':<8} {'status':<8} {'input MB':>9} {'wall s':>8} {'rows/s':>9} "
          f"{'RSS MB tree':>11} {'records':>9}  equal to CSV")
    for fmt, r in runs.items():
        eq = equality.get(fmt, {}).get("equal")
        print(f"{fmt:<8} {r['status']:<8} {r['input_bytes'] / MB:>9.1f} {r['wall_s']:>8.1f} "
              f"{args.rows / r['wall_s']:>9.0f} {r['peak_rss_tree_bytes'] / MB:>11.0f} "
              f"{r.get('records', 0):>9,}  {'-' if fmt == 'csv' else ('yes' if eq else 'NO')}")
    with open(os.path.join(args.workdir, "results_table_formats.json"), "w") as f:
        json.dump({"rows": args.rows, "runs": runs, "equality": equality}, f, indent=2, default=str)
    failed = any(r["status"] != "ok" for r in runs.values()) or any(
        not v["equal"] for k, v in equality.items() if k != "csv")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
