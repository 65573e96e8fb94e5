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

Each split carries ``statistics`` of the records written (dead letters left
out), computed while writing (``transforms.plan.statistics``); ``--compare_to``
compares them between datasets (``transforms.plan.drift``). Their shape is part
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

Feature keys are feature names; a ``<feature>/shape`` feature has none. Tables
grouped into sequences, and ``WriteVerifiedShards`` datasets, get ``records`` only.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.elements import ShardResult
from beam_tfrecords.schemas.features import FeatureSpec
from beam_tfrecords.schemas.shards import ShardBand

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "DEAD_LETTER_DIR",
    "REPORT_NAME",
    "ErrorBudget",
    "ShardEntry",
    "build_manifest",
    "manifest_shards",
    "parse_manifest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The rest of an output folder: one JSON line per bad input, and the last run's report.
DEAD_LETTER_DIR = "dead_letter"
REPORT_NAME = "run_report.json"


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
    }


def parse_manifest(text: str, source: str = MANIFEST_NAME) -> dict:
    """Parses and checks a manifest's JSON.

    Raises:
      ValueError: if it is not JSON, or not a manifest of a version we read.
    """
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source} is not valid JSON: {err}") from None
    if not isinstance(manifest, dict) or "splits" not in manifest:
        raise ValueError(f"{source} is not a dataset manifest (no 'splits')")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{source} has format_version {manifest.get('format_version')!r}; "
            f"this tool reads version {FORMAT_VERSION}"
        )
    return manifest


def manifest_shards(manifest: Mapping) -> list[ShardEntry]:
    """Every shard the manifest lists, split by split, in index order."""
    entries = []
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            entries.append(
                ShardEntry(split, shard["path"], shard["records"], shard["bytes"],
                           shard["crc32c"], shard["sha256"])
            )
    return entries
