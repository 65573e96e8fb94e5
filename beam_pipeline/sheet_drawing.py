"""What a contact sheet draws over a thumbnail: a record's boxes and masks.

A record with ``image/object/bbox/{xmin,ymin,xmax,ymax}`` (normalized, see
``schemas.annotations.DETECTION_KEYS``) gets every box outlined (2 px, inside the
box) in its class's colour, captioned with ``image/object/class/text`` (or its
label id); ``image/object/mask`` (one PNG per object, 0/1) and
``image/segmentation/class/encoded`` (a PNG of class ids, 0 background, 255
ignored) tint their pixels with the class colour at 40 % opacity, under the boxes.
Colours come from ``PALETTE`` by class id. Everything is drawn on the thumbnail
after scaling, so boxes and masks scale with it.

A record without these keys is returned untouched. Bad annotations never raise:
a box whose four lists do not all hold it, or with a value that is not finite, is
skipped; values outside [0, 1] are clipped to the image; a mask that cannot be
decoded is skipped.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageDraw, UnidentifiedImageError

__all__ = ["PALETTE", "TINT_ALPHA", "annotate_thumbnail", "box_pixels", "class_colour"]

# A fixed palette of distinct colours, picked by class id modulo its length.
PALETTE = (
    (230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48),
    (145, 30, 180), (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212),
    (0, 128, 128), (170, 110, 40),
)
TINT_ALPHA = 102  # 40 % of 255.
_BOX_KEYS = tuple(f"image/object/bbox/{k}" for k in ("xmin", "ymin", "xmax", "ymax"))
_MASK_ERRORS = (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError)


def class_colour(label: int) -> tuple[int, int, int]:
    """The colour of class id ``label``."""
    return PALETTE[label % len(PALETTE)]


def box_pixels(box: tuple[float, float, float, float],
               size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """A normalized ``(xmin, ymin, xmax, ymax)`` as pixel corners ``(x0, y0, x1, y1)``
    (inclusive) of an image of ``size``, clipped to it; ``None`` when a value is
    not finite or the box is inverted."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in box):
        return None
    xmin, ymin, xmax, ymax = (min(1.0, max(0.0, float(v))) for v in box)
    if xmax < xmin or ymax < ymin:
        return None
    w, h = size
    return (round(xmin * (w - 1)), round(ymin * (h - 1)),
            round(xmax * (w - 1)), round(ymax * (h - 1)))


def _labels(features: dict) -> list:
    labels = features.get("image/object/class/label", [])
    return [v if isinstance(v, int) else 0 for v in labels]


def _label(labels: list, index: int) -> int:
    return labels[index] if index < len(labels) else index


def _decoded_mask(data, size: tuple[int, int]) -> Image.Image | None:
    """A one-channel PNG resized (nearest) to ``size``, or ``None`` if unreadable."""
    if not isinstance(data, bytes):
        return None
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.mode not in ("1", "L", "P", "I", "I;16"):
                return None
            values = np.asarray(image)  # Class ids or 0/1 (a palette PNG: its indices).
    except _MASK_ERRORS:
        return None
    if values.ndim != 2:
        return None
    mask = Image.fromarray(np.minimum(values, 255).astype(np.uint8))
    return mask.resize(size, Image.Resampling.NEAREST)


def _tint(thumb: Image.Image, alpha: Image.Image, colour: tuple[int, int, int]) -> None:
    thumb.paste(Image.new("RGB", thumb.size, colour), mask=alpha)


def _tint_masks(thumb: Image.Image, features: dict, labels: list) -> None:
    for index, data in enumerate(features.get("image/object/mask", [])):
        mask = _decoded_mask(data, thumb.size)
        if mask is not None:
            _tint(thumb, mask.point(lambda v: TINT_ALPHA if v else 0),
                  class_colour(_label(labels, index)))
    for data in features.get("image/segmentation/class/encoded", [])[:1]:
        mask = _decoded_mask(data, thumb.size)
        if mask is None:
            continue
        for _, value in sorted(mask.getcolors(256) or []):
            if value not in (0, 255):
                _tint(thumb, mask.point(lambda v, c=value: TINT_ALPHA if v == c else 0),
                      class_colour(value))


def _draw_boxes(thumb: Image.Image, features: dict, labels: list) -> None:
    lists = [features.get(key, []) for key in _BOX_KEYS]
    texts = features.get("image/object/class/text", [])
    draw = ImageDraw.Draw(thumb)
    for index, box in enumerate(zip(*lists)):
        corners = box_pixels(box, thumb.size)
        if corners is None:
            continue
        label = _label(labels, index)
        colour = class_colour(label)
        draw.rectangle(corners, outline=colour, width=2)
        text = texts[index] if index < len(texts) else b""
        text = text.decode("utf-8", "replace") if isinstance(text, bytes) else ""
        caption = "".join(c for c in (text or str(label)) if c.isprintable())[:12]
        draw.text((corners[0] + 3, corners[1] + 2), caption, fill=colour)


def annotate_thumbnail(thumb: Image.Image, features: dict) -> Image.Image:
    """Draws the record's masks, then its boxes, on ``thumb`` (RGB, in place) and
    returns it; a record without boxes or masks leaves it untouched."""
    has_boxes = any(features.get(key) for key in _BOX_KEYS)
    has_masks = bool(features.get("image/object/mask")
                     or features.get("image/segmentation/class/encoded"))
    if not (has_boxes or has_masks):
        return thumb
    labels = _labels(features)
    _tint_masks(thumb, features, labels)
    if has_boxes:
        _draw_boxes(thumb, features, labels)
    return thumb
