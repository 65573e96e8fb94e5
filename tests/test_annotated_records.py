"""Detection records and what a shard reports of them (issue 21, worker side).

A reference of an annotated layout carries its annotations (``ImageRef.annotation``)
and ``label == -1``: its record holds no ``image/class/*`` (classes are per object)
and is read back with the test-side decoder that requires Model Garden's keys. The
shard writer (``write_shard``, the one writer of every input kind) folds the images'
reports into the shard's annotation statistics and writes each dropped object as a
dead letter of stage ``object``, which the shard's bad counts (the error budget's)
leave out.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.schemas.annotations import ImageAnnotations, LabelMap, ObjectAnnotation, Rle
from beam_tfrecords.schemas.elements import ImageRef, ImageRefs
from beam_tfrecords.schemas.shards import ShardTarget
from beam_tfrecords.transforms.codec.annotation_bytes import encode_annotations
from beam_tfrecords.transforms.codec.masks import render_mask
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from beam_tfrecords.transforms.image_steps import ImageRecords
from beam_tfrecords.transforms.io.annotated_output import report_counts
from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach, AnnotationOptions
from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder
from beam_tfrecords.transforms.plan.shard_cuts import shard_spec
from beam_tfrecords.transforms.shard_engine import write_shard
from tests.harness.detection_decode import decode_detection

pytestmark = pytest.mark.unit

LABELS = LabelMap(((1, "cat"), (3, "dog")))  # Ids as COCO gives them: not contiguous.
SIZE = (40, 30)
OBJECTS = (
    ObjectAnnotation((4.0, 2.0, 20.0, 12.0), 1, "cat", source="a.json: annotation 7"),
    ObjectAnnotation((30.0, 20.0, 50.0, 40.0), 3, "dog", source="a.json: annotation 8"),  # Clipped.
    ObjectAnnotation((60.0, 5.0, 70.0, 9.0), 3, "dog", source="a.json: annotation 9"),  # Outside.
    ObjectAnnotation((1.0, 1.0, 2.0, math.nan), 1, "cat", source="a.json: annotation 10"),
)


def _png(path: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.zeros((SIZE[1], SIZE[0], 3), np.uint8)).save(out, format="PNG")
    with open(path, "wb") as f:
        f.write(out.getvalue())
    return out.getvalue()


def _ref(path: str, rel: str, data: bytes, objects=OBJECTS, label: int = -1) -> ImageRef:
    annotations = ImageAnnotations(rel, "77", objects, source="a.json")
    return ImageRef("train", rel, rel, path, len(data), label, "", annotation=encode_annotations(annotations))


def test_a_detection_record_has_no_image_class_keys_and_decodes_as_model_garden_reads_it(tmp_path):
    data = _png(str(tmp_path / "a.png"))
    ref = _ref(str(tmp_path / "a.png"), "img/a.png", data)
    built = ImageRecordBuilder(attach=AnnotationAttach(None, LABELS)).example(ref, data)
    serialized, outcome = built
    det = decode_detection(serialized)
    assert det.source_id == "77" and det.filename == "img/a.png"
    assert len(det.image_labels) == 0 and det.image_texts == ()
    assert b"image/class/label" not in serialized and b"image/class/text" not in serialized
    np.testing.assert_allclose(det.boxes, [[2 / 30, 4 / 40, 12 / 30, 20 / 40], [20 / 30, 30 / 40, 1, 1]],
                               atol=1e-6)
    assert det.classes.tolist() == [1, 3] and det.class_text == ("cat", "dog")
    report = outcome.report
    # Per object written: its class and box area in output pixels (the dog's clipped to 10x10).
    assert report.objects == ((1, 160.0), (3, 100.0))
    assert dict(report.counts) == {"box_clipped": 1, "box_empty": 1}
    assert [(p.source, p.reason, p.kept) for p in report.problems] == [
        ("a.json: annotation 9", "box_empty", "image"), ("a.json: annotation 10", "box_not_finite", "image")]
    # The not-finite box is counted once, by the problem (the builder's counts lack it).
    assert dict(report_counts(report)) == {"box_clipped": 1, "box_empty": 1, "box_not_finite": 1}


def test_a_label_minus_one_without_annotations_has_no_class_keys_and_a_label_keeps_them(tmp_path):
    data = _png(str(tmp_path / "a.png"))
    bare = ImageRef("train", "k", "a.png", str(tmp_path / "a.png"), len(data), -1, "")
    serialized, outcome = ImageRecordBuilder().example(bare, data)
    assert b"image/class/" not in serialized and outcome.report is None
    labelled = ImageRef("train", "k", "a.png", str(tmp_path / "a.png"), len(data), 2, "two")
    assert b"image/class/label" in ImageRecordBuilder().example(labelled, data)[0]
    # Several labels from the attachment: the lists, though the listing's label is -1.
    several = ImageRef("train", "k", "a.png", str(tmp_path / "a.png"), len(data), -1, "", annotation=(
        encode_annotations(ImageAnnotations("a.png", "a.png", labels=(1, 3), texts=("cat", "dog")))))
    det = decode_detection(ImageRecordBuilder(attach=AnnotationAttach(None, LABELS)).example(several, data)[0])
    assert det.image_labels.tolist() == [1, 3] and det.image_texts == ("cat", "dog")


def test_a_shard_folds_statistics_and_dead_letters_dropped_objects_outside_the_budget(tmp_path):
    out = tmp_path / "out"
    data = _png(str(tmp_path / "a.png"))
    _png(str(tmp_path / "b.png"))
    refs = [_ref(str(tmp_path / "a.png"), "a.png", data),
            _ref(str(tmp_path / "b.png"), "b.png", data, objects=()),  # A negative example.
            ImageRef("train", "c.png", "c.png", str(tmp_path / "gone.png"), 10, -1, "")]  # Unreadable.
    spec = shard_spec("train", 0, 1, "none", 1000, ImageRefs.pack(refs))
    source = ImageRecords(attach=AnnotationAttach(None, LABELS))
    source.setup()
    try:
        target = ShardTarget(str(out), run_id="r1")
        result = write_shard(spec, target, source)
    finally:
        source.teardown()
    assert result.records == 2
    # The budget's counts: the one image that could not be read, not the dropped objects.
    assert dict(result.bad_counts) == {"read_error": 1}
    assert result.objects_dead_lettered == 2
    # Staged in the run's temporary folder until the commit publishes them.
    with open(Path(target.temp_dir) / result.dead_letter_path, encoding="utf-8") as f:
        letters = [json.loads(line) for line in f]
    objects = [(d["source"], d["stage"], d["error"]) for d in letters if d["stage"] == "object"]
    assert objects == [("a.json: annotation 9", "object", "box_empty"),
                       ("a.json: annotation 10", "object", "box_not_finite")]
    assert all("a.png, the image kept" in d["message"] for d in letters if d["stage"] == "object")
    stats = result.annotations.to_json(LABELS)
    assert (stats["images"], stats["images_without_objects"], stats["objects"]) == (2, 1, 2)
    assert stats["areas"] == {"large": 0, "medium": 0, "small": 2}
    assert [(c["id"], c["text"], c["objects"]) for c in stats["classes"]] == [(1, "cat", 1), (3, "dog", 1)]
    assert stats["problems"] == {"box_clipped": 1, "box_empty": 1, "box_not_finite": 1}
    with open(result.temp_path, "rb") as f:
        records = list(iter_records(f))
    assert [decode_detection(r).source_id for r in records] == ["77", "77"]
    assert result.label_counts == ()  # Detection records have no image label to count.



def test_a_segmentation_the_renderer_refuses_is_an_empty_mask_counted_and_the_object_kept(tmp_path):
    data = _png(str(tmp_path / "a.png"))
    wrong = Rle((5, 5), (25,))  # An RLE of a 5x5 image, for a 40x30 one.
    objects = (ObjectAnnotation((4.0, 2.0, 20.0, 12.0), 1, "cat", segmentation=wrong, source="a.json: annotation 7"),
               ObjectAnnotation((0.0, 0.0, 10.0, 10.0), 3, "dog", source="a.json: annotation 8"))
    ref = _ref(str(tmp_path / "a.png"), "a.png", data, objects)
    attach = AnnotationAttach(None, LABELS, AnnotationOptions(instance_masks=True), render_mask)
    serialized, outcome = ImageRecordBuilder(attach=attach).example(ref, data)
    det = decode_detection(serialized, include_mask=True)
    assert det.classes.tolist() == [1, 3]
    assert det.masks[0].sum() == 0 and det.masks[1].sum() == 100  # The dog's box, filled.
    assert dict(outcome.report.counts) == {"mask_from_box": 1, "segmentation_invalid": 1}
