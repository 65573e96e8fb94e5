"""The COCO instances reader: an ``instances_*.json`` file's bytes to ``Annotated``.

Pure and Beam-free (issue 21, ``--layout coco``): the caller reads the file and, if it
wants files checked, passes ``exists``; nothing here touches storage.

What is read (``schemas.annotations`` has the contract):

* ``images``: ``id`` (``image/source_id`` is it as text), ``file_name`` (relative to the
  images folder; an absolute path or one with ``..`` is refused), ``width`` and
  ``height`` (the stated size, checked against the image by the record builder);
* ``categories``: ``id`` and ``name``, the label map in id order; the ids are written as
  given (COCO's 1..90 with gaps);
* ``annotations``, in file order per image: ``bbox`` ``[x, y, w, h]`` becomes the box
  ``(x, y, x + w, y + h)`` in pixels (not clipped here); ``iscrowd``; ``area`` (``None``
  when absent or not a finite number: the box's area is written instead);
  ``segmentation`` as polygons or as RLE with ``counts`` a list (uncompressed) or a
  string (COCO's compressed form, decoded here).

What is not taken as given becomes an ``AnnotationProblem`` (reasons from
``PROBLEM_REASONS``; sources like ``"instances_val.json: annotation 1234"``):

* the file is not JSON, or lacks ``images``, ``annotations`` or ``categories``:
  ``bad_annotation_file``, one problem, nothing read;
* an image entry without a usable ``id``, ``file_name`` or size, or repeating an id or
  a file: ``bad_image_entry``, the image and its objects left out (the objects of an
  entry repeating a file are each a ``bad_image_entry`` too, their image kept: the file
  is converted with the first entry's objects); with ``exists``, an image whose file
  does not exist: ``image_not_found``, likewise;
* an annotation whose ``image_id`` names no image: ``unknown_image_id``, kept nothing;
  one whose ``category_id`` is not a category: ``unknown_category``; a ``bbox`` missing
  or with a value that is not a finite number: ``box_not_finite`` (both: the object is
  dropped, its image kept); a category entry without an integer id and a name, or
  repeating an id: ``unknown_category`` (the entry is left out; objects of it follow);
* a polygon ring with fewer than three points, an odd count of numbers, a value that
  is not a finite number or a point far outside the image (``masks.coordinate_limit``), or an RLE whose runs do not fill its size or whose size is not
  the image's: ``segmentation_invalid``; the ring (or the RLE) is left out, the object
  kept (without a usable segmentation its mask is empty).

``merge_coco`` joins one file per split (``--annotations train=a.json,validation=b.json``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
from collections.abc import Callable, Sequence

from beam_tfrecords.schemas.annotations import (
    Annotated,
    AnnotationProblem,
    ImageAnnotations,
    LabelMap,
    ObjectAnnotation,
    Polygons,
    Rle,
)
from beam_tfrecords.transforms.codec.masks import MaskError, coordinate_limit, rle_from_string

__all__ = ["merge_coco", "read_coco"]

_SECTIONS = ("images", "annotations", "categories")
# The largest width or height an image entry may state (no image this product reads is larger).
_MAX_SIDE = 1 << 24
_NUMBERS = frozenset({int, float})  # JSON's numbers (not bool, which is an int to Python)


def read_coco(data: bytes, name: str, *, exists: Callable[[str], bool] | None = None) -> Annotated:
    """Parse a COCO instances file.

    Args:
      data: the file's bytes.
      name: how sources name the file (``"instances_val.json"``); control characters in
        it are escaped.
      exists: optional ``exists(path) -> bool`` for an image's ``file_name``: images whose
        file does not exist become ``image_not_found`` problems.

    Returns:
      ``Annotated`` (layout ``"coco"``): the images sorted by path, every one the file
      lists (those without annotations too: negative examples), with ``split`` ``""``.
      Never raises for bad content: see the module docstring.
    """
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)
    with _collector_paused():
        document = _load(data, shown)
        if isinstance(document, AnnotationProblem):
            return Annotated(layout="coco", images=(), label_map=LabelMap(()), problems=(document,))
        reading = _Reading(shown, exists)
        reading.categories(document["categories"])
        reading.images(document["images"])
        reading.annotations(document["annotations"])
        return reading.result()


@contextlib.contextmanager
def _collector_paused():
    """Python's cycle collector paused while a file's millions of small objects (which
    hold no cycles) are made: it would otherwise scan them again and again (a third of
    the time for COCO 2017 val's size)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def merge_coco(parts: Sequence[tuple[str, Annotated]]) -> Annotated:
    """Join one ``Annotated`` per split (``(split, read_coco(...))``, in the order given).

    Each part's images get its split. The label map is the union of the parts'. When a
    category id has another name in a later part than in the first part naming it, the
    first name stands and the later part's objects of that id are dropped
    (``unknown_category``, image kept): their class would be ambiguous. An image listed
    by two parts stays in the first one; the later listing is a ``bad_image_entry``
    (kept nothing), so no image is in two splits. Problems: each part's, in part order,
    then the merge's.
    """
    names: dict[int, tuple[str, str]] = {}
    by_path: dict[str, str] = {}
    images: list[ImageAnnotations] = []
    problems: list[AnnotationProblem] = [p for _, part in parts for p in part.problems]
    for split, part in parts:
        clashes = set()
        for label, text in part.label_map.items:
            if label not in names:
                names[label] = (text, split)
            elif names[label][0] != text:
                clashes.add(label)
        for image in part.images:
            if image.path in by_path:
                problems.append(AnnotationProblem(
                    image.source, "bad_image_entry",
                    f"the image is also listed in split {by_path[image.path]}: left out of split {split}",
                    image.path, "nothing"))
                continue
            by_path[image.path] = split
            kept = []
            for obj in image.objects:
                if obj.label in clashes:
                    problems.append(AnnotationProblem(
                        obj.source, "unknown_category",
                        f"category {obj.label} has another name in split {split} than in split "
                        f"{names[obj.label][1]}: object dropped", image.path, "image"))
                else:
                    kept.append(obj)
            images.append(dataclasses.replace(image, split=split, objects=tuple(kept)))
    label_map = LabelMap(tuple((label, names[label][0]) for label in sorted(names)))
    images.sort(key=lambda image: image.path)
    return Annotated(layout="coco", images=tuple(images), label_map=label_map, problems=tuple(problems))


def _load(data: bytes, name: str) -> dict | AnnotationProblem:
    """The parsed document, or the one problem saying why there is none."""
    def refused(detail: str) -> AnnotationProblem:
        return AnnotationProblem(name, "bad_annotation_file", detail, "", "nothing")

    try:
        document = json.loads(data)
    except json.JSONDecodeError as exc:
        return refused(f"not valid JSON (line {exc.lineno}, column {exc.colno}; {len(data)} bytes)")
    except (ValueError, RecursionError):
        return refused(f"not valid JSON text ({len(data)} bytes)")
    if not isinstance(document, dict):
        return refused("not a COCO instances file: the top level is not a JSON object")
    missing = [key for key in _SECTIONS if not isinstance(document.get(key), list)]
    if missing:
        return refused("not a COCO instances file: no list " + ", ".join(f"'{k}'" for k in missing))
    return document


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    """A finite number (an integer too large for a float is not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _relative_path(file_name: object) -> str | None:
    """``file_name`` as a ``/``-separated path inside the images folder, or ``None``."""
    if not isinstance(file_name, str) or file_name.startswith("/") or "\x00" in file_name:
        return None
    parts = [part for part in file_name.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def _ring(values: object, limit: float) -> tuple[tuple[float, ...] | None, str]:
    """A polygon ring as floats, or ``None`` and why not (``limit``: ``coordinate_limit``)."""
    if not isinstance(values, list):
        return None, "a ring that is not a list of numbers"
    if len(values) < 6:
        return None, "a ring with fewer than three points"
    if len(values) % 2:
        return None, "a ring with an odd count of numbers"
    if not set(map(type, values)) <= _NUMBERS:
        return None, "a ring with a value that is not a number"
    if not _finite(sum(values)):  # a NaN or an infinity makes the sum one
        return None, "a ring with a value that is not a finite number"
    if max(map(abs, values)) > limit:
        return None, f"a ring with a point farther than {limit:g} pixels from the image"
    return tuple(map(float, values)), ""


def _polygons(rings: list, stated: tuple[int, int] | None) -> tuple[Polygons | None, str]:
    limit = coordinate_limit(stated[1], stated[0]) if stated else math.inf
    kept, why = [], ""
    for values in rings:
        ring, reason = _ring(values, limit)
        if ring is None:
            why = why or reason
        else:
            kept.append(ring)
    detail = f"{len(rings) - len(kept)} of {len(rings)} polygon rings left out ({why})" if why else ""
    return (Polygons(tuple(kept)) if kept else None), detail


def _rle(segmentation: dict, stated: tuple[int, int] | None) -> tuple[Rle | None, str]:
    size, counts = segmentation.get("size"), segmentation.get("counts")
    if not (isinstance(size, list) and len(size) == 2 and all(_whole(v) and v > 0 for v in size)):
        return None, "RLE left out: its size is not two positive integers"
    height, width = size
    if stated is not None and (width, height) != stated:
        return None, f"RLE left out: its size {height}x{width} is not the image's {stated[1]}x{stated[0]}"
    if isinstance(counts, str):
        try:
            runs = rle_from_string(counts)
        except MaskError as exc:
            return None, f"RLE left out: {exc}"
    elif isinstance(counts, list) and all(_whole(v) and v >= 0 for v in counts):
        runs = tuple(counts)
    else:
        return None, "RLE left out: its counts are neither a string nor a list of whole numbers"
    if sum(runs) != height * width:
        return None, f"RLE left out: its runs cover {sum(runs)} pixels, not {height}x{width}"
    return Rle(size=(height, width), counts=runs), ""


def _segmentation(value: object, stated: tuple[int, int] | None) -> tuple[Polygons | Rle | None, str]:
    """The object's segmentation and, when something of it was left out, why."""
    if value is None or value == []:
        return None, ""
    if isinstance(value, list):
        return _polygons(value, stated)
    if isinstance(value, dict):
        return _rle(value, stated)
    return None, "segmentation left out: neither polygons nor an RLE"


@dataclasses.dataclass(frozen=True)
class _Image:
    """An image entry taken: its record-to-be and the objects gathered for it."""

    annotations: ImageAnnotations
    objects: list


class _Reading:
    """One file's reading: what has been taken so far, and the problems met."""

    def __init__(self, name: str, exists: Callable[[str], bool] | None) -> None:
        self.name = name
        self.exists = exists
        self.problems: list[AnnotationProblem] = []
        self.labels: dict[int, str] = {}
        self.by_id: dict[object, _Image] = {}
        self.left_out: set[object] = set()  # ids of images refused: their objects go with them
        self.repeats: dict[object, str] = {}  # ids of entries repeating a file_name: that file

    def problem(self, source: str, reason: str, detail: str, image: str = "", kept: str = "image") -> None:
        self.problems.append(AnnotationProblem(source, reason, detail, image, kept))

    def categories(self, entries: list) -> None:
        for index, entry in enumerate(entries):
            label = entry.get("id") if isinstance(entry, dict) else None
            text = entry.get("name") if isinstance(entry, dict) else None
            source = f"{self.name}: category {label}" if _whole(label) else f"{self.name}: category entry {index}"
            if not (_whole(label) and isinstance(text, str) and text):
                self.problem(source, "unknown_category", "category entry without an integer id and a name: "
                             "left out (its objects are unknown_category)")
            elif label in self.labels:
                self.problem(source, "unknown_category", f"category id {label} repeated: the first entry stands")
            else:
                self.labels[label] = text

    def images(self, entries: list) -> None:
        seen: set[object] = set()
        paths: set[str] = set()
        for index, entry in enumerate(entries):
            fields = entry if isinstance(entry, dict) else {}
            image_id = fields.get("id")
            valid_id = _whole(image_id) or (isinstance(image_id, str) and image_id != "")
            repeated = valid_id and image_id in seen
            seen.add(image_id if valid_id else None)
            source = f"{self.name}: image {image_id}" if _whole(image_id) else f"{self.name}: image entry {index}"
            path = _relative_path(fields.get("file_name"))
            size = self._stated_size(fields)
            why = ("it has no usable id" if not valid_id
                   else "its id repeats an earlier image's" if repeated
                   else "its file_name is not a relative path inside the images folder" if path is None
                   else "its file_name repeats an earlier image's" if path in paths
                   else f"its width and height are not whole numbers from 1 to {_MAX_SIDE}" if size is False else "")
            if why:
                # A second entry for a file the first one converts refuses no image.
                kept = "image" if valid_id and not repeated and path is not None and path in paths else "nothing"
                self.problem(source, "bad_image_entry", f"image entry {index} left out: {why}", path or "", kept)
                if valid_id and not repeated:
                    self.left_out.add(image_id)
                    if path in paths:
                        self.repeats[image_id] = path
                continue
            if self.exists is not None and not self.exists(path):
                self.problem(source, "image_not_found", "no such file in the images folder", path, "nothing")
                self.left_out.add(image_id)
                continue
            paths.add(path)
            record = ImageAnnotations(path=path, source_id=str(image_id), stated_size=size, source=source)
            self.by_id[image_id] = _Image(record, [])

    @staticmethod
    def _stated_size(entry: dict) -> tuple[int, int] | None | bool:
        """``(width, height)``; ``None`` when neither is given; ``False`` when unusable."""
        width, height = entry.get("width"), entry.get("height")
        if width is None and height is None:
            return None
        if _whole(width) and _whole(height) and 0 < width <= _MAX_SIDE and 0 < height <= _MAX_SIDE:
            return (width, height)
        return False

    def annotations(self, entries: list) -> None:
        for index, entry in enumerate(entries):
            ann_id = entry.get("id") if isinstance(entry, dict) else None
            source = f"{self.name}: annotation {ann_id}" if _whole(ann_id) else f"{self.name}: annotation entry {index}"
            if not isinstance(entry, dict):
                self.problem(source, "bad_label_line", "annotation entry is not a JSON object", kept="nothing")
                continue
            image_id = entry.get("image_id")
            known = _whole(image_id) or isinstance(image_id, str)
            image = self.by_id.get(image_id) if known else None
            if image is None:
                if known and image_id in self.repeats:  # Its image is converted, by the first entry.
                    self.problem(source, "bad_image_entry", f"its image entry (image {image_id}) repeats "
                                 "an earlier entry's file_name and was left out: object dropped",
                                 self.repeats[image_id])
                elif not known or image_id not in self.left_out:
                    shown = f"image_id {image_id}" if _whole(image_id) else "its image_id"
                    self.problem(source, "unknown_image_id", f"{shown} is not in images", kept="nothing")
                continue
            path = image.annotations.path
            obj = self._object(entry, source, path, image.annotations.stated_size)
            if obj is not None:
                image.objects.append(obj)

    def _object(self, entry: dict, source: str, path: str,
                stated: tuple[int, int] | None) -> ObjectAnnotation | None:
        label = entry.get("category_id")
        if not _whole(label) or label not in self.labels:
            shown = f"category_id {label}" if _whole(label) else "its category_id"
            self.problem(source, "unknown_category", f"{shown} is not in categories: object dropped", path)
            return None
        bbox = entry.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_finite(v) for v in bbox)):
            self.problem(source, "box_not_finite",
                         "bbox is missing or not four finite numbers: object dropped", path)
            return None
        x, y, w, h = (float(v) for v in bbox)
        segmentation, detail = _segmentation(entry.get("segmentation"), stated)
        if detail:
            self.problem(source, "segmentation_invalid", detail + "; object kept", path)
        area = entry.get("area")
        return ObjectAnnotation(
            box=(x, y, x + w, y + h), label=label, text=self.labels[label],
            is_crowd=entry.get("iscrowd") == 1, area=float(area) if _finite(area) else None,
            segmentation=segmentation, source=source)

    def result(self) -> Annotated:
        images = sorted(
            (dataclasses.replace(image.annotations, objects=tuple(image.objects)) for image in self.by_id.values()),
            key=lambda image: image.path)
        label_map = LabelMap(tuple(sorted(self.labels.items())))
        return Annotated(layout="coco", images=tuple(images), label_map=label_map, problems=tuple(self.problems))
