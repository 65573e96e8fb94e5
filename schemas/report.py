"""The run report: what a run did, as the commit step decided it.

``RunReport`` is what ``run_report.json`` holds, typed: the commit step
(``transforms.commit_step``) builds it, the launcher (``beam_pipeline.pipeline``)
builds the reports of runs that never reached the commit (``failed``,
``skipped``, ``dry_run``), and the console, the CLI and the library read it by
attribute. ``to_bytes`` writes the file exactly as the dict code before it did
(the same keys, in the same order, in the same JSON form); ``from_json`` reads
one back, so that a report read and written again keeps its bytes.

The nested values the report carries as they are (``splits``, ``rows``,
``drift``, ``duplicates``, ...) stay JSON objects: the report is their only
reader besides a person.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping

from beam_tfrecords.schemas.manifest import ErrorBudget

__all__ = ["Failure", "RunReport", "Status"]


class Status(str, enum.Enum):
    """How a run ended (``status`` in ``run_report.json``); equal to its string.

    The commit's statuses, in the order it decides them (the first that holds
    wins, see ``transforms.commit_step.decide_status``): ``split_name_clash``,
    ``accounting_failed``, ``verification_failed``, ``no_records``,
    ``error_budget_exceeded``, ``leakage_found``, ``drift_found``,
    ``output_exists``, else ``ok`` (then ``commit_failed`` when the store refused
    the publication). The launcher's: ``failed`` (the pipeline raised),
    ``skipped`` (a scheduled run found nothing to do), ``dry_run``.
    """

    OK = "ok"
    SPLIT_NAME_CLASH = "split_name_clash"
    ACCOUNTING_FAILED = "accounting_failed"
    VERIFICATION_FAILED = "verification_failed"
    NO_RECORDS = "no_records"
    ERROR_BUDGET_EXCEEDED = "error_budget_exceeded"
    LEAKAGE_FOUND = "leakage_found"
    DRIFT_FOUND = "drift_found"
    OUTPUT_EXISTS = "output_exists"
    COMMIT_FAILED = "commit_failed"
    FAILED = "failed"
    SKIPPED = "skipped"
    DRY_RUN = "dry_run"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclasses.dataclass(frozen=True)
class Failure:
    """A shard that did not write or verify (``path``, ``error``); after
    ``commit_failed``, the output and what the store said."""

    path: str
    error: str

    def to_json(self) -> dict:
        return {"path": self.path, "error": self.error}


# The keys of run_report.json, in the order they are written: a commit's report,
# then a report of the launcher's (failed, skipped, dry_run).
_COMMIT_KEYS = (
    "status", "run_id", "output", "manifest", "records", "bytes", "shards", "bad_records",
    "dead_letter_files", "error_budget", "verification_failures", "shards_outside_band",
    "removed_stale_shards", "splits", "dropped_columns", "late_columns", "image_bytes",
    "skipped", "duplicates_dropped", "duplicates", "rows", "update", "part", "drift",
    "split_name_clash", "leakage", "manifest_sha256", "removed_parts", "annotations",
)
_LAUNCHER_KEYS = ("status", "output", "manifest", "error", "run_id", "report_not_written",
                  "reason", "update")


@dataclasses.dataclass(frozen=True)
class RunReport:
    """What ``run_report.json`` holds. A field that is ``None`` is left out of the
    file (but ``manifest``, written as ``null`` when nothing was published).

    Attributes:
      status: how the run ended.
      output: the output folder (a part's dataset folder for the launcher's reports).
      manifest: the published ``manifest.json`` (``None``: nothing was published).
      run_id: the run (every report but ``skipped`` and ``dry_run``).
      records, bytes, shards: what was written; ``bad_records``: dead letters by
        reason; ``dead_letter_files``: relative to ``output``.
      error_budget: the budget and what it counted.
      verification_failures: shards that did not write or verify.
      shards_outside_band, removed_stale_shards, removed_parts: shard paths.
      splits: per split, ``{"records", "shards", "bytes", "seconds"}``.
      dropped_columns, late_columns: a table's columns the schema does not name
        (and where each first appeared, for those found after the first row).
      image_bytes: ``{"converted_to_png" | "kept" | "reshape": {why: n}}``.
      skipped: ``{"by_reason": {...}, "file": ...}``: paths passed over while listing.
      duplicates_dropped: how many files ``--drop_duplicates`` left out.
      duplicates: ``{"groups", "images", "across_splits", "within_split"}``.
      rows: a table's accounting of rows and lines.
      update: what a scheduled run decided; ``part``: the part it published.
      drift: the drift gate's verdict (``--compare_to``).
      split_name_clash: groups of split names that differ only in case, with
        their records; ``leakage``: the duplicates across splits
        (``leakage_found``).
      manifest_sha256: of the manifest published (or of the dataset's, for a part).
      annotations: an annotated run's accounting, the manifest's ``annotations``
        without its label map and statistics: ``problems`` by reason,
        ``images_without_objects``, ``listed_without_objects``, ``dropped_empty``,
        ``objects_dead_lettered``.
      error, report_not_written: why a ``failed`` run failed, and why its report
        could not be written to the output.
      reason: why a scheduled run was ``skipped``.
      manifest_json: in memory only: the published manifest (never written).
      extra: keys a report of another version holds that this one does not know,
        kept in their order (written last).
    """

    status: Status
    output: str
    manifest: str | None = None
    run_id: str | None = None
    records: int | None = None
    bytes: int | None = None
    shards: int | None = None
    bad_records: Mapping[str, int] | None = None
    dead_letter_files: tuple[str, ...] | None = None
    error_budget: ErrorBudget | None = None
    verification_failures: tuple[Failure, ...] | None = None
    shards_outside_band: tuple[str, ...] | None = None
    removed_stale_shards: tuple[str, ...] | None = None
    splits: Mapping[str, Mapping] | None = None
    dropped_columns: tuple[str, ...] | None = None
    late_columns: Mapping[str, str] | None = None
    image_bytes: Mapping[str, Mapping[str, int]] | None = None
    skipped: Mapping | None = None
    duplicates_dropped: int | None = None
    duplicates: Mapping | None = None
    rows: Mapping | None = None
    update: Mapping | None = None
    part: str | None = None
    drift: Mapping | None = None
    split_name_clash: tuple[Mapping[str, int], ...] | None = None
    leakage: Mapping | None = None
    manifest_sha256: str | None = None
    removed_parts: tuple[str, ...] | None = None
    annotations: Mapping | None = None
    error: str | None = None
    report_not_written: str | None = None
    reason: str | None = None
    manifest_json: Mapping | None = dataclasses.field(default=None, compare=False, repr=False)
    extra: tuple[tuple[str, object], ...] = ()

    @property
    def ok(self) -> bool:
        """Every shard proved and published, and the error budget kept."""
        return self.status == Status.OK

    @property
    def failures(self) -> tuple[Failure, ...]:
        """``verification_failures``, or none."""
        return self.verification_failures or ()

    def failure_line(self) -> str:
        """One line: the run published nothing, its status, where, and each failure."""
        failures = "; ".join(f"{f.path}: {f.error}" for f in self.failures)
        return (f"the run published nothing ({self.status.value}) in {self.output}"
                + (f": {failures}" if failures else ""))

    def to_dict(self) -> dict:
        """The report as ``run_report.json`` holds it (``manifest_json`` left out)."""
        keys = _LAUNCHER_KEYS if self.records is None else _COMMIT_KEYS
        out = {}
        for key in keys:
            value = getattr(self, key)
            if value is not None or key == "manifest":
                out[key] = _json_value(value)
        out.update(self.extra)
        return out

    def to_bytes(self) -> bytes:
        """``run_report.json`` as the commit writes it: indented UTF-8 JSON and a newline."""
        return (json.dumps(self.to_dict(), indent=2, ensure_ascii=False) + "\n").encode("utf-8")

    @classmethod
    def from_dict(cls, value: Mapping) -> RunReport:
        """The report ``value`` (``run_report.json`` read as JSON) holds.

        Raises:
          ValueError: when ``value`` is no run report (no known ``status``).
        """
        if not isinstance(value, Mapping) or not isinstance(value.get("status"), str):
            raise ValueError("a run report holds a 'status'")
        names = {f.name for f in dataclasses.fields(cls)} - {"manifest_json", "extra"}
        fields = {key: item for key, item in value.items() if key in names}
        budget = fields.get("error_budget")
        if budget is not None:
            fields["error_budget"] = ErrorBudget(budget["max_bad_fraction"], budget["bad"], budget["inputs"])
        if fields.get("verification_failures") is not None:
            fields["verification_failures"] = tuple(
                Failure(f["path"], f["error"]) for f in fields["verification_failures"])
        for key in ("dead_letter_files", "shards_outside_band", "removed_stale_shards",
                    "dropped_columns", "split_name_clash", "removed_parts"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        extra = tuple((key, item) for key, item in value.items()
                      if key not in names and key != "manifest_json")
        return cls(**{**fields, "status": Status(value["status"])},
                   manifest_json=value.get("manifest_json"), extra=extra)

    @classmethod
    def from_json(cls, data: bytes | str) -> RunReport:
        """The report of ``run_report.json``'s bytes (see ``from_dict``)."""
        return cls.from_dict(json.loads(data))


def _json_value(value):
    if isinstance(value, Status):
        return value.value
    if isinstance(value, (ErrorBudget, Failure)):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json_value(item) for item in value]
    return value
