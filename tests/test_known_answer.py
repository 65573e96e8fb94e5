"""Known answers: a fixed tiny dataset always becomes the same shards, byte for byte.

The images are written by hand (BMP pixels, and PNG with stored, uncompressed
deflate blocks), so their bytes depend on no image library. The expected keys and
shard digests are pinned here; a change to the key, the plan, the record layout or
the framing shows up as a different digest. The conversion is repeated in fresh
processes with other hash seeds and with Beam's multi-processing DirectRunner, so
anything that depends on process state (dict order, hash randomization, worker
count) fails this test.
"""

import os
import struct
import subprocess
import sys
import zlib

import pytest

from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from tests.conftest import sha256_file

pytestmark = pytest.mark.e2e

# stable_key(split, relative path) = sha256(split + NUL + path)[:32 hex]: the order of
# records within a split.
GOLDEN_KEYS = {
    ("train", "cat/c00.bmp"): "bffd49f71245f4e676b0461ea93f1a3e",
    ("train", "dog/d03.png"): "8d33db936f880f0675cfea659d8103a6",
}
# sha256 of every shard of the fixed dataset, converted with a 0.01-0.02 MB band.
GOLDEN_SHARDS = {
    "train-00000-of-00004.tfrecord": "65a5bb78557ab0c4144208ea9286e8ead326a6bad05331f16647e49913d1949d",
    "train-00001-of-00004.tfrecord": "801bbd475823e288aca1df69cba2997bcaf212def56d5c5678b13da5a1f85106",
    "train-00002-of-00004.tfrecord": "39e2187c2f1c52a707bce4f778f9c7d0dab3a7dfe754db848c0e4f4af28b687a",
    "train-00003-of-00004.tfrecord": "2d97e356737d9c8ec154bc0fbbc8067d561664e23d7b9a67987521f5fb8f3eca",
}
BAND = ["--shard_min_mb", "0.01", "--shard_max_mb", "0.02"]


def _bmp(width: int, height: int, seed: int) -> bytes:
    """A 24-bit BMP whose pixels are a function of ``seed``."""
    row = (width * 3 + 3) & ~3
    pixels = bytearray()
    for y in range(height):
        line = bytes(((x * 7 + y * 13 + seed * 31 + c * 85) % 256) for x in range(width) for c in range(3))
        pixels += line + b"\0" * (row - width * 3)
    header = struct.pack("<2sIHHI", b"BM", 54 + len(pixels), 0, 0, 54)
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, len(pixels), 2835, 2835, 0, 0)
    return header + info + bytes(pixels)


def _png(width: int, height: int, seed: int) -> bytes:
    """An 8-bit RGB PNG with stored (level 0) deflate blocks: the same bytes on any zlib."""
    raw = b"".join(
        b"\0" + bytes(((x * 11 + y * 5 + seed * 17 + c * 60) % 256) for x in range(width) for c in range(3))
        for y in range(height)
    )

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw, 0))
            + chunk(b"IEND", b""))


def _make_dataset(root: str) -> None:
    for cls, maker, ext in (("cat", _bmp, "bmp"), ("dog", _png, "png")):
        os.makedirs(os.path.join(root, cls))
        for i in range(5):
            with open(os.path.join(root, cls, f"{cls[0]}{i:02d}.{ext}"), "wb") as f:
                f.write(maker(40 + i * 3, 30 + i * 2, seed=i))


def _convert(root: str, out: str, *extra: str, hash_seed: str = "0") -> None:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    run = subprocess.run([sys.executable, "-m", "beam_tfrecords", "convert", "--input", root,
                          "--output", out, *BAND, *extra], env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]


def _shards(out: str) -> dict[str, str]:
    return {name: sha256_file(os.path.join(out, name)) for name in sorted(os.listdir(out))
            if ".tfrecord" in name and not name.endswith(".idx")}


def test_stable_keys_are_pinned():
    for (split, relative), key in GOLDEN_KEYS.items():
        assert stable_key(split, relative) == key


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("known") / "in")
    _make_dataset(root)
    return root


@pytest.mark.parametrize("extra, hash_seed", [
    ((), "0"),
    ((), "4242"),
    (("--direct_running_mode=multi_processing", "--direct_num_workers=2"), "7"),
    (("--encode_processes", "0", "--read_threads", "1"), "99"),
], ids=["default", "other-hash-seed", "multi-processing", "no-helpers-one-thread"])
def test_the_fixed_dataset_always_gives_the_pinned_shards(dataset, tmp_path, extra, hash_seed):
    out = str(tmp_path / "out")
    _convert(dataset, out, *extra, hash_seed=hash_seed)
    assert _shards(out) == GOLDEN_SHARDS
