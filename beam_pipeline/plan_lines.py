"""The plan's lines for people: what a run will do, decided before it runs.

``describe_images`` and ``describe_table`` say the input's kind and layout, its
splits, classes or columns, features, and what is left out and why;
``update_lines`` what a scheduled run decided. They read what the planners found
(``beam_pipeline.planners``) and read no file.
"""

from __future__ import annotations

import os
from collections import Counter

from beam_tfrecords.input_checks import INFER_SAMPLE_ROWS
from beam_tfrecords.schemas.annotations import PROBLEM_REASONS
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.features import IMAGE_FEATURE_SPEC, output_feature_name, parse_feature_names
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.io.table_readers import table_format
from beam_tfrecords.transforms.plan.annotated_listing import PASSED_OVER_REASONS
from beam_tfrecords.transforms.plan.layouts import DEFAULT_SPLIT, SPLIT_NAMES, Listing
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.updates import Update

__all__ = ["describe_annotated", "describe_images", "describe_table", "update_lines"]

_SHOWN = 8


def _counts(counter: Counter, order=None) -> str:
    names = list(order) if order is not None else sorted(counter)
    shown = ", ".join(f"{name} ({counter[name]:,})" for name in names[:_SHOWN])
    return shown + (f", ... and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def describe_images(config: ConvertConfig, listing: Listing, on_workers: bool = False) -> list[str]:
    """The plan of an image input, from its listing (``on_workers``: before its images
    are hashed on the workers, so splits by content and copies are not known yet)."""
    refs = listing.refs
    layout = {"class_folders": "class folders", "cifar": "CIFAR (<split>/<id>_<class>.<ext>)",
              "csv": "CSV image manifest"}.get(listing.layout, _LAYOUT_NAMES.get(listing.layout, listing.layout))
    table = isinstance(refs, RefTable)  # A large listing, as columns: counted without objects.
    splits = Counter(refs.split_counts() if table else (ref.split for ref in refs))
    shown = _counts(splits) or "none"
    if on_workers and config.splits and config.split_by == "content":
        shown = (", ".join(f"{name} {share:g}" for name, share in config.splits)
                 + " of the images; each picked from its bytes as the workers hash it, so the counts "
                 "are known at the end")
    lines = [f"  images: {len(refs):,} in layout {layout}; splits: {shown}"
             + (f" (from {listing.split_source})" if listing.split_source else "")]
    if listing.annotated is not None:
        return lines + describe_annotated(listing.annotated, config) + _left_out(config, listing, on_workers)
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
    renames = parse_feature_names(config.feature_names).renames  # The names the records carry.
    features = sorted(output_feature_name(renames, name) for name, _, _ in IMAGE_FEATURE_SPEC.entries())
    features += [output_feature_name(renames, name) for name in listing.extra_features]
    lines.append(f"  features: {', '.join(features)}")
    lines.extend(_left_out(config, listing, on_workers))
    name = os.path.basename(config.input.rstrip("/"))
    if listing.layout == "class_folders" and name in SPLIT_NAMES and set(splits) == {DEFAULT_SPLIT}:
        lines.append(f"  note: --input is a folder named {name!r}, but its images go to split "
                     f"{DEFAULT_SPLIT!r} (splits are folders under --input; point --input at its "
                     "parent to keep the name)")
    if len(order) == 1 and listing.layout != "csv":
        lines.append(f"  note: one class only ({order[0]!r}); is --input one folder too deep?")
    return lines


def _left_out(config: ConvertConfig, listing: Listing, on_workers: bool) -> list[str]:
    """The plan's line of what an image listing leaves out and why (none: no line)."""
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
    skipped = Counter(d.error for d in listing.skipped  # Not the objects left out of an annotated input.
                      if listing.annotated is None or d.error not in PROBLEM_REASONS)
    if skipped:
        left.append(f"{sum(skipped.values()):,} paths passed over ({_counts(skipped)})")
    return [f"  left out: {'; '.join(left)}"] if left else []


_LAYOUT_NAMES = {"box_csv": "box CSV", "multi_label": "several labels per image (CSV)", "coco": "COCO",
                 "voc": "Pascal VOC", "yolo": "YOLO", "masks": "semantic masks"}


def describe_annotated(summary, config: ConvertConfig) -> list[str]:
    """The plan's lines of an annotated listing (``summary``: its
    ``plan.annotated_listing.AnnotatedSummary``; ``None``: no lines): the label map,
    objects per class, images without objects, problems by reason, and notes."""
    if summary is None:
        return []
    run = summary.run
    lines = [f"  annotations: {_LAYOUT_NAMES.get(run.layout, run.layout)}; label map: "
             f"{len(run.label_map.items):,} class{'es' if len(run.label_map.items) != 1 else ''} "
             + ("(from --labels: line i is mask value i)" if run.layout == "masks" and config.labels else
                "(none: pass --labels to name the mask values)" if run.layout == "masks" else
                "(ids as the categories give them)" if run.layout == "coco" else
                f"(ids from 1, in the order of --labels {config.labels})" if config.labels else
                "(ids from 1)")]
    per_class = Counter(dict(summary.objects_per_class))
    what = "labels" if run.layout == "multi_label" else "objects"
    if run.layout != "masks":
        lines.append(f"  {what} per class: {sum(per_class.values()):,} in all: "
                     f"{_counts(per_class, [name for name, _ in summary.objects_per_class]) or 'none'}")
    empty = (f"{run.dropped_empty:,} left out (--drop_empty)" if config.drop_empty
             else f"{run.images_without_objects:,} kept as negative examples")
    if run.layout != "masks":
        lines.append(f"  images without {what}: {empty}")
    passed = dict(run.problems).get("mask_not_found", 0)
    if passed:  # Passed over, not refused (plan.annotated_listing.PASSED_OVER_REASONS).
        lines.append(f"  left out: {passed:,} image{'s' if passed != 1 else ''} without a mask under "
                     "--masks, not converted (named in dead_letter/skipped.jsonl; not bad inputs)")
    problems = [(reason, n) for reason, n in run.problems if reason not in PASSED_OVER_REASONS]
    if problems:
        lines.append(f"  annotation problems: {sum(n for _, n in problems):,} ("
                     + ", ".join(f"{reason} ({n:,})" for reason, n in problems) + "); images "
                     "refused are dead-lettered, objects left out are listed in dead_letter/skipped.jsonl")
    lines.extend(_exif_lines(summary.exif, run.layout))
    if summary.unnamed:
        lines.append(f"  note: {summary.unnamed:,} image file(s) under --input that the annotations do "
                     "not name: not converted")
    lines += [f"  note: {note}" for note in summary.notes]
    if summary.normalized_boxes:
        lines.append("  note: every box value is <= 1 and pixels were assumed: say --box_units "
                     "normalized if they are normalized")
    return lines


_STATE_SIZE = {"box_csv": "state their displayed size in width,height columns (they are then stored turned)",
               "voc": "state their displayed <size> in the XML (they are then stored turned)",
               "coco": "state their displayed width and height (they are then stored turned)"}


def _exif_lines(note, layout: str) -> list[str]:
    """The plan's note of images whose annotations state no size and whose EXIF
    orientation is not 1 (``plan.annotated_listing.ExifNote``; ``None``: no line)."""
    if note is None:
        return []
    if note.on_workers:
        return ["  note: the EXIF orientation of images whose annotations state no size is not read on "
                "the launcher for gs:// inputs: the workers count those other than 1, stored as in the file "
                "with their boxes as given (the manifest's annotations.problems.exif_orientation_not_applied; "
                "the summary prints it)"]
    more = note.images - len(note.names)
    hint = _STATE_SIZE.get(layout, "store the pictures turned as displayed before converting (e.g. "
                                   "Pillow's ImageOps.exif_transpose)")
    return [f"  note: {note.images:,} image{'s have' if note.images != 1 else ' has'} an EXIF orientation "
            f"other than 1 and no stated size: stored as in the file, boxes as given (TensorFlow ignores "
            f"EXIF orientation); if the boxes were drawn on the displayed pictures, {hint}: "
            + ", ".join(note.names) + (f" (+{more:,} more)" if more else "")]


def describe_table(config: ConvertConfig, found, header: list[str], schema: TableSchema,
                    dropped: tuple[str, ...], notes: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The plan of a table input."""
    size = sum(s for _, s in found)
    kinds = Counter({"csv": "CSV", "parquet": "Parquet", "jsonl": "JSON Lines"}[table_format(path)]
                    for path, _ in found)
    lines = [f"  table: {len(found):,} {'/'.join(sorted(kinds))} file{'s' if len(found) > 1 else ''}, "
             f"{size / 1e6:,.1f} MB; {len(header)} columns"]
    source = f"--schema {config.schema}" if config.schema else (
        f"inferred from the first {INFER_SAMPLE_ROWS:,} rows of {found[0][0]}")
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


def update_lines(update: Update | None) -> list[str]:
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
