"""The public Beam API in a user's own pipeline: WriteVerifiedShards, ImagesToExamples,
RowsToExamples, importable from the package top."""

import glob
import hashlib
import json
import os
import pickle
import random

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that

from beam_tfrecords import (
    ImagesToExamples,
    RowsToExamples,
    WriteVerifiedShards,
)
from beam_tfrecords.cli import main
from beam_tfrecords.samples import CLASSES, make_class_folder_sample
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.example import encode_example
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from tests.conftest import load_manifest, sha256_file

pytestmark = pytest.mark.beam

MB = 1_000_000


def _random_examples(count: int, seed: int = 7, part: int = 0, parts: int = 1) -> list[bytes]:
    """Serialized Examples of 1 to 2,000 bytes each (``part`` of ``parts`` of ``count``),
    all different, the same on every call."""
    records = []
    for i in range(part, count, parts):
        rng = random.Random(seed * 1_000_003 + i)
        records.append(_example_of_size(i, rng.randint(1, 2000), rng))
    return records


def _example_of_size(i: int, target: int, rng: random.Random) -> bytes:
    """An Example holding ``id`` = i and a payload, of at most ``target`` bytes and
    as close to it as the encoding allows (below ~20 bytes: the bare id)."""
    base = encode_example([("id", "int64", [i])])
    payload_room = target - len(base) - 16  # Feature entry, key and length varints.
    if payload_room <= 0:
        return base
    return encode_example([("id", "int64", [i]), ("p", "string", [rng.randbytes(payload_room)])])


def _shard_files(out: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(out, "*.tfrecord*")) if not p.endswith(".idx"))


def _read_all(out: str) -> list[bytes]:
    records = []
    for path in _shard_files(out):
        with open(path, "rb") as f:
            records.extend(iter_records(f))
    return records


def _capture(pcoll, path, label="Capture"):
    """Saves what a PCollection held to ``path`` (a pipeline's functions run on pickled
    copies, so they cannot fill a list of the test's)."""
    def save(values):
        with open(path, "wb") as f:
            pickle.dump(list(values), f)
    assert_that(pcoll, save, label=label)


def _captured(path) -> list:
    with open(path, "rb") as f:
        return pickle.load(f)


def test_write_verified_shards_from_a_user_pipeline(tmp_path):
    out = str(tmp_path / "out")
    records = _random_examples(20_000)
    sizes = [len(r) for r in records]
    assert min(sizes) <= 40 and max(sizes) <= 2000 and sum(sizes) > 15 * MB
    with beam.Pipeline() as p:
        manifest = (
            p
            # Made inside the pipeline in 20 parts: a Create of 20 MB would be pickled
            # (and compressed) into the pipeline itself.
            | beam.Create(range(20))
            | beam.FlatMap(lambda part: _random_examples(20_000, part=part, parts=20))
            | WriteVerifiedShards(out, split="train", shard_min_mb=1, shard_max_mb=2)
        )
        _capture(manifest, tmp_path / "returned")
    returned = _captured(tmp_path / "returned")
    shards = _shard_files(out)
    assert len(shards) >= 8
    for path in shards:
        assert 1 * MB <= os.path.getsize(path) <= 2 * MB, (path, os.path.getsize(path))
    # Every record read back exactly once, each a valid Example.
    read = _read_all(out)
    assert sorted(read) == sorted(records)
    assert example_pb2.Example.FromString(read[0]).features.feature["id"].int64_list.value
    # The manifest: returned, written last, naming every shard with its checksums.
    (manifest,) = returned
    assert manifest == load_manifest(out)
    listed = manifest["splits"]["train"]["shards"]
    assert [s["path"] for s in listed] == [os.path.basename(p) for p in shards]
    assert [s["sha256"] for s in listed] == [sha256_file(p) for p in shards]
    assert manifest["splits"]["train"]["records"] == 20_000
    assert not manifest["splits"]["train"]["shards_outside_band"]
    assert not os.path.exists(os.path.join(out, ".beam-tfrecords"))
    assert main(["verify", out]) == 0


def test_keys_order_records_and_reruns_are_byte_identical(tmp_path):
    records = [(f"k{i:05d}", _example_of_size(i, 300 + i % 700, random.Random(i))) for i in range(3000)]
    digests = []
    for run in range(2):
        out = str(tmp_path / f"out{run}")
        shuffled = list(records)
        random.Random(run).shuffle(shuffled)  # Arrival order must not matter.
        with beam.Pipeline() as p:
            _ = (p | beam.Create(shuffled, reshuffle=True)
                 | WriteVerifiedShards(out, shard_min_mb=0.5, shard_max_mb=1))
        digests.append([sha256_file(path) for path in _shard_files(out)])
        assert _read_all(out) == [r for _, r in records]  # Key order, across shards.
    assert digests[0] == digests[1] and len(digests[0]) >= 2


def test_several_splits_from_a_dict(tmp_path):
    out = str(tmp_path / "out")
    train = [encode_example([("id", "int64", [i])]) for i in range(50)]
    test = [encode_example([("id", "int64", [i])]) for i in range(50, 60)]
    with beam.Pipeline() as p:
        _ = {"train": p | "T" >> beam.Create(train), "test": p | "E" >> beam.Create(test)} | \
            WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2, features={"id": ("int64", [])})
    manifest = load_manifest(out)
    assert {s: manifest["splits"][s]["records"] for s in manifest["splits"]} == {"test": 10, "train": 50}
    assert manifest["features"] == {"id": {"dtype": "int64", "shape": []}}
    assert [os.path.basename(p) for p in _shard_files(out)] == [
        "test-00000-of-00001.tfrecord", "train-00000-of-00001.tfrecord"]


def test_an_existing_dataset_is_not_replaced_without_overwrite(tmp_path):
    out = str(tmp_path / "out")
    first = [encode_example([("id", "int64", [i])]) for i in range(5)]
    with beam.Pipeline() as p:
        _ = p | beam.Create(first) | WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2)
    before = load_manifest(out)
    with pytest.raises(RuntimeError, match=r"published nothing \(output_exists\)"):
        with beam.Pipeline() as p:
            _ = p | beam.Create(first[:2]) | WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2)
    assert load_manifest(out) == before
    assert len(_read_all(out)) == 5
    with beam.Pipeline() as p:
        _ = p | beam.Create(first[:2]) | WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2,
                                                              overwrite=True)
    assert len(_read_all(out)) == 2


def test_images_to_examples_gives_the_clis_shards(tmp_path):
    root, cli_out, api_out = (str(tmp_path / d) for d in ("in", "cli", "api"))
    relative = make_class_folder_sample(root, per_class=30, splits=None, size_range=(150, 260),
                                        formats=("jpeg", "png"), seed=3)
    band = ["--shard_min_mb", "0.4", "--shard_max_mb", "0.8"]
    assert main(["convert", "--input", root, "--output", cli_out, *band]) == 0
    cli_shards = _shard_files(cli_out)
    assert len(cli_shards) >= 3
    vocabulary = load_manifest(cli_out)["labels"]["vocabulary"]
    paths = [os.path.join(root, rel) for rel in relative]
    with beam.Pipeline() as p:
        _ = (
            p
            | beam.Create(paths, reshuffle=True)
            | ImagesToExamples(root=root, labels=vocabulary)
            | WriteVerifiedShards(api_out, shard_min_mb=0.4, shard_max_mb=0.8)
        )
    api_shards = _shard_files(api_out)
    assert [os.path.basename(p) for p in api_shards] == [os.path.basename(p) for p in cli_shards]
    assert [sha256_file(p) for p in api_shards] == [sha256_file(p) for p in cli_shards]


def test_images_to_examples_sends_bad_images_to_its_dead_letter_output(tmp_path):
    root = tmp_path / "in"
    make_class_folder_sample(str(root), per_class=2, splits=None)
    bad = root / "circles" / "broken.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    paths = sorted(str(p) for p in root.rglob("*.*") if p.suffix in (".png", ".jpg"))
    with beam.Pipeline() as p:
        encode = ImagesToExamples(root=str(root), labels=list(CLASSES))
        examples = p | beam.Create(paths) | encode
        _capture(examples | beam.Map(lambda kv: kv[0]), tmp_path / "good")
        _capture(encode.dead_letter | beam.Map(lambda d: (d.source, d.error)), tmp_path / "dead",
                 label="Dead")
    good, dead = _captured(tmp_path / "good"), _captured(tmp_path / "dead")
    assert len(good) == len(paths) - 1
    assert dead == [(str(bad), "truncated_png")]


def test_rows_to_examples_types_cells_by_the_schema(tmp_path):
    out = str(tmp_path / "out")
    schema = json.dumps({"columns": [
        {"name": "id", "type": "int64", "required": True},
        {"name": "score", "type": "float", "default": 0.5},
        {"name": "tags", "type": "string", "delimiter": ";"},
    ]})
    rows = [{"id": "1", "score": "2.5", "tags": "a;b"}, {"id": "2", "score": "", "tags": "c"},
            {"id": "x", "score": "1", "tags": ""}]
    with beam.Pipeline() as p:
        encode = RowsToExamples(schema, key_column="id")
        _ = p | beam.Create(rows) | encode | WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2)
        _capture(encode.dead_letter | beam.Map(lambda d: d.error), tmp_path / "dead", label="Dead")
    dead = _captured(tmp_path / "dead")
    parsed = [example_pb2.Example.FromString(r).features.feature for r in _read_all(out)]
    assert [list(f["id"].int64_list.value) for f in parsed] == [[1], [2]]
    assert [list(f["score"].float_list.value) for f in parsed] == [[2.5], [0.5]]
    assert [list(f["tags"].bytes_list.value) for f in parsed] == [[b"a", b"b"], [b"c"]]
    assert dead == ["bad_value"]


def test_bare_records_are_ordered_by_their_sha256(tmp_path):
    out = str(tmp_path / "out")
    records = [encode_example([("id", "int64", [i])]) for i in range(20)]
    with beam.Pipeline() as p:
        _ = p | beam.Create(records) | WriteVerifiedShards(out, shard_min_mb=1, shard_max_mb=2)
    assert _read_all(out) == sorted(records, key=lambda r: hashlib.sha256(r).digest())
