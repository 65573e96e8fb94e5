"""The Dataflow job an output's lock names, and the two questions asked of the
Dataflow API about it: its state (``jobs.get``) and, when ``convert`` is
interrupted, its cancellation (``jobs.update`` with ``requestedState``).

A lock that names a Dataflow job (``transforms.io.commit``) is taken over only
when that job has ended: ``ENDED_STATES``, the states in which no worker of it
runs any more (Beam's terminal ``PipelineState``\\ s). A job that is cancelling,
draining or cleaning up its resources has not ended. A job that cannot be asked
about (no credentials, the API refuses or cannot be reached, a 404) is never
taken to have ended.

Each question is one request with a time limit and no retry (``DataflowApi``):
Beam's own client (``apache_beam.runners.dataflow.internal.apiclient``) builds
the same ``JobsV1Beta3Client`` of ``google-cloud-dataflow-client`` but retries a
failing ``get_job`` for minutes. The API is reached over REST at
``--dataflow_endpoint`` (Beam's option; Google's endpoint by default), as whoever
the application-default credentials name, or anonymously with ``--no_auth``
(Beam's testing switch, which the tests use against a fake of the API on
loopback).
"""

from __future__ import annotations

import dataclasses
import re

__all__ = [
    "ENDED_STATES",
    "DataflowApi",
    "DataflowJob",
    "JobQueryError",
    "cancel_job",
    "flex_launch_job_id",
    "job_state",
]

# The states in which the job has stopped for good (no worker runs). Anything else,
# including a state this code does not know, counts as running.
ENDED_STATES = frozenset({
    "JOB_STATE_DONE", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_UPDATED",
    "JOB_STATE_DRAINED",
})
DEFAULT_ENDPOINT = "https://dataflow.googleapis.com"
_TIMEOUT_SECONDS = 30.0
# What a lock may name (it is read from storage: nothing else reaches a request's path).
_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
_PROJECT = re.compile(r"[a-z][a-z0-9.:-]{0,99}")
_REGION = re.compile(r"[a-z][a-z0-9-]{0,62}")


# Where a Flex Template launch has the program write its job (``--template_location``):
# ``gs://STAGING/template_launches/<job id>/job_object``; the job exists already.
_FLEX_LAUNCH = re.compile(r"^gs://.+/template_launches/([A-Za-z0-9_-]{1,128})/[^/]+$")


def flex_launch_job_id(template_location: str | None) -> str:
    """The id of the job a Flex Template launch runs this program for, read from the
    ``--template_location`` its launcher passes (``.../template_launches/<job
    id>/job_object``: Dataflow creates the job before it starts the launcher, and
    names the launch's folder by it); ``''`` for anything else (no template, or a
    classic template being created)."""
    match = _FLEX_LAUNCH.match(template_location or "")
    return match.group(1) if match else ""


class JobQueryError(RuntimeError):
    """The Dataflow API could not be asked, or did not answer, about a job."""


@dataclasses.dataclass(frozen=True)
class DataflowJob:
    """A Dataflow job, or (``job_id`` empty) the one a launcher is submitting.

    Attributes:
      project: the Google Cloud project the job runs in.
      region: its regional endpoint (``us-central1``).
      job_id: what Dataflow answered on submission; ``''`` before.
    """

    project: str
    region: str
    job_id: str = ""

    @property
    def console_url(self) -> str:
        """The job's page in the Google Cloud console."""
        return (f"https://console.cloud.google.com/dataflow/jobs/{self.region}/{self.job_id}"
                f"?project={self.project}")

    @property
    def cancel_command(self) -> str:
        """The ``gcloud`` command that cancels it."""
        return f"gcloud dataflow jobs cancel {self.job_id} --region {self.region} --project {self.project}"

    def describe(self) -> str:
        """``Dataflow job ID (project P, region R)``."""
        return f"Dataflow job {self.job_id or '(not yet created)'} (project {self.project}, region {self.region})"

    def to_json(self) -> dict[str, str]:
        return {"project": self.project, "region": self.region, "job_id": self.job_id}

    @classmethod
    def from_json(cls, value: object) -> DataflowJob | None:
        """The job a lock's ``dataflow`` entry names; ``None`` when it is not one
        (missing fields, or a name that is not a Dataflow project, region or id)."""
        if not isinstance(value, dict):
            return None
        project, region, job_id = (value.get(k) for k in ("project", "region", "job_id"))
        if not all(isinstance(v, str) for v in (project, region, job_id)):
            return None
        if job_id == "":  # Still being submitted: nothing is asked of the API about it.
            return cls(project[:100], region[:63])
        if not (_PROJECT.fullmatch(project) and _REGION.fullmatch(region) and _JOB_ID.fullmatch(job_id)):
            return None
        return cls(project, region, job_id)


@dataclasses.dataclass(frozen=True)
class DataflowApi:
    """Where and as whom the Dataflow API is asked.

    Attributes:
      endpoint: the API's root URL (Beam's ``--dataflow_endpoint``).
      anonymous: no credentials (Beam's ``--no_auth``, for tests).
      timeout: seconds one request may take.
    """

    endpoint: str = DEFAULT_ENDPOINT
    anonymous: bool = False
    timeout: float = _TIMEOUT_SECONDS

    @classmethod
    def from_options(cls, options) -> DataflowApi:
        """The API as Beam's ``PipelineOptions`` name it (``--dataflow_endpoint``, ``--no_auth``)."""
        from apache_beam.options.pipeline_options import (  # pylint: disable=import-outside-toplevel
            GoogleCloudOptions,
        )

        cloud = options.view_as(GoogleCloudOptions)
        return cls((cloud.dataflow_endpoint or DEFAULT_ENDPOINT).strip(), bool(cloud.no_auth))


def _client(api: DataflowApi):
    # pylint: disable=import-outside-toplevel
    import google.auth
    from google.api_core.client_options import ClientOptions
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import dataflow_v1beta3

    if api.anonymous:
        credentials = AnonymousCredentials()
    else:
        try:
            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
        except auth_exceptions.DefaultCredentialsError as err:
            raise JobQueryError(f"no Google credentials on this machine ({_first_line(err)})") from None
    return dataflow_v1beta3.JobsV1Beta3Client(
        credentials=credentials, transport="rest",
        client_options=ClientOptions(api_endpoint=api.endpoint.rstrip("/")))


def _first_line(err: BaseException) -> str:
    from google.api_core import exceptions  # pylint: disable=import-outside-toplevel

    if isinstance(err, exceptions.GoogleAPICallError):  # Without the request's URL (REST puts it first).
        message = re.sub(r"^[A-Z]+ \S+: ", "", str(err.message or ""))
        return f"{type(err).__name__}: {err.code} {message}"[:300]
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__


def _ask(job: DataflowJob, api: DataflowApi, call: str, /, **fields) -> str:
    """One request about ``job`` (``get_job`` or ``update_job``); the state it answered."""
    if not job.job_id:
        raise JobQueryError("the lock names no job id (the launcher stopped while submitting)")
    client = _client(api)
    try:
        answer = getattr(client, call)(request={"project_id": job.project, "location": job.region,
                                                "job_id": job.job_id, **fields},
                                       retry=None, timeout=api.timeout)
    except Exception as err:  # pylint: disable=broad-except
        # Any failure (refused, not found, unreachable, credentials that do not
        # refresh) means the same here: the job's state is not known.
        raise JobQueryError(_first_line(err)) from None
    finally:
        client.transport.close()
    return answer.current_state.name if answer.current_state is not None else "JOB_STATE_UNKNOWN"


def job_state(job: DataflowJob, api: DataflowApi) -> str:
    """The job's current state (``JOB_STATE_RUNNING``, ...), from one ``jobs.get``.

    Raises:
      JobQueryError: when the API cannot be asked or does not answer.
    """
    return _ask(job, api, "get_job", view="JOB_VIEW_SUMMARY")


def cancel_job(job: DataflowJob, api: DataflowApi) -> str:
    """Asks Dataflow to cancel the job (one ``jobs.update`` with ``requestedState:
    JOB_STATE_CANCELLED``); returns the state it answered (usually not yet ended:
    workers take a while to stop).

    Raises:
      JobQueryError: when the API cannot be asked or refused.
    """
    return _ask(job, api, "update_job", job={"requested_state": "JOB_STATE_CANCELLED"})
