"""The listing of annotated inputs (issue 21, launcher side): each layout, generated small
in its public form, listed as ``convert`` lists it (``ListingIdentity.of(config)`` and
``list_images``): one reference per image kept with its annotations, the layout's split,
``label`` -1; dead letters for what keeps nothing; the run's counts (``AnnotatedRun``)."""

from __future__ import annotations

import json
import os

import pytest

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.annotated_inputs import (
    AmbiguousManifest,
    AnnotationArgs,
    detect_annotated_layout,
)
from beam_tfrecords.transforms.codec.annotation_bytes import decode_annotations
from beam_tfrecords.transforms.image_steps import ListingIdentity, list_images
from beam_tfrecords.transforms.quality.splits import split_of

pytestmark = pytest.mark.unit


def _write(root, files: dict) -> str:
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(text if isinstance(text, bytes) else text.encode())
    return str(root)


def _listing(**options):
    config = ConvertConfig(output="/nowhere", **options)
    return list_images(*ListingIdentity.of(config))


def _by_name(listing) -> dict:
    return {ref.filename: (ref, decode_annotations(ref.annotation)) for ref in listing.refs}


def _letters(letters) -> list:
    return sorted((d.source, d.error) for d in letters)


def _xml(name: str, objects, size=(64, 48)) -> str:
    parts = [f"<annotation><filename>{name}</filename><size><width>{size[0]}</width>"
             f"<height>{size[1]}</height><depth>3</depth></size>"]
    for cls, box, difficult in objects:
        corners = "".join(f"<{k}>{v}</{k}>" for k, v in zip(("xmin", "ymin", "xmax", "ymax"), box))
        parts.append(f"<object><name>{cls}</name><difficult>{difficult}</difficult>"
                     f"<bndbox>{corners}</bndbox></object>")
    return "".join(parts) + "</annotation>"


VOC = {
    "Annotations/a.xml": _xml("a.jpg", [("dog", (1, 2, 30, 40), 0), ("cat", (5, 5, 9, 9), 1)]),
    "Annotations/b.xml": _xml("b.jpg", [("cat", (1, 1, 10, 10), 0), ("cat", ("nan", 1, 5, 5), 0)]),
    "Annotations/c.xml": _xml("c.jpg", []),
    "Annotations/gone.xml": _xml("gone.jpg", [("dog", (1, 1, 2, 2), 0)]),
    "JPEGImages/a.jpg": b"x", "JPEGImages/b.jpg": b"xy", "JPEGImages/c.jpg": b"x",
    "JPEGImages/lonely.jpg": b"x",
    "ImageSets/Main/train.txt": "a\n", "ImageSets/Main/val.txt": "b\n",
}


def test_voc_with_imagesets_and_difficult(tmp_path):
    root = _write(tmp_path / "voc", VOC)
    assert detect_annotated_layout(root, AnnotationArgs()) == "voc"
    assert detect_annotated_layout(f"{root}/JPEGImages/*.jpg", AnnotationArgs()) is None  # a glob
    splits = (("train", 0.5), ("test", 0.5))
    listing = _listing(input=root, layout="voc", splits=splits)
    refs = _by_name(listing)
    assert sorted(refs) == ["JPEGImages/a.jpg", "JPEGImages/b.jpg", "JPEGImages/c.jpg"]
    a, found = refs["JPEGImages/a.jpg"]
    assert (a.split, a.label, a.label_text, a.size, a.path) == ("train", -1, "", 1, f"{root}/JPEGImages/a.jpg")
    # VOC's 1-based pixel indices: the box over pixels 1..30 starts at edge 0.
    assert [(o.text, o.label, o.box, o.difficult) for o in found.objects] == [
        ("dog", 2, (0.0, 1.0, 30.0, 40.0), False), ("cat", 1, (4.0, 4.0, 9.0, 9.0), True)]
    assert found.stated_size == (64, 48)
    assert refs["JPEGImages/b.jpg"][0].split == "validation"
    assert len(refs["JPEGImages/b.jpg"][1].objects) == 1  # the NaN box left out, the image kept
    assert refs["JPEGImages/c.jpg"][0].split == split_of("JPEGImages/c.jpg", splits)  # not in ImageSets
    # An image no XML describes (VOC's test images) is not converted and not a bad input: counted.
    assert _letters(listing.dead_letters) == [("Annotations/gone.xml", "image_not_found")]
    assert listing.annotated.unnamed == 1
    assert _letters(listing.skipped) == [("Annotations/b.xml: object 2", "box_not_finite")]
    run = listing.annotated.run
    assert (run.layout, run.label_map.items, run.images_without_objects) == ("voc", ((1, "cat"), (2, "dog")), 1)
    assert dict(run.problems) == {"box_not_finite": 1, "image_not_found": 1}
    assert listing.vocabulary == ["cat", "dog"]
    assert listing.annotated.objects_per_class == (("cat", 2), ("dog", 1))

    labels = _write(tmp_path / "l", {"labels.txt": "dog\nbird\n"}) + "/labels.txt"
    numbered = _by_name(_listing(input=root, layout="voc", labels=labels))  # --labels: ids from 1 in its order
    assert [(o.text, o.label) for o in numbered["JPEGImages/a.jpg"][1].objects] == [("dog", 1)]
    renumbered = _listing(input=root, layout="voc", labels=labels)
    assert renumbered.annotated.run.label_map.items == ((1, "dog"), (2, "bird"))
    assert sorted(d.source for d in renumbered.skipped if d.error == "unknown_category") == [
        "Annotations/a.xml: object 2", "Annotations/b.xml: object 1"]  # cats: left out, images kept

    dropped = _listing(input=root, layout="voc", drop_empty=True)
    assert sorted(_by_name(dropped)) == ["JPEGImages/a.jpg", "JPEGImages/b.jpg"]
    assert (dropped.annotated.run.dropped_empty, dropped.annotated.run.images_without_objects) == (1, 0)


@pytest.mark.parametrize("yaml_text", ["names: [cat, dog]\n", "names:\n  1: dog\n  0: cat\n"])
def test_yolo_names_and_an_image_without_a_label_file(tmp_path, yaml_text):
    root = _write(tmp_path / "yolo", {
        "data.yaml": "train: images/train\nval: images/val\n" + yaml_text,
        "images/train/a.jpg": b"x", "labels/train/a.txt": "1 0.5 0.5 0.25 0.5\n0 0.1 0.1 0.1 0.1\n",
        "images/train/b.jpg": b"x", "labels/train/b.txt": "7 0.5 0.5 0.1 0.1\nnot a line\n",
        "images/val/c.jpg": b"x",  # no label file: an image without objects
        "labels/val/ghost.txt": "0 0.5 0.5 0.1 0.1\n",
    })
    assert detect_annotated_layout(root, AnnotationArgs()) == "yolo"
    listing = _listing(input=root, layout="yolo")
    refs = _by_name(listing)
    assert sorted(refs) == ["images/train/a.jpg", "images/train/b.jpg", "images/val/c.jpg"]
    a = refs["images/train/a.jpg"][1]
    assert (a.units, [(o.label, o.text) for o in a.objects]) == ("normalized", [(2, "dog"), (1, "cat")])
    assert a.objects[0].box == pytest.approx((0.375, 0.25, 0.625, 0.75))
    assert refs["images/val/c.jpg"][0].split == "validation" and refs["images/val/c.jpg"][1].objects == ()
    assert refs["images/train/b.jpg"][1].objects == ()
    run = listing.annotated.run
    assert run.label_map.items == ((1, "cat"), (2, "dog"))
    assert run.images_without_objects == 2  # c (no label file) and b (its lines refused)
    assert _letters(listing.dead_letters) == [("labels/val/ghost.txt", "image_not_found")]
    assert {d.error for d in listing.skipped} == {"bad_label_line", "unknown_category"}


def _coco(images, annotations, categories) -> str:
    return json.dumps({"images": images, "annotations": annotations, "categories": categories})


def test_coco_single_file_and_one_per_split(tmp_path):
    root = _write(tmp_path / "imgs", {"a.jpg": b"x", "sub/b.jpg": b"xy", "c.jpg": b"x", "extra.jpg": b"x"})
    categories = [{"id": 3, "name": "cat"}, {"id": 7, "name": "dog"}]
    train = _write(tmp_path / "ann", {"train.json": _coco(
        [{"id": 1, "file_name": "a.jpg", "width": 8, "height": 6},
         {"id": 2, "file_name": "sub/b.jpg", "width": 8, "height": 6},
         {"id": 5, "file_name": "missing.jpg", "width": 8, "height": 6}],
        [{"id": 10, "image_id": 1, "category_id": 7, "bbox": [1, 2, 3, 4], "iscrowd": 1, "area": 5},
         {"id": 11, "image_id": 1, "category_id": 99, "bbox": [0, 0, 1, 1]},
         {"id": 12, "image_id": 42, "category_id": 3, "bbox": [0, 0, 1, 1]}], categories)}) + "/train.json"
    val = _write(tmp_path / "ann", {"val.json": _coco(
        [{"id": 8, "file_name": "c.jpg", "width": 8, "height": 6}],
        [{"id": 20, "image_id": 8, "category_id": 3, "bbox": [0, 0, 2, 2]}], categories)}) + "/val.json"
    assert detect_annotated_layout(root, AnnotationArgs(annotations=train)) == "coco"

    single = _listing(input=root, layout="coco", annotations=train)
    refs = _by_name(single)
    assert sorted(refs) == ["a.jpg", "sub/b.jpg"]
    a = refs["a.jpg"][1]
    assert (a.source_id, [(o.label, o.text, o.is_crowd, o.area, o.box) for o in a.objects]) == (
        "1", [(7, "dog", True, 5.0, (1.0, 2.0, 4.0, 6.0))])
    assert refs["a.jpg"][0].split == "train"  # no split given: the default
    # A missing image is a bad input; an annotation of no image is passed over, counted.
    assert {d.error for d in single.dead_letters} == {"image_not_found"}
    assert sorted(d.error for d in single.skipped) == ["unknown_category", "unknown_image_id"]
    assert single.annotated.run.label_map.items == ((3, "cat"), (7, "dog"))
    assert single.annotated.unnamed == 2  # c.jpg and extra.jpg: not in this file

    both = _listing(input=root, layout="coco", annotations=f"train={train},validation={val}")
    assert {r.filename: r.split for r in both.refs} == {"a.jpg": "train", "sub/b.jpg": "train",
                                                        "c.jpg": "validation"}
    assert both.annotated.run.images_without_objects == 1  # sub/b.jpg


def test_box_csv_grouped_by_image_with_width_and_height(tmp_path):
    root = _write(tmp_path / "boxes", {
        "boxes.csv": "filename,width,height,class,xmin,ymin,xmax,ymax\n"
                     "img/a.jpg,64,48,cat,1,2,30,40\nimg/b.jpg,64,48,dog,0,0,10,10\n"
                     "img/a.jpg,64,48,dog,5,5,9,9\nimg/a.jpg,64,48,dog,x,5,9,9\n"
                     "img/missing.jpg,64,48,cat,1,1,2,2\n",
        "img/a.jpg": b"abc", "img/b.jpg": b"x"})
    csv = f"{root}/boxes.csv"
    assert detect_annotated_layout(csv, AnnotationArgs()) == "box_csv"
    listing = _listing(input=csv, layout="box_csv")
    refs = _by_name(listing)
    assert sorted(refs) == ["img/a.jpg", "img/b.jpg"]
    ref, a = refs["img/a.jpg"]
    assert (ref.path, ref.size, a.stated_size) == (f"{root}/img/a.jpg", 3, (64, 48))
    assert [(o.text, o.label, o.box, o.source) for o in a.objects] == [
        ("cat", 1, (1.0, 2.0, 30.0, 40.0), "boxes.csv:2"), ("dog", 2, (5.0, 5.0, 9.0, 9.0), "boxes.csv:4")]
    assert _letters(listing.dead_letters) == [("boxes.csv:6", "image_not_found")]
    assert dict(listing.annotated.run.problems) == {"bad_label_line": 1, "image_not_found": 1}
    assert _letters(listing.skipped) == [("boxes.csv:5", "bad_label_line")]
    assert not listing.annotated.normalized_boxes

    small = _write(tmp_path / "small", {"b.csv": "image,label,x0,y0,x1,y1\na.jpg,cat,0.1,0.2,0.5,0.6\n",
                                        "a.jpg": b"x"})
    args = dict(input=f"{small}/b.csv", layout="box_csv", box_columns=("x0", "y0", "x1", "y1"))
    assert _listing(**args).annotated.normalized_boxes  # every value <= 1, pixels assumed
    normalized = _listing(**args, box_units="normalized")
    assert not normalized.annotated.normalized_boxes
    assert decode_annotations(normalized.refs[0].annotation).units == "normalized"


@pytest.mark.parametrize("separator,rows,labels", [
    (None, "a.jpg,cat\na.jpg,dog\nb.jpg,dog\na.jpg,cat\n", {"a.jpg": ("cat", "dog"), "b.jpg": ("dog",)}),
    ("|", "a.jpg,cat|dog\nb.jpg,dog\nc.jpg,\n", {"a.jpg": ("cat", "dog"), "b.jpg": ("dog",), "c.jpg": ()}),
])
def test_several_labels_per_image(tmp_path, separator, rows, labels):
    root = _write(tmp_path / "tags", {"tags.csv": "image,label\n" + rows, "a.jpg": b"x", "b.jpg": b"x",
                                      "c.jpg": b"x"})
    csv = f"{root}/tags.csv"
    if separator is None:  # Several rows per image: the user says which layout it is.
        with pytest.raises(AmbiguousManifest, match=r"1 images appear on several rows with different labels "
                                                    r"\(the first: line 3\): say --layout multi_label"):
            detect_annotated_layout(csv, AnnotationArgs())
        assert detect_annotated_layout(csv, AnnotationArgs(), known=frozenset({"cat"})) is None
    else:
        assert detect_annotated_layout(csv, AnnotationArgs(label_separator=separator)) == "multi_label"
    listing = _listing(input=csv, layout="multi_label", label_separator=separator)
    refs = _by_name(listing)
    assert {name: found.texts for name, (_, found) in refs.items()} == labels
    assert {name: found.labels for name, (_, found) in refs.items()} == {
        name: tuple({"cat": 1, "dog": 2}[t] for t in texts) for name, texts in labels.items()}
    assert listing.annotated.run.images_without_objects == sum(not t for t in labels.values())
    assert listing.refs[0].label == -1


def test_a_plain_manifest_stays_a_csv_manifest(tmp_path):
    root = _write(tmp_path / "m", {"m.csv": "image,label\na.jpg,cat\nb.jpg,dog\n"})
    assert detect_annotated_layout(f"{root}/m.csv", AnnotationArgs()) is None
    # A row repeated with its label, or a broken row naming the image again, is not a
    # second label: the manifest stays one of one label per row (its checks dead-letter those rows).
    repeated = _write(tmp_path / "r", {"m.csv": 'image,label,note\na.jpg,cat,x\nb.jpg,dog,y\na.jpg,cat,x\n'
                                                'a.jpg,dog,"never closed\nb.jpg,cat\n'})
    assert detect_annotated_layout(f"{repeated}/m.csv", AnnotationArgs()) is None


def test_a_row_whose_quoting_is_broken_is_a_problem_and_the_rows_after_it_are_read(tmp_path):
    root = _write(tmp_path / "tags", {"tags.csv": 'image,label,note\na.jpg,cat,x\na.jpg,dog,"SECRET-1\n'
                                                  'b.jpg,dog,z\nb.jpg,cat,z\n', "a.jpg": b"x", "b.jpg": b"x"})
    listing = _listing(input=f"{root}/tags.csv", layout="multi_label")
    assert {name: found.texts for name, (_, found) in _by_name(listing).items()} == {
        "a.jpg": ("cat",), "b.jpg": ("dog", "cat")}
    assert [(d.source.rsplit("/", 1)[-1], d.error) for d in listing.skipped] == [("tags.csv:3", "bad_label_line")]
    assert "quoting is broken" in listing.skipped[0].message and "SECRET" not in listing.skipped[0].message
    assert detect_annotated_layout(_write(tmp_path / "folders", {"cat/a.jpg": b"x"}), AnnotationArgs()) is None


def test_semantic_masks_pair_by_path_and_stem(tmp_path):
    images = _write(tmp_path / "images", {"a.jpg": b"x", "sub/b.png": b"xy", "c.jpg": b"x"})
    masks = _write(tmp_path / "masks", {"a.png": b"m", "sub/b.png": b"m", "stray.png": b"m"})
    labels = _write(tmp_path / "l", {"labels.txt": "background\nroad\ncar\n"}) + "/labels.txt"
    assert detect_annotated_layout(images, AnnotationArgs(masks=masks)) == "masks"
    listing = _listing(input=images, layout="masks", masks=masks, labels=labels, splits=(("train", 0.5), ("val", 0.5)))
    refs = _by_name(listing)
    assert {name: found.mask for name, (_, found) in refs.items()} == {"a.jpg": "a.png", "sub/b.png": "sub/b.png"}
    assert {r.filename: r.split for r in listing.refs} == {n: split_of(n, (("train", 0.5), ("val", 0.5)))
                                                           for n in refs}
    assert _letters(listing.skipped) == [("c.jpg", "mask_not_found")] and not listing.dead_letters
    run = listing.annotated.run
    assert (run.mask_root, run.label_map.items) == (masks, ((0, "background"), (1, "road"), (2, "car")))
    assert _listing(input=images, layout="masks", masks=masks).annotated.run.label_map.items == ()


def test_a_mask_folder_inside_the_input_and_names_that_are_not_utf8(tmp_path):
    root = _write(tmp_path / "data", {"a.jpg": b"x", "masks/a.png": b"m"})
    with open(os.path.join(os.fsencode(root), b"bad\xff.jpg"), "wb") as f:
        f.write(b"x")
    listing = _listing(input=root, layout="masks", masks=f"{root}/masks")
    assert [(r.filename, decode_annotations(r.annotation).mask) for r in listing.refs] == [("a.jpg", "a.png")]
    assert _letters(listing.dead_letters) == [("bad\\xff.jpg", "bad_file_name")]  # masks/a.png is no image
