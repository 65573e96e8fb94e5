"""Pascal VOC annotation files: one ``Annotations/<id>.xml`` to its size and objects.

Pure parsing, bytes in, structures out (the folder reader, ``plan.annotation_folders``,
finds the files and builds the label map). What is read from a file:

* ``<filename>``: the image's file name, as written (the folder reader looks it up in
  ``JPEGImages/``, then falls back to the XML's stem);
* ``<size>``: ``<width>`` and ``<height>`` become ``stated_size``; a size that is absent,
  or ``0`` (some VOC tools write 0 when they did not know it), states nothing; one that is
  not a whole number makes the file bad;
* every ``<object>``, in file order: ``<name>`` (the class), ``<bndbox>``, ``<difficult>``
  and ``<truncated>`` (a whole number, 0 is false, or ``true``/``false``/``yes``/``no``
  in any case; absent or empty: 0). ``<pose>`` (and any other element) is
  read past and ignored: no record key holds it.

Coordinates. VOC's ``<bndbox>`` holds 1-based pixel indices, both ends inclusive: a box
over the image's first column has ``xmin`` 1, and one over all of a 500-pixel-wide image
has ``xmax`` 500. The contract (``schemas.annotations``) wants continuous 0-based edges,
so a box becomes ``(xmin - 1, ymin - 1, xmax, ymax)``: VOC's ``1..500`` becomes
``0..500``, the whole width. Fractional values (some exporters write them) are taken the
same way. Nothing is clipped here (the record builder clips, knowing the image).

Safety. ``xml.etree.ElementTree`` expands internal entities, so a document holding
``<!DOCTYPE`` or ``<!ENTITY`` is refused before it is parsed (``bad_annotation_file``):
VOC files have neither, and refusing them rules out entity expansion attacks without
``defusedxml``. The check is a byte search, then a pass of expat that stops at the first
declaration (so a document in UTF-16 or another declared encoding is caught too).

Problems. A file that does not parse (or is refused, or has no ``<annotation>`` root, or
a size that is not a number) is one ``bad_annotation_file`` problem, nothing kept. An
object without a ``<name>`` or a ``<bndbox>``, or whose coordinates or flags do not
parse, is a ``bad_object`` problem naming the object and the field, the object dropped
and the image kept (the file's other objects are read); one whose coordinates are not finite is ``box_not_finite``, likewise.
Messages name the field and a number, never the file's text.
"""

from __future__ import annotations

import dataclasses
import math
import re
import xml.etree.ElementTree as ET
from xml.parsers import expat

from beam_tfrecords.schemas.annotations import AnnotationProblem

__all__ = [
    "VocObject",
    "VocFile",
    "parse_voc_xml",
]

_REFUSED = re.compile(rb"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)
_BOX_FIELDS = ("xmin", "ymin", "xmax", "ymax")


@dataclasses.dataclass(frozen=True)
class VocObject:
    """One ``<object>`` of a VOC file.

    Attributes:
      name: its class name (``<name>``, stripped).
      box: ``(xmin, ymin, xmax, ymax)`` in the contract's 0-based edges (converted).
      difficult, truncated: VOC's flags.
      source: ``"<file>: object N"`` (N from 1, in file order).
    """

    name: str
    box: tuple[float, float, float, float]
    difficult: bool
    truncated: bool
    source: str


@dataclasses.dataclass(frozen=True)
class VocFile:
    """What a VOC annotation file says.

    Attributes:
      filename: ``<filename>`` as written (``""`` when absent).
      stated_size: ``(width, height)`` from ``<size>``, or ``None``.
      objects: the objects kept, in file order.
      problems: the objects dropped, in file order.
    """

    filename: str
    stated_size: tuple[int, int] | None
    objects: tuple[VocObject, ...]
    problems: tuple[AnnotationProblem, ...]


class _Declared(Exception):
    """A DTD or entity declaration met by ``_declares``."""


def _refuse(*_args) -> None:
    raise _Declared


def _declares(data: bytes) -> bool:
    """Whether the document declares a DTD or an entity, in whatever encoding it is
    written (expat decodes it first: a byte search alone misses UTF-16)."""
    if _REFUSED.search(data):
        return True
    parser = expat.ParserCreate()
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    try:
        parser.Parse(data, True)
    except _Declared:
        return True
    except expat.ExpatError:
        return False  # Not well-formed: the parse that follows says so.
    return False


class _BadField(ValueError):
    """A field that is missing or not a number (its name in ``args[0]``)."""


def _text(element: ET.Element | None, tag: str) -> str | None:
    found = None if element is None else element.find(tag)
    return None if found is None or found.text is None else found.text.strip()


def _size(root: ET.Element) -> tuple[int, int] | None:
    size = root.find("size")
    if size is None:
        return None
    values = []
    for tag in ("width", "height"):
        text = _text(size, tag)
        if text is None or text == "":
            return None
        try:
            value = float(text)
        except ValueError:
            raise _BadField(f"size/{tag}") from None
        if not math.isfinite(value) or value < 0 or value != int(value):
            raise _BadField(f"size/{tag}")
        values.append(int(value))
    return None if 0 in values else (values[0], values[1])


_FLAG_WORDS = {"true": True, "yes": True, "false": False, "no": False}


def _flag(element: ET.Element, tag: str) -> bool:
    text = _text(element, tag)
    if text is None or text == "":
        return False
    word = text.strip().lower()
    if word in _FLAG_WORDS:
        return _FLAG_WORDS[word]
    try:
        return int(word) != 0
    except ValueError:
        raise _BadField(tag) from None


def _object(element: ET.Element, source: str) -> VocObject:
    name = _text(element, "name")
    if not name:
        raise _BadField("name")
    bndbox = element.find("bndbox")
    if bndbox is None:
        raise _BadField("bndbox")
    values = []
    for tag in _BOX_FIELDS:
        text = _text(bndbox, tag)
        try:
            values.append(float(text or ""))
        except ValueError:
            raise _BadField(f"bndbox/{tag}") from None
    xmin, ymin, xmax, ymax = values
    box = (xmin - 1.0, ymin - 1.0, xmax, ymax)
    return VocObject(name=name, box=box, difficult=_flag(element, "difficult"),
                     truncated=_flag(element, "truncated"), source=source)


def _object_problem(source: str, reason: str, detail: str, image: str) -> AnnotationProblem:
    return AnnotationProblem(source=source, reason=reason, detail=detail, image=image, kept="image")


def parse_voc_xml(data: bytes, source: str, image: str = "") -> VocFile | AnnotationProblem:
    """One VOC annotation file.

    Args:
      data: the file's bytes.
      source: how problems name the file (its path relative to the VOC folder).
      image: the image's relative path when known (problems name it), else ``""``.

    Returns:
      The ``VocFile``, or one ``bad_annotation_file`` problem (nothing kept) when the
      file does not parse, is refused (a DTD or an entity), or its size is not a number.
    """
    def bad(detail: str) -> AnnotationProblem:
        return AnnotationProblem(source=source, reason="bad_annotation_file", detail=detail,
                                 image=image, kept="nothing")

    if _declares(data):
        return bad("a DTD or entity declaration (refused: VOC files have none)")
    try:
        root = ET.fromstring(data)
    except ET.ParseError as err:
        line = err.position[0] if err.position else 0
        return bad(f"not well-formed XML (line {line})")
    if root.tag != "annotation":
        return bad("the root element is not <annotation>")
    try:
        stated = _size(root)
    except _BadField as err:
        return bad(f"{err.args[0]} is not a whole number")
    objects, problems = [], []
    for number, element in enumerate(root.findall("object"), start=1):
        where = f"{source}: object {number}"
        try:
            found = _object(element, where)
        except _BadField as err:
            problems.append(_object_problem(where, "bad_object",
                                            f"the object's {err.args[0]} is missing or does not parse", image))
            continue
        if not all(math.isfinite(v) for v in found.box):
            problems.append(_object_problem(where, "box_not_finite",
                                            "bndbox has a coordinate that is not a finite number", image))
            continue
        objects.append(found)
    return VocFile(filename=_text(root, "filename") or "", stated_size=stated,
                   objects=tuple(objects), problems=tuple(problems))
