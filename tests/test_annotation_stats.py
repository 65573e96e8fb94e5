"""Annotation statistics (issue 21): exact figures of a hand-made set, merges that equal
one pass in any order, and JSON that is the same bytes every time."""

import json

import pytest

from beam_tfrecords.schemas.annotations import LabelMap
from beam_tfrecords.transforms.quality.annotation_stats import (
    AnnotationStatistics,
    area_range,
    object_class_shares,
)

pytestmark = pytest.mark.unit

LABELS = LabelMap(((1, "cat"), (2, "dog"), (3, "bird")))
# (width, height, [(class id, box area in output pixels)], [(reason, n)]) per image.
IMAGES = [
    (100, 100, [(1, 1023.0), (1, 1024.0), (2, 9216.0)], []),  # Just under 32², 32², 96².
    (50, 40, [], [("box_empty", 1)]),                           # No object left.
    (200, 200, [(2, 9215.999), (2, 40000.0)], [("box_clipped", 1)]),  # Just under 96², the whole image.
    (10, 10, [(1, 0.5)], []),
    (64, 64, [(2, 100.0)] * 5, [("box_clipped", 2), ("box_empty", 1)]),
]
NO_AREAS = {"large": 0, "medium": 0, "small": 0}


def _stats(images) -> AnnotationStatistics:
    stats = AnnotationStatistics()
    for width, height, objects, counts in images:
        stats.add(width, height, objects, counts)
    return stats


def _bytes(stats: AnnotationStatistics) -> bytes:
    return json.dumps(stats.to_json(LABELS)).encode()


def test_a_hand_made_set_gives_exact_figures():
    assert _stats(IMAGES).to_json(LABELS) == {
        "areas": {"large": 2, "medium": 2, "small": 7},
        "classes": [
            {"areas": {"large": 0, "medium": 1, "small": 2}, "id": 1, "objects": 3, "text": "cat"},
            {"areas": {"large": 2, "medium": 1, "small": 5}, "id": 2, "objects": 8, "text": "dog"},
        ],
        "images": 5,
        "images_without_objects": 1,
        "objects": 11,
        "objects_per_image": {
            "histogram": [{"images": 1, "objects": "0"}, {"images": 1, "objects": "1"},
                          {"images": 1, "objects": "2"}, {"images": 2, "objects": "3-5"},
                          {"images": 0, "objects": "6-10"}, {"images": 0, "objects": "11-20"},
                          {"images": 0, "objects": "21+"}],
            "max": 5, "mean": 2.2, "min": 0},
        "problems": {"box_clipped": 3, "box_empty": 2},
    }
    assert object_class_shares(_stats(IMAGES).to_json(LABELS)) == {"cat": 3 / 11, "dog": 8 / 11}


@pytest.mark.parametrize("area, expected", [
    (0.0, "small"), (1023.999, "small"), (1024.0, "medium"), (9215.999, "medium"),
    (9216.0, "large"), (1e9, "large")])
def test_coco_area_ranges_at_their_edges(area, expected):
    assert area_range(area) == expected


def test_histogram_edges_nothing_and_an_id_without_text():
    counts = [0, 5, 6, 10, 11, 20, 21, 40]
    stats = _stats([(10, 10, [(7, 1.0)] * n, []) for n in counts])
    histogram = {b["objects"]: b["images"] for b in stats.to_json(LABELS)["objects_per_image"]["histogram"]}
    assert histogram == {"0": 1, "1": 0, "2": 0, "3-5": 1, "6-10": 2, "11-20": 2, "21+": 2}
    assert stats.to_json(LABELS)["classes"] == [
        {"areas": {"large": 0, "medium": 0, "small": 113}, "id": 7, "objects": 113, "text": None}]
    assert object_class_shares(stats.to_json(LABELS)) == {"id 7": 1.0}
    empty = AnnotationStatistics().to_json(LABELS)
    assert (empty["images"], empty["objects"], empty["areas"], empty["classes"]) == (0, 0, NO_AREAS, [])
    assert {k: empty["objects_per_image"][k] for k in ("min", "max", "mean")} == dict.fromkeys(("min", "max", "mean"))
    assert object_class_shares(empty) == {}


def test_merged_halves_equal_one_pass_in_either_order():
    one_pass = _bytes(_stats(IMAGES))
    first, second = IMAGES[:2], IMAGES[2:]
    assert _bytes(_stats(first).merge(_stats(second))) == one_pass
    assert _bytes(_stats(second).merge(_stats(first))) == one_pass
    assert _bytes(AnnotationStatistics().merge(_stats(IMAGES[::-1]))) == one_pass
    interleaved = _stats(IMAGES[1::2]).merge(_stats(IMAGES[::2]))
    assert interleaved == _stats(IMAGES)


def test_to_json_is_byte_stable_with_sorted_keys():
    stats = _stats(IMAGES[:1])
    text = json.dumps(stats.to_json(LABELS))
    assert text == json.dumps(stats.to_json(LABELS), sort_keys=True) == json.dumps(
        json.loads(text), sort_keys=True)
    assert text == (
        '{"areas": {"large": 1, "medium": 1, "small": 1}, "classes": ['
        '{"areas": {"large": 0, "medium": 1, "small": 1}, "id": 1, "objects": 2, "text": "cat"}, '
        '{"areas": {"large": 1, "medium": 0, "small": 0}, "id": 2, "objects": 1, "text": "dog"}], '
        '"images": 1, "images_without_objects": 0, "objects": 3, "objects_per_image": {"histogram": ['
        '{"images": 0, "objects": "0"}, {"images": 0, "objects": "1"}, {"images": 0, "objects": "2"}, '
        '{"images": 1, "objects": "3-5"}, {"images": 0, "objects": "6-10"}, '
        '{"images": 0, "objects": "11-20"}, {"images": 0, "objects": "21+"}], '
        '"max": 3, "mean": 3.0, "min": 3}, "problems": {}}')
    # What an old manifest holds gives the same shares as the run's own statistics.
    assert object_class_shares(json.loads(text)) == object_class_shares(stats.to_json(LABELS)) == {
        "cat": 2 / 3, "dog": 1 / 3}


@pytest.mark.parametrize("width, height, objects", [
    (0, 10, []), (10, 10, [(1, 100.001)]), (10, 10, [(1, -1.0)]), (10, 10, [(1, float("nan"))])])
def test_facts_that_cannot_be_are_refused(width, height, objects):
    stats = AnnotationStatistics()
    with pytest.raises(ValueError):
        stats.add(width, height, objects)
    assert stats == AnnotationStatistics()
