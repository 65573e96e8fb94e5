"""Tests for transforms.codec.sequence: SequenceExample bytes.

The golden serialization is written by hand from the proto3 wire format of
tf.train.SequenceExample (schemas/proto/example.proto, TensorFlow's numbers):

  tag = (field << 3) | wire_type; wire type 2 = length-delimited.
  SequenceExample.context = 1 (Features), feature_lists = 2 (FeatureLists);
  Features.feature = 1 and FeatureLists.feature_list = 1 (map entries: key = 1,
  value = 2); FeatureList.feature = 1 (repeated Feature);
  Feature.bytes_list = 1, float_list = 2, int64_list = 3; XList.value = 1 (packed).
"""

import itertools
import struct

import pytest
from google.protobuf.message import DecodeError

from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.example import (
    bytes_feature,
    encode_example,
    float_feature,
    int64_feature,
)
from beam_tfrecords.transforms.codec.sequence import (
    encode_sequence_example,
    sequence_example_to_dict,
)

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------
# Golden SequenceExample bytes, by hand:
#   context {"id": int64 [7]}, feature_lists {"x": float32 [[1.0], [2.5]]}
# --------------------------------------------------------------------------

_ID_INT64_LIST = b"\x0a\x01" + b"\x07"  # Int64List.value (packed, 1 byte): 7
_ID_FEATURE = b"\x1a\x03" + _ID_INT64_LIST  # Feature.int64_list (field 3), 3 bytes
_ID_ENTRY = b"\x0a\x02id" + b"\x12\x05" + _ID_FEATURE  # key "id", value (5 bytes)
_CONTEXT = b"\x0a\x0b" + _ID_ENTRY  # Features.feature entry, 11 bytes
_STEP_0 = b"\x12\x06" + b"\x0a\x04" + b"\x00\x00\x80\x3f"  # Feature.float_list: [1.0] (f32 LE)
_STEP_1 = b"\x12\x06" + b"\x0a\x04" + b"\x00\x00\x20\x40"  # Feature.float_list: [2.5]
_X_FEATURE_LIST = (
    b"\x0a\x08" + _STEP_0  # FeatureList.feature, 8 bytes
    + b"\x0a\x08" + _STEP_1  # FeatureList.feature, 8 bytes
)
_X_ENTRY = b"\x0a\x01x" + b"\x12\x14" + _X_FEATURE_LIST  # key "x", value (20 bytes)
_FEATURE_LISTS = b"\x0a\x19" + _X_ENTRY  # FeatureLists.feature_list entry, 25 bytes
GOLDEN_SEQ = (
    b"\x0a\x0d" + _CONTEXT  # SequenceExample.context, 13 bytes
    + b"\x12\x1b" + _FEATURE_LISTS  # SequenceExample.feature_lists, 27 bytes
)
GOLDEN_CONTEXT = [("id", "int64", [7])]
GOLDEN_LISTS = [("x", "float32", [[1.0], [2.5]])]


def test_golden_pieces_have_the_lengths_they_claim():
    assert len(_ID_ENTRY) == 0x0B and len(_CONTEXT) == 0x0D
    assert len(_STEP_0) == len(_STEP_1) == 0x08
    assert len(_X_FEATURE_LIST) == 0x14 and len(_X_ENTRY) == 0x19 and len(_FEATURE_LISTS) == 0x1B
    assert len(GOLDEN_SEQ) == 2 + 0x0D + 2 + 0x1B == 44
    assert struct.pack("<f", 1.0) == b"\x00\x00\x80\x3f"
    assert struct.pack("<f", 2.5) == b"\x00\x00\x20\x40"


def test_encode_sequence_example_golden():
    assert encode_sequence_example(GOLDEN_CONTEXT, GOLDEN_LISTS) == GOLDEN_SEQ


def test_context_field_is_an_encoded_example():
    # Example.features and SequenceExample.context are both field 1 of type Features.
    assert GOLDEN_SEQ.startswith(encode_example(GOLDEN_CONTEXT))


MAKERS = {"string": bytes_feature, "int64": int64_feature, "float32": float_feature}


def _reference(context, feature_lists) -> bytes:
    """The same SequenceExample built with the generated classes (both fields set)."""
    message = example_pb2.SequenceExample()
    message.context.SetInParent()
    message.feature_lists.SetInParent()
    for name, dtype, values in context:
        message.context.feature[name].CopyFrom(MAKERS[dtype](values))
    for name, dtype, steps in feature_lists:
        feature_list = message.feature_lists.feature_list[name]
        for values in steps:
            feature_list.feature.add().CopyFrom(MAKERS[dtype](values))
    return message.SerializeToString(deterministic=True)


def test_golden_equals_protobuf_and_parses():
    assert _reference(GOLDEN_CONTEXT, GOLDEN_LISTS) == GOLDEN_SEQ
    message = example_pb2.SequenceExample.FromString(GOLDEN_SEQ)
    assert list(message.context.feature["id"].int64_list.value) == [7]
    steps = message.feature_lists.feature_list["x"].feature
    assert [list(f.float_list.value) for f in steps] == [[1.0], [2.5]]
    assert [f.WhichOneof("kind") for f in steps] == ["float_list", "float_list"]
    assert sequence_example_to_dict(GOLDEN_SEQ) == ({"id": [7]}, {"x": [[1.0], [2.5]]})


SEQUENCE_CASES = {
    "all_empty": ([], []),
    "no_context": ([], [("x", "int64", [[1], [2, 3]])]),
    "no_lists": ([("c", "string", ["only context"])], []),
    "empty_feature_lists": (
        [("n", "int64", [])],
        [("zero_steps", "float32", []), ("empty_steps", "int64", [[], []]), ("s", "string", [[]])],
    ),
    "strings": (
        [("lang", "string", ["pt_BR"]), ("tags", "string", [b"a", "é", b"", b"\x00\xff"])],
        [
            ("tokens", "string", [["héllo", b"world"], [], [""], [b"x" * 200]]),
            ("猫/name", "string", [["chat noir ü"]]),
        ],
    ),
    "numbers": (
        [("i", "int64", [0, -1, 2**63 - 1, -(2**63)]), ("f", "float32", [0.1, -2.5, 3.4e38])],
        [
            ("ratings", "float32", [[4.5], [5.0, 3.0], [1e-45, -0.0]]),
            ("ids", "int64", [[True, False], [127, 128, 16384], [-5]]),
        ],
    ),
    "long_lengths": (  # Multi-byte varint lengths at every nesting level.
        [("blob", "string", [b"z" * 70000])],
        [("frames", "string", [[b"f" * 150] for _ in range(120)]), ("ones", "int64", [[1]] * 300)],
    ),
    "same_name_in_both": ([("k", "int64", [1])], [("k", "int64", [[1]])]),
    "empty_name": ([("", "int64", [1])], [("", "string", [["a"]])]),
}
# No case has one name a prefix of another in the same map: see
# test_prefix_names_sort_shorter_first for why protobuf-python's bytes differ then.


@pytest.mark.parametrize("case", SEQUENCE_CASES.values(), ids=SEQUENCE_CASES.keys())
def test_encode_sequence_example_equals_protobuf_deterministic_bytes(case):
    context, feature_lists = case
    encoded = encode_sequence_example(context, feature_lists)
    assert encoded == _reference(context, feature_lists)
    parsed_context, parsed_lists = sequence_example_to_dict(encoded)
    assert list(parsed_context) == sorted(name for name, _, _ in context)
    assert list(parsed_lists) == sorted(name for name, _, _ in feature_lists)
    for name, _, steps in feature_lists:
        assert len(parsed_lists[name]) == len(steps)


def test_all_empty_sets_both_fields():
    assert encode_sequence_example([], []) == b"\x0a\x00" + b"\x12\x00"


def test_empty_feature_list_and_empty_step_bytes():
    # "e": no steps → entry with an empty FeatureList; "s": one step, empty Int64List.
    assert encode_sequence_example([], [("e", "int64", [])]) == (
        b"\x0a\x00" + b"\x12\x07" + b"\x0a\x05" + b"\x0a\x01e" + b"\x12\x00"
    )
    assert encode_sequence_example([], [("s", "int64", [[]])]) == (
        b"\x0a\x00" + b"\x12\x0b" + b"\x0a\x09" + b"\x0a\x01s" + b"\x12\x04"
        + b"\x0a\x02" + b"\x1a\x00"  # FeatureList.feature: Feature with an empty int64_list
    )


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_encode_sequence_example_any_order(order):
    context = [("b", "int64", [2]), ("a", "string", ["x"]), ("c", "float32", [0.5])]
    lists = [("z", "int64", [[1]]), ("m", "string", [["s"], []]), ("a", "float32", [[1.5, 2.0]])]
    expected = encode_sequence_example(context, lists)
    assert encode_sequence_example([context[i] for i in order], [lists[i] for i in order]) == expected
    assert expected == _reference(context, lists)


def test_encode_sequence_example_accepts_iterators():
    context = iter(GOLDEN_CONTEXT)
    lists = (item for item in [("x", "float32", iter([[1.0], [2.5]]))])
    assert encode_sequence_example(context, lists) == GOLDEN_SEQ


def test_round_trip_values():
    context = [("s", "string", ["é", b"\x00"]), ("i", "int64", [-3]), ("f", "float32", [0.25])]
    lists = [("tok", "string", [["a", "b"], [], [b"c"]]), ("v", "float32", [[1.5], [0.1]])]
    parsed = sequence_example_to_dict(encode_sequence_example(context, lists))
    assert parsed == (
        {"f": [0.25], "i": [-3], "s": ["é".encode(), b"\x00"]},
        {"tok": [[b"a", b"b"], [], [b"c"]], "v": [[1.5], [pytest.approx(0.1, rel=1e-7)]]},
    )


@pytest.mark.parametrize(
    "context, lists",
    [
        ([("c", "float64", [1.0, 2.0])], []),
        ([("c", "float64", [1.0])], []),
        ([], [("x", "float64", [[1.0]])]),
        ([], [("x", "bytes", [])]),  # Checked even with no steps.
    ],
)
def test_rejects_unknown_dtype(context, lists):
    with pytest.raises(ValueError, match="float32"):
        encode_sequence_example(context, lists)


def test_rejects_duplicate_names():
    with pytest.raises(ValueError, match="'a'"):
        encode_sequence_example([("a", "int64", [1]), ("a", "int64", [2])], [])
    with pytest.raises(ValueError, match="'x'"):
        encode_sequence_example([], [("x", "int64", [[1]]), ("x", "int64", [])])


@pytest.mark.parametrize("step", ["abc", b"abc"])
def test_rejects_bare_string_step(step):
    with pytest.raises(TypeError, match="list of values"):
        encode_sequence_example([], [("x", "string", [step])])


def test_sequence_example_to_dict_edge_cases():
    assert sequence_example_to_dict(b"") == ({}, {})
    message = example_pb2.SequenceExample()
    message.context.feature["e"].SetInParent()  # A Feature with no list set.
    message.feature_lists.feature_list["l"].feature.add()
    assert sequence_example_to_dict(message.SerializeToString()) == ({"e": []}, {"l": [[]]})
    with pytest.raises(DecodeError, match=r"Error parsing message with type 'beam_tfrecords\.v1\.SequenceExample'"):
        sequence_example_to_dict(b"\x12\x05\x01")  # length 5, one byte present


def _entry_keys(features_or_lists: bytes) -> list[bytes]:
    """The keys of a serialized map field's entries, in wire order."""
    keys, pos = [], 0
    while pos < len(features_or_lists):
        assert features_or_lists[pos] == 0x0A  # map entry, field 1
        size = features_or_lists[pos + 1]  # (test data keeps these under 128)
        entry = features_or_lists[pos + 2:pos + 2 + size]
        assert entry[0] == 0x0A  # key, field 1
        keys.append(entry[2:2 + entry[1]])
        pos += 2 + size
    return keys


def test_prefix_names_sort_shorter_first():
    """Map entries are ordered by the names' UTF-8 bytes, a prefix before its
    extensions, as C++ protobuf's deterministic serialization (std::less) and
    encode_example order them. protobuf-python (upb) 6.x orders a longer key
    before its prefix ("ab" before "a", "" last): _upb_mapsorter_cmpstr negates
    memcmp and the encoder emits the sorted entries backwards (open upstream
    fix: protocolbuffers/protobuf#26621). Maps are unordered, so both parse to
    the same message.
    """
    names = ["ab", "", "a", "b", "aa", "é"]
    context = [(name, "int64", [1]) for name in names]
    lists = [(name, "int64", [[1]]) for name in names]
    encoded = encode_sequence_example(context, lists)
    expected_order = [b"", b"a", b"aa", b"ab", b"b", "é".encode()]
    context_size = encoded[1]
    assert _entry_keys(encoded[2:2 + context_size]) == expected_order
    lists_field = encoded[2 + context_size:]
    assert lists_field[0] == 0x12 and lists_field[1] == len(lists_field) - 2
    assert _entry_keys(lists_field[2:]) == expected_order
    reference = _reference(context, lists)
    assert example_pb2.SequenceExample.FromString(encoded) == example_pb2.SequenceExample.FromString(
        reference
    )
    assert sequence_example_to_dict(encoded) == sequence_example_to_dict(reference)
