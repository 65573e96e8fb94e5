"""One image's annotations as record features, after the geometry its pixels went through.

The record builder (``image_records``) tells an attachment's ``follow`` the
``Geometry`` it applied (an EXIF orientation's turns first, a reshape's scale, crop
or pad, then turns and a flip);
``detection_features`` turns one ``ImageAnnotations`` into the features TF Model
Garden's ``TfExampleDecoder`` and the Object Detection API read
(``schemas.annotations.DETECTION_KEYS``), in the stored image's frame:

- boxes: normalized ones are made pixels with the size of the picture they were
  drawn on (the frame: the stored image, or the displayed one when the image is
  stored turned for its EXIF orientation, see ``codec.orientation``); mapped to
  the stored pixels, through the geometry, clipped to the output image (counted
  ``box_clipped``); an object left without area is dropped (``box_empty``, an
  ``AnnotationProblem``, the image kept); the rest normalized by the output's
  size, float32, in the annotations' order. ``image/object/area`` is in output
  pixels: the given area (COCO's) times the scale factors (and times the share of
  the box a clip kept), else the box's;
- instance masks (``instance_masks``): each object's segmentation rendered at the
  frame's size by the ``render`` given (``render(segmentation, height, width)`` ->
  a 0/1 ``uint8`` array; an object without one gets its box filled, counted
  ``mask_from_box``; one the renderer refuses, an RLE of another size or a bad
  ring, is an empty mask, counted ``segmentation_invalid``, the object kept),
  moved like the pixels with nearest neighbour (a mask stays
  0/1), one PNG each (mode ``L``, values 0 and 1);
- a semantic mask (PNG bytes): its size must be the frame's (else
  ``mask_size_mismatch``: the image is refused), moved with nearest neighbour,
  padding ``mask_pad`` (0, the background, by default); pixel values that are not
  a class of the label map nor 0 are counted (``mask_pixels_outside_classes``; not
  without a label map: no class is named), and 255 (the usual "ignore") apart (``mask_pixels_ignore``), in the source mask;
- ``image/source_id``.

Several labels per image (``image/class/label`` and ``text``) are the builder's
reserved keys: ``AnnotationAttach`` gives them as ``Attachment.labels``; such a
record holds no per-object key (``objects=False``, or labels and no object).

Pure (numpy and Pillow), no Beam, no I/O.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable

import numpy as np
from PIL import Image

from beam_tfrecords.schemas.annotations import AnnotationProblem, ImageAnnotations, LabelMap, ObjectAnnotation
from beam_tfrecords.transforms.codec.orientation import Orienting
from beam_tfrecords.transforms.io.image_records import Geometry

__all__ = [
    "DetectionFeatures",
    "Render",
    "detection_features",
    "frame_geometry",
    "moved_mask",
    "png_bytes",
    "source_point",
]

Render = Callable[[object, int, int], np.ndarray]
Feature = tuple[str, str, object]
# A coordinate moved by less than this by clipping is not counted as clipped (float noise).
_CLIP_TOLERANCE = 1e-6
_PNG_LEVEL = 6
_IGNORE = 255
_MASK_MODES = ("1", "L", "P", "I;16", "I")


@dataclasses.dataclass(frozen=True)
class DetectionFeatures:
    """What ``detection_features`` gives for one image.

    Attributes:
      features: ``((key, dtype, values), ...)`` with ``values`` a tuple (a list
        feature; empty lists for an image without objects), as ``Attachment``
        features are.
      counts: ``((reason, n), ...)``, only reasons with ``n > 0``.
      problems: objects dropped (``box_empty``, ``box_not_finite``), the image kept.
      refused: a problem that refuses the whole image (``mask_size_mismatch``,
        ``bad_mask``; ``kept`` is ``"nothing"``), else ``None``: then ``features``
        is empty.
      objects: per object written, ``(class id, its box's area in output pixels)``
        (the box's, not COCO's ``area``: the statistics' size ranges).
      mask_classes: per class of the label map (0, the background, left out) the
        written semantic mask holds, ``(class id, its pixels)``, in id order.
    """

    features: tuple[Feature, ...] = ()
    counts: tuple[tuple[str, int], ...] = ()
    problems: tuple[AnnotationProblem, ...] = ()
    refused: AnnotationProblem | None = None
    objects: tuple[tuple[int, float], ...] = ()
    mask_classes: tuple[tuple[int, int], ...] = ()


def source_point(geometry: Geometry, x, y):
    """The inverse of ``Geometry.map_point``: a point of the output, in the source's
    coordinates (numbers or numpy arrays)."""
    x, y, width, height = _unturned(x, y, geometry.output, geometry.turns, geometry.flip)
    x = (x - geometry.pad[0] + geometry.crop[0]) / geometry.scale[0]
    y = (y - geometry.pad[1] + geometry.crop[1]) / geometry.scale[1]
    source = geometry.source
    shown = source[::-1] if geometry.first_turns % 2 else source
    x, y, _, _ = _unturned(x, y, shown, geometry.first_turns, geometry.first_flip)
    return x, y


def _unturned(x, y, size: tuple[int, int], turns: int, flip: bool):
    """Undoes ``turns`` clockwise quarter turns then a flip that made a ``size``
    frame: ``(x, y, width, height)`` in the frame before them."""
    width, height = size
    if flip:
        x = width - x
    for _ in range(turns % 4):
        # Undo one clockwise turn: (x, y) of a (width, height) frame came from
        # (y, width - x) of the (height, width) one before it.
        x, y, width, height = y, width - x, height, width
    return x, y, width, height


def frame_geometry(stored: tuple[int, int], orienting: Orienting | None) -> Geometry:
    """The geometry from the stored pixels to the picture the annotations were drawn
    on (the EXIF turns when the image is stored turned; else none)."""
    if orienting is None or not (orienting.turns % 4 or orienting.flip):
        return Geometry(tuple(stored), tuple(stored))
    return Geometry(tuple(stored), tuple(orienting.frame), turns=orienting.turns % 4, flip=orienting.flip)


def _sampled(geometry: Geometry, frame: Geometry, along_x: bool) -> tuple[np.ndarray, np.ndarray]:
    """Frame coordinates of the output pixel centres along its first row (``along_x``)
    or its first column: ``(fx, fy)`` arrays."""
    width, height = geometry.output
    if along_x:
        xs, ys = np.arange(width) + 0.5, np.full(width, 0.5)
    else:
        xs, ys = np.full(height, 0.5), np.arange(height) + 0.5
    return frame.map_point(*source_point(geometry, xs, ys))


def _indices(coords: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    index = np.floor(coords).astype(np.int64)
    valid = (index >= 0) & (index < size)
    return np.where(valid, index, 0), valid


def moved_mask(mask: np.ndarray, geometry: Geometry, frame: Geometry | None = None,
               fill: int = 0) -> np.ndarray:
    """A mask drawn on the frame (``frame.output`` sized; the stored image when
    ``frame`` is ``None``), as the pixels were moved: each output pixel takes the
    mask's value at its centre's source position (nearest neighbour, never
    interpolated), ``fill`` where that falls outside (a pad).

    The geometry only scales, shifts, turns and mirrors, so each output column maps
    to one frame column (or row, when the turns swap the axes): sampled per axis.
    """
    frame = frame or Geometry(geometry.source, geometry.source)
    frame_w, frame_h = frame.output
    if mask.shape[:2] != (frame_h, frame_w):
        raise ValueError(f"a mask of {mask.shape[1]}x{mask.shape[0]} for a {frame_w}x{frame_h} frame")
    swapped = (geometry.first_turns + geometry.turns + frame.turns) % 2 == 1
    row_x, row_y = _sampled(geometry, frame, along_x=True)  # Output x varies.
    col_x, col_y = _sampled(geometry, frame, along_x=False)  # Output y varies.
    if not swapped:
        cols, cols_ok = _indices(row_x, frame_w)
        rows, rows_ok = _indices(col_y, frame_h)
        out = mask[np.ix_(rows, cols)]
    else:
        rows, cols_ok = _indices(row_y, frame_h)  # Output x walks the frame's rows.
        cols, rows_ok = _indices(col_x, frame_w)
        out = mask[np.ix_(rows, cols)].T.copy()
    out[~rows_ok, :] = fill
    out[:, ~cols_ok] = fill
    return np.ascontiguousarray(out)


def png_bytes(array: np.ndarray) -> bytes:
    """A 2-D ``uint8`` (mode ``L``) or ``uint16`` array as PNG bytes (deterministic)."""
    out = io.BytesIO()
    Image.fromarray(array).save(out, format="PNG", compress_level=_PNG_LEVEL)
    return out.getvalue()


@dataclasses.dataclass
class _Boxes:
    """The kept objects' columns, filled object by object."""

    xmin: list = dataclasses.field(default_factory=list)
    ymin: list = dataclasses.field(default_factory=list)
    xmax: list = dataclasses.field(default_factory=list)
    ymax: list = dataclasses.field(default_factory=list)
    area: list = dataclasses.field(default_factory=list)
    box_area: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)
    clipped: int = 0
    problems: list = dataclasses.field(default_factory=list)

    def features(self) -> tuple[Feature, ...]:
        objects = self.kept
        return (
            ("image/object/bbox/xmin", "float32", tuple(self.xmin)),
            ("image/object/bbox/ymin", "float32", tuple(self.ymin)),
            ("image/object/bbox/xmax", "float32", tuple(self.xmax)),
            ("image/object/bbox/ymax", "float32", tuple(self.ymax)),
            ("image/object/class/label", "int64", tuple(o.label for o in objects)),
            ("image/object/class/text", "string", tuple(o.text for o in objects)),
            ("image/object/is_crowd", "int64", tuple(int(o.is_crowd) for o in objects)),
            ("image/object/area", "float32", tuple(self.area)),
            ("image/object/difficult", "int64", tuple(int(o.difficult) for o in objects)),
            ("image/object/truncated", "int64", tuple(int(o.truncated) for o in objects)),
        )


def _dropped(annotations: ImageAnnotations, obj: ObjectAnnotation, reason: str, detail: str) -> AnnotationProblem:
    return AnnotationProblem(obj.source or annotations.source, reason, detail, annotations.path, "image")


def _frame_box(obj: ObjectAnnotation, units: str, frame: tuple[int, int]) -> tuple[float, ...]:
    if units == "normalized":
        width, height = frame
        return (obj.box[0] * width, obj.box[1] * height, obj.box[2] * width, obj.box[3] * height)
    return tuple(float(v) for v in obj.box)


def _output_box(box: tuple[float, ...], geometry: Geometry, frame: Geometry) -> tuple[float, ...]:
    """A frame box mapped to the stored pixels, then through the geometry."""
    (x0, y0), (x1, y1) = (source_point(frame, box[0], box[1]), source_point(frame, box[2], box[3]))
    return geometry.map_box((x0, y0, x1, y1))


def _no_area(box: tuple[float, ...]) -> str:
    """Why a box as given has no area: swapped coordinates are named (never swapped back)."""
    swapped = [f"{lo} > {hi}" for lo, hi, low, high in (("xmin", "xmax", box[0], box[2]),
                                                          ("ymin", "ymax", box[1], box[3])) if low > high]
    if swapped:
        return f"the coordinates are swapped ({', '.join(swapped)}): the box has no area as given"
    return "the box has no area as given"


def _add_object(boxes: _Boxes, annotations: ImageAnnotations, obj: ObjectAnnotation,
                geometry: Geometry, frame: Geometry) -> bool:
    """Maps, clips and adds one object; records why when it is dropped."""
    if not obj.finite():
        boxes.problems.append(_dropped(annotations, obj, "box_not_finite",
                                       "a box coordinate is not a finite number"))
        return False
    box = _frame_box(obj, annotations.units, frame.output)
    width, height = geometry.output
    if box[2] <= box[0] or box[3] <= box[1]:
        boxes.problems.append(_dropped(annotations, obj, "box_empty", _no_area(box)))
        return False
    moved = _output_box(box, geometry, frame)
    clipped = (min(max(moved[0], 0.0), width), min(max(moved[1], 0.0), height),
               min(max(moved[2], 0.0), width), min(max(moved[3], 0.0), height))
    if clipped[2] <= clipped[0] or clipped[3] <= clipped[1]:
        boxes.problems.append(_dropped(annotations, obj, "box_empty",
                                       f"the box has no area inside the {width}x{height} stored image"))
        return False
    if max(abs(a - b) for a, b in zip(moved, clipped)) > _CLIP_TOLERANCE:
        boxes.clipped += 1
    kept_area = (clipped[2] - clipped[0]) * (clipped[3] - clipped[1])
    if obj.area is not None:
        share = kept_area / ((moved[2] - moved[0]) * (moved[3] - moved[1]))
        kept_area = float(obj.area) * geometry.scale[0] * geometry.scale[1] * share
    boxes.xmin.append(clipped[0] / width)
    boxes.ymin.append(clipped[1] / height)
    boxes.xmax.append(clipped[2] / width)
    boxes.ymax.append(clipped[3] / height)
    boxes.box_area.append((clipped[2] - clipped[0]) * (clipped[3] - clipped[1]))
    boxes.area.append(kept_area)
    boxes.kept.append(obj)
    return True


def _box_mask(box: tuple[float, ...], frame: tuple[int, int]) -> np.ndarray:
    """The pixels a box covers (any part of), as a 0/1 mask of the frame."""
    width, height = frame
    mask = np.zeros((height, width), dtype=np.uint8)
    x0, y0 = max(0, int(np.floor(box[0]))), max(0, int(np.floor(box[1])))
    x1, y1 = min(width, int(np.ceil(box[2]))), min(height, int(np.ceil(box[3])))
    mask[y0:y1, x0:x1] = 1
    return mask


def _instance_masks(annotations: ImageAnnotations, objects: list[ObjectAnnotation], geometry: Geometry,
                    frame: Geometry, render: Render) -> tuple[tuple[bytes, ...], int, int]:
    """One PNG per kept object, how many were filled from their box, and how many
    segmentations the renderer refused (an RLE of another size, a bad ring: the
    object kept with an empty mask, counted ``segmentation_invalid``)."""
    width, height = frame.output
    pngs, from_box, invalid = [], 0, 0
    for obj in objects:
        if obj.segmentation is None:
            drawn = _box_mask(_frame_box(obj, annotations.units, frame.output), frame.output)
            from_box += 1
        else:
            try:
                drawn = np.asarray(render(obj.segmentation, height, width))
            except ValueError:  # codec.masks.MaskError: this object's segmentation only.
                drawn, invalid = np.zeros((height, width), np.uint8), invalid + 1
            if drawn.shape != (height, width):
                raise ValueError(f"the mask renderer gave {drawn.shape}, not ({height}, {width})")
        moved = moved_mask((drawn > 0).astype(np.uint8), geometry, frame)
        pngs.append(png_bytes(moved))
    return tuple(pngs), from_box, invalid


def _mask_array(data: bytes) -> np.ndarray:
    """A semantic mask PNG's class values (palette indices for a palette PNG).

    Raises:
      ValueError: not a one-channel PNG (L, P, 1 or 16-bit grey).
    """
    with Image.open(io.BytesIO(data)) as im:
        if im.format != "PNG" or im.mode not in _MASK_MODES:
            raise ValueError(f"a {im.format} image of mode {im.mode}, not a one-channel PNG")
        array = np.asarray(im)
    if array.dtype == bool:
        return array.astype(np.uint8)
    if array.dtype != np.uint8:
        return array.astype(np.uint16)
    return array


def _mask_size(data: bytes) -> tuple[int, int] | None:
    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except Exception:  # noqa: BLE001 - Pillow raises many kinds for bytes that are no image.
        return None


def _semantic(annotations: ImageAnnotations, data: bytes, geometry: Geometry, frame: Geometry,
              label_map: LabelMap, pad: int) -> tuple[tuple[Feature, ...], dict, AnnotationProblem | None, tuple]:
    """The semantic mask's features, counts and classes (``DetectionFeatures.mask_classes``),
    or the problem that refuses the image."""
    size, where = _mask_size(data), annotations.mask or annotations.path
    if size is not None and size != tuple(frame.output):
        return (), {}, AnnotationProblem(
            where, "mask_size_mismatch",
            f"the mask is {size[0]}x{size[1]}, the image {frame.output[0]}x{frame.output[1]}",
            annotations.path, "nothing"), ()
    try:
        if size is None:
            raise ValueError("not an image Pillow can open")
        mask = _mask_array(data)
    except (ValueError, OSError, SyntaxError) as err:
        return (), {}, AnnotationProblem(where, "bad_mask", f"the mask ({len(data):,} bytes) is {err}",
                                         annotations.path, "nothing"), ()
    classes = np.array(sorted({0, *(label for label, _ in label_map.items)}), dtype=np.int64)
    known = np.isin(mask, classes)
    ignore = int(np.count_nonzero(mask == _IGNORE)) if _IGNORE not in classes else 0
    # Without a label map (``--masks`` without ``--labels``) no value is a named class:
    # nothing to count as outside them.
    outside = int(mask.size - np.count_nonzero(known)) - ignore if label_map.items else 0
    counts = {"mask_pixels_outside_classes": outside, "mask_pixels_ignore": ignore}
    moved = moved_mask(mask, geometry, frame, fill=pad)
    features = (("image/segmentation/class/encoded", "string", (png_bytes(moved),)),
                ("image/segmentation/class/format", "string", ("png",)))
    values, pixels = np.unique(moved, return_counts=True)
    named = {label for label, _ in label_map.items} - {0}
    present = tuple((int(v), int(n)) for v, n in zip(values, pixels) if int(v) in named)
    return features, counts, None, present


def detection_features(annotations: ImageAnnotations, geometry: Geometry, label_map: LabelMap, *,
                       orienting: Orienting | None = None, semantic: bytes | None = None,
                       instance_masks: bool = False, render: Render | None = None,
                       mask_pad: int = 0, objects: bool = True) -> DetectionFeatures:
    """One image's annotation features, in the stored image's frame (see the module).

    Args:
      annotations: the image's annotations (coordinates in the frame's pixels, or
        normalized by its size).
      geometry: what the record builder applied (``geometry.source`` is the stored
        image's true size; it holds ``orienting``'s turns when those were asked:
        first, before a reshape, else last).
      label_map: the classes (a semantic mask's values are checked against it).
      orienting: the EXIF decision (``codec.orientation.orient``): its frame is the
        picture the annotations were drawn on; ``None``: the stored image.
      semantic: the semantic mask's PNG bytes, or ``None``.
      instance_masks: write ``image/object/mask``, rendered by ``render``.
      render: ``render(segmentation, height, width)`` -> 0/1 ``uint8`` array.
      mask_pad: the semantic mask's value where the pixels were padded.
      objects: write the per-object keys (``False`` for several labels per image:
        none, even for an image without labels).

    Raises:
      ValueError: ``instance_masks`` without ``render``, or a renderer's bad output.
    """
    if instance_masks and render is None:
        raise ValueError("instance masks need a mask renderer")
    frame = frame_geometry(geometry.source, orienting)
    counts: dict[str, int] = {}
    mask_classes: tuple = ()
    source_id = annotations.source_id or annotations.path  # Model Garden's decoder needs one.
    features: tuple[Feature, ...] = (("image/source_id", "string", (source_id,)),)
    if semantic is not None:
        mask_features, counts, refused, mask_classes = _semantic(annotations, semantic, geometry, frame,
                                                                 label_map, mask_pad)
        if refused is not None:
            return DetectionFeatures(refused=refused)
        features += mask_features
    boxes = _Boxes()
    for obj in annotations.objects:
        _add_object(boxes, annotations, obj, geometry, frame)
    # Several labels per image: no object keys (an image of such a run without labels too).
    objects = objects and bool(annotations.objects or not annotations.labels)
    if objects:
        features += boxes.features()
    counts["box_clipped"] = boxes.clipped
    counts["box_empty"] = sum(p.reason == "box_empty" for p in boxes.problems)
    if instance_masks and objects:
        pngs, counts["mask_from_box"], counts["segmentation_invalid"] = _instance_masks(
            annotations, boxes.kept, geometry, frame, render)
        features += (("image/object/mask", "string", pngs),)
    return DetectionFeatures(features, tuple((k, n) for k, n in sorted(counts.items()) if n),
                             tuple(boxes.problems),
                             objects=tuple((o.label, area) for o, area in zip(boxes.kept, boxes.box_area)),
                             mask_classes=mask_classes)
