"""Table reading split into its parts (issue 20): the CSV segment reader's line
tracking (``io.csv_stream``) and the rows the encode step drops after encoding
(``table_spooling.drop_rows``), through their named types."""

import pickle

import numpy as np
import pyarrow as pa
import pytest

from beam_tfrecords.schemas.table_schema import load_schema
from beam_tfrecords.transforms.codec.table_batches import BAD, TableTask, encode_table_batch
from beam_tfrecords.transforms.io.csv_stream import LineTracker, RefusedRow, RowText
from beam_tfrecords.transforms.table_spooling import drop_rows

pytestmark = pytest.mark.unit


def test_refused_rows_take_their_physical_lines_among_rows_that_span_lines():
    """Header on line 1; row 2 one line; row 3 refused, two lines (3-4); row 4 holds a
    quoted newline (5-6); row 5 on line 7; row 6 refused after the batch, line 8."""
    tracker = LineTracker(header_lines=1)
    tracker.invalid += [RefusedRow(3, "x,y\nz"), RefusedRow(6, "tail")]
    lines, refused = tracker.batch(np.array([0, 1, 0]))
    assert lines.tolist() == [2, 5, 7]
    assert refused == [RowText(3, "x,y\nz")] and refused[0].line == 3
    assert tracker.rest() == [RowText(8, "tail")]
    later = LineTracker(header_lines=0, first_line=40)  # A segment that starts at line 40.
    assert later.batch(np.array([2, 0]))[0].tolist() == [40, 43]


def test_dropped_rows_leave_the_other_records_byte_identical():
    schema = load_schema("columns:\n  - {name: n, type: int64}\n  - {name: s, type: string}\n")
    task = pickle.dumps(TableTask(schema, ("n", "s")))
    batch = pa.RecordBatch.from_arrays([pa.array(["1", "2", "3", "4"]), pa.array(["a", "bb", "c", "dd"])],
                                       names=["n", "s"])
    whole = encode_table_batch(task, batch)
    kept = encode_table_batch(task, batch.take(pa.array([0, 2])))
    dropped = drop_rows(whole, {1: ("invalid_utf8", "column 's' is not valid UTF-8 text"), 3: None})
    assert dropped.blobs == kept.blobs and whole.blobs != kept.blobs
    assert [s.tolist() for s in dropped.sizes] == [s.tolist() for s in kept.sizes]
    assert dropped.status.tolist() == [whole.status[0], BAD, whole.status[2], BAD]
    assert dropped.errors == [(1, "invalid_utf8", "column 's' is not valid UTF-8 text")]
    assert dropped.statistics is None  # No longer true of the rows written: summarised again.
