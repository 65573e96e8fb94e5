"""Fast image sniffing, header reading and validation.

Every input file goes through :func:`inspect_image`, so it is written for
speed: JPEG, PNG and GIF headers are parsed with ``struct`` straight from the
bytes (no decode, no copy of the data; ``codec.image_headers``); BMP, WEBP and
TIFF headers are read through Pillow. The format is always taken from the content, never from the
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
from beam_tfrecords.transforms.codec.image_headers import (
    ImageError,
    ImageInfo,
    check_png_stream,
    inspect_gif,
    inspect_jpeg,
    inspect_png,
)

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

_U32LE = struct.Struct("<I").unpack_from
_BMP_HEADER_SIZES = frozenset({12, 40, 52, 56, 64, 108, 124})  # those Pillow reads
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF

# Channel count per Pillow mode (palette mode P is decided by its transparency).
# RGBX is RGB plus a padding byte, so 3.
_MODE_CHANNELS = {
    "1": 1, "L": 1, "I": 1, "F": 1,
    "I;16": 1, "I;16L": 1, "I;16B": 1, "I;16N": 1,
    "LA": 2, "La": 2,
    "RGB": 3, "YCbCr": 3, "LAB": 3, "HSV": 3, "RGBX": 3,
    "RGBA": 4, "RGBa": 4, "PA": 4,
    "CMYK": 3,  # Decoded to RGB (tf.io.decode_image for JPEG, Pillow's convert).
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
        info = inspect_jpeg(data, n)
    elif data.startswith(b"\x89PNG"):
        info, ihdr, idat = inspect_png(data, n)
    elif data.startswith(b"GIF8"):
        info = inspect_gif(data, n)
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
        check_png_stream(data, ihdr, idat)
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
