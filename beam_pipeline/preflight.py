"""Preflight: resolve the input once, check flags and paths, and take the output.

Everything that can be known before a pipeline runs is decided here, once: the
options with local paths made absolute, the kind of input (images or a table),
a table's files, header and schema, whether the output may be written. The
pipeline is then built from the result (``RunPlan``), and no step re-reads a
header or re-resolves an option.
"""

from __future__ import annotations

import codecs
import concurrent.futures
import csv
import dataclasses
import datetime
import io
import itertools
import json
import os
import re
from collections import Counter

import numpy as np
from apache_beam.io.filesystem import BeamIOError, FileSystem
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from beam_tfrecords.schemas.config import ConvertConfig, CsvDialect, expand_templates
from beam_tfrecords.schemas.features import IMAGE_FEATURE_SPEC, image_feature_spec
from beam_tfrecords.schemas.inputs import INPUTS_NAME, InputFile, encode_inputs
from beam_tfrecords.schemas.manifest import (
    DEAD_LETTER_DIR,
    MANIFEST_NAME,
    REPORT_NAME,
    parse_manifest,
)
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms import worker_listing
from beam_tfrecords.transforms.codec.images import is_image_filename
from beam_tfrecords.transforms.images import (
    LISTING_NAME,
    HeldImages,
    ListingIdentity,
    keep_listing,
    list_images,
    read_labels_text,
)
from beam_tfrecords.transforms.io import files, gcs
from beam_tfrecords.transforms.io.commit import (
    OutputBusyError,
    acquire_lock,
    new_run_id,
    release_lock,
    remove_folder,
    remove_stale_temporaries,
)
from beam_tfrecords.transforms.io.dataflow_jobs import DataflowApi, DataflowJob
from beam_tfrecords.transforms.io.fingerprint import (
    file_entries,
    hash_entries,
    published_entry,
    relative_path,
    role_entry,
    root_identity,
    table_entries,
    write_inputs,
)
from beam_tfrecords.transforms.io.ownership import (
    OutputClaims,
    claim_output,
    prune_journal,
    record_folder,
)
from beam_tfrecords.transforms.io.table_readers import (
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    csv_sample_lines,
    table_format,
    typed_sample,
)
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    DEFAULT_SPLIT,
    IMAGE_COLUMNS,
    SPLIT_NAMES,
    Listing,
    find_image_column,
    folders_are_splits,
    image_path_column,
    manifest_columns,
    parse_labels_text,
    resolve_input,
    rows_outside,
)
from beam_tfrecords.transforms.plan.names import check_names
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.transforms.plan.table_inference import infer_schema, infer_typed_schema
from beam_tfrecords.transforms.quality.drift import (
    PREVIOUS,
    DriftGate,
    baseline_of,
    drift_manifest_path,
)
from beam_tfrecords.transforms.tables import csv_header, table_files, table_header
from beam_tfrecords.transforms.worker_listing import UnitsToList
from beam_tfrecords.updates import Update, UpdateRefused, decide, manifest_digest, read_dataset
from beam_tfrecords.verify import manifest_text

__all__ = [
    "ConvertError",
    "OutputExistsError",
    "OutputNotOursError",
    "RunPlan",
    "plan_run",
    "refuse_local_paths_on_dataflow",
    "resolve_config",
    "runs_on_dataflow",
    "infer_table_schema",
    "sample_rows",
    "table_inputs",
    "take_output",
]

_INFER_SAMPLE_ROWS = 10_000
# Rows read to tell whether a CSV without an image column names images anyway.
_PATH_SAMPLE_ROWS = 20
_CSV_SUFFIXES = (".csv", ".tsv")
# Always tables (never image manifests).
_TYPED_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES
_CSV_DIALECT_FLAGS = (("--no_header", "no_header"), ("--columns", "columns"),
                      ("--csv_delimiter", "csv_delimiter"), ("--csv_quote", "csv_quote"),
                      ("--encoding", "encoding"), ("--no_quoted_newlines", "quoted_newlines"))
_GLOB = re.compile(r"[*?\[]")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ConvertConfig)
             if f.default is not dataclasses.MISSING}
# Flags that only tables use, and flags that only images use: (flag, ConvertConfig field).
_TABLE_FLAGS = (
    ("--schema", "schema"), ("--split_column", "split_column"), ("--key_column", "key_column"), ("--sequence_key", "sequence_key"),
    ("--sequence_order", "sequence_order"), ("--no_header", "no_header"), ("--columns", "columns"),
    ("--csv_delimiter", "csv_delimiter"), ("--csv_quote", "csv_quote"), ("--encoding", "encoding"),
    ("--no_quoted_newlines", "quoted_newlines"), ("--strict_schema", "strict_schema"),
)
_IMAGE_FLAGS = (("--labels", "labels"), ("--validate", "validate"), ("--max_pixels", "max_pixels"),
                ("--read_threads", "read_threads"), ("--image_bytes", "image_bytes"),
                ("--split_by", "split_by"), ("--drop_duplicates", "drop_duplicates"),
                ("--fail_on_leakage", "fail_on_leakage"), ("--max_side", "max_side"),
                ("--min_side", "min_side"), ("--size", "size"), ("--fit", "fit"),
                ("--image_format", "image_format"), ("--jpeg_quality", "jpeg_quality"),
                ("--color_mode", "color_mode"), ("--follow_links_outside", "follow_links_outside"),
                ("--max_file_bytes", "max_file_bytes"))
_MANIFEST_FLAGS = (("--image_column", "image_column"), ("--label_column", "label_column"),
                   ("--allowed_roots", "allowed_roots"), ("--allow_paths_outside", "allow_paths_outside"))


class ConvertError(ValueError):
    """The options or the inputs cannot work; the message says what to change."""


class OutputExistsError(ConvertError):
    """The output folder already holds a dataset and ``overwrite`` is off."""


class OutputBusy(ConvertError):
    """Another run is writing the output folder."""


class OutputNotOursError(ConvertError):
    """The output folder holds files this product cannot prove it wrote, where a
    run would replace them or read them as the dataset's (or a folder of its own
    is a link)."""


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
      dropped_columns: header columns that ``--schema`` does not name (not written).
      inputs: what the preflight decided, as lines for people (see ``describe``).
      listing: for images, a token for the listing the preflight made (the
        listing step takes it when it runs in this process).
      input_files: the fingerprint entries of the inputs this run converts.
      role_files: entries of the labels file, schema, CSV manifest (by role).
      update: what a scheduled run decided (``skip``, ``run`` or ``part``; see
        ``beam_pipeline.updates``); ``None`` for a plain run.
      dataset_output: the dataset's folder (the lock is taken there): the
        ``--output`` given; ``config.output`` is the part's folder for a part.
      vocabulary: for an incremental run over images, the dataset's classes.
      only: for an incremental run over images, the files to convert.
      input_table, input_rows: for a plain run over a folder layout, the listing's
        columns (``Listing.files``) and the rows it converts (``None``: all), which
        ``inputs.jsonl`` is written from instead of ``input_files``.
      hand_over: the listing step runs in other processes (Dataflow, a
        multi-process DirectRunner): building the pipeline writes the listing to
        the run's temporary folder for it (``listing_path``), so that the run
        converts the files this plan lists, not a second listing's.
      units: with ``--list_on_workers``, the units the workers list and what the
        launcher decided for them (no listing is made here).
      output_claims: the output folder sorted into what this product wrote, what
        it did not (refused), and what it leaves alone (see
        ``transforms.io.ownership``); ``None`` until ``plan_run`` looked.
      contents_on_workers: ``--drop_duplicates`` or ``--split_by content`` hash the
        images on the workers (``contents_on_workers``), not here.
    """

    config: ConvertConfig
    target: ShardTarget
    table_inputs: tuple[tuple[str, int], ...] = ()
    header: tuple[str, ...] = ()
    schema: TableSchema | None = None
    dropped_columns: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    listing: str | None = None
    input_files: tuple[InputFile, ...] = ()
    role_files: tuple[InputFile, ...] = ()
    update: Update | None = None
    dataset_output: str = ""
    vocabulary: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    input_table: RefTable | None = None
    input_rows: object = None
    hand_over: bool = False
    units: UnitsToList | None = None
    output_claims: OutputClaims | None = None
    contents_on_workers: bool = False

    @property
    def is_table(self) -> bool:
        return self.config.layout == "table"

    @property
    def listing_path(self) -> str | None:
        """Where the listing step reads the preflight's listing (``None``: it takes it
        in this process)."""
        return files.join(self.target.temp_dir, LISTING_NAME) if self.hand_over and self.listing else None

    def describe(self) -> list[str]:
        """What the run will do, decided before it runs: input kind and layout,
        splits, classes or columns, features, and what is left out and why."""
        claims = self.output_claims.plan_lines() if self.output_claims is not None else []
        return [f"plan: {self.config.input} -> {self.config.output}", *self.inputs, *claims]


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


def runs_on_dataflow(options: PipelineOptions | None) -> bool:
    """Whether ``options`` name Dataflow's runner."""
    runner = options.view_as(StandardOptions).runner if options is not None else None
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else ""
    return name.rsplit(".", 1)[-1] in ("DataflowRunner", "dataflow", "TestDataflowRunner")


def refuse_local_paths_on_dataflow(config: ConvertConfig, options: PipelineOptions | None) -> None:
    """On Dataflow, refuses what the workers would read or write on the launcher's
    disk, which they cannot see: a local ``--input`` (every image a read_error after
    the whole job ran) or ``--output`` (each worker writing to its own disk),
    ``--allowed_roots``, or, with ``--allow_paths_outside``, a CSV manifest's rows
    naming local images. ``--labels``, ``--schema`` and ``--compare_to`` are read
    here, on the launcher, and may stay local.

    Raises:
      ConvertError: naming the flags, and to use gs://.
    """
    if not runs_on_dataflow(options):
        return
    local = [f"{flag} {value}" for flag, value in (("--input", config.input), ("--output", config.output))
             if files.is_local(value)]
    local += [f"--allowed_roots {root}" for root in config.allowed_roots if files.is_local(root)]
    if not local and config.allow_paths_outside and config.input.lower().endswith(".csv"):
        try:
            outside = rows_outside(config.input, files.read_text(config.input), config.image_column,
                                   config.label_column, (), _row_resolver())
        except (OSError, BeamIOError, ValueError):
            outside = {}  # Not a readable image manifest: the checks after this one say why.
        local = [f"--input {config.input} (its rows name images under {_printable_root(root)})"
                 for root in outside if files.is_local(root)][:1]
    if local:
        raise ConvertError(f"{', '.join(local)}: Dataflow's workers cannot see this machine's disk; "
                           "use gs:// paths (copy local files to a bucket first, e.g. gcloud "
                           "storage cp -r DIR gs://BUCKET/DIR)")


def _is_folder(path: str) -> bool:
    """Whether ``path`` (not a glob) is a folder holding files."""
    if _GLOB.search(path):
        return False
    if files.is_local(path) and os.path.isdir(path):
        return True
    return bool(files.list_files(path.rstrip("/") + "/**", limit=1))


def _is_table(config: ConvertConfig) -> bool:
    """Whether ``--input`` is a table: ``--layout table``; or, with ``--layout auto``,
    a ``.csv``/``.tsv`` file or glob whose header has no image column (see
    ``layouts.IMAGE_COLUMNS``; with one, or with ``--image_column`` or
    ``--label_column``, it is an image manifest), a Parquet (``.parquet``, ``.pq``)
    or JSON Lines (``.jsonl``, ``.ndjson``, also ``.gz``) file or glob, or any other
    file or glob given a ``--schema`` (a folder stays a folder of images)."""
    if config.layout == "table":
        return True
    if config.layout != "auto":
        return False
    if config.input.lower().endswith(_TYPED_SUFFIXES):
        return bool(files.list_files(config.input, limit=1))
    if config.input.lower().endswith(_CSV_SUFFIXES):
        found = files.list_files(config.input, limit=1)
        if not found or config.image_column or config.label_column:
            return False
        return find_image_column(csv_header(config.dialect, found[0][0])) is None
    return bool(config.schema) and not _is_folder(config.input)


def _given(config: ConvertConfig, flags) -> list[str]:
    """The flags of ``flags`` whose values differ from the defaults."""
    given = []
    for flag, name in flags:
        if name not in _DEFAULTS:
            continue
        value, default = getattr(config, name), _DEFAULTS[name]
        if name == "encoding":
            try:
                value, default = codecs.lookup(value).name, codecs.lookup(default).name
            except LookupError:
                pass
        if value != default:
            given.append(flag)
    return given


def _refuse(flags: list[str], only: str, what: str, hint: str = "") -> None:
    """Raises ConvertError for ``flags`` that apply ``only`` to other inputs than ``what``."""
    if flags:
        many = len(flags) > 1
        raise ConvertError(f"{', '.join(flags)} appl{'y' if many else 'ies'} only to {only}, and "
                           f"--input {what}: remove {'them' if many else 'it'}{hint}")


def table_inputs(path: str) -> tuple[tuple[str, int], ...]:
    """The table files (CSV, Parquet, JSON Lines) of a table's ``--input`` (a file or a
    glob), sorted, with sizes.

    Raises:
      ConvertError: for a folder, or when nothing matches.
    """
    if _is_folder(path):
        raise ConvertError(f"--input must be a table file or glob (CSV, Parquet or JSON Lines, "
                           f"e.g. '{path.rstrip('/')}/*.csv'), not a folder: {path}")
    found = tuple(table_files(path))
    if not found:
        raise ConvertError(f"--input: no files match {path}")
    return found


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
                limit: int, lines: list[int] | None = None) -> list[list[str]]:
    """Up to ``limit`` rows of a CSV file that have as many cells as ``header`` (rows
    longer than ``SAMPLE_ROW_BYTES`` left out, unread: see ``csv_sample_lines``);
    ``lines``, if given, is appended with each row's first line number."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # The converter has no cap either.
    with files.open_read(path) as stream:
        # Bytes that do not decode cost their row when converting; here they must not
        # stop the sample.
        text = io.TextIOWrapper(stream, encoding=config.encoding, errors="replace", newline="")
        sampled = csv_sample_lines(text, config.csv_quote, config.csv_delimiter, len(header))
        reader = csv.reader(sampled, delimiter=config.csv_delimiter, quotechar=config.csv_quote)
        if not config.no_header:
            next(reader, None)
        rows, line = [], reader.line_num + 1
        for row in itertools.islice(reader, limit):
            if len(row) == len(header):
                rows.append(row)
                if lines is not None:
                    lines.append(line)
            line = reader.line_num + 1
        return rows


def infer_table_schema(config: ConvertConfig, path: str, header: list[str],
                       limit: int, notes: list[str] | None = None) -> tuple[TableSchema, int]:
    """A schema inferred from the first ``limit`` rows of a table file (from the cell
    text of a CSV, from the column types of a Parquet or JSON Lines file), and the
    number of rows it was inferred from; ``notes``, if given, gets what the sample
    decided beyond the types (see ``plan.table_inference``).

    Raises:
      ValueError: if the file cannot be read.
    """
    if table_format(path) == "csv":
        rows = sample_rows(config, path, header, limit)
        return infer_schema(header, rows, notes), len(rows)
    tables = typed_sample(path, limit)
    return infer_typed_schema(header, tables, notes), sum(t.num_rows for t in tables)


def _table_schema(config: ConvertConfig, first: str, header: list[str],
                  notes: list[str] | None = None) -> TableSchema:
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
        try:
            schema, _ = infer_table_schema(config, first, header, _INFER_SAMPLE_ROWS, notes)
        except ValueError as err:
            raise ConvertError(f"--input {err}") from None
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
    """Checks an image input (folder, glob or CSV manifest) and the flags given with it."""
    layout, root, pattern = resolve_input(config.input, config.layout)
    if layout == "auto" and config.input.lower().endswith(_CSV_SUFFIXES):
        # Not a table (its header has an image column), yet not one .csv file either.
        if not files.list_files(config.input, limit=1):
            raise ConvertError(f"--input: no files match {config.input}")
        raise ConvertError(
            f"--input {config.input}: an image manifest is one comma-separated .csv file, "
            "not a glob or a .tsv; give one .csv, or pass --layout table to read the files "
            "as tables")
    if layout == "csv":
        if not files.exists(config.input):
            raise ConvertError(f"--input: CSV manifest {config.input} does not exist")
        what = f"{config.input} is a CSV image manifest"
        _refuse(_given(config, _TABLE_FLAGS), "tables", what,
                " (or pass --layout table to read the CSV as a table)")
    else:
        if not files.list_files(pattern, limit=1):
            raise ConvertError(f"--input: no files match {pattern}")
        what = f"{config.input} is {'a glob' if _GLOB.search(config.input) else 'a folder'} of images"
        _refuse(_given(config, _TABLE_FLAGS), "tables", what)
        _refuse(_given(config, _MANIFEST_FLAGS), "CSV image manifests", what)
    if config.labels:
        if not files.exists(config.labels):
            raise ConvertError(f"--labels: {config.labels} does not exist")
        try:
            parse_labels_text(read_labels_text(config.labels))
        except ValueError as err:
            raise ConvertError(f"--labels {config.labels}: {err}") from None
    if layout == "csv":
        try:
            manifest_columns(csv_header(CsvDialect(), config.input),
                             config.image_column, config.label_column)
        except ValueError as err:
            raise ConvertError(f"--input {config.input}: {err}") from None
        _check_manifest_rows(config)
    elif layout == "cifar":
        labels_file = files.join(root, CIFAR_LABELS_FILE)
        if not config.labels and not files.exists(labels_file):
            raise ConvertError(f"--layout cifar: {labels_file} does not exist; it names the "
                               "classes, one per line (or pass --labels FILE)")


def _row_resolver():
    """Where a CSV manifest's image path really is, for ``layouts.rows_outside``: a
    local path absolute with its links followed (its folder's resolved once),
    ``None`` for a scheme no file system of this run reads (that row is
    dead-lettered, not read), any other URI as it is."""
    folders: dict[str, str] = {}

    def resolve(path: str) -> str | None:
        if not files.is_local(path):
            try:
                FileSystems.get_filesystem(path)
            except ValueError:
                return None
            return path
        try:
            folder, name = os.path.split(os.path.abspath(path))
            if folder not in folders:
                folders[folder] = os.path.realpath(folder)
            real = os.path.join(folders[folder], name)
            return os.path.realpath(real) if name and os.path.islink(real) else real
        except (OSError, ValueError):  # A NUL in the name: judged by name.
            return os.path.abspath(path)

    return resolve


def _check_manifest_rows(config: ConvertConfig) -> None:
    """Refuses a CSV manifest whose rows name images outside its folder (absolute
    paths, ``..``, links out, other buckets or schemes) that ``--allowed_roots``
    does not cover, before any of them is looked up; ``--allow_paths_outside``
    reads them all.

    Raises:
      ConvertError: naming each root, its rows and the flag to add.
    """
    if config.allow_paths_outside:
        return
    resolve = _row_resolver()
    allowed = [resolve(root) or root for root in config.allowed_roots]
    try:
        outside = rows_outside(config.input, files.read_text(config.input), config.image_column,
                               config.label_column, allowed, resolve)
    except (UnicodeDecodeError, ValueError) as err:
        raise ConvertError(f"--input {config.input}: {err}") from None
    if not outside:
        return
    roots = [_printable_root(root) for root in outside]
    shown = ", ".join(f"{root} ({rows:,} row{'s' if rows > 1 else ''})"
                      for root, rows in zip(roots[:5], list(outside.values())[:5]))
    more = f" and {len(roots) - 5} more" if len(roots) > 5 else ""
    total = sum(outside.values())
    raise ConvertError(
        f"--input {config.input}: {total:,} row{'s' if total > 1 else ''} of the CSV manifest "
        f"name{'' if total > 1 else 's'} images outside its folder, under {shown}{more}; they are "
        f"read only when allowed: add --allowed_roots {','.join(roots)} (or "
        "--allow_paths_outside to read rows wherever they point)")


def _printable_root(root: str) -> str:
    """A root from a CSV cell as printed: control and non-printing characters escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in root)


def _refuse_image_paths(config: ConvertConfig, first: str, header: list[str]) -> None:
    """Refuses a CSV detected as a table whose column holds image paths."""
    lines: list[int] = []
    rows = sample_rows(config, first, header, _PATH_SAMPLE_ROWS, lines)
    found = image_path_column(header, rows)
    if found:
        column, cell = found
        at = header.index(column)
        line = next(n for row, n in zip(rows, lines) if row[at] == cell)
        raise ConvertError(
            f"--input {config.input}: column {column!r} holds image paths (e.g. on line {line}) but no "
            f"column is named {', '.join(IMAGE_COLUMNS)}, so the CSV would be read as a table of "
            f"strings; pass --image_column {column} to convert the images it names, or "
            "--layout table to keep it a table")


def _check_buckets(config: ConvertConfig) -> None:
    """Refuses, within a bounded time, a run whose ``gs://`` buckets do not answer."""
    checked = set()
    for flag, path in (("--input", config.input), ("--output", config.output),
                       ("--labels", config.labels), ("--schema", config.schema)):
        if not path or not gcs.is_gcs(path):
            continue
        bucket = path[len("gs://"):].split("/", 1)[0]
        if bucket in checked:
            continue
        checked.add(bucket)
        try:
            gcs.check_reachable(path)
        except (ConnectionError, FileNotFoundError, PermissionError) as err:
            raise ConvertError(f"{flag} {path}: {err}") from None


_SHOWN = 8


def _counts(counter: Counter, order=None) -> str:
    names = list(order) if order is not None else sorted(counter)
    shown = ", ".join(f"{name} ({counter[name]:,})" for name in names[:_SHOWN])
    return shown + (f", ... and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def contents_on_workers(config: ConvertConfig) -> bool:
    """Whether ``--drop_duplicates`` and ``--split_by content`` hash the images on the
    workers (``transforms.image_contents``): always, but for ``--drop_duplicates``
    with ``--skip_unchanged`` or ``--incremental``, where what changed is decided
    on the launcher from the files left once copies are dropped (the launcher
    hashes the images then, as before)."""
    hashing = config.drop_duplicates or bool(config.splits and config.split_by == "content")
    scheduled = config.skip_unchanged or config.incremental
    return hashing and not (config.drop_duplicates and scheduled)


def _describe_images(config: ConvertConfig, listing: Listing, on_workers: bool = False) -> list[str]:
    """The plan of an image input, from its listing (``on_workers``: before its images
    are hashed on the workers, so splits by content and copies are not known yet)."""
    refs = listing.refs
    layout = {"class_folders": "class folders", "cifar": "CIFAR (<split>/<id>_<class>.<ext>)",
              "csv": "CSV image manifest"}.get(listing.layout, listing.layout)
    table = isinstance(refs, RefTable)  # A large listing, as columns: counted without objects.
    splits = Counter(refs.split_counts() if table else (ref.split for ref in refs))
    shown = _counts(splits) or "none"
    if on_workers and config.splits and config.split_by == "content":
        shown = (", ".join(f"{name} {share:g}" for name, share in config.splits)
                 + " of the images; each picked from its bytes as the workers hash it, so the counts "
                 "are known at the end")
    lines = [f"  images: {len(refs):,} in layout {layout}; splits: {shown}"
             + (f" (from {listing.split_source})" if listing.split_source else "")]
    if listing.layout == "class_folders":
        source = "folder names"
    elif listing.layout == "cifar":
        source = "file names, numbered by labels.txt"
    else:
        source = "the CSV's label column"
    if config.labels:
        source += f", numbered by --labels {config.labels}"
    classes = Counter(refs.label_counts() if table else (ref.label_text or str(ref.label) for ref in refs))
    order = list(listing.vocabulary) or sorted(classes, key=lambda n: (len(n), n))
    lines.append(f"  labels from {source}: {len(order):,} class{'es' if len(order) != 1 else ''}: "
                 f"{_counts(classes, order)}")
    reshape = config.reshape
    if reshape.active:
        how = [f"longest side to {reshape.max_side}" if reshape.max_side else "",
               f"shortest side to {reshape.min_side}" if reshape.min_side else "",
               f"{reshape.size[0]}x{reshape.size[1]} ({reshape.fit})" if reshape.size else "",
               f"as {reshape.format.upper()}" if reshape.format != "keep" else "",
               f"quality {reshape.quality}" if reshape.format == "jpeg" or reshape.size
               or reshape.max_side or reshape.min_side else "",
               f"colour {reshape.color.upper()}" if reshape.color != "keep" else ""]
        lines.append(f"  images reshaped: {', '.join(h for h in how if h)} (never enlarged "
                     "unless --size; unchanged images keep their bytes); encoded before shards "
                     "are planned, so shards are cut by exact sizes")
    features = [name for name, _, _ in IMAGE_FEATURE_SPEC.entries()] + list(listing.extra_features)
    lines.append(f"  features: {', '.join(features)}")
    left = []
    if on_workers and config.drop_duplicates:
        left.append("copies of other images (--drop_duplicates): found as the workers hash the "
                    "images, so not counted here; the summary at the end counts them")
    if listing.duplicates_dropped:
        dropped = len(listing.duplicates_dropped)
        left.append(f"{dropped:,} cop{'ies' if dropped != 1 else 'y'} of other images "
                    "(--drop_duplicates)")
    if listing.ignored:
        left.append(f"{listing.ignored:,} file{'s' if listing.ignored > 1 else ''} that "
                    f"{'are' if listing.ignored > 1 else 'is'} not an image (by extension)")
    refused = Counter(d.error for d in listing.dead_letters)
    if refused:
        left.append(f"{sum(refused.values()):,} refused ({_counts(refused)}; dead-lettered)")
    skipped = Counter(d.error for d in listing.skipped)
    if skipped:
        left.append(f"{sum(skipped.values()):,} paths passed over ({_counts(skipped)})")
    if left:
        lines.append(f"  left out: {'; '.join(left)}")
    name = os.path.basename(config.input.rstrip("/"))
    if listing.layout == "class_folders" and name in SPLIT_NAMES and set(splits) == {DEFAULT_SPLIT}:
        lines.append(f"  note: --input is a folder named {name!r}, but its images go to split "
                     f"{DEFAULT_SPLIT!r} (splits are folders under --input; point --input at its "
                     "parent to keep the name)")
    if len(order) == 1 and listing.layout != "csv":
        lines.append(f"  note: one class only ({order[0]!r}); is --input one folder too deep?")
    return lines


def _check_table_headers(config: ConvertConfig, schema: TableSchema, found, header: list[str]) -> tuple[str, ...]:
    """The columns no file's rows will be written from (in order of first appearance).

    Every file's header is read (a CSV's first record, a Parquet schema, the keys
    of a JSON Lines file's first objects), not only the first file's: a column
    that only later files have would otherwise be dropped unseen, and a later
    file without a schema column would fail the run half way.

    Raises:
      ConvertError: a CSV or Parquet file lacks a column the run needs, or (with
        ``--strict_schema``) a file has a column the schema does not name.
    """
    headers = [(found[0][0], header)]
    if len(found) > 1:
        def read(path):
            try:
                return path, table_header(config.dialect, path)
            except ValueError as err:
                if table_format(path) == "jsonl" and "no columns" in str(err):
                    return path, []  # Empty, or no object early: its lines are read one by one.
                raise ConvertError(f"--input {err}") from None
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(16, len(found) - 1)) as pool:
            headers += list(pool.map(read, [path for path, _ in found[1:]]))
    named = {c.name for c in schema.columns}
    needed = [c.name for c in schema.kept] + [c for c in (
        config.split_column, config.key_column, config.sequence_key, config.sequence_order) if c]
    first_seen: dict[str, str] = {}
    for path, names in headers:
        if table_format(path) != "jsonl":  # A JSON object may leave a key out: its cell is empty.
            missing = [name for name in dict.fromkeys(needed) if name not in names]
            if missing:
                raise ConvertError(
                    f"--input {path} has no column {', '.join(map(repr, missing))}, which "
                    f"{'the schema' if config.schema else 'the schema inferred from ' + found[0][0]} "
                    f"needs (its columns: {', '.join(names[:20])}{' ...' if len(names) > 20 else ''}); "
                    "give files of one layout, or convert them separately")
        for name in names:
            if name not in named:
                first_seen.setdefault(name, path)
    dropped = tuple(first_seen)
    if dropped and config.strict_schema:
        by_file: dict[str, list[str]] = {}
        for name, path in first_seen.items():
            by_file.setdefault(path, []).append(name)
        listed = "; ".join(f"{path} has columns the schema does not name: {names}"
                           for path, names in list(by_file.items())[:5])
        raise ConvertError(f"--strict_schema: {listed}; add them to the schema (with 'skip: true' "
                           "to drop them on purpose), or run without --strict_schema")
    return dropped


def _describe_table(config: ConvertConfig, found, header: list[str], schema: TableSchema,
                    dropped: tuple[str, ...], notes: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The plan of a table input."""
    size = sum(s for _, s in found)
    kinds = Counter({"csv": "CSV", "parquet": "Parquet", "jsonl": "JSON Lines"}[table_format(path)]
                    for path, _ in found)
    lines = [f"  table: {len(found):,} {'/'.join(sorted(kinds))} file{'s' if len(found) > 1 else ''}, "
             f"{size / 1e6:,.1f} MB; {len(header)} columns"]
    source = f"--schema {config.schema}" if config.schema else (
        f"inferred from the first {_INFER_SAMPLE_ROWS:,} rows of {found[0][0]}")
    kept = schema.kept
    features = ", ".join(f"{c.feature_name}:{c.type}" for c in kept[:12])
    more = f", ... and {len(kept) - 12} more" if len(kept) > 12 else ""
    lines.append(f"  schema {source}: {len(kept)} features: {features}{more}")
    lines += [f"  note: {note}" for note in notes]
    skipped = [c.name for c in schema.columns if c.skip]
    if skipped or dropped:
        parts = ([f"{', '.join(skipped)} (skip: true)"] if skipped else []) + (
            [f"{', '.join(dropped)} (not in --schema; --strict_schema refuses them)"] if dropped else [])
        lines.append(f"  columns dropped: {'; '.join(parts)}")
    if config.split_column:
        splits = f"from column {config.split_column!r}"
    elif config.splits:
        key = f"column {config.key_column!r}" if config.key_column else "the whole row"
        splits = "by ratio " + ",".join(f"{n}={r:g}" for n, r in config.splits) + f", hashing {key}"
    else:
        splits = f"one split, {DEFAULT_SPLIT!r}"
    lines.append(f"  splits: {splits}")
    if config.sequence_key:
        lines.append(f"  sequences: one SequenceExample per {config.sequence_key!r}"
                     + (f", ordered by {config.sequence_order!r}" if config.sequence_order else ""))
    return lines


def _fill_templates(config: ConvertConfig) -> ConvertConfig:
    """``{date}`` and the like in ``--input`` and ``--output``, filled from ``--date``
    (default: today, UTC)."""
    date = config.date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    try:
        return dataclasses.replace(config, input=expand_templates(config.input, date, "--input"),
                                   output=expand_templates(config.output, date, "--output"),
                                   date=date)
    except ValueError as err:
        raise ConvertError(str(err)) from None


def _role_files(config: ConvertConfig, root: str, layout: str = "") -> tuple[InputFile, ...]:
    """Entries of the files besides the inputs that shape the records (``layout``:
    the one the listing used, when known)."""
    roles = []
    if config.labels:
        roles.append((config.labels, "labels"))
    elif config.layout == "cifar" or (config.layout == "auto" and not config.input.lower().endswith(".csv")
                                      and files.exists(files.join(root, CIFAR_LABELS_FILE))):
        roles.append((files.join(root, CIFAR_LABELS_FILE), "labels"))
    if config.schema:
        roles.append((config.schema, "schema"))
    if "csv" in (config.layout, layout):
        roles.append((config.input, "manifest_csv"))
    entries = []
    for path, role in roles:
        try:
            entries.append(role_entry(path, role))
        except OSError:
            pass  # A missing file fails the plan elsewhere, with its flag named.
    return tuple(entries)


def _decide(config: ConvertConfig, dataset, entries, roles, paths, root, vocabulary=()) -> Update | None:
    if not (config.skip_unchanged or config.incremental):
        return None
    try:
        return decide(config, dataset, entries, roles, paths, root, vocabulary)
    except UpdateRefused as err:
        raise ConvertError(str(err)) from None


def _as_part(config: ConvertConfig, target: ShardTarget, update: Update | None
             ) -> tuple[ConvertConfig, ShardTarget]:
    """For an incremental part, the config and target of the part's folder."""
    if update is None or update.action != "part":
        return config, target
    output = files.join(config.output, update.part)
    return (dataclasses.replace(config, output=output),
            ShardTarget(output, target.compression, target.run_id))


def _update_lines(update: Update | None) -> list[str]:
    if update is None:
        return []
    lines = [f"scheduled run: {update.action}: {update.reason}"]
    changes = update.changes
    if changes is not None and changes.changed:
        shown = ", ".join(now.path for _, now in changes.changed[:5])
        lines.append(f"  changed since the dataset was made: {shown}"
                     + (f" and {len(changes.changed) - 5} more" if len(changes.changed) > 5 else "")
                     + ("; converted again into the new part, while their old records stay in "
                        "the dataset: a full run (without --incremental) replaces them"
                        if update.action == "part" else ""))
    if update.refused_before:
        lines.append(f"  {update.refused_before} input(s) refused while listing were refused by the "
                     "dataset before (see its dead letters): not counted again in this part")
    if changes is not None and changes.deleted:
        shown = ", ".join(e.path for e in changes.deleted[:5])
        lines.append(f"  deleted since the dataset was made: {shown}"
                     + (f" and {len(changes.deleted) - 5} more" if len(changes.deleted) > 5 else "")
                     + ("; their records stay until a full run" if update.action != "run" else ""))
    return lines


def _fingerprint_columns(listing: Listing):
    """``(table, rows)``: the listing's columns (``Listing.files``) and, when the
    references are fewer (``--drop_duplicates``, unreadable files), the rows they
    keep (else ``None``); ``(None, None)`` for a CSV manifest."""
    table = listing.files
    if table is None:
        return None, None
    if len(table) == len(listing.refs):
        return table, None
    if isinstance(listing.refs, RefTable):
        kept = set(listing.refs.filename(i) for i in range(len(listing.refs)))
    else:
        kept = {ref.filename for ref in listing.refs}
    return table, np.array([i for i in range(len(table)) if table.filename(i) in kept], np.int64)


# --list_on_workers: the launcher finds folders until there are this many units
# (down to 3 levels), so that a few hundred workers' threads all have some.
WORKER_LISTING_UNITS = 256


def _plan_on_workers(config: ConvertConfig, target: ShardTarget, dataset_output: str) -> RunPlan:
    """The plan of a listing made on the workers (``transforms.worker_listing``): the
    launcher lists folders only and makes the decisions that span the input."""
    given = [flag for flag, on in (
        ("--skip_unchanged", config.skip_unchanged), ("--incremental", config.incremental),
        ("--fingerprint content", config.fingerprint == "content"),
        ("--drop_duplicates", config.drop_duplicates), ("--split_by content", config.split_by == "content"),
        ("resizing or re-encoding flags", config.reshape.active)) if on]
    if given:
        raise ConvertError(f"--list_on_workers does not combine with {', '.join(given)}: they need "
                           "every file's listing in one place; drop one or the other")
    layout, root, pattern = resolve_input(config.input, config.layout)
    if not gcs.is_gcs(pattern) or layout == "csv":
        raise ConvertError(f"--list_on_workers lists a gs:// folder or glob of images on the "
                           f"workers; {config.input} is not one (drop the flag)")
    output_root = config.output.rstrip("/") + "/"
    if output_root.startswith(root.rstrip("/") + "/"):
        raise ConvertError(f"--list_on_workers: --output {config.output} is inside the input "
                           f"folder {root}; the workers would list the run's own files as "
                           "input. Write the output elsewhere")
    if layout == "auto":
        # As detect_layout decides from a listing: a labels.txt the input matches.
        labels_file = files.join(root, CIFAR_LABELS_FILE)
        matched = re.compile(FileSystem.translate_pattern(pattern)).match(labels_file)
        layout = "cifar" if matched and files.exists(labels_file) else "class_folders"
    labels: tuple[str, ...] = ()
    try:
        if config.labels:
            labels = tuple(parse_labels_text(files.read_text(config.labels)))
        elif layout == "cifar":
            labels = tuple(parse_labels_text(files.read_text(files.join(root, CIFAR_LABELS_FILE))))
        units = tuple(files.listing_units(pattern, WORKER_LISTING_UNITS))
    except (ValueError, OSError, BeamIOError) as err:
        raise ConvertError(f"--input {config.input}: {err}") from None
    prefix = root.rstrip("/") + "/"
    top = set()
    for name, objects in units:
        for path in ([o[0] for o in objects] if objects is not None else [_gcs_path(pattern, name)]):
            rel = path[len(prefix):] if path.startswith(prefix) else ""
            if objects is None and "/" not in rel:
                raise ConvertError(
                    f"--list_on_workers: {_gcs_path(pattern, name)} holds more than "
                    f"{files.UNIT_OBJECTS:,} files directly, so its folders are not known before "
                    "the workers list it; drop the flag (the launcher then lists the input)")
            if "/" in rel and (objects is None or is_image_filename(rel)):
                top.add(rel.split("/", 1)[0])
    split_folders = False
    if layout == "class_folders":
        try:
            check_names("top-level folders", top)
            split_folders = folders_are_splits(root, top)
        except ValueError as err:
            raise ConvertError(f"--input {config.input}: {err} (with --list_on_workers, a top "
                               "folder counts even when it holds no images)") from None
    if config.splits and (split_folders or layout == "cifar"):
        raise ConvertError(f"--input {config.input}: --splits: the input already names its splits "
                           "(split folders); use one or the other")
    settings = UnitsToList(pattern, root, layout, units, split_folders, labels, tuple(config.splits),
                           config.output, target.temp_dir, config.band, config.compression,
                           worker_listing.SHARDS_PER_GROUP)
    folders = sum(objects is None for _, objects in units)
    inputs = (
        f"  images: listed by the workers, {len(units):,} unit(s) ({folders:,} folders) under {root}, "
        f"layout {layout}; splits: "
        + ("from split folders" if split_folders or layout == "cifar" else
           "--splits, by path" if config.splits else DEFAULT_SPLIT)
        + "; shards are cut on the workers",
        f"  labels: {'--labels ' + config.labels if config.labels else 'labels.txt' if layout == 'cifar' else 'the class folders found, sorted'}",
    )
    return RunPlan(config, target, inputs=inputs, role_files=_role_files(config, root, layout),
                   dataset_output=dataset_output, units=settings)


def _gcs_path(pattern: str, name: str) -> str:
    """The ``gs://`` path of an object or folder name in the bucket of ``pattern``."""
    return "gs://" + pattern[len("gs://"):].split("/", 1)[0] + "/" + name


def plan_run(config: ConvertConfig, options: PipelineOptions | None = None,
             run_id: str | None = None) -> RunPlan:
    """Resolves and checks a conversion, reading what it must of the input once, and
    sorts the output folder into what this product wrote and what it did not
    (``plan.output_claims``; ``check_output`` refuses the run on what it did not).

    With ``skip_unchanged`` or ``incremental``, compares the input with the
    dataset at the output (see ``beam_pipeline.updates``): ``plan.update`` says
    what to do (a ``skip`` plan is not run).

    Raises:
      ConvertError: naming the flag or file to change.
    """
    plan = _plan_run(config, options, run_id)
    if _skipped_plan(plan) or (options is not None and options.view_as(TestOptions).dry_run):
        return plan  # Nothing to write (a dry run's check_output looks, if it is called).
    return dataclasses.replace(plan, output_claims=claim_output(plan.dataset_output or plan.config.output))


def _skipped_plan(plan: RunPlan) -> bool:
    return plan.update is not None and plan.update.action == "skip"


def _plan_run(config: ConvertConfig, options: PipelineOptions | None = None,
              run_id: str | None = None) -> RunPlan:
    """Resolves and checks a conversion, reading what it must of the input once.

    With ``skip_unchanged`` or ``incremental``, compares the input with the
    dataset at the output (see ``beam_pipeline.updates``): ``plan.update`` says
    what to do (a ``skip`` plan is not run).

    Raises:
      ConvertError: naming the flag or file to change.
    """
    options = options or PipelineOptions([])
    config = _fill_templates(config)
    refuse_local_paths_on_dataflow(config, options)
    given_layout = config.layout
    if not options.view_as(TestOptions).dry_run:  # A dry run builds the job only.
        _check_buckets(config)
    try:
        config = resolve_config(config, options)
    except ValueError as err:
        raise ConvertError(str(err)) from None
    if config.list_on_workers and config.layout == "table":
        raise ConvertError(f"--list_on_workers lists a gs:// folder or glob of images on the "
                           f"workers; {config.input} is read as a table (drop the flag)")
    drift_gate(config)  # A --compare_to that cannot be read fails now, not after the run.
    _, root, _ = resolve_input(config.input, config.layout)
    output_root = config.output.rstrip("/") + "/"
    if (root.rstrip("/") + "/").startswith(output_root):
        raise ConvertError(f"--input {config.input} is inside --output {config.output}")
    target = ShardTarget(config.output, config.compression, run_id or new_run_id())
    scheduled = config.skip_unchanged or config.incremental
    dataset = read_dataset(config.output) if scheduled else None
    dataset_output = config.output
    if not config.layout == "table":
        _check_images(config)
        if config.list_on_workers:
            config, target = _as_part(config, target, None)
            return _plan_on_workers(config, target, dataset_output)
        hand_over = not _in_process_direct_runner(options)
        vocabulary = ()
        if config.incremental and dataset is not None and not dataset.problem and not config.labels:
            vocabulary = tuple(dataset.manifest.get("labels", {}).get("vocabulary", []))
        identity = ListingIdentity.of(config, vocabulary)
        on_workers = contents_on_workers(config)
        try:
            listing = list_images(*identity, held=_held_images(config, dataset, root),
                                  contents_on_workers=on_workers)
        except ValueError as err:
            text = str(err)
            raise ConvertError(text if text.startswith(config.input) else
                               f"--input {config.input}: {text}") from None
        unknown = sorted({d.source.rsplit("/", 2)[-2] for d in listing.dead_letters
                          if d.error == "unknown_class" and "/" in d.source})
        if vocabulary and unknown:
            raise ConvertError(f"--incremental: classes not in the dataset appeared "
                               f"({', '.join(unknown[:5])}); the dataset's labels are numbered "
                               "by its classes, so a full run is needed (without --incremental, "
                               "with --overwrite)")
        roles = _role_files(config, root, listing.layout)
        columns, rows = _fingerprint_columns(listing)
        if columns is not None and not scheduled and config.fingerprint == "stat":
            # A plain run writes its inputs.jsonl from the listing's columns (take_output):
            # no entry object per file.
            config, target = _as_part(config, target, None)
            inputs = tuple(_describe_images(config, listing, on_workers))
            token = keep_listing(listing, identity)
            return RunPlan(config, target, inputs=inputs, listing=token, role_files=roles,
                           dataset_output=dataset_output, vocabulary=vocabulary,
                           input_table=columns, input_rows=rows, hand_over=hand_over,
                           contents_on_workers=on_workers)
        paths, names = [], []
        for ref in listing.refs:  # One pass: a large listing makes its objects as it goes.
            paths.append((ref.path, ref.size))
            names.append(ref.filename)
        entries = (table_entries(columns, rows) if columns is not None
                   else file_entries(root, paths, names))
        if config.fingerprint == "content":
            if columns is not None:  # Entries in path order, as the paths must be.
                entries.sort(key=lambda e: e.path)
                by_name = dict(zip(names, (path for path, _ in paths)))
                paths = [(by_name[e.path], e.size) for e in entries]
                names = [e.path for e in entries]
            entries = hash_entries(entries, [path for path, _ in paths])
        update = _decide(config, dataset, entries, roles,
                         dict(zip(names, (path for path, _ in paths))) if scheduled else {},
                         root, listing.vocabulary)
        del paths, names
        if update is not None and update.action == "part":
            features = image_feature_spec(dict(listing.extra_features)).to_json()
            if features != dataset.manifest.get("features"):
                raise ConvertError("--incremental: the features the images would have differ from "
                                   "the dataset's (a CSV manifest column added, removed or of "
                                   "another type); a full run is needed (without --incremental, "
                                   "with --overwrite)")
        only: tuple[str, ...] = ()
        if update is not None and update.action == "part":
            only = tuple(sorted(update.include))
            wanted = set(only)
            listing.refs = [ref for ref in listing.refs if ref.filename in wanted]
            # Inputs the dataset already refused while listing (a CSV manifest's row for
            # a missing file, a file of no class) are counted once, not again in every part.
            known = _listing_dead_letters(dataset)
            counted = [d for d in listing.dead_letters if (d.source, d.error) in known]
            if counted:
                listing.dead_letters = [d for d in listing.dead_letters
                                        if (d.source, d.error) not in known]
                update = dataclasses.replace(update, refused_before=len(counted))
        if update is not None and update.changes is not None:
            hashed = {e.path: e for e in update.changes.now}
            entries = [hashed.get(e.path, e) for e in entries]
        if only:
            entries = [e for e in entries if e.path in set(only)]
        config, target = _as_part(config, target, update)
        inputs = tuple(_update_lines(update) + _describe_images(config, listing, on_workers))
        token = None if update is not None and update.action == "skip" else keep_listing(
            listing, identity._replace(only=only))
        return RunPlan(config, target, inputs=inputs, listing=token, input_files=tuple(entries),
                       role_files=roles, update=update, dataset_output=dataset_output,
                       vocabulary=vocabulary, only=only, hand_over=hand_over,
                       contents_on_workers=on_workers)
    found = table_inputs(config.input)
    if given_layout == "table":
        why, hint = "--layout table", ""
    elif config.input.lower().endswith(_TYPED_SUFFIXES):
        why, hint = "Parquet or JSON Lines", ""
    elif not config.input.lower().endswith(_CSV_SUFFIXES):
        why, hint = "--schema", ""
    else:
        why = "a CSV without an image column"
        hint = " (or pass --image_column NAME to read the CSV as an image manifest)"
    _refuse(_given(config, _IMAGE_FLAGS + _MANIFEST_FLAGS), "images",
            f"{config.input} is a table ({why})", hint)
    typed = [path for path, _ in found if table_format(path) != "csv"]
    if typed:
        _refuse(_given(config, _CSV_DIALECT_FLAGS), "CSV tables",
                f"{config.input} holds Parquet or JSON Lines ({typed[0]})")
    try:
        header = table_header(config.dialect, found[0][0])
    except ValueError as err:
        raise ConvertError(f"--input {err}") from None
    if given_layout == "auto" and not config.schema and not typed:
        _refuse_image_paths(config, found[0][0], header)
    notes: list[str] = []
    schema = _table_schema(config, found[0][0], header, notes)
    dropped = _check_table_headers(config, schema, found, header)
    # Tables are few, large files that the run reads whole: their content hash is
    # always recorded (about 1 GB/s here), so a touched file is not a changed one.
    entries = hash_entries(file_entries(root, found), [path for path, _ in found])
    roles = _role_files(config, root)
    update = _decide(config, dataset, entries, roles, {relative_path(root, p): p for p, _ in found}, root)
    if update is not None and update.action == "part":
        wanted = set(update.include)
        found = tuple((path, size) for path, size in found if relative_path(root, path) in wanted)
        entries = [e for e in entries if e.path in wanted]
    config, target = _as_part(config, target, update)
    inputs = tuple(_update_lines(update) + _describe_table(config, found, header, schema, dropped, notes))
    return RunPlan(config, target, found, tuple(header), schema, dropped, inputs,
                   input_files=tuple(entries), role_files=roles, update=update,
                   dataset_output=dataset_output)


def _held_images(config: ConvertConfig, dataset, root: str) -> HeldImages | None:
    """For ``--drop_duplicates`` with ``--incremental``: what the dataset holds
    (``transforms.images.HeldImages``), so that the listing keeps it and drops new
    copies of it; ``None`` otherwise."""
    if not (config.incremental and config.drop_duplicates) or dataset is None or dataset.problem:
        return None
    here = dataset.files.get(root_identity(root), {})
    contents = {entry.sha256: entry.path for layer in dataset.files.values()
                for entry in layer.values() if entry.sha256}
    return HeldImages(frozenset(here), contents)


def _listing_dead_letters(dataset) -> set[tuple[str, str]]:
    """``(source, error)`` of the inputs a dataset (its first run and its parts)
    refused while listing (a source an earlier version wrote absolute is also
    known relative to the dataset's input root, as sources are written now)."""
    known: set[tuple[str, str]] = set()
    prefix = dataset.input_root.rstrip("/") + "/" if dataset.input_root.startswith("/") else None
    folders = [dataset.output] + [files.join(dataset.output, part["path"])
                                  for part in dataset.manifest.get("parts", [])]
    for folder in folders:
        text = files.read_text_if_exists(files.join(folder, DEAD_LETTER_DIR, "listing.jsonl")) or ""
        for line in text.split("\n"):
            if line.strip():
                try:
                    value = json.loads(line)
                    known.add((value["source"], value["error"]))
                    if prefix and value["source"].startswith(prefix):
                        known.add((value["source"][len(prefix):], value["error"]))
                except (ValueError, KeyError, TypeError):
                    continue  # Not ours to judge here: verify reports a damaged file.
    return known


def check_output(plan: RunPlan, claims: OutputClaims | None = None) -> None:
    """Refuses an output folder that holds files this product cannot prove it wrote
    where a run would replace them or read them as the dataset's, or a folder of its
    own that is a link (with or without ``overwrite``), and one that holds a
    finished dataset, unless overwriting (or adding a part to it); reads only.

    Args:
      plan: the run.
      claims: the output as found now (default: as the plan found it).

    Raises:
      OutputNotOursError: naming the files (the first few, and a count).
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
    """
    config = plan.config
    is_part = plan.update is not None and plan.update.action == "part"
    # A dataset there is named first (the usual case: pass --overwrite); what the output
    # holds besides, that this product cannot prove it wrote, refuses the run either way.
    if not is_part and files.exists(files.join(config.output, MANIFEST_NAME)) and not config.overwrite:
        why = f" ({plan.update.reason})" if plan.update is not None else ""
        raise OutputExistsError(
            f"--output {config.output} already holds a dataset ({MANIFEST_NAME}){why}; "
            "pass --overwrite to replace it, or choose another folder"
        )
    claims = claims or plan.output_claims or claim_output(plan.dataset_output or config.output)
    if claims.refusal():
        raise OutputNotOursError(claims.refusal())


def take_output(plan: RunPlan, job: DataflowJob | None = None, api: DataflowApi | None = None) -> None:
    """Takes the output folder for this run: its lock, then a clean slate.

    Refuses a finished dataset unless overwriting (the old manifest stays until
    the new one replaces it, see ``transforms.io.commit``), removes what killed
    runs left behind, and clears the last run's report and dead letters. ``job``
    and ``api``: see ``acquire_lock`` (a run on Dataflow; a lock naming a job).

    Raises:
      OutputExistsError: when ``manifest.json`` exists and ``overwrite`` is off.
      OutputBusy: when another run holds the output's lock.
    """
    config, target = plan.config, plan.target
    lock_output = plan.dataset_output or config.output
    is_part = plan.update is not None and plan.update.action == "part"
    check_output(plan)
    try:
        acquire_lock(lock_output, target.run_id, job, api)
    except OutputBusyError as err:
        raise OutputBusy(str(err)) from None
    except OSError as err:
        raise ConvertError(f"--output {lock_output}: cannot write there "
                           f"({err.strerror or err}); choose another folder") from None
    try:
        if plan.update is not None:
            now = manifest_digest(files.read_bytes_if_exists(files.join(lock_output, MANIFEST_NAME)))
            if now != plan.update.seen_manifest:
                raise OutputBusy(f"--output {lock_output}: another run changed the dataset while "
                                 "this one was planning; run again to compare with what it wrote")
        # Looked at again under the lock: only what this product can prove it wrote
        # is removed (the report and dead letters of the last run, what killed runs
        # left); anything else a run would touch refuses the run.
        claims = claim_output(lock_output)
        check_output(plan, claims)
        remove_stale_temporaries(lock_output, target.run_id)
        part = config.output[len(files.join(lock_output, "")):] + "/" if is_part else ""
        if part and claims.owns(part):
            # A part folder the root manifest does not list is what a killed run left.
            remove_folder(config.output)
        stale = [REPORT_NAME] + [name for name in claims.owned if name.startswith(DEAD_LETTER_DIR + "/")
                                 and not is_part]
        files.delete_files([files.join(lock_output, name) for name in stale if claims.owns(name)])
        if files.is_local(lock_output) and not is_part:
            try:  # Emptied: it goes too (a user's file in it keeps it).
                os.rmdir(files.join(lock_output, DEAD_LETTER_DIR))
            except OSError:
                pass
        prune_journal(lock_output)  # What it recorded of the files just removed.
        if part:  # Recorded before anything creates it, so that the next run may remove it.
            record_folder(lock_output, part)
        # Role files (labels, schema, CSV manifest) are published relative to the input root.
        _, root, _ = resolve_input(config.input, config.layout)
        roles = [published_entry(entry, root) for entry in plan.role_files]
        if plan.input_table is not None:
            # A listing's columns: streamed, in the bytes encode_inputs makes.
            write_inputs(files.join(target.temp_dir, INPUTS_NAME), roles,
                         plan.input_table, plan.input_rows)
        elif plan.input_files or roles:
            # The commit step completes the entries (content hashes it computed) and
            # publishes them beside the manifest.
            files.write_bytes(files.join(target.temp_dir, INPUTS_NAME),
                              encode_inputs((*roles, *plan.input_files)))
    except BaseException:
        release_lock(lock_output, target.run_id)
        raise


def drift_gate(config: ConvertConfig, output: str = "") -> DriftGate | None:
    """The drift gate of ``--compare_to``: the old dataset's feature spec and
    statistics, read now (small), and the thresholds; ``None`` without the flag.
    ``previous`` is the dataset at ``output`` (default ``config.output``; an
    incremental part passes the dataset's root).

    Raises:
      ConvertError: when the named manifest does not exist or is not a manifest
        (``previous`` without a manifest at ``--output`` is a gate that passes).
    """
    if config.compare_to is None:
        return None
    limits = dict(max_mean_shift=config.drift_max_mean_shift,
                  max_missing_change=config.drift_max_missing_change,
                  max_class_share_change=config.drift_max_class_share_change)
    output = output or config.output
    path = drift_manifest_path(config.compare_to, output)
    try:
        text = manifest_text(path)
        if text is None and config.compare_to == PREVIOUS:
            return DriftGate(config.compare_to, note=f"no dataset at {output} yet: nothing "
                             "to compare with (--compare_to previous passes)", **limits)
        if text is None:
            raise ValueError(f"{path} does not exist")
        manifest = parse_manifest(text, path)
    except (OSError, ValueError) as err:
        raise ConvertError(f"--compare_to {config.compare_to}: {err} (give a manifest.json, a "
                           "dataset folder holding one, or 'previous')") from None
    return DriftGate(config.compare_to, path, baseline_of(manifest), **limits)
