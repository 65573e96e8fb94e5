"""YOLO (Ultralytics layout): a dataset generated in tmp_path, listed and read with
transforms.io.files, read by transforms.plan.annotation_folders (codec.yolo parses it).

``names`` as a list in data.yaml and as a mapping in another *.yaml; an image without a
label file, one with an empty file, bad lines, an orphan label file. Boxes are chosen
exact in binary, so corners compare exactly.
"""

import os

import pytest

from beam_tfrecords.schemas.annotations import PROBLEM_REASONS, ObjectAnnotation
from beam_tfrecords.transforms.codec.yolo import parse_data_yaml
from beam_tfrecords.transforms.io.files import list_under, read_bytes
from beam_tfrecords.transforms.plan.annotation_folders import (
    detect_annotation_layout,
    read_yolo_folder,
    yolo_label_path,
)

pytestmark = pytest.mark.unit

FILES = {
    "images/train/a.jpg": "x", "labels/train/a.txt": "0 0.5 0.5 0.25 0.5\n\n1 0.25 0.75 0.5 0.5\n",
    "images/train/b.jpg": "x",                                    # no label file
    "images/train/sub/c.png": "x",
    "labels/train/sub/c.txt": "0 0.125 0.125 0.25 0.25\n0 SECRET 1 2 3\n5 0.5 0.5 0.1 0.1\n1 nan 0.5 0.1 0.1\n0 1 2 3 4 5\n",
    "images/train/e.jpg": "x", "labels/train/e.txt": "",          # empty label file
    "images/val/d.jpg": "x", "labels/val/d.txt": "1 0.5 0.5 1 1\n0 0.5 0.25 0.75 0.5 0.25 1 0.5 0.25\n",
    "labels/val/orphan.txt": "0 0.5 0.5 0.1 0.1\n",
    "images/unlisted/f.jpg": "x",                                 # no split names it: not read
}
AS_LIST = ("data.yaml", "path: .\ntrain: images/train\nval: images/val\nnames: [cat, dog]\n")
AS_MAPPING = ("coco8.yaml", "train: images/train\nval: [images/val]\nnames:\n  1: dog\n  0: cat\n")


@pytest.fixture(params=[AS_LIST, AS_MAPPING], ids=["names_list", "names_mapping"])
def yolo(tmp_path, request):
    name, text = request.param
    for rel, content in {**FILES, name: text}.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    root = str(tmp_path)
    paths = [os.path.relpath(p, root).replace(os.sep, "/") for p, _ in list_under(root)]
    return paths, lambda rel: read_bytes(os.path.join(root, rel)), name


def test_yolo_folder_is_detected_and_read(yolo):
    paths, read, yaml_name = yolo
    assert detect_annotation_layout(paths, read) == "yolo"
    if yaml_name == "coco8.yaml":  # only data.yaml counts when the files cannot be read
        assert detect_annotation_layout(paths) is None
    found = read_yolo_folder(paths, read)
    assert found.layout == "yolo"
    assert found.label_map.items == ((1, "cat"), (2, "dog"))
    assert [(i.path, i.source_id, i.split, i.units, i.source, len(i.objects)) for i in found.images] == [
        ("images/train/a.jpg", "images/train/a.jpg", "train", "normalized", "labels/train/a.txt", 2),
        ("images/train/b.jpg", "images/train/b.jpg", "train", "normalized", "", 0),
        ("images/train/e.jpg", "images/train/e.jpg", "train", "normalized", "labels/train/e.txt", 0),
        ("images/train/sub/c.png", "images/train/sub/c.png", "train", "normalized", "labels/train/sub/c.txt", 1),
        ("images/val/d.jpg", "images/val/d.jpg", "validation", "normalized", "labels/val/d.txt", 2),
    ]
    objects = {i.path: i.objects for i in found.images}
    assert objects["images/train/a.jpg"] == (
        ObjectAnnotation(box=(0.375, 0.25, 0.625, 0.75), label=1, text="cat", source="labels/train/a.txt:1"),
        ObjectAnnotation(box=(0.0, 0.5, 0.5, 1.0), label=2, text="dog", source="labels/train/a.txt:3"),
    )
    assert objects["images/train/sub/c.png"] == (
        ObjectAnnotation(box=(0.0, 0.0, 0.25, 0.25), label=1, text="cat", source="labels/train/sub/c.txt:1"),)
    assert objects["images/val/d.jpg"] == (  # line 2: a segmentation polygon, the box around it
        ObjectAnnotation(box=(0.0, 0.0, 1.0, 1.0), label=2, text="dog", source="labels/val/d.txt:1"),
        ObjectAnnotation(box=(0.25, 0.25, 0.75, 1.0), label=1, text="cat", source="labels/val/d.txt:2"))
    assert [(p.source, p.reason, p.image, p.kept) for p in found.problems] == [
        ("labels/train/sub/c.txt:2", "bad_label_line", "images/train/sub/c.png", "image"),
        ("labels/train/sub/c.txt:3", "unknown_category", "images/train/sub/c.png", "image"),
        ("labels/train/sub/c.txt:4", "box_not_finite", "images/train/sub/c.png", "image"),
        ("labels/train/sub/c.txt:5", "bad_label_line", "images/train/sub/c.png", "image"),
        ("labels/val/orphan.txt", "image_not_found", "", "nothing"),
    ]
    assert [p.detail for p in found.problems[:2]] == ["a field is not a number", "class index 5 is not in names"]
    assert found.problems[3].detail == "6 fields, not 5 (class cx cy w h) or a polygon"
    assert all(p.reason in PROBLEM_REASONS for p in found.problems)
    assert not any("SECRET" in str(p) for p in found.problems)


def test_detection_never_guesses():
    yolo = ["data.yaml", "images/train/a.jpg", "labels/train/a.txt"]
    voc = ["Annotations/a.xml", "JPEGImages/a.jpg"]
    assert detect_annotation_layout(voc + yolo) is None
    assert detect_annotation_layout(yolo[1:]) is None
    assert detect_annotation_layout(["Annotations/a.xml", "images/a.jpg"]) is None
    # Top-level names may be given as folders ("labels/"): an empty labels folder counts.
    assert detect_annotation_layout(["data.yaml", "images/train/a.jpg", "labels/"]) == "yolo"


@pytest.mark.parametrize("text, detail", [
    (b"names: [cat\n", "not valid YAML (line 2)"),
    (b"train: images/train\n", "no names (the class names)"),
    (b"names: {a: cat}\n", "names has a key that is not a class index"),
    (b"names: 7\n", "names is neither a list nor a mapping"),
    (b"names: [cat]\ntrain: ../../elsewhere\n", "train is outside the dataset folder"),
    (b"names: [cat]\nval: /data/images/val\n", "val is outside the dataset folder"),
    (b"names: [cat]\ntrain: train.txt\n", "train names a file list (only folders are read)"),
])
def test_a_bad_data_yaml_is_one_problem(text, detail):
    problem = parse_data_yaml(text, "data.yaml")
    assert (problem.source, problem.reason, problem.kept) == ("data.yaml", "bad_annotation_file", "nothing")
    assert problem.detail == detail
    found = read_yolo_folder(["data.yaml", "images/train/a.jpg"], {"data.yaml": text}.get)
    assert found.images == () and found.problems == (problem,)


@pytest.mark.parametrize("text, splits", [
    (b"path: ../datasets/coco8\ntrain: ../train/images\nval: valid/images\n",  # Roboflow's export
     (("train", ("train/images",)), ("validation", ("valid/images",)))),
    (b"path: sub\ntrain: [images/a, ./images/b/]\ntest: images/t\n",
     (("train", ("sub/images/a", "sub/images/b")), ("test", ("sub/images/t",)))),
])
def test_data_yaml_split_folders(text, splits):
    config = parse_data_yaml(text + b"names: [cat]\n", "data.yaml")
    assert (config.names, config.splits) == (((0, "cat"),), splits)


def test_label_path_follows_ultralytics():
    assert yolo_label_path("images/train/x.y.jpg") == "labels/train/x.y.txt"
    assert yolo_label_path("data/images/images/val/a.png") == "data/images/labels/val/a.txt"
