"""A detection record decoder for the tests, without TensorFlow: it requires what TF
Model Garden's ``TfExampleDecoder`` (``official/vision/dataloaders/tf_example_decoder.py``)
requires, and fails loudly where it would fail (or where its output would be wrong).

``decode_detection(serialized, include_mask=False)`` parses a serialized
``tf.train.Example`` with the product's own protobuf (``schemas.proto``) and mirrors
``TfExampleDecoder(include_mask).decode``:

- fixed-length keys (``tf.io.FixedLenFeature((), ...)``): ``image/encoded`` (string,
  required), ``image/source_id`` (string, required: the decoder is built with
  ``regenerate_source_id=False``), ``image/height`` and ``image/width`` (int64,
  default -1: then the decoded image's size). Present means exactly one value of that
  type. An empty ``image/source_id`` is refused here: Model Garden would replace it
  with a FarmHash of the image bytes, which cannot be computed without TensorFlow,
  and the product never writes one empty;
- variable-length keys (``tf.io.VarLenFeature``): ``image/object/bbox/{xmin,ymin,
  xmax,ymax}`` and ``image/object/area`` (float32), ``image/object/class/label`` and
  ``image/object/is_crowd`` (int64), ``image/object/mask`` (string, with
  ``include_mask``): absent means empty; present means that type;
- boxes stacked ``[ymin, xmin, ymax, xmax]`` (the four lists must be as long as one
  another, as ``tf.stack`` requires); area from the boxes when absent
  (``(xmax - xmin) * (ymax - ymin) * height * width``); ``is_crowd`` all false when
  absent; masks decoded from PNG (one channel), ``[0, height, width]`` when none;
  the image decoded as ``tf.io.decode_image(..., channels=3)`` does
  (``tests.harness.tf_decode``: bytes TensorFlow cannot decode fail here too).

Stricter than Model Garden where its output would silently disagree with itself:
per-object lists (classes, area, is_crowd, masks, text, difficult, truncated) must be
as long as the boxes when present, and masks and the semantic mask must be the
image's size.

Also read, as the Object Detection API's decoder and DeepLab's read them:
``image/object/class/text`` (string), ``image/object/difficult`` and
``image/object/truncated`` (int64), ``image/class/label`` (int64) and
``image/class/text`` (string) as lists; ``image/segmentation/class/encoded``
(fixed string, default '') with ``image/segmentation/class/format`` (default
``png``), decoded to a ``[height, width]`` array; ``image/filename``.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
from google.protobuf.message import DecodeError as ProtobufDecodeError
from PIL import Image

from beam_tfrecords.schemas.proto import example_pb2
from tests.harness.tf_decode import tf_decode_image

KIND = {"string": "bytes_list", "float32": "float_list", "int64": "int64_list"}
BOX_KEYS = ("ymin", "xmin", "ymax", "xmax")


class DecodeError(ValueError):
    """The record is not one Model Garden's TfExampleDecoder would decode as meant."""


@dataclasses.dataclass(frozen=True)
class Detection:
    """One decoded record (``TfExampleDecoder.decode``'s tensors, as numpy).

    Attributes:
      source_id, filename: text.
      image: ``[height, width, 3]`` uint8.
      height, width: from the record (or the image, when absent).
      boxes: ``[N, 4]`` float32, ``ymin, xmin, ymax, xmax``, normalized.
      classes: ``[N]`` int64; is_crowd: ``[N]`` bool; area: ``[N]`` float32.
      masks: ``[N, height, width]`` float32 (with ``include_mask``), else ``None``.
      class_text: per object; difficult, truncated: ``[N]`` int64 (zeros when absent).
      image_labels, image_texts: several labels per image.
      segmentation: the semantic mask ``[height, width]`` (uint8 or uint16), or ``None``.
    """

    source_id: str
    filename: str
    image: np.ndarray
    height: int
    width: int
    boxes: np.ndarray
    classes: np.ndarray
    is_crowd: np.ndarray
    area: np.ndarray
    masks: np.ndarray | None
    class_text: tuple[str, ...]
    difficult: np.ndarray
    truncated: np.ndarray
    image_labels: np.ndarray
    image_texts: tuple[str, ...]
    segmentation: np.ndarray | None


def _values(features, key: str, dtype: str) -> list | None:
    """The key's values, ``None`` when absent; ``DecodeError`` on another type."""
    if key not in features:
        return None
    kind = features[key].WhichOneof("kind")
    if kind is None:
        return []
    if kind != KIND[dtype]:
        raise DecodeError(f"{key}: expected {dtype} ({KIND[dtype]}), found {kind}")
    return list(getattr(features[key], kind).value)


def _fixed(features, key: str, dtype: str, default=None):
    """A ``FixedLenFeature((), dtype, default)``: exactly one value when present; the
    default only when absent."""
    values = _values(features, key, dtype)
    if values is None:
        if default is None:
            raise DecodeError(f"{key}: required (FixedLenFeature without a default) but missing")
        return default
    if len(values) != 1:
        raise DecodeError(f"{key}: a fixed-length scalar needs exactly 1 value, found {len(values)}")
    return values[0]


def _var(features, key: str, dtype: str, count: int | None = None) -> list:
    """A ``VarLenFeature(dtype)``: its values, empty when absent; with ``count``, a
    non-empty list must have that many."""
    values = _values(features, key, dtype) or []
    if count is not None and values and len(values) != count:
        raise DecodeError(f"{key}: {len(values)} values for {count} boxes")
    return values


def _rgb(data: bytes) -> np.ndarray:
    """``tf.io.decode_image(data, channels=3)``."""
    array = tf_decode_image(data)
    if array.dtype == np.uint16:
        array = (array // 257).astype(np.uint8)
    if array.ndim == 2:
        array = array[:, :, None]
    if array.shape[2] in (1, 2):
        array = np.repeat(array[:, :, :1], 3, axis=2)
    return np.ascontiguousarray(array[:, :, :3])


def _png_channel(data: bytes, key: str, size: tuple[int, int]) -> np.ndarray:
    """A one-channel PNG (``tf.io.decode_png(channels=1)``), checked to be ``size``."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        raise DecodeError(f"{key}: not a PNG")
    with Image.open(io.BytesIO(data)) as im:
        if im.mode not in ("L", "1", "P", "I;16", "I"):
            raise DecodeError(f"{key}: a PNG of mode {im.mode}, not one channel")
        array = np.asarray(im)
    if array.shape != (size[1], size[0]):
        raise DecodeError(f"{key}: {array.shape[1]}x{array.shape[0]}, the image {size[0]}x{size[1]}")
    return array.astype(np.uint8) if array.dtype == bool else array


def _boxes(features) -> np.ndarray:
    columns = [_var(features, f"image/object/bbox/{name}", "float32") for name in BOX_KEYS]
    if len({len(column) for column in columns}) != 1:
        raise DecodeError(f"the bbox lists differ in length: {[len(c) for c in columns]}")
    return np.array(columns, dtype=np.float32).T.reshape(-1, 4)


def _semantic(features, size: tuple[int, int]) -> np.ndarray | None:
    encoded = _fixed(features, "image/segmentation/class/encoded", "string", b"")
    mask_format = _fixed(features, "image/segmentation/class/format", "string", b"png")
    if not encoded:
        return None
    if mask_format != b"png":
        raise DecodeError(f"image/segmentation/class/format: {mask_format!r}, not png")
    return _png_channel(encoded, "image/segmentation/class/encoded", size)


def decode_detection(serialized: bytes, include_mask: bool = False) -> Detection:
    """Decodes one record as ``TfExampleDecoder(include_mask=...).decode`` (see the module).

    Raises:
      DecodeError: a required key missing, a wrong type, lists that disagree.
    """
    try:
        features = example_pb2.Example.FromString(serialized).features.feature
    except ProtobufDecodeError as err:
        raise DecodeError(f"not a tf.train.Example: {err}") from None
    encoded = _fixed(features, "image/encoded", "string")
    source_id = _fixed(features, "image/source_id", "string")
    if not source_id:
        raise DecodeError("image/source_id: empty (Model Garden would hash the image bytes instead)")
    image = _rgb(encoded)
    height = _fixed(features, "image/height", "int64", -1)
    width = _fixed(features, "image/width", "int64", -1)
    if height == -1 or width == -1:
        height, width = image.shape[0], image.shape[1]
    if (height, width) != image.shape[:2]:
        raise DecodeError(f"image/height, image/width say {width}x{height}, the image is "
                          f"{image.shape[1]}x{image.shape[0]}")
    boxes = _boxes(features)
    count = len(boxes)
    classes = np.array(_var(features, "image/object/class/label", "int64"), dtype=np.int64)
    if len(classes) != count:
        raise DecodeError(f"image/object/class/label: {len(classes)} values for {count} boxes")
    area = np.array(_var(features, "image/object/area", "float32", count), dtype=np.float32)
    if not len(area):
        area = ((boxes[:, 3] - boxes[:, 1]) * (boxes[:, 2] - boxes[:, 0]) * height * width).astype(np.float32)
    crowd = _var(features, "image/object/is_crowd", "int64", count)
    masks = None
    if include_mask:
        pngs = _var(features, "image/object/mask", "string", count)
        masks = np.zeros((0, height, width), dtype=np.float32) if not pngs else np.stack(
            [_png_channel(p, "image/object/mask", (width, height)).astype(np.float32) for p in pngs])
    return Detection(
        source_id=source_id.decode("utf-8"),
        filename=_fixed(features, "image/filename", "string", b"").decode("utf-8"),
        image=image, height=int(height), width=int(width), boxes=boxes, classes=classes,
        is_crowd=np.array(crowd, dtype=bool) if crowd else np.zeros(count, dtype=bool),
        area=area, masks=masks,
        class_text=tuple(t.decode("utf-8") for t in _var(features, "image/object/class/text", "string", count)),
        difficult=np.array(_var(features, "image/object/difficult", "int64", count) or [0] * count),
        truncated=np.array(_var(features, "image/object/truncated", "int64", count) or [0] * count),
        image_labels=np.array(_var(features, "image/class/label", "int64"), dtype=np.int64),
        image_texts=tuple(t.decode("utf-8") for t in _var(features, "image/class/text", "string")),
        segmentation=_semantic(features, (width, height)),
    )
