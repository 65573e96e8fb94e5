"""Resize and re-encode an image (``ImageReshape``), with Pillow.

An image the options leave as it is (already within the size, its format and
colour mode kept, readable by ``tf.io.decode_image``) keeps its bytes. The rest
are decoded (a JPEG shrunk by libjpeg's reduced decode to the smallest scale at
or above the target, then resampled), converted, resized with a Lanczos filter,
and written as JPEG or PNG. Output is deterministic for given Pillow, libjpeg
and zlib builds. Pure Python: no Beam import.
"""

from __future__ import annotations

import io

from PIL import Image

from beam_tfrecords.schemas.config import ImageReshape
from beam_tfrecords.transforms.codec.image_inspection import ImageInfo, decode_first_frame
from beam_tfrecords.transforms.codec.readable import readable_image, to_uint16

__all__ = ["reshape_decodes", "reshape_image", "target_size", "transposed"]

_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "I;16": 1}
_PNG_LEVEL = 6
# Pillow downsamples by whole factors first when shrinking more than this many
# times, then resamples with Lanczos (near-identical output, far less work).
_REDUCING_GAP = 3.0
# Clockwise quarter turns as Pillow transposes.
_TURNS = {1: Image.Transpose.ROTATE_270, 2: Image.Transpose.ROTATE_180, 3: Image.Transpose.ROTATE_90}


def transposed(im: Image.Image, turns: int, flip: bool) -> Image.Image:
    """``im`` turned ``turns`` quarter turns clockwise, then mirrored left to right
    when ``flip``."""
    moved = im.transpose(_TURNS[turns % 4]) if turns % 4 else im
    return moved.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else moved


def target_size(width: int, height: int, spec: ImageReshape) -> tuple[int, int]:
    """The ``(width, height)`` an image of that size is made."""
    if spec.size:
        return spec.size[0], spec.size[1]
    side = max(width, height) if spec.max_side else min(width, height) if spec.min_side else 0
    limit = spec.max_side or spec.min_side
    if not limit or side <= limit:
        return width, height
    scale = limit / side
    new = [max(1, round(width * scale)), max(1, round(height * scale))]
    # The constrained side is exactly the limit (rounding must not miss it).
    new[0 if (width >= height) == bool(spec.max_side) else 1] = limit
    return new[0], new[1]


def _out_format(info: ImageInfo, spec: ImageReshape) -> str:
    if spec.format != "keep":
        return spec.format
    return info.format if info.format in ("jpeg", "png") else "png"


def _mode(im: Image.Image, spec: ImageReshape, out_format: str) -> str:
    """The mode to write: the asked colour mode, else the image's, as the format holds it."""
    if spec.color == "rgb":
        return "RGB"
    if spec.color == "l":
        return "L"
    mode = im.mode
    if mode == "P":
        mode = "RGBA" if "transparency" in im.info else "RGB"
    mode = {"1": "L", "La": "LA", "PA": "RGBA", "RGBa": "RGBA", "RGBX": "RGB", "CMYK": "RGB",
            "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB", "I": "I;16", "F": "L"}.get(mode, mode)
    if mode.startswith("I;16"):
        mode = "I;16"
    if out_format == "jpeg":  # JPEG holds grey and colour only: alpha is dropped.
        mode = {"LA": "L", "RGBA": "RGB", "I;16": "L"}.get(mode, mode)
    return mode if mode in _CHANNELS else "RGB"


def _convert(im: Image.Image, mode: str) -> Image.Image:
    if im.mode == mode:
        return im
    if mode == "L" and (im.mode.startswith("I;16") or im.mode == "I"):
        return to_uint16(im).convert("I").point(lambda v: v / 256).convert("L")  # The top 8 bits.
    if mode == "I;16":
        return to_uint16(im)
    has_alpha = im.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (
        im.mode == "P" and "transparency" in im.info)
    if has_alpha and mode in ("RGB", "L"):
        # What is transparent shows as black (as --fit pad's bands), not the colour
        # stored under it.
        rgba = im.convert("RGBA")
        im = Image.alpha_composite(Image.new("RGBA", rgba.size, (0, 0, 0, 255)), rgba)
    return im.convert(mode)


def _resize(im: Image.Image, size: tuple[int, int]) -> Image.Image:
    # Pillow's whole-factor pre-shrink (reducing_gap) does not take 16-bit images.
    gap = None if im.mode.startswith("I;16") else _REDUCING_GAP
    return im.resize(size, Image.Resampling.LANCZOS, reducing_gap=gap)


def _fit(im: Image.Image, size: tuple[int, int], spec: ImageReshape) -> Image.Image:
    width, height = size
    if im.size == size:
        return im
    if not spec.size or spec.fit == "stretch":
        return _resize(im, size)
    scale = (max if spec.fit == "crop" else min)(width / im.width, height / im.height)
    scaled = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
    im = _resize(im, scaled)
    if spec.fit == "crop":
        left, top = (scaled[0] - width) // 2, (scaled[1] - height) // 2
        return im.crop((left, top, left + width, top + height))
    canvas = Image.new(im.mode, size)  # Black (and transparent, with alpha).
    canvas.paste(im, ((width - scaled[0]) // 2, (height - scaled[1]) // 2))
    return canvas


def reshape_decodes(info: ImageInfo, spec: ImageReshape) -> bool:
    """Whether ``reshape_image`` decodes this image (else it keeps its bytes)."""
    return not (target_size(info.width, info.height, spec) == (info.width, info.height)
                and _out_format(info, spec) == info.format and spec.color == "keep"
                and not info.unreadable)


def reshape_image(data: bytes, info: ImageInfo, spec: ImageReshape, *, turns: int = 0,
                  flip: bool = False) -> tuple[bytes, ImageInfo, str]:
    """The image as ``spec`` makes it: ``(bytes, info, note)``.

    ``note`` is ``reshape/resized`` (the size changed), ``reshape/re-encoded``
    (format or colour mode changed, or made readable), or ``reshape/kept`` (the
    file's own bytes, nothing to change).

    ``turns`` (quarter turns clockwise) and ``flip`` (then mirrored left to right),
    when given, are applied to the decoded pixels first (an EXIF orientation shown
    as displayed): the reshape is of the turned picture, and the image is always
    written again.

    Raises:
      ImageError: when the pixels cannot be decoded or converted.
    """
    turned = turns % 2 == 1
    shown = (info.height, info.width) if turned else (info.width, info.height)
    moves = bool(turns % 4 or flip)
    size = target_size(shown[0], shown[1], spec)
    out_format = _out_format(info, spec)
    if not moves and not reshape_decodes(info, spec):
        return data, info, "reshape/kept"
    if not moves and size == shown and spec.color == "keep" and spec.format == "keep":
        converted, converted_info = readable_image(data, info)  # Only made readable.
        return converted, converted_info, "reshape/re-encoded"
    cover = size
    if spec.size and spec.fit != "stretch":
        scale = (max if spec.fit == "crop" else min)(size[0] / shown[0], size[1] / shown[1])
        cover = (max(1, round(shown[0] * scale)), max(1, round(shown[1] * scale)))
    with decode_first_frame(data, info, at_least=cover[::-1] if turned else cover) as im:
        mode = _mode(im, spec, out_format)
        im = _fit(_convert(transposed(im, turns, flip) if moves else im, mode), size, spec)
        out = io.BytesIO()
        if out_format == "jpeg":
            im.save(out, format="JPEG", quality=spec.quality)
        else:
            im.save(out, format="PNG", compress_level=_PNG_LEVEL)
    note = "reshape/resized" if size != shown else "reshape/re-encoded"
    bits = 16 if mode == "I;16" else 8
    return out.getvalue(), ImageInfo(out_format, size[1], size[0], _CHANNELS[mode], bits), note
