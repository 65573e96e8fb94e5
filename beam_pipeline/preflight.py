"""Preflight: resolve the input once, check flags and paths, and take the output.

Everything that can be known before a pipeline runs is decided here, once: the
options with local paths made absolute, the kind of input (images or a table),
a table's files, header and schema, whether the output may be written. The
pipeline is then built from the result (``RunPlan``), and no step re-reads a
header or re-resolves an option.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import itertools
import os
import re

from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

from beam_tfrecords.schemas.config import ConvertConfig, CsvDialect
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
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    IMAGE_COLUMNS,
    SPLIT_NAMES,
    detect_layout,
    find_image_column,
    folders_are_splits,
    image_path_column,
    manifest_columns,
    parse_labels_text,
    resolve_input,
    top_level_folders,
)
from beam_tfrecords.transforms.plan.table_inference import infer_schema
from beam_tfrecords.transforms.tables import csv_header, table_files

__all__ = [
    "ConvertError",
    "OutputExistsError",
    "RunPlan",
    "plan_run",
    "resolve_config",
    "sample_rows",
    "table_inputs",
    "take_output",
]

_INFER_SAMPLE_ROWS = 10_000
# Rows read to tell whether a CSV without an image column names images anyway.
_PATH_SAMPLE_ROWS = 20
_CSV_SUFFIXES = (".csv", ".tsv")
_GLOB = re.compile(r"[*?\[]")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ConvertConfig)
             if f.default is not dataclasses.MISSING}
# Flags that only tables use, and flags that only images use: (flag, ConvertConfig field).
_TABLE_FLAGS = (
    ("--schema", "schema"), ("--split_column", "split_column"), ("--splits", "splits"),
    ("--key_column", "key_column"), ("--sequence_key", "sequence_key"),
    ("--sequence_order", "sequence_order"), ("--no_header", "no_header"), ("--columns", "columns"),
    ("--csv_delimiter", "csv_delimiter"), ("--csv_quote", "csv_quote"), ("--encoding", "encoding"),
    ("--no_quoted_newlines", "quoted_newlines"),
)
_IMAGE_FLAGS = (("--labels", "labels"), ("--validate", "validate"), ("--max_pixels", "max_pixels"),
                ("--read_threads", "read_threads"))
_MANIFEST_FLAGS = (("--image_column", "image_column"), ("--label_column", "label_column"))


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
    ``--label_column``, it is an image manifest), or any other file or glob
    given a ``--schema`` (a folder stays a folder of images)."""
    if config.layout == "table":
        return True
    if config.layout != "auto":
        return False
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
    """The CSV files of a table's ``--input`` (a file or a glob), sorted, with sizes.

    Raises:
      ConvertError: for a folder, or when nothing matches.
    """
    if _is_folder(path):
        raise ConvertError(f"--input must be a CSV file or glob (e.g. '{path.rstrip('/')}/*.csv'), "
                           f"not a folder: {path}")
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
                limit: int) -> list[list[str]]:
    """Up to ``limit`` rows of a CSV file that have as many cells as ``header``."""
    csv.field_size_limit(max(csv.field_size_limit(), 1 << 30))  # The converter has no cap either.
    with files.open_read(path) as stream:
        # Bytes that do not decode cost their row when converting; here they must not
        # stop the sample.
        text = io.TextIOWrapper(stream, encoding=config.encoding, errors="replace", newline="")
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
            parse_labels_text(files.read_text(config.labels))
        except ValueError as err:
            raise ConvertError(f"--labels {config.labels}: {err}") from None
    if layout == "csv":
        try:
            manifest_columns(csv_header(CsvDialect(), config.input),
                             config.image_column, config.label_column)
        except ValueError as err:
            raise ConvertError(f"--input {config.input}: {err}") from None
    elif layout == "cifar":
        labels_file = files.join(root, CIFAR_LABELS_FILE)
        if not config.labels and not files.exists(labels_file):
            raise ConvertError(f"--layout cifar: {labels_file} does not exist; it names the "
                               "classes, one per line (or pass --labels FILE)")
    else:
        # The listing's own rule, on the whole listing: ROOT/<split>/<class>/ when every
        # top-level folder is a split name, ROOT/<class>/ when none is, else refused.
        # A local root whose folders are all split names, or none, needs no listing here:
        # the folders holding images are a subset of them (the run lists once, later).
        if files.is_local(root) and pattern == files.join(root, "**") and os.path.isdir(root):
            with os.scandir(root) as entries:
                names = {e.name for e in entries if e.is_dir(follow_symlinks=True)}
            if names <= SPLIT_NAMES or not names & SPLIT_NAMES:
                return
        paths = [path for path, _ in files.list_files(pattern)]
        if layout == "auto" and detect_layout(root, paths) == "cifar":
            return
        try:
            folders_are_splits(root, top_level_folders(root, paths))
        except ValueError as err:
            raise ConvertError(f"--input {config.input}: {err}") from None


def _refuse_image_paths(config: ConvertConfig, first: str, header: list[str]) -> None:
    """Refuses a CSV detected as a table whose column holds image paths."""
    found = image_path_column(header, sample_rows(config, first, header, _PATH_SAMPLE_ROWS))
    if found:
        column, cell = found
        raise ConvertError(
            f"--input {config.input}: column {column!r} holds image paths (e.g. {cell!r}) but no "
            f"column is named {', '.join(IMAGE_COLUMNS)}, so the CSV would be read as a table of "
            f"strings; pass --image_column {column} to convert the images it names, or "
            "--layout table to keep it a table")


def plan_run(config: ConvertConfig, options: PipelineOptions | None = None,
             run_id: str | None = None) -> RunPlan:
    """Resolves and checks a conversion, reading what it must of the input once.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    options = options or PipelineOptions([])
    given_layout = config.layout
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
    found = table_inputs(config.input)
    if given_layout == "table":
        why, hint = "--layout table", ""
    elif not config.input.lower().endswith(_CSV_SUFFIXES):
        why, hint = "--schema", ""
    else:
        why = "a CSV without an image column"
        hint = " (or pass --image_column NAME to read the CSV as an image manifest)"
    _refuse(_given(config, _IMAGE_FLAGS + _MANIFEST_FLAGS), "images",
            f"{config.input} is a table ({why})", hint)
    try:
        header = csv_header(config.dialect, found[0][0])
    except ValueError as err:
        raise ConvertError(f"--input {err}") from None
    if given_layout == "auto" and not config.schema:
        _refuse_image_paths(config, found[0][0], header)
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
