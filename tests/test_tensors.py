"""Tests for transforms.codec.tensors: TensorProto bytes for tf.io.parse_tensor.

What tf.io.parse_tensor(serialized, out_type) expects (TensorFlow's
ParseTensorOp → Tensor::FromProto, tensorflow/core/framework/tensor.cc): a
serialized TensorProto whose dtype equals out_type, whose tensor_shape has
only dims >= 0 and no unknown rank, and then either
  * a non-empty tensor_content of exactly num_elements * sizeof(T) bytes, the
    values row-major in the machine layout (little-endian on every platform
    TensorFlow ships for; bools must be bytes 0 or 1) — DT_STRING content is
    instead all lengths as varint32s, then all bytes; or
  * the dtype's *_val field (a short list is padded with its last value).
An empty tensor (a zero dim) needs neither. encode_tensor writes dtype,
tensor_shape (always present, as Tensor::AsProtoTensorContent writes it; empty
for a scalar) and, for numbers, tensor_content in exactly that layout; for
strings one string_val per element. The golden bytes below are written by hand
from the proto3 wire format (schemas/proto/tensor.proto, TensorFlow's numbers):

  tag = (field << 3) | wire_type; wire type 0 = varint, 2 = length-delimited.
  TensorProto.dtype = 1 (enum), tensor_shape = 2, tensor_content = 4, string_val = 8;
  TensorShapeProto.dim = 2; Dim.size = 1.
  DataType: DT_FLOAT = 1, DT_INT32 = 3, DT_STRING = 7.
"""

import struct

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from beam_tfrecords.schemas.proto import tensor_pb2
from beam_tfrecords.transforms.codec.tensors import SUPPORTED_DTYPES, decode_tensor, encode_tensor

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------
# Golden TensorProto bytes, by hand
# --------------------------------------------------------------------------

# np.array([[1, 2], [3, 4]], dtype=np.int32)
_DIM_2 = b"\x12\x02" + b"\x08\x02"  # TensorShapeProto.dim: Dim{size: 2}
_INT32_2X2 = (
    b"\x08\x03"  # dtype: DT_INT32 (3)
    + b"\x12\x08" + _DIM_2 + _DIM_2  # tensor_shape (8 bytes): dims [2, 2]
    + b"\x22\x10"  # tensor_content, 16 bytes: int32 LE, row-major
    + b"\x01\x00\x00\x00" + b"\x02\x00\x00\x00" + b"\x03\x00\x00\x00" + b"\x04\x00\x00\x00"
)
# np.float32(1.5), a scalar: an empty shape, still present
_FLOAT32_SCALAR = (
    b"\x08\x01"  # dtype: DT_FLOAT (1)
    + b"\x12\x00"  # tensor_shape: no dims (rank 0)
    + b"\x22\x04" + b"\x00\x00\xc0\x3f"  # tensor_content: 1.5 as float32 LE
)
# np.array([b"ab", b""], dtype=object)
_STRINGS = (
    b"\x08\x07"  # dtype: DT_STRING (7)
    + b"\x12\x04" + b"\x12\x02" + b"\x08\x02"  # tensor_shape: dims [2]
    + b"\x42\x02ab"  # string_val (field 8): b"ab"
    + b"\x42\x00"  # string_val: b""
)
# np.zeros((0, 3), np.float32): no elements, so no tensor_content at all
_EMPTY_0X3 = b"\x08\x01" + b"\x12\x06" + b"\x12\x00" + b"\x12\x02\x08\x03"  # dims [0, 3]


def test_golden_pieces_have_the_lengths_they_claim():
    assert len(_INT32_2X2) == 2 + 2 + 8 + 2 + 16
    assert len(_FLOAT32_SCALAR) == 10
    assert len(_STRINGS) == 2 + 2 + 4 + 4 + 2
    assert struct.pack("<4i", 1, 2, 3, 4) == _INT32_2X2[-16:]
    assert struct.pack("<f", 1.5) == b"\x00\x00\xc0\x3f"


@pytest.mark.parametrize(
    "array, golden",
    [
        (np.array([[1, 2], [3, 4]], dtype=np.int32), _INT32_2X2),
        (np.float32(1.5), _FLOAT32_SCALAR),
        (np.array(1.5, dtype=np.float32), _FLOAT32_SCALAR),
        (np.array([b"ab", b""], dtype=object), _STRINGS),
        (np.array(["ab", ""]), _STRINGS),
        (np.array([b"ab", b""]), _STRINGS),
        (np.zeros((0, 3), np.float32), _EMPTY_0X3),
    ],
    ids=["int32_2x2", "float32_scalar", "float32_0d", "bytes_obj", "unicode", "bytes_S", "empty"],
)
def test_encode_tensor_golden(array, golden):
    assert encode_tensor(array) == golden


def test_golden_parses_with_generated_proto():
    proto = tensor_pb2.TensorProto.FromString(_INT32_2X2)
    assert proto.dtype == tensor_pb2.DT_INT32
    assert [d.size for d in proto.tensor_shape.dim] == [2, 2]
    assert proto.tensor_content == struct.pack("<4i", 1, 2, 3, 4)
    scalar = tensor_pb2.TensorProto.FromString(_FLOAT32_SCALAR)
    assert scalar.dtype == tensor_pb2.DT_FLOAT and scalar.HasField("tensor_shape")
    assert len(scalar.tensor_shape.dim) == 0 and not scalar.tensor_shape.unknown_rank
    strings = tensor_pb2.TensorProto.FromString(_STRINGS)
    assert list(strings.string_val) == [b"ab", b""] and strings.tensor_content == b""


def test_decode_golden():
    decoded = decode_tensor(_INT32_2X2)
    assert decoded.dtype == np.int32 and decoded.shape == (2, 2)
    assert decoded.tolist() == [[1, 2], [3, 4]]
    scalar = decode_tensor(_FLOAT32_SCALAR)
    assert scalar.dtype == np.float32 and scalar.shape == () and scalar == 1.5
    strings = decode_tensor(_STRINGS)
    assert strings.dtype == object and strings.tolist() == [b"ab", b""]
    empty = decode_tensor(_EMPTY_0X3)
    assert empty.dtype == np.float32 and empty.shape == (0, 3)


# --------------------------------------------------------------------------
# Equality with protobuf, round trips
# --------------------------------------------------------------------------

# Element format for struct, built independently of numpy's tobytes.
_STRUCT = {
    "bool": "?", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint8": "B",
    "uint16": "H", "uint32": "I", "uint64": "Q", "float16": "e", "float32": "f", "float64": "d",
}  # fmt: skip
_ENUM = {
    "bool": "DT_BOOL", "int8": "DT_INT8", "int16": "DT_INT16", "int32": "DT_INT32",
    "int64": "DT_INT64", "uint8": "DT_UINT8", "uint16": "DT_UINT16", "uint32": "DT_UINT32",
    "uint64": "DT_UINT64", "float16": "DT_HALF", "float32": "DT_FLOAT", "float64": "DT_DOUBLE",
    "complex64": "DT_COMPLEX64", "complex128": "DT_COMPLEX128",
}  # fmt: skip


def _reference(array: np.ndarray) -> bytes:
    """The TensorProto built with the generated class, content packed with struct."""
    proto = tensor_pb2.TensorProto()
    proto.tensor_shape.SetInParent()
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    values = array.ravel(order="C").tolist()
    if array.dtype.kind in "USOT":
        proto.dtype = tensor_pb2.DT_STRING
        proto.string_val.extend(v.encode() if isinstance(v, str) else v for v in values)
    else:
        name = array.dtype.name
        proto.dtype = tensor_pb2.DataType.Value(_ENUM[name])
        if array.dtype.kind == "c":
            fmt = "f" if name == "complex64" else "d"
            values = [part for v in values for part in (v.real, v.imag)]
        else:
            fmt = _STRUCT[name]
        proto.tensor_content = struct.pack(f"<{len(values)}{fmt}", *values)
    return proto.SerializeToString(deterministic=True)


_RNG = np.random.default_rng(7)
TENSOR_CASES = {
    "float64_3d": _RNG.standard_normal((2, 3, 4)),
    "float32_special": np.array([0.0, -0.0, np.inf, -np.inf, 1e-45, 3.4e38], np.float32),
    "float16": np.array([[1.0, -2.5], [65504.0, 6e-8]], np.float16),
    "bool": np.array([[True, False, True], [False, False, True]]),
    "bool_scalar": np.bool_(True),
    "int8": np.array([-128, -1, 0, 127], np.int8),
    "int16": np.array([-32768, 32767], np.int16),
    "int64_extremes": np.array([-(2**63), -1, 0, 2**63 - 1], np.int64),
    "longlong": np.array([1, -2], np.longlong),
    "uint8_image": _RNG.integers(0, 256, (4, 5, 3), dtype=np.uint8),
    "uint16": np.array([0, 65535], np.uint16),
    "uint32": np.array([0, 2**32 - 1], np.uint32),
    "uint64": np.array([0, 2**64 - 1], np.uint64),
    "complex64": np.array([1 + 2j, -0.5j], np.complex64),
    "complex128": np.array([[1e300 - 1j]], np.complex128),
    "big_content": np.arange(5000, dtype=np.int32),  # 20000 bytes: a 3-byte length varint
    "big_dims": np.zeros((1, 200, 0, 70000), np.int64),
    "unicode": np.array([["héllo", "猫"], ["", "x" * 200]]),
    "bytes_object": np.array([b"\x00\xff", "ü", b""], dtype=object),
    "string_scalar": np.array("chat noir"),
    "string_empty": np.array([], dtype=object).reshape(0, 2),
    "int32_scalar": np.int32(-7),
}
if hasattr(np, "dtypes") and hasattr(np.dtypes, "StringDType"):  # numpy >= 2
    TENSOR_CASES["numpy_string_dtype"] = np.array(["ü", "", "z"], dtype=np.dtypes.StringDType())


@pytest.mark.parametrize("array", TENSOR_CASES.values(), ids=TENSOR_CASES.keys())
def test_encode_tensor_equals_protobuf_deterministic_bytes(array):
    array = np.asarray(array)
    assert encode_tensor(array) == _reference(array)


@pytest.mark.parametrize("array", TENSOR_CASES.values(), ids=TENSOR_CASES.keys())
def test_round_trip(array):
    array = np.asarray(array)
    decoded = decode_tensor(encode_tensor(array))
    assert decoded.shape == array.shape
    if array.dtype.kind in "USOT":
        assert decoded.dtype == object
        expected = [v.encode() if isinstance(v, str) else v for v in array.ravel().tolist()]
        assert decoded.ravel().tolist() == expected
    else:
        assert decoded.dtype == array.dtype
        assert decoded.tobytes() == array.tobytes()  # Bit-exact, -0.0 and NaN included.
        assert decoded.flags.writeable


def test_nan_bits_survive():
    array = np.array([np.nan, -np.nan], np.float64)
    assert decode_tensor(encode_tensor(array)).tobytes() == array.tobytes()


def test_layout_does_not_change_the_bytes():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    expected = encode_tensor(np.ascontiguousarray(base.T))
    assert encode_tensor(base.T) == expected  # A transposed (Fortran-order) view.
    assert encode_tensor(np.asfortranarray(base.T)) == expected
    assert encode_tensor(base.T.astype(">f4")) == expected  # Big-endian.
    strided = np.arange(48, dtype=np.int64)[::2]
    assert encode_tensor(strided) == encode_tensor(strided.copy())
    assert decode_tensor(encode_tensor(base.T)).tolist() == base.T.tolist()


def test_big_endian_input_decodes_native():
    array = np.array([[1, 256], [-2, 65536]], dtype=">i4")
    decoded = decode_tensor(encode_tensor(array))
    assert decoded.dtype == np.int32 and decoded.dtype.isnative
    assert decoded.tolist() == array.tolist()


def test_encode_is_deterministic():
    array = _RNG.standard_normal((3, 7)).astype(np.float32)
    assert encode_tensor(array) == encode_tensor(array.copy()) == _reference(array)


@pytest.mark.parametrize(
    "array",
    [
        np.array([1.0], np.longdouble) if np.dtype(np.longdouble).itemsize not in (4, 8) else None,
        np.array(["2024-01-01"], dtype="datetime64[D]"),
        np.array([1], dtype=np.timedelta64),
        np.zeros(2, dtype=[("a", "i4"), ("b", "f4")]),
        np.array([b"ab"], dtype="V2"),
    ],
    ids=["longdouble", "datetime64", "timedelta64", "structured", "void"],
)
def test_encode_rejects_unsupported_dtypes(array):
    if array is None:
        pytest.skip("long double is float64 on this platform")
    with pytest.raises(ValueError, match="float32") as info:
        encode_tensor(array)
    assert "string" in str(info.value) and "uint8" in str(info.value)


def test_encode_rejects_non_strings_in_object_arrays():
    with pytest.raises(ValueError, match="str or bytes.*float32"):
        encode_tensor(np.array(["a", 1], dtype=object))


@pytest.mark.parametrize("value", [[1.0, 2.0], 3, "text", b"raw"])
def test_encode_requires_numpy(value):
    with pytest.raises(TypeError, match="numpy array"):
        encode_tensor(value)


def test_supported_dtypes_listed():
    assert set(SUPPORTED_DTYPES) == set(_ENUM) | {"string"}


# --------------------------------------------------------------------------
# decode_tensor on what TensorFlow itself writes
# --------------------------------------------------------------------------


def _proto(dtype: str, shape, **fields) -> bytes:
    proto = tensor_pb2.TensorProto(dtype=tensor_pb2.DataType.Value(dtype), **fields)
    proto.tensor_shape.SetInParent()
    for size in shape:
        proto.tensor_shape.dim.add(size=size)
    return proto.SerializeToString()


def test_decode_tf_string_tensor_content():
    # tf.io.serialize_tensor(tf.constant([["a", ""], ["bcd", "é"]])): string
    # content is the 4 lengths (varint32) then the 4 strings (port::EncodeStringList).
    content = b"\x01\x00\x03\x02" + b"a" + b"" + b"bcd" + "é".encode()
    decoded = decode_tensor(_proto("DT_STRING", [2, 2], tensor_content=content))
    assert decoded.tolist() == [[b"a", b""], [b"bcd", "é".encode()]]
    long = b"x" * 300
    content = b"\xac\x02" + long  # 300 = ac 02
    assert decode_tensor(_proto("DT_STRING", [1], tensor_content=content)).tolist() == [long]
    with pytest.raises(ValueError, match="add up"):
        decode_tensor(_proto("DT_STRING", [2], tensor_content=b"\x01\x01abc"))
    with pytest.raises(ValueError, match="varint"):
        decode_tensor(_proto("DT_STRING", [2], tensor_content=b"\x01"))


@pytest.mark.parametrize(
    "dtype, shape, fields, expected",
    [
        ("DT_FLOAT", [3], {"float_val": [1.5]}, np.array([1.5, 1.5, 1.5], np.float32)),  # splat
        ("DT_FLOAT", [2, 2], {"float_val": [1.0, 2.0]}, np.array([[1, 2], [2, 2]], np.float32)),
        ("DT_DOUBLE", [2], {"double_val": [0.1, 0.2, 0.3]}, np.array([0.1, 0.2])),  # extra ignored
        ("DT_INT32", [2], {}, np.array([0, 0], np.int32)),  # no values: zeros
        ("DT_INT8", [3], {"int_val": [-1, 127, 128]}, np.array([-1, 127, -128], np.int8)),
        ("DT_UINT8", [2], {"int_val": [255, 7]}, np.array([255, 7], np.uint8)),
        ("DT_UINT16", [1], {"int_val": [65535]}, np.array([65535], np.uint16)),
        ("DT_INT16", [], {"int_val": [-300]}, np.array(-300, np.int16)),
        ("DT_INT64", [2], {"int64_val": [-(2**63), 5]}, np.array([-(2**63), 5], np.int64)),
        ("DT_UINT32", [1], {"uint32_val": [2**32 - 1]}, np.array([2**32 - 1], np.uint32)),
        ("DT_UINT64", [1], {"uint64_val": [2**64 - 1]}, np.array([2**64 - 1], np.uint64)),
        ("DT_BOOL", [3], {"bool_val": [False, True]}, np.array([False, True, True])),
        ("DT_HALF", [2], {"half_val": [0x3C00, 0xC100]}, np.array([1.0, -2.5], np.float16)),
        ("DT_COMPLEX64", [2], {"scomplex_val": [1, 2]}, np.array([1 + 2j, 1 + 2j], np.complex64)),
        ("DT_COMPLEX128", [1], {"dcomplex_val": [0, -1]}, np.array([-1j], np.complex128)),
        ("DT_STRING", [3], {"string_val": [b"a", b"b"]}, np.array([b"a", b"b", b"b"], object)),
        ("DT_STRING", [2], {}, np.array([b"", b""], object)),
    ],
)
def test_decode_typed_val_fields(dtype, shape, fields, expected):
    decoded = decode_tensor(_proto(dtype, shape, **fields))
    assert decoded.dtype == expected.dtype and decoded.shape == expected.shape
    assert decoded.tolist() == expected.tolist()


@pytest.mark.parametrize(
    "data, match",
    [
        (_proto("DT_INT32", [2], tensor_content=b"\x01\x00\x00"), "needs 8"),
        (_proto("DT_FLOAT", [1], tensor_content=b"\x00" * 8), "needs 4"),
        (_proto("DT_BOOL", [2], tensor_content=b"\x01\x02"), "0 and 1"),
        (_proto("DT_FLOAT", [-1]), "unknown"),
        (tensor_pb2.TensorProto(dtype=1, tensor_shape={"unknown_rank": True}).SerializeToString(),
         "unknown rank"),
        (_proto("DT_INVALID", [1]), "DT_INVALID.*float32"),
        (b"\x08\x0e\x12\x00", "enum 14.*float32"),  # DT_BFLOAT16 (14), not in our enum
    ],
    ids=["short", "long", "bad_bool", "negative_dim", "unknown_rank", "invalid", "bfloat16"],
)
def test_decode_rejects(data, match):
    with pytest.raises(ValueError, match=match):
        decode_tensor(data)


def test_decode_rejects_garbage():
    with pytest.raises(DecodeError, match=r"Error parsing message with type 'beam_tfrecords\.v1\.TensorProto'"):
        decode_tensor(b"\x22\x05\x01")  # tensor_content of 5 bytes, one present
