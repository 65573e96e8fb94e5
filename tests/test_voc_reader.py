"""Pascal VOC: a folder generated in tmp_path, listed and read with transforms.io.files,
its annotations read by transforms.plan.annotation_folders (codec.voc parses the XML).

Asserts the converted boxes (1-based inclusive -> 0-based edges), flags, labels, splits
from ImageSets/Main, and every planted problem's reason, source and what was kept.
"""

import os

import pytest

from beam_tfrecords.schemas.annotations import PROBLEM_REASONS, ObjectAnnotation
from beam_tfrecords.transforms.codec.voc import parse_voc_xml
from beam_tfrecords.transforms.io.files import list_under, read_bytes
from beam_tfrecords.transforms.plan.annotation_folders import detect_annotation_layout, read_voc_folder

pytestmark = pytest.mark.unit


def voc_xml(filename, objects, size=(500, 375)):
    parts = [f"<annotation><folder>VOC2007</folder><filename>{filename}</filename>"]
    if size is not None:
        parts.append(f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>")
    for obj in objects:
        parts.append(f"<object>{obj}</object>")
    return "".join(parts) + "</annotation>"


def obj(name, box, difficult=None, truncated=None, pose="Unspecified"):
    flags = "" if difficult is None else f"<difficult>{difficult}</difficult>"
    flags += "" if truncated is None else f"<truncated>{truncated}</truncated>"
    bndbox = "" if box is None else (
        "<bndbox>" + "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), box)) + "</bndbox>")
    return f"<name>{name}</name><pose>{pose}</pose>{flags}{bndbox}"


FILES = {
    "Annotations/000001.xml": voc_xml("000001.jpg", [
        obj("dog", (48, 240, 195, 371), difficult=0, truncated=1, pose="Left"),
        obj("person", (8, 12, 352, 498), difficult=1, truncated=0),
    ]),
    "Annotations/000002.xml": voc_xml("000002.jpg", [
        obj("cat", (1, 1, 500, 375)),
        obj("cat", None),                          # no bndbox: object 2 dropped
        obj("cat", ("nan", 1, 5, 5)),              # not finite: object 3 dropped
        obj("dog", (10.5, 20, 30, 40.5)),
    ]),
    "Annotations/000003.xml": '<?xml version="1.0"?><!DOCTYPE a [<!ENTITY x "SECRET">]>'
                              '<annotation><filename>&x;</filename></annotation>',
    "Annotations/000004.xml": "<annotation><filename>SECRET</filename><object>",
    "Annotations/000005.xml": voc_xml("000005.jpg", [obj("cat", (1, 1, 2, 2))]),  # no image
    "Annotations/000008.xml": voc_xml("000008.jpg", [obj("person", (2, 3, 4, 5))], size=(0, 0)),
    "JPEGImages/000001.jpg": "x", "JPEGImages/000002.jpg": "x", "JPEGImages/000003.jpg": "x",
    "JPEGImages/000004.jpg": "x", "JPEGImages/000006.jpg": "x", "JPEGImages/000008.jpg": "x",
    "ImageSets/Main/train.txt": "000001\n000007\n",
    "ImageSets/Main/val.txt": "000002\n",
    "ImageSets/Main/trainval.txt": "000001\n000002\n000008\n",
    "ImageSets/Main/test.txt": "\n000002\n",
    "ImageSets/Main/cat_train.txt": "000001 -1\n",  # per-class files are not read
}


@pytest.fixture
def voc(tmp_path):
    for rel, text in FILES.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root = str(tmp_path)
    paths = [os.path.relpath(p, root).replace(os.sep, "/") for p, _ in list_under(root)]
    return paths, lambda rel: read_bytes(os.path.join(root, rel))


def test_voc_folder_is_detected_and_read(voc):
    paths, read = voc
    assert detect_annotation_layout(paths) == "voc"
    found = read_voc_folder(paths, read)
    assert found.layout == "voc"
    assert found.label_map.items == ((1, "cat"), (2, "dog"), (3, "person"))
    assert [(i.path, i.source_id, i.split, i.stated_size, i.units, i.source) for i in found.images] == [
        ("JPEGImages/000001.jpg", "JPEGImages/000001.jpg", "train", (500, 375), "pixels", "Annotations/000001.xml"),
        ("JPEGImages/000002.jpg", "JPEGImages/000002.jpg", "validation", (500, 375), "pixels",
         "Annotations/000002.xml"),
        ("JPEGImages/000008.jpg", "JPEGImages/000008.jpg", "train", None, "pixels", "Annotations/000008.xml"),
    ]
    first, second, third = (i.objects for i in found.images)
    assert first == (
        ObjectAnnotation(box=(47.0, 239.0, 195.0, 371.0), label=2, text="dog", difficult=False, truncated=True,
                         source="Annotations/000001.xml: object 1"),
        ObjectAnnotation(box=(7.0, 11.0, 352.0, 498.0), label=3, text="person", difficult=True, truncated=False,
                         source="Annotations/000001.xml: object 2"),
    )
    assert [(o.box, o.label, o.text, o.source) for o in second] == [
        ((0.0, 0.0, 500.0, 375.0), 1, "cat", "Annotations/000002.xml: object 1"),
        ((9.5, 19.0, 30.0, 40.5), 2, "dog", "Annotations/000002.xml: object 4"),
    ]
    assert [(o.box, o.label) for o in third] == [((1.0, 2.0, 4.0, 5.0), 3)]


def test_voc_problems_name_file_and_reason_never_the_content(voc):
    found = read_voc_folder(*voc)
    assert [(p.source, p.reason, p.image, p.kept) for p in found.problems] == [
        ("Annotations/000002.xml: object 2", "bad_object", "JPEGImages/000002.jpg", "image"),
        ("Annotations/000002.xml: object 3", "box_not_finite", "JPEGImages/000002.jpg", "image"),
        ("Annotations/000003.xml", "bad_annotation_file", "JPEGImages/000003.jpg", "nothing"),
        ("Annotations/000004.xml", "bad_annotation_file", "JPEGImages/000004.jpg", "nothing"),
        ("Annotations/000005.xml", "image_not_found", "", "nothing"),
        ("ImageSets/Main/test.txt:2", "split_conflict", "JPEGImages/000002.jpg", "image"),
        ("ImageSets/Main/train.txt:2", "annotation_not_found", "", "nothing"),
    ]
    assert all(p.reason in PROBLEM_REASONS and p.detail for p in found.problems)
    assert "DTD" in found.problems[2].detail and "line 1" in found.problems[3].detail
    assert not any("SECRET" in str(p) for p in found.problems)


def test_trainval_alone_is_the_training_split(tmp_path):
    files = {"Annotations/a.xml": voc_xml("a.png", []), "JPEGImages/a.png": b"x",
             "ImageSets/Main/trainval.txt": b"a\n"}
    read = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}.get
    found = read_voc_folder(files, read)
    assert [(i.path, i.split, i.objects) for i in found.images] == [("JPEGImages/a.png", "train", ())]
    assert found.problems == () and found.label_map.items == ()


def test_the_image_is_found_by_stem_then_by_filename():
    files = {
        "Annotations/a.xml": voc_xml("a.png", []),       # a.jpg has the stem: taken
        "Annotations/b.xml": voc_xml("photo.jpg", []),   # no b.*: <filename> names it
        "Annotations/c.xml": voc_xml("photo.jpg", []),   # the same image again: refused
        "JPEGImages/a.jpg": "x", "JPEGImages/photo.jpg": "x",
    }
    found = read_voc_folder(files, lambda rel: files[rel].encode())
    assert [(i.path, i.source) for i in found.images] == [
        ("JPEGImages/a.jpg", "Annotations/a.xml"), ("JPEGImages/photo.jpg", "Annotations/b.xml")]
    assert [(p.source, p.reason, p.image, p.kept) for p in found.problems] == [
        ("Annotations/c.xml", "bad_annotation_file", "JPEGImages/photo.jpg", "nothing")]


def test_a_dtd_is_refused_in_any_encoding():
    text = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE a [<!ENTITY x "SECRET">]><annotation/>'
    problem = parse_voc_xml(text.encode("utf-16"), "Annotations/u.xml")
    assert (problem.source, problem.reason, problem.kept) == ("Annotations/u.xml", "bad_annotation_file", "nothing")
    assert "DTD" in problem.detail
