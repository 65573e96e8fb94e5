"""Scheduled runs: input fingerprints, --skip_unchanged, --incremental parts, {date}.

Every test runs the real CLI (in-process, or a killed subprocess) and checks what a
scheduler and a reader see: exit statuses, the files of the output byte for byte
(mtimes and SHA-256 before and after), the records every shard holds, and what
``verify`` says.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.schemas.inputs import SKIPPED_EXIT_STATUS, decode_inputs
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.tfrecord import iter_records
from beam_tfrecords.verify import dataset_shards, verify_dataset
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

QUIET = ["--progress", "off"]


def _png(path: str, seed: int, side: int = 12) -> None:
    """A stored (uncompressed) PNG: changing a pixel keeps its size."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, compress_level=0)


def _add_images(root: str, count: int, first: int = 0, classes=("cat", "dog")) -> list[str]:
    names = []
    for i in range(first, first + count):
        name = f"{classes[i % len(classes)]}/{i:05d}.png"
        _png(os.path.join(root, name), seed=i)
        names.append(name)
    return names


def _same_size_edit(path: str, keep_time: bool = False) -> None:
    before = os.stat(path)
    image = np.array(Image.open(path))
    image[0, 0] = 255 - image[0, 0]
    Image.fromarray(image).save(path, compress_level=0)
    assert os.path.getsize(path) == before.st_size
    if keep_time:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def _snapshot(folder: str) -> dict[str, tuple[int, str]]:
    """Every file under ``folder`` (hidden ones too): mtime and SHA-256."""
    out = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = (os.stat(path).st_mtime_ns,
                                                      hashlib.sha256(f.read()).hexdigest())
    return out


def _filenames(output: str, split: str | None = None) -> list[str]:
    """``image/filename`` of every record a reader of the whole dataset sees."""
    names = []
    for path in dataset_shards(output, split):
        with open(path, "rb") as f:
            for record in iter_records(io.BytesIO(f.read())):
                names.append(example_to_dict(record)["image/filename"][0].decode())
    return names


def _convert(capsys, *flags) -> tuple[int, str]:
    code = main(["convert", *flags, *QUIET])
    return code, capsys.readouterr().out


def _manifest(output: str) -> dict:
    with open(os.path.join(output, "manifest.json"), encoding="utf-8") as f:
        return json.load(f)


@pytest.mark.e2e
def test_skip_unchanged_exits_99_and_touches_nothing(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 40)
    code, _ = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    assert code == 0
    entries = decode_inputs(open(os.path.join(out, "inputs.jsonl"), "rb").read())
    assert len(entries) == 40 and all(e.sha256 and e.mtime_ns for e in entries)
    manifest = _manifest(out)
    assert manifest["input"]["files_list"]["files"] == 40
    assert manifest["input"]["files_list"]["sha256"] == hashlib.sha256(
        open(os.path.join(out, "inputs.jsonl"), "rb").read()).hexdigest()
    before = _snapshot(out)
    start = time.monotonic()
    code, printed = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    wall = time.monotonic() - start
    assert code == SKIPPED_EXIT_STATUS == 99
    assert printed.strip().splitlines()[-1].startswith("SKIPPED: input unchanged since")
    assert _snapshot(out) == before, "a skipped run changed the output"
    print(f"[figure] skipped run: exit {code}, {wall:.2f} s in-process, "
          f"{len(before)} output files unchanged (mtime and sha256)")
    # A touch moves the time, not the content: still skipped.
    os.utime(os.path.join(root, "cat/00000.png"))
    code, printed = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    assert code == 99 and "1 with a new time but the same content" in printed
    assert _snapshot(out) == before
    # A shard gone from the output: the dataset is not what its manifest says, so no skip.
    shard = os.path.join(out, "train-00000-of-00001.tfrecord")
    os.rename(shard, shard + ".away")
    code, printed = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    assert code == 2, printed
    assert f"shard {shard} is missing): a full run" in printed
    os.rename(shard + ".away", shard)


@pytest.mark.e2e
def test_same_size_edit_is_seen_by_skip_and_converted_by_incremental(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 30)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    _same_size_edit(os.path.join(root, "dog/00007.png"))
    # --skip_unchanged sees it: a full run, which must be allowed to replace the dataset.
    code, _ = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    captured = capsys.readouterr()
    assert code == 2
    before = _snapshot(out)
    # --incremental converts exactly that file, reported as changed.
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
    assert code == 0, printed
    assert "1 changed" in printed and "dog/00007.png" in printed and "full run" in printed
    assert _filenames(os.path.join(out, "part-00001")) == ["dog/00007.png"]
    report = json.load(open(os.path.join(out, "run_report.json")))
    assert report["update"]["inputs"]["changed"] == 1
    assert report["update"]["changed_files"] == ["dog/00007.png"]
    assert all(_snapshot(out)[name] == value for name, value in before.items()
               if name.endswith(".tfrecord")), "the first run's shards changed"
    assert verify_dataset(out).ok
    # The full run replaces the dataset (and its part).
    code, printed = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged", "--overwrite")
    assert code == 0 and not os.path.exists(os.path.join(out, "part-00001"))
    assert sorted(_filenames(out)) == sorted(_add_images(str(tmp_path / "scratch"), 30))
    del captured


@pytest.mark.e2e
def test_content_fingerprint_sees_an_edit_that_kept_the_time(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 10)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    _same_size_edit(os.path.join(root, "cat/00004.png"), keep_time=True)
    # Size and time are unchanged: stat fingerprints trust them (documented) ...
    code, _ = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    assert code == 99
    # ... content fingerprints read every file and see it.
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental",
                             "--fingerprint", "content")
    assert code == 0 and "1 changed" in printed
    assert _filenames(os.path.join(out, "part-00001")) == ["cat/00004.png"]


@pytest.mark.e2e
def test_three_incremental_runs_make_three_verified_parts(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    names = _add_images(root, 60)
    assert _convert(capsys, "--input", root, "--output", out, "--incremental")[0] == 0  # First: full.
    first = _snapshot(out)
    for number, count in enumerate((100, 50, 25), 1):
        added = _add_images(root, count, first=len(names))
        names += added
        code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
        assert code == 0, printed
        part = os.path.join(out, f"part-{number:05d}")
        assert sorted(_filenames(part)) == sorted(added)
        assert verify_dataset(part).ok
    manifest = _manifest(out)
    assert [p["path"] for p in manifest["parts"]] == ["part-00001", "part-00002", "part-00003"]
    assert [p["records"] for p in manifest["parts"]] == [100, 50, 25]
    assert manifest["dataset"]["records"] == 235 == 60 + 175
    seen = _filenames(out)
    assert len(seen) == len(set(seen)) == 235 and set(seen) == set(names)
    report = verify_dataset(out)
    assert report.ok and len(report.checks) == 4
    assert all(_snapshot(out)[name] == value for name, value in first.items()
               if name.endswith(".tfrecord")), "an incremental run rewrote the first run's shards"
    # Nothing new: skipped, exit 99, nothing written.
    before = _snapshot(out)
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
    assert code == 99 and _snapshot(out) == before
    # Deleted inputs are reported; their records stay until a full run.
    os.remove(os.path.join(root, names[3]))
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
    assert code == 99 and "1 deleted" in printed and names[3] in printed
    assert len(_filenames(out)) == 235
    # A full run drops the parts and the deleted file's record.
    assert _convert(capsys, "--input", root, "--output", out, "--overwrite")[0] == 0
    assert not [n for n in os.listdir(out) if n.startswith("part-")]
    assert len(_filenames(out)) == 234 and "parts" not in _manifest(out)


@pytest.mark.e2e
def test_incremental_refuses_what_only_a_full_run_can_do(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 20)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    before = _snapshot(out)
    _add_images(root, 3, first=100, classes=("bird",))
    code = main(["convert", "--input", root, "--output", out, "--incremental", *QUIET])
    err = capsys.readouterr().err
    assert code == 2 and "classes not in the dataset appeared (bird)" in err and "full run" in err
    shutil.rmtree(os.path.join(root, "bird"))
    code = main(["convert", "--input", root, "--output", out, "--incremental", "--compression",
                 "gzip", *QUIET])
    err = capsys.readouterr().err
    assert code == 2 and "options that shape the records changed (compression)" in err
    # Options that do not shape records (threads, budget) are not a change.
    code = main(["convert", "--input", root, "--output", out, "--skip_unchanged", "--read_threads",
                 "2", "--max_bad_fraction", "0.5", *QUIET])
    assert code == 99
    assert _snapshot(out) == before


@pytest.mark.e2e
def test_killed_between_part_and_manifest_then_next_run_redoes_the_part(tmp_path, capsys):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 20)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    _add_images(root, 10, first=20)
    hold_dir = tmp_path / "hold"
    hold_dir.mkdir()
    env = dict(os.environ, BEAM_TFRECORDS_HOLD_AT="before_register", BEAM_TFRECORDS_HOLD_DIR=str(hold_dir),
               BEAM_TFRECORDS_TEST_HOOKS="1")
    proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", "--input", root,
                             "--output", out, "--incremental", *QUIET], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (hold_dir / "before_register").exists():
            assert proc.poll() is None, "convert ended before the hold point"
            assert time.monotonic() < deadline, "convert did not reach before_register"
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # The part is published in its folder, but the dataset does not list it; the
    # dataset's journal recorded the folder before the run created it (issue 18).
    assert os.path.exists(os.path.join(out, "part-00001", "manifest.json"))
    assert "parts" not in _manifest(out)
    journal = os.path.join(out, ".beam-tfrecords", "journal")
    recorded = []
    for name in os.listdir(journal):
        with open(os.path.join(journal, name), encoding="utf-8") as f:
            recorded += [claim["path"] for claim in json.load(f)["claims"]]
    assert recorded == ["part-00001/"]
    assert len(_filenames(out)) == 20
    report = verify_dataset(out)
    assert not report.ok and any("does not list" in c.error for c in report.checks)
    # The next run takes over the dead run's lock, removes the folder and redoes the part.
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
    assert code == 0, printed
    assert [p["path"] for p in _manifest(out)["parts"]] == ["part-00001"]
    seen = _filenames(out)
    assert len(seen) == len(set(seen)) == 30 and verify_dataset(out).ok


@pytest.mark.e2e
def test_table_skip_and_incremental_by_file(tmp_path, capsys):
    folder, out = tmp_path / "rows", str(tmp_path / "out")
    folder.mkdir()

    def write(name: str, first: int, count: int) -> None:
        with open(folder / name, "w", encoding="utf-8") as f:
            f.write("id,value,name\n")
            for i in range(first, first + count):
                f.write(f"{i},{i * 0.5},n{i}\n")

    write("a.csv", 0, 100)
    pattern = str(folder / "*.csv")
    assert _convert(capsys, "--input", pattern, "--output", out)[0] == 0
    assert _convert(capsys, "--input", pattern, "--output", out, "--skip_unchanged")[0] == 99
    os.utime(folder / "a.csv")
    assert _convert(capsys, "--input", pattern, "--output", out, "--skip_unchanged")[0] == 99
    write("b.csv", 100, 40)
    code, printed = _convert(capsys, "--input", pattern, "--output", out, "--incremental")
    assert code == 0, printed
    manifest = _manifest(out)
    assert manifest["parts"][0]["records"] == 40 and manifest["dataset"]["records"] == 140
    ids = []
    for path in dataset_shards(out):
        with open(path, "rb") as f:
            ids += [example_to_dict(r)["id"][0] for r in iter_records(io.BytesIO(f.read()))]
    assert sorted(ids) == list(range(140))
    assert verify_dataset(out).ok


@pytest.mark.e2e
def test_date_templates_make_one_part_per_landing_day(tmp_path, capsys):
    landing, out = tmp_path / "landing", str(tmp_path / "out")
    _add_images(str(landing / "2026-11-21"), 12)
    _add_images(str(landing / "2026-11-22"), 8)  # The same file names, another day.
    flags = ["--input", str(landing / "{date}"), "--output", out, "--incremental"]
    assert _convert(capsys, *flags, "--date", "2026-11-21")[0] == 0
    code, printed = _convert(capsys, *flags, "--date", "2026-11-22")
    assert code == 0, printed
    manifest = _manifest(out)
    assert manifest["input"]["root"].endswith("2026-11-21")
    assert manifest["parts"][0]["input_root"].endswith("2026-11-22")
    assert manifest["dataset"]["records"] == 20
    assert _convert(capsys, *flags, "--date", "2026-11-22")[0] == 99
    code = main(["convert", "--input", str(landing / "{day}"), "--output", out, *QUIET])
    assert code == 2 and "'day' is not a placeholder" in capsys.readouterr().err
    code = main(["convert", *flags, "--date", "22/11/2026", *QUIET])
    assert code == 2 and "--date must be a day as YYYY-MM-DD" in capsys.readouterr().err


@pytest.mark.emulator
def test_gcs_inputs_are_fingerprinted_from_the_listing(gcs, tmp_path, capsys):
    local = str(tmp_path / "in")
    _add_images(local, 6)
    gcs.upload_tree(local, "gs://b/fp-in")
    out = str(tmp_path / "out")
    assert _convert(capsys, "--input", "gs://b/fp-in", "--output", out)[0] == 0
    entries = decode_inputs(open(os.path.join(out, "inputs.jsonl"), "rb").read())
    assert len(entries) == 6 and all(e.crc32c and e.generation and not e.mtime_ns for e in entries)
    assert _convert(capsys, "--input", "gs://b/fp-in", "--output", out, "--skip_unchanged")[0] == 99
    # Rewritten with the same bytes: a new generation, the same crc32c: unchanged.
    with open(os.path.join(local, "cat/00000.png"), "rb") as f:
        gcs.overwrite_object("gs://b/fp-in/cat/00000.png", f.read())
    assert _convert(capsys, "--input", "gs://b/fp-in", "--output", out, "--skip_unchanged")[0] == 99
    _same_size_edit(os.path.join(local, "cat/00000.png"))
    with open(os.path.join(local, "cat/00000.png"), "rb") as f:
        gcs.overwrite_object("gs://b/fp-in/cat/00000.png", f.read())
    code, printed = _convert(capsys, "--input", "gs://b/fp-in", "--output", out, "--incremental")
    assert code == 0 and "1 changed" in printed
    assert _filenames(os.path.join(out, "part-00001")) == ["cat/00000.png"]


@pytest.mark.e2e
def test_a_run_planned_before_another_finished_is_refused(tmp_path, capsys):
    """Two incremental runs at once: the one that planned on the old dataset must not
    write the part number the other one just published (it would remove it)."""
    from beam_tfrecords.pipeline import OutputBusy
    from beam_tfrecords.preflight import plan_run, take_output
    from beam_tfrecords.schemas.config import ConvertConfig
    from beam_tfrecords.transforms.image_steps import drop_listing

    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 10)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    added = _add_images(root, 5, first=10)
    slow = plan_run(ConvertConfig(input=root, output=out, incremental=True))
    assert slow.update.action == "part" and slow.update.part == "part-00001"
    assert _convert(capsys, "--input", root, "--output", out, "--incremental")[0] == 0
    with pytest.raises(OutputBusy, match="another run changed the dataset"):
        take_output(slow)
    drop_listing(slow.listing)
    assert not os.path.exists(os.path.join(out, ".beam-tfrecords", "lock.json"))
    assert sorted(_filenames(os.path.join(out, "part-00001"))) == sorted(added)
    assert verify_dataset(out).ok


@pytest.mark.e2e
def test_csv_image_manifest_edits_are_seen(tmp_path, capsys):
    """An edited label in a CSV image manifest (auto layout) is a change; an incremental
    run takes appended rows only, and refuses rows that changed."""
    images = str(tmp_path / "img")
    names = _add_images(images, 6)
    manifest, out = tmp_path / "m.csv", str(tmp_path / "out")
    manifest.write_text("image,label\n" + "".join(f"{images}/{n},{n.split('/')[0]}\n" for n in names[:4]))
    assert _convert(capsys, "--input", str(manifest), "--output", out)[0] == 0
    with open(manifest, "a", encoding="utf-8") as f:
        f.write("".join(f"{images}/{n},{n.split('/')[0]}\n" for n in names[4:]))
    code, printed = _convert(capsys, "--input", str(manifest), "--output", out, "--incremental")
    assert code == 0, printed
    assert len(_filenames(os.path.join(out, "part-00001"))) == 2
    manifest.write_text(manifest.read_text().replace(",cat\n", ",dog\n", 1))
    code = main(["convert", "--input", str(manifest), "--output", out, "--incremental", *QUIET])
    assert code == 2 and "existing rows changed" in capsys.readouterr().err
    before = _snapshot(out)
    code = main(["convert", "--input", str(manifest), "--output", out, "--skip_unchanged", *QUIET])
    assert code == 2 and "changed" in capsys.readouterr().err and _snapshot(out) == before


@pytest.mark.unit
def test_stray_words_and_refused_combinations(tmp_path, capsys):
    code = main(["convert", "--input", str(tmp_path / "a.csv"), str(tmp_path / "b.csv"),
                 "--output", str(tmp_path / "o")])
    assert code == 2 and "unexpected arguments" in capsys.readouterr().err
    for flags, text in ((["--sequence_key", "k"], "cannot add to sequences"),
                        (["--fail_on_leakage", "--splits", "train=1"], "cannot see the older parts"),
                        (["--date", "20261121"], "--date must be a day as YYYY-MM-DD")):
        code = main(["convert", "--input", str(tmp_path), "--output", str(tmp_path / "o"),
                     "--incremental", *flags])
        assert code == 2 and text in capsys.readouterr().err, flags


@pytest.mark.e2e
def test_a_file_arriving_while_a_multi_process_run_starts_is_left_for_the_next_run(tmp_path, capsys):
    """Listing steps in other processes (Dataflow, the multi-process DirectRunner)
    take the preflight's listing: the run converts what its plan and inputs.jsonl
    say, and the next incremental run adds the late file once (before, the step
    listed again: 21 records against 20 lines, and the next run added it twice)."""
    from beam_tfrecords.pipeline import convert
    from beam_tfrecords.schemas.config import ConvertConfig

    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    names = _add_images(root, 20)

    def arrives(plan):
        assert plan.listing_path and plan.listing_path.startswith(out)
        _add_images(root, 1, first=20)

    result = convert(ConvertConfig(input=root, output=out, incremental=True),
                     ["--direct_running_mode=multi_processing", "--direct_num_workers=2"], on_plan=arrives)
    assert result.ok, result.report
    assert sorted(_filenames(out)) == sorted(names)
    with open(os.path.join(out, "inputs.jsonl"), "rb") as f:
        listed = [entry.path for entry in decode_inputs(f.read())]
    assert sorted(listed) == sorted(names)
    left = [name for _, _, found in os.walk(out) for name in found if name == "listing.arrow"]
    assert not left, "the handed-over listing outlived the run"
    code, printed = _convert(capsys, "--input", root, "--output", out, "--incremental")
    assert code == 0, printed
    seen = _filenames(out)
    assert len(seen) == len(set(seen)) == 21 and sorted(_filenames(os.path.join(out, "part-00001"))) == ["cat/00020.png"]


@pytest.mark.e2e
def test_names_holding_unicode_line_separators_are_one_line_each(tmp_path, capsys):
    """inputs.jsonl writes U+2028, U+2029 and U+0085 as they are: the commit and the
    skip check split lines at '\\n' only (before: every such run failed at the commit)."""
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    names = _add_images(root, 4) + ["cat/a\u2028b.png", "dog/n\x85l.png", "dog/p\u2029q.png"]
    for seed, name in enumerate(names[4:], 100):
        _png(os.path.join(root, name), seed=seed)
    code, printed = _convert(capsys, "--input", root, "--output", out)
    assert code == 0, printed
    with open(os.path.join(out, "inputs.jsonl"), "rb") as f:
        data = f.read()
    assert data.count(b"\n") == 7 and sorted(e.path for e in decode_inputs(data)) == sorted(names)
    assert sorted(_filenames(out)) == sorted(names)
    code, printed = _convert(capsys, "--input", root, "--output", out, "--skip_unchanged")
    assert code == SKIPPED_EXIT_STATUS, printed


@pytest.mark.e2e
@pytest.mark.parametrize("mode", [[], ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]])
def test_a_dry_run_on_the_direct_runner_runs_and_writes_nothing(tmp_path, capsys, mode):
    """--dry_run=True builds and checks the pipeline; on the DirectRunner (which
    would run it) it is not run, and the output is not touched: no lock, the last
    run's report and dead letters stay (before: in-process it wrote a whole
    dataset while saying it did not; multi-process it failed)."""
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _add_images(root, 6)
    assert _convert(capsys, "--input", root, "--output", out)[0] == 0
    before = _snapshot(out)
    _add_images(root, 2, first=6)
    code, printed = _convert(capsys, "--input", root, "--output", out, "--overwrite", "--dry_run=True", *mode)
    assert code == 0 and "dry run: the job was built and checked, not run" in printed, printed
    assert _snapshot(out) == before
    code, printed = _convert(capsys, "--input", root, "--output", str(tmp_path / "new"), "--dry_run=True", *mode)
    assert code == 0 and not os.path.exists(tmp_path / "new"), printed
    code = main(["convert", "--input", root, "--output", out, "--dry_run=True", *mode, *QUIET])
    assert code == 2 and "already holds a dataset" in capsys.readouterr().err


@pytest.mark.e2e
def test_an_input_the_dataset_refused_before_is_not_counted_again_in_a_part(tmp_path, capsys):
    """A CSV manifest row for a missing file is dead-lettered by the first run; each
    incremental part lists the manifest again and used to dead-letter and count it
    again, so a part of one new image went over the budget (1 bad of 2) for ever."""
    images = str(tmp_path / "img")
    names = _add_images(images, 10)
    manifest, out = tmp_path / "m.csv", str(tmp_path / "out")
    rows = [f"{images}/{n},{n.split('/')[0]}\n" for n in names]
    manifest.write_text("image,label\n" + "".join(rows[:9]) + f"{images}/cat/gone.png,cat\n")
    code, printed = _convert(capsys, "--input", str(manifest), "--output", out, "--max_bad_fraction", "0.2")
    assert code == 0, printed
    with open(manifest, "a", encoding="utf-8") as f:
        f.write(rows[9])
    code, printed = _convert(capsys, "--input", str(manifest), "--output", out, "--incremental",
                             "--max_bad_fraction", "0.2")
    assert code == 0, printed
    assert "1 input(s) refused while listing were refused by the dataset before" in printed
    part = os.path.join(out, "part-00001")
    (only,) = _filenames(part)
    assert only.endswith("/img/" + names[9])
    assert not os.path.exists(os.path.join(part, "dead_letter", "listing.jsonl"))
    with open(os.path.join(out, "run_report.json"), encoding="utf-8") as f:
        run = json.load(f)
    assert run["status"] == "ok" and run["update"]["refused_before"] == 1 and run["bad_records"] == {}
