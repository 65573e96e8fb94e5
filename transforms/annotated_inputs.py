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

Under ``--layout auto`` a folder that is none of them but holds VOC folders
(``VOCdevkit``), or a darknet folder (label files beside the images, ``classes.txt``,
no ``data.yaml``), is refused (``AnnotatedRefused``, naming what to pass): read as
class folders it would publish the wrong dataset.

``list_annotated`` lists the files, runs the layout's reader (``codec.coco``,
``codec.box_csv``, ``plan.annotation_folders``, ``plan.annotated_listing``) and makes
the ``Listing`` (``plan.annotated_listing.annotated_listing``); a folder without its
layout's files, a COCO file or data.yaml that is not read are refused. Each COCO file's
images folder is the first of the root, ``root/NAME`` for ``instances_NAME.json`` and
the file's own folder that holds its first images (``image/filename`` is the path
under the root); ``val`` and ``valid`` splits are ``validation``; a category id 0 no
annotation uses is left out of the label map, one they use refused.
``refuse_empty_listing`` refuses a listing with no image to convert. No Beam
transform here.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import posixpath
import re
import stat
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS, Annotated, AnnotationProblem, LabelMap
from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.manifest import shown_value
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
    voc_images,
)
from beam_tfrecords.transforms.plan.label_map_file import is_label_map_pbtxt, read_label_map
from beam_tfrecords.transforms.plan.layouts import (
    Listing,
    manifest_columns,
    manifest_image_path,
    parse_labels_text,
    resolve_input,
)

__all__ = ["AmbiguousManifest", "AnnotatedRefused", "AnnotationArgs", "detect_annotated_layout", "exif_note",
           "list_annotated", "refuse_empty_listing"]

# --annotations split names that mean another split (as VOC's and YOLO's val do).
_SPLIT_NAMES = {"val": "validation", "valid": "validation"}
# A darknet folder's class names file, at its top.
_DARKNET_NAMES = ("classes.txt", "obj.names")
# How many of a COCO file's images are looked up to pick its images folder.
_COCO_SAMPLE = 5


class AmbiguousManifest(ValueError):
    """A CSV manifest that gives images several labels on several rows, under ``--layout
    auto``: one record per row (``csv``) or one per image (``multi_label``) is the
    user's to say; the message names both."""


class AnnotatedRefused(ValueError):
    """An annotated input refused before anything runs (exit 2): the message is the
    whole line, naming the flag or path to change."""


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
    found = detect_annotation_layout(_top_names(root), lambda p: files.read_bytes_if_exists(files.join(root, p)))
    if found == "yolo" and not _has_label_files(root):
        found = None  # A data.yaml beside class folders (a classification export): not YOLO.
    if found is None:
        _refuse_unread_folder(input_path, root)
    return found


def _has_label_files(root: str) -> bool:
    """Whether a folder holds YOLO label files: a ``.txt`` under ``labels/`` at its top
    (Ultralytics) or under a top folder's ``labels/`` (Roboflow's ``train/labels``)."""
    if files.is_local(root):
        patterns = (os.path.join(glob.escape(root), "labels", "**", "*.txt"),
                    os.path.join(glob.escape(root), "*", "labels", "**", "*.txt"))
        return any(next(glob.iglob(pattern, recursive=True), None) is not None for pattern in patterns)
    return any(path.endswith(".txt") for pattern in (files.join(root, "labels", "**"),
                                                     files.join(root, "*", "labels", "**"))
               for path, _ in files.list_files(pattern, limit=100))


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _nested_voc(root: str) -> list[str]:
    """The subfolders of a local folder that hold ``Annotations/`` and ``JPEGImages/``
    (``VOCdevkit/VOC2012``); ``[]`` for a ``gs://`` folder (not listed for this)."""
    if not files.is_local(root):
        return []
    found = []
    try:
        folders = [entry for entry in os.scandir(root) if entry.is_dir()]
    except OSError:
        return []
    for entry in folders:
        try:
            # Two lookups first; the folder is listed (the names' exact case) only when both
            # are there: an image folder of 50k files is not listed to find none.
            if (os.path.lexists(os.path.join(entry.path, "Annotations"))
                    and os.path.lexists(os.path.join(entry.path, "JPEGImages"))
                    and {"Annotations", "JPEGImages"} <= set(os.listdir(entry.path))):
                found.append(entry.name)
        except OSError:
            continue
    return sorted(found)


def _nested_hint(input_path: str, nested: list[str]) -> str:
    inner = [_printable(posixpath.join(input_path.rstrip("/"), name)) for name in nested]
    what = f"the Pascal VOC folder {_printable(nested[0])}" if len(nested) == 1 else (
        "the Pascal VOC folders " + ", ".join(map(_printable, nested)))
    where = f"pass --input {inner[0]}" if len(inner) == 1 else f"pass one of {', '.join(inner)} as --input"
    return f"it holds {what}; {where} (the folder holding Annotations/ and JPEGImages/)"


def _yolo_line(path: str) -> bool:
    """Whether the first line of a text file is a YOLO label line (``class cx cy w h``)."""
    try:
        with open(path, "rb") as handle:
            fields = handle.readline(200).split()
        return len(fields) == 5 and fields[0].isdigit() and bool([float(f) for f in fields[1:]])
    except (OSError, ValueError):
        return False


def _darknet(root: str) -> bool:
    """A local darknet folder: ``classes.txt`` or ``obj.names`` at its top, and an image
    with a YOLO label file of its stem beside it."""
    if not files.is_local(root) or not any(os.path.isfile(os.path.join(root, n)) for n in _DARKNET_NAMES):
        return False
    for folder, _, names in os.walk(root):
        texts = {os.path.splitext(n)[0]: n for n in names if n.lower().endswith(".txt")}
        for name in names:
            label = texts.get(os.path.splitext(name)[0])
            if label and is_image_filename(name):
                return _yolo_line(os.path.join(folder, label))
    return False


def _refuse_unread_folder(input_path: str, root: str) -> None:
    """Refuses, under ``--layout auto``, a folder of a known annotated layout that would
    otherwise be read as class folders: a ``VOCdevkit`` (its subfolders are VOC
    folders) and a darknet folder (YOLO label files beside the images, no data.yaml).

    Raises:
      AnnotatedRefused: saying what to pass instead.
    """
    nested = _nested_voc(root)
    if nested:
        raise AnnotatedRefused(f"--input {_printable(input_path)}: this is not a Pascal VOC folder but "
                               + _nested_hint(input_path, nested))
    if _darknet(root):
        raise AnnotatedRefused(
            f"--input {_printable(input_path)}: a darknet YOLO folder (classes.txt or obj.names, label "
            ".txt files beside the images) is not read without a data.yaml: write data.yaml in it with "
            "'train: FOLDER' (the folder of the images, relative to it) and 'names:' the classes in "
            "order, then run again (it is read as YOLO)")


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


def _folder_under(root: str, folder: str) -> str | None:
    """``folder`` relative to ``root`` (``""``: the root itself), or ``None`` outside it."""
    if files.is_local(root):
        root, folder = os.path.abspath(root), os.path.abspath(folder)
    inside = root.rstrip("/") + "/"
    folder = folder.rstrip("/") + "/"
    return folder[len(inside):].rstrip("/") if folder.startswith(inside) else None


def _coco_folder(root: str, path: str, read: Annotated, names: set[str]) -> str:
    """The folder (relative to ``root``) a COCO file's ``file_name`` paths are under: the
    first of ``root``, ``root/NAME`` for ``instances_NAME.json`` (COCO's download) and the
    file's own folder (Roboflow's export) that holds the most of its first images."""
    candidates = [""]
    named = re.fullmatch(r"instances_(.+)\.json", posixpath.basename(path))
    if named:
        candidates.append(named.group(1))
    own = _folder_under(root, posixpath.dirname(path) if not files.is_local(path) else os.path.dirname(path))
    if own is not None:
        candidates.append(own)
    sample = [image.path for image in read.images[:_COCO_SAMPLE]]

    def found(folder: str) -> int:
        return sum(annotation_key(posixpath.join(folder, p)) in names for p in sample)

    return max(candidates, key=lambda folder: (found(folder), -candidates.index(folder)))


def _under(read: Annotated, folder: str, names: set[str]) -> Annotated:
    """``read`` with its paths under ``folder`` (relative to the input root, as
    ``image/filename`` holds them), its images whose file is not there ``image_not_found``."""
    prefix = folder + "/" if folder else ""
    problems = [dataclasses.replace(p, image=prefix + p.image) if p.image else p for p in read.problems]
    images = []
    for image in read.images:
        path = prefix + image.path
        if annotation_key(path) in names:
            images.append(dataclasses.replace(image, path=path))
        else:
            problems.append(AnnotationProblem(image.source, "image_not_found", "no such file under --input",
                                              path, "nothing"))
    return dataclasses.replace(read, images=tuple(images), problems=tuple(problems))


def _background(read: Annotated, notes: list[str]) -> Annotated:
    """A COCO category id 0 (the background to the Object Detection API and Model
    Garden) left out of the label map when no annotation uses it.

    Raises:
      AnnotatedRefused: when annotations use it.
    """
    if 0 not in dict(read.label_map.items):
        return read
    used = [o.source for image in read.images for o in image.objects if o.label == 0]
    if used:
        raise AnnotatedRefused(
            f"--annotations: category id 0 is used by {len(used):,} annotation(s) (the first: "
            f"{_printable(used[0])}); id 0 is the background in the Object Detection API and Model "
            "Garden: renumber the categories from 1")
    notes.append("category id 0 has no annotation: left out of the label map (id 0 is the background)")
    return dataclasses.replace(read, label_map=LabelMap(tuple(i for i in read.label_map.items if i[0] != 0)))


def _coco(root: str, listed: dict[str, FoundImage], args: AnnotationArgs,
          notes: list[str]) -> Annotated:
    """The COCO files of ``--annotations``, each under the images folder it names
    (``_coco_folder``; ``notes`` gets which), split names ``val`` and ``valid`` read as
    ``validation``.

    Raises:
      AnnotatedRefused: a file that is not a COCO instances file, a split given twice,
        a category id 0 that annotations use.
    """
    names = set(listed)
    given = [(_SPLIT_NAMES.get(split, split), split, path) for split, path in annotation_parts(args.annotations or "")]
    for index, (split, named, _) in enumerate(given):
        if split and split in {s for s, _, _ in given[:index]}:
            raise AnnotatedRefused(f"--annotations names the split {split} twice ({named} means {split})")
    parts = []
    for split, _, path in given:
        read = read_coco(files.read_bytes(path), posixpath.basename(path))
        refused = [p for p in read.problems if p.reason == "bad_annotation_file" and not p.image]
        if refused:
            raise AnnotatedRefused(f"--annotations {_printable(path)}: {refused[0].detail}")
        folder = _coco_folder(root, path, read, names)
        notes.append(f"{_printable(posixpath.basename(path))}" + (f" (split {split})" if split else "")
                     + f": images under {_printable(folder) + '/' if folder else '--input itself'}")
        parts.append((split, _under(read, folder, names)))
    merged = parts[0][1] if len(parts) == 1 and not parts[0][0] else merge_coco(parts)
    return _background(merged, notes)


def _refuse_folder(input_path: str, root: str, layout: str, listed: dict[str, FoundImage]) -> None:
    """Refuses a folder given as ``--layout voc`` or ``yolo`` that lacks the layout's
    files (``AnnotatedRefused``)."""
    if layout == "voc":
        for folder in ("Annotations", "JPEGImages"):
            if not any(p.startswith(folder + "/") for p in listed):
                nested = _nested_voc(root)
                raise AnnotatedRefused(f"--layout voc: {_printable(input_path)} has no {folder}/ folder"
                                       + (f"; {_nested_hint(input_path, nested)}" if nested else ""))
    if layout == "yolo" and not any("/" not in p and p.lower().endswith((".yaml", ".yml")) for p in listed):
        raise AnnotatedRefused(f"--layout yolo: {_printable(input_path)} has no data.yaml (the file "
                               "naming the classes and each split's image folder)")


def _refuse_yaml(input_path: str, annotated: Annotated) -> None:
    """Refuses a YOLO folder whose data.yaml is not read (``AnnotatedRefused``)."""
    for problem in annotated.problems:
        if problem.reason == "bad_annotation_file" and not problem.image and problem.source.endswith(
                (".yaml", ".yml")):
            raise AnnotatedRefused(f"--input {_printable(input_path)}: {_printable(problem.source)} is not "
                                   f"read: {problem.detail}")


def refuse_empty_listing(input_path: str, listing: Listing, drop_empty: bool = False) -> None:
    """Refuses an annotated listing without an image to convert (the run would publish
    nothing), naming the commonest reason and its first source. Called by the plan
    (not by ``list_annotated``: a listing step that lists again must not raise).

    Raises:
      AnnotatedRefused: the listing has no image reference.
    """
    if listing.refs or listing.annotated is None:
        return
    unnamed = listing.annotated.unnamed
    refused = Counter(d.error for d in listing.dead_letters)
    if refused:
        reason, count = refused.most_common(1)[0]
        first = next(d for d in listing.dead_letters if d.error == reason)
        why = f"{count:,} {reason} (the first: {first.source}: {first.message})"
    elif drop_empty and listing.annotated.run.dropped_empty:
        why = "every image is without objects, and --drop_empty leaves them out"
    elif unnamed:
        why = f"the annotations name none of the {unnamed:,} images under it"
    else:
        why = "the annotations name no image"
    hint = (" (or, if its folders are classes, say --layout class_folders)"
            if listing.layout in ("voc", "yolo") else "")
    raise AnnotatedRefused(_printable(f"--input {input_path}: no image to convert: {why}{hint}"))


def _refuse_all_unknown(annotated: Annotated, given: Annotated | None = None, labels_path: str = "") -> None:
    """Refuses a run whose every object (or label) would be left out as
    ``unknown_category``: the label map matches none of the annotations' classes.

    Raises:
      ValueError: naming the first classes the label map lacks (``--labels``), or the
        first object left out.
    """
    unknown = [p for p in annotated.problems if p.reason == "unknown_category"]
    if not unknown or any(image.objects or image.labels for image in annotated.images):
        return
    if given is not None:
        known = {name for _, name in annotated.label_map.items}
        names = dict.fromkeys(n for image in given.images for n in (*(o.text for o in image.objects), *image.texts)
                              if n not in known)
        first = ", ".join(shown_value(n) for n in list(names)[:3])
        what = "labels" if annotated.layout == "multi_label" else "objects"
        raise ValueError(f"--labels {labels_path} names none of the annotations' classes (the first: {first}): "
                         f"all {len(unknown)} {what} would be left out as unknown_category; give the label map "
                         "of these annotations, or drop --labels")
    raise ValueError(f"every object of the annotations is of a class the label map lacks ({len(unknown)} "
                     f"unknown_category; the first: {unknown[0].source}: {unknown[0].detail}): check the "
                     "annotations' class names or ids")


def list_annotated(input_path: str, layout: str, labels_path: str | None = None,
                   image_column: str | None = None, label_column: str | None = None,
                   splits: tuple = (), follow_links_outside: bool = False,
                   args: AnnotationArgs = AnnotationArgs()) -> Listing:
    """The listing of an annotated layout (``plan.annotated_listing``).

    Raises:
      AnnotatedRefused: a folder without the layout's files, or an annotation file
        that is not read (a COCO file, a data.yaml).
      ValueError: a column, file or flag that cannot be used (the preflight's, exit 2).
      OSError: an annotation file that cannot be read.
    """
    if layout not in ANNOTATION_LAYOUTS:
        raise ValueError(f"not an annotated layout: {layout}")
    _, root, pattern = resolve_input(input_path, layout)
    unnamed, skipped, notes = 0, [], []
    if layout in ("box_csv", "multi_label"):
        annotated, found = _csv_listing(input_path, root, layout, image_column, label_column, args)
    else:
        listed = _listed(pattern, root, follow_links_outside, skipped)
        images = [p for p in listed if is_image_filename(p)]
        _refuse_folder(input_path, root, layout, listed)
        if layout == "voc":
            annotated = read_voc_folder(listed, lambda p: files.read_bytes_if_exists(files.join(root, p)))
            images = voc_images(listed)
        elif layout == "yolo":
            annotated = read_yolo_folder(listed, lambda p: files.read_bytes_if_exists(files.join(root, p)))
            _refuse_yaml(input_path, annotated)
        elif layout == "coco":
            annotated = _coco(root, listed, args, notes)
        else:
            text = files.read_text(labels_path) if labels_path else ""
            # A label map's ids are the mask values; a labels file's line i is value i.
            labels = (read_label_map(text) if is_label_map_pbtxt(text)
                      else mask_label_map(parse_labels_text(text) if text else None))
            masks = _listed(files.join(args.masks or "", "**"), args.masks or "", follow_links_outside)
            inside = relative_path(root, args.masks or "").rstrip("/") + "/"  # A mask folder under --input:
            images = [p for p in images if not p.startswith(inside)]  # its PNGs are not images.
            annotated = read_mask_folder(images, masks, labels)
        found = {entry.path: listed[annotation_key(entry.path)] for entry in annotated.images
                 if annotation_key(entry.path) in listed}
        if layout in ("coco", "masks", "voc"):
            unnamed = len(set(images) - {annotation_key(entry.path) for entry in annotated.images}
                          - {p.image for p in annotated.problems})
    if labels_path and layout in ("voc", "box_csv", "multi_label"):
        given = annotated
        annotated = relabeled(annotated, read_label_map(files.read_text(labels_path)))
        _refuse_all_unknown(annotated, given, labels_path)
    else:
        _refuse_all_unknown(annotated)
    normalized = layout == "box_csv" and args.box_units == "pixels" and every_value_normalized(annotated)
    listing = annotated_listing(annotated, found, splits=tuple(splits), drop_empty=args.drop_empty,
                                instance_masks=args.instance_masks,
                                mask_root=(args.masks or "") if layout == "masks" else "",
                                unnamed=unnamed, normalized_boxes=normalized)
    if notes:
        listing.annotated = dataclasses.replace(listing.annotated, notes=tuple(notes))
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
