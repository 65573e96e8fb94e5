"""The images' hand-off as columns (issue 23): ``RefColumns``, the plan made on
them, and batches encoded in one task (``io.image_batches``) each.

The oracle is the way of before: a tuple of ``ImageRef`` packed by
``ImageRefs.pack``, planned by ``_ref_specs``, encoded file by file with
``ImageRecordBuilder.framed``.
"""

from __future__ import annotations

import dataclasses
import io
import pickle

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, ImageRefs, RefColumns
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.image_listing import pack_refs
from beam_tfrecords.transforms.image_steps import ImageRecords, image_shards
from beam_tfrecords.transforms.io.image_batches import batch_bounds
from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder
from beam_tfrecords.transforms.plan.layouts import list_class_folders
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.transforms.plan.shard_cuts import shard_spec, stable_key

pytestmark = pytest.mark.unit


def _refs(count: int, seed: int = 0) -> list[ImageRef]:
    rng = np.random.default_rng(seed)
    refs = []
    for i in range(count):
        split = ("train", "val", "test")[int(rng.integers(3))]
        name = f"{split}/c{int(rng.integers(5))}/img_{i:05d}{'é' if i % 7 == 0 else ''}.png"
        extra = (("score", "float32", float(i)),) if i % 11 == 0 else ()
        refs.append(ImageRef(split, stable_key(split, name), name, f"/in/{name}", int(rng.integers(1, 90_000)),
                             i % 5, f"class{i % 5}" if i % 13 else "", extra, generation=i % 3,
                             crc32c=-1 if i % 4 else i, annotation=b"{}" if i % 9 == 0 else b""))
    # The same name listed twice in a split (a manifest may): the sort keeps listing order.
    refs.append(ImageRef(refs[0].split, refs[0].key, refs[0].filename, "/elsewhere/x.png", 5, 1, "class1"))
    return refs


def test_columns_hold_every_field_and_pickle_back_equal():
    refs = _refs(300)
    columns = RefColumns.of(refs)
    back = ImageRefs.pack_columns(refs).unpack()
    assert isinstance(back, RefColumns) and len(back) == len(refs)
    assert back == refs and list(back) == refs and back[-1] == refs[-1] and back[3:9] == tuple(refs[3:9])
    assert [r.annotation for r in back] == [r.annotation for r in refs]
    assert list(columns.take([5, 2, 5])) == [refs[5], refs[2], refs[5]]
    assert list(columns.span(290, 400)) == refs[290:]
    assert columns.column("size") == [r.size for r in refs]
    plain = RefColumns.of([ImageRef("train", "k", "a.png", "/in/a.png", 3, 0, "cat")])
    assert plain.column("crc32c") == [-1] and plain.column("annotation") == [b""]
    assert pickle.loads(pickle.dumps(plain)) == [ImageRef("train", "k", "a.png", "/in/a.png", 3, 0, "cat")]


@pytest.mark.parametrize("band", [ShardBand(1_000_000, 2_000_000), ShardBand(10**9, 2 * 10**9)])
def test_the_plan_on_columns_equals_the_plan_on_objects(band):
    refs = _refs(1500, seed=4)
    old = [(s.split, s.index, s.num_shards, s.name, s.planned_bytes, s.records.count, tuple(s.records.unpack()))
           for s in image_shards(ImageRefs.pack(refs), band, "none")]
    new = list(image_shards(ImageRefs.pack_columns(refs), band, "none"))
    assert all(isinstance(s.records.unpack(), RefColumns) for s in new)
    assert [(s.split, s.index, s.num_shards, s.name, s.planned_bytes, s.records.count, tuple(s.records.unpack()))
            for s in new] == old
    assert len(old) > 3 if band.max_bytes < 10**7 else len(old) == 3


def _png(path, shade: int, size=(6, 4), mode="RGB") -> int:
    out = io.BytesIO()
    Image.new(mode, size, shade).save(out, format="PNG")
    path.write_bytes(out.getvalue())
    return len(out.getvalue())


def _chunks(source: ImageRecords, records) -> list:
    spec = shard_spec("train", 0, 1, "none", 1000, records)
    return list(source.chunks(spec))


@pytest.mark.parametrize("workers", [1, 3])  # Two batches a task, then one.
def test_batches_hand_back_what_each_file_alone_gives(tmp_path, monkeypatch, workers):
    """Every record form (objects, columns, a table) gives the same chunks, equal to
    ``framed`` file by file: bytes, labels, notes, contents, image facts, dead letters;
    however many batches a task holds."""
    root = tmp_path / "in"
    for split in ("train",):
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
    files = []
    for i in range(150):
        rel = f"train/{('cat', 'dog')[i % 2]}/{i:03d}.png"
        size = _png(root / rel, i, (6 + i % 3, 4), "L" if i % 5 == 0 else "RGB")
        if i == 40:
            (root / rel).write_bytes(b"\x89PNG\r\n\x1a\n" + b"broken" * 10)  # Not a PNG: dead-lettered.
            size = 68
        if i == 90:
            (root / rel).unlink()  # Gone since listed: a read error.
        files.append((str(root / rel), size))
    table = list_class_folders(str(root), iter(files), compact=True).refs
    refs = list(table)
    builder = ImageRecordBuilder()
    expected_framed, expected_dead, contents, images, labels = [], [], [], [], []
    for ref in refs:
        built = builder.framed(ref)
        if isinstance(built, DeadLetter):
            expected_dead.append(built)
            continue
        expected_framed.append(b"".join(built[0]))
        outcome = built[1]
        contents.append((outcome.sha256, ref.filename, ""))
        images.append(outcome.image)
        labels.append(ref.label_text)
    assert [(d.source, d.stage) for d in expected_dead] == [("train/cat/040.png", "validate"),
                                                            ("train/cat/090.png", "read")]
    monkeypatch.setattr("beam_tfrecords.transforms.io.image_batches._CHUNK_FILES", 16)
    source = ImageRecords(read_threads=workers)
    source.setup()
    try:
        forms = [ImageRefs.pack(refs), ImageRefs.pack_columns(refs), pack_refs(table)]
        got = [_chunks(source, form) for form in forms]
    finally:
        source.teardown()
    assert isinstance(forms[2].unpack(), type(table))
    noted = table.with_annotations([b"x" * (i % 3) for i in range(len(table))])
    for start, stop in ((0, 16), (37, 90), (140, 200)):  # What a helper process is handed.
        span = pickle.loads(pickle.dumps(noted.span(start, stop)))
        assert list(span) == list(noted)[start:stop] and list(table.span(start, stop)) == refs[start:stop]
        assert list(span.ref_columns()) == list(span) and list(table.span(start, stop).ref_columns()) == list(
            table.span(start, stop))
    for chunks in got:
        assert [c.inputs for c in chunks] == [16] * 9 + [6]
        assert b"".join(c.framed for c in chunks) == b"".join(expected_framed)
        assert sum(c.records for c in chunks) == len(expected_framed) == 148
        assert [d for c in chunks for d in c.dead] == expected_dead
        assert [x for c in chunks for x in c.labels] == labels
        assert [x for c in chunks for x in c.contents] == contents
        assert [x for c in chunks for x in c.images] == images
        assert all(c.notes == ("",) * c.records and c.annotations == () for c in chunks)
        assert all(len(c.labels) == len(c.notes) == len(c.contents) == len(c.images) == c.records
                   for c in chunks)
    assert got[0] == got[1] == got[2]


def test_a_table_makes_the_references_take_makes():
    files = [(f"gs://b/in/{split}/c{i % 3}/{i:04d}{'é' if i % 5 == 0 else ''}.jpg", 100 + i, 7 * i, i)
             for i, split in enumerate(["train", "val"] * 40)]
    table = list_class_folders("gs://b/in", iter(files), compact=True).refs
    assert len(table) == 80 and any(r.generation for r in table) and any(r.crc32c > 0 for r in table)
    assert list(table.ref_columns()) == list(table)
    assert list(table.span(10, 30).ref_columns()) == list(table)[10:30]
    noted = table.with_annotations([b"n" * (i % 4) for i in range(80)])
    for picked in ([], [5], [79, 0, 3, 3, 41], list(range(80))[::-1]):
        for t in (table, noted):
            got, want = t.gather(picked), t.rows(picked)
            assert (got.blob, got.offsets.tolist()) == (want.blob, want.offsets.tolist())
            assert list(got) == list(want) and (got.annotations is None) == (t.annotations is None)


def test_references_a_table_can_hold_become_one_and_others_not():
    files = [(f"/in/{split}/c{i % 3}/{i:04d}{'é' if i % 5 == 0 else ''}.jpg", 100 + i)
             for i, split in enumerate(["train", "val", "test"] * 30)]
    refs = list(list_class_folders("/in", iter(files), compact=True).refs)
    for form in (refs, [dataclasses.replace(r, annotation=b"{}" * (i % 3)) for i, r in enumerate(refs)]):
        table = RefTable.from_columns(RefColumns.of(form))
        assert isinstance(table, RefTable) and list(table) == form
        assert [s.records.unpack() for s in image_shards(pack_refs(table), ShardBand(4000, 8000), "none")] == [
            s.records.unpack() for s in image_shards(ImageRefs.pack(form), ShardBand(4000, 8000), "none")]
    odd = [dataclasses.replace(refs[0], path="/elsewhere/x.jpg"), dataclasses.replace(refs[0], label=-1),
           dataclasses.replace(refs[0], extra=(("a", "int64", 1),)), dataclasses.replace(refs[0], generation=3),
           dataclasses.replace(refs[0], key=refs[0].key.upper()), dataclasses.replace(refs[0], key="k"),
           dataclasses.replace(refs[0], label_text="other")]
    for ref in odd:  # Each one a table cannot hold as it is: kept as columns.
        assert RefTable.from_columns(RefColumns.of(refs + [ref])) is None
    assert RefTable.from_columns(RefColumns.of([])) is None


def test_batch_bounds_cut_by_files_and_bytes():
    assert batch_bounds([], 4, 100) == [0]
    assert batch_bounds([1] * 9, 4, 100) == [0, 4, 8, 9]
    assert batch_bounds([60, 60, 10, 200, 5], 4, 100) == [0, 1, 3, 4, 5]


def test_annotated_images_dropped_objects_follow_the_files_refused_before_them(tmp_path):
    """Per annotated image the writer's process adds its facts and its dropped objects,
    in file order among the batch's refused files (as when it did it file by file)."""
    from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach
    from beam_tfrecords.transforms.io.image_batches import chunk_fields, encode_batch
    from tests.test_annotated_records import LABELS, OBJECTS
    from tests.test_annotated_records import _png as annotated_png
    from tests.test_annotated_records import _ref as annotated_ref

    data = annotated_png(str(tmp_path / "a.png"))
    gone = [ImageRef("train", f"g{i}", f"g{i}.png", str(tmp_path / f"gone{i}.png"), 10, -1, "") for i in range(3)]
    refs = [gone[0], annotated_ref(str(tmp_path / "a.png"), "a.png", data), gone[1],
            annotated_ref(str(tmp_path / "a.png"), "b.png", data, objects=OBJECTS[:2]), gone[2],
            annotated_ref(str(tmp_path / "a.png"), "c.png", data)]
    batch = encode_batch(ImageRecordBuilder(attach=AnnotationAttach(None, LABELS)), RefColumns.of(refs))
    fields = chunk_fields(pickle.loads(pickle.dumps(batch)))
    dead = fields[2]
    assert [(d.source.rsplit(":", 1)[0] if d.stage == "object" else d.source, d.stage) for d in dead] == [
        ("g0.png", "read"), ("a.json", "object"), ("a.json", "object"), ("g1.png", "read"),
        ("g2.png", "read"), ("a.json", "object"), ("a.json", "object")]
    assert [d.message.rsplit(" of ", 1)[-1] for d in dead if d.stage == "object"] == [
        "a.png, the image kept", "a.png, the image kept", "c.png, the image kept", "c.png, the image kept"]
    facts = fields[8]
    assert fields[1] == 3 and [len(objects) for _, _, objects, _ in facts] == [2, 2, 2]
