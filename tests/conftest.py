"""Shared helpers for tests that run whole conversions and read the output back."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os

import pytest
from PIL import Image

from beam_tfrecords.pipeline import convert
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.tfrecord import iter_records

CHANNELS_BY_MODE = {"L": 1, "LA": 2, "RGB": 3, "YCbCr": 3, "RGBA": 4, "CMYK": 3}  # CMYK decodes to RGB.


TIERS = ("unit", "beam", "e2e", "emulator", "interop")  # Registered, with slow, in pytest.ini.
# Modules of the longest tests (a minute and more on a busy machine: the crash matrix's
# killed conversions), run first after the ``slow`` ones (the sdist's fresh-venv install),
# so that no worker of ``make test`` starts one of them while the others finish.
LONG_FIRST = ("test_crash_safety.py",)


def _start_rank(item) -> int:
    if item.get_closest_marker("slow"):
        return 0
    name = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return 1 + LONG_FIRST.index(name) if name in LONG_FIRST else 1 + len(LONG_FIRST)


def pytest_collection_modifyitems(config, items):
    """Every test has exactly one tier marker, or is ``slow``: none may go unmarked. The
    longest tests go first (``_start_rank``; the order is otherwise kept)."""
    problems = []
    for item in items:
        tiers = sorted({m.name for m in item.iter_markers() if m.name in TIERS})
        if len(tiers) > 1 or not (tiers or item.get_closest_marker("slow")):
            problems.append(f"  {item.nodeid}: {', '.join(tiers) or 'no tier marker'}")
    if problems:
        raise pytest.UsageError(
            f"each test needs exactly one tier marker of {', '.join(TIERS)} (or slow); mark the "
            "module with pytestmark = pytest.mark.<tier> or the test with @pytest.mark.<tier>:\n"
            + "\n".join(problems))
    items.sort(key=_start_rank)  # Stable: each module keeps its order.


def read_dataset(output: str) -> dict[str, list[dict]]:
    """Every record of every shard in ``output``, parsed, by shard file name."""
    shards = {}
    for name in sorted(os.listdir(output)):
        if ".tfrecord" not in name or name.endswith(".idx"):  # Index files (issue 22) are not shards.
            continue
        with open(os.path.join(output, name), "rb") as f:
            data = f.read()
        if name.endswith(".gz"):
            data = gzip.decompress(data)
        shards[name] = [example_to_dict(r) for r in iter_records(io.BytesIO(data))]
    return shards


def load_manifest(output: str) -> dict:
    with open(os.path.join(output, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


def expected_features(root: str, rel: str, label: int, text: str) -> dict[str, list]:
    """The nine image features, computed independently from the source file."""
    with open(os.path.join(root, rel), "rb") as f:
        data = f.read()
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        mode, fmt = image.mode, image.format.lower()
        transparent = "transparency" in image.info
    channels = (4 if transparent else 3) if mode == "P" else CHANNELS_BY_MODE[mode]
    return {
        "image/encoded": [data],
        "image/format": [fmt.encode()],
        "image/height": [height],
        "image/width": [width],
        "image/channels": [channels],
        "image/class/label": [label],
        "image/class/text": [text.encode()],
        "image/filename": [rel.encode()],
        "image/key/sha256": [hashlib.sha256(data).hexdigest().encode()],
    }


def dead_letters(output: str) -> list[dict]:
    """Every dead letter of an output folder, file by file, line by line."""
    letters = []
    folder = os.path.join(output, "dead_letter")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            letters += [json.loads(line) for line in f]
    return letters


def sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def run_convert():
    """Runs a conversion with test-friendly defaults; returns the ConvertResult."""

    def run(input_path: str, output: str, beam_args=(), **options):
        return convert(ConvertConfig(input=input_path, output=output, **options), beam_args)

    return run
