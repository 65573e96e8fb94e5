"""A row's memory is bounded (issue 18, Memory), through the real CLI.

A CSV row or JSON line longer than the reader's 4 MB block is read alone; one longer
than the row limit (256,000,000 bytes) is dead-lettered as ``unreadable`` without
being held: reading goes on at the next row and every line is accounted for. The runs
here lower the limit to ``LIMIT`` with the test hook ``BEAM_TFRECORDS_TEST_MAX_ROW_BYTES``,
honoured only under the test switch ``BEAM_TFRECORDS_TEST_HOOKS=1`` (never below two
blocks, never above the real limit). The peak memory at real sizes (100, 250 and 300 MB
rows) is measured by ``benchmarks/bench_row_memory.py``, not here.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from beam_tfrecords.transforms.io import table_readers
from beam_tfrecords.transforms.quality.statistics import StringSummary, string_hashes
from tests.harness.attack_table import cli, cli_env, tally

LIMIT = 9_000_000  # Bytes: over two 4 MB blocks, so rows near it are read alone.
SWITCH = {"BEAM_TFRECORDS_TEST_HOOKS": "1"}
LOWER = {"BEAM_TFRECORDS_TEST_MAX_ROW_BYTES": str(LIMIT)}
ROWS = 200
UNDER, OVER, SPAN, OPEN = 40, 90, 130, 170  # Rows made long (see _csv_table).
_WORDS = [b"alpha", b"beta,", b"gamma", b'say ""hi""', b"delta", b"epsilon,", b"zeta"]


def _text(size: int, seed: int, newlines: int = 0) -> bytes:
    """``size`` bytes of words (commas and doubled quotes among them) for a quoted CSV
    cell, ``newlines`` of them spread through it."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < size:
        out += rng.choice(_WORDS) + b" "
    del out[size:]
    if out.endswith(b'"'):  # Not half of a doubled quote at the end.
        out[-1:] = b"x"
    for k in range(newlines):
        at = (k + 1) * size // (newlines + 1)
        out[at:at + 1] = b"\n"
    return bytes(out)


def _csv_row(i: int, total: int, newlines: int = 0) -> tuple[bytes, bytes]:
    """Row ``i`` with a quoted cell making it ``total`` bytes long (its newline
    included), and that cell's value."""
    head, tail = f'{i},"'.encode(), b'",0.5\n'
    cell = _text(total - len(head) - len(tail), i, newlines)
    return head + cell + tail, cell.replace(b'""', b'"')


def _csv_table(path) -> tuple[bytes, dict[int, int]]:
    """The table: ``id,text,score``, ROWS rows; UNDER just under LIMIT bytes, OVER just
    over it, SPAN over it across four lines, OPEN a 5 MB cell whose quote never closes
    (no quote follows it in the file). Returns UNDER's cell and each row's line."""
    lines, line_of, line = [b"id,text,score\n"], {}, 2
    under = b""
    for i in range(ROWS):
        if i == UNDER:
            row, under = _csv_row(i, LIMIT - 1000)
        elif i == OVER:
            row, _ = _csv_row(i, LIMIT + 1000)
        elif i == SPAN:
            row, _ = _csv_row(i, LIMIT + 50_000, newlines=3)
        elif i == OPEN:
            row = f'{i},"'.encode() + b"x" * 5_000_000 + b",0.5\n"
        else:
            row = f"{i},row {i},{i / 4}\n".encode()
        lines.append(row)
        line_of[i] = line
        line += row.count(b"\n")
    path.write_bytes(b"".join(lines))
    return under, line_of


def _convert(tmp_path, src, name: str, env: dict[str, str]):
    out = str(tmp_path / name)
    run = cli(tmp_path, "convert", "--input", str(src), "--output", out, "--max_bad_fraction", "0.1",
              env=cli_env(**env))
    return run, tally(out)


def _closed(found, rows_in: int, lines_in: int) -> None:
    rows = found.manifest["input"]["rows"]
    assert rows["accounted"] and rows["in"] == rows_in == rows["written"] + rows["dead_lettered"]
    assert rows["written"] == len(found.records) and rows["dead_lettered"] == len(found.dead)
    assert rows["lines"] == {"in": lines_in, "accounted_for": lines_in}


@pytest.mark.e2e
def test_a_csv_row_past_the_limit_is_dead_lettered_and_one_under_it_converted(tmp_path):
    src = tmp_path / "t.csv"
    under, line_of = _csv_table(src)
    lines_in = 1 + ROWS + 3
    run, found = _convert(tmp_path, src, "out", {**SWITCH, **LOWER})
    assert run.exit == 0, run.stderr[-2000:]
    assert "Test hook: rows longer than 9000000 bytes are dead-lettered" in run.stderr
    assert f"the row from line {line_of[UNDER]} is 9.0 MB long: read alone" in run.stderr
    records = {r["id"][0]: r for r in found.records}
    assert sorted(records) == [i for i in range(ROWS) if i not in (OVER, SPAN, OPEN)]
    assert records[UNDER]["text"] == [under]  # Byte for byte, doubled quotes undone.
    assert records[UNDER + 1]["text"] == [f"row {UNDER + 1}".encode()]
    letters = {d["source"]: d for d in found.dead}
    assert sorted(letters) == sorted(f"{src}:{line_of[i]}" for i in (OVER, SPAN, OPEN))
    over, span, never = (letters[f"{src}:{line_of[i]}"] for i in (OVER, SPAN, OPEN))
    assert (over["error"], span["error"], never["error"]) == ("unreadable", "unreadable",
                                                              "unterminated_quote")
    assert f"is {LIMIT + 1000:,} bytes long, more than the {LIMIT:,}" in over["message"]
    assert f"(lines {line_of[SPAN]}-{line_of[SPAN] + 3}) is {LIMIT + 50_000:,} bytes" in span["message"]
    assert all(len(json.dumps(d)) < 10_000 for d in found.dead)  # No letter holds the row.
    _closed(found, ROWS, lines_in)
    assert f"rows: {ROWS} in = {ROWS - 3} written + 3 dead-lettered" in run.stdout

    # The lower limit is a test hook: without the test switch it is not honoured.
    run, found = _convert(tmp_path, src, "unswitched", LOWER)
    assert run.exit == 0, run.stderr[-2000:]
    assert "Test hook" not in run.stderr
    assert sorted(r["id"][0] for r in found.records) == [i for i in range(ROWS) if i != OPEN]
    assert [d["error"] for d in found.dead] == ["unterminated_quote"]
    _closed(found, ROWS, lines_in)


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_a_json_line_past_the_limit_is_dead_lettered_and_one_under_it_converted(tmp_path, name):
    """A plain file's long line is found, then read in one piece; a gzip file's is
    gathered as it is read (it cannot go back cheaply), and dropped past the limit."""
    src = tmp_path / name
    lines, under = [], ""
    for i in range(ROWS):
        row = {"id": i, "text": f"row {i}", "score": i / 4}
        if i in (UNDER, OVER):
            size = LIMIT - 1000 if i == UNDER else LIMIT + 1000
            row["text"] = ""
            pad = size - len(json.dumps(row)) - 1
            row["text"] = _text(pad, i).decode().replace('"', "'")
            under = row["text"] if i == UNDER else under
        lines.append(json.dumps(row) + "\n")
    data = "".join(lines).encode()
    src.write_bytes(gzip.compress(data, 1) if name.endswith(".gz") else data)
    assert [len(lines[i]) for i in (UNDER, OVER)] == [LIMIT - 1000, LIMIT + 1000]
    run, found = _convert(tmp_path, src, "out", {**SWITCH, **LOWER})
    assert run.exit == 0, run.stderr[-2000:]
    records = {r["id"][0]: r for r in found.records}
    assert sorted(records) == [i for i in range(ROWS) if i != OVER]
    assert records[UNDER]["text"] == [under.encode()]
    (letter,) = found.dead
    assert (letter["source"], letter["error"]) == (f"{src}:{OVER + 1}", "unreadable")
    assert f"the line is {LIMIT + 1000:,} bytes long, more than the {LIMIT:,}" in letter["message"]
    _closed(found, ROWS, ROWS)


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(40))
def test_a_long_rows_end_is_found_where_pyarrow_ends_it(seed, monkeypatch):
    """The scan that finds where a long row ends (a few bytes at a time here, so quotes,
    doubled quotes and delimiters fall on its chunks' edges) cuts a CSV into the rows
    pyarrow's reader reads, with their quoted newlines."""
    from beam_tfrecords.transforms.io import csv_stream  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(csv_stream, "_SCAN_BYTES", 1 + seed % 5)
    rng = random.Random(seed)
    cells = [b"plain", b"", b'"quoted, with a comma"', b'"two\nlines"', b'"say ""hi"""',
             b'stray"quote', b'"closed"then', b'"a\n""b""\nc"', b'""']
    text = b"".join(b",".join(rng.choice(cells) for _ in range(3)) + b"\n" for _ in range(30))
    stream, rows, newlines = io.BytesIO(text), [], 0
    while stream.tell() < len(text):
        start = stream.tell()
        extent = csv_stream.row_extent(stream.read, b'"', b",")
        assert extent.closed
        rows.append(text[start:start + extent.size])
        newlines += extent.newlines
        stream.seek(start + extent.size)
        assert extent.more == (stream.tell() < len(text))
    options = dict(read_options=pacsv.ReadOptions(column_names=["a", "b", "c"]),
                   parse_options=pacsv.ParseOptions(newlines_in_values=True),
                   convert_options=pacsv.ConvertOptions(column_types={n: pa.binary() for n in "abc"}))
    whole = pacsv.read_csv(io.BytesIO(text), **options).to_pylist()
    assert [pacsv.read_csv(io.BytesIO(row), **options).to_pylist() for row in rows] == [[r] for r in whole]
    assert newlines == sum(sum(v.count(b"\n") for v in r.values()) for r in whole)


@pytest.mark.unit
def test_a_quote_never_closed_is_found_at_the_end():
    from beam_tfrecords.transforms.io import csv_stream  # pylint: disable=import-outside-toplevel

    extent = csv_stream.row_extent(io.BytesIO(b'1,"open\n2,x\n3,y').read, b'"', b",")
    assert (extent.closed, extent.more, extent.size, extent.newlines) == (False, False, 15, 2)


@pytest.mark.unit
def test_the_inference_sample_leaves_long_rows_out_and_keeps_the_rest(monkeypatch):
    monkeypatch.setattr(table_readers, "SAMPLE_ROW_BYTES", 60)
    text = ('a,b,c\n1,2,3\n4,"' + "x" * 100 + '",6\n7,"multi\nline' + "y" * 70 + '\nend",9\n'
            '10,ab"c,12\n13,"q""uote",15\n16,' + "z" * 80 + ",18\n19,20,21\n")
    lines = list(table_readers.csv_sample_lines(io.StringIO(text, newline=""), '"', ",", 3))
    assert len(lines) == text.count("\n")  # One line out per line in.
    assert max(map(len, lines)) < 60
    rows = [row for row in csv.reader(lines) if len(row) == 3]
    assert rows == [["a", "b", "c"], ["1", "2", "3"], ["10", 'ab"c', "12"], ["13", 'q"uote', "15"],
                    ["19", "20", "21"]]


@pytest.mark.unit
@pytest.mark.parametrize("seed", range(20))
def test_the_sample_follows_quotes_as_pythons_csv_does(seed):
    """Where the sample's reader sees a row end (outside a quoted cell) is where
    Python's csv ends one (text after a closing quote, stray and doubled quotes)."""
    rng = random.Random(seed)
    cells = ['"a"', '"b""c"', '"x\ny"', '"p,q"', '""', '"a\n\nb"', '"c"tail"', 'ab"c', 'a""',
             'x"\n"y', "1", "", "foo"]
    text = "".join(",".join(rng.choice(cells) for _ in range(3)) + "\n" for _ in range(40))
    quotes = table_readers._Quotes('"', ",")  # pylint: disable=protected-access
    ends = []
    for number, line in enumerate(io.StringIO(text, newline=""), start=1):
        quotes.feed(line)
        if not quotes.inside:
            ends.append(number)
    reader = csv.reader(io.StringIO(text, newline=""))
    expected = [reader.line_num for _ in reader]
    assert ends == (expected if not quotes.inside else expected[:-1])


@pytest.mark.unit
def test_a_long_string_is_hashed_and_counted_without_a_copy_of_it(monkeypatch):
    from beam_tfrecords.transforms.quality import statistics  # pylint: disable=import-outside-toplevel

    rng = np.random.default_rng(3)
    long = rng.integers(0, 256, 3 * (1 << 20) + 5, dtype=np.uint8).tobytes()
    values = pa.array([b"x", long, b"", long[:-1]], type=pa.binary())
    pieces = string_hashes(values)  # Values over a megabyte: a megabyte at a time.
    monkeypatch.setattr(statistics, "_HASH_BYTES", 1 << 30)  # All in one slice, as before.
    assert pieces.tolist() == string_hashes(values).tolist()
    monkeypatch.undo()
    assert len(set(pieces.tolist())) == 4
    # A top-value counter holds a long value by its first 120 characters and its hash.
    summary = StringSummary.of(pa.array(["a" * 5000, "b", "a" * 5000, "a" * 4999 + "c"]), 0)
    assert [(e["value"], e["count"]) for e in summary.to_json()["top_values"]] == [
        ("a" * 120 + "...", 2), ("a" * 120 + "...", 1), ("b", 1)]
    assert max(len(v) for v in summary.top_values.to_pylist()) < 200
    assert summary.distinct == (3, True)


@pytest.mark.unit
@pytest.mark.parametrize("delimiter,quote", [(",", '"'), ("\t", '"'), (" ", "'"), (";", '"')])
def test_a_long_rows_split_is_the_one_its_text_gives(delimiter, quote, monkeypatch):
    """``--splits`` without a key hashes a row's CSV text; a long row's hash is taken a
    piece at a time from its cells, to the fraction of the text ``csv`` writes."""
    from beam_tfrecords.schemas.table_schema import TableSchema  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms.codec import table_batches  # pylint: disable=import-outside-toplevel
    from beam_tfrecords.transforms.quality.splits import split_fraction  # pylint: disable=import-outside-toplevel

    rng = random.Random(7)
    alphabet = ["a", "b", ",", '"', "'", "\n", "\r", " ", "\t", "é", ";"]
    for columns in (1, 3):
        header = tuple(f"c{i}" for i in range(columns))
        rows = [["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6))) for _ in header]
                for _ in range(200)]
        batch = pa.RecordBatch.from_arrays([pa.array([r[i] for r in rows]) for i in range(columns)],
                                           names=list(header))
        schema = TableSchema.from_dict({"columns": [{"name": name, "type": "string"} for name in header]})
        task = table_batches.TableTask(schema, header, delimiter=delimiter, quote=quote)
        texts = []
        for cells in rows:
            out = io.StringIO()
            csv.writer(out, delimiter=delimiter, quotechar=quote, lineterminator="\n").writerow(cells)
            texts.append(out.getvalue()[:-1])
        monkeypatch.setattr(table_batches, "_LONG_ROW_CHARS", 3)  # About half the rows are "long".
        keys = table_batches._raw_rows(task, batch)  # pylint: disable=protected-access
        assert any(isinstance(k, float) for k in keys) and any(isinstance(k, str) for k in keys)
        assert [k if isinstance(k, float) else split_fraction(k) for k in keys] == [
            split_fraction(text) for text in texts]
