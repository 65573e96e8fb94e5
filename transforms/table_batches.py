"""One batch of CSV rows (an Arrow RecordBatch of strings) to framed records.

Like ``transforms.encode``, this module loads no Beam, so the shard writers'
helper processes can run it: the reader sends them batches (Arrow batches
pickle as their buffers) and gets back, per split, the batch's records as one
blob, so neither side does per-row work to move them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.sharding import is_valid_split_name
from schemas.table_encode import RowEncoder
from schemas.table_schema import TableSchema

__all__ = ["BLANK", "BAD", "EncodedBatch", "TableTask", "encode_table_batch", "row_split_fraction"]

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
    """

    status: np.ndarray
    splits: list[str]
    blobs: list[bytes]
    sizes: list[np.ndarray]
    errors: list[tuple[int, str, str]]


def row_split_fraction(key: str) -> float:
    """A stable number in [0, 1) for a split key (a cell, or the raw row)."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


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
        keys = cells[task.key_column] if task.key_column else _raw_rows(task, batch)
        edges = np.cumsum([f for _, f in task.splits])
        names = task.split_names
        picks = np.searchsorted(edges, [row_split_fraction(k) for k in keys], side="right")
        return [names[min(int(i), len(names) - 1)] for i in picks]
    return [DEFAULT_SPLIT] * rows


def encode_table_batch(task_bytes: bytes, batch: pa.RecordBatch) -> EncodedBatch:
    """Encodes a batch of rows of all-string columns.

    Args:
      task_bytes: the pickled ``TableTask`` (pickled once by the caller; helpers
        cache the encoder built from it).
      batch: the rows, one string column per CSV column.
    """
    task, encoder = _encoder(task_bytes)
    rows = batch.num_rows
    blank = np.ones(rows, dtype=bool)
    for column in batch.columns:
        blank &= pc.equal(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)
    needed = {c.name for c in task.schema.kept} | {c for c in (task.split_column, task.key_column) if c}
    cells = {name: batch.column(name).to_pylist() for name in needed}
    records, row_errors = encoder.encode(cells, rows)
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
    )
