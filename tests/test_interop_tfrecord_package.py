"""The ``tfrecord`` package (the PyTorch reader) reads our shards through our index files.

Issue 22, "Must show": three workers, each in a process of its own, each given its
share by ``tfrecord.reader.tfrecord_loader(shard, index, description, shard=(w, 3))``
(which needs the index file to split a shard: without one every worker gets every
record), read together exactly the records TensorFlow's ``tf.data.TFRecordDataset``
reads from the same shards, none twice, and each worker reads some of every shard.
And the index files are the bytes the package's own ``create_index`` writes.
"""

from __future__ import annotations

import collections
import hashlib
import json
import multiprocessing
import os

import pytest

pytestmark = pytest.mark.interop

WORKERS = 3
# What each record is compared by: its file name, a digest of its image bytes, its label.
DESCRIPTION = {"image/filename": "byte", "image/encoded": "byte", "image/class/label": "int"}


def _fingerprint(filename: bytes, encoded: bytes, label: int) -> tuple[str, str, int]:
    return filename.decode(), hashlib.sha256(encoded).hexdigest(), int(label)


def _worker_share(shards: list[tuple[str, str]], worker: int) -> dict[str, list]:
    """In a process of its own: what worker ``worker`` of ``WORKERS`` reads of each shard
    through the shard's index file (``{shard: [fingerprint, ...]}``)."""
    from tfrecord.reader import tfrecord_loader  # pylint: disable=import-outside-toplevel

    found = {}
    for path, index in shards:
        found[path] = [
            _fingerprint(bytes(r["image/filename"]), bytes(r["image/encoded"]), int(r["image/class/label"][0]))
            for r in tfrecord_loader(path, index, DESCRIPTION, shard=(worker, WORKERS))]
    return found


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A small image dataset in five shards, each of at least three records."""
    from beam_tfrecords.pipeline import convert  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.samples import make_class_folder_sample  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.schemas.config import ConvertConfig  # pylint: disable=import-outside-toplevel

    base = tmp_path_factory.mktemp("tfrecord-package")
    images, out = str(base / "images"), str(base / "out")
    make_class_folder_sample(images, per_class=6, splits=None, seed=3, size_range=(16, 40))
    convert(ConvertConfig(input=images, output=out, shard_min_mb=0.006, shard_max_mb=0.012))
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    shards = [(os.path.join(out, s["path"]), os.path.join(out, s["index"]["path"]))
              for s in manifest["splits"]["train"]["shards"]]
    assert len(shards) >= 3 and all(s["records"] >= WORKERS for s in manifest["splits"]["train"]["shards"])
    return out, shards


def _package_indexes(shards: list[tuple[str, str]], folder: str) -> list[str]:
    """In a process of its own: the index file the package's ``create_index`` writes for
    each shard (its path). The package cannot be imported beside TensorFlow: both
    register ``tensorflow.Example`` in protobuf's one descriptor pool."""
    from tfrecord.tools.tfrecord2idx import create_index  # pylint: disable=import-outside-toplevel

    written = []
    for number, (path, _) in enumerate(shards):
        written.append(os.path.join(folder, f"{number}.idx"))
        create_index(path, written[-1])
    return written


@pytest.fixture(scope="module")
def package(dataset, tmp_path_factory):
    """What the package does with the dataset, in real processes started before
    TensorFlow is imported here (spawn: nothing inherited): each worker's share of
    every shard, and the package's own index files."""
    _, shards = dataset
    folder = str(tmp_path_factory.mktemp("their-indexes"))
    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        theirs = pool.apply_async(_package_indexes, (shards, folder))
        shares = pool.starmap(_worker_share, [(shards, w) for w in range(WORKERS)])
        return shares, theirs.get()


def test_three_workers_read_each_their_share_together_exactly_what_tensorflow_reads(dataset, package):
    _, shards = dataset
    shares, _ = package

    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    for path, _ in shards:
        expected = []
        for raw in tf.data.TFRecordDataset([path]).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            expected.append(_fingerprint(feature["image/filename"].bytes_list.value[0],
                                         feature["image/encoded"].bytes_list.value[0],
                                         feature["image/class/label"].int64_list.value[0]))
        parts = [share[path] for share in shares]
        name = os.path.basename(path)
        assert all(parts), f"{name}: a worker read nothing: {[len(p) for p in parts]}"
        together = [record for part in parts for record in part]
        assert collections.Counter(together) == collections.Counter(expected), name
        assert len(set(together)) == len(together) == len(expected), f"{name}: a record read twice"
        print(f"{name}: {len(expected)} records; workers read {[len(p) for p in parts]}")


def test_our_index_files_are_the_bytes_the_package_create_index_writes(dataset, package):
    _, shards = dataset
    _, theirs = package
    for (_, index), their_index in zip(shards, theirs, strict=True):
        with open(their_index, "rb") as a, open(index, "rb") as b:
            assert a.read() == b.read(), os.path.basename(index)
