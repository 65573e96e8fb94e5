"""What an input is, and which flags apply to it: no silently wrong reading.

- ImageNet-style split folders (``ROOT/train``, ``ROOT/val``, ...) are splits,
  not classes; a mix of split names and other names is refused as ambiguous.
- A CSV manifest's image and label columns go by their usual names
  (``image_uri``, ``path``, ``class``, ...) or by ``--image_column`` /
  ``--label_column``; a CSV whose column holds image paths under another name is
  refused instead of becoming a table of path strings.
- A flag that does not apply to the input's kind (table flags on images, image
  flags on a table) is refused, naming the flag and the kind.
- ``--layout cifar`` without ``labels.txt``, ``infer-schema`` on a folder or a
  missing path: one-line errors, exit 2.

Expected values come from the files written here, never from the code under test.
"""

import csv
import os

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_cifar_sample, make_class_folder_sample, make_csv_manifest_sample
from beam_tfrecords.transforms.plan.layouts import (
    IMAGE_COLUMNS,
    image_path_column,
    list_csv_manifest,
    manifest_columns,
)
from tests.conftest import load_manifest, read_dataset

EXIT_OK, EXIT_USAGE = 0, 2
CONVERT_ERROR = "beam-tfrecords convert: error: "
INFER_ERROR = "beam-tfrecords infer-schema: error: "


def _first_error_line(capsys) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert lines, "nothing on stderr"
    return lines[0]


def _convert(*flags) -> int:
    return main(["convert", *flags])


def _labels_by_split(output):
    """``{split: {class text}}`` read back from the shards."""
    found = {}
    for shard, examples in read_dataset(output).items():
        split = shard.split("-", 1)[0]
        for features in examples:
            found.setdefault(split, set()).add(features["image/class/text"][0].decode())
    return found


def _rewrite_csv(path, rename=None, keep=None):
    """Rewrites a CSV with columns renamed (``{old: new}``) and only ``keep`` (old names)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    keep = keep or list(rows[0])
    rename = rename or {}
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow([rename.get(c, c) for c in keep])
        writer.writerows([row[c] for c in keep] for row in rows)
    return rows


@pytest.fixture
def table_csv(tmp_path):
    path = tmp_path / "table" / "t.csv"
    path.parent.mkdir()
    path.write_text("id,score,name\n1,0.5,a\n2,1.5,b\n3,2.5,c\n")
    return str(path)


# --------------------------------------------------------------------------
# 1. split folders
# --------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("splits", [("train", "val"), ("train", "valid", "eval"), ("dev", "test", "validation")])
def test_imagenet_style_split_folders_are_splits(tmp_path, capsys, splits):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    classes = ("n01440764", "n01443537")
    written = make_class_folder_sample(root, per_class=2, splits=splits, classes=classes)
    assert _convert("--input", root, "--output", out) == EXIT_OK, capsys.readouterr().err

    manifest = load_manifest(out)
    assert set(manifest["splits"]) == set(splits)
    assert manifest["labels"]["vocabulary"] == sorted(classes)
    for split in splits:
        assert manifest["splits"][split]["records"] == 2 * len(classes)
        # The split written to the shard files is the folder's own name.
        assert os.path.exists(os.path.join(out, f"{split}-00000-of-00001.tfrecord"))
    assert _labels_by_split(out) == {split: set(classes) for split in splits}
    assert sum(s["records"] for s in manifest["splits"].values()) == len(written)


@pytest.mark.e2e
def test_split_names_mixed_with_other_folders_are_refused(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=1, splits=("train", "val"), classes=("cat",))
    make_class_folder_sample(root, per_class=1, splits=None, classes=("bird",))
    assert _convert("--input", root, "--output", out) == EXIT_USAGE
    line = _first_error_line(capsys)
    assert line.startswith(CONVERT_ERROR + f"--input {root}: ")
    assert "top-level folders ['train', 'val'] look like splits but ['bird'] do not" in line
    assert f"point --input at one split folder (e.g. {root}/train" in line
    assert not os.path.exists(out)


@pytest.mark.e2e
def test_split_names_that_differ_in_case_are_classes(tmp_path, capsys):
    """Split names are matched as on disk, lower case: ``Train`` is a class."""
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=1, splits=None, classes=("Train", "Val"))
    assert _convert("--input", root, "--output", out) == EXIT_OK, capsys.readouterr().err
    manifest = load_manifest(out)
    assert set(manifest["splits"]) == {"train"}
    assert manifest["labels"]["vocabulary"] == ["Train", "Val"]


# --------------------------------------------------------------------------
# 2. CSV manifest columns
# --------------------------------------------------------------------------


@pytest.mark.e2e
def test_tfrecorder_style_manifest_is_an_image_manifest(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    csv_path = os.path.join(root, "manifest.csv")
    rows = make_csv_manifest_sample(root, n=8)
    _rewrite_csv(csv_path, rename={"image": "image_uri"}, keep=["image", "label", "split"])
    assert _convert("--input", csv_path, "--output", out) == EXIT_OK, capsys.readouterr().err

    manifest = load_manifest(out)
    assert manifest["input"]["layout"] == "csv"
    assert manifest["labels"]["vocabulary"] == sorted({r["label"] for r in rows})
    assert set(manifest["splits"]) == {r["split"] for r in rows}
    for split in manifest["splits"]:
        assert manifest["splits"][split]["records"] == sum(r["split"] == split for r in rows)
    names = {f["image/filename"][0].decode() for ex in read_dataset(out).values() for f in ex}
    assert names == {r["image"] for r in rows}
    assert "image_uri" not in manifest["features"]  # the path column is no feature


@pytest.mark.e2e
def test_image_and_label_column_flags(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    csv_path = os.path.join(root, "manifest.csv")
    rows = make_csv_manifest_sample(root, n=6)
    _rewrite_csv(csv_path, rename={"image": "photo", "label": "kind"},
                 keep=["image", "label", "split", "note"])
    assert _convert("--input", csv_path, "--output", out,
                    "--image_column", "photo", "--label_column", "kind") == EXIT_OK, \
        capsys.readouterr().err
    manifest = load_manifest(out)
    assert manifest["input"]["layout"] == "csv"
    assert manifest["labels"]["vocabulary"] == sorted({r["label"] for r in rows})
    assert set(manifest["features"]) >= {"note"} and "photo" not in manifest["features"]
    assert sum(s["records"] for s in manifest["splits"].values()) == len(rows)


@pytest.mark.e2e
def test_column_of_image_paths_without_a_known_name_is_refused(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    csv_path = os.path.join(root, "manifest.csv")
    make_csv_manifest_sample(root, n=4)
    _rewrite_csv(csv_path, rename={"image": "photo"}, keep=["image", "label"])
    assert _convert("--input", csv_path, "--output", out) == EXIT_USAGE
    line = _first_error_line(capsys)
    assert line.startswith(CONVERT_ERROR + f"--input {csv_path}: column 'photo' holds image paths")
    assert "pass --image_column photo" in line
    assert not os.path.exists(out)
    # Being explicit either way works: a table of strings...
    assert _convert("--input", csv_path, "--output", out, "--layout", "table") == EXIT_OK
    assert load_manifest(out)["input"]["layout"] == "table"
    # ... or the images.
    out2 = str(tmp_path / "out2")
    assert _convert("--input", csv_path, "--output", out2, "--image_column", "photo") == EXIT_OK
    assert sum(s["records"] for s in load_manifest(out2)["splits"].values()) == 4


@pytest.mark.e2e
@pytest.mark.parametrize("flags, message", [
    (["--image_column", "photo"], "--image_column: column 'photo' is not in the CSV header"),
    (["--label_column", "kind"], "--label_column: column 'kind' is not in the CSV header"),
    (["--image_column", "label"], "the image column and the label column are both 'label'; pass "
                                  "--image_column and --label_column naming different columns"),
    (["--image_column", "image", "--label_column", "image"],
     "--image_column and --label_column must name different columns; both are 'image'"),
    (["--image_column", "split"], "column 'split' names the split; it cannot be the image column"),
])
def test_manifest_column_flags_are_checked_before_running(tmp_path, capsys, flags, message):
    root = str(tmp_path / "in")
    make_csv_manifest_sample(root, n=2)
    code = _convert("--input", os.path.join(root, "manifest.csv"), "--output",
                    str(tmp_path / "out"), *flags)
    assert code == EXIT_USAGE
    assert message in _first_error_line(capsys)


@pytest.mark.e2e
def test_manifest_without_a_label_column_fails_before_running(tmp_path, capsys):
    root = str(tmp_path / "in")
    csv_path = os.path.join(root, "manifest.csv")
    make_csv_manifest_sample(root, n=2)
    _rewrite_csv(csv_path, keep=["image", "split"])
    assert _convert("--input", csv_path, "--output", str(tmp_path / "out")) == EXIT_USAGE
    line = _first_error_line(capsys)
    assert "missing ['label']" in line and "--label_column" in line


@pytest.mark.e2e
@pytest.mark.parametrize("flag", ["--image_column", "--label_column"])
def test_manifest_column_flags_are_refused_for_other_inputs(tmp_path, capsys, table_csv, flag):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    assert _convert("--input", root, "--output", str(tmp_path / "o1"), flag, "x") == EXIT_USAGE
    line = _first_error_line(capsys)
    assert line == (CONVERT_ERROR + f"{flag} applies only to CSV image manifests, and --input "
                    f"{root} is a folder of images: remove it")
    assert _convert("--input", table_csv, "--output", str(tmp_path / "o2"), "--layout", "table",
                    flag, "x") == EXIT_USAGE
    assert f"{flag} applies to CSV image manifests, not to --layout table" in _first_error_line(capsys)


@pytest.mark.unit
@pytest.mark.parametrize("name", IMAGE_COLUMNS)
def test_every_usual_image_column_name_is_recognized(name):
    listing = list_csv_manifest("/m/x.csv", f"{name},category,split\na.jpg,cat,val\n", lambda p: 7)
    [ref] = listing.refs
    assert (ref.path, ref.split, ref.label_text, ref.extra) == ("/m/a.jpg", "val", "cat", ())


@pytest.mark.unit
def test_manifest_columns_first_match_wins_and_flags_override():
    header = ["uri", "path", "class", "label", "split"]
    assert manifest_columns(header) == ("path", "label")
    assert manifest_columns(header, "uri", "class") == ("uri", "class")
    listing = list_csv_manifest("/m/x.csv", "uri,path,label\na.jpg,b.png,0\n", lambda p: 1)
    [ref] = listing.refs
    assert ref.filename == "b.png" and ref.extra == (("uri", "string", "a.jpg"),)


@pytest.mark.unit
def test_image_path_column():
    header = ["id", "photo", "caption"]
    rows = [["1", "a/1.JPG", "x.png is nice"], ["2", "", "y"], ["3", "b/2.png", "z"]]
    assert image_path_column(header, rows) == ("photo", "a/1.JPG")
    assert image_path_column(header, [["1", "a/1.jpg", ""], ["2", "notes.txt", ""]]) is None
    assert image_path_column(header, []) is None


# --------------------------------------------------------------------------
# 3. flags that do not apply to the input's kind
# --------------------------------------------------------------------------

TABLE_FLAGS = [  # --splits applies to images too (see tests/test_image_splits.py).
    (["--split_column", "split"], "--split_column"),
    (["--splits", "train=0.5,test=0.5", "--key_column", "id"], "--key_column"),
    (["--sequence_key", "id"], "--sequence_key"),
    (["--sequence_key", "id", "--sequence_order", "t"], "--sequence_key, --sequence_order"),
    (["--schema", "s.yaml"], "--schema"),
    (["--no_header", "--columns", "a,b"], "--no_header, --columns"),
    (["--csv_delimiter", ";"], "--csv_delimiter"),
    (["--csv_quote", "'"], "--csv_quote"),
    (["--encoding", "latin-1"], "--encoding"),
    (["--no_quoted_newlines"], "--no_quoted_newlines"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("flags, named", TABLE_FLAGS)
def test_table_flags_are_refused_on_an_image_folder(tmp_path, capsys, flags, named):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    assert _convert("--input", root, "--output", str(tmp_path / "out"), *flags) == EXIT_USAGE
    verb = "apply" if "," in named else "applies"
    assert _first_error_line(capsys) == (
        CONVERT_ERROR + f"{named} {verb} only to tables, and --input {root} is a folder of images: "
        f"remove {'them' if ',' in named else 'it'}")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.e2e
@pytest.mark.parametrize("flags, named", [
    (["--split_column", "split"], "--split_column"),
    (["--schema", "s.yaml"], "--schema"),
    (["--csv_delimiter", ","], None),  # the default, given explicitly: fine
])
def test_table_flags_are_refused_on_an_image_manifest(tmp_path, capsys, flags, named):
    root = str(tmp_path / "in")
    csv_path = os.path.join(root, "manifest.csv")
    make_csv_manifest_sample(root, n=2)
    code = _convert("--input", csv_path, "--output", str(tmp_path / "out"), *flags)
    if named is None:
        assert code == EXIT_OK, capsys.readouterr().err
        return
    assert code == EXIT_USAGE
    assert _first_error_line(capsys) == (
        CONVERT_ERROR + f"{named} applies only to tables, and --input {csv_path} is a CSV image "
        "manifest: remove it (or pass --layout table to read the CSV as a table)")


@pytest.mark.e2e
@pytest.mark.parametrize("flags, named", [
    (["--labels", "LABELS"], "--labels"),
    (["--validate", "decode"], "--validate"),
    (["--read_threads", "8"], "--read_threads"),
    (["--max_pixels", "1000"], "--max_pixels"),
    (["--validate", "decode", "--read_threads", "2"], "--validate, --read_threads"),
])
def test_image_flags_are_refused_on_a_table(tmp_path, capsys, table_csv, flags, named):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    flags = [str(labels) if f == "LABELS" else f for f in flags]
    assert _convert("--input", table_csv, "--output", str(tmp_path / "out"), *flags) == EXIT_USAGE
    many = "," in named
    assert _first_error_line(capsys) == (
        CONVERT_ERROR + f"{named} appl{'y' if many else 'ies'} only to images, and --input "
        f"{table_csv} is a table (a CSV without an image column): remove "
        f"{'them' if many else 'it'} (or pass --image_column NAME to read the CSV as an image "
        "manifest)")
    # With --layout table, no hint about manifests.
    assert _convert("--input", table_csv, "--output", str(tmp_path / "out"), "--layout", "table",
                    *flags) == EXIT_USAGE
    assert _first_error_line(capsys).endswith(f"is a table (--layout table): remove {'them' if many else 'it'}")


@pytest.mark.e2e
def test_defaults_given_explicitly_are_not_refused(tmp_path, capsys, table_csv):
    out = str(tmp_path / "out")
    assert _convert("--input", table_csv, "--output", out, "--validate", "structure",
                    "--read_threads", "4") == EXIT_OK, capsys.readouterr().err
    assert load_manifest(out)["input"]["layout"] == "table"


@pytest.mark.e2e
def test_schema_on_an_image_folder_is_refused_not_read_as_a_table(tmp_path, capsys):
    """It used to be read as a table and crash (IsADirectoryError, exit 1)."""
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    schema = tmp_path / "s.yaml"
    schema.write_text("columns:\n  - {name: a, type: int64}\n")
    assert _convert("--input", root, "--output", str(tmp_path / "out"),
                    "--schema", str(schema)) == EXIT_USAGE
    assert _first_error_line(capsys).startswith(CONVERT_ERROR + "--schema applies only to tables")


# --------------------------------------------------------------------------
# 4. cifar without labels.txt
# --------------------------------------------------------------------------


@pytest.mark.e2e
def test_cifar_without_labels_file(tmp_path, capsys):
    root = str(tmp_path / "in")
    make_cifar_sample(root, {"train": 4, "test": 2})
    labels = tmp_path / "classes.txt"
    os.replace(os.path.join(root, "labels.txt"), labels)
    assert _convert("--input", root, "--output", str(tmp_path / "out"), "--layout", "cifar") == EXIT_USAGE
    line = _first_error_line(capsys)
    assert line == (CONVERT_ERROR + f"--layout cifar: {root}/labels.txt does not exist; it names "
                    "the classes, one per line (or pass --labels FILE)")
    # --labels stands in for it.
    out = str(tmp_path / "out")
    assert _convert("--input", root, "--output", out, "--layout", "cifar",
                    "--labels", str(labels)) == EXIT_OK, capsys.readouterr().err
    assert {s: v["records"] for s, v in load_manifest(out)["splits"].items()} == {"train": 4, "test": 2}


# --------------------------------------------------------------------------
# 5. tables given a folder, infer-schema given a folder or nothing
# --------------------------------------------------------------------------


@pytest.mark.e2e
def test_infer_schema_on_a_folder(tmp_path, capsys):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    assert main(["infer-schema", "--input", root]) == EXIT_USAGE
    assert _first_error_line(capsys) == (
        INFER_ERROR + "--input must be a table file or glob (CSV, Parquet or JSON Lines, "
        f"e.g. '{root}/*.csv'), not a folder: {root}")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["infer-schema", "--input", str(empty)]) == EXIT_USAGE
    assert "not a folder" in _first_error_line(capsys)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["missing.csv", "missing", "nowhere/*.csv"])
def test_infer_schema_on_a_missing_path(tmp_path, capsys, name):
    path = str(tmp_path / name)
    assert main(["infer-schema", "--input", path]) == EXIT_USAGE
    assert _first_error_line(capsys) == INFER_ERROR + f"--input: no files match {path}"


@pytest.mark.e2e
def test_table_layout_on_a_folder(tmp_path, capsys):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    assert _convert("--input", root, "--output", str(tmp_path / "out"), "--layout", "table") == EXIT_USAGE
    assert _first_error_line(capsys).startswith(CONVERT_ERROR + "--input must be a table file or glob")


@pytest.mark.e2e
def test_glob_of_image_manifests_is_refused(tmp_path, capsys):
    root = str(tmp_path / "in")
    make_csv_manifest_sample(root, n=2)
    pattern = os.path.join(root, "*.csv")
    assert _convert("--input", pattern, "--output", str(tmp_path / "out")) == EXIT_USAGE
    assert _first_error_line(capsys).startswith(
        CONVERT_ERROR + f"--input {pattern}: an image manifest is one comma-separated .csv file")
