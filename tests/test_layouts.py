"""Tests for transforms.plan.layouts: resolving inputs and listing the three layouts.

The listing functions are pure: they get ``(path, size)`` tuples, text and a
``size_of`` callable, so no files are needed here.
"""

import pytest

from beam_tfrecords.schemas.config import LAYOUTS
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.plan.layouts import (
    detect_layout,
    list_cifar,
    list_class_folders,
    list_csv_manifest,
    parse_labels_text,
    resolve_input,
)
from beam_tfrecords.transforms.plan.shard_cuts import stable_key

pytestmark = pytest.mark.unit


def dead_errors(listing):
    """``{source: error}`` of the listing's dead letters (all at stage 'list')."""
    assert all(isinstance(d, DeadLetter) and d.stage == "list" and d.message for d in listing.dead_letters)
    return {d.source: d.error for d in listing.dead_letters}


def by_filename(listing):
    return {ref.filename: ref for ref in listing.refs}


# --------------------------------------------------------------------------
# resolve_input / detect_layout
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, layout, expected",
    [
        ("data/root", "auto", ("auto", "data/root", "data/root/**")),
        ("data/root/", "auto", ("auto", "data/root", "data/root/**")),
        ("/abs/root//", "auto", ("auto", "/abs/root", "/abs/root/**")),
        ("/", "auto", ("auto", "/", "/**")),
        ("root/*/x*.jpg", "auto", ("auto", "root", "root/*/x*.jpg")),
        ("root/ab*/x.jpg", "auto", ("auto", "root", "root/ab*/x.jpg")),
        ("root/img_?.png", "auto", ("auto", "root", "root/img_?.png")),
        ("root/[ab]/x.jpg", "auto", ("auto", "root", "root/[ab]/x.jpg")),
        ("*.jpg", "auto", ("auto", ".", "*.jpg")),
        ("/*.jpg", "auto", ("auto", "/", "/*.jpg")),
        ("gs://bucket/dir", "auto", ("auto", "gs://bucket/dir", "gs://bucket/dir/**")),
        ("gs://bucket/dir/", "auto", ("auto", "gs://bucket/dir", "gs://bucket/dir/**")),
        ("gs://bucket/dir/*/*.png", "auto", ("auto", "gs://bucket/dir", "gs://bucket/dir/*/*.png")),
        ("gs://bucket/data/labels.csv", "auto", ("csv", "gs://bucket/data", "gs://bucket/data/labels.csv")),
        ("/data/manifest.CSV", "auto", ("csv", "/data", "/data/manifest.CSV")),
        ("data/manifest.txt", "csv", ("csv", "data", "data/manifest.txt")),
        ("data/*.csv", "auto", ("auto", "data", "data/*.csv")),  # a glob, not a manifest
        ("data/root", "class_folders", ("class_folders", "data/root", "data/root/**")),
        ("data/root", "cifar", ("cifar", "data/root", "data/root/**")),
    ],
)
def test_resolve_input(path, layout, expected):
    assert layout in LAYOUTS
    assert resolve_input(path, layout) == expected


@pytest.mark.parametrize(
    "path, layout", [("data/root", "folders"), ("data/root", ""), ("data/*.csv", "csv")]
)
def test_resolve_input_rejects(path, layout):
    with pytest.raises(ValueError, match="layout must be one of|a CSV manifest is one file, not a glob"):
        resolve_input(path, layout)


@pytest.mark.parametrize(
    "root, paths, expected",
    [
        ("/d", ["/d/labels.txt", "/d/train/1_cat.png"], "cifar"),
        ("/d/", ["/d/labels.txt"], "cifar"),
        ("gs://b/d", ["gs://b/d/labels.txt"], "cifar"),
        ("/d", ["/d/cat/labels.txt", "/d/cat/1.png"], "class_folders"),
        ("/d", ["/d/cat/1.png"], "class_folders"),
        ("/d", [], "class_folders"),
    ],
)
def test_detect_layout(root, paths, expected):
    assert detect_layout(root, iter(paths)) == expected


# --------------------------------------------------------------------------
# parse_labels_text
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, names",
    [
        ("cat\ndog\n", ["cat", "dog"]),
        ("  cat \r\n dog\n\n", ["cat", "dog"]),  # Blank lines at the end shift nothing.
        ("sea lion\nzèbre\n猫", ["sea lion", "zèbre", "猫"]),
    ],
)
def test_parse_labels_text(text, names):
    assert parse_labels_text(text) == names


@pytest.mark.parametrize(
    "text, match", [("", "no class"), ("\n  \n", "no class"), ("cat\ndog\ncat\n", "cat"), ("a\n a \n", "'a'"),
                    ("  cat \r\n\r\n dog\n", "line 2 of the labels file is blank"),
                    ("Cat\ncat\n", "letter case")]
)
def test_parse_labels_text_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        parse_labels_text(text)


# --------------------------------------------------------------------------
# class_folders
# --------------------------------------------------------------------------

FLAT = [
    ("/data/dog/b.png", 20),
    ("/data/cat/a.jpg", 10),
    ("/data/cat/sub/c.JPEG", 30),
    ("/data/cat/notes.txt", 5),
    ("/data/.DS_Store", 1),
    ("/data/README", 2),
]


@pytest.mark.parametrize("root", ["/data", "/data/"])
def test_class_folders_flat(root):
    listing = list_class_folders(root, FLAT)
    assert listing.layout == "class_folders"
    assert listing.vocabulary == ["cat", "dog"]
    assert listing.ignored == 3
    assert listing.dead_letters == []
    assert listing.extra_features == {}
    assert [r.filename for r in listing.refs] == ["cat/a.jpg", "cat/sub/c.JPEG", "dog/b.png"]
    assert listing.refs[0] == ImageRef(
        split="train",
        key=stable_key("train", "cat/a.jpg"),
        filename="cat/a.jpg",
        path="/data/cat/a.jpg",
        size=10,
        label=0,
        label_text="cat",
    )
    refs = by_filename(listing)
    assert (refs["cat/sub/c.JPEG"].label, refs["cat/sub/c.JPEG"].size) == (0, 30)
    assert (refs["dog/b.png"].label, refs["dog/b.png"].label_text) == (1, "dog")


def test_class_folders_with_split_folders():
    files = [
        ("gs://b/d/train/cat/1.jpg", 1),
        ("gs://b/d/train/dog/2.jpg", 2),
        ("gs://b/d/validation/dog/3.jpg", 3),
        ("gs://b/d/test/cat/4.jpg", 4),
        ("gs://b/d/test/bird/5.jpg", 5),
        ("gs://b/d/train/labels.csv", 6),
    ]
    listing = list_class_folders("gs://b/d", files)
    assert listing.vocabulary == ["bird", "cat", "dog"]
    assert listing.ignored == 1
    got = {(r.split, r.filename, r.label, r.label_text) for r in listing.refs}
    assert got == {
        ("train", "train/cat/1.jpg", 1, "cat"),
        ("train", "train/dog/2.jpg", 2, "dog"),
        ("validation", "validation/dog/3.jpg", 2, "dog"),
        ("test", "test/cat/4.jpg", 1, "cat"),
        ("test", "test/bird/5.jpg", 0, "bird"),
    }
    assert all(r.key == stable_key(r.split, r.filename) for r in listing.refs)


def test_class_folders_split_names_mixed_with_other_folders_are_refused():
    """A mix of split-named and other top-level folders is ambiguous: reading
    'train' as a class (the old behaviour) silently mislabels every image in it."""
    files = [("/d/train/cat/1.jpg", 1), ("/d/dog/2.jpg", 2)]
    with pytest.raises(ValueError, match=r"\['train'\] look like splits but \['dog'\] do not"):
        list_class_folders("/d", files)
    # A folder without images does not count.
    listing = list_class_folders("/d", [("/d/train/cat/1.jpg", 1), ("/d/docs/notes.txt", 2)])
    assert {(r.split, r.label_text) for r in listing.refs} == {("train", "cat")}


@pytest.mark.parametrize("split", ["train", "val", "valid", "validation", "dev", "test", "eval"])
def test_class_folders_split_folder_names(split):
    listing = list_class_folders("/d", [(f"/d/{split}/cat/1.jpg", 1), ("/d/train/dog/2.jpg", 2)])
    assert listing.vocabulary == ["cat", "dog"]
    assert {(r.split, r.label_text) for r in listing.refs} == {(split, "cat"), ("train", "dog")}


def test_class_folders_split_names_are_case_sensitive():
    listing = list_class_folders("/d", [("/d/Train/cat/1.jpg", 1), ("/d/VAL/dog/2.jpg", 2)])
    assert listing.vocabulary == ["Train", "VAL"]
    assert {r.split for r in listing.refs} == {"train"}


def test_image_directly_under_root_is_dead_letter():
    files = [("/d/cat/1.jpg", 1), ("/d/stray.png", 2), ("/d/top.txt", 3)]
    listing = list_class_folders("/d", files)
    assert [r.filename for r in listing.refs] == ["cat/1.jpg"]
    assert dead_errors(listing) == {"stray.png": "no_class_folder"}
    assert listing.ignored == 1


def test_image_directly_under_split_folder_is_dead_letter():
    """Every top-level folder is a split name, so the tree is split by folder
    (module docstring); one stray image in a split folder has no class folder and
    must not turn 'train'/'test' into classes for every other image."""
    files = [("/d/train/cat/1.jpg", 1), ("/d/test/dog/2.jpg", 2), ("/d/test/3.jpg", 3)]
    listing = list_class_folders("/d", files)
    assert listing.vocabulary == ["cat", "dog"]
    assert {(r.split, r.filename, r.label_text) for r in listing.refs} == {
        ("train", "train/cat/1.jpg", "cat"),
        ("test", "test/dog/2.jpg", "dog"),
    }
    assert dead_errors(listing) == {"test/3.jpg": "no_class_folder"}


def test_class_folders_labels_order_and_unknown_class():
    files = [("/d/cat/1.jpg", 1), ("/d/dog/2.jpg", 2), ("/d/bird/3.jpg", 3)]
    listing = list_class_folders("/d", files, labels=["dog", "cat", "horse"])
    assert listing.vocabulary == ["dog", "cat", "horse"]
    assert {(r.filename, r.label, r.label_text) for r in listing.refs} == {
        ("cat/1.jpg", 1, "cat"),
        ("dog/2.jpg", 0, "dog"),
    }
    assert dead_errors(listing) == {"bird/3.jpg": "unknown_class"}
    assert "bird" in listing.dead_letters[0].message


def test_class_folders_empty_and_outside_root():
    listing = list_class_folders("/d", [])
    assert (listing.refs, listing.vocabulary, listing.ignored, listing.dead_letters) == ([], [], 0, [])
    with pytest.raises(ValueError, match=r"/other/cat/1\.jpg is not under the input root /d"):
        list_class_folders("/d", [("/other/cat/1.jpg", 1)])
    with pytest.raises(ValueError, match=r"/dd/cat/1\.jpg is not under the input root /d"):
        list_class_folders("/d", [("/dd/cat/1.jpg", 1)])  # a sibling with the same prefix


# --------------------------------------------------------------------------
# cifar
# --------------------------------------------------------------------------

CIFAR_LABELS = "dog\ncat\nsea_lion\n"
CIFAR = [
    ("/c/labels.txt", 20),
    ("/c/train/10_cat.png", 1),
    ("/c/train/11_dog.png", 2),
    ("/c/test/12_sea_lion.png", 3),
    ("/c/test/13_cat.PNG", 4),
    ("/c/train/14_bird.png", 5),  # not in labels.txt
    ("/c/train/weird.png", 6),  # no ID_CLASS
    ("/c/15_cat.png", 7),  # not inside a split folder
    ("/c/train/sub/16_cat.png", 8),  # too deep
    ("/c/train/readme.md", 9),
]


def test_cifar():
    listing = list_cifar("/c", CIFAR, CIFAR_LABELS)
    assert listing.layout == "cifar"
    assert listing.vocabulary == ["dog", "cat", "sea_lion"]
    assert listing.ignored == 2
    got = {(r.split, r.filename, r.label, r.label_text, r.size) for r in listing.refs}
    assert got == {
        ("train", "train/10_cat.png", 1, "cat", 1),
        ("train", "train/11_dog.png", 0, "dog", 2),
        ("test", "test/12_sea_lion.png", 2, "sea_lion", 3),
        ("test", "test/13_cat.PNG", 1, "cat", 4),
    }
    assert all(r.key == stable_key(r.split, r.filename) for r in listing.refs)
    assert dead_errors(listing) == {
        "train/14_bird.png": "unknown_class",
        "train/weird.png": "unlabeled",
        "15_cat.png": "unlabeled",
        "train/sub/16_cat.png": "unlabeled",
    }


def test_cifar_split_that_cannot_name_a_file_is_dead_letter():
    files = [("/c/my split/1_cat.png", 1), ("/c/ok.v2/2_cat.png", 2)]
    listing = list_cifar("/c", files, "cat\n")
    assert [(r.split, r.filename) for r in listing.refs] == [("ok.v2", "ok.v2/2_cat.png")]
    assert dead_errors(listing) == {"my split/1_cat.png": "bad_split"}


@pytest.mark.parametrize("labels_text", ["", "cat\ncat\n"])
def test_cifar_bad_labels_file(labels_text):
    with pytest.raises(ValueError, match="holds no class names|appears twice in the labels file"):
        list_cifar("/c", CIFAR, labels_text)


# --------------------------------------------------------------------------
# csv
# --------------------------------------------------------------------------

CSV_PATH = "gs://b/data/manifest.csv"
CSV_TEXT = (
    "image,label,split,note,weight,id\n"  # line 1
    'img/1.jpg,cat,train,"a,b",0.5,7\n'  # line 2
    "/abs/2.png,dog,test,plain,1,8\n"  # line 3
    "gs://other/3.jpg,cat,,x,2.5,9\n"  # line 4
    "\n"  # line 5: blank, skipped
    "img/4.jpg,dog,train,too,many,cells,here\n"  # line 6: bad row
    "img/missing.jpg,cat,train,y,1,10\n"  # line 7: no such file
    "img/5.txt,cat,train,z,1,11\n"  # line 8: not an image path
    "img/6.jpg,dog,bad split,w,1,12\n"  # line 9: split cannot name a file
)
SIZES = {
    "gs://b/data/img/1.jpg": 100,
    "/abs/2.png": 200,
    "gs://other/3.jpg": 300,
    "gs://b/data/img/6.jpg": 600,
}


def test_csv_manifest():
    asked = []

    def size_of(path):
        asked.append(path)
        return SIZES.get(path)

    listing = list_csv_manifest(CSV_PATH, CSV_TEXT, size_of)
    assert listing.layout == "csv"
    assert listing.vocabulary == ["cat", "dog"]
    assert listing.extra_features == {"id": "int64", "note": "string", "weight": "float32"}
    assert list(listing.extra_features) == ["id", "note", "weight"]
    refs = {r.path: r for r in listing.refs}
    assert set(refs) == {"gs://b/data/img/1.jpg", "/abs/2.png", "gs://other/3.jpg"}
    first = refs["gs://b/data/img/1.jpg"]
    assert first == ImageRef(
        split="train",
        key=stable_key("train", "img/1.jpg"),
        filename="img/1.jpg",
        path="gs://b/data/img/1.jpg",
        size=100,
        label=0,
        label_text="cat",
        extra=(("id", "int64", 7), ("note", "string", "a,b"), ("weight", "float32", 0.5)),
    )
    second = refs["/abs/2.png"]
    assert (second.split, second.filename, second.size, second.label, second.label_text) == (
        "test", "abs/2.png", 200, 1, "dog",
    )  # fmt: skip
    assert second.extra == (("id", "int64", 8), ("note", "string", "plain"), ("weight", "float32", 1.0))
    assert isinstance(second.extra[2][2], float) and isinstance(second.extra[0][2], int)
    assert refs["gs://other/3.jpg"].split == "train"  # empty split cell: the default
    assert dead_errors(listing) == {
        f"{CSV_PATH}:6": "bad_row",
        f"{CSV_PATH}:7": "missing_file",
        f"{CSV_PATH}:8": "not_an_image_path",
        "gs://b/data/img/6.jpg": "bad_split",
    }
    assert "gs://b/data/img/missing.jpg" in asked


def test_csv_int_labels_have_no_vocabulary():
    text = "image,label\na.jpg,0\nb.jpg,2\n"
    listing = list_csv_manifest("m/x.csv", text, lambda p: 1)
    assert listing.vocabulary == []
    assert {(r.path, r.label, r.label_text) for r in listing.refs} == {("m/a.jpg", 0, ""), ("m/b.jpg", 2, "")}
    assert listing.extra_features == {}
    assert all(r.extra == () for r in listing.refs)


def test_csv_labels_given_accept_names_and_indices():
    text = "image,label\na.jpg,cat\nb.jpg,0\nc.jpg,1\nd.jpg,5\ne.jpg,horse\n"
    listing = list_csv_manifest("/m/x.csv", text, lambda p: 1, labels=["dog", "cat"])
    assert listing.vocabulary == ["dog", "cat"]
    assert {(r.filename, r.label, r.label_text) for r in listing.refs} == {
        ("a.jpg", 1, "cat"),
        ("b.jpg", 0, "dog"),
        ("c.jpg", 1, "cat"),
    }
    assert dead_errors(listing) == {"/m/x.csv:5": "unknown_class", "/m/x.csv:6": "unknown_class"}


@pytest.mark.parametrize(
    "cells, dtype, values",
    [
        (["1", "-2", "30"], "int64", [1, -2, 30]),
        (["1", "2.5", "-3e2"], "float32", [1.0, 2.5, -300.0]),
        (["1", "x", "2.5"], "string", ["1", "x", "2.5"]),
        (["a,b", " padded ", "c"], "string", ["a,b", "padded", "c"]),
    ],
)
def test_csv_extra_column_types(cells, dtype, values):
    rows = "".join(f'{i}.jpg,0,"{cell}"\n' for i, cell in enumerate(cells))
    listing = list_csv_manifest("x.csv", "image,label,col\n" + rows, lambda p: 1)
    assert listing.extra_features == {"col": dtype}
    got = {r.filename: r.extra for r in listing.refs}
    assert [got[f"{i}.jpg"] for i in range(len(cells))] == [(("col", dtype, v),) for v in values]
    assert all(type(v) is type(values[0]) for ((_, _, v),) in got.values())


def test_csv_quoted_cells_and_header_whitespace():
    text = ' image , label ,caption\n"dir, with comma/1.jpg","sea, lion","said ""hi"", left"\n'
    listing = list_csv_manifest("/m/x.csv", text, {"/m/dir, with comma/1.jpg": 5}.get)
    [ref] = listing.refs
    assert (ref.path, ref.size, ref.label_text) == ("/m/dir, with comma/1.jpg", 5, "sea, lion")
    assert ref.extra == (("caption", "string", 'said "hi", left'),)


@pytest.mark.parametrize(
    "header, missing",
    [("image,split", "label"), ("label,split", "image"), ("photo,kind", "image")],
)
def test_csv_missing_required_column(header, missing):
    with pytest.raises(ValueError, match=rf"missing \[.*'{missing}'.*\]"):
        list_csv_manifest("x.csv", header + "\n", lambda p: 1)


@pytest.mark.parametrize("header", ["image,label,image/extra", "image,label,,x", "image,label, "])
def test_csv_reserved_extra_column_names(header):
    with pytest.raises(ValueError, match="reserved"):
        list_csv_manifest("x.csv", header + "\n", lambda p: 1)


def test_csv_empty_manifest():
    with pytest.raises(ValueError, match="empty"):
        list_csv_manifest("x.csv", "", lambda p: 1)
    listing = list_csv_manifest("x.csv", "image,label\n", lambda p: 1)
    assert (listing.refs, listing.dead_letters, listing.vocabulary) == ([], [], [])


def test_csv_manifest_rows_are_lines():
    """One physical line is one row: a quoted newline (which no image path holds) is
    broken quoting on its line, and the next line is a row of its own, so a stray
    quote never swallows the rows after it."""
    text = 'image,label,note\na.jpg,0,"two\nlines"\nb.jpg,0\nc.jpg,1,ok\n'
    listing = list_csv_manifest("x.csv", text, lambda p: 1)
    assert [r.filename for r in listing.refs] == ["c.jpg"]
    assert dead_errors(listing) == {"x.csv:2": "bad_quoting", "x.csv:3": "bad_row", "x.csv:4": "bad_row"}


@pytest.mark.parametrize("header", ["image,label,x,x", "image,label,label", "image,image,label"])
def test_csv_duplicate_column_is_refused(header):
    """A repeated column name would silently keep only its last cell; for an extra
    column it also puts the name twice in ImageRef.extra (one feature in the
    Example, two in image_example_size)."""
    cells = ",".join(["a.jpg", "0"] + [str(i) for i in range(header.count(",") - 1)])
    with pytest.raises(ValueError, match=r"m\.csv: the CSV header names columns \[.*\] more than once"):
        list_csv_manifest("m.csv", f"{header}\n{cells}\n", lambda p: 1)
