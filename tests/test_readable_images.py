"""Every record's image is one tf.io.decode_image reads, as the record describes it.

The reference decoder is ``tests/harness/tf_decode.py`` (TensorFlow's ``DecodeImageV2``
rules: JPEG 8-bit Huffman grey/RGB, PNG, GIF as RGB, BMP read raw as TensorFlow's
own reader does; nothing else). TensorFlow itself is not a dependency.
"""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.transforms.codec.image_inspection import inspect_image
from beam_tfrecords.transforms.codec.readable import readable_image
from tests.conftest import read_dataset
from tests.harness.tf_decode import Unsupported, tf_decode_image


def _picture(mode: str, size=(37, 23), seed=0) -> Image.Image:
    rng = np.random.default_rng(seed)
    rgba = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 4), dtype=np.uint8), "RGBA")
    return rgba.convert(mode)


def _encode(im: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    im.save(out, fmt, **kwargs)
    return out.getvalue()


def _animated_gif() -> bytes:
    frames = [_picture("P", seed=s) for s in range(3)]
    return _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50)


# name -> (file bytes, what a record of it must decode to (from the file, by Pillow),
# the conversion reason or '' when the bytes are kept)
def _cases() -> dict[str, tuple[bytes, np.ndarray, str]]:
    rgb = _picture("RGB")
    cases = {}

    def add(name, data, expected_mode, reason):
        with Image.open(io.BytesIO(data)) as im:
            im.seek(0)
            expected = np.array(im.convert(expected_mode) if expected_mode else im)
        cases[name] = (data, expected, reason)

    add("tiff_rgb.tif", _encode(rgb, "TIFF"), "RGB", "tiff")
    add("tiff_16bit_grey.tif", _encode(_picture("I;16"), "TIFF"), None, "tiff")
    add("cmyk.jpg", _encode(rgb.convert("CMYK"), "JPEG", quality=95), "RGB", "cmyk_jpeg")
    add("webp_lossless.webp", _encode(rgb, "WEBP", lossless=True), "RGB", "webp")
    add("webp_alpha.webp", _encode(_picture("RGBA"), "WEBP", lossless=True), "RGBA", "webp")
    add("bmp_8bit.bmp", _encode(rgb.convert("P"), "BMP"), "RGB", "bmp_not_24_bit")
    add("bmp_32bit.bmp", _encode(_picture("RGBA"), "BMP"), None, "bmp_not_24_bit")
    add("bmp_24bit.bmp", _encode(rgb, "BMP"), "RGB", "")
    add("png_16bit.png", _encode(_picture("I;16"), "PNG"), None, "")
    add("png_palette_trns.png", _encode(rgb.convert("P"), "PNG", transparency=0), "RGBA", "")
    add("png_la.png", _encode(_picture("LA"), "PNG"), "LA", "")
    add("png_grey.png", _encode(_picture("L"), "PNG"), "L", "")
    add("jpeg_grey.jpg", _encode(_picture("L"), "JPEG"), "L", "")
    add("jpeg_progressive.jpg", _encode(rgb, "JPEG", progressive=True), "RGB", "")
    add("gif_animated.gif", _animated_gif(), "RGB", "")
    return cases


def _as_hwc(array: np.ndarray) -> np.ndarray:
    return array[..., None] if array.ndim == 2 else array


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    cases = _cases()
    root = tmp_path_factory.mktemp("readable")
    (root / "in" / "mixed").mkdir(parents=True)
    for name, (data, _, _) in cases.items():
        (root / "in" / "mixed" / name).write_bytes(data)
    outputs = {}
    for mode in ("readable", "original"):
        out = root / mode
        assert main(["convert", "--input", str(root / "in"), "--output", str(out),
                     "--image_bytes", mode]) == 0
        (records,) = read_dataset(str(out)).values()
        outputs[mode] = (out, {r["image/filename"][0].decode().split("/")[-1]: r for r in records})
    return cases, outputs


@pytest.mark.e2e
def test_every_record_decodes_as_tf_decode_image_does_with_the_stated_shape(converted):
    cases, outputs = converted
    _, records = outputs["readable"]
    assert sorted(records) == sorted(cases)
    for name, (data, expected, reason) in cases.items():
        record = records[name]
        encoded = record["image/encoded"][0]
        array = tf_decode_image(encoded)
        shape = (record["image/height"][0], record["image/width"][0], record["image/channels"][0])
        assert array.shape == shape, name
        assert np.array_equal(array, _as_hwc(expected)), name  # Pixel for pixel, losslessly.
        if reason:
            assert record["image/format"] == [b"png"] and encoded[:4] == b"\x89PNG", name
        else:
            assert encoded == data, name  # Readable as it is: the file's own bytes.
        assert record["image/key/sha256"] == [hashlib.sha256(encoded).hexdigest().encode()]


@pytest.mark.e2e
def test_the_manifest_counts_conversions_by_reason_and_16_bit_pngs(converted):
    _, outputs = converted
    out, _ = outputs["readable"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["image_bytes"] == {
        "converted_to_png": {"bmp_not_24_bit": 2, "cmyk_jpeg": 1, "tiff": 2, "webp": 2},
        "kept": {"png_16_bit": 1},
    }
    assert manifest["options"]["image_bytes"] == "readable"


@pytest.mark.e2e
def test_original_keeps_every_files_bytes_and_says_what_tensorflow_cannot_read(converted):
    cases, outputs = converted
    out, records = outputs["original"]
    unreadable = []
    for name, (data, _, _) in cases.items():
        assert records[name]["image/encoded"] == [data], name
        try:
            tf_decode_image(data)
        except Unsupported:
            unreadable.append(name)
    # What the reference refuses is what readable mode converts, except BMPs that
    # TensorFlow reads but wrongly (8-bit without its palette, 32-bit padding as alpha).
    assert sorted(unreadable) == sorted(n for n, (_, _, r) in cases.items() if r and r != "bmp_not_24_bit")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["image_bytes"]["kept"] == {
        "bmp_not_24_bit": 2, "cmyk_jpeg": 1, "png_16_bit": 1, "tiff": 2, "webp": 2}


@pytest.mark.unit
@pytest.mark.parametrize("width", [1, 2, 3, 4, 5])
def test_a_24_bit_bmp_of_any_row_padding_is_kept_and_reads_as_pillow_reads_it(width):
    data = _encode(_picture("RGB", size=(width, 3)), "BMP")
    info = inspect_image(data)
    assert info.unreadable == ""
    assert readable_image(data, info) == (data, info)
    with Image.open(io.BytesIO(data)) as im:
        assert np.array_equal(tf_decode_image(data), np.array(im))


@pytest.mark.unit
def test_a_float_tiff_has_no_lossless_png_and_is_refused_with_a_reason():
    from beam_tfrecords.transforms.codec.image_inspection import ImageError

    data = _encode(Image.new("F", (4, 3), 0.5), "TIFF")
    with pytest.raises(ImageError, match=r"unconvertible_image: pixel mode F has no lossless PNG"):
        readable_image(data, inspect_image(data))
