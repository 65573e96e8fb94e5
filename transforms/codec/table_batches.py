"""One batch of CSV rows (an Arrow RecordBatch of strings) to framed records.

The rows' feature entries come from ``RowEncoder.entries`` (a column at a time);
each split's rows are framed together (``table_columns.frame_examples``), so a
split's records leave as one blob and an array of sizes.

Like ``transforms.io.helpers``, this module loads no Beam, so the shard writers'
helper processes can run it: the reader sends them batches (Arrow batches
pickle as their buffers) and gets back, per split, the batch's records as one
blob, so neither side does per-row work to move them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import math
import pickle
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec import table_columns
from beam_tfrecords.transforms.codec.table_columns import frame_examples
from beam_tfrecords.transforms.codec.table_rows import RowEncoder, describe_text
from beam_tfrecords.transforms.quality.splits import split_fraction
from beam_tfrecords.transforms.quality.statistics import table_batch_statistics

__all__ = [
    "BAD",
    "BLANK",
    "EncodedBatch",
    "RowError",
    "TableTask",
    "encode_table_batch",
    "order_key",
    "row_split_fraction",
    "sequence_table_batch",
]

BLANK, BAD = -2, -1
DEFAULT_SPLIT = "train"
# Rows encoded at once: bounds the working arrays of a batch to a few MB.
_CHUNK_ROWS = 32_768
# A row whose cells hold more bytes is hashed a piece at a time for its split (_raw_rows).
_LONG_ROW_CHARS = 1 << 20


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


class RowError(NamedTuple):
    """A row that cannot be encoded: its index in the batch, why (a dead letter's
    reason) and a message that names no cell's content."""

    row: int
    reason: str
    message: str


@dataclasses.dataclass
class EncodedBatch:
    """A batch's outcome.

    Attributes:
      status: per row, ``BLANK`` (every cell empty: skipped), ``BAD`` (see
        ``errors``) or the index of its split in ``splits``.
      splits: split names, in order of first appearance.
      blobs: per split, its rows' framed records concatenated in row order.
      sizes: per split, each record's framed size.
      errors: a ``RowError`` for every ``BAD`` row, in row order.
      groups: sequence mode only: sequence key → rows of this batch, each
        ``(order, row, split, values)`` with ``values`` per kept column.
      newlines: per row, the line breaks inside its quoted cells (so the reader
        can number lines).
      statistics: per split, the statistics of its rows in this batch
        (``quality.statistics.table_batch_statistics``); ``None`` when not computed
        (sequences), or no longer true (rows dropped after encoding).
    """

    status: np.ndarray
    splits: list[str]
    blobs: list[bytes]
    sizes: list[np.ndarray]
    errors: list[RowError]
    groups: dict[str, list] = dataclasses.field(default_factory=dict)
    newlines: np.ndarray | None = None
    statistics: dict | None = None


# A stable number in [0, 1) for a split key (a cell, or the raw row).
row_split_fraction = split_fraction


@functools.lru_cache(maxsize=8)
def _encoder(task_bytes: bytes) -> tuple[TableTask, RowEncoder]:
    task = pickle.loads(task_bytes)
    return task, RowEncoder(task.schema, task.header)


def _raw_rows(task: TableTask, batch: pa.RecordBatch) -> list[str | float]:
    """Each row's text as a CSV of ``task``'s dialect writes it (its split key without
    a key column); a row whose cells hold over ``_LONG_ROW_CHARS`` bytes is given as
    that text's ``split_fraction`` instead, hashed a piece at a time from its cells
    (``csv`` would build the text at 4 bytes a character)."""
    import csv  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel

    out = io.StringIO()
    writer = csv.writer(out, delimiter=task.delimiter, quotechar=task.quote, lineterminator="\n")
    sizes = np.zeros(batch.num_rows, dtype=np.int64)
    for name in task.header:
        sizes += pc.binary_length(batch.column(name)).to_numpy(zero_copy_only=False)
    long = np.flatnonzero(sizes > _LONG_ROW_CHARS).tolist()
    fractions = {row: _long_row_fraction(task, batch, row) for row in long}
    keep = pa.array(np.isin(np.arange(batch.num_rows), long, invert=True)) if long else None
    columns = [(batch.column(name) if keep is None else batch.column(name).filter(keep)).to_pylist()
               for name in task.header]
    rows: list[str | float] = []
    for cells in zip(*columns):
        while len(rows) in fractions:
            rows.append(fractions[len(rows)])
        out.seek(0)
        out.truncate()
        writer.writerow(cells)
        rows.append(out.getvalue()[:-1])
    while len(rows) in fractions:
        rows.append(fractions[len(rows)])
    return rows


def _long_row_fraction(task: TableTask, batch: pa.RecordBatch, row: int) -> float:
    """``split_fraction`` of a row's CSV text (as ``_raw_rows`` writes it: a cell is
    quoted when it holds a character ``csv`` quotes, its quotes doubled; one empty
    cell alone is ``""``), from its cells' UTF-8 bytes a megabyte at a time."""
    digest = hashlib.sha256()
    quote, delimiter = task.quote.encode(), task.delimiter.encode()
    special = _quoted_characters(task.delimiter, task.quote)
    for k, name in enumerate(task.header):
        cell = batch.column(name).slice(row, 1)
        if k:
            digest.update(delimiter)
        if len(task.header) == 1 and pc.binary_length(cell)[0].as_py() == 0:
            digest.update(quote + quote)
            continue
        quoted = any(pc.any(pc.match_substring(cell, ch)).as_py() for ch in special)
        offsets = np.frombuffer(cell.buffers()[1], dtype=np.int32, count=2, offset=cell.offset * 4)
        data = cell.buffers()[2]
        if quoted:
            digest.update(quote)
        for at in range(int(offsets[0]), int(offsets[1]), 1 << 20):
            piece = data.slice(at, min(1 << 20, int(offsets[1]) - at)).to_pybytes()
            digest.update(piece.replace(quote, quote + quote) if quoted else piece)
        if quoted:
            digest.update(quote)
    return int.from_bytes(digest.digest()[:8], "big") / 2**64


@functools.lru_cache(maxsize=8)
def _quoted_characters(delimiter: str, quote: str) -> tuple[str, ...]:
    """The characters that make ``csv.writer`` (this dialect, ``\\n`` line ends) quote
    a cell, found by asking it."""
    import csv  # pylint: disable=import-outside-toplevel
    import io  # pylint: disable=import-outside-toplevel

    found = []
    for ch in dict.fromkeys((delimiter, quote, "\n", "\r", " ", "\t", "\x00", "\x0b", "\x0c")):
        out = io.StringIO()
        csv.writer(out, delimiter=delimiter, quotechar=quote, lineterminator="\n").writerow([f"a{ch}b", "c"])
        if out.getvalue().startswith(quote):
            found.append(ch)
    return tuple(found)


def _split_codes(task: TableTask, batch: pa.RecordBatch) -> tuple[np.ndarray, list[str]]:
    """Per row the index of its split in the returned names, or -1 for a split cell that
    cannot name a shard file; each distinct split cell or key is looked at once."""
    rows = batch.num_rows
    if task.split_column:
        encoded = pc.dictionary_encode(batch.column(task.split_column))
        distinct = encoded.dictionary.to_pylist()
        valid = [is_valid_split_name(c) for c in distinct]
        names = [c for c, ok in zip(distinct, valid) if ok]
        to_name = np.cumsum(valid) - 1
        codes = np.where(np.array(valid, dtype=bool), to_name, -1) if distinct else np.empty(0, np.int64)
        return codes[encoded.indices.to_numpy(zero_copy_only=False)].astype(np.int64), names
    if task.splits:
        key_column = task.key_column or task.sequence_key
        edges = np.cumsum([f for _, f in task.splits])
        names = list(task.split_names)
        if key_column:
            encoded = pc.dictionary_encode(batch.column(key_column))
            fractions = [row_split_fraction(k) for k in encoded.dictionary.to_pylist()]
            picks = np.searchsorted(edges, fractions, side="right")[
                encoded.indices.to_numpy(zero_copy_only=False)]
        else:
            picks = np.searchsorted(edges, [k if isinstance(k, float) else row_split_fraction(k)
                                            for k in _raw_rows(task, batch)], side="right")
        return np.minimum(picks, len(names) - 1).astype(np.int64), names
    return np.zeros(rows, dtype=np.int64), [DEFAULT_SPLIT]


def _bad_split(task: TableTask, cell: str) -> str:
    what = "an empty cell" if cell == "" else describe_text(cell)
    return (f"column {task.split_column!r} (--split_column): {what} cannot name a shard file: "
            "use letters, digits, '_' and '.'")


def _row_splits(task: TableTask, batch: pa.RecordBatch) -> list[str | None]:
    codes, names = _split_codes(task, batch)
    return [names[c] if c >= 0 else None for c in codes.tolist()]


def _cells(task: TableTask, batch: pa.RecordBatch) -> dict:
    """Column name → cells as a list of strings (for the per-row sequence path)."""
    keys = {c for c in (task.split_column, task.key_column, task.sequence_key, task.sequence_order) if c}
    return {name: batch.column(name).to_pylist() for name in keys | {c.name for c in task.schema.kept}}


def _statistics(task: TableTask, batch: pa.RecordBatch, status: np.ndarray,
                splits: list[str]) -> dict | None:
    return table_batch_statistics(task.schema, batch, status, splits) if task.statistics else None


def _blank_rows(batch: pa.RecordBatch) -> np.ndarray:
    blank = np.ones(batch.num_rows, dtype=bool)
    for column in batch.columns:
        blank &= pc.binary_length(column).to_numpy(zero_copy_only=False) == 0
    return blank


def _newlines(batch: pa.RecordBatch) -> np.ndarray:
    counts = np.zeros(batch.num_rows, dtype=np.int64)
    for column in batch.columns:
        data = column.buffers()[2]
        if data is not None and _holds_newline(data):  # Else none to count.
            counts += pc.count_substring(column, "\n").to_numpy(zero_copy_only=False)
    return counts


def _holds_newline(data: pa.Buffer, piece: int = 4 << 20) -> bool:
    """Whether a buffer holds a newline, looked for a few megabytes at a time (a long
    cell's whole buffer compared at once took a byte of memory per byte)."""
    octets = np.frombuffer(data, dtype=np.uint8)
    return any((octets[at:at + piece] == 10).any() for at in range(0, len(octets), piece))


def order_key(cell: str) -> tuple:
    """How ``--sequence_order`` sorts: numbers numerically, before other text (NaN, which
    has no order among numbers, sorts as text)."""
    try:
        value = float(cell)
    except ValueError:
        return (1, 0.0, cell)
    return (1, 0.0, cell) if math.isnan(value) else (0, value, "")


def sequence_table_batch(task_bytes: bytes, batch: pa.RecordBatch) -> EncodedBatch:
    """Parses a batch for ``--sequence_key``: good rows are grouped by key, not encoded
    (a sequence's rows may come from several batches and files)."""
    task, encoder = _encoder(task_bytes)
    blank = _blank_rows(batch)
    cells = _cells(task, batch)
    values, row_errors = encoder.parse(cells)
    splits = _row_splits(task, batch)
    status = np.full(batch.num_rows, BAD, dtype=np.int16)
    errors = {e.row: RowError(e.row, e.reason, e.message) for e in row_errors}
    kept = [c.name for c in task.schema.kept]
    groups: dict[str, list] = {}
    for row in range(batch.num_rows):
        if blank[row]:
            status[row] = BLANK
            errors.pop(row, None)
            continue
        key = cells[task.sequence_key][row]
        if row not in errors and key == "":
            errors[row] = RowError(row, "missing_sequence_key", f"column {task.sequence_key!r} is empty")
        if row not in errors and splits[row] is None:
            errors[row] = RowError(row, "bad_split", _bad_split(task, cells[task.split_column][row]))
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
    codes, names = _split_codes(task, batch)
    bad = np.zeros(rows, dtype=bool)
    errors: dict[int, RowError] = {}
    pieces: dict[int, tuple[list, list]] = {}  # split code → (blobs, sizes) of each chunk
    kept = [c.name for c in task.schema.kept]
    for start in range(0, max(rows, 1), _CHUNK_ROWS):
        chunk = batch.slice(start, _CHUNK_ROWS)
        entries, chunk_bad, row_errors = encoder.entries({name: chunk.column(name) for name in kept},
                                                         chunk.num_rows)
        bad[start:start + chunk.num_rows] = chunk_bad
        for e in row_errors:
            if not blank[start + e.row]:
                errors[start + e.row] = RowError(start + e.row, e.reason, e.message)
        good = ~chunk_bad & ~blank[start:start + chunk.num_rows]
        chunk_codes = codes[start:start + chunk.num_rows]
        for code in np.unique(chunk_codes[good & (chunk_codes >= 0)]).tolist():
            rows_k = good & (chunk_codes == code)
            if rows_k.all():  # The chunk's one split: its entries are framed, then let go.
                parts, entries = entries, []
            else:
                parts = [e.filter(pa.array(rows_k)) for e in entries]
            records = frame_examples(parts, int(rows_k.sum()))
            blob, record_sizes = table_columns.blob(records)
            blobs, sizes = pieces.setdefault(code, ([], []))
            blobs.append(blob)
            sizes.append(record_sizes)
    bad_split = np.nonzero((codes < 0) & ~bad & ~blank)[0]
    if len(bad_split):
        split_cells = batch.column(task.split_column).take(pa.array(bad_split)).to_pylist()
        for row, cell in zip(bad_split.tolist(), split_cells):
            errors[row] = RowError(row, "bad_split", _bad_split(task, cell))
    good = ~bad & ~blank & (codes >= 0)
    status = np.full(rows, BAD, dtype=np.int16)
    status[blank] = BLANK
    # Splits in order of their first row written.
    used, first_rows = np.unique(codes[good], return_index=True)
    order = used[np.argsort(first_rows)].tolist()
    splits = [names[code] for code in order]
    for k, code in enumerate(order):
        status[good & (codes == code)] = k
    encoded = EncodedBatch(
        status=status,
        splits=splits,
        blobs=[_joined(pieces[code][0]) for code in order],
        sizes=[np.concatenate(pieces[code][1]) for code in order],
        errors=[errors[row] for row in sorted(errors)],
        newlines=_newlines(batch),
        statistics=_statistics(task, batch, status, splits) if splits else {},
    )
    _release_memory()
    return encoded


def _joined(blobs: list) -> bytes | pa.Buffer:
    """The blobs end to end (one is left as it is: a long row's is not copied)."""
    return blobs[0] if len(blobs) == 1 else b"".join(blobs)


def _release_memory() -> None:
    """Hands the batch's freed working memory back to the system: Arrow's pool and the C
    heap keep freed blocks, and a helper process would hold them for the rest of the run."""
    pa.default_memory_pool().release_unused()
    if _malloc_trim is not None:
        _malloc_trim(0)


def _libc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # Not glibc.
        return None


_malloc_trim = _libc_malloc_trim()
