"""Ratio splits for images (``--splits``): by a stable hash of the relative path
(or of the content, ``--split_by content``), identical across runs and runner
settings; refused where the input already names its splits."""

from __future__ import annotations

import io
import json
import os
from collections import Counter

import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.preflight import ConvertError, plan_run
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.image_steps import list_images
from tests.conftest import sha256_file

SPLITS = (("train", 0.8), ("validation", 0.1), ("test", 0.1))
FILES = 10_000


def _tiny_gif(index: int) -> bytes:
    out = io.BytesIO()
    Image.new("P", (2, 1), index % 256).save(out, "GIF")
    return out.getvalue()


def _tiny_png(index: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (2, 1), index % 256).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def ten_thousand(tmp_path_factory):
    root = tmp_path_factory.mktemp("splits") / "in"
    for cls in range(10):
        (root / f"class{cls}").mkdir(parents=True)
    for i in range(FILES):
        (root / f"class{i % 10}" / f"img{i:05d}.gif").write_bytes(_tiny_gif(i))
    return root


@pytest.mark.unit
def test_counts_are_within_one_percent_of_the_ratios_on_ten_thousand_files(ten_thousand):
    listing = list_images(str(ten_thousand), splits=SPLITS)
    counts = Counter(ref.split for ref in listing.refs)
    assert sum(counts.values()) == FILES
    for name, share in SPLITS:
        assert abs(counts[name] / FILES - share) <= 0.01, (name, counts)
    # The same path always lands in the same split, whatever else is listed.
    again = list_images(str(ten_thousand / "class3"), splits=SPLITS)
    by_name = {ref.filename.rsplit("/", 1)[-1]: ref.split for ref in listing.refs}
    assert all(ref.split == by_name[ref.filename] for ref in again.refs)
    assert listing.split_source == "--splits, by path"


@pytest.mark.unit
def test_split_by_content_puts_copies_of_an_image_in_one_split(tmp_path):
    (tmp_path / "a").mkdir()
    for i in range(200):
        data = _tiny_png(i % 20)  # 20 distinct images, 10 copies each
        (tmp_path / "a" / f"copy{i:03d}.png").write_bytes(data)
    listing = list_images(str(tmp_path), splits=SPLITS, split_by="content")
    by_content: dict[bytes, set] = {}
    for ref in listing.refs:
        with open(ref.path, "rb") as f:
            by_content.setdefault(f.read(), set()).add(ref.split)
    assert len(by_content) == 20 and all(len(s) == 1 for s in by_content.values())
    by_path = list_images(str(tmp_path), splits=SPLITS)
    assert any(len({r.split for r in by_path.refs if open(r.path, "rb").read() == c}) > 1
               for c in list(by_content)[:5])


@pytest.mark.unit
def test_splits_on_an_input_that_names_its_splits_are_refused(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split / "cat").mkdir(parents=True)
        (tmp_path / split / "cat" / "x.gif").write_bytes(_tiny_gif(1))
    with pytest.raises(ConvertError, match=r"--splits: the input already names its splits "
                       r"\(split folders\); use one or the other"):
        plan_run(ConvertConfig(input=str(tmp_path), output=str(tmp_path / "out"), splits=SPLITS))
    manifest = tmp_path / "m.csv"
    manifest.write_text("image,label,split\ntrain/cat/x.gif,cat,train\n")
    with pytest.raises(ConvertError, match=r"the input already names its splits \(the CSV's "
                       r"'split' column\)"):
        plan_run(ConvertConfig(input=str(manifest), output=str(tmp_path / "out2"), splits=SPLITS))


@pytest.mark.unit
def test_split_by_is_refused_on_tables(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    with pytest.raises(ConvertError, match=r"--split_by applies only to images"):
        plan_run(ConvertConfig(input=str(table), output=str(tmp_path / "o"), split_by="content",
                               splits=(("train", 0.5), ("test", 0.5))))
    with pytest.raises(ValueError, match=r"--split_by applies only with --splits"):
        ConvertConfig(input=str(table), output=str(tmp_path / "o"), split_by="content")


def _shards(out) -> dict[str, str]:
    return {name: sha256_file(os.path.join(out, name)) for name in sorted(os.listdir(out))
            if ".tfrecord" in name and not name.endswith(".idx")}


@pytest.mark.slow
def test_ten_thousand_files_split_identically_under_different_worker_settings(ten_thousand, tmp_path):
    outputs = []
    for i, flags in enumerate((["--encode_processes", "0", "--read_threads", "1"],
                               ["--encode_processes", "2", "--direct_num_workers", "2",
                                "--direct_running_mode", "multi_threading"])):
        out = str(tmp_path / f"out{i}")
        assert main(["convert", "--input", str(ten_thousand), "--output", out,
                     "--splits", "train=0.8,validation=0.1,test=0.1", *flags]) == 0
        outputs.append(out)
    first, second = (_shards(o) for o in outputs)
    assert first == second and len(first) == 3  # Byte-identical shards, one per split.
    with open(os.path.join(outputs[0], "manifest.json")) as f:
        manifest = json.load(f)
    records = {s: v["records"] for s, v in manifest["splits"].items()}
    assert sum(records.values()) == FILES
    for name, share in SPLITS:
        assert abs(records[name] / FILES - share) <= 0.01, records
    print(f"\n[splits] {FILES} files: {records}")
