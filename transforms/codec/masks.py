"""Instance masks: an object's segmentation rendered to pixels, and the PNG that stores it.

Pure and Beam-free (issue 21, ``--instance_masks``). A mask is a numpy ``uint8`` array,
``height x width``, values 0 and 1.

Rendering follows pycocotools exactly, so that a record's mask equals what the Object
Detection API's ``create_coco_tf_record.py`` stores (``mask.frPyObjects`` then
``mask.decode``, the rings of a polygon merged by their union):

* a polygon ring is rasterized by COCO's own rule (``rleFrPoly``): the ring is scaled by
  5 and rounded, its edges are walked point by point, and every crossing of a pixel
  column's centre line turns the column on or off at the centre rounded up. It is not
  the "centre inside the polygon" rule: a ring's mask can differ from other rasterizers
  by a pixel along its edges;
* an RLE (``schemas.annotations.Rle``) alternates background and foreground runs in
  column-major order, starting with background.

COCO's compressed RLE strings (``"counts": "..."``) are decoded by ``rle_from_string``
and written by ``rle_to_string``: LEB128-like, 5 bits of value per character in ASCII
48-111, each count after the second stored as its difference from the count two before.

``encode_mask_png`` writes a mask as a PNG (mode ``"L"``, values 0 and 1, Pillow's
defaults: the same bytes for the same mask), as ``create_coco_tf_record.py`` does;
``decode_mask_png`` reads one back.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from PIL import Image

from beam_tfrecords.schemas.annotations import Polygons, Rle

__all__ = [
    "MaskError",
    "coordinate_limit",
    "decode_mask_png",
    "encode_mask_png",
    "mask_to_rle",
    "render_mask",
    "render_polygons",
    "render_rle",
    "ring_area_perimeter",
    "rle_from_string",
    "rle_to_string",
]

# COCO's polygon rasterizer works on a grid 5 times finer than the pixels.
_UPSCALE = 5
# Compressed RLE: 5 value bits per character, a continuation bit, a sign bit, offset 48.
_VALUE_BITS = 5
_CONTINUE = 0x20
_SIGN = 0x10
_OFFSET = 48
# Outline points walked at a time (a few tens of MB of arrays).
_CHUNK_POINTS = 1 << 18


class MaskError(ValueError):
    """A segmentation or a stored mask that cannot be read as one (the message says why,
    in words and numbers only)."""


def render_mask(segmentation: Polygons | Rle | None, height: int, width: int) -> np.ndarray:
    """An object's mask, ``height x width``, as pycocotools renders it.

    Args:
      segmentation: the object's polygons or RLE; ``None`` (no usable segmentation)
        gives an empty mask.
      height, width: the image's size, in source pixels.

    Raises:
      MaskError: an RLE whose size is not ``(height, width)`` or whose runs do not fill it;
        a polygon ring as ``render_polygons`` refuses it. (The record builder counts the
        object's ``segmentation_invalid`` and stores an empty mask, or drops it.)
    """
    if segmentation is None:
        return np.zeros((height, width), dtype=np.uint8)
    if isinstance(segmentation, Polygons):
        return render_polygons(segmentation, height, width)
    if tuple(segmentation.size) != (height, width):
        raise MaskError(
            f"RLE size {segmentation.size[0]}x{segmentation.size[1]} (height x width) is not "
            f"the image's {height}x{width}")
    return render_rle(segmentation)


def render_polygons(polygons: Polygons, height: int, width: int) -> np.ndarray:
    """The union of the rings' masks, each rasterized by COCO's rule (module docstring).

    Raises:
      MaskError: a ring with fewer than three points, a value that is not finite, or a
        point past ``coordinate_limit`` (the COCO reader leaves such rings out already
        when the image's size is stated).
    """
    mask = np.zeros((height, width), dtype=np.uint8)
    for ring in polygons.rings:
        mask |= _ring_mask(ring, height, width)
    return mask


def coordinate_limit(height: int, width: int) -> float:
    """How far from the origin a polygon's points may lie, in pixels, for an image of
    this size: four times its longer side, plus 64. Points past it are refused, not
    rendered (they bound the work a ring costs; real annotations stay near the image)."""
    return 4.0 * max(height, width) + 64.0


def _ring_mask(ring: tuple[float, ...], height: int, width: int) -> np.ndarray:
    """One ring's mask: every column's on/off switches, by COCO's rule, then their parity.
    The outline is walked a bounded number of points at a time."""
    xy = np.asarray(ring, dtype=np.float64)
    if xy.size < 6 or not np.all(np.isfinite(xy)):
        raise MaskError("a polygon ring has fewer than three points or a value that is not finite")
    if float(np.max(np.abs(xy))) > coordinate_limit(height, width):
        raise MaskError(f"a polygon ring has a point farther than {coordinate_limit(height, width):g} "
                        f"pixels from a {width}x{height} image's corner")
    size = height * width
    # A switch at column-major position p flips every pixel from p on; two at one place cancel.
    switches = np.zeros(size + 1, dtype=np.uint8)
    outline = _Outline.of(xy)
    last: tuple[np.ndarray, np.ndarray] | None = None
    for first, stop in outline.chunks(_CHUNK_POINTS):
        xs, ys = outline.walk(first, stop)
        if last is not None:  # the step from the previous chunk's last point
            xs, ys = np.concatenate((last[0], xs)), np.concatenate((last[1], ys))
        cols, rows = _column_crossings(xs, ys, height, width)
        np.bitwise_xor.at(switches, cols * height + rows, 1)
        last = xs[-1:], ys[-1:]
    flat = np.bitwise_xor.accumulate(switches[:size])
    return flat.reshape(width, height).T.copy()


def _column_crossings(xs: np.ndarray, ys: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Where the outline, walked on the 5x grid, crosses pixel columns' centre lines:
    ``(columns, rows)``, the row being the first pixel centre at or below the crossing."""
    moved = xs[1:] != xs[:-1]
    # The grid column left of the step, as a pixel coordinate: whole only on a centre line.
    left = np.where(xs[1:] < xs[:-1], xs[1:], xs[1:] - 1)[moved]
    col = (left + 0.5) / _UPSCALE - 0.5
    top = np.minimum(ys[1:], ys[:-1])[moved]
    row = (top + 0.5) / _UPSCALE - 0.5
    keep = (np.floor(col) == col) & (col >= 0) & (col <= width - 1)
    row = np.ceil(np.clip(row[keep], 0, height))
    return col[keep].astype(np.int64), row.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class _Outline:
    """A closed ring's edges on the 5x grid, each walked one grid step at a time along its
    longer axis from its lower end there (``start``), its points listed in the ring's order."""

    start_x: np.ndarray
    start_y: np.ndarray
    steps: np.ndarray
    along_x: np.ndarray
    flip: np.ndarray
    slope: np.ndarray

    @classmethod
    def of(cls, xy: np.ndarray) -> _Outline:
        count = len(xy) // 2
        # C's (int)(v + .5): rounding by truncation toward zero, as COCO's code does.
        gx = np.trunc(_UPSCALE * xy[0:2 * count:2] + 0.5).astype(np.int64)
        gy = np.trunc(_UPSCALE * xy[1:2 * count:2] + 0.5).astype(np.int64)
        x0, y0, x1, y1 = gx, gy, np.roll(gx, -1), np.roll(gy, -1)
        dx, dy = np.abs(x1 - x0), np.abs(y1 - y0)
        along_x = dx >= dy
        flip = (along_x & (x0 > x1)) | (~along_x & (y0 > y1))
        xs, xe = np.where(flip, x1, x0), np.where(flip, x0, x1)
        ys, ye = np.where(flip, y1, y0), np.where(flip, y0, y1)
        steps = np.maximum(dx, dy)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = np.where(along_x, (ye - ys) / dx, (xe - xs) / dy)
        slope = np.where(steps == 0, 0.0, slope)  # a repeated point: one point, no direction
        return cls(xs, ys, steps, along_x, flip, slope)

    def chunks(self, points: int):
        """``(first, stop)`` edge ranges of about ``points`` points each (one edge at least)."""
        ends = np.cumsum(self.steps + 1)
        first = 0
        while first < len(ends):
            done = int(ends[first - 1]) if first else 0
            stop = max(int(np.searchsorted(ends, done + points, side="right")), first + 1)
            yield first, stop
            first = stop

    def walk(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """The points of edges ``first..stop-1``, both ends of each edge included."""
        steps = self.steps[first:stop]
        edge = np.repeat(np.arange(first, stop), steps + 1)
        offsets = np.cumsum(steps + 1) - (steps + 1)
        d = np.arange(len(edge)) - offsets[edge - first]
        t = np.where(self.flip[edge], self.steps[edge] - d, d)
        lead_x = self.along_x[edge]
        base = np.where(lead_x, self.start_y[edge], self.start_x[edge]).astype(np.float64)
        follow = np.trunc(base + self.slope[edge] * t + 0.5).astype(np.int64)
        px = np.where(lead_x, t + self.start_x[edge], follow)
        py = np.where(lead_x, follow, t + self.start_y[edge])
        return px, py


def render_rle(rle: Rle) -> np.ndarray:
    """The RLE's mask, ``size`` (height x width): runs alternate 0 and 1 in column-major order.

    Raises:
      MaskError: a negative run, or runs that do not add up to height x width.
    """
    height, width = rle.size
    counts = np.asarray(rle.counts, dtype=np.int64)
    if counts.size and counts.min() < 0:
        raise MaskError("an RLE run is negative")
    if int(counts.sum()) != height * width:
        raise MaskError(
            f"RLE runs add up to {int(counts.sum())} pixels, not {height}x{width}")
    values = (np.arange(counts.size) & 1).astype(np.uint8)
    flat = np.repeat(values, counts)
    return flat.reshape(width, height).T.copy()


def mask_to_rle(mask: np.ndarray) -> Rle:
    """A mask's RLE (column-major runs, starting with background), as COCO encodes it;
    any value other than 0 is foreground."""
    height, width = mask.shape
    flat = (np.asarray(mask).T.reshape(-1) != 0).astype(np.uint8)
    if flat.size == 0:
        return Rle(size=(height, width), counts=(0,))
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    counts = np.diff(np.concatenate(([0], change, [flat.size])))
    lead = (0,) if flat[0] else ()
    return Rle(size=(height, width), counts=lead + tuple(int(c) for c in counts))


def rle_from_string(counts: str) -> tuple[int, ...]:
    """Run lengths from COCO's compressed RLE string (module docstring).

    Raises:
      MaskError: a character outside COCO's alphabet, a string that ends inside a count,
        or a count that decodes negative.
    """
    runs: list[int] = []
    value = shift = 0
    for position, char in enumerate(counts):
        code = ord(char) - _OFFSET
        if not 0 <= code < 64:
            raise MaskError(f"character {position} of the RLE string is outside COCO's alphabet")
        value |= (code & 0x1F) << shift
        shift += _VALUE_BITS
        if code & _CONTINUE:
            continue
        if code & _SIGN:
            value -= 1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            raise MaskError(f"count {len(runs)} of the RLE string decodes negative")
        runs.append(value)
        value = shift = 0
    if shift:
        raise MaskError("the RLE string ends inside a count")
    return tuple(runs)


def rle_to_string(counts: tuple[int, ...] | list[int]) -> str:
    """COCO's compressed RLE string for run lengths (the inverse of ``rle_from_string``)."""
    chars: list[str] = []
    for index, count in enumerate(counts):
        value = int(count) - (int(counts[index - 2]) if index > 2 else 0)
        more = True
        while more:
            code = value & 0x1F
            value >>= _VALUE_BITS
            more = value != -1 if code & _SIGN else value != 0
            if more:
                code |= _CONTINUE
            chars.append(chr(code + _OFFSET))
    return "".join(chars)


def encode_mask_png(mask: np.ndarray) -> bytes:
    """The mask as PNG bytes: 8-bit grayscale (mode ``"L"``), values 0 and 1, Pillow's
    default settings (deterministic: the same mask gives the same bytes).

    Raises:
      MaskError: not a two-dimensional array of 0s and 1s.
    """
    array = np.asarray(mask)
    if array.ndim != 2 or (array.size and int(array.max()) > 1) or (array.size and int(array.min()) < 0):
        raise MaskError("a mask is a two-dimensional array of 0s and 1s")
    out = io.BytesIO()
    Image.fromarray(array.astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def decode_mask_png(data: bytes) -> np.ndarray:
    """A mask PNG (``encode_mask_png``) back to its ``uint8`` array.

    Raises:
      MaskError: not a PNG, or not 8-bit grayscale.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG" or image.mode != "L":
                raise MaskError(f"a mask is an 8-bit grayscale PNG, not {image.format} mode {image.mode}")
            return np.asarray(image, dtype=np.uint8).copy()
    except (OSError, SyntaxError) as exc:
        raise MaskError(f"not a readable PNG ({type(exc).__name__})") from None


def ring_area_perimeter(ring: tuple[float, ...]) -> tuple[float, float]:
    """A ring's ``(area, perimeter)`` in pixels: the shoelace formula and the closed
    outline's length (what a rendered mask's pixel count must come within)."""
    xy = np.asarray(ring, dtype=np.float64)
    x, y = xy[0::2], xy[1::2]
    xn, yn = np.roll(x, -1), np.roll(y, -1)
    area = abs(float(np.sum(x * yn - xn * y))) / 2.0
    perimeter = float(np.sum(np.hypot(xn - x, yn - y)))
    return area, perimeter
