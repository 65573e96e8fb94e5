"""Preflight: resolve the input once, check flags and paths, and take the output.

Everything that can be known before a pipeline runs is decided here, once: the
options with local paths made absolute, the kind of input (images or a table),
a table's files, header and schema, whether the output may be written. The
pipeline is then built from the result (``RunPlan``), and no step re-reads a
header or re-resolves an option.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import os

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR, MANIFEST_NAME, REPORT_NAME
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.commit import (
    OutputBusyError,
    acquire_lock,
    new_run_id,
    release_lock,
    remove_stale_temporaries,
)
from beam_tfrecords.transforms.plan.layouts import parse_labels_text, resolve_input
from beam_tfrecords.transforms.plan.table_inference import infer_schema
from beam_tfrecords.transforms.tables import csv_header, table_files

__all__ = [
    "ConvertError",
    "OutputExistsError",
    "RunPlan",
    "plan_run",
    "resolve_config",
    "sample_rows",
    "take_output",
]

_INFER_SAMPLE_ROWS = 10_000


class ConvertError(ValueError):
    """The options or the inputs cannot work; the message says what to change."""


class OutputExistsError(ConvertError):
    """The output folder already holds a dataset and ``overwrite`` is off."""


class OutputBusy(ConvertError):
    """Another run is writing the output folder."""


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A conversion resolved before its pipeline is built.

    Attributes:
      config: the options, local paths absolute, ``encode_processes`` a count,
        ``layout`` set to ``table`` for a table.
      target: where the shards go, for this run.
      table_inputs: a table's CSV files ``(path, size)``, sorted.
      header: the columns of a table's first file.
      schema: a table's schema (given or inferred).
    """

    config: ConvertConfig
    target: ShardTarget
    table_inputs: tuple[tuple[str, int], ...] = ()
    header: tuple[str, ...] = ()
    schema: TableSchema | None = None

    @property
    def is_table(self) -> bool:
        return self.config.layout == "table"


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


def _is_table(config: ConvertConfig) -> bool:
    """Whether ``--input`` is a table: ``--layout table``, a ``--schema``, or (with
    ``--layout auto``) a ``.csv``/``.tsv`` file or glob whose header has no ``image``
    column (that one is an image manifest)."""
    if config.layout == "table" or config.schema:
        return True
    if config.layout != "auto" or not config.input.lower().endswith((".csv", ".tsv")):
        return False
    found = files.list_files(config.input, limit=1)
    return bool(found) and "image" not in csv_header(config.dialect, found[0][0])


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
    if config.layout != "table" and _is_table(config):
        config = dataclasses.replace(config, layout="table")
    if config.layout == "table" and config.input.lower().endswith(".tsv") and config.csv_delimiter == ",":
        config = dataclasses.replace(config, csv_delimiter="\t")
    return config


def sample_rows(config: ConvertConfig, path: str, header: list[str],
                limit: int) -> list[list[str]]:
    """Up to ``limit`` rows of a CSV file that have as many cells as ``header``."""
    with files.open_read(path) as stream:
        text = io.TextIOWrapper(stream, encoding=config.encoding, newline="")
        reader = csv.reader(text, delimiter=config.csv_delimiter, quotechar=config.csv_quote)
        if not config.no_header:
            next(reader, None)
        return [row for row in itertools.islice(reader, limit) if len(row) == len(header)]


def _table_schema(config: ConvertConfig, first: str, header: list[str]) -> TableSchema:
    """``--schema``, or a schema inferred from the first rows; checked against the header.

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
        schema = infer_schema(header, sample_rows(config, first, header, _INFER_SAMPLE_ROWS))
    missing = [c.name for c in schema.kept if c.name not in header]
    if missing:
        raise ConvertError(f"--schema names columns {missing} that {first} does not have "
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


def _check_images(config: ConvertConfig) -> None:
    layout, _, pattern = resolve_input(config.input, config.layout)
    if layout == "csv":
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


def plan_run(config: ConvertConfig, options: PipelineOptions | None = None,
             run_id: str | None = None) -> RunPlan:
    """Resolves and checks a conversion, reading what it must of the input once.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    options = options or PipelineOptions([])
    try:
        config = resolve_config(config, options)
    except ValueError as err:
        raise ConvertError(str(err)) from None
    _, root, _ = resolve_input(config.input, config.layout)
    output_root = config.output.rstrip("/") + "/"
    if (root.rstrip("/") + "/").startswith(output_root):
        raise ConvertError(f"--input {config.input} is inside --output {config.output}")
    target = ShardTarget(config.output, config.compression, run_id or new_run_id())
    if not config.layout == "table":
        _check_images(config)
        return RunPlan(config, target)
    found = tuple(table_files(config.input))
    if not found:
        raise ConvertError(f"--input: no files match {config.input}")
    try:
        header = csv_header(config.dialect, found[0][0])
    except ValueError as err:
        raise ConvertError(f"--input {err}") from None
    schema = _table_schema(config, found[0][0], header)
    return RunPlan(config, target, found, tuple(header), schema)


def take_output(plan: RunPlan) -> None:
    """Takes the output folder for this run: its lock, then a clean slate.

    Refuses a finished dataset unless overwriting (the old manifest stays until
    the new one replaces it, see ``transforms.io.commit``), removes what killed
    runs left behind, and clears the last run's report and dead letters.

    Raises:
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
      OutputBusy: when another run holds the output's lock.
    """
    config, target = plan.config, plan.target
    manifest = files.join(config.output, MANIFEST_NAME)
    if files.exists(manifest) and not config.overwrite:
        raise OutputExistsError(
            f"--output {config.output} already holds a dataset ({MANIFEST_NAME}); "
            "pass --overwrite to replace it, or choose another folder"
        )
    try:
        acquire_lock(config.output, target.run_id)
    except OutputBusyError as err:
        raise OutputBusy(str(err)) from None
    try:
        remove_stale_temporaries(config.output, target.run_id)
        stale = [files.join(config.output, REPORT_NAME)]
        stale += [p for p, _ in files.list_files(files.join(config.output, DEAD_LETTER_DIR, "*.jsonl"))]
        files.delete_files(stale)
    except BaseException:
        release_lock(config.output, target.run_id)
        raise
