"""Naive Beam baseline: a CSV file to tf.train.Example records in fixed TFRecord shards.

What a competent engineer writes without tuning anything: read the file line
by line, parse each line with ``csv.reader``, build an Example with the column
types hard-coded, and let ``WriteToTFRecord`` spread the records over
``round(input bytes / 150 MB)`` shards.

    python benchmarks/baseline_csv.py --input FILE.csv --output DIR [beam flags]

The columns are those of ``benchmarks/datasets_csv.py``. ``ReadFromText``
splits on every newline, also inside quoted fields, so a row whose text holds a
newline arrives as broken lines; lines that do not convert are dropped and
counted, and the count is printed at the end.
"""

import argparse
import csv
import posixpath

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics.metric import Metrics, MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions

from beam_tfrecords.schemas.proto import example_pb2

SHARD_BYTES = 150e6
DROPPED = Metrics.counter("baseline_csv", "dropped_lines")
FLAGS = {"True": 1, "False": 0}


def parse(line):
    """Splits one line into its fields with ``csv.reader``."""
    return next(csv.reader([line]))


def _int64s(values):
    """Wraps integers in a Feature."""
    return example_pb2.Feature(int64_list=example_pb2.Int64List(value=values))


def _floats(values):
    """Wraps floats in a Feature."""
    return example_pb2.Feature(float_list=example_pb2.FloatList(value=values))


def _bytes(values):
    """Wraps byte strings in a Feature."""
    return example_pb2.Feature(bytes_list=example_pb2.BytesList(value=values))


def to_example(fields):
    """Builds the serialized Example of one row, or nothing if it does not convert.

    Args:
        fields: The fields of one line.

    Yields:
        The Example, serialized deterministically; nothing (and the dropped
        counter goes up) if the line has the wrong number of fields or a
        value of the wrong type.
    """
    try:
        flag, count, animal, score, comment, maybe, ids = fields
        features = {
            "flag": _int64s([FLAGS[flag]]),
            "count": _int64s([int(count)]),
            "animal": _bytes([animal.encode()]),
            "score": _floats([float(score)]),
            "comment": _bytes([comment.encode()]),
            "maybe": _floats([float(maybe) if maybe else 0.0]),
            "ids": _int64s([int(i) for i in ids.split(";")] if ids else []),
        }
    except (ValueError, KeyError):
        DROPPED.inc()
        return
    example = example_pb2.Example(features=example_pb2.Features(feature=features))
    yield example.SerializeToString(deterministic=True)


def main(argv=None):
    """Parses the command line, runs the pipeline and prints the dropped count."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", required=True, help="CSV file with a header line")
    parser.add_argument("--output", required=True, help="folder for the shards")
    args, beam_args = parser.parse_known_args(argv)

    matched = FileSystems.match([args.input])[0].metadata_list
    input_bytes = sum(m.size_in_bytes for m in matched)
    num_shards = max(1, round(input_bytes / SHARD_BYTES))

    pipeline = beam.Pipeline(options=PipelineOptions(beam_args))
    _ = (pipeline
         | beam.io.ReadFromText(args.input, skip_header_lines=1)
         | beam.Map(parse)
         | beam.FlatMap(to_example)
         | beam.io.WriteToTFRecord(posixpath.join(args.output, "data"),
                                   file_name_suffix=".tfrecord",
                                   num_shards=num_shards))
    result = pipeline.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("dropped_lines"))["counters"]
    print(f"dropped lines: {sum(c.committed or 0 for c in counters)}", flush=True)


if __name__ == "__main__":
    main()
