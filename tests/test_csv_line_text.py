"""The CSV reader's stray-quote check, made cheaper in issue 23 (``LineIndex.text_of``
reads a line with ``readline``, ``text_after_close`` jumps from quote to quote): the
same text and the same verdicts as before."""

import pytest

from beam_tfrecords.transforms.io.csv_stream import LineIndex, text_after_close


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

