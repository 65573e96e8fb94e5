"""Commit: the last step, which decides whether the dataset is published.

It sees every shard's result at once (small metadata). Only when every shard was
proved, some record was written and the error budget held does it move the
shards to their final names and write ``manifest.json`` (see
``transforms.io.commit`` for the order), then remove shards an earlier run left
under other names. It writes ``run_report.json``, which the launcher reads to
print the summary and choose its exit status, then removes the run's temporary
folder and releases the output's lock.

A runner runs this step at least once (Dataflow retries a step whose worker was
lost, or that raised), so every part of it can run again, after a crash anywhere
in it, and ends with the same published dataset, byte for byte: a retry reuses
the manifest its first attempt staged (the same ``created`` time), ``publish``
recognizes the moves already made, and a retry that finds this run's report
already written does nothing but the cleanup. A run that publishes nothing raises
(``RunFailed``) after writing its report, so that the job ends failed; after a
failed commit (``commit_failed``) the temporary folder and the lock are kept, so
that the retry can finish the commit.

In three steps (``commit_run``): ``summarize_run`` (the report, ``RunReport``, and the
facts that decide its status), ``decide_status`` (plain values in, the first status
that holds out), ``publish_run`` (``ok`` only: the manifest, published).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence

import apache_beam as beam

from beam_tfrecords.schemas.annotations import LABEL_MAP_NAME, AnnotatedRun
from beam_tfrecords.schemas.elements import CompletedInputs, InputSummary, ShardResult
from beam_tfrecords.schemas.features import FeatureSpec, image_feature_spec, parse_feature_names, renamed_spec
from beam_tfrecords.schemas.inputs import INPUTS_NAME
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, REPORT_NAME, ErrorBudget, build_manifest
from beam_tfrecords.schemas.report import Failure, RunReport, Status
from beam_tfrecords.schemas.shards import ShardBand, ShardTarget, clashing_split_names
from beam_tfrecords.schemas.version import __version__
from beam_tfrecords.transforms.gather import GatherContents, Gathered, gather_in_process, join_gathered
from beam_tfrecords.transforms.io import annotated_output as annotated_io
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.commit import (
    holds_lock,
    publish,
    register_part,
    release_lock,
    remove_folder,
)
from beam_tfrecords.transforms.io.commit_moves import shard_moves
from beam_tfrecords.transforms.io.contents import stripped
from beam_tfrecords.transforms.io.dead_letters import failed_run_letters, staged_letters, staged_moves
from beam_tfrecords.transforms.io.faults import hold_point
from beam_tfrecords.transforms.io.fingerprint import (
    published_input,
    published_path,
    published_root,
    root_identity,
)
from beam_tfrecords.transforms.io.helpers import retire_helper_pool
from beam_tfrecords.transforms.io.ownership import (
    Claim,
    claim_output,
    prune_journal,
    write_atomic,
    write_owned,
)
from beam_tfrecords.transforms.io.progress import split_totals
from beam_tfrecords.transforms.io.storage_errors import STORAGE_ERRORS
from beam_tfrecords.transforms.io.tfds_output import stage_tfds_files, with_tfds_entry
from beam_tfrecords.transforms.plan.annotated_listing import annotation_parts
from beam_tfrecords.transforms.quality.drift import DriftGate, statistics_and_drift
from beam_tfrecords.transforms.result_totals import FoldedResults

__all__ = ["Commit", "CommitSettings", "RunFailed", "RunSummary", "StatusFacts", "commit_run",
           "decide_status", "publish_run", "summarize_run"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CommitSettings:
    """What the commit step needs to know.

    Attributes:
      target: where the shards are (temporary names) and go (final names).
      band: the shard size band (the manifest flags shards outside it).
      max_bad_fraction: the error budget.
      options: ``((name, value), ...)`` recorded in the manifest as the options.
      overwrite: whether an existing ``manifest.json`` may be replaced (the CLI
        checks this before running; a user's pipeline is checked here).
      release_lock: the run id whose lock on the output to release at the end
        ('' when the run took none).
      dropped_columns: a table's columns that the schema does not name (reported).
      fail_on_leakage: publish nothing when an image's content sits in more than
        one split (status ``leakage_found``).
      options_fingerprint: the fingerprint of the options that shape the records
        (see ``schemas.inputs``); ``input_root``: what input paths are relative to.
      dataset_output, part: for an incremental part, the dataset's folder (the
        part is published in ``target.output`` and then listed in the dataset's
        manifest; the lock and the run report are the dataset's) and its name.
      update: what a scheduled run decided, as JSON (for the report).
      drift: the dataset to compare the run's statistics with (``--compare_to``);
        a run that drifted publishes nothing (status ``drift_found``).
      input_units: for a listing made on the workers, its units: their
        ``inputs.jsonl`` lines (``UNIT_INPUTS_DIR``) follow the launcher's
        (the files with a role), in unit order.
      annotated: an annotated run's layout and label map (``label_map.pbtxt``
        and the manifest's ``annotations``, see ``io.annotated_output``), else ``None``.
    """

    target: ShardTarget
    band: ShardBand
    max_bad_fraction: float
    options: tuple[tuple[str, object], ...] = ()
    overwrite: bool = True
    release_lock: str = ""
    dropped_columns: tuple[str, ...] = ()
    fail_on_leakage: bool = False
    options_fingerprint: str = ""
    input_root: str = ""
    dataset_output: str = ""
    part: str = ""
    update: str = ""
    drift: DriftGate | None = None
    input_units: int = 0
    annotated: AnnotatedRun | None = None


class RunFailed(RuntimeError):
    """The commit published nothing (its report, already written, says why)."""


def _json_bytes(value: dict) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def _published_options(options: dict, root: str) -> dict:
    """The options as the manifest records them: the input's paths relative to its
    root (``fingerprint.published_input``, ``published_path``), never the folders
    above it."""
    if not root:
        return options
    if options.get("input"):
        options["input"] = published_input(root, options["input"])
    for name in ("labels", "schema", "masks"):
        if options.get(name):
            options[name] = published_path(root, options[name])
    if options.get("annotations"):  # COCO's files, one per split or one (issue 21).
        options["annotations"] = ",".join(f"{split}={published_path(root, path)}" if split else
                                          published_path(root, path)
                                          for split, path in annotation_parts(options["annotations"]))
    return options


def _feature_names(settings: CommitSettings) -> dict[str, str]:
    """``--feature_names`` resolved: canonical -> output, renamed features only."""
    return parse_feature_names(dict(settings.options).get("feature_names")).renames


def _feature_spec(summary: InputSummary, annotated: AnnotatedRun | None = None,
                  renames: dict[str, str] | None = None) -> FeatureSpec:
    """The records' features under their output names (a table's schema is renamed
    already, ``renamed_spec`` leaves its names as they are)."""
    if summary.layout in ("table", "records"):
        spec = FeatureSpec({name: (dtype, list(shape)) for name, dtype, shape in summary.features})
    elif annotated is not None:
        spec = annotated_io.annotated_feature_spec(annotated, dict(summary.extra_features))
    else:
        spec = image_feature_spec(dict(summary.extra_features))
    return renamed_spec(spec, renames)


def _rows(summary: InputSummary, written: int, dead: int) -> dict:
    rows = {"in": summary.rows_in}
    if summary.sequence_features:
        rows.update(in_sequences=summary.rows_grouped, sequences_written=written)
        accounted = summary.rows_in == summary.rows_grouped + dead
    else:
        rows["written"] = written
        accounted = summary.rows_in == written + dead
    rows.update(dead_lettered=dead, blank_skipped=summary.blank_rows,
                lines={"in": summary.lines_in, "accounted_for": summary.lines_accounted},
                multiline_rows={"rows": summary.multiline[0], "largest_span": summary.multiline[1],
                                "first": list(summary.multiline[2])},
                accounted=accounted and summary.lines_in == summary.lines_accounted)
    return rows


def _image_notes(results: Sequence[ShardResult]) -> dict:
    """``{"converted_to_png": {why: n}, "kept": {why: n}}`` from the shards' notes."""
    counts: Counter = Counter()
    for result in results:
        counts.update(dict(result.note_counts))
    notes: dict = {}
    for note, count in sorted(counts.items()):
        kind, _, why = note.partition("/")
        notes.setdefault(kind, {})[why] = count
    return notes


def _gathered(settings: CommitSettings, results: Sequence[ShardResult], gathered: Gathered | None) -> Gathered:
    """What the steps before the commit gathered from the shards' content lists (the
    duplicates report and the completed ``inputs.jsonl``, see ``transforms.gather``);
    made here, in this process, for a caller without them."""
    if gathered is not None:
        return gathered
    return gather_in_process(settings.target.temp_dir, settings.input_units,
                             settings.options_fingerprint, results)


def _part_entry(settings: CommitSettings, manifest: dict, manifest_bytes: bytes) -> dict:
    splits = {name: {"records": info["records"], "num_shards": info["num_shards"]}
              for name, info in manifest["splits"].items()}
    return {
        "path": settings.part,
        "created": manifest["created"],
        "manifest_sha256": hashlib.sha256(manifest_bytes).hexdigest(),
        "records": sum(s["records"] for s in splits.values()),
        "bytes": sum(info["bytes"] for info in manifest["splits"].values()),
        "splits": splits,
        "input_root": published_root(settings.input_root) if settings.input_root else "",
        "input_root_id": root_identity(settings.input_root) if settings.input_root else "",
        "input_files": manifest["input"].get("files_list", {}).get("files", 0),
    }


def commit_run(settings: CommitSettings, results: Sequence[ShardResult], summary: InputSummary,
               gathered: Gathered | None = None) -> RunReport:
    """The commit: ``summarize_run``, ``decide_status``, then, for ``ok``, ``publish_run``;
    the report is written, and the run's temporaries and lock go (``_clean_up``).

    Returns:
      The run report: ``status`` is ``ok``, or, with nothing published, the first
      status ``decide_status`` finds, or ``commit_failed`` (the store refused moving
      a shard to its final name). ``manifest_json`` holds the published manifest.
    """
    target = settings.target
    ended = _ended_report(settings)
    if ended is not None:  # A retry of a commit that ended: only its cleanup again.
        _clean_up(settings, summary, ended)
        return ended
    run = summarize_run(settings, results, summary, gathered)
    manifest_path = files.join(target.output, MANIFEST_NAME)
    status = decide_status(run.facts, lambda: not settings.overwrite and files.exists(manifest_path)
                           and not _published_here(target))
    report = dataclasses.replace(run.report, status=status)
    if status == Status.SPLIT_NAME_CLASH:
        # Their shards would be one file on a case-insensitive file system: publish nothing.
        report = dataclasses.replace(report, split_name_clash=tuple(
            {name: run.report.splits[name]["records"] for name in group}
            for group in clashing_split_names(run.report.splits)))
    elif status == Status.LEAKAGE_FOUND:
        report = dataclasses.replace(report, leakage=run.duplicates["across_splits"])
    elif status == Status.OK:
        report = publish_run(settings, run)
    if report.status not in (Status.OK, Status.COMMIT_FAILED):
        report = failed_run_letters(report, target.temp_dir)
        _remove_temporaries(target)  # Nothing of a failed run reaches a final name.
    hold_point("before_report")
    home = settings.dataset_output or target.output
    if report.manifest is not None:  # It names the manifest's SHA-256: proof enough.
        write_atomic(files.join(home, REPORT_NAME), report.to_bytes())
    else:  # Recorded in the journal first, so that the next run can prove it ours.
        write_owned(home, REPORT_NAME, report.to_bytes())
    hold_point("report_written")
    _clean_up(settings, summary, report)
    return report


@dataclasses.dataclass(frozen=True)
class StatusFacts:
    """What decides a commit's status (see ``decide_status``), as plain values.

    Attributes:
      split_name_clash: split names differ only in case.
      rows_accounted: a table's rows and lines are all accounted for (``True``
        for other inputs; with a shard that failed, its lines alone: its rows are in no count).
      verification_failed: a shard did not write or verify.
      records: the records written.
      budget_exceeded: the error budget was exceeded.
      leakage: ``--fail_on_leakage`` and an image's content sits in two splits.
      drift_failed: the statistics moved past ``--compare_to``'s limits.
    """

    split_name_clash: bool = False
    rows_accounted: bool = True
    verification_failed: bool = False
    records: int = 1
    budget_exceeded: bool = False
    leakage: bool = False
    drift_failed: bool = False


def decide_status(facts: StatusFacts, output_taken: Callable[[], bool] = lambda: False) -> Status:
    """The commit's status: the first of these that holds, in this order, else ``ok``.

    ``split_name_clash``, ``accounting_failed`` (rows or lines went missing between
    the file and the records, no shard failing), ``verification_failed``, ``no_records`` (an empty
    dataset must not look like a finished one), ``error_budget_exceeded``,
    ``leakage_found``, ``drift_found`` (the old dataset stays as it is), then
    ``output_exists``: ``output_taken()`` (asked last: it reads the output), a
    manifest that may not be replaced and that this run did not publish.
    """
    for holds, status in ((facts.split_name_clash, Status.SPLIT_NAME_CLASH),
                          (not facts.rows_accounted, Status.ACCOUNTING_FAILED),
                          (facts.verification_failed, Status.VERIFICATION_FAILED),
                          (facts.records == 0, Status.NO_RECORDS),
                          (facts.budget_exceeded, Status.ERROR_BUDGET_EXCEEDED),
                          (facts.leakage, Status.LEAKAGE_FOUND),
                          (facts.drift_failed, Status.DRIFT_FOUND)):
        if holds:
            return status
    return Status.OUTPUT_EXISTS if output_taken() else Status.OK


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What ``summarize_run`` counted: the report but its status and publication,
    what decides the status, and what the manifest is built from.

    Attributes:
      report: the run report, status ``ok``, nothing published yet.
      facts: what ``decide_status`` decides by.
      results: the shards' results, by split and index.
      bad: the dead letters by reason; ``budget``: the error budget.
      input_json: the manifest's ``input`` (but its ``files_list``).
      duplicates: the duplicates report (``transforms.gather``), or ``{}``.
      statistics: the manifest's statistics; ``root``: the input's root.
      completed: the completed ``inputs.jsonl`` to publish, or ``None``.
      summary: what the listing or the table step read and refused.
    """

    report: RunReport
    facts: StatusFacts
    results: tuple[ShardResult, ...]
    bad: Mapping[str, int]
    budget: ErrorBudget
    input_json: Mapping
    duplicates: Mapping
    statistics: Mapping
    root: str
    completed: CompletedInputs | None
    summary: InputSummary


def summarize_run(settings: CommitSettings, results: Sequence[ShardResult], summary: InputSummary,
                  gathered: Gathered | None = None) -> RunSummary:
    """Sums what the shards and the listing reported; reads nothing but the
    gathered side files (when ``gathered`` is ``None``) and the drift baseline."""
    results = sorted(results, key=lambda r: (r.split, r.index))
    bad: Counter = Counter(dict(summary.bad_counts))
    for result in results:
        bad.update(dict(result.bad_counts))
    written, dead = sum(r.records for r in results), sum(bad.values())
    # The budget counts inputs: rows for a table (a sequence holds many), else records.
    budget = ErrorBudget(settings.max_bad_fraction, dead, summary.rows_in if summary.layout == "table"
                         else written + dead)
    failures = tuple(Failure(r.path, r.verify_error) for r in results if not r.verified)
    root = settings.input_root or summary.root
    input_json = _input_json(summary, root)
    gathered = _gathered(settings, results, gathered)
    duplicates = gathered.duplicates or {}
    rows = _rows(summary, written, dead) if summary.layout == "table" else None
    if rows is not None:
        input_json["rows"] = rows
    statistics, drift = statistics_and_drift(settings.drift, results, summary,
                                             _feature_spec(summary, settings.annotated,
                                                           _feature_names(settings)).to_json(),
                                             annotated_io.split_statistics_json(settings.annotated, results))
    late = [name for name, _ in summary.late_columns if name not in settings.dropped_columns]
    report = RunReport(
        Status.OK, settings.target.output, manifest=None,
        run_id=settings.target.run_id, records=written, bytes=sum(r.bytes for r in results),
        shards=len(results), bad_records=dict(sorted(bad.items())),
        dead_letter_files=_dead_letter_files(summary, results), error_budget=budget,
        verification_failures=failures, shards_outside_band=(), removed_stale_shards=(),
        splits=split_totals(results),  # For the CLI's summary table.
        dropped_columns=(*settings.dropped_columns, *late) if settings.dropped_columns or late else None,
        late_columns=dict(summary.late_columns) or None, image_bytes=_image_notes(results) or None,
        skipped=input_json.get("skipped"),
        duplicates_dropped=len(summary.duplicates_dropped) or None,
        duplicates={"groups": duplicates["groups"], "images": duplicates["images"],
                    "across_splits": duplicates["across_splits"]["groups"],
                    "within_split": duplicates["within_split"]["groups"]} if duplicates else None,
        rows=rows, update=json.loads(settings.update) if settings.update else None,
        part=settings.part or None, drift=drift or None,
        annotations=_annotations_report(settings, results))
    facts = StatusFacts(
        split_name_clash=bool(clashing_split_names(report.splits)),
        verification_failed=bool(failures), rows_accounted=rows is None or rows["accounted"] or (
            bool(failures) and rows["lines"]["in"] == rows["lines"]["accounted_for"]),
        records=written, budget_exceeded=budget.exceeded,
        leakage=bool(settings.fail_on_leakage and duplicates and duplicates["across_splits"]["groups"]),
        drift_failed=bool(drift) and drift["status"] == "failed")
    return RunSummary(report, facts, tuple(results), bad, budget, input_json, duplicates,
                      statistics, root, gathered.inputs, summary)


def _annotations_report(settings: CommitSettings, results: Sequence[ShardResult]) -> dict | None:
    """An annotated run's accounting for its report (``RunReport.annotations``): the
    manifest's ``annotations`` without its label map and statistics."""
    if settings.annotated is None:
        return None
    section = annotated_io.annotations_section(settings.annotated, results)
    return {key: section[key] for key in ("problems", "images_without_objects", "listed_without_objects",
                                          "dropped_empty", "objects_dead_lettered")}


def _input_json(summary: InputSummary, root: str) -> dict:
    """The manifest's ``input``, but its rows and its ``files_list``. Input paths are
    published relative to the root, which is named without the folders above it
    (see fingerprint.published_root) and identified by root_id."""
    input_json = {
        "root": published_root(root) if root else "",
        "root_id": root_identity(root) if root else "",
        "layout": summary.layout,
        "files": summary.input_files,
        "bytes": summary.input_bytes,
        "ignored_files": summary.ignored_files,
    }
    if summary.skipped:
        input_json["skipped"] = {"by_reason": dict(summary.skipped), "file": summary.skipped_path}
    if summary.duplicates_dropped:
        input_json["duplicates_dropped"] = [
            {"filename": dropped, "split": split, "copy_of": kept}
            for dropped, split, kept in summary.duplicates_dropped]
    return input_json


def _dead_letter_files(summary: InputSummary, results: Sequence[ShardResult]) -> tuple[str, ...]:
    return tuple(sorted(p for p in [summary.dead_letter_path, *summary.dead_letter_paths,
                                    *(r.dead_letter_path for r in results)] if p))


def _run_manifest(settings: CommitSettings, run: RunSummary) -> dict:
    """The manifest to publish (its ``created`` time now)."""
    summary = run.summary
    input_json = dict(run.input_json)
    completed = run.completed
    if completed is not None:
        input_json["files_list"] = {
            "path": INPUTS_NAME, "root": input_json["root"], "root_id": input_json["root_id"],
            "files": completed.files,
            "sha256": completed.sha256}
        input_json["fingerprint"] = completed.fingerprint
        input_json["options_fingerprint"] = settings.options_fingerprint
    manifest = build_manifest(
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__,
        options=_published_options(dict(settings.options), run.root),
        input_summary=input_json,
        results=[dataclasses.replace(r, path=r.path.rsplit("/", 1)[-1]) for r in run.results],
        vocabulary=annotated_io.vocabulary_of(settings.annotated.label_map) if settings.annotated
        else summary.vocabulary,
        feature_spec=_feature_spec(summary, settings.annotated, _feature_names(settings)),
        bad_counts=run.bad,
        dead_letter_files=list(run.report.dead_letter_files),
        budget=run.budget,
        band=settings.band,
        statistics=run.statistics,
    )
    if _feature_names(settings):  # --feature_names: canonical -> output, renamed ones only.
        manifest["feature_names"] = _feature_names(settings)
    if run.report.image_bytes:
        manifest["image_bytes"] = run.report.image_bytes
    if run.duplicates:
        manifest["duplicates"] = run.duplicates
    if settings.annotated is not None:
        manifest["annotations"] = annotated_io.annotations_section(settings.annotated, run.results)
    if summary.schema:
        manifest["schema"] = json.loads(summary.schema)
    if summary.sequence_features:
        manifest["sequence_features"] = FeatureSpec(
            {name: (dtype, list(shape)) for name, dtype, shape in summary.sequence_features}
        ).to_json()
    return with_tfds_entry(manifest)  # Which TFDS files the commit publishes (verify holds it to them).


def publish_run(settings: CommitSettings, run: RunSummary) -> RunReport:
    """Publishes the run's shards, ``inputs.jsonl`` and manifest (``io.commit.publish``);
    a part is then listed in its dataset's manifest (``register_part``).

    Returns:
      ``run.report`` with what was published, or, when the store refused,
      ``commit_failed`` with what it said (no new manifest was published; some
      shards may sit at final names, recorded in the journal: a retry of this
      step finishes the commit, or the next run replaces or removes them).
    """
    target, results, completed = settings.target, run.results, run.completed
    # The shards and their index files; what the journal records of each file the commit
    # puts at a final name, and the stored object verification read of each.
    renames, digests, verified = shard_moves(results)
    if completed is not None:
        renames.append((completed.path, files.join(target.output, INPUTS_NAME)))
        digests[renames[-1][1]] = Claim(INPUTS_NAME, completed.size, completed.sha256)
    if settings.annotated is not None:  # label_map.pbtxt, beside the manifest, moved as a shard is.
        *move, digests[files.join(target.output, LABEL_MAP_NAME)] = annotated_io.stage_label_map(
            target.output, target.temp_dir, settings.annotated.label_map)
        renames.append(tuple(move))
    # The dead letters, staged in the temporary folder, go with the shards.
    letters, letter_digests = staged_moves(target.output, target.temp_dir, staged_letters(run.report))
    renames += letters
    digests.update(letter_digests)
    manifest = _run_manifest(settings, run)
    manifest_bytes = _json_bytes(manifest)
    try:
        earlier = _staged_manifest(target, manifest)
        if earlier is not None:  # A retry publishes what its first attempt staged.
            manifest_bytes, manifest = earlier, json.loads(earlier)
        # The TFDS metadata, from the manifest as published, moved after the shards.
        for staged, final, claim in stage_tfds_files(target.output, target.temp_dir, json.loads(manifest_bytes)):
            renames.append((staged, final))
            digests[final] = claim
        # What of the output this product can prove it wrote: only that is replaced
        # or removed (the commit refuses, publishing nothing, when a file it cannot
        # prove sits where it would put or remove its own).
        claims = claim_output(target.output)
        if not settings.dataset_output and claims.owns(REPORT_NAME):
            # The last run's report (a launcher removes it before its run starts; a
            # pipeline of the user's does not): it describes the dataset being
            # replaced, and once the new manifest is published it names none.
            files.delete_files([files.join(target.output, REPORT_NAME)])
        published = publish(target.output, target.temp_dir, renames, manifest_bytes,
                            verified, claims, digests, remove_parts=not settings.part,
                            remove_inputs=completed is None and not settings.part)
        manifest_sha256, removed_parts = hashlib.sha256(manifest_bytes).hexdigest(), None
        if settings.part:
            hold_point("before_register")
            manifest_sha256 = register_part(
                settings.dataset_output, _part_entry(settings, manifest, manifest_bytes))
        else:
            removed_parts = tuple(published.removed_parts)
    except STORAGE_ERRORS as err:
        return dataclasses.replace(run.report, status=Status.COMMIT_FAILED,
                                   verification_failures=(Failure(target.output, str(err)),))
    # The new manifest lists what the journal recorded, or it was removed.
    for folder in (target.output, settings.dataset_output):
        try:
            if folder:
                prune_journal(folder)
        except STORAGE_ERRORS as err:
            _log.warning("Could not tidy the journal of %s (the next run will): %s", folder, err)
    return dataclasses.replace(
        run.report, manifest=published.manifest_path, manifest_json=manifest,
        shards_outside_band=tuple(path for split in manifest["splits"].values()
                                  for path in split["shards_outside_band"]),
        removed_stale_shards=tuple(published.removed_stale_shards),
        manifest_sha256=manifest_sha256, removed_parts=removed_parts)


def _remove_temporaries(target: ShardTarget) -> None:
    try:
        remove_folder(target.temp_dir)
    except STORAGE_ERRORS as err:
        _log.warning("Could not remove %s (the next run will): %s", target.temp_dir, err)


def _clean_up(settings: CommitSettings, summary: InputSummary, report: RunReport) -> None:
    """What follows the report, each step harmless to repeat: the temporary folder
    goes (after a published commit, or after any failure but ``commit_failed``,
    whose retry needs it), spools outside it go, and the lock is released
    (``commit_failed`` keeps it: the retry still writes to the output; the
    launcher releases it when the job ends)."""
    if report.status == Status.COMMIT_FAILED:
        return
    _remove_temporaries(settings.target)
    hold_point("temporaries_removed")
    for spool in summary.spools:  # Spools outside the temporary folder (none on our paths).
        files.delete_files([spool])
    if settings.release_lock:
        release_lock(settings.dataset_output or settings.target.output, settings.release_lock)


def _ended_report(settings: CommitSettings) -> RunReport | None:
    """This run's report when an earlier attempt of this step already wrote it (and
    not ``commit_failed``, which a retry tries again), with the published manifest
    for an ``ok`` one (``manifest_json``); ``None`` when the commit is still to make.

    Raises:
      RunFailed: when another run holds the output's lock: this run's commit ended
        (it releases the lock last) or was taken over; it must not touch the output.
    """
    target = settings.target
    home = settings.dataset_output or target.output
    path = files.join(home, REPORT_NAME)
    try:
        report = RunReport.from_json(files.read_bytes_if_exists(path) or b"null")
    except ValueError:
        report = None
    if report is not None and report.run_id == target.run_id and report.status != Status.COMMIT_FAILED:
        if report.ok and report.manifest:
            report = dataclasses.replace(report, manifest_json=json.loads(files.read_bytes(report.manifest)))
        return report
    if settings.release_lock and holds_lock(home, settings.release_lock) is False:
        raise RunFailed(f"the commit of run {target.run_id} into {home} ran again after another "
                        "run took the output's lock; it changed nothing there")
    return None


def _published_here(target: ShardTarget) -> bool:
    """Whether ``manifest.json`` holds the manifest this run staged (an earlier attempt
    of this step published it)."""
    staged = files.read_bytes_if_exists(files.join(target.temp_dir, MANIFEST_NAME))
    return staged is not None and staged == files.read_bytes_if_exists(
        files.join(target.output, MANIFEST_NAME))


def _staged_manifest(target: ShardTarget, manifest: dict) -> bytes | None:
    """The manifest an earlier attempt of this step staged in the temporary folder,
    when it is ``manifest`` but for its ``created`` time; else ``None``."""
    staged = files.read_bytes_if_exists(files.join(target.temp_dir, MANIFEST_NAME))
    try:
        earlier = json.loads(staged) if staged is not None else None
    except ValueError:
        return None
    if not isinstance(earlier, dict) or {**earlier, "created": manifest["created"]} != json.loads(
            _json_bytes(manifest)):
        return None
    return staged


class _CommitFn(beam.DoFn):
    """``(None, [("result", ShardResult) | ("summary", InputSummary) | a part of what
    was gathered (see ``transforms.gather``), ...])`` → the run report."""

    def __init__(self, settings: CommitSettings):
        self._settings = settings

    def process(self, element) -> Iterator[RunReport]:
        retire_helper_pool()  # Every step before this one ended: the helpers end while it commits.
        _, values = element
        results, summaries, parts = FoldedResults(), [], []
        for kind, value in values:  # A runner may hand a large group a page at a time.
            if kind == "result":
                results.add(value)
            else:
                (summaries if kind == "summary" else parts).append((kind, value))
        (summary,) = [value for _, value in summaries]
        settings = self._settings
        # A retry of a commit that ended (its report written, the temporary folder
        # perhaps gone) joins nothing: commit_run only repeats the cleanup.
        ended = _ended_report(settings) is not None
        gathered = None if ended else join_gathered(parts, settings.target.temp_dir,
                                                     settings.options_fingerprint)
        report = commit_run(settings, results.results(), summary, gathered)
        _log.info("Run finished: %s", report.status)
        if report.status != Status.OK:
            # After the report: the job ends failed, not done (and a retry of this
            # step finds the report, or, after commit_failed, tries the commit again).
            raise RunFailed(report.failure_line())
        yield report


class Commit(beam.PTransform):
    """Collects every ``ShardResult`` and finishes the dataset; yields the run report.

    Args:
      settings: see ``CommitSettings``.
      summary: a PCollection of one ``InputSummary`` (what was read and refused).
      left_out: a PCollection of the ``image/filename`` s the run left out after the
        launcher listed them (see ``transforms.gather.GatherContents``), or ``None``.
    """

    def __init__(self, settings: CommitSettings, summary, left_out=None):
        super().__init__()
        self._settings = settings
        self._summary, self._left_out = summary, left_out

    def expand(self, results):
        # One group under one key, never a side input: Beam sizes a side input by
        # walking every object in it, and the summary's one element makes the group
        # exist even when there are no shards. Values are tagged by hand (a
        # CoGroupByKey adds a step per input, which every run pays to build).
        settings = self._settings
        # Duplicates and inputs.jsonl, from the shards' content lists, on the workers.
        gathered = results | "Gather" >> GatherContents(
            settings.target.temp_dir, settings.input_units, self._summary, self._left_out)
        return (
            (results | "KeyResults" >> beam.Map(_tagged_result),
             self._summary | "KeySummary" >> beam.Map(_tagged, "summary"),
             gathered)
            | "All" >> beam.Flatten()
            | "Collect" >> beam.GroupByKey()
            | "Finish" >> beam.ParDo(_CommitFn(self._settings))
        )


def _tagged(value, kind: str):
    return None, (kind, value)


def _tagged_result(result: ShardResult):
    return None, ("result", stripped(result))  # Its content entries went to GatherContents.
