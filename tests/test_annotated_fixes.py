"""Issue 21, the tester's findings on annotated images (F6, F7, F8, F13, F15).

- F6: every record's keys and dtypes are exactly the manifest's ``features``
  (``annotated_output.annotated_feature_spec``), for every annotated layout, images
  without objects (or labels) included: checked at builder level, each generated set
  (``tests/harness/annotated_sets.py``) listed as ``convert`` lists it and built with
  the attachment the job graph makes. A several-labels record never holds
  ``image/object/*``; one without labels holds ``image/class/*`` as empty lists.
- F13: a several-labels run counts records per class (``labels.counts``, the
  ``images.classes`` the drift gate's ``class_share`` compares), so ``--compare_to``
  fails (exit 3) on another label set.
- F8: box CSV and several-labels rows are grouped by the normalized image path.
- F15: readable labels are taken (YOLO's ``0.0`` class, VOC's ``true``/``false``
  flags); a VOC object that does not parse is dropped as ``bad_object``; a box with
  swapped coordinates says so.
- F7: ``--labels`` reads an Object Detection API ``label_map.pbtxt`` with its ids; a
  label map that matches none of the annotations' classes refuses the run (exit 2).
"""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.job_graph import annotated_attach
from beam_tfrecords.schemas.annotations import ImageAnnotations, LabelMap, ObjectAnnotation
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.box_csv import csv_rows, image_path, read_box_rows, read_label_rows
from beam_tfrecords.transforms.codec.voc import parse_voc_xml
from beam_tfrecords.transforms.codec.yolo import parse_label_file
from beam_tfrecords.transforms.image_steps import ListingIdentity, list_images
from beam_tfrecords.transforms.io.annotated_output import annotated_feature_spec
from beam_tfrecords.transforms.io.detection_features import detection_features
from beam_tfrecords.transforms.io.image_records import Geometry, ImageRecordBuilder
from beam_tfrecords.transforms.plan.label_map_file import parse_label_map_pbtxt, read_label_map
from tests.harness import annotated_sets as sets
from tests.harness.attack_table import cli

_KINDS = {"bytes_list": "string", "int64_list": "int64", "float_list": "float32"}
_FLAGS = {"--input": "input", "--annotations": "annotations", "--masks": "masks", "--labels": "labels",
          "--label_separator": "label_separator"}


def _config(made: sets.AnnotatedSet, **more) -> ConvertConfig:
    options, flags = {"layout": made.layout, **more}, list(made.flags)
    while flags:
        flag = flags.pop(0)
        if flag == "--instance_masks":
            options["instance_masks"] = True
        else:
            options[_FLAGS[flag]] = flags.pop(0)
    return ConvertConfig(output="/nowhere", **options)


def _multi_label_with_an_image_without_labels(root: Path) -> sets.AnnotatedSet:
    made = sets.make_multi_label(root)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / "images" / "e.png")
    with open(root / "tags.csv", "a", encoding="utf-8") as f:
        f.write("images/e.png,\n")
    return made


_MAKERS = {"box_csv": sets.make_box_csv, "coco_masks": sets.make_coco, "voc": sets.make_voc,
           "yolo": sets.make_yolo, "masks": sets.make_semantic_masks,
           "multi_label": _multi_label_with_an_image_without_labels}


@pytest.mark.unit
@pytest.mark.parametrize("kind", [*_MAKERS, "coco"])
def test_every_record_holds_exactly_the_manifest_features_in_every_layout(kind, tmp_path):
    made = _MAKERS["coco_masks" if kind == "coco" else kind](tmp_path)
    if kind == "coco":
        made.flags.remove("--instance_masks")
    listing = list_images(*ListingIdentity.of(_config(made)))
    run = listing.annotated.run
    attach, _ = annotated_attach(types.SimpleNamespace(annotated=run), None)
    spec = {name: (dtype, shape) for name, dtype, shape in annotated_feature_spec(run).entries()}
    builder = ImageRecordBuilder(attach=attach)
    empty = 0
    for ref in listing.refs:
        serialized, outcome = builder.example(ref, Path(ref.path).read_bytes())
        example = example_pb2.Example.FromString(serialized)
        held = {}
        for name, feature in example.features.feature.items():
            kind_of = feature.WhichOneof("kind")
            held[name] = (_KINDS[kind_of], len(getattr(feature, kind_of).value))
        assert set(held) == set(spec), (ref.filename, sorted(set(held) ^ set(spec)))
        for name, (dtype, count) in held.items():
            assert dtype == spec[name][0], (ref.filename, name)
            assert spec[name][1] == [None] or count == 1, (ref.filename, name, count)
        if kind == "multi_label":
            assert not any(name.startswith("image/object/") for name in held)
            assert outcome.report.labels == tuple(example.features.feature["image/class/text"].bytes_list.value[i]
                                                  .decode() for i in range(held["image/class/text"][1]))
        empty += held.get("image/object/bbox/xmin", held.get("image/class/label", (0, 1)))[1] == 0
    # The set's image without objects (or labels) was checked (a semantic mask's records have no boxes).
    assert empty == (len(listing.refs) if kind == "masks" else 1)


@pytest.mark.e2e
def test_several_labels_are_counted_per_class_and_the_drift_gate_sees_another_label_set(tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for i, size in enumerate(((16, 12), (20, 10), (12, 12))):
        Image.fromarray(np.full((size[1], size[0], 3), 40 * i, np.uint8)).save(images / f"{i}.png")
    (tmp_path / "a.csv").write_text("image,label\nimages/0.png,cat\nimages/0.png,outdoor\nimages/1.png,dog\n"
                                    "images/2.png,cat\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text("image,label\nimages/0.png,zebra\nimages/0.png,horse\nimages/1.png,zebra\n",
                                    encoding="utf-8")
    first = cli(tmp_path, "convert", "--input", str(tmp_path / "a.csv"), "--layout", "multi_label",
                "--output", str(tmp_path / "a"), "--progress", "off")
    assert first.exit == 0, first.stderr[-2000:]
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["labels"]["counts"] == {"train": {"cat": 2, "dog": 1, "outdoor": 1}}
    assert manifest["splits"]["train"]["statistics"]["images"]["classes"] == {"cat": 2, "dog": 1, "outdoor": 1}
    second = cli(tmp_path, "convert", "--input", str(tmp_path / "b.csv"), "--layout", "multi_label",
                 "--output", str(tmp_path / "b"), "--compare_to", str(tmp_path / "a"), "--progress", "off")
    assert second.exit == 3, second.stderr[-2000:]
    assert "class 'zebra' share moved 1.00 (0.00 -> 1.00" in second.stdout + second.stderr
    assert not (tmp_path / "b" / "manifest.json").exists()


@pytest.mark.unit
def test_rows_of_one_image_spelled_several_ways_are_one_image():
    text = ("filename,class,xmin,ymin,xmax,ymax\nimages/a.jpg,cat,1,1,10,10\n./images/a.jpg,dog,2,2,9,9\n"
            "images//a.jpg,cat,3,3,8,8\ngs://b/x//y.jpg,cat,1,1,2,2\n")
    found = read_box_rows(*csv_rows(text), source="b.csv", image_column="filename", class_column="class")
    assert [(i.path, [o.source for o in i.objects]) for i in found.images] == [
        ("gs://b/x//y.jpg", ["b.csv:5"]), ("images/a.jpg", ["b.csv:2", "b.csv:3", "b.csv:4"])]
    labels = read_label_rows(*csv_rows("image,label\nimages/a.jpg,cat\n./images/a.jpg,dog\n"), source="t.csv",
                             image_column="image", label_column="label")
    assert [(i.path, i.texts) for i in labels.images] == [("images/a.jpg", ("cat", "dog"))]
    assert [image_path(p) for p in ("/data//a.jpg", "//data/a.jpg", "a/../b.jpg", "")] == [
        "/data/a.jpg", "/data/a.jpg", "b.jpg", ""]


def _voc(objects: str) -> bytes:
    return (f"<annotation><filename>a.jpg</filename><size><width>20</width><height>10</height></size>"
            f"{objects}</annotation>").encode()


def _object(name: str, difficult: str = "0", xmin: str = "1") -> str:
    return (f"<object><name>{name}</name><difficult>{difficult}</difficult><truncated>{difficult}</truncated>"
            f"<bndbox><xmin>{xmin}</xmin><ymin>1</ymin><xmax>5</xmax><ymax>5</ymax></bndbox></object>")


@pytest.mark.unit
def test_readable_labels_are_taken_and_what_does_not_parse_drops_one_object():
    objects, problems = parse_label_file("0.0 0.5 0.5 0.2 0.2\n1.5 0.5 0.5 0.2 0.2\n", "l/a.txt", ((0, "x"),))
    assert [(o.label, o.text) for o in objects] == [(1, "x")]
    assert [(p.source, p.reason, p.kept) for p in problems] == [("l/a.txt:2", "bad_label_line", "image")]
    found = parse_voc_xml(_voc(_object("a", "true") + _object("b", "No") + _object("c", "maybe")
                               + _object("d", xmin="one") + _object("e", "YES")), "Annotations/a.xml")
    assert [(o.name, o.difficult, o.truncated) for o in found.objects] == [
        ("a", True, True), ("b", False, False), ("e", True, True)]
    assert [(p.source, p.reason, p.kept) for p in found.problems] == [
        ("Annotations/a.xml: object 3", "bad_object", "image"), ("Annotations/a.xml: object 4", "bad_object", "image")]
    assert "difficult" in found.problems[0].detail and "maybe" not in found.problems[0].detail
    swapped = ImageAnnotations("a.png", "a.png", (ObjectAnnotation((10.0, 1.0, 5.0, 8.0), 1, "x", source="b.csv:2"),))
    found = detection_features(swapped, Geometry((20, 10), (20, 10)), LabelMap(((1, "x"),)))
    assert [(p.reason, p.detail) for p in found.problems] == [
        ("box_empty", "the coordinates are swapped (xmin > xmax): the box has no area as given")]


@pytest.mark.unit
def test_a_label_map_pbtxt_gives_its_ids_and_a_labels_file_its_line_order(tmp_path):
    text = ("# from the Object Detection API\nitem {\n  id: 3\n  name: 'car'  # a comment\n}\n"
            "item { id: 1 display_name: \"person\" }\nitem {\n  name: \"it's\"\n  id: 7\n  frequency: FREQUENT\n}\n")
    assert parse_label_map_pbtxt(text) == LabelMap(((1, "person"), (3, "car"), (7, "it's")))
    assert read_label_map("dog\ncat\n") == LabelMap(((1, "dog"), (2, "cat")))
    for bad, says in (("item { id: 0 name: 'a' }", "above 0"), ("item { id: 1 }", "no name"),
                      ("item { id: 1 name: 'a' }\nitem { id: 1 name: 'b' }", "id 1 appears twice"),
                      ("item { id: 1 name: 'a }", "unclosed quote"), ("item { id: 1 name: 'a' } x", "line 1")):
        with pytest.raises(ValueError, match=says):
            parse_label_map_pbtxt(bad)
    made = sets.make_voc(tmp_path / "voc")
    (tmp_path / "map.pbtxt").write_text("item {\n  id: 5\n  name: 'person'\n}\nitem {\n  id: 9\n  name: 'car'\n}\n")
    listing = list_images(*ListingIdentity.of(_config(made, labels=str(tmp_path / "map.pbtxt"))))
    assert listing.annotated.run.label_map == LabelMap(((5, "person"), (9, "car")))
    assert listing.annotated.run.problems == ()  # Every class named: nothing left out.


@pytest.mark.e2e
def test_a_label_map_matching_no_class_refuses_the_run_in_one_line(tmp_path):
    made = sets.make_voc(tmp_path / "voc")
    (tmp_path / "map.pbtxt").write_text("item {\n  id: 1\n  name: 'dog'\n}\n")
    run = cli(tmp_path, "convert", *made.flags, "--labels", str(tmp_path / "map.pbtxt"),
              "--output", str(tmp_path / "out"), "--progress", "off")
    assert run.exit == 2
    line = run.stderr.strip().splitlines()[-1]
    assert "names none of the annotations' classes (the first: \"person\", \"car\")" in line
    assert "all 5 objects would be left out as unknown_category" in line
    assert not (tmp_path / "out").exists()
