"""The library API: build the conversion pipeline, or run it and get its result.

``build_pipeline`` returns an un-run pipeline (for tests, or to run elsewhere; the
steps are wired in ``job_graph``);
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
import hashlib
import json
import logging
import re
import signal
import threading
from collections.abc import Callable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, TestOptions

from beam_tfrecords.job_graph import build_graph, helpers_may_fork, helpers_start_now, start_first_shard_early
from beam_tfrecords.preflight import (
    ConvertError,
    OutputBusy,
    OutputExistsError,
    RunPlan,
    check_output,
    plan_run,
    runs_on_dataflow,
    take_output,
)
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.manifest import MANIFEST_NAME, REPORT_NAME
from beam_tfrecords.schemas.report import RunReport, Status
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.image_steps import drop_listing, forget_first_shard
from beam_tfrecords.transforms.io import files
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
    "record_interruption",
    "submit",
]


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """The outcome of a run: the report ``run_report.json`` holds (``RunReport``,
    read by attribute: ``result.report.status``, ``result.report.records``)."""

    report: RunReport

    @property
    def ok(self) -> bool:
        """Every shard proved and published, and the error budget kept."""
        return self.report.ok

    @property
    def skipped(self) -> bool:
        """A scheduled run that found nothing to do (and wrote nothing)."""
        return self.report.status == Status.SKIPPED

    @property
    def manifest_path(self) -> str | None:
        return self.report.manifest


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
    return build_graph(plan, options, auto_helpers=plan is not config and config.encode_processes < 0)


def _start(plan: RunPlan, options: PipelineOptions, attach: Callable | None = None,
           auto_helpers: bool = False):
    """Builds and starts the pipeline (which, on the DirectRunner, runs it);
    ``auto_helpers``: ``--encode_processes`` was left to the run (see
    ``job_graph.helper_processes``)."""
    if helpers_start_now(plan, auto_helpers):
        # Start them, and their imports, now, while the graph is built and the runner starts.
        fork = helpers_may_fork(plan)
        if plan.is_table:
            helper_pool(plan.config.encode_processes,
                        preload=("beam_tfrecords.transforms.codec.table_batches",), fork=fork)
        else:
            helper_pool(plan.config.encode_processes, fork=fork)
            start_first_shard_early(plan, options, attach, auto_helpers)
    try:
        pipeline = build_graph(plan, options, attach, auto_helpers=auto_helpers)
        return pipeline.run()
    finally:  # The local runner has run it by now (a remote one takes nothing started early).
        forget_first_shard()


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


def _record_failure(plan: RunPlan, err: BaseException) -> RunReport:
    """The report of a run whose pipeline raised: written to the output when it
    can be (best effort, as the storage may be what failed); the run's
    temporaries are removed so a full disk gets its space back (but for what a commit
    stopped before publishing kept of the old dataset: ``remove_run_folder``)."""
    _log.error("The pipeline failed", exc_info=err)
    output, target = plan.dataset_output or plan.config.output, plan.target
    report = RunReport(Status.FAILED, output, None, run_id=target.run_id, error=_failure(err))
    try:
        remove_run_folder(target.output, target.temp_dir)
    except Exception as cleanup:  # pylint: disable=broad-except
        _log.warning("Could not remove %s: %s", target.temp_dir, cleanup)
    try:
        # Recorded in the output's journal first: the next run may then replace it.
        write_owned(output, REPORT_NAME, json.dumps(report.to_dict(), indent=2).encode())
    except Exception as unwritten:  # pylint: disable=broad-except
        report = dataclasses.replace(
            report, report_not_written=str(unwritten).splitlines()[0] if str(unwritten) else "")
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
class _Taken:
    """The output a run not on Dataflow took, for ``record_interruption``: its run id
    and the SHA-256 of the manifest published there when it started ('' : none)."""

    output: str
    run_id: str
    manifest: str


_taken: _Taken | None = None
_INTERRUPT_REPORT_SECONDS = 10.0


def _digest(data: bytes | None) -> str:
    return hashlib.sha256(data).hexdigest() if data is not None else ""


def record_interruption(signum: int) -> str:
    """For a signal handler (Ctrl-C, SIGTERM) of a run that took its output (not on
    Dataflow: see ``interrupt_job``): writes its ``run_report.json``, status
    ``failed`` with the signal in ``error``, as every run that started does (the
    last run's report was removed when this one took the output). Only when the run
    published nothing (the manifest is the one it found) and wrote no report of its
    own (an error budget exceeded, say). Best effort: the process is ending, so it is
    written from a thread given 10 s (the interrupted main thread may hold what a
    storage client needs).

    Returns:
      The output, when the run (the last ``convert`` of this process) published its
      dataset there: the manifest there is a new one, not the one it found (nothing
      is written then); else ``""``.
    """
    taken = _taken
    if taken is None:
        return ""
    published: list[str] = []
    writer = threading.Thread(target=_write_interrupted, args=(taken, signum, published), daemon=True,
                              name="interrupted-report")
    writer.start()
    writer.join(_INTERRUPT_REPORT_SECONDS)
    return published[0] if published else ""


def _write_interrupted(taken: _Taken, signum: int, published: list[str]) -> None:
    try:
        now = _digest(files.read_bytes_if_exists(files.join(taken.output, MANIFEST_NAME)))
        if now and now != taken.manifest:  # The lock is this run's: so is the manifest.
            published.append(taken.output)
            return
        data = files.read_bytes_if_exists(files.join(taken.output, REPORT_NAME))
        if now != taken.manifest or (data and RunReport.from_json(data).run_id == taken.run_id):
            return
        name = signal.Signals(signum).name if signum in iter(signal.Signals) else str(signum)
        report = RunReport(Status.FAILED, taken.output, None, run_id=taken.run_id,
                           error=f"interrupted ({name}) before it published anything; the dataset there, "
                                 "if any, is the one published before")
        write_owned(taken.output, REPORT_NAME, report.to_bytes())
    except Exception as err:  # pylint: disable=broad-except
        _log.warning("Could not write the report of the interrupted run: %s", err)


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


def _submit(plan: RunPlan, options: PipelineOptions, launch: _Launch | None, attach=None,
            auto_helpers: bool = False):
    """Builds and starts the pipeline; on Dataflow, writes the job it submitted into
    the output's lock (``record_job``), so that the lock follows the job."""
    if launch is not None:
        hold_point("dataflow_submit")  # Tests: interrupted while submitting.
    result = _start(plan, options, attach, auto_helpers)
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


def _lost_job(plan: RunPlan, launch: _Launch, err: BaseException) -> RunReport:
    """The report of a run that stopped waiting for a Dataflow job that may still run:
    its temporaries and lock stay, nothing is written to the output."""
    job = launch.job
    return RunReport(Status.FAILED, launch.output, None, run_id=plan.target.run_id,
                     error=f"{_failure(err)}; {job.describe()} may still be running ({job.console_url}): "
                           f"the lock {launch.lock_path} stays until it ends",
                     report_not_written="the Dataflow job may still be running")


def _own_report(plan: RunPlan) -> RunReport | None:
    """This run's report, when its commit wrote one (it names the run); else ``None``."""
    try:
        data = files.read_bytes_if_exists(files.join(plan.dataset_output or plan.config.output, REPORT_NAME))
        report = RunReport.from_json(data) if data else None
    except Exception:  # pylint: disable=broad-except  # Unreadable: the failure is recorded anew.
        return None
    return report if report is not None and report.run_id == plan.target.run_id else None


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
        build_graph(plan, options)
        return None
    finally:
        drop_listing(plan.listing)


def _is_dataflow(options: PipelineOptions) -> bool:
    return runs_on_dataflow(options)


def _skipped(plan: RunPlan) -> bool:
    return plan.update is not None and plan.update.action == "skip"


def _skip_report(plan: RunPlan) -> RunReport:
    """The report of a run that found nothing to do (written nowhere: the output
    is not touched)."""
    return RunReport(Status.SKIPPED, plan.dataset_output or plan.config.output,
                     files.join(plan.dataset_output or plan.config.output, MANIFEST_NAME),
                     reason=plan.update.reason, update=plan.update.to_json())


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
    global _active, _taken  # pylint: disable=global-statement
    _taken = None  # Kept from the last run until this one takes its output.
    announce_hooks()
    options = PipelineOptions(list(beam_args))
    plan = plan_run(config, options)
    stopped = _shown(plan, options, on_plan)
    if stopped is not None:
        return stopped
    launch = _launch_of(plan, options)
    output = plan.dataset_output or plan.config.output
    seen = files.read_bytes_if_exists(files.join(output, MANIFEST_NAME))
    _take(plan, launch)
    release = True  # Whether this process releases the lock at the end.
    _active = launch
    _taken = _Taken(output, plan.target.run_id, _digest(seen)) if launch is None else None
    try:
        try:
            result = _submit(plan, options, launch, attach, config.encode_processes < 0)
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
                return ConvertResult(_published_nothing(plan, own))
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
        # _taken stays: a Ctrl-C while the launcher prints the summary finds
        # the dataset this run published (record_interruption).
        _active = None
        drop_listing(plan.listing)
        if release:
            release_lock(output, plan.target.run_id)
    report_path = files.join(output, REPORT_NAME)
    if not files.exists(report_path):
        raise RuntimeError(f"the pipeline finished without writing {report_path}")
    return ConvertResult(RunReport.from_json(files.read_text(report_path)))


def _shown(plan: RunPlan, options: PipelineOptions,
           on_plan: Callable[[RunPlan], None] | None) -> ConvertResult | None:
    """Shows the plan (``on_plan``); the result of a run that ends there (a scheduled
    run with nothing to do, a dry run), else ``None``: the run goes on."""
    if _skipped(plan):
        if on_plan is not None:
            on_plan(plan)
        return ConvertResult(_skip_report(plan))
    if options.view_as(TestOptions).dry_run:
        if on_plan is not None:
            on_plan(plan)
        _dry_run(plan, options)
        return ConvertResult(RunReport(Status.DRY_RUN, plan.config.output, None))
    if on_plan is not None:
        try:
            on_plan(plan)
        except BaseException:
            drop_listing(plan.listing)
            raise
    return None


def _published_nothing(plan: RunPlan, own: RunReport) -> RunReport:
    """After the pipeline raised, this run's report, which its commit wrote before it
    raised so that the job ends failed (``transforms.commit_step.RunFailed``); no retry
    follows here, so what it kept for one (after commit_failed) goes, but for what it
    kept of the old dataset while no new manifest is published."""
    _log.info("The run published nothing: %s", own.status.value)
    try:
        remove_run_folder(plan.target.output, plan.target.temp_dir)
    except Exception as cleanup:  # pylint: disable=broad-except
        _log.warning("Could not remove %s: %s", plan.target.temp_dir, cleanup)
    return own
