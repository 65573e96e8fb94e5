"""The CSV reader's serial path, made shorter in issue 23: batches parsed on a thread of
their own (``csv_segments._prefetched``) give the same records, dead letters and counts as
parsing in line; the stray-quote check's line reads (``LineIndex.text_of`` with
``readline``, ``text_after_close`` jumping from quote to quote) give the same text."""

import json
import os

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.transforms.io.csv_stream import LineIndex, text_after_close
from tests.conftest import read_dataset


@pytest.mark.unit
def test_text_of_reads_each_line_cut_to_the_limit(tmp_path):
    lines = [b"a,b", b"", b"x" * 5000, b'tail"",q', b"\xff bad utf-8\r", b"last, no newline"]
    path = tmp_path / "t.csv"
    path.write_bytes(b"\n".join(lines))
    index = LineIndex(str(path))
    try:
        got = [index.text_of(n, limit=4096) for n in range(1, len(lines) + 1)]
    finally:
        index.close()
    assert got == [line[:4096].decode("utf-8", errors="replace") for line in lines]
    # A line exactly as long as the limit and one a byte shorter (its newline read too).
    path.write_bytes(b"y" * 16 + b"\n" + b"z" * 15 + b"\nend")
    index = LineIndex(str(path))
    try:
        assert [index.text_of(n, limit=16) for n in (1, 2, 3)] == ["y" * 16, "z" * 15, "end"]
    finally:
        index.close()


@pytest.mark.unit
@pytest.mark.parametrize("text, expected", [
    ('end of cell",next', None),            # Closed, then a delimiter.
    ('end of cell"', None),                 # Closed at the line's end.
    ('end of cell"\r', None),               # ... before a carriage return.
    ('say ""hi"" then"x,y', "x,y"),         # Doubled quotes inside, then text: stray.
    ('""""', None),                         # Only doubled quotes: the cell never closes here.
    ('a"' + "b" * 60, "b" * 40),            # Text after the close, cut to 40 characters.
    ("no quote at all", None),
])
def test_text_after_close(text, expected):
    assert text_after_close(text, ",", '"') == expected


def _outputs(out) -> tuple:
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        report = json.load(f)
    letters = []
    for path in report["dead_letter_files"]:
        with open(os.path.join(out, path), encoding="utf-8") as f:
            letters += [json.loads(line) for line in f]
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        rows = json.load(f)["input"]["rows"]
    shards = {name: open(os.path.join(out, name), "rb").read()
              for name in sorted(os.listdir(out)) if ".tfrecord" in name}
    return shards, letters, rows, report["records"]


@pytest.mark.e2e
def test_batches_parsed_ahead_on_a_thread_give_what_parsing_in_line_gives(tmp_path, monkeypatch):
    """~25 blocks, with bad lines spread over them: a refused row, a cell that is not
    UTF-8, a stray quote (a new segment), a quoted newline."""
    from beam_tfrecords.transforms.io import csv_stream  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(csv_stream, "BLOCK_BYTES", 4096)
    lines = [b"id,score,note\n"] + [f"{i},{i * 0.5},note {i}\n".encode() for i in range(3000)]
    lines[300] = b"299,1.0,too,many,cells\n"
    lines[900] = b'899,2.0,"bad \xff utf-8"\n'
    lines[1500] = b'1499,3.0,"a stray\nquote"here\n'
    lines[2100] = b'2099,4.0,"two\nlines"\n'
    src = tmp_path / "t.csv"
    src.write_bytes(b"".join(lines))
    ahead, inline = str(tmp_path / "ahead"), str(tmp_path / "inline")
    flags = ["--max_bad_fraction", "0.1"]
    assert main(["convert", "--input", str(src), "--output", ahead, *flags]) == 0
    monkeypatch.setattr("beam_tfrecords.transforms.csv_segments._prefetched",
                        lambda items, depth=1: items)
    assert main(["convert", "--input", str(src), "--output", inline, *flags]) == 0
    got, expected = _outputs(ahead), _outputs(inline)
    assert got == expected
    shards, letters, rows, records = got
    assert {letter["error"] for letter in letters} == {"bad_row", "invalid_utf8", "bad_quoting"}
    assert rows["accounted"] and records == sum(
        len(split) for split in read_dataset(ahead).values()) > 2900
