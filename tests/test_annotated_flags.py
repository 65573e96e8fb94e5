"""The flags of annotated images through the CLI (issue 21, launcher side): each
combination that cannot work is refused before anything runs, exit 2, one line naming
what to change; the plan of a Pascal VOC folder names its layout, images, objects per
class and problems (the real CLI, ``--dry_run``); a listing handed over to other
processes carries every image's annotations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_tfrecords.cli import main
from beam_tfrecords.preflight import plan_run
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.codec.annotation_bytes import decode_annotations
from beam_tfrecords.transforms.image_listing import listing_for
from beam_tfrecords.transforms.image_steps import ListingIdentity, write_listing
from tests.harness.attack_table import cli

pytestmark = pytest.mark.e2e


def _write(root: Path, files: dict) -> str:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(root)


def _jpeg() -> bytes:
    from io import BytesIO  # pylint: disable=import-outside-toplevel

    from PIL import Image  # pylint: disable=import-outside-toplevel
    out = BytesIO()
    Image.new("RGB", (32, 24), (200, 80, 40)).save(out, "JPEG")
    return out.getvalue()


def _xml(name: str, objects) -> str:
    body = "".join(f"<object><name>{cls}</name><difficult>{difficult}</difficult><bndbox><xmin>{b[0]}</xmin>"
                   f"<ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox></object>"
                   for cls, b, difficult in objects)
    return (f"<annotation><filename>{name}</filename><size><width>32</width><height>24</height>"
            f"<depth>3</depth></size>{body}</annotation>")


@pytest.fixture(name="voc")
def _voc(tmp_path) -> str:
    jpeg = _jpeg()
    return _write(tmp_path / "voc", {
        "Annotations/a.xml": _xml("a.jpg", [("dog", (2, 2, 20, 20), 0), ("cat", (4, 4, 30, 22), 1)]),
        "Annotations/b.xml": _xml("b.jpg", [("cat", (1, 1, 10, 10), 0)]),
        "Annotations/c.xml": _xml("c.jpg", []),
        "JPEGImages/a.jpg": jpeg, "JPEGImages/b.jpg": jpeg, "JPEGImages/c.jpg": jpeg, "JPEGImages/d.jpg": jpeg,
        "ImageSets/Main/train.txt": "a\nc\n", "ImageSets/Main/val.txt": "b\n",
    })


@pytest.fixture(name="inputs")
def _inputs(tmp_path, voc) -> dict:
    return {"voc": voc,
            "folders": _write(tmp_path / "folders", {"cat/a.jpg": b"x", "dog/b.jpg": b"x"}),
            "coco": _write(tmp_path / "ann", {"i.json": '{"images": [], "annotations": [], "categories": []}'})
            + "/i.json",
            "masks": _write(tmp_path / "masks", {"a.png": b"x"})}


BAD = [
    (["--input", "{folders}", "--instance_masks"], "--instance_masks renders COCO segmentations"),
    (["--input", "{voc}", "--layout", "voc", "--annotations", "{coco}"], "--annotations applies only to --layout coco"),
    (["--input", "{folders}", "--masks", "{masks}", "--list_on_workers"], "--masks pairs every image"),
    (["--input", "{voc}", "--incremental"], "--incremental does not work with annotated images (--layout voc)"),
    (["--input", "{voc}", "--skip_unchanged"], "--skip_unchanged does not work"),
    (["--input", "{folders}", "--annotations", "{coco}", "--masks", "{masks}"], "two layouts; give one"),
    (["--input", "{voc}", "--box_units", "normalized"], "--box_units applies only to --layout box_csv; the input "
     "is read as --layout voc"),
    (["--input", "{voc}", "--box_columns", "x0,y0,x1"], "--box_columns must name 4 different columns"),
    (["--input", "{folders}", "--drop_empty"], "--drop_empty applies only to an annotated layout"),
    (["--input", "{folders}", "--annotations", "{coco}", "--labels", "{coco}"], "--labels: with --layout coco"),
    (["--input", "{folders}", "--annotations", "{folders}/none.json"], "--annotations: "),
    (["--input", "{folders}", "--layout", "coco"], "--layout coco needs --annotations"),
    (["--input", "{folders}", "--annotations", "train={coco},bad name={coco}"], "is not SPLIT=FILE"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[m[:30] for _, m in BAD])
def test_a_bad_combination_is_refused_in_one_line(tmp_path, capsys, inputs, argv, message):
    argv = [a.format(**inputs) for a in argv]
    code = main(["convert", "--output", str(tmp_path / "out"), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and message in err, err
    assert not os.path.exists(tmp_path / "out")


def test_the_plan_of_a_voc_folder_names_layout_images_and_objects(tmp_path, voc):
    run = cli(tmp_path, "convert", "--input", voc, "--output", str(tmp_path / "out"), "--dry_run=True")
    assert run.exit == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "  images: 3 in layout Pascal VOC; splits: train (2), validation (1) (from the VOC layout " \
           "(train, validation))" in lines
    assert "  annotations: Pascal VOC; label map: 2 classes (ids from 1)" in lines
    assert "  objects per class: 3 in all: cat (2), dog (1)" in lines
    assert "  images without objects: 1 kept as negative examples" in lines
    # The image no XML describes is not converted, and not a bad input (VOC's test images).
    assert "  note: 1 image file(s) under --input that the annotations do not name: not converted" in lines
    assert not any(line.startswith(("  annotation problems:", "  left out:")) for line in lines)
    assert not os.path.exists(tmp_path / "out")


def test_a_handed_over_listing_carries_the_annotations(tmp_path, voc):
    options = PipelineOptions(["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"])
    plan = plan_run(ConvertConfig(input=voc, output=str(tmp_path / "out")), options)
    assert plan.hand_over and plan.config.layout == "voc" and plan.annotated.layout == "voc"
    path = str(tmp_path / "handoff" / "listing.arrow")
    os.makedirs(os.path.dirname(path))
    digest = write_listing(path, plan.listing)
    # As the listing step in another process takes it: by the identity the job graph gives it.
    listing, _, count, _, reused = listing_for(ListingIdentity.of(plan.config), None, path, digest, 0)
    assert reused and count == 3
    carried = {ref.filename: decode_annotations(ref.annotation) for ref in listing.refs}
    assert [o.text for o in carried["JPEGImages/a.jpg"].objects] == ["dog", "cat"]
    assert carried["JPEGImages/c.jpg"].objects == () and {ref.label for ref in listing.refs} == {-1}


def test_skip_unchanged_sees_the_coco_file_change(tmp_path, capsys):
    images = _write(tmp_path / "imgs", {"a.jpg": _jpeg()})
    coco = tmp_path / "instances.json"
    coco.write_text('{"images": [{"id": 1, "file_name": "a.jpg", "width": 32, "height": 24}], '
                    '"annotations": [], "categories": [{"id": 1, "name": "cat"}]}')
    argv = ["convert", "--input", images, "--annotations", str(coco), "--output", str(tmp_path / "out"),
            "--skip_unchanged", "--overwrite"]
    assert main(argv) == 0
    assert main(argv) == 99  # The images and the COCO file unchanged: nothing to do.
    coco.write_text(coco.read_text().replace('"cat"', '"dog"'))
    assert main(argv) == 0
    assert "the annotations file instances.json changed: a full run" in capsys.readouterr().out
