"""Reading a published dataset back: ``DataSource`` (random access, no TensorFlow) and
``tf_dataset`` (a parsed ``tf.data.Dataset``).

``DataSource(path, split)`` is a map-style source (``len(ds)``, ``ds[i]``, as
Grain's ``MapDataset.source`` and a PyTorch ``DataLoader`` expect). Record ``i`` of
the split (the first run's shards in manifest order, then each incremental part's)
is read at its byte offset: from the shard's index file when the manifest lists one
(``index``), else from one pass over that shard's framing, made the first time the
shard is read in a process. Both CRCs of every record read are checked. The record
is decoded by the manifest's feature spec (``features``):

- ``int64``/``float32`` of shape ``[]``: a numpy scalar (``numpy.int64``,
  ``numpy.float32``); of a fixed shape: an array of that shape; with ``null`` in the
  shape (variable length): a 1-D array (``[null, k]``: ``(n, k)``), empty when the
  record has no value.
- ``string`` of shape ``[]``: ``bytes``; otherwise a list of ``bytes``.

Variable-length features differ in length between records: batch them padded or
ragged (a collate function of your own; ``tf_dataset(...).ragged_batch(n)``).

A dataset written without a spec (``WriteVerifiedShards`` without ``features``)
gives every feature of each record as a 1-D array or a list of ``bytes``.

``decode_images=True`` decodes the image feature (``image/encoded``, or its
``--feature_names`` name) with Pillow into a ``(height, width, channels)`` array:
``uint8``, ``uint16`` for a 16-bit greyscale PNG (other 16-bit PNGs give ``uint8``,
their high bytes, as ``tf.io.decode_image`` does; grey+alpha keeps its 2 channels);
grey images keep one channel, a
palette image becomes RGB (RGBA with transparency), an animated GIF gives its first
frame.

Gzip shards are refused: reading one record at an offset would decompress the shard
from its start each time (``tf_dataset`` reads them). Sequence datasets
(``SequenceExample`` records, ``--sequence_key``) are refused too.

The source pickles as its manifest's contents and path: no open file goes with it;
each process opens the shards it reads on first use (one descriptor per shard
locally; on ``gs://`` ranged reads of the generation seen when it was opened).
"""

from __future__ import annotations

import bisect
import hashlib
import io
import operator
import os
import posixpath
import threading
import warnings

import numpy as np

from beam_tfrecords.schemas.features import output_feature_name
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, outside_folder, parse_manifest, shown_value
from beam_tfrecords.schemas.proto import example_pb2
from beam_tfrecords.transforms.codec.record_offsets import (
    FramingScanner,
    RecordOffsets,
    parse_index,
    unframe,
)
from beam_tfrecords.transforms.codec.tfrecord import RecordError
from beam_tfrecords.transforms.io.shard_reads import ShardChanged, ShardFile, read_small_file

__all__ = ["DataSource", "RecordUnreadable", "tf_dataset"]

_LISTS = {"string": "bytes_list", "int64": "int64_list", "float32": "float_list"}
# Guards a source's first use in a forked process (renewed in each child: a thread of
# the parent may have held it at the fork).
_FORKED = threading.Lock()


def _renew_fork_lock() -> None:
    global _FORKED  # pylint: disable=global-statement
    _FORKED = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_fork_lock)


class RecordUnreadable(ValueError):
    """A record that cannot be read as the manifest describes it: a CRC that does not
    hold, a value that does not fit the spec. The message names the shard and the
    record (its index in the shard and in the split)."""


def _join(folder: str, rel: str, key: str, source: str) -> str:
    """``rel`` under ``folder``, proved to stay inside it (locally, links included)."""
    why = outside_folder(rel)
    path = posixpath.join(folder.rstrip("/"), rel)
    if not why and not folder.startswith("gs://"):
        base, target = os.path.realpath(folder), os.path.realpath(path)
        if target != base and not target.startswith(base.rstrip("/") + "/"):
            why = "is a symbolic link leading out of the dataset folder"
    if why:
        raise ValueError(f"{source}: {key}: {shown_value(rel)} {why}: it leads outside the "
                         "dataset folder")
    return path


def _load_manifest(path: str, expected_sha256: str | None = None) -> dict:
    data = read_small_file(path)
    if data is None:
        raise FileNotFoundError(f"{path} does not exist: not a finished dataset")
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise ValueError(f"{path} does not match the SHA-256 the root {MANIFEST_NAME} lists")
    return parse_manifest(data.decode("utf-8-sig"), path)


def _split_shards(location: str, split: str) -> tuple[dict, list[dict]]:
    """The root manifest and the split's shards (first run, then each part), each as
    ``{"path", "records", "bytes", "crc32c", "index"}`` with full paths."""
    location = location.rstrip("/") or location
    root_path = posixpath.join(location, MANIFEST_NAME)
    root = _load_manifest(root_path)
    folders = [(location, root, root_path)]
    for i, part in enumerate(root.get("parts", [])):
        folder = _join(location, part["path"], f"parts[{i}].path", root_path)
        part_path = posixpath.join(folder, MANIFEST_NAME)
        folders.append((folder, _load_manifest(part_path, part["manifest_sha256"]), part_path))
    known = sorted({s for _, m, _ in folders for s in m["splits"]})
    if split not in known:
        raise KeyError(f"{location} has no split {split!r} (it has {', '.join(known) or 'none'})")
    shards = []
    for folder, manifest, source in folders:
        for n, shard in enumerate(manifest["splits"].get(split, {}).get("shards", [])):
            key = f"splits.{split}.shards[{n}]"
            index = shard.get("index")
            index_path = None
            if isinstance(index, dict) and isinstance(index.get("path"), str):
                index_path = _join(folder, index["path"], f"{key}.index.path", source)
            shards.append({"path": _join(folder, shard["path"], f"{key}.path", source),
                           "records": shard["records"], "bytes": shard["bytes"],
                           "crc32c": shard["crc32c"], "index": index_path,
                           "index_sha256": index.get("sha256") if index_path else None})
    return root, shards


def _refusal(root: dict, shards: list[dict]) -> str:
    if any(s["path"].endswith(".gz") for s in shards):
        return ("its shards are gzip-compressed: a record cannot be read at its offset without "
                "decompressing the shard from its start; read it with "
                "beam_tfrecords.tf_dataset, or convert with --compression none")
    if root.get("sequence_features"):
        return "it holds SequenceExample records (--sequence_key); read it with tf.data"
    return ""


class DataSource:
    """A split of a published dataset as a map-style source: ``len(ds)``, ``ds[i]``.

    Args:
      path: the dataset folder (holding ``manifest.json``), local or ``gs://``.
      split: the split to read (``train``, ...).
      decode_images: decode the image feature into a ``(height, width, channels)``
        numpy array (see the module docstring).

    Raises:
      FileNotFoundError: when ``path`` holds no manifest.
      KeyError: when the dataset has no such split.
      ValueError: when the manifest is malformed, names a path outside its folder,
        the shards are gzip-compressed, or ``decode_images`` is asked of a dataset
        without an image feature.
    """

    def __init__(self, path: str, split: str, *, decode_images: bool = False):
        root, shards = _split_shards(path, split)
        why = _refusal(root, shards)
        if why:
            raise ValueError(f"DataSource cannot read {path}: {why}")
        self.path = path
        self.split = split
        self.decode_images = decode_images
        self._spec = {name: (s.get("dtype", "string"), list(s.get("shape") or []))
                      for name, s in sorted((root.get("features") or {}).items())}
        # (name, list kind, shape, numpy shape, fixed value count or None) per feature.
        self._fields = [(name, _LISTS[dtype], shape, tuple(-1 if d is None else d for d in shape),
                         None if None in shape else int(np.prod(shape, dtype=np.int64)))
                        for name, (dtype, shape) in self._spec.items()]
        self._image_key = output_feature_name(root.get("feature_names"), "image/encoded")
        if decode_images and self._image_key not in self._spec:
            raise ValueError(f"DataSource cannot decode images of {path}: its records have no "
                             f"image feature ({self._image_key!r} is not in its feature spec)")
        self._shards = shards
        self._ends = np.cumsum([s["records"] for s in shards]).tolist()
        self._local: dict = {"pid": os.getpid()}
        self._lock = threading.Lock()  # Threads of one process open each shard once.

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_local"], state["_lock"]  # Open files and found offsets stay in their process.
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = {"pid": os.getpid()}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    @property
    def feature_spec(self) -> dict[str, dict]:
        """The manifest's feature spec: ``{name: {"dtype": ..., "shape": [...]}}``."""
        return {name: {"dtype": dtype, "shape": list(shape)} for name, (dtype, shape) in self._spec.items()}

    def __repr__(self) -> str:
        features = ", ".join(self._spec) or "as each record holds them"
        return (f"DataSource({self.path!r}, {self.split!r}, decode_images={self.decode_images}): "
                f"{len(self)} records in {len(self._shards)} shards; features: {features}")

    def __getitem__(self, i) -> dict:
        shard_no, within = self._locate(i)
        return self._decode(self._read(shard_no, within), shard_no, within)

    def record_bytes(self, i) -> bytes:
        """Record ``i``'s serialized Example (both its CRCs checked), undecoded.

        Raises:
          IndexError: when ``i`` is out of range.
          RecordUnreadable: naming the shard and the record, when a CRC does not hold.
        """
        return self._read(*self._locate(i))

    def close(self) -> None:
        """Closes the shards this process opened (a later read opens them again).
        Not to be called while another thread reads."""
        with self._lock:
            for key, found in list(self._local.items()):
                if key != "pid":
                    found[0].close()
            self._local = {"pid": os.getpid()}

    def _locate(self, i) -> tuple[int, int]:
        """``(shard number, record number in the shard)`` of record ``i`` of the split."""
        i = operator.index(i)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record index out of range: {n} records")
        shard_no = bisect.bisect_right(self._ends, i)
        return shard_no, i - (self._ends[shard_no - 1] if shard_no else 0)

    def _read(self, shard_no: int, within: int) -> bytes:
        handle, offsets = self._opened(shard_no)
        start, length = int(offsets.starts[within]), int(offsets.lengths[within])
        try:
            return unframe(handle.read(start, length), within, start)
        except RecordError as err:
            raise self._unreadable(shard_no, within, str(err)) from None

    def _unreadable(self, shard_no: int, within: int, why: str) -> RecordUnreadable:
        first = self._ends[shard_no - 1] if shard_no else 0
        return RecordUnreadable(f"{self._shards[shard_no]['path']}: record {within} of the shard "
                                f"(record {first + within} of split {self.split!r}): {why}")

    def _opened(self, shard_no: int) -> tuple[ShardFile, RecordOffsets]:
        """The shard's file and offsets, opened and found once in this process (under
        a lock: threads reading at once share one descriptor per shard)."""
        if self._local.get("pid") != os.getpid():  # A forked worker opens its own files,
            with _FORKED:  # with a lock no thread of its parent holds.
                if self._local.get("pid") != os.getpid():
                    self._lock = threading.Lock()
                    self._local = {"pid": os.getpid()}
        found = self._local.get(shard_no)
        if found is not None:
            return found
        with self._lock:
            found = self._local.get(shard_no)
            if found is None:
                shard = self._shards[shard_no]
                handle = ShardFile(shard["path"], shard["bytes"], shard["crc32c"])
                offsets = self._offsets(shard_no, handle)
                handle.open()  # Opened here, under the lock, not by the first read.
                found = self._local[shard_no] = (handle, offsets)
        return found

    def _offsets(self, shard_no: int, handle: ShardFile) -> RecordOffsets:
        shard = self._shards[shard_no]
        if shard["index"]:
            data = read_small_file(shard["index"])
            why = "is missing" if data is None else (
                "does not match the SHA-256 the manifest lists"
                if hashlib.sha256(data).hexdigest() != shard["index_sha256"] else "")
            if not why:
                try:
                    return parse_index(data, shard["bytes"], shard["records"])
                except ValueError as err:
                    why = str(err)
            warnings.warn(f"{shard['index']} {why}; the shard's framing is read instead",
                          stacklevel=4)
        scanner = FramingScanner()
        try:
            for block in handle.blocks():
                scanner.feed(block)
            offsets = scanner.finish()
        except RecordError as err:
            raise self._unreadable(shard_no, err.index, str(err)) from None
        if len(offsets) != shard["records"]:
            raise ShardChanged(f"{shard['path']} holds {len(offsets)} records; the manifest "
                               f"lists {shard['records']}")
        return offsets

    def _decode(self, data: bytes, shard_no: int, within: int) -> dict:
        try:
            features = example_pb2.Example.FromString(data).features.feature
            if not self._spec:
                return {name: _values(feature, feature.WhichOneof("kind"), [None], (-1,), None)
                        for name, feature in sorted(features.items())}
            out = {}
            for name, kind, shape, dims, size in self._fields:
                if name in features:  # (Indexing a protobuf map would add the key.)
                    out[name] = _values(features[name], kind, shape, dims, size)
                elif None in shape:
                    out[name] = _values(None, kind, shape, dims, size)
                else:
                    raise ValueError(f"feature {name!r} is missing (its shape {shape} is fixed)")
            if self.decode_images:
                out[self._image_key] = decode_image(out[self._image_key])
            return out
        except Exception as err:  # pylint: disable=broad-except
            raise self._unreadable(shard_no, within, f"{type(err).__name__}: {err}") from None


def _values(feature, kind: str | None, shape: list, dims: tuple, size: int | None):
    """One feature's values as the spec's shape says (see the module docstring)."""
    if kind is None:  # A feature without a list (no spec to say which).
        return []
    values = getattr(feature, kind).value if feature is not None else ()
    count = len(values)
    if shape == [] and count != 1:
        raise ValueError(f"{count} values for a scalar")
    if kind == "bytes_list":
        return values[0] if shape == [] else list(values)
    numpy_type = np.int64 if kind == "int64_list" else np.float32
    if shape == []:
        return numpy_type(values[0])
    if size is not None and count != size:
        raise ValueError(f"{count} values for shape {shape}")
    array = np.fromiter(values, numpy_type, count)
    return array.reshape(dims) if len(dims) > 1 else array


def decode_image(data: bytes) -> np.ndarray:
    """An encoded image as a ``(height, width, channels)`` array with Pillow: ``uint8``,
    ``uint16`` for 16-bit greyscale (other 16-bit PNGs: their high bytes, a grey+alpha
    one in its 2 channels); a palette image as RGB (RGBA with transparency), an
    animated image's first frame."""
    from PIL import Image  # pylint: disable=import-outside-toplevel

    with Image.open(io.BytesIO(data)) as image:
        mode = image.mode
        # Pillow reads a 16-bit grey+alpha PNG as RGBA at 8 bits (grey in R, G and B):
        # its two channels are R and A, the high bytes, as tf.io.decode_image gives them.
        grey_alpha = mode == "RGBA" and any(t[3] == "LA;16B" for t in image.tile)
        if mode in ("I;16", "I;16B", "I;16L", "I"):
            array = np.asarray(image, dtype=np.uint16) if mode != "I" else \
                np.asarray(image).astype(np.uint16)
        else:
            if mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif mode == "1":
                image = image.convert("L")
            elif mode in ("PA",):
                image = image.convert("RGBA")
            elif mode not in ("L", "LA", "RGB", "RGBA"):
                image = image.convert("RGB")
            array = np.asarray(image, dtype=np.uint8)
    if grey_alpha:
        array = array[:, :, [0, 3]]
    return array[:, :, None] if array.ndim == 2 else array


def tf_dataset(path: str, split: str, decode_images: bool = False):
    """A split as a ``tf.data.Dataset`` of parsed records (dicts of tensors), built from
    the manifest's feature spec: ``tf.io.FixedLenFeature`` for a fixed shape, a
    variable-length feature (``null`` in its shape) as a dense 1-D tensor (``[null,
    k]``: ``(n, k)``). The split's shards are read in manifest order, parts included,
    gzip shards too. Variable-length features differ in length between records:
    batch with ``ragged_batch`` or ``padded_batch`` (``batch`` fails on them).

    Imports TensorFlow when called (and only then): TensorFlow is not a dependency
    of this package.

    Args:
      path: the dataset folder (holding ``manifest.json``), local or ``gs://``.
      split: the split to read.
      decode_images: decode the image feature with ``tf.io.decode_image``
        (``expand_animations=False``: an animated GIF's first frame) into a
        ``(height, width, channels)`` ``uint8`` tensor (TensorFlow converts a
        16-bit PNG to ``uint8``; ``DataSource`` keeps ``uint16``).

    Raises:
      ImportError: when TensorFlow is not installed (saying so).
      FileNotFoundError, KeyError, ValueError: as ``DataSource``.
    """
    try:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
    except ImportError as err:
        raise ImportError("beam_tfrecords.tf_dataset needs TensorFlow, which is not installed "
                          "(pip install tensorflow-cpu); DataSource reads without it") from err
    root, shards = _split_shards(path, split)
    if root.get("sequence_features"):
        raise ValueError(f"tf_dataset cannot read {path}: it holds SequenceExample records "
                         "(--sequence_key); parse them with tf.io.parse_single_sequence_example")
    specs = {name: (s.get("dtype", "string"), list(s.get("shape") or []))
             for name, s in sorted((root.get("features") or {}).items())}
    if not specs:
        raise ValueError(f"tf_dataset cannot read {path}: its manifest has no feature spec")
    image_key = output_feature_name(root.get("feature_names"), "image/encoded")
    if decode_images and image_key not in specs:
        raise ValueError(f"tf_dataset cannot decode images of {path}: no {image_key!r} feature")
    parse = {name: tf.io.VarLenFeature(dtype) if None in shape else tf.io.FixedLenFeature(shape, dtype)
             for name, (dtype, shape) in specs.items()}

    def parsed(record):
        features = tf.io.parse_single_example(record, parse)
        for name, (_, shape) in specs.items():
            if None in shape:
                dense = tf.sparse.to_dense(features[name])
                features[name] = tf.reshape(dense, [-1 if d is None else d for d in shape]) \
                    if len(shape) > 1 else dense
        if decode_images:
            features[image_key] = tf.io.decode_image(features[image_key], expand_animations=False)
        return features

    files = [s["path"] for s in shards]
    compression = "GZIP" if any(f.endswith(".gz") for f in files) else ""
    return tf.data.TFRecordDataset(files, compression_type=compression).map(parsed)
