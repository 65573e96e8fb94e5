"""Input layouts: from a listing of files to labelled, split image references.

Three layouts are understood (``auto`` picks one):

- ``class_folders``: ``ROOT/<class>/<file>``, or ``ROOT/<split>/<class>/<file>``
  when every top-level folder is a split name (``SPLIT_NAMES``: train; val,
  valid, validation, dev; test, eval); the split is the folder's own name. A mix
  of split names and other names is refused as ambiguous. The label is the
  class's index in the sorted class names, or in a labels file.
- ``cifar``: ``ROOT/<split>/<ID>_<CLASS>.<ext>`` with ``ROOT/labels.txt``; the
  label is the line index of CLASS.
- ``csv``: a CSV manifest with an image column (path relative to the CSV's
  folder, or absolute; ``image``, ``image_uri``, ``image_path``, ``path``,
  ``filename``, ``file`` or ``uri``, or one named by the caller), a label column
  (int or class name; ``label``, ``class`` or ``category``, or named), optional
  ``split``; other columns become int64, float32 or string features. A row
  whose image lies outside the CSV's folder is read only when its root is
  allowed (``rows_outside`` tells the preflight which are not); a row's path is
  looked up literally, never as a glob (the caller's ``size_of``).

Pure functions: the caller lists the files and reads the text files.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import posixpath
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from beam_tfrecords.schemas.config import LAYOUTS
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.schemas.manifest import shown_value
from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.schemas.table_schema import FLOAT32_MAX
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.plan.names import check_names
from beam_tfrecords.transforms.plan.ref_table import (
    RefTable,
    TableListing,
    cifar_batches,
    cifar_table,
    class_folder_batches,
    class_folder_table,
)
from beam_tfrecords.transforms.plan.shard_cuts import stable_key

__all__ = [
    "DEFAULT_SPLIT",
    "IMAGE_COLUMNS",
    "LABEL_COLUMNS",
    "SPLIT_NAMES",
    "Listing",
    "detect_layout",
    "find_image_column",
    "folders_are_splits",
    "image_path_column",
    "list_cifar",
    "list_class_folders",
    "list_csv_manifest",
    "manifest_columns",
    "manifest_image_path",
    "outside_root",
    "parse_labels_text",
    "resolve_input",
    "rows_outside",
    "top_level_folders",
    "within",
]

# Folder names read as splits (as on disk: lower case). The split written to the
# shard files is the folder's own name (``val-00000-of-00001.tfrecord``).
SPLIT_NAMES = frozenset({"train", "val", "valid", "validation", "dev", "test", "eval"})
DEFAULT_SPLIT = "train"
CIFAR_LABELS_FILE = "labels.txt"
# Column names of a CSV manifest, first match wins (TFRecorder writes image_uri).
IMAGE_COLUMNS = ("image", "image_uri", "image_path", "path", "filename", "file", "uri")
LABEL_COLUMNS = ("label", "class", "category")
SPLIT_COLUMN = "split"
# Cells of a column looked at to tell whether it holds image paths.
_PATH_SAMPLE_CELLS = 5


@dataclasses.dataclass
class Listing:
    """The images of a dataset, before any is read.

    Attributes:
      layout: the layout used.
      refs: images to convert: a list, or for a large listing of a folder layout a
        ``RefTable`` (a sequence of the same references, held as columns).
      vocabulary: class names; ``vocabulary[label]`` is the class of a label.
      ignored: files skipped as plainly not images (``.txt``, ``.DS_Store``, ...).
      dead_letters: inputs refused while listing (no class, unknown class, ...).
      extra_features: ``{name: dtype}`` of the extra columns of a CSV manifest.
      skipped: paths passed over while walking, with the reason (not inputs: links
        met twice, link loops, FIFOs, unreadable folders); not bad inputs.
      split_source: what named the splits ('' when every image is in the default
        split): ``split folders``, or the CSV manifest's ``split`` column.
      duplicates_dropped: ``(filename, split, filename it copies)`` of images
        left out as copies (see ``transforms.image_steps.list_images``).
      files: for a folder layout, every labelled image as a ``RefTable`` with what
        the listing said of each file (time or generation, crc32c): the input
        fingerprint is written from it (``refs`` may be a subset of it, or the
        same table); ``None`` for a CSV manifest.
      annotated: for an annotated layout, what its plan says of it
        (``plan.annotated_listing.AnnotatedSummary``); ``None`` otherwise. Not handed over.
    """

    layout: str
    refs: list[ImageRef] | RefTable
    vocabulary: list[str]
    ignored: int = 0
    dead_letters: list[DeadLetter] = dataclasses.field(default_factory=list)
    extra_features: dict[str, str] = dataclasses.field(default_factory=dict)
    skipped: list[DeadLetter] = dataclasses.field(default_factory=list)
    split_source: str = ""
    duplicates_dropped: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    files: RefTable | None = None
    annotated: object = None


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
    """Class names from a labels file: one per line; line ``i`` (from 0) names label ``i``.

    Blank lines at the end are ignored; a blank line before a name is refused, since
    skipping it would give every later class another label than its line says.

    Raises:
      ValueError: naming the line, if a line before the last name is blank, a name
        appears twice (also when only its Unicode normalization or letter case
        differs, see ``plan.names``), or there is none.
    """
    lines = [line.strip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise ValueError("the labels file holds no class names")
    blank = next((number for number, name in enumerate(lines, start=1) if not name), None)
    if blank is not None:
        raise ValueError(f"line {blank} of the labels file is blank; a label is its line's index, "
                         "so a blank line would shift every class after it: remove the line, or "
                         "name the class it stands for")
    seen: dict[str, int] = {}
    for number, name in enumerate(lines, start=1):
        if name in seen:
            raise ValueError(f"class {name!r} appears twice in the labels file (lines {seen[name]} "
                             f"and {number})")
        seen[name] = number
    check_names("classes in the labels file", lines)
    return lines


def _relative(root: str, path: str) -> str:
    prefix = root.rstrip("/") + "/"
    if not path.startswith(prefix):
        raise ValueError(f"{path} is not under the input root {root}")
    return path[len(prefix):]


def detect_layout(root: str, paths: Iterable[str]) -> str:
    """``cifar`` when ``ROOT/labels.txt`` is present, else ``class_folders``."""
    labels = root.rstrip("/") + "/" + CIFAR_LABELS_FILE
    return "cifar" if any(p == labels for p in paths) else "class_folders"


def top_level_folders(root: str, paths: Iterable[str]) -> set[str]:
    """The top-level folders under ``root`` that hold image files (at any depth)."""
    folders = set()
    for path in paths:
        rel = _relative(root, path)
        if "/" in rel and is_image_filename(rel):
            folders.add(rel.split("/", 1)[0])
    return folders


def folders_are_splits(root: str, folders: Iterable[str]) -> bool:
    """Whether the top-level ``folders`` of ``root`` are split folders.

    True when every one is a split name (``SPLIT_NAMES``), False when none is.

    Raises:
      ValueError: when some are split names and others are not (the tree could
        be ``ROOT/<split>/<class>/`` with strays, or classes named like splits).
    """
    folders = set(folders)
    splits, others = sorted(folders & SPLIT_NAMES), sorted(folders - SPLIT_NAMES)
    if splits and others:
        base = root.rstrip("/") or "/"
        raise ValueError(
            f"top-level folders {splits} look like splits but {others} do not, so it is "
            f"ambiguous whether {base} holds <split>/<class>/ or <class>/ folders; be explicit: "
            f"point --input at one split folder (e.g. {base}/{splits[0]}; its images go to split "
            f"'{DEFAULT_SPLIT}'), or move or rename folders so that all or none of them are split "
            f"names ({', '.join(sorted(SPLIT_NAMES))})"
        )
    return bool(splits)


def find_image_column(header: Sequence[str]) -> str | None:
    """The first of ``IMAGE_COLUMNS`` in a CSV header, or ``None``."""
    return next((name for name in IMAGE_COLUMNS if name in header), None)


def manifest_columns(
    header: Sequence[str], image_column: str | None = None, label_column: str | None = None
) -> tuple[str, str]:
    """``(image column, label column)`` of a CSV manifest's header.

    Args:
      header: the column names.
      image_column, label_column: the names to use; default: the first of
        ``IMAGE_COLUMNS`` / ``LABEL_COLUMNS`` in the header.

    Raises:
      ValueError: naming the flag to pass when a column is missing.
    """
    header = list(header)
    for flag, given in (("--image_column", image_column), ("--label_column", label_column)):
        if given is not None and given not in header:
            raise ValueError(f"{flag}: column {given!r} is not in the CSV header {header}")
    image = image_column or find_image_column(header)
    label = label_column or next((name for name in LABEL_COLUMNS if name in header), None)
    missing = [(kind, f"{kind}: one of {', '.join(names)}, or pass {flag} NAME")
               for kind, found, names, flag in (
                   ("image", image, IMAGE_COLUMNS, "--image_column"),
                   ("label", label, LABEL_COLUMNS, "--label_column"))
               if found is None]
    if missing:
        raise ValueError(f"the CSV manifest needs an image and a label column; missing "
                         f"{[kind for kind, _ in missing]} ({'; '.join(h for _, h in missing)}); "
                         f"found {header}")
    if image == label:
        raise ValueError(f"the image column and the label column are both {image!r}; pass "
                         "--image_column and --label_column naming different columns")
    if SPLIT_COLUMN in (image, label):
        raise ValueError(f"column {SPLIT_COLUMN!r} names the split; it cannot be the "
                         f"{'image' if image == SPLIT_COLUMN else 'label'} column")
    return image, label


def image_path_column(header: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[str, str] | None:
    """``(column, first cell)`` of the first column whose first few non-empty cells
    all name image files (``a/1.jpg``), or ``None``."""
    for i, name in enumerate(header):
        cells = [row[i].strip() for row in rows if i < len(row) and row[i].strip()]
        cells = cells[:_PATH_SAMPLE_CELLS]
        if cells and all(is_image_filename(cell) for cell in cells):
            return name, cells[0]
    return None


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
    root: str, files: Iterable[tuple[str, int]], labels: Sequence[str] | None = None,
    compact: bool = False, batched: bool = False,
) -> Listing:
    """Images under ``ROOT/<class>/`` or ``ROOT/<split>/<class>/``.

    Args:
      root: the input root (no trailing slash needed).
      files: ``(path, size)`` of every file under the root (a stream is read once).
      labels: class names in label order; default: the sorted class folder names.
      compact: give the references as a ``RefTable`` (columns, in listing order)
        instead of a list of ``ImageRef`` sorted by relative path.
      batched: ``files`` are ``plan.ref_table.FileBatch``es (a folder's files at a time).

    Raises:
      ValueError: when the top-level folders mix split names and other names.
    """
    build = class_folder_batches if batched else class_folder_table
    found = build(root, files, labels, folders_are_splits, DEFAULT_SPLIT)
    return _from_table("class_folders", found, compact)


def list_cifar(root: str, files: Iterable[tuple[str, int]], labels_text: str,
               compact: bool = False, batched: bool = False) -> Listing:
    """Images named ``ROOT/<split>/<ID>_<CLASS>.<ext>``, labelled by ``labels.txt``
    (``compact``, ``batched``: see ``list_class_folders``)."""
    try:
        vocabulary = parse_labels_text(labels_text)
    except ValueError as err:
        raise ValueError(f"{CIFAR_LABELS_FILE}: {err}") from None
    found = (cifar_batches if batched else cifar_table)(root, files, vocabulary, CIFAR_LABELS_FILE,
                                                        DEFAULT_SPLIT)
    return _from_table("cifar", found, compact)


def _from_table(layout: str, found: TableListing, compact: bool) -> Listing:
    refs = found.table if compact else found.table.by_filename()
    return Listing(layout, refs, found.vocabulary, found.ignored, found.dead_letters,
                   split_source=found.split_source)


def _int64(value: str) -> int:
    number = int(value)
    if not -(2**63) <= number < 2**63:
        raise ValueError("does not fit in int64")
    return number


def _finite_float32(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
        raise ValueError("not a finite float32")
    return number


def _infer_dtype(values: Sequence[str]) -> str:
    """int64 if every cell is an int64, float32 if every cell is a finite float32 number,
    else string (a manifest has no schema to allow NaN or infinities: such a column is
    kept as its text, never published as a value that is not finite)."""
    for dtype, parse in (("int64", _int64), ("float32", _finite_float32)):
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
    image_column: str | None = None,
    label_column: str | None = None,
) -> Listing:
    """Images named by a CSV manifest.

    Args:
      csv_path: where the CSV is; relative image paths are taken from its folder.
      text: the CSV's content (with a header row).
      size_of: the size in bytes of the image at a resolved path, looked up
        literally (never as a glob), ``None`` when it does not exist (the row then
        goes to the dead letter, ``missing_file``); it raises ``ValueError`` for a
        path it cannot look up at all (an unknown scheme: ``unreadable_path``).
      labels: class names in label order; default: the sorted label values when
        they are names, no names when they are all integers.
      image_column, label_column: the columns of the image paths and the labels;
        default: the first of ``IMAGE_COLUMNS`` / ``LABEL_COLUMNS`` in the header.

    Raises:
      ValueError: if a required column is missing or an extra column is named
        like a reserved image feature.
    """
    table = _manifest_table(csv_path, text, image_column, label_column)
    image_column, label_column = table.image_column, table.label_column
    extra_names, rows, dead = table.extra_names, table.rows, table.dead
    dtypes = {name: _infer_dtype([row[name] for _, row in rows]) for name in extra_names}
    vocabulary, int_labels = _manifest_vocabulary(labels, [row[label_column] for _, row in rows])
    index = {name: i for i, name in enumerate(vocabulary)}
    refs = []
    for line, row in rows:
        source = f"{csv_path}:{line}"
        image = row[image_column]
        if image.startswith("file://"):
            image = image[len("file://"):]
        path = manifest_image_path(table.base, image)
        rel = image if not image.startswith("/") else image.lstrip("/")
        if not is_image_filename(image):
            dead.append(DeadLetter(source, "list", "not_an_image_path",
                                   f"the {image_column!r} cell (a {len(image):,}-character text) does "
                                   "not name an image file (no image extension)"))
            continue
        # Named as the row names it (relative to the CSV's folder, or as written), escaped.
        shown = shown_value(row[image_column])
        try:
            size = size_of(path)
        except ValueError as err:
            dead.append(DeadLetter(source, "list", "unreadable_path", f"image {shown}: {err}"))
            continue
        if size is None:
            dead.append(DeadLetter(source, "list", "missing_file", f"image {shown} does not exist"))
            continue
        value = row[label_column]
        if int_labels:
            label, text = int(value), ""
        elif value in index:
            label, text = index[value], value
        elif _is_int(value) and 0 <= int(value) < len(vocabulary):
            label, text = int(value), vocabulary[int(value)]
        else:
            dead.append(DeadLetter(source, "list", "unknown_class",
                                   f"the {label_column!r} cell (a {len(value):,}-character text) is not "
                                   f"a known class ({len(vocabulary):,} classes"
                                   + (", from --labels)" if labels is not None else ")")))
            continue
        split = row.get(SPLIT_COLUMN) or DEFAULT_SPLIT
        extra = tuple((name, dtypes[name], _cast(dtypes[name], row[name])) for name in sorted(extra_names))
        refs.append(_ref(split, rel, path, size, label, text, extra))
    listing = _finish("csv", refs, vocabulary, 0, dead, dict(sorted(dtypes.items())))
    listing.split_source = f"the CSV's {SPLIT_COLUMN!r} column" if SPLIT_COLUMN in table.header else ""
    return listing


def _manifest_vocabulary(labels: Sequence[str] | None, values: list[str]) -> tuple[list[str], bool]:
    """A CSV manifest's class names in label order, and whether its labels are
    integers with no names (no ``labels`` given, every value an integer)."""
    if labels is not None:
        return list(labels), False
    if all(_is_int(v) for v in values):
        return [], True
    return sorted(set(values)), False


@dataclasses.dataclass(frozen=True)
class _ManifestTable:
    """A CSV manifest's rows as read, before any image is looked up."""

    base: str  # the CSV's folder
    header: list[str]
    image_column: str
    label_column: str
    extra_names: list[str]
    rows: list[tuple[int, dict[str, str]]]  # (line number, {column: cell})
    dead: list[DeadLetter]  # lines that are no row (broken quoting, wrong cell count)


def _manifest_table(csv_path: str, text: str, image_column: str | None,
                    label_column: str | None) -> _ManifestTable:
    """Reads a CSV manifest's header and rows (see ``list_csv_manifest``)."""
    # One physical line is one row: an image path holds no newline, so a quote that is
    # never closed costs its own line, not every row after it.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].strip():
        raise ValueError(f"{csv_path}: the CSV manifest is empty (no header row)")
    try:
        header = [h.strip() for h in _cells(lines[0])]
    except csv.Error as err:
        raise ValueError(f"{csv_path}: the header row cannot be read: {err}") from None
    duplicated = sorted({h for h in header if header.count(h) > 1})
    if duplicated:
        raise ValueError(f"{csv_path}: the CSV header names columns {duplicated} more than once")
    try:
        image_column, label_column = manifest_columns(header, image_column, label_column)
    except ValueError as err:
        raise ValueError(f"{csv_path}: {err}") from None
    extra_names = [h for h in header if h not in (image_column, label_column, SPLIT_COLUMN)]
    clashing = [h for h in extra_names if h.startswith("image/") or not h]
    if clashing:
        raise ValueError(
            f"{csv_path}: extra columns {clashing} would clash with the image features; "
            "rename them (names starting with 'image/' and empty names are reserved)"
        )
    dead: list[DeadLetter] = []
    rows = []  # (line, cells)
    for line, text_line in enumerate(lines[1:], start=2):
        if not text_line.strip():
            continue
        try:
            cells = _cells(text_line)
        except csv.Error:
            dead.append(DeadLetter(f"{csv_path}:{line}", "list", "bad_quoting",
                                   "the quoting on this line is broken: a quote never closed, or "
                                   "text after a closing quote (an image manifest holds one row "
                                   "per line)"))
            continue
        if not any(c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            dead.append(
                DeadLetter(f"{csv_path}:{line}", "list", "bad_row",
                           f"row has {len(cells)} cells, the header has {len(header)}")
            )
            continue
        rows.append((line, dict(zip(header, (c.strip() for c in cells)))))
    return _ManifestTable(posixpath.dirname(csv_path), header, image_column, label_column,
                          extra_names, rows, dead)


def manifest_image_path(base: str, image: str) -> str:
    """Where a CSV manifest's image cell points: a ``file://`` prefix dropped, an
    absolute path or a URI as it is, anything else joined to the CSV's folder
    ``base`` (unchanged otherwise: ``..`` is not resolved here)."""
    if image.startswith("file://"):
        image = image[len("file://"):]
    return image if image.startswith("/") or "://" in image else posixpath.join(base, image)


def _parts(path: str) -> tuple[str, list[str]]:
    """``(scheme, names)`` of an absolute path or URI, ``..`` and ``.`` resolved by
    name: ``/a/b`` is ``('', ['a', 'b'])``, ``gs://bucket/x`` is ``('gs', ['bucket', 'x'])``."""
    scheme, sep, rest = path.partition("://")
    if not sep:
        scheme, rest = "", path
    names: list[str] = []
    for name in rest.split("/"):
        if name == "..":
            if names:
                names.pop()
        elif name not in ("", "."):
            names.append(name)
    return scheme, names


def _joined(scheme: str, names: list[str]) -> str:
    return f"{scheme}://" + "/".join(names) if scheme else "/" + "/".join(names)


def outside_root(base: str, path: str) -> str:
    """``''`` when ``path`` lies inside the folder ``base`` (by name: ``..``
    resolved, links not followed; both absolute paths or URIs); else the root it
    reaches: the folder just below the deepest folder the two share (``/data``
    for ``/data/imgs/1.jpg`` beside a CSV in ``/home/me``, ``/home/other`` for
    ``/home/me/../other/1.jpg``), or the folder holding the file when that is the
    shared one; across schemes or buckets, the bucket (``gs://photos``) or the
    top folder (``/data``)."""
    base_scheme, base_names = _parts(base)
    scheme, names = _parts(path)
    if scheme != base_scheme or (scheme and names[:1] != base_names[:1]):
        return _joined(scheme, names[:1] if scheme else names[:min(1, len(names) - 1)])
    shared = 0
    while shared < min(len(names), len(base_names)) and names[shared] == base_names[shared]:
        shared += 1
    if shared == len(base_names) and len(names) > shared:
        return ""
    return _joined(scheme, names[:min(shared + 1, len(names) - 1)])


def within(path: str, roots: Sequence[str]) -> bool:
    """Whether ``path`` lies in one of the folders ``roots`` (by name, as
    ``outside_root`` compares; a root may be a bucket, ``gs://photos``)."""
    scheme, names = _parts(path)
    for root in roots:
        root_scheme, root_names = _parts(root)
        if root_scheme == scheme and names[:len(root_names)] == root_names and len(names) > len(root_names):
            return True
    return False


def rows_outside(csv_path: str, text: str, image_column: str | None = None,
                 label_column: str | None = None, allowed: Sequence[str] = (),
                 resolve: Callable[[str], str | None] | None = None) -> dict[str, int]:
    """``{root: rows}`` of the rows of a CSV manifest whose image lies outside the
    CSV's folder (``outside_root``) and in none of the ``allowed`` folders, before
    any image is looked up: the rows a run must not read unless told to.

    Args:
      csv_path, text, image_column, label_column: as for ``list_csv_manifest``
        (rows it would refuse unread, and cells that name no image file, are
        left out).
      allowed: folders, buckets or URIs whose images may be read.
      resolve: where a path really is (local links followed), ``None`` for a
        path that will not be read at all (an unknown scheme: dead-lettered);
        default: a local path made absolute. The CSV's folder is resolved with
        it too.
    """
    table = _manifest_table(csv_path, text, image_column, label_column)
    resolve = resolve or (lambda path: path if "://" in path else posixpath.abspath(path))
    base = resolve(table.base or ".") or table.base
    roots: Counter = Counter()
    for _, row in table.rows:
        image = row[table.image_column]
        if not is_image_filename(image):
            continue
        path = resolve(manifest_image_path(table.base, image))
        if path is None:
            continue
        root = outside_root(base, path)
        if root and not within(path, allowed):
            roots[root] += 1
    return dict(sorted(roots.items()))


def _cells(line: str) -> list[str]:
    """The cells of one CSV line (a trailing carriage return dropped).

    Raises:
      csv.Error: when a quote on the line is never closed.
    """
    return next(csv.reader([line.rstrip("\r")], strict=True), [])


def _is_int(value: str) -> bool:
    try:
        int(value)
    except ValueError:
        return False
    return True
