"""Annotated inputs: which annotated layout an input is, and its listing (issue 21).

``detect_annotated_layout`` tells, for ``--layout auto``, whether an input is one of
the annotated layouts (``schemas.annotations.ANNOTATION_LAYOUTS``):

* ``--annotations`` given: ``coco`` (``--input`` is the images' folder);
* ``--masks`` given: ``masks``;
* a folder holding ``Annotations/`` and ``JPEGImages/``: ``voc``; one holding
  ``images/``, ``labels/`` and ``data.yaml``: ``yolo``
  (``plan.annotation_folders.detect_annotation_layout``);
* a CSV manifest whose header holds the box columns (``--box_columns``): ``box_csv``;
  one whose image column names an image on several rows, or read with
  ``--label_separator``: ``multi_label``.

``list_annotated`` lists the files, runs the layout's reader (``codec.coco``,
``codec.box_csv``, ``plan.annotation_folders``, ``plan.annotated_listing``) and makes
the ``Listing`` (``plan.annotated_listing.annotated_listing``). No Beam transform here.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import stat
from collections.abc import Sequence
from typing import NamedTuple

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS, Annotated
from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.transforms.codec.box_csv import (
    BOX_COLUMNS,
    CsvRow,
    csv_rows,
    every_value_normalized,
    read_box_rows,
    read_label_rows,
)
from beam_tfrecords.transforms.codec.coco import merge_coco, read_coco
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.annotation_attach import annotation_key
from beam_tfrecords.transforms.io.fingerprint import relative_path
from beam_tfrecords.transforms.io.gcs import is_gcs
from beam_tfrecords.transforms.io.orientation_scan import orientations
from beam_tfrecords.transforms.plan.annotated_listing import (
    ExifNote,
    FoundImage,
    annotated_listing,
    annotation_parts,
    mask_label_map,
    read_mask_folder,
    relabeled,
    unstated_sizes,
)
from beam_tfrecords.transforms.plan.annotation_folders import (
    YOLO_YAML,
    detect_annotation_layout,
    read_voc_folder,
    read_yolo_folder,
)
from beam_tfrecords.transforms.plan.layouts import (
    Listing,
    manifest_columns,
    manifest_image_path,
    parse_labels_text,
    resolve_input,
)

__all__ = ["AmbiguousManifest", "AnnotationArgs", "detect_annotated_layout", "exif_note", "list_annotated"]


class AmbiguousManifest(ValueError):
    """A CSV manifest that gives images several labels on several rows, under ``--layout
    auto``: one record per row (``csv``) or one per image (``multi_label``) is the
    user's to say; the message names both."""


class AnnotationArgs(NamedTuple):
    """The flags of annotated images, as a listing's identity carries them
    (``image_listing.ListingIdentity.annotations``)."""

    annotations: str | None = None
    masks: str | None = None
    instance_masks: bool = False
    box_columns: tuple[str, ...] = BOX_COLUMNS
    box_units: str = "pixels"
    label_separator: str | None = None
    drop_empty: bool = False

    @classmethod
    def of(cls, config) -> AnnotationArgs:
        """The flags of ``config`` (a ``ConvertConfig``)."""
        return cls(config.annotations, config.masks, config.instance_masks, tuple(config.box_columns),
                   config.box_units, config.label_separator, config.drop_empty)


def _top_names(root: str) -> list[str]:
    """The top-level names of a folder (folders as ``name/x``), for layout detection."""
    if files.is_local(root):
        try:
            return [f"{e.name}/x" if e.is_dir() else e.name for e in os.scandir(root)]
        except OSError:
            return []
    names = [f"{name}/x" for name in ("Annotations", "JPEGImages", "images", "labels")
             if files.list_files(files.join(root, name, "**"), limit=1)]
    return names + ([YOLO_YAML] if files.exists(files.join(root, YOLO_YAML)) else [])


def detect_annotated_layout(input_path: str, args: AnnotationArgs, image_column: str | None = None,
                            label_column: str | None = None, known: frozenset[str] | None = None
                            ) -> str | None:
    """The annotated layout of ``input_path`` under ``--layout auto`` (see the module
    docstring), or ``None`` (not annotated: the other layouts decide).

    Raises:
      AmbiguousManifest: a CSV manifest without box columns that gives an image
        several labels (two whole rows, different labels of ``known`` when given):
        not decided from the data, so that a scheduled run does not change its
        records' schema the day a row repeats an image.
    """
    if args.annotations:
        return "coco"
    if args.masks:
        return "masks"
    layout, root, pattern = resolve_input(input_path, "auto")
    if layout == "csv":
        header, rows = csv_rows(files.read_text(input_path))
        if all(name in header for name in args.box_columns):
            return "box_csv"
        if args.label_separator is not None:
            return "multi_label"
        several = _labels_repeat(header, rows, image_column, label_column, known)
        if several:
            raise AmbiguousManifest(
                f"{input_path}: {several[0]} images appear on several rows with different labels "
                f"(the first: line {several[1]}): say --layout multi_label to make each image one record "
                "with all its labels, or --layout csv to keep one record per row")
        return None
    if pattern != root.rstrip("/") + "/**" or (files.is_local(root) and not os.path.isdir(root)):
        return None  # A glob names its files: not a layout's folder.
    return detect_annotation_layout(_top_names(root))


def _labels_repeat(header: Sequence[str], rows: Sequence[CsvRow], image_column: str | None,
                   label_column: str | None, known: frozenset[str] | None) -> tuple[int, int] | None:
    """``(images, first line)`` of the images a CSV manifest gives several labels: two
    whole rows (every cell, quoting intact) name the image with different labels (of
    ``known``, when given); ``None`` when none. A repeated row (the same label), a
    broken one, or one whose label is not a class do not count."""
    try:
        image, label = manifest_columns(header, image_column, label_column)
    except ValueError:
        return None
    where, what = header.index(image), header.index(label)
    seen: dict[str, str] = {}
    several: dict[str, int] = {}
    for row in rows:
        if row.error or len(row.cells) != len(header):
            continue
        path, name = row.cells[where].strip(), row.cells[what].strip()
        if known is not None and name not in known:
            continue
        if seen.setdefault(path, name) != name:
            several.setdefault(path, row.line)
    return (len(several), min(several.values())) if several else None


def _size(path: str) -> int | None:
    """The size of the file at ``path``, looked up by its name; ``None`` when missing."""
    if files.is_local(path):
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            return None
        return None if stat.S_ISDIR(info.st_mode) else info.st_size
    try:
        return FileSystems.get_filesystem(path).metadata(path).size_in_bytes
    except (BeamIOError, ValueError):
        return None


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _shown(root: str, path: str) -> str:
    """A listed path as dead letters name it: relative to the root, undecodable bytes escaped."""
    return relative_path(root, path).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _listed(pattern: str, root: str, follow_links_outside: bool,
            skipped: list | None = None) -> dict[str, FoundImage]:
    """``{path relative to root: FoundImage}`` of every file under the pattern (a
    ``gs://`` object with the generation and CRC-32C listed); ``skipped`` gathers the
    paths passed over (``files.list_stamped``)."""
    found = {}
    for path, size, stamp, crc in files.list_stamped(pattern, skipped=skipped,
                                                     follow_outside=follow_links_outside):
        if not _utf8(path):  # Not a name a feature's text can hold: a bad input, as other listings.
            if skipped is not None:
                skipped.append((path, "bad_file_name", "the file name is not UTF-8 text; rename the file"))
            continue
        pinned = is_gcs(path) and stamp > 0
        found[relative_path(root, path)] = FoundImage(path, size, stamp if pinned else 0,
                                                      crc if pinned else -1)
    return found


def _csv_listing(input_path: str, root: str, layout: str, image_column, label_column,
                 args: AnnotationArgs) -> tuple[Annotated, dict[str, FoundImage]]:
    header, rows = csv_rows(files.read_text(input_path))
    image, label = manifest_columns(header, image_column, label_column)
    source = posixpath.basename(input_path)
    if layout == "box_csv":
        annotated = read_box_rows(header, rows, source=source, image_column=image, class_column=label,
                                  box_columns=args.box_columns, units=args.box_units)
    else:
        annotated = read_label_rows(header, rows, source=source, image_column=image,
                                    label_column=label, separator=args.label_separator)
    found = {}
    for entry in annotated.images:
        path = manifest_image_path(root, entry.path)
        size = _size(path)
        if size is not None:
            found[entry.path] = FoundImage(path, size)
    return annotated, found


def _coco(root: str, listed: dict[str, FoundImage], args: AnnotationArgs) -> Annotated:
    names = set(listed)
    parts = []
    for split, path in annotation_parts(args.annotations or ""):
        read = read_coco(files.read_bytes(path), posixpath.basename(path),
                         exists=lambda p: annotation_key(p) in names)
        parts.append((split, read))
    return parts[0][1] if len(parts) == 1 and not parts[0][0] else merge_coco(parts)


def list_annotated(input_path: str, layout: str, labels_path: str | None = None,
                   image_column: str | None = None, label_column: str | None = None,
                   splits: tuple = (), follow_links_outside: bool = False,
                   args: AnnotationArgs = AnnotationArgs()) -> Listing:
    """The listing of an annotated layout (``plan.annotated_listing``).

    Raises:
      ValueError: a column, file or flag that cannot be used (the preflight's, exit 2).
      OSError: an annotation file that cannot be read.
    """
    if layout not in ANNOTATION_LAYOUTS:
        raise ValueError(f"not an annotated layout: {layout}")
    _, root, pattern = resolve_input(input_path, layout)
    unnamed, skipped = 0, []
    if layout in ("box_csv", "multi_label"):
        annotated, found = _csv_listing(input_path, root, layout, image_column, label_column, args)
    else:
        listed = _listed(pattern, root, follow_links_outside, skipped)
        images = [p for p in listed if is_image_filename(p)]
        if layout == "voc":
            annotated = read_voc_folder(listed, lambda p: files.read_bytes_if_exists(files.join(root, p)))
        elif layout == "yolo":
            annotated = read_yolo_folder(listed, lambda p: files.read_bytes_if_exists(files.join(root, p)))
        elif layout == "coco":
            annotated = _coco(root, listed, args)
        else:
            labels = parse_labels_text(files.read_text(labels_path)) if labels_path else None
            masks = _listed(files.join(args.masks or "", "**"), args.masks or "", follow_links_outside)
            inside = relative_path(root, args.masks or "").rstrip("/") + "/"  # A mask folder under --input:
            images = [p for p in images if not p.startswith(inside)]  # its PNGs are not images.
            annotated = read_mask_folder(images, masks, mask_label_map(labels))
        found = {entry.path: listed[annotation_key(entry.path)] for entry in annotated.images
                 if annotation_key(entry.path) in listed}
        if layout in ("coco", "masks"):
            unnamed = len(set(images) - {annotation_key(entry.path) for entry in annotated.images}
                          - {p.image for p in annotated.problems})
    if labels_path and layout in ("voc", "box_csv", "multi_label"):
        annotated = relabeled(annotated, parse_labels_text(files.read_text(labels_path)))
    normalized = layout == "box_csv" and args.box_units == "pixels" and every_value_normalized(annotated)
    listing = annotated_listing(annotated, found, splits=tuple(splits), drop_empty=args.drop_empty,
                                instance_masks=args.instance_masks,
                                mask_root=(args.masks or "") if layout == "masks" else "",
                                unnamed=unnamed, normalized_boxes=normalized)
    for path, reason, message in skipped:
        (listing.dead_letters if reason == "bad_file_name" else listing.skipped).append(
            DeadLetter(_shown(root, path), "list", reason, message))
    listing.annotated = dataclasses.replace(listing.annotated, exif=exif_note(annotated, found))
    return listing


def exif_note(annotated: Annotated, found: dict[str, FoundImage], shown: int = 8) -> ExifNote | None:
    """The images whose annotations state no size and whose EXIF orientation is not 1,
    read from their first bytes here (``io.orientation_scan``) for local files; for
    ``gs://`` ones, a note that the workers count them. ``None``: no such image."""
    unstated = unstated_sizes(annotated, found)
    if not unstated:
        return None
    if any(not files.is_local(path) for _, path in unstated):
        return ExifNote(on_workers=True)
    turned = [name for (name, _), value in zip(unstated, orientations([p for _, p in unstated])) if value != 1]
    return ExifNote(len(turned), tuple(turned[:shown]), len(unstated)) if turned else None
