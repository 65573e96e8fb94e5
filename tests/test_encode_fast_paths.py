"""The per-file encoding's fast paths (issue 23, ENC) give what the general code gives.

A small PNG's stream is checked in one ``decompress`` call (one IDAT chunk): the same
image split over two IDAT chunks takes the general loop, so both must accept and
refuse the same images with the same reason and message. The usual image record's
entries come from cached heads: its bytes must equal ``encode_example``'s (the
general encoder, itself held to protobuf's output). ``frame_parts`` caches record
heads by size: its pieces must join to ``frame_record``'s bytes, for the first and
the second record of a size, small and large.
"""

import struct
import zlib

import pytest

from beam_tfrecords.transforms.codec.example import encode_example
from beam_tfrecords.transforms.codec.image_example import image_example_parts
from beam_tfrecords.transforms.codec.image_headers import ImageError, check_png_stream
from beam_tfrecords.transforms.codec.image_inspection import inspect_image
from beam_tfrecords.transforms.codec.tfrecord import frame_parts, frame_record

pytestmark = pytest.mark.unit

WIDTH, HEIGHT = 5, 4
ROW = 1 + 3 * WIDTH


def _chunk(ctype: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + ctype + payload + struct.pack(">I", zlib.crc32(ctype + payload))


def _png(stream: bytes, split: bool) -> bytes:
    """An 8-bit RGB WIDTH x HEIGHT PNG whose IDAT data is ``stream``, in one chunk
    or (``split``) two."""
    ihdr = struct.pack(">IIBBBBB", WIDTH, HEIGHT, 8, 2, 0, 0, 0)
    half = len(stream) // 2
    idat = (_chunk(b"IDAT", stream[:half]) + _chunk(b"IDAT", stream[half:]) if split
            else _chunk(b"IDAT", stream))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + idat + _chunk(b"IEND", b"")


def _rows(filters=(0, 1, 2, 4)) -> bytes:
    return b"".join(bytes([f]) + bytes(range(i, i + 3 * WIDTH)) for i, f in enumerate(filters))


def _streams() -> dict[str, bytes]:
    good = zlib.compress(_rows())
    return {
        "good": good,
        "bad_filter": zlib.compress(_rows((0, 1, 7, 0))),
        "short": zlib.compress(_rows()[: 2 * ROW + 3]),
        "bad_adler": good[:-1] + bytes([good[-1] ^ 1]),
        "flipped": good[:6] + bytes([good[6] ^ 0x40]) + good[7:],
        "cut": good[: len(good) // 2],
        "empty": b"",
        "garbage": b"\x00\x01garbage",
    }


def _outcome(data: bytes) -> tuple[str, str]:
    try:
        info = inspect_image(data)
    except ImageError as err:
        return err.reason, err.message
    return "ok", f"{info.width}x{info.height}"


@pytest.mark.parametrize("name", sorted(_streams()))
def test_one_idat_chunk_is_checked_as_two_are(name):
    stream = _streams()[name]
    one, two = _outcome(_png(stream, split=False)), _outcome(_png(stream, split=True))
    assert one == two
    assert (one[0] == "ok") == (name == "good")


def test_the_fast_path_refuses_what_it_must():
    """Direct: a bad filter byte, data missing, a damaged stream (each a corrupt_png)."""
    ihdr = (WIDTH, HEIGHT, 8, 2, 0, 0, 0)
    streams = _streams()
    for name, says in (("bad_filter", "invalid row filter type 7 at decompressed byte 32"),
                       ("short", "holds 35 bytes when decompressed, but a 5x4 image needs 64"),
                       ("bad_adler", "the IDAT zlib stream) is damaged")):
        data = _png(streams[name], split=False)
        with pytest.raises(ImageError) as err:
            check_png_stream(data, ihdr, [(41, 41 + len(streams[name]))])
        assert err.value.reason == "corrupt_png" and says in err.value.message, name


@pytest.mark.parametrize("label_text", ["cat", "a much longer class name than thirty-two bytes"])
def test_the_usual_record_is_the_general_encoders(label_text):
    data = _png(_streams()["good"], split=False)
    info = inspect_image(data)
    for encoded in (data, data * 60):  # One-byte and two-byte length varints.
        for filename in ("a.png", "dir/" + "x" * 200 + ".png"):
            digest = "ab" * 32
            parts, size = image_example_parts(encoded, info, 3, label_text, filename, (), digest)
            general = encode_example([
                ("image/encoded", "string", (encoded,)), ("image/format", "string", ("png",)),
                ("image/height", "int64", (HEIGHT,)), ("image/width", "int64", (WIDTH,)),
                ("image/channels", "int64", (3,)), ("image/class/label", "int64", (3,)),
                ("image/class/text", "string", (label_text,)), ("image/filename", "string", (filename,)),
                ("image/key/sha256", "string", (digest,)),
            ])
            assert b"".join(parts) == general and size == len(general)


@pytest.mark.parametrize("size", [0, 1, 3000, 70_000])
def test_frame_parts_joins_to_frame_record(size):
    payload = bytes(i % 251 for i in range(size))
    pieces = [payload[: size // 3], payload[size // 3:]]
    for _ in range(2):  # The second record of a size takes the cached head.
        assert b"".join(frame_parts(pieces, size)) == frame_record(payload)
