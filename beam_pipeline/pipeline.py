"""The library API: build the conversion pipeline, or run it and get its result.

``build_pipeline`` returns an un-run pipeline (for tests, or to run elsewhere);
``convert`` plans the run (``preflight``), takes the output folder, runs the
pipeline on the runner the Beam options name (DirectRunner by default), and
returns the run report that the last step wrote.

On Dataflow the output's lock follows the job (``transforms.io.commit``): it
names the job once submitted, the launcher releases it only when the job is
known to have ended (else the job's last step does, or the next run takes it
over once the Dataflow API says the job ended), and an interrupted ``convert``
cancels the job it waits for, or leaves it running (``interrupt_job``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)

from beam_tfrecords.preflight import (
    ConvertError,
    OutputBusy,
    OutputExistsError,
    RunPlan,
    check_output,
    drift_gate,
    plan_run,
    runs_on_dataflow,
    take_output,
)
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, REPORT_NAME
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.image_contents import HashImages, add_contents_outcome
from beam_tfrecords.transforms.images import (
    ImageRecords,
    ListImages,
    PlanImageShards,
    SpoolImages,
    add_spool_dead_letters,
    drop_listing,
    joined_parts,
    listing_size,
    write_listing,
)
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.commit import LOCK_NAME, record_job, release_lock, remove_run_folder
from beam_tfrecords.transforms.io.dataflow_jobs import (
    ENDED_STATES,
    DataflowApi,
    DataflowJob,
    JobQueryError,
    cancel_job,
    flex_launch_job_id,
    job_state,
)
from beam_tfrecords.transforms.io.faults import announce_hooks, hold_point
from beam_tfrecords.transforms.io.helpers import helper_pool
from beam_tfrecords.transforms.io.ownership import write_owned
from beam_tfrecords.transforms.listing_plan import PlanListingParts
from beam_tfrecords.transforms.manifest import Commit, CommitSettings
from beam_tfrecords.transforms.plan import handoff
from beam_tfrecords.transforms.plan.layouts import resolve_input
from beam_tfrecords.transforms.sequences import BuildSequences, PlanSequenceShards
from beam_tfrecords.transforms.shards import SpoolCopy, VerifyShards, WriteShards
from beam_tfrecords.transforms.tables import EncodeTables, PlanTableShards, table_summary
from beam_tfrecords.transforms.worker_listing import ListAndPlanOnWorkers
from beam_tfrecords.updates import config_fingerprint

_log = logging.getLogger(__name__)

__all__ = [
    "ConvertError",
    "ConvertResult",
    "JobInterrupted",
    "JobInterruption",
    "OutputBusy",
    "OutputExistsError",
    "build_pipeline",
    "convert",
    "interrupt_job",
    "submit",
]


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """The outcome of a run: the report ``run_report.json`` holds."""

    report: dict

    @property
    def ok(self) -> bool:
        """Every shard proved and published, and the error budget kept."""
        return self.report["status"] == "ok"

    @property
    def skipped(self) -> bool:
        """A scheduled run that found nothing to do (and wrote nothing)."""
        return self.report["status"] == "skipped"

    @property
    def manifest_path(self) -> str | None:
        return self.report["manifest"]


def _commit_settings(plan: RunPlan) -> CommitSettings:
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
                          input_units=len(plan.units.units) if plan.units is not None else 0)


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

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    return fn_runner.FnApiRunner(provision_info=fn_runner.ExtendedProvisionInfo(
        beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded)))


def _build(plan: RunPlan, options: PipelineOptions, attach: Callable | None = None) -> beam.Pipeline:
    config, target = plan.config, plan.target
    carried = options.view_as(progress.ProgressOptions)
    if carried.progress_seconds is None:  # The job carries it to the processes running its steps.
        carried.progress_seconds = progress.interval()
    pipeline = beam.Pipeline(runner=_local_runner(options), options=options)
    verify = VerifyShards(config.compression, config.encode_processes, reread=config.reread)
    left_out = None  # Files the listing named that hashing on the workers left out.
    if plan.is_table:
        schema = plan.schema
        spool_dir = files.join(target.temp_dir, "spool")
        encoded = pipeline | "EncodeTables" >> EncodeTables(
            plan.table_inputs, schema, config.dialect, config.table_layout, config.output, spool_dir,
            config.encode_processes)
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
            | "WriteShards" >> WriteShards(target, SpoolCopy())
            | "VerifyShards" >> verify
        )
    elif plan.units is not None:
        # Listed and planned on the workers (--list_on_workers).
        specs, summary = pipeline | "ListOnWorkers" >> ListAndPlanOnWorkers(plan.units)
        source = ImageRecords(config.validate, config.read_threads, config.encode_processes,
                              max_pixels=config.max_pixels, image_bytes=config.image_bytes,
                              reshape=config.reshape, max_file_bytes=config.max_file_bytes, attach=attach)
        results = (
            specs
            | "WriteShards" >> WriteShards(target, source)
            | "VerifyShards" >> verify
        )
    else:
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
            config.input, config.layout, config.labels, config.output, config.encode_processes,
            config.image_column, config.label_column, kept=plan.listing,
            splits=config.splits, split_by=config.split_by, drop_duplicates=config.drop_duplicates,
            vocabulary=plan.vocabulary, only=plan.only, listing_path=plan.listing_path,
            follow_links_outside=config.follow_links_outside, max_file_bytes=config.max_file_bytes,
            listing_sha256=digest, part_rows=part_rows if in_parts else 0,
            contents_on_workers=plan.contents_on_workers)
        refs, summary = listing.refs, listing.summary
        if plan.contents_on_workers:
            hashing = HashImages(config.output, config.splits if config.split_by == "content" else (),
                                 config.drop_duplicates, config.max_file_bytes)
            refs = refs | "HashImages" >> hashing
            summary, left_out = add_contents_outcome(summary, hashing.outcome), hashing.left_out
        source = ImageRecords(config.validate, config.read_threads, config.encode_processes,
                              max_pixels=config.max_pixels, image_bytes=config.image_bytes,
                              reshape=config.reshape, max_file_bytes=config.max_file_bytes, attach=attach)
        if config.reshape.active:
            # Resized or re-encoded records are sized only once encoded: encode to
            # spools first, then cut shards by exact sizes.
            if in_parts:
                refs = refs | "CollectParts" >> beam.combiners.ToList() | "JoinParts" >> beam.Map(joined_parts)
            specs, spools = refs | "SpoolImages" >> SpoolImages(
                source, files.join(target.temp_dir, "spool"), config.output, config.band,
                config.compression)
            summary = add_spool_dead_letters(summary, spools)
            results = (
                specs
                | "WriteShards" >> WriteShards(target, SpoolCopy())
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
    _ = results | "WriteManifest" >> Commit(_commit_settings(plan), summary, left_out)
    return pipeline


def build_pipeline(config: ConvertConfig | RunPlan, options: PipelineOptions | None = None) -> beam.Pipeline:
    """The conversion as an un-run Beam pipeline.

    Args:
      config: the conversion, or a plan from ``preflight.plan_run`` (the plan is
        made here from a config; the output folder is not taken, see ``convert``).
      options: Beam options (runner and its flags); DirectRunner when ``None``.

    Raises:
      ConvertError: on options or inputs that cannot work.
    """
    options = options or PipelineOptions([])
    plan = config if isinstance(config, RunPlan) else plan_run(config, options)
    return _build(plan, options)


def _start(plan: RunPlan, options: PipelineOptions, attach: Callable | None = None):
    """Builds and starts the pipeline (which, on the DirectRunner, runs it)."""
    pipeline = _build(plan, options, attach)
    if plan.is_table and plan.config.encode_processes > 0:
        # Start them, and their imports, now, while the runner starts.
        helper_pool(plan.config.encode_processes,
                    preload=("beam_tfrecords.transforms.codec.table_batches",))
    return pipeline.run()


_RAISED = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Interrupt)\b.*)$")


def _remote_error(text: str) -> str:
    """The exception line of an error raised in another process (a worker of a
    multi-process runner), whose message is its whole traceback: the one Beam
    marks with its step, else the last; ``text`` when it holds no traceback."""
    if "Traceback (most recent call last)" not in text:
        return text
    raised = [m.group(1) for m in map(_RAISED.match, (line.strip() for line in text.splitlines())) if m]
    in_step = [line for line in raised if "[while running '" in line]  # What the step raised.
    return (in_step or raised or [text])[0 if in_step else -1]


def _failure(err: BaseException) -> str:
    """One line that says why a pipeline failed: the error, the step, what to do."""
    text = " ".join(_remote_error(str(err)).split()) or type(err).__name__
    step = re.search(r"\[while running '([^']*)'\]", text)
    text = re.sub(r"\s*\[while running '[^']*'\]", "", text)
    if not re.match(r"^[A-Za-z_.]*(Error|Exception|Interrupt)\b", text):
        text = f"{type(err).__name__}: {text}"
    if "Errno 28" in text or "No space left" in text:
        text += " (the disk holding --output, or its temporaries, is full: free space or choose another --output)"
    return text[:600] + (f" (in step {step.group(1)})" if step else "")


def _record_failure(plan: RunPlan, err: BaseException) -> dict:
    """The report of a run whose pipeline raised: written to the output when it
    can be (best effort, as the storage may be what failed); the run's
    temporaries are removed so a full disk gets its space back (but for what a commit
    stopped before publishing kept of the old dataset: ``remove_run_folder``)."""
    _log.error("The pipeline failed", exc_info=err)
    output, target = plan.dataset_output or plan.config.output, plan.target
    report = {"status": "failed", "output": output, "manifest": None, "error": _failure(err),
              "run_id": target.run_id}
    try:
        remove_run_folder(target.output, target.temp_dir)
    except Exception as cleanup:  # pylint: disable=broad-except
        _log.warning("Could not remove %s: %s", target.temp_dir, cleanup)
    try:
        # Recorded in the output's journal first: the next run may then replace it.
        write_owned(output, REPORT_NAME, json.dumps(report, indent=2).encode())
    except Exception as unwritten:  # pylint: disable=broad-except
        report["report_not_written"] = str(unwritten).splitlines()[0] if str(unwritten) else ""
    return report


# --- the Dataflow job a run submits, and its lock -------------------------------------------


@dataclasses.dataclass
class _Launch:
    """A Dataflow job this process submits, and the lock that names it (mutable: the
    job id arrives on submission; the CLI's signal handlers read it, see
    ``interrupt_job``)."""

    output: str
    run_id: str
    api: DataflowApi
    job: DataflowJob  # job_id '' until submitted.
    interrupted: int = 0  # The signal that came while submitting (0: none).
    keep: bool = False
    stopping: bool = False  # An interrupt is handling the job.

    @property
    def lock_path(self) -> str:
        return files.join(self.output, WORK_DIR, LOCK_NAME)


_active: _Launch | None = None  # The job convert() submits or waits for, for interrupt_job.


@dataclasses.dataclass(frozen=True)
class JobInterruption:
    """What an interrupt did to the Dataflow job this process submitted.

    Attributes:
      line: one line for the person (or scheduler) that interrupted.
      exit_now: ``False`` when the job is still being submitted: the process goes
        on until it is, then handles it (``JobInterrupted``).
    """

    line: str
    exit_now: bool = True


class JobInterrupted(KeyboardInterrupt):
    """``convert`` was interrupted while submitting its Dataflow job; the job has
    since been cancelled or left running, as the message says.

    Attributes:
      signum: the signal that interrupted it.
    """

    def __init__(self, line: str, signum: int):
        super().__init__(line)
        self.signum = signum


def _launch_of(plan: RunPlan, options: PipelineOptions) -> _Launch | None:
    """For a run on Dataflow, the job it is to submit (project and region; the id
    comes at submission); ``None`` on other runners."""
    if not _is_dataflow(options):
        return None
    cloud = options.view_as(GoogleCloudOptions)
    return _Launch(plan.dataset_output or plan.config.output, plan.target.run_id,
                   DataflowApi.from_options(options), DataflowJob(cloud.project or "", cloud.region or ""))


def _take(plan: RunPlan, launch: _Launch | None) -> None:
    """``take_output``; on Dataflow the lock names the job's project and region."""
    try:
        if launch is None:
            take_output(plan)
        else:
            take_output(plan, job=launch.job, api=launch.api)
    except BaseException:
        drop_listing(plan.listing)
        raise


def _submit(plan: RunPlan, options: PipelineOptions, launch: _Launch | None, attach=None):
    """Builds and starts the pipeline; on Dataflow, writes the job it submitted into
    the output's lock (``record_job``), so that the lock follows the job."""
    if launch is not None:
        hold_point("dataflow_submit")  # Tests: interrupted while submitting.
    result = _start(plan, options, attach)
    if launch is None:
        return result
    cloud = options.view_as(GoogleCloudOptions)  # Completed by Beam (a default region).
    # Submitted by this program, or (a Flex Template launch) by the launcher service,
    # which had the program write the job to --template_location.
    job_id = (result.job_id() if getattr(result, "has_job", False)
              else flex_launch_job_id(cloud.template_location))
    if not job_id:
        _log.warning("No Dataflow job id is known (--template_location %s): the lock %s stays until "
                     "the job's last step releases it; if no job runs, delete it",
                     cloud.template_location, launch.lock_path)
        return result
    job = DataflowJob(cloud.project or launch.job.project, cloud.region or launch.job.region, job_id)
    try:
        recorded = record_job(launch.output, launch.run_id, job)
    except Exception as err:  # pylint: disable=broad-except
        _log.warning("Could not write %s into %s: %s", job.describe(), launch.lock_path, err)
        recorded = False
    if recorded:
        _log.info("The lock %s names %s (%s)", launch.lock_path, job.describe(), job.console_url)
    else:
        _log.warning("The lock %s does not name %s: if this launcher stops, delete it once that job "
                     "has ended", launch.lock_path, job.describe())
    launch.job = job
    return result


def _stop_job(launch: _Launch, keep: bool) -> str:
    """Cancels the submitted job (or, with ``keep``, leaves it running); releases the
    lock only when the job has ended. Returns one line saying what happened."""
    job = launch.job
    if keep:
        return (f"interrupted; {job.describe()} keeps running ({job.console_url}); the lock "
                f"{launch.lock_path} stays until it ends (the next run takes it over then); to "
                f"stop it: {job.cancel_command}")
    try:
        state = cancel_job(job, launch.api)
        if state not in ENDED_STATES:
            state = job_state(job, launch.api)
    except JobQueryError as err:
        return (f"interrupted; could not cancel {job.describe()} ({err}): it may still run; cancel "
                f"it: {job.cancel_command}; the lock {launch.lock_path} stays until it ends")
    if state not in ENDED_STATES:
        return (f"interrupted; cancelling {job.describe()}, now {state}: the lock {launch.lock_path} "
                "stays until the job has stopped, and the next run takes it over then")
    try:
        release_lock(launch.output, launch.run_id)
    except Exception as err:  # pylint: disable=broad-except
        return (f"interrupted; cancelled {job.describe()}, now {state}, but could not release the "
                f"lock ({type(err).__name__}); the next run takes it over")
    return f"interrupted; cancelled {job.describe()}, now {state}, and released the lock"


def interrupt_job(keep: bool = False, signum: int = signal.SIGINT) -> JobInterruption | None:
    """For a signal handler (Ctrl-C, SIGTERM) while ``convert`` runs on Dataflow:
    cancels the job it submitted and waits for, then releases the output's lock
    when Dataflow says the job ended; with ``keep``, leaves the job running and
    its lock in place (the next run takes it over once the job ended). While
    the job is being submitted, the interrupt is remembered and handled as soon
    as the job exists (``convert`` then raises ``JobInterrupted``); a second
    interrupt then stops at once, leaving the lock.

    Args:
      keep: leave the job running instead of cancelling it.
      signum: the signal (carried by ``JobInterrupted``).

    Returns:
      What was done; ``None`` when this process waits for no Dataflow job (the
      run stops as on any runner).
    """
    launch = _active
    if launch is None:
        return None
    if launch.stopping:  # Interrupted again while the first interrupt asks the API.
        return JobInterruption(f"interrupted again; {launch.job.describe()} may still run (to stop it: "
                               f"{launch.job.cancel_command}); the lock {launch.lock_path} stays until "
                               "it ends")
    if launch.job.job_id:
        launch.stopping = True
        return JobInterruption(_stop_job(launch, keep))
    if launch.interrupted:
        return JobInterruption(
            f"interrupted again while submitting to Dataflow: the lock {launch.lock_path} stays; "
            f"if no job of run {launch.run_id} was created (gcloud dataflow jobs list --status=active "
            f"--region {launch.job.region} --project {launch.job.project}), delete it")
    launch.interrupted, launch.keep = signum, keep
    return JobInterruption(
        "interrupted while submitting the Dataflow job: it will be "
        f"{'left running' if keep else 'cancelled'} as soon as it exists (interrupt again to stop "
        "now, leaving the lock)", exit_now=False)


def _job_ended(launch: _Launch) -> bool:
    """Whether the Dataflow API says the submitted job has ended (``False`` when it
    cannot be asked)."""
    try:
        return job_state(launch.job, launch.api) in ENDED_STATES
    except JobQueryError as err:
        _log.warning("Could not ask about %s: %s", launch.job.describe(), err)
        return False


def _lost_job(plan: RunPlan, launch: _Launch, err: BaseException) -> dict:
    """The report of a run that stopped waiting for a Dataflow job that may still run:
    its temporaries and lock stay, nothing is written to the output."""
    job = launch.job
    return {"status": "failed", "output": launch.output, "manifest": None, "run_id": plan.target.run_id,
            "error": f"{_failure(err)}; {job.describe()} may still be running ({job.console_url}): "
                     f"the lock {launch.lock_path} stays until it ends",
            "report_not_written": "the Dataflow job may still be running"}


def _own_report(plan: RunPlan) -> dict | None:
    """This run's report, when its commit wrote one (it names the run); else ``None``."""
    try:
        data = files.read_bytes_if_exists(files.join(plan.dataset_output or plan.config.output, REPORT_NAME))
        report = json.loads(data) if data else None
    except Exception:  # pylint: disable=broad-except  # Unreadable: the failure is recorded anew.
        return None
    ours = isinstance(report, dict) and report.get("run_id") == plan.target.run_id
    return report if ours and isinstance(report.get("status"), str) else None


def submit(config: ConvertConfig, beam_args: Sequence[str] = ()):
    """Checks, prepares and starts a conversion without waiting for it.

    For launchers that only submit (a Dataflow Flex Template): the outcome is
    then ``OUTPUT/run_report.json``, and ``manifest.json`` when it succeeded; the
    pipeline's last step releases the output's lock. On Dataflow the lock names
    the job once it is submitted (in a Flex Template launch, the job the launcher
    created, read from ``--template_location``; see ``flex_launch_job_id``): a job
    that fails or is cancelled leaves it, and the next run takes it over once the
    Dataflow API says the job has ended.

    Returns:
      Beam's ``PipelineResult``; ``None`` when a scheduled run found nothing to do
      (``skip_unchanged`` or ``incremental``, see ``beam_pipeline.updates``), or for
      ``--dry_run=True`` on a runner other than Dataflow (the pipeline is built, not
      run; see ``_dry_run``).

    Raises:
      ConvertError: on options or inputs that cannot work (before anything runs).
    """
    announce_hooks()
    options = PipelineOptions(list(beam_args))
    plan = plan_run(config, options)
    if _skipped(plan):
        return None
    if options.view_as(TestOptions).dry_run:
        return _dry_run(plan, options)
    launch = _launch_of(plan, options)
    _take(plan, launch)
    try:
        return _submit(plan, options, launch)
    except BaseException:
        drop_listing(plan.listing)
        release_lock(plan.dataset_output or plan.config.output, plan.target.run_id)
        raise


def _dry_run(plan: RunPlan, options: PipelineOptions):
    """``--dry_run=True``: the pipeline is built and checked, and nothing runs or is
    written (the output is not even locked). The DataflowRunner builds its job
    without submitting it (its ``PipelineResult`` holds the job); other runners
    would run the pipeline, so it is only built."""
    try:
        check_output(plan)
        if _is_dataflow(options):
            result = _start(plan, options)
            result.wait_until_finish()
            return result
        _build(plan, options)
        return None
    finally:
        drop_listing(plan.listing)


def _is_dataflow(options: PipelineOptions) -> bool:
    return runs_on_dataflow(options)


def _skipped(plan: RunPlan) -> bool:
    return plan.update is not None and plan.update.action == "skip"


def _skip_report(plan: RunPlan) -> dict:
    """The report of a run that found nothing to do (written nowhere: the output
    is not touched)."""
    return {"status": "skipped", "output": plan.dataset_output or plan.config.output,
            "manifest": files.join(plan.dataset_output or plan.config.output, MANIFEST_NAME),
            "reason": plan.update.reason, "update": plan.update.to_json()}


def convert(config: ConvertConfig, beam_args: Sequence[str] = (),
            on_plan: Callable[[RunPlan], None] | None = None, attach=None) -> ConvertResult:
    """Runs a conversion to the end and returns its report.

    Args:
      config: the conversion.
      beam_args: Beam flags (``--runner``, ``--direct_num_workers``, ...).
      on_plan: called with the checked plan before the output is taken and anything runs.
      attach: images: what side data adds to each record (``io.image_records``; no flag).

    Raises:
      ConvertError: on options or inputs that cannot work (before anything runs),
        or another run holding the output.
      RuntimeError: when the pipeline ends without a run report.

    A pipeline that raises (storage full or gone, a runner failure) gives a result
    with status ``failed`` and its ``error``; nothing is published.
    """
    announce_hooks()
    options = PipelineOptions(list(beam_args))
    plan = plan_run(config, options)
    if _skipped(plan):
        if on_plan is not None:
            on_plan(plan)
        return ConvertResult(_skip_report(plan))
    if options.view_as(TestOptions).dry_run:
        if on_plan is not None:
            on_plan(plan)
        _dry_run(plan, options)
        return ConvertResult({"status": "dry_run", "output": plan.config.output, "manifest": None})
    if on_plan is not None:
        try:
            on_plan(plan)
        except BaseException:
            drop_listing(plan.listing)
            raise
    launch = _launch_of(plan, options)
    _take(plan, launch)
    output = plan.dataset_output or plan.config.output
    release = True  # Whether this process releases the lock at the end.
    global _active  # pylint: disable=global-statement
    _active = launch
    try:
        try:
            result = _submit(plan, options, launch, attach)
            if launch is not None and launch.interrupted:  # Came while submitting.
                launch.stopping = True
                raise JobInterrupted(_stop_job(launch, launch.keep) if launch.job.job_id else
                                     f"interrupted; no Dataflow job id is known: the lock "
                                     f"{launch.lock_path} stays", launch.interrupted)
            release = launch is None  # Dataflow: only once the job is known to have ended.
            result.wait_until_finish()
            release = True
        except Exception as err:  # pylint: disable=broad-except
            own = _own_report(plan)
            if own is not None:
                # The commit wrote its report, then raised so that the job ends failed
                # (transforms.manifest.RunFailed); no retry follows here, so what it
                # kept for one (after commit_failed) goes, but for what it kept of the old
                # dataset while no new manifest is published.
                _log.info("The run published nothing: %s", own["status"])
                try:
                    remove_run_folder(plan.target.output, plan.target.temp_dir)
                except Exception as cleanup:  # pylint: disable=broad-except
                    _log.warning("Could not remove %s: %s", plan.target.temp_dir, cleanup)
                return ConvertResult(own)
            # Inputs are dead-lettered, not raised: this is the storage, the runner or a bug.
            if launch is not None and launch.job.job_id and not release and not _job_ended(launch):
                return ConvertResult(_lost_job(plan, launch, err))
            release = True
            return ConvertResult(_record_failure(plan, err))
        except JobInterrupted:
            release = False  # _stop_job released it if the job ended.
            raise
        except KeyboardInterrupt:
            if launch is not None and launch.job.job_id:  # Python's own Ctrl-C (library use).
                release = False
                _log.warning("%s", _stop_job(launch, keep=False))
            raise
    finally:
        _active = None
        drop_listing(plan.listing)
        if release:
            release_lock(output, plan.target.run_id)
    report_path = files.join(output, REPORT_NAME)
    if not files.exists(report_path):
        raise RuntimeError(f"the pipeline finished without writing {report_path}")
    return ConvertResult(json.loads(files.read_text(report_path)))
