"""The listing of an annotated layout: a reader's ``Annotated`` and the files found, to
the ``Listing`` the pipeline converts and the ``AnnotatedRun`` its plan carries.

Pure (issue 21): the caller lists the files and runs the reader (``transforms.
annotated_inputs``). One ``ImageRef`` per image kept, its annotations in
``ImageRef.annotation`` (``codec.annotation_bytes``), ``label`` -1 and ``label_text``
'' (the classes travel in the annotations), ``filename`` the image's path relative to
the input root (as ``image/filename`` holds it), ``split`` the layout's (VOC's
ImageSets, YOLO's folders, COCO's file per split) or, for an image the layout puts in
none, the run's ``--splits`` hashed by that path (``quality.splits``; every object of
an image goes with it), else ``train``.

What the annotations did not give as they are:

* a problem that keeps nothing (``AnnotationProblem.kept == "nothing"``: an annotation
  for a file that does not exist, an image without its annotation file or mask, a file
  that does not parse, ...) is a dead letter of the listing (stage ``list``, error the
  reason, source the annotation's file, line or id): when it names an image, the error
  budget counts it as one bad input, like the listing's other dead letters; one that
  names no image (a COCO annotation whose ``image_id`` is unknown, a CSV row without an
  image) refuses no image: it is passed over like an object left out (below), and so
  is an image the layout passes over (``PASSED_OVER_REASONS``: an image without a mask
  under ``--masks``, as COCO's images its file does not name; not converted, named in
  ``dead_letter/skipped.jsonl``, not counted by the budget);
* a problem whose image is kept (an object dropped, a split conflict, a segmentation
  left out) is NOT a bad input: it is written to ``dead_letter/skipped.jsonl`` with
  the paths passed over (``Listing.skipped``, which the budget does not count) and
  counted by reason in ``AnnotatedRun.problems``;
* an image without objects (no boxes, labels or mask) is kept and counted
  (``images_without_objects``), or with ``drop_empty`` left out and counted
  (``dropped_empty``).

Semantic masks (``read_mask_folder``): every image under ``--input`` is paired with the
PNG of the same relative path and stem under ``--masks``; an image without one is
passed over (``mask_not_found``: not converted, not a bad input). Its label map comes
from ``--labels``: the class on line ``i`` (from 0, as labels files number classes) is mask value ``i``, so line 0 is
usually the background; without ``--labels`` the map is empty (every mask value but 0
and 255 is then counted as outside the classes).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.annotations import (
    Annotated,
    AnnotatedRun,
    AnnotationProblem,
    ImageAnnotations,
    LabelMap,
)
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.transforms.codec.annotation_bytes import encode_annotations
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.plan.layouts import DEFAULT_SPLIT, Listing
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from beam_tfrecords.transforms.quality.splits import split_of

__all__ = ["PASSED_OVER_REASONS", "AnnotatedSummary", "ExifNote", "FoundImage", "annotated_listing", "annotation_parts",
           "mask_label_map", "passed_over", "read_mask_folder", "relabeled", "unstated_sizes"]


@dataclasses.dataclass(frozen=True)
class FoundImage:
    """An image file an annotation names: where to read it, its size in bytes, and for a
    ``gs://`` object the generation and CRC-32C it was listed with (it is read at them)."""

    path: str
    size: int
    generation: int = 0
    crc32c: int = -1


@dataclasses.dataclass(frozen=True)
class AnnotatedSummary:
    """What the plan says of an annotated listing (``Listing.annotated``).

    Attributes:
      run: what the pipeline and the commit need (``RunPlan.annotated``).
      objects_per_class: ``((class name, objects), ...)`` of the images kept, most first.
      objects: objects of the images kept.
      unnamed: image files under the input the annotations do not name (not converted;
        COCO and masks' folders only).
      normalized_boxes: every box value is at most 1 while pixels were assumed.
      notes: more lines for the plan (``note: ...``): e.g. the folder COCO's images
        were found in, a category id 0 left out of the label map.
      exif: the images whose annotations state no size and whose EXIF orientation
        is not 1 (``ExifNote``), or ``None`` (none, or not read).
    """

    run: AnnotatedRun
    objects_per_class: tuple[tuple[str, int], ...] = ()
    objects: int = 0
    unnamed: int = 0
    normalized_boxes: bool = False
    notes: tuple[str, ...] = ()
    exif: ExifNote | None = None


@dataclasses.dataclass(frozen=True)
class ExifNote:
    """What the plan says of images with an EXIF orientation other than 1 whose
    annotations state no size (stored as in the file, boxes as given; TensorFlow's
    decoders ignore EXIF orientation).

    Attributes:
      images: how many (read on the launcher), 0 when ``on_workers``.
      names: their paths as the annotations name them, sorted (the first few).
      read: how many images without a stated size were read for it.
      on_workers: not read here (a ``gs://`` input): the workers count them.
    """

    images: int = 0
    names: tuple[str, ...] = ()
    read: int = 0
    on_workers: bool = False


def unstated_sizes(annotated: Annotated, found: Mapping[str, FoundImage]) -> list[tuple[str, str]]:
    """``(path as the annotations name it, file)`` of the images found whose annotations
    state no size, by path (several labels per image left out: no geometry)."""
    if annotated.layout == "multi_label":
        return []
    return sorted((image.path, found[image.path].path) for image in annotated.images
                  if image.stated_size is None and image.path in found)


def _letter(problem: AnnotationProblem) -> DeadLetter:
    where = f" (image {problem.image})" if problem.image and problem.image not in problem.source else ""
    kept = ("not converted: " if problem.reason in PASSED_OVER_REASONS else
            "" if problem.kept == "nothing" else "image kept: ")
    return DeadLetter(problem.source or problem.image or "annotations", "list", problem.reason,
                      f"{kept}{problem.detail}{where}")


# Reasons an image is passed over, not refused: the input holds more images than the
# layout converts (VOC2012's 17k images, of which ~2.9k have a segmentation mask).
PASSED_OVER_REASONS = ("mask_not_found",)


def passed_over(problem: AnnotationProblem) -> bool:
    """A problem that is no bad input (the error budget counts bad images): an annotation
    that names no image (a COCO annotation whose image id is in no image entry, a CSV
    row that names no image, a VOC split file's id with neither an XML nor an
    image), or an image the layout passes over (``--masks``: an image
    without a mask is not converted, as COCO's images its file does not name)."""
    return (not problem.image and problem.reason in ("unknown_image_id", "bad_label_line", "annotation_not_found")) or (
        problem.reason in PASSED_OVER_REASONS)


def _empty(image: ImageAnnotations) -> bool:
    return not image.objects and not image.labels and not image.mask


def _split(image: ImageAnnotations, filename: str, splits: Sequence[tuple[str, float]]) -> str:
    if image.split:
        return image.split
    return split_of(filename, splits) if splits else DEFAULT_SPLIT


def annotated_listing(annotated: Annotated, found: Mapping[str, FoundImage], *,
                      splits: Sequence[tuple[str, float]] = (), drop_empty: bool = False,
                      instance_masks: bool = False, mask_root: str = "", unnamed: int = 0,
                      normalized_boxes: bool = False) -> Listing:
    """The ``Listing`` of an annotated layout; its ``annotated`` is an ``AnnotatedSummary``.

    Args:
      annotated: what the layout's reader returned.
      found: ``{image path as the annotations name it: FoundImage}`` of the images that
        exist (an image the annotations name that is missing here is dead-lettered,
        ``image_not_found``).
      splits: the run's ``--splits``, for images the layout puts in no split.
      drop_empty: leave out images without objects.
      instance_masks, mask_root: for ``AnnotatedRun``.
      unnamed, normalized_boxes: for ``AnnotatedSummary``.
    """
    # An image refused is a bad input; an annotation that names no image is not (the
    # error budget counts images): it is passed over, with the objects left out.
    dead = [_letter(p) for p in annotated.problems if p.kept == "nothing" and not passed_over(p)]
    kept_problems = [p for p in annotated.problems if p.kept != "nothing" or passed_over(p)]
    refs, classes = [], Counter()
    without, dropped, missing = 0, 0, 0
    for image in annotated.images:
        where = found.get(image.path)
        if where is None:
            dead.append(DeadLetter(image.source or image.path, "list", "image_not_found",
                                   f"the annotations name image {image.path}, which does not exist"))
            missing += 1
            continue
        if _empty(image):
            if drop_empty:
                dropped += 1
                continue
            without += 1
        # As a CSV manifest's image/filename: the cell as written, file:// and a leading / dropped.
        filename = image.path[len("file://"):] if image.path.startswith("file://") else image.path
        filename = filename.lstrip("/")
        split = _split(image, filename, splits)
        classes.update(o.text for o in image.objects)
        classes.update(image.texts)
        refs.append(ImageRef(split=split, key=stable_key(split, filename), filename=filename,
                             path=where.path, size=where.size, label=-1, label_text="",
                             generation=where.generation, crc32c=where.crc32c,
                             annotation=encode_annotations(image)))
    refs.sort(key=lambda r: r.filename)
    reasons = Counter(p.reason for p in annotated.problems)
    reasons.update(d.error for d in dead[len(dead) - missing:])  # The images found missing here.
    run = AnnotatedRun(layout=annotated.layout, label_map=annotated.label_map,
                       instance_masks=instance_masks, mask_root=mask_root,
                       problems=tuple(sorted(reasons.items())),
                       images_without_objects=without if annotated.layout != "masks" else 0,
                       dropped_empty=dropped)
    listing = Listing(annotated.layout, refs, [name for _, name in annotated.label_map.items],
                      dead_letters=dead, skipped=[_letter(p) for p in kept_problems])
    assigned = sorted({image.split for image in annotated.images if image.split})
    listing.split_source = (f"the {annotated.layout.upper()} layout ({', '.join(assigned)})" if assigned
                            else "--splits, by path" if splits else "")
    listing.annotated = AnnotatedSummary(
        run, tuple(sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))),
        sum(classes.values()) if annotated.layout != "multi_label" else 0, unnamed, normalized_boxes)
    return listing


def mask_label_map(names: Sequence[str] | None) -> LabelMap:
    """The label map of semantic masks: the class on line ``i`` of ``--labels`` is mask
    value ``i`` (from 0); none given: empty."""
    return LabelMap(tuple(enumerate(names or ())))


def read_mask_folder(images: Iterable[str], masks: Iterable[str],
                     label_map: LabelMap = LabelMap(())) -> Annotated:
    """Semantic masks: each image (paths relative to the input root) with the mask of
    the same relative path and stem, ``.png`` (paths relative to the mask root).

    An image without one is ``mask_not_found`` (kept nothing; the listing passes it
    over, ``PASSED_OVER_REASONS``); masks without an image are not read.
    """
    masks = set(masks)
    found, problems = [], []
    for path in sorted(p for p in images if is_image_filename(p)):
        mask = posixpath.splitext(path)[0] + ".png"
        if mask in masks:
            found.append(ImageAnnotations(path=path, source_id=path, mask=mask, source=mask))
        else:
            problems.append(AnnotationProblem(source=path, reason="mask_not_found",
                                              detail=f"no mask {mask} under --masks", image=path,
                                              kept="nothing"))
    return Annotated(layout="masks", images=tuple(found), label_map=label_map, problems=tuple(problems))


def relabeled(annotated: Annotated, names: Sequence[str] | LabelMap) -> Annotated:
    """``annotated`` numbered by a labels file (``--labels``: the class on line ``i``,
    from 0, gets id ``i + 1``; 0 is the background) or by a ``LabelMap`` (a
    ``label_map.pbtxt``'s ids): an object or label of a class the file does not name
    is left out, its image kept (``unknown_category``)."""
    label_map = names if isinstance(names, LabelMap) else LabelMap(tuple(enumerate(names, start=1)))
    ids = {name: label for label, name in label_map.items}
    images, problems = [], list(annotated.problems)
    for image in annotated.images:
        sources = [o.source for o in image.objects if o.text not in ids]
        sources += [image.source for t in image.texts if t not in ids]
        problems.extend(AnnotationProblem(source=where or image.source, reason="unknown_category",
                                          detail="its class is not in --labels", image=image.path)
                        for where in sources)
        objects = tuple(dataclasses.replace(o, label=ids[o.text]) for o in image.objects if o.text in ids)
        texts = tuple(t for t in image.texts if t in ids)
        images.append(dataclasses.replace(image, objects=objects, texts=texts,
                                          labels=tuple(ids[t] for t in texts)))
    return Annotated(annotated.layout, tuple(images), label_map, tuple(problems))


def annotation_parts(text: str) -> tuple[tuple[str, str], ...]:
    """``--annotations``: ``((split, path), ...)``; a single path is ``(("", path),)``.

    Raises:
      ValueError: when a part of ``split=path,...`` is not one, or a split name
        cannot name a shard file, or is given twice.
    """
    head = text.split(",", 1)[0]
    if "=" not in head or "/" in head.split("=", 1)[0]:
        return (("", text),)
    parts = []
    for part in text.split(","):
        split, sep, path = part.partition("=")
        split, path = split.strip(), path.strip()
        if not sep or not path or not is_valid_split_name(split):
            raise ValueError(f"--annotations: {part!r} is not SPLIT=FILE (e.g. train=a.json,"
                             "validation=b.json; split names of letters, digits, '_' and '.')")
        parts.append((split, path))
    if len({s for s, _ in parts}) != len(parts):
        raise ValueError("--annotations names a split twice")
    return tuple(parts)
