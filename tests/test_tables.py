"""CSV tables end to end: types, lists, defaults, quoting, dialects, bad rows,
splits, shapes, reruns and the size band. Every test reads the shards back."""

import base64
import csv
import json
import os

import numpy as np
import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.transforms.codec.tensors import decode_tensor
from tests.conftest import dead_letters, load_manifest, read_dataset, sha256_file

pytestmark = pytest.mark.e2e


def _write_csv(path, header, rows, delimiter=",", **kwargs):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter, **kwargs)
        if header:
            writer.writerow(header)
        writer.writerows(rows)


def _schema(tmp_path, columns):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"columns": columns}))
    return str(path)


def _records(out):
    return [r for shard in sorted(read_dataset(out)) for r in read_dataset(out)[shard]]


_dead = dead_letters


def test_every_type_list_and_default(tmp_path):
    src, out = str(tmp_path / "in" / "t.csv"), str(tmp_path / "out")
    blob = bytes(range(256))
    _write_csv(src, ["i", "f", "b", "s", "raw", "ints", "words", "opt", "dflt"], [
        ["7", "2.5", "true", "héllo", base64.b64encode(blob).decode(), "1;-2;300", "a|b", "", ""],
        ["-9223372036854775808", "-0.125", "No", "", base64.b64encode(b"x").decode(), "", "c", "4", "1.5"],
    ])
    schema = _schema(tmp_path, [
        {"name": "i", "type": "int64", "required": True},
        {"name": "f", "type": "float", "required": True},
        {"name": "b", "type": "bool"}, {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"}, {"name": "ints", "type": "int64", "delimiter": ";"},
        {"name": "words", "type": "string", "delimiter": "|", "feature": "tokens"},
        {"name": "opt", "type": "int64"}, {"name": "dflt", "type": "float", "default": 9.0},
    ])
    assert main(["convert", "--input", src, "--schema", schema, "--output", out]) == 0
    first, second = _records(out)
    assert first == {
        "i": [7], "f": [2.5], "b": [1], "s": ["héllo".encode()], "raw": [blob],
        "ints": [1, -2, 300], "tokens": [b"a", b"b"], "opt": [], "dflt": [9.0],
    }
    assert second == {
        "i": [-(2**63)], "f": [-0.125], "b": [0], "s": [], "raw": [b"x"],  # Empty: no value.
        "ints": [], "tokens": [b"c"], "opt": [4], "dflt": [1.5],
    }
    features = load_manifest(out)["features"]
    assert features["i"] == {"dtype": "int64", "shape": []}
    assert features["opt"] == {"dtype": "int64", "shape": [None]}
    assert features["tokens"] == {"dtype": "string", "shape": [None]}
    assert features["f"] == {"dtype": "float32", "shape": []}
    assert not os.path.exists(os.path.join(out, ".beam-tfrecords"))  # Spools and lock are removed.


def test_quoting_edge_cases_and_several_files(tmp_path):
    rows_a = [["1", 'a, "quoted" value'], ["2", "line one\nline two"], ["3", ""]]
    rows_b = [["4", "semi;colon"], ["5", '"', ]]
    _write_csv(str(tmp_path / "in" / "part-a.csv"), ["id", "text"], rows_a)
    _write_csv(str(tmp_path / "in" / "part-b.csv"), ["id", "text"], rows_b)
    schema = _schema(tmp_path, [{"name": "id", "type": "int64"},
                                {"name": "text", "type": "string", "default": ""}])
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(tmp_path / "in" / "part-*.csv"), "--schema", schema,
                 "--output", out]) == 0
    got = [(r["id"][0], r["text"][0].decode()) for r in _records(out)]
    assert got == [(int(i), t) for i, t in rows_a + rows_b]  # File order, then row order.
    assert load_manifest(out)["input"]["files"] == 2


def test_no_header_semicolon_dialect(tmp_path):
    src, out = str(tmp_path / "in" / "t.txt"), str(tmp_path / "out")
    _write_csv(src, None, [["1", "x;y'z"], ["2", "plain"]], delimiter=";", quotechar="'")
    code = main(["convert", "--input", src, "--layout", "table", "--no_header", "--columns", "n,word",
                 "--csv_delimiter", ";", "--csv_quote", "'", "--output", out])
    assert code == 0
    assert [(r["n"][0], r["word"][0]) for r in _records(out)] == [(1, b"x;y'z"), (2, b"plain")]


def test_malformed_rows_are_dead_lettered_with_line_numbers(tmp_path):
    src, out = str(tmp_path / "in" / "t.csv"), str(tmp_path / "out")
    text = (
        "id,score,note\n"          # line 1
        "1,0.5,ok\n"               # 2
        '2,1.5,"two\nlines"\n'     # 3-4
        "3,abc,bad float\n"        # 5: unparseable value
        "4,2.5\n"                  # 6: wrong cell count
        ",3.5,missing id\n"        # 7: required id empty
        "6,4.5,fine\n"             # 8
        '7,5.5,"never closed\n'    # 9: a quote never closed: set aside, reading goes on
        "8,6.5,kept\n"             # 10: read, not swallowed into line 9's cell
    )
    os.makedirs(os.path.dirname(src))
    with open(src, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    schema = _schema(tmp_path, [{"name": "id", "type": "int64", "required": True},
                                {"name": "score", "type": "float"}, {"name": "note", "type": "string"}])
    assert main(["convert", "--input", src, "--schema", schema, "--output", out,
                 "--max_bad_fraction", "0.9"]) == 0
    assert [r["id"][0] for r in _records(out)] == [1, 2, 6, 8]
    letters = {int(d["source"].rsplit(":", 1)[1]): d for d in _dead(out)}
    assert {line: d["error"] for line, d in letters.items()} == {
        5: "bad_value", 6: "bad_row", 7: "missing_required", 9: "unterminated_quote",
    }
    # A dead letter names the line and the column, and describes the cell; it never holds the row.
    assert not any("row" in d for d in letters.values())
    assert letters[5]["message"] == "column 'score' (float): a 3-character text is not a number"
    assert "bad float" not in json.dumps(letters) and "7,5.5" not in json.dumps(letters)
    rows = load_manifest(out)["input"]["rows"]
    assert rows == {"in": 8, "written": 4, "dead_lettered": 4, "blank_skipped": 0,
                    "lines": {"in": 10, "accounted_for": 10},
                    "multiline_rows": {"rows": 1, "largest_span": 2, "first": [f"{src}:3"]},
                    "accounted": True}
    assert rows["in"] == rows["written"] + rows["dead_lettered"]


def test_infer_schema_then_convert_round_trip(tmp_path):
    src, out = str(tmp_path / "in" / "t.csv"), str(tmp_path / "out")
    _write_csv(src, ["flag", "n", "x", "word", "gap"], [
        ["yes", "1", "1", "cat", "1"], ["no", "2", "2.5", "dog", ""], ["YES", "3", "-1", "1", "3"],
    ])
    schema = str(tmp_path / "inferred.yaml")
    assert main(["infer-schema", "--input", src, "--output", schema]) == 0
    columns = {c["name"]: c for c in json.loads(json.dumps(
        __import__("yaml").safe_load(open(schema, encoding="utf-8"))))["columns"]}
    assert {n: c["type"] for n, c in columns.items()} == {
        "flag": "bool", "n": "int64", "x": "float", "word": "string", "gap": "int64"}
    assert columns["gap"].get("required") is None and columns["n"]["required"] is True
    assert main(["convert", "--input", src, "--schema", schema, "--output", out]) == 0
    records = _records(out)
    assert [r["flag"] for r in records] == [[1], [0], [1]]
    assert [r["x"] for r in records] == [[1.0], [2.5], [-1.0]]
    assert [r["gap"] for r in records] == [[1], [], [3]]


def test_splits_by_column_and_by_ratio(tmp_path):
    src = str(tmp_path / "in" / "t.csv")
    _write_csv(src, ["id", "part"], [[str(i), "train" if i % 4 else "test"] for i in range(400)])
    schema = _schema(tmp_path, [{"name": "id", "type": "int64"}, {"name": "part", "skip": True}])
    by_column = str(tmp_path / "col")
    assert main(["convert", "--input", src, "--schema", schema, "--split_column", "part",
                 "--output", by_column]) == 0
    splits = load_manifest(by_column)["splits"]
    assert splits["test"]["records"] == 100 and splits["train"]["records"] == 300

    runs = []
    for name in ("r1", "r2"):
        out = str(tmp_path / name)
        assert main(["convert", "--input", src, "--schema", schema, "--output", out,
                     "--splits", "train=0.8,validation=0.1,test=0.1", "--key_column", "id"]) == 0
        runs.append(out)
    counts = {k: v["records"] for k, v in load_manifest(runs[0])["splits"].items()}
    assert sum(counts.values()) == 400 and set(counts) == {"train", "validation", "test"}
    assert 280 < counts["train"] < 360
    shards = sorted(n for n in os.listdir(runs[0]) if ".tfrecord" in n)
    assert [sha256_file(os.path.join(runs[0], n)) for n in shards] == \
        [sha256_file(os.path.join(runs[1], n)) for n in shards]


def test_shaped_columns_flat_and_tensor(tmp_path):
    src, out = str(tmp_path / "in" / "t.csv"), str(tmp_path / "out")
    _write_csv(src, ["flat", "tensor"], [["1 2 3 4 5 6", "0.5 1.5 2.5 3.5"], ["1 2 3", "1 2 3 4"]])
    schema = _schema(tmp_path, [
        {"name": "flat", "type": "int64", "delimiter": " ", "shape": [2, 3]},
        {"name": "tensor", "type": "float", "delimiter": " ", "shape": [2, 2], "encoding": "tensor"},
    ])
    assert main(["convert", "--input", src, "--schema", schema, "--output", out,
                 "--max_bad_fraction", "0.5"]) == 0
    (record,) = _records(out)
    assert record["flat"] == [1, 2, 3, 4, 5, 6] and record["flat/shape"] == [2, 3]
    np.testing.assert_array_equal(decode_tensor(record["tensor"][0]),
                                  np.array([[0.5, 1.5], [2.5, 3.5]], dtype=np.float32))
    assert [d["error"] for d in _dead(out)] == ["wrong_length"]
    features = load_manifest(out)["features"]
    assert features["flat"] == {"dtype": "int64", "shape": [6]}
    assert features["flat/shape"] == {"dtype": "int64", "shape": [2]}
    assert features["tensor"] == {"dtype": "string", "shape": []}


@pytest.fixture(scope="module")
def five_mb_csv(tmp_path_factory):
    src = str(tmp_path_factory.mktemp("band") / "big.csv")
    rng = np.random.default_rng(0)
    _write_csv(src, ["id", "text", "score"], [
        [str(i), "word " * int(rng.integers(5, 40)), f"{rng.normal():.6f}"] for i in range(40_000)
    ])
    assert 4e6 < os.path.getsize(src) < 9e6
    return src


def test_reruns_are_byte_identical_and_shards_inside_the_band(five_mb_csv, tmp_path):
    outs = []
    for name, processes in (("a", "0"), ("b", "2")):
        out = str(tmp_path / name)
        assert main(["convert", "--input", five_mb_csv, "--output", out, "--shard_min_mb", "1",
                     "--shard_max_mb", "2", "--encode_processes", processes]) == 0
        outs.append(out)
    shards = sorted(n for n in os.listdir(outs[0]) if n.endswith(".tfrecord"))
    assert len(shards) >= 3
    for name in shards:
        size = os.path.getsize(os.path.join(outs[0], name))
        assert 1_000_000 <= size <= 2_000_000, (name, size)
        for file in (name, name + ".idx"):  # The shard, and its index file (issue 22).
            assert sha256_file(os.path.join(outs[0], file)) == sha256_file(os.path.join(outs[1], file))
    ids = [r["id"][0] for r in _records(outs[0])]
    assert ids == list(range(40_000))
    assert main(["verify", outs[0]]) == 0


def test_sequence_examples_round_trip(tmp_path):
    from beam_tfrecords.transforms.codec.sequence import (
        sequence_example_to_dict,
    )  # pylint: disable=import-outside-toplevel

    src_a, src_b = str(tmp_path / "in" / "a.csv"), str(tmp_path / "in" / "b.csv")
    header = ["user", "step", "country", "clicks", "page"]
    _write_csv(src_a, header, [["u1", "2", "fr", "5", "home"], ["u2", "1", "de", "1", "cart"],
                               ["u1", "10", "fr", "7", "pay"], ["", "1", "xx", "0", "none"]])
    _write_csv(src_b, header, [["u1", "1", "fr", "3", "landing"], ["u3", "1", "us", "x", "bad"]])
    schema = _schema(tmp_path, [
        {"name": "user", "type": "string"}, {"name": "step", "skip": True},
        {"name": "country", "type": "string"},
        {"name": "clicks", "type": "int64", "sequence": True},
        {"name": "page", "type": "string", "sequence": True},
    ])
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(tmp_path / "in" / "*.csv"), "--schema", schema,
                 "--sequence_key", "user", "--sequence_order", "step", "--output", out,
                 "--max_bad_fraction", "0.5"]) == 0
    shards = sorted(n for n in os.listdir(out) if ".tfrecord" in n)
    from beam_tfrecords.transforms.codec.tfrecord import (
        iter_records,
    )  # pylint: disable=import-outside-toplevel

    with open(os.path.join(out, shards[0]), "rb") as f:
        parsed = [sequence_example_to_dict(r) for r in iter_records(f)]
    by_user = {context["user"][0]: (context, lists) for context, lists in parsed}
    assert set(by_user) == {b"u1", b"u2"}
    context, lists = by_user[b"u1"]
    assert context == {"country": [b"fr"], "user": [b"u1"]}
    assert lists == {"clicks": [[3], [5], [7]], "page": [[b"landing"], [b"home"], [b"pay"]]}
    assert by_user[b"u2"][1] == {"clicks": [[1]], "page": [[b"cart"]]}
    manifest = load_manifest(out)
    assert manifest["sequence_features"] == {"clicks": {"dtype": "int64", "shape": [None]},
                                             "page": {"dtype": "string", "shape": [None]}}
    assert manifest["input"]["rows"]["in"] == 6
    assert manifest["input"]["rows"]["in_sequences"] == 4
    assert manifest["input"]["rows"]["accounted"] is True
    assert sorted(d["error"] for d in _dead(out)) == ["bad_value", "missing_sequence_key"]
    assert not os.path.exists(os.path.join(out, ".beam-tfrecords"))


def test_tsv_defaults_to_tabs_and_encoding_is_honoured(tmp_path):
    src, out = tmp_path / "in" / "t.tsv", str(tmp_path / "out")
    src.parent.mkdir()
    src.write_bytes("name\tcity\nZoë\tSão Paulo, BR\n".encode("latin-1"))
    assert main(["convert", "--input", str(src), "--encoding", "latin-1", "--output", out]) == 0
    (record,) = _records(out)
    assert record == {"name": ["Zoë".encode()], "city": ["São Paulo, BR".encode()]}
    assert load_manifest(out)["schema"]["columns"][0] == {"name": "name", "type": "string",
                                                          "required": True}


def test_header_only_and_empty_csv(tmp_path, capsys):
    header_only = tmp_path / "h.csv"
    header_only.write_text("a,b\n")
    assert main(["convert", "--input", str(header_only), "--output", str(tmp_path / "o1")]) == 1
    assert "NO RECORDS WRITTEN" in capsys.readouterr().out
    assert not os.path.exists(tmp_path / "o1" / "manifest.json")
    empty = tmp_path / "e.csv"
    empty.write_text("")
    assert main(["convert", "--input", str(empty), "--output", str(tmp_path / "o2")]) == 2
    assert "cannot read a header row (the file is empty)" in capsys.readouterr().err


def _whole_array_plan(spools, band, compression):
    """The plan as one array of all a split's sizes gives it (the reference)."""
    from beam_tfrecords.schemas.shards import shard_name
    from beam_tfrecords.transforms.codec.record_offsets import checkpoints
    from beam_tfrecords.transforms.plan.shard_cuts import cut_shards

    sizes = np.concatenate([s for _, s in spools])
    owner = np.concatenate([np.full(len(s), k) for k, (_, s) in enumerate(spools)])
    offsets = np.concatenate([np.concatenate(([0], np.cumsum(s)[:-1])) for _, s in spools])
    num_shards, shard_of = cut_shards(sizes, band)
    plan = []
    for index in range(num_shards):
        members = np.nonzero(shard_of == index)[0]
        segments = []
        for k in np.unique(owner[members]):
            rows = members[owner[members] == k]
            first, last = int(rows[0]), int(rows[-1])
            segments.append((spools[k][0], int(offsets[first]), int(offsets[last] + sizes[last]),
                             len(rows)))
        plan.append((index, num_shards, shard_name("train", index, num_shards, compression),
                     int(sizes[members].sum()), tuple(segments),
                     checkpoints(sizes[members]) if compression == "none" else ()))
    return plan


@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("shape", ["many", "one_file", "huge_records", "tiny"])
def test_plan_streamed_from_sidecars_matches_the_whole_array_plan(tmp_path, monkeypatch, shape,
                                                                  compression):
    """Shards are planned from the spools' sidecars a chunk at a time; the cuts,
    segments, bytes and checkpoints are those of the whole-array plan."""
    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms import tables

    rng = np.random.default_rng(len(shape))
    counts = {"many": [30000, 1, 70000, 25000], "one_file": [40000], "huge_records": [60, 5, 40],
              "tiny": [1]}[shape]
    spools, infos = [], []
    for k, count in enumerate(counts):
        sizes = rng.integers(16, 4000, count).astype("<i8")
        if shape == "huge_records":
            sizes[::7] = rng.integers(20 << 20, 40 << 20, len(sizes[::7]))
        path = str(tmp_path / f"{k:05d}-train.spool")
        (tmp_path / f"{k:05d}-train.spool.sizes").write_bytes(sizes.tobytes())
        spools.append((path, sizes))
        infos.append(tables.SpoolInfo("train", k, path, len(sizes), int(sizes.sum())))
    infos.append(tables.SpoolInfo("", 9, ""))  # A file with no good row.
    band = ShardBand(20 << 20, 30 << 20) if shape != "tiny" else ShardBand(1, 2)
    monkeypatch.setattr(tables.SpoolInfo, "record_sizes",
                        lambda self, chunk=997, _f=tables.SpoolInfo.record_sizes: _f(self, chunk))
    specs = tables.plan_table_shards(list(reversed(infos)), band, compression)
    got = [(s.index, s.num_shards, s.name, s.planned_bytes, s.records.segments, s.checkpoints)
           for s in specs]
    assert got == _whole_array_plan(spools, band, compression)
    assert len(got) > 1 or shape == "tiny"
    if compression == "none" and shape != "tiny":
        assert any(s.checkpoints for s in specs)


def test_plan_of_spooled_images_matches_the_whole_array_plan(tmp_path):
    """Spooled images (``ImageSpool``, sizes carried whole) share the table planner."""
    from beam_tfrecords.schemas.elements import ImageSpool
    from beam_tfrecords.schemas.shards import ShardBand
    from beam_tfrecords.transforms.tables import plan_table_shards

    rng = np.random.default_rng(7)
    spools = [(str(tmp_path / f"{k}.spool"), rng.integers(16, 400_000, count).astype("<i8"))
              for k, count in enumerate([300, 50, 700])]
    band = ShardBand(20 << 20, 30 << 20)
    specs = plan_table_shards([ImageSpool("train", k, path, sizes.tobytes())
                               for k, (path, sizes) in enumerate(spools)], band, "none")
    got = [(s.index, s.num_shards, s.name, s.planned_bytes, s.records.segments, s.checkpoints)
           for s in specs]
    assert got == _whole_array_plan(spools, band, "none")
    assert len(got) > 1
