"""Every line of a CSV is accounted for: a bad line costs its own row, never the rows
after it, and a run whose lines do not close publishes nothing."""

import json
import os

import pytest

from beam_tfrecords.cli import main
from tests.conftest import load_manifest, read_dataset

pytestmark = pytest.mark.e2e

ROWS = 3000


def _table(path, replace: dict[int, bytes] | None = None, tail: bytes = b"") -> None:
    """``id,score,note`` and ROWS rows; ``replace`` swaps row i's line for other bytes."""
    lines = [b"id,score,note\n"] + [f"{i},{i * 0.5},note {i}\n".encode() for i in range(ROWS)]
    for row, data in (replace or {}).items():
        lines[row + 1] = data
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"".join(lines) + tail)


def _convert(src, out, *flags):
    return main(["convert", "--input", src, "--output", out, "--max_bad_fraction", "0.1", *flags])


def _report(out) -> dict:
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        return json.load(f)


def _ids(out) -> list[int]:
    return sorted(r["id"][0] for split in read_dataset(out).values() for r in split)


def _dead(out) -> list[dict]:
    letters = []
    for path in _report(out)["dead_letter_files"]:
        with open(os.path.join(out, path), encoding="utf-8") as f:
            letters += [json.loads(line) for line in f]
    return letters


@pytest.mark.parametrize("row", [5, ROWS - 40], ids=["early", "late"])
def test_an_unterminated_quote_costs_one_row(tmp_path, row):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    _table(src, {row: f'{row},1.0,"never closed\n'.encode()})
    assert _convert(src, out) == 0
    assert _ids(out) == [i for i in range(ROWS) if i != row]
    (letter,) = _dead(out)
    assert letter["error"] == "unterminated_quote"
    assert letter["source"] == f"{src}:{row + 2}" and "row" not in letter  # The line, not its text.
    rows = load_manifest(out)["input"]["rows"]
    assert (rows["in"], rows["written"], rows["dead_lettered"]) == (ROWS, ROWS - 1, 1)
    assert rows["lines"] == {"in": ROWS + 1, "accounted_for": ROWS + 1} and rows["accounted"]


@pytest.mark.parametrize("row", [0, ROWS - 3], ids=["early", "late"])
def test_invalid_utf8_costs_one_row(tmp_path, row):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    _table(src, {row: f"{row},1.0,caf".encode() + b"\xe9\xff\n"})
    assert _convert(src, out) == 0
    assert _ids(out) == [i for i in range(ROWS) if i != row]
    (letter,) = _dead(out)
    assert (letter["error"], letter["source"]) == ("invalid_utf8", f"{src}:{row + 2}")
    assert "'note' is not valid UTF-8" in letter["message"]


def test_a_field_larger_than_the_read_block_is_read(tmp_path):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    huge = b"x" * (9 << 20)  # Over two 4 MB read blocks.
    _table(src, {100: b'100,1.0,"' + huge + b'"\n'})
    assert _convert(src, out, "--shard_max_mb", "500") == 0
    records = {r["id"][0]: r for split in read_dataset(out).values() for r in split}
    assert sorted(records) == list(range(ROWS))
    assert records[100]["note"][0] == huge


def test_quoted_newlines_are_kept_and_reported_or_refused(tmp_path, capsys):
    src = str(tmp_path / "t.csv")
    _table(src, {7: b'7,1.0,"two\nlines"\n'})
    out = str(tmp_path / "out")
    assert _convert(src, out) == 0
    assert "1 rows hold quoted newlines (the longest spans 2 lines" in capsys.readouterr().out
    rows = load_manifest(out)["input"]["rows"]
    assert rows["multiline_rows"] == {"rows": 1, "largest_span": 2, "first": [f"{src}:9"]}
    strict = str(tmp_path / "strict")
    assert _convert(src, strict, "--no_quoted_newlines") == 0
    assert 7 not in _ids(strict) and len(_ids(strict)) == ROWS - 1
    assert [(d["source"], d["error"]) for d in _dead(strict)] == [(f"{src}:9", "quoted_newline")]


def test_lines_that_do_not_close_fail_the_run_and_publish_nothing(tmp_path, capsys):
    # Carriage returns alone end rows for the parser but are no newlines: the rows
    # read cover more lines than the file has, and the run must not publish.
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    with open(src, "wb") as f:
        f.write(b"id,score,note\r1,0.5,a\r2,1.5,b\r")
    assert _convert(src, out) == 1
    printed = capsys.readouterr().out
    assert "ACCOUNTING FAILED" in printed
    report = _report(out)
    assert report["status"] == "accounting_failed" and report["manifest"] is None
    assert report["rows"]["lines"] == {"in": 1, "accounted_for": 3}
    assert not [n for n in os.listdir(out) if ".tfrecord" in n]


def test_a_broken_quote_in_an_image_manifest_costs_one_image(tmp_path):
    from beam_tfrecords.samples import make_class_folder_sample  # pylint: disable=import-outside-toplevel

    root = tmp_path / "in"
    relative = make_class_folder_sample(str(root), per_class=50, splits=None, size_range=(16, 24))
    lines = ["image,label"] + [f"{rel},{rel.split('/')[0]}" for rel in relative]
    lines[12] = '"' + lines[12]  # A quote never closed, early in the file.
    lines.append("file://" + str(root / relative[0]) + "," + relative[0].split("/")[0])
    (root / "list.csv").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root / "list.csv"), "--output", out]) == 0
    records = sum(len(split) for split in read_dataset(out).values())
    assert records == len(relative)  # Every image but line 13's, plus the file:// row.
    (letter,) = _dead(out)
    assert (letter["source"], letter["error"]) == (f"{root}/list.csv:13", "bad_quoting")


def test_two_stray_quotes_cost_two_rows_not_the_lines_between(tmp_path):
    # Row 100 opens a quote, row 2,900 closes it with text after the quote: not CSV,
    # so the cell is not taken as one 2,800-line value (which a lenient parser does).
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    _table(src, {100: b'100,1.0,"never closed\n', 2900: b'2900,1.0,"never closed either\n'})
    assert _convert(src, out) == 0
    assert _ids(out) == [i for i in range(ROWS) if i not in (100, 2900)]
    stray, unterminated = sorted(_dead(out), key=lambda d: d["source"])
    assert stray["error"] == "bad_quoting" and stray["source"] == f"{src}:102"
    assert stray["message"].startswith(
        "a quoted cell opened here closes at line 2902 followed by text other than a delimiter, "
        "which is not CSV: a stray quote would merge lines 102-2902 into one cell")
    assert "either" not in json.dumps(_dead(out))  # Described, not quoted.
    assert unterminated["error"] == "unterminated_quote" and unterminated["source"] == f"{src}:2902"
    rows = load_manifest(out)["input"]["rows"]
    assert (rows["in"], rows["written"], rows["dead_lettered"]) == (ROWS, ROWS - 2, 2)
    assert rows["lines"] == {"in": ROWS + 1, "accounted_for": ROWS + 1} and rows["accounted"]


def test_a_legal_multiline_cell_is_kept_and_reported(tmp_path):
    src, out = str(tmp_path / "t.csv"), str(tmp_path / "out")
    _table(src, {7: b'7,1.0,"two\nlines, one cell"\n', 8: b'8,1.0,"quote "" inside\nand ""x"""\n'})
    assert _convert(src, out) == 0
    notes = {r["id"][0]: r["note"][0] for split in read_dataset(out).values() for r in split}
    assert notes[7] == b"two\nlines, one cell" and notes[8] == b'quote " inside\nand "x"'
    assert _dead(out) == []
    assert _report(out)["rows"]["multiline_rows"]["rows"] == 2


@pytest.mark.parametrize("text, after", [
    ('end of cell",2', None), ('end"', None), ('end"\r', None), ('a ""b"" c",x', None),
    ('no quote here', None), ('end" tail', " tail"), ('x"y,z', "y,z"),
])
def test_text_after_a_closing_quote(text, after):
    from beam_tfrecords.transforms.io.csv_stream import text_after_close

    assert text_after_close(text, ",", '"') == after


def _shards(out) -> dict[str, bytes]:
    return {name: open(os.path.join(out, name), "rb").read()
            for name in sorted(os.listdir(out)) if ".tfrecord" in name}


def test_the_csv_reader_reads_at_most_a_few_blocks_ahead(tmp_path, monkeypatch):
    """pyarrow's CSV reader would read up to 32 blocks ahead of the batches taken (128 MB
    at 4 MB blocks): the gate holds it to _READ_AHEAD_BLOCKS, with the same records, on
    a clean table and on one whose bad rows make the reader read some parts again."""
    from beam_tfrecords.transforms.io import csv_stream  # pylint: disable=import-outside-toplevel

    monkeypatch.setattr(csv_stream, "BLOCK_BYTES", 4096)  # ~20 blocks in this table
    clean, broken = str(tmp_path / "clean.csv"), str(tmp_path / "broken.csv")
    _table(clean)
    _table(broken, {7: b'7,"unclosed\n', 2000: b'2000,"two\nlines",x\n'})
    leads: list[int] = []
    real = csv_stream.ReadAhead.before_read

    def before_read(self):
        real(self)
        if not self._open:  # pylint: disable=protected-access  # (open: the segment is done)
            leads.append(self._read - self._taken * self._block)  # pylint: disable=protected-access

    monkeypatch.setattr(csv_stream.ReadAhead, "before_read", before_read)
    for name, src in (("clean", clean), ("broken", broken)):
        assert _convert(src, str(tmp_path / f"{name}-held")) == 0
        if name == "clean":
            assert len(leads) > 15
            assert max(leads) < (csv_stream.READ_AHEAD_BLOCKS + 1) * 4096, max(leads)
    monkeypatch.setattr(csv_stream, "READ_AHEAD_BLOCKS", 1000)  # The gate never holds it.
    for name, src in (("clean", clean), ("broken", broken)):
        assert _convert(src, str(tmp_path / f"{name}-free")) == 0
        held, free = str(tmp_path / f"{name}-held"), str(tmp_path / f"{name}-free")
        assert _shards(held) == _shards(free)
        assert _dead(held) == _dead(free)
        assert _ids(held) == _ids(free)


def test_a_shard_that_cannot_be_written_fails_the_run_as_such_not_as_lost_rows(tmp_path):
    # Two files whose spools fit under the process's file size limit and whose one shard
    # does not: its rows are in no count, and the run says the shard failed (it said
    # "accounting_failed" and "check the file's line endings and quoting").
    import resource  # pylint: disable=import-outside-toplevel
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    for name in ("a", "b"):
        with open(tmp_path / f"{name}.csv", "w", encoding="utf-8") as f:
            f.write("id,text\n" + "".join(f"{i},{name} {'x' * 60}\n" for i in range(30_000)))
    out = tmp_path / "out"
    limit = 5 << 20  # Each spool ~3.3 MB, the shard ~6.6 MB.

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    done = subprocess.run([sys.executable, "-m", "beam_tfrecords", "convert", "--input", str(tmp_path / "*.csv"),
                           "--output", str(out), "--progress", "off", "--encode_processes", "0"],
                          capture_output=True, text=True, timeout=300, check=False, preexec_fn=limited)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    report = _report(out)
    assert report["status"] == "verification_failed" and report["manifest"] is None
    assert report["rows"]["in"] == 60_000 and report["rows"]["written"] == 0
    assert "ACCOUNTING FAILED" not in done.stdout
    assert "VERIFICATION FAILED" in done.stdout and "File too large" in done.stdout
    assert not [n for n in os.listdir(out) if ".tfrecord" in n]
