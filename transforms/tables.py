"""Tables: CSV files → spooled records → size-banded shards.

Row sizes are unknown until rows are encoded, so each CSV file is read once
(pyarrow's streaming reader, a block at a time), its rows encoded in batches,
and the framed records appended to spool files, one per (file, split), in row
order. Only small metadata leaves that step: each spool's record sizes. Shards
are planned from the sizes and built by copying byte ranges out of the spools (a
TFRecord file is a plain concatenation of framed records), in file and row
order, so a rerun gives the same bytes.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import io
import itertools
import json
import logging
import pickle
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from beam_tfrecords.schemas.config import CsvDialect, TableLayout
from beam_tfrecords.schemas.elements import DeadLetter, InputSummary, ShardSpec, SpoolSegments
from beam_tfrecords.schemas.shards import ShardBand, shard_name
from beam_tfrecords.schemas.table_schema import TableSchema, load_schema
from beam_tfrecords.transforms.codec.table_batches import (
    BAD,
    BLANK,
    EncodedBatch,
    TableTask,
    encode_table_batch,
    sequence_table_batch,
)
from beam_tfrecords.transforms.codec.table_rows import RowEncoder
from beam_tfrecords.transforms.codec.tfrecord import checkpoints
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.helpers import ordered_map, ready_helper_pool
from beam_tfrecords.transforms.plan.shards import cut_shards

__all__ = [
    "EncodeTables",
    "PlanTableShards",
    "RowsToExamples",
    "csv_header",
    "plan_table_shards",
    "table_files",
]

ROWS_TAG = "rows"
_BLOCK_BYTES = 4 << 20
_log = logging.getLogger(__name__)


def table_files(pattern: str) -> list[tuple[str, int]]:
    """The CSV files a path or glob names, sorted, with sizes."""
    return sorted(files.list_files(pattern))


def csv_header(dialect: CsvDialect, path: str) -> list[str]:
    """The column names of a CSV file: its first record, or the dialect's ``columns``.

    Raises:
      ValueError: if the file is empty or its first record cannot be parsed.
    """
    if dialect.no_header:
        return list(dialect.columns)
    with files.open_read(path) as stream:
        head = stream.read(1 << 20).decode(dialect.encoding, errors="replace").lstrip("\ufeff")
    reader = csv.reader(io.StringIO(head, newline=""), delimiter=dialect.delimiter,
                        quotechar=dialect.quote)
    try:
        return [name.strip() for name in next(reader)]
    except (StopIteration, csv.Error) as err:
        raise ValueError(f"{path}: cannot read a header row ({str(err) or 'the file is empty'})") from None


@dataclasses.dataclass(frozen=True)
class SpoolInfo:
    """What one CSV file gave one split: records spooled, in row order.

    Attributes:
      split: the split.
      file_index: the CSV's place in the sorted input list (orders spools).
      path: the spool file.
      sizes: framed size of each record, as little-endian int64 bytes.
      rows_in, dead, blank: rows read (all splits: set on the file's first
        spool only), rows dead-lettered, blank rows skipped.
      bad_counts, dead_letter_path: the file's dead letters.
      source_bytes: the CSV's size (on the first spool only).
    """

    split: str
    file_index: int
    path: str
    sizes: bytes
    rows_in: int = 0
    dead: int = 0
    blank: int = 0
    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    source_bytes: int = 0

    def record_sizes(self) -> np.ndarray:
        return np.frombuffer(self.sizes, dtype="<i8")


class _LineTracker:
    """Physical line numbers of rows, counting newlines inside quoted cells.

    pyarrow numbers rows (1 = the header when there is one), not lines; a row
    holding quoted newlines spans several lines. Rows that pyarrow refuses
    (wrong cell count) arrive out of band with their number and text.
    """

    def __init__(self, header_lines: int):
        self.next_row = 1 + header_lines
        self.next_line = 1 + header_lines
        self.invalid: list[tuple[int, str]] = []  # (row number, text), appended by pyarrow

    def _take_invalid(self, upto_row: int | None, out: list) -> None:
        while self.invalid and (upto_row is None or self.invalid[0][0] <= upto_row):
            number, text = self.invalid.pop(0)
            out.append((self.next_line, text))
            self.next_line += 1 + text.count("\n")
            self.next_row = number + 1

    def batch(self, embedded_newlines: np.ndarray) -> tuple[np.ndarray, list[tuple[int, str]]]:
        """Lines of a batch's valid rows, and (line, text) of invalid rows before them."""
        invalid_out: list[tuple[int, str]] = []
        lines = np.empty(len(embedded_newlines), dtype=np.int64)
        i = 0
        while i < len(lines):
            if self.invalid and self.invalid[0][0] == self.next_row:
                self._take_invalid(self.next_row, invalid_out)
                continue
            # Valid rows up to the next invalid one: vectorised.
            stop = len(lines)
            if self.invalid:
                stop = min(stop, i + (self.invalid[0][0] - self.next_row))
            span = embedded_newlines[i:stop]
            steps = 1 + span
            lines[i:stop] = self.next_line + np.concatenate(([0], np.cumsum(steps)[:-1]))
            self.next_line += int(steps.sum())
            self.next_row += stop - i
            i = stop
        return lines, invalid_out

    def rest(self) -> list[tuple[int, str]]:
        out: list[tuple[int, str]] = []
        self._take_invalid(None, out)
        return out


class _QuoteCounter(io.RawIOBase):
    """Passes a stream through, counting quote characters: an odd count at the end
    means a quote was never closed."""

    def __init__(self, source, quote: str):
        super().__init__()
        self._source = source
        self._quote = quote.encode("utf-8")
        self.quotes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._source.read(len(buffer))
        buffer[: len(data)] = data
        self.quotes += data.count(self._quote)
        return len(data)

    def close(self) -> None:
        self._source.close()
        super().close()


def _drop_last_row(encoded: EncodedBatch, reason: str, message: str) -> EncodedBatch:
    """The batch with its last row turned into an error (its record removed)."""
    row = len(encoded.status) - 1
    k = int(encoded.status[row])
    if k < 0:
        return encoded
    if encoded.groups:
        groups = {key: [r for r in rows if r[1] != row] for key, rows in encoded.groups.items()}
        status = encoded.status.copy()
        status[row] = BAD
        return dataclasses.replace(encoded, status=status, errors=[*encoded.errors, (row, reason, message)],
                                   groups={key: rows for key, rows in groups.items() if rows})
    size = int(encoded.sizes[k][-1])
    blobs, sizes = list(encoded.blobs), list(encoded.sizes)
    blobs[k], sizes[k] = blobs[k][:-size], sizes[k][:-1]
    status = encoded.status.copy()
    status[row] = BAD
    return dataclasses.replace(encoded, status=status, blobs=blobs, sizes=sizes,
                               errors=[*encoded.errors, (row, reason, message)])


def _raw_row(cells: Sequence[str], delimiter: str, quote: str) -> str:
    out = io.StringIO()
    csv.writer(out, delimiter=delimiter, quotechar=quote, lineterminator="").writerow(cells)
    return out.getvalue()


class _EncodeCsvFn(beam.DoFn):
    """``(file_index, path, size)`` → one ``SpoolInfo`` per split with rows."""

    def __init__(self, schema: TableSchema, dialect: CsvDialect, layout: TableLayout, output: str,
                 spool_dir: str, helper_processes: int):
        self._schema = schema
        self._dialect = dialect
        self._layout = layout
        self._output = output
        self._spool_dir = spool_dir
        self._processes = helper_processes

    def _batches(self, reader, task_bytes: bytes) -> Iterator[tuple[pa.RecordBatch, np.ndarray, EncodedBatch]]:
        """``(batch, embedded newlines per row, encoded)``, in order, encoded in helper
        processes when the config allows (the reader stays a batch or two ahead)."""

        encode = sequence_table_batch if self._layout.sequence_key else encode_table_batch
        processes = self._processes
        pool = ready_helper_pool(processes) if processes > 0 else None
        if pool is None:
            for batch in reader:
                encoded = encode(task_bytes, batch)
                yield batch, encoded.newlines, encoded
            return
        # The reader runs at most processes + 1 batches ahead; tee holds those few.
        batches, in_order = itertools.tee(reader)
        encoded_batches = ordered_map(pool, functools.partial(encode, task_bytes), batches, processes + 1)
        for batch, encoded in zip(in_order, encoded_batches):
            yield batch, encoded.newlines, encoded

    def process(self, element: tuple[int, str, int]) -> Iterator[SpoolInfo]:
        file_index, path, size = element
        dialect, layout = self._dialect, self._layout
        start = time.monotonic()
        hold_point("listing")
        header = csv_header(dialect, path)
        task = TableTask(self._schema, tuple(header), layout.split_column, layout.splits,
                         layout.key_column, dialect.delimiter, dialect.quote,
                         layout.sequence_key, layout.sequence_order)
        RowEncoder(self._schema, header)  # Fails here, with the columns named, on a wrong header.
        task_bytes = pickle.dumps(task)
        tracker = _LineTracker(0 if dialect.no_header else 1)

        def on_invalid(row) -> str:
            tracker.invalid.append((row.number, row.text or ""))
            return "skip"

        dead: list[DeadLetter] = []
        sinks: dict[str, tuple] = {}  # split → (stream, record sizes, spool path)
        rows_in = blank = 0
        try:
            counting = _QuoteCounter(files.open_read(path), dialect.quote)
            reader = pacsv.open_csv(
                counting,
                read_options=pacsv.ReadOptions(
                    use_threads=False, block_size=_BLOCK_BYTES, encoding=dialect.encoding,
                    column_names=list(dialect.columns) if dialect.no_header else None,
                ),
                parse_options=pacsv.ParseOptions(
                    delimiter=dialect.delimiter, quote_char=dialect.quote,
                    newlines_in_values=True, ignore_empty_lines=False,
                    invalid_row_handler=on_invalid,
                ),
                convert_options=pacsv.ConvertOptions(
                    column_types={name: pa.string() for name in header},
                    strings_can_be_null=False, quoted_strings_can_be_null=False,
                ),
            )
            # One batch is held back: at the end of the file, its last row may turn out
            # to be an unterminated quote that swallowed the rest of the file.
            held = None
            for item in itertools.chain(self._batches(reader, task_bytes), [None]):
                if held is None:
                    held = item
                    continue
                batch, newlines, encoded = held
                held = item
                if item is None and counting.quotes % 2 and newlines.size and newlines[-1]:
                    encoded = _drop_last_row(encoded, "bad_row", "unterminated quote: the last cell "
                                             "runs to the end of the file")
                lines, invalid = tracker.batch(newlines)
                dead.extend(self._invalid_rows(path, invalid, len(header)))
                rows_in += sum(1 for _, text in invalid if text.strip())
                blank += int((encoded.status == BLANK).sum())
                rows_in += int((encoded.status != BLANK).sum())
                for row, reason, message in encoded.errors:
                    dead.append(self._row_letter(path, int(lines[row]), batch, header, row,
                                                 reason, message))
                for key, group in encoded.groups.items():
                    # (key, [(order, file index, line, split, values), ...]) for GroupByKey.
                    yield beam.pvalue.TaggedOutput(ROWS_TAG, (key, [
                        (order, file_index, int(lines[row]), split, values)
                        for order, row, split, values in group
                    ]))
                for split, blob, sizes in zip(encoded.splits, encoded.blobs, encoded.sizes):
                    if split not in sinks:
                        spool = files.join(self._spool_dir, f"{file_index:05d}-{split}.spool")
                        stream = files.open_write(spool)
                        sinks[split] = (stream, [], spool)
                    stream, all_sizes, _ = sinks[split]
                    stream.write(blob)  # Already framed; the shard's copy is what gets digested.
                    all_sizes.append(sizes)
            for line, text in tracker.rest():
                dead.extend(self._invalid_rows(path, [(line, text)], len(header)))
                rows_in += 1 if text.strip() else 0
        except (pa.ArrowInvalid, UnicodeDecodeError) as err:
            dead.append(DeadLetter(f"{path}:{tracker.next_line}", "read", "unreadable",
                                   f"the CSV cannot be read from here on: {err}"))
        finally:
            for stream, _, _ in sinks.values():
                stream.close()
        stem = path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        dead_path = write_dead_letters(self._output, f"{stem}-{file_index:05d}", dead)
        bad = tuple(sorted(Counter(d.error for d in dead).items()))
        beam.metrics.Metrics.counter("table", "rows").inc(rows_in)
        beam.metrics.Metrics.counter("table", "dead_letter").inc(len(dead))
        _log.info("Encoded %s: %d rows, %d dead-lettered, %d blank, in %.1f s", path, rows_in,
                  len(dead), blank, time.monotonic() - start)
        infos = [
            SpoolInfo(split, file_index, spool, np.concatenate(sizes).astype("<i8").tobytes())
            for split, (_, sizes, spool) in sorted(sinks.items())
        ]
        totals = dict(rows_in=rows_in, dead=len(dead), blank=blank, bad_counts=bad,
                      dead_letter_path=dead_path, source_bytes=size)
        if infos:
            infos[0] = dataclasses.replace(infos[0], **totals)
        else:  # No good row: still report the file's counts.
            infos = [SpoolInfo("", file_index, "", b"", **totals)]
        yield from infos

    def _invalid_rows(self, path: str, invalid, expected: int) -> list[DeadLetter]:
        letters = []
        for line, text in invalid:
            if not text.strip():
                continue
            letters.append(DeadLetter(
                f"{path}:{line}", "read", "bad_row",
                f"the row does not split into {expected} cells (wrong cell count, or broken quoting)",
                row=text,
            ))
        return letters

    def _row_letter(self, path, line, batch, header, row, reason, message) -> DeadLetter:
        cells = [batch.column(name)[row].as_py() for name in header]
        return DeadLetter(f"{path}:{line}", "validate", reason, message,
                          row=_raw_row(cells, self._dialect.delimiter, self._dialect.quote))


class EncodeTables(beam.PTransform):
    """CSV files → ``SpoolInfo`` per (file, split): rows encoded into spool files.

    Args:
      inputs: the CSV files, ``(path, size)``, in order.
      schema: the table schema.
      dialect: how the files are written.
      layout: splits and sequences.
      output: the output folder (for dead letters).
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


def plan_table_shards(infos: Sequence[SpoolInfo], band: ShardBand, compression: str) -> list[ShardSpec]:
    """Cuts each split, in (file, row) order, into shards of nearly equal bytes,
    each a list of byte ranges of the spools."""
    specs = []
    by_split: dict[str, list[SpoolInfo]] = {}
    for info in infos:
        if info.path:
            by_split.setdefault(info.split, []).append(info)
    for split in sorted(by_split):
        spools = sorted(by_split[split], key=lambda i: i.file_index)
        sizes = np.concatenate([s.record_sizes() for s in spools])
        owner = np.concatenate([np.full(len(s.record_sizes()), k) for k, s in enumerate(spools)])
        num_shards, shard_of = cut_shards(sizes, band)
        offsets = np.concatenate([np.concatenate(([0], np.cumsum(s.record_sizes())[:-1]))
                                  for s in spools])
        for index in range(num_shards):
            members = np.nonzero(shard_of == index)[0]
            segments = []
            for k in np.unique(owner[members]):
                rows = members[owner[members] == k]
                first, last = int(rows[0]), int(rows[-1])
                segments.append((spools[k].path, int(offsets[first]),
                                 int(offsets[last] + sizes[last]), len(rows)))
            specs.append(ShardSpec(
                split, index, num_shards, shard_name(split, index, num_shards, compression),
                int(sizes[members].sum()), SpoolSegments(tuple(segments)),
                checkpoints(sizes[members]) if compression == "none" else (),
            ))
    return specs


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
        spools=tuple(sorted([*(i.path for i in infos if i.path), *grouped[1]])),
        schema=json.dumps(schema.to_dict()),
        sequence_features=tuple(sorted(sequence_features)),
        rows_grouped=grouped[0],
    )


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
            | "Cut" >> beam.FlatMap(plan_table_shards, self._band, self._compression)
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
        self._task = pickle.dumps(TableTask(schema, self._columns))
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
                    reason, message, row=_raw_row(rows[number], ",", '"')))
                continue
            size = int(encoded.sizes[status][counters[status]])
            start = offsets[status]
            record = encoded.blobs[status][start + 12:start + size - 4]  # Unframed.
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
