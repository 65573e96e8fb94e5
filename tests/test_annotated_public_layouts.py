"""The public annotated layouts as their users have them (issue 21, second round): the
folder VOC's tar extracts (``VOCdevkit/VOC2012``), Roboflow's YOLO and COCO exports, a
darknet folder, COCO as downloaded (``annotations/instances_train2017.json`` beside
``train2017/``). What cannot be read is refused before anything runs (exit 2, one line
naming what to pass), what can is read with its splits, folders and label map right.
"""

from __future__ import annotations

import json
import os
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.transforms.annotated_inputs import (
    AnnotationArgs,
    detect_annotated_layout,
    list_annotated,
)
from beam_tfrecords.transforms.codec.coco import read_coco
from tests.harness.attack_table import cli


def _jpeg() -> bytes:
    out = BytesIO()
    Image.new("RGB", (32, 24), (200, 80, 40)).save(out, "JPEG")
    return out.getvalue()


def _write(root: Path, tree: dict) -> str:
    """``tree`` (relative path -> text or bytes) written under ``root``."""
    for name in sorted(tree):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        content = tree[name]
        (root / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return str(root)


def _xml(name: str) -> str:
    return (f"<annotation><filename>{name}</filename><size><width>32</width><height>24</height>"
            "</size><object><name>cat</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>20</xmax>"
            "<ymax>20</ymax></bndbox></object></annotation>")


def _voc(root: Path) -> str:
    """A miniature of VOCdevkit/VOC2012: two annotated images, one test image without
    XML that test.txt lists, one test.txt id with neither, a segmentation mask."""
    jpeg = _jpeg()
    return _write(root, {
        "Annotations/a.xml": _xml("a.jpg"), "Annotations/b.xml": _xml("b.jpg"),
        "JPEGImages/a.jpg": jpeg, "JPEGImages/b.jpg": jpeg, "JPEGImages/t.jpg": jpeg,
        "ImageSets/Main/train.txt": "a\n", "ImageSets/Main/val.txt": "b\n",
        "ImageSets/Main/test.txt": "t\ngone\n", "SegmentationClass/a.png": jpeg,
    })


def _coco(images: list[tuple[int, str]], annotations: list[tuple[int, int, int]],
          categories=((1, "cat"),)) -> str:
    return json.dumps({
        "images": [{"id": i, "file_name": name, "width": 32, "height": 24} for i, name in images],
        "annotations": [{"id": a, "image_id": i, "category_id": c, "bbox": [1, 1, 5, 5], "area": 25,
                         "iscrowd": 0} for a, i, c in annotations],
        "categories": [{"id": c, "name": n} for c, n in categories]})


def _coco_download(root: Path) -> str:
    """COCO as downloaded: file_name relative to train2017/ and val2017/."""
    jpeg = _jpeg()
    return _write(root, {
        "train2017/000000000139.jpg": jpeg, "train2017/000000000285.jpg": jpeg, "val2017/000000000632.jpg": jpeg,
        "annotations/instances_train2017.json": _coco([(139, "000000000139.jpg"), (285, "000000000285.jpg")],
                                                      [(1, 139, 1)]),
        "annotations/instances_val2017.json": _coco([(632, "000000000632.jpg")], [(2, 632, 1)]),
    })


def _roboflow_yolo(root: Path) -> str:
    files = {"data.yaml": "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 2\n"
                          "names: ['helmet', 'head']\n\nroboflow:\n  workspace: w\n  version: 1\n"}
    for split in ("train", "valid", "test"):
        files[f"{split}/images/x_{split}.rf.1.jpg"] = _jpeg()
        files[f"{split}/labels/x_{split}.rf.1.txt"] = "0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n"
    return _write(root, files)


def _refs(listing) -> dict:
    return {ref.filename: ref.split for ref in listing.refs}


@pytest.mark.unit
def test_a_roboflow_yolo_export_is_yolo_under_auto(tmp_path):
    root = _roboflow_yolo(tmp_path / "rf")
    assert detect_annotated_layout(root, AnnotationArgs()) == "yolo"
    listing = list_annotated(root, "yolo")
    assert _refs(listing) == {"train/images/x_train.rf.1.jpg": "train",
                              "valid/images/x_valid.rf.1.jpg": "validation", "test/images/x_test.rf.1.jpg": "test"}
    assert listing.annotated.run.label_map.items == ((1, "helmet"), (2, "head"))
    assert listing.annotated.objects == 6 and not listing.dead_letters


@pytest.mark.unit
def test_coco_images_are_found_where_the_download_and_roboflow_put_them(tmp_path):
    root = _coco_download(tmp_path / "coco")
    notes = ("instances_train2017.json (split train): images under train2017/",
             "instances_val2017.json (split validation): images under val2017/")
    given = f"train={root}/annotations/instances_train2017.json,valid={root}/annotations/instances_val2017.json"
    listing = list_annotated(root, "coco", args=AnnotationArgs(annotations=given))
    # image/filename is the path under --input; valid means validation, as VOC's and YOLO's val.
    assert _refs(listing) == {"train2017/000000000139.jpg": "train", "train2017/000000000285.jpg": "train",
                              "val2017/000000000632.jpg": "validation"}
    assert listing.annotated.notes == notes and not listing.dead_letters
    # Roboflow's COCO export: _annotations.coco.json beside its images, --input above them.
    rf = _write(tmp_path / "rf", {"train/a.rf.1.jpg": _jpeg(),
                                  "train/_annotations.coco.json": _coco([(0, "a.rf.1.jpg")], [(0, 0, 1)])})
    listing = list_annotated(rf, "coco", args=AnnotationArgs(annotations=f"train={rf}/train/_annotations.coco.json"))
    assert _refs(listing) == {"train/a.rf.1.jpg": "train"}
    assert listing.annotated.notes == ("_annotations.coco.json (split train): images under train/",)


@pytest.mark.unit
def test_a_coco_category_id_0_no_annotation_uses_is_left_out_of_the_label_map(tmp_path):
    # Roboflow's COCO export: id 0 is the supercategory, no annotation uses it.
    root = _write(tmp_path / "rf", {"a.jpg": _jpeg(), "_annotations.coco.json": _coco(
        [(0, "a.jpg")], [(0, 0, 1)], categories=((0, "helmets"), (1, "head")))})
    listing = list_annotated(root, "coco", args=AnnotationArgs(annotations=f"{root}/_annotations.coco.json"))
    assert listing.annotated.run.label_map.items == ((1, "head"),)
    assert "category id 0 has no annotation: left out of the label map (id 0 is the background)" \
        in listing.annotated.notes


@pytest.mark.unit
def test_the_objects_of_a_coco_entry_repeating_a_file_name_are_counted(tmp_path):
    data = _coco([(1, "a.jpg"), (2, "a.jpg")], [(10, 1, 1), (11, 2, 1), (12, 2, 1)]).encode()
    read = read_coco(data, "i.json")
    assert [(i.path, len(i.objects)) for i in read.images] == [("a.jpg", 1)]
    assert [(p.source, p.reason, p.image, p.kept) for p in read.problems] == [
        ("i.json: image 2", "bad_image_entry", "a.jpg", "image"),  # a.jpg is converted: no bad input
        ("i.json: annotation 11", "bad_image_entry", "a.jpg", "image"),
        ("i.json: annotation 12", "bad_image_entry", "a.jpg", "image")]
    root = _write(tmp_path / "c", {"a.jpg": _jpeg(), "i.json": data})
    listing = list_annotated(root, "coco", args=AnnotationArgs(annotations=f"{root}/i.json"))
    assert [d.source for d in listing.skipped] == ["i.json: image 2", "i.json: annotation 11",
                                                   "i.json: annotation 12"]
    assert not listing.dead_letters  # The file the repeated entry names is converted (first entry).
    assert dict(listing.annotated.run.problems)["bad_image_entry"] == 3


@pytest.mark.unit
def test_a_voc_image_without_xml_is_counted_once_not_a_bad_input(tmp_path):
    listing = list_annotated(_voc(tmp_path / "VOCdevkit" / "VOC2012"), "voc")
    assert _refs(listing) == {"JPEGImages/a.jpg": "train", "JPEGImages/b.jpg": "validation"}
    assert listing.dead_letters == []  # t.jpg (in test.txt, no XML) is not a bad input
    assert listing.annotated.unnamed == 1  # t.jpg, counted once in the plan's note
    assert [(d.source, d.error) for d in listing.skipped] == [("ImageSets/Main/test.txt:2", "annotation_not_found")]


def _refusals(tmp_path: Path) -> dict:
    voc = _voc(tmp_path / "VOCdevkit" / "VOC2012")
    devkit = str(Path(voc).parent)
    ultra = _write(tmp_path / "ultra", {"images/train/a.jpg": _jpeg(), "labels/train/a.txt": "0 .5 .5 .2 .2\n",
                                        "data.yaml": "train: images/train\nnames: [a]\n"})
    listed = _write(tmp_path / "listed", {"images/train/a.jpg": _jpeg(), "train.txt": "./images/train/a.jpg\n",
                                          "labels/train/a.txt": "0 0.5 0.5 0.2 0.2\n",
                                          "data.yaml": "train: train.txt\nnames: [a]\n"})
    darknet = _write(tmp_path / "darknet", {"obj/a.jpg": _jpeg(), "obj/a.txt": "0 0.5 0.5 0.2 0.2\n",
                                            "classes.txt": "person\n"})
    coco = _coco_download(tmp_path / "coco")
    bad = _write(tmp_path / "bad", {"a.json": "{not json"}) + "/a.json"
    zero = _write(tmp_path / "zero", {"a.jpg": _jpeg(), "z.json": _coco([(1, "a.jpg")], [(1, 1, 0)], ((0, "bg"),))})
    return {"devkit": devkit, "voc": voc, "ultra": ultra, "listed": listed, "darknet": darknet, "coco": coco,
            "bad": bad, "zero": zero}


REFUSED = [
    (["--input", "{devkit}"], "--input {devkit}: this is not a Pascal VOC folder but it holds the Pascal VOC "
     "folder VOC2012; pass --input {voc} (the folder holding Annotations/ and JPEGImages/)"),
    (["--input", "{devkit}", "--layout", "voc"], "--layout voc: {devkit} has no Annotations/ folder; it holds"),
    (["--input", "{ultra}", "--layout", "voc"], "--layout voc: {ultra} has no Annotations/ folder"),
    (["--input", "{voc}", "--layout", "yolo"], "--layout yolo: {voc} has no data.yaml"),
    (["--input", "{listed}"], "--input {listed}: data.yaml is not read: train names a file list"),
    (["--input", "{darknet}"], "--input {darknet}: a darknet YOLO folder (classes.txt or obj.names"),
    (["--input", "{coco}/val2017", "--annotations", "{bad}"], "--annotations {bad}: not valid JSON (line 1"),
    (["--input", "{coco}/train2017", "--annotations", "{coco}/annotations/instances_val2017.json"],
     "--input {coco}/train2017: no image to convert: 1 image_not_found (the first: instances_val2017.json: "
     "image 632: no such file under --input (image 000000000632.jpg))"),
    (["--input", "{coco}", "--annotations", "val={bad},validation={bad}"],
     "--annotations names the split validation twice"),
    (["--input", "{zero}", "--annotations", "{zero}/z.json"], "--annotations: category id 0 is used by 1 "
     "annotation(s) (the first: z.json: annotation 1); id 0 is the background"),
]


@pytest.mark.e2e
def test_public_layouts_that_cannot_be_read_are_refused_in_one_line(tmp_path, capsys):
    inputs = _refusals(tmp_path)
    for argv, message in REFUSED:
        out = tmp_path / "out"
        code = main(["convert", "--output", str(out), "--progress", "off", *[a.format(**inputs) for a in argv]])
        err = capsys.readouterr().err.strip()
        assert code == 2, (argv, err)
        assert len(err.splitlines()) == 1 and message.format(**inputs) in err, (argv, err)
        assert not os.path.exists(out)
    # Through the real CLI, once: the exit code and the one line a user sees.
    run = cli(tmp_path, "convert", "--input", inputs["devkit"], "--output", str(tmp_path / "out"))
    assert run.exit == 2 and run.stderr.strip().endswith(
        f"pass --input {inputs['voc']} (the folder holding Annotations/ and JPEGImages/); or, if its folders "
        "are classes, say --layout class_folders"), run.stderr
