"""A fake of the Dataflow API's jobs resource (v1b3, REST/JSON) on loopback.

Dataflow cannot run here. This server answers the requests a launcher makes about
jobs, in the JSON the REST API speaks, so that the real clients run against it:
Beam's ``DataflowRunner`` (``apiclient.DataflowApplicationClient`` sends REST
when ``--dataflow_endpoint`` names ``localhost``) and ``transforms.io.dataflow_jobs``.

===========================================================  ==========================
request                                                      answer
===========================================================  ==========================
``POST   /v1b3/projects/P/locations/R/jobs``                 the job, new id, RUNNING
``GET    /v1b3/projects/P/locations/R/jobs/ID``               the job (jobs.get)
``PUT    /v1b3/projects/P/locations/R/jobs/ID``               jobs.update: a
                                                             ``requestedState`` of
                                                             CANCELLED moves the job to
                                                             ``cancel_to``
``GET    /v1b3/projects/P/locations/R/jobs/ID/messages``      no messages
===========================================================  ==========================

Enums are answered as numbers when the client asks for them so
(``$alt=json;enum-encoding=int``, as google-cloud-dataflow-client does), by name
otherwise; an unknown job is a 404 in Google's error format. ``refuse = 403``
makes every request fail so (credentials without ``dataflow.jobs.get``), or only
those of ``refuse_method``.
A job's state is what the test sets (``set_state``): nothing runs.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.cloud.dataflow_v1beta3 import JobState

__all__ = ["FakeDataflow"]

_JOBS = re.compile(r"/v1b3/projects/([^/]+)/locations/([^/]+)/jobs(?:/([^/:]+))?(/messages)?")
_STATUS = {403: "PERMISSION_DENIED", 404: "NOT_FOUND", 400: "INVALID_ARGUMENT"}


class FakeDataflow:
    """The server (started on construction, on 127.0.0.1) and what it was asked.

    Attributes:
      url: the endpoint to give as ``--dataflow_endpoint`` (``http://localhost:PORT``).
      jobs: ``{job id: job JSON}`` (states by name).
      requests: ``(method, path, body)`` of every request, in order.
      refuse: an HTTP status every request gets instead of its answer (0: none).
      refuse_method: when set, only requests of this method are refused.
      cancel_to: the state a cancel request moves a job to.
    """

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict]] = []
        self.refuse = 0
        self.refuse_method = ""
        self.cancel_to = "JOB_STATE_CANCELLED"
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://localhost:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_job(self, project: str, region: str, state: str = "JOB_STATE_RUNNING") -> str:
        """A job as if submitted; returns its id."""
        with self._lock:
            job_id = f"2026-11-30_01_02_{next(self._ids):02d}-8041155463276813457"
            self.jobs[job_id] = {"id": job_id, "projectId": project, "location": region,
                                 "name": f"beamapp-test-{job_id[-4:]}", "type": "JOB_TYPE_BATCH",
                                 "currentState": state}
        return job_id

    def set_state(self, job_id: str, state: str) -> None:
        with self._lock:
            self.jobs[job_id]["currentState"] = state

    def state(self, job_id: str) -> str:
        with self._lock:
            return self.jobs[job_id]["currentState"]

    def asked(self, method: str, job_id: str = "") -> list[dict]:
        """The bodies of the requests ``method`` about ``job_id`` (any job when '')."""
        return [body for m, path, body in self.requests
                if m == method and (not job_id or path.split("?")[0].endswith(f"/jobs/{job_id}"))]

    def _answer(self, method: str, path: str, body: dict) -> tuple[int, dict]:
        match = _JOBS.fullmatch(path)
        if not match:
            return 404, _error(404, f"no such resource: {path}")
        project, region, job_id, messages = match.groups()
        if method == "POST" and job_id is None:
            job_id = self.add_job(project, region)
            with self._lock:
                self.jobs[job_id]["name"] = body.get("name", self.jobs[job_id]["name"])
                return 200, dict(self.jobs[job_id])
        with self._lock:
            job = self.jobs.get(job_id or "")
            if job is None or (job["projectId"], job["location"]) != (project, region):
                return 404, _error(404, f"(2c1b) Could not find job {job_id} in {region}")
            if messages:
                return 200, {"jobMessages": []}
            if method == "PUT":
                requested = body.get("requestedState")
                if requested in ("JOB_STATE_CANCELLED", JobState.JOB_STATE_CANCELLED.value):
                    job["requestedState"] = "JOB_STATE_CANCELLED"
                    if job["currentState"] not in ("JOB_STATE_DONE", "JOB_STATE_FAILED"):
                        job["currentState"] = self.cancel_to
                else:
                    return 400, _error(400, f"cannot request state {requested!r}")
            elif method != "GET":
                return 400, _error(400, f"{method} not served")
            return 200, dict(job)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # pylint: disable=arguments-differ
                pass

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else {}
                path, _, query = self.path.partition("?")
                fake.requests.append((method, self.path, body))
                refused = fake.refuse and fake.refuse_method in ("", method)
                code, answer = ((fake.refuse, _error(fake.refuse, "the caller does not have permission"))
                                if refused else fake._answer(method, path, body))  # pylint: disable=protected-access
                if "enum-encoding=int" in urllib.parse.unquote(query):
                    answer = {k: JobState[v].value if k in ("currentState", "requestedState") else v
                              for k, v in answer.items()}
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802
                self._serve("GET")

            def do_POST(self):  # noqa: N802
                self._serve("POST")

            def do_PUT(self):  # noqa: N802
                self._serve("PUT")

        return Handler


def _error(code: int, message: str) -> dict:
    return {"error": {"code": code, "message": message, "status": _STATUS.get(code, "UNKNOWN")}}
