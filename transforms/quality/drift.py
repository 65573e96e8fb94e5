"""The drift gate: a run's statistics against those of a published dataset.

``--compare_to`` names the dataset (its ``manifest.json``); the commit step
compares before it publishes anything, and a run that drifted publishes nothing
(status ``drift_found``). Checked, each entry going into the run report's
``drift.checks`` with its old and new value, threshold and verdict:

- ``schema``: every feature of either spec: added, removed, or another dtype or
  shape (always a failure: readers parse by the spec).
- ``mean``: per split and numeric feature, how far the mean moved, in standard
  deviations of the old values (``max_mean_shift``).
- ``missing_rate``: per split and feature, the change of the share of records
  whose cell was empty (absolute, ``max_missing_change``).
- ``non_finite_rate``: per split and numeric feature, the change of the share of
  its values that are NaN or infinite (absolute, ``max_missing_change`` too: a
  value that carries no number is missing in all but name), so a feature that
  went from 0% to 98% NaN fails even though its finite values kept their mean.
- ``class_share``: per split and image class, the change of its share of the
  records (absolute, ``max_class_share_change``).
- ``object_class_share``: per split and object class of annotated images, the
  change of its share of the objects (same threshold), when both datasets have
  annotation statistics with objects in the split (``statistics.annotations``).
- ``value_share``: per split and string feature whose top values are exact on
  both sides, the change of each top value's share of the values (same
  threshold); a value outside one side's top list counts at most that list's
  last share there, so only a change that is certain fails.

A comparison that cannot be made (a split in one dataset only, an old manifest
without statistics, a value one side does not have or that is not a number, a
mean with no finite value to take, top values that are not exact) is listed with
the verdict ``not_compared`` and a ``note`` saying why: it never counts as passed,
and the report's message counts such checks apart. It does not fail the gate: the
checks that could be made decide (``non_finite_rate`` and ``missing_rate`` are
what fails a feature whose values all became NaN or empty, where ``mean`` has
nothing to compare).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from beam_tfrecords.schemas.manifest import MANIFEST_NAME
from beam_tfrecords.transforms.quality.annotation_stats import object_class_shares
from beam_tfrecords.transforms.quality.statistics import split_statistics

__all__ = ["PREVIOUS", "DriftGate", "baseline_of", "compare", "drift_manifest_path",
           "statistics_and_drift"]

PREVIOUS = "previous"
_EPSILON = 1e-12


@dataclasses.dataclass(frozen=True)
class DriftGate:
    """What the commit step compares a run with, and how much change it allows.

    Attributes:
      compare_to: as given (a path, or ``previous``).
      source: the manifest that was read ('' when there was none).
      baseline: ``baseline_of`` that manifest; ``None`` when there was none.
      note: why nothing is compared, when ``baseline`` is ``None``.
      max_mean_shift: standard deviations (of the old values) a mean may move.
      max_missing_change: how much a missing rate may change (absolute).
      max_class_share_change: how much a class's (or top value's) share may change.
    """

    compare_to: str
    source: str = ""
    baseline: dict | None = None
    note: str = ""
    max_mean_shift: float = 2.0
    max_missing_change: float = 0.1
    max_class_share_change: float = 0.1


def drift_manifest_path(compare_to: str, output: str) -> str:
    """The manifest ``--compare_to`` names: ``previous`` is the one at ``output``; a
    path ending in ``.json`` is the manifest itself; anything else a dataset folder."""
    if compare_to == PREVIOUS:
        return output.rstrip("/") + "/" + MANIFEST_NAME
    if compare_to.endswith(".json"):
        return compare_to
    return compare_to.rstrip("/") + "/" + MANIFEST_NAME


def baseline_of(manifest: Mapping) -> dict:
    """What the gate keeps of an old manifest: its feature spec and, per split, its
    records and statistics (``None`` for a manifest made before statistics)."""
    return {
        "features": dict(manifest.get("features") or {}),
        "splits": {split: {"records": info.get("records", 0), "statistics": info.get("statistics")}
                   for split, info in manifest["splits"].items()},
    }


def _spec_text(spec: Mapping | None) -> str:
    return "absent" if spec is None else f"{spec.get('dtype')} {spec.get('shape')}"


class _Checks:
    """The checks made so far and the failures among them."""

    def __init__(self, splits: int):
        self.checks: list[dict] = []
        self.failures: list[str] = []
        self._splits = splits

    def not_compared(self, check: dict, note: str) -> None:
        """A check that could not be made: listed, never passed nor failed."""
        self.checks.append({**check, "verdict": "not_compared", "note": note})

    def add(self, check: dict, failed: bool, message: str, split: str | None = None) -> None:
        check["verdict"] = "failed" if failed else "passed"
        self.checks.append(check)
        if failed:
            where = f" in split '{split}'" if split is not None and self._splits > 1 else ""
            self.failures.append(message + where)

    def share(self, kind: str, name: str, split: str, old: float, new: float, limit: float,
              label: str, **extra) -> None:
        change = abs(new - old)
        self.add({"check": kind, "split": split, **extra, "old": round(old, 6), "new": round(new, 6),
                  "change": round(change, 6), "threshold": limit},
                 change > limit + _EPSILON,
                 f"{label} {name} moved {change:.2f} ({old:.2f} -> {new:.2f}; limit {float(limit)})", split)


def _schema(checks: _Checks, old: Mapping, new: Mapping) -> None:
    for name in sorted(set(old) | set(new)):
        before, after = old.get(name), new.get(name)
        if before is None:
            what = f"was added ({_spec_text(after)})"
        elif after is None:
            what = f"was removed (was {_spec_text(before)})"
        else:
            what = f"changed from {_spec_text(before)} to {_spec_text(after)}"
        checks.add({"check": "schema", "feature": name, "old": before, "new": after},
                   before != after, f"feature '{name}' {what}")


def _number(value) -> float | None:
    """A finite number from a statistics entry, or ``None`` (absent, null, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _mean(checks: _Checks, split: str, name: str, old: Mapping, new: Mapping, limit: float) -> None:
    before, after, std = _number(old.get("mean")), _number(new.get("mean")), _number(old.get("std"))
    if before is None or after is None or std is None:
        side = "old" if before is None or std is None else "new"
        checks.not_compared({"check": "mean", "split": split, "feature": name, "old": old.get("mean"),
                             "new": new.get("mean"), "threshold": limit},
                            f"the {side} dataset has no mean for it (no finite value)")
        return
    moved = abs(after - before)
    if moved <= _EPSILON * max(1.0, abs(before)):
        shift = 0.0
    else:
        shift = moved / std if std > 0 else math.inf
    check = {"check": "mean", "split": split, "feature": name, "old": before, "new": after,
             "old_std": std, "shift_std": round(shift, 6) if math.isfinite(shift) else None,
             "threshold": limit}
    how = (f"{shift:.1f} std" if math.isfinite(shift)
           else f"from {before:g} to {after:g} (its old values were all equal)")
    checks.add(check, shift > limit, f"feature '{name}' mean moved {how} (limit {float(limit)})", split)


def _top_shares(stats: Mapping) -> tuple[dict[str, float], float] | None:
    """A string feature's top values as shares of its values, and the most a value
    outside the list can have; ``None`` unless the counts are exact."""
    if not stats.get("top_values_exact") or not stats.get("count"):
        return None
    total = stats["count"]
    shares = {entry["value"]: entry["count"] / total for entry in stats.get("top_values", [])}
    full = len(shares) >= 10 and stats.get("distinct", 0) > len(shares)
    return shares, (min(shares.values()) if full and shares else 0.0)


def _rate(checks: _Checks, kind: str, split: str, name: str, old: tuple, new: tuple,
          limit: float, label: str) -> None:
    """A share check (``old``, ``new``: ``(part, whole)`` each), or ``not_compared`` when a
    side's part is unknown or its whole is zero."""
    shares = []
    for side, (part, whole) in (("old", old), ("new", new)):
        part, whole = _number(part), _number(whole)
        if part is None or whole is None or whole <= 0:
            what = "does not count them" if part is None else "has no value to count them among"
            checks.not_compared({"check": kind, "split": split, "feature": name, "threshold": limit},
                                f"the {side} dataset {what}")
            return
        shares.append(part / whole)
    checks.share(kind, f"'{name}' {label}", split, shares[0], shares[1], limit, "feature", feature=name)


def _values(checks: _Checks, split: str, name: str, old: Mapping, new: Mapping, limit: float) -> None:
    before, after = _top_shares(old), _top_shares(new)
    if before is None or after is None:
        side = "old" if before is None else "new"
        checks.not_compared({"check": "value_share", "split": split, "feature": name, "threshold": limit},
                            f"the {side} dataset's top values are not exact counts (or it has none)")
        return
    (old_shares, old_rest), (new_shares, new_rest) = before, after
    for value in sorted(set(old_shares) | set(new_shares)):
        o, n = old_shares.get(value), new_shares.get(value)
        # Outside a list, a value's share is between 0 and that list's last share:
        # take the bound nearest the other side, so only a certain change fails.
        if o is None:
            o = min(n, old_rest)
        if n is None:
            n = min(o, new_rest)
        checks.share("value_share", f"'{value}' share", split, o, n, limit,
                     f"feature '{name}' value", feature=name, value=value)


def _values_of(stats: Mapping) -> float | None:
    """A numeric feature's values, finite or not (``None`` when either count is unknown)."""
    count, non_finite = _number(stats.get("count")), _number(stats.get("non_finite"))
    return None if count is None or non_finite is None else count + non_finite


def _split(checks: _Checks, gate: DriftGate, split: str, old: Mapping, new: Mapping) -> None:
    old_stats = old.get("statistics")
    if not old_stats:
        checks.not_compared({"check": "statistics", "split": split},
                            "the old manifest has no statistics for this split")
        return
    old_records, new_records = old_stats.get("records") or 0, new.get("records") or 0
    old_features, new_features = old_stats.get("features") or {}, new.get("features") or {}
    for name in sorted(set(old_features) ^ set(new_features)):
        side = "new" if name in old_features else "old"
        checks.not_compared({"check": "statistics", "split": split, "feature": name},
                            f"the {side} dataset has no statistics for it")
    for name in sorted(set(old_features) & set(new_features)):
        before, after = old_features[name], new_features[name]
        numeric = before.get("kind") == after.get("kind") == "numeric"
        if numeric:
            _mean(checks, split, name, before, after, gate.max_mean_shift)
        elif before.get("kind") != after.get("kind"):
            checks.not_compared({"check": "statistics", "split": split, "feature": name,
                                 "old": before.get("kind"), "new": after.get("kind")},
                                "its statistics are of another kind on each side")
            continue
        _rate(checks, "missing_rate", split, name, (before.get("missing"), old_records),
              (after.get("missing"), new_records), gate.max_missing_change, "missing rate")
        if numeric:
            _rate(checks, "non_finite_rate", split, name, *(
                (stats.get("non_finite"), _values_of(stats)) for stats in (before, after)),
                gate.max_missing_change, "non-finite share")
        if before.get("kind") == after.get("kind") == "string":
            _values(checks, split, name, before, after, gate.max_class_share_change)
    old_classes = (old_stats.get("images") or {}).get("classes")
    new_classes = (new.get("images") or {}).get("classes")
    if (old_classes is None) != (new_classes is None):
        checks.not_compared({"check": "class_share", "split": split},
                            f"the {'old' if old_classes is None else 'new'} dataset has no class counts")
    elif (old_classes is not None and new_classes is not None) and not (old_records and new_records):
        checks.not_compared({"check": "class_share", "split": split},
                            f"the {'old' if not old_records else 'new'} dataset has no records in it")
    elif old_classes is not None and new_classes is not None:
        for name in sorted(set(old_classes) | set(new_classes)):
            checks.share("class_share", f"'{name}' share", split, old_classes.get(name, 0) / old_records,
                         new_classes.get(name, 0) / new_records, gate.max_class_share_change,
                         "class", **{"class": name})


def _object_shares(checks: _Checks, gate: DriftGate, split: str, old: Mapping, new: Mapping) -> None:
    """``object_class_share``: per class, the change of its share of the objects, when
    both splits have annotation statistics with objects (else nothing is listed)."""
    before, after = (object_class_shares(side.get("annotations") or {}) for side in (old, new))
    if not before or not after:
        return
    for name in sorted(set(before) | set(after)):
        checks.share("object_class_share", f"'{name}' share of the objects", split, before.get(name, 0.0),
                     after.get(name, 0.0), gate.max_class_share_change, "class", **{"class": name})


def compare(gate: DriftGate, features: Mapping, statistics: Mapping[str, Mapping]) -> dict:
    """The drift report of a run (``run_report.json``'s ``drift``).

    Args:
      gate: the old dataset and the thresholds.
      features: the run's feature spec (``FeatureSpec.to_json()``).
      statistics: the run's ``{split: statistics}`` (``statistics.split_statistics``).

    Returns:
      ``{"compare_to", "manifest", "status": "passed" | "failed" | "skipped",
      "thresholds", "checks", "failures", "message"}``; ``skipped`` (with a
      ``note``) when there was no old manifest to compare with.
    """
    report: dict = {
        "compare_to": gate.compare_to,
        "manifest": gate.source or None,
        "status": "skipped",
        "thresholds": {"max_mean_shift": gate.max_mean_shift,
                       "max_missing_change": gate.max_missing_change,
                       "max_class_share_change": gate.max_class_share_change},
    }
    if gate.baseline is None:
        report.update(note=gate.note, checks=[], failures=[], message=gate.note)
        return report
    old_splits = gate.baseline["splits"]
    checks = _Checks(len(set(old_splits) | set(statistics)))
    _schema(checks, gate.baseline["features"], features)
    for split in sorted(set(old_splits) | set(statistics)):
        if split not in old_splits or split not in statistics:
            checks.not_compared({
                "check": "split", "split": split,
                "old": old_splits[split]["records"] if split in old_splits else None,
                "new": statistics[split]["records"] if split in statistics else None},
                f"the split is only in the {'old' if split in old_splits else 'new'} dataset")
            continue
        _split(checks, gate, split, old_splits[split], statistics[split])
        _object_shares(checks, gate, split, old_splits[split].get("statistics") or {}, statistics[split])
    failed = bool(checks.failures)
    passed = sum(1 for c in checks.checks if c["verdict"] == "passed")
    not_compared = sum(1 for c in checks.checks if c["verdict"] == "not_compared")
    apart = f", {not_compared} not compared (see 'checks')" if not_compared else ""
    report.update(
        status="failed" if failed else "passed",
        checks=checks.checks,
        failures=checks.failures,
        passed=passed,
        not_compared=not_compared,
        message=("; ".join(checks.failures) if failed else
                 f"{passed} checks passed{apart} against {gate.source}"),
    )
    return report


def statistics_and_drift(gate: DriftGate | None, results, summary, features: Mapping,
                         annotations: Mapping[str, dict] | None = None) -> tuple[dict[str, dict], dict | None]:
    """For the commit step: the run's ``{split: statistics}`` (see
    ``statistics.split_statistics``; an annotated run's ``annotations``, per split,
    ``AnnotationStatistics.to_json``, go in as each split's ``annotations``) and,
    with a gate, its drift report."""
    statistics = split_statistics(results, summary)
    for split, stats in (annotations or {}).items():
        if split in statistics:
            statistics[split]["annotations"] = stats
    return statistics, (compare(gate, features, statistics) if gate is not None else None)
