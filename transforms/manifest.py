"""WriteManifest: the last step, which decides whether the dataset is complete.

It sees every shard's result at once (small metadata). When every shard was
proved, it writes ``manifest.json`` and then removes shards an earlier run left
under other names. Whatever happened, it writes ``run_report.json``, which the
launcher reads to print the summary and choose its exit status.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import InputSummary, ShardResult
from beam_tfrecords.schemas.features import FeatureSpec, image_feature_spec
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, ErrorBudget, build_manifest
from beam_tfrecords.schemas.shards import parse_shard_name
from beam_tfrecords.schemas.version import __version__
from beam_tfrecords.transforms.io import files

__all__ = ["REPORT_NAME", "WriteManifest", "finalize"]

REPORT_NAME = "run_report.json"
_log = logging.getLogger(__name__)


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _remove_stale_shards(output: str, keep: set[str]) -> list[str]:
    """Deletes shard files in ``output`` that are not in ``keep``; returns their names."""
    stale = [
        path for path, _ in files.list_files(files.join(output, "*"))
        if parse_shard_name(path.rsplit("/", 1)[-1]) and path not in keep
    ]
    files.delete_files(stale)
    return [path.rsplit("/", 1)[-1] for path in stale]


def finalize(config: ConvertConfig, results: Sequence[ShardResult], summary: InputSummary) -> dict:
    """Writes the manifest (if every shard was proved) and the run report.

    Returns:
      The run report: ``status`` is ``ok``, ``error_budget_exceeded``,
      ``verification_failed`` or ``no_records`` (no manifest for the last two).
    """
    results = sorted(results, key=lambda r: (r.split, r.index))
    bad: Counter = Counter(dict(summary.bad_counts))
    for result in results:
        bad.update(dict(result.bad_counts))
    written = sum(r.records for r in results)
    # The budget counts inputs: rows for a table (a sequence holds many), else records.
    inputs = summary.rows_in if summary.layout == "table" else written + sum(bad.values())
    budget = ErrorBudget(config.max_bad_fraction, sum(bad.values()), inputs)
    failures = [{"path": r.path, "error": r.verify_error} for r in results if not r.verified]
    dead_letter_files = sorted(
        p for p in [summary.dead_letter_path, *summary.dead_letter_paths,
                    *(r.dead_letter_path for r in results)] if p
    )
    report = {
        "status": "ok",
        "output": config.output,
        "manifest": None,
        "records": written,
        "bytes": sum(r.bytes for r in results),
        "shards": len(results),
        "bad_records": dict(sorted(bad.items())),
        "dead_letter_files": dead_letter_files,
        "error_budget": budget.to_json(),
        "verification_failures": failures,
        "shards_outside_band": [],
        "removed_stale_shards": [],
    }
    input_json = {
        "root": summary.root,
        "layout": summary.layout,
        "files": summary.input_files,
        "bytes": summary.input_bytes,
        "ignored_files": summary.ignored_files,
    }
    dead = sum(bad.values())
    if summary.layout == "table":
        rows = {"in": summary.rows_in}
        if summary.sequence_features:
            rows.update(in_sequences=summary.rows_grouped, sequences_written=written)
            accounted = summary.rows_in == summary.rows_grouped + dead
        else:
            rows["written"] = written
            accounted = summary.rows_in == written + dead
        rows.update(dead_lettered=dead, blank_skipped=summary.blank_rows, accounted=accounted)
        input_json["rows"] = report["rows"] = rows
        feature_spec = FeatureSpec({name: (dtype, list(shape)) for name, dtype, shape in summary.features})
    else:
        feature_spec = image_feature_spec(dict(summary.extra_features))
    if failures:
        report["status"] = "verification_failed"
    elif written == 0:
        # Nothing to describe: an empty dataset must not look like a finished one.
        report["status"] = "no_records"
    else:
        prefix = config.output.rstrip("/") + "/"
        relative = [
            dataclasses.replace(r, path=r.path[len(prefix):] if r.path.startswith(prefix) else r.path)
            for r in results
        ]
        manifest = build_manifest(
            created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            tool_version=__version__,
            options=config.to_json(),
            input_summary=input_json,
            results=relative,
            vocabulary=summary.vocabulary,
            feature_spec=feature_spec,
            bad_counts=bad,
            dead_letter_files=dead_letter_files,
            budget=budget,
            band=config.band,
        )
        if summary.schema:
            manifest["schema"] = json.loads(summary.schema)
        if summary.sequence_features:
            manifest["sequence_features"] = FeatureSpec(
                {name: (dtype, list(shape)) for name, dtype, shape in summary.sequence_features}
            ).to_json()
        manifest_path = files.join(config.output, MANIFEST_NAME)
        files.write_bytes(manifest_path, _json_bytes(manifest))
        report["manifest"] = manifest_path
        report["shards_outside_band"] = [
            path for split in manifest["splits"].values() for path in split["shards_outside_band"]
        ]
        report["removed_stale_shards"] = _remove_stale_shards(
            config.output, {r.path for r in results}
        )
        if budget.exceeded:
            report["status"] = "error_budget_exceeded"
    files.delete_files(list(summary.spools))
    files.write_bytes(files.join(config.output, REPORT_NAME), _json_bytes(report))
    return report


class _FinalizeFn(beam.DoFn):
    """``[ShardResult, ...]`` + side input ``InputSummary`` → the run report."""

    def __init__(self, config: ConvertConfig):
        self._config = config

    def process(self, results: list[ShardResult], summary: InputSummary) -> Iterator[dict]:
        report = finalize(self._config, results, summary)
        _log.info("Run finished: %s", report["status"])
        yield report


class WriteManifest(beam.PTransform):
    """Collects every ``ShardResult`` and finishes the dataset."""

    def __init__(self, config: ConvertConfig, summary):
        super().__init__()
        self._config = config
        self._summary = summary

    def expand(self, results):
        return (
            results
            | "Collect" >> beam.combiners.ToList()
            | "Finish" >> beam.ParDo(
                _FinalizeFn(self._config), beam.pvalue.AsSingleton(self._summary)
            )
        )
