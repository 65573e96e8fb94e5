"""The TFDS metadata files (issue 22, item 1): the exact bytes ``tfds_metadata`` gives for a
known manifest (TFDS 4.9's JSON: 64-bit integers as strings, keys sorted), the roles
it reads through ``--feature_names`` renames, what it declares when TFDS cannot
represent a dataset (gzip, GIF, several channel counts, 16-bit images, class names a
labels file cannot hold, a split name holding '.'), the manifest's ``tfds`` entry
naming the files (or why none), and ``verify`` failing, with one line naming each
file, a dataset whose ``dataset_info.json`` was edited, whose TFDS files were all
deleted, or which holds one the manifest does not imply; the files are the run's own (removed by a gzip run
over them, a user's file of such a name refused).
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.pipeline import convert
from beam_tfrecords.samples import make_cifar_sample
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.manifest import parse_manifest
from beam_tfrecords.transforms.codec.tfds_metadata import (
    is_tfds_file,
    tfds_digests,
    tfds_entry,
    tfds_metadata,
    tfds_notes,
)

MANIFEST = {
    "tool": {"name": "beam-tfrecords", "version": "9.9.9"},
    "options": {"compression": "none"},
    "input": {"root": "My Photos"},
    "splits": {
        "train": {"bytes": 300, "shards": [{"path": "train-00000-of-00002.tfrecord", "records": 2},
                                           {"path": "train-00001-of-00002.tfrecord", "records": 1}]},
        "test": {"bytes": 100, "shards": [{"path": "test-00000-of-00001.tfrecord", "records": 1}]},
    },
    "labels": {"vocabulary": ["cat", "dog"]},
    "features": {"image/encoded": {"dtype": "string", "shape": []},
                 "image/class/label": {"dtype": "int64", "shape": []},
                 "image/height": {"dtype": "int64", "shape": []},
                 "image/filename": {"dtype": "string", "shape": []},
                 "ids": {"dtype": "float32", "shape": [None]}},
}
for _split in MANIFEST["splits"].values():
    _split["statistics"] = {"images": {"formats": {"png": 1}, "modes": {"RGB": 1}}}

DATASET_INFO = """{
  "description": "Written by beam-tfrecords 9.9.9 from the records' feature spec in manifest.json (the dataset's checksums and statistics).",
  "fileFormat": "tfrecord",
  "name": "my_photos",
  "splits": [
    {
      "filepathTemplate": "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}",
      "name": "test",
      "numBytes": "100",
      "shardLengths": [
        "1"
      ]
    },
    {
      "filepathTemplate": "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}",
      "name": "train",
      "numBytes": "300",
      "shardLengths": [
        "2",
        "1"
      ]
    }
  ],
  "version": "1.0.0"
}"""

_P = "tensorflow_datasets.core.features."
FEATURES = {
    "ids": {"pythonClassName": _P + "tensor_feature.Tensor",
            "tensor": {"dtype": "float32", "encoding": "none", "shape": {"dimensions": ["-1"]}}},
    "image/class/label": {"classLabel": {"numClasses": "2"}, "pythonClassName": _P + "class_label_feature.ClassLabel"},
    "image/encoded": {"image": {"dtype": "uint8", "encodingFormat": "png", "shape": {"dimensions": ["-1", "-1", "3"]}},
                      "pythonClassName": _P + "image_feature.Image"},
    "image/filename": {"pythonClassName": _P + "text_feature.Text", "text": {}},
    "image/height": {"pythonClassName": _P + "scalar.Scalar",
                     "tensor": {"dtype": "int64", "encoding": "none", "shape": {}}},
}


def _with(**changes) -> dict:
    manifest = copy.deepcopy(MANIFEST)
    manifest.update(changes)
    return manifest


def _features(manifest) -> dict:
    return json.loads(tfds_metadata(manifest)["features.json"])["featuresDict"]["features"]


@pytest.mark.unit
def test_the_bytes_of_a_known_manifest():
    made = tfds_metadata(MANIFEST)
    assert sorted(made) == ["dataset_info.json", "features.json", "image.class.label.labels.txt"]
    assert made["dataset_info.json"].decode() == DATASET_INFO
    assert made["features.json"] == json.dumps(
        {"featuresDict": {"features": FEATURES}, "pythonClassName": _P + "features_dict.FeaturesDict"},
        indent=4, sort_keys=True).encode()
    assert made["image.class.label.labels.txt"] == b"cat\ndog\n"
    assert tfds_metadata(copy.deepcopy(MANIFEST)) == made  # Deterministic.
    assert all(is_tfds_file(name) for name in made) and not is_tfds_file("manifest.json")


@pytest.mark.unit
def test_renamed_features_keep_their_roles():
    manifest = _with(feature_names={"image/encoded": "img", "image/class/label": "label"})
    manifest["features"] = {"img": MANIFEST["features"]["image/encoded"],
                            "label": MANIFEST["features"]["image/class/label"]}
    made = tfds_metadata(manifest)
    assert made["label.labels.txt"] == b"cat\ndog\n"
    features = _features(manifest)
    assert "image" in features["img"] and "classLabel" in features["label"]


@pytest.mark.unit
def test_what_tfds_cannot_represent():
    assert tfds_metadata(_with(options={"compression": "gzip"})) == {}
    assert tfds_notes(_with(options={"compression": "gzip"}))[0].startswith("gzip shards")
    gif = _with()
    gif["splits"]["train"]["statistics"]["images"]["formats"] = {"gif": 1, "png": 2}
    assert _features(gif)["image/encoded"]["tensor"]["dtype"] == "string"
    assert "gif" in tfds_notes(gif)[0] and "gif" in json.loads(tfds_metadata(gif)["dataset_info.json"])["description"]
    mixed = _with()
    mixed["splits"]["test"]["statistics"]["images"]["modes"] = {"L": 1}
    mixed["splits"]["test"]["statistics"]["images"]["formats"] = {"jpeg": 1}
    image = _features(mixed)["image/encoded"]["image"]
    assert image["shape"]["dimensions"] == ["-1", "-1", "-1"] and "encodingFormat" not in image
    blank = _with(labels={"vocabulary": ["cat", " dog"]})  # TFDS strips each line of a labels file.
    assert "tensor" in _features(blank)["image/class/label"]
    assert not any(n.endswith(".labels.txt") for n in tfds_metadata(blank))


@pytest.mark.unit
@pytest.mark.parametrize("modes, channels, dtype", [
    ({"L": 1, "RGB": 1}, "-1", "uint8"),  # Grey among RGB: TFDS refuses png with no channel count.
    ({"L16": 2}, "1", "uint16"),  # The statistics' 16-bit modes: every image 16-bit is uint16,
    ({"RGBA16": 1, "RGB16": 1}, "-1", "uint16"),
    ({"L16": 1, "L": 1}, "1", "uint8"),  # with 8-bit ones uint8 (TensorFlow scales them down).
])
def test_png_channels_and_bit_depth(modes, channels, dtype):
    manifest = _with()
    for info in manifest["splits"].values():
        info["statistics"]["images"]["modes"] = modes
    image = _features(manifest)["image/encoded"]["image"]
    assert image["shape"]["dimensions"] == ["-1", "-1", channels] and image["dtype"] == dtype
    assert image.get("encodingFormat") == (None if channels == "-1" else "png")


@pytest.mark.unit
def test_the_manifest_names_the_files_or_why_none():
    assert tfds_entry(MANIFEST) == {"written": True, "files": sorted(tfds_metadata(MANIFEST))}
    assert tfds_entry(_with(options={"compression": "gzip"})) == {
        "written": False, "why": "gzip shards: TFDS reads TFRecord files uncompressed only"}
    dotted = _with()  # TFDS's split parser refuses as_dataset(split="train.v2"): no metadata at all.
    dotted["splits"]["train.v2"] = dotted["splits"].pop("train")
    assert tfds_metadata(dotted) == {} and tfds_entry(dotted) == {
        "written": False, "why": "split name train.v2: TFDS cannot parse a split name holding '.'"}
    assert tfds_notes(dotted) == ["split name train.v2: TFDS cannot parse a split name holding '.'; "
                                  "no TFDS metadata is written"]
    base = {"format_version": 1, "created": "x", "splits": {}, "labels": {"vocabulary": []},
            "bad_records": {"total": 0}}
    for entry in ({"written": True, "files": ["features.json"]}, {"written": False, "why": "gzip"}):
        assert parse_manifest(json.dumps({**base, "tfds": entry}))["tfds"] == entry
    for entry, why in (({"written": True}, "tfds.files: missing"), ({"written": False}, "tfds.why: missing"),
                       ({"written": True, "files": ["a/b.labels.txt"]}, "is not a file name beside"),
                       ({"written": True, "files": ["../x.json"]}, "leads outside the dataset folder")):
        with pytest.raises(ValueError, match=why):
            parse_manifest(json.dumps({**base, "tfds": entry}))


@pytest.mark.unit
def test_detection_ids_index_the_labels_file():
    manifest = _with(annotations={"layout": "coco", "label_map": {"items": [{"id": 2, "name": "dog"},
                                                                            {"id": 4, "name": "cat"}]}})
    manifest["features"] = {"image/encoded": MANIFEST["features"]["image/encoded"],
                            "image/object/class/label": {"dtype": "int64", "shape": [None]},
                            "image/object/bbox/xmin": {"dtype": "float32", "shape": [None]},
                            "image/object/mask": {"dtype": "string", "shape": [None]}}
    made = tfds_metadata(manifest)
    assert made["image.object.class.label.labels.txt"] == b"background\nunused_1\ndog\nunused_3\ncat\n"
    features = _features(manifest)
    assert features["image/object/class/label"]["sequence"]["feature"]["classLabel"] == {"numClasses": "5"}
    assert "tensor" in features["image/object/bbox/xmin"]["sequence"]["feature"]
    assert features["image/object/mask"]["sequence"]["feature"]["image"]["shape"]["dimensions"][-1] == "1"
    assert set(tfds_digests(manifest)) == set(made)


@pytest.mark.beam
def test_verify_fails_an_edited_dataset_info(tmp_path, capsys):
    make_cifar_sample(str(tmp_path / "in"), counts={"train": 3}, seed=1)
    out = tmp_path / "out"
    assert convert(ConvertConfig(input=str(tmp_path / "in"), output=str(out), encode_processes=0)).ok
    assert main(["verify", str(out)]) == 0
    info = out / "dataset_info.json"
    size = info.stat().st_size
    info.write_bytes(info.read_bytes().replace(b'"3"', b'"4"'))
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert failed == [f"  FAIL  {info}  TFDS metadata differs from what manifest.json gives "
                      f"({size} bytes, expected {size}; recomputed from it)"]
    made = sorted(json.loads((out / "manifest.json").read_text())["tfds"]["files"])
    assert made == ["dataset_info.json", "features.json", "image.class.label.labels.txt"]
    for name in made:  # All of them gone: the manifest says they were written.
        (out / name).unlink()
    (out / "image.class.text.labels.txt").write_text("x\n")  # One no manifest implies.
    assert main(["verify", str(out)]) == 1
    failed = [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line]
    assert failed == [f"  FAIL  {out / name}  TFDS metadata file missing (manifest.json lists it in tfds.files)"
                      for name in made] + [
        f"  FAIL  {out / 'image.class.text.labels.txt'}  TFDS metadata file that manifest.json does not imply "
        f"(its tfds.files: {', '.join(made)}); TFDS would read it: remove it"]
    (out / "image.class.text.labels.txt").unlink()  # A manifest written before the entry: not checked.
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["tfds"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", str(out)]) == 0


@pytest.mark.beam
def test_the_files_are_the_runs_own_and_nothing_else(tmp_path, capsys):
    """A gzip run over a plain dataset (--overwrite) removes its TFDS files; a user's file
    of such a name is refused (exit 2, one line naming it) and left as it was."""
    make_cifar_sample(str(tmp_path / "in"), counts={"train": 2}, seed=3)
    out = tmp_path / "out"
    flags = ["convert", "--input", str(tmp_path / "in"), "--output", str(out), "--encode_processes", "0"]
    assert main(flags) == 0
    assert {"dataset_info.json", "features.json", "image.class.label.labels.txt"} <= set(os.listdir(out))
    assert main([*flags, "--overwrite", "--compression", "gzip"]) == 0
    assert not [name for name in os.listdir(out) if is_tfds_file(name)]
    assert main(["verify", str(out)]) == 0
    (out / "features.json").write_bytes(b"{}")  # A user's: TFDS would read it, verify fails it.
    capsys.readouterr()
    assert main(["verify", str(out)]) == 1
    assert [line for line in capsys.readouterr().out.splitlines() if "FAIL" in line] == [
        f"  FAIL  {out / 'features.json'}  TFDS metadata file that manifest.json does not imply (no TFDS "
        f"metadata was written: \"gzip shards: TFDS reads TFRecord files uncompressed only\"); TFDS would "
        f"read it: remove it"]
    assert main([*flags, "--overwrite"]) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cannot prove it wrote" in refusal and refusal.endswith(
        "features.json; with or without --overwrite, move it out of the folder, or choose another --output")
    assert (out / "features.json").read_bytes() == b"{}"


@pytest.mark.beam
def test_a_split_name_holding_a_dot_gets_no_tfds_metadata(tmp_path, capsys):
    """TFDS cannot parse ``train.v2`` (as_dataset refuses it): the run goes on (refusing would
    break such names, valid since the first version), the plan and the manifest say why."""
    table = tmp_path / "t.csv"
    table.write_text("k,v\n" + "".join(f"{i},{i % 7}\n" for i in range(12)))
    out = tmp_path / "out"
    assert main(["convert", "--input", str(table), "--output", str(out), "--splits", "train.v2=0.5,test=0.5",
                 "--encode_processes", "0"]) == 0
    why = "split name train.v2: TFDS cannot parse a split name holding '.'"
    assert f"  TFDS metadata: none ({why})" in capsys.readouterr().out.splitlines()
    assert json.loads((out / "manifest.json").read_text())["tfds"] == {"written": False, "why": why}
    assert not [name for name in os.listdir(out) if is_tfds_file(name)]
    assert main(["verify", str(out)]) == 0
