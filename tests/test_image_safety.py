"""Images that must never reach a shard: decompression bombs and damaged files.

The pixel limit (``max_pixels``, ``--max_pixels``) is checked from the header,
in every validate mode, before anything is decoded. The default mode
(``structure``) also checks the compressed data the way a decoder reads it, so
that no file a full Pillow decode rejects is accepted; a seeded fuzz set of
byte-mutated JPEGs and PNGs measures that.
"""

import io
import json
import os
import random
import struct
import zlib

import numpy as np
import pytest
from PIL import Image, ImageFile

from beam_tfrecords.cli import config_from_args, convert_parser
from beam_tfrecords.samples import CLASSES, make_class_folder_sample, render_image
from beam_tfrecords.schemas.config import DEFAULT_MAX_PIXELS, VALIDATE_MODES, ConvertConfig
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.codec.image_inspection import ImageError, ImageInfo, inspect_image
from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder

# Mutated headers may declare sizes above Pillow's warning threshold (the reference decode).
from tests.conftest import dead_letters

pytestmark = pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")


def _encode(im, fmt, **kwargs):
    buf = io.BytesIO()
    im.save(buf, fmt, **kwargs)
    return buf.getvalue()


def _picture(width=100, height=100, seed=0):
    return render_image(CLASSES[seed % len(CLASSES)], width, height, np.random.default_rng(seed))


def _png_chunk(ctype, payload):
    return struct.pack(">I", len(payload)) + ctype + payload + struct.pack(">I", zlib.crc32(ctype + payload))


def _png(width, height, depth, colour, raw, interlace=0, split_at=None, z=None):
    """A PNG built by hand around ``raw`` (the filtered rows), or around the zlib
    stream ``z``: every CRC valid."""
    out = b"\x89PNG\r\n\x1a\n" + _png_chunk(
        b"IHDR", struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace))
    if colour == 3:
        out += _png_chunk(b"PLTE", bytes(range(48)))
    z = zlib.compress(raw) if z is None else z
    if split_at is None:
        out += _png_chunk(b"IDAT", z)
    else:  # IDAT, another chunk, IDAT: decoders stop at the first run
        out += _png_chunk(b"IDAT", z[:split_at]) + _png_chunk(b"tEXt", b"k\x00v") + _png_chunk(b"IDAT", z[split_at:])
    return out + _png_chunk(b"IEND", b"")


def _png_rows(width, height, bits, interlace, filter_type=0):
    """Zero rows, each with its filter byte, as the IHDR implies (Adam7 when interlaced)."""
    passes = [(width, height)] if not interlace else [
        ((width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy)
        for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                               (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))]
    return b"".join(bytes([filter_type]) + bytes((w * bits + 7) // 8)
                    for w, h in passes if w and h for _ in range(h))


def _fix_png_crcs(data):
    """Recomputes every chunk CRC (a damaged file written by a buggy tool, or on purpose)."""
    data, pos = bytearray(data), 8
    while pos + 12 <= len(data):
        end = pos + 12 + struct.unpack_from(">I", data, pos)[0]
        if end > len(data):
            break
        data[end - 4:end] = struct.pack(">I", zlib.crc32(data[pos + 4:end - 4]))
        pos = end
    return bytes(data)


def _pillow_decodes(data):
    """The reference: a full Pillow decode (Image.open + load), truncated images refused."""
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
    except Exception:  # pylint: disable=broad-except  # anything Pillow raises is a refusal
        return False
    return True


def _reason(data, validate, max_pixels=DEFAULT_MAX_PIXELS):
    try:
        inspect_image(data, validate, max_pixels)
    except ImageError as err:
        return err.reason
    return None


# --- decompression bombs: tiny files whose headers declare huge sizes ---------------------------

def _jpeg_bomb(width, height, progressive=False):
    data = _encode(_picture(32, 24), "JPEG", progressive=progressive)
    sof = data.index(b"\xff\xc2" if progressive else b"\xff\xc0")
    return data[:sof + 5] + struct.pack(">HH", height, width) + data[sof + 9:]


def _png_bomb(width, height):
    data = _encode(_picture(32, 24), "PNG")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return data[:8] + _png_chunk(b"IHDR", ihdr) + data[33:]


def _gif_bomb(screen, frame):
    data = bytearray(_encode(_picture(32, 24).convert("P"), "GIF"))
    data[6:10] = struct.pack("<HH", *screen)
    descriptor = data.index(b"\x2c", 13 + (3 << ((data[10] & 7) + 1)))
    data[descriptor + 5:descriptor + 9] = struct.pack("<HH", *frame)
    return bytes(data)


def _bmp_bomb(width, height):
    data = bytearray(_encode(_picture(32, 24), "BMP"))
    data[18:26] = struct.pack("<ii", width, height)
    return bytes(data)


def _webp_bomb():
    data = bytearray(_encode(_picture(32, 24), "WEBP", lossless=False))
    vp8 = data.index(b"VP8 ") + 8 + 6  # chunk payload: 3-byte frame tag, start code, then sizes
    data[vp8:vp8 + 4] = struct.pack("<HH", 16383, 16383)  # 14 bits each, the most VP8 can say
    return bytes(data)


def _tiff_bomb():
    data = bytearray(_encode(_picture(32, 24), "TIFF"))
    ifd = struct.unpack_from("<I", data, 4)[0]
    for i in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * i
        tag, kind = struct.unpack_from("<HH", data, entry)
        if tag in (256, 257):  # ImageWidth, ImageLength
            struct.pack_into("<H" if kind == 3 else "<I", data, entry + 8, 60_000)
    return bytes(data)


BOMBS = {  # eight as in the issue (JPEG SOF, PNG IHDR, GIF screen and frame, BMP), then WEBP, TIFF
    "jpeg-65535x65535": (lambda: _jpeg_bomb(65535, 65535), 65535, 65535),
    "jpeg-30000x20000": (lambda: _jpeg_bomb(30000, 20000), 30000, 20000),
    "jpeg-progressive-11586x11586": (lambda: _jpeg_bomb(11586, 11586, progressive=True), 11586, 11586),
    "png-65535x65535": (lambda: _png_bomb(65535, 65535), 65535, 65535),
    "png-1000000x200": (lambda: _png_bomb(1_000_000, 200), 1_000_000, 200),
    "gif-screen-65535x65535": (lambda: _gif_bomb((65535, 65535), (32, 24)), 65535, 65535),
    "gif-frame-65535x65535": (lambda: _gif_bomb((32, 24), (65535, 65535)), 65535, 65535),
    "bmp-65535x65535": (lambda: _bmp_bomb(65535, 65535), 65535, 65535),
    "webp-16383x16383": (_webp_bomb, 16383, 16383),
    "tiff-60000x60000": (_tiff_bomb, 60000, 60000),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(BOMBS))
def test_decompression_bombs_are_refused_from_the_header_in_every_mode(name):
    build, width, height = BOMBS[name]
    data = build()
    assert len(data) < 10_000 and width * height > DEFAULT_MAX_PIXELS
    for validate in VALIDATE_MODES:
        with pytest.raises(ImageError) as excinfo:
            inspect_image(data, validate)
        assert excinfo.value.reason == "too_many_pixels", (validate, str(excinfo.value))
        assert f"{width}x{height} = {width * height:,} pixels" in excinfo.value.message
        assert "--max_pixels" in excinfo.value.message
    # With the limit raised, the header passes: the limit was the only reason. (The
    # pixel data these files would need is missing: reading it refuses them.)
    info = inspect_image(data, "headers", max_pixels=width * height)
    assert (info.width, info.height) == (width, height)
    if name.startswith("png"):  # no decode attempted: the image data is simply too short
        assert _reason(data, "structure", max_pixels=width * height) == "corrupt_png"


@pytest.mark.unit
def test_a_bomb_becomes_a_dead_letter_too_many_pixels():
    ref = ImageRef("train", "k", "a/bomb.png", "/in/a/bomb.png", 100, 0, "a")
    letter = ImageRecordBuilder("structure").example(ref, _png_bomb(65535, 65535))
    assert isinstance(letter, DeadLetter)
    assert (letter.stage, letter.error) == ("validate", "too_many_pixels")
    assert "65535x65535" in letter.message


@pytest.mark.unit
def test_pillows_process_wide_limit_is_left_alone():
    before = Image.MAX_IMAGE_PIXELS
    for build, _, _ in BOMBS.values():
        data = build()
        for validate in VALIDATE_MODES:
            _reason(data, validate)
    assert Image.MAX_IMAGE_PIXELS == before


@pytest.mark.unit
@pytest.mark.parametrize("validate", VALIDATE_MODES)
def test_our_limit_decides_not_pillows(monkeypatch, validate):
    """Pillow's process-wide limit is not applied; where a plugin applies it anyway
    (a GIF frame larger than its screen, a TIFF load) it is raised just enough, never
    lowered."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow refuses > 2000 pixels
    gif = bytearray(SMALL_IMAGES["gif"]())
    gif[6:10] = struct.pack("<HH", 10, 5)  # the frame (100 x 100) grows the screen
    files = [bytes(gif), SMALL_IMAGES["tiff"](), SMALL_IMAGES["png"](), SMALL_IMAGES["jpeg"]()]
    for data in files:
        with pytest.raises(Image.DecompressionBombError):
            with Image.open(io.BytesIO(data)) as im:
                im.load()
    for data in files:
        assert inspect_image(data, validate).width == 100
        assert _reason(data, validate, max_pixels=9999) == "too_many_pixels"
    assert Image.MAX_IMAGE_PIXELS in ((1000,) if validate == "headers" else (5000,))
    inspect_image(_encode(_picture(10, 10).convert("P"), "GIF"), validate)
    assert Image.MAX_IMAGE_PIXELS in ((1000,) if validate == "headers" else (5000,))


SMALL_IMAGES = {  # 100 x 100 = 10,000 pixels
    "jpeg": lambda: _encode(_picture(), "JPEG"),
    "jpeg-progressive": lambda: _encode(_picture(), "JPEG", progressive=True),
    "png": lambda: _encode(_picture(), "PNG"),
    "png-interlaced": lambda: _encode(_picture(), "PNG", interlace=1),
    "gif": lambda: _encode(_picture().convert("P"), "GIF"),
    "bmp": lambda: _encode(_picture(), "BMP"),
    "webp": lambda: _encode(_picture(), "WEBP"),
    "tiff": lambda: _encode(_picture(), "TIFF"),
}


@pytest.mark.unit
@pytest.mark.parametrize("validate", VALIDATE_MODES)
@pytest.mark.parametrize("name", sorted(SMALL_IMAGES))
def test_the_limit_is_the_flag(name, validate):
    data = SMALL_IMAGES[name]()
    assert _reason(data, validate, max_pixels=5000) == "too_many_pixels"
    assert _reason(data, validate, max_pixels=9999) == "too_many_pixels"
    assert inspect_image(data, validate, max_pixels=10_000).width == 100
    assert inspect_image(data, validate, max_pixels=20_000).width == 100


@pytest.mark.unit
def test_a_valid_image_over_the_default_limit_passes_when_it_is_raised():
    # 12000 x 12000 one-bit PNG: 144 M pixels, 18 MB of rows, ~18 KB of file.
    width = height = 12_000
    data = _png(width, height, 1, 0, _png_rows(width, height, 1, 0))
    assert len(data) < 100_000
    for validate in VALIDATE_MODES:
        assert _reason(data, validate) == "too_many_pixels"
    for validate in ("headers", "structure"):
        assert inspect_image(data, validate, max_pixels=1 << 28) == ImageInfo("png", height, width, 1)


@pytest.mark.unit
@pytest.mark.parametrize("max_pixels", [0, -1, 1.5, "100", None, True])
def test_max_pixels_must_be_a_positive_integer(max_pixels):
    with pytest.raises(ValueError, match="max_pixels must be a positive integer") as excinfo:
        inspect_image(SMALL_IMAGES["png"](), "structure", max_pixels)
    assert not isinstance(excinfo.value, ImageError)
    with pytest.raises(ValueError, match="--max_pixels must be a positive whole number"):
        ConvertConfig(input="in", output="out", max_pixels=max_pixels)


@pytest.mark.unit
def test_max_pixels_flag_reaches_the_config():
    parser = convert_parser()
    defaults = config_from_args(parser.parse_args(["--input", "in", "--output", "out"]))
    assert (defaults.validate, defaults.max_pixels) == ("structure", DEFAULT_MAX_PIXELS)
    assert DEFAULT_MAX_PIXELS == 1 << 27
    raised = config_from_args(parser.parse_args(
        ["--input", "in", "--output", "out", "--max_pixels", "500000000", "--validate", "headers"]))
    assert (raised.validate, raised.max_pixels) == ("headers", 500_000_000)
    assert raised.to_json()["max_pixels"] == 500_000_000


# --- the default mode's PNG stream check, against Pillow --------------------------------------

PNG_LAYOUTS = [  # (width, height, bit depth, colour type, interlace)
    (7, 5, 8, 2, 0), (7, 5, 8, 2, 1), (1, 1, 1, 0, 1), (13, 9, 1, 0, 0), (13, 9, 2, 3, 1),
    (3, 17, 16, 6, 1), (100, 3, 4, 0, 0), (2, 2, 16, 4, 1), (9, 9, 8, 3, 0),
]
_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def _png_variants(width, height, depth, colour, interlace):
    """name → (file, should the default mode accept it)."""
    rows = _png_rows(width, height, depth * _SAMPLES[colour], interlace)
    bad_filter = bytearray(rows)
    bad_filter[len(rows) - (width * depth * _SAMPLES[colour] + 7) // 8 - 1] = 5  # the last row's
    z = zlib.compress(rows)
    return {
        "exact": (_png(width, height, depth, colour, rows, interlace), True),
        "one byte short": (_png(width, height, depth, colour, rows[:-1], interlace), False),
        "extra data": (_png(width, height, depth, colour, rows + bytes(50), interlace), True),
        "bad filter type": (_png(width, height, depth, colour, bytes(bad_filter), interlace), False),
        "idat split by a chunk": (_png(width, height, depth, colour, rows, interlace, len(z) // 2), None),
        "bad zlib checksum": (_png(width, height, depth, colour, b"", interlace,
                                   z=z[:-4] + bytes(a ^ 0xFF for a in z[-4:])), False),
    }


@pytest.mark.unit
@pytest.mark.parametrize("layout", PNG_LAYOUTS, ids=lambda t: "{}x{} d{} c{} i{}".format(*t))
def test_png_stream_check_refuses_what_pillow_cannot_decode(layout):
    for name, (data, accept) in _png_variants(*layout).items():
        decodes = _pillow_decodes(data)
        assert _reason(data, "headers") is None, name  # every CRC is valid
        structure = _reason(data, "structure")
        if not decodes:
            assert structure == "corrupt_png", (name, structure)
        if accept is not None:
            assert (structure is None) == accept, (name, structure)
        assert (structure is None) == (_reason(data, "decode") is None) or name == "bad zlib checksum"


@pytest.mark.unit
def test_png_stream_check_messages():
    rows = _png_rows(7, 5, 24, 0)
    with pytest.raises(ImageError, match=r"holds 109 bytes when decompressed, but a 7x5 image needs 110"):
        inspect_image(_png(7, 5, 8, 2, rows[:-1]))
    bad = bytearray(rows)
    bad[22] = 9
    with pytest.raises(ImageError, match=r"invalid row filter type 9 at decompressed byte 22"):
        inspect_image(_png(7, 5, 8, 2, bytes(bad)))


@pytest.mark.unit
def test_png_stream_check_reads_a_big_image_in_bounded_pieces():
    # 4000 x 3000 RGBA, 48 MB of rows, in many small IDAT chunks; one damaged row filter at the end.
    width, height = 4000, 3000
    rows = bytearray(_png_rows(width, height, 32, 0))
    z = zlib.compress(bytes(rows), 1)
    idat = b"".join(_png_chunk(b"IDAT", z[i:i + 8192]) for i in range(0, len(z), 8192))
    head = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
    assert inspect_image(head + idat + _png_chunk(b"IEND", b"")) == ImageInfo("png", height, width, 4)
    rows[(height - 1) * (1 + 4 * width)] = 7
    z = zlib.compress(bytes(rows), 1)
    with pytest.raises(ImageError, match="invalid row filter type 7") as excinfo:
        inspect_image(head + _png_chunk(b"IDAT", z) + _png_chunk(b"IEND", b""))
    assert excinfo.value.reason == "corrupt_png"


# --- a seeded fuzz set: nothing a full decode rejects gets past the default mode --------------

_SIZES = [(64, 48), (160, 120), (200, 150), (97, 131), (320, 240), (33, 17)]


def _fuzz_sources(fmt):
    rng = np.random.default_rng(0)
    sources = []
    for i, (width, height) in enumerate(_SIZES):
        picture = render_image(CLASSES[i % len(CLASSES)], width, height, rng)
        if fmt == "JPEG":
            sources.append(_encode(picture, "JPEG", quality=70 + 5 * i, progressive=i % 3 == 2))
        else:
            sources.append(_encode(picture.convert("RGBA" if i % 2 else "RGB"), "PNG",
                                   interlace=int(i % 3 == 2)))
    return sources


def _mutants(fmt, count=300, seed=1234):
    """Byte-mutated copies: 1-8 random bytes changed after the signature, or a cut; for
    PNG half of them also get every CRC recomputed, so that the damage reaches the
    compressed data instead of stopping at a CRC check."""
    rng = random.Random(seed)
    sources, skip = _fuzz_sources(fmt), (2 if fmt == "JPEG" else 8)
    mutants = []
    for i in range(count):
        data = bytearray(sources[i % len(sources)])
        if rng.random() < 0.1:
            mutants.append(bytes(data[:rng.randrange(skip, len(data))]))
            continue
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(skip, len(data))] = rng.randrange(256)
        data = bytes(data)
        if fmt == "PNG" and rng.random() < 0.5:
            data = _fix_png_crcs(data)
        mutants.append(data)
    return mutants


def _outcome(data, validate):
    try:
        inspect_image(data, validate)
    except ImageError as err:
        return str(err)
    return None


def _fuzz_counts(fmt):
    """Counts per mode, and each mode's outcome (None: accepted) per mutant."""
    mutants = _mutants(fmt)
    decodes = [_pillow_decodes(m) for m in mutants]
    counts = {"mutants": len(mutants), "full decode rejects": decodes.count(False)}
    outcomes = {}
    for validate in VALIDATE_MODES:
        outcomes[validate] = found = [_outcome(m, validate) for m in mutants]
        counts[validate] = {
            "accepted": found.count(None),
            "accepted, full decode rejects": sum(o is None and not d for o, d in zip(found, decodes)),
            "refused, full decode accepts": sum(o is not None and d for o, d in zip(found, decodes)),
        }
    return counts, decodes, outcomes


@pytest.mark.unit
@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_fuzzed_files_that_a_full_decode_rejects_never_pass_the_default(fmt):
    counts, decodes, outcomes = _fuzz_counts(fmt)
    print(fmt, json.dumps(counts))  # pytest -s shows the counts per mode
    assert counts["full decode rejects"] > 20  # the set exercises the checks...
    assert counts["headers"]["accepted, full decode rejects"] > 0  # ...beyond the headers
    assert counts["structure"]["accepted, full decode rejects"] == 0  # the point
    assert counts["decode"]["accepted, full decode rejects"] == 0
    for i, decoded in enumerate(decodes):
        headers, structure, decode = (outcomes[v][i] for v in ("headers", "structure", "decode"))
        # Modes nest: what a stricter mode accepts, a laxer one accepts too.
        assert headers is None or structure is not None, i
        assert structure is None or decode is not None, i
        # Files Pillow decodes are refused only by the header checks (a CRC, a size over
        # the limit), or, for PNG, by the zlib checksum of damaged pixel data, which
        # Pillow does not read.
        if decoded and structure is not None:
            assert headers is not None or "incorrect data check" in structure, (i, structure)


@pytest.mark.unit
def test_fuzz_set_is_reproducible():
    assert _mutants("PNG", 5) == _mutants("PNG", 5)
    assert _mutants("JPEG", 5) == _mutants("JPEG", 5)


# --- through a whole conversion ----------------------------------------------------------------



@pytest.mark.e2e
def test_conversion_dead_letters_bombs_and_honours_max_pixels(tmp_path, run_convert):
    root = tmp_path / "in"
    make_class_folder_sample(str(root), per_class=2, splits=None, formats=("png",))
    (root / "circles" / "bomb.png").write_bytes(_png_bomb(65535, 65535))
    (root / "circles" / "bomb.jpg").write_bytes(_jpeg_bomb(65535, 65535))
    result = run_convert(str(root), str(tmp_path / "out"), max_bad_fraction=0.5)
    assert result.ok and result.report.records == 8
    assert result.report.bad_records == {"too_many_pixels": 2}
    letters = dead_letters(str(tmp_path / "out"))
    assert sorted(os.path.basename(d["source"]) for d in letters) == ["bomb.jpg", "bomb.png"]
    assert all("--max_pixels" in d["message"] for d in letters)
    # A limit below the smallest sample image (64 x 64): every image refused.
    low = run_convert(str(root), str(tmp_path / "low"), max_bad_fraction=1.0, max_pixels=64 * 64 - 1)
    assert low.report.records == 0
    assert low.report.bad_records == {"too_many_pixels": 10}
