"""The library API: build the conversion pipeline, or run it and get its result.

``build_pipeline`` returns an un-run pipeline (for tests, or to run elsewhere);
``convert`` checks the options and the output folder, runs the pipeline on the
runner the Beam options name (DirectRunner by default), and returns the run
report that the last step wrote.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import os
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.manifest import MANIFEST_NAME
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.images import DEAD_LETTER_DIR, ListImages
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.helpers import helper_pool
from beam_tfrecords.transforms.manifest import REPORT_NAME, WriteManifest
from beam_tfrecords.transforms.plan.layouts import parse_labels_text, resolve_input
from beam_tfrecords.transforms.plan.table_inference import infer_schema
from beam_tfrecords.transforms.sequences import BuildSequences, PlanSequenceShards
from beam_tfrecords.transforms.shards import PlanShards, VerifyShards, WriteShards
from beam_tfrecords.transforms.tables import (
    SPOOL_DIR,
    EncodeTables,
    PlanTableShards,
    WriteTableShards,
    csv_header,
    table_files,
    table_summary,
)

__all__ = [
    "ConvertError",
    "ConvertResult",
    "OutputExistsError",
    "build_pipeline",
    "convert",
    "submit",
]


class ConvertError(ValueError):
    """The options or the inputs cannot work; the message says what to change."""


class OutputExistsError(ConvertError):
    """The output folder already holds a dataset and ``overwrite`` is off."""


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """The outcome of a run: the report ``run_report.json`` holds."""

    report: dict

    @property
    def ok(self) -> bool:
        """Every shard proved and the error budget kept."""
        return self.report["status"] == "ok"

    @property
    def manifest_path(self) -> str | None:
        return self.report["manifest"]


def _absolute(path: str | None) -> str | None:
    if path is None or not files.is_local(path):
        return path
    return os.path.abspath(path)


def _in_process_direct_runner(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    direct = options.view_as(DirectOptions)
    return (runner is None or runner in ("DirectRunner", "direct")) and (
        direct.direct_running_mode in (None, "in_memory", "multi_threading")
    )


def is_table(config: ConvertConfig) -> bool:
    """Whether ``--input`` is a table: ``--layout table``, a ``--schema``, or (with
    ``--layout auto``) a ``.csv``/``.tsv`` file or glob whose header has no ``image``
    column (that one is an image manifest)."""
    if config.layout == "table" or config.schema:
        return True
    if config.layout != "auto" or not config.input.lower().endswith((".csv", ".tsv")):
        return False
    found = files.list_files(config.input, limit=1)
    return bool(found) and "image" not in csv_header(config, found[0][0])


def resolve_config(config: ConvertConfig, options: PipelineOptions) -> ConvertConfig:
    """The config as workers need it: local paths absolute (so every process reads
    the same files), ``encode_processes=-1`` replaced by a count for this runner,
    the layout of a table set to ``table``, and a ``.tsv`` read with tabs."""
    processes = config.encode_processes
    if processes < 0:
        processes = (os.cpu_count() or 1) if _in_process_direct_runner(options) else 0
    config = dataclasses.replace(
        config, input=_absolute(config.input), output=_absolute(config.output),
        labels=_absolute(config.labels), schema=_absolute(config.schema),
        encode_processes=processes,
    )
    if config.layout != "table" and is_table(config):
        config = dataclasses.replace(config, layout="table")
    if config.layout == "table" and config.input.lower().endswith(".tsv") and config.csv_delimiter == ",":
        config = dataclasses.replace(config, csv_delimiter="\t")
    return config


def sample_rows(config: ConvertConfig, limit: int) -> tuple[list[str], list[list[str]]]:
    """The header and up to ``limit`` rows of the first CSV file ``--input`` names."""
    found = table_files(config)
    if not found:
        raise ConvertError(f"--input: no files match {config.input}")
    header = csv_header(config, found[0][0])
    with files.open_read(found[0][0]) as stream:
        text = io.TextIOWrapper(stream, encoding=config.encoding, newline="")
        reader = csv.reader(text, delimiter=config.csv_delimiter, quotechar=config.csv_quote)
        if not config.no_header:
            next(reader, None)
        rows = [row for row in itertools.islice(reader, limit) if len(row) == len(header)]
    return header, rows


def table_schema(config: ConvertConfig, sample: int = 10_000) -> TableSchema:
    """The schema of a table: ``--schema``, or inferred from the first rows.

    Raises:
      ConvertError: when the schema file is missing or invalid, or names columns
        the CSV does not have.
    """
    if config.schema:
        if not files.exists(config.schema):
            raise ConvertError(f"--schema: {config.schema} does not exist")
        try:
            schema = load_schema(files.read_text(config.schema), config.schema)
        except ValueError as err:
            raise ConvertError(f"--schema {err}") from None
    else:
        header, rows = sample_rows(config, sample)
        schema = infer_schema(header, rows)
    found = table_files(config)
    header = csv_header(config, found[0][0]) if found else []
    missing = [c.name for c in schema.kept if c.name not in header]
    if missing:
        raise ConvertError(f"--schema names columns {missing} that {found[0][0]} does not have "
                           f"(its columns: {header})")
    if config.sequence_key:
        shaped = [c.name for c in schema.kept if c.shape is not None]
        if shaped:
            raise ConvertError(f"--sequence_key: shaped columns {shaped} are not supported in "
                               "sequences; give them no 'shape', or convert without --sequence_key")
        if not any(c.sequence for c in schema.kept):
            raise ConvertError("--sequence_key: mark the per-row columns 'sequence: true' in the "
                               "schema; the others become context features")
    for flag, column in (("--split_column", config.split_column), ("--key_column", config.key_column),
                         ("--sequence_key", config.sequence_key),
                         ("--sequence_order", config.sequence_order)):
        if column and column not in header:
            raise ConvertError(f"{flag}: column {column!r} is not in the CSV header {header}")
    return schema


def check_inputs(config: ConvertConfig) -> None:
    """Fails fast, before a pipeline starts, on inputs that cannot work.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    layout, root, pattern = resolve_input(config.input, config.layout)
    if layout == "table":
        if not table_files(config):
            raise ConvertError(f"--input: no files match {config.input}")
    elif layout == "csv":
        if not files.exists(config.input):
            raise ConvertError(f"--input: CSV manifest {config.input} does not exist")
    elif not files.list_files(pattern, limit=1):
        raise ConvertError(f"--input: no files match {pattern}")
    if config.labels:
        if not files.exists(config.labels):
            raise ConvertError(f"--labels: {config.labels} does not exist")
        try:
            parse_labels_text(files.read_text(config.labels))
        except ValueError as err:
            raise ConvertError(f"--labels {config.labels}: {err}") from None
    output_root = config.output.rstrip("/") + "/"
    if (root.rstrip("/") + "/").startswith(output_root):
        raise ConvertError(f"--input {config.input} is inside --output {config.output}")


def prepare_output(config: ConvertConfig) -> None:
    """Refuses a finished dataset unless overwriting; clears what a run rewrites.

    The old manifest goes first, so the folder never looks complete while it
    holds a mix of old and new shards. Old shards are removed only at the end of
    a successful run (see ``transforms.manifest``).

    Raises:
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
    """
    manifest = files.join(config.output, MANIFEST_NAME)
    if files.exists(manifest):
        if not config.overwrite:
            raise OutputExistsError(
                f"--output {config.output} already holds a dataset ({MANIFEST_NAME}); "
                "pass --overwrite to replace it, or choose another folder"
            )
        files.delete_files([manifest])
    stale = [files.join(config.output, REPORT_NAME)]
    stale += [p for p, _ in files.list_files(files.join(config.output, DEAD_LETTER_DIR, "*.jsonl"))]
    stale += [p for p, _ in files.list_files(files.join(config.output, SPOOL_DIR, "*"))]
    files.delete_files(stale)


def build_pipeline(
    config: ConvertConfig,
    options: PipelineOptions | None = None,
    schema: TableSchema | None = None,
) -> beam.Pipeline:
    """The conversion as an un-run Beam pipeline.

    Args:
      config: the conversion (see ``resolve_config`` for what is filled in).
      options: Beam options (runner and its flags); DirectRunner when ``None``.
      schema: for a table, its schema; default: ``table_schema(config)``.
    """
    options = options or PipelineOptions([])
    config = resolve_config(config, options)
    pipeline = beam.Pipeline(options=options)
    if config.layout == "table":
        schema = schema or table_schema(config)
        spool_dir = files.join(config.output, SPOOL_DIR)
        encoded = pipeline | "EncodeTables" >> EncodeTables(config, schema, spool_dir)
        if config.sequence_key:
            spools = encoded.rows | "BuildSequences" >> BuildSequences(schema, spool_dir)
            specs, grouped = spools | "PlanSequenceShards" >> PlanSequenceShards(config)
            summary = (
                encoded.infos
                | "CollectFiles" >> beam.combiners.ToList()
                | "Summarize" >> beam.Map(table_summary, config, schema, beam.pvalue.AsSingleton(grouped))
            )
        else:
            specs, summary = encoded.infos | "PlanTableShards" >> PlanTableShards(config, schema)
        results = (
            specs
            | "WriteShards" >> WriteTableShards(config)
            | "VerifyShards" >> VerifyShards(config)
        )
        _ = results | "WriteManifest" >> WriteManifest(config, summary)
        return pipeline
    listing = pipeline | "ListImages" >> ListImages(config)
    results = (
        listing.refs
        | "PlanShards" >> PlanShards(config)
        | "WriteShards" >> WriteShards(config)
        | "VerifyShards" >> VerifyShards(config)
    )
    _ = results | "WriteManifest" >> WriteManifest(config, listing.summary)
    return pipeline


def submit(config: ConvertConfig, beam_args: Sequence[str] = ()):
    """Checks, prepares and starts a conversion without waiting for it.

    For launchers that only submit (a Dataflow Flex Template): the outcome is
    then ``OUTPUT/run_report.json``, and ``manifest.json`` when it succeeded.

    Returns:
      Beam's ``PipelineResult``.

    Raises:
      ConvertError: on options or inputs that cannot work (before anything runs).
    """
    options = PipelineOptions(list(beam_args))
    config = resolve_config(config, options)
    check_inputs(config)
    schema = table_schema(config) if config.layout == "table" else None
    prepare_output(config)
    return build_pipeline(config, options, schema).run()


def convert(config: ConvertConfig, beam_args: Sequence[str] = ()) -> ConvertResult:
    """Runs a conversion to the end and returns its report.

    Args:
      config: the conversion.
      beam_args: Beam flags (``--runner``, ``--direct_num_workers``, ...).

    Raises:
      ConvertError: on options or inputs that cannot work (before anything runs).
      RuntimeError: when the pipeline ends without a run report.
    """
    options = PipelineOptions(list(beam_args))
    config = resolve_config(config, options)
    check_inputs(config)
    schema = table_schema(config) if config.layout == "table" else None
    prepare_output(config)
    pipeline = build_pipeline(config, options, schema)
    if config.layout == "table" and config.encode_processes > 0:
        # Start them, and their imports, now, while the runner starts.
        helper_pool(config.encode_processes, preload=("beam_tfrecords.transforms.codec.table_batches",))
    pipeline.run().wait_until_finish()
    report_path = files.join(config.output, REPORT_NAME)
    if not files.exists(report_path):
        raise RuntimeError(f"the pipeline finished without writing {report_path}")
    return ConvertResult(json.loads(files.read_text(report_path)))
