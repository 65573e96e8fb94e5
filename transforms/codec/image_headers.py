"""Image containers read straight from the bytes: JPEG markers, PNG chunks, GIF
blocks (``struct``, no decode, no copy of the data), and the PNG image-data stream
check; with ``ImageInfo`` (what a header says) and ``ImageError`` (why an image is
refused). ``codec.image_inspection.inspect_image`` calls these first. Pure Python: no Beam.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass

__all__ = ["ImageError", "ImageInfo", "check_png_stream", "inspect_gif", "inspect_jpeg", "inspect_png"]

_U16BE = struct.Struct(">H").unpack_from
_U32BE = struct.Struct(">I").unpack_from
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
            2 grey+alpha, 3 colour (a CMYK/YCCK JPEG too: TensorFlow and Pillow
            decode it to RGB), 4 colour+alpha; palette PNGs
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
        modes: ``L``, ``LA``, ``RGB`` (CMYK too, decoded to RGB), ``RGBA``, with ``16``
        appended for 16-bit samples (``L16``, ``RGB16``, ...)."""
        name = _MODES.get(self.channels) or f"{self.channels}ch"
        return name + ("16" if self.bit_depth == 16 else "")


_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}
# The header's info, one (immutable) instance per distinct header: a run's images
# share a few sizes, and a frozen dataclass costs more to make than to look up.
_info = functools.lru_cache(maxsize=4096)(ImageInfo)


def inspect_jpeg(data: bytes, n: int) -> ImageInfo:
    """Walks the JPEG markers from SOI to the first SOS and checks the end."""
    sof, sof_marker, pos = _jpeg_frame(data, n)
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
    # Four components (CMYK/YCCK) decode to RGB (tf.io.decode_image, Pillow's convert).
    return _info("jpeg", height, width, 3 if components == 4 else components, precision, unreadable)


def _jpeg_frame(data: bytes, n: int) -> tuple[tuple | None, int, int]:
    """The first frame header (SOF) before the first scan, as ``(precision, height,
    width, components)``, or ``None``; its marker; where the scan's data starts."""
    pos = 2
    sof = None
    sof_marker = 0
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
    return sof, sof_marker, pos


def inspect_png(data: bytes, n: int) -> tuple[ImageInfo, tuple, list[tuple[int, int]]]:
    """Checks every PNG chunk (bounds, CRC, order) and reads IHDR.

    Returns the info, the IHDR fields, and where the payloads of the first run of
    consecutive IDAT chunks lie (the image data a decoder reads).
    """
    ihdr, has_trns, has_plte, idat = _png_chunks(data, n)
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
    if not idat:
        raise ImageError("corrupt_png", "PNG has no image data (IDAT chunk)")
    if colour == 3:
        if not has_plte:
            raise ImageError("corrupt_png", "palette PNG has no palette (PLTE chunk)")
        channels = 4 if has_trns else 3
    else:
        channels = _PNG_CHANNELS[colour]
    return _info("png", height, width, channels, 16 if depth == 16 else 8), ihdr, idat


def _png_chunks(data: bytes, n: int) -> tuple[tuple, bool, bool, list[tuple[int, int]]]:
    """Walks the chunks from the signature to IEND, checking each one's bounds and CRC:
    ``(IHDR fields, has tRNS, has PLTE, the first IDAT run's payloads)``."""
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
    return ihdr, has_trns, has_plte, idat


def _chunk_name(ctype: bytes) -> str:
    """Printable name of a PNG chunk type."""
    return repr(ctype.decode("latin-1")) if ctype.isalpha() else repr(ctype)


def inspect_gif(data: bytes, n: int) -> ImageInfo:
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


def check_png_stream(data: bytes, ihdr: tuple, idat: list[tuple[int, int]]) -> None:
    """Inflates a PNG's image data and checks what a decoder would: a valid zlib
    stream, at least as many bytes as the header implies, and a valid filter type
    (0-4) at the start of every row. Nothing is unfiltered or kept: memory stays at
    about ``_INFLATE_OUT`` whatever the image size.

    Raises:
        ImageError: ``corrupt_png``.
    """
    width, height, depth, colour, _, _, interlace = ihdr
    bits = depth * _PNG_SAMPLES[colour]
    if not interlace and len(idat) == 1:
        start, end = idat[0]
        row = (width * bits + 7) // 8 + 1
        if end - start <= _INFLATE_IN and row * height <= _INFLATE_OUT:
            _check_small_png_stream(data, start, end, row, ihdr)
            return
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
                            raise _bad_filter(piece[bad], produced + bad)
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
        raise _damaged(exc) from exc
    if produced < expected:
        raise _missing(produced, width, height, expected)


def _check_small_png_stream(data: bytes, start: int, end: int, row: int, ihdr: tuple) -> None:
    """``check_png_stream`` of a small image (the usual thumbnail or tile): not
    interlaced, one IDAT chunk of at most ``_INFLATE_IN`` bytes whose rows (``row``
    bytes each, filter byte included) hold at most ``_INFLATE_OUT``. The same checks
    and messages in one ``decompress`` call: the general loop would make that one
    call too (its output limit cannot stop it short of the rows).
    """
    width, height = ihdr[0], ihdr[1]
    expected = row * height
    try:
        piece = zlib.decompressobj().decompress(memoryview(data)[start:end], _INFLATE_OUT)
    except zlib.error as exc:
        raise _damaged(exc) from exc
    size = len(piece)
    count = min(height, (size + row - 1) // row)
    if count and max(piece[0 : (count - 1) * row + 1 : row]) > 4:
        bad = next(i for i in range(0, count * row, row) if piece[i] > 4)
        raise _bad_filter(piece[bad], bad)
    if size < expected:
        raise _missing(size, width, height, expected)


def _damaged(exc: zlib.error) -> ImageError:
    return ImageError("corrupt_png", f"PNG image data (the IDAT zlib stream) is damaged: {exc}")


def _bad_filter(value: int, at: int) -> ImageError:
    return ImageError(
        "corrupt_png",
        f"PNG image data has an invalid row filter type {value} at decompressed byte {at}: data is damaged",
    )


def _missing(produced: int, width: int, height: int, expected: int) -> ImageError:
    return ImageError(
        "corrupt_png",
        f"PNG image data holds {produced:,} bytes when decompressed, but a "
        f"{width}x{height} image needs {expected:,}: data is missing",
    )
