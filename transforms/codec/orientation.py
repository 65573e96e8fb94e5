"""EXIF orientation: what it says, and what to do about it when annotations state a size.

A camera stores its pixels as the sensor read them and records in EXIF (tag 0x0112,
values 1-8) how to show them; viewers and Pillow's ``ImageOps.exif_transpose`` apply
it, TensorFlow's decoders do not. Annotations drawn in a viewer are in the displayed
picture's coordinates; annotations drawn by a tool that reads the raw pixels are in
the stored ones. The size the annotations state tells the two apart, when the
orientation swaps the sides (5-8) of a picture that is not square: see ``orient``.

Pure: bytes and numbers in, numbers out (Pillow reads the header only).
"""

from __future__ import annotations

import dataclasses
import io
import struct

from PIL import Image

__all__ = ["EXIF_TURNS", "ORIENTATION_TAG", "Orienting", "displayed_size", "exif_orientation",
           "header_orientation", "orient"]

ORIENTATION_TAG = 0x0112
# Orientation -> (quarter turns clockwise, then mirrored left to right) that show the
# stored pixels as displayed: the transposes of ``ImageOps.exif_transpose`` (2 FLIP_LEFT_RIGHT,
# 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90;
# Pillow's ROTATE_n turns counter-clockwise) in the record builder's terms.
EXIF_TURNS = {1: (0, False), 2: (0, True), 3: (2, False), 4: (2, True),
              5: (1, True), 6: (1, False), 7: (3, True), 8: (3, False)}


def exif_orientation(data: bytes) -> int:
    """The EXIF orientation of an encoded image (1-8); 1 when there is none, or it
    cannot be read or is not one of the eight values."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            value = im.getexif().get(ORIENTATION_TAG, 1)
    except Exception:  # noqa: BLE001 - any unreadable EXIF block means: no orientation.
        return 1
    return value if isinstance(value, int) and value in EXIF_TURNS else 1


def _tiff_orientation(data: bytes, start: int) -> int:
    """The orientation tag of IFD0 of the TIFF structure at ``data[start:]`` (an EXIF
    block); 1 when absent, cut off or not one of the eight values."""
    order = {b"II": "<", b"MM": ">"}.get(data[start:start + 2])
    if order is None or len(data) < start + 8:
        return 1
    magic, ifd = struct.unpack_from(order + "HI", data, start + 2)
    at = start + ifd
    if magic != 42 or len(data) < at + 2:
        return 1
    (count,) = struct.unpack_from(order + "H", data, at)
    for entry in range(min(count, (len(data) - at - 2) // 12)):
        tag, kind, _, value = struct.unpack_from(order + "HHIH", data, at + 2 + 12 * entry)
        if tag == ORIENTATION_TAG:
            return value if kind == 3 and value in EXIF_TURNS else 1
    return 1


def header_orientation(head: bytes) -> int:
    """The EXIF orientation read from the first bytes of an image file only (a launcher
    reads a bounded prefix: a JPEG's EXIF block sits before its pixels). A JPEG's
    markers are walked to its first EXIF block (APP1) and its IFD0 read by hand, so a
    prefix that cuts the block after the tag still answers; other formats go to
    Pillow (``exif_orientation``). 1 when there is none or it cannot be read: the
    same values the workers get from the whole file."""
    if not head.startswith(b"\xff\xd8"):
        return exif_orientation(head)
    at = 2
    while at + 4 <= len(head) and head[at] == 0xFF:
        marker = head[at + 1]
        if marker == 0xFF:  # Fill byte.
            at += 1
            continue
        if marker in (0xD9, 0xDA):  # End of image, start of scan: no EXIF before the pixels.
            return 1
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # Markers without a length.
            at += 2
            continue
        (length,) = struct.unpack_from(">H", head, at + 2)
        if marker == 0xE1 and head[at + 4:at + 10] == b"Exif\x00\x00":
            return _tiff_orientation(head[:at + 2 + length], at + 10)
        at += 2 + length
    return 1


def displayed_size(width: int, height: int, orientation: int) -> tuple[int, int]:
    """The ``(width, height)`` a viewer shows an image of that stored size in."""
    turns, _ = EXIF_TURNS.get(orientation, (0, False))
    return (height, width) if turns % 2 else (width, height)


@dataclasses.dataclass(frozen=True)
class Orienting:
    """What to do with an annotated image's EXIF orientation (``orient``).

    Attributes:
      turns, flip: what the record builder's ``Attachment`` asks (quarter turns
        clockwise, then a mirror): the pixels are stored as displayed.
      frame: ``(width, height)`` of the picture the annotations' coordinates are in:
        the displayed one when turned (the boxes are then mapped back to the stored
        pixels, then through the geometry the builder applied, which holds these
        turns: first, before a reshape, else last), else the stored one.
      count: what the run counts: ``exif_rotated`` (stored turned), or
        ``exif_orientation_not_applied`` (an orientation other than 1 left as it is:
        no size stated, or the stated size is the stored one), or ''.
      mismatch: the stated size is neither the stored nor the displayed one
        (``annotation_size_mismatch``: the image is not converted).
    """

    turns: int = 0
    flip: bool = False
    frame: tuple[int, int] = (0, 0)
    count: str = ""
    mismatch: bool = False


def orient(stored: tuple[int, int], orientation: int, stated: tuple[int, int] | None) -> Orienting:
    """Decides how an image's EXIF orientation and its annotations' stated size agree.

    No stated size: the annotations are taken to be in the stored pixels (an
    orientation other than 1 is counted). The stated size equal to the stored one:
    the same (orientations 2-4, and 5-8 of a square picture, keep the size, so
    this is also what they get). Equal to the displayed size only: the annotations
    were drawn on the displayed picture, so the image is stored turned as displayed.
    Anything else is a mismatch.

    Args:
      stored: the image's ``(width, height)`` as stored in its file.
      orientation: its EXIF orientation (1-8; anything else counts as 1).
      stated: the ``(width, height)`` the annotations state, or ``None``.
    """
    orientation = orientation if orientation in EXIF_TURNS else 1
    not_applied = "exif_orientation_not_applied" if orientation != 1 else ""
    if stated is None or tuple(stated) == tuple(stored):
        return Orienting(frame=tuple(stored), count=not_applied)
    shown = displayed_size(stored[0], stored[1], orientation)
    if tuple(stated) == shown:
        turns, flip = EXIF_TURNS[orientation]
        return Orienting(turns, flip, shown, "exif_rotated")
    return Orienting(frame=tuple(stored), mismatch=True)
