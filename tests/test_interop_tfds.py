"""TFDS reads our output as it is (issue 22, "Must show"): ``tfds.builder_from_directory``
on an image dataset (class folders, PNG only, one grayscale image among RGB ones: no
encoding can be declared for two channel counts), a 16-bit grayscale PNG dataset, a
table dataset (CSV, ratio splits) and a detection dataset (COCO: category ids 3, 7
and 18, instance masks), each converted once for the module:

- every split's record and shard counts equal the manifest's;
- ``train[:10%]`` (``[:50%]`` of the four COCO images) gives the first records of the
  split's shards, in order, none else;
- every decoded image has its record's height and width (and the grayscale one one
  channel, the others three); every instance mask its image's size; the 16-bit
  images decode as ``uint16``, each pixel its file's;
- the class names equal the vocabulary (COCO: the name at each category id, and each
  object's decoded class name its ``image/object/class/text``);
- the table's values equal the records parsed by protobuf, feature by feature;
- the README's "Loading with TFDS" snippet runs as written on the image dataset.

``pytest -s`` prints the figures.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import config_from_args, convert_parser
from beam_tfrecords.pipeline import convert
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from tests.harness import annotated_sets as sets

pytestmark = pytest.mark.interop

tfds = pytest.importorskip("tensorflow_datasets")


def _convert(out: Path, *flags: str) -> dict:
    config = config_from_args(convert_parser().parse_args([*flags, "--output", str(out),
                                                           "--encode_processes", "0"]))
    result = convert(config)
    assert result.ok, result.report
    return json.loads((out / "manifest.json").read_text())


def _records(out: Path, manifest: dict, split: str) -> list[dict]:
    """The split's records parsed by protobuf, shards in index order."""
    found = []
    for shard in manifest["splits"][split]["shards"]:
        with open(out / shard["path"], "rb") as f:
            found += [example_to_dict(r) for r in iter_records(f)]
    return found


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    work = tmp_path_factory.mktemp("tfds")
    images = work / "images"
    make_class_folder_sample(str(images), per_class=5, splits=("train", "test"), formats=("png",), seed=5)
    Image.fromarray(np.arange(70 * 50, dtype=np.uint8).reshape(50, 70)).save(images / "train" / "circles" / "gray.png")
    table = work / "table" / "table.csv"
    table.parent.mkdir()
    table.write_text("id,flag,count,score,name\n" + "".join(
        f"{i},{'true' if i % 3 else 'false'},{i * 7 % 11},{i / 8:.3f},row {i}\n" for i in range(60)))
    coco = sets.make_coco(work / "coco")
    for i, name in enumerate(("a", "b")):
        (work / "sixteen" / name).mkdir(parents=True)
        Image.fromarray(_sixteen_bit(i)).save(work / "sixteen" / name / f"{name}.png")
    return {
        "image": (work / "out-image", _convert(work / "out-image", "--input", str(images))),
        "table": (work / "out-table", _convert(work / "out-table", "--input", str(table),
                                               "--splits", "train=0.75,test=0.25", "--key_column", "id")),
        "detection": (work / "out-coco", _convert(work / "out-coco", *coco.flags)),
        "sixteen": (work / "out-16", _convert(work / "out-16", "--input", str(work / "sixteen"))),
    }


def _sixteen_bit(seed: int) -> np.ndarray:
    return (np.arange(10 * 12, dtype=np.uint16).reshape(10, 12) * 547 + seed * 9).astype(np.uint16)


def _counts_and_slice(out: Path, manifest: dict, key: str, percent: int) -> tuple:
    """Checks the split counts and ``train[:percent%]``; returns the builder and figures."""
    builder = tfds.builder_from_directory(str(out))
    for split, info in manifest["splits"].items():
        assert builder.info.splits[split].num_examples == info["records"]
        assert builder.info.splits[split].num_shards == info["num_shards"]
    sliced = list(tfds.as_numpy(builder.as_dataset(split=f"train[:{percent}%]", shuffle_files=False)))
    first = _records(out, manifest, "train")[:len(sliced)]
    total = manifest["splits"]["train"]["records"]
    assert sliced and abs(len(sliced) - total * percent / 100) <= 1
    assert [r[key] for r in sliced] == [r[key][0] for r in first]
    counts = {s: builder.info.splits[s].num_examples for s in sorted(manifest["splits"])}
    return builder, f"splits {counts} = manifest; train[:{percent}%] {len(sliced)} of {total} records"


def test_image_dataset(datasets):
    out, manifest = datasets["image"]
    builder, figures = _counts_and_slice(out, manifest, "image/filename", 10)
    assert builder.info.features["image/class/label"].names == manifest["labels"]["vocabulary"]
    shapes = set()
    for split in manifest["splits"]:
        for record in tfds.as_numpy(builder.as_dataset(split=split)):
            image = record["image/encoded"]
            assert image.shape[:2] == (record["image/height"], record["image/width"])
            assert image.shape[2] == record["image/channels"] == (1 if record["image/filename"].endswith(b"gray.png")
                                                                  else 3)
            assert builder.info.features["image/class/label"].int2str(record["image/class/label"]) \
                == record["image/class/text"].decode()
            shapes.add(image.shape[2])
    print(f"\n  TFDS image dataset: {figures}; every image its record's height x width "
          f"(channels {sorted(shapes)}); class names = vocabulary {manifest['labels']['vocabulary']}")


def test_table_dataset(datasets):
    out, manifest = datasets["table"]
    builder, figures = _counts_and_slice(out, manifest, "id", 10)
    assert sorted(builder.info.features.keys()) == sorted(manifest["features"])
    compared = 0
    for split in manifest["splits"]:
        read = list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))
        for got, want in zip(read, _records(out, manifest, split), strict=True):
            for name, values in want.items():
                assert np.asarray(got[name]).ravel().tolist() == pytest.approx(values) \
                    if not isinstance(values[0], bytes) else [got[name]] == values
            compared += 1
    print(f"\n  TFDS table dataset: {figures}; {compared} records equal to protobuf's parse")


def test_detection_dataset(datasets):
    out, manifest = datasets["detection"]
    builder, figures = _counts_and_slice(out, manifest, "image/source_id", 50)
    names = builder.info.features["image/object/class/label"].feature.names
    items = manifest["annotations"]["label_map"]["items"]
    assert [names[i["id"]] for i in items] == manifest["labels"]["vocabulary"]
    objects = masks = 0
    for record in tfds.as_numpy(builder.as_dataset(split="train")):
        height, width = record["image/height"], record["image/width"]
        assert record["image/encoded"].shape[:2] == (height, width)
        texts = [t.decode() for t in record["image/object/class/text"]]
        assert [names[label] for label in record["image/object/class/label"]] == texts
        mask_shape = record["image/object/mask"].shape
        assert mask_shape == ((len(texts), height, width, 1) if texts else (0, 0, 0, 1))
        assert len(record["image/object/bbox/xmin"]) == len(texts)
        objects += len(texts)
        masks += len(record["image/object/mask"])
    print(f"\n  TFDS detection dataset (COCO): {figures}; {objects} objects, {masks} instance masks of "
          f"their image's size; names at the category ids {[i['id'] for i in items]} = vocabulary "
          f"{manifest['labels']['vocabulary']}")


def test_sixteen_bit_dataset(datasets):
    out, manifest = datasets["sixteen"]
    builder = tfds.builder_from_directory(str(out))
    assert (builder.info.features["image/encoded"].dtype, builder.info.features["image/encoded"].shape) \
        == (np.uint16, (None, None, 1))
    read = {r["image/filename"].decode(): r["image/encoded"] for r in tfds.as_numpy(builder.as_dataset(split="train"))}
    assert sorted(read) == ["a/a.png", "b/b.png"]
    for i, name in enumerate(("a", "b")):
        image = read[f"{name}/{name}.png"]
        assert image.dtype == np.uint16 and (image[..., 0] == _sixteen_bit(i)).all()
    print(f"\n  TFDS 16-bit PNG dataset: {len(read)} images uint16 (None, None, 1), every pixel its file's")


def test_the_metadata_files_are_beside_the_manifest(datasets):
    for out, manifest in datasets.values():
        assert {"dataset_info.json", "features.json"} <= set(os.listdir(out))
        names = sorted(n for n in os.listdir(out) if n in ("dataset_info.json", "features.json") or n.endswith(".labels.txt"))
        assert manifest["tfds"] == {"written": True, "files": names}


def test_the_readme_snippet_runs(datasets, monkeypatch):
    out, manifest = datasets["image"]
    text = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    snippet = re.search(r"```python\n(.*?)```", text[text.index("## Loading with TFDS"):], re.S).group(1)
    monkeypatch.chdir(out.parent)
    os.rename(out, out.parent / "OUT")
    try:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(snippet, "README.md", "exec"), {})
    finally:
        os.rename(out.parent / "OUT", out)
    assert printed.getvalue().split(" ", 1) == [str(manifest["splits"]["train"]["records"]),
                                                f"{manifest['labels']['vocabulary']}\n"]
