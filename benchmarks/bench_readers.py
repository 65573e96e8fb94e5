"""Reader benchmark (issue 22): ``DataSource`` against ``tf.data`` on our own output.

    .venv/bin/python benchmarks/bench_readers.py [--workdir DIR] [--quick] [--repeat 1]
                                                 [--sets photo,table]

Two data sets of the image and table benchmarks, built once and reused: the photo set
(``datasets.make_photo_like``: JPEGs 320-1024 px wide, ~600 MB, ``WORKDIR/data/photo``;
``--quick``: 6 MB under ``data/quick``) and the 1M-row table (``datasets_csv``:
``WORKDIR/data/csv/tabular.csv``; ``--quick``: 10,000 rows). Each is converted once
by the CLI (``WORKDIR/out/readers/<set>``, reused while its manifest is there), then
read whole, in one process, in one invocation, by:

* ``ds_sequential``: ``DataSource(out, "train")[i]`` for i in order (every record's
  CRCs checked, decoded into numpy by the manifest's spec);
* ``ds_random``: the same in a random order (a fixed permutation);
* ``ds_decode`` (photos only): sequential with ``decode_images=True`` (Pillow);
* ``tf_parsed``: ``tf_dataset(out, "train")`` iterated (``parse_single_example`` by
  the same spec; tensors to numpy), sequential, as a user gets it;
* ``tf_batched``: the fast tf.data idiom: the same shards in batches of 256 parsed
  by ``tf.io.parse_example`` with the same spec (variable-length features left
  sparse), prefetched;
* ``tf_raw``: ``tf.data.TFRecordDataset`` of the same shards, records only (no
  parsing): the floor of a sequential read.

TensorFlow and the package are imported before anything is timed; a reader's time
includes making its dataset (tf.data traces its parse function then).

Each reader starts from a fresh ``DataSource`` (its first read of a shard scans that
shard's framing, or reads its index file: included). The figures are records/s (median of
``--repeat`` rounds) and each reader's ratio to ``tf_parsed``; printed, and written to
``WORKDIR/results_readers.json``. The page cache holds the shards after the first
reader (they are read once before timing), so this is CPU cost, not disk.
"""

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

import datasets
import datasets_csv

READERS = ("ds_sequential", "ds_random", "ds_decode", "tf_parsed", "tf_batched", "tf_raw")


def convert(name, source, out, schema=None):
    """Converts ``source`` to ``out`` with the CLI unless a dataset is already there."""
    if os.path.exists(os.path.join(out, "manifest.json")):
        print(f"{name}: reusing {out}", flush=True)
        return
    command = [sys.executable, "-m", "beam_tfrecords", "convert", "--input", source, "--output", out,
               "--overwrite", "--progress", "off"] + (["--schema", schema] if schema else [])
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"{name}: converted in {time.perf_counter() - started:.1f} s -> {out}", flush=True)


def warm(out):
    """Reads every shard once, so every reader finds them in the page cache."""
    for folder, _, names in os.walk(out):
        for name in names:
            if ".tfrecord" in name:
                with open(os.path.join(folder, name), "rb") as f:
                    while f.read(1 << 24):
                        pass


def read_data_source(out, order, decode_images=False):
    """Reads every record of ``order`` through a fresh DataSource; returns the count."""
    from beam_tfrecords import DataSource  # pylint: disable=import-outside-toplevel

    source = DataSource(out, "train", decode_images=decode_images)
    count = 0
    for i in order(len(source)):
        source[i]
        count += 1
    return count


def read_tf(out, how):
    """Reads the split with tf.data: ``parsed`` by ``tf_dataset``, ``batched`` (256 at a
    time by ``parse_example``) or ``raw`` records."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from beam_tfrecords import tf_dataset  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.verify import dataset_shards  # pylint: disable=import-outside-toplevel

    if how == "parsed":
        dataset = tf_dataset(out, "train")
    else:
        dataset = tf.data.TFRecordDataset(dataset_shards(out, "train"))
    if how == "batched":
        with open(os.path.join(out, "manifest.json")) as f:
            spec = json.load(f)["features"]
        parse = {k: tf.io.VarLenFeature(v["dtype"]) if None in v["shape"]
                 else tf.io.FixedLenFeature(v["shape"], v["dtype"]) for k, v in spec.items()}
        dataset = dataset.batch(256).map(lambda r: (tf.shape(r)[0], tf.io.parse_example(r, parse)))
        return sum(int(n) for n, _ in dataset.prefetch(2))
    count = 0
    for _ in dataset.as_numpy_iterator():
        count += 1
    return count


def readers(name, out):
    """``{reader: function returning the records read}`` for one data set."""
    def shuffled(n):
        order = list(range(n))
        random.Random(0).shuffle(order)
        return order

    found = {
        "ds_sequential": lambda: read_data_source(out, range),
        "ds_random": lambda: read_data_source(out, shuffled),
        "tf_parsed": lambda: read_tf(out, "parsed"),
        "tf_batched": lambda: read_tf(out, "batched"),
        "tf_raw": lambda: read_tf(out, "raw"),
    }
    if name == "photo":
        found["ds_decode"] = lambda: read_data_source(out, range, decode_images=True)
    return found


def measure(name, out, repeat):
    """Records/s of every reader (median of ``repeat`` rounds), in rounds."""
    warm(out)
    runs = {}
    for _ in range(repeat):
        for reader, function in readers(name, out).items():
            started = time.perf_counter()
            records = function()
            seconds = time.perf_counter() - started
            runs.setdefault(reader, []).append((records, seconds))
            print(f"  {name:6s} {reader:14s} {records:>9,} records in {seconds:7.2f} s: "
                  f"{records / seconds:>10,.0f} records/s", flush=True)
    result = {}
    for reader, rounds in runs.items():
        counts = {records for records, _ in rounds}
        assert len(counts) == 1, f"{reader} read {counts} records"
        seconds = statistics.median(s for _, s in rounds)
        result[reader] = {"records": counts.pop(), "seconds": round(seconds, 3),
                          "records_per_s": round(rounds[0][0] / seconds, 1)}
    lengths = {r["records"] for r in result.values()}
    assert len(lengths) == 1, f"the readers disagree on the record count: {result}"
    return result


def print_table(results):
    print(f"\n{'set':6s} {'reader':14s} {'records':>9s} {'records/s':>11s} {'x tf_parsed':>12s}")
    for name, result in results.items():
        reference = result["tf_parsed"]["records_per_s"]
        for reader in READERS:
            if reader in result:
                r = result[reader]
                print(f"{name:6s} {reader:14s} {r['records']:>9,} {r['records_per_s']:>11,.0f} "
                      f"{r['records_per_s'] / reference:>11.2f}x")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--workdir", default="/tmp/beam-tfrecords-bench")
    parser.add_argument("--quick", action="store_true", help="6 MB of photos, 10,000 rows")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--sets", default="photo,table", help="which sets, comma-separated")
    args = parser.parse_args(argv)
    data = os.path.join(args.workdir, "data")
    root = os.path.join(data, "quick") if args.quick else data
    outs = os.path.join(args.workdir, "out", "readers", "quick" if args.quick else "full")
    photo = datasets.make_photo_like(os.path.join(root, "photo"), total_mb=6 if args.quick else 600)
    csv_path, schema = datasets_csv.make_tabular_csv(
        os.path.join(root, "csv", "tabular.csv"), rows=10_000 if args.quick else 1_000_000)
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    import beam_tfrecords.data_source  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import beam_tfrecords.verify  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

    convert("photo", photo, os.path.join(outs, "photo"))
    convert("table", csv_path, os.path.join(outs, "table"), schema)
    results = {name: measure(name, os.path.join(outs, name), args.repeat)
               for name in ("photo", "table") if name in args.sets.split(",")}
    print_table(results)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process (TensorFlow included): {peak_mb:,.0f} MB")
    path = os.path.join(args.workdir, "results_readers.json")
    with open(path, "w") as f:
        json.dump({"quick": args.quick, "repeat": args.repeat, "results": results,
                   "peak_rss_mb": round(peak_mb)}, f, indent=2)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
