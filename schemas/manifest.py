"""The dataset manifest: what was written, proved, and refused.

``manifest.json`` is written last, only after every shard was re-read and
matched; a dataset without one is incomplete by definition. Shard paths in it
are relative to the manifest's folder, so a dataset can be copied as a whole.

Scheduled runs (see ``schemas.inputs``) add, under ``input``: ``files_list``
(``{"path": "inputs.jsonl", "root": ..., "files": N, "sha256": ...}``: the input
fingerprint file beside the manifest), ``fingerprint`` and ``options_fingerprint``.
A dataset grown by incremental runs lists its parts in the root manifest::

    "parts": [{"path": "part-00001", "created": ..., "manifest_sha256": ...,
               "records": 100, "bytes": ..., "splits": {"train": {"records": 100,
               "num_shards": 1}}, "input_root": ..., "input_files": 100}],
    "dataset": {"parts": 1, "records": 1100, "splits": {"train": {"records": 1100,
                "num_shards": 5}}}

Each part folder is a dataset of its own (shards, ``manifest.json``,
``inputs.jsonl``); the root's ``splits`` describe the first run's shards only.

Each uncompressed shard has an index file beside it (issue 22; see
``transforms.codec.record_index``), listed with the shard as
``"index": {"path": "<shard path>.idx", "bytes": N, "sha256": ...}``; the top
level says ``"index_files": {"format": "offset length", "written": true}``, or
``"written": false`` with ``"why"`` for gzip shards, which have none. The TFDS
metadata beside the manifest (``transforms.codec.tfds_metadata``, derived from the
manifest) is named as ``"tfds": {"written": true, "files": ["dataset_info.json", ...]}``,
or ``{"written": false, "why": ...}`` (gzip shards, a split name TFDS cannot parse);
a manifest written before it has no ``tfds``.

Each split carries ``statistics`` of the records written (dead letters left
out), computed while writing (``transforms.quality.statistics``); ``--compare_to``
compares them between datasets (``transforms.quality.drift``). Their shape is part
of the format::

    "statistics": {
      "records": 1000,                      # every split
      "features": {                         # tables (not with --sequence_key)
        "age": {"kind": "numeric",          # int64, float (as float32), bool (0/1) columns
                "count": 990,               # values summarised (lists: every value)
                "missing": 10,              # records whose cell was empty (a default
                                            # then fills it, and is counted in the values)
                "non_finite": 0,            # NaN/inf values (a column's allow_nan, allow_infinite),
                                            # left out of the four below
                "min": 18, "max": 90,       # null when count is 0
                "mean": 41.2, "std": 12.9}, # population std (ddof 0)
        "city": {"kind": "string", "count": 1000, "missing": 0,
                 "distinct": 37, "distinct_exact": true,   # else a KMV estimate (~3%)
                 "top_values": [{"value": "Paris", "count": 120}, ...],  # up to 10
                 "top_values_exact": true},  # false: Misra-Gries lower bounds
        "blob": {"kind": "bytes", "count": 1000, "missing": 0,
                 "distinct": 1000, "distinct_exact": false}
      },
      "images": {                           # images
        "formats": {"jpeg": 900, "png": 100},
        "modes": {"RGB": 990, "L": 10},     # ImageInfo.mode: L, LA, RGB, RGBA (+16)
        "width": {"p0": 32, "p5": 32, "p50": 320, "p95": 1024, "p100": 1024},
        "height": {...},                    # nearest-rank quantiles, null when empty
        "classes": {"cat": 500, "dog": 500}
      }
    }

Features renamed by ``--feature_names`` are listed as ``"feature_names": {"image/encoded":
"img", ...}`` (canonical -> output, renamed ones only; absent when none is); ``features``
and the statistics use the output names (``features.output_feature_name`` resolves one).

Feature keys are feature names; a ``<feature>/shape`` feature has none. Tables
grouped into sequences, and ``WriteVerifiedShards`` datasets, get ``records`` only.

Reading a manifest (``parse_manifest``) checks the structure every reader of this
package uses, and that every path it names (``splits.*.shards[].path``,
``parts[].path``, ``input.files_list.path``, ``input.skipped.file``,
``bad_records.dead_letter_files[]``, ``tfds.files[]``) stays inside the manifest's folder
(``outside_folder``: no ``..``, no absolute path, no scheme) and every split
name can name a file; what is wrong is named in one line by its JSON path
(``splits.train.shards[3].path: missing``). Links out of a local dataset folder
are the readers' to check (``transforms.io.files.link_outside``): they need the
file system.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.elements import ShardResult
from beam_tfrecords.schemas.features import DTYPES, FeatureSpec
from beam_tfrecords.schemas.shards import INDEX_SUFFIX, ShardBand, is_valid_split_name

__all__ = [
    "FORMAT_VERSION",
    "INDEX_FORMAT",
    "MANIFEST_NAME",
    "DEAD_LETTER_DIR",
    "REPORT_NAME",
    "ErrorBudget",
    "ShardEntry",
    "build_manifest",
    "index_files_json",
    "manifest_shards",
    "outside_folder",
    "parse_manifest",
    "shown_value",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The rest of an output folder: one JSON line per bad input, and the last run's report.
DEAD_LETTER_DIR = "dead_letter"
REPORT_NAME = "run_report.json"
# Each uncompressed shard's ``<shard>.idx``: DALI's tfrecord2idx / the tfrecord package's format.
INDEX_FORMAT = "offset length"


@dataclasses.dataclass(frozen=True)
class ErrorBudget:
    """How many bad inputs a run may have before it fails."""

    max_bad_fraction: float
    bad: int
    total: int

    def __post_init__(self):
        if not 0.0 <= self.max_bad_fraction <= 1.0:
            raise ValueError(f"max_bad_fraction must be within [0, 1], got {self.max_bad_fraction}")

    @property
    def bad_fraction(self) -> float:
        return self.bad / self.total if self.total else 0.0

    @property
    def exceeded(self) -> bool:
        return self.bad_fraction > self.max_bad_fraction

    def to_json(self) -> dict:
        return {
            "max_bad_fraction": self.max_bad_fraction,
            "bad": self.bad,
            "inputs": self.total,
            "bad_fraction": round(self.bad_fraction, 6),
            "exceeded": self.exceeded,
        }


@dataclasses.dataclass(frozen=True)
class ShardEntry:
    """One shard as the manifest records it."""

    split: str
    path: str
    records: int
    bytes: int
    crc32c: str
    sha256: str
    key: str = ""  # Where the manifest names the path: ``splits.train.shards[0].path``.
    # Its index file (``index``), as the manifest records it: '' and 0 without one.
    index_path: str = ""
    index_bytes: int = 0
    index_sha256: str = ""


def _split_json(results: Sequence[ShardResult], band: ShardBand) -> dict:
    total = sum(r.bytes for r in results)
    outside = [
        r.path for r in results
        if not band.holds(r.bytes) and not (len(results) == 1 and total < band.min_bytes)
    ]
    return {
        "records": sum(r.records for r in results),
        "bytes": total,
        "num_shards": len(results),
        "shards_outside_band": outside,
        "shards": [
            {
                "path": r.path,
                "records": r.records,
                "bytes": r.bytes,
                "crc32c": r.crc32c,
                "sha256": r.sha256,
                **({"storage_crc32c": r.storage_crc32c} if r.storage_crc32c else {}),
                **({"index": {"path": r.path + INDEX_SUFFIX, "bytes": r.index_bytes,
                              "sha256": r.index_sha256}} if r.index_sha256 else {}),
            }
            for r in sorted(results, key=lambda r: r.index)
        ],
    }


def build_manifest(
    *,
    created: str,
    tool_version: str,
    options: Mapping[str, object],
    input_summary: Mapping[str, object],
    results: Iterable[ShardResult],
    vocabulary: Sequence[str],
    feature_spec: FeatureSpec,
    bad_counts: Mapping[str, int],
    dead_letter_files: Sequence[str],
    budget: ErrorBudget,
    band: ShardBand,
    statistics: Mapping[str, Mapping] | None = None,
) -> dict:
    """The manifest as a JSON-ready dict.

    Args:
      created: creation time, ISO 8601 UTC.
      tool_version: version of this package.
      options: the conversion options (not the runner's).
      input_summary: input fingerprint: layout, paths, file count, bytes, ignored files.
      results: every shard's result, all verified.
      vocabulary: class names in label order.
      feature_spec: name → dtype and shape of every feature.
      bad_counts: bad inputs by reason, listing and writing together.
      dead_letter_files: dead-letter files, relative to the output folder.
      budget: the error budget and how it was spent.
      band: the shard size band.
      statistics: ``{split: statistics}`` (see the module docstring), if any.

    Raises:
      ValueError: if a result is not verified (a manifest only describes proved shards).
    """
    by_split: dict[str, list[ShardResult]] = {}
    for result in results:
        if not result.verified:
            raise ValueError(f"shard {result.path} is not verified: {result.verify_error}")
        by_split.setdefault(result.split, []).append(result)
    label_counts = {}
    for split, split_results in sorted(by_split.items()):
        counts: Counter = Counter()
        for result in split_results:
            counts.update(dict(result.label_counts))
        label_counts[split] = dict(sorted(counts.items()))
    return {
        "format_version": FORMAT_VERSION,
        "created": created,
        "tool": {"name": "beam-tfrecords", "version": tool_version},
        "options": dict(options),
        "input": dict(input_summary),
        "shard_band_bytes": [band.min_bytes, band.max_bytes],
        "splits": {split: {**_split_json(rs, band),
                           **({"statistics": dict(statistics[split])}
                              if statistics and split in statistics else {})}
                   for split, rs in sorted(by_split.items())},
        "labels": {"vocabulary": list(vocabulary), "counts": label_counts},
        "features": feature_spec.to_json(),
        "bad_records": {
            "total": sum(bad_counts.values()),
            "by_reason": dict(sorted(bad_counts.items())),
            "dead_letter_files": list(dead_letter_files),
        },
        "error_budget": budget.to_json(),
        "index_files": index_files_json(options.get("compression", "none")),
    }


def index_files_json(compression: object) -> dict:
    """The manifest's ``index_files``: whether each shard has an index file beside it
    (``<shard>.idx``, one ``"{offset} {length}\\n"`` line per record), and why not."""
    if compression == "gzip":
        return {"format": INDEX_FORMAT, "written": False, "why": "gzip shards cannot be read at an offset"}
    return {"format": INDEX_FORMAT, "written": True}


def parse_manifest(text: str, source: str = MANIFEST_NAME) -> dict:
    """Parses and checks a manifest's JSON: its version, the structure readers use
    (types, required keys of each split, shard and part, the statistics the drift
    gate compares) and that every path it names stays inside its folder.

    Raises:
      ValueError: if it is not JSON, not a manifest of a version we read, or one
        of its values is missing, of the wrong type, a path leading outside its
        folder, or a split name that cannot name a file; one line naming
        ``source`` and the JSON path (``splits.train.shards[3].path: missing``).
    """
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source} is not valid JSON: {err}") from None
    except RecursionError:
        raise ValueError(f"{source} is not a dataset manifest (nested too deeply)") from None
    if not isinstance(manifest, dict) or "splits" not in manifest:
        raise ValueError(f"{source} is not a dataset manifest (no 'splits')")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{source} has format_version {shown_value(manifest.get('format_version'))}; "
            f"this tool reads version {FORMAT_VERSION}"
        )
    try:
        _check_manifest(manifest)
    except _Malformed as err:
        raise ValueError(f"{source}: {err}") from None
    return manifest


def manifest_shards(manifest: Mapping) -> list[ShardEntry]:
    """Every shard the manifest lists, split by split, in index order."""
    entries = []
    for split, info in manifest["splits"].items():
        for i, shard in enumerate(info["shards"]):
            index = shard.get("index") or {}
            entries.append(
                ShardEntry(split, shard["path"], shard["records"], shard["bytes"],
                           shard["crc32c"], shard["sha256"],
                           f"{_key(_key('splits', split), 'shards')}[{i}].path",
                           index.get("path", ""), index.get("bytes", 0), index.get("sha256", ""))
            )
    return entries


# --- reading: containment and structure ------------------------------------------

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN_CHARS = 300


def outside_folder(path: str) -> str:
    """Why ``path``, a path a manifest names relative to its folder, would reach
    outside that folder or could not name a file in it; ``''`` when it stays inside.

    The one containment rule of every reader of a dataset: a plain relative path
    of names joined by ``/``: not absolute, no scheme (``gs:``, ``file:``, ``C:``),
    no ``..``, ``.`` or empty part, no backslash and no control character.
    """
    if not path:
        return "is empty"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "holds a control character"
    if path.startswith("/"):
        return "is an absolute path"
    if "://" in path or _SCHEME.match(path):
        return "names a scheme (another store)"
    if "\\" in path:
        return "holds a backslash (a manifest's paths use '/')"
    parts = path.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if "" in parts or "." in parts:
        return "is not a plain relative path (an empty or '.' part)"
    return ""


def shown_value(value: object) -> str:
    """A value from a file as one escaped line for a message: JSON, control and
    other non-printing characters escaped, cut at 300 characters."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    text = "".join(c if c.isprintable() else json.dumps(c)[1:-1] if ord(c) < 0x10000
                   else f"\\U{ord(c):08x}" for c in text)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS - 3] + "..."


class _Malformed(ValueError):
    """A manifest value readers cannot use (the message names its JSON path)."""


def _key(path: str, name: str | int) -> str:
    """The JSON path of ``name`` under ``path``: ``splits.train``, ``shards[3]``,
    ``splits["a b"]``."""
    if isinstance(name, int):
        return f"{path}[{name}]"
    if _NAME.fullmatch(name):
        return f"{path}.{name}" if path else name
    return f"{path}[{shown_value(name)}]"


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_number(v) -> bool:  # NaN and infinities included: json reads them.
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# kind -> (test, what it must be)
_KINDS = {
    "object": (lambda v: isinstance(v, dict), "a JSON object"),
    "list": (lambda v: isinstance(v, list), "a list"),
    "text": (lambda v: isinstance(v, str), "a string"),
    "count": (_is_count, "a whole number >= 0"),
    "number?": (lambda v: v is None or _is_number(v), "a number or null"),
    "flag": (lambda v: isinstance(v, bool), "true or false"),
}


def _value(obj: Mapping, name: str, path: str, kind: str, required: bool = True):
    """``obj[name]`` checked to be of ``kind``; ``None`` when absent and not required."""
    key = _key(path, name)
    if name not in obj:
        if required:
            raise _Malformed(f"{key}: missing")
        return None
    value = obj[name]
    test, what = _KINDS[kind]
    if not test(value):
        raise _Malformed(f"{key}: {shown_value(value)} is not {what}")
    return value


def _inner_path(obj: Mapping, name: str | int, path: str, required: bool = True) -> str | None:
    """A path the manifest names inside its folder, checked (``outside_folder``)."""
    key = _key(path, name)
    if isinstance(name, int):
        value = obj[name]
        if not isinstance(value, str):
            raise _Malformed(f"{key}: {shown_value(value)} is not a string")
    else:
        value = _value(obj, name, path, "text", required)
    if value is not None:
        why = outside_folder(value)
        if why:
            raise _Malformed(f"{key}: {shown_value(value)} {why}: it leads outside the dataset "
                             "folder (a manifest names files inside its own folder only)")
    return value


def _items(obj: Mapping, name: str, path: str, kind: str, required: bool = True,
           container: str = "list"):
    """``(key, index or name, item)`` of the items of a list (``container``
    ``list``) or the values of an object (``object``), each checked to be of ``kind``."""
    container = _value(obj, name, path, container, required)
    if container is None:
        return []
    base = _key(path, name)
    pairs = enumerate(container) if isinstance(container, list) else container.items()
    test, what = _KINDS[kind]
    out = []
    for sub, item in pairs:
        if not test(item):
            raise _Malformed(f"{_key(base, sub)}: {shown_value(item)} is not {what}")
        out.append((_key(base, sub), sub, item))
    return out


def _check_manifest(manifest: Mapping) -> None:
    _value(manifest, "created", "", "text")
    seen: dict[str, str] = {}
    for key, split, info in _items(manifest, "splits", "", "object", container="object"):
        if not is_valid_split_name(split):
            raise _Malformed(f"{key}: split name {shown_value(split)} cannot name a file (letters, "
                             "digits, '_' and '.', starting with a letter or digit)")
        for name in ("records", "bytes", "num_shards"):
            _value(info, name, key, "count")
        for shard_key, _, shard in _items(info, "shards", key, "object"):
            shard_path = _inner_path(shard, "path", shard_key)
            if shard_path in seen:
                raise _Malformed(f"{shard_key}.path: {shown_value(shard_path)} is listed twice "
                                 f"(also {seen[shard_path]})")
            seen[shard_path] = f"{shard_key}.path"
            for name in ("records", "bytes"):
                _value(shard, name, shard_key, "count")
            for name in ("crc32c", "sha256"):
                _value(shard, name, shard_key, "text")
            _value(shard, "storage_crc32c", shard_key, "text", required=False)
            index = _value(shard, "index", shard_key, "object", required=False)
            if index is not None:
                _inner_path(index, "path", _key(shard_key, "index"))
                _value(index, "bytes", _key(shard_key, "index"), "count")
                _value(index, "sha256", _key(shard_key, "index"), "text")
        _items(info, "shards_outside_band", key, "text", required=False)
        _check_statistics(info, key)
    labels = _value(manifest, "labels", "", "object")
    _items(labels, "vocabulary", "labels", "text")
    bad = _value(manifest, "bad_records", "", "object")
    _value(bad, "total", "bad_records", "count")
    for _, i, _ in _items(bad, "dead_letter_files", "bad_records", "text", required=False):
        _inner_path(bad["dead_letter_files"], i, "bad_records.dead_letter_files")
    for name in ("options", "features", "dataset"):
        _value(manifest, name, "", "object", required=False)
    for section in ("features", "sequence_features"):
        for key, _, spec in _items(manifest, section, "", "object", False, "object"):
            _check_feature_spec(spec, key)
    _items(manifest, "feature_names", "", "text", False, "object")  # --feature_names (issue 22).
    for key, _, info in _items(manifest.get("dataset") or {}, "splits", "dataset", "object",
                               False, "object"):
        for name in ("records", "num_shards"):
            _value(info, name, key, "count")
    _check_tfds(manifest)
    _check_input(manifest)
    _check_parts(manifest)


def _check_tfds(manifest: Mapping) -> None:
    """``tfds`` (issue 22): ``{"written": true, "files": [names beside the manifest]}`` or
    ``{"written": false, "why": ...}``; absent in a manifest written before it."""
    entry = _value(manifest, "tfds", "", "object", required=False)
    if entry is None:
        return
    if not _value(entry, "written", "tfds", "flag"):
        _value(entry, "why", "tfds", "text")
        return
    for key, i, name in _items(entry, "files", "tfds", "text"):
        _inner_path(entry["files"], i, "tfds.files")
        if "/" in name:
            raise _Malformed(f"{key}: {shown_value(name)} is not a file name beside the manifest")


def _check_feature_spec(spec: Mapping, key: str) -> None:
    """One feature's ``dtype`` (one of ``DTYPES``) and ``shape`` (a list of whole
    numbers, ``null`` first at most: what the readers reshape to)."""
    dtype = _value(spec, "dtype", key, "text", required=False)
    if dtype is not None and dtype not in DTYPES:
        raise _Malformed(f"{_key(key, 'dtype')}: {shown_value(dtype)} is not one of "
                         f"{', '.join(DTYPES)}")
    shape = _value(spec, "shape", key, "list", required=False)
    if shape is not None and not (all(d is None or _is_count(d) for d in shape)
                                  and None not in shape[1:]):
        raise _Malformed(f"{_key(key, 'shape')}: {shown_value(shape)} is not a list of whole "
                         "numbers >= 0 (null, a variable length, first at most)")


def _check_input(manifest: Mapping) -> None:
    given = _value(manifest, "input", "", "object", required=False)
    if given is None:
        return
    for name in ("root", "fingerprint", "options_fingerprint"):
        _value(given, name, "input", "text", required=False)
    listed = _value(given, "files_list", "input", "object", required=False)
    if listed is not None:
        _inner_path(listed, "path", "input.files_list", required=False)
        for name in ("root", "sha256"):
            _value(listed, name, "input.files_list", "text", required=False)
    skipped = _value(given, "skipped", "input", "object", required=False)
    if skipped is not None:
        _inner_path(skipped, "file", "input.skipped", required=False)


def _check_parts(manifest: Mapping) -> None:
    seen: dict[str, str] = {}
    for key, _, part in _items(manifest, "parts", "", "object", required=False):
        path = _inner_path(part, "path", key)
        if path in seen:
            raise _Malformed(f"{key}.path: {shown_value(path)} is listed twice (also {seen[path]})")
        seen[path] = f"{key}.path"
        _value(part, "manifest_sha256", key, "text")
        _value(part, "records", key, "count", required=False)
        for split_key, _, info in _items(part, "splits", key, "object", False, "object"):
            for name in ("records", "num_shards"):
                _value(info, name, split_key, "count")


def _check_statistics(info: Mapping, path: str) -> None:
    """What the drift gate (``--compare_to``) reads of a split's statistics."""
    stats = _value(info, "statistics", path, "object", required=False)
    if stats is None:
        return
    path = _key(path, "statistics")
    _value(stats, "records", path, "count", required=False)
    for key, _, feature in _items(stats, "features", path, "object", False, "object"):
        _value(feature, "kind", key, "text", required=False)
        for name in ("count", "missing", "non_finite", "distinct"):
            _value(feature, name, key, "count", required=False)
        for name in ("min", "max", "mean", "std"):
            _value(feature, name, key, "number?", required=False)
        for name in ("top_values_exact", "distinct_exact"):
            _value(feature, name, key, "flag", required=False)
        for entry_key, _, entry in _items(feature, "top_values", key, "object", required=False):
            _value(entry, "count", entry_key, "count")
    images = _value(stats, "images", path, "object", required=False)
    if images is not None:
        _items(images, "classes", _key(path, "images"), "count", False, "object")
