"""The image record: which features an image becomes, its bytes, and its size.

Feature names follow the conventional keys (as in TFRecorder and the TF object
detection API): the original encoded bytes are kept, never re-encoded.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping

from beam_tfrecords.transforms.codec.example import (
    bytes_entry_head,
    encode_example,
    feature_entry,
    scalar_entry,
    varint,
    varint_size,
)
from beam_tfrecords.transforms.codec.image_inspection import ImageInfo

__all__ = ["encode_image_example", "image_example_parts", "image_example_size"]


def _text_entry(name: str, text: str) -> bytes:
    return scalar_entry(name, "string", text) if len(text) <= 32 else feature_entry(name, "string", [text])


# The heads of the usual record's byte entries, by name and value size (digests all
# share one, names a few dozen, images' sizes a few thousand in a run).
_entry_head = functools.lru_cache(maxsize=16384)(bytes_entry_head)


@functools.lru_cache(maxsize=1024)
def _before(channels: int, label: int, label_text: str) -> bytes:
    """The usual record's entries before ``image/encoded`` (they repeat: cached)."""
    return b"".join((scalar_entry("image/channels", "int64", channels),
                     scalar_entry("image/class/label", "int64", label),
                     _text_entry("image/class/text", label_text)))


@functools.lru_cache(maxsize=1024)
def _middle(image_format: str, height: int) -> bytes:
    """The usual record's entries between ``image/filename`` and ``image/key/sha256``."""
    return scalar_entry("image/format", "string", image_format) + scalar_entry("image/height", "int64", height)


def encode_image_example(
    encoded: bytes,
    info: ImageInfo,
    label: int,
    label_text: str,
    filename: str,
    extra: tuple[tuple[str, str, object], ...] = (),
    digest: str | None = None,
) -> bytes:
    """Serializes one image as a ``tf.train.Example``.

    Args:
      encoded: the image file's bytes, stored unchanged.
      info: format, dimensions and channel count read from the header.
      label: class index (or, for several labels per image, a tuple of them; or
        ``None``: no ``image/class/label`` nor ``image/class/text``, a detection
        record whose classes are per object).
      label_text: class name (or a tuple of names, as ``label``; ignored with ``None``).
      filename: path relative to the input root.
      extra: extra features, ``((name, dtype, value), ...)``: one value each, or a
        tuple or list of values (a list feature, possibly empty).
      digest: the SHA-256 of ``encoded`` in hex, when the caller has it already.

    Returns:
      The deterministic serialization of the Example.
    """
    parts, _ = image_example_parts(encoded, info, label, label_text, filename, extra, digest)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def image_example_parts(
    encoded: bytes,
    info: ImageInfo,
    label: int,
    label_text: str,
    filename: str,
    extra: tuple[tuple[str, str, object], ...] = (),
    digest: str | None = None,
    names: Mapping[str, str] | None = None,
) -> tuple[list[bytes], int]:
    """``encode_image_example`` as pieces whose concatenation is the Example, and
    their total size: ``encoded`` is one of the pieces, not copied (see
    ``codec.tfrecord.frame_parts``). Arguments as for ``encode_image_example``;
    ``names`` (``--feature_names``, canonical -> output) renames the features,
    ``extra`` ones included, the Example's entries then sorted by output name."""
    digest = digest or hashlib.sha256(encoded).hexdigest()
    if not extra and not isinstance(label, tuple) and label is not None and not names:
        # The usual record: nine features whose name order is fixed (see _ORDER).
        image_head = _entry_head("image/encoded", len(encoded))
        name = filename.encode("utf-8")
        name_entry = _entry_head("image/filename", len(name)) + name
        key = digest.encode("utf-8")
        key_entry = _entry_head("image/key/sha256", len(key)) + key
        before = _before(info.channels, label, label_text)
        middle = _middle(info.format, info.height)
        after = scalar_entry("image/width", "int64", info.width)
        body = (len(before) + len(image_head) + len(encoded) + len(name_entry) + len(middle) + len(key_entry)
                + len(after))
        head = b"\x0a" + varint(body)
        return [head, before, image_head, encoded, name_entry, middle, key_entry, after], len(head) + body
    features = [
        ("image/encoded", "string", (encoded,)),
        ("image/format", "string", (info.format,)),
        ("image/height", "int64", (info.height,)),
        ("image/width", "int64", (info.width,)),
        ("image/channels", "int64", (info.channels,)),
        ("image/class/label", "int64", _values(label)),
        ("image/class/text", "string", _values(label_text)),
        ("image/filename", "string", (filename,)),
        ("image/key/sha256", "string", (digest,)),
    ]
    if label is None:  # A detection record: classes per object only.
        features = [feature for feature in features if not feature[0].startswith("image/class/")]
    features.extend((name, dtype, _values(value)) for name, dtype, value in extra)
    if names:
        features = [(names.get(name, name), dtype, values) for name, dtype, values in features]
    example = encode_example(features)
    return [example], len(example)


def _values(value) -> tuple:
    """A feature's values: a tuple or list as it is, anything else as one value."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _entry_size(key: str, value_list_size: int) -> int:
    """Size of one ``Features.feature`` map entry holding a one-list Feature."""
    key_size = len(key.encode("utf-8"))
    feature = 1 + varint_size(value_list_size) + value_list_size
    entry = 1 + varint_size(key_size) + key_size + 1 + varint_size(feature) + feature
    return 1 + varint_size(entry) + entry


def _bytes_list_size(value: bytes) -> int:
    return 1 + varint_size(len(value)) + len(value)


def _int64_list_size(value: int) -> int:
    packed = varint_size(value)
    return 1 + varint_size(packed) + packed


def _extra_list_size(dtype: str, value) -> int:
    if dtype == "int64":
        return _int64_list_size(int(value))
    if dtype == "float32":
        return 1 + 1 + 4  # Packed: tag, length 4, one float32.
    return _bytes_list_size(str(value).encode("utf-8"))


@functools.lru_cache(maxsize=256)
def _fixed_entries_size(image_format: str, height: int, width: int, channels: int, label: int,
                        label_text: str) -> int:
    """Size of the entries that do not depend on the file's name or bytes."""
    return (
        _entry_size("image/format", _bytes_list_size(image_format.encode("utf-8")))
        + _entry_size("image/height", _int64_list_size(height))
        + _entry_size("image/width", _int64_list_size(width))
        + _entry_size("image/channels", _int64_list_size(channels))
        + _entry_size("image/class/label", _int64_list_size(label))
        + _entry_size("image/class/text", _bytes_list_size(label_text.encode("utf-8")))
        + _entry_size("image/key/sha256", _bytes_list_size(b"0" * 64))
    )


def image_example_size(
    encoded_size: int,
    image_format: str,
    height: int,
    width: int,
    channels: int,
    label: int,
    label_text: str,
    filename: str,
    extra: tuple[tuple[str, str, object], ...] = (),
) -> int:
    """Exact serialized size of the Example ``encode_image_example`` makes.

    Used to plan shards before any image is read: call it with the file size and
    typical dimensions; the dimensions change the result by a few bytes at most.
    """
    features = (
        _entry_size("image/encoded", 1 + varint_size(encoded_size) + encoded_size)
        + _fixed_entries_size(image_format, height, width, channels, label, label_text)
        + _entry_size("image/filename", _bytes_list_size(filename.encode("utf-8")))
        + sum(_entry_size(name, _extra_list_size(dtype, value)) for name, dtype, value in extra)
    )
    return 1 + varint_size(features) + features
