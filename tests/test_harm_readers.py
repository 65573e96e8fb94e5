"""Issue 18, "do no harm", readers: what reads a dataset stays inside it and bounded,
and a CSV image manifest's rows stay in its folder unless the user says otherwise.

Through the real CLI (``tests.harness.attack_table.cli``: ``python -m beam_tfrecords ...`` as
a subprocess): the exit status, the one line the user reads, the files present before
and after (byte for byte), records counted from the shards themselves; and the
pieces those runs rest on (``parse_manifest``, ``outside_folder``, the TFRecord
scanner, ``outside_root``) as unit tests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from beam_tfrecords.samples import make_class_folder_sample, make_csv_manifest_sample
from beam_tfrecords.schemas.manifest import outside_folder, parse_manifest
from beam_tfrecords.transforms.codec.tfrecord import (
    RECORD_PIECE,
    SCAN_MEMORY_BYTES,
    RecordError,
    TFRecordWriter,
    frame_record,
    iter_records,
    masked_crc32c,
    scan_stream,
)
from beam_tfrecords.transforms.plan.layouts import outside_root, rows_outside, within
from beam_tfrecords.verify import dataset_shards
from tests.conftest import read_dataset
from tests.harness.attack_table import EXIT_FAILED, EXIT_OK, EXIT_USAGE, TRACEBACK, Run, cli, cli_env
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, str]:
    """Every entry under ``folder``: a file's SHA-256, a link's target, a folder's mark."""
    found = {}
    for here, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(here, name)
            rel = os.path.relpath(path, folder)
            if name in ("stdout.txt", "stderr.txt"):  # The CLI runner's own capture.
                continue
            if os.path.islink(path):
                found[rel] = "link -> " + os.readlink(path)
            elif os.path.isdir(path):
                found[rel] = "folder"
            else:
                with open(path, "rb") as f:
                    found[rel] = hashlib.sha256(f.read()).hexdigest()
    return found


def one_line(run: Run) -> str:
    """The run's verdict: its stderr holds exactly that line besides log records."""
    assert TRACEBACK not in run.stdout + run.stderr, run.stderr[-2000:]
    assert not run.stray_stderr, run.stray_stderr
    return run.message


def records_in(out: Path) -> int:
    return sum(len(records) for records in read_dataset(str(out)).values())


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A small published dataset (class folders, splits train and test), made by the CLI."""
    work = tmp_path_factory.mktemp("dataset")
    make_class_folder_sample(str(work / "in"), per_class=2, splits=("train", "test"))
    run = cli(work, "convert", "--input", str(work / "in"), "--output", str(work / "out"),
              "--progress", "off")
    assert run.exit == EXIT_OK, run.stderr[-2000:]
    return work / "out"


def copy_dataset(dataset: Path, work: Path, edit=None) -> Path:
    """A copy of ``dataset`` at ``work/ds``, its manifest changed by ``edit(manifest)``
    (which may return text to write instead)."""
    out = work / "ds"
    shutil.copytree(dataset, out)
    if edit is not None:
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        text = edit(manifest)
        if isinstance(text, bytes):
            (out / "manifest.json").write_bytes(text)
        else:
            (out / "manifest.json").write_text(text if isinstance(text, str) else json.dumps(manifest),
                                               encoding="utf-8")
    return out


# --------------------------------------------------------------------------------------
# 1. containment: paths a manifest names stay in its folder
# --------------------------------------------------------------------------------------


def _point_outside(how: str):
    """A manifest edit (and the files to set up) that points ``train``'s first shard
    outside the dataset; the outside copy is a valid shard, so only containment fails it."""

    def setup(work: Path, out: Path) -> str:
        outside = work / "outside"
        outside.mkdir()
        shard = out / "train-00000-of-00001.tfrecord"
        shutil.copy(shard, outside / shard.name)
        manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
        entry = manifest["splits"]["train"]["shards"][0]
        if how == "dotdot":
            entry["path"] = f"../outside/{shard.name}"
        elif how == "absolute":
            entry["path"] = str(outside / shard.name)
        elif how == "scheme":
            entry["path"] = f"file://{outside / shard.name}"
        elif how == "link":  # The manifest is unchanged: the shard is a link out.
            shard.unlink()
            shard.symlink_to(outside / shard.name)
        elif how == "part_link":  # A part folder that is a link to a folder outside.
            part = outside / "part-00001"
            part.mkdir()
            (part / "manifest.json").write_text("{}", encoding="utf-8")
            (out / "part-00001").symlink_to(part)
            manifest["parts"] = [{"path": "part-00001", "manifest_sha256": hashlib.sha256(
                b"{}").hexdigest(), "records": 0, "splits": {}}]
        (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        return {"dotdot": "splits.train.shards[0].path", "absolute": "splits.train.shards[0].path",
                "scheme": "splits.train.shards[0].path", "link": "splits.train.shards[0].path",
                "part_link": "parts[0].path"}[how]

    return setup


@pytest.mark.e2e
@pytest.mark.parametrize("how", ["dotdot", "absolute", "scheme", "link", "part_link"])
def test_a_manifest_pointing_outside_fails_verify_inspect_and_dataset_shards(dataset, tmp_path, how):
    out = copy_dataset(dataset, tmp_path)
    key = _point_outside(how)(tmp_path, out)
    before = snapshot(tmp_path)
    for command in (["verify", str(out)], ["inspect", str(out), "--contact_sheet",
                                             str(tmp_path / "sheet.png")]):
        run = cli(tmp_path, *command)
        line = one_line(run)
        assert run.exit == EXIT_USAGE, (command, run.exit, line)
        assert line.startswith(f"beam-tfrecords {command[0]}: error: {out}/manifest.json: {key}: "), line
        assert "leads outside the dataset folder" in line, line
        if how == "dotdot":
            assert '"../outside/train-00000-of-00001.tfrecord" climbs out' in line, line
        elif how == "absolute":
            assert f'"{tmp_path}/outside/train-00000-of-00001.tfrecord" is an absolute path' in line, line
        assert snapshot(tmp_path) == before  # Nothing written, nothing removed.
    with pytest.raises(ValueError, match=r"leads outside the dataset folder") as err:
        dataset_shards(str(out))
    assert key in str(err.value) and "\n" not in str(err.value)


@pytest.mark.e2e
def test_a_split_name_cannot_steer_where_the_contact_sheet_goes(dataset, tmp_path):
    def rename(manifest):
        manifest["splits"]["/../../x"] = manifest["splits"].pop("train")
    out = copy_dataset(dataset, tmp_path / "a" / "b", rename)
    run_dir = tmp_path / "a" / "b" / "run"
    run_dir.mkdir()
    before = snapshot(tmp_path)
    run = cli(run_dir, "inspect", str(out), "--contact_sheet", "sheet.png")
    line = one_line(run)
    assert run.exit == EXIT_USAGE
    assert line == (f'beam-tfrecords inspect: error: {out}/manifest.json: splits["/../../x"]: '
                    "split name \"/../../x\" cannot name a file (letters, digits, '_' and '.', "
                    "starting with a letter or digit)")
    assert snapshot(tmp_path) == before
    assert not (tmp_path / "a" / "x.png").exists() and not (run_dir / "sheet-").exists()


@pytest.mark.unit
def test_contact_sheets_refuse_a_split_that_names_another_file(tmp_path):
    from beam_tfrecords.inspect import contact_sheets  # pylint: disable=import-outside-toplevel

    with pytest.raises(ValueError, match=r'split name "/\.\./\.\./x" cannot name a contact sheet'):
        contact_sheets([("train", {}), ("/../../x", {})], str(tmp_path / "sheet.png"))
    assert os.listdir(tmp_path) == []  # Refused before the first sheet.


@pytest.mark.unit
@pytest.mark.parametrize("path, why", [
    ("train-00000-of-00001.tfrecord", ""),
    ("part-00001/train-00000-of-00001.tfrecord", ""),
    ("../x.tfrecord", "climbs out with '..'"),
    ("a/../../x.tfrecord", "climbs out with '..'"),
    ("/etc/passwd", "is an absolute path"),
    ("gs://other/x.tfrecord", "names a scheme (another store)"),
    ("file:x.tfrecord", "names a scheme (another store)"),
    ("C:x.tfrecord", "names a scheme (another store)"),
    ("..\\x.tfrecord", "holds a backslash (a manifest's paths use '/')"),
    ("a//b.tfrecord", "is not a plain relative path (an empty or '.' part)"),
    ("./b.tfrecord", "is not a plain relative path (an empty or '.' part)"),
    ("", "is empty"),
    ("x\x1b[2J.tfrecord", "holds a control character"),
])
def test_outside_folder(path, why):
    assert outside_folder(path) == why


# --------------------------------------------------------------------------------------
# 2. malformed manifests: one line naming the JSON path
# --------------------------------------------------------------------------------------


def _set(path, value):
    def edit(manifest):
        *head, last = path
        target = manifest
        for key in head:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return edit


MALFORMED = {
    "no_shards": (_set(["splits", "train", "shards"], KeyError), "splits.train.shards: missing"),
    "shards_not_a_list": (_set(["splits", "train", "shards"], {"a": 1}),
                          'splits.train.shards: {"a": 1} is not a list'),
    "shard_without_path": (_set(["splits", "train", "shards", 0, "path"], KeyError),
                           "splits.train.shards[0].path: missing"),
    "records_as_text": (_set(["splits", "test", "shards", 0, "records"], "12"),
                        'splits.test.shards[0].records: "12" is not a whole number >= 0'),
    "split_not_an_object": (_set(["splits", "test"], [1, 2]), "splits.test: [1, 2] is not a JSON object"),
    "no_labels": (_set(["labels"], KeyError), "labels: missing"),
    "part_without_path": (_set(["parts"], [{"manifest_sha256": "00"}]), "parts[0].path: missing"),
    "statistics_mean_as_text": (
        _set(["splits", "train", "statistics"], {"features": {"age": {"mean": "x\x1b[31m"}}}),
        'splits.train.statistics.features.age.mean: "x\\u001b[31m" is not a number or null'),
    "shard_listed_twice": (
        lambda m: m["splits"]["test"]["shards"].append(dict(m["splits"]["train"]["shards"][0])),
        'splits.train.shards[0].path: "train-00000-of-00001.tfrecord" is listed twice '
        "(also splits.test.shards[1].path)"),
    "not_json": (lambda m: "{not json", "is not valid JSON: "),
    "not_utf8": (lambda m: b'{"splits": "\xff"}', "is not UTF-8 text (byte 12)"),
}

# The faults run through every command (the others through verify alone).
EVERY_COMMAND = ("not_json", "not_utf8", "shard_without_path")


def minimal_manifest() -> dict:
    """A manifest as ``build_manifest`` writes one, with the keys readers use."""
    def split(name):
        return {"records": 2, "bytes": 40, "num_shards": 1, "shards_outside_band": [],
                "shards": [{"path": f"{name}-00000-of-00001.tfrecord", "records": 2, "bytes": 40,
                            "crc32c": "0" * 8, "sha256": "0" * 64}]}
    return {"format_version": 1, "created": "2026-01-01T00:00:00+00:00",
            "splits": {"test": split("test"), "train": split("train")},
            "labels": {"vocabulary": ["a"], "counts": {}}, "features": {},
            "bad_records": {"total": 0, "by_reason": {}, "dead_letter_files": []}}


@pytest.mark.unit
def test_a_minimal_manifest_parses():
    assert parse_manifest(json.dumps(minimal_manifest())) == minimal_manifest()


@pytest.mark.unit
@pytest.mark.parametrize("name", [n for n in MALFORMED if n not in ("not_json", "not_utf8")])
def test_parse_manifest_names_the_json_path(name):
    manifest = minimal_manifest()
    edit, expected = MALFORMED[name]
    edit(manifest)
    with pytest.raises(ValueError) as err:
        parse_manifest(json.dumps(manifest), "M")
    assert str(err.value) == f"M: {expected}"


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_manifest_ends_in_one_line_everywhere(dataset, tmp_path, name):
    """verify, inspect, dataset_shards, --compare_to, --skip_unchanged, --incremental.

    Every reader parses with ``parse_manifest`` (each message is checked by
    ``test_parse_manifest_names_the_json_path``), so every command runs for the
    undecodable files and one structural fault; the other faults run ``verify``
    (the suite's time: each command is a process of its own)."""
    edit, expected = MALFORMED[name]
    out = copy_dataset(dataset, tmp_path, edit)
    source = f"{out}/manifest.json"
    src = tmp_path / "in"
    make_class_folder_sample(str(src), per_class=1, splits=None)
    before = snapshot(tmp_path)
    runs = {
        "verify": (["verify", str(out)], f"beam-tfrecords verify: error: {source}"),
        "inspect": (["inspect", str(out)], f"beam-tfrecords inspect: error: {source}"),
        "compare_to": (["convert", "--input", str(src), "--output", str(tmp_path / "new"),
                        "--compare_to", str(out)],
                       f"beam-tfrecords convert: error: --compare_to {out}: {source}"),
        "skip_unchanged": (["convert", "--input", str(src), "--output", str(out), "--skip_unchanged"],
                           f"beam-tfrecords convert: error: --output {out} already holds a dataset "
                           f"(manifest.json) (the dataset cannot be compared with ({source}"),
        "incremental": (["convert", "--input", str(src), "--output", str(out), "--incremental"],
                        f"beam-tfrecords convert: error: --incremental: the dataset at {out} cannot "
                        f"be compared with ({source}"),
    }
    if name not in EVERY_COMMAND:  # no_shards: inspect as well (once the attack table's case).
        runs = {k: runs[k] for k in (("verify", "inspect") if name == "no_shards" else ("verify",))}
    for what, (argv, start) in runs.items():
        run = cli(tmp_path, *argv, "--progress", "off") if argv[0] == "convert" else cli(tmp_path, *argv)
        line = one_line(run)
        assert run.exit == EXIT_USAGE, (what, run.exit, line)
        assert line.startswith(start), (what, line)
        assert expected in line, (what, line)
        assert snapshot(tmp_path) == before, what  # Nothing written, nothing removed.
    with pytest.raises(ValueError) as err:
        dataset_shards(str(out))
    assert str(err.value).startswith(source) and expected in str(err.value)


# --------------------------------------------------------------------------------------
# 3. hostile shards: bounded memory, one line naming shard, record and offset
# --------------------------------------------------------------------------------------


def _header(length: int) -> bytes:
    field = struct.pack("<Q", length)
    return field + struct.pack("<I", masked_crc32c(field))


def hostile(path: Path, claim: int, zeros_mb: int, gz: bool) -> Path:
    """A shard whose first record's (valid) length field claims ``claim`` bytes, over
    ``zeros_mb`` MB of zeros; gzip-compressed (~1000 times smaller) when ``gz``."""
    with open(path, "wb") as f:
        out = gzip.GzipFile(fileobj=f, mode="wb", mtime=0) if gz else f
        out.write(_header(claim))
        zeros = bytes(1 << 20)
        for _ in range(zeros_mb):
            out.write(zeros)
        if gz:
            out.close()
    return path


_MEASURE = """
import resource, subprocess, sys
with open("stdout.txt", "w") as out, open("stderr.txt", "w") as err:
    code = subprocess.run(sys.argv[1:], stdout=out, stderr=err).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def measured(work: Path, *argv: str) -> tuple[Run, int]:
    """The CLI run in a fresh parent whose only child it is: the run and its peak RSS (bytes)."""
    command = [sys.executable, "-m", "beam_tfrecords", *argv]
    done = subprocess.run([sys.executable, "-c", _MEASURE, *command], cwd=work, env=cli_env(),
                          capture_output=True, text=True, timeout=600, check=True)
    code, rss_kb = map(int, done.stdout.split())
    run = Run(list(argv), code, (work / "stdout.txt").read_text(), (work / "stderr.txt").read_text(), 0.0)
    return run, rss_kb * 1024


@pytest.mark.e2e
@pytest.mark.parametrize("name, claim, zeros_mb, gz", [
    ("gz-64mb", 1 << 40, 64, True),                 # a ~65 KB .gz: 64 MB decompressed
    ("gz-1gb-claims-2gb", 1 << 31, 1024, True),     # a ~1 MB .gz: allocated 1.24 GB before
    ("plain-2e40", 1 << 40, 64, False),             # 64 MB claiming 2^40: scanned quadratically before
])
def test_verify_fails_a_hostile_shard_within_the_stated_memory(dataset, tmp_path, name, claim,
                                                                zeros_mb, gz):
    suffix = ".tfrecord.gz" if gz else ".tfrecord"
    path = hostile(tmp_path / f"{name}-00000-of-00001{suffix}", claim, zeros_mb, gz)
    valid = tmp_path / "valid"
    valid.mkdir()
    shutil.copy(dataset / "train-00000-of-00001.tfrecord", valid)
    base_run, base_rss = measured(tmp_path, "verify", str(valid / "train-00000-of-00001.tfrecord"))
    assert base_run.exit == EXIT_OK, base_run.stdout
    before = snapshot(tmp_path)
    run, rss = measured(tmp_path, "verify", str(path))
    line = one_line(run)
    present = zeros_mb << 20
    assert run.exit == EXIT_FAILED
    assert line == (f"FAIL  {path}  record 0 at byte offset 0: stream ends inside the record: "
                    f"{claim + 4} bytes of data and CRC expected, {present} present")
    assert snapshot(tmp_path) == before
    print(f"\n{name}: {path.stat().st_size:,} bytes on disk; verify peak RSS {rss / 2**20:.1f} MiB, "
          f"a valid shard's {base_rss / 2**20:.1f} MiB")
    assert rss <= base_rss + SCAN_MEMORY_BYTES, (rss, base_rss)


@pytest.mark.e2e
def test_verify_and_inspect_of_a_dataset_holding_a_hostile_shard(dataset, tmp_path):
    """The shard at a listed name replaced by one claiming 2^40 bytes: verify fails it
    (exit 1, naming shard, record and offset); inspect stops there (exit 1)."""
    out = copy_dataset(dataset, tmp_path)
    shard = out / "train-00000-of-00001.tfrecord"
    hostile(shard, 1 << 40, 1, False)
    before = snapshot(tmp_path)
    run = cli(tmp_path, "verify", str(out))
    assert run.exit == EXIT_FAILED
    assert one_line(run).startswith(f"FAIL  {shard}  record 0 at byte offset 0: stream ends inside "
                                    "the record: 1099511627780 bytes")
    run = cli(tmp_path, "inspect", str(out))
    assert run.exit == EXIT_FAILED
    assert one_line(run) == (f"beam-tfrecords inspect: error: {shard}: record 0 at byte offset 0: "
                             "stream ends inside the record: 1099511627780 bytes of data and CRC "
                             "expected, 1048576 present")
    gz_shard = out / "test-00000-of-00001.tfrecord"  # inspect's own bound, for a gzip shard.
    gz_out = tmp_path / "gz"
    shutil.copytree(out, gz_out)
    manifest = json.loads((gz_out / "manifest.json").read_text())
    manifest["splits"]["test"]["shards"][0]["path"] = gz_shard.name + ".gz"
    (gz_out / "manifest.json").write_text(json.dumps(manifest))
    hostile(gz_out / (gz_shard.name + ".gz"), 1 << 30, 1, True)
    run = cli(tmp_path, "inspect", str(gz_out))
    assert run.exit == EXIT_FAILED
    assert one_line(run).endswith("record 0 at byte offset 0: the record claims 1,073,741,824 "
                                  "bytes, more than the 268,435,456 read here")
    assert snapshot(out) == {k[len("ds/"):]: v for k, v in before.items() if k.startswith("ds/")}


@pytest.mark.unit
@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_long_records_scan_and_read_as_written(compression):
    """Records longer than a block or a piece (streamed through the CRC) read back
    byte for byte, with the writer's digest, around each boundary."""
    sizes = [0, 5, RECORD_PIECE - 17, RECORD_PIECE - 16, RECORD_PIECE - 4, RECORD_PIECE,
             RECORD_PIECE + 1, 3 * RECORD_PIECE + 7, 12, 5 * RECORD_PIECE // 2, 1]
    records = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    sink = io.BytesIO()
    writer = TFRecordWriter(sink, compression)
    for record in records:
        writer.write(record)
    digest = writer.close()
    stored = sink.getvalue()
    assert scan_stream(io.BytesIO(stored), compression) == digest
    plain = gzip.decompress(stored) if compression == "gzip" else stored
    assert list(iter_records(io.BytesIO(plain), size=len(plain))) == records
    assert list(iter_records(io.BytesIO(plain))) == records


@pytest.mark.unit
def test_a_long_record_cut_or_corrupt_is_named_at_its_offset():
    records = [b"a" * 10, b"b" * (3 * RECORD_PIECE), b"c"]
    data = bytearray(b"".join(frame_record(r) for r in records))
    second = 16 + 10
    corrupt = bytes(data[:second + 12 + RECORD_PIECE * 2]) + b"X" + bytes(data[second + 13 + RECORD_PIECE * 2:])
    for read in (lambda d: scan_stream(io.BytesIO(d)), lambda d: list(iter_records(io.BytesIO(d)))):
        with pytest.raises(RecordError, match="data CRC mismatch") as err:
            read(corrupt)
        assert (err.value.index, err.value.offset) == (1, second)
        with pytest.raises(RecordError, match="stream ends inside the record") as err:
            read(bytes(data[:second + 12 + RECORD_PIECE]))
        assert (err.value.kind, err.value.index, err.value.offset) == ("truncated", 1, second)


@pytest.mark.unit
def test_iter_records_refuses_a_claim_before_reading():
    data = _header(1 << 40) + bytes(100)

    class Counting(io.BytesIO):
        asked = 0

        def read(self, n=-1):
            Counting.asked = max(Counting.asked, n)
            return super().read(n)

    with pytest.raises(RecordError, match="1099511627780 bytes of data and CRC expected, 100 present"):
        list(iter_records(Counting(data), size=len(data)))
    assert Counting.asked == 12  # Only the header was read.
    with pytest.raises(RecordError, match="more than the 1,000 read here") as err:
        list(iter_records(Counting(data), max_record=1000))
    assert err.value.kind == "too_large"
    Counting.asked = 0
    with pytest.raises(RecordError, match="stream ends inside the record"):
        list(iter_records(Counting(data)))  # No size known: read in pieces, to the end.
    assert Counting.asked <= RECORD_PIECE


# --------------------------------------------------------------------------------------
# 4. a CSV image manifest's rows stay in its folder
# --------------------------------------------------------------------------------------


def csv_manifest(work: Path, extra: list[str], n: int = 12) -> tuple[Path, list[dict]]:
    """``work/m/manifest.csv`` naming ``n`` images of ``work/m/images``, plus rows whose
    image cells are ``extra`` (their other cells copied from the first row)."""
    rows = make_csv_manifest_sample(str(work / "m"), n=n)
    path = work / "m" / "manifest.csv"
    lines = path.read_text(encoding="utf-8").splitlines()
    rest = lines[1].split(",", 1)[1]
    path.write_text("\n".join(lines + [f"{image},{rest}" for image in extra]) + "\n", encoding="utf-8")
    return path, rows


def outside_image(work: Path, name: str = "secret.jpg") -> Path:
    folder = work / "elsewhere"
    folder.mkdir(exist_ok=True)
    shutil.copy(work / "m" / "images" / "000.jpg", folder / name)
    return folder / name


@pytest.mark.e2e
def test_rows_outside_the_csv_folder_refuse_the_run_unless_allowed(tmp_path):
    csv_path, rows = csv_manifest(tmp_path, [])
    secret = outside_image(tmp_path)
    lines = csv_path.read_text().splitlines()
    rest = lines[1].split(",", 1)[1]
    extra = ["../elsewhere/secret.jpg", str(secret), "gs://someone-elses-bucket/x.jpg",
             "gs://someone-elses-bucket/y.jpg"]
    csv_path.write_text("\n".join(lines + [f"{e},{rest}" for e in extra]) + "\n")
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off")
    assert run.exit == EXIT_USAGE
    elsewhere = os.path.realpath(tmp_path / "elsewhere")
    assert one_line(run) == (
        f"beam-tfrecords convert: error: --input {csv_path}: 4 rows of the CSV manifest name images "
        f"outside its folder, under {elsewhere} (2 rows), gs://someone-elses-bucket (2 rows); "
        f"they are read only when allowed: add --allowed_roots {elsewhere},gs://someone-elses-bucket "
        "(or --allow_paths_outside to read rows wherever they point)")
    assert snapshot(tmp_path) == before and not out.exists()
    # One root allowed: the other is still refused, alone.
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              "--allowed_roots", f"{tmp_path}/elsewhere")
    assert run.exit == EXIT_USAGE
    assert "2 rows of the CSV manifest name images outside its folder, under " \
           "gs://someone-elses-bucket (2 rows);" in one_line(run)
    assert snapshot(tmp_path) == before


@pytest.mark.e2e
@pytest.mark.parametrize("flag", ["--allowed_roots", "--allow_paths_outside"])
def test_rows_outside_are_read_when_allowed(tmp_path, flag):
    csv_path, rows = csv_manifest(tmp_path, [])
    secret = outside_image(tmp_path)
    (tmp_path / "m" / "linked").symlink_to(tmp_path / "elsewhere")  # A link out counts too.
    lines = csv_path.read_text().splitlines()
    rest = lines[1].split(",", 1)[1]
    csv_path.write_text("\n".join(lines + [f"../elsewhere/secret.jpg,{rest}", f"{secret},{rest}",
                                           f"linked/secret.jpg,{rest}"]) + "\n")
    out = tmp_path / "out"
    refused = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off")
    assert refused.exit == EXIT_USAGE
    assert f"3 rows of the CSV manifest name images outside its folder, under " \
           f"{os.path.realpath(tmp_path / 'elsewhere')} (3 rows)" in one_line(refused)
    argv = [flag, str(tmp_path / "elsewhere")] if flag == "--allowed_roots" else [flag]
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              *argv)
    assert run.exit == EXIT_OK, one_line(run)
    assert one_line(run) == "status: ok"
    names = sorted(r["image/filename"][0].decode() for rs in read_dataset(str(out)).values() for r in rs)
    assert len(names) == len(rows) + 3 == records_in(out)
    assert {"../elsewhere/secret.jpg", str(secret).lstrip("/"), "linked/secret.jpg"} <= set(names)
    # Every row once, by its image: none dead-lettered, none dropped (the attack table's accounting).
    assert names == sorted([r["image"] for r in rows] + ["../elsewhere/secret.jpg", str(secret).lstrip("/"),
                                                         "linked/secret.jpg"])
    assert not (out / "dead_letter").exists() or not list((out / "dead_letter").iterdir())
    assert sum(s["records"] for s in json.loads((out / "manifest.json").read_text())["splits"].values()) \
        == len(names)


@pytest.mark.e2e
def test_a_row_is_looked_up_literally_and_an_unreadable_one_is_a_dead_letter(tmp_path):
    """A glob in a row names a file of that name (none here); an unknown scheme is
    dead-lettered; the run publishes the rest (exit 0), walking nothing."""
    csv_path, rows = csv_manifest(tmp_path, ["images/*.jpg", "x://a.jpg", "/**/secret.jpg"])
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              "--max_bad_fraction", "0.5", "--allow_paths_outside")
    assert run.exit == EXIT_OK, one_line(run)
    assert records_in(out) == len(rows)
    with open(out / "dead_letter" / "listing.jsonl", encoding="utf-8") as f:
        letters = {json.loads(line)["source"].rsplit(":", 1)[1]: json.loads(line) for line in f}
    first = len(rows) + 2
    assert {line: (d["error"], d["message"]) for line, d in letters.items()} == {
        str(first): ("missing_file", 'image "images/*.jpg" does not exist'),
        str(first + 1): ("unreadable_path", 'image "x://a.jpg": no file system of this run reads its scheme'),
        str(first + 2): ("missing_file", 'image "/**/secret.jpg" does not exist'),
    }
    (tmp_path / "m" / "images" / "*.jpg").write_bytes((tmp_path / "m" / "images" / "000.jpg").read_bytes())
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              "--max_bad_fraction", "0.5", "--allow_paths_outside", "--overwrite")
    assert run.exit == EXIT_OK
    assert records_in(out) == len(rows) + 1  # The file literally named '*.jpg', once.


@pytest.mark.e2e
@pytest.mark.parametrize("input_kind", ["table", "folder"])
def test_the_manifest_row_flags_are_refused_for_tables_and_folders(tmp_path, input_kind):
    if input_kind == "table":
        src = tmp_path / "t.csv"
        src.write_text("id,x\n1,2\n")
    else:
        src = tmp_path / "in"
        make_class_folder_sample(str(src), per_class=1, splits=None)
    run = cli(tmp_path, "convert", "--input", str(src), "--output", str(tmp_path / "out"),
              "--allowed_roots", "/data", "--allow_paths_outside")
    assert run.exit == EXIT_USAGE
    assert one_line(run).startswith("beam-tfrecords convert: error: --allowed_roots, "
                                    "--allow_paths_outside apply only to ")
    assert not (tmp_path / "out").exists()


@pytest.mark.unit
@pytest.mark.parametrize("path, root", [
    ("/home/me/proj/a.jpg", ""),
    ("/home/me/proj/x/../a.jpg", ""),
    ("/home/me/proj/**/x.jpg", ""),
    ("/home/me/proj/../a.jpg", "/home/me"),
    ("/home/me/other/x/a.jpg", "/home/me/other"),
    ("/data/imgs/a.jpg", "/data"),
    ("/a.jpg", "/"),
    ("/**/x.jpg", "/**"),
    ("gs://b/x/a.jpg", "gs://b"),
    ("s3://q/a.jpg", "s3://q"),
])
def test_outside_root_of_a_local_csv(path, root):
    assert outside_root("/home/me/proj", path) == root


@pytest.mark.unit
@pytest.mark.parametrize("path, root", [
    ("gs://b/dir/a.jpg", ""),
    ("gs://b/dir/sub/a.jpg", ""),
    ("gs://b/other/a.jpg", "gs://b/other"),
    ("gs://b/dir/../a.jpg", "gs://b"),
    ("gs://c/a.jpg", "gs://c"),
    ("/data/a.jpg", "/data"),
])
def test_outside_root_of_a_bucket_csv(path, root):
    assert outside_root("gs://b/dir", path) == root


@pytest.mark.unit
def test_rows_outside_counts_rows_by_root_and_leaves_allowed_ones():
    text = ("image,label\na.jpg,1\n../b.jpg,1\n/d/e/f.jpg,0\n/d/g.jpg,0\ngs://p/q.jpg,0\n"
            "gs://p/r/s.jpg,1\nnot-an-image,1\nx://t.jpg,0\n")
    resolve = lambda path: None if path.startswith("x://") else path  # noqa: E731
    assert rows_outside("/m/x.csv", text, resolve=resolve) == {"/": 1, "/d": 2, "gs://p": 2}
    assert rows_outside("/m/x.csv", text, allowed=["/d/e", "gs://p"], resolve=resolve) == {"/": 1, "/d": 1}
    assert within("/d/e/f.jpg", ["/d/e/"]) and not within("/d/ef/f.jpg", ["/d/e"])


@pytest.mark.emulator
def test_tfrecorder_style_gs_rows_are_refused_then_read_when_the_bucket_is_allowed(gcs, tmp_path):
    """gs:// rows (against the emulator): refused naming the bucket, before any lookup;
    read with --allowed_roots gs://photos (a glob row looked up literally, dead-lettered);
    a CSV on gs:// reads its own folder's rows and refuses another folder's."""
    local = tmp_path / "m"
    rows = make_csv_manifest_sample(str(local), n=6)
    gcs.upload_tree(str(local / "images"), "gs://photos/images")
    cells = [f"gs://photos/{row['image']},{row['label']},{row['split']}" for row in rows]
    csv_path = tmp_path / "list.csv"
    csv_path.write_text("\n".join(["image_uri,label,split", *cells,
                                   "gs://photos/images/*.jpg,circles,train"]) + "\n")
    env = cli_env(STORAGE_EMULATOR_HOST=gcs.url, NO_GCE_CHECK="true")
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              env=env)
    assert run.exit == EXIT_USAGE
    assert one_line(run) == (
        f"beam-tfrecords convert: error: --input {csv_path}: 7 rows of the CSV manifest name images "
        "outside its folder, under gs://photos (7 rows); they are read only when allowed: add "
        "--allowed_roots gs://photos (or --allow_paths_outside to read rows wherever they point)")
    assert not out.exists()
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              "--allowed_roots", "gs://photos", "--max_bad_fraction", "0.2", env=env)
    assert run.exit == EXIT_OK, one_line(run)
    assert records_in(out) == len(rows)
    with open(out / "dead_letter" / "listing.jsonl", encoding="utf-8") as f:
        assert [json.loads(line)["error"] for line in f] == ["missing_file"]
    # A CSV on gs://: its own folder's rows are inside; another folder of the bucket is a root.
    inside = [f"images/{row['image'].split('/')[-1]},{row['label']},{row['split']}" for row in rows]
    gcs.upload_bytes("gs://photos/list.csv", ("image,label,split\n" + "\n".join(inside) + "\n").encode())
    run = cli(tmp_path, "convert", "--input", "gs://photos/list.csv", "--output", str(tmp_path / "out2"),
              "--progress", "off", env=env)
    assert run.exit == EXIT_OK, one_line(run)
    assert records_in(tmp_path / "out2") == len(rows)
    gcs.upload_bytes("gs://photos/lists/list.csv",
                     ("image,label,split\n" + "\n".join(cells) + "\n").encode())
    run = cli(tmp_path, "convert", "--input", "gs://photos/lists/list.csv", "--output",
              str(tmp_path / "out3"), "--progress", "off", env=env)
    assert run.exit == EXIT_USAGE
    assert "6 rows of the CSV manifest name images outside its folder, under gs://photos/images " \
           "(6 rows);" in one_line(run)
    assert not (tmp_path / "out3").exists()


@pytest.mark.e2e
def test_a_csv_manifests_bad_rows_are_dead_lettered_without_their_text(tmp_path):
    """Broken quoting, an unknown label and a cell that names no image: each costs its
    row, and the secret those rows hold reaches no file of the output and no line printed."""
    secret = "SECRET-5b1e-hunter2@example.com"
    csv_path, rows = csv_manifest(tmp_path, [])
    with open(csv_path, "a", encoding="utf-8") as f:
        f.write(f'images/000.jpg,circles,train,0.5,1,"{secret} never closed\n')
        f.write(f"images/001.png,{secret},train,0.5,2,note\n")
        f.write(f"{secret},circles,train,0.5,3,note\n")
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(csv_path), "--output", str(out), "--progress", "off",
              "--max_bad_fraction", "0.5", "--labels", str(_labels_file(tmp_path)))
    assert run.exit == EXIT_OK, one_line(run)
    assert records_in(out) == len(rows)
    with open(out / "dead_letter" / "listing.jsonl", encoding="utf-8") as f:
        letters = [json.loads(line) for line in f]
    assert sorted(d["error"] for d in letters) == ["bad_quoting", "not_an_image_path", "unknown_class"]
    leaks = [str(p) for p in out.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert not leaks and secret not in run.stdout + run.stderr, leaks


def _labels_file(work: Path) -> Path:
    path = work / "labels.txt"
    path.write_text("circles\nsquares\nstripes\ntriangles\n", encoding="utf-8")
    return path
