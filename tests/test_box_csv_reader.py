"""Box CSV manifests and several labels per image (transforms.codec.box_csv): rows grouped
into one ImageAnnotations per image, objects and labels in row order, every planted
problem's reason, source (``csv:line``) and what was kept."""

import pytest

from beam_tfrecords.schemas.annotations import PROBLEM_REASONS, ImageAnnotations, ObjectAnnotation
from beam_tfrecords.transforms.codec.box_csv import (
    csv_rows,
    every_value_normalized,
    read_box_rows,
    read_label_rows,
)

pytestmark = pytest.mark.unit

PIXELS = """filename,width,height,class,xmin,ymin,xmax,ymax
b.jpg,640,480,dog,10,20,110,220
a.jpg,640,480,cat,0,0,64,48
b.jpg,640,480,"cat",5,6,7.5,8
b.jpg,640,480,dog,SECRET,1,2,3
a.jpg,640,480,cat,inf,0,1,1
c.jpg,100,100,,,,,

d.jpg,100,100,bird,1,1,2,2
d.jpg,200,100,bird,1,1,2,2
,640,480,cat,1,1,2,2
e.jpg,640
f.jpg,64,x,cat,1,1,2,2
"""


def test_box_csv_in_pixels_groups_rows_by_image():
    header, rows = csv_rows(PIXELS)
    found = read_box_rows(header, rows, source="boxes.csv", image_column="filename", class_column="class")
    assert found.layout == "box_csv"
    assert found.label_map.items == ((1, "cat"), (2, "dog"))  # d.jpg's bird was refused with d.jpg
    assert found.images == (
        ImageAnnotations(path="a.jpg", source_id="a.jpg", stated_size=(640, 480), source="boxes.csv:3", objects=(
            ObjectAnnotation(box=(0.0, 0.0, 64.0, 48.0), label=1, text="cat", source="boxes.csv:3"),)),
        ImageAnnotations(path="b.jpg", source_id="b.jpg", stated_size=(640, 480), source="boxes.csv:2", objects=(
            ObjectAnnotation(box=(10.0, 20.0, 110.0, 220.0), label=2, text="dog", source="boxes.csv:2"),
            ObjectAnnotation(box=(5.0, 6.0, 7.5, 8.0), label=1, text="cat", source="boxes.csv:4"))),
        ImageAnnotations(path="c.jpg", source_id="c.jpg", stated_size=(100, 100), source="boxes.csv:7"),
        ImageAnnotations(path="e.jpg", source_id="e.jpg", source="boxes.csv:12"),
        ImageAnnotations(path="f.jpg", source_id="f.jpg", source="boxes.csv:13"),
    )
    assert [(p.source, p.reason, p.image, p.kept) for p in found.problems] == [
        ("boxes.csv:5", "bad_label_line", "b.jpg", "image"),
        ("boxes.csv:6", "box_not_finite", "a.jpg", "image"),
        ("boxes.csv:11", "bad_label_line", "", "nothing"),
        ("boxes.csv:12", "bad_label_line", "e.jpg", "image"),
        ("boxes.csv:13", "bad_label_line", "f.jpg", "image"),
        ("boxes.csv:10", "annotation_size_mismatch", "d.jpg", "nothing"),
    ]
    assert found.problems[-1].detail == "width/height 200x100 differ from line 9's 100x100"
    assert all(p.reason in PROBLEM_REASONS for p in found.problems)
    assert not any("SECRET" in str(p) for p in found.problems)
    assert not every_value_normalized(found)


def test_box_csv_normalized_with_named_columns():
    header, rows = csv_rows("path,label,x1,y1,x2,y2\nq/a.png,cat,0.25,0.5,0.75,1\nq/a.png,ant,0,0,0.5,0.5\n")
    kwargs = dict(source="n.csv", image_column="path", class_column="label", box_columns=("x1", "y1", "x2", "y2"))
    found = read_box_rows(header, rows, units="normalized", **kwargs)
    assert found.label_map.items == ((1, "ant"), (2, "cat"))
    (image,) = found.images
    assert (image.path, image.units, image.stated_size, found.problems) == ("q/a.png", "normalized", None, ())
    assert [(o.box, o.label, o.text) for o in image.objects] == [
        ((0.25, 0.5, 0.75, 1.0), 2, "cat"), ((0.0, 0.0, 0.5, 0.5), 1, "ant")]
    # Read as pixels, every value is at most 1: the plan says so.
    assert every_value_normalized(read_box_rows(header, rows, **kwargs))
    with pytest.raises(ValueError, match="no column xmin"):
        read_box_rows(header, rows, source="n.csv", image_column="path", class_column="label")


LABELS = 'image,tags\na.jpg,"cat; dog"\nb.jpg,dog\na.jpg,cat\na.jpg,bird;;\nc.jpg,\nb.jpg\n'


@pytest.mark.parametrize("separator, expected", [
    (";", [("a.jpg", ("cat", "dog", "bird"), (2, 3, 1)), ("b.jpg", ("dog",), (3,)), ("c.jpg", (), ())]),
    (None, [("a.jpg", ("cat; dog", "cat", "bird;;"), (3, 2, 1)), ("b.jpg", ("dog",), (4,)), ("c.jpg", (), ())]),
])
def test_several_labels_per_image(separator, expected):
    header, rows = csv_rows(LABELS)
    found = read_label_rows(header, rows, source="tags.csv", image_column="image", label_column="tags",
                            separator=separator)
    assert found.layout == "multi_label"
    assert [(i.path, i.texts, i.labels) for i in found.images] == expected
    assert [i.source for i in found.images] == ["tags.csv:2", "tags.csv:3", "tags.csv:6"]
    assert all(i.objects == () for i in found.images)
    names = sorted({t for _, texts, _ in expected for t in texts})
    assert found.label_map.items == tuple(enumerate(names, start=1))
    assert [(p.source, p.reason, p.image, p.kept) for p in found.problems] == [
        ("tags.csv:7", "bad_label_line", "b.jpg", "image")]
