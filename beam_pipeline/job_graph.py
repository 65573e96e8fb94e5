"""The conversion's Beam graph: the steps for each kind of input, ending in the commit.

``build_graph`` wires a ``RunPlan`` (``preflight.plan_run``) into a pipeline:
a table is encoded into spools, then cut into shards (or grouped into
sequences first); images are listed on the launcher (hashed on the workers, or
not; resized into spools first, or not) or on the workers (``--list_on_workers``);
every branch writes and verifies its shards and ends in ``transforms.commit_step.Commit``,
which publishes the dataset and writes the run report. ``beam_pipeline.pipeline``
runs it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions, TypeOptions

from beam_tfrecords.preflight import RunPlan, drift_gate, in_process_direct_runner
from beam_tfrecords.schemas.annotations import AnnotatedRun, LabelMap
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.features import parse_feature_names
from beam_tfrecords.transforms.codec.masks import render_mask
from beam_tfrecords.transforms.commit_step import Commit, CommitSettings
from beam_tfrecords.transforms.image_contents import HashImages, add_contents_outcome
from beam_tfrecords.transforms.image_steps import (
    ImageRecords,
    ListImages,
    ListingIdentity,
    PlanImageShards,
    SpoolImages,
    add_spool_dead_letters,
    joined_parts,
    kept_refs,
    listing_size,
    start_first_shard,
    write_listing,
)
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.annotated_output import CUSTOM_LAYOUT
from beam_tfrecords.transforms.io.annotation_attach import AnnotationAttach, AnnotationOptions
from beam_tfrecords.transforms.io.faults import announce_hooks
from beam_tfrecords.transforms.io.helpers import HELPER_MIN_FILES, HELPER_MIN_TABLE_BYTES, helpers_pay
from beam_tfrecords.transforms.listing_plan import PlanListingParts
from beam_tfrecords.transforms.plan import handoff
from beam_tfrecords.transforms.plan.layouts import resolve_input
from beam_tfrecords.transforms.sequences import BuildSequences, PlanSequenceShards
from beam_tfrecords.transforms.shard_engine import SpoolCopy, VerifyShards, WriteShards
from beam_tfrecords.transforms.tables import EncodeTables, PlanTableShards, table_summary
from beam_tfrecords.transforms.worker_listing import ListAndPlanOnWorkers
from beam_tfrecords.updates import config_fingerprint

__all__ = ["annotated_attach", "build_graph", "helper_processes", "helpers_may_fork", "helpers_start_now"]


def annotated_attach(plan: RunPlan, attach: Callable | None) -> tuple[Callable | None, AnnotatedRun | None]:
    """The attachment and the ``AnnotatedRun`` of a run.

    An annotated layout's plan (``plan.annotated``) gets ``AnnotationAttach`` over the
    annotations each reference carries (``ImageRef.annotation``), with
    ``codec.masks.render_mask`` for ``--instance_masks``. A library user's own
    attachment that has a ``label_map`` (an ``AnnotationAttach`` over an index) makes
    the run an annotated one of layout ``custom``: its commit writes
    ``label_map.pbtxt`` and the manifest's ``annotations`` too.
    """
    annotated = plan.annotated
    if annotated is not None and attach is None:
        options = AnnotationOptions(instance_masks=annotated.instance_masks,
                                    images_root=annotated.images_root, mask_root=annotated.mask_root,
                                    several_labels=annotated.layout == "multi_label",
                                    mask_classes=annotated.layout == "masks")
        attach = AnnotationAttach(None, annotated.label_map, options,
                                  render_mask if annotated.instance_masks else None)
    elif annotated is None and isinstance(getattr(attach, "label_map", None), LabelMap):
        options = getattr(attach, "options", None) or AnnotationOptions()
        annotated = AnnotatedRun(CUSTOM_LAYOUT, attach.label_map, instance_masks=options.instance_masks,
                                 images_root=options.images_root, mask_root=options.mask_root)
    return attach, annotated


def _commit_settings(plan: RunPlan, annotated: AnnotatedRun | None = None) -> CommitSettings:
    config = plan.config
    _, root, _ = resolve_input(config.input, config.layout)
    is_part = plan.update is not None and plan.update.action == "part"
    options = config.to_json()
    if is_part:
        options["output"] = plan.dataset_output
    return CommitSettings(plan.target, config.band, config.max_bad_fraction,
                          options=tuple(options.items()), overwrite=True,
                          release_lock=plan.target.run_id, dropped_columns=plan.dropped_columns,
                          fail_on_leakage=config.fail_on_leakage,
                          options_fingerprint=config_fingerprint(config), input_root=root,
                          dataset_output=plan.dataset_output if is_part else "",
                          part=plan.update.part if is_part else "",
                          update=json.dumps(plan.update.to_json()) if plan.update else "",
                          drift=drift_gate(config, plan.dataset_output),
                          input_units=len(plan.units.units) if plan.units is not None else 0,
                          annotated=annotated)


_DIRECT_RUNNER_NAMES = (None, "DirectRunner", "direct", "SwitchingDirectRunner")


def _local_runner(options: PipelineOptions):
    """The engine the DirectRunner runs a batch pipeline on in this process (Beam's
    ``FnApiRunner``, given the options as the DirectRunner gives them), or ``None``
    when the options name another runner.

    Chosen here, not by the DirectRunner: Beam 2.77's DirectRunner first tries the
    Prism runner, which downloads a binary from GitHub at run time (on a machine
    without network access the download fails and it falls back) and runs the
    pipeline in a process of its own, where the progress line, the in-process
    listing hand-over and the helper processes this product plans for do not hold.
    A run never fetches and runs code it was not installed with.
    """
    if options.view_as(StandardOptions).runner not in _DIRECT_RUNNER_NAMES:
        return None
    # pylint: disable=import-outside-toplevel
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    _prompt_step_timers()
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


# Beam's per-step timer (a thread each bundle starts) sleeps up to 200 ms between
# samples, and a bundle's end joins it: every step of a local run waited ~0.1 s on
# average for it (0.09-0.18 s a 60k-file run, in the main process while the cores
# idle). Sampled every 10 ms at most, it ends within 10 ms; the extra wake-ups take
# no GIL and no measurable CPU. The step timings are sampled as before, only finer.
_STEP_TIMER_PERIOD_MS = 10


def _prompt_step_timers() -> None:
    """Makes the bundles this process runs sample their step times every
    ``_STEP_TIMER_PERIOD_MS`` at most (Beam 2.77's ``StateSampler``, which
    ``bundle_processor`` makes per bundle with the default period)."""
    # pylint: disable=import-outside-toplevel
    from apache_beam.runners.worker import statesampler

    if getattr(statesampler.StateSampler, "prompt", False):
        return
    base = statesampler.StateSampler

    class PromptStateSampler(base):  # pylint: disable=too-few-public-methods
        prompt = True

        def __init__(self, prefix, counter_factory, sampling_period_ms=_STEP_TIMER_PERIOD_MS):
            super().__init__(prefix, counter_factory, min(sampling_period_ms, _STEP_TIMER_PERIOD_MS))

    statesampler.StateSampler = PromptStateSampler


def _listed_bytes(plan: RunPlan) -> int | None:
    """The bytes of the images the preflight listed for this run (``None``: not known
    here, e.g. a CSV manifest or a scheduled run)."""
    table = plan.input_table
    sizes = getattr(table, "sizes", None)
    if sizes is None:
        return None
    return int(sizes.sum() if plan.input_rows is None else sizes[plan.input_rows].sum())


def helper_processes(plan: RunPlan, auto: bool) -> int:
    """The helper processes the steps of ``plan`` may use: ``encode_processes``, or,
    when the run chooses them (``auto``: ``--encode_processes -1``), 0 if the
    preflight already knows the run is too small for helpers to pay back their start
    (``transforms.io.helpers.HELPER_MIN_FILES``, ``HELPER_MIN_TABLE_BYTES``): threads
    then do the work, with the same bytes written."""
    processes = plan.config.encode_processes
    if processes <= 0 or not auto:
        return max(processes, 0)
    return 0 if _small_run(plan) else processes


def _small_run(plan: RunPlan) -> bool:
    """Whether the preflight knows the run's inputs to be few: under
    ``HELPER_MIN_FILES`` images, or a table under ``HELPER_MIN_TABLE_BYTES``."""
    if plan.is_table:
        return sum(size for _, size in plan.table_inputs) < HELPER_MIN_TABLE_BYTES
    return bool(plan.units is None and plan.listing and listing_size(plan.listing) < HELPER_MIN_FILES)


def helpers_start_now(plan: RunPlan, auto: bool) -> bool:
    """Whether the run will use helper processes for sure, so they can be started
    before its graph is built (their spawn and imports then overlap the runner's start)."""
    if helper_processes(plan, auto) <= 0:
        return False
    if plan.is_table:
        return True
    listed = _listed_bytes(plan) if plan.units is None and plan.listing else None
    return listed is not None and helpers_pay(listing_size(plan.listing), listed)


def helpers_may_fork(plan: RunPlan) -> bool:
    """Whether helpers started before the runner may be forked (where the process
    allows it, ``helpers.allow_forked_helpers``): only when they read and check local
    files. A fork would give them this process's storage clients, whose connections'
    sockets this process goes on using; on ``gs://`` they are spawned and make their own."""
    return "://" not in plan.config.input and "://" not in plan.config.output


def start_first_shard_early(plan: RunPlan, options: PipelineOptions, attach: Callable | None,
                            auto: bool) -> int:
    """Starts encoding the first shard's files on the helper processes now, before the
    graph is built (``image_plans.start_first_shard``): the helpers would otherwise
    wait the ~0.3 s the graph and the local runner take to start. Only for a listing
    this process plans and writes (this runner, in this process, the steps
    ``_image_steps`` gives ``PlanImageShards``), with helpers started now
    (``helpers_start_now``), and no test hold point armed (a run held at ``listing``
    has read no input). Returns the files started."""
    config = plan.config
    refs = kept_refs(plan.listing) if plan.listing else None
    if (not refs or plan.is_table or plan.units is not None or plan.contents_on_workers or plan.listing_path
            or config.reshape.active or len(refs) > handoff.PART_ROWS
            or not in_process_direct_runner(options) or announce_hooks() is not None
            or not helpers_start_now(plan, auto)):
        return 0
    attach, _ = annotated_attach(plan, attach)
    source = _image_records(config, attach, helper_processes(plan, auto))
    return start_first_shard(refs, config.band, config.compression, source)


def build_graph(plan: RunPlan, options: PipelineOptions, attach: Callable | None = None, *,
                auto_helpers: bool = False) -> beam.Pipeline:
    """The conversion planned as ``plan`` as an un-run Beam pipeline, on the runner
    ``options`` name (see ``_local_runner``); ``attach``: images, what side data adds
    to each record (``transforms.io.image_records``); ``auto_helpers``: the run
    chooses its helper processes (``helper_processes``)."""
    config = plan.config
    attach, annotated = annotated_attach(plan, attach)
    carried = options.view_as(progress.ProgressOptions)
    if carried.progress_seconds is None:  # The job carries it to the processes running its steps.
        carried.progress_seconds = progress.interval()
    runner = _local_runner(options)
    if runner is not None and (_small_run(plan) or not plan.is_table):
        # Beam infers each step's output type by tracing its code (~65 ms of a 9-image
        # run's graph, and of a 60k-image run's, before its first image is read); our
        # steps check their own elements, and this runner's coders need no inferred
        # types. (A large table keeps them: the coders they choose hold its rows in less
        # memory at peak; a Dataflow job too: they shape its graph.)
        options.view_as(TypeOptions).pipeline_type_check = False
    pipeline = beam.Pipeline(runner=runner, options=options)
    processes = helper_processes(plan, auto_helpers)
    verify = VerifyShards(config.compression, processes, reread=config.reread)
    if plan.is_table:
        steps = _table_steps(pipeline, plan, verify, processes)
    elif plan.units is not None:
        # Listed and planned on the workers (--list_on_workers).
        specs, summary = pipeline | "ListOnWorkers" >> ListAndPlanOnWorkers(plan.units)
        results = (
            specs
            | "WriteShards" >> WriteShards(plan.target, _image_records(config, attach, processes))
            | "VerifyShards" >> verify
        )
        steps = _Steps(results, summary)
    else:
        steps = _image_steps(pipeline, plan, options, verify, attach, processes)
    _ = steps.results | "WriteManifest" >> Commit(_commit_settings(plan, annotated), steps.summary,
                                                  steps.left_out)
    return pipeline


@dataclasses.dataclass(frozen=True)
class _Steps:
    """What the commit takes: the shards' results, the input's summary (a PCollection
    of one ``InputSummary``) and, for images hashed on the workers, the files they
    left out (see ``transforms.gather.GatherContents``)."""

    results: beam.PCollection
    summary: beam.PCollection
    left_out: beam.PCollection | None = None


def _image_records(config: ConvertConfig, attach: Callable | None, processes: int) -> ImageRecords:
    return ImageRecords(config.validate, config.read_threads, processes,
                        max_pixels=config.max_pixels, image_bytes=config.image_bytes,
                        reshape=config.reshape, max_file_bytes=config.max_file_bytes, attach=attach,
                        names=tuple(parse_feature_names(config.feature_names).renames.items()))


def _table_steps(pipeline: beam.Pipeline, plan: RunPlan, verify: VerifyShards, processes: int) -> _Steps:
    config, target, schema = plan.config, plan.target, plan.schema
    spool_dir = files.join(target.temp_dir, "spool")
    encoded = pipeline | "EncodeTables" >> EncodeTables(
        plan.table_inputs, schema, config.dialect, config.table_layout, target.temp_dir, spool_dir,
        processes)
    if config.sequence_key:
        spools = encoded.rows | "BuildSequences" >> BuildSequences(schema, spool_dir)
        specs, grouped = spools | "PlanSequenceShards" >> PlanSequenceShards(
            config.band, config.compression)
        summary = (
            encoded.infos
            | "CollectFiles" >> beam.combiners.ToList()
            | "Summarize" >> beam.Map(table_summary, config.input, schema, True,
                                      beam.pvalue.AsSingleton(grouped))
        )
    else:
        specs, summary = encoded.infos | "PlanTableShards" >> PlanTableShards(
            config.band, config.compression, config.input, schema)
    results = (
        specs
        | "WriteShards" >> WriteShards(target, SpoolCopy(check_ahead=processes > 0))
        | "VerifyShards" >> verify
    )
    return _Steps(results, summary)


def _image_steps(pipeline: beam.Pipeline, plan: RunPlan, options: PipelineOptions,
                 verify: VerifyShards, attach: Callable | None, processes: int) -> _Steps:
    """Images listed on the launcher: the listing, hashed on the workers or not, then
    shards planned from it (or, resized, from their spools)."""
    config, target = plan.config, plan.target
    left_out = None  # Files the listing named that hashing on the workers left out.
    digest = ""
    if plan.listing_path:
        # The steps run elsewhere: they take this listing, not another, and only
        # if the file still has the digest the job graph carries (a dry run
        # builds the same job, and writes nothing).
        dry = options.view_as(TestOptions).dry_run
        digest = write_listing(None if dry else plan.listing_path, plan.listing, handoff.PART_ROWS)
    # A large listing travels as parts, planned without one step holding it all;
    # images hashed on the workers travel as parts too.
    part_rows = handoff.PART_ROWS
    in_parts = plan.contents_on_workers or (
        not config.reshape.active and listing_size(plan.listing) > part_rows)
    listing = pipeline | "ListImages" >> ListImages(
        config.input, config.layout, config.labels, target.temp_dir, processes,
        config.image_column, config.label_column, kept=plan.listing,
        splits=config.splits, split_by=config.split_by, drop_duplicates=config.drop_duplicates,
        vocabulary=plan.vocabulary, only=plan.only, listing_path=plan.listing_path,
        follow_links_outside=config.follow_links_outside, max_file_bytes=config.max_file_bytes,
        listing_sha256=digest, part_rows=part_rows if in_parts else 0,
        contents_on_workers=plan.contents_on_workers,
        annotations=ListingIdentity.of(config).annotations)
    refs, summary = listing.refs, listing.summary
    if plan.contents_on_workers:
        hashing = HashImages(target.temp_dir, config.splits if config.split_by == "content" else (),
                             config.drop_duplicates, config.max_file_bytes)
        refs = refs | "HashImages" >> hashing
        summary, left_out = add_contents_outcome(summary, hashing.outcome), hashing.left_out
    source = _image_records(config, attach, processes)
    if config.reshape.active:
        # Resized or re-encoded records are sized only once encoded: encode to
        # spools first, then cut shards by exact sizes.
        if in_parts:
            refs = refs | "CollectParts" >> beam.combiners.ToList() | "JoinParts" >> beam.Map(joined_parts)
        specs, spools = refs | "SpoolImages" >> SpoolImages(
            source, files.join(target.temp_dir, "spool"), target.temp_dir, config.band,
            config.compression)
        summary = add_spool_dead_letters(summary, spools)
        results = (
            specs
            | "WriteShards" >> WriteShards(target, SpoolCopy(check_ahead=processes > 0))
            | "VerifyShards" >> verify
        )
    else:
        planner = PlanListingParts if in_parts else PlanImageShards
        results = (
            refs
            | "PlanShards" >> planner(config.band, config.compression)
            | "WriteShards" >> WriteShards(target, source)
            | "VerifyShards" >> verify
        )
    return _Steps(results, summary, left_out)
