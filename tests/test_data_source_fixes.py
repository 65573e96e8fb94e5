"""What a stranger found in DataSource (issue 22): one source read from several
threads opens each shard once and ``close()`` closes them all; a feature spec edited
by hand is refused in one line naming the file and the key; a CMYK JPEG kept as it
is (``--image_bytes original``) is recorded with the 3 channels it decodes to; a
semantic-mask dataset's manifest counts the classes its masks hold."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords import DataSource
from beam_tfrecords.cli import main
from beam_tfrecords.verify import dataset_shards
from tests.harness import annotated_sets as sets
from tests.test_data_source import QUIET, make_image_dataset


def make_cmyk_dataset(root, out) -> None:
    """Two CMYK JPEGs (10x8 and 7x5), kept as they are (``--image_bytes original``)."""
    rng = np.random.default_rng(3)
    for label, (width, height) in (("a", (10, 8)), ("b", (7, 5))):
        os.makedirs(root / label)
        rgb = Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8))
        rgb.convert("CMYK").save(root / label / "cmyk.jpg", quality=95)
    assert main(["convert", "--input", str(root), "--output", str(out), "--image_bytes", "original",
                 *QUIET]) == 0


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("fixes")
    make_image_dataset(base / "in", base / "out")
    return str(base / "out")


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _read(source: DataSource, start: threading.Barrier, seed: int) -> None:
    order = random.Random(seed)
    start.wait()  # All at once: the first reads of each shard race.
    for _ in range(60):
        source.record_bytes(order.randrange(len(source)))


@pytest.mark.e2e
def test_threads_share_one_descriptor_per_shard_and_close_closes_them(images):
    shards = len(dataset_shards(images, "train"))
    assert shards >= 2
    for _ in range(3):  # The race it guards against shows within a few tries.
        before = _fds()
        source = DataSource(images, "train")
        start = threading.Barrier(8)
        threads = [threading.Thread(target=_read, args=(source, start, seed)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        opened = _fds() - before
        assert len(opened) == shards, opened
        source.close()
        assert _fds() - before == set()


@pytest.mark.e2e
@pytest.mark.parametrize("key, value, said", [
    ("dtype", "float64", '"float64" is not one of string, int64, float32'),
    ("shape", "x", '"x" is not a list'),
    ("shape", [None, None, -3], "[null, null, -3] is not a list of whole numbers >= 0"),
])
def test_a_malformed_feature_spec_is_refused_naming_the_file_and_key(images, tmp_path, key, value, said):
    out = str(shutil.copytree(images, tmp_path / "copy"))
    path = os.path.join(out, "manifest.json")
    manifest = json.load(open(path))
    manifest["features"]["image/height"][key] = value
    json.dump(manifest, open(path, "w"))
    with pytest.raises(ValueError) as raised:
        DataSource(out, "train")
    assert str(raised.value) == f'{path}: features["image/height"].{key}: {said}' + (
        " (null, a variable length, first at most)" if isinstance(value, list) else "")


@pytest.mark.e2e
def test_a_cmyk_jpeg_kept_as_it_is_says_the_channels_it_decodes_to(tmp_path):
    make_cmyk_dataset(tmp_path / "in", tmp_path / "out")
    source = DataSource(str(tmp_path / "out"), "train", decode_images=True)
    shapes = sorted((int(r["image/height"]), int(r["image/width"]), int(r["image/channels"]),
                     r["image/encoded"].shape) for r in (source[0], source[1]))
    assert shapes == [(5, 7, 3, (5, 7, 3)), (8, 10, 3, (8, 10, 3))]


@pytest.mark.e2e
def test_a_semantic_mask_manifest_counts_the_classes_its_masks_hold(tmp_path):
    """Issue 22 finding 6: ``annotations.images_without_objects`` said 0 and its
    ``statistics`` 3 (no boxes); ``labels.counts`` was empty."""
    made = sets.make_semantic_masks(tmp_path / "set")
    Image.fromarray(np.zeros((32, 48), np.uint8)).save(tmp_path / "set" / "masks" / "a.png")  # Background only.
    assert main(["convert", *made.flags, "--output", str(tmp_path / "out"), *QUIET]) == 0
    manifest = json.load(open(tmp_path / "out" / "manifest.json"))
    annotations = manifest["annotations"]
    statistics = annotations["statistics"]
    assert annotations["images_without_objects"] == statistics["images_without_objects"] == 1
    names = dict(made.label_map)
    expected = {names[label]: sum(label in np.unique(r.segmentation) for rel, r in made.records.items()
                                  if rel != "a.png") for label in names if label}
    assert manifest["labels"]["counts"] == {"train": expected} and sum(expected.values()) == 4
    assert [(c["text"], c["objects"]) for c in statistics["classes"]] == sorted(expected.items())
    assert statistics["objects"] == 4 and statistics["images"] == 3
