"""Preflight: resolve the input once, check flags and paths, and take the output.

Everything that can be known before a pipeline runs is decided here, once: the
options with local paths made absolute, the kind of input (images or a table),
a table's files, header and schema, whether the output may be written. The
pipeline is then built from the result (``RunPlan``), and no step re-reads a
header or re-resolves an option.

This module is the entry: ``plan_run`` checks what every run needs and the flags
given for the input's kind, then hands the input to the planner of its kind
(``beam_pipeline.planners``); the checks that read an input are in
``beam_pipeline.input_checks``, the plan's lines for people in
``beam_pipeline.plan_lines``, the plan and its errors in ``beam_pipeline.run_plan``,
and taking the output folder in ``beam_pipeline.output_claim``.
"""

from __future__ import annotations

import codecs
import dataclasses
import datetime
import os
import re

from apache_beam.io.filesystem import BeamIOError
from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from beam_tfrecords.annotated_plan import annotated_config, refuse_annotation_flags
from beam_tfrecords.input_checks import (
    check_manifest_rows,
    infer_table_schema,
    is_folder,
    printable_root,
    row_resolver,
    sample_rows,
    table_inputs,
)
from beam_tfrecords.output_claim import check_output, take_output
from beam_tfrecords.planners import plan_images, plan_on_workers, plan_table
from beam_tfrecords.run_plan import ConvertError, OutputBusy, OutputExistsError, OutputNotOursError, RunPlan
from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS
from beam_tfrecords.schemas.config import ConvertConfig, CsvDialect, expand_templates
from beam_tfrecords.schemas.manifest import parse_manifest
from beam_tfrecords.schemas.options import CSV_MANIFEST, CSV_TABLE, IMAGES, TABLES, flags_only_for
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.transforms.image_steps import read_labels_text
from beam_tfrecords.transforms.io import files, gcs
from beam_tfrecords.transforms.io.commit import new_run_id
from beam_tfrecords.transforms.io.ownership import claim_output
from beam_tfrecords.transforms.io.table_readers import JSONL_SUFFIXES, PARQUET_SUFFIXES, table_format
from beam_tfrecords.transforms.plan.label_map_file import is_label_map_pbtxt, parse_label_map_pbtxt
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    find_image_column,
    manifest_columns,
    parse_labels_text,
    resolve_input,
    rows_outside,
)
from beam_tfrecords.transforms.quality.drift import (
    PREVIOUS,
    DriftGate,
    baseline_of,
    drift_manifest_path,
)
from beam_tfrecords.transforms.tables import csv_header
from beam_tfrecords.updates import read_dataset
from beam_tfrecords.verify import manifest_text

__all__ = [
    "ConvertError",
    "OutputBusy",
    "OutputExistsError",
    "OutputNotOursError",
    "RunPlan",
    "check_output",
    "drift_gate",
    "in_process_direct_runner",
    "plan_run",
    "refuse_local_paths_on_dataflow",
    "resolve_config",
    "runs_on_dataflow",
    "infer_table_schema",
    "sample_rows",
    "table_inputs",
    "take_output",
]
_CSV_SUFFIXES = (".csv", ".tsv")
# Always tables (never image manifests).
_TYPED_SUFFIXES = PARQUET_SUFFIXES + JSONL_SUFFIXES
_GLOB = re.compile(r"[*?\[]")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ConvertConfig)
             if f.default is not dataclasses.MISSING}
# Flags that apply only to some inputs, as (flag, ConvertConfig field), read off
# their declarations (schemas.options): tables, CSV tables, CSV image manifests, and
# images (folders and manifests alike).
_TABLE_FLAGS = flags_only_for(TABLES)
_CSV_DIALECT_FLAGS = flags_only_for({CSV_TABLE})
_MANIFEST_FLAGS = flags_only_for({CSV_MANIFEST})
_IMAGE_FLAGS = tuple(f for f in flags_only_for(IMAGES) if f not in _MANIFEST_FLAGS)



def _absolute(path: str | None) -> str | None:
    if path is None or not files.is_local(path):
        return path
    return os.path.abspath(path)


def in_process_direct_runner(options: PipelineOptions) -> bool:
    """Whether ``options`` run the steps in this process (the DirectRunner, in memory
    or on threads)."""
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
    local = [f"{flag} {value}" for flag, value in (("--input", config.input), ("--output", config.output),
                                                  ("--masks", config.masks))  # The workers read masks.
             if value and files.is_local(value)]
    local += [f"--allowed_roots {root}" for root in config.allowed_roots if files.is_local(root)]
    if not local and config.allow_paths_outside and config.input.lower().endswith(".csv"):
        try:
            outside = rows_outside(config.input, files.read_text(config.input), config.image_column,
                                   config.label_column, (), row_resolver())
        except (OSError, BeamIOError, ValueError):
            outside = {}  # Not a readable image manifest: the checks after this one say why.
        local = [f"--input {config.input} (its rows name images under {printable_root(root)})"
                 for root in outside if files.is_local(root)][:1]
    if local:
        raise ConvertError(f"{', '.join(local)}: Dataflow's workers cannot see this machine's disk; "
                           "use gs:// paths (copy local files to a bucket first, e.g. gcloud "
                           "storage cp -r DIR gs://BUCKET/DIR)")


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
    return bool(config.schema) and not is_folder(config.input)


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


def resolve_config(config: ConvertConfig, options: PipelineOptions) -> ConvertConfig:
    """The config as workers need it: local paths absolute (so every process reads
    the same files), ``encode_processes=-1`` replaced by a count for this runner,
    the layout of a table set to ``table``, and a ``.tsv`` read with tabs."""
    processes = config.encode_processes
    if processes < 0:
        processes = (os.cpu_count() or 1) if in_process_direct_runner(options) else 0
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
            text = read_labels_text(config.labels)
            if not is_label_map_pbtxt(text):
                parse_labels_text(text)
            elif config.layout in ANNOTATION_LAYOUTS:
                parse_label_map_pbtxt(text)  # An Object Detection API label map: its ids.
            else:
                raise ValueError("an Object Detection API label map numbers the classes of annotated "
                                 "images only; give a labels file with one class name per line")
        except ValueError as err:
            raise ConvertError(f"--labels {config.labels}: {err}") from None
    if layout == "csv":
        try:
            manifest_columns(csv_header(CsvDialect(), config.input),
                             config.image_column, config.label_column)
        except ValueError as err:
            raise ConvertError(f"--input {config.input}: {err}") from None
        check_manifest_rows(config)
    elif layout == "cifar":
        labels_file = files.join(root, CIFAR_LABELS_FILE)
        if not config.labels and not files.exists(labels_file):
            raise ConvertError(f"--layout cifar: {labels_file} does not exist; it names the "
                               "classes, one per line (or pass --labels FILE)")


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
    """Resolves and checks a conversion, reading what it must of the input once: what
    every run needs (``_checked_config``), the flags given for the input's kind, then
    the planner of its kind (``beam_pipeline.planners``): a table, images listed on
    the workers, or images listed here.

    With ``skip_unchanged`` or ``incremental``, compares the input with the
    dataset at the output (see ``beam_pipeline.updates``): ``plan.update`` says
    what to do (a ``skip`` plan is not run).

    Raises:
      ConvertError: naming the flag or file to change.
    """
    options = options or PipelineOptions([])
    given_layout = config.layout
    refuse_annotation_flags(config)  # Before any bucket is asked.
    config = annotated_config(_checked_config(config, options))  # An annotated layout decided.
    _, root, _ = resolve_input(config.input, config.layout)
    target = ShardTarget(config.output, config.compression, run_id or new_run_id())
    scheduled = config.skip_unchanged or config.incremental
    dataset = read_dataset(config.output) if scheduled else None
    if config.layout == "table":
        found = table_inputs(config.input)
        _check_table_flags(config, given_layout, found)
        return plan_table(config, target, found, given_layout, dataset, root)
    _check_images(config)
    if config.list_on_workers:
        return plan_on_workers(config, target, config.output)
    return plan_images(config, target, dataset, root, hand_over=not in_process_direct_runner(options))


def _checked_config(config: ConvertConfig, options: PipelineOptions) -> ConvertConfig:
    """The config with its templates filled and resolved (``resolve_config``), once
    what refuses any run is checked: local paths on Dataflow, buckets that do not
    answer, ``--list_on_workers`` over a table, a ``--compare_to`` that cannot be
    read, an input inside the output.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    config = _fill_templates(config)
    refuse_local_paths_on_dataflow(config, options)
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
    return config


def _check_table_flags(config: ConvertConfig, given_layout: str, found) -> None:
    """Refuses the flags that apply only to images given with a table, and the CSV
    dialect's flags given with Parquet or JSON Lines files (``found``: the table's)."""
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
