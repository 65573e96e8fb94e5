"""One batch of CSV rows (an Arrow RecordBatch of strings) to framed records.

Like ``transforms.io.helpers``, this module loads no Beam, so the shard writers'
helper processes can run it: the reader sends them batches (Arrow batches
pickle as their buffers) and gets back, per split, the batch's records as one
blob, so neither side does per-row work to move them.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.plan.splits import split_fraction
from beam_tfrecords.transforms.plan.statistics import table_batch_statistics

__all__ = [
    "BAD",
    "BLANK",
    "EncodedBatch",
    "TableTask",
    "encode_table_batch",
    "order_key",
    "row_split_fraction",
    "sequence_table_batch",
]

BLANK, BAD = -2, -1
DEFAULT_SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class TableTask:
    """What a helper needs to encode batches of one CSV layout."""

    schema: TableSchema
    header: tuple[str, ...]
    split_column: str | None = None
    splits: tuple[tuple[str, float], ...] = ()
    key_column: str | None = None
    delimiter: str = ","
    quote: str = '"'
    sequence_key: str | None = None
    sequence_order: str | None = None
    # Summarise each batch for the manifest's statistics (RowsToExamples does not).
    statistics: bool = True

    @property
    def split_names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.splits) if self.splits else ()


@dataclasses.dataclass
class EncodedBatch:
    """A batch's outcome.

    Attributes:
      status: per row, ``BLANK`` (every cell empty: skipped), ``BAD`` (see
        ``errors``) or the index of its split in ``splits``.
      splits: split names, in order of first appearance.
      blobs: per split, its rows' framed records concatenated in row order.
      sizes: per split, each record's framed size.
      errors: ``(row, reason, message)`` for every ``BAD`` row.
      groups: sequence mode only: sequence key → rows of this batch, each
        ``(order, row, split, values)`` with ``values`` per kept column.
      newlines: per row, the line breaks inside its quoted cells (so the reader
        can number lines).
      statistics: per split, the statistics of its rows in this batch
        (``plan.statistics.table_batch_statistics``); ``None`` when not computed
        (sequences), or no longer true (rows dropped after encoding).
    """

    status: np.ndarray
    splits: list[str]
    blobs: list[bytes]
    sizes: list[np.ndarray]
    errors: list[tuple[int, str, str]]
    groups: dict[str, list] = dataclasses.field(default_factory=dict)
    newlines: np.ndarray | None = None
    statistics: dict | None = None


# A stable number in [0, 1) for a split key (a cell, or the raw row).
row_split_fraction = split_fraction


@functools.lru_cache(maxsize=8)
def _encoder(task_bytes: bytes) -> tuple[TableTask, RowEncoder]:
    task = pickle.loads(task_bytes)
    return task, RowEncoder(task.schema, task.header)


def _raw_rows(task: TableTask, batch: pa.RecordBatch) -> list[str]:
    import csv  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel

    out = io.StringIO()
    writer = csv.writer(out, delimiter=task.delimiter, quotechar=task.quote, lineterminator="\n")
    columns = [batch.column(name).to_pylist() for name in task.header]
    rows = []
    for cells in zip(*columns):
        out.seek(0)
        out.truncate()
        writer.writerow(cells)
        rows.append(out.getvalue()[:-1])
    return rows


def _row_splits(task: TableTask, batch: pa.RecordBatch, cells: dict) -> list[str | None]:
    rows = batch.num_rows
    if task.split_column:
        return [c if is_valid_split_name(c) else None for c in cells[task.split_column]]
    if task.splits:
        key_column = task.key_column or task.sequence_key
        keys = cells[key_column] if key_column else _raw_rows(task, batch)
        edges = np.cumsum([f for _, f in task.splits])
        names = task.split_names
        picks = np.searchsorted(edges, [row_split_fraction(k) for k in keys], side="right")
        return [names[min(int(i), len(names) - 1)] for i in picks]
    return [DEFAULT_SPLIT] * rows


def _cells(task: TableTask, batch: pa.RecordBatch, arrow_floats: bool = False) -> dict:
    """Column name → cells as a list of strings; with ``arrow_floats``, one-value
    columns and int64 list columns stay Arrow arrays (the encoder parses those in
    a few calls)."""
    keys = {c for c in (task.split_column, task.key_column, task.sequence_key, task.sequence_order) if c}
    cells = {name: batch.column(name).to_pylist() for name in keys}
    for column in task.schema.kept:
        if column.name in cells:
            continue
        vectorized = arrow_floats and column.shape is None and column.encoding == "flat" and (
            not column.is_list or column.type == "int64"
        )
        array = batch.column(column.name)
        cells[column.name] = array if vectorized else array.to_pylist()
    return cells


def _statistics(task: TableTask, batch: pa.RecordBatch, status: np.ndarray,
                splits: list[str]) -> dict | None:
    return table_batch_statistics(task.schema, batch, status, splits) if task.statistics else None


def _blank_rows(batch: pa.RecordBatch) -> np.ndarray:
    blank = np.ones(batch.num_rows, dtype=bool)
    for column in batch.columns:
        blank &= pc.equal(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)
    return blank


def _newlines(batch: pa.RecordBatch) -> np.ndarray:
    counts = np.zeros(batch.num_rows, dtype=np.int64)
    for column in batch.columns:
        counts += pc.count_substring(column, "\n").to_numpy(zero_copy_only=False)
    return counts


def order_key(cell: str) -> tuple:
    """How ``--sequence_order`` sorts: numbers numerically, before other text."""
    try:
        return (0, float(cell), "")
    except ValueError:
        return (1, 0.0, cell)


def sequence_table_batch(task_bytes: bytes, batch: pa.RecordBatch) -> EncodedBatch:
    """Parses a batch for ``--sequence_key``: good rows are grouped by key, not encoded
    (a sequence's rows may come from several batches and files)."""
    task, encoder = _encoder(task_bytes)
    blank = _blank_rows(batch)
    cells = _cells(task, batch)
    values, row_errors = encoder.parse(cells)
    splits = _row_splits(task, batch, cells)
    status = np.full(batch.num_rows, BAD, dtype=np.int16)
    errors = {e.row: (e.row, e.reason, e.message) for e in row_errors}
    kept = [c.name for c in task.schema.kept]
    groups: dict[str, list] = {}
    for row in range(batch.num_rows):
        if blank[row]:
            status[row] = BLANK
            errors.pop(row, None)
            continue
        key = cells[task.sequence_key][row]
        if row not in errors and key == "":
            errors[row] = (row, "missing_sequence_key", f"column {task.sequence_key!r} is empty")
        if row not in errors and splits[row] is None:
            errors[row] = (row, "bad_split", f"split {cells[task.split_column][row]!r} cannot "
                           "name a shard file: use letters, digits, '_' and '.'")
        if row in errors:
            continue
        order = order_key(cells[task.sequence_order][row]) if task.sequence_order else (0, 0.0, "")
        groups.setdefault(key, []).append(
            (order, row, splits[row], tuple(values[name][row] for name in kept))
        )
        status[row] = 0
    return EncodedBatch(status, [], [], [], [errors[row] for row in sorted(errors)], groups,
                        _newlines(batch))


def encode_table_batch(task_bytes: bytes, batch: pa.RecordBatch) -> EncodedBatch:
    """Encodes a batch of rows of all-string columns.

    Args:
      task_bytes: the pickled ``TableTask`` (pickled once by the caller; helpers
        cache the encoder built from it).
      batch: the rows, one string column per CSV column.
    """
    task, encoder = _encoder(task_bytes)
    rows = batch.num_rows
    blank = _blank_rows(batch)
    cells = _cells(task, batch, arrow_floats=True)
    records, row_errors = encoder.encode(cells, rows)
    if not task.split_column and not task.splits:
        # One split: the rows' records in order, less the blank and bad ones.
        status = np.zeros(rows, dtype=np.int16)
        errors = [(e.row, e.reason, e.message) for e in row_errors if not blank[e.row]]
        for row, _, _ in errors:
            status[row] = BAD
            records[row] = None
        for row in np.nonzero(blank)[0]:
            status[row] = BLANK
            records[row] = None
        kept = [r for r in records if r is not None]
        if not kept:
            return EncodedBatch(status, [], [], [], errors, newlines=_newlines(batch), statistics={})
        return EncodedBatch(status, [DEFAULT_SPLIT], [b"".join(kept)],
                            [np.fromiter(map(len, kept), dtype=np.int64, count=len(kept))], errors,
                            newlines=_newlines(batch),
                            statistics=_statistics(task, batch, status, [DEFAULT_SPLIT]))
    splits = _row_splits(task, batch, cells)
    status = np.full(rows, BAD, dtype=np.int16)
    errors = {e.row: (e.row, e.reason, e.message) for e in row_errors}
    names: list[str] = []
    index: dict[str, int] = {}
    parts: list[list[bytes]] = []
    for row in range(rows):
        if blank[row]:
            status[row] = BLANK
            errors.pop(row, None)
            continue
        if row in errors:
            continue
        split = splits[row]
        if split is None:
            cell = cells[task.split_column][row]
            errors[row] = (row, "bad_split", f"split {cell!r} cannot name a shard file: "
                                             "use letters, digits, '_' and '.'")
            continue
        k = index.get(split)
        if k is None:
            k = index[split] = len(names)
            names.append(split)
            parts.append([])
        status[row] = k
        parts[k].append(records[row])
    return EncodedBatch(
        status=status,
        splits=names,
        blobs=[b"".join(p) for p in parts],
        sizes=[np.fromiter(map(len, p), dtype=np.int64, count=len(p)) for p in parts],
        errors=[errors[row] for row in sorted(errors)],
        newlines=_newlines(batch),
        statistics=_statistics(task, batch, status, names),
    )
