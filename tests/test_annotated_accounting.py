"""What an annotated run counts, and where it says so (issue 21, tester findings F9,
F11, F16 and the summary).

- EXIF orientation without a stated size: the launcher reads each such image's
  orientation from its first bytes (a JPEG's EXIF block parsed by hand, so a prefix
  cut inside the block still answers) and the plan names those other than 1; a
  ``gs://`` input is left to the workers, and the plan says so.
- Semantic masks: an image without a mask under ``--masks`` is passed over (not
  converted, named in ``dead_letter/skipped.jsonl``), not a bad input (VOC2012 has
  masks for ~2.9k of its 17k images).
- The summary's ``annotations:`` line (objects left out by reason, boxes clipped,
  what the workers counted, images without objects) and ``paths passed over`` only
  for paths; ``--drop_empty``'s figures agree between the plan and the manifest.
- Do no harm (any run): Ctrl-C during an ``--overwrite`` run keeps the published
  dataset byte for byte and writes the interrupted run's ``run_report.json``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.schemas.annotations import Annotated, ImageAnnotations, LabelMap
from beam_tfrecords.transforms.annotated_inputs import exif_note
from beam_tfrecords.transforms.codec.orientation import exif_orientation, header_orientation
from beam_tfrecords.transforms.plan.annotated_listing import FoundImage
from tests.harness.attack_table import cli, cli_env


def _jpeg(size=(40, 30), orientation: int | None = None, colour=(90, 30, 200)) -> bytes:
    out = io.BytesIO()
    kwargs = {}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif
    Image.new("RGB", size, colour).save(out, "JPEG", **kwargs)
    return out.getvalue()


def _app1_big_endian(orientation: int) -> bytes:
    """A JPEG whose EXIF block is big-endian (``MM``), as many cameras write it."""
    tiff = b"MM" + struct.pack(">HI", 42, 8) + struct.pack(">H", 1) + struct.pack(
        ">HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(">I", 0)
    block = b"Exif\x00\x00" + tiff
    plain = _jpeg()
    return plain[:2] + b"\xff\xe1" + struct.pack(">H", len(block) + 2) + block + plain[2:]


@pytest.mark.unit
def test_the_orientation_is_read_from_the_first_bytes_as_the_workers_read_it_whole():
    for value in range(1, 9):
        data = _jpeg(orientation=value)
        assert header_orientation(data) == exif_orientation(data) == value
        assert header_orientation(data[:120]) == value  # Cut inside the image data: still read.
    assert header_orientation(_app1_big_endian(6)) == exif_orientation(_app1_big_endian(6)) == 6
    assert header_orientation(_app1_big_endian(9)) == 1  # Not one of the eight values.
    assert header_orientation(_jpeg()) == header_orientation(b"") == header_orientation(b"\xff\xd8\xff") == 1
    png = io.BytesIO()
    exif = Image.Exif()
    exif[0x0112] = 8
    Image.new("RGB", (5, 3)).save(png, "PNG", exif=exif)
    assert header_orientation(png.getvalue()) == 8  # Not a JPEG: Pillow reads it.


@pytest.mark.unit
def test_exif_note_names_turned_images_without_a_stated_size_and_leaves_gcs_to_the_workers(tmp_path):
    for name, orientation in (("a.jpg", 6), ("b.jpg", None), ("c.jpg", 3), ("sized.jpg", 6)):
        (tmp_path / name).write_bytes(_jpeg(orientation=orientation))
    images = tuple(ImageAnnotations(name, name, stated_size=(30, 40) if name == "sized.jpg" else None)
                   for name in ("a.jpg", "b.jpg", "c.jpg", "sized.jpg", "missing.jpg"))
    annotated = Annotated("box_csv", images, LabelMap(((1, "x"),)))
    found = {i.path: FoundImage(str(tmp_path / i.path), 1) for i in images if i.path != "missing.jpg"}
    note = exif_note(annotated, found)
    assert (note.images, note.names, note.read, note.on_workers) == (2, ("a.jpg", "c.jpg"), 3, False)
    assert exif_note(annotated, {"b.jpg": found["b.jpg"]}) is None
    remote = exif_note(annotated, {"a.jpg": FoundImage("gs://bucket/a.jpg", 1)})
    assert (remote.on_workers, remote.images) == (True, 0)
    assert exif_note(Annotated("multi_label", images, LabelMap(())), found) is None  # No geometry.


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.mark.e2e
def test_images_without_a_mask_are_passed_over_not_bad_inputs(tmp_path):
    images, masks = tmp_path / "JPEGImages", tmp_path / "SegmentationClass"
    images.mkdir()
    masks.mkdir()
    for name in ("a", "b", "c"):
        (images / f"{name}.jpg").write_bytes(_jpeg())
    mask = np.zeros((30, 40), np.uint8)
    mask[5:20, 5:20] = 1
    Image.fromarray(mask).save(masks / "a.png")
    (tmp_path / "classes.txt").write_text("background\nthing\n")
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(images), "--masks", str(masks), "--labels",
              str(tmp_path / "classes.txt"), "--output", str(out), "--progress", "off")
    assert run.exit == 0, run.stdout + run.stderr
    assert ("  left out: 2 images without a mask under --masks, not converted (named in "
            "dead_letter/skipped.jsonl; not bad inputs)") in run.stdout
    assert "bad inputs: 0 of 1 " in run.stdout
    assert "2 images without a mask, not converted" in run.stdout
    assert "paths passed over" not in run.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bad_records"]["total"] == 0 and manifest["input"]["skipped"]["by_reason"] == {
        "mask_not_found": 2}
    assert sorted((d["source"], d["error"]) for d in _lines(out / "dead_letter" / "skipped.jsonl")) == [
        ("b.jpg", "mask_not_found"), ("c.jpg", "mask_not_found")]
    assert manifest["annotations"]["problems"] == {"mask_not_found": 2}
    assert ("annotations: no object left out; 2 images without a mask, not converted; 0 images without "
            "objects written; see dead_letter/") in run.stdout


@pytest.mark.e2e
def test_plan_summary_and_manifest_account_for_objects_orientation_and_drop_empty(tmp_path):
    """One box CSV: a box past the edge (clipped), one outside the image (empty), a
    coordinate that is not a number, a class --labels does not name, two images
    without objects (--drop_empty), and a photo stored with EXIF orientation 6 whose
    rows state no size."""
    for name in ("a.jpg", "b.jpg", "c.jpg"):
        (tmp_path / name).write_bytes(_jpeg())
    (tmp_path / "rot.jpg").write_bytes(_jpeg((80, 60), orientation=6))
    (tmp_path / "labels.txt").write_text("cat\n")
    (tmp_path / "boxes.csv").write_text(
        "filename,class,xmin,ymin,xmax,ymax\n"
        "a.jpg,cat,1,1,10,10\n"
        "a.jpg,cat,30,20,60,40\n"      # past the edge of 40x30: clipped
        "a.jpg,cat,50,40,60,50\n"      # outside: no area once clipped
        "a.jpg,cat,nan,1,2,2\n"        # box_not_finite
        "a.jpg,dog,1,1,5,5\n"          # unknown_category (not in --labels)
        "b.jpg,,,,,\nc.jpg,,,,,\n"     # without objects
        "rot.jpg,cat,5,10,25,30\n")
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(tmp_path / "boxes.csv"), "--labels", str(tmp_path / "labels.txt"),
              "--drop_empty", "--output", str(out), "--progress", "off")
    assert run.exit == 0, run.stdout + run.stderr
    assert ("  note: 1 image has an EXIF orientation other than 1 and no stated size: stored as in the "
            "file, boxes as given (TensorFlow ignores EXIF orientation); if the boxes were drawn on the "
            "displayed pictures, state their displayed size in width,height columns (they are then stored "
            "turned): rot.jpg") in run.stdout
    assert "  images without objects: 2 left out (--drop_empty)" in run.stdout
    annotations = json.loads((out / "manifest.json").read_text())["annotations"]
    assert (annotations["listed_without_objects"], annotations["dropped_empty"],
            annotations["images_without_objects"]) == (2, 2, 0)
    assert annotations["problems"] == {"box_clipped": 1, "box_empty": 1, "box_not_finite": 1,
                                       "exif_orientation_not_applied": 1, "unknown_category": 1}
    assert ("annotations: 3 objects left out (box_empty 1, box_not_finite 1, unknown_category 1); 1 box "
            "clipped to the image; counted: exif_orientation_not_applied 1; 2 images without objects "
            "listed, 2 left out (--drop_empty); see dead_letter/") in run.stdout
    assert "paths passed over" not in run.stdout
    report = json.loads((out / "run_report.json").read_text())
    assert report["annotations"]["problems"] == annotations["problems"]


# --- do no harm: an interrupted --overwrite run (not annotated) -------------------------


def _dataset_files(out: Path) -> dict[str, bytes]:
    """Every file of the published dataset but the run report and the work folder."""
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != "run_report.json" and ".beam-tfrecords" not in p.parts}


@pytest.mark.e2e
def test_ctrl_c_during_an_overwrite_keeps_the_dataset_and_writes_the_run_report(tmp_path):
    """Ctrl-C (SIGINT to the process group, as a terminal sends it) while the run lists
    its images: the published manifest, shard, inputs.jsonl and dead letters stay byte
    for byte, and run_report.json says this run failed, interrupted (the last run's
    report was removed when the run took the output); verify passes; the next run
    proves the report its own and replaces it."""
    inp, out = tmp_path / "in", tmp_path / "out"
    for folder in ("cat", "dog"):
        (inp / folder).mkdir(parents=True)
        for i in range(4):
            (inp / folder / f"{i}.jpg").write_bytes(_jpeg(colour=(i * 40, 60 if folder == "cat" else 160, 90)))
    (inp / "cat" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg" * 8)
    argv = ["convert", "--input", str(inp), "--output", str(out), "--max_bad_fraction", "0.2"]
    assert cli(tmp_path, *argv).exit == 0
    before = _dataset_files(out)
    assert "dead_letter/train-00000-of-00001.jsonl" in before and "inputs.jsonl" in before
    old_run = json.loads((out / "run_report.json").read_text())["run_id"]

    flag = tmp_path / "hold" / "listing"
    flag.parent.mkdir()
    env = cli_env(BEAM_TFRECORDS_TEST_HOOKS="1", BEAM_TFRECORDS_HOLD_AT="listing",
                  BEAM_TFRECORDS_HOLD_DIR=str(flag.parent))
    with open(tmp_path / "held.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", *argv, "--overwrite"], cwd=tmp_path,
                                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "held.log").read_text()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, (tmp_path / "held.log").read_text()
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    assert _dataset_files(out) == before
    report = json.loads((out / "run_report.json").read_text())
    assert (report["status"], report["manifest"]) == ("failed", None)
    assert report["run_id"] != old_run and "interrupted (SIGINT)" in report["error"]
    assert cli(tmp_path, "verify", str(out)).exit == 0
    again = cli(tmp_path, *argv, "--overwrite")
    assert again.exit == 0, again.stdout + again.stderr
    assert json.loads((out / "run_report.json").read_text())["status"] == "ok"
