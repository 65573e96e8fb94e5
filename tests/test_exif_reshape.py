"""An EXIF-turned photo annotated as displayed comes out the size asked (issue 21, E21).

A white rectangle is drawn on the displayed 40x30 picture; the file stores the pixels
as the camera would (30x40 for orientations 5-8) with the EXIF orientation that shows
them as drawn. The annotations state the displayed size, so the record builder stores
the picture turned as displayed; a ``--size 20x10`` reshape must then give a 20x10
image (not 10x20), and the rectangle's stored pixels must lie inside its stored box.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_tfrecords.schemas.annotations import ImageAnnotations, LabelMap, ObjectAnnotation
from beam_tfrecords.schemas.config import ImageReshape
from beam_tfrecords.schemas.elements import ImageRef
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.image_inspection import inspect_image
from beam_tfrecords.transforms.codec.orientation import EXIF_TURNS, exif_orientation
from beam_tfrecords.transforms.codec.reshape import reshape_image
from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach, AnnotationOptions
from beam_tfrecords.transforms.io.detection_features import source_point
from beam_tfrecords.transforms.io.image_records import Attachment, Geometry, ImageRecordBuilder
from tests.harness.detection_decode import decode_detection

pytestmark = pytest.mark.unit

DISPLAYED = (40, 30)
BOX = (12, 8, 30, 22)  # The drawn rectangle, in the displayed picture's pixels.
RESHAPES = {
    "size_crop": (ImageReshape(size=(20, 10), fit="crop"), (20, 10)),
    "size_pad": (ImageReshape(size=(20, 10), fit="pad"), (20, 10)),
    "max_side": (ImageReshape(max_side=20), (20, 15)),
}


def _no_render(segmentation, height, width):  # Every object here has a box only.
    raise AssertionError("not called")


def _displayed_reshaped(data: bytes, reshape: ImageReshape) -> np.ndarray:
    """What turning first means: the picture as a viewer shows it, then reshaped."""
    with Image.open(io.BytesIO(data)) as im:
        out = io.BytesIO()
        ImageOps.exif_transpose(im).save(out, format="PNG")
    shown = out.getvalue()
    reshaped, _, _ = reshape_image(shown, inspect_image(shown), reshape)
    with Image.open(io.BytesIO(reshaped)) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def _photo(orientation: int) -> bytes:
    """A JPEG whose stored pixels, shown with ``orientation``, are the drawn picture."""
    drawn = np.zeros((DISPLAYED[1], DISPLAYED[0], 3), dtype=np.uint8)
    drawn[BOX[1]:BOX[3], BOX[0]:BOX[2]] = 255
    turns, flip = EXIF_TURNS[orientation]
    im = Image.fromarray(drawn)
    stored = (ImageOps.mirror(im) if flip else im).rotate(90 * turns, expand=True)  # Undone by a viewer.
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    stored.save(out, format="JPEG", quality=95, exif=exif)
    data = out.getvalue()
    with Image.open(io.BytesIO(data)) as check:  # The premise: a viewer shows the drawn picture.
        assert check.size == DISPLAYED[::-1]
        assert np.array_equal(np.asarray(ImageOps.exif_transpose(check)).mean(axis=2) > 128, drawn[:, :, 0] > 0)
    return data


def _ref(data: bytes) -> ImageRef:
    return ImageRef("train", "k", "img/a.jpg", "/in/img/a.jpg", len(data), 0, "")


@pytest.mark.parametrize("orientation", [6, 8, 5])
@pytest.mark.parametrize("name", sorted(RESHAPES))
def test_an_exif_turned_photo_is_stored_the_size_asked_with_its_box_on_its_pixels(name, orientation):
    reshape, size = RESHAPES[name]
    data = _photo(orientation)
    annotations = ImageAnnotations(
        path="img/a.jpg", source_id="a", source="boxes.csv", stated_size=DISPLAYED,
        objects=(ObjectAnnotation(box=tuple(float(v) for v in BOX), label=1, text="cat", source="boxes.csv:2"),))
    attach = AnnotationAttach({annotations.path: annotations}, LabelMap(((1, "cat"),)),
                              AnnotationOptions(instance_masks=True), _no_render)
    serialized, outcome = ImageRecordBuilder(reshape=reshape, attach=attach).example(_ref(data), data)
    det = decode_detection(serialized, include_mask=True)
    assert (det.width, det.height) == size and outcome.image[2:] == size
    geometry = outcome.geometry  # The EXIF turns first, then the reshape: nothing after it.
    assert (geometry.source, geometry.output) == (DISPLAYED[::-1], size)
    assert (geometry.first_turns, geometry.first_flip, geometry.turns, geometry.flip) == (
        *EXIF_TURNS[orientation], 0, False)
    assert dict(outcome.report.counts) == {"exif_rotated": 1, "mask_from_box": 1}
    # The pixels are the displayed picture reshaped (JPEG noise aside; a pixel's shift is ~240).
    assert np.abs(det.image.astype(int) - _displayed_reshaped(data, reshape)).max() < 64
    assert exif_orientation(_encoded_image(serialized)) == 1  # No orientation left for a viewer.
    rows, cols = np.nonzero(det.image.mean(axis=2) > 128)
    assert rows.size
    ymin, xmin, ymax, xmax = det.boxes[0] * [size[1], size[0], size[1], size[0]]
    # Every lit pixel's centre inside the box, and the box within 2 pixels of them.
    lit = np.array([cols.min(), rows.min(), cols.max() + 1, rows.max() + 1], dtype=float)
    assert xmin <= lit[0] + 0.5 and ymin <= lit[1] + 0.5 and lit[2] - 0.5 <= xmax and lit[3] - 0.5 <= ymax
    assert np.abs(lit - [xmin, ymin, xmax, ymax]).max() <= 2.0, (lit, (xmin, ymin, xmax, ymax))
    # The instance mask (filled from the box) moved with the pixels: it holds every lit pixel.
    assert det.masks[0][rows, cols].all()


def test_source_point_undoes_turns_made_before_the_reshape():
    points = np.array([[0.0, 0.0], [3.25, 7.5], [29.0, 39.0]])
    for geometry in (Geometry((30, 40), (20, 10), (0.5, 0.5), crop=(0, 2), first_turns=1),
                     Geometry((30, 40), (20, 10), (0.325, 1 / 3), pad=(3, 0), first_turns=3, first_flip=True),
                     Geometry((30, 40), (10, 20), (0.5, 0.5), crop=(0, 5), first_turns=2, turns=1, flip=True)):
        x, y = geometry.map_point(points[:, 0], points[:, 1])
        np.testing.assert_allclose(np.stack(source_point(geometry, x, y), axis=1), points, atol=1e-9)
    # One quarter turn first: the stored top-left corner is the displayed top-right one.
    assert Geometry((30, 40), (40, 30), first_turns=1).map_point(0, 0) == (40, 0)


def _encoded_image(serialized: bytes) -> bytes:
    return example_pb2.Example.FromString(serialized).features.feature["image/encoded"].bytes_list.value[0]


class _QuarterTurn:
    """A plain attachment (not an EXIF orientation): one quarter turn after the reshape."""

    def __call__(self, ref):
        return Attachment(turns=1)


def test_turns_not_from_exif_still_follow_the_reshape():
    data = _photo(6)
    serialized, outcome = ImageRecordBuilder(reshape=RESHAPES["size_crop"][0], attach=_QuarterTurn()).example(
        _ref(data), data)
    assert outcome.image[2:] == (10, 20)  # Reshaped to 20x10 as stored, then turned: as before.
    assert (outcome.geometry.output, outcome.geometry.turns) == ((10, 20), 1)
