"""The contact sheet draws a record's boxes (a class-coloured outline, scaled with the
thumbnail) over its instance and semantic masks (tinted at 40 %), and a record with
malformed box lists still renders."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.inspect import contact_sheet
from beam_tfrecords.sheet_drawing import PALETTE, TINT_ALPHA
from beam_tfrecords.transforms.codec.example import (
    bytes_feature,
    example_to_dict,
    float_feature,
    int64_feature,
    make_example,
    serialize_example,
)

THUMB, CAPTION, GREY = 132, 28, 128
W, H = 256, 128  # Stored size; the thumbnail is 128x64, placed at (2, 34) in its cell.
TW, TH = 128, 64


def png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def record(**features) -> tuple[str, dict]:
    """A record built with the product's protobuf, read back as inspect reads it."""
    base = {"image/encoded": bytes_feature(png(Image.new("RGB", (W, H), (GREY,) * 3))),
            "image/filename": bytes_feature("x.png")}
    base.update(features)
    return "train", example_to_dict(serialize_example(make_example(base)))


def boxes(xmin, ymin, xmax, ymax) -> dict:
    return {f"image/object/bbox/{k}": float_feature(v)
            for k, v in zip(("xmin", "ymin", "xmax", "ymax"), (xmin, ymin, xmax, ymax))}


def scaled(v: float, size: int) -> int:
    return round(float(np.float32(v)) * (size - 1))


def tinted(colour) -> np.ndarray:
    return np.array([GREY + (c - GREY) * TINT_ALPHA / 255 for c in colour])


@pytest.mark.unit
def test_boxes_and_masks_are_drawn_at_their_scaled_places(tmp_path):
    instance = np.zeros((H, W), np.uint8)
    instance[40:90, 60:110] = 1  # Inside box 0.
    semantic = np.zeros((H, W), np.uint8)
    semantic[:, :128] = 3  # Left half is class 3.
    detected = record(**boxes([0.1, 0.55], [0.2, 0.1], [0.45, 0.9], [0.8, 0.9]),
                      **{"image/object/class/label": int64_feature([1, 2]),
                         "image/object/class/text": bytes_feature([b"cat", b"dog"]),
                         "image/object/mask": bytes_feature([png(Image.fromarray(instance)),
                                                             png(Image.new("L", (W, H), 0))])})
    segmented = record(**{"image/segmentation/class/encoded": bytes_feature(png(Image.fromarray(semantic)))})
    malformed = record(**boxes([-0.5, float("nan"), 0.1], [0.2, 0.1, 0.1], [1.5, 0.5, 0.3], [0.6, 0.5]),
                       **{"image/object/class/label": int64_feature([0, 1, 2]),
                          "image/object/mask": bytes_feature([b"not a png"])})
    path = str(tmp_path / "sheet.png")
    assert contact_sheet([detected, segmented, malformed], path) == 3
    with Image.open(path) as sheet:
        pixels = np.array(sheet.convert("RGB")).astype(int)
    cells = [pixels[oy + 34: oy + 34 + TH, ox + 2: ox + 2 + TW]
             for ox, oy in ((0, 0), (THUMB, 0), (0, THUMB + CAPTION))]

    thumb = cells[0]
    for (xmin, ymin, xmax, ymax), colour in (((0.1, 0.2, 0.45, 0.8), PALETTE[1]),
                                             ((0.55, 0.1, 0.9, 0.9), PALETTE[2])):
        x0, y0, x1, y1 = scaled(xmin, TW), scaled(ymin, TH), scaled(xmax, TW), scaled(ymax, TH)
        for edge in (thumb[y0, x0:x1 + 1], thumb[y1, x0:x1 + 1],
                     thumb[y0:y1 + 1, x0], thumb[y0:y1 + 1, x1]):
            assert (edge == colour).all(), (colour, edge)
        assert not (thumb[y0:y1 + 1, x0 - 1] == colour).all(axis=1).any()  # Nothing outside it.
    assert np.abs(thumb[32, 42] - tinted(PALETTE[1])).max() <= 1  # The instance mask.
    assert (thumb[55:60, 30] == GREY).all()  # Inside box 0, outside its mask.
    assert (thumb[30, 66] == GREY).all()  # Between the boxes: object 1's mask is empty.

    assert np.abs(cells[1][30, 30] - tinted(PALETTE[3])).max() <= 1  # Class 3 is tinted,
    assert (cells[1][30, 100] == GREY).all()  # class 0 (background) is not.

    thumb = cells[2]  # Only box 0, clipped to the image; NaN and short lists skipped.
    y0, y1 = scaled(0.2, TH), scaled(0.6, TH)
    assert (thumb[y0:y1 + 1, 0] == PALETTE[0]).all() and (thumb[y0:y1 + 1, TW - 1] == PALETTE[0]).all()
    for skipped in (PALETTE[1], PALETTE[2]):
        assert not (thumb == skipped).all(axis=2).any()
    assert (thumb[TH // 2 + 8, TW // 2] == GREY).all()
