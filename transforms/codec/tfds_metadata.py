"""TFDS metadata of a published dataset: ``dataset_info.json``, ``features.json`` and one
``<feature>.labels.txt`` per class feature, computed from its ``manifest.json`` alone.

``tfds.builder_from_directory(OUT)`` reads a folder holding these files and the
shards; TFDS is not needed to write them. ``tfds_metadata(manifest)`` is a pure,
deterministic function (``{file name: bytes}``): the commit publishes its files
beside the manifest, and ``verify`` recomputes them and compares bytes. The JSON is
what TFDS 4.9 writes (``DatasetInfo.write_to_directory``: protobuf's JSON, 64-bit
integers as strings, keys sorted): per split ``shardLengths`` (records per shard,
in index order), ``numBytes`` and the ``filepathTemplate``
``{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}``, which names our shards
(``train-00000-of-00008.tfrecord``); ``fileFormat`` ``tfrecord``.

Features, stock TFDS classes only, keyed by the manifest's feature names (the
output names, ``--feature_names`` renames included; roles are resolved with
``schemas.features.output_feature_name``):

- the image bytes: ``Image`` with shape ``(None, None, C)``, C the one channel
  count of every image's mode in the statistics (``None`` when they differ: each
  image then decodes to its own), ``uint16`` when every image is 16-bit (modes
  ``L16``, ``RGB16``, ...; a mix of 8- and 16-bit is ``uint8``: TensorFlow scales
  the 16-bit ones down), and the encoding when every image is JPEG or PNG of one
  channel count (TFDS checks it against the encoding). A dataset holding a format TFDS's
  decoder cannot give as one image (GIF, animated or not, and WebP:
  ``tf.image.decode_image`` gives frames; TIFF and others: not decoded) declares the bytes as a
  ``Tensor`` of ``string`` instead, and its description says why;
- one class per image: ``ClassLabel`` with the vocabulary as its labels file;
  the annotated layouts' ids (1-based, COCO's as given, 0 the background) are
  ``ClassLabel`` indices too: the labels file names every index up to the largest
  id, the unused ones ``background`` (0) and ``unused_<id>``; per object (and
  several labels per image) a ``Sequence`` of it;
- boxes: the four coordinate lists as ``Sequence`` of ``float32`` (TFDS's
  ``BBoxFeature`` needs the four in one key, which the Object Detection API keys
  are not); instance masks a ``Sequence`` of one-channel PNG ``Image``; a semantic
  mask (8- or 16-bit, which a TFDS ``Image`` must state ahead) its PNG bytes;
- other scalars ``Scalar`` (numbers) or ``Text`` (strings); lists and fixed
  shapes ``Tensor``; ``bytes`` table columns ``Tensor`` of ``string``.

Not written: gzip datasets (TFDS reads TFRecord files uncompressed only), a dataset
with a split name holding ``.`` (TFDS's split parser refuses ``train.v2``), and a
dataset without shards. The manifest records which (``tfds_entry``: the file names,
or why none), so that ``verify`` tells a dataset whose files were deleted from one
written before they existed. ``tfds_notes`` says in lines what the files leave out.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping

from beam_tfrecords.schemas.features import output_feature_name

__all__ = [
    "DATASET_INFO_NAME",
    "FEATURES_NAME",
    "FILEPATH_TEMPLATE",
    "LABELS_SUFFIX",
    "is_tfds_file",
    "tfds_digests",
    "tfds_entry",
    "tfds_metadata",
    "tfds_not_written",
    "tfds_notes",
]

DATASET_INFO_NAME = "dataset_info.json"
FEATURES_NAME = "features.json"
LABELS_SUFFIX = ".labels.txt"
FILEPATH_TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.{FILEFORMAT}"
_VERSION = "1.0.0"
_CLASSES = "tensorflow_datasets.core.features."
_IMAGE, _CLASS_LABEL = _CLASSES + "image_feature.Image", _CLASSES + "class_label_feature.ClassLabel"
_SCALAR, _TENSOR = _CLASSES + "scalar.Scalar", _CLASSES + "tensor_feature.Tensor"
_TEXT, _SEQUENCE = _CLASSES + "text_feature.Text", _CLASSES + "sequence_feature.Sequence"
_DICT = _CLASSES + "features_dict.FeaturesDict"
# What tf.image.decode_image decodes to one image (GIF and WebP give frames; TIFF it cannot read).
_DECODED_FORMATS = {"jpeg", "png", "bmp"}
# The statistics' modes (``codec.image_headers.ImageInfo.mode``): these, ``16`` appended when 16-bit.
_MODE_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}
# A split name TFDS's split parser reads (``train``, ``train[:10%]``): no '.'.
_TFDS_SPLIT = re.compile(r"[\w-]+")
_PER_OBJECT = ("image/object/bbox/xmin", "image/object/bbox/ymin", "image/object/bbox/xmax",
               "image/object/bbox/ymax", "image/object/class/text", "image/object/is_crowd",
               "image/object/area", "image/object/difficult", "image/object/truncated")
_BYTES_ROLES = ("image/segmentation/class/encoded",)
_SAFE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_MAX_CLASS_ID = 65535  # A larger id would make a labels file of that many lines: plain int64 then.


def is_tfds_file(name: str) -> bool:
    """Whether a file name at the top of a dataset folder is one ``tfds_metadata`` may write."""
    return name in (DATASET_INFO_NAME, FEATURES_NAME) or (
        name.endswith(LABELS_SUFFIX) and "/" not in name)


def _dumps(value: dict, indent: int) -> bytes:
    return json.dumps(value, indent=indent, sort_keys=True, ensure_ascii=False).encode("utf-8")


def _shape(dims) -> dict:
    return {"dimensions": [str(-1 if d is None else d) for d in dims]} if dims else {}


def _tensor(dtype: str, dims=(), scalar: bool = False) -> dict:
    return {"pythonClassName": _SCALAR if scalar else _TENSOR,
            "tensor": {"dtype": dtype, "encoding": "none", "shape": _shape(dims)}}


def _text() -> dict:
    return {"pythonClassName": _TEXT, "text": {}}


def _sequence(feature: dict) -> dict:
    return {"pythonClassName": _SEQUENCE, "sequence": {"feature": feature, "length": "-1"}}


def _class_label(count: int) -> dict:
    return {"classLabel": {"numClasses": str(count)}, "pythonClassName": _CLASS_LABEL}


def _image(channels: int | None, dtype: str, encoding: str | None) -> dict:
    value = {"dtype": dtype, "shape": _shape((None, None, channels))}
    if encoding:
        value["encodingFormat"] = encoding
    return {"image": value, "pythonClassName": _IMAGE}


def _image_counts(manifest: Mapping, kind: str) -> set[str]:
    """The image formats (``kind`` ``formats``) or modes (``modes``) of every split's statistics."""
    found: set[str] = set()
    for info in manifest["splits"].values():
        found |= set(((info.get("statistics") or {}).get("images") or {}).get(kind) or {})
    return found


def _image_feature(manifest: Mapping) -> tuple[dict, str]:
    """The image bytes' feature, and '' or why they are declared as bytes."""
    formats = _image_counts(manifest, "formats")
    undecoded = sorted(formats - _DECODED_FORMATS)
    if undecoded:
        return _tensor("string"), (f"images of format {', '.join(undecoded)} (TFDS's Image decodes "
                                   f"JPEG, PNG and BMP): the image feature is their bytes")
    modes = _image_counts(manifest, "modes")
    counts = {_MODE_CHANNELS.get(m.removesuffix("16")) for m in modes}
    channels = counts.pop() if len(counts) == 1 else None
    dtype = "uint16" if modes and all(m.endswith("16") for m in modes) else "uint8"
    # TFDS checks a PNG's or JPEG's channel count: with several (or unknown), no encoding.
    encoding = formats.pop() if len(formats) == 1 and formats <= {"jpeg", "png"} and channels else None
    if encoding == "jpeg" and (channels not in (1, 3) or dtype != "uint8"):
        encoding = None
    return _image(channels, dtype, encoding), ""


def _names_by_id(items) -> list[str] | None:
    """Labels file lines indexed by class id (``[[id, name], ...]``), gaps filled."""
    ids = dict(items)
    if not ids or min(ids) < 0 or max(ids) > _MAX_CLASS_ID:
        return None
    taken = set(ids.values())
    names = []
    for index in range(max(ids) + 1):
        name = ids.get(index)
        if name is None:
            name = "background" if index == 0 else f"unused_{index}"
            while name in taken:
                name += "_"
            taken.add(name)
        names.append(name)
    return names


def _labels_ok(names: list[str] | None) -> bool:
    """TFDS reads a labels file line by line, stripped, blank lines dropped."""
    return bool(names) and len(set(names)) == len(names) and all(
        n and n == n.strip() and "\n" not in n and "\r" not in n for n in names)


def _class_names(manifest: Mapping, canonical: str) -> list[str] | None:
    """The labels file lines of a class feature (``None``: declared as plain int64): the
    vocabulary for one class per image; an annotated layout's ids (see the module)."""
    annotations = manifest.get("annotations")
    if isinstance(annotations, Mapping) and annotations.get("layout") != "custom":
        items = [(i["id"], i["name"]) for i in (annotations.get("label_map") or {}).get("items") or []]
        names = _names_by_id(items)
    elif canonical == "image/class/label":
        names = list((manifest.get("labels") or {}).get("vocabulary") or [])
    else:
        names = None
    return names if _labels_ok(names) else None


def _labels_file(name: str) -> str | None:
    file = name.replace("/", ".") + LABELS_SUFFIX
    return file if _SAFE_FILE.fullmatch(file) else None


def _bytes_columns(manifest: Mapping) -> set[str]:
    columns = (manifest.get("schema") or {}).get("columns") or []
    return {c.get("feature") or c.get("name") for c in columns
            if isinstance(c, Mapping) and c.get("type") == "bytes"}


def _plain(name: str, dtype: str, shape: list, binary: set[str]) -> dict:
    if shape:
        return _tensor(dtype, shape)
    if dtype == "string":
        return _tensor("string") if name in binary else _text()
    return _tensor(dtype, scalar=True)


def _features(manifest: Mapping) -> tuple[dict, dict[str, bytes], list[str]]:
    """``features.json``'s features, the labels files, and notes (what TFDS gets as bytes)."""
    renames = manifest.get("feature_names")
    role = {output_feature_name(renames, n): n for n in (
        "image/encoded", "image/class/label", "image/object/class/label", "image/object/mask",
        *_PER_OBJECT, *_BYTES_ROLES)}
    spec = manifest.get("features") or {}
    image_key = output_feature_name(renames, "image/encoded")
    is_image = image_key in spec
    binary = _bytes_columns(manifest)
    features: dict[str, dict] = {}
    labels: dict[str, bytes] = {}
    notes: list[str] = []
    for name, entry in sorted(spec.items()):
        dtype, shape = entry["dtype"], list(entry["shape"])
        canonical = role.get(name, "") if is_image else ""
        if canonical == "image/encoded":
            feature, why = _image_feature(manifest)
            notes += [why] if why else []
        elif canonical in ("image/class/label", "image/object/class/label") and dtype == "int64" \
                and shape in ([], [None]) and _class_names(manifest, canonical) and _labels_file(name):
            names = _class_names(manifest, canonical)
            feature = _class_label(len(names))
            labels[_labels_file(name)] = ("\n".join(names) + "\n").encode("utf-8")
            feature = _sequence(feature) if shape else feature
        elif canonical == "image/object/mask" and shape == [None]:
            feature = _sequence(_image(1, "uint8", "png"))
        elif canonical in _PER_OBJECT and shape == [None]:
            feature = _sequence(_text() if dtype == "string" else _tensor(dtype, scalar=True))
        else:
            feature = _plain(name, dtype, shape, binary | ({name} if canonical in _BYTES_ROLES else set()))
        features[name] = feature
    return features, labels, notes


def _name(manifest: Mapping) -> str:
    root = str((manifest.get("input") or {}).get("root") or "").rstrip("/").rsplit("/", 1)[-1]
    name = re.sub(r"[^a-z0-9]+", "_", root.lower()).strip("_")
    return name if name[:1].isalpha() else f"dataset_{name}".rstrip("_")


def _description(manifest: Mapping, notes: list[str]) -> str:
    tool = manifest.get("tool") or {}
    text = (f"Written by {tool.get('name', 'beam-tfrecords')} {tool.get('version', '')} from the "
            f"records' feature spec in manifest.json (the dataset's checksums and statistics).")
    return " ".join([text, *(f"Note: {n}." for n in notes)])


def tfds_not_written(compression: object, split_names: Iterable[str]) -> str:
    """Why a dataset of these shards and splits gets no TFDS metadata; ``''`` when it does
    (the plan says it before the run, the manifest's ``tfds`` entry after)."""
    if compression != "none":
        return "gzip shards: TFDS reads TFRecord files uncompressed only"
    dotted = sorted(s for s in split_names if not _TFDS_SPLIT.fullmatch(s))
    if dotted:
        shown = ", ".join(dotted[:5]) + (f" and {len(dotted) - 5} more" if len(dotted) > 5 else "")
        return (f"split name{'s' if len(dotted) > 1 else ''} {shown}: TFDS cannot parse a split "
                f"name holding '.'")
    return ""


def _why_none(manifest: Mapping) -> str:
    return tfds_not_written((manifest.get("options") or {}).get("compression", "none"), manifest["splits"])


def tfds_metadata(manifest: Mapping) -> dict[str, bytes]:
    """``{file name: bytes}`` of a dataset's TFDS metadata (see the module); ``{}`` for a
    dataset ``tfds_not_written`` refuses or one without shards. Deterministic: the same
    manifest gives the same bytes (its time and run are not read, nor its ``tfds`` entry)."""
    if _why_none(manifest):
        return {}
    splits = [{"filepathTemplate": FILEPATH_TEMPLATE, "name": split, "numBytes": str(info["bytes"]),
               "shardLengths": [str(s["records"]) for s in info["shards"]]}
              for split, info in sorted(manifest["splits"].items()) if info["shards"]]
    if not splits:
        return {}
    features, labels, notes = _features(manifest)
    info = {"description": _description(manifest, notes), "fileFormat": "tfrecord",
            "name": _name(manifest), "splits": splits, "version": _VERSION}
    files = {DATASET_INFO_NAME: _dumps(info, 2),
             FEATURES_NAME: _dumps({"featuresDict": {"features": features}, "pythonClassName": _DICT}, 4)}
    files.update(sorted(labels.items()))
    return files


def tfds_notes(manifest: Mapping) -> list[str]:
    """What the TFDS metadata of a dataset leaves out, one line each (``[]``: nothing)."""
    if _why_none(manifest):
        return [f"{_why_none(manifest)}; no TFDS metadata is written"]
    notes = _features(manifest)[2]
    if manifest.get("sequence_features"):
        notes.append("sequence records: features.json declares the context features only")
    return notes


def tfds_entry(manifest: Mapping) -> dict:
    """The manifest's ``tfds`` entry: ``{"written": true, "files": [file names]}``, or
    ``{"written": false, "why": ...}`` (what ``verify`` holds the folder to)."""
    made = tfds_metadata(manifest)
    if made:
        return {"written": True, "files": sorted(made)}
    return {"written": False, "why": _why_none(manifest) or "the dataset has no shards"}


def tfds_digests(manifest) -> dict[str, str]:
    """``{file name: SHA-256}`` of the TFDS metadata a manifest implies (``{}``: none, or
    not a manifest): what proves such a file beside it this product's."""
    if not isinstance(manifest, Mapping):
        return {}
    try:
        made = tfds_metadata(manifest)
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}
    return {name: hashlib.sha256(data).hexdigest() for name, data in made.items()}
