"""Resize and re-encode on the way in (``--max_side``, ``--min_side``, ``--size``
with ``--fit``, ``--image_format``, ``--jpeg_quality``, ``--color_mode``)."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.schemas.config import ConvertConfig, ImageReshape
from beam_tfrecords.transforms.codec.image_inspection import inspect_image
from beam_tfrecords.transforms.codec.reshape import reshape_image, target_size
from tests.conftest import read_dataset
from tests.harness.tf_decode import tf_decode_image

PHOTOS = 500
SIDE = 256


def _photo(width: int, height: int, seed: int) -> Image.Image:
    """A smooth picture with some texture (JPEG sizes like a photo's, roughly)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * (1 + seed % 5)) % 256, (y * 2) % 256, ((x + y) // 3) % 256], axis=-1)
    noise = rng.integers(0, 24, (height, width, 3))
    return Image.fromarray(((base + noise) % 256).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """500 photos, 64 to 900 pixels a side (some already under 256), JPEG and PNG."""
    root = tmp_path_factory.mktemp("photos") / "in"
    rng = np.random.default_rng(500)
    sizes = {}
    for i in range(PHOTOS):
        cls = f"c{i % 4}"
        (root / cls).mkdir(parents=True, exist_ok=True)
        width, height = (int(v) for v in rng.integers(64, 900, 2))
        name = f"p{i:03d}." + ("png" if i % 10 == 0 else "jpg")
        _photo(width, height, i).save(root / cls / name, quality=92)
        sizes[f"{cls}/{name}"] = (width, height)
    return root, sizes


@pytest.mark.e2e
def test_500_photos_to_longest_side_256_never_enlarged_aspect_within_a_pixel(photos, tmp_path):
    root, sizes = photos
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root), "--output", out, "--max_side", str(SIDE)]) == 0
    records = [r for rs in read_dataset(out).values() for r in rs]
    assert len(records) == PHOTOS
    enlarged = kept = 0
    for record in records:
        name = record["image/filename"][0].decode()
        width, height = sizes[name]
        encoded = record["image/encoded"][0]
        array = tf_decode_image(encoded)  # Readable as tf.io.decode_image reads it.
        out_h, out_w, channels = array.shape
        assert (out_h, out_w, channels) == (record["image/height"][0], record["image/width"][0],
                                            record["image/channels"][0])
        if max(width, height) <= SIDE:
            assert (out_w, out_h) == (width, height), name  # Never enlarged...
            with open(os.path.join(root, name), "rb") as f:
                assert encoded == f.read(), name  # ...and its bytes kept.
            kept += 1
        else:
            assert max(out_w, out_h) == SIDE, (name, out_w, out_h)
            scale = SIDE / max(width, height)
            assert abs(out_w - width * scale) <= 1 and abs(out_h - height * scale) <= 1, name
        enlarged += max(out_w, out_h) > max(width, height)
        assert record["image/format"][0] == (b"png" if name.endswith(".png") else b"jpeg")
    assert enlarged == 0 and kept > 0
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["image_bytes"]["reshape"] == {"kept": kept, "resized": PHOTOS - kept}
    assert manifest["options"]["max_side"] == SIDE
    assert sum(manifest["labels"]["counts"]["train"].values()) == PHOTOS


@pytest.mark.e2e
def test_resized_shards_are_cut_by_exact_sizes_and_rerun_byte_identical(photos, tmp_path):
    root, _ = photos
    digests = []
    for run, flags in enumerate((["--encode_processes", "0"], ["--encode_processes", "2"])):
        out = str(tmp_path / f"out{run}")
        assert main(["convert", "--input", str(root), "--output", out, "--max_side", "128",
                     "--shard_min_mb", "0.5", "--shard_max_mb", "1", *flags]) == 0
        with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
            manifest = json.load(f)
        shards = manifest["splits"]["train"]["shards"]
        assert len(shards) > 1
        assert manifest["splits"]["train"]["shards_outside_band"] == []
        assert all(0.5e6 <= s["bytes"] <= 1e6 for s in shards[:-1]) or len(shards) == 1
        digests.append([s["sha256"] for s in shards])
        assert main(["verify", out]) == 0
    assert digests[0] == digests[1]


@pytest.mark.unit
@pytest.mark.parametrize("size, spec, expected", [
    ((500, 300), ImageReshape(max_side=256), (256, 154)),
    ((300, 500), ImageReshape(max_side=256), (154, 256)),
    ((200, 100), ImageReshape(max_side=256), (200, 100)),
    ((500, 300), ImageReshape(min_side=100), (167, 100)),
    ((90, 300), ImageReshape(min_side=100), (90, 300)),
    ((50, 40), ImageReshape(size=(224, 224)), (224, 224)),
    ((1001, 1), ImageReshape(max_side=10), (10, 1)),
])
def test_target_size(size, spec, expected):
    assert target_size(*size, spec) == expected


def _encode(im, fmt, **kwargs) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kwargs)
    return out.getvalue()


@pytest.mark.unit
@pytest.mark.parametrize("fit", ["stretch", "crop", "pad"])
def test_exact_size_by_fit(fit):
    data = _encode(_photo(400, 200, 1), "PNG")
    out, info, note = reshape_image(data, inspect_image(data), ImageReshape(size=(100, 100), fit=fit))
    array = tf_decode_image(out)
    assert array.shape == (100, 100, 3) and (info.width, info.height) == (100, 100)
    assert note == "reshape/resized"
    if fit == "pad":  # Fit 100x50 centred: black bands above and below.
        assert array[:20].max() == 0 and array[-20:].max() == 0 and array[40:60].max() > 0


@pytest.mark.unit
def test_format_and_colour_mode():
    data = _encode(_photo(40, 30, 2).convert("RGBA"), "PNG")
    out, info, note = reshape_image(data, inspect_image(data), ImageReshape(format="jpeg", quality=80))
    assert out[:3] == b"\xff\xd8\xff" and (info.format, info.channels) == ("jpeg", 3)
    assert note == "reshape/re-encoded"
    out, info, _ = reshape_image(data, inspect_image(data), ImageReshape(color="l"))
    assert tf_decode_image(out).shape == (30, 40, 1) and info.channels == 1
    tiff = _encode(_photo(40, 30, 3), "TIFF")  # Not readable as it is: made PNG even unresized.
    out, info, note = reshape_image(tiff, inspect_image(tiff), ImageReshape(max_side=100))
    assert info.format == "png" and note == "reshape/re-encoded"
    assert np.array_equal(tf_decode_image(out), np.array(Image.open(io.BytesIO(tiff))))


@pytest.mark.unit
@pytest.mark.parametrize("options, message", [
    (dict(max_side=10, size=(5, 5)), r"--max_side and --size: give one way to size images"),
    (dict(fit="zoom"), r"--fit must be one of stretch, crop, pad"),
    (dict(jpeg_quality=100), r"--jpeg_quality must be within 1..95"),
    (dict(max_side=-3), r"--max_side must be a positive whole number"),
])
def test_bad_reshape_flags_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        ConvertConfig(input="in", output="out", **options)


@pytest.mark.e2e
def test_reshape_flags_are_refused_on_a_table(tmp_path, capsys):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    assert main(["convert", "--input", str(table), "--output", str(tmp_path / "o"),
                 "--max_side", "256"]) == 2
    assert "--max_side applies only to images" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_no_undecodable_fuzzed_file_reaches_a_shard_when_resizing(tmp_path, fmt):
    # Resized JPEGs skip the separate 1/8-size check: the resizing decode reads
    # every entropy-coded byte too, so what a full decode refuses is still refused.
    from tests.test_image_safety import _mutants, _pillow_decodes

    root = tmp_path / "in" / "fuzz"
    root.mkdir(parents=True)
    mutants = _mutants(fmt, count=150)
    for i, data in enumerate(mutants):
        (root / f"m{i:03d}.{fmt.lower()}").write_bytes(data)
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(tmp_path / "in"), "--output", out, "--max_side", "16",
                 "--max_bad_fraction", "1"]) in (0, 1)
    written = [r["image/filename"][0].decode() for rs in read_dataset(out).values() for r in rs] \
        if os.path.exists(os.path.join(out, "manifest.json")) else []
    undecodable = [name for name in written
                   if not _pillow_decodes((tmp_path / "in" / name).read_bytes())]
    assert undecodable == []
    assert len(written) <= sum(_pillow_decodes(m) for m in mutants)
    if fmt == "JPEG":
        assert len(written) > 50  # Most JPEG mutants still decode: the test sees some.


@pytest.mark.e2e
@pytest.mark.parametrize("flags, message", [
    (["--size", "abc"], "argument --size: 'abc' is not WIDTHxHEIGHT (e.g. 224x224)"),
    (["--splits", "foo"], "argument --splits: 'foo' is not NAME=FRACTION (e.g. "
                          "train=0.8,validation=0.1,test=0.1)"),
])
def test_a_flag_value_that_does_not_parse_says_what_to_write(tmp_path, capsys, flags, message):
    assert main(["convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"), *flags]) == 2
    # One line, no usage block.
    assert capsys.readouterr().err.strip().splitlines() == [
        f"beam-tfrecords convert: error: {message} (see beam-tfrecords convert --help)"]


def _save_png(path, im):
    im.save(path, "PNG")


@pytest.mark.e2e
def test_16_bit_images_resize_and_alpha_shows_black_in_a_jpeg(tmp_path):
    root = tmp_path / "in" / "a"
    root.mkdir(parents=True)
    deep = np.random.default_rng(3).integers(0, 65535, (700, 700)).astype(np.uint16)
    _save_png(root / "deep.png", Image.fromarray(deep))
    _save_png(root / "clear.png", Image.new("RGBA", (40, 40), (255, 0, 0, 0)))  # Red, all transparent.
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(tmp_path / "in"), "--output", out, "--max_side", "100"]) == 0
    records = {r["image/filename"][0].decode(): r for rs in read_dataset(out).values() for r in rs}
    resized = tf_decode_image(records["a/deep.png"]["image/encoded"][0])
    assert resized.shape == (100, 100, 1) and resized.dtype == np.uint16
    assert abs(int(resized.mean()) - int(deep.mean())) < 2000  # Values kept in 16 bits.
    out_jpeg = str(tmp_path / "jpeg")
    assert main(["convert", "--input", str(tmp_path / "in"), "--output", out_jpeg,
                 "--image_format", "jpeg"]) == 0
    records = {r["image/filename"][0].decode(): r for rs in read_dataset(out_jpeg).values() for r in rs}
    clear = tf_decode_image(records["a/clear.png"]["image/encoded"][0])
    assert clear.max() < 8  # Black, not the red stored under the transparency.


@pytest.mark.unit
def test_big_endian_16_bit_tiff_keeps_its_values():
    from beam_tfrecords.transforms.codec.readable import readable_image

    values = np.random.default_rng(0).integers(0, 65535, (4, 5)).astype(">u2")
    out = io.BytesIO()
    Image.frombytes("I;16B", (5, 4), values.tobytes()).save(out, "TIFF")
    data = out.getvalue()
    with Image.open(io.BytesIO(data)) as source:
        assert source.mode == "I;16B"
    png, info = readable_image(data, inspect_image(data))
    assert info.bit_depth == 16
    assert np.array_equal(tf_decode_image(png)[..., 0], values.astype(np.uint16))


@pytest.mark.unit
def test_a_size_over_max_pixels_is_refused_before_running():
    with pytest.raises(ValueError, match=r"--size 100000x100000 is 10,000,000,000 pixels an image, "
                       r"more than --max_pixels"):
        ConvertConfig(input="in", output="out", size=(100000, 100000))
