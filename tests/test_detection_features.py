"""Annotations follow the pixels (issue 21, package C21): the record builder with
``AnnotationAttach`` on generated images, each record read back with the test-side
decoder that requires what Model Garden's ``TfExampleDecoder`` requires.

A white rectangle is drawn inside an object's box on a black image; after the
geometry (none, ``--max_side``, ``--size`` with ``--fit crop`` and ``pad``, a flip, a
quarter turn, an EXIF orientation), the rectangle's stored pixels (thresholded) must
lie inside the stored box, and the box must be tight around them.
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_tfrecords.schemas.annotations import ImageAnnotations, LabelMap, ObjectAnnotation, Polygons
from beam_tfrecords.schemas.config import ImageReshape
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.annotation_bytes import encode_annotations
from beam_tfrecords.transforms.codec.orientation import EXIF_TURNS, exif_orientation, orient
from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach, AnnotationOptions, annotation_key
from beam_tfrecords.transforms.io.detection_features import moved_mask, source_point
from beam_tfrecords.transforms.io.image_records import (
    Attachment,
    Geometry,
    ImageRecordBuilder,
    reshape_geometry,
)
from tests.harness.detection_decode import DecodeError, decode_detection

pytestmark = pytest.mark.unit

LABELS = LabelMap(((1, "cat"), (2, "dog")))
RECT = (6, 4, 26, 20)  # Pixels x 6..25, y 4..19 of a 40x30 image: the box (6, 4, 26, 20).


def render_rings(segmentation: Polygons, height: int, width: int) -> np.ndarray:
    """A test renderer: each ring's bounding pixels filled (the rings here are rectangles)."""
    mask = np.zeros((height, width), dtype=np.uint8)
    for ring in segmentation.rings:
        xs, ys = ring[0::2], ring[1::2]
        mask[int(min(ys)):int(max(ys)), int(min(xs)):int(max(xs))] = 1
    return mask


def _drawn(size=(40, 30), rect=RECT) -> np.ndarray:
    pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    pixels[rect[1]:rect[3], rect[0]:rect[2]] = 255
    return pixels


def _encoded(pixels: np.ndarray, fmt: str = "PNG", **save) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **save)
    return out.getvalue()


def _obj(box, label=1, **kw) -> ObjectAnnotation:
    return ObjectAnnotation(box=tuple(float(v) for v in box), label=label, text=LABELS.name_of(label),
                            source=f"boxes.csv:{label}", **kw)


def _ann(*objects, **kw) -> ImageAnnotations:
    return ImageAnnotations(path="img/a.png", source_id="a-1", objects=objects, source="boxes.csv", **kw)


class Turned:
    """AnnotationAttach's attachment with extra turns and a flip (picklable)."""

    def __init__(self, inner: AnnotationAttach, turns: int, flip: bool):
        self.inner, self.turns, self.flip = inner, turns, flip

    def __call__(self, ref):
        attachment = self.inner(ref)
        return Attachment(labels=attachment.labels, resolve=lambda source: dataclasses.replace(
            attachment.resolve(source), turns=self.turns, flip=self.flip))


def _build(data: bytes, annotations: ImageAnnotations, reshape=None, turns=0, flip=False,
           options=None, render=None):
    attach = AnnotationAttach({annotations.path: annotations}, LABELS, options, render)
    if turns or flip:
        attach = Turned(attach, turns, flip)
    ref = ImageRef("train", "k", annotations.path, "/in/" + annotations.path, len(data), 0, "")
    return ImageRecordBuilder(reshape=reshape, attach=attach).example(ref, data)


def _lit(image: np.ndarray) -> np.ndarray:
    return image.mean(axis=2) > 128


def _assert_rect_in_box(det, index=0, tight=2.0):
    """The lit pixels' centres lie inside box ``index`` (a pixel the box edge halves
    may be lit: 1e-4 slack), and each box edge is within ``tight`` pixels of them."""
    rows, cols = np.nonzero(_lit(det.image))
    assert rows.size
    ymin, xmin, ymax, xmax = det.boxes[index] * [det.height, det.width, det.height, det.width]
    lit = (cols.min() + 0.5, rows.min() + 0.5, cols.max() + 0.5, rows.max() + 0.5)
    assert xmin - 1e-4 <= lit[0] and ymin - 1e-4 <= lit[1], (lit, (xmin, ymin, xmax, ymax))
    assert lit[2] <= xmax + 1e-4 and lit[3] <= ymax + 1e-4, (lit, (xmin, ymin, xmax, ymax))
    assert max(lit[0] - xmin, lit[1] - ymin, xmax - lit[2], ymax - lit[3]) <= tight


def _grown(mask: np.ndarray) -> np.ndarray:
    """The mask and its 8 neighbours."""
    padded = np.pad(mask, 1)
    height, width = mask.shape
    return np.any([padded[1 + dy:1 + dy + height, 1 + dx:1 + dx + width]
                   for dy in (-1, 0, 1) for dx in (-1, 0, 1)], axis=0)


GEOMETRIES = {
    "none": (None, 0, False, (40, 30)),
    "max_side": (ImageReshape(max_side=20), 0, False, (20, 15)),
    "size_crop": (ImageReshape(size=(20, 20), fit="crop"), 0, False, (20, 20)),
    "size_pad": (ImageReshape(size=(20, 20), fit="pad"), 0, False, (20, 20)),
    "flip": (None, 0, True, (40, 30)),
    "quarter_turn_after_pad": (ImageReshape(size=(50, 50), fit="pad"), 1, False, (50, 50)),
    "three_turns_flip": (None, 3, True, (30, 40)),
}


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_a_drawn_rectangle_stays_inside_its_box_through_the_geometry(name):
    reshape, turns, flip, size = GEOMETRIES[name]
    data = _encoded(_drawn())
    # The mask's ring is the rectangle; a second object has only a box.
    ring = Polygons(((6, 4, 26, 4, 26, 20, 6, 20),))
    annotations = _ann(_obj(RECT, segmentation=ring), _obj((16, 24, 24, 28), label=2))
    built = _build(data, annotations, reshape, turns, flip, AnnotationOptions(instance_masks=True),
                   render_rings)
    assert not isinstance(built, DeadLetter), built
    det = decode_detection(built[0], include_mask=True)
    assert (det.width, det.height) == size and det.source_id == "a-1"
    assert det.classes.tolist() == [1, 2] and det.class_text == ("cat", "dog")
    _assert_rect_in_box(det)
    # Instance masks stay 0/1 and cover the drawn pixels: exactly when not scaled,
    # else but for pixels next to the edge.
    assert det.masks.shape == (2, size[1], size[0])
    assert set(np.unique(det.masks)) <= {0.0, 1.0}
    lit, mask = _lit(det.image), det.masks[0] > 0
    if reshape is None:
        assert np.array_equal(mask, lit)
    assert not (mask & ~_grown(lit)).any() and not (lit & ~_grown(mask)).any()
    if name == "none":
        np.testing.assert_allclose(det.boxes[0], [4 / 30, 6 / 40, 20 / 30, 26 / 40], atol=1e-6)
        assert det.area.tolist() == [320.0, 32.0]
    if name == "size_pad":  # Scaled by 0.5 to 20x15, 2 rows of pad above: the pad is 0 in the mask.
        assert not det.masks[:, :2].any() and not det.masks[:, 17:].any()
    assert built[1].report.problems == ()


def test_boxes_past_the_edge_are_clipped_and_those_left_without_area_dropped_and_counted():
    data = _encoded(_drawn())
    annotations = _ann(
        _obj((-5, 4, 26, 20)),              # Past the left edge: clipped.
        _obj((1, 1, 4, 29), label=2),       # In the 5 columns the crop cuts off: dropped.
        _obj((30, 10, 38, 20), area=40.0),  # Clipped by the crop; COCO's area with it.
        _obj((12, 12, 12, 18)),             # No area as given: dropped.
        _obj((10, 25, 12, 28), label=2),    # Inside: kept as it is.
    )
    # --size 30x30 --fit crop of 40x30: not scaled, 5 columns cut each side.
    built = _build(data, annotations, ImageReshape(size=(30, 30), fit="crop"))
    det = decode_detection(built[0])
    assert det.classes.tolist() == [1, 1, 2]
    np.testing.assert_allclose(det.boxes[0], [4 / 30, 0, 20 / 30, 21 / 30], atol=1e-6)
    np.testing.assert_allclose(det.boxes[1], [10 / 30, 25 / 30, 20 / 30, 30 / 30], atol=1e-6)
    assert det.area.tolist() == [21 * 16, 40.0 * 5 / 8, 6.0]  # 3 of 8 columns of the second cut off.
    np.testing.assert_allclose(det.boxes[2], [25 / 30, 5 / 30, 28 / 30, 7 / 30], atol=1e-6)
    report = built[1].report
    assert dict(report.counts) == {"box_clipped": 2, "box_empty": 2}
    assert [(p.source, p.reason, p.kept, p.image) for p in report.problems] == [
        ("boxes.csv:2", "box_empty", "image", "img/a.png"), ("boxes.csv:1", "box_empty", "image", "img/a.png")]
    assert "no area inside the 30x30 stored image" in report.problems[0].detail


def test_normalized_boxes_are_made_pixels_with_the_source_size():
    data = _encoded(_drawn())
    annotations = _ann(_obj((6 / 40, 4 / 30, 26 / 40, 20 / 30)), units="normalized")
    det = decode_detection(_build(data, annotations, ImageReshape(max_side=20))[0])
    np.testing.assert_allclose(det.boxes[0], [4 / 30, 6 / 40, 20 / 30, 26 / 40], atol=1e-6)
    assert det.area.tolist() == [80.0]  # 10 x 8 output pixels.


def test_a_semantic_mask_is_pixel_exact_after_a_pad_and_its_stray_values_counted(tmp_path):
    rng = np.random.default_rng(3)
    mask = rng.integers(0, 3, (10, 20), dtype=np.uint8)
    mask[0, :3] = (7, 255, 255)  # 7 is no class; 255 is "ignore".
    (tmp_path / "a.png").write_bytes(_encoded(mask))
    annotations = _ann(mask="a.png")
    options = AnnotationOptions(mask_root=str(tmp_path))
    # --size 40x40 --fit pad of 20x10: scaled 2x to 40x20, 10 rows of pad above and below.
    built = _build(_encoded(_drawn((20, 10), (2, 2, 8, 8))), annotations, ImageReshape(size=(40, 40), fit="pad"),
                   options=options)
    det = decode_detection(built[0])
    expected = np.zeros((40, 40), dtype=np.uint8)
    expected[10:30] = np.kron(mask, np.ones((2, 2), dtype=np.uint8))
    assert det.segmentation.dtype == np.uint8 and np.array_equal(det.segmentation, expected)
    assert dict(built[1].report.counts) == {"mask_pixels_ignore": 2, "mask_pixels_outside_classes": 1}
    # Without a label map (--masks without --labels) no value is outside the classes named.
    unnamed = ImageRecordBuilder(attach=AnnotationAttach({annotations.path: annotations}, LabelMap(()), options))
    ref = ImageRef("train", "k", annotations.path, "/in/" + annotations.path, 1, 0, "")
    counts = dict(unnamed.example(ref, _encoded(_drawn((20, 10), (2, 2, 8, 8))))[1].report.counts)
    assert "mask_pixels_outside_classes" not in counts and counts["mask_pixels_ignore"] == 2
    # A mask of another size refuses the image.
    (tmp_path / "a.png").write_bytes(_encoded(mask[:, :19]))
    letter = _build(_encoded(_drawn((20, 10), (2, 2, 8, 8))), annotations, options=options)
    assert isinstance(letter, DeadLetter)
    assert (letter.source, letter.stage, letter.error) == ("img/a.png", "validate", "mask_size_mismatch")
    assert "19x10" in letter.message and "20x10" in letter.message
    # A mask that is no one-channel PNG, or no file at all, refuses it too.
    (tmp_path / "a.png").write_bytes(_encoded(np.dstack([mask] * 3)))
    letter = _build(_encoded(_drawn((20, 10), (2, 2, 8, 8))), annotations, options=options)
    assert letter.error == "bad_mask" and "mode RGB" in letter.message
    (tmp_path / "a.png").unlink()
    letter = _build(_encoded(_drawn((20, 10), (2, 2, 8, 8))), annotations, options=options)
    assert letter.error == "bad_mask" and "cannot read" in letter.message


def test_an_exif_rotated_photo_annotated_as_displayed_is_stored_turned_and_its_box_agrees():
    displayed = _drawn((40, 30), (20, 3, 36, 12))  # What a viewer shows (orientation 6).
    stored = np.asarray(Image.fromarray(displayed).transpose(Image.Transpose.ROTATE_90))  # 30x40.
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _encoded(stored, "JPEG", exif=exif, quality=95)
    assert exif_orientation(data) == 6
    with Image.open(io.BytesIO(data)) as im:  # The test's own premise: a viewer shows `displayed`.
        assert im.size == (30, 40)
        assert np.array_equal(_lit(np.asarray(ImageOps.exif_transpose(im))), _lit(displayed))
    annotations = _ann(_obj((20, 3, 36, 12)), stated_size=(40, 30))
    built = _build(data, annotations)
    det = decode_detection(built[0])
    assert (det.width, det.height) == (40, 30)
    assert exif_orientation(example_pb2.Example.FromString(built[0]).features.feature[
        "image/encoded"].bytes_list.value[0]) == 1  # Stored as displayed: no orientation left.
    _assert_rect_in_box(det)
    assert dict(built[1].report.counts) == {"exif_rotated": 1}
    assert built[1].note == "attached/moved"
    # A stated size that is neither the stored nor the displayed one: dead-lettered.
    letter = _build(data, dataclasses.replace(annotations, stated_size=(41, 30)))
    assert (letter.stage, letter.error) == ("validate", "annotation_size_mismatch")
    assert "41x30" in letter.message and "30x40 (40x30 as displayed)" in letter.message
    # No stated size: stored as it is, counted.
    kept = _build(data, dataclasses.replace(annotations, stated_size=None))
    assert decode_detection(kept[0]).width == 30
    assert dict(kept[1].report.counts)["exif_orientation_not_applied"] == 1


def test_the_orientation_table_is_pillows_exif_transpose():
    pixels = np.random.default_rng(1).integers(0, 256, (3, 5), dtype=np.uint8)
    for orientation, (turns, flip) in EXIF_TURNS.items():
        im = Image.fromarray(pixels)
        im.getexif()[0x0112] = orientation
        ours = im.rotate(-90 * turns, expand=True)
        ours = ImageOps.mirror(ours) if flip else ours
        assert np.array_equal(np.asarray(ours), np.asarray(ImageOps.exif_transpose(im))), orientation
    assert orient((30, 40), 6, (40, 30)).turns == 1 and orient((30, 40), 6, (30, 40)).turns == 0
    assert orient((40, 40), 6, None).count == "exif_orientation_not_applied"


def test_several_labels_are_lists_and_the_attach_callable_pickles():
    annotations = ImageAnnotations(path="./img/a.png", source_id="img/a.png", labels=(2, 1))
    data = _encoded(_drawn())
    attach = AnnotationAttach({annotations.path: annotations}, LABELS)
    builder = pickle.loads(pickle.dumps(ImageRecordBuilder(attach=attach)))
    ref = ImageRef("train", "k", "img/a.png", "/in/img/a.png", len(data), 0, "")
    det = decode_detection(builder.example(ref, data)[0])
    assert det.image_labels.tolist() == [2, 1] and det.image_texts == ("dog", "cat")
    assert det.boxes.shape == (0, 4) and det.source_id == "img/a.png"
    assert annotation_key("file:///data//x/./a.jpg") == "data/x/a.jpg"
    assert builder.attach(dataclasses.replace(ref, filename="img/b.png")) is None


@pytest.mark.parametrize("reshape", [ImageReshape(size=(17, 9), fit="crop"), ImageReshape(size=(11, 12), fit="pad"),
                                     ImageReshape(max_side=5)])
def test_a_mask_moves_as_pillows_nearest_neighbour_then_crop_or_pad_then_transposes(reshape):
    mask = np.random.default_rng(2).integers(0, 9, (5, 7), dtype=np.uint8)
    base = reshape_geometry(7, 5, reshape)
    scaled = (round(7 * base.scale[0]), round(5 * base.scale[1]))
    im = Image.fromarray(mask).resize(scaled, Image.Resampling.NEAREST)
    canvas = Image.new("L", base.output, 4)
    canvas.paste(im.crop((base.crop[0], base.crop[1], base.crop[0] + base.output[0],
                          base.crop[1] + base.output[1])) if base.crop != (0, 0) else im, base.pad)
    for turns, flip in ((0, False), (1, False), (2, True), (3, True)):
        expected = canvas.rotate(-90 * turns, expand=True)
        expected = ImageOps.mirror(expected) if flip else expected
        geometry = dataclasses.replace(base, output=expected.size, turns=turns, flip=flip)
        assert np.array_equal(moved_mask(mask, geometry, fill=4), np.asarray(expected)), (turns, flip)


def test_source_point_inverts_map_point():
    points = np.array([[0.0, 0.0], [3.25, 7.5], [19.0, 9.0]])
    for geometry in (Geometry((20, 10), (30, 40), (1.5, 2.0), crop=(0, 5), turns=1, flip=True),
                     Geometry((20, 10), (40, 40), (2.0, 2.0), pad=(0, 10), turns=2),
                     Geometry((20, 10), (10, 20), turns=3)):
        back = source_point(geometry, *geometry.map_point(points[:, 0], points[:, 1]))
        np.testing.assert_allclose(np.stack(back, axis=1), points, atol=1e-9)


def test_the_decoder_fails_on_a_missing_source_id_or_a_wrong_type():
    data = _encoded(_drawn())
    ref = ImageRef("train", "k", "img/a.png", "/in/img/a.png", len(data), 0, "")
    plain = ImageRecordBuilder().example(ref, data)[0]  # No annotations: no image/source_id.
    with pytest.raises(DecodeError, match="image/source_id: required"):
        decode_detection(plain)
    example = example_pb2.Example.FromString(_build(data, _ann(_obj(RECT)))[0])
    decode_detection(example.SerializeToString())
    example.features.feature["image/object/bbox/xmin"].Clear()
    example.features.feature["image/object/bbox/xmin"].int64_list.value.append(6)
    with pytest.raises(DecodeError, match="bbox/xmin: expected float32"):
        decode_detection(example.SerializeToString())


def test_annotations_carried_in_the_reference_give_the_same_record_as_an_index():
    """How a run carries them (``ImageRef.annotation``, no index in the job graph):
    the same record, byte for byte; bytes that are not annotations dead-letter the
    image (``bad_annotation_file``), naming neither their content nor a traceback."""
    data = _encoded(_drawn())
    annotations = _ann(_obj(RECT), _obj((16, 24, 24, 28), label=2))
    reshape = ImageReshape(size=(20, 20), fit="pad")
    ref = ImageRef("train", "k", annotations.path, "/in/" + annotations.path, len(data), 0, "")
    by_index = ImageRecordBuilder(reshape=reshape, attach=AnnotationAttach(
        {annotations.path: annotations}, LABELS)).example(ref, data)
    carried = dataclasses.replace(ref, annotation=encode_annotations(annotations))
    attach = pickle.loads(pickle.dumps(AnnotationAttach(None, LABELS)))
    in_ref = ImageRecordBuilder(reshape=reshape, attach=attach).example(carried, data)
    assert not isinstance(in_ref, DeadLetter), in_ref
    assert in_ref[0] == by_index[0]
    assert decode_detection(in_ref[0]).classes.tolist() == [1, 2]
    # No annotation in the reference and no index: a plain record.
    assert ImageRecordBuilder(attach=attach).example(ref, data)[0] == ImageRecordBuilder().example(ref, data)[0]
    garbage = dataclasses.replace(ref, annotation=b'{"secret": 1}')
    letter = ImageRecordBuilder(attach=attach).example(garbage, data)
    assert isinstance(letter, DeadLetter) and letter.error == "bad_annotation_file", letter
    assert "secret" not in letter.message and letter.source == annotations.path
