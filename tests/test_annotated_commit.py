"""What an annotated run publishes (issue 21, commit side), through the library API.

``convert(config, attach=AnnotationAttach(index, label_map))`` over a generated class
folder (a library user's own annotations: the run is recorded as layout ``custom``):
the manifest's ``annotations`` section, ``label_map.pbtxt`` beside it (journalled and
ownership-checked like the shards), the dropped objects' dead letters (stage
``object``) that the error budget does not count, a rerun with ``overwrite`` that
replaces the label map, a plain rerun that removes it, and a ``label_map.pbtxt`` this
product did not write, which a run refuses to touch.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.job_graph import annotated_attach
from beam_tfrecords.pipeline import convert
from beam_tfrecords.preflight import ConvertError
from beam_tfrecords.schemas.annotations import AnnotatedRun, ImageAnnotations, LabelMap, ObjectAnnotation
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.transforms.codec.masks import render_mask
from beam_tfrecords.transforms.io.annotated_output import label_map_bytes
from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach
from beam_tfrecords.transforms.io.ownership import claim_output, file_claim, journal_commit
from beam_tfrecords.transforms.quality.drift import DriftGate, compare
from tests.conftest import dead_letters, load_manifest, read_dataset

LABELS = LabelMap(((1, "cat"), (7, "dog's")))  # Ids as COCO gives them; a quote to escape.
SIZES = {"cat/a.png": (40, 30), "cat/b.png": (20, 20), "dog/c.png": (64, 48)}
INDEX = {
    "cat/a.png": ImageAnnotations("cat/a.png", "11", (
        ObjectAnnotation((2.0, 2.0, 12.0, 10.0), 1, "cat", source="ann.json: annotation 1"),
        ObjectAnnotation((30.0, 20.0, 50.0, 40.0), 7, "dog's", source="ann.json: annotation 2"),  # Clipped.
    )),
    "cat/b.png": ImageAnnotations("cat/b.png", "12", ()),  # A negative example.
    "dog/c.png": ImageAnnotations("dog/c.png", "13", (
        ObjectAnnotation((0.0, 0.0, 64.0, 48.0), 7, "dog's", source="ann.json: annotation 3"),
        ObjectAnnotation((70.0, 1.0, 80.0, 5.0), 1, "cat", source="ann.json: annotation 4"),  # Outside.
    )),
}


def _inputs(root: str) -> None:
    for rel, (width, height) in SIZES.items():
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        Image.fromarray(np.full((height, width, 3), 90, np.uint8)).save(os.path.join(root, rel))


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.e2e
def test_an_annotated_run_publishes_its_label_map_and_annotations_and_a_rerun_replaces_them(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _inputs(root)
    config = ConvertConfig(input=root, output=out, max_bad_fraction=0.0)
    result = convert(config, attach=AnnotationAttach(INDEX, LABELS))
    # The budget is zero and an object was dead-lettered: objects are not what it counts.
    assert result.ok, result.report
    manifest = load_manifest(out)
    label_map = _read(os.path.join(out, "label_map.pbtxt"))
    assert label_map == b"item {\n  id: 1\n  name: 'cat'\n}\nitem {\n  id: 7\n  name: 'dog\\'s'\n}\n"
    section = manifest["annotations"]
    assert section["layout"] == "custom"
    assert section["label_map"]["items"] == [{"id": 1, "name": "cat"}, {"id": 7, "name": "dog's"}]
    assert section["label_map"]["path"] == "label_map.pbtxt"
    assert section["problems"] == {"box_clipped": 1, "box_empty": 1}
    assert (section["images_without_objects"], section["objects_dead_lettered"]) == (1, 1)
    stats = section["statistics"]
    assert (stats["images"], stats["objects"]) == (3, 3)
    assert [(c["id"], c["objects"]) for c in stats["classes"]] == [(1, 1), (7, 2)]
    assert stats["areas"] == {"large": 0, "medium": 1, "small": 2}  # 80, 100 and 64x48 px.
    assert manifest["splits"]["train"]["statistics"]["annotations"] == stats  # One split: the same.
    assert manifest["labels"]["vocabulary"] == ["cat", "dog's"]
    assert manifest["features"]["image/object/bbox/xmin"] == {"dtype": "float32", "shape": [None]}
    assert manifest["features"]["image/source_id"] == {"dtype": "string", "shape": []}
    assert manifest["bad_records"]["total"] == 0 and manifest["error_budget"]["bad"] == 0
    letters = [d for d in dead_letters(out) if d["stage"] == "object"]
    assert [(d["source"], d["error"]) for d in letters] == [("ann.json: annotation 4", "box_empty")]
    assert manifest["bad_records"]["dead_letter_files"]  # Listed, so the next run owns it.
    records = {r["image/filename"][0].decode(): r for shard in read_dataset(out).values() for r in shard}
    assert records["dog/c.png"]["image/source_id"] == [b"13"]
    assert records["dog/c.png"]["image/object/class/label"] == [7]

    # Another label map, --overwrite: the file is replaced, and proved ours by the manifest.
    other = LabelMap(((1, "cat"), (7, "hound")))
    again = convert(dataclasses.replace(config, overwrite=True), attach=AnnotationAttach(INDEX, other))
    assert again.ok, again.report
    assert b"name: 'hound'" in _read(os.path.join(out, "label_map.pbtxt"))
    # A plain run over it: the old label map goes with the dataset it described.
    plain = convert(dataclasses.replace(config, overwrite=True))
    assert plain.ok, plain.report
    assert not os.path.exists(os.path.join(out, "label_map.pbtxt"))
    assert "annotations" not in load_manifest(out)


@pytest.mark.e2e
def test_a_label_map_this_product_did_not_write_is_refused_and_kept(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _inputs(root)
    os.makedirs(out)
    planted = os.path.join(out, "label_map.pbtxt")
    with open(planted, "wb") as f:
        f.write(b"item { id: 1 name: 'mine' }\n")
    for overwrite in (False, True):
        with pytest.raises(ConvertError, match="label_map.pbtxt"):
            convert(ConvertConfig(input=root, output=out, overwrite=overwrite),
                    attach=AnnotationAttach(INDEX, LABELS))
    assert _read(planted) == b"item { id: 1 name: 'mine' }\n"
    assert sorted(os.listdir(out)) == ["label_map.pbtxt"]


@pytest.mark.unit
def test_a_plan_with_an_annotated_layout_gets_the_attachment_that_reads_its_references():
    class Plan:  # What annotated_attach reads of a RunPlan.
        annotated = AnnotatedRun("coco", LABELS, instance_masks=True, images_root="images")

    attach, annotated = annotated_attach(Plan, None)
    assert isinstance(attach, AnnotationAttach) and attach.render is render_mask
    assert attach.options.instance_masks and attach.options.images_root == "images"
    assert annotated is Plan.annotated
    Plan.annotated = None
    mine = AnnotationAttach(INDEX, LABELS)
    attach, annotated = annotated_attach(Plan, mine)
    assert attach is mine and annotated == AnnotatedRun("custom", LABELS)
    assert annotated_attach(Plan, None) == (None, None)


@pytest.mark.e2e
def test_resized_images_carry_their_annotation_statistics_through_the_spools(tmp_path):
    root, out = str(tmp_path / "in"), str(tmp_path / "out")
    _inputs(root)
    # --max_side 32: records are encoded into spools first, then copied into shards.
    result = convert(ConvertConfig(input=root, output=out, max_side=32), attach=AnnotationAttach(INDEX, LABELS))
    assert result.ok, result.report
    section = load_manifest(out)["annotations"]
    assert section["problems"] == {"box_clipped": 1, "box_empty": 1}
    stats = section["statistics"]
    assert (stats["images"], stats["images_without_objects"], stats["objects"]) == (3, 1, 3)
    # Areas in output pixels: dog/c.png is 32x24 now (its box 768 px: small, no longer medium).
    assert stats["areas"] == {"large": 0, "medium": 0, "small": 3}
    assert [(d["source"], d["stage"]) for d in dead_letters(out)] == [("ann.json: annotation 4", "object")]


@pytest.mark.unit
def test_the_drift_gate_compares_object_class_shares_when_both_datasets_have_them():
    def stats(cats: int, dogs: int) -> dict:
        return {"records": 10, "annotations": {"objects": cats + dogs, "classes": [
            {"id": 1, "text": "cat", "objects": cats}, {"id": 7, "text": "dog", "objects": dogs}]}}

    gate = DriftGate("old", "old/manifest.json", {"features": {}, "splits": {"train": {
        "records": 10, "statistics": stats(5, 5)}}})
    report = compare(gate, {}, {"train": stats(9, 1)})
    shares = [c for c in report["checks"] if c["check"] == "object_class_share"]
    assert [(c["class"], c["old"], c["new"], c["verdict"]) for c in shares] == [
        ("cat", 0.5, 0.9, "failed"), ("dog", 0.5, 0.1, "failed")]
    assert report["status"] == "failed"
    assert compare(gate, {}, {"train": stats(5, 5)})["status"] == "passed"
    plain = compare(gate, {}, {"train": {"records": 10}})  # The new dataset has none: no check.
    assert not [c for c in plain["checks"] if c["check"] == "object_class_share"]


@pytest.mark.unit
def test_a_label_map_a_killed_commit_left_is_proved_ours_by_the_journal_by_its_bytes(tmp_path):
    out = str(tmp_path)
    data = label_map_bytes(LABELS)
    # What a commit records before its moves (then killed: no manifest lists the file).
    journal_commit(out, "r1", [file_claim("label_map.pbtxt", data, ".beam-tfrecords/tmp-r1/label_map.pbtxt")], None)
    with open(os.path.join(out, "label_map.pbtxt"), "wb") as f:
        f.write(data)
    claims = claim_output(out)
    assert "label_map.pbtxt" in claims.leftovers and not claims.refusal()
    with open(os.path.join(out, "label_map.pbtxt"), "ab") as f:  # Other bytes: not ours any more.
        f.write(b"item {\n  id: 9\n  name: 'added'\n}\n")
    assert "label_map.pbtxt" in claim_output(out).foreign
