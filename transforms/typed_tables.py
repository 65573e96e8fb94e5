"""Reading one Parquet or JSON Lines file, for the table encode step (``transforms.tables``).

``io.table_readers`` reads the file in typed pieces (Parquet a batch of a row group
at a time, JSON Lines a block of lines at a time); each piece's values are written
as the cell text a CSV of the same table holds (``codec.table_cells``), so every
format gives the same records, and encoded and spooled as a CSV's batches are
(``transforms.table_spooling``).

A file's "lines" are, for Parquet, the rows its metadata counts; for JSON Lines,
its physical lines. Each must be covered by a row written, dead-lettered or blank,
or by a stretch that could not be read.
"""

from __future__ import annotations

import collections
import logging
import pickle
import time
from collections.abc import Generator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.table_schema import TableSchema
from beam_tfrecords.transforms.codec.table_batches import TableTask
from beam_tfrecords.transforms.codec.table_cells import text_batch
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.io.csv_stream import FileCounts
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.table_readers import JsonLinesReader, ParquetReader, table_format
from beam_tfrecords.transforms.table_spooling import FileState, TableFileReader, drop_rows, table_header

__all__ = ["TypedTableReader"]

_log = logging.getLogger(__name__)


def _json_types(schema: TableSchema) -> dict[str, pa.DataType]:
    """The Arrow types JSON values of int64 and float columns are read as (so an
    integer never goes through a float, and a value of another type costs its line)."""
    scalar = {"int64": pa.int64(), "float": pa.float64()}
    return {c.name: pa.list_(scalar[c.type]) if c.is_list else scalar[c.type]
            for c in schema.kept if c.type in scalar}


class _Sent(NamedTuple):
    """A piece whose text batch went to be encoded, and the rows to drop from it."""

    piece: object
    problems: dict


class TypedTableReader(TableFileReader):
    """Reads Parquet and JSON Lines files (see the module's text)."""

    def read(self, file_index: int, path: str) -> Generator[object, None, FileState]:
        """Reads one Parquet or JSON Lines file whole (typed pieces → cell text → the
        CSV encoder); yields sequence rows (with a sequence key).

        Returns:
          The file's ``FileState``, its spools closed.
        """
        start = time.monotonic()
        hold_point("listing")
        schema, layout = self._schema, self._layout
        kind = table_format(path)
        try:
            header = table_header(self._dialect, path)
        except ValueError:
            if kind != "jsonl":
                raise
            header = []  # Empty, or no object in its first lines: each line is read on its own.
        if kind == "jsonl":  # Objects may leave keys out: a column no early object names is empty.
            needed = [c.name for c in schema.kept] + [c for c in (
                layout.split_column, layout.key_column, layout.sequence_key, layout.sequence_order) if c]
            header += [name for name in dict.fromkeys(needed) if name not in header]
        task = TableTask(schema, tuple(header), layout.split_column, layout.splits,
                         layout.key_column, ",", '"', layout.sequence_key, layout.sequence_order)
        RowEncoder(schema, header)  # Fails here, with the columns named, on a wrong header.
        state = FileState(path, file_index, header, pickle.dumps(task), FileCounts(b'"'))
        specs = {c.name: c for c in schema.kept}
        known = set(header)
        reader = ParquetReader(path, header) if kind == "parquet" else JsonLinesReader(path, _json_types(schema))
        pending: collections.deque = collections.deque()  # _Sent, of each batch sent

        def text_batches():
            for piece in reader:
                for stretch in piece.unreadable:
                    stage = "validate" if stretch.reason == "bad_value" else "read"
                    state.dead.append(DeadLetter(f"{path}:{stretch.number}", stage, stretch.reason,
                                                 stretch.message))
                    state.rows_in += 1
                    state.lines_done += stretch.covers
                state.blank += piece.blank
                state.lines_done += piece.blank
                if piece.table.num_rows:
                    batch, problems = text_batch(piece.table, header, specs)
                    self._late_columns(state, piece, known, problems)
                    pending.append(_Sent(piece, problems))
                    yield batch

        try:
            for batch, _, encoded in self._spooler.encoded(text_batches(), state.task_bytes):
                piece, problems = pending.popleft()
                if problems:
                    encoded = drop_rows(encoded, problems)
                numbers = piece.numbers
                self._spooler.take_batch(state, batch, numbers, [],
                                         np.zeros(len(numbers), dtype=np.int64), encoded)
                state.lines_done += len(numbers)
                yield from self._spooler.sequence_rows(state, numbers, encoded)
        finally:
            for sink in state.sinks.values():
                sink.close()
            reader.close()
        pa.default_memory_pool().release_unused()  # A long line's memory, kept by Arrow's pool.
        lines_in = reader.rows if kind == "parquet" else reader.lines
        what = "rows in its metadata" if kind == "parquet" else "lines"
        _log.info("Encoded %s: %d rows (%d %s), %d dead-lettered, %d blank, in %.1f s", path,
                  state.rows_in, lines_in, what, len(state.dead), state.blank, time.monotonic() - start)
        if state.lines_done != lines_in:
            _log.error("%s: %d %s, but the rows read account for %d", path, lines_in, what,
                       state.lines_done)
        state.lines_in = lines_in
        return state

    def _late_columns(self, state: FileState, piece, known: set, problems: dict) -> None:
        """Notes the columns of a piece that the header did not have (JSON Lines keys
        first seen past its sample): they are not written, so the report names them;
        with ``--strict_schema`` the rows holding one are dead-lettered."""
        for name in piece.table.column_names:
            if name in known:
                continue
            present = np.nonzero(pc.is_valid(piece.table.column(name)).to_numpy(zero_copy_only=False))[0]
            if not present.size:
                continue
            state.late_columns.setdefault(name, f"{state.path}:{piece.numbers[present[0]]}")
            if self._layout.strict_columns:
                why = (f"key {name!r} is not in the schema (--strict_schema refuses columns it "
                       "does not name)")
                for row in present.tolist():
                    problems.setdefault(row, ("unknown_column", why))

