"""An image's annotations travel in its reference (issue 21): the bytes encoding of one
``ImageAnnotations`` (``transforms.codec.annotation_bytes``) and ``ImageRef.annotation``
through packing, the listing's hand-off parts and the shard plan's size estimate."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import pickle

import numpy as np
import pytest

from beam_tfrecords.schemas.annotations import ImageAnnotations, ObjectAnnotation, Polygons, Rle
from beam_tfrecords.schemas.elements import ImageRef, ImageRefs
from beam_tfrecords.transforms.codec.annotation_bytes import decode_annotations, encode_annotations
from beam_tfrecords.transforms.io.image_records import estimated_record_size, record_overheads
from beam_tfrecords.transforms.plan.handoff import HandoffError, decode_part, encode_part
from beam_tfrecords.transforms.plan.ref_table import RefTable, concat_tables

pytestmark = pytest.mark.unit

# Every field away from its default, and floats that print long or oddly.
FULL = ImageAnnotations(
    path="a/b\u00e9.jpg", source_id="397133",
    objects=(
        ObjectAnnotation((0.1, 1e-300, 640.0000000000001, 2.5), 18, "dog", is_crowd=True, area=1234.5678,
                         difficult=True, truncated=True,
                         segmentation=Polygons(((1.5, 2.25, 3.0, 4.0, 5.125, 6.0),
                                                (0.0, 0.0, 1.0, 0.0, 1.0, 1.0))),
                         source="instances.json: annotation 1"),
        ObjectAnnotation((1, 2, 3, 4), 1, "person", area=None, segmentation=Rle((480, 640), (0, 5, 300, 7)),
                         source="instances.json: annotation 2"),
        ObjectAnnotation((0.25, 0.5, 0.75, 1.0), 3, "caf\u00e9 'x'", difficult=True,
                         segmentation=Rle((2, 2), (4,))),
    ),
    labels=(3, 1), texts=("x", "y\u2603"), units="normalized", stated_size=(640, 480),
    mask="masks/b.png", split="validation", source="Annotations/b.xml")


@pytest.mark.parametrize("annotations", [
    FULL,
    ImageAnnotations("x.jpg", "x.jpg"),  # Every field at its default.
    ImageAnnotations("y.jpg", "y", objects=(ObjectAnnotation((0.0, 0.0, 1.0, 1.0), 0, "", truncated=True),)),
], ids=["every_field", "defaults", "one_flag"])
def test_encoding_round_trips_every_field_exactly(annotations):
    data = encode_annotations(annotations)
    back = decode_annotations(data)
    assert back == annotations
    assert encode_annotations(back) == data  # Deterministic: the same annotations, the same bytes.
    # Compact and canonical: sorted keys, no whitespace between tokens, ASCII.
    assert data == json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode("ascii")
    for mine, theirs in zip(back.objects, annotations.objects):
        assert [float(v).hex() for v in mine.box] == [float(v).hex() for v in theirs.box]


def test_each_field_reaches_the_decoded_value():
    back = decode_annotations(encode_annotations(FULL))
    first, second, third = back.objects
    assert (first.is_crowd, first.difficult, first.truncated, first.area) == (True, True, True, 1234.5678)
    assert first.segmentation.rings[0] == (1.5, 2.25, 3.0, 4.0, 5.125, 6.0)
    assert second.segmentation == Rle((480, 640), (0, 5, 300, 7)) and second.area is None
    assert (second.is_crowd, second.difficult, second.truncated) == (False, False, False)
    assert third.text == "caf\u00e9 'x'" and third.segmentation.size == (2, 2)
    assert (back.units, back.stated_size, back.mask, back.split) == ("normalized", (640, 480), "masks/b.png",
                                                                     "validation")
    assert (back.labels, back.texts, back.source) == ((3, 1), ("x", "y\u2603"), "Annotations/b.xml")


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", b"not json", b"[1,2]", b'{"v":2,"p":"a","i":"a"}', b'{"v":1,"p":"a"}',
    b'{"v":1,"p":"a","i":"a","x":1}', b'{"v":1,"p":"a","i":"a","u":"inches"}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3],1,"",0,null,null,""]]}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3,"4"],1,"",0,null,null,""]]}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3,4],true,"",0,null,null,""]]}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3,4],1,"",8,null,null,""]]}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3,4],1,"",0,null,{"q":1},""]]}',
    b'{"v":1,"p":"a","i":"a","o":[[[1,2,3,4],1,"",0,null,{"r":[1,2]},""]]}',
    b'{"v":1,"p":"a","i":"a","z":[1,2,3]}', b"[" * 100_000,
    pickle.dumps(FULL),  # Never unpickled: refused as not JSON.
], ids=lambda d: f"{len(d)}b")
def test_garbage_is_refused_with_a_value_error(data):
    with pytest.raises(ValueError, match="are not annotations") as caught:
        decode_annotations(data)
    assert "not json" not in str(caught.value) and "inches" not in str(caught.value)  # Content not quoted.


# SHA-256 of the bytes 84f633c (before ImageRef.annotation) made of ``_refs()`` and ``_table()``.
PINNED = {"packed": "3c943e68229a88322e0e27e7cfecf4ecb28ae7645a8fdca36c4d0ba68cbaf230",
          "list_part": "f19b3b30472af3aee6bf1948b2a1dc53dd9a7fa249ee306a89f1c60106856afb",
          "table_part": "679ff5acaf43813d6b68a4f6d9e68eb027cd3042936dedd83faee020da0481ce",
          "table_pickle": "755bd3272131271c6d4d5cd6ac71ccb22799c9549702c936161ad627f581eaaa"}


def _refs():
    """The references whose pre-annotation bytes are pinned below (computed on 84f633c)."""
    return [ImageRef("train", "00ab", "cat/a.jpg", "/in/cat/a.jpg", 1234, 0, "cat"),
            ImageRef("validation", "ff01", "dog/b\u00e9.png", "gs://b/in/dog/b\u00e9.png", 99, 1, "dog",
                     (("score", "float32", 0.5), ("tag", "string", "x")), 1700000000000001, 123456789)]


def _table():
    return RefTable("/in", b"cat/a.jpgdog/b.png", np.array([0, 9, 18], np.int64),
                    np.array([1234, 99], np.int64),
                    np.array([0, 1], np.int32), ("train", "validation"), np.array([0, 1], np.int32),
                    ("cat", "dog"), np.array([[1, 2], [3, 4]], np.uint64))


def _part(refs) -> bytes:
    sink = io.BytesIO()
    encode_part(refs, sink)
    return sink.getvalue()


def test_references_without_annotations_keep_their_bytes():
    """Packed, handed off and estimated exactly as before ``ImageRef.annotation`` existed."""
    digest = lambda data: hashlib.sha256(data).hexdigest()  # noqa: E731
    assert digest(ImageRefs.pack(_refs()).packed) == PINNED["packed"]
    assert digest(_part(_refs())) == PINNED["list_part"]
    assert digest(_part(_table())) == PINNED["table_part"]
    assert digest(pickle.dumps(_table(), protocol=pickle.HIGHEST_PROTOCOL)) == PINNED["table_pickle"]
    assert [estimated_record_size(r) for r in _refs()] == [1570, 470]


def _annotated():
    data = encode_annotations(FULL)
    return [dataclasses.replace(_refs()[0], annotation=data), _refs()[1]], data


def test_annotations_survive_packing_a_hand_off_part_and_the_estimate():
    refs, data = _annotated()
    unpacked = ImageRefs.pack(refs).unpack()
    assert list(unpacked) == refs and unpacked[0].annotation == data and unpacked[1].annotation == b""
    part = _part(refs)
    back = decode_part(part, hashlib.sha256(part).hexdigest(), "listing-00000.arrow")
    assert back == refs and back[0].annotation == data and back[1].annotation == b""
    assert decode_annotations(back[0].annotation) == FULL
    assert estimated_record_size(refs[0]) == 1570 + len(data)
    assert [r.annotation for r in _table()] == [b"", b""]  # Folder layouts carry none.


def test_a_changed_annotation_in_a_part_is_refused_and_never_unpickled():
    refs, data = _annotated()
    part = _part(refs)
    tampered = part.replace(data[:20], b"X" * 20, 1)
    assert tampered != part
    with pytest.raises(HandoffError, match="not the one the launcher wrote"):
        decode_part(tampered, hashlib.sha256(part).hexdigest(), "listing-00000.arrow")


def test_a_reference_refuses_an_annotation_that_is_not_bytes():
    with pytest.raises(ValueError, match="annotation must be bytes"):
        ImageRef("train", "k", "a.jpg", "/in/a.jpg", 1, 0, "", annotation="{}")


def test_a_table_carries_annotations_through_rows_splits_joins_pickles_and_its_part():
    data = encode_annotations(FULL)
    table = _table().with_annotations([b"", data])
    assert [r.annotation for r in table] == [b"", data]
    assert table.annotation_lengths().tolist() == [0, len(data)]
    assert _table().annotation_lengths().tolist() == [0, 0] and _table().with_annotations([b"", b""]) == _table()
    assert [r.annotation for r in table.rows([1, 0])] == [data, b""]
    assert [r.annotation for r in table.with_splits(lambda name: "test")] == [b"", data]
    assert [r.annotation for r in concat_tables([_table(), table, table.rows([1])])] == [b"", b"", b"", data, data]
    assert list(pickle.loads(pickle.dumps(table))) == list(table)
    part = _part(table)
    back = decode_part(part, hashlib.sha256(part).hexdigest(), "listing-00000.arrow")
    assert isinstance(back, RefTable) and list(back) == list(table) and back[1].annotation == data
    # The planned size of a table's record is what estimated_record_size says of its reference.
    planned = record_overheads(table.vocabulary)[table.labels] + table.sizes + table.name_lengths()
    assert (planned + table.annotation_lengths()).tolist() == [estimated_record_size(r) for r in table]
