"""Building, serializing and sizing ``tf.train.Example`` messages (our own protos).

Everything here is pure: no Beam, no I/O. Serialization is deterministic
(features ordered by name), so the same values give the same bytes in every
process and on every run.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.features import DTYPES
from beam_tfrecords.schemas.proto import example_pb2

__all__ = [
    "LIST_TAGS",
    "bytes_entry_head",
    "bytes_entry_parts",
    "bytes_feature",
    "encode_example",
    "entry_prefix",
    "example_to_dict",
    "feature_entry",
    "float_feature",
    "int64_feature",
    "list_parts",
    "make_example",
    "scalar_entry",
    "serialize_example",
    "varint",
    "varint_size",
]


def bytes_feature(values: bytes | str | Iterable[bytes | str]) -> example_pb2.Feature:
    """A Feature holding a BytesList; ``str`` values are encoded as UTF-8."""
    if isinstance(values, (bytes, str)):
        values = (values,)
    encoded = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
    return example_pb2.Feature(bytes_list=example_pb2.BytesList(value=encoded))


def int64_feature(values: int | Iterable[int]) -> example_pb2.Feature:
    """A Feature holding an Int64List (bools become 0/1)."""
    if isinstance(values, int):
        values = (values,)
    return example_pb2.Feature(int64_list=example_pb2.Int64List(value=[int(v) for v in values]))


def float_feature(values: float | Iterable[float]) -> example_pb2.Feature:
    """A Feature holding a FloatList (values are stored as float32)."""
    if isinstance(values, (int, float)):
        values = (values,)
    return example_pb2.Feature(float_list=example_pb2.FloatList(value=list(values)))


def make_example(features: Mapping[str, example_pb2.Feature]) -> example_pb2.Example:
    """An Example holding ``features``."""
    example = example_pb2.Example()
    fmap = example.features.feature
    for name, feature in features.items():
        fmap[name].CopyFrom(feature)
    return example


def serialize_example(example: example_pb2.Example) -> bytes:
    """Serializes with map entries sorted by key: equal values, equal bytes."""
    return example.SerializeToString(deterministic=True)


_U64 = (1 << 64) - 1
_SMALL_VARINTS = tuple(bytes((i,)) for i in range(128))
_CACHED_STR = 32  # One-value string features up to this length are cached whole.
# Feature field tags (example.proto): bytes_list = 1, float_list = 2, int64_list = 3.
LIST_TAGS = {"string": b"\x0a", "float32": b"\x12", "int64": b"\x1a"}


def _encode_varint(value: int) -> bytes:
    value &= _U64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# Varints of 0..16383 (one and two bytes), looked up rather than computed.
_VARINT_TABLE = tuple(_encode_varint(i) for i in range(1 << 14))


def varint(value: int) -> bytes:
    """Protobuf varint; negative int64 values take their 10-byte two's complement."""
    if 0 <= value < 16384:
        return _VARINT_TABLE[value]
    return _encode_varint(value)


@functools.lru_cache(maxsize=4096)
def entry_prefix(name: str) -> bytes:
    """A map entry's key field and the tag of its value field."""
    key = name.encode("utf-8")
    return b"".join((b"\x0a", varint(len(key)), key, b"\x12"))


def list_parts(dtype: str, values: Sequence, parts: list) -> int:
    """Appends the serialized value list to ``parts``; returns its length."""
    if dtype == "string":
        size = 0
        for value in values:
            if isinstance(value, str):
                value = value.encode("utf-8")
            head = varint(len(value))
            parts += (b"\x0a", head, value)
            size += 1 + len(head) + len(value)
        return size
    if dtype == "int64":
        table = _VARINT_TABLE
        packed = b"".join([table[v] if 0 <= v < 16384 else _encode_varint(v) for v in map(int, values)])
    elif dtype == "float32":
        packed = struct.pack(f"<{len(values)}f", *values)
    else:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not values:
        return 0
    head = varint(len(packed))
    parts += (b"\x0a", head, packed)
    return 1 + len(head) + len(packed)


def feature_entry(name: str, dtype: str, values: Sequence) -> bytes:
    """One item of ``Features.feature``, serialized whole: tag, length, key, value.

    An Example's body is its items in name order (see ``encode_example``);
    building items column by column lets a table encoder reuse equal ones.
    """
    if dtype not in LIST_TAGS:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    parts: list[bytes] = []
    list_size = list_parts(dtype, values, parts)
    feature = b"".join((LIST_TAGS[dtype], varint(list_size), *parts))
    entry = b"".join((entry_prefix(name), varint(len(feature)), feature))
    return b"".join((b"\x0a", varint(len(entry)), entry))


@functools.lru_cache(maxsize=8192)
def scalar_entry(name: str, dtype: str, value) -> bytes:
    """``feature_entry`` of one value, cached: labels and dimensions repeat."""
    return feature_entry(name, dtype, (value,))


def bytes_entry_head(name: str, size: int) -> bytes:
    """What precedes one value of ``size`` bytes in ``feature_entry(name, 'string',
    [value])``: the entry's tag and length, its key, the Feature's and the list's
    tags and lengths (``head + value`` is the entry; ``len(head) + size`` its size)."""
    value_head = _SMALL_VARINTS[size] if size < 0x80 else varint(size)
    list_size = 1 + len(value_head) + size
    list_head = _SMALL_VARINTS[list_size] if list_size < 0x80 else varint(list_size)
    feature_size = 1 + len(list_head) + list_size
    feature_head = varint(feature_size)
    prefix = entry_prefix(name)
    return b"".join((b"\x0a", varint(len(prefix) + len(feature_head) + feature_size), prefix, feature_head,
                     b"\x0a", list_head, b"\x0a", value_head))


def bytes_entry_parts(name: str, value: bytes | str) -> tuple[tuple[bytes, ...], int]:
    """``feature_entry(name, 'string', [value])`` as pieces, and their total size.

    For one large value (an image): the lengths are worked out, the value is
    not copied; joining the pieces with the rest of the record copies it once.
    """
    if isinstance(value, str):
        value = value.encode("utf-8")
    head = bytes_entry_head(name, len(value))
    return (head, value), len(head) + len(value)


def encode_example(features: Iterable[tuple[str, str, Sequence]]) -> bytes:
    """Serializes an Example straight from values, without building messages.

    The bytes equal ``serialize_example(make_example(...))`` (map entries sorted
    by key, lists packed). Lengths are worked out first and the payloads copied
    once, so a large image costs one copy, not one per nesting level. The tests
    hold this to protobuf's output and to hand-written golden bytes.

    Args:
      features: ``(name, dtype, values)`` triples; dtype is one of ``DTYPES``.
    """
    parts: list[bytes] = [b"\x0a", b""]  # Example.features; its length goes in parts[1].
    body = 0
    for name, dtype, values in sorted(features, key=lambda f: f[0]):
        if len(values) == 1:
            value = values[0]
            if dtype == "float32" and isinstance(value, float):
                # Not cached: the cache's keys are equal for 0.0 and -0.0 (and floats rarely repeat).
                entry = feature_entry(name, dtype, (value,))
                parts.append(entry)
                body += len(entry)
                continue
            if dtype != "string" or (isinstance(value, str) and len(value) <= _CACHED_STR):
                entry = scalar_entry(name, dtype, value)  # Labels, formats, dimensions.
                parts.append(entry)
                body += len(entry)
                continue
            entry_parts, size = bytes_entry_parts(name, value)
            parts += entry_parts
            body += size
            continue
        if dtype not in LIST_TAGS:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        head_at = len(parts)
        parts += (b"", b"", b"", b"", b"")  # Entry tag+length, key+value tag, value length, list tag+length.
        list_size = list_parts(dtype, values, parts)
        list_head = varint(list_size)
        feature_size = 1 + len(list_head) + list_size
        prefix = entry_prefix(name)
        feature_head = varint(feature_size)
        entry_size = len(prefix) + len(feature_head) + feature_size
        entry_head = varint(entry_size)
        parts[head_at:head_at + 5] = (b"\x0a" + entry_head, prefix, feature_head,
                                      LIST_TAGS[dtype], list_head)
        body += 1 + len(entry_head) + entry_size
    parts[1] = varint(body)
    return b"".join(parts)


def example_to_dict(serialized: bytes) -> dict[str, list]:
    """Parses a serialized Example into ``{name: [values]}`` (bytes stay bytes).

    Raises:
      google.protobuf.message.DecodeError: if the bytes are not an Example.
    """
    example = example_pb2.Example.FromString(serialized)
    values = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        values[name] = list(getattr(feature, kind).value) if kind else []
    return values


def varint_size(value: int) -> int:
    """Bytes a non-negative value takes as a protobuf varint (negatives take 10)."""
    if value < 0:
        return 10
    size = 1
    while value >= 0x80:
        value >>= 7
        size += 1
    return size


