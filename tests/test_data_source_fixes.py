"""What a stranger found in DataSource (issue 22): one source read from several
threads opens each shard once and ``close()`` closes them all; a feature spec edited
by hand is refused in one line naming the file and the key."""

from __future__ import annotations

import json
import os
import random
import shutil
import threading

import pytest

from beam_tfrecords import DataSource
from beam_tfrecords.verify import dataset_shards
from tests.test_data_source import make_image_dataset


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
