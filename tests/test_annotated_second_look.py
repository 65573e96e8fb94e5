"""What a second stranger found on the merged issue 21 (annotated images): a class-folder
dataset shipped with a ``data.yaml`` taken for YOLO, ``verify`` failing a good annotated
dataset (its object dead letters) and passing a changed ``label_map.pbtxt``, and the
contact sheet of several labels with an image without labels."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from beam_tfrecords.transforms.annotated_inputs import AnnotationArgs, detect_annotated_layout
from tests.harness.attack_table import cli


def _png(color: tuple[int, int, int]) -> bytes:
    out = BytesIO()
    Image.new("RGB", (32, 24), color).save(out, "PNG")
    return out.getvalue()


def _write(root: Path, tree: dict) -> Path:
    for name, content in tree.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content.encode() if isinstance(content, str) else content)
    return root


@pytest.mark.unit
def test_a_data_yaml_beside_class_folders_is_not_yolo_without_label_files(tmp_path):
    """A classification export (``train/cat``, ``val/dog`` and a ``data.yaml`` naming the
    classes) stays class folders; the same folder with YOLO label files is YOLO."""
    tree = {"train/cat/a.png": _png((1, 2, 3)), "train/dog/b.png": _png((4, 5, 6)),
            "val/cat/c.png": _png((7, 8, 9)), "data.yaml": "train: train\nval: val\nnames: [cat, dog]\n"}
    plain = _write(tmp_path / "plain", tree)
    assert detect_annotated_layout(str(plain), AnnotationArgs()) is None
    rf = _write(tmp_path / "rf", {"train/images/a.png": _png((1, 2, 3)), "train/labels/a.txt": "0 0.5 0.5 0.2 0.2\n",
                                  "data.yaml": "train: ../train/images\nval: ../train/images\nnames: [cat]\n"})
    assert detect_annotated_layout(str(rf), AnnotationArgs()) == "yolo"


@pytest.mark.e2e
def test_verify_passes_object_dead_letters_and_fails_a_changed_label_map(tmp_path):
    """An object dropped against the pixels shares the shard's dead-letter file without
    being a bad record: ``verify`` counts it apart; a ``label_map.pbtxt`` that is not the
    one the manifest records fails ``verify`` naming it."""
    root = _write(tmp_path / "in", {
        "images/a.png": _png((200, 10, 10)), "images/b.png": _png((10, 200, 10)),
        # b's second box lies past the right edge: no area left after clipping.
        "boxes.csv": "filename,class,xmin,ymin,xmax,ymax\nimages/a.png,cat,2,2,20,20\n"
                     "images/b.png,dog,1,1,10,10\nimages/b.png,dog,40,2,50,20\n"})
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(root / "boxes.csv"), "--output", str(out))
    assert run.exit == 0, run.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["bad_records"]["total"], manifest["annotations"]["objects_dead_lettered"]) == (0, 1)
    checked = cli(tmp_path, "verify", str(out))
    assert checked.exit == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    label_map = out / "label_map.pbtxt"
    label_map.write_text(label_map.read_text().replace("'cat'", "'kat'"))
    tampered = cli(tmp_path, "verify", str(out))
    assert tampered.exit == 1
    assert "label_map.pbtxt  label map differs from the one manifest.json records (sha256)" in tampered.stdout


@pytest.mark.e2e
def test_the_contact_sheet_of_several_labels_draws_an_image_without_labels(tmp_path):
    root = _write(tmp_path / "in", {"a.png": _png((200, 10, 10)), "b.png": _png((10, 200, 10)),
                                    "tags.csv": "image,label\na.png,cat;outdoor\nb.png,\n"})
    out = tmp_path / "out"
    run = cli(tmp_path, "convert", "--input", str(root / "tags.csv"), "--output", str(out),
              "--label_separator", ";")
    assert run.exit == 0, run.stderr[-2000:]
    sheet = tmp_path / "sheet.png"
    shown = cli(tmp_path, "inspect", str(out), "--contact_sheet", str(sheet))
    assert shown.exit == 0, shown.stderr[-2000:]
    assert (tmp_path / "sheet-train.png").stat().st_size > 0
