"""Tests for transforms.codec.example and transforms.codec.image_example: Example bytes and sizes.

The golden serializations are written by hand from the proto3 wire format of
tf.train.Example (schemas/proto/example.proto), not produced by our code:

  tag = (field << 3) | wire_type; wire type 2 = length-delimited, 0 = varint.
  Example.features = 1; Features.feature = 1 (map entry: key = 1, value = 2);
  Feature.bytes_list = 1, float_list = 2, int64_list = 3; XList.value = 1 (packed).
"""

import hashlib
import io
import itertools
import struct

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from PIL import Image

from beam_tfrecords.schemas.features import DTYPES, IMAGE_FEATURE_SPEC, FeatureSpec, image_feature_spec
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.example import (
    bytes_feature,
    encode_example,
    example_to_dict,
    float_feature,
    int64_feature,
    make_example,
    serialize_example,
    varint_size,
)
from beam_tfrecords.transforms.codec.image_example import encode_image_example, image_example_size
from beam_tfrecords.transforms.codec.image_inspection import ImageInfo, inspect_image

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------
# Golden Example bytes, by hand
# --------------------------------------------------------------------------

# "a": int64 [1, 300]
_A_INT64_LIST = b"\x0a\x03" + b"\x01" + b"\xac\x02"  # value (packed, 3 bytes): 1, 300
_A_FEATURE = b"\x1a\x05" + _A_INT64_LIST  # Feature.int64_list (field 3), 5 bytes
_A_ENTRY = b"\x0a\x01a" + b"\x12\x07" + _A_FEATURE  # key "a", value (7 bytes)
# "b": bytes [b"xy"]
_B_BYTES_LIST = b"\x0a\x02xy"  # value: b"xy"
_B_FEATURE = b"\x0a\x04" + _B_BYTES_LIST  # Feature.bytes_list (field 1), 4 bytes
_B_ENTRY = b"\x0a\x01b" + b"\x12\x06" + _B_FEATURE  # key "b", value (6 bytes)
# "c": float [1.5]
_C_FLOAT_LIST = b"\x0a\x04" + b"\x00\x00\xc0\x3f"  # value (packed): 1.5 as float32 LE
_C_FEATURE = b"\x12\x06" + _C_FLOAT_LIST  # Feature.float_list (field 2), 6 bytes
_C_ENTRY = b"\x0a\x01c" + b"\x12\x08" + _C_FEATURE  # key "c", value (8 bytes)
_ABC_FEATURES = (
    b"\x0a\x0c" + _A_ENTRY  # Features.feature entry, 12 bytes
    + b"\x0a\x0b" + _B_ENTRY  # 11 bytes
    + b"\x0a\x0d" + _C_ENTRY  # 13 bytes
)
GOLDEN_ABC = b"\x0a\x2a" + _ABC_FEATURES  # Example.features, 42 bytes

# "n": int64 [-1]: a negative int64 is a 10-byte varint.
_N_INT64_LIST = b"\x0a\x0a" + b"\xff" * 9 + b"\x01"
_N_FEATURE = b"\x1a\x0c" + _N_INT64_LIST
_N_ENTRY = b"\x0a\x01n" + b"\x12\x0e" + _N_FEATURE
GOLDEN_NEG = b"\x0a\x15" + b"\x0a\x13" + _N_ENTRY

ABC_FEATURES = {
    "a": lambda: int64_feature([1, 300]),
    "b": lambda: bytes_feature([b"xy"]),
    "c": lambda: float_feature([1.5]),
}


def test_golden_pieces_have_the_lengths_they_claim():
    assert len(_A_ENTRY) == 0x0C and len(_B_ENTRY) == 0x0B and len(_C_ENTRY) == 0x0D
    assert len(_ABC_FEATURES) == 0x2A
    assert len(_N_ENTRY) == 0x13 and len(GOLDEN_NEG) == 2 + 2 + 0x13
    assert struct.pack("<f", 1.5) == b"\x00\x00\xc0\x3f"


@pytest.mark.parametrize("order", list(itertools.permutations("abc")), ids="".join)
def test_serialize_example_golden_in_any_insertion_order(order):
    example = make_example({name: ABC_FEATURES[name]() for name in order})
    assert serialize_example(example) == GOLDEN_ABC


@pytest.mark.parametrize("order", list(itertools.permutations("abc")), ids="".join)
def test_encode_example_golden_in_any_order(order):
    values = {"a": ("int64", [1, 300]), "b": ("string", [b"xy"]), "c": ("float32", [1.5])}
    assert encode_example([(n, *values[n]) for n in order]) == GOLDEN_ABC
    assert encode_example([("n", "int64", [-1])]) == GOLDEN_NEG


ENCODE_CASES = [
    [("empty_bytes", "string", []), ("empty_ints", "int64", []), ("empty_floats", "float32", [])],
    [("s", "string", ["héllo", b"\x00\xff", ""]), ("k/é", "int64", [0, -5, 2**63 - 1, -(2**63)])],
    [("f", "float32", [0.0, -1.25, 3.4e38, 1e-45]), ("big", "string", [b"x" * 70000])],
    [("z", "int64", [True, False, 127, 128, 16384]), ("a", "string", [b"a"]), ("m", "float32", [2.5])],
]


@pytest.mark.parametrize("features", ENCODE_CASES)
def test_encode_example_equals_protobuf_deterministic_bytes(features):
    maker = {"string": bytes_feature, "int64": int64_feature, "float32": float_feature}
    reference = serialize_example(make_example({n: maker[d](v) for n, d, v in features}))
    assert encode_example(features) == reference
    parsed = example_pb2.Example.FromString(encode_example(features))
    assert sorted(parsed.features.feature) == sorted(n for n, _, _ in features)


def test_one_float_keeps_the_sign_of_zero_whatever_was_encoded_before():
    for first, second in ((0.0, -0.0), (-0.0, 0.0)):
        encode_example([("z", "float32", [first])])
        parsed = example_pb2.Example.FromString(encode_example([("z", "float32", [second])]))
        assert struct.pack("<f", parsed.features.feature["z"].float_list.value[0]) == struct.pack("<f", second)


def test_encode_example_rejects_unknown_dtype():
    with pytest.raises(ValueError, match="float32"):
        encode_example([("x", "float64", [1.0])])


@pytest.mark.parametrize(
    "make",
    [
        lambda: int64_feature(-1),
        lambda: int64_feature([-1]),
        lambda: int64_feature(v for v in [-1]),
    ],
    ids=["scalar", "list", "generator"],
)
def test_serialize_negative_int_golden(make):
    assert serialize_example(make_example({"n": make()})) == GOLDEN_NEG


@pytest.mark.parametrize(
    "make",
    [lambda: bytes_feature(b"xy"), lambda: bytes_feature("xy"), lambda: bytes_feature(["xy"])],
    ids=["bytes", "str", "str_list"],
)
def test_bytes_feature_scalar_and_str_forms(make):
    assert make() == bytes_feature([b"xy"])


def test_scalar_forms_serialize_like_lists():
    example = make_example(
        {"a": int64_feature([1, 300]), "b": bytes_feature(b"xy"), "c": float_feature(1.5)}
    )
    assert serialize_example(example) == GOLDEN_ABC


def test_golden_parses_with_generated_proto():
    example = example_pb2.Example.FromString(GOLDEN_ABC)
    fmap = example.features.feature
    assert sorted(fmap) == ["a", "b", "c"]
    assert list(fmap["a"].int64_list.value) == [1, 300]
    assert list(fmap["b"].bytes_list.value) == [b"xy"]
    assert list(fmap["c"].float_list.value) == [1.5]
    assert [fmap[k].WhichOneof("kind") for k in "abc"] == ["int64_list", "bytes_list", "float_list"]
    neg = example_pb2.Example.FromString(GOLDEN_NEG)
    assert list(neg.features.feature["n"].int64_list.value) == [-1]


def test_example_to_dict_on_golden():
    assert example_to_dict(GOLDEN_ABC) == {"a": [1, 300], "b": [b"xy"], "c": [1.5]}
    assert example_to_dict(GOLDEN_NEG) == {"n": [-1]}
    assert example_to_dict(b"") == {}


def test_example_to_dict_feature_without_kind_is_empty_list():
    serialized = serialize_example(make_example({"e": example_pb2.Feature()}))
    assert example_to_dict(serialized) == {"e": []}


def test_example_to_dict_rejects_garbage():
    with pytest.raises(DecodeError, match=r"Error parsing message with type 'beam_tfrecords\.v1\.Example'"):
        example_to_dict(b"\x0a\x05\x01")  # length 5, one byte present


def test_float_feature_stores_float32():
    values = example_to_dict(serialize_example(make_example({"f": float_feature([0.1, 2, -3.25])})))
    assert values["f"] == [float(np.float32(0.1)), 2.0, -3.25]
    assert values["f"][0] != 0.1


def test_int64_feature_bools_and_extremes():
    values = [True, False, 2**63 - 1, -(2**63)]
    parsed = example_to_dict(serialize_example(make_example({"i": int64_feature(values)})))
    assert parsed["i"] == [1, 0, 2**63 - 1, -(2**63)]


def _varint(value: int) -> bytes:
    """Reference base-128 varint encoder (negatives as 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@pytest.mark.parametrize(
    "value, size",
    [
        (0, 1), (1, 1), (127, 1), (128, 2), (300, 2), (16383, 2), (16384, 3),
        (2**21 - 1, 3), (2**21, 4), (2**28, 5), (2**35, 6), (2**63 - 1, 9),
        (-1, 10), (-(2**63), 10),
    ],
)  # fmt: skip
def test_varint_size(value, size):
    assert len(_varint(value)) == size
    assert varint_size(value) == size


# --------------------------------------------------------------------------
# FeatureSpec
# --------------------------------------------------------------------------


def test_feature_spec_entries_sorted_and_json():
    spec = FeatureSpec({"z": ("int64", []), "a": ("string", [None]), "m": ("float32", (3,))})
    assert spec.entries() == [("a", "string", [None]), ("m", "float32", [3]), ("z", "int64", [])]
    assert list(spec.to_json()) == ["a", "m", "z"]
    assert spec.to_json()["m"] == {"dtype": "float32", "shape": [3]}


@pytest.mark.parametrize("dtype", ["float", "int32", "bytes", "", "String"])
def test_feature_spec_rejects_unknown_dtype(dtype):
    assert dtype not in DTYPES
    with pytest.raises(ValueError) as raised:
        FeatureSpec({"x": (dtype, [])})
    assert str(raised.value) == f"feature 'x': dtype must be one of {DTYPES}, got {dtype!r}"


def test_image_feature_spec_with_extras():
    names = [name for name, _, _ in IMAGE_FEATURE_SPEC.entries()]
    assert names == sorted(
        [
            "image/encoded", "image/format", "image/height", "image/width", "image/channels",
            "image/class/label", "image/class/text", "image/filename", "image/key/sha256",
        ]
    )  # fmt: skip
    spec = image_feature_spec({"weight": "float32", "note": "string", "id": "int64"})
    json_spec = spec.to_json()
    assert json_spec["weight"] == {"dtype": "float32", "shape": []}
    assert json_spec["id"] == {"dtype": "int64", "shape": []}
    assert json_spec["image/height"] == {"dtype": "int64", "shape": []}
    assert len(json_spec) == len(names) + 3
    assert image_feature_spec().to_json() == IMAGE_FEATURE_SPEC.to_json()


# --------------------------------------------------------------------------
# The image record
# --------------------------------------------------------------------------

EXTRA = (("note", "string", "a,b"), ("weight", "float32", 0.5), ("id", "int64", 7))


def _png(width=5, height=3, mode="RGB") -> bytes:
    rng = np.random.default_rng(0)
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    arr = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
    image = Image.fromarray(arr[..., 0] if channels == 1 else arr, mode)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    "mode, extra, filename, label, text",
    [
        ("RGB", (), "cat/1.png", 0, "cat"),
        ("RGBA", EXTRA, "dossier/chat noir ü 猫.png", 3, "chat noir"),
        ("L", EXTRA, "x.png", 127, ""),
    ],
)
def test_encode_image_example_round_trip(mode, extra, filename, label, text):
    encoded = _png(7, 4, mode)
    info = inspect_image(encoded)
    assert (info.format, info.height, info.width) == ("png", 4, 7)
    serialized = encode_image_example(encoded, info, label, text, filename, extra)
    parsed = example_to_dict(serialized)
    expected = {
        "image/encoded": [encoded],
        "image/format": [b"png"],
        "image/height": [4],
        "image/width": [7],
        "image/channels": [{"L": 1, "RGB": 3, "RGBA": 4}[mode]],
        "image/class/label": [label],
        "image/class/text": [text.encode("utf-8")],
        "image/filename": [filename.encode("utf-8")],
        "image/key/sha256": [hashlib.sha256(encoded).hexdigest().encode("ascii")],
    }
    if extra:
        expected.update({"note": [b"a,b"], "weight": [0.5], "id": [7]})
    assert parsed == expected
    # Deterministic: same inputs, same bytes; and features serialized in name order.
    assert encode_image_example(encoded, info, label, text, filename, extra) == serialized
    example = example_pb2.Example.FromString(serialized)
    assert serialize_example(example) == serialized
    assert image_example_size(
        len(encoded), info.format, info.height, info.width, info.channels, label, text, filename, extra
    ) == len(serialized)


EXTRA_VARIANTS = [
    (),
    EXTRA,
    (("n", "int64", -5), ("z", "float32", 0.0), ("s", "string", "")),
    (("poids é", "string", "ünï 猫" * 50), ("big", "int64", 2**40)),
]
SIZE_CASES = [
    # (encoded_size, format, height, width, channels, label, label_text, filename)
    (0, "png", 1, 1, 1, 0, "", ""),
    (1, "jpeg", 127, 128, 3, 1, "cat", "a.jpg"),
    (127, "gif", 128, 127, 4, 127, "", "x/y/z.gif"),
    (128, "png", 16384, 16383, 2, 128, "chat noir ü", "dossier/ünïcödé 猫.png"),
    (16383, "webp", 2**21, 2**21 - 1, 3, 16384, "a" * 200, "f" * 300),
    (16384, "tiff", 2**21, 2**21, 1, 2**31, "猫", "very/" * 40 + "deep.tiff"),
    (2**21, "bmp", 1, 2**21, 3, -1, "", "neg_label.bmp"),
]


@pytest.mark.parametrize("extra", EXTRA_VARIANTS, ids=["no_extra", "extra", "edge_extra", "unicode_extra"])
@pytest.mark.parametrize("case", SIZE_CASES, ids=lambda c: f"enc{c[0]}_h{c[2]}_w{c[3]}")
def test_image_example_size_is_exact(case, extra):
    encoded_size, fmt, height, width, channels, label, text, filename = case
    encoded = bytes([0x5A]) * encoded_size
    info = ImageInfo(fmt, height, width, channels)
    serialized = encode_image_example(encoded, info, label, text, filename, extra)
    assert image_example_size(
        encoded_size, fmt, height, width, channels, label, text, filename, extra
    ) == len(serialized)


@pytest.mark.parametrize("text", ["cat", "", "a" * 40, "éè"])
@pytest.mark.parametrize("dims", [(1, 1, 1), (300, 200, 3), (20000, 70000, 4)])
def test_image_fast_path_equals_the_generic_encoder(text, dims):
    data = bytes(range(256)) * 3
    info = ImageInfo("png", *dims)
    fast = encode_image_example(data, info, 7, text, "a/b.png")
    generic = encode_example([
        ("image/encoded", "string", [data]), ("image/format", "string", ["png"]),
        ("image/height", "int64", [dims[0]]), ("image/width", "int64", [dims[1]]),
        ("image/channels", "int64", [dims[2]]), ("image/class/label", "int64", [7]),
        ("image/class/text", "string", [text]), ("image/filename", "string", ["a/b.png"]),
        ("image/key/sha256", "string", [hashlib.sha256(data).hexdigest()]),
    ])
    assert fast == generic
