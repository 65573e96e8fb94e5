"""Fast image sniffing, header reading and validation.

Every input file goes through :func:`inspect_image`, so it is written for
speed: JPEG, PNG and GIF headers are parsed here with ``struct`` straight from
the bytes (no decode, no copy of the data); BMP, WEBP and TIFF headers are read
through Pillow. The format is always taken from the content, never from the
file name. Pure Python: no Beam import.
"""

from __future__ import annotations

import io
import posixpath
import struct
import zlib
from dataclasses import dataclass

from PIL import Image

from beam_tfrecords.schemas.config import VALIDATE_MODES

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageError",
    "ImageInfo",
    "inspect_image",
    "is_image_filename",
]

IMAGE_EXTENSIONS: frozenset[str] = frozenset(
    {".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"}
)


# Exceptions Pillow raises for bad content, on open or on load. Image.open turns
# plugin SyntaxError/IndexError/TypeError/struct.error into UnidentifiedImageError
# (an OSError); the rest can escape from open() or load().
_PIL_ERRORS = (
    OSError,
    SyntaxError,
    ValueError,
    EOFError,
    IndexError,
    TypeError,
    KeyError,
    struct.error,
)

_U16BE = struct.Struct(">H").unpack_from
_U32BE = struct.Struct(">I").unpack_from
_U32LE = struct.Struct("<I").unpack_from
_JPEG_SOF = struct.Struct(">BHHB").unpack_from  # precision, height, width, components
_PNG_CHUNK_HEAD = struct.Struct(">I4s").unpack_from  # length, type
_PNG_IHDR = struct.Struct(">IIBBBBB").unpack_from
_GIF_SCREEN = struct.Struct("<HHB").unpack_from  # width, height, flags
_GIF_IMAGE = struct.Struct("<HHHH").unpack_from  # left, top, width, height

# SOF0..SOF15, minus DHT (C4), JPG (C8) and DAC (CC) which share the range.
_JPEG_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_EOI = b"\xff\xd9"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# Bit depths the PNG spec allows for each colour type.
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # colour type 3 depends on tRNS
_BMP_HEADER_SIZES = frozenset({12, 40, 52, 56, 64, 108, 124})  # those Pillow reads
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF

# Channel count per Pillow mode (palette mode P is decided by its transparency).
# RGBX is RGB plus a padding byte, so 3.
_MODE_CHANNELS = {
    "1": 1, "L": 1, "I": 1, "F": 1,
    "I;16": 1, "I;16L": 1, "I;16B": 1, "I;16N": 1,
    "LA": 2, "La": 2,
    "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBX": 3,
    "RGBA": 4, "RGBa": 4, "CMYK": 4, "PA": 4,
}  # fmt: skip


class ImageError(ValueError):
    """Bad image content.

    Args:
        reason: Short snake_case code (see ``reason`` below).
        message: What is wrong, in plain words.

    Attributes:
        reason: Short snake_case code, one of ``empty_file``, ``not_an_image``,
            ``truncated_jpeg``, ``corrupt_jpeg``, ``truncated_png``,
            ``corrupt_png``, ``truncated_gif``, ``corrupt_gif``,
            ``corrupt_image`` (BMP, WEBP, TIFF) and ``decode_error``.
        message: Human-readable description of what is wrong.
    """

    def __init__(self, reason: str, message: str) -> None:
        # Both go to args so the exception survives pickling (Beam moves errors
        # between processes).
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the header says about an image.

    Attributes:
        format: ``jpeg``, ``png``, ``gif``, ``bmp``, ``webp`` or ``tiff``, from
            the content (magic bytes), not from the file name.
        height: Height in pixels.
        width: Width in pixels.
        channels: True channel count: 1 grey, 2 grey+alpha, 3 colour,
            4 colour+alpha or CMYK; palette images count 4 when they carry
            transparency, else 3.
    """

    format: str
    height: int
    width: int
    channels: int


def is_image_filename(name: str) -> bool:
    """Tells whether a file name has an image extension.

    Args:
        name: File name or path (local or URL-like, ``/``-separated).

    Returns:
        True when the extension, compared case-insensitively, is in
        :data:`IMAGE_EXTENSIONS`. Dot-files such as ``.DS_Store`` have no
        extension and give False.
    """
    return posixpath.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def inspect_image(data: bytes, validate: str = "structure") -> ImageInfo:
    """Identifies an image from its content, reads its header and validates it.

    Dimensions always come from the header. ``'structure'`` checks the container
    without decoding pixels (markers and end of image for JPEG, every chunk's
    length and CRC for PNG, the trailer for GIF, Pillow's header parse plus the
    declared file size for BMP/WEBP/TIFF). ``'decode'`` does all of that and
    then a full Pillow decode of the first frame.

    Args:
        data: The whole file content (bytes, bytearray or memoryview).
        validate: One of :data:`VALIDATE_MODES`.

    Returns:
        The format, height, width and channel count.

    Raises:
        ImageError: The content is empty, not a supported image, or damaged;
            ``reason`` says which.
        ValueError: ``validate`` is not one of :data:`VALIDATE_MODES`.
        TypeError: ``data`` is not bytes-like.
    """
    if validate not in VALIDATE_MODES:
        raise ValueError(
            f"validate must be one of {', '.join(map(repr, VALIDATE_MODES))}; "
            f"got {validate!r}"
        )
    if not isinstance(data, (bytes, bytearray)):
        if not isinstance(data, memoryview):
            raise TypeError(f"data must be bytes-like, not {type(data).__name__}")
        data = data.tobytes()
    n = len(data)
    if not n:
        raise ImageError("empty_file", "file is empty (0 bytes)")

    if data.startswith(b"\xff\xd8"):
        fmt = "jpeg"
        info = _inspect_jpeg(data, n)
    elif data.startswith(b"\x89PNG"):
        fmt = "png"
        info = _inspect_png(data, n)
    elif data.startswith(b"GIF8"):
        fmt = "gif"
        info = _inspect_gif(data, n)
    elif data.startswith(b"BM") and n >= 18 and _U32LE(data, 14)[0] in _BMP_HEADER_SIZES:
        return _inspect_with_pillow(data, n, "bmp", validate == "decode")
    elif data.startswith(b"RIFF") and data.startswith(b"WEBP", 8):
        return _inspect_with_pillow(data, n, "webp", validate == "decode")
    elif data.startswith(_TIFF_MAGICS):
        return _inspect_with_pillow(data, n, "tiff", validate == "decode")
    else:
        raise ImageError("not_an_image", _describe_unknown(data))

    if validate == "decode":
        _decode_with_pillow(data, fmt)
    return info


def _inspect_jpeg(data: bytes, n: int) -> ImageInfo:
    """Walks the JPEG markers from SOI to the first SOS and checks the end."""
    pos = 2
    sof = None
    while True:
        if pos + 1 >= n:
            raise ImageError("truncated_jpeg", "JPEG ends before the start of scan (SOS)")
        if data[pos] != 0xFF:
            raise ImageError(
                "corrupt_jpeg",
                f"JPEG marker structure is broken: expected a marker (0xFF) at byte "
                f"{pos}, found 0x{data[pos]:02X}",
            )
        marker = data[pos + 1]
        while marker == 0xFF:  # fill bytes before a marker are allowed
            pos += 1
            if pos + 1 >= n:
                raise ImageError("truncated_jpeg", "JPEG ends inside a marker")
            marker = data[pos + 1]
        pos += 2
        if marker == 0xDA:  # SOS: entropy-coded data follows
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # RSTn, TEM: no length
            continue
        if marker in (0x00, 0xD8, 0xD9):
            name = {0x00: "a stuffed 0xFF00", 0xD8: "a second SOI", 0xD9: "EOI"}[marker]
            raise ImageError(
                "corrupt_jpeg",
                f"JPEG marker structure is broken: {name} at byte {pos - 2}, before any scan",
            )
        if pos + 2 > n:
            raise ImageError("truncated_jpeg", "JPEG ends inside a marker segment")
        length = _U16BE(data, pos)[0]
        if length < 2:
            raise ImageError(
                "corrupt_jpeg",
                f"JPEG segment 0xFF{marker:02X} at byte {pos - 2} has invalid length {length}",
            )
        end = pos + length
        if end > n:
            raise ImageError(
                "truncated_jpeg",
                f"JPEG segment 0xFF{marker:02X} at byte {pos - 2} runs past the end of "
                "the data: file is truncated",
            )
        if sof is None and marker in _JPEG_SOF_MARKERS:
            if length < 8:
                raise ImageError(
                    "corrupt_jpeg", f"JPEG frame header (SOF) is too short ({length} bytes)"
                )
            sof = _JPEG_SOF(data, pos + 2)
            if length < 8 + 3 * sof[3]:
                raise ImageError(
                    "corrupt_jpeg",
                    f"JPEG frame header (SOF) is too short for {sof[3]} components",
                )
        pos = end

    if sof is None:
        raise ImageError("corrupt_jpeg", "JPEG has no frame header (SOF) before its first scan")
    _, height, width, components = sof
    if not height or not width:
        raise ImageError("corrupt_jpeg", f"JPEG frame header gives an empty size {width}x{height}")
    if components not in (1, 3, 4):
        raise ImageError(
            "corrupt_jpeg",
            f"JPEG has {components} colour components; only 1, 3 or 4 can be decoded",
        )
    # The end: normally the last two bytes. Otherwise accept an EOI anywhere after
    # the first SOS (FFD9 cannot occur inside entropy-coded data): that covers zero
    # padding and data appended after the image (phone "motion photos", Samsung
    # trailers), which every decoder ignores. rfind: padding is found at once.
    if not data.endswith(_JPEG_EOI) and data.rfind(_JPEG_EOI, pos) < 0:
        raise ImageError(
            "truncated_jpeg", "JPEG has no end-of-image marker (FFD9): file is truncated"
        )
    return ImageInfo("jpeg", height, width, components)


def _inspect_png(data: bytes, n: int) -> ImageInfo:
    """Checks every PNG chunk (bounds, CRC, order) and reads IHDR."""
    if n < 8:
        raise ImageError("truncated_png", f"PNG is only {n} bytes long: file is truncated")
    if not data.startswith(_PNG_SIGNATURE):
        raise ImageError(
            "corrupt_png",
            "PNG signature is damaged (typically line endings rewritten by a text-mode transfer)",
        )
    view = memoryview(data)
    crc32 = zlib.crc32
    chunk_head = _PNG_CHUNK_HEAD
    u32 = _U32BE
    pos = 8
    ihdr = None
    has_trns = has_plte = has_idat = False
    while True:
        if pos + 12 > n:
            if pos == n:
                raise ImageError("truncated_png", "PNG has no IEND chunk: file is truncated")
            raise ImageError(
                "truncated_png", f"PNG ends inside a chunk header at byte {pos}: file is truncated"
            )
        length, ctype = chunk_head(data, pos)
        end = pos + 12 + length
        if end > n:
            raise ImageError(
                "truncated_png",
                f"PNG chunk {_chunk_name(ctype)} at byte {pos} declares {length} bytes but "
                f"only {n - pos - 12} remain: file is truncated",
            )
        if crc32(view[pos + 4 : end - 4]) != u32(data, end - 4)[0]:
            raise ImageError(
                "corrupt_png",
                f"PNG chunk {_chunk_name(ctype)} at byte {pos} fails its CRC check: "
                "data is damaged",
            )
        if ihdr is None:
            if ctype != b"IHDR" or length != 13:
                raise ImageError(
                    "corrupt_png",
                    f"PNG does not start with an IHDR chunk (found {_chunk_name(ctype)})",
                )
            ihdr = _PNG_IHDR(data, pos + 8)
        elif ctype == b"IDAT":
            has_idat = True
        elif ctype == b"IEND":
            if end != n:
                raise ImageError(
                    "corrupt_png", f"PNG has {n - end} bytes of extra data after the IEND chunk"
                )
            break
        elif ctype == b"tRNS":
            has_trns = True
        elif ctype == b"PLTE":
            has_plte = True
        elif ctype == b"IHDR":
            raise ImageError("corrupt_png", "PNG has a second IHDR chunk")
        pos = end

    width, height, depth, colour, compression, filter_method, interlace = ihdr
    if not width or not height or width > 0x7FFFFFFF or height > 0x7FFFFFFF:
        raise ImageError("corrupt_png", f"PNG header gives an invalid size {width}x{height}")
    if depth not in _PNG_DEPTHS.get(colour, ()):
        raise ImageError(
            "corrupt_png", f"PNG header has an invalid colour type {colour} / bit depth {depth}"
        )
    if compression or filter_method or interlace > 1:
        raise ImageError(
            "corrupt_png", "PNG header has an unknown compression, filter or interlace method"
        )
    if not has_idat:
        raise ImageError("corrupt_png", "PNG has no image data (IDAT chunk)")
    if colour == 3:
        if not has_plte:
            raise ImageError("corrupt_png", "palette PNG has no palette (PLTE chunk)")
        channels = 4 if has_trns else 3
    else:
        channels = _PNG_CHANNELS[colour]
    return ImageInfo("png", height, width, channels)


def _chunk_name(ctype: bytes) -> str:
    """Printable name of a PNG chunk type."""
    return repr(ctype.decode("latin-1")) if ctype.isalpha() else repr(ctype)


def _inspect_gif(data: bytes, n: int) -> ImageInfo:
    """Reads the GIF screen, blocks up to the first image, and checks the trailer."""
    if n < 13:
        raise ImageError("truncated_gif", f"GIF is only {n} bytes long: file is truncated")
    if data[4] not in b"79" or data[5] != 0x61:  # GIF87a / GIF89a
        raise ImageError("corrupt_gif", f"GIF has an unknown version {bytes(data[:6])!r}")
    width, height, flags = _GIF_SCREEN(data, 6)
    pos = 13
    if flags & 0x80:  # global colour table
        pos += 3 << ((flags & 7) + 1)
    transparent = None
    while True:
        if pos >= n:
            raise ImageError("truncated_gif", "GIF ends before its first image: file is truncated")
        block = data[pos]
        if block == 0x2C:  # image descriptor
            if pos + 10 > n:
                raise ImageError("truncated_gif", "GIF ends inside an image descriptor")
            left, top, frame_width, frame_height = _GIF_IMAGE(data, pos + 1)
            break
        if block == 0x21:  # extension: label, then sub-blocks until a 0 size
            if pos + 2 >= n:
                raise ImageError("truncated_gif", "GIF ends inside an extension block")
            label = data[pos + 1]
            pos += 2
            if label == 0xF9 and transparent is None and pos + 1 < n and data[pos] >= 2:
                transparent = bool(data[pos + 1] & 1)  # Graphic Control Extension
            while True:
                if pos >= n:
                    raise ImageError("truncated_gif", "GIF ends inside an extension block")
                size = data[pos]
                pos += 1 + size
                if not size:
                    break
        elif block == 0x3B:
            raise ImageError("corrupt_gif", "GIF has no image (trailer before any image)")
        else:
            raise ImageError(
                "corrupt_gif",
                f"GIF block structure is broken: unknown block 0x{block:02X} at byte {pos}",
            )
    # Like Pillow, grow the logical screen to fit the first frame.
    width = max(width, left + frame_width)
    height = max(height, top + frame_height)
    if not width or not height:
        raise ImageError("corrupt_gif", f"GIF has an empty size {width}x{height}")
    if data[n - 1] != 0x3B:
        raise ImageError(
            "truncated_gif", "GIF does not end with its trailer byte (0x3B): file is truncated"
        )
    return ImageInfo("gif", height, width, 4 if transparent else 3)


def _inspect_with_pillow(data: bytes, n: int, fmt: str, decode: bool) -> ImageInfo:
    """Reads a BMP/WEBP/TIFF header with Pillow; in decode mode also loads pixels."""
    if fmt == "bmp":
        declared = _U32LE(data, 2)[0]  # bfSize; some writers leave it 0
        if declared > n:
            raise ImageError(
                "corrupt_image",
                f"BMP header declares {declared} bytes but the file has {n}: file is truncated",
            )
    elif fmt == "webp":
        declared = _U32LE(data, 4)[0] + 8  # RIFF size counts from byte 8
        if declared > n or declared < 12:
            raise ImageError(
                "corrupt_image",
                f"WEBP RIFF header declares {declared} bytes but the file has {n}"
                + (": file is truncated" if declared > n else ""),
            )
    label = fmt.upper()
    try:
        im = Image.open(io.BytesIO(data), formats=(label,))
    except Image.DecompressionBombError as exc:
        raise _too_large(label, exc) from exc
    except Image.UnidentifiedImageError as exc:  # its text only names the BytesIO
        raise ImageError("corrupt_image", f"{label} header cannot be parsed by Pillow") from exc
    except _PIL_ERRORS as exc:
        raise ImageError("corrupt_image", f"{label} header cannot be read: {exc}") from exc
    with im:
        width, height = im.size
        mode = im.mode
        if mode == "P":
            channels = 4 if "transparency" in im.info else 3
        else:
            channels = _MODE_CHANNELS.get(mode) or len(Image.getmodebands(mode))
        if decode:
            try:
                im.load()
            except Image.DecompressionBombError as exc:
                raise _too_large(label, exc) from exc
            except _PIL_ERRORS as exc:
                raise _undecodable(label, exc) from exc
    if not width or not height:
        raise ImageError("corrupt_image", f"{label} has an empty size {width}x{height}")
    return ImageInfo(fmt, height, width, channels)


def _decode_with_pillow(data: bytes, fmt: str) -> None:
    """Fully decodes the first frame; any failure is an ImageError('decode_error').

    Relies on Pillow's default ``ImageFile.LOAD_TRUNCATED_IMAGES = False``.
    """
    label = fmt.upper()
    try:
        with Image.open(io.BytesIO(data), formats=(label,)) as im:
            im.load()
    except Image.DecompressionBombError as exc:
        raise _too_large(label, exc) from exc
    except _PIL_ERRORS as exc:
        raise _undecodable(label, exc) from exc


def _too_large(label: str, exc: Exception) -> ImageError:
    """decode_error for an image over Pillow's decompression-bomb limit."""
    return ImageError("decode_error", f"{label} is too large to decode safely: {exc}")


def _undecodable(label: str, exc: Exception) -> ImageError:
    """decode_error for pixel data Pillow fails to decode."""
    return ImageError("decode_error", f"{label} pixel data cannot be decoded: {exc}")


def _describe_unknown(data: bytes) -> str:
    """Message for content that matches no supported image signature."""
    head = bytes(data[:16])
    if data[4:8] == b"ftyp":
        kind = "an ISO media file (HEIC/AVIF/MP4), which is not supported"
    elif all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        kind = "text"
    else:
        kind = "not a JPEG, PNG, GIF, BMP, WEBP or TIFF image"
    return f"content is {kind} (starts with {head[:8]!r})"
