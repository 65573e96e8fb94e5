"""Serializing ``tf.train.SequenceExample`` messages straight from values.

A SequenceExample (schemas/proto/example.proto) holds ``context``, a Features
map like an Example's, and ``feature_lists``, a map from name to a FeatureList:
one Feature per time step. TensorFlow reads it with
``tf.io.parse_single_sequence_example``.

Everything here is pure: no Beam, no I/O. Serialization is deterministic (map
entries ordered by name) and reuses the Example encoder of
:mod:`transforms.codec.example`: a SequenceExample's ``context`` is field 1 of type
Features, exactly like ``Example.features``, so an encoded Example *is* the
context field.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from beam_tfrecords.schemas.features import DTYPES
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.example import (
    LIST_TAGS,
    encode_example,
    entry_prefix,
    list_parts,
    varint,
)

__all__ = ["encode_sequence_example", "sequence_example_to_dict"]

_TAG_FEATURE_LISTS = b"\x12"  # SequenceExample.feature_lists = 2, length-delimited.
_TAG_ENTRY = b"\x0a"  # FeatureLists.feature_list = 1 (a map entry); also FeatureList.feature = 1.


def _check_unique(names: list[str], what: str) -> None:
    seen = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{what} name {name!r} given twice")
        seen.add(name)


def encode_sequence_example(
    context: Iterable[tuple[str, str, Sequence]],
    feature_lists: Iterable[tuple[str, str, Sequence[Sequence]]],
) -> bytes:
    """Serializes a SequenceExample without building messages.

    The bytes equal ``SequenceExample.SerializeToString(deterministic=True)`` of
    the message with both ``context`` and ``feature_lists`` set (possibly empty:
    an empty input gives ``0a 00 12 00``), map entries sorted by name, and every
    step a Feature with its list set (an empty step is an empty list, not an
    unset Feature). The tests hold this to protobuf's output and to hand-written
    golden bytes.

    Args:
      context: ``(name, dtype, values)`` triples, as for
        :func:`transforms.codec.example.encode_example`; dtype is one of ``DTYPES``.
      feature_lists: ``(name, dtype, steps)`` triples; ``steps`` is a sequence
        of value lists, one per time step, all of ``dtype``. ``[]`` is a
        feature list with no steps.

    Returns:
      The serialized SequenceExample.

    Raises:
      ValueError: on an unknown dtype, or a name given twice in ``context`` or
        in ``feature_lists``.
      TypeError: if a step is a single str/bytes value instead of a list.
    """
    context = list(context)
    feature_lists = sorted(feature_lists, key=lambda f: f[0])
    _check_unique([name for name, _, _ in context], "context feature")
    _check_unique([name for name, _, _ in feature_lists], "feature list")
    parts: list[bytes] = [encode_example(context), _TAG_FEATURE_LISTS, b""]  # Length at [2].
    body = 0
    for name, dtype, steps in feature_lists:
        if dtype not in LIST_TAGS:
            raise ValueError(f"feature list {name!r}: dtype must be one of {DTYPES}, got {dtype!r}")
        list_tag = LIST_TAGS[dtype]
        head_at = len(parts)
        parts += (b"", b"", b"")  # Entry tag+length, key + value tag, FeatureList length.
        feature_list_size = 0
        for values in steps:
            if isinstance(values, (str, bytes)):
                raise TypeError(
                    f"feature list {name!r}: each step must be a list of values, got {values!r}"
                )
            step_at = len(parts)
            parts += (b"", b"")  # Feature tag+length, list tag+length.
            list_size = list_parts(dtype, values, parts)
            list_head = varint(list_size)
            feature_size = 1 + len(list_head) + list_size
            feature_head = varint(feature_size)
            parts[step_at] = _TAG_ENTRY + feature_head
            parts[step_at + 1] = list_tag + list_head
            feature_list_size += 1 + len(feature_head) + feature_size
        prefix = entry_prefix(name)
        feature_list_head = varint(feature_list_size)
        entry_size = len(prefix) + len(feature_list_head) + feature_list_size
        entry_head = varint(entry_size)
        parts[head_at:head_at + 3] = (_TAG_ENTRY + entry_head, prefix, feature_list_head)
        body += 1 + len(entry_head) + entry_size
    parts[2] = varint(body)
    return b"".join(parts)


def _values(feature: example_pb2.Feature) -> list:
    kind = feature.WhichOneof("kind")
    return list(getattr(feature, kind).value) if kind else []


def sequence_example_to_dict(data: bytes) -> tuple[dict[str, list], dict[str, list[list]]]:
    """Parses a serialized SequenceExample with the generated protobuf classes.

    Args:
      data: a serialized SequenceExample.

    Returns:
      ``(context, feature_lists)``: ``{name: [values]}`` and
      ``{name: [[values of step 0], [values of step 1], ...]}``, each sorted by
      name. Bytes stay bytes; a Feature with no list set gives ``[]``.

    Raises:
      google.protobuf.message.DecodeError: if the bytes are not a SequenceExample.
    """
    message = example_pb2.SequenceExample.FromString(data)
    context = {
        name: _values(feature) for name, feature in sorted(message.context.feature.items())
    }
    feature_lists = {
        name: [_values(feature) for feature in feature_list.feature]
        for name, feature_list in sorted(message.feature_lists.feature_list.items())
    }
    return context, feature_lists
