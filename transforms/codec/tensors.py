"""Serializing numpy arrays as ``TensorProto`` bytes, for ``tf.io.parse_tensor``.

A record feature often holds a whole tensor as one bytes value; the reader gets
it back with ``tf.io.parse_tensor(value, out_type=tf.float32)``. That op parses
a serialized ``TensorProto`` (schemas/proto/tensor.proto, field numbers as in
TensorFlow) and builds the tensor with ``Tensor::FromProto``:

* numeric dtypes: ``tensor_content`` must hold exactly ``num_elements *
  itemsize`` bytes, the values in row-major order in the machine's (little-endian)
  layout. That is what ``tf.io.serialize_tensor`` writes and what we write.
* ``DT_STRING``: we write one ``string_val`` per element (as
  ``tf.make_tensor_proto`` does); ``tf.io.serialize_tensor`` instead packs the
  strings into ``tensor_content`` (all lengths as varints, then all bytes).
  ``FromProto`` reads both, and so does :func:`decode_tensor`.

``out_type`` must equal the stored dtype: the op does not cast.

Everything here is pure: no Beam, no TensorFlow, no I/O. Encoding is
deterministic: the same array gives the same bytes, equal to the generated
class's ``SerializeToString(deterministic=True)``.
"""

from __future__ import annotations

import math

import numpy as np

from beam_tfrecords.schemas.proto import tensor_pb2
from beam_tfrecords.transforms.codec.example import varint

__all__ = ["SUPPORTED_DTYPES", "decode_tensor", "encode_tensor"]

# (numpy kind, itemsize) → (DataType, the TensorProto *_val field FromProto reads
# when tensor_content is empty). Keyed on kind and size, not on numpy's scalar
# type, so that e.g. ``longlong`` and ``int64`` (distinct types, same layout) agree.
_NUMERIC = {
    ("b", 1): (tensor_pb2.DT_BOOL, "bool_val"),
    ("i", 1): (tensor_pb2.DT_INT8, "int_val"),
    ("i", 2): (tensor_pb2.DT_INT16, "int_val"),
    ("i", 4): (tensor_pb2.DT_INT32, "int_val"),
    ("i", 8): (tensor_pb2.DT_INT64, "int64_val"),
    ("u", 1): (tensor_pb2.DT_UINT8, "int_val"),
    ("u", 2): (tensor_pb2.DT_UINT16, "int_val"),
    ("u", 4): (tensor_pb2.DT_UINT32, "uint32_val"),
    ("u", 8): (tensor_pb2.DT_UINT64, "uint64_val"),
    ("f", 2): (tensor_pb2.DT_HALF, "half_val"),
    ("f", 4): (tensor_pb2.DT_FLOAT, "float_val"),
    ("f", 8): (tensor_pb2.DT_DOUBLE, "double_val"),
    ("c", 8): (tensor_pb2.DT_COMPLEX64, "scomplex_val"),
    ("c", 16): (tensor_pb2.DT_COMPLEX128, "dcomplex_val"),
}
# DataType → little-endian numpy dtype of one element.
_NUMPY_DTYPE = {
    data_type: np.dtype(f"{kind}{size}").newbyteorder("<")
    for (kind, size), (data_type, _) in _NUMERIC.items()
}
_VAL_FIELD = {data_type: field for data_type, field in _NUMERIC.values()}
_STRING_KINDS = "USOT"  # str_, bytes_, object (of str/bytes), StringDType.

# numpy dtype names, which are also TensorFlow's names for the same types
# (tf.float32, tf.uint8, tf.bool, ..., tf.string), except float16 = tf.half.
SUPPORTED_DTYPES = tuple(
    sorted(np.dtype(f"{kind}{size}").name for kind, size in _NUMERIC)
) + ("string",)

# TensorProto field tags: (field << 3) | wire type (0 = varint, 2 = length-delimited).
_TAG_DTYPE = b"\x08"  # dtype = 1, varint
_TAG_SHAPE = b"\x12"  # tensor_shape = 2
_TAG_CONTENT = b"\x22"  # tensor_content = 4
_TAG_STRING_VAL = b"\x42"  # string_val = 8
_TAG_DIM = b"\x12"  # TensorShapeProto.dim = 2
_TAG_DIM_SIZE = b"\x08"  # TensorShapeProto.Dim.size = 1, varint


def _unsupported(what) -> ValueError:
    return ValueError(f"unsupported tensor dtype {what}; supported: {', '.join(SUPPORTED_DTYPES)}")


def _shape_field(shape: tuple[int, ...]) -> bytes:
    """The tensor_shape field. Always present, even for a scalar (``12 00``), as
    TensorFlow writes it; a zero-size dim is an empty Dim message (``12 00``)."""
    dims = []
    for size in shape:
        dim = _TAG_DIM_SIZE + varint(size) if size else b""
        dims += (_TAG_DIM, varint(len(dim)), dim)
    body = b"".join(dims)
    return b"".join((_TAG_SHAPE, varint(len(body)), body))


def _string_items(array: np.ndarray) -> list[bytes]:
    """The elements of a string array, row-major, as bytes (``str`` → UTF-8)."""
    items = []
    for item in array.ravel(order="C").tolist():
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif not isinstance(item, bytes):
            # An object array of non-strings is an unsupported dtype, reported as such.
            raise ValueError(  # noqa: TRY004
                f"object arrays must hold only str or bytes, got {type(item).__name__}; "
                f"supported dtypes: {', '.join(SUPPORTED_DTYPES)}"
            )
        items.append(item)
    return items


def encode_tensor(array: np.ndarray | np.generic) -> bytes:
    """Serializes an array as a ``TensorProto`` that ``tf.io.parse_tensor`` reads.

    Numeric and bool arrays give ``dtype``, ``tensor_shape`` and
    ``tensor_content`` (the values, row-major, little-endian, whatever the
    array's own byte order and strides). String arrays (numpy ``str_`` or
    ``bytes_`` arrays, or object arrays of ``str``/``bytes``) give ``DT_STRING``
    with one ``string_val`` per element, ``str`` encoded as UTF-8. Note that
    numpy ``bytes_`` arrays drop trailing NUL bytes of each element; use an
    object array to keep them.

    The bytes equal ``TensorProto.SerializeToString(deterministic=True)`` of
    the same message (fields in number order; ``version_number`` 0 omitted).

    Args:
      array: the tensor; a numpy scalar is a 0-d tensor.

    Returns:
      The serialized ``TensorProto``.

    Raises:
      TypeError: if ``array`` is not a numpy array or scalar.
      ValueError: if its dtype is not one of ``SUPPORTED_DTYPES`` (the message
        lists them), or an object array holds something other than str/bytes.
    """
    if isinstance(array, np.generic):
        array = np.asarray(array)
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected a numpy array, got {type(array).__name__}")
    dtype = array.dtype
    shape = _shape_field(array.shape)
    if dtype.kind in _STRING_KINDS:
        parts = [_TAG_DTYPE, varint(tensor_pb2.DT_STRING), shape]
        for item in _string_items(array):
            parts += (_TAG_STRING_VAL, varint(len(item)), item)
        return b"".join(parts)
    entry = _NUMERIC.get((dtype.kind, dtype.itemsize))
    if entry is None:  # float128, datetime, structured, ...
        raise _unsupported(dtype)
    data_type = entry[0]
    # astype(copy=False) swaps bytes only for a big-endian array; tobytes("C")
    # makes the one copy, contiguous in row-major order.
    content = array.astype(_NUMPY_DTYPE[data_type], copy=False).tobytes(order="C")
    if not content:  # No elements: proto3 omits an empty bytes field.
        return b"".join((_TAG_DTYPE, varint(data_type), shape))
    return b"".join(
        (_TAG_DTYPE, varint(data_type), shape, _TAG_CONTENT, varint(len(content)), content)
    )


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A varint at ``data[pos:]``: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint in string tensor_content")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _decode_string_list(content: bytes, count: int) -> list[bytes]:
    """TensorFlow's string tensor_content (port::EncodeStringList): ``count``
    varint lengths, then the strings back to back, nothing after."""
    sizes = []
    pos = 0
    for _ in range(count):
        size, pos = _read_varint(content, pos)
        sizes.append(size)
    if sum(sizes) != len(content) - pos:
        raise ValueError("string tensor_content lengths do not add up to its size")
    items = []
    for size in sizes:
        items.append(content[pos:pos + size])
        pos += size
    return items


def _splat(values: list, count: int, default) -> list:
    """Tensor::FromProto's rule for *_val fields: too few values are padded with
    the last one (or ``default`` if there is none); extra values are ignored."""
    if not values:
        return [default] * count
    return values[:count] + [values[-1]] * (count - len(values))


def decode_tensor(data: bytes) -> np.ndarray:
    """Parses a serialized ``TensorProto`` into a numpy array (for tests and inspection).

    Reads what :func:`encode_tensor` and ``tf.io.serialize_tensor`` write, and
    also the typed ``*_val`` fields (``tf.make_tensor_proto``), with
    TensorFlow's rule that a short list is padded with its last value.

    Args:
      data: a serialized ``TensorProto``.

    Returns:
      An array of the stored shape, in native byte order. Numeric tensors keep
      their dtype (``DT_HALF`` → float16); ``DT_STRING`` tensors become object
      arrays of ``bytes``.

    Raises:
      ValueError: if the dtype is not supported, the shape is unknown or
        negative, or the content does not match the shape.
      google.protobuf.message.DecodeError: if ``data`` is not a TensorProto.
    """
    proto = tensor_pb2.TensorProto.FromString(data)
    if proto.tensor_shape.unknown_rank:
        raise ValueError("tensor shape has unknown rank")
    shape = tuple(dim.size for dim in proto.tensor_shape.dim)
    if any(size < 0 for size in shape):
        raise ValueError(f"tensor shape {list(shape)} has an unknown (negative) dimension")
    count = math.prod(shape)
    data_type = proto.dtype
    if data_type == tensor_pb2.DT_STRING:
        if count and proto.tensor_content:
            items = _decode_string_list(proto.tensor_content, count)
        else:
            items = _splat(list(proto.string_val), count, b"")
        out = np.empty(count, dtype=object)
        out[:] = items
        return out.reshape(shape)
    if data_type not in _NUMPY_DTYPE:
        known = data_type in tensor_pb2.DataType.values()
        raise _unsupported(tensor_pb2.DataType.Name(data_type) if known else f"enum {data_type}")
    dtype = _NUMPY_DTYPE[data_type]
    native = dtype.newbyteorder("=")
    if count == 0:
        return np.empty(shape, dtype=native)
    content = proto.tensor_content
    if content:
        if len(content) != count * dtype.itemsize:
            raise ValueError(
                f"tensor_content has {len(content)} bytes; shape {list(shape)} of "
                f"{native.name} needs {count * dtype.itemsize}"
            )
        if data_type == tensor_pb2.DT_BOOL and content.translate(None, b"\x00\x01"):
            raise ValueError("bool tensor_content holds bytes other than 0 and 1")
        return np.frombuffer(content, dtype=dtype).astype(native).reshape(shape)
    values = list(getattr(proto, _VAL_FIELD[data_type]))
    if data_type in (tensor_pb2.DT_COMPLEX64, tensor_pb2.DT_COMPLEX128):
        pairs = [complex(re, im) for re, im in zip(values[0::2], values[1::2])]  # (real, imag)
        return np.array(_splat(pairs, count, 0j), dtype=native).reshape(shape)
    values = _splat(values, count, 0)
    if data_type == tensor_pb2.DT_HALF:  # float16 bit patterns, one per int32.
        bits = np.array(values, dtype=np.int64).astype(np.uint16)
        return bits.view(np.float16).reshape(shape)
    if data_type == tensor_pb2.DT_UINT64:
        return np.array(values, dtype=np.uint64).reshape(shape)
    if native.kind in "iu":
        # int_val holds int8/int16/uint8/uint16 as int32; as in FromProto's C++
        # conversion, out-of-range values wrap.
        return np.array(values, dtype=np.int64).astype(native).reshape(shape)
    return np.array(values, dtype=native).reshape(shape)  # float, double, bool.
