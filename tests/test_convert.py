"""Whole conversions: size band, byte-identical reruns, bad input, overwrite, gzip."""

import gzip
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from tests.conftest import dead_letters, load_manifest, read_dataset, sha256_file

pytestmark = pytest.mark.e2e

MB = 1_000_000


def _noisy_jpegs(root, count, seed=0):
    """JPEGs of ~100 KB each in 4 class folders (noise keeps them large)."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        cls = f"class{i % 4}"
        width, height = int(rng.integers(300, 420)), int(rng.integers(200, 300))
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        Image.fromarray(pixels).save(os.path.join(root, cls, f"{i:04d}.jpg"), quality=85)


@pytest.fixture(scope="module")
def ten_mb_of_images(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("band") / "in")
    _noisy_jpegs(root, 140)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)
    assert 8 * MB < total < 14 * MB
    return root


def _shard_digests(output):
    return {
        name: sha256_file(os.path.join(output, name))
        for name in sorted(os.listdir(output)) if ".tfrecord" in name and not name.endswith(".idx")
    }


def test_every_shard_inside_the_band(ten_mb_of_images, tmp_path, run_convert):
    out = str(tmp_path / "out")
    result = run_convert(ten_mb_of_images, out, shard_min_mb=1, shard_max_mb=2)
    assert result.ok, result.report
    sizes = {name: os.path.getsize(os.path.join(out, name)) for name in _shard_digests(out)}
    assert len(sizes) >= 5
    for name, size in sizes.items():
        assert 1 * MB <= size <= 2 * MB, (name, size)
    manifest = load_manifest(out)
    assert manifest["splits"]["train"]["shards_outside_band"] == []
    assert manifest["splits"]["train"]["records"] == 140
    # Classes mix across shards: no shard holds a single class.
    for examples in read_dataset(out).values():
        assert len({e["image/class/label"][0] for e in examples}) > 1


def test_two_runs_give_byte_identical_shards(ten_mb_of_images, tmp_path, run_convert):
    first, second = str(tmp_path / "a"), str(tmp_path / "b")
    assert run_convert(ten_mb_of_images, first, shard_min_mb=1, shard_max_mb=2).ok
    # Different concurrency must not change a byte.
    assert run_convert(
        ten_mb_of_images, second, shard_min_mb=1, shard_max_mb=2, read_threads=1,
        beam_args=["--direct_num_workers=2", "--direct_running_mode=multi_threading"],
    ).ok
    digests = _shard_digests(first)
    assert len(digests) >= 5
    assert digests == _shard_digests(second)
    shards_a = load_manifest(first)["splits"]
    shards_b = load_manifest(second)["splits"]
    assert shards_a == shards_b


def _make_bad_inputs(root):
    """4 bad images and one ignorable text file beside 40 good images."""
    make_class_folder_sample(root, per_class=10, splits=None)
    with open(os.path.join(root, "circles", "circles_0000.jpg"), "rb") as f:
        jpeg = f.read()
    with open(os.path.join(root, "squares", "squares_0001.png"), "rb") as f:
        png = f.read()
    bad = {
        "circles/truncated.jpg": jpeg[: len(jpeg) // 2],
        "squares/truncated.png": png[: len(png) // 2],
        "stripes/empty.jpg": b"",
        "triangles/notes.jpg": b"this is a text file, not a JPEG\n",
    }
    for rel, data in bad.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    with open(os.path.join(root, "circles", "notes.txt"), "w") as f:
        f.write("ignored\n")
    return bad


EXPECTED_REASONS = {
    "circles/truncated.jpg": "truncated_jpeg",
    "squares/truncated.png": "truncated_png",
    "stripes/empty.jpg": "empty_file",
    "triangles/notes.jpg": "not_an_image",
}




def test_bad_inputs_go_to_the_dead_letter_within_budget(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _make_bad_inputs(root)
    code = main(["convert", "--input", root, "--output", out, "--max_bad_fraction", "0.1"])
    assert code == 0, capsys.readouterr()

    written = {
        e["image/filename"][0].decode() for examples in read_dataset(out).values() for e in examples
    }
    assert len(written) == 40
    assert not written & set(EXPECTED_REASONS)
    letters = dead_letters(out)
    by_source = {d["source"]: d for d in letters}  # Relative to the input root.
    assert set(by_source) == set(EXPECTED_REASONS)
    for rel, reason in EXPECTED_REASONS.items():
        letter = by_source[rel]
        assert letter["error"] == reason
        assert letter["stage"] == "validate"
        assert letter["message"]
    manifest = load_manifest(out)
    assert manifest["bad_records"]["by_reason"] == {r: 1 for r in EXPECTED_REASONS.values()}
    assert manifest["bad_records"]["total"] == 4
    assert manifest["input"]["ignored_files"] == 2  # README.txt and notes.txt
    assert manifest["error_budget"]["exceeded"] is False
    assert "bad inputs: 4 of 44" in capsys.readouterr().out


def test_bad_inputs_beyond_budget_fail_the_run_and_publish_nothing(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _make_bad_inputs(root)
    code = main(["convert", "--input", root, "--output", out])  # Default budget: 1%.
    assert code == 1
    assert "ERROR BUDGET EXCEEDED" in capsys.readouterr().out
    # A manifest means complete and within budget: none here, and no shard at a final
    # name; the dead letters and the report say what went wrong.
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert not [name for name in os.listdir(out) if ".tfrecord" in name]
    assert len(dead_letters(out)) == 4
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        report = json.load(f)
    assert report["status"] == "error_budget_exceeded"
    assert report["records"] == 40 and report["error_budget"]["exceeded"] is True
    # No temporaries and no lock are left; only the journal, which records the report
    # and the dead letters (so that the next run can prove them its own and remove them).
    work = os.path.join(out, ".beam-tfrecords")
    assert os.listdir(work) == ["journal"]
    recorded = set()
    for name in os.listdir(os.path.join(work, "journal")):
        with open(os.path.join(work, "journal", name), encoding="utf-8") as f:
            recorded |= {claim["path"] for claim in json.load(f)["claims"]}
    assert recorded == {"run_report.json", *report["dead_letter_files"]}


def _record_offsets(path):
    """(index, offset, length) of each record, walking the framing by hand."""
    with open(path, "rb") as f:
        data = f.read()
    out, offset, index = [], 0, 0
    while offset < len(data):
        length = int.from_bytes(data[offset:offset + 8], "little")
        out.append((index, offset, length))
        offset += 16 + length
        index += 1
    return out


def test_verify_names_shard_record_and_offset(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=12, splits=None, size_range=(120, 200))
    assert main(["convert", "--input", root, "--output", out,
                 "--shard_min_mb", "0.2", "--shard_max_mb", "0.4"]) == 0
    assert main(["verify", out]) == 0
    shards = sorted(n for n in os.listdir(out) if n.endswith(".tfrecord"))
    assert len(shards) >= 3
    flipped, truncated = shards[0], shards[1]

    index, offset, length = _record_offsets(os.path.join(out, flipped))[2]
    with open(os.path.join(out, flipped), "r+b") as f:
        f.seek(offset + 12 + length // 2)
        byte = f.read(1)
        f.seek(-1, io.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    cut_index, cut_offset, cut_length = _record_offsets(os.path.join(out, truncated))[1]
    with open(os.path.join(out, truncated), "r+b") as f:
        f.truncate(cut_offset + 12 + cut_length // 2)
    capsys.readouterr()

    assert main(["verify", out]) == 1
    report = capsys.readouterr().out
    flipped_line = next(line for line in report.splitlines() if flipped in line)
    assert "FAIL" in flipped_line
    assert f"record {index} at byte offset {offset}" in flipped_line
    assert "data CRC mismatch" in flipped_line
    truncated_line = next(line for line in report.splitlines() if truncated in line)
    assert "FAIL" in truncated_line
    assert f"record {cut_index} at byte offset {cut_offset}" in truncated_line
    assert "ends inside the record" in truncated_line
    assert sum("OK" in line.split()[:1] for line in report.splitlines()) == len(shards) - 2

    # Without the manifest the folder is not a dataset: verify fails it, and on request
    # CRC-scans the files, still finding both faults.
    os.remove(os.path.join(out, "manifest.json"))
    assert main(["verify", out]) == 1
    assert "no manifest.json: not a finished dataset" in capsys.readouterr().out
    assert main(["verify", out, "--scan_only"]) == 1
    report = capsys.readouterr().out
    assert "CRC scan" in report
    assert f"record {index} at byte offset {offset}" in report
    assert f"record {cut_index} at byte offset {cut_offset}" in report


def test_existing_dataset_is_refused_unless_overwrite(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=6, splits=None, size_range=(120, 200))
    assert main(["convert", "--input", root, "--output", out,
                 "--shard_min_mb", "0.05", "--shard_max_mb", "0.1"]) == 0
    first = set(_shard_digests(out))
    assert len(first) >= 3

    assert main(["convert", "--input", root, "--output", out]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert set(_shard_digests(out)) == first  # Untouched.

    assert main(["convert", "--input", root, "--output", out, "--overwrite"]) == 0
    after = set(_shard_digests(out))
    assert after == {"train-00000-of-00001.tfrecord"}  # Old shards removed.
    assert main(["verify", out]) == 0


def test_gzip_shards(tmp_path, run_convert):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=3, splits=None)
    result = run_convert(root, out, compression="gzip")
    assert result.ok, result.report
    names = sorted(n for n in os.listdir(out) if ".tfrecord" in n)
    assert names == ["train-00000-of-00001.tfrecord.gz"]
    with open(os.path.join(out, names[0]), "rb") as f:
        raw = f.read()
    assert raw[:2] == b"\x1f\x8b"
    records = list(iter_records(io.BytesIO(gzip.decompress(raw))))
    assert len(records) == 12
    shard = load_manifest(out)["splits"]["train"]["shards"][0]
    assert shard["bytes"] == len(raw)
    assert shard["sha256"] == sha256_file(os.path.join(out, names[0]))
    assert main(["verify", out]) == 0


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--shard_min_mb", "5", "--shard_max_mb", "2"], "--shard_max_mb"),
        (["--max_bad_fraction", "2"], "--max_bad_fraction"),
        (["--shard_max_md", "2"], "did you mean --shard_max_mb"),
        (["--runer", "DirectRunner"], "did you mean --runner"),
        (["--layout", "folders"], "--layout"),
    ],
)
def test_bad_flags_fail_fast(tmp_path, capsys, flags, message):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=1, splits=None)
    code = main(["convert", "--input", root, "--output", str(tmp_path / "out"), *flags])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "manifest.json")


def test_missing_input_fails_fast(tmp_path, capsys):
    code = main(["convert", "--input", str(tmp_path / "nothing"), "--output", str(tmp_path / "out")])
    assert code == 2
    assert "no files match" in capsys.readouterr().err


def test_default_validation_catches_garbled_scan_data_that_headers_lets_through(tmp_path, run_convert):
    root = tmp_path / "in"
    make_class_folder_sample(str(root), per_class=2, splits=None, formats=("jpeg",))
    with open(root / "circles" / "circles_0000.jpg", "rb") as f:
        data = f.read()
    sos = data.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    garbage = np.random.default_rng(7).bytes(len(data) - 2 - scan).replace(b"\xff\xd9", b"\xff\x00")
    (root / "circles" / "garbled.jpg").write_bytes(data[:scan] + garbage + b"\xff\xd9")

    headers = run_convert(str(root), str(tmp_path / "headers"), validate="headers", max_bad_fraction=0.5)
    assert headers.ok and headers.report.records == 9  # Headers and markers only: let through.
    for mode in ("structure", "decode"):  # The default, and the full decode, refuse it.
        run = run_convert(str(root), str(tmp_path / mode), validate=mode, max_bad_fraction=0.5)
        assert run.ok and run.report.records == 8, mode
        assert run.report.bad_records == {"decode_error": 1}, mode
        letters = dead_letters(str(tmp_path / mode))
        assert [os.path.basename(d["source"]) for d in letters] == ["garbled.jpg"], mode


def test_no_convertible_image_fails_without_manifest(tmp_path, capsys):
    root = tmp_path / "in" / "cats"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("not an image\n")
    (root / "empty.jpg").write_bytes(b"")
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(tmp_path / "in"), "--output", out,
                 "--max_bad_fraction", "1"]) == 1
    assert "NO RECORDS WRITTEN" in capsys.readouterr().out
    assert not os.path.exists(os.path.join(out, "manifest.json"))
    assert len(dead_letters(out)) == 1


def test_verify_fails_what_is_not_a_finished_dataset(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    assert main(["verify", missing]) == 2
    assert capsys.readouterr().err == f"beam-tfrecords verify: error: {missing} does not exist\n"
    assert main(["verify", missing + "/*.tfrecord"]) == 2
    assert capsys.readouterr().err == (f"beam-tfrecords verify: error: no files match "
                                       f"{missing}/*.tfrecord\n")
    (tmp_path / "empty").mkdir()
    assert main(["verify", str(tmp_path / "empty")]) == 1
    assert "holds no files" in capsys.readouterr().out
    # Shards without a manifest (a run that never finished): not a dataset.
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=3, splits=None)
    assert main(["convert", "--input", root, "--output", out]) == 0
    os.remove(os.path.join(out, "manifest.json"))
    assert main(["verify", out]) == 1
    printed = capsys.readouterr().out
    assert "FAIL  no manifest.json" in printed and "not verified" in printed
    assert main(["verify", out, "--scan_only"]) == 0


def test_every_gzip_fault_is_reported_not_raised(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    make_class_folder_sample(root, per_class=3, splits=None)
    assert main(["convert", "--input", root, "--output", out, "--compression", "gzip"]) == 0
    (shard,) = [os.path.join(out, n) for n in os.listdir(out) if n.endswith(".tfrecord.gz")]
    with open(shard, "rb") as f:
        data = bytearray(f.read())
    failures = set()
    for position in range(20, len(data) - 8, max(1, len(data) // 40)):  # Inside the deflate stream.
        damaged = bytearray(data)
        damaged[position] ^= 0x55
        with open(shard, "wb") as f:
            f.write(damaged)
        assert main(["verify", out]) == 1
        printed = capsys.readouterr().out
        assert "Traceback" not in printed
        failures.add(next(line for line in printed.splitlines() if "FAIL" in line).split(":")[0])
    assert failures  # Every flip failed verification with a FAIL line, none raised.
