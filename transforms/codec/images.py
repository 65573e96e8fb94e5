"""Fast image sniffing, header reading and validation.

Every input file goes through :func:`inspect_image`, so it is written for
speed: JPEG, PNG and GIF headers are parsed here with ``struct`` straight from
the bytes (no decode, no copy of the data); BMP, WEBP and TIFF headers are read
through Pillow. The format is always taken from the content, never from the
file name. Pure Python: no Beam import.

Validation modes (``VALIDATE_MODES``), each stricter than the one before:

* ``headers``: the container only (JPEG markers and end of image, every PNG
  chunk's length and CRC, the GIF blocks and trailer, Pillow's header parse of
  BMP/WEBP/TIFF). No compressed data is read.
* ``structure`` (the default): ``headers``, then the compressed stream is
  checked the way a decoder reads it, cheaply: a JPEG is decoded at 1/8 size
  (Pillow's ``draft``: every entropy-coded byte is still decoded, the inverse
  DCT is skipped), a PNG's IDAT stream is inflated and its length and row
  filter bytes checked (no unfiltering, nothing kept), GIF/BMP/WEBP/TIFF are
  decoded by Pillow (first frame). What a full decode rejects, this rejects.
* ``decode``: ``headers``, then a full Pillow decode of the first frame (PNG: after
  the stream check, which also catches a bad zlib checksum that Pillow, stopping
  at the last row, never reads).

In every mode the pixel count the header declares is checked against
``max_pixels`` before anything is decoded (reason ``too_many_pixels``), so a
few-byte file declaring 65535x65535 pixels is refused at once. That limit also
bounds the memory of checking one image, in proportion to its pixels (measured
on 8000x8000 = 64 M pixels): the PNG stream check holds about 1 MB whatever the
size; a baseline JPEG decoded at 1/8 size a few MB; a progressive JPEG ~6 bytes
a pixel even at 1/8 size (libjpeg buffers every coefficient of a multi-scan
image: up to 8 for CMYK); a full decode Pillow's image, up to 4 bytes a pixel
(plus the coefficients of a progressive JPEG: ~10). At the default 2**27 pixels
that is at most ~1.3 GB for the worst image in ``decode``, ~1 GB in
``structure``, per image being checked at a time. Pillow's own,
process-wide decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``) is not the
one applied: images are opened through the format plugins directly, after the
check here; it is only ever raised, never lowered, and only when an image
within ``max_pixels`` would trip it (see ``_allow_in_pillow``).
"""

from __future__ import annotations

import io
import posixpath
import re
import struct
import threading
import zlib
from dataclasses import dataclass

from PIL import (
    BmpImagePlugin,
    GifImagePlugin,
    Image,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    WebPImagePlugin,
)

from beam_tfrecords.schemas.config import DEFAULT_MAX_PIXELS, VALIDATE_MODES

__all__ = [
    "IMAGE_EXTENSIONS",
    "ImageError",
    "ImageInfo",
    "decode_first_frame",
    "describe_content",
    "inspect_image",
    "is_image_filename",
    "quiet_message",
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

# Each format's Pillow class, used instead of Image.open: Image.open applies Pillow's
# process-wide decompression-bomb limit, and ours (max_pixels) must be the one that
# decides. Constructing the class reads the header only.
_PLUGINS = {
    "jpeg": JpegImagePlugin.JpegImageFile,
    "png": PngImagePlugin.PngImageFile,
    "gif": GifImagePlugin.GifImageFile,
    "bmp": BmpImagePlugin.BmpImageFile,
    "webp": WebPImagePlugin.WebPImageFile,
    "tiff": TiffImagePlugin.TiffImageFile,
}
_pillow_limit_lock = threading.Lock()

# PNG: samples a pixel as stored (palette: one index), and the Adam7 passes
# (x0, y0, dx, dy).
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
_INFLATE_IN = 1 << 16  # compressed bytes handed to zlib at a time
_INFLATE_OUT = 1 << 20  # most decompressed bytes held at a time


class ImageError(ValueError):
    """Bad image content.

    Args:
        reason: Short snake_case code (see ``reason`` below).
        message: What is wrong, in plain words.

    Attributes:
        reason: Short snake_case code, one of ``empty_file``, ``not_an_image``,
            ``truncated_jpeg``, ``corrupt_jpeg``, ``truncated_png``,
            ``corrupt_png``, ``truncated_gif``, ``corrupt_gif``,
            ``corrupt_image`` (BMP, WEBP, TIFF), ``too_many_pixels`` (the
            header declares more pixels than ``max_pixels``) and
            ``decode_error`` (Pillow cannot decode the pixel data).
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
        channels: The channel count ``tf.io.decode_image`` gives: 1 grey,
            2 grey+alpha, 3 colour, 4 colour+alpha (or CMYK); palette PNGs
            count 4 when they carry transparency, else 3; GIFs 3 (TensorFlow
            decodes them to RGB).
        bit_depth: Bits per sample (16 for 16-bit PNGs, which TensorFlow decodes
            to ``uint16`` when asked; 8 otherwise).
        unreadable: Why ``tf.io.decode_image`` cannot read the bytes as stored
            (``tiff``, ``webp``, ``cmyk_jpeg``, ``jpeg_12_bit``,
            ``jpeg_uncommon_coding``, ``bmp_not_24_bit``); '' when it can.
    """

    format: str
    height: int
    width: int
    channels: int
    bit_depth: int = 8
    unreadable: str = ""

    @property
    def mode(self) -> str:
        """The channel layout ``tf.io.decode_image`` gives, named as Pillow names
        modes: ``L``, ``LA``, ``RGB``, ``RGBA`` (4 channels: CMYK too), with ``16``
        appended for 16-bit samples (``L16``, ``RGB16``, ...)."""
        name = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}.get(self.channels, f"{self.channels}ch")
        return name + ("16" if self.bit_depth == 16 else "")


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


def inspect_image(
    data: bytes, validate: str = "structure", max_pixels: int = DEFAULT_MAX_PIXELS
) -> ImageInfo:
    """Identifies an image from its content, reads its header and validates it.

    Dimensions always come from the header, and an image declaring more than
    ``max_pixels`` pixels is refused before anything is decoded, in every mode.
    ``'headers'`` checks the container without reading compressed data
    (markers and end of image for JPEG, every chunk's length and CRC for PNG,
    the blocks and trailer for GIF, Pillow's header parse plus the declared
    file size for BMP/WEBP/TIFF). ``'structure'`` (the default) does that, then
    checks the compressed stream so that whatever a full decode would reject
    is rejected: a JPEG is decoded at 1/8 size (every entropy-coded byte is
    still read), a PNG's image data is inflated and its length and row filters
    checked, other formats are decoded by Pillow. ``'decode'`` does the header
    checks (and the PNG stream check), then a full Pillow decode of the first
    frame.

    Args:
        data: The whole file content (bytes, bytearray or memoryview).
        validate: One of :data:`VALIDATE_MODES`.
        max_pixels: The most pixels (width x height) an image may declare;
            more is ``too_many_pixels``. It bounds a decode's memory too.

    Returns:
        The format, height, width and channel count.

    Raises:
        ImageError: The content is empty, not a supported image, too large or
            damaged; ``reason`` says which.
        ValueError: ``validate`` is not one of :data:`VALIDATE_MODES`, or
            ``max_pixels`` is not a positive integer.
        TypeError: ``data`` is not bytes-like.
    """
    if validate not in VALIDATE_MODES:
        raise ValueError(
            f"validate must be one of {', '.join(map(repr, VALIDATE_MODES))}; "
            f"got {validate!r}"
        )
    if not isinstance(max_pixels, int) or isinstance(max_pixels, bool) or max_pixels < 1:
        raise ValueError(f"max_pixels must be a positive integer; got {max_pixels!r}")
    if not isinstance(data, (bytes, bytearray)):
        if not isinstance(data, memoryview):
            raise TypeError(f"data must be bytes-like, not {type(data).__name__}")
        data = data.tobytes()
    n = len(data)
    if not n:
        raise ImageError("empty_file", "file is empty (0 bytes)")

    if data.startswith(b"\xff\xd8"):
        info = _inspect_jpeg(data, n)
    elif data.startswith(b"\x89PNG"):
        info, ihdr, idat = _inspect_png(data, n)
    elif data.startswith(b"GIF8"):
        info = _inspect_gif(data, n)
    elif data.startswith(b"BM") and n >= 18 and _U32LE(data, 14)[0] in _BMP_HEADER_SIZES:
        return _inspect_with_pillow(data, n, "bmp", validate, max_pixels)
    elif data.startswith(b"RIFF") and data.startswith(b"WEBP", 8):
        return _inspect_with_pillow(data, n, "webp", validate, max_pixels)
    elif data.startswith(_TIFF_MAGICS):
        return _inspect_with_pillow(data, n, "tiff", validate, max_pixels)
    else:
        raise ImageError("not_an_image", _describe_unknown(data))

    _check_pixels(info.format.upper(), info.width, info.height, max_pixels)
    if validate == "headers":
        return info
    if info.format == "png":
        # Also before a full decode: Pillow stops reading at the last row, so it never
        # sees a bad zlib checksum (damaged pixel data) that this check refuses.
        _check_png_stream(data, ihdr, idat)
        if validate == "decode":
            _decode_with_pillow(data, info, reduced=False)
    else:  # JPEG at 1/8 size unless 'decode'; GIF in full (first frame)
        _decode_with_pillow(data, info, reduced=validate == "structure" and info.format == "jpeg")
    return info


def _check_pixels(label: str, width: int, height: int, max_pixels: int) -> None:
    """too_many_pixels when the declared size is over the limit."""
    if width * height > max_pixels:
        raise ImageError(
            "too_many_pixels",
            f"{label} header declares {width}x{height} = {width * height:,} pixels, more "
            f"than the limit of {max_pixels:,}: refused without decoding (a decompression "
            "bomb, or a genuinely huge image: raise --max_pixels to accept it)",
        )


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
            sof_marker = marker
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
    precision, height, width, components = sof
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
    # libjpeg as TensorFlow builds it: 8-bit baseline, extended or progressive
    # Huffman coding; grey or YCbCr/RGB.
    unreadable = ("cmyk_jpeg" if components == 4 else "jpeg_12_bit" if precision != 8
                  else "" if sof_marker in (0xC0, 0xC1, 0xC2) else "jpeg_uncommon_coding")
    return ImageInfo("jpeg", height, width, components, precision, unreadable)


def _inspect_png(data: bytes, n: int) -> tuple[ImageInfo, tuple, list[tuple[int, int]]]:
    """Checks every PNG chunk (bounds, CRC, order) and reads IHDR.

    Returns the info, the IHDR fields, and where the payloads of the first run of
    consecutive IDAT chunks lie (the image data a decoder reads).
    """
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
    idat: list[tuple[int, int]] = []
    in_idat_run = False
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
            if not has_idat or in_idat_run:
                idat.append((pos + 8, end - 4))
            has_idat = in_idat_run = True
            pos = end
            continue
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
        in_idat_run = False
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
    return ImageInfo("png", height, width, channels, 16 if depth == 16 else 8), ihdr, idat


def _chunk_name(ctype: bytes) -> str:
    """Printable name of a PNG chunk type."""
    return repr(ctype.decode("latin-1")) if ctype.isalpha() else repr(ctype)


def _inspect_gif(data: bytes, n: int) -> ImageInfo:
    """Reads the GIF screen, blocks up to the first image, and checks the trailer."""
    if n < 13:
        raise ImageError("truncated_gif", f"GIF is only {n} bytes long: file is truncated")
    if data[4] not in b"79" or data[5] != 0x61:  # GIF87a / GIF89a
        raise ImageError("corrupt_gif", "GIF has an unknown version (neither 87a nor 89a)")
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
    return ImageInfo("gif", height, width, 3)  # TensorFlow decodes a GIF to RGB


def _inspect_with_pillow(
    data: bytes, n: int, fmt: str, validate: str, max_pixels: int
) -> ImageInfo:
    """Reads a BMP/WEBP/TIFF header with Pillow; unless ``validate`` is ``headers``,
    also decodes the first frame (once its size is known to be within the limit)."""
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
        im = _PLUGINS[fmt](io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # not expected: Pillow's limit is not applied
        raise ImageError("too_many_pixels", f"{label} is too large to decode safely: {exc}") from exc
    except _PIL_ERRORS as exc:
        raise ImageError("corrupt_image", f"{label} header cannot be read: {exc}") from exc
    with im:
        width, height = im.size
        mode = im.mode
        if not width or not height:
            raise ImageError("corrupt_image", f"{label} has an empty size {width}x{height}")
        _check_pixels(label, width, height, max_pixels)
        if mode == "P":
            channels = 4 if "transparency" in im.info else 3
        else:
            channels = _MODE_CHANNELS.get(mode) or len(Image.getmodebands(mode))
        if validate != "headers":
            _load(im, label, width * height, reduced=False)
    return ImageInfo(fmt, height, width, channels, unreadable=_unreadable(fmt, data, width, height))


def _unreadable(fmt: str, data: bytes, width: int, height: int) -> str:
    """Why tf.io.decode_image cannot read a BMP, WEBP or TIFF as stored ('' if it can).

    TensorFlow's BMP decoder reads the pixel array raw, as ``bits per pixel / 8``
    channels: it ignores a palette (8-bit) and compression, keeps the padding byte
    of 32-bit pixels as alpha, and wants the file to end exactly after the rows.
    So only uncompressed 24-bit BMPs of exactly that size read as Pillow reads them.
    """
    if fmt != "bmp":
        return fmt
    offset, bpp = _U32LE(data, 10)[0], struct.unpack_from("<H", data, 28)[0]
    compression = _U32LE(data, 30)[0] if _U32LE(data, 14)[0] >= 40 else 0
    rows = (3 * width + 3) // 4 * 4 * height
    return "" if bpp == 24 and compression == 0 and len(data) - offset == rows else "bmp_not_24_bit"


def _decode_with_pillow(data: bytes, info: ImageInfo, reduced: bool) -> None:
    """Decodes the first frame (a JPEG at 1/8 size when ``reduced``); any failure is
    an ImageError('decode_error').

    Relies on Pillow's default ``ImageFile.LOAD_TRUNCATED_IMAGES = False``.
    """
    with _open(data, info, always_allow=False) as im:
        _load(im, info.format.upper(), info.width * info.height, reduced)


def _open(data: bytes, info: ImageInfo, always_allow: bool = True) -> Image.Image:
    """The image opened by its format's plugin (header read, nothing decoded)."""
    label = info.format.upper()
    try:
        if always_allow or info.format == "gif":  # opening a GIF reads its first frame's header
            _allow_in_pillow(info.width * info.height)
        return _PLUGINS[info.format](io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageError("too_many_pixels", f"{label} is too large to decode safely: {exc}") from exc
    except _PIL_ERRORS as exc:
        raise _undecodable(label, exc) from exc


def decode_first_frame(data: bytes, info: ImageInfo,
                       at_least: tuple[int, int] | None = None) -> Image.Image:
    """The image's first frame, decoded (the caller closes it).

    For an image ``inspect_image`` passed: the pixel limit was applied then.

    Args:
      at_least: ``(width, height)`` the result may shrink to but not below: a
        JPEG is then decoded at the smallest of 1/1, 1/2, 1/4, 1/8 scale that
        keeps that size (libjpeg's reduced decode, much faster); others in full.

    Raises:
      ImageError: ``decode_error`` (or ``too_many_pixels``) when Pillow fails.
    """
    im = _open(data, info)
    try:
        if at_least is not None and info.format == "jpeg":
            im.draft(im.mode if im.mode in ("L", "RGB") else "RGB", at_least)
        _load(im, info.format.upper(), info.width * info.height, reduced=False)
    except BaseException:
        im.close()
        raise
    return im


def _load(im: Image.Image, label: str, pixels: int, reduced: bool) -> None:
    """Loads an opened image's first frame: a JPEG at 1/8 size when ``reduced``.

    At 1/8 size libjpeg still decodes every entropy-coded byte (so it still fails on
    broken or truncated scan data) but skips most of the inverse DCT, colour
    conversion and memory: about 2/3 of a full decode's time on photos.
    """
    try:
        if reduced:
            # The largest scale-down (1/8), grey: libjpeg still entropy-decodes every
            # block of every component (so a broken or cut scan still fails), but
            # skips the chroma's inverse DCT and the colour conversion (~20% less
            # time on photos; on 4,000 seeded byte-mutated JPEGs it refused exactly
            # what the colour draft refused). Modes other than YCbCr keep theirs.
            im.draft("L", (1, 1))
        _allow_in_pillow(pixels)
        im.load()
    except Image.DecompressionBombError as exc:
        raise ImageError("too_many_pixels", f"{label} is too large to decode safely: {exc}") from exc
    except _PIL_ERRORS as exc:
        raise _undecodable(label, exc, reduced) from exc


def _allow_in_pillow(pixels: int) -> None:
    """Makes sure Pillow's own bomb check will not refuse ``pixels`` (within max_pixels).

    ``Image.MAX_IMAGE_PIXELS`` is process-wide. It is only consulted inside the GIF and
    TIFF plugins here (everything is opened without ``Image.open``), and Pillow refuses
    above twice its value: 178,956,970 pixels by default, more than the default
    ``max_pixels``. So it is only touched when a larger ``max_pixels`` lets such an image
    through, and then only raised, under a lock: a thread never sees a lower limit than
    it needs, whatever others do. Left alone when someone set it to None.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or pixels <= 2 * limit:
        return
    with _pillow_limit_lock:
        limit = Image.MAX_IMAGE_PIXELS
        if limit is not None and pixels > 2 * limit:
            Image.MAX_IMAGE_PIXELS = -(-pixels // 2)


def _check_png_stream(data: bytes, ihdr: tuple, idat: list[tuple[int, int]]) -> None:
    """Inflates a PNG's image data and checks what a decoder would: a valid zlib
    stream, at least as many bytes as the header implies, and a valid filter type
    (0-4) at the start of every row. Nothing is unfiltered or kept: memory stays at
    about ``_INFLATE_OUT`` whatever the image size.

    Raises:
        ImageError: ``corrupt_png``.
    """
    width, height, depth, colour, _, _, interlace = ihdr
    bits = depth * _PNG_SAMPLES[colour]
    if interlace:
        passes = [((width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy)
                  for x0, y0, dx, dy in _ADAM7]
    else:
        passes = [(width, height)]
    # (row length with its filter byte, rows) of each non-empty pass
    rows = [((w * bits + 7) // 8 + 1, h) for w, h in passes if w > 0 and h > 0]
    expected = sum(length * count for length, count in rows)

    inflater = zlib.decompressobj()
    view = memoryview(data)
    produced = 0
    at = 0  # offset of the next filter byte in the piece being checked
    segment = 0
    row, left = rows[0]
    try:
        for start, end in idat:
            for first in range(start, end, _INFLATE_IN):
                chunk = view[first : min(end, first + _INFLATE_IN)]
                while True:
                    piece = inflater.decompress(chunk, _INFLATE_OUT)
                    size = len(piece)
                    while at < size and segment < len(rows):
                        count = min(left, (size - at + row - 1) // row)
                        last = at + (count - 1) * row
                        if max(piece[at : last + 1 : row]) > 4:
                            bad = next(i for i in range(at, last + 1, row) if piece[i] > 4)
                            raise ImageError(
                                "corrupt_png",
                                f"PNG image data has an invalid row filter type {piece[bad]} "
                                f"at decompressed byte {produced + bad}: data is damaged",
                            )
                        at = last + row
                        left -= count
                        if not left:
                            segment += 1
                            if segment < len(rows):
                                row, left = rows[segment]
                    at -= size
                    produced += size
                    if produced >= expected or inflater.eof:
                        # Every row is there (decoders ignore anything more), or
                        # the stream ended (short: below).
                        break
                    chunk = inflater.unconsumed_tail
                    if not chunk and size < _INFLATE_OUT:
                        break
                if produced >= expected or inflater.eof:
                    break
            if produced >= expected or inflater.eof:
                break
    except zlib.error as exc:
        raise ImageError(
            "corrupt_png", f"PNG image data (the IDAT zlib stream) is damaged: {exc}"
        ) from exc
    if produced < expected:
        raise ImageError(
            "corrupt_png",
            f"PNG image data holds {produced:,} bytes when decompressed, but a "
            f"{width}x{height} image needs {expected:,}: data is missing",
        )


def _undecodable(label: str, exc: Exception, reduced: bool = False) -> ImageError:
    """decode_error for pixel data Pillow fails to decode."""
    how = " (checked by a reduced-size decode)" if reduced else ""
    return ImageError("decode_error", f"{label} pixel data cannot be decoded{how}: {exc}")


def _describe_unknown(data: bytes) -> str:
    """Message for content that matches no supported image signature: what it
    seems to be and its size, never what it holds."""
    return (f"the file seems to be {describe_content(data)} ({len(data):,} bytes), not a JPEG, "
            "PNG, GIF, BMP, WEBP or TIFF image")


# Signatures of common files that are not images (what a dead letter may say a file is).
_KINDS = ((b"%PDF-", "PDF"), (b"PK\x03\x04", "zip"), (b"PK\x05\x06", "zip"), (b"\x1f\x8b", "gzip"),
          (b"\x7fELF", "an executable (ELF)"))
_MARKUP = re.compile(rb"^(?:\xef\xbb\xbf)?\s*<(?:!doctype\s+html|html|head|body|\?xml|svg)\b", re.I)
_TEXT_SAMPLE = 512


def describe_content(data: bytes) -> str:
    """What a file's bytes seem to be, in a few words (``text``, ``HTML``, ``PDF``,
    ``zip``, ``empty``, ``unknown binary``, ...): for messages, which name a
    file's kind and size and never quote its content."""
    if not data:
        return "empty"
    head = bytes(data[:_TEXT_SAMPLE])
    if head[4:8] == b"ftyp":
        return "an ISO media file (HEIC/AVIF/MP4, not supported)"
    for magic, kind in _KINDS:
        if head.startswith(magic):
            return kind
    markup = _MARKUP.match(head)
    if markup:
        tag = markup.group(0).lower()
        return "SVG" if b"svg" in tag else "XML" if b"xml" in tag else "HTML"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as err:
        # A character cut at the end of the sample is still text.
        text = head[:err.start].decode("utf-8") if err.start >= len(head) - 3 else None
    if text is not None and all(ch.isprintable() or ch in "\t\n\r\f" for ch in text):
        return "text"
    return "unknown binary"


# A bytes literal in a message (``b'II*\x00'``, as Pillow quotes a header it refused).
_BYTES_LITERAL = re.compile(r"(?<!\w)b'(?:[^'\\]|\\.)*'" + r'|(?<!\w)b"(?:[^"\\]|\\.)*"')
_MESSAGE_CHARS = 300


def quiet_message(text: str) -> str:
    """A message fit for a dead letter: bytes a library quoted from the file
    replaced by ``<bytes>``, control characters escaped, cut to 300 characters."""
    text = _BYTES_LITERAL.sub("<bytes>", text)
    text = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
    return text if len(text) <= _MESSAGE_CHARS else text[:_MESSAGE_CHARS - 3] + "..."
