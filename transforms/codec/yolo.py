"""YOLO (Ultralytics layout): ``data.yaml`` and label files, text in, structures out.

Pure parsing (the folder reader, ``plan.annotation_folders``, finds the files).

``data.yaml`` (read with ``yaml.safe_load``): ``names`` is a list (class index = list
position) or a mapping ``{index: name}`` (indices whole numbers from 0, any order, gaps
allowed); ``path`` (optional) is the dataset root, relative to the yaml's folder, and
ignored when it is absolute or leaves that folder (it then names where the dataset lay
on the machine that wrote the yaml: the folder read is the dataset); ``train``, ``val``
and ``test`` are each a folder or a list of folders, relative to ``path`` (or to the
yaml's folder without one); one that leaves the folder by a leading ``../`` is tried
without it, as Ultralytics does (Roboflow's exports write ``../train/images``). ``val``
is the split ``validation``. Other keys (``nc``, ``download``, ...) are ignored. A file
list (a ``.txt`` in place of a folder) and absolute or outside paths are refused: the
reader reads inside the input only.

Label files: one object per line, ``class cx cy w h``, the class a whole number (or
one written as a float with nothing after the point, ``0.0``, which Ultralytics reads as
``int(float(x))``; ``0.5`` is refused) and the box normalized to the image (centre and size); blank lines are skipped. A box becomes
the contract's normalized corners ``(cx - w/2, cy - h/2, cx + w/2, cy + h/2)`` (the
record builder, knowing the size, turns them into pixels and clips them). Its label id
is the class index + 1 (0 is the background), its text the class name.

A segmentation line (Ultralytics' ``class x1 y1 x2 y2 x3 y3 ...``: a class and three or
more normalized points) gives the box around its points, as Ultralytics' detection does;
the polygon itself is not kept (the contract's polygons are in pixels).

Problems (the image is always kept; its other objects too): a line with neither five
fields nor a polygon's, or whose fields are not numbers (or whose class is not a
whole number), is ``bad_label_line``; a class
index ``names`` lacks is ``unknown_category``; a coordinate that is not finite is
``box_not_finite``.
A yaml that does not parse or lacks ``names`` is one ``bad_annotation_file``.
"""

from __future__ import annotations

import dataclasses
import math
import posixpath

import yaml

from beam_tfrecords.schemas.annotations import AnnotationProblem, ObjectAnnotation

__all__ = [
    "YOLO_SPLITS",
    "YoloConfig",
    "parse_data_yaml",
    "parse_label_file",
    "yaml_names_classes",
]

# data.yaml key -> split name.
YOLO_SPLITS = (("train", "train"), ("val", "validation"), ("test", "test"))


@dataclasses.dataclass(frozen=True)
class YoloConfig:
    """What ``data.yaml`` says.

    Attributes:
      names: ``(index, name)`` in index order.
      splits: ``(split, folders)``: each split's image folders, relative to the folder
        that holds the yaml, ``/``-separated, normalized; splits the yaml leaves out are
        absent.
    """

    names: tuple[tuple[int, str], ...]
    splits: tuple[tuple[str, tuple[str, ...]], ...]


class _Refused(ValueError):
    """A data.yaml value the reader does not take (what, in ``args[0]``)."""


def _names(value: object) -> tuple[tuple[int, str], ...]:
    if isinstance(value, list):
        pairs = list(enumerate(value))
    elif isinstance(value, dict):
        pairs = []
        for key, name in value.items():
            if isinstance(key, bool) or not isinstance(key, (int, str)) or not str(key).isdigit():
                raise _Refused("names has a key that is not a class index")
            pairs.append((int(key), name))
    else:
        raise _Refused("names is neither a list nor a mapping")
    if not pairs:
        raise _Refused("names is empty")
    if len({i for i, _ in pairs}) != len(pairs):
        raise _Refused("names gives one class index twice")
    if any(not isinstance(n, (str, int, float)) or isinstance(n, bool) or str(n).strip() == "" for _, n in pairs):
        raise _Refused("names has a class without a name")
    return tuple(sorted((i, str(n).strip()) for i, n in pairs))


def _inside(base: str, text: str) -> str | None:
    """``text`` joined to ``base``, normalized (``""`` for the folder itself), or ``None``
    when it is absolute or leaves the folder."""
    joined = posixpath.normpath(posixpath.join(base, text))
    if posixpath.isabs(text) or joined == ".." or joined.startswith("../"):
        return None
    return "" if joined == "." else joined


def _folder(base: str, value: object, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Refused(f"{key} is not a folder")
    text = value.strip()
    if text.lower().endswith(".txt"):
        raise _Refused(f"{key} names a file list (only folders are read)")
    joined = _inside(base, text)
    if joined is None and text.startswith("../"):
        joined = _inside(base, text[3:])  # Ultralytics' own fallback (Roboflow's ../train/images).
    if joined is None:
        raise _Refused(f"{key} is outside the dataset folder")
    return joined


def _splits(config: dict) -> tuple[tuple[str, tuple[str, ...]], ...]:
    path = config.get("path")
    base = (_inside("", path.strip()) or "") if isinstance(path, str) else ""
    splits = []
    for key, split in YOLO_SPLITS:
        value = config.get(key)
        if value is None or value == "":
            continue
        values = value if isinstance(value, list) else [value]
        splits.append((split, tuple(_folder(base, v, key) for v in values)))
    return tuple(splits)


def yaml_names_classes(data: bytes) -> bool:
    """Whether ``data`` is a YAML mapping with a ``names`` key (what makes a ``*.yaml`` at
    a folder's top a YOLO dataset file); ``False`` for anything that does not parse."""
    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError:
        return False
    return isinstance(config, dict) and "names" in config


def parse_data_yaml(data: bytes, source: str) -> YoloConfig | AnnotationProblem:
    """``data.yaml``.

    Args:
      data: the file's bytes.
      source: how a problem names the file (its path relative to the input).

    Returns:
      The ``YoloConfig``, or one ``bad_annotation_file`` problem (nothing kept).
    """
    def bad(detail: str) -> AnnotationProblem:
        return AnnotationProblem(source=source, reason="bad_annotation_file", detail=detail, kept="nothing")

    try:
        config = yaml.safe_load(data)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        return bad(f"not valid YAML (line {mark.line + 1})" if mark is not None else "not valid YAML")
    if not isinstance(config, dict) or "names" not in config:
        return bad("no names (the class names)")
    try:
        return YoloConfig(names=_names(config["names"]), splits=_splits(config))
    except _Refused as err:
        return bad(str(err))


def _class_index(field: str) -> int | None:
    """A class field as Ultralytics reads it (``int(float(x))``), integral values only:
    ``3`` and ``3.0`` are 3; ``None`` for ``3.5`` or a value that is not finite.

    Raises:
      ValueError: not a number.
    """
    try:
        return int(field)
    except ValueError:
        value = float(field)
    return int(value) if math.isfinite(value) and value == int(value) else None


def _line(fields: list[str], where: str, names: dict[int, str], image: str
          ) -> ObjectAnnotation | AnnotationProblem:
    def problem(reason: str, detail: str) -> AnnotationProblem:
        return AnnotationProblem(source=where, reason=reason, detail=detail, image=image, kept="image")

    polygon = len(fields) >= 7 and len(fields) % 2 == 1
    if len(fields) != 5 and not polygon:
        return problem("bad_label_line", f"{len(fields)} fields, not 5 (class cx cy w h) or a polygon")
    try:
        index = _class_index(fields[0])
        values = [float(v) for v in fields[1:]]
    except ValueError:
        return problem("bad_label_line", "a field is not a number")
    if index is None:
        return problem("bad_label_line", "the class is not a whole number")
    if index not in names:
        return problem("unknown_category", f"class index {index} is not in names")
    if polygon:
        xs, ys = values[0::2], values[1::2]
        box = (min(xs), min(ys), max(xs), max(ys))
    else:
        cx, cy, w, h = values
        box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
    if not all(math.isfinite(v) for v in box):
        return problem("box_not_finite", "a coordinate is not a finite number")
    return ObjectAnnotation(box=box, label=index + 1, text=names[index], source=where)


def parse_label_file(text: str, source: str, names: tuple[tuple[int, str], ...], image: str = ""
                     ) -> tuple[tuple[ObjectAnnotation, ...], tuple[AnnotationProblem, ...]]:
    """One label file's objects (normalized boxes), in line order, and its problems.

    Args:
      text: the file's text.
      source: the file's relative path; objects and problems are named ``source:LINE``.
      names: ``YoloConfig.names``.
      image: the image's relative path (problems name it).
    """
    by_index = dict(names)
    objects, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        found = _line(fields, f"{source}:{number}", by_index, image)
        (problems if isinstance(found, AnnotationProblem) else objects).append(found)
    return tuple(objects), tuple(problems)
