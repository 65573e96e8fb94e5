"""Annotated folders: which layout a folder is, and its Pascal VOC or YOLO annotations.

Pure functions over a listing: the caller lists the folder (paths relative to it,
``/``-separated, files only) and gives ``read(relative_path) -> bytes | None`` for the
few files read (XML, split files, yaml, label files). The files' contents are parsed by
``codec.voc`` and ``codec.yolo``; here they are found, paired with their images, split,
and given a label map.

Layout detection (``detect_annotation_layout``), from the top-level names only (the
listing's first path parts; a folder may be given as ``"name/"``, so an empty one counts):

* ``"voc"``: the folder holds ``Annotations/`` and ``JPEGImages/``;
* ``"yolo"``: it holds ``images/`` and ``labels/`` and, beside them, ``data.yaml`` (or,
  when ``read`` is given, another ``*.yaml`` with a ``names`` key); or, when ``read``
  is given, a ``data.yaml`` with a ``names`` key whatever its folders are called
  (Roboflow's export: ``train/images``, ``train/labels``, ``valid/...``);
* ``None`` otherwise, and when both match: it never guesses between two (``--layout``
  decides).

Pascal VOC (``read_voc_folder``): every ``Annotations/<id>.xml`` describes the image
``JPEGImages/<id>.<ext>`` (when several files share the stem, the one the XML's
``<filename>`` names; when none has it, the file ``<filename>`` names). Splits come from
``ImageSets/Main/{train,val,trainval,test}.txt`` (one id per line; the per-class files
such as ``cat_train.txt`` are not read): ``train``, ``val`` (split ``validation``) and
``test`` assign their ids; ``trainval`` (in VOC's releases the union of ``train`` and
``val``) puts in ``train`` only the ids that neither ``train`` nor ``val`` lists, so it
adds nothing when both are there and is the training split when it is alone. An id in
two of ``train``, ``val``, ``test`` is a ``split_conflict`` (the first kept, in that
order). Images the split files leave out (when there are any) keep the split ``""``: the
run's ``--splits`` decide. ``source_id`` is the image's relative path. The label map: the
class names of the objects kept, sorted, ids from 1 (0 is the background; a labels file
will override the order). An image of ``JPEGImages/`` that no XML describes (VOC's test
images) is not converted and not a problem: the caller counts it (``voc_images``), like
COCO's images its file does not name. Problems: an XML without its image
(``image_not_found``, nothing kept); a split file's id with neither an XML nor an image
(``annotation_not_found``, once per id; it names no image, so it is passed over); and
what ``codec.voc`` finds in each file.

YOLO (``read_yolo_folder``): ``data.yaml`` (``codec.yolo``) names the classes and each
split's image folders; every image found under a split's folders (at any depth) is one
image of that split, its labels in the file Ultralytics reads: the path with its last
``images/`` folder replaced by ``labels/`` and its extension by ``.txt``. An image
without a label file, or with an empty one, is an image without objects. A label file
in a split's label folder whose image does not exist is ``image_not_found``; a split
folder without images is ``image_not_found`` too (the yaml named it); an image under
two splits' folders is a ``split_conflict`` (the first kept: train, val, test). Images
under ``images/`` that no split names are not read. Boxes are normalized
(``units="normalized"``); the label map is ``names``, ids = class index + 1.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable, Iterable

from beam_tfrecords.schemas.annotations import (
    Annotated,
    AnnotationProblem,
    ImageAnnotations,
    LabelMap,
    ObjectAnnotation,
)
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.codec.voc import VocFile, parse_voc_xml
from beam_tfrecords.transforms.codec.yolo import parse_data_yaml, parse_label_file, yaml_names_classes

__all__ = [
    "VOC_SPLIT_FILES",
    "YOLO_YAML",
    "detect_annotation_layout",
    "read_voc_folder",
    "read_yolo_folder",
    "voc_images",
    "yolo_label_path",
]

Read = Callable[[str], "bytes | None"]

YOLO_YAML = "data.yaml"
# ImageSets/Main/<name>.txt -> split, in the order they are applied.
VOC_SPLIT_FILES = (("train", "train"), ("val", "validation"), ("test", "test"), ("trainval", "train"))
_VOC_SPLITS = "ImageSets/Main/"


def _top_level(paths: Iterable[str]) -> tuple[set[str], set[str]]:
    """``(folders, files)`` at the top of the listing."""
    folders, files = set(), set()
    for path in paths:
        head, sep, _ = path.partition("/")
        (folders if sep else files).add(head)
    return folders, files


def _yolo_yaml(files: set[str], read: Read | None) -> str | None:
    if YOLO_YAML in files:
        return YOLO_YAML
    if read is None:
        return None
    for name in sorted(f for f in files if f.lower().endswith((".yaml", ".yml"))):
        data = read(name)
        if data is not None and yaml_names_classes(data):
            return name
    return None


def detect_annotation_layout(paths: Iterable[str], read: Read | None = None) -> str | None:
    """``"voc"``, ``"yolo"`` or ``None`` for a folder's listing (see the module docstring).

    Args:
      paths: every file under the folder, relative to it.
      read: reads a top-level ``*.yaml`` to see whether it names classes; without it,
        only ``data.yaml`` makes a YOLO folder.
    """
    folders, files = _top_level(paths)
    voc = {"Annotations", "JPEGImages"} <= folders
    yaml_name = _yolo_yaml(files, read)
    # A data.yaml naming classes makes a YOLO folder whatever its folders are called
    # (Roboflow's export: train/images, train/labels, valid/..., test/...).
    named = yaml_name is not None and read is not None and yaml_names_classes(read(yaml_name) or b"")
    yolo = yaml_name is not None and ({"images", "labels"} <= folders or named)
    if voc == yolo:
        return None
    return "voc" if voc else "yolo"


def _stem(path: str) -> str:
    return posixpath.splitext(posixpath.basename(path))[0]


def _decoded(data: bytes) -> str | None:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _nothing(source: str, reason: str, detail: str, image: str = "") -> AnnotationProblem:
    return AnnotationProblem(source=source, reason=reason, detail=detail, image=image, kept="nothing")


def _voc_splits(paths: set[str], read: Read, problems: list) -> tuple[dict[str, str], list]:
    """``{id: split}`` from ImageSets/Main, and ``(id, source)`` of every listed id; a
    problem's ``image`` holds the id (the caller turns it into the image's path)."""
    splits: dict[str, str] = {}
    listed = []
    for name, split in VOC_SPLIT_FILES:
        path = f"{_VOC_SPLITS}{name}.txt"
        data = read(path) if path in paths else None
        if data is None:
            continue
        text = _decoded(data)
        if text is None:
            problems.append(_nothing(path, "bad_annotation_file", "not UTF-8 text"))
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            fields = line.split()
            if not fields:
                continue
            image_id, where = fields[0], f"{path}:{number}"
            listed.append((image_id, where))
            if name == "trainval":
                splits.setdefault(image_id, split)
            elif splits.setdefault(image_id, split) != split:
                problems.append(AnnotationProblem(
                    source=where, reason="split_conflict", image=image_id,
                    detail=f"also listed in the split {splits[image_id]}, which is kept"))
    return splits, listed


def _voc_image(parsed: VocFile, image_id: str, images: set[str], by_stem: dict[str, list[str]]) -> str | None:
    named = f"JPEGImages/{parsed.filename}" if parsed.filename else ""
    same_stem = by_stem.get(image_id, [])
    if named in same_stem or (not same_stem and named in images):
        return named
    return same_stem[0] if same_stem else None


def _voc_files(paths: set[str], read: Read, problems: list
               ) -> tuple[dict[str, tuple[str, VocFile]], set[str]]:
    """``{image: (xml, parsed)}`` of the XML files whose image exists, and the ids of all XMLs."""
    images = set(voc_images(paths))
    by_stem: dict[str, list[str]] = {}
    for path in sorted(images):
        by_stem.setdefault(_stem(path), []).append(path)
    found: dict[str, tuple[str, VocFile]] = {}
    ids = set()
    for xml in sorted(p for p in paths if p.startswith("Annotations/") and p.count("/") == 1
                      and p.lower().endswith(".xml")):
        image_id = _stem(xml)
        ids.add(image_id)
        parsed = parse_voc_xml(read(xml) or b"", xml)
        if isinstance(parsed, AnnotationProblem):
            image = (by_stem.get(image_id) or [""])[0]
            problems.append(dataclasses.replace(parsed, image=image))
            continue
        image = _voc_image(parsed, image_id, images, by_stem)
        if image is None:
            problems.append(_nothing(xml, "image_not_found", "no image in JPEGImages for this file"))
        elif image in found:
            problems.append(_nothing(xml, "bad_annotation_file",
                                     "names an image another annotation file describes", image))
        else:
            problems.extend(dataclasses.replace(p, image=image) for p in parsed.problems)
            found[image] = (xml, parsed)
    return found, ids


def voc_images(paths: Iterable[str]) -> list[str]:
    """The images of a Pascal VOC folder: the image files directly in ``JPEGImages/``."""
    return sorted(p for p in paths if p.startswith("JPEGImages/") and p.count("/") == 1 and is_image_filename(p))


def read_voc_folder(paths: Iterable[str], read: Read) -> Annotated:
    """A Pascal VOC folder's annotations (see the module docstring).

    Args:
      paths: every file under the folder, relative to it.
      read: the bytes of a file of ``paths`` (``None`` if it vanished).
    """
    paths = set(paths)
    problems: list[AnnotationProblem] = []
    found, ids = _voc_files(paths, read, problems)
    split_problems: list[AnnotationProblem] = []
    splits, listed = _voc_splits(paths, read, split_problems)
    image_of = {_stem(xml): image for image, (xml, _) in found.items()}
    problems.extend(dataclasses.replace(p, image=image_of.get(p.image, "")) if p.image else p
                    for p in split_problems)
    stems = {_stem(p) for p in voc_images(paths)}
    first: dict[str, str] = {}
    for image_id, where in listed:
        first.setdefault(image_id, where)
    for image_id, where in first.items():  # Each id once; an image without XML is not converted.
        if image_id not in ids and image_id not in stems:
            problems.append(_nothing(where, "annotation_not_found", "no Annotations/ file and no image for this id"))
    names = sorted({o.name for _, parsed in found.values() for o in parsed.objects})
    label_map = LabelMap(tuple(enumerate(names, start=1)))
    label_of = {name: label for label, name in label_map.items}
    images = []
    for image in sorted(found):
        xml, parsed = found[image]
        objects = tuple(ObjectAnnotation(box=o.box, label=label_of[o.name], text=o.name,
                                         difficult=o.difficult, truncated=o.truncated, source=o.source)
                        for o in parsed.objects)
        images.append(ImageAnnotations(path=image, source_id=image, objects=objects,
                                       stated_size=parsed.stated_size,
                                       split=splits.get(_stem(xml), ""), source=xml))
    return Annotated(layout="voc", images=tuple(images), label_map=label_map, problems=tuple(problems))


def yolo_label_path(image: str) -> str:
    """The label file Ultralytics reads for ``image``: its last ``images/`` folder
    replaced by ``labels/``, its extension by ``.txt``."""
    rooted = "/" + image
    if "/images/" in rooted:
        rooted = "/labels/".join(rooted.rsplit("/images/", 1))
    return posixpath.splitext(rooted[1:])[0] + ".txt"


def _yolo_image(image: str, split: str, paths: set[str], read: Read, names) -> tuple[ImageAnnotations, tuple]:
    label = yolo_label_path(image)
    data = read(label) if label in paths else None
    objects: tuple = ()
    problems: tuple = ()
    if data is not None:
        text = _decoded(data)
        if text is None:
            problems = (AnnotationProblem(source=label, reason="bad_label_line", detail="not UTF-8 text",
                                          image=image, kept="image"),)
        else:
            objects, problems = parse_label_file(text, label, names, image)
    found = ImageAnnotations(path=image, source_id=image, objects=objects, units="normalized",
                             split=split, source=label if data is not None else "")
    return found, problems


def read_yolo_folder(paths: Iterable[str], read: Read) -> Annotated:
    """A YOLO (Ultralytics) folder's annotations (see the module docstring).

    Args:
      paths: every file under the folder, relative to it.
      read: the bytes of a file of ``paths`` (``None`` if it vanished).
    """
    paths = set(paths)
    yaml_path = _yolo_yaml(_top_level(paths)[1], read)
    data = read(yaml_path) if yaml_path else None
    config = (parse_data_yaml(data, yaml_path) if data is not None and yaml_path else
              _nothing(YOLO_YAML, "bad_annotation_file", "no data.yaml naming the classes"))
    if isinstance(config, AnnotationProblem):
        return Annotated(layout="yolo", images=(), label_map=LabelMap(()), problems=(config,))
    problems: list[AnnotationProblem] = []
    images: dict[str, ImageAnnotations] = {}
    label_folders = set()
    for split, folders in config.splits:
        for folder in folders:
            prefix = folder + "/" if folder else ""
            label_folders.add(posixpath.dirname(yolo_label_path(prefix + "x.jpg")))
            under = sorted(p for p in paths if p.startswith(prefix) and is_image_filename(p))
            if not under:
                problems.append(_nothing(yaml_path, "image_not_found", f"the {split} folder holds no image"))
            for image in under:
                if image in images:
                    problems.append(AnnotationProblem(
                        source=yaml_path, reason="split_conflict", image=image,
                        detail=f"under the {split} folder too; the split {images[image].split} is kept"))
                    continue
                images[image], found = _yolo_image(image, split, paths, read, config.names)
                problems.extend(found)
    labels_of_images = {yolo_label_path(p) for p in paths if is_image_filename(p)}
    for label in sorted(p for p in paths if p.endswith(".txt") and p not in labels_of_images):
        if any(label.startswith(f + "/") if f else "/" not in label for f in label_folders):
            problems.append(_nothing(label, "image_not_found", "a label file without its image"))
    label_map = LabelMap(tuple((index + 1, name) for index, name in config.names))
    return Annotated(layout="yolo", images=tuple(images[p] for p in sorted(images)),
                     label_map=label_map, problems=tuple(problems))
