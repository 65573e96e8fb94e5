"""Box CSV manifests and several labels per image: CSV rows to one record's annotations
per image.

Pure: rows already split into cells (``csv_rows`` splits a text with the ``csv`` module
and keeps each row's first line number), grouped by the image column into ONE
``ImageAnnotations`` per image, images sorted by path, each image's objects (or labels)
in row order. Rows are grouped by the image cell normalized (``image_path``: ``./``,
``..`` and doubled slashes resolved, ``scheme://`` paths such as ``gs://`` kept as
written), so ``images/a.jpg``, ``./images/a.jpg`` and ``images//a.jpg`` are one image;
the normalized path is ``path`` and ``source_id``: the caller resolves it against the
CSV's folder.

Boxes (``read_box_rows``): the box columns are ``xmin,ymin,xmax,ymax`` unless named,
their values in ``units``: ``"pixels"`` (the contract's continuous 0-based edges, as the
detection CSV every tutorial writes them) or ``"normalized"`` (divided by the width and
height). ``every_value_normalized`` says whether every box value is at most 1, so the
plan can say so when pixels were assumed. ``width``/``height`` columns, when present,
give ``stated_size`` (an empty pair states nothing). The class column's names make the
label map: names sorted, ids from 1 (0 is the background). A row whose box and class
cells are all empty is an image without objects (a negative example).

Several labels (``read_label_rows``): no box columns; each image's labels in row order,
without repeats; with a ``separator``, one cell holds several labels (pieces stripped,
empty pieces skipped). An empty cell adds no label: an image whose cells are all empty
has none.

Problems, named ``"<csv>:<line>"``: a row with fewer cells than the header, or whose box
or size cells are not numbers (or a box row without a class), is ``bad_label_line``,
the object dropped and the image kept; a box whose ``xmin`` passes its ``xmax`` (or
``ymin`` its ``ymax``) is taken as given, so the record builder drops it as
``box_empty``, its detail saying the coordinates are swapped (nothing is swapped
silently); a coordinate that is not finite is
``box_not_finite``, likewise; a row without an image is ``bad_label_line`` with nothing
kept; rows of one image that state different sizes make the image an
``annotation_size_mismatch``, nothing kept.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import posixpath
from collections.abc import Iterable, Sequence

from beam_tfrecords.schemas.annotations import (
    Annotated,
    AnnotationProblem,
    ImageAnnotations,
    LabelMap,
    ObjectAnnotation,
)

__all__ = [
    "BOX_COLUMNS",
    "BOX_UNITS",
    "SIZE_COLUMNS",
    "CsvRow",
    "csv_rows",
    "every_value_normalized",
    "image_path",
    "read_box_rows",
    "read_label_rows",
]

BOX_COLUMNS = ("xmin", "ymin", "xmax", "ymax")
SIZE_COLUMNS = ("width", "height")
BOX_UNITS = ("pixels", "normalized")


@dataclasses.dataclass(frozen=True)
class CsvRow:
    """One CSV row: the line it starts on (the header is line 1) and its cells, or, for a
    row that does not parse (a quote never closed), no cells and ``error`` saying so."""

    line: int
    cells: tuple[str, ...]
    error: str = ""


def csv_rows(text: str) -> tuple[tuple[str, ...], tuple[CsvRow, ...]]:
    """The header and the rows of a CSV text (``csv`` module, excel dialect, strict);
    blank rows are skipped. A row whose quoting is broken is a row with ``error`` set,
    and reading goes on at the line after the one it starts on (the rows a quote never
    closed would swallow are read as rows)."""
    lines = text.splitlines(keepends=True)
    header: tuple[str, ...] = ()
    rows = []
    first = 0  # The index in ``lines`` reading starts from.
    while first < len(lines):
        reader = csv.reader(iter(lines[first:]), strict=True)
        previous = 0
        try:
            for cells in reader:
                start, previous = first + previous + 1, reader.line_num
                if not header:
                    header = tuple(c.strip() for c in cells)
                    continue
                if any(c.strip() for c in cells):
                    rows.append(CsvRow(start, tuple(cells)))
            break
        except csv.Error:
            rows.append(CsvRow(first + previous + 1, (), "the row's quoting is broken (a quote is never closed, "
                                                          "or text follows a closing quote)"))
            first += previous + 1
    return header, tuple(rows)


def every_value_normalized(annotated: Annotated) -> bool:
    """Whether every box coordinate is at most 1 (and there is a box): the boxes were
    probably normalized while read as pixels."""
    values = [v for image in annotated.images for o in image.objects for v in o.box]
    return bool(values) and all(v <= 1.0 for v in values)


def image_path(cell: str) -> str:
    """An image cell as rows are grouped by: stripped, then ``posixpath.normpath``
    (``./a.jpg``, ``images//a.jpg``, ``images/x/../a.jpg`` name ``a.jpg``,
    ``images/a.jpg``); a path with a scheme (``gs://``, ``file://``) is kept as
    written, and a leading ``//`` is one ``/``. ``''`` stays ``''``."""
    cell = cell.strip()
    if not cell or "://" in cell:
        return cell
    normal = posixpath.normpath(cell)
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


class _RowError(ValueError):
    """A row not taken: ``args`` = (reason, detail)."""


def _columns(header: Sequence[str], names: Sequence[str]) -> tuple[int, ...]:
    missing = [n for n in names if n not in header]
    if missing:
        raise ValueError(f"the CSV has no column {missing[0]}")
    return tuple(header.index(n) for n in names)


def _problem(where: str, reason: str, detail: str, image: str = "", kept: str = "image") -> AnnotationProblem:
    return AnnotationProblem(source=where, reason=reason, detail=detail, image=image, kept=kept)


def _size(cells: Sequence[str], where: tuple[int, int] | None) -> tuple[int, int] | None:
    if where is None or not any(cells[i].strip() for i in where):
        return None
    try:
        values = [float(cells[i]) for i in where]
    except ValueError:
        raise _RowError("bad_label_line", "width or height is not a number") from None
    if not all(math.isfinite(v) and v > 0 and v == int(v) for v in values):
        raise _RowError("bad_label_line", "width or height is not a whole number above 0")
    return int(values[0]), int(values[1])


def _box(cells: Sequence[str], where: tuple[int, ...]) -> tuple[float, float, float, float]:
    try:
        box = tuple(float(cells[i]) for i in where)
    except ValueError:
        raise _RowError("bad_label_line", "a box value is not a number") from None
    if not all(math.isfinite(v) for v in box):
        raise _RowError("box_not_finite", "a box value is not a finite number")
    return box  # type: ignore[return-value]


class _Image:
    """One image's rows while they are grouped."""

    def __init__(self, line: int):
        self.first_line = line
        self.items: list = []  # (name, box, where) for boxes; names for labels
        self.size: tuple[int, int] | None = None
        self.size_line = 0
        self.refused: AnnotationProblem | None = None


def _rows_by_image(source: str, header: Sequence[str], rows: Iterable[CsvRow], image_column: str,
                   problems: list, images: dict[str, _Image]) -> Iterable[tuple[str, _Image, CsvRow, str]]:
    """``(path, image, row, where)`` per row with all its cells and an image, the image
    grouped in ``images``; the others are problems (a short row's image is still kept)."""
    index = _columns(header, [image_column])[0]
    for row in rows:
        where = f"{source}:{row.line}"
        if row.error:
            problems.append(_problem(where, "bad_label_line", row.error, kept="nothing"))
            continue
        if len(row.cells) < len(header):
            image = image_path(row.cells[index]) if index < len(row.cells) else ""
            problems.append(_problem(where, "bad_label_line",
                                     f"{len(row.cells)} cells, the header has {len(header)}", image,
                                     "image" if image else "nothing"))
            if image:
                images.setdefault(image, _Image(row.line))
            continue
        path = image_path(row.cells[index])
        if not path:
            problems.append(_problem(where, "bad_label_line", "no image", kept="nothing"))
            continue
        yield path, images.setdefault(path, _Image(row.line)), row, where


def _label_map(names: Iterable[str]) -> LabelMap:
    return LabelMap(tuple((i, n) for i, n in enumerate(sorted(set(names)), start=1)))


def _take_size(image: _Image, size: tuple[int, int] | None, row: CsvRow, where: str, path: str) -> None:
    if size is None or image.refused is not None:
        return
    if image.size is None:
        image.size, image.size_line = size, row.line
    elif size != image.size:
        image.refused = _problem(
            where, "annotation_size_mismatch",
            f"width/height {size[0]}x{size[1]} differ from line {image.size_line}'s "
            f"{image.size[0]}x{image.size[1]}", path, "nothing")


def read_box_rows(header: Sequence[str], rows: Iterable[CsvRow], *, source: str,
                  image_column: str, class_column: str, box_columns: Sequence[str] = BOX_COLUMNS,
                  units: str = "pixels", size_columns: Sequence[str] | None = SIZE_COLUMNS) -> Annotated:
    """A box CSV: one ``ImageAnnotations`` per image, objects in row order.

    Args:
      header, rows: the CSV (``csv_rows``).
      source: the CSV's name, as problems and objects name it (``"boxes.csv:17"``).
      image_column, class_column: the columns holding the image path and the class name.
      box_columns: the four box columns, in ``xmin, ymin, xmax, ymax`` order.
      units: ``"pixels"`` or ``"normalized"``.
      size_columns: the width and height columns; used when both are in the header.

    Raises:
      ValueError: a column named (or the default box columns) missing from the header,
        or ``units`` unknown: a bad flag, the caller's to report.
    """
    if units not in BOX_UNITS:
        raise ValueError(f"box units must be one of {', '.join(BOX_UNITS)}")
    boxes = _columns(header, list(box_columns))
    label = _columns(header, [class_column])[0]
    sizes = (_columns(header, list(size_columns))
             if size_columns and all(c in header for c in size_columns) else None)
    problems: list[AnnotationProblem] = []
    images: dict[str, _Image] = {}
    for path, image, row, where in _rows_by_image(source, header, rows, image_column, problems, images):
        name = row.cells[label].strip()
        try:
            _take_size(image, _size(row.cells, sizes), row, where, path)
            if not name and not any(row.cells[i].strip() for i in boxes):
                continue  # A negative row: the image, no object.
            if not name:
                raise _RowError("bad_label_line", f"a box without a {class_column}")
            image.items.append((name, _box(row.cells, boxes), where))
        except _RowError as err:
            problems.append(_problem(where, err.args[0], err.args[1], path))
    label_map = _label_map(n for image in images.values() if image.refused is None for n, _, _ in image.items)
    ids = dict((n, i) for i, n in label_map.items)
    found = []
    for path in sorted(images):
        image = images[path]
        if image.refused is not None:
            problems.append(image.refused)
            continue
        objects = tuple(ObjectAnnotation(box=box, label=ids[name], text=name, source=where)
                        for name, box, where in image.items)
        found.append(ImageAnnotations(path=path, source_id=path, objects=objects, units=units,
                                      stated_size=image.size, source=f"{source}:{image.first_line}"))
    return Annotated(layout="box_csv", images=tuple(found), label_map=label_map, problems=tuple(problems))


def read_label_rows(header: Sequence[str], rows: Iterable[CsvRow], *, source: str,
                    image_column: str, label_column: str, separator: str | None = None) -> Annotated:
    """Several labels per image: one ``ImageAnnotations`` per image with ``labels`` and
    ``texts`` in row order, without repeats.

    Args:
      header, rows: the CSV (``csv_rows``).
      source: the CSV's name, as problems name it.
      image_column, label_column: the columns holding the image path and the label(s).
      separator: splits one label cell into several labels (``None``: one per cell).

    Raises:
      ValueError: a column named missing from the header, or an empty ``separator``.
    """
    if separator == "":
        raise ValueError("the label separator is empty")
    label = _columns(header, [label_column])[0]
    problems: list[AnnotationProblem] = []
    images: dict[str, _Image] = {}
    for _path, image, row, _where in _rows_by_image(source, header, rows, image_column, problems, images):
        cell = row.cells[label]
        pieces = cell.split(separator) if separator is not None else [cell]
        for piece in (p.strip() for p in pieces):
            if piece and piece not in image.items:
                image.items.append(piece)
    label_map = _label_map(n for image in images.values() for n in image.items)
    ids = dict((n, i) for i, n in label_map.items)
    found = tuple(
        ImageAnnotations(path=path, source_id=path, labels=tuple(ids[n] for n in images[path].items),
                         texts=tuple(images[path].items), source=f"{source}:{images[path].first_line}")
        for path in sorted(images))
    return Annotated(layout="multi_label", images=found, label_map=label_map, problems=tuple(problems))
