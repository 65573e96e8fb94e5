"""A reference for what ``tf.io.decode_image`` reads, without TensorFlow.

``tf_decode_image(data)`` returns the array ``tf.io.decode_image(data,
expand_animations=False)`` gives (shape, dtype and pixels) for the formats and
variants TensorFlow's ``DecodeImageV2`` kernel reads, and raises ``Unsupported``
for the rest. What it accepts, from that kernel and the libraries it wraps:

- JPEG (libjpeg, 8-bit): baseline, extended or progressive Huffman coding
  (SOF0-SOF2), precision 8, 1 or 3 components; CMYK/YCCK, 12-bit, lossless,
  arithmetic-coded and hierarchical JPEGs are refused here. Pixels: Pillow's.
- PNG (libpng): every colour type and depth (1, 2 and 4-bit grey scaled to 0..255).
  Channels with ``channels=0``:
  palette -> 3, or 4 with a tRNS chunk; grey 1 (tRNS ignored); grey+alpha 2;
  RGB 3; RGBA 4. Depth 16 gives ``uint16`` (``decode_image`` converts to the
  dtype asked for). Pixels: Pillow's.
- GIF (giflib): always RGB, 3 channels, the first frame at the screen size.
- BMP: TensorFlow's own reader, ported here line by line: the pixel array read
  raw at ``bfOffBits`` as ``bpp / 8`` channels (1, 3 or 4), no palette, no
  compression, the file exactly header + rows; BGR(A) to RGB(A).
- Anything else (TIFF, WebP in the TensorFlow releases trainers run, ...):
  ``Unsupported``.
"""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image


class Unsupported(ValueError):
    """tf.io.decode_image would fail on these bytes."""


def _jpeg_frame(data: bytes) -> tuple[int, int, int]:
    """(SOF marker, precision, components)."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise Unsupported("broken JPEG markers")
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return marker, data[pos + 4], data[pos + 9]
        pos += 2 + length
    raise Unsupported("JPEG without a frame header")


def _png_header(data: bytes) -> tuple[int, int, bool]:
    """(colour type, bit depth, has tRNS)."""
    depth, colour = data[24], data[25]
    pos, trns = 8, False
    while pos + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"tRNS":
            trns = True
        if kind == b"IDAT":
            break
        pos += 12 + length
    return colour, depth, trns


def _bmp(data: bytes) -> np.ndarray:
    if len(data) < 32:
        raise Unsupported("Incomplete bmp content")
    header_size, = struct.unpack_from("<i", data, 10)
    width, height = struct.unpack_from("<ii", data, 18)
    bpp, = struct.unpack_from("<h", data, 28)
    channels = bpp // 8
    if channels not in (1, 3, 4) or width <= 0 or height == 0 or header_size < 0:
        raise Unsupported(f"BMP with {bpp} bits per pixel")
    rows = abs(height)
    row_size = (channels * width + 3) // 4 * 4
    if len(data) - header_size - row_size * rows != 0:
        raise Unsupported("Input size should match (header_size + row_size * abs_height)")
    pixels = np.frombuffer(data, np.uint8, row_size * rows, header_size).reshape(rows, row_size)
    pixels = pixels[:, :width * channels].reshape(rows, width, channels)
    if height > 0:
        pixels = pixels[::-1]
    if channels >= 3:
        pixels = pixels[..., [2, 1, 0, 3][:channels]]
    return np.ascontiguousarray(pixels)


def tf_decode_image(data: bytes) -> np.ndarray:
    """``tf.io.decode_image(data, expand_animations=False)``, as an array."""
    if data[:3] == b"\xff\xd8\xff":
        marker, precision, components = _jpeg_frame(data)
        if marker not in (0xC0, 0xC1, 0xC2) or precision != 8 or components not in (1, 3):
            raise Unsupported(f"JPEG SOF{marker - 0xC0} precision {precision}, "
                              f"{components} components")
        with Image.open(io.BytesIO(data)) as im:
            return np.array(im.convert("L" if components == 1 else "RGB")).reshape(
                im.height, im.width, components)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        colour, depth, trns = _png_header(data)
        with Image.open(io.BytesIO(data)) as im:
            if colour == 3:
                mode = "RGBA" if trns else "RGB"
                return np.array(im.convert(mode))
            if colour == 0:
                if depth < 8:  # libpng scales 1, 2 and 4-bit grey to 0..255.
                    return np.array(im.convert("L"))[..., None]
                array = np.array(im)
                return array.astype(np.uint16 if depth == 16 else np.uint8)[..., None]
            if colour == 4:
                return np.array(im.convert("LA"))
            if depth == 16:
                raise Unsupported("16-bit colour PNG (Pillow cannot decode it to check)")
            return np.array(im.convert("RGB" if colour == 2 else "RGBA"))
    if data[:4] == b"GIF8":
        with Image.open(io.BytesIO(data)) as im:
            im.seek(0)
            return np.array(im.convert("RGB"))
    if data[:2] == b"BM":
        return _bmp(data)
    raise Unsupported(f"not a format tf.io.decode_image reads (starts {data[:8]!r})")
