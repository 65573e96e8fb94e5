"""Image bytes a trainer can decode: what ``tf.io.decode_image`` reads, and a
lossless PNG for what it does not.

``tf.io.decode_image`` (TensorFlow's ``DecodeImageV2`` kernel) reads JPEG, PNG,
GIF and BMP. Of those, the header inspection (``codec.image_inspection``) marks what it
still cannot read as stored (``ImageInfo.unreadable``): CMYK/YCCK JPEGs (as
TensorFlow's own ImageNet build script notes), 12-bit and lossless or
arithmetic-coded JPEGs, and BMPs other than uncompressed 24-bit (its BMP decoder
ignores palettes and compression and reads a 32-bit pixel's padding byte as
alpha). TIFF, and WebP (not read by the TensorFlow releases most trainers run),
are unreadable too. Those are decoded with Pillow (first frame) and written as
PNG, pixel for pixel: only a CMYK or YCbCr image changes colour space (to RGB),
as a decoder would. PNG output is deterministic for a given zlib.

Pure Python and Pillow: no Beam import.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from beam_tfrecords.transforms.codec.image_inspection import ImageError, ImageInfo, decode_first_frame

__all__ = ["readable_image", "to_uint16"]

# Pillow mode -> the mode stored in the PNG (PNG holds L, LA, RGB, RGBA, I;16).
_PNG_MODES = {
    "1": "L", "L": "L", "LA": "LA", "La": "LA", "P": None, "PA": "RGBA",
    "RGB": "RGB", "RGBX": "RGB", "RGBA": "RGBA", "RGBa": "RGBA",
    "CMYK": "RGB", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB",
    "I;16": "I;16", "I;16L": "I;16", "I;16B": "I;16", "I;16N": "I;16",
}  # fmt: skip
_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "I;16": 1}
# zlib level of converted PNGs: 6 is zlib's default, a fair size for the time.
_PNG_LEVEL = 6


def _png_mode(im: Image.Image) -> str:
    mode = im.mode
    if mode == "P":
        return "RGBA" if "transparency" in im.info else "RGB"
    if mode == "I":  # 32-bit integers: PNG keeps them only when they fit 16 bits.
        low, high = im.getextrema()
        if low >= 0 and high <= 0xFFFF:
            return "I;16"
        raise ImageError("unconvertible_image", "integer pixels outside 0..65535 (signed, or 32-bit) "
                         "have no lossless PNG form; convert the file, or pass --image_bytes original")
    if mode not in _PNG_MODES:
        raise ImageError("unconvertible_image", f"pixel mode {mode} has no lossless PNG form; "
                         "convert the file, or pass --image_bytes original")
    return _PNG_MODES[mode]


def to_uint16(im: Image.Image) -> Image.Image:
    """A 16-bit grey image (any byte order, or 32-bit integers within 0..65535) as
    mode ``I;16``, values exact (Pillow's own ``convert`` clamps some to 8 bits)."""
    return Image.fromarray(np.asarray(im).astype(np.uint16))


def _refuse_lost_bits(im: Image.Image) -> None:
    """Pillow reads a TIFF of more than 8 bits per colour sample as 8-bit RGB(A):
    no lossless PNG can come of that."""
    bits = getattr(im, "tag_v2", {}).get(258) if im.format == "TIFF" else None
    if bits and im.mode in ("RGB", "RGBA", "CMYK", "LA") and max(bits) > 8:
        raise ImageError("unconvertible_image", f"{max(bits)}-bit colour samples are read as 8 "
                         "bits: no lossless PNG can be made; convert the file, or pass "
                         "--image_bytes original")


def readable_image(data: bytes, info: ImageInfo) -> tuple[bytes, ImageInfo]:
    """The image as ``tf.io.decode_image`` reads it: ``data`` itself when it can,
    else the first frame as a lossless PNG, with its format, size and channels.

    Raises:
      ImageError: when the pixels cannot be decoded or have no lossless PNG form.
    """
    if not info.unreadable:
        return data, info
    with decode_first_frame(data, info) as im:
        _refuse_lost_bits(im)
        mode = _png_mode(im)
        if mode == "I;16" and im.mode != "I;16":
            im = to_uint16(im)
        elif im.mode != mode:
            im = im.convert(mode)
        out = io.BytesIO()
        im.save(out, format="PNG", compress_level=_PNG_LEVEL)
    bits = 16 if mode == "I;16" else 8
    return out.getvalue(), ImageInfo("png", info.height, info.width, _CHANNELS[mode], bits)
