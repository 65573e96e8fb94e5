"""Tables: CSV, Parquet and JSON Lines files → spooled records → size-banded shards.

Row sizes are unknown until rows are encoded, so each file is read once, its rows
encoded in batches and the framed records appended to spool files, one per
(file, split), in row order, each record's framed size to the spool's sidecar
(``<spool>.sizes``). The encode step (``EncodeTables``) reads a file with one of
two readers:

- ``csv_segments.CsvSegmentReader``: a CSV file, through pyarrow's streaming CSV
  reader a block at a time, in segments (a bad line never costs the rows after it;
  a row longer than a block is read alone, see ``io.csv_stream``);
- ``typed_tables.TypedTableReader``: a Parquet file a batch of a row group at a
  time, a JSON Lines file a block of lines at a time; their typed values are first
  written as the cell text a CSV of the same table holds (``codec.table_cells``), so
  every format gives the same records.

Both encode and spool through ``table_spooling.TableSpooler``. Only small metadata
leaves that step: each spool's record and byte totals (``SpoolInfo``). Shards are
planned by streaming the sidecars (``PlanTableShards``: the same cuts as one array
of all sizes would give, in bounded memory) and built by copying byte ranges out of
the spools (a TFRecord file is a plain concatenation of framed records), in file
and row order, so a rerun gives the same bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pickle
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam
import pyarrow as pa

from beam_tfrecords.schemas.config import CsvDialect, TableLayout
from beam_tfrecords.schemas.elements import DeadLetter, InputSummary
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.codec.table_batches import BAD, BLANK, TableTask, encode_table_batch
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.csv_segments import CsvSegmentReader
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.csv_stream import csv_header
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.table_readers import table_format
from beam_tfrecords.transforms.quality.statistics import merge_table_statistics
from beam_tfrecords.transforms.shard_engine import SpoolCopy
from beam_tfrecords.transforms.spools import SpoolInfo, plan_table_shards
from beam_tfrecords.transforms.table_spooling import (
    MULTILINE_SAMPLES,
    ROWS_TAG,
    FileState,
    TableSpooler,
    table_header,
)
from beam_tfrecords.transforms.typed_tables import TypedTableReader

__all__ = [
    "ROWS_TAG",
    "EncodeTables",
    "PlanTableShards",
    "RowsToExamples",
    "csv_header",
    "plan_table_shards",
    "table_files",
    "table_header",
]


def table_files(pattern: str) -> list[tuple[str, int]]:
    """The table files (CSV, Parquet, JSON Lines) a path or glob names, sorted, with sizes."""
    return sorted(files.list_files(pattern))


class _EncodeCsvFn(beam.DoFn):
    """``(file_index, path, size)`` → one ``SpoolInfo`` per split with rows; with a
    sequence key also the rows, grouped by key within a batch (tagged ``ROWS_TAG``).

    A CSV file is read by ``CsvSegmentReader``, a Parquet or JSON Lines file by
    ``TypedTableReader``; both encode and spool through one ``TableSpooler``. (Its
    name is in the step label a failed run's last line quotes: kept as it was.)
    """

    def __init__(self, schema: TableSchema, dialect: CsvDialect, layout: TableLayout, output: str,
                 spool_dir: str, helper_processes: int):
        self._output = output
        spooler = TableSpooler(schema, layout, spool_dir, helper_processes)
        self._csv = CsvSegmentReader(schema, dialect, layout, spooler)
        self._typed = TypedTableReader(schema, dialect, layout, spooler)

    def process(self, element: tuple[int, str, int]) -> Iterator[SpoolInfo]:
        file_index, path, size = element
        reader = self._csv if table_format(path) == "csv" else self._typed
        state = yield from reader.read(file_index, path)
        yield from self._infos(state, size, state.lines_in)

    def _infos(self, state: FileState, size: int, lines_in: int) -> list[SpoolInfo]:
        """The file's ``SpoolInfo``s (its totals on the first), its dead letters written."""
        path, file_index = state.path, state.file_index
        # In line order: letters are found as rows are read and as batches come back encoded.
        dead = sorted(state.dead, key=lambda d: int(d.source.rsplit(":", 1)[1]))
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        dead_path = write_dead_letters(self._output, f"{stem}-{file_index:05d}", dead)
        bad = tuple(sorted(Counter(d.error for d in dead).items()))
        beam.metrics.Metrics.counter("table", "rows").inc(state.rows_in)
        progress.inputs_at(id(state), state.rows_in, state.counts.counted_to, done=True)
        beam.metrics.Metrics.counter("table", "dead_letter").inc(len(dead))
        infos = [
            SpoolInfo(split, file_index, sink.path, sink.records, sink.bytes,
                      statistics=state.statistics.get(split))
            for split, sink in sorted(state.sinks.items())
        ]
        totals = dict(rows_in=state.rows_in, dead=len(dead), blank=state.blank, bad_counts=bad,
                      dead_letter_path=dead_path, source_bytes=size, lines_in=lines_in,
                      lines_accounted=state.lines_done, multiline_rows=state.multiline_rows,
                      largest_span=state.largest_span, multiline_first_lines=tuple(state.multiline_lines),
                      late_columns=tuple(state.late_columns.items()))
        if infos:
            infos[0] = dataclasses.replace(infos[0], **totals)
        else:  # No good row: still report the file's counts.
            infos = [SpoolInfo("", file_index, "", **totals)]
        return infos


class EncodeTables(beam.PTransform):
    """Table files (CSV, Parquet, JSON Lines) → ``SpoolInfo`` per (file, split): rows
    encoded into spool files.

    Args:
      inputs: the table files, ``(path, size)``, in order.
      schema: the table schema.
      dialect: how the files are written.
      layout: splits and sequences.
      output: where dead letters are written: the run's temporary folder
        (``ShardTarget.temp_dir``; the commit moves them to the output).
      spool_dir: where to spool the framed records.
      helper_processes: helper processes that encode batches (0: this process).
    """

    def __init__(self, inputs: Sequence[tuple[str, int]], schema: TableSchema, dialect: CsvDialect,
                 layout: TableLayout, output: str, spool_dir: str, helper_processes: int = 0):
        super().__init__()
        self._inputs = list(inputs)
        self._fn = _EncodeCsvFn(schema, dialect, layout, output, spool_dir, helper_processes)

    def expand(self, pbegin):
        """Returns a ``DoOutputsTuple``: ``.infos`` (``SpoolInfo``), and with a
        sequence key also ``.rows`` (rows grouped by key within a batch)."""
        inputs = [(i, path, size) for i, (path, size) in enumerate(self._inputs)]
        files_in = pbegin | "Files" >> beam.Create(inputs)
        if len(inputs) > 1:  # Spread the files over workers; one file needs no shuffle.
            files_in = files_in | "Spread" >> beam.Reshuffle()
        return (
            files_in
            | "EncodeRows" >> beam.ParDo(self._fn).with_outputs(ROWS_TAG, main="infos")
        )


def table_summary(
    infos: Sequence[SpoolInfo],
    root: str,
    schema: TableSchema,
    sequences: bool = False,
    grouped: tuple[int, tuple[str, ...]] = (0, ()),
) -> InputSummary:
    """The input summary of a table run.

    Args:
      infos: every file's ``SpoolInfo``.
      root: the input (path or glob), as the manifest records it.
      schema: the schema used.
      sequences: whether rows were grouped into sequences.
      grouped: with sequences: rows that went into them, and the sequence spools.
    """
    bad: Counter = Counter()
    for info in infos:
        bad.update(dict(info.bad_counts))
    features, sequence_features = [], []
    for column in schema.kept:
        entry = (column.feature_name, column.dtype, tuple(column.feature_shape()))
        (sequence_features if sequences and column.sequence else features).append(entry)
        if column.shape is not None and column.encoding == "flat":
            features.append((f"{column.feature_name}/shape", "int64", (len(column.shape),)))
    return InputSummary(
        root=root,
        layout="table",
        input_files=len({i.file_index for i in infos}),
        input_bytes=sum(i.source_bytes for i in infos),
        ignored_files=0,
        vocabulary=(),
        bad_counts=tuple(sorted(bad.items())),
        dead_letter_path="",
        rows_in=sum(i.rows_in for i in infos),
        blank_rows=sum(i.blank for i in infos),
        features=tuple(sorted(features)),
        dead_letter_paths=tuple(sorted(i.dead_letter_path for i in infos if i.dead_letter_path)),
        spools=tuple(sorted([*(p for i in infos if i.path for p in (i.path, i.sizes_path)),
                             *grouped[1]])),
        schema=json.dumps(schema.to_dict()),
        sequence_features=tuple(sorted(sequence_features)),
        rows_grouped=grouped[0],
        lines_in=sum(i.lines_in for i in infos),
        lines_accounted=sum(i.lines_accounted for i in infos),
        multiline=(sum(i.multiline_rows for i in infos),
                   max((i.largest_span for i in infos), default=0),
                   tuple(where for i in sorted(infos, key=lambda i: i.file_index)
                         for where in i.multiline_first_lines)[:MULTILINE_SAMPLES]),
        statistics=() if sequences else merge_table_statistics((i.split, i.statistics) for i in infos),
        late_columns=_first_seen(infos),
    )


def _first_seen(infos: Sequence[SpoolInfo]) -> tuple[tuple[str, str], ...]:
    """Each late column once, where the first file in input order has it."""
    seen: dict[str, str] = {}
    for info in sorted(infos, key=lambda i: i.file_index):
        for name, where in info.late_columns:
            seen.setdefault(name, where)
    return tuple(seen.items())


def _cut(infos: Sequence[SpoolInfo], band: ShardBand, compression: str) -> list:
    """``plan_table_shards``; an uncompressed table's first shards have their index made on
    the live helpers at once (``SpoolCopy.index_early``)."""
    specs = plan_table_shards(infos, band, compression)
    if compression == "none":
        SpoolCopy.index_early(specs)
    return specs


class PlanTableShards(beam.PTransform):
    """``SpoolInfo``s → ``ShardSpec`` per shard (main) and one ``InputSummary``.

    Args:
      band: the shard size band.
      compression: ``none`` or ``gzip``.
      root: the input, as the manifest records it.
      schema: the schema used.
    """

    def __init__(self, band: ShardBand, compression: str, root: str, schema: TableSchema):
        super().__init__()
        self._band = band
        self._compression = compression
        self._root = root
        self._schema = schema

    def expand(self, infos):
        collected = infos | "Collect" >> beam.combiners.ToList()
        specs = (
            collected
            | "Cut" >> beam.FlatMap(_cut, self._band, self._compression)
            | "Spread" >> beam.Reshuffle()
        )
        summary = collected | "Summarize" >> beam.Map(table_summary, self._root, self._schema)
        return specs, summary


class _RowsToExamplesFn(beam.DoFn):
    """Rows (dicts, or cell sequences in ``columns`` order) → ``(key, Example bytes)``,
    encoded a batch at a time by the CLI's own table codec."""

    _BATCH = 4096

    def __init__(self, schema: TableSchema, columns: Sequence[str], key_column: str | None):
        self._columns = tuple(columns)
        self._key_column = key_column
        self._task = pickle.dumps(TableTask(schema, self._columns, statistics=False))
        self._rows: list[list[str]] = []

    def start_bundle(self):
        self._rows = []

    def _cells(self, row) -> list[str]:
        if isinstance(row, dict):
            values = [row.get(name) for name in self._columns]
        else:
            values = list(row)
            if len(values) != len(self._columns):
                raise ValueError(f"a row has {len(values)} cells; columns are {list(self._columns)}")
        return ["" if v is None else v if isinstance(v, str) else str(v) for v in values]

    def process(self, row) -> Iterator:
        self._rows.append(self._cells(row))
        if len(self._rows) >= self._BATCH:
            yield from self._flush()

    def finish_bundle(self):
        for output in self._flush():
            value = output.value if isinstance(output, beam.pvalue.TaggedOutput) else output
            window = beam.transforms.window.GlobalWindow()
            timestamp = beam.utils.timestamp.MIN_TIMESTAMP
            windowed = beam.utils.windowed_value.WindowedValue(value, timestamp, [window])
            if isinstance(output, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(output.tag, windowed)
            else:
                yield windowed

    def _flush(self) -> Iterator:
        rows, self._rows = self._rows, []
        if not rows:
            return
        batch = pa.RecordBatch.from_arrays(
            [pa.array([r[i] for r in rows], type=pa.string()) for i in range(len(self._columns))],
            names=list(self._columns))
        encoded = encode_table_batch(self._task, batch)
        errors = {row: (reason, message) for row, reason, message in encoded.errors}
        offsets = [0] * len(encoded.splits)
        counters = [0] * len(encoded.splits)
        key_at = self._columns.index(self._key_column) if self._key_column else None
        for number, status in enumerate(encoded.status.tolist()):
            if status == BLANK:
                continue
            if status == BAD:
                reason, message = errors.get(number, ("bad_row", "the row cannot be encoded"))
                beam.metrics.Metrics.counter("rows", "dead_letter").inc()
                yield beam.pvalue.TaggedOutput(ROWS_DEAD_LETTER_TAG, DeadLetter(
                    f"row:{rows[number][key_at] if key_at is not None else number}", "validate",
                    reason, message))
                continue
            size = int(encoded.sizes[status][counters[status]])
            start = offsets[status]
            record = bytes(encoded.blobs[status][start + 12:start + size - 4])  # Unframed.
            offsets[status] += size
            counters[status] += 1
            key = rows[number][key_at] if key_at is not None else hashlib.sha256(record).hexdigest()
            yield key, record


ROWS_DEAD_LETTER_TAG = "dead_letter"


class RowsToExamples(beam.PTransform):
    """Table rows → ``(key, serialized tf.train.Example)``, typed by a table schema.

    The same codec as ``convert`` on a CSV: every schema type, lists, shapes,
    defaults and required cells; a row whose cells do not fit the schema is
    counted (metric ``rows/dead_letter``) and goes to ``.dead_letter`` (a
    PCollection of ``DeadLetter``, set when the transform is applied).

    Args:
      schema: a ``TableSchema``, or the text of a YAML/JSON schema.
      columns: the column names, in cell order (for rows given as sequences);
        default: the schema's column names.
      key_column: the column whose cell is the record's key (orders records in
        ``WriteVerifiedShards``); default: the SHA-256 of the record.
    """

    def __init__(self, schema, columns: Sequence[str] | None = None, key_column: str | None = None):
        super().__init__()
        if isinstance(schema, str):
            schema = load_schema(schema)
        names = tuple(columns) if columns else tuple(c.name for c in schema.columns)
        if key_column is not None and key_column not in names:
            raise ValueError(f"key_column {key_column!r} is not one of the columns {list(names)}")
        RowEncoder(schema, names)  # Fails here, naming the columns, when they do not fit.
        self._fn = _RowsToExamplesFn(schema, names, key_column)
        self.dead_letter = None

    def expand(self, rows):
        outputs = rows | "Encode" >> beam.ParDo(self._fn).with_outputs(ROWS_DEAD_LETTER_TAG, main="examples")
        self.dead_letter = outputs[ROWS_DEAD_LETTER_TAG]
        return outputs.examples
