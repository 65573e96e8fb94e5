"""Tests for transforms.codec.images: sniffing, header reading and validation."""

import io
import pickle
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.schemas.config import VALIDATE_MODES
from beam_tfrecords.transforms.codec.image_inspection import (
    IMAGE_EXTENSIONS,
    ImageError,
    ImageInfo,
    inspect_image,
    is_image_filename,
)

pytestmark = pytest.mark.unit

W, H = 30, 20  # deliberately not square, to catch width/height swaps


def _encode(im, fmt, **kwargs):
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _rgb():
    rng = np.random.default_rng(1)
    return Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8), "RGB")


def _rgba():
    rng = np.random.default_rng(2)
    arr = rng.integers(0, 256, (H, W, 4), dtype=np.uint8)
    arr[..., 3] = np.where(arr[..., 3] > 127, 255, 0)  # real transparency
    return Image.fromarray(arr, "RGBA")


def _palette():
    rng = np.random.default_rng(3)
    im = Image.fromarray(rng.integers(0, 4, (H, W), dtype=np.uint8), "P")
    im.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255])
    return im


def _gray16():
    rng = np.random.default_rng(4)
    return Image.fromarray(rng.integers(0, 65536, (H, W), dtype=np.uint16))


def _jpeg(**kwargs):
    return _encode(_rgb(), "JPEG", **kwargs)


def _png():
    return _encode(_rgb(), "PNG")


def _gif():
    return _encode(_palette(), "GIF")


# id: (encoder, expected format, expected channels)
GOOD_IMAGES = {
    "jpeg-L": (lambda: _encode(_rgb().convert("L"), "JPEG"), "jpeg", 1),
    "jpeg-RGB": (lambda: _encode(_rgb(), "JPEG"), "jpeg", 3),
    "jpeg-CMYK": (lambda: _encode(_rgb().convert("CMYK"), "JPEG"), "jpeg", 3),  # Decoded to RGB.
    "jpeg-progressive": (lambda: _encode(_rgb(), "JPEG", progressive=True), "jpeg", 3),
    "png-L": (lambda: _encode(_rgb().convert("L"), "PNG"), "png", 1),
    "png-LA": (lambda: _encode(_rgba().convert("LA"), "PNG"), "png", 2),
    "png-RGB": (lambda: _encode(_rgb(), "PNG"), "png", 3),
    "png-RGBA": (lambda: _encode(_rgba(), "PNG"), "png", 4),
    "png-P": (lambda: _encode(_palette(), "PNG"), "png", 3),
    "png-P-transparency": (lambda: _encode(_palette(), "PNG", transparency=0), "png", 4),
    "png-I;16": (lambda: _encode(_gray16(), "PNG"), "png", 1),
    # tRNS on a truecolour PNG: Pillow keeps mode RGB, so 3.
    "png-RGB-tRNS": (lambda: _encode(_rgb(), "PNG", transparency=(1, 2, 3)), "png", 3),
    "png-interlaced": (lambda: _encode(_rgb(), "PNG", interlace=1), "png", 3),
    "gif": (lambda: _encode(_palette(), "GIF"), "gif", 3),
    # TensorFlow decodes every GIF to RGB, transparent or not: 3.
    "gif-transparency": (lambda: _encode(_palette(), "GIF", transparency=0), "gif", 3),
    "gif-from-RGBA": (lambda: _encode(_rgba(), "GIF"), "gif", 3),
    "gif-grey": (lambda: _encode(_rgb().convert("L"), "GIF"), "gif", 3),
    "gif-animated": (
        lambda: _encode(_palette(), "GIF", save_all=True, append_images=[_palette()] * 2),
        "gif",
        3,
    ),
    "bmp-RGB": (lambda: _encode(_rgb(), "BMP"), "bmp", 3),
    "bmp-P": (lambda: _encode(_palette(), "BMP"), "bmp", 3),
    "bmp-L": (lambda: _encode(_rgb().convert("L"), "BMP"), "bmp", 1),
    "webp-RGB": (lambda: _encode(_rgb(), "WEBP"), "webp", 3),
    "webp-RGBA": (lambda: _encode(_rgba(), "WEBP"), "webp", 4),
    "webp-lossless": (lambda: _encode(_rgb(), "WEBP", lossless=True), "webp", 3),
    "tiff-RGB": (lambda: _encode(_rgb(), "TIFF"), "tiff", 3),
    "tiff-RGBA": (lambda: _encode(_rgba(), "TIFF"), "tiff", 4),
    "tiff-CMYK": (lambda: _encode(_rgb().convert("CMYK"), "TIFF"), "tiff", 3),  # Decoded to RGB.
    "tiff-I;16": (lambda: _encode(_gray16(), "TIFF"), "tiff", 1),
    "tiff-deflate": (lambda: _encode(_rgb(), "TIFF", compression="tiff_adobe_deflate"), "tiff", 3),
}


# Why tf.io.decode_image cannot read an image as stored (the rest it reads).
UNREADABLE = {
    "jpeg-CMYK": "cmyk_jpeg", "bmp-P": "bmp_not_24_bit", "bmp-L": "bmp_not_24_bit",
    **{name: name.split("-")[0] for name in GOOD_IMAGES if name.startswith(("webp", "tiff"))},
}


@pytest.mark.parametrize("validate", VALIDATE_MODES)
@pytest.mark.parametrize("name", sorted(GOOD_IMAGES))
def test_good_images_match_pillow(name, validate):
    encode, fmt, channels = GOOD_IMAGES[name]
    data = encode()
    with Image.open(io.BytesIO(data)) as im:
        pil_width, pil_height = im.size
    info = inspect_image(data, validate=validate)
    assert info == ImageInfo(format=fmt, height=pil_height, width=pil_width, channels=channels,
                             bit_depth=16 if name == "png-I;16" else 8,
                             unreadable=UNREADABLE.get(name, ""))
    assert (info.width, info.height) == (W, H)


@pytest.mark.parametrize("name", sorted(GOOD_IMAGES))
def test_format_comes_from_content_not_name(name):
    encode, fmt, _ = GOOD_IMAGES[name]
    wrong_name = "photo.png" if fmt != "png" else "photo.jpg"
    assert is_image_filename(wrong_name)
    assert inspect_image(encode()).format == fmt


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview], ids=lambda t: t.__name__)
def test_accepts_bytes_like(wrap):
    assert inspect_image(wrap(_png())) == ImageInfo("png", H, W, 3)
    assert inspect_image(wrap(_jpeg())) == ImageInfo("jpeg", H, W, 3)


def test_rejects_str():
    with pytest.raises(TypeError, match="data must be bytes-like, not str"):
        inspect_image("not bytes")


def _png_chunks(data):
    """(offset, type) of every chunk in a well-formed PNG."""
    pos, chunks = 8, []
    while pos < len(data):
        length, ctype = struct.unpack_from(">I4s", data, pos)
        chunks.append((pos, ctype))
        pos += 12 + length
    return chunks


def _png_flip_in_idat():
    data = bytearray(_png())
    idat = next(pos for pos, ctype in _png_chunks(data) if ctype == b"IDAT")
    data[idat + 8 + 5] ^= 0xFF
    return bytes(data)


def _png_cut_before_iend():
    data = _png()
    iend = next(pos for pos, ctype in _png_chunks(data) if ctype == b"IEND")
    return data[:iend]


def _png_without_ihdr_first():
    data = _png()
    starts = [pos for pos, _ in _png_chunks(data)] + [len(data)]
    chunks = [data[a:b] for a, b in zip(starts, starts[1:])]
    return data[:8] + chunks[1] + chunks[0] + b"".join(chunks[2:])  # IDAT.., IHDR, .., IEND


def _png_chunk(ctype, payload):
    crc = struct.pack(">I", zlib.crc32(ctype + payload))
    return struct.pack(">I", len(payload)) + ctype + payload + crc


def _png_without_iend():
    # A complete-looking PNG that simply has no IEND.
    return _png()[:-12]


def _gif_cut():
    data = _gif()
    cut = len(data) // 2
    while data[cut - 1] == 0x3B:  # the check is the trailer byte: do not cut just after one
        cut += 1
    return data[:cut]


def _jpeg_cut():
    data = _encode(_rgb().resize((300, 200)), "JPEG")
    cut = data[: len(data) // 2]
    assert cut.find(b"\xff\xda") > 0  # the cut is inside the entropy-coded data
    return cut


def _jpeg_without_sof():
    data = _jpeg()
    sof = data.index(b"\xff\xc0")
    length = struct.unpack_from(">H", data, sof + 2)[0]
    return data[:sof] + data[sof + 2 + length :]


def _jpeg_broken_marker():
    data = bytearray(_jpeg())
    data[2] = 0x12  # first marker after SOI is no longer 0xFF..
    return bytes(data)


def _jpeg_segment_past_end():
    # SOI, then an APP1 that claims more bytes than exist; the file ends with FFD9.
    return b"\xff\xd8\xff\xe1\x40\x00" + b"Exif\x00\x00" + b"\x00" * 10 + b"\xff\xd9"


def _bmp_cut():
    data = _encode(_rgb(), "BMP")
    return data[: len(data) // 2]


def _webp_cut():
    data = _encode(_rgb(), "WEBP")
    return data[: len(data) // 2]


def _tiff_garbage():
    return b"II*\x00" + b"\xff" * 60


def _random_bytes():
    data = random.Random(1234).randbytes(4096)
    assert not data.startswith((b"\xff\xd8", b"\x89PNG", b"GIF8", b"BM", b"RIFF", b"II", b"MM"))
    return data


# id: (builder, expected reason)
BAD_IMAGES = {
    "empty": (lambda: b"", "empty_file"),
    "text": (lambda: b"this is a text file saved as photo.jpg\n", "not_an_image"),
    "random": (_random_bytes, "not_an_image"),
    "heic-like": (lambda: b"\x00\x00\x00\x18ftypheic" + b"\x00" * 32, "not_an_image"),
    "riff-wav": (lambda: b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x00" * 28, "not_an_image"),
    "jpeg-cut-half": (_jpeg_cut, "truncated_jpeg"),
    "jpeg-cut-in-headers": (lambda: _jpeg()[:300], "truncated_jpeg"),
    "jpeg-soi-only": (lambda: b"\xff\xd8", "truncated_jpeg"),
    "jpeg-no-eoi": (lambda: _jpeg()[:-2], "truncated_jpeg"),
    "jpeg-segment-past-end": (_jpeg_segment_past_end, "truncated_jpeg"),
    "jpeg-no-sof": (_jpeg_without_sof, "corrupt_jpeg"),
    "jpeg-broken-marker": (_jpeg_broken_marker, "corrupt_jpeg"),
    "jpeg-eoi-before-scan": (lambda: b"\xff\xd8\xff\xd9", "corrupt_jpeg"),
    "png-cut-half": (lambda: _png()[: len(_png()) // 2], "truncated_png"),
    "png-cut-before-iend": (_png_cut_before_iend, "truncated_png"),
    "png-no-iend": (_png_without_iend, "truncated_png"),
    "png-signature-only": (lambda: _png()[:8], "truncated_png"),
    "png-short-signature": (lambda: b"\x89PNG\r", "truncated_png"),
    "png-flipped-idat-byte": (_png_flip_in_idat, "corrupt_png"),
    "png-crlf-mangled": (lambda: _png().replace(b"\r\n", b"\n", 1), "corrupt_png"),
    "png-ihdr-not-first": (_png_without_ihdr_first, "corrupt_png"),
    "png-data-after-iend": (lambda: _png() + _png_chunk(b"tEXt", b"k\x00v"), "corrupt_png"),
    "gif-cut-half": (_gif_cut, "truncated_gif"),
    "gif-no-trailer": (lambda: _gif()[:-1], "truncated_gif"),
    "gif-header-only": (lambda: _gif()[:10], "truncated_gif"),
    "gif-bad-version": (lambda: b"GIF88a" + _gif()[6:], "corrupt_gif"),
    "bmp-cut-half": (_bmp_cut, "corrupt_image"),
    "webp-cut-half": (_webp_cut, "corrupt_image"),
    "tiff-garbage": (_tiff_garbage, "corrupt_image"),
}


@pytest.mark.filterwarnings("ignore:Corrupt EXIF data")  # Pillow, on tiff-garbage
@pytest.mark.parametrize("validate", VALIDATE_MODES)
@pytest.mark.parametrize("name", sorted(BAD_IMAGES))
def test_bad_images_raise_with_reason(name, validate):
    build, reason = BAD_IMAGES[name]
    with pytest.raises(ImageError, match=f"^{reason}: ") as excinfo:
        inspect_image(build(), validate=validate)
    assert excinfo.value.reason == reason
    assert excinfo.value.message


def test_truncated_jpeg_message_is_plain():
    with pytest.raises(ImageError, match="no end-of-image marker"):
        inspect_image(_jpeg_cut())


def test_png_crc_message_names_chunk():
    with pytest.raises(ImageError, match="IDAT.*CRC"):
        inspect_image(_png_flip_in_idat())


@pytest.mark.parametrize("padding", [1, 2, 517, 10_000])
def test_jpeg_trailing_zero_padding_passes(padding):
    data = _jpeg() + b"\x00" * padding
    assert inspect_image(data) == ImageInfo("jpeg", H, W, 3)
    assert inspect_image(data, validate="decode") == ImageInfo("jpeg", H, W, 3)


def test_jpeg_data_appended_after_eoi_passes():
    # Motion photos / Samsung trailers: a whole JPEG followed by other data.
    data = _jpeg() + b"ftypmp42" + random.Random(5).randbytes(2000).replace(b"\xff\xd9", b"")
    assert inspect_image(data) == ImageInfo("jpeg", H, W, 3)


def test_jpeg_cut_after_embedded_thumbnail_is_truncated():
    # An EXIF thumbnail (with its own FFD9) sits inside APP1, before the SOS.
    thumb = _encode(_rgb().resize((8, 6)), "JPEG")
    data = _jpeg()
    app1 = b"Exif\x00\x00" + b"\x00" * 8 + thumb
    segment = b"\xff\xe1" + struct.pack(">H", len(app1) + 2) + app1
    data = data[:2] + segment + data[2:]
    assert inspect_image(data).format == "jpeg"
    cut = data[: 2 + len(segment)]  # ends with the thumbnail's FFD9
    assert cut.endswith(b"\xff\xd9")
    with pytest.raises(ImageError, match=r"JPEG ends before the start of scan \(SOS\)") as excinfo:
        inspect_image(cut)
    assert excinfo.value.reason == "truncated_jpeg"


def _jpeg_with_garbage_scan():
    data = _jpeg()
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + struct.unpack_from(">H", data, sos + 2)[0]
    garbage = random.Random(7).randbytes(len(data) - 2 - scan).replace(b"\xff\xd9", b"\xff\x00")
    return data[:scan] + garbage + b"\xff\xd9"


@pytest.mark.parametrize("validate", ["structure", "decode"])
def test_structure_and_decode_catch_garbage_entropy_data(validate):
    data = _jpeg_with_garbage_scan()
    assert inspect_image(data, validate="headers") == ImageInfo("jpeg", H, W, 3)
    with pytest.raises(ImageError, match="JPEG pixel data cannot be decoded") as excinfo:
        inspect_image(data, validate=validate)
    assert excinfo.value.reason == "decode_error"


def _with_jpeg_size(data, width, height):
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]


@pytest.mark.parametrize("validate", VALIDATE_MODES)
def test_decompression_bomb_is_refused_from_its_header(validate):
    data = _with_jpeg_size(_jpeg(), 30_000, 30_000)
    with pytest.raises(ImageError, match="30000x30000 = 900,000,000 pixels.*--max_pixels") as excinfo:
        inspect_image(data, validate=validate)
    assert excinfo.value.reason == "too_many_pixels"
    # Raising the limit lets the header through; only decoding can then refuse it.
    assert inspect_image(data, "headers", max_pixels=10**9) == ImageInfo("jpeg", 30_000, 30_000, 3)


def test_gif_first_frame_larger_than_screen_matches_pillow():
    data = bytearray(_gif())
    data[6:10] = struct.pack("<HH", 10, 5)  # logical screen smaller than the frame
    with Image.open(io.BytesIO(bytes(data))) as im:
        assert im.size == (W, H)
    assert inspect_image(bytes(data)) == ImageInfo("gif", H, W, 3)


def test_gif_transparency_only_counts_before_first_image():
    # GCE with transparency placed after the first image: does not count.
    data = _gif()
    gce = b"\x21\xf9\x04\x01\x00\x00\x00\x00"
    with_late_gce = data[:-1] + gce + data[-1:]
    assert inspect_image(with_late_gce).channels == 3


@pytest.mark.parametrize("mode", ["fast", "", "STRUCTURE", None])
def test_bad_validate_mode(mode):
    with pytest.raises(ValueError, match="validate must be one of 'headers', 'structure', 'decode'; got ") as excinfo:
        inspect_image(_png(), validate=mode)
    assert not isinstance(excinfo.value, ImageError)
    assert "structure" in str(excinfo.value) and "decode" in str(excinfo.value)


def test_image_error_attributes_and_pickling():
    err = ImageError("truncated_png", "PNG has no IEND chunk")
    assert isinstance(err, ValueError)
    assert (err.reason, err.message) == ("truncated_png", "PNG has no IEND chunk")
    assert "truncated_png" in str(err) and "IEND" in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.reason, copy.message) == (err.reason, err.message)


def test_image_info_is_frozen():
    info = inspect_image(_png())
    with pytest.raises(AttributeError, match="cannot assign to field 'width'"):
        info.width = 1


@pytest.mark.parametrize(
    "name, expected",
    [
        ("a.jpg", True),
        ("a.JPG", True),
        ("a.jpeg", True),
        ("a.Jpe", True),
        ("a.png", True),
        ("a.gif", True),
        ("a.bmp", True),
        ("a.webp", True),
        ("a.tif", True),
        ("a.TIFF", True),
        ("dir/sub/x.y.png", True),
        ("gs://bucket/images/cat.jpeg", True),
        (".DS_Store", False),
        ("a.txt", False),
        ("labels.txt", False),
        ("photo.jpg.txt", False),
        ("archive.tar.gz", False),
        ("noextension", False),
        ("images.png/labels.csv", False),
        ("a.svg", False),
        ("a.heic", False),
        ("", False),
    ],
)
def test_is_image_filename(name, expected):
    assert is_image_filename(name) is expected


def test_image_extensions():
    assert IMAGE_EXTENSIONS == {
        ".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"
    }
    assert isinstance(IMAGE_EXTENSIONS, frozenset)
