"""A real GCS JSON API on loopback for ``gs://`` tests: ``gcp-storage-emulator``.

Use it from a test module with
``from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture`` (pytest finds
fixtures imported into a test module; they register as ``gcs_emulator`` and
``gcs``), or list ``"tests.harness.gcs_emulator"`` in ``pytest_plugins`` of the root conftest.

``gcs_emulator`` (session scope) starts the emulator (in memory) as a subprocess
on 127.0.0.1 at a free port, waits until it answers, and for the session sets

- ``STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT``: Beam's GCS filesystem (and
  every google-cloud-storage client without an explicit endpoint) talks to it;
- ``NO_GCE_CHECK=true``: google-auth never probes the metadata server;
- Beam's credential cache of this process set to "anonymous"
  (``transforms.io.gcs.use_anonymous_credentials``), so no GCS call waits ~20 s on
  ``google.auth.default()`` retries. Worker processes get the same by importing
  ``transforms.io.gcs`` (``--beam_plugin beam_tfrecords.transforms.io.gcs``), which does it whenever
  ``STORAGE_EMULATOR_HOST`` is set.

All of it is restored afterwards, and the emulator is always stopped: by the
fixture's teardown, by ``atexit``, and, if this process dies without either,
by the emulator itself (it exits when its parent process goes away).

``gcs`` (function scope) is the same object with a watchdog: a test that runs
longer than ``GCS_TEST_TIMEOUT`` seconds (default 300) dumps every thread's
stack and ends the test process instead of hanging.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import faulthandler
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

__all__ = ["GcsEmulator", "gcs_emulator_fixture", "gcs_fixture", "split_gs"]

START_TIMEOUT_SECONDS = 30
REQUEST_TIMEOUT_SECONDS = 30
TEST_TIMEOUT_SECONDS = float(os.environ.get("GCS_TEST_TIMEOUT", "300"))

# Runs in the emulator's process: serves until stdin closes (the parent died or
# closed it) or the parent process changes; then exits.
_BOOT = r"""
import os, sys, threading, time
from gcp_storage_emulator.server import create_server
host, port, data_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parent = os.getppid()
server = create_server(host, port, in_memory=True, data_dir=data_dir)
server.start()
print("ready", flush=True)
def watch_stdin():
    sys.stdin.read()
    os._exit(0)
threading.Thread(target=watch_stdin, daemon=True).start()
while os.getppid() == parent:
    time.sleep(0.5)
os._exit(0)
"""


def split_gs(path: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` to ``("bucket", "a/b")``."""
    if not path.startswith("gs://"):
        raise ValueError(f"not a gs:// path: {path}")
    bucket, _, name = path[len("gs://"):].partition("/")
    return bucket, name


def _reset_helper_pool() -> None:
    """Stops the shard writer's process-wide helper pool, if one is running.

    Its processes keep the environment they were spawned with: helpers started by
    an earlier test, before ``STORAGE_EMULATOR_HOST`` was set, would send gs://
    reads to the real GCS (and probe the metadata server), and helpers started
    during this session would keep pointing at a stopped emulator. The next
    conversion spawns fresh ones.
    """
    from beam_tfrecords.transforms.io import helpers as encode  # pylint: disable=import-outside-toplevel

    # pylint: disable=protected-access
    with encode._pool_lock:
        pool, encode._pool, encode._pool_size = encode._pool, None, 0
        encode._warmups.clear()
    if pool is not None:
        pool.shutdown(wait=True, cancel_futures=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GcsEmulator:
    """A running emulator and helpers that use google-cloud-storage (anonymous) on it."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.port: int | None = None
        self.url: str | None = None
        self.process: subprocess.Popen | None = None
        self._log = None
        self._client = None
        self._saved_env: dict[str, str | None] = {}
        self._saved_gce_check = None
        self._saved_creds = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> GcsEmulator:
        last_error = None
        for _ in range(3):  # A free port can be taken between probe and bind: retry.
            try:
                self._start_once(_free_port())
                return self
            except RuntimeError as err:
                last_error = err
                self._kill()
        raise RuntimeError(f"gcp-storage-emulator did not start: {last_error}")

    def _start_once(self, port: int) -> None:
        self._log = open(os.path.join(self.workdir, f"emulator-{port}.log"), "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BOOT, "127.0.0.1", str(port), self.workdir],
            stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT,
            cwd=self.workdir, start_new_session=True,
        )
        atexit.register(self._kill)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with {self.process.returncode}; see {self._log.name}")
            try:
                with urllib.request.urlopen(f"{url}/storage/v1/b?project=test", timeout=1) as r:
                    if r.status == 200:
                        self.port, self.url = port, url
                        return
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)
        raise RuntimeError(f"no answer on {url} within {START_TIMEOUT_SECONDS} s")

    def _kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=3)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self) -> None:
        self.restore_environment()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        self._kill()

    def set_environment(self) -> None:
        """``STORAGE_EMULATOR_HOST``, ``NO_GCE_CHECK`` and Beam's anonymous credentials."""
        _reset_helper_pool()
        for key, value in (("STORAGE_EMULATOR_HOST", self.url), ("NO_GCE_CHECK", "true")):
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        # google-auth reads NO_GCE_CHECK when its metadata module is imported.
        from google.auth.compute_engine import _metadata  # pylint: disable=import-outside-toplevel

        self._saved_gce_check = _metadata._NO_GCE_CHECK  # pylint: disable=protected-access
        _metadata._NO_GCE_CHECK = True  # pylint: disable=protected-access
        from apache_beam.internal.gcp import auth  # pylint: disable=import-outside-toplevel

        creds = auth._Credentials  # pylint: disable=protected-access
        self._saved_creds = (creds._credentials_init, creds._credentials)  # pylint: disable=protected-access
        with creds._credentials_lock:  # pylint: disable=protected-access
            creds._credentials_init, creds._credentials = False, None  # pylint: disable=protected-access
        from beam_tfrecords.transforms.io import (
            gcs as gcs_module,
        )  # pylint: disable=import-outside-toplevel

        gcs_module._gcsio = None  # pylint: disable=protected-access  # Made before: real GCS.
        gcs_module.use_anonymous_credentials()

    def restore_environment(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()
        if self._saved_gce_check is not None:
            from google.auth.compute_engine import _metadata  # pylint: disable=import-outside-toplevel

            _metadata._NO_GCE_CHECK = self._saved_gce_check  # pylint: disable=protected-access
            self._saved_gce_check = None
        if self._saved_creds is not None:
            # pylint: disable=import-outside-toplevel,protected-access
            from apache_beam.internal.gcp import auth

            from beam_tfrecords.transforms.io import gcs as gcs_module

            creds = auth._Credentials
            with creds._credentials_lock:
                creds._credentials_init, creds._credentials = self._saved_creds
            gcs_module._gcsio = None  # pylint: disable=protected-access  # Its client is anonymous.
            self._saved_creds = None
        _reset_helper_pool()

    # -- helpers -----------------------------------------------------------------

    @property
    def client(self):
        """A google-cloud-storage client on the emulator, anonymous (created once)."""
        if self._client is None:
            # pylint: disable=import-outside-toplevel
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials
            from google.cloud import storage

            self._client = storage.Client(
                project="test", credentials=AnonymousCredentials(),
                client_options=ClientOptions(api_endpoint=self.url),
            )
        return self._client

    def create_bucket(self, name: str) -> str:
        """Creates the bucket (if missing); returns ``gs://name``."""
        from google.api_core.exceptions import Conflict  # pylint: disable=import-outside-toplevel

        with contextlib.suppress(Conflict):
            self.client.create_bucket(name, timeout=REQUEST_TIMEOUT_SECONDS)
        return f"gs://{name}"

    def _blob(self, gs_path: str):
        bucket, name = split_gs(gs_path)
        return self.client.bucket(bucket).blob(name)

    def upload_bytes(self, gs_path: str, data: bytes) -> None:
        """Writes one object (its bucket is created if missing)."""
        self.create_bucket(split_gs(gs_path)[0])
        self._blob(gs_path).upload_from_string(
            data, content_type="application/octet-stream", timeout=REQUEST_TIMEOUT_SECONDS)

    def upload_tree(self, local_dir: str, gs_prefix: str) -> list[str]:
        """Uploads every file under ``local_dir`` to ``gs_prefix/<relative path>``.

        Returns:
          The ``gs://`` paths written, sorted.
        """
        written = []
        for folder, _, names in os.walk(local_dir):
            for name in names:
                local = os.path.join(folder, name)
                rel = os.path.relpath(local, local_dir).replace(os.sep, "/")
                target = f"{gs_prefix.rstrip('/')}/{rel}"
                with open(local, "rb") as f:
                    self.upload_bytes(target, f.read())
                written.append(target)
        return sorted(written)

    def download(self, gs_path: str) -> bytes:
        """The object's bytes."""
        return self._blob(gs_path).download_as_bytes(timeout=REQUEST_TIMEOUT_SECONDS, checksum=None)

    def exists(self, gs_path: str) -> bool:
        return self._blob(gs_path).exists(timeout=REQUEST_TIMEOUT_SECONDS)

    def list(self, gs_prefix: str) -> list[str]:
        """``gs://`` paths of the objects whose names start with the prefix, sorted."""
        bucket, prefix = split_gs(gs_prefix)
        blobs = self.client.list_blobs(bucket, prefix=prefix or None, timeout=REQUEST_TIMEOUT_SECONDS)
        return sorted(f"gs://{bucket}/{b.name}" for b in blobs)

    def object_metadata(self, gs_path: str) -> dict:
        """The object's resource as the emulator reports it, plus ``crc32c_hex``.

        Keys include ``name``, ``bucket``, ``size`` (int), ``crc32c`` (GCS's base64),
        ``crc32c_hex`` (8 hex digits), ``md5Hash``, ``generation``, ``contentType``.

        Raises:
          FileNotFoundError: when the object does not exist.
        """
        bucket, name = split_gs(gs_path)
        blob = self.client.bucket(bucket).get_blob(name, timeout=REQUEST_TIMEOUT_SECONDS)
        if blob is None:
            raise FileNotFoundError(gs_path)
        meta = dict(blob._properties)  # pylint: disable=protected-access
        meta["size"] = int(meta["size"]) if "size" in meta else None
        crc = meta.get("crc32c")
        meta["crc32c_hex"] = base64.b64decode(crc).hex() if crc else None
        return meta

    def overwrite_object(self, gs_path: str, data: bytes) -> None:
        """Replaces an existing object's bytes (a new generation), as a corruption would."""
        if not self.exists(gs_path):
            raise FileNotFoundError(gs_path)
        self.upload_bytes(gs_path, data)

    def delete(self, gs_path: str) -> None:
        self._blob(gs_path).delete(timeout=REQUEST_TIMEOUT_SECONDS)


@pytest.fixture(scope="session", name="gcs_emulator")
def gcs_emulator_fixture(tmp_path_factory) -> Iterator[GcsEmulator]:
    """The running emulator, with the environment set for the session (see module doc)."""
    emulator = GcsEmulator(str(tmp_path_factory.mktemp("gcs-emulator")))
    try:
        emulator.start()
        emulator.set_environment()
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(name="gcs")
def gcs_fixture(gcs_emulator) -> Iterator[GcsEmulator]:
    """``gcs_emulator`` for one test, which is ended (with stacks dumped) if it hangs."""
    faulthandler.dump_traceback_later(TEST_TIMEOUT_SECONDS, exit=True)
    try:
        yield gcs_emulator
    finally:
        faulthandler.cancel_dump_traceback_later()
