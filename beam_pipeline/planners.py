"""The per-kind planners: what the preflight decides for each kind of input.

``beam_pipeline.preflight`` checks what every run needs and the flags given, then
hands the input to the planner of its kind:

- ``plan_images``: class folders, CIFAR or a CSV image manifest, listed here (the
  listing is kept for the listing step); with ``--skip_unchanged`` or
  ``--incremental``, what changed since the dataset was made.
- ``plan_on_workers``: a gs:// folder or glob of images listed on the workers
  (``--list_on_workers``); the launcher lists folders only.
- ``plan_table``: CSV, Parquet or JSON Lines files (with ``--sequence_key``,
  sequences): header, schema, every file's columns, and what changed.

Each returns the ``RunPlan`` the pipeline is built from.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
from apache_beam.io.filesystem import BeamIOError, FileSystem

from beam_tfrecords.input_checks import check_table_headers, refuse_image_paths, table_schema
from beam_tfrecords.plan_lines import describe_images, describe_table, update_lines
from beam_tfrecords.run_plan import ConvertError, RunPlan
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.features import (
    FEATURE_NAME_PRESETS,
    IMAGE_FEATURE_SPEC,
    FeatureSpec,
    image_feature_spec,
    parse_feature_names,
    renamed_spec,
)
from beam_tfrecords.schemas.inputs import InputFile
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms import worker_listing
from beam_tfrecords.transforms.annotated_inputs import AnnotatedRefused, refuse_empty_listing
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.image_steps import HeldImages, ListingIdentity, keep_listing, list_images
from beam_tfrecords.transforms.io import files, gcs
from beam_tfrecords.transforms.io.annotated_output import annotated_feature_spec
from beam_tfrecords.transforms.io.fingerprint import (
    file_entries,
    hash_entries,
    relative_path,
    role_entry,
    root_identity,
    table_entries,
)
from beam_tfrecords.transforms.io.table_readers import table_format
from beam_tfrecords.transforms.plan.annotated_listing import annotation_parts
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    DEFAULT_SPLIT,
    Listing,
    folders_are_splits,
    parse_labels_text,
    resolve_input,
)
from beam_tfrecords.transforms.plan.names import check_names
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.transforms.tables import table_header
from beam_tfrecords.transforms.worker_listing import UnitsToList
from beam_tfrecords.updates import Update, UpdateRefused, decide

__all__ = ["WORKER_LISTING_UNITS", "contents_on_workers", "plan_images", "plan_on_workers", "plan_table"]


def plan_images(config: ConvertConfig, target: ShardTarget, dataset, root: str,
                hand_over: bool) -> RunPlan:
    """The plan of images listed here, on the launcher (class folders, CIFAR, a CSV
    image manifest): the listing, kept for the listing step (``hand_over``: written
    for it to another process), and with ``--skip_unchanged`` or ``--incremental``,
    what changed since the ``dataset`` at the output was made.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    dataset_output = config.output
    scheduled = config.skip_unchanged or config.incremental
    vocabulary = ()
    if config.incremental and dataset is not None and not dataset.problem and not config.labels:
        vocabulary = tuple(dataset.manifest.get("labels", {}).get("vocabulary", []))
    identity = ListingIdentity.of(config, vocabulary)
    on_workers = contents_on_workers(config)
    try:
        listing = list_images(*identity, held=_held_images(config, dataset, root),
                              contents_on_workers=on_workers)
        refuse_empty_listing(config.input, listing, config.drop_empty)
    except AnnotatedRefused as err:  # The whole line (the flag or path to change).
        raise ConvertError(str(err)) from None
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
    names = _feature_names(config, _listed_features(listing), "these images' records")
    roles = _role_files(config, root, listing.layout)
    columns, rows = _fingerprint_columns(listing)
    if columns is not None and not scheduled and config.fingerprint == "stat":
        # A plain run writes its inputs.jsonl from the listing's columns (take_output):
        # no entry object per file.
        config, target = _as_part(config, target, None)
        inputs = tuple(describe_images(config, listing, on_workers)) + names
        token = keep_listing(listing, identity)
        return RunPlan(config, target, inputs=inputs, listing=token, role_files=roles,
                       dataset_output=dataset_output, vocabulary=vocabulary,
                       input_table=columns, input_rows=rows, hand_over=hand_over,
                       contents_on_workers=on_workers)
    compared = _compare_images(config, dataset, listing, (columns, rows), roles, root)
    update, only, entries = compared.update, compared.only, compared.entries
    config, target = _as_part(config, target, update)
    inputs = tuple(update_lines(update) + describe_images(config, listing, on_workers)) + names
    token = None if update is not None and update.action == "skip" else keep_listing(
        listing, identity._replace(only=only))
    return RunPlan(config, target, inputs=inputs, listing=token, input_files=tuple(entries),
                   role_files=roles, update=update, dataset_output=dataset_output,
                   vocabulary=vocabulary, only=only, hand_over=hand_over,
                   contents_on_workers=on_workers,
                   annotated=listing.annotated.run if listing.annotated is not None else None)


@dataclasses.dataclass(frozen=True)
class _Compared:
    """What a scheduled run decided for images: ``update`` (``None`` for a plain run),
    the files a part converts (``only``) and the fingerprint entries it records."""

    update: Update | None
    only: tuple[str, ...]
    entries: list


def _compare_images(config: ConvertConfig, dataset, listing: Listing, listed, roles,
                    root: str) -> _Compared:
    """The fingerprint entries of a listing's images, and with ``--skip_unchanged`` or
    ``--incremental``, what changed since the ``dataset`` was made (an incremental
    part's listing keeps only the images it converts, and the refusals the dataset
    already counted are not counted again). ``listed``: the listing's columns and
    rows (``_fingerprint_columns``).

    Raises:
      ConvertError: when a part's images would have other features than the dataset's.
    """
    scheduled = config.skip_unchanged or config.incremental
    columns, rows = listed
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
        features = renamed_spec(image_feature_spec(dict(listing.extra_features)),
                                parse_feature_names(config.feature_names).renames).to_json()
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
    return _Compared(update, only, entries)


def plan_table(config: ConvertConfig, target: ShardTarget, found: tuple[tuple[str, int], ...],
               given_layout: str, dataset, root: str) -> RunPlan:
    """The plan of a table (CSV, Parquet or JSON Lines files ``found``, whose flags the
    preflight checked; with ``--sequence_key``, sequences): its header and schema, every
    file's columns, and with ``--skip_unchanged`` or ``--incremental``, which files
    changed since the ``dataset`` at the output was made.

    Raises:
      ConvertError: naming the flag or file to change.
    """
    dataset_output = config.output
    typed = [path for path, _ in found if table_format(path) != "csv"]
    try:
        header = table_header(config.dialect, found[0][0])
    except ValueError as err:
        raise ConvertError(f"--input {err}") from None
    if given_layout == "auto" and not config.schema and not typed:
        refuse_image_paths(config, found[0][0], header)
    notes: list[str] = []
    schema = table_schema(config, found[0][0], header, notes)
    dropped = check_table_headers(config, schema, found, header)
    schema, names = _renamed_schema(config, schema)
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
    inputs = tuple(update_lines(update) + describe_table(config, found, header, schema, dropped, notes)) + names
    return RunPlan(config, target, found, tuple(header), schema, dropped, inputs,
                   input_files=tuple(entries), role_files=roles, update=update,
                   dataset_output=dataset_output)


# --list_on_workers: the launcher finds folders until there are this many units
# (down to 3 levels), so that a few hundred workers' threads all have some.
WORKER_LISTING_UNITS = 256


def plan_on_workers(config: ConvertConfig, target: ShardTarget, dataset_output: str) -> RunPlan:
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
    inputs += _feature_names(config, IMAGE_FEATURE_SPEC, "these images' records")
    return RunPlan(config, target, inputs=inputs, role_files=_role_files(config, root, layout),
                   dataset_output=dataset_output, units=settings)


def _listed_features(listing: Listing) -> FeatureSpec:
    """The features (canonical names) the records of a listing's images hold."""
    if listing.annotated is not None:
        return annotated_feature_spec(listing.annotated.run, dict(listing.extra_features))
    return image_feature_spec(dict(listing.extra_features))


def _feature_names(config: ConvertConfig, spec: FeatureSpec, what: str,
                   shaped: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``--feature_names`` checked against the records' features ``spec`` (and the
    features of ``shaped`` whose ``<name>/shape`` follows their name): the plan's
    line saying the renames (none without the flag).

    Raises:
      ConvertError: naming the rename to change (a feature the records do not hold,
        one a preset needs or needs of another dtype or shape, an output name a
        feature has already).
    """
    names = parse_feature_names(config.feature_names)
    if not names.renames:
        return ()
    try:
        names.check_spec(spec, what, shaped)
    except ValueError as err:
        raise ConvertError(str(err)) from None
    preset = f"preset {names.preset}" + (", and pairs" if len(names.renames) > len(
        FEATURE_NAME_PRESETS[names.preset]) else "") if names.preset else "pairs"
    renames = ", ".join(f"{canonical} -> {output}" for canonical, output in names.renames.items())
    return (f"  feature names (--feature_names, {preset}): {renames}; the manifest's features and "
            "statistics use the new names",)


def _renamed_schema(config: ConvertConfig, schema: TableSchema) -> tuple[TableSchema, tuple[str, ...]]:
    """A table's schema with ``--feature_names`` applied (each renamed column's
    ``feature``), and the plan's line saying so.

    Raises:
      ConvertError: naming the rename to change.
    """
    entries, shaped = {}, []
    for column in schema.kept:  # As the records hold them (transforms.tables).
        entries[column.feature_name] = (column.dtype, column.feature_shape())
        if column.shape is not None and column.encoding == "flat":
            entries[f"{column.feature_name}/shape"] = ("int64", [len(column.shape)])
            shaped.append(column.feature_name)
    lines = _feature_names(config, FeatureSpec(entries), "the table's records", tuple(shaped))
    if not lines:
        return schema, ()
    renames = parse_feature_names(config.feature_names).renames
    columns = tuple(dataclasses.replace(c, feature=renames[c.feature_name])
                    if not c.skip and c.feature_name in renames else c for c in schema.columns)
    try:
        return TableSchema(columns), lines
    except ValueError as err:
        raise ConvertError(f"--feature_names: {err}") from None


def _gcs_path(pattern: str, name: str) -> str:
    """The ``gs://`` path of an object or folder name in the bucket of ``pattern``."""
    return "gs://" + pattern[len("gs://"):].split("/", 1)[0] + "/" + name


def contents_on_workers(config: ConvertConfig) -> bool:
    """Whether ``--drop_duplicates`` and ``--split_by content`` hash the images on the
    workers (``transforms.image_contents``): always, but for ``--drop_duplicates``
    with ``--skip_unchanged`` or ``--incremental``, where what changed is decided
    on the launcher from the files left once copies are dropped (the launcher
    hashes the images then, as before)."""
    hashing = config.drop_duplicates or bool(config.splits and config.split_by == "content")
    scheduled = config.skip_unchanged or config.incremental
    return hashing and not (config.drop_duplicates and scheduled)


def _held_images(config: ConvertConfig, dataset, root: str) -> HeldImages | None:
    """For ``--drop_duplicates`` with ``--incremental``: what the dataset holds
    (``transforms.image_steps.HeldImages``), so that the listing keeps it and drops new
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
    if "csv" in (config.layout, layout) or config.layout in ("box_csv", "multi_label"):
        roles.append((config.input, "manifest_csv"))
    if config.layout == "coco" and config.annotations:
        roles.extend((path, f"annotations_{split}" if split else "annotations")
                     for split, path in annotation_parts(config.annotations))
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
