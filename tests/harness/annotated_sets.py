"""Small annotated image sets in the public layouts, and what their records must hold
(issue 21): a box CSV, COCO instances, Pascal VOC, YOLO (Ultralytics), semantic masks,
several labels per image.

Every maker writes a handful of distinct images of a few sizes (seeded noise, PNG
unless the layout is JPEG's) and its annotation files under ``root``, and returns an
``AnnotatedSet``: the ``convert`` flags that read it, and per image (keyed by the
``image/source_id`` it must get) the ``Expected`` record, computed here from the
numbers written into the annotation files, never by the product's code:

- boxes normalized to the stored image, ``(xmin, ymin, xmax, ymax)``, in the
  annotations' order (COCO ``[x, y, w, h]`` -> ``(x, y, x + w, y + h) / size``; YOLO's
  centre and size -> corners; VOC's 1-based inclusive indices -> ``(xmin - 1,
  ymin - 1, xmax, ymax) / size``, as ``transforms/codec/voc.py`` documents);
- class ids (COCO's category ids as given; otherwise 1-based in the sorted names'
  order), texts, crowd, difficult and truncated flags;
- instance masks: a polygon's rings (its mask must cover the shoelace area within the
  perimeter) or the exact 0/1 array an RLE encodes;
- a semantic mask's exact array; several labels' ids and texts;
- the image's bytes (an image stored as given) or its displayed pixels (an EXIF-turned
  one, which is stored turned).

``red_inside`` finds a drawn pure red rectangle in decoded pixels and checks it sits
inside a normalized box (the geometry checks).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

__all__ = [
    "AnnotatedSet",
    "Expected",
    "coco_rle_compressed",
    "exif_photo",
    "label_map_items",
    "make_box_csv",
    "make_coco",
    "make_multi_label",
    "make_semantic_masks",
    "make_voc",
    "make_yolo",
    "noise_image",
    "red_pixels",
    "shoelace",
]

RED = (255, 0, 0)


@dataclasses.dataclass
class Expected:
    """One image's record, as its annotations say it must be.

    Attributes:
      path: the image file, relative to the set's root.
      size: ``(width, height)`` of the stored image.
      split: the split the layout assigns, or ``None`` (the run decides).
      boxes: normalized ``(xmin, ymin, xmax, ymax)`` per object.
      classes, texts, crowd, difficult, truncated: per object.
      rings: per object, a polygon's rings (``((x0, y0, x1, y1, ...), ...)``) or ``None``.
      masks: per object, the exact 0/1 mask of an RLE or ``None``.
      areas: per object, ``image/object/area`` in pixels (COCO's as given, else the box's).
      segmentation: the semantic mask, or ``None``.
      labels, label_texts: several labels per image.
      encoded: the file's bytes when the record must hold them as they are, else ``None``.
      displayed: the pixels the record must hold (an EXIF-turned image), else ``None``.
      red_box: the normalized box around a drawn red rectangle, or ``None``.
    """

    path: str
    size: tuple[int, int]
    split: str | None = None
    boxes: list = dataclasses.field(default_factory=list)
    classes: list = dataclasses.field(default_factory=list)
    texts: list = dataclasses.field(default_factory=list)
    crowd: list = dataclasses.field(default_factory=list)
    difficult: list = dataclasses.field(default_factory=list)
    truncated: list = dataclasses.field(default_factory=list)
    rings: list = dataclasses.field(default_factory=list)
    masks: list = dataclasses.field(default_factory=list)
    areas: list = dataclasses.field(default_factory=list)
    segmentation: np.ndarray | None = None
    labels: list = dataclasses.field(default_factory=list)
    label_texts: list = dataclasses.field(default_factory=list)
    encoded: bytes | None = None
    displayed: np.ndarray | None = None
    red_box: tuple | None = None

    def add(self, box, label: int, text: str, *, crowd=False, difficult=False, truncated=False,
            ring=None, mask=None, area=None) -> None:
        """One object; ``area`` in pixels as given (COCO's), else the box's."""
        width, height = self.size
        self.areas.append(float(area) if area is not None else (box[2] - box[0]) * width * (box[3] - box[1]) * height)
        self.boxes.append(tuple(float(v) for v in box))
        self.classes.append(label)
        self.texts.append(text)
        self.crowd.append(bool(crowd))
        self.difficult.append(int(difficult))
        self.truncated.append(int(truncated))
        self.rings.append(ring)
        self.masks.append(mask)


@dataclasses.dataclass
class AnnotatedSet:
    """A generated set: its ``convert`` flags (paths absolute), the layout the run must
    report, the label map ``((id, name), ...)`` and the records by source id."""

    flags: list[str]
    layout: str
    label_map: tuple[tuple[int, str], ...]
    records: dict[str, Expected]
    extra: dict = dataclasses.field(default_factory=dict)

    @property
    def splits(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for expected in self.records.values():
            if expected.split is not None:
                counts[expected.split] = counts.get(expected.split, 0) + 1
        return counts

    @property
    def objects(self) -> int:
        return sum(len(e.boxes) for e in self.records.values())

    @property
    def without_objects(self) -> int:
        return sum(not e.boxes and not e.labels for e in self.records.values())


def label_map_items(text: str) -> list[tuple[int, str]]:
    """``label_map.pbtxt``'s ``(id, name)`` pairs, in file order (the Object Detection
    API's ``item { id: N name: '...' }``)."""
    import re  # pylint: disable=import-outside-toplevel

    return [(int(i), n) for i, n in re.findall(r"item\s*\{\s*id:\s*(\d+)\s*name:\s*'([^']*)'\s*\}", text)]


def noise_image(size: tuple[int, int], seed: int, red: tuple | None = None) -> np.ndarray:
    """A distinct picture: smooth noise with little red (R < 48, G and B 80-175), and a
    pure red rectangle ``red`` ``(x0, y0, x1, y1)`` (pixel edges) when given."""
    width, height = size
    rng = np.random.default_rng([seed, width, height])
    coarse = rng.uniform(0, 1, (max(2, height // 8), max(2, width // 8), 3))
    smooth = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize((width, height), Image.BILINEAR),
                        dtype=np.float64) / 255
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[:, :, 0] = (smooth[:, :, 0] * 47).astype(np.uint8)
    pixels[:, :, 1:] = (80 + smooth[:, :, 1:] * 95).astype(np.uint8)
    if red is not None:
        x0, y0, x1, y1 = red
        pixels[y0:y1, x0:x1] = RED
    return pixels


def _encoded(pixels: np.ndarray, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, **kwargs)
    return out.getvalue()


def _write(path: Path, data: bytes) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


def exif_photo(displayed: np.ndarray, orientation: int) -> bytes:
    """A JPEG whose stored pixels, shown with EXIF ``orientation`` (6 or 8), are
    ``displayed``."""
    turn = {6: Image.ROTATE_90, 8: Image.ROTATE_270}[orientation]  # Undone by a viewer.
    stored = Image.fromarray(displayed).transpose(turn)
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encoded(np.asarray(stored), "JPEG", quality=95, subsampling=0, exif=exif)
    with Image.open(io.BytesIO(data)) as check:  # The premise: a viewer shows ``displayed``.
        assert check.size == displayed.shape[:2]
        shown = np.asarray(ImageOps.exif_transpose(check))
        assert shown.shape == displayed.shape and np.array_equal(red_pixels(shown), red_pixels(displayed))
    return data


def red_pixels(pixels: np.ndarray) -> np.ndarray:
    """The pixels that are mostly the drawn red: a ``[height, width]`` bool array."""
    p = pixels.astype(int)
    return (p[:, :, 0] > 150) & (p[:, :, 1] < 70) & (p[:, :, 2] < 70)


def shoelace(ring) -> tuple[float, float]:
    """A ring's ``(area, perimeter)``: the shoelace formula and the outline's length."""
    xy = np.asarray(ring, dtype=np.float64)
    x, y = xy[0::2], xy[1::2]
    xn, yn = np.roll(x, -1), np.roll(y, -1)
    return abs(float(np.sum(x * yn - xn * y))) / 2, float(np.sum(np.hypot(xn - x, yn - y)))


def coco_rle_compressed(mask: np.ndarray) -> str:
    """COCO's compressed RLE string of a 0/1 mask (pycocotools, independent of ours)."""
    from pycocotools import mask as coco_mask  # pylint: disable=import-outside-toplevel

    return coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode("ascii")


def _rle_counts(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed RLE: column-major runs, background first."""
    flat = mask.T.reshape(-1).astype(np.uint8)
    counts, value, run = [], 0, 0
    for v in flat:
        if v == value:
            run += 1
        else:
            counts.append(run)
            value, run = v, 1
    counts.append(run)
    return counts


def _mask_bbox(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``[x, y, w, h]`` of a mask's pixels, as COCO's ``toBbox``."""
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max() - xs.min() + 1), int(ys.max() - ys.min() + 1)


def _ring_bbox(rings) -> tuple[float, float, float, float]:
    xs = [v for ring in rings for v in ring[0::2]]
    ys = [v for ring in rings for v in ring[1::2]]
    return min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)


def _norm(box, size) -> tuple[float, ...]:
    width, height = size
    return (box[0] / width, box[1] / height, box[2] / width, box[3] / height)


# --- box CSV --------------------------------------------------------------------------

BOX_CSV_NAMES = ("bird", "cat", "dog")  # Sorted: ids 1, 2, 3.


def make_box_csv(root: Path, *, exif: bool = True) -> AnnotatedSet:
    """``root/boxes.csv`` (``filename,width,height,class,xmin,ymin,xmax,ymax``, one row
    per object, rows of one image not adjacent, one negative row) over PNGs under
    ``root/images``; with ``exif``, also a JPEG stored turned (orientation 6) whose rows
    state the displayed size and a box around a red rectangle drawn on the displayed
    picture."""
    ids = {n: i for i, n in enumerate(BOX_CSV_NAMES, start=1)}
    sizes = {"images/a.png": (48, 32), "images/b.png": (40, 56), "images/c.png": (64, 40),
             "images/sub/d.png": (32, 32)}
    records = {}
    for seed, (rel, size) in enumerate(sizes.items()):
        data = _write(root / rel, _encoded(noise_image(size, seed), "PNG"))
        records[rel] = Expected(rel, size, encoded=data)
    rows = [  # (image, class, box in pixels); row order = object order per image.
        ("images/a.png", "cat", (4, 2, 20, 30)),
        ("images/b.png", "dog", (0, 0, 40, 56)),
        ("images/a.png", "dog", (10.5, 3.5, 40, 31.25)),
        ("images/c.png", "", None),
        ("images/b.png", "bird", (5, 6, 15, 50)),
        ("images/sub/d.png", "cat", (1, 1, 31, 31)),
        ("images/a.png", "bird", (0, 0, 48, 32)),
    ]
    if exif:
        shown_size, red = (24, 40), (5, 9, 17, 31)
        displayed = noise_image(shown_size, 99, red=red)
        rel = "images/photo_exif.jpg"
        _write(root / rel, exif_photo(displayed, 6))
        records[rel] = Expected(rel, shown_size, displayed=displayed, red_box=_norm(red, shown_size))
        sizes[rel] = shown_size
        rows.append((rel, "cat", red))
    lines = ["filename,width,height,class,xmin,ymin,xmax,ymax"]
    for rel, name, box in rows:
        width, height = sizes[rel]
        if box is None:
            lines.append(f"{rel},{width},{height},,,,,")
            continue
        lines.append(f"{rel},{width},{height},{name}," + ",".join(f"{v:g}" for v in box))
        records[rel].add(_norm(box, sizes[rel]), ids[name], name)
    (root / "boxes.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return AnnotatedSet(["--input", str(root / "boxes.csv")], "box_csv",
                        tuple((i, n) for n, i in ids.items()), records)


# --- COCO -----------------------------------------------------------------------------

COCO_CATEGORIES = ((18, "bird"), (3, "cat"), (7, "dog"))  # Listed out of id order, ids with gaps.


def _blob(size: tuple[int, int], x0: int, y0: int, x1: int, y1: int, notch: bool = True) -> np.ndarray:
    """A 0/1 mask: a rectangle, a notch cut from its corner (not a box)."""
    width, height = size
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[y0:y1, x0:x1] = 1
    if notch:
        mask[y0:y0 + (y1 - y0) // 2, x0:x0 + (x1 - x0) // 2] = 0
        mask[y1 - 1, x1 - 1] = 1
    return mask


def make_coco(root: Path) -> AnnotatedSet:
    """``root/images`` (PNGs, one in a subfolder) and ``root/instances.json``: polygons
    (one ring; two rings), an uncompressed RLE on a crowd object, compressed RLEs, an
    image without annotations; annotations listed out of image order; COCO's category
    ids as given. Flags: ``--input root/images --annotations root/instances.json
    --instance_masks``."""
    images = {101: ("1.png", (48, 32)), 205: ("2.png", (40, 56)), 307: ("more/3.png", (64, 40)),
              409: ("4.png", (32, 32))}
    names = dict(COCO_CATEGORIES)
    records, entries = {}, []
    for seed, (image_id, (rel, size)) in enumerate(images.items()):
        data = _write(root / "images" / rel, _encoded(noise_image(size, 10 + seed), "PNG"))
        records[str(image_id)] = Expected(rel, size, encoded=data)
        entries.append({"id": image_id, "file_name": rel, "width": size[0], "height": size[1]})
    rle_a = _blob(images[205][1], 4, 6, 30, 40)
    rle_b = _blob(images[205][1], 20, 30, 38, 54, notch=False)
    rle_c = _blob(images[307][1], 40, 2, 62, 30)
    objects = [  # (image id, category, kind, segmentation data, crowd)
        (205, 18, "rle", rle_a, True),
        (101, 3, "polygon", ((4.0, 3.0, 30.0, 5.5, 22.0, 28.0, 6.0, 20.0),), False),
        (307, 3, "polygon", ((2.5, 2.0, 30.0, 2.0, 30.0, 36.0),), False),
        (205, 7, "compressed", rle_b, False),
        (101, 7, "polygon", ((32.0, 2.0, 46.0, 2.0, 46.0, 14.0, 32.0, 14.0),
                             (34.0, 18.0, 44.0, 18.0, 39.0, 30.0)), False),
        (307, 18, "compressed", rle_c, False),
    ]
    annotations = []
    for number, (image_id, category, kind, seg, crowd) in enumerate(objects, start=1):
        size = images[image_id][1]
        if kind == "polygon":
            bbox = _ring_bbox(seg)
            area = sum(shoelace(r)[0] for r in seg)
            segmentation = [list(r) for r in seg]
            ring, mask = seg, None
        else:
            bbox = _mask_bbox(seg)
            area = float(seg.sum())
            counts = _rle_counts(seg) if kind == "rle" else coco_rle_compressed(seg)
            segmentation = {"size": [size[1], size[0]], "counts": counts}
            ring, mask = None, seg
        annotations.append({"id": 1000 + number, "image_id": image_id, "category_id": category,
                            "bbox": list(bbox), "area": area, "iscrowd": int(crowd),
                            "segmentation": segmentation})
        x, y, w, h = bbox
        records[str(image_id)].add(_norm((x, y, x + w, y + h), size), category, names[category],
                                   crowd=crowd, ring=ring, mask=mask, area=area)
    document = {"info": {"description": "generated"}, "images": entries, "annotations": annotations,
                "categories": [{"id": i, "name": n, "supercategory": "animal"} for i, n in COCO_CATEGORIES]}
    (root / "instances.json").write_text(json.dumps(document), encoding="utf-8")
    return AnnotatedSet(["--input", str(root / "images"), "--annotations", str(root / "instances.json"),
                         "--instance_masks"], "coco", tuple(sorted(COCO_CATEGORIES)), records)


# --- Pascal VOC -----------------------------------------------------------------------

VOC_NAMES = ("car", "person")  # Sorted: ids 1, 2.


def _voc_xml(stem: str, size: tuple[int, int], objects) -> str:
    parts = [f"<annotation><folder>VOC2012</folder><filename>{stem}.jpg</filename>",
             "<source><database>generated</database></source>",
             f"<size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>",
             "<segmented>0</segmented>"]
    for name, (xmin, ymin, xmax, ymax), difficult, truncated in objects:
        parts.append(f"<object><name>{name}</name><pose>Left</pose><truncated>{truncated}</truncated>"
                     f"<difficult>{difficult}</difficult><bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin>"
                     f"<xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>")
    return "\n".join(parts) + "\n</annotation>\n"


def make_voc(root: Path) -> AnnotatedSet:
    """A VOC folder ``root`` (``Annotations/``, ``JPEGImages/``, ``ImageSets/Main/
    {train,val}.txt``): objects with ``difficult`` and ``truncated``, 1-based inclusive
    boxes (one over the whole image: ``1..W``), an image without objects."""
    ids = {n: i for i, n in enumerate(VOC_NAMES, start=1)}
    images = {  # stem: (size, split, objects (name, 1-based inclusive box, difficult, truncated))
        "2008_000001": ((48, 32), "train", [("person", (5, 3, 20, 30), 0, 0), ("car", (22, 10, 47, 31), 1, 0)]),
        "2008_000002": ((40, 56), "train", [("car", (1, 1, 40, 56), 0, 1)]),
        "2008_000003": ((64, 40), "validation", []),
        "2008_000004": ((32, 32), "validation", [("person", (2, 2, 16, 31), 1, 1), ("person", (17, 4, 30, 20), 0, 0)]),
    }
    records = {}
    for seed, (stem, (size, split, objects)) in enumerate(images.items()):
        rel = f"JPEGImages/{stem}.jpg"
        data = _write(root / rel, _encoded(noise_image(size, 20 + seed), "JPEG", quality=90))
        expected = records[rel] = Expected(rel, size, split=split, encoded=data)
        for name, (xmin, ymin, xmax, ymax), difficult, truncated in objects:
            expected.add(_norm((xmin - 1, ymin - 1, xmax, ymax), size), ids[name], name,
                         difficult=difficult, truncated=truncated)
        _write(root / "Annotations" / f"{stem}.xml", _voc_xml(stem, size, objects).encode())
    for split_file, split in (("train", "train"), ("val", "validation")):
        stems = [s for s, (_, sp, _) in images.items() if sp == split]
        _write(root / "ImageSets" / "Main" / f"{split_file}.txt", ("\n".join(stems) + "\n").encode())
    return AnnotatedSet(["--input", str(root)], "voc", tuple((i, n) for n, i in ids.items()), records)


# --- YOLO -----------------------------------------------------------------------------

YOLO_NAMES = ("person", "car", "tree")  # Class index = position; id = index + 1.


def make_yolo(root: Path) -> AnnotatedSet:
    """An Ultralytics dataset ``root`` (``data.yaml`` with ``names`` as a mapping,
    ``images/{train,val}``, ``labels/{train,val}``): one image without a label file,
    boxes given as normalized centres and sizes."""
    images = {  # rel: (size, split, lines (class, cx, cy, w, h) or None: no label file)
        "images/train/a.png": ((48, 32), "train", [(0, 0.5, 0.5, 0.25, 0.5), (2, 0.125, 0.75, 0.25, 0.5)]),
        "images/train/b.png": ((40, 56), "train", [(1, 0.5, 0.5, 1.0, 1.0)]),
        "images/train/c.png": ((64, 40), "train", None),
        "images/val/d.png": ((32, 32), "validation", [(1, 0.3125, 0.40625, 0.375, 0.5625),
                                                      (0, 0.75, 0.75, 0.5, 0.5)]),
    }
    records = {}
    for seed, (rel, (size, split, lines)) in enumerate(images.items()):
        data = _write(root / rel, _encoded(noise_image(size, 30 + seed), "PNG"))
        expected = records[rel] = Expected(rel, size, split=split, encoded=data)
        if lines is None:
            continue
        label = root / "labels" / rel.split("/", 1)[1].rsplit(".", 1)[0]
        _write(label.with_suffix(".txt"), "".join(f"{c} {cx} {cy} {w} {h}\n" for c, cx, cy, w, h in lines).encode())
        for c, cx, cy, w, h in lines:
            expected.add((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), c + 1, YOLO_NAMES[c])
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(YOLO_NAMES))
    (root / "data.yaml").write_text(f"train: images/train\nval: images/val\nnc: {len(YOLO_NAMES)}\n"
                                    f"names:\n{names}\n", encoding="utf-8")
    return AnnotatedSet(["--input", str(root)], "yolo",
                        tuple((i + 1, n) for i, n in enumerate(YOLO_NAMES)), records)


# --- semantic masks -------------------------------------------------------------------


MASK_CLASSES = ("background", "road", "sky")  # --labels: line i is mask value i.


def make_semantic_masks(root: Path) -> AnnotatedSet:
    """``root/images`` (PNGs and a JPEG, one in a subfolder), ``root/masks`` (one-channel
    PNGs of the same relative path and stem, values 0-2) and ``root/classes.txt`` (the
    class of each mask value). Flags: ``--input root/images --masks root/masks --labels
    root/classes.txt``."""
    images = {"a.png": (48, 32), "b.jpg": (40, 56), "sub/c.png": (64, 40)}
    records = {}
    for seed, (rel, size) in enumerate(images.items()):
        fmt = "JPEG" if rel.endswith(".jpg") else "PNG"
        data = _write(root / "images" / rel, _encoded(noise_image(size, 40 + seed), fmt))
        rng = np.random.default_rng(seed)
        mask = np.zeros((size[1], size[0]), dtype=np.uint8)
        mask[size[1] // 4:, : size[0] // 2] = 1
        mask[: size[1] // 3, size[0] // 3:] = 2
        mask[rng.uniform(size=mask.shape) < 0.05] = 1  # Scattered pixels: pixel-exact matters.
        _write(root / "masks" / (rel.rsplit(".", 1)[0] + ".png"), _encoded(mask, "PNG"))
        records[rel] = Expected(rel, size, encoded=data, segmentation=mask)
    (root / "classes.txt").write_text("\n".join(MASK_CLASSES) + "\n", encoding="utf-8")
    return AnnotatedSet(["--input", str(root / "images"), "--masks", str(root / "masks"),
                         "--labels", str(root / "classes.txt")], "masks", tuple(enumerate(MASK_CLASSES)), records)


# --- several labels -------------------------------------------------------------------

MULTI_NAMES = ("bird", "cat", "dog")


def make_multi_label(root: Path) -> AnnotatedSet:
    """``root/tags.csv`` (``filename,label``: one row per image and tag, rows of one image
    not adjacent, a repeated tag, and cells holding several tags split by ``;``) over
    PNGs under ``root/images``. Flags: ``--input root/tags.csv --label_separator ;``."""
    ids = {n: i for i, n in enumerate(MULTI_NAMES, start=1)}
    sizes = {"images/a.png": (48, 32), "images/b.png": (40, 56), "images/c.png": (64, 40),
             "images/d.png": (32, 32)}
    rows = [("images/a.png", "cat"), ("images/b.png", "dog"), ("images/a.png", "dog"),
            ("images/c.png", "bird;cat"), ("images/b.png", "dog"), ("images/d.png", "cat"),
            ("images/a.png", " bird ; cat")]
    records = {}
    for seed, (rel, size) in enumerate(sizes.items()):
        data = _write(root / rel, _encoded(noise_image(size, 50 + seed), "PNG"))
        records[rel] = Expected(rel, size, encoded=data)
    for rel, cell in rows:
        for tag in (t.strip() for t in cell.split(";")):
            if tag and tag not in records[rel].label_texts:
                records[rel].label_texts.append(tag)
                records[rel].labels.append(ids[tag])
    (root / "tags.csv").write_text("filename,label\n" + "".join(f"{r},{c}\n" for r, c in rows), encoding="utf-8")
    return AnnotatedSet(["--input", str(root / "tags.csv"), "--label_separator", ";"], "multi_label",
                        tuple((i, n) for n, i in ids.items()), records)


def relative(path: str, root: str) -> str:
    """``path`` relative to ``root`` when under it."""
    return os.path.relpath(path, root) if os.path.isabs(path) else path
