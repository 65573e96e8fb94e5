"""The COCO instances reader (transforms/codec/coco.py): what it takes, and every problem
it plants a reason, a source and what was kept for."""

from __future__ import annotations

import json

import numpy as np
import pytest

from beam_tfrecords.schemas.annotations import PROBLEM_REASONS, Polygons, Rle
from beam_tfrecords.transforms.codec.coco import merge_coco, read_coco
from beam_tfrecords.transforms.codec.masks import mask_to_rle, render_rle, rle_to_string

pytestmark = pytest.mark.unit

NAME = "instances_val.json"
CROWD = np.zeros((4, 6), np.uint8)
CROWD[1:3, 2:5] = 1
CROWD_RUNS = mask_to_rle(CROWD).counts


def _document() -> dict:
    """Three usable images (one without objects, one whose file is missing), two refused
    image entries, categories with a gap, and one annotation per case."""
    images = [
        {"id": 7, "file_name": "b/seven.jpg", "width": 6, "height": 4},
        {"id": 3, "file_name": "a/three.jpg", "width": 6, "height": 4},
        {"id": 9, "file_name": "empty.jpg", "width": 6, "height": 4},
        {"id": 11, "file_name": "gone.jpg", "width": 6, "height": 4},
        {"id": 12, "file_name": "../../outside/secret-name.jpg", "width": 6, "height": 4},
        {"id": 7, "file_name": "again.jpg", "width": 6, "height": 4},
        {"id": 13, "file_name": "huge.jpg", "width": 10 ** 400, "height": 4},
    ]
    polygon = [[0.5, 0.5, 4.5, 0.5, 4.5, 3.5]]
    annotations = [
        {"id": 101, "image_id": 7, "category_id": 3, "bbox": [1, 2, 3, 1.5], "area": 4.5, "iscrowd": 0,
         "segmentation": polygon},
        {"id": 102, "image_id": 3, "category_id": 1, "bbox": [0, 0, 6, 4], "area": 6, "iscrowd": 1,
         "segmentation": {"size": [4, 6], "counts": rle_to_string(CROWD_RUNS)}},
        {"id": 103, "image_id": 7, "category_id": 1, "bbox": [2, 1, 3, 2], "iscrowd": 1,
         "segmentation": {"size": [4, 6], "counts": list(CROWD_RUNS)}},
        {"id": 104, "image_id": 404, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"id": 105, "image_id": 7, "category_id": 2, "bbox": [0, 0, 1, 1]},
        {"id": 106, "image_id": 3, "category_id": 1, "bbox": [float("nan"), 0, 1, 1]},
        {"id": 107, "image_id": 3, "category_id": 1},
        {"id": 108, "image_id": 3, "category_id": 3, "bbox": [1, 1, 2, 2],
         "segmentation": [[1, 1, 3, 1], [1, 1, 3, 1, 3, 3], [0, 0, 5, 0, 1e9, 3]]},
        {"id": 109, "image_id": 3, "category_id": 3, "bbox": [1, 1, 2, 2],
         "segmentation": {"size": [5, 6], "counts": [30]}},
        {"id": 110, "image_id": 11, "category_id": 1, "bbox": [0, 0, 1, 1]},
        {"id": 111, "image_id": 3, "category_id": 1, "bbox": [0, 0, 10 ** 400, 1], "area": 10 ** 400},
        "not an object",
    ]
    categories = [{"id": 3, "name": "cat"}, {"id": 1, "name": "person"}, {"id": 3, "name": "dog"},
                  {"name": "no id"}]
    return {"info": {}, "images": images, "annotations": annotations, "categories": categories}


def _read(document: dict | None = None, **kwargs):
    data = json.dumps(document or _document(), allow_nan=True).encode()
    return read_coco(data, NAME, exists=lambda path: path != "gone.jpg", **kwargs)


def test_images_objects_and_label_map():
    result = _read()
    assert result.layout == "coco"
    assert result.label_map.items == ((1, "person"), (3, "cat"))
    by_path = {image.path: image for image in result.images}
    assert [image.path for image in result.images] == ["a/three.jpg", "b/seven.jpg", "empty.jpg"]
    seven, three, empty = by_path["b/seven.jpg"], by_path["a/three.jpg"], by_path["empty.jpg"]
    assert (seven.source_id, seven.stated_size, seven.split) == ("7", (6, 4), "")
    assert empty.objects == ()  # a negative example
    # File order per image; bbox [x, y, w, h] -> (x, y, x + w, y + h).
    assert [o.source for o in seven.objects] == [f"{NAME}: annotation 101", f"{NAME}: annotation 103"]
    polygon, crowd_list = seven.objects
    assert (polygon.box, polygon.label, polygon.text, polygon.is_crowd, polygon.area) == (
        (1.0, 2.0, 4.0, 3.5), 3, "cat", False, 4.5)
    assert polygon.segmentation == Polygons(((0.5, 0.5, 4.5, 0.5, 4.5, 3.5),))
    assert (crowd_list.is_crowd, crowd_list.area) == (True, None)
    # Both RLE forms give the same runs, which render to the planted mask.
    crowd_string = three.objects[0]
    assert crowd_string.is_crowd and crowd_string.source == f"{NAME}: annotation 102"
    assert crowd_string.segmentation == crowd_list.segmentation == Rle((4, 6), CROWD_RUNS)
    assert np.array_equal(render_rle(crowd_string.segmentation), CROWD)
    # 108 keeps its good ring, 109 its box without the RLE of the wrong size.
    assert [o.source.rsplit(" ", 1)[1] for o in three.objects] == ["102", "108", "109"]
    assert three.objects[1].segmentation == Polygons(((1.0, 1.0, 3.0, 1.0, 3.0, 3.0),))
    assert three.objects[2].segmentation is None


def test_every_problem_has_its_reason_source_and_what_was_kept():
    problems = [(p.source, p.reason, p.image, p.kept) for p in _read().problems]
    assert problems == [
        (f"{NAME}: category 3", "unknown_category", "", "image"),
        (f"{NAME}: category entry 3", "unknown_category", "", "image"),
        (f"{NAME}: image 11", "image_not_found", "gone.jpg", "nothing"),
        (f"{NAME}: image 12", "bad_image_entry", "", "nothing"),
        (f"{NAME}: image 7", "bad_image_entry", "again.jpg", "nothing"),
        (f"{NAME}: image 13", "bad_image_entry", "huge.jpg", "nothing"),
        (f"{NAME}: annotation 104", "unknown_image_id", "", "nothing"),
        (f"{NAME}: annotation 105", "unknown_category", "b/seven.jpg", "image"),
        (f"{NAME}: annotation 106", "box_not_finite", "a/three.jpg", "image"),
        (f"{NAME}: annotation 107", "box_not_finite", "a/three.jpg", "image"),
        (f"{NAME}: annotation 108", "segmentation_invalid", "a/three.jpg", "image"),
        (f"{NAME}: annotation 109", "segmentation_invalid", "a/three.jpg", "image"),
        (f"{NAME}: annotation 111", "box_not_finite", "a/three.jpg", "image"),
        (f"{NAME}: annotation entry 11", "bad_label_line", "", "nothing"),
    ]
    details = [p.detail for p in _read().problems][2:]
    assert "not a relative path" in details[1] and "id repeats" in details[2]
    assert "width and height are not whole numbers" in details[3]
    assert details[4] == "image_id 404 is not in images"
    assert "2 of 3 polygon rings left out (a ring with fewer than three points)" in details[8]
    assert "size 5x6 is not the image's 4x6" in details[9]
    assert all(p.reason in PROBLEM_REASONS for p in _read().problems)
    assert not any("secret-name" in d or "outside" in d for d in details)  # no file content quoted
    # Annotation 110 went with its missing image: no second problem for it.
    assert not any(p.source.endswith("annotation 110") for p in _read().problems)


@pytest.mark.parametrize("data, detail", [
    (b'{"images": [], "annotations": [', "not valid JSON (line 1, column 32; 31 bytes)"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    (b'[1, 2]', "the top level is not a JSON object"),
    (b'{"images": [], "annotations": {}}', "no list 'annotations', 'categories'"),
])
def test_a_bad_file_is_one_clear_problem(data, detail):
    result = read_coco(data, NAME)
    assert result.images == () and result.label_map.items == ()
    (problem,) = result.problems
    assert (problem.source, problem.reason, problem.kept) == (NAME, "bad_annotation_file", "nothing")
    assert detail in problem.detail


def test_merge_gives_each_part_its_split_and_reports_what_does_not_agree():
    train = _document()
    validation = {
        "images": [{"id": 1, "file_name": "v.jpg", "width": 6, "height": 4},
                   {"id": 2, "file_name": "empty.jpg", "width": 6, "height": 4}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 2, 2]},
                        {"id": 2, "image_id": 1, "category_id": 3, "bbox": [0, 0, 2, 2]},
                        {"id": 3, "image_id": 1, "category_id": 5, "bbox": [0, 0, 2, 2]}],
        "categories": [{"id": 1, "name": "person"}, {"id": 3, "name": "dog"}, {"id": 5, "name": "kite"}],
    }
    parts = [("train", _read(train)), ("validation", read_coco(json.dumps(validation).encode(), "val.json"))]
    merged = merge_coco(parts)
    assert merged.layout == "coco"
    assert merged.label_map.items == ((1, "person"), (3, "cat"), (5, "kite"))
    assert {image.path: image.split for image in merged.images} == {
        "a/three.jpg": "train", "b/seven.jpg": "train", "empty.jpg": "train", "v.jpg": "validation"}
    v = next(image for image in merged.images if image.path == "v.jpg")
    assert [o.label for o in v.objects] == [1, 5]
    assert merged.problems[:len(parts[0][1].problems)] == parts[0][1].problems
    added = [(p.source, p.reason, p.image, p.kept) for p in merged.problems[len(parts[0][1].problems):]]
    assert added == [
        ("val.json: image 2", "bad_image_entry", "empty.jpg", "nothing"),
        ("val.json: annotation 2", "unknown_category", "v.jpg", "image"),
    ]
    assert "also listed in split train" in merged.problems[-2].detail
    assert "another name in split validation than in split train" in merged.problems[-1].detail
