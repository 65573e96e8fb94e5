"""One image's annotations as bytes: what ``ImageRef.annotation`` carries to the workers.

An annotated listing's references travel through the job graph, the listing's hand-off
in the output's temporary folder (storage others may write to), and Beam's element
encodings; so an image's ``ImageAnnotations`` travels with its reference as plain data,
never as code: compact JSON (sorted keys, no whitespace, ASCII), read back with JSON's
parser and checked field by field. ``encode_annotations`` is deterministic (the same
annotations give the same bytes); floats come back exactly (JSON writes a float's
shortest round-tripping form, ``NaN`` and ``Infinity`` included).

The layout (version 1), one JSON object; a field at its default is left out:

* ``v``: 1; ``p``: path; ``i``: source_id; ``o``: the objects; ``l``: labels; ``t``:
  texts; ``u``: units; ``z``: stated size ``[width, height]``; ``m``: mask; ``s``:
  split; ``f``: source.
* an object: ``[box, label, text, flags, area, segmentation, source]``, ``box`` four
  numbers, ``flags`` ``is_crowd | difficult << 1 | truncated << 2``, ``area`` a number
  or ``null``, ``segmentation`` ``null``, ``{"p": rings}`` (polygons) or ``{"r":
  [height, width, counts]}`` (RLE).

``decode_annotations`` raises ``ValueError`` on bytes that are not such a value, naming
the field, never quoting the bytes.
"""

from __future__ import annotations

import json

from beam_tfrecords.schemas.annotations import ImageAnnotations, ObjectAnnotation, Polygons, Rle

__all__ = ["ANNOTATION_FORMAT_VERSION", "decode_annotations", "encode_annotations"]

ANNOTATION_FORMAT_VERSION = 1
_UNITS = ("pixels", "normalized")
_TOP_KEYS = frozenset("vpioltuzmsf")
_CROWD, _DIFFICULT, _TRUNCATED = 1, 2, 4


def _segmentation(segmentation) -> object:
    if segmentation is None:
        return None
    if isinstance(segmentation, Polygons):
        return {"p": [list(ring) for ring in segmentation.rings]}
    if isinstance(segmentation, Rle):
        return {"r": [segmentation.size[0], segmentation.size[1], list(segmentation.counts)]}
    raise TypeError(f"segmentation must be Polygons, Rle or None, not {type(segmentation).__name__}")


def _object(obj: ObjectAnnotation) -> list:
    flags = (_CROWD if obj.is_crowd else 0) | (_DIFFICULT if obj.difficult else 0) \
        | (_TRUNCATED if obj.truncated else 0)
    return [list(obj.box), obj.label, obj.text, flags, obj.area, _segmentation(obj.segmentation),
            obj.source]


def encode_annotations(annotations: ImageAnnotations) -> bytes:
    """``annotations`` as compact, deterministic JSON bytes (see the module docstring)."""
    value: dict[str, object] = {"v": ANNOTATION_FORMAT_VERSION, "p": annotations.path,
                                "i": annotations.source_id}
    optional = (("o", [_object(o) for o in annotations.objects], []),
                ("l", list(annotations.labels), []), ("t", list(annotations.texts), []),
                ("u", annotations.units, "pixels"),
                ("z", list(annotations.stated_size) if annotations.stated_size is not None else None, None),
                ("m", annotations.mask, ""), ("s", annotations.split, ""), ("f", annotations.source, ""))
    for key, field, default in optional:
        if field != default:
            value[key] = field
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


class _Bad(ValueError):
    """A field that is not what the layout says (its name in the message)."""


def _number(value, where: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"{where} is not a number")
    return value


def _integer(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Bad(f"{where} is not an integer")
    return value


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{where} is not a string")
    return value


def _list(value, where: str, length: int | None = None) -> list:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise _Bad(f"{where} is not a list" + ("" if length is None else f" of {length}"))
    return value


def _read_segmentation(value, where: str) -> Polygons | Rle | None:
    if value is None:
        return None
    if isinstance(value, dict) and set(value) == {"p"}:
        rings = _list(value["p"], f"{where} polygons")
        return Polygons(tuple(tuple(_number(v, f"{where} polygon point")
                                    for v in _list(ring, f"{where} ring")) for ring in rings))
    if isinstance(value, dict) and set(value) == {"r"}:
        height, width, counts = _list(value["r"], f"{where} rle", 3)
        return Rle((_integer(height, f"{where} rle height"), _integer(width, f"{where} rle width")),
                   tuple(_integer(c, f"{where} rle count") for c in _list(counts, f"{where} rle counts")))
    raise _Bad(f"{where} segmentation is neither polygons nor rle")


def _read_object(value, index: int) -> ObjectAnnotation:
    where = f"object {index}"
    box, label, text, flags, area, segmentation, source = _list(value, where, 7)
    flags = _integer(flags, f"{where} flags")
    if not 0 <= flags <= _CROWD | _DIFFICULT | _TRUNCATED:
        raise _Bad(f"{where} flags out of range")
    return ObjectAnnotation(
        box=tuple(_number(v, f"{where} box") for v in _list(box, f"{where} box", 4)),
        label=_integer(label, f"{where} label"), text=_string(text, f"{where} text"),
        is_crowd=bool(flags & _CROWD), area=None if area is None else _number(area, f"{where} area"),
        difficult=bool(flags & _DIFFICULT), truncated=bool(flags & _TRUNCATED),
        segmentation=_read_segmentation(segmentation, where), source=_string(source, f"{where} source"))


def _read(value) -> ImageAnnotations:
    if not isinstance(value, dict):
        raise _Bad("not a JSON object")
    if not set(value) <= _TOP_KEYS or value.get("v") != ANNOTATION_FORMAT_VERSION:
        raise _Bad(f"not annotations of format version {ANNOTATION_FORMAT_VERSION}")
    units = _string(value.get("u", "pixels"), "units")
    if units not in _UNITS:
        raise _Bad(f"units must be one of {_UNITS}")
    size = value.get("z")
    if size is not None:
        size = tuple(_integer(v, "stated size") for v in _list(size, "stated size", 2))
    return ImageAnnotations(
        path=_string(value.get("p"), "path"), source_id=_string(value.get("i"), "source_id"),
        objects=tuple(_read_object(o, i) for i, o in enumerate(_list(value.get("o", []), "objects"))),
        labels=tuple(_integer(v, "label") for v in _list(value.get("l", []), "labels")),
        texts=tuple(_string(v, "text") for v in _list(value.get("t", []), "texts")), units=units,
        stated_size=size,
        mask=_string(value.get("m", ""), "mask"), split=_string(value.get("s", ""), "split"),
        source=_string(value.get("f", ""), "source"))


def decode_annotations(data: bytes) -> ImageAnnotations:
    """The ``ImageAnnotations`` that ``encode_annotations`` made ``data`` from.

    Raises:
      ValueError: ``data`` is not such bytes (not ASCII JSON, another version, a field
        of the wrong kind); the message names the field, not the bytes.
    """
    try:
        value = json.loads(bytes(data).decode("ascii"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, TypeError) as err:
        raise ValueError(f"annotation bytes ({len(data)} bytes) are not annotations: "
                         f"{type(err).__name__}") from None
    try:
        return _read(value)
    except _Bad as err:
        raise ValueError(f"annotation bytes ({len(data)} bytes) are not annotations: {err}") from None
    except (TypeError, ValueError, RecursionError):  # A list of the wrong length to unpack, and such.
        raise ValueError(f"annotation bytes ({len(data)} bytes) are not annotations: "
                         "a field has the wrong shape") from None
