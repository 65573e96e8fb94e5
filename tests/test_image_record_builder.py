"""The image record builder's extension point (``transforms.io.image_records``): an
attachment adds features and moves pixels, and the geometry it is told maps side
data onto the stored image.

The seam test runs the real conversion (``beam_tfrecords.convert``, what the CLI
calls, on the DirectRunner, with a helper process encoding) of a class-folder
input, with a toy attachment: a feature per image from a side mapping, and a
horizontal flip; the published shards are read back.
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
from PIL import Image, ImageOps

from beam_tfrecords.pipeline import convert
from beam_tfrecords.schemas.config import ConvertConfig, ImageReshape
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.io.image_records import (
    Attachment,
    Geometry,
    ImageOutcome,
    ImageRecordBuilder,
    reshape_geometry,
)
from tests.conftest import dead_letters, load_manifest, read_dataset

# image/filename -> the toy value side data gives it.
TOY = {"cat/a.png": 7, "cat/b.png": 11, "dog/c.png": 42}
SIZES = {"cat/a.png": (9, 5), "cat/b.png": (6, 8), "dog/c.png": (13, 4)}
COLUMN = 2  # The source column whose position the attachment reports.


def _follow(geometry: Geometry) -> tuple:
    col, _ = geometry.map_pixel(COLUMN, 0)
    return (("image/toy_column", "int64", int(col)),)


class ToyAttach:
    """Picklable (module level): it travels to the helper processes."""

    def __init__(self, toy: dict[str, int]):
        self.toy = toy

    def __call__(self, ref: ImageRef) -> Attachment | None:
        if ref.filename not in self.toy:
            return None
        return Attachment(features=(("image/toy", "int64", self.toy[ref.filename]),), flip=True,
                          follow=_follow)


def _write_inputs(root: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    pixels = {}
    for rel, (width, height) in SIZES.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        pixels[rel] = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels[rel]).save(os.path.join(root, rel))
    return pixels


@pytest.mark.e2e
def test_an_attachment_adds_a_feature_and_flips_the_pixels_through_a_real_run(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    pixels = _write_inputs(root)
    result = convert(ConvertConfig(input=root, output=out, encode_processes=1),
                     attach=ToyAttach(TOY))
    assert result.ok, result.report
    records = [r for shard in read_dataset(out).values() for r in shard]
    assert sorted(r["image/filename"][0].decode() for r in records) == sorted(TOY)
    for record in records:
        rel = record["image/filename"][0].decode()
        width, height = SIZES[rel]
        # (a) the side data's feature, the right value for this image.
        assert record["image/toy"] == [TOY[rel]]
        # (b) the stored pixels are the source's, mirrored left to right.
        with Image.open(io.BytesIO(record["image/encoded"][0])) as stored:
            assert stored.size == (width, height)
            flipped = np.asarray(ImageOps.mirror(Image.fromarray(pixels[rel])))
            assert np.array_equal(np.asarray(stored.convert("RGB")), flipped)
            assert not np.array_equal(flipped, pixels[rel])
        # (c) the geometry the attachment was told maps column x to width - 1 - x.
        assert record["image/toy_column"] == [width - 1 - COLUMN]
        assert (record["image/width"], record["image/height"]) == ([width], [height])
    assert dead_letters(out) == []
    assert load_manifest(out)["image_bytes"] == {"attached": {"moved": 3}}


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.unit
def test_an_attachment_may_not_add_a_reserved_feature():
    ref = ImageRef("train", "k", "cat/a.png", "/in/cat/a.png", 10, 0, "cat")
    builder = ImageRecordBuilder(attach=lambda r: Attachment((("image/width", "int64", 1),)))
    letter = builder.example(ref, _png(4, 3))
    assert isinstance(letter, DeadLetter)
    assert (letter.source, letter.stage, letter.error) == ("cat/a.png", "encode", "encode_error")
    assert "'image/width'" in letter.message


@pytest.mark.unit
def test_an_image_without_attachment_is_encoded_as_before():
    ref = ImageRef("train", "k", "cat/a.png", "/in/cat/a.png", 10, 0, "cat")
    data = _png(4, 3)
    plain = ImageRecordBuilder().example(ref, data)
    none = ImageRecordBuilder(attach=lambda r: None).example(ref, data)
    assert plain[0] == none[0] and plain[1].geometry is None


@pytest.mark.unit
def test_geometry_maps_points_through_a_reshape_and_turns():
    # --size 20x10 --fit pad of a 10x10 image: scaled to 10x10, padded 5 left; then
    # one clockwise turn (output 10 wide, 20 high), then a flip.
    geometry = reshape_geometry(10, 10, ImageReshape(size=(20, 10), fit="pad"))
    assert (geometry.scale, geometry.pad, geometry.output) == ((1.0, 1.0), (5, 0), (20, 10))
    assert geometry.map_point(0, 0) == (5, 0)
    turned = Geometry((10, 10), (10, 20), pad=(5, 0), turns=1)
    assert turned.map_point(0, 0) == (10, 5)  # Top-left goes to the top-right corner.
    assert turned.map_box((0, 0, 10, 10)) == (0, 5, 10, 15)
    mirrored = Geometry((10, 10), (10, 20), pad=(5, 0), turns=1, flip=True)
    assert mirrored.map_point(0, 0) == (0, 5)
    crop = reshape_geometry(20, 10, ImageReshape(size=(10, 10), fit="crop"))
    assert (crop.scale, crop.crop) == ((1.0, 1.0), (5, 0)) and crop.map_pixel(5, 0) == (0, 0)


@pytest.mark.unit
def test_a_chunk_crosses_a_process_boundary_with_its_outcomes_named(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(_png(4, 3))
    refs = [ImageRef("train", "k", "a.png", str(path), path.stat().st_size, 0, "cat"),
            ImageRef("train", "l", "gone.png", str(tmp_path / "gone.png"), 5, 0, "cat")]
    chunk = ImageRecordBuilder().chunk(refs)
    back = pickle.loads(pickle.dumps(chunk))
    assert back == chunk and back.framed == chunk.framed
    assert type(back.outcomes[0]) is ImageOutcome and back.outcomes[0].image == ("png", "RGB", 4, 3)
    assert isinstance(back.outcomes[1], DeadLetter) and back.outcomes[1].stage == "read"
