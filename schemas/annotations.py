"""Annotations of images: what the readers of annotated layouts (a box CSV, COCO, Pascal
VOC, YOLO, semantic masks, several labels per image) hand to the record builder.

Contracts only (issue 21). A reader turns a layout's files into one ``Annotated``: one
``ImageAnnotations`` per image, the ``LabelMap``, and every ``AnnotationProblem`` it met.
The record builder (``transforms.io.image_records``) attaches an image's annotations to
its record: the boxes follow the pixels through the geometry applied (``Geometry``) and
are written, normalized, under the keys TF Model Garden's ``TfExampleDecoder`` and the
Object Detection API read (``DETECTION_KEYS``).

Coordinates. Every box and polygon here is in the source image's pixels as stored in its
file (before any EXIF orientation), as continuous coordinates with 0-based edges: a box
``(xmin, ymin, xmax, ymax)`` covers ``xmin <= x <= xmax``; the image spans ``0..width``
and ``0..height``. A reader converts its layout's convention to this one (COCO's
``[x, y, w, h]``; YOLO's normalized centre and size; VOC's 1-based inclusive pixel
indices, where a box over pixels ``xmin..xmax`` becomes ``(xmin - 1, ..., xmax, ...)``).
A reader does not clip: clipping to the image and dropping boxes without area happen
where the image's true size is known, in the record builder, and are counted there.

Labels. ``ObjectAnnotation.label`` is the id written as ``image/object/class/label``:
COCO's category id as given; otherwise 1-based in the label map's order (0 is the
background). ``LabelMap`` is written beside the shards as ``label_map.pbtxt``.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "ANNOTATION_LAYOUTS",
    "Annotated",
    "AnnotatedRun",
    "AnnotationProblem",
    "DETECTION_KEYS",
    "ImageAnnotations",
    "LABEL_MAP_NAME",
    "LabelMap",
    "ObjectAnnotation",
    "PROBLEM_REASONS",
    "Polygons",
    "Rle",
]

# The annotated layouts, as ``--layout`` names them.
ANNOTATION_LAYOUTS = ("box_csv", "multi_label", "coco", "voc", "yolo", "masks")

LABEL_MAP_NAME = "label_map.pbtxt"

# Feature key -> dtype, as Model Garden's TfExampleDecoder and the Object Detection API
# read them. Per object (lists, in the annotations' order): the bbox keys, class, crowd,
# area, difficult, truncated, and (with --instance_masks) one PNG per object. Per image:
# the semantic mask. Several labels per image: image/class/label and text as lists.
DETECTION_KEYS = {
    "image/source_id": "string",
    "image/object/bbox/xmin": "float32",
    "image/object/bbox/ymin": "float32",
    "image/object/bbox/xmax": "float32",
    "image/object/bbox/ymax": "float32",
    "image/object/class/label": "int64",
    "image/object/class/text": "string",
    "image/object/is_crowd": "int64",
    "image/object/area": "float32",
    "image/object/difficult": "int64",
    "image/object/truncated": "int64",
    "image/object/mask": "string",
    "image/segmentation/class/encoded": "string",
    "image/segmentation/class/format": "string",
    "image/class/label": "int64",
    "image/class/text": "string",
}

# Why an annotation (or the image it belongs to) was not taken as given. A reader meets
# the first group; the record builder, which knows the image, the second. ``kept`` in
# ``AnnotationProblem`` says what happened to the image.
PROBLEM_REASONS = (
    # Readers: the annotation files themselves.
    "bad_annotation_file",    # the file does not parse (XML, JSON, YAML): every image it names
    "bad_label_line",         # a YOLO label line or a CSV row that does not parse
    "unknown_image_id",       # a COCO annotation whose image_id is not in "images"
    "unknown_category",       # a category id / class index / name the label map lacks
    "image_not_found",        # an annotation for a file that does not exist
    "box_not_finite",         # a coordinate that is not a finite number: object dropped
    "annotation_not_found",   # an image (or a split file's id) with no annotation file (VOC)
    "split_conflict",         # an image the layout puts in two splits: the first one kept
    "bad_image_entry",        # a COCO image entry without a usable id, file_name or size, or repeated
    "segmentation_invalid",   # a polygon ring or RLE that cannot be rendered: left out, object kept
    "bad_object",             # an object whose field is missing or does not parse (VOC): object dropped
    # The record builder: the annotation against the image.
    "box_empty",              # no area left after clipping (or after a crop): object dropped
    "annotation_size_mismatch",  # the stated size is neither the image's nor its EXIF-rotated size
    "mask_size_mismatch",     # a semantic mask whose size differs from its image's
    "bad_mask",               # a semantic mask that is not a one-channel PNG, or cannot be read
    # The launcher's listing (--masks): an image without the mask of its path and stem.
    "mask_not_found",
)


@dataclasses.dataclass(frozen=True)
class Polygons:
    """A COCO polygon segmentation: one or more rings, each ``(x0, y0, x1, y1, ...)`` in
    source pixels (at least three points)."""

    rings: tuple[tuple[float, ...], ...]


@dataclasses.dataclass(frozen=True)
class Rle:
    """A run-length encoded mask (COCO), decoded to its run lengths: ``size`` is
    ``(height, width)``, ``counts`` alternate background and foreground runs in
    column-major order, starting with background (COCO's convention)."""

    size: tuple[int, int]
    counts: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ObjectAnnotation:
    """One object of an image.

    Attributes:
      box: ``(xmin, ymin, xmax, ymax)`` in source pixels (see the module docstring);
        finite numbers (a reader drops an object whose coordinates are not).
      label: its id (``image/object/class/label``).
      text: its class name (``image/object/class/text``).
      is_crowd: COCO's ``iscrowd``.
      area: in source pixels; COCO's ``area`` as given, else ``None`` (the box's area is
        written, after the geometry).
      difficult, truncated: VOC's flags.
      segmentation: for ``--instance_masks``: the object's polygons or RLE, else ``None``.
      source: where it was read (``"instances.json: annotation 1234"``, ``"Annotations/
        x.xml: object 2"``, ``"labels/train/x.txt:3"``, ``"boxes.csv:17"``): dead letters
        and problem counts name it.
    """

    box: tuple[float, float, float, float]
    label: int
    text: str
    is_crowd: bool = False
    area: float | None = None
    difficult: bool = False
    truncated: bool = False
    segmentation: Polygons | Rle | None = None
    source: str = ""

    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.box)


@dataclasses.dataclass(frozen=True)
class ImageAnnotations:
    """Everything the annotations say about one image.

    Attributes:
      path: the image's path relative to the images root, ``/``-separated.
      source_id: ``image/source_id``: COCO's image id as text; otherwise ``path``.
      objects: in the order the annotations list them (file, row or line order).
      labels: several labels per image (no boxes): ids, in row order, no repeats.
      texts: the names of ``labels``.
      units: ``"pixels"`` (boxes as the module docstring says) or ``"normalized"``
        (every box coordinate divided by the source image's width or height, as YOLO
        and ``--box_units normalized`` give them; the record builder, which knows the
        size, turns them into pixels). Polygons and RLE are always in pixels.
      stated_size: ``(width, height)`` the annotations state (CSV width/height, VOC
        ``<size>``, COCO width/height), or ``None``.
      mask: a semantic mask's path (``--masks``), absolute or relative to the mask root.
      split: the split the layout assigns (VOC's ImageSets, YOLO's folders, COCO's file
        per split), or ``""`` (the run's ``--splits`` decide).
      source: the annotation file (or CSV rows) that described it.
    """

    path: str
    source_id: str
    objects: tuple[ObjectAnnotation, ...] = ()
    labels: tuple[int, ...] = ()
    texts: tuple[str, ...] = ()
    units: str = "pixels"
    stated_size: tuple[int, int] | None = None
    mask: str = ""
    split: str = ""
    source: str = ""


@dataclasses.dataclass(frozen=True)
class AnnotationProblem:
    """One annotation not taken as given.

    Attributes:
      source: the annotation: file, line or id (``ObjectAnnotation.source`` form).
      reason: one of ``PROBLEM_REASONS``.
      detail: what was wrong, in words, without quoting the file's content beyond the
        field's name and a number.
      image: the image's relative path, when one is known, else ``""``.
      kept: ``"image"`` (the image is converted, the object dropped), ``"nothing"``
        (neither: a dead letter).
    """

    source: str
    reason: str
    detail: str
    image: str = ""
    kept: str = "image"


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Class ids and names, in id order (``label_map.pbtxt``)."""

    items: tuple[tuple[int, str], ...]

    def name_of(self, label: int) -> str:
        return dict(self.items)[label]

    def id_of(self, name: str) -> int:
        return {n: i for i, n in self.items}[name]

    def to_pbtxt(self) -> str:
        """The Object Detection API's text format: ``item { id: N name: '...' }`` per class."""
        lines = []
        for label, name in self.items:
            escaped = name.replace("\\", "\\\\").replace("'", "\\'")
            lines.append(f"item {{\n  id: {label}\n  name: '{escaped}'\n}}\n")
        return "".join(lines)


@dataclasses.dataclass(frozen=True)
class Annotated:
    """What a reader of an annotated layout returns.

    Attributes:
      layout: one of ``ANNOTATION_LAYOUTS``.
      images: one per image the annotations name (or, for YOLO and masks, per image
        found), in a stable order (sorted by ``path``).
      label_map: the classes.
      problems: every annotation not taken as given, in the order met.
    """

    layout: str
    images: tuple[ImageAnnotations, ...]
    label_map: LabelMap
    problems: tuple[AnnotationProblem, ...] = ()


@dataclasses.dataclass(frozen=True)
class AnnotatedRun:
    """What the plan of an annotated run tells its pipeline and its commit (issue 21).

    The preflight reads the annotations (``Annotated``) and puts each image's into its
    ``ImageRef.annotation``; this is the rest, small enough for the job graph.

    Attributes:
      layout: one of ``ANNOTATION_LAYOUTS``; or ``custom``: a library user's own
        ``AnnotationAttach`` given to ``convert(attach=...)`` (the job graph makes
        this record of it, so its commit writes the label map and the manifest's
        ``annotations`` too).
      label_map: the classes (``label_map.pbtxt``; the manifest's vocabulary).
      instance_masks: ``--instance_masks``: write ``image/object/mask``.
      images_root: the images' folder relative to the input root when the
        annotations' paths are relative to it (``AnnotationOptions.images_root``).
      mask_root: ``--masks``: the folder the semantic masks' paths are under, or ''.
      problems: what the launcher counted by reason while reading the annotations,
        ``((reason, n), ...)`` sorted (objects dropped, images kept or dead-lettered).
      images_without_objects: images kept with no objects (negative examples).
      dropped_empty: images left out by ``--drop_empty``.
    """

    layout: str
    label_map: LabelMap
    instance_masks: bool = False
    images_root: str = ""
    mask_root: str = ""
    problems: tuple[tuple[str, int], ...] = ()
    images_without_objects: int = 0
    dropped_empty: int = 0
