"""Input layouts: from a listing of files to labelled, split image references.

Three layouts are understood (``auto`` picks one):

- ``class_folders``: ``ROOT/<class>/<file>``, or ``ROOT/<split>/<class>/<file>``
  when every top-level folder is a split name (train, validation, test). The
  label is the class's index in the sorted class names, or in a labels file.
- ``cifar``: ``ROOT/<split>/<ID>_<CLASS>.<ext>`` with ``ROOT/labels.txt``; the
  label is the line index of CLASS.
- ``csv``: a CSV manifest with columns ``image`` (path relative to the CSV's
  folder, or absolute), ``label`` (int or class name), optional ``split``; other
  columns become int64, float32 or string features.

Pure functions: the caller lists the files and reads the text files.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import posixpath
import re
from collections.abc import Callable, Iterable, Sequence

from beam_tfrecords.schemas.config import LAYOUTS
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.transforms.codec.images import is_image_filename
from beam_tfrecords.transforms.plan.shards import stable_key

__all__ = [
    "DEFAULT_SPLIT",
    "SPLIT_NAMES",
    "Listing",
    "detect_layout",
    "list_cifar",
    "list_class_folders",
    "list_csv_manifest",
    "parse_labels_text",
    "resolve_input",
]

SPLIT_NAMES = frozenset({"train", "validation", "test"})
DEFAULT_SPLIT = "train"
CIFAR_LABELS_FILE = "labels.txt"
_CIFAR_NAME = re.compile(r"^(?P<id>[^_/]+)_(?P<cls>[^/]+)\.[A-Za-z0-9]+$")
_CSV_REQUIRED = ("image", "label")
_RESERVED_CSV_COLUMNS = ("image", "label", "split")


@dataclasses.dataclass
class Listing:
    """The images of a dataset, before any is read.

    Attributes:
      layout: the layout used.
      refs: images to convert.
      vocabulary: class names; ``vocabulary[label]`` is the class of a label.
      ignored: files skipped as plainly not images (``.txt``, ``.DS_Store``, ...).
      dead_letters: inputs refused while listing (no class, unknown class, ...).
      extra_features: ``{name: dtype}`` of the extra columns of a CSV manifest.
    """

    layout: str
    refs: list[ImageRef]
    vocabulary: list[str]
    ignored: int = 0
    dead_letters: list[DeadLetter] = dataclasses.field(default_factory=list)
    extra_features: dict[str, str] = dataclasses.field(default_factory=dict)


_GLOB_CHARS = re.compile(r"[*?\[]")


def resolve_input(path: str, layout: str = "auto") -> tuple[str, str, str]:
    """Where the inputs are: ``(layout, root, pattern)``.

    ``layout`` stays ``auto`` for folders and globs (the listing decides); a path
    ending in ``.csv`` (or any path with ``layout='csv'``) is a CSV manifest whose
    folder is the root. A folder's pattern is ``ROOT/**``; a glob's root is the
    folder above its first wildcard.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    wildcard = _GLOB_CHARS.search(path)
    if layout == "table":
        return "table", (path[: wildcard.start()] if wildcard else path).rsplit("/", 1)[0] or ".", path
    if layout == "csv" or (wildcard is None and path.lower().endswith(".csv")):
        if wildcard is not None:
            raise ValueError(f"a CSV manifest is one file, not a glob: {path}")
        return "csv", posixpath.dirname(path) or ".", path
    if wildcard is None:
        root = path.rstrip("/") or "/"
        return layout, root, root.rstrip("/") + "/**"
    prefix = path[: wildcard.start()]
    root = prefix.rsplit("/", 1)[0] if "/" in prefix else "."
    return layout, root or "/", path


def parse_labels_text(text: str) -> list[str]:
    """Class names from a labels file: one per line, blank lines skipped.

    Raises:
      ValueError: if a name appears twice or there is none.
    """
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise ValueError("the labels file holds no class names")
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"class {name!r} appears twice in the labels file")
        seen.add(name)
    return names


def _relative(root: str, path: str) -> str:
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not under the input root {root}")
    return path[len(prefix):]


def detect_layout(root: str, paths: Iterable[str]) -> str:
    """``cifar`` when ``ROOT/labels.txt`` is present, else ``class_folders``."""
    labels = root.rstrip("/") + "/" + CIFAR_LABELS_FILE
    return "cifar" if any(p == labels for p in paths) else "class_folders"


def _split_images(
    root: str, files: Sequence[tuple[str, int]]
) -> tuple[list[tuple[str, str, int]], int]:
    """(relative path, path, size) of image files, and the count of other files."""
    images, ignored = [], 0
    for path, size in files:
        rel = _relative(root, path)
        if is_image_filename(rel):
            images.append((rel, path, size))
        else:
            ignored += 1
    images.sort()
    return images, ignored


def _finish(layout, refs, vocabulary, ignored, dead, extra_features=None) -> Listing:
    """The Listing, with images whose split cannot name a file moved to the dead letter."""
    kept = []
    for ref in refs:
        if is_valid_split_name(ref.split):
            kept.append(ref)
        else:
            dead.append(DeadLetter(ref.path, "list", "bad_split",
                                   f"split {ref.split!r} cannot name a shard file: "
                                   "use letters, digits, '_' and '.'"))
    return Listing(layout, kept, vocabulary, ignored, dead, extra_features or {})


def _ref(split, rel, path, size, label, text, extra=()) -> ImageRef:
    return ImageRef(
        split=split,
        key=stable_key(split, rel),
        filename=rel,
        path=path,
        size=size,
        label=label,
        label_text=text,
        extra=extra,
    )


def list_class_folders(
    root: str, files: Sequence[tuple[str, int]], labels: Sequence[str] | None = None
) -> Listing:
    """Images under ``ROOT/<class>/`` or ``ROOT/<split>/<class>/``.

    Args:
      root: the input root (no trailing slash needed).
      files: ``(path, size)`` of every file under the root.
      labels: class names in label order; default: the sorted class folder names.
    """
    images, ignored = _split_images(root, files)
    parts = [rel.split("/") for rel, _, _ in images]
    # Split folders when every top-level folder holding images is a split name.
    top_folders = {p[0] for p in parts if len(p) >= 2}
    by_split = bool(top_folders) and top_folders <= SPLIT_NAMES
    dead: list[DeadLetter] = []
    placed = []  # (split, class, rel, path, size)
    for (rel, path, size), p in zip(images, parts):
        split, rest = (p[0], p[1:]) if by_split and len(p) >= 2 else (DEFAULT_SPLIT, p)
        if len(rest) < 2:
            dead.append(
                DeadLetter(path, "list", "no_class_folder",
                           "image is not inside a class folder (expected ROOT/<class>/<file>)")
            )
            continue
        placed.append((split, rest[0], rel, path, size))
    vocabulary = list(labels) if labels is not None else sorted({c for _, c, _, _, _ in placed})
    index = {name: i for i, name in enumerate(vocabulary)}
    refs = []
    for split, cls, rel, path, size in placed:
        if cls not in index:
            dead.append(
                DeadLetter(path, "list", "unknown_class",
                           f"class folder {cls!r} is not in the labels file")
            )
            continue
        refs.append(_ref(split, rel, path, size, index[cls], cls))
    return _finish("class_folders", refs, vocabulary, ignored, dead)


def list_cifar(root: str, files: Sequence[tuple[str, int]], labels_text: str) -> Listing:
    """Images named ``ROOT/<split>/<ID>_<CLASS>.<ext>``, labelled by ``labels.txt``."""
    vocabulary = parse_labels_text(labels_text)
    index = {name: i for i, name in enumerate(vocabulary)}
    images, ignored = _split_images(root, files)
    refs, dead = [], []
    for rel, path, size in images:
        p = rel.split("/")
        match = _CIFAR_NAME.match(p[-1]) if len(p) == 2 else None
        if match is None:
            dead.append(
                DeadLetter(path, "list", "unlabeled",
                           "expected ROOT/<split>/<ID>_<CLASS>.<ext> in the CIFAR layout")
            )
        elif match["cls"] not in index:
            dead.append(
                DeadLetter(path, "list", "unknown_class",
                           f"class {match['cls']!r} is not in {CIFAR_LABELS_FILE}")
            )
        else:
            refs.append(_ref(p[0], rel, path, size, index[match["cls"]], match["cls"]))
    return _finish("cifar", refs, vocabulary, ignored, dead)


def _infer_dtype(values: Sequence[str]) -> str:
    """int64 if every cell is an int, float32 if every cell is a number, else string."""
    for dtype, parse in (("int64", int), ("float32", float)):
        try:
            for value in values:
                parse(value)
        except ValueError:
            continue
        return dtype
    return "string"


def _cast(dtype: str, value: str) -> object:
    return int(value) if dtype == "int64" else float(value) if dtype == "float32" else value


def list_csv_manifest(
    csv_path: str,
    text: str,
    size_of: Callable[[str], int | None],
    labels: Sequence[str] | None = None,
) -> Listing:
    """Images named by a CSV manifest.

    Args:
      csv_path: where the CSV is; relative image paths are taken from its folder.
      text: the CSV's content (with a header row).
      size_of: the size in bytes of the image at a resolved path, ``None`` when it
        does not exist (the row then goes to the dead letter).
      labels: class names in label order; default: the sorted label values when
        they are names, no names when they are all integers.

    Raises:
      ValueError: if a required column is missing or an extra column is named
        like a reserved image feature.
    """
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ValueError(f"{csv_path}: the CSV manifest is empty") from None
    duplicated = sorted({h for h in header if header.count(h) > 1})
    if duplicated:
        raise ValueError(f"{csv_path}: the CSV header names columns {duplicated} more than once")
    missing = [c for c in _CSV_REQUIRED if c not in header]
    if missing:
        raise ValueError(
            f"{csv_path}: the CSV manifest needs columns {list(_CSV_REQUIRED)} "
            f"(optional: split); missing {missing}, found {header}"
        )
    extra_names = [h for h in header if h not in _RESERVED_CSV_COLUMNS]
    clashing = [h for h in extra_names if h.startswith("image/") or not h]
    if clashing:
        raise ValueError(
            f"{csv_path}: extra columns {clashing} would clash with the image features; "
            "rename them (names starting with 'image/' and empty names are reserved)"
        )
    base = posixpath.dirname(csv_path)
    dead: list[DeadLetter] = []
    rows = []  # (line, cells)
    for cells in reader:
        line = reader.line_num
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            dead.append(
                DeadLetter(f"{csv_path}:{line}", "list", "bad_row",
                           f"row has {len(cells)} cells, the header has {len(header)}")
            )
            continue
        rows.append((line, dict(zip(header, (c.strip() for c in cells)))))
    dtypes = {name: _infer_dtype([row[name] for _, row in rows]) for name in extra_names}
    label_values = [row["label"] for _, row in rows]
    int_labels = labels is None and all(_is_int(v) for v in label_values)
    if labels is not None:
        vocabulary = list(labels)
    elif int_labels:
        vocabulary = []
    else:
        vocabulary = sorted(set(label_values))
    index = {name: i for i, name in enumerate(vocabulary)}
    refs = []
    for line, row in rows:
        source = f"{csv_path}:{line}"
        image = row["image"]
        path = image if image.startswith("/") or "://" in image else posixpath.join(base, image)
        rel = image if not image.startswith("/") else image.lstrip("/")
        if not is_image_filename(image):
            dead.append(DeadLetter(source, "list", "not_an_image_path",
                                   f"{image!r} does not name an image file"))
            continue
        size = size_of(path)
        if size is None:
            dead.append(DeadLetter(source, "list", "missing_file", f"image {path} does not exist"))
            continue
        value = row["label"]
        if int_labels:
            label, text = int(value), ""
        elif value in index:
            label, text = index[value], value
        elif _is_int(value) and 0 <= int(value) < len(vocabulary):
            label, text = int(value), vocabulary[int(value)]
        else:
            dead.append(DeadLetter(source, "list", "unknown_class",
                                   f"label {value!r} is not a known class"))
            continue
        split = row.get("split") or DEFAULT_SPLIT
        extra = tuple((name, dtypes[name], _cast(dtypes[name], row[name])) for name in sorted(extra_names))
        refs.append(_ref(split, rel, path, size, label, text, extra))
    return _finish("csv", refs, vocabulary, 0, dead, dict(sorted(dtypes.items())))


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True
