"""Do no harm, image inputs (issue 18, D): read only what is the input, once, and name
it rightly.

Through the real CLI (``python -m beam_tfrecords convert`` as a subprocess, see
``tests/harness/attack_table.py`` ``cli``): the exit status, the first line, the files present
before and after (byte-identical where they must be kept), and records counted from
the shards. Real symlinks, FIFOs and ``/dev/zero``; no mocks.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from beam_tfrecords.samples import make_cifar_sample, make_class_folder_sample
from beam_tfrecords.transforms.codec.image_inspection import describe_content, quiet_message
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input, sha256_input
from beam_tfrecords.transforms.plan.layouts import parse_labels_text
from beam_tfrecords.transforms.plan.names import find_clash
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from tests.conftest import load_manifest, read_dataset
from tests.harness.attack_table import TRACEBACK, cli

EXIT_OK, EXIT_USAGE, EXIT_NOTHING_TO_DO = 0, 2, 99
CLASSES = ("circles", "squares", "stripes", "triangles")
SECRET = "api_key=hunter2-do-not-leak"


def _tree(root: Path, per_class: int = 2, seed: int = 0) -> list[str]:
    """Class folders (``circles``, ``squares``, ``stripes``, ``triangles``) and a README."""
    return make_class_folder_sample(str(root), per_class=per_class, splits=None, seed=seed)


def _snapshot(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every regular file under ``folder`` (links not followed)."""
    found = {}
    for top, _dirs, names in os.walk(folder):
        for name in names:
            path = Path(top) / name
            if path.is_symlink() or not path.is_file():
                continue
            found[str(path.relative_to(folder))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _records(out: Path) -> list[dict]:
    return [r for shard in read_dataset(str(out)).values() for r in shard]


def _per_class(out: Path) -> Counter:
    return Counter(r["image/class/text"][0].decode() for r in _records(out))


def _letters(out: Path, name: str | None = None) -> list[dict]:
    """Dead letters (``name``: one file's, e.g. ``skipped``; else all but skipped.jsonl)."""
    folder = out / "dead_letter"
    letters = []
    for path in sorted(folder.glob("*.jsonl")) if folder.is_dir() else []:
        if (name is None and path.stem != "skipped") or path.stem == name:
            letters += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return letters


def _clean(run) -> None:
    """No traceback, and stderr holds only log records and the one-line verdict (the
    attack table's rule for every run, tests/harness/attack_table.py ``Case.run``)."""
    assert TRACEBACK not in run.stdout + run.stderr, run.stderr[-3000:]
    assert not run.stray_stderr, run.stray_stderr


def _whole(out: Path, names: list[str]) -> None:
    """Exactly ``names`` are records (by name); the manifest counts them, and README.txt
    as the one file ignored (the attack table's accounting, ``account_files``)."""
    assert sorted(r["image/filename"][0].decode() for r in _records(out)) == sorted(names)
    manifest = load_manifest(str(out))
    assert sum(s["records"] for s in manifest["splits"].values()) == len(names)
    assert manifest["input"]["ignored_files"] == 1


def _convert(work: Path, src: Path | str, out: Path | str, *flags: str):
    return cli(work, "convert", "--input", str(src), "--output", str(out), "--progress", "off", *flags)


# --------------------------------------------------------------------------------------
# 1. links out of the input
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("follow", [False, True], ids=["passed-over", "followed"])
def test_links_out_of_the_input_are_followed_only_with_the_flag(tmp_path, follow):
    root, outside, out = tmp_path / "in", tmp_path / "outside", tmp_path / "out"
    inside = _tree(root)
    _tree(outside / "tree", seed=7)
    os.symlink(outside / "tree" / "circles", root / "dogs")  # A class folder elsewhere.
    os.symlink(outside / "tree" / "squares" / "squares_0000.jpg", root / "stripes" / "far.jpg")
    before = _snapshot(outside)
    run = _convert(tmp_path, root, out, *(["--follow_links_outside"] if follow else []))
    assert run.exit == EXIT_OK, run.stderr
    assert run.message == "status: ok"
    _clean(run)
    assert _snapshot(outside) == before  # The outside files: read at most, never changed.
    manifest = load_manifest(str(out))
    skipped = {d["source"]: d["error"] for d in _letters(out, "skipped")}
    names = sorted(r["image/filename"][0].decode() for r in _records(out))
    if follow:
        assert names == sorted(inside + ["dogs/circles_0000.jpg", "dogs/circles_0001.png",
                                         "stripes/far.jpg"])
        assert _per_class(out)["dogs"] == 2
        _whole(out, names)
        assert "link_outside_input" not in manifest["input"].get("skipped", {}).get("by_reason", {})
    else:
        assert names == sorted(inside)
        _whole(out, inside)
        assert skipped == {"dogs": "link_outside_input", "stripes/far.jpg": "link_outside_input"}
        assert manifest["input"]["skipped"]["by_reason"] == {"link_outside_input": 2}
        assert manifest["bad_records"]["total"] == 0  # Not inputs: no error budget spent.
        assert "2 paths passed over (link_outside_input (2))" in run.stdout  # In the plan.
        assert "dogs" not in manifest["labels"]["vocabulary"]


# --------------------------------------------------------------------------------------
# 2. identity: a real folder wins over a link to it; a symlinked root is the same input
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_real_folder_wins_over_links_to_it_whatever_their_names(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    _tree(root, per_class=3)
    os.symlink("circles", root / "a_circles")          # sorts (and may list) before the folder
    os.symlink(root / "squares", root / "Z_squares")   # absolute link, sorts first in bytes
    os.symlink("../triangles", root / "stripes" / "inner")  # a link inside another class
    run = _convert(tmp_path, root, out)
    assert run.exit == EXIT_OK, run.stderr
    assert run.message == "status: ok"
    assert _per_class(out) == {name: 3 for name in CLASSES}  # Counted from the shards.
    assert {r["image/filename"][0].decode().split("/")[0] for r in _records(out)} == set(CLASSES)
    skipped = {d["source"]: d["error"] for d in _letters(out, "skipped")}
    assert skipped == {"a_circles": "duplicate", "Z_squares": "duplicate",
                       "stripes/inner": "duplicate"}
    assert load_manifest(str(out))["labels"]["vocabulary"] == list(CLASSES)


@pytest.mark.e2e
def test_a_real_split_folder_keeps_its_images_from_a_link_in_another_split(tmp_path):
    """A link met before the folder it leads to (here, whichever split is walked first
    holds one) must not take that folder's images into its own split."""
    root, out = tmp_path / "in", tmp_path / "out"
    images = make_class_folder_sample(str(root), per_class=3, splits=("train", "test"))
    shutil.rmtree(root / "test" / "circles")
    os.symlink("../train/circles", root / "test" / "circles")
    shutil.rmtree(root / "train" / "squares")
    os.symlink("../test/squares", root / "train" / "squares")
    run = _convert(tmp_path, root, out)
    assert run.exit == EXIT_OK, run.stderr
    assert run.message == "status: ok"
    _clean(run)
    by_split = Counter((r["image/filename"][0].decode().split("/")[0], r["image/class/text"][0].decode())
                       for r in _records(out))
    assert by_split == {("train", "circles"): 3, ("train", "stripes"): 3, ("train", "triangles"): 3,
                        ("test", "squares"): 3, ("test", "stripes"): 3, ("test", "triangles"): 3}
    shards = sorted(read_dataset(str(out)))
    assert shards == ["test-00000-of-00001.tfrecord", "train-00000-of-00001.tfrecord"]
    _whole(out, [i for i in images if not i.startswith(("test/circles/", "train/squares/"))])
    assert {d["source"]: d["error"] for d in _letters(out, "skipped")} == {
        "test/circles": "duplicate", "train/squares": "duplicate"}


def _outputs(out: Path) -> dict[str, tuple[int, str]]:
    """Every file in an output folder: ``(mtime_ns, sha256)``."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.e2e
@pytest.mark.parametrize("old_manifest", [False, True], ids=["new-manifest", "old-manifest"])
def test_incremental_through_a_symlinked_root_converts_nothing_again(tmp_path, old_manifest):
    real, out = tmp_path / "data" / "photos", tmp_path / "out"
    inside = _tree(real)
    link = tmp_path / "photos_link"
    os.symlink(real, link)
    first = _convert(tmp_path, real, out, "--incremental")
    assert first.exit == EXIT_OK, first.stderr
    _whole(out, inside)
    if old_manifest:  # As an earlier version wrote it: the absolute root, no root_id.
        manifest = load_manifest(str(out))
        for section in (manifest["input"], manifest["input"]["files_list"]):
            section["root"] = str(real)
            section.pop("root_id")
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    before = _outputs(out)
    for flag in ("--incremental", "--skip_unchanged"):
        again = _convert(tmp_path, link, out, flag)
        assert again.exit == EXIT_NOTHING_TO_DO, again.stdout + again.stderr
        assert again.message.startswith("SKIPPED: input unchanged since"), again.message
        assert "0 new, 0 changed, 0 deleted, 8 unchanged" in again.message
        _clean(again)
    assert _outputs(out) == before  # Nothing written, nothing touched.
    assert not list(out.glob("part-*"))


@pytest.mark.e2e
def test_incremental_reads_a_dataset_an_earlier_version_published_with_absolute_paths(tmp_path):
    """Absolute roots, role paths and dead-letter sources (as written before issue 18):
    the next part, through a symlinked root, converts only the new image, takes the
    labels file as unchanged and counts the refused file once."""
    root, out = tmp_path / "data" / "cifar", tmp_path / "out"
    make_cifar_sample(str(root), classes=CLASSES)
    (root / "train" / "weird.png").write_bytes((root / "train" / "0_circles.png").read_bytes())
    first = _convert(tmp_path, root, out, "--incremental", "--max_bad_fraction", "0.1")
    assert first.exit == EXIT_OK, first.stderr
    # Rewrite it as an earlier version wrote it.
    lines = []
    for line in (out / "inputs.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("role"):
            entry["path"] = str(root / entry["path"])
        lines.append(json.dumps(entry, ensure_ascii=False))
    inputs = ("\n".join(lines) + "\n").encode()
    (out / "inputs.jsonl").write_bytes(inputs)
    manifest = load_manifest(str(out))
    for section in (manifest["input"], manifest["input"]["files_list"]):
        section["root"] = str(root)
        section.pop("root_id")
    manifest["input"]["files_list"]["sha256"] = hashlib.sha256(inputs).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    report = json.loads((out / "run_report.json").read_text())  # Reports named no manifest then.
    report.pop("manifest_sha256")
    (out / "run_report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    listing = out / "dead_letter" / "listing.jsonl"
    letters = [json.loads(line) for line in listing.read_text().splitlines()]
    assert [(d["source"], d["error"]) for d in letters] == [("train/weird.png", "unlabeled")]
    listing.write_text("".join(json.dumps({**d, "source": str(root / d["source"])}) + "\n"
                               for d in letters))
    make_cifar_sample(str(tmp_path / "more"), counts={"train": 1}, classes=CLASSES, seed=3)
    shutil.copyfile(tmp_path / "more" / "train" / "0_circles.png", root / "train" / "50_circles.png")
    os.symlink(root, tmp_path / "cifar_link")
    part = _convert(tmp_path, tmp_path / "cifar_link", out, "--incremental", "--max_bad_fraction", "0.1")
    assert part.exit == EXIT_OK, part.stdout + part.stderr
    report = json.loads((out / "run_report.json").read_text())
    assert report["update"]["inputs"]["new"] == 1 and report["update"]["inputs"]["deleted"] == 0
    assert report["update"]["refused_before"] == 1
    assert [r["image/filename"][0].decode() for r in _records(out / "part-00001")] == ["train/50_circles.png"]
    assert not (out / "part-00001" / "dead_letter").exists()


@pytest.mark.e2e
def test_drop_duplicates_with_incremental_keeps_what_the_dataset_holds(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    _tree(root)
    first = _convert(tmp_path, root, out, "--incremental", "--drop_duplicates")
    assert first.exit == EXIT_OK, first.stderr
    held = {r["image/filename"][0].decode() for r in _records(out)}
    assert len(held) == 8
    # Copies of held images under names whose ordering key comes before the original's:
    # a listing that kept the first by key alone would drop the held file and store the copy.
    original = "circles/circles_0000.jpg"
    copy = next(f"circles/copy{i}.jpg" for i in range(1000)
                if stable_key("train", f"circles/copy{i}.jpg") < stable_key("train", original))
    shutil.copyfile(root / original, root / copy)
    shutil.copyfile(root / "squares" / "squares_0001.png", root / "triangles" / "again.png")
    before = _outputs(out)
    only_copies = _convert(tmp_path, root, out, "--incremental", "--drop_duplicates")
    assert only_copies.exit == EXIT_NOTHING_TO_DO, only_copies.stdout + only_copies.stderr
    assert only_copies.message.startswith("SKIPPED:"), only_copies.message
    assert "0 new, 0 changed, 0 deleted, 8 unchanged" in only_copies.message
    assert "left out: 2 copies of other images" in only_copies.stdout
    assert _outputs(out) == before
    # With a new image besides: a part holding it alone, nothing reported deleted.
    _tree(tmp_path / "other", per_class=1, seed=5)
    shutil.copyfile(tmp_path / "other" / "stripes" / "stripes_0000.jpg", root / "stripes" / "new.jpg")
    part = _convert(tmp_path, root, out, "--incremental", "--drop_duplicates")
    assert part.exit == EXIT_OK, part.stderr
    assert part.message == "status: ok"
    _clean(part)
    report = json.loads((out / "run_report.json").read_text())
    assert report["update"]["inputs"] == {"new": 1, "changed": 0, "deleted": 0, "unchanged": 8,
                                          "touched": 0}
    assert [r["image/filename"][0].decode() for r in _records(out / "part-00001")] == ["stripes/new.jpg"]
    assert {r["image/filename"][0].decode() for r in _records(out)} == held  # The root: as it was.
    dropped = load_manifest(str(out / "part-00001"))["input"]["duplicates_dropped"]
    assert sorted((d["filename"], d["copy_of"]) for d in dropped) == [
        (copy, original), ("triangles/again.png", "squares/squares_0001.png")]
    for name, (mtime, digest) in before.items():
        if name.endswith(".tfrecord") or name == "inputs.jsonl":
            assert _outputs(out)[name] == (mtime, digest), name


# --------------------------------------------------------------------------------------
# 3. names: NFC/NFD and letter case; blank lines in labels files
# --------------------------------------------------------------------------------------

NFC, NFD = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")


def _class_tree(root: Path, names: tuple[str, str], splits: bool) -> None:
    """Two class folders (or, with ``splits``, two split folders of one class each)."""
    _tree(root.parent / "src")
    for i, name in enumerate(names):
        folder = root / name / "circles" if splits else root / name
        shutil.copytree(root.parent / "src" / CLASSES[i], folder)


@pytest.mark.e2e
@pytest.mark.parametrize("layout, names", [
    ("class folders", (NFC, NFD)),
    ("class folders", ("Cat", "cat")),
    ("split folders", ("TRAIN", "train")),
    ("cifar split folders", (NFC, NFD)),
    ("cifar split folders", ("TRAIN", "train")),
    ("cifar classes", ("Cat", "cat")),
], ids=["class-nfc-nfd", "class-case", "split-case", "cifar-split-nfc-nfd", "cifar-split-case",
        "cifar-class-case"])
def test_names_that_differ_only_in_normalization_or_case_are_refused(tmp_path, layout, names):
    root, out = tmp_path / "in", tmp_path / "out"
    if layout.startswith("cifar"):
        make_cifar_sample(str(root), counts={"train": 4}, classes=("Cat", "dog"))
        if layout == "cifar split folders":
            os.rename(root / "train", root / names[0])
            shutil.copytree(root / names[0], root / names[1])
        else:
            (root / "train" / "9_cat.png").write_bytes((root / "train" / "0_Cat.png").read_bytes())
    else:
        _class_tree(root, names, splits=layout == "split folders")
    before = _snapshot(root)
    run = _convert(tmp_path, root, out)
    assert run.exit == EXIT_USAGE, run.stdout + run.stderr
    assert run.message.startswith(f"beam-tfrecords convert: error: --input {root}: "), run.message
    first, second = sorted(names)
    assert f"{ascii(first)} and {ascii(second)} differ only in" in run.message, run.message
    assert "normalization" in run.message if NFC in names else "letter case" in run.message
    _clean(run)
    assert _snapshot(root) == before
    assert not out.exists()  # Refused before anything ran.


@pytest.mark.e2e
@pytest.mark.parametrize("column, values", [("label", (NFC, NFD)), ("split", ("TRAIN", "train"))])
def test_csv_manifest_labels_and_splits_that_differ_only_in_normalization_or_case_are_refused(
        tmp_path, column, values):
    root, out = tmp_path / "in", tmp_path / "out"
    inside = _tree(root)
    rows = [f"{rel},{values[i % 2] if column == 'label' else 'cat'},"
            f"{values[i % 2] if column == 'split' else 'train'}" for i, rel in enumerate(inside)]
    (root / "list.csv").write_text("image,label,split\n" + "\n".join(rows) + "\n", encoding="utf-8")
    run = _convert(tmp_path, root / "list.csv", out)
    assert run.exit == EXIT_USAGE, run.stdout + run.stderr
    first, second = sorted(values)
    assert f"{ascii(first)} and {ascii(second)} differ only in" in run.message, run.message
    assert not out.exists()


@pytest.mark.e2e
@pytest.mark.parametrize("where", ["labels.txt", "--labels"])
def test_a_blank_line_in_a_labels_file_is_refused_naming_the_line(tmp_path, where):
    out = tmp_path / "out"
    text = "circles\nsquares\n\nstripes\ntriangles\n\n"  # Line 3; the trailing blank shifts nothing.
    if where == "labels.txt":
        root = tmp_path / "cifar"
        make_cifar_sample(str(root), classes=CLASSES)
        (root / "labels.txt").write_text(text)
        flags: list[str] = []
    else:
        root = tmp_path / "in"
        _tree(root)
        (tmp_path / "labels.txt").write_text(text)
        flags = ["--labels", str(tmp_path / "labels.txt")]
    run = _convert(tmp_path, root, out, *flags)
    assert run.exit == EXIT_USAGE, run.stdout + run.stderr
    assert run.message.startswith("beam-tfrecords convert: error: "), run.message
    assert "line 3 of the labels file is blank" in run.message
    _clean(run)
    assert not out.exists()
    # The same file without the blank line converts, labels by line index.
    (root / "labels.txt" if where == "labels.txt" else tmp_path / "labels.txt").write_text(
        text.replace("\n\n", "\n"))
    fixed = _convert(tmp_path, root, out, *flags)
    assert fixed.exit == EXIT_OK, fixed.stderr
    labels = {r["image/class/text"][0].decode(): r["image/class/label"][0] for r in _records(out)}
    assert labels == {name: i for i, name in enumerate(CLASSES)}


# --------------------------------------------------------------------------------------
# 4. only regular files, never more than their size plus one byte, --max_file_bytes
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_fifo_and_a_dev_zero_link_named_jpg_do_not_block_the_run(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    inside = _tree(root)
    os.mkfifo(root / "circles" / "pipe.jpg")                  # Nobody ever writes to it.
    os.symlink("/dev/zero", root / "squares" / "zero.jpg")   # Endless zeros.
    run = _convert(tmp_path, root, out)  # A hang would end at cli()'s time limit: exit None.
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    assert run.message == "status: ok"
    _clean(run)
    _whole(out, inside)
    assert {d["source"]: d["error"] for d in _letters(out, "skipped")} == {
        "circles/pipe.jpg": "not_a_regular_file", "squares/zero.jpg": "not_a_regular_file"}
    assert load_manifest(str(out))["input"]["skipped"]["by_reason"] == {"not_a_regular_file": 2}


@pytest.mark.e2e
def test_a_manifest_row_naming_a_fifo_or_dev_zero_is_dead_lettered_by_the_read(tmp_path):
    """A CSV manifest's rows are looked up, not walked: the read itself refuses them."""
    root, out = tmp_path / "in", tmp_path / "out"
    inside = _tree(root)
    os.mkfifo(root / "pipe.jpg")
    os.symlink("/dev/zero", root / "zero.jpg")
    rows = [f"{rel},{rel.split('/')[0]}" for rel in inside] + ["pipe.jpg,circles", "zero.jpg,squares"]
    (root / "list.csv").write_text("image,label\n" + "\n".join(rows) + "\n")
    # The /dev/zero link leads out of the CSV's folder: refused by default (exit 2, before any
    # read), so allow it here to show that the read itself refuses a non-regular file.
    refused = _convert(tmp_path, root / "list.csv", out, "--max_bad_fraction", "0.5")
    assert refused.exit == 2 and "/dev (1 row)" in refused.stderr, refused.stdout + refused.stderr
    run = _convert(tmp_path, root / "list.csv", out, "--max_bad_fraction", "0.5", "--allow_paths_outside")
    assert run.exit == EXIT_OK, run.stdout + run.stderr
    _clean(run)
    assert sorted(r["image/filename"][0].decode() for r in _records(out)) == sorted(inside)
    assert sorted((d["source"], d["stage"], d["error"]) for d in _letters(out)) == [
        ("pipe.jpg", "read", "not_a_regular_file"), ("zero.jpg", "read", "not_a_regular_file")]


@pytest.mark.e2e
def test_a_file_over_max_file_bytes_is_dead_lettered_unread(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    inside = _tree(root)
    sizes = {rel: (root / rel).stat().st_size for rel in inside}
    limit = sorted(sizes.values())[-3]  # The two largest files are over it.
    large = sorted(rel for rel, size in sizes.items() if size > limit)
    assert len(large) == 2
    run = _convert(tmp_path, root, out, "--max_file_bytes", str(limit), "--max_bad_fraction", "0.3")
    assert run.exit == EXIT_OK, run.stderr
    assert run.message == "status: ok"
    _clean(run)
    assert sorted(r["image/filename"][0].decode() for r in _records(out)) == sorted(set(inside) - set(large))
    letters = _letters(out)
    assert sorted((d["source"], d["error"]) for d in letters) == [(rel, "file_too_large") for rel in large]
    for letter in letters:
        assert f"{sizes[letter['source']]:,} bytes, more than --max_file_bytes ({limit:,})" in letter["message"]
    assert "file_too_large: 2" in run.stdout
    # A table takes no image flag.
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    table = _convert(tmp_path, tmp_path / "t.csv", tmp_path / "out-t", "--max_file_bytes", "10")
    assert table.exit == EXIT_USAGE and "--max_file_bytes applies only to images" in table.message


@pytest.mark.unit
def test_reads_take_regular_files_only_and_at_most_their_size_plus_one(tmp_path):
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    for path, size in ((str(fifo), 100), ("/dev/zero", 100), ("/dev/zero", None)):
        with pytest.raises(InputRefused) as refused:
            read_input(path, size, 1 << 20)  # Returns at once: nothing blocks, nothing is read.
        assert refused.value.reason == "not_a_regular_file"
        with pytest.raises(InputRefused):
            sha256_input(path, size)
    grown = tmp_path / "grown.jpg"
    grown.write_bytes(b"x" * 1000)
    assert read_input(str(grown), 1000, 1 << 20) == b"x" * 1000
    with open(grown, "ab") as f:
        f.write(b"y" * (5 << 20))  # Grew by 5 MB after it was listed at 1,000 bytes.
    with pytest.raises(InputRefused) as refused:
        read_input(str(grown), 1000, 1 << 30)
    assert refused.value.reason == "changed_while_reading"
    assert "more than 1,000" in refused.value.message
    with pytest.raises(InputRefused) as refused:
        read_input(str(grown), (5 << 20) + 1000, 1 << 20)
    assert refused.value.reason == "file_too_large"
    with pytest.raises(InputRefused) as refused:
        read_input(str(grown), 2000, 1 << 30)  # Listed larger than it is now: shrank.
    assert refused.value.reason == "changed_while_reading"


# --------------------------------------------------------------------------------------
# 5, 6. published paths; messages name a file's kind and size, never its content
# --------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_text_file_named_jpg_is_named_by_kind_and_size_not_content(tmp_path):
    root, out = tmp_path / "in", tmp_path / "out"
    inside = _tree(root)
    bodies = {"circles/notes.jpg": f"{SECRET}\n".encode(),
              "squares/page.png": f"<!DOCTYPE html><html>{SECRET}</html>".encode(),
              "stripes/doc.jpg": b"%PDF-1.4\n" + SECRET.encode(),
              "triangles/blob.gif": b"\x00\x01\x02" + SECRET.encode() + b"\xff" * 20}
    for rel, body in bodies.items():
        (root / rel).write_bytes(body)
    run = _convert(tmp_path, root, out, "--max_bad_fraction", "0.5")
    assert run.exit == EXIT_OK, run.stderr
    _clean(run)
    _whole(out, inside)  # Every real image written beside the four refused files.
    letters = {d["source"]: d for d in _letters(out)}
    kinds = {"circles/notes.jpg": "text", "squares/page.png": "HTML", "stripes/doc.jpg": "PDF",
             "triangles/blob.gif": "unknown binary"}
    assert set(letters) == set(bodies)
    for rel, letter in letters.items():
        assert letter["error"] == "not_an_image"
        assert f"seems to be {kinds[rel]} ({len(bodies[rel]):,} bytes)" in letter["message"], letter
    published = "".join(p.read_text(errors="replace") for p in out.rglob("*") if p.is_file()
                        and not p.name.endswith(".tfrecord"))
    assert "hunter2" not in published + run.stdout + run.stderr
    assert "DOCTYPE" not in published and "%PDF" not in published


@pytest.mark.e2e
@pytest.mark.parametrize("layout", ["class_folders", "cifar"])
def test_no_absolute_input_path_is_published(tmp_path, layout):
    root, out = tmp_path / "data" / "in", tmp_path / "out"
    if layout == "cifar":
        make_cifar_sample(str(root), classes=CLASSES)
        (root / "train" / "99_circles.png").write_bytes(b"not a png")  # A dead letter.
        flags: list[str] = []
    else:
        _tree(root)
        (root / "circles" / "bad.jpg").write_bytes(b"not a jpeg")
        (tmp_path / "labels.txt").write_text("\n".join(CLASSES) + "\n")  # Outside the root.
        flags = ["--labels", str(tmp_path / "labels.txt")]
    os.symlink("circles" if layout == "class_folders" else "train", root / "again")  # Skipped.
    run = _convert(tmp_path, root, out, "--max_bad_fraction", "0.2", *flags)
    assert run.exit == EXIT_OK, run.stderr
    _clean(run)
    published = sorted(p for p in out.rglob("*") if p.is_file() and ".tfrecord" not in p.name)
    names = {str(p.relative_to(out)) for p in published}
    assert {"manifest.json", "inputs.jsonl", "run_report.json", "dead_letter/skipped.jsonl"} <= names
    assert any(n.startswith("dead_letter/") and n != "dead_letter/skipped.jsonl" for n in names)
    for path in published:
        text = path.read_text(encoding="utf-8")
        assert str(tmp_path / "data") not in text, (path, text)  # No absolute input path.
        assert str(tmp_path / "labels.txt") not in text, path
    manifest = load_manifest(str(out))
    assert manifest["input"]["root"] == "in"
    assert manifest["input"]["root_id"].startswith("sha256:")
    assert manifest["options"]["input"] == "in"
    roles = [json.loads(line) for line in (out / "inputs.jsonl").read_text().splitlines()
             if "role" in json.loads(line)]
    assert [r["path"] for r in roles] == ["labels.txt"]
    bad = {d["source"] for d in _letters(out)}
    assert bad == {"circles/bad.jpg"} if layout == "class_folders" else {"train/99_circles.png"}


# --------------------------------------------------------------------------------------
# pure pieces
# --------------------------------------------------------------------------------------


@pytest.mark.unit
def test_name_clashes_fold_normalization_and_case():
    assert find_clash([NFC, NFD]) == tuple(sorted([NFC, NFD]))
    assert find_clash(["TRAIN", "train", "test"]) == ("TRAIN", "train")
    assert find_clash(["Straße", "STRASSE"]) == ("STRASSE", "Straße")
    assert find_clash(["cat", "dog", "café"]) is None
    with pytest.raises(ValueError, match="line 2 of the labels file is blank"):
        parse_labels_text("a\n\nb\n")
    assert parse_labels_text("a\nb\n\n\n") == ["a", "b"]


@pytest.mark.unit
def test_content_is_described_never_quoted():
    assert describe_content(b"") == "empty"
    assert describe_content(SECRET.encode()) == "text"
    assert describe_content(b"\n <html><body>x") == "HTML"
    assert describe_content(b"%PDF-1.7") == "PDF"
    assert describe_content(b"PK\x03\x04rest") == "zip"
    assert describe_content(bytes(range(256))) == "unknown binary"
    # A library's message quoting the file's bytes loses them; control characters are escaped.
    assert quiet_message("not a TIFF file (header b'II*\\x00' not valid)\x1b[2J") == \
        "not a TIFF file (header <bytes> not valid)\\x1b[2J"
