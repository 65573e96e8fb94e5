"""``tests/harness/fault_proxy.py`` against the real emulator and google-cloud-storage.

Every client here reaches the emulator through the proxy only because
``STORAGE_EMULATOR_HOST`` names the proxy (no explicit endpoint); what the
emulator holds is read back directly (``gcs.download``, not through the proxy).
Each test shows a fault firing (the rule's counter, the proxy's log) and what the
client makes of it. Log assertions look only at the requests on the test's object:
google-cloud-storage 3.17 also sends ``GET /storage/v1/b/BUCKET?projection=noAcl``
from a background thread (its bucket-metadata cache) at a moment of its choosing.
Retries are made fast (``FAST_RETRY``) and every call has a ``timeout``: the
client's default retry would wait up to 120 s (Beam's ``GcsIO`` keeps its own
default retry here: about 1 s per fault).
"""

from __future__ import annotations

import gc
import io
import os
import socket
import time
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.exceptions import InvalidResponse
from google.cloud.storage.retry import DEFAULT_RETRY

from tests.harness.fault_proxy import (
    FaultProxy,
    RequestInfo,
    any_request,
    methods,
    object_name_contains,
    object_name_of,
    upload_completions,
)
from tests.harness.gcs_emulator import gcs_emulator_fixture, gcs_fixture  # noqa: F401  (fixtures)

BUCKET = "fault-proxy"
TIMEOUT = 10  # Seconds, for each client request.
CHUNK = 256 * 1024  # Resumable chunk size (the smallest GCS allows).
# A BlobWriter whose close() failed tries again when garbage-collected and raises
# ("Upload is in an invalid state"): tests that make one fail collect it themselves,
# under this filter, so pytest does not report it against a later test.
UNRAISABLE_FAILED_WRITER = "ignore:Exception ignored in.*BlobWriter:pytest.PytestUnraisableExceptionWarning"
FAST_RETRY = DEFAULT_RETRY.with_delay(initial=0.02, maximum=0.1, multiplier=2).with_timeout(5)


@pytest.fixture
def proxy(gcs, monkeypatch):
    """A FaultProxy in front of the emulator, named by STORAGE_EMULATOR_HOST for this test."""
    gcs.create_bucket(BUCKET)
    with FaultProxy(gcs.url, upstream_timeout=TIMEOUT) as fault_proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", fault_proxy.url)
        yield fault_proxy
        assert fault_proxy.upstream_errors == []  # Every request reached the emulator and back.


@pytest.fixture
def client(proxy):
    """An anonymous google-cloud-storage client; its endpoint comes from STORAGE_EMULATOR_HOST."""
    storage_client = storage.Client(project="test", credentials=AnonymousCredentials())
    assert storage_client.api_endpoint == proxy.url
    yield storage_client
    storage_client.close()


def _blob(client, name: str, chunk_size: int | None = None):
    return client.bucket(BUCKET).blob(name, chunk_size=chunk_size)


def _write_resumable(client, name: str, data: bytes, retry=FAST_RETRY) -> None:
    """Writes like Beam's GCS filesystem does: a BlobWriter (resumable upload, CHUNK-sized PUTs)."""
    with _blob(client, name).open("wb", chunk_size=CHUNK, retry=retry, timeout=TIMEOUT) as f:
        f.write(data)


def _entries(proxy, name: str):
    """(method, outcome) of the logged requests on object ``name``, in order."""
    return [(e.method, e.outcome) for e in proxy.log if e.object_name == name]


def _info(method: str, target: str, headers: dict) -> RequestInfo:
    parts = urlsplit(target)
    return RequestInfo(method, target, parts.path, parse_qs(parts.query), headers, object_name_of(target))


# -- no emulator -------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("target, name", [
    ("/storage/v1/b/bk/o/dir%2Fa%20b.bin?alt=json", "dir/a b.bin"),
    ("/storage/v1/b/bk/o/dir/a%20b+c.bin", "dir/a b+c.bin"),  # "/" left unencoded by the client.
    ("/download/storage/v1/b/bk/o/x%2Fy.tfrecord?generation=1&alt=media", "x/y.tfrecord"),
    ("/upload/storage/v1/b/bk/o?uploadType=resumable&name=x%2Fy+z", "x/y z"),
    ("/storage/v1/b/bk/o/src%2Fa/copyTo/b/other/o/dst", "src/a"),
    ("/storage/v1/b/bk/o/a%2Fb/acl", "a/b"),
    ("/upload/storage/v1/b/bk/o?uploadType=multipart", None),
    ("/storage/v1/b/bk?projection=noAcl", None),
    ("/storage/v1/b/bk/o?prefix=a", None),
])
def test_object_name_of(target, name):
    assert object_name_of(target) == name


@pytest.mark.unit
@pytest.mark.parametrize("method, target, content_range, completes", [
    ("POST", "/upload/storage/v1/b/bk/o?uploadType=multipart", None, True),
    ("POST", "/upload/storage/v1/b/bk/o?uploadType=resumable", None, False),  # Opens a session.
    ("PUT", "/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u", "bytes 0-262143/*", False),
    ("PUT", "/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u", "bytes 262144-299999/300000", True),
    ("PUT", "/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u", "bytes 0-9/20", False),
    ("PUT", "/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u", "bytes */20", True),
    ("PUT", "/upload/storage/v1/b/bk/o?uploadType=resumable&upload_id=u", None, True),
    ("GET", "/download/storage/v1/b/bk/o/x?alt=media", None, False),
])
def test_upload_completions(method, target, content_range, completes):
    headers = {"content-range": content_range} if content_range else {}
    info = _info(method, target, headers)
    assert upload_completions()(info) is completes


@pytest.mark.unit
@pytest.mark.parametrize("upstream", ["http://10.0.0.1:80", "http://storage.googleapis.com:80",
                                      "https://127.0.0.1:443", "http://127.0.0.1"])
def test_upstream_must_be_loopback_http(upstream):
    with pytest.raises(ValueError, match=r"upstream must be (a loopback address|http://HOST:PORT), not '"):
        FaultProxy(upstream)


# -- through the emulator ------------------------------------------------------------------


@pytest.mark.emulator
def test_round_trip_without_faults_is_byte_identical(gcs, proxy, client):
    small, large = os.urandom(100_000), os.urandom(3 * CHUNK + 12345)
    _blob(client, "clean/small.bin").upload_from_string(small, timeout=TIMEOUT, retry=FAST_RETRY)
    _write_resumable(client, "clean/dir/large one.bin", large)

    assert _blob(client, "clean/small.bin").download_as_bytes(timeout=TIMEOUT) == small
    assert _blob(client, "clean/dir/large one.bin").download_as_bytes(timeout=TIMEOUT) == large
    # Ranged (206) downloads, as BlobReader makes them.
    with _blob(client, "clean/dir/large one.bin").open("rb", chunk_size=CHUNK, timeout=TIMEOUT) as f:
        assert f.read() == large
    assert gcs.download(f"gs://{BUCKET}/clean/small.bin") == small
    assert gcs.download(f"gs://{BUCKET}/clean/dir/large one.bin") == large

    log = proxy.log
    assert proxy.faults() == []
    assert all(isinstance(e.outcome, int) for e in log)
    # One session: the POST that opens it, 4 PUTs (308 308 308 200), named through its upload_id.
    assert _entries(proxy, "clean/dir/large one.bin")[:5] == [
        ("POST", 200), ("PUT", 308), ("PUT", 308), ("PUT", 308), ("PUT", 200)]
    assert {e.outcome for e in log if e.method == "GET" and "alt=media" in e.target} <= {200, 206}


@pytest.mark.emulator
def test_chunked_request_body_is_forwarded(gcs, proxy):
    """A media upload whose body is sent chunked (no Content-Length), by plain requests."""
    data = os.urandom(700_000)
    pieces = (data[i:i + 50_000] for i in range(0, len(data), 50_000))
    response = requests.post(f"{proxy.url}/upload/storage/v1/b/{BUCKET}/o",
                             params={"uploadType": "media", "name": "chunked/body.bin"},
                             data=pieces, headers={"Content-Type": "application/octet-stream"},
                             timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "chunked/body.bin"
    entry = proxy.log[-1]
    assert entry.headers.get("transfer-encoding") == "chunked"
    assert "content-length" not in entry.headers
    assert gcs.download(f"gs://{BUCKET}/chunked/body.bin") == data


@pytest.mark.emulator
@pytest.mark.parametrize("status", [503, 429])
def test_status_burst_on_upload_is_survived_by_client_retries(gcs, proxy, client, status):
    data = os.urandom(200_000)
    name = f"burst/{status}.bin"
    rule = proxy.status_burst(status, 2, match=object_name_contains(name))
    _blob(client, name).upload_from_string(data, timeout=TIMEOUT, retry=FAST_RETRY)

    assert rule.fired == 2 and not rule.active
    assert _entries(proxy, name) == [("POST", f"status_burst:{status}")] * 2 + [("POST", 200)]
    assert gcs.download(f"gs://{BUCKET}/{name}") == data
    assert _blob(client, name).download_as_bytes(timeout=TIMEOUT) == data


@pytest.mark.emulator
def test_status_burst_answer_is_a_json_error_and_not_forwarded(gcs, proxy):
    rule = proxy.status_burst(503, 1, match=methods("GET"))
    response = requests.get(f"{proxy.url}/storage/v1/b/{BUCKET}", timeout=TIMEOUT)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == 503
    assert rule.fired == 1
    assert requests.get(f"{proxy.url}/storage/v1/b/{BUCKET}", timeout=TIMEOUT).status_code == 200
    assert [e.outcome for e in proxy.log] == ["status_burst:503", 200]


@pytest.mark.emulator
def test_outage_on_one_object_fails_calls_until_removed(gcs, proxy, client):
    data = b"outage" * 1000
    gcs.upload_bytes(f"gs://{BUCKET}/outage/down.bin", data)
    gcs.upload_bytes(f"gs://{BUCKET}/outage/fine.bin", data)
    rule = proxy.outage(match=object_name_contains("outage/down.bin"))

    # No retry: the first 503 is the answer.
    with pytest.raises(api_exceptions.ServiceUnavailable, match="injected by FaultProxy: outage"):
        _blob(client, "outage/down.bin").download_as_bytes(timeout=TIMEOUT, retry=None)
    with pytest.raises(api_exceptions.ServiceUnavailable, match="injected by FaultProxy: outage"):
        _blob(client, "outage/down.bin").upload_from_string(b"new", timeout=TIMEOUT, retry=None)
    assert rule.fired == 2
    # With a retry: attempts until its timeout, then RetryError.
    start = time.monotonic()
    with pytest.raises(api_exceptions.RetryError, match=r"Timeout of [\d.]+s exceeded, last exception: .*503"):
        _blob(client, "outage/down.bin").download_as_bytes(timeout=TIMEOUT, retry=FAST_RETRY.with_timeout(0.5))
    assert time.monotonic() - start < 5
    assert rule.fired > 2
    # Other objects are not affected.
    assert _blob(client, "outage/fine.bin").download_as_bytes(timeout=TIMEOUT, retry=None) == data

    proxy.remove(rule)
    assert _blob(client, "outage/down.bin").download_as_bytes(timeout=TIMEOUT, retry=None) == data
    fired = rule.fired
    assert all(o == "outage:503" for m, o in _entries(proxy, "outage/down.bin")[:fired])
    assert gcs.download(f"gs://{BUCKET}/outage/down.bin") == data  # The upload never got through.


@pytest.mark.filterwarnings(UNRAISABLE_FAILED_WRITER)
@pytest.mark.emulator
@pytest.mark.parametrize("writer, error", [
    ("blob_writer", InvalidResponse),                # blob.open("wb"), as Beam's GcsIO writes.
    ("upload_from_file", api_exceptions.NotFound),   # No size given: resumable.
])
def test_reset_after_forward_of_resumable_final_put_stores_object_but_client_gets_404(
        gcs, proxy, client, writer, error):
    """The emulator forgets a finished session: the client's retried last PUT gets 404
    (real GCS would answer 200 with the object), so the write fails though the object is stored."""
    data = os.urandom(2 * CHUNK + 4321)
    name = f"reset/resumable-{writer}.bin"
    rule = proxy.reset_after_forward(1, match=object_name_contains(name) & upload_completions())

    with pytest.raises(error, match="Request failed with status code', 404"):
        if writer == "blob_writer":
            _write_resumable(client, name, data)
        else:
            _blob(client, name, chunk_size=CHUNK).upload_from_file(
                io.BytesIO(data), timeout=TIMEOUT, retry=FAST_RETRY)
    gc.collect()  # The failed writer (see UNRAISABLE_FAILED_WRITER).

    assert rule.fired == 1
    assert _entries(proxy, name) == [("POST", 200), ("PUT", 308), ("PUT", 308),
                                     ("PUT", "reset_after_forward:200"), ("PUT", 404)]
    assert gcs.download(f"gs://{BUCKET}/{name}") == data


@pytest.mark.emulator
def test_reset_after_forward_of_multipart_upload(gcs, proxy, client):
    data = os.urandom(50_000)
    name = "reset/multipart.bin"
    match = object_name_contains(name) & upload_completions()

    # No retry: the client sees the reset; the object is stored all the same.
    rule = proxy.reset_after_forward(1, match=match)
    with pytest.raises(requests.exceptions.ConnectionError, match=r"Connection aborted\..*Connection reset by peer") as caught:
        _blob(client, name).upload_from_string(data, timeout=TIMEOUT, retry=None)
    assert "Connection aborted" in str(caught.value)
    assert rule.fired == 1
    first = gcs.object_metadata(f"gs://{BUCKET}/{name}")
    assert gcs.download(f"gs://{BUCKET}/{name}") == data

    # With a retry: the POST is simply sent again, a new generation.
    rule = proxy.reset_after_forward(1, match=match)
    _blob(client, name).upload_from_string(data, timeout=TIMEOUT, retry=FAST_RETRY)
    assert rule.fired == 1
    assert _entries(proxy, name)[-2:] == [("POST", "reset_after_forward:200"), ("POST", 200)]
    assert int(gcs.object_metadata(f"gs://{BUCKET}/{name}")["generation"]) != int(first["generation"])
    assert gcs.download(f"gs://{BUCKET}/{name}") == data


@pytest.mark.emulator
def test_reset_is_a_tcp_rst(gcs, proxy):
    """At the socket: the request is answered by a reset, with no response byte."""
    proxy.reset_after_forward(1, match=any_request())
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as sock:
        sock.sendall(f"GET /storage/v1/b/{BUCKET} HTTP/1.1\r\nHost: {proxy.url[7:]}\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError, match="Connection reset by peer"):
            data = sock.recv(65536)
            assert data == b""  # Fails the test if the peer closed with a FIN instead.
    assert proxy.log[-1].outcome == "reset_after_forward:200"


@pytest.mark.emulator
def test_truncated_download_is_resumed_by_client(gcs, proxy, client):
    data = os.urandom(300_000)
    name = "truncate/object.bin"
    gcs.upload_bytes(f"gs://{BUCKET}/{name}", data)

    rule = proxy.truncate_download(1, match=object_name_contains(name))
    assert _blob(client, name).download_as_bytes(timeout=TIMEOUT, retry=FAST_RETRY) == data
    assert rule.fired == 1
    # The client asked for the rest with a Range from what it had consumed (<= half).
    truncated, resumed = [e for e in proxy.log if e.object_name == name]
    assert truncated.outcome == "truncate_download:200"
    assert resumed.outcome == 206
    offset = int(resumed.headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < offset <= len(data) // 2


@pytest.mark.emulator
def test_truncated_download_without_retry_is_a_short_read(gcs, proxy, client):
    data = os.urandom(300_000)
    name = "truncate/no-retry.bin"
    gcs.upload_bytes(f"gs://{BUCKET}/{name}", data)

    rule = proxy.truncate_download(1, match=object_name_contains(name))
    with pytest.raises(requests.exceptions.ChunkedEncodingError, match="IncompleteRead"):
        _blob(client, name).download_as_bytes(timeout=TIMEOUT, retry=None)
    assert rule.fired == 1
    assert _entries(proxy, name) == [("GET", "truncate_download:200")]
    # Raw: full Content-Length announced, half the body sent, then the connection closes.
    proxy.truncate_download(1, match=object_name_contains(name))
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as sock:
        path = f"/download/storage/v1/b/{BUCKET}/o/truncate%2Fno-retry.bin?alt=media"
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {proxy.url[7:]}\r\n\r\n".encode())
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    assert f"content-length: {len(data)}".encode() in head.lower()
    assert body == data[: len(data) // 2]


@pytest.mark.emulator
def test_rules_are_counted_cleared_and_stop_closes(gcs, proxy, client):
    gcs.upload_bytes(f"gs://{BUCKET}/rules/x.bin", b"x")
    burst = proxy.status_burst(503, 1, match=object_name_contains("rules/x.bin"))
    outage = proxy.outage(match=object_name_contains("rules/never"))
    assert proxy.rules == [burst, outage]
    assert _blob(client, "rules/x.bin").download_as_bytes(timeout=TIMEOUT, retry=FAST_RETRY) == b"x"
    assert (burst.fired, outage.fired) == (1, 0)
    proxy.clear()
    assert proxy.rules == [] and not outage.active
    url = proxy.url
    proxy.stop()
    with pytest.raises(requests.exceptions.ConnectionError, match="Connection refused"):
        requests.get(f"{url}/storage/v1/b/{BUCKET}", timeout=2)


def _beam_write(gcsio, path: str, data: bytes) -> None:
    with gcsio.open(path, "wb") as f:
        f.write(data)


@pytest.mark.filterwarnings(UNRAISABLE_FAILED_WRITER)
@pytest.mark.emulator
def test_beam_gcsio_through_proxy(gcs, proxy, client):
    """Beam's GcsIO (as FileSystems uses it): a reset write fails on the emulator; a cut read resumes."""
    from apache_beam.io.gcp.gcsio import GcsIO  # pylint: disable=import-outside-toplevel

    gcsio = GcsIO(storage_client=client)
    data = os.urandom(600_000)
    name = "beam/shard.tfrecord"
    path = f"gs://{BUCKET}/{name}"

    reset = proxy.reset_after_forward(1, match=object_name_contains(name) & upload_completions())
    with pytest.raises(InvalidResponse, match="404"):
        _beam_write(gcsio, path, data)
    gc.collect()  # The failed writer (see UNRAISABLE_FAILED_WRITER).
    assert reset.fired == 1
    # One PUT (Beam's chunk is 16 MiB): reset after the emulator stored it, retried, 404.
    assert _entries(proxy, name) == [("POST", 200), ("PUT", "reset_after_forward:200"), ("PUT", 404)]
    assert gcs.download(path) == data

    proxy.clear_log()
    cut = proxy.truncate_download(1, match=object_name_contains(name))
    with gcsio.open(path, "rb") as f:
        assert f.read() == data
    assert cut.fired == 1
    downloads = [e for e in proxy.log if e.object_name == name and e.method == "GET" and "alt=media" in e.target]
    assert [e.outcome for e in downloads] == ["truncate_download:206", 206]
    assert downloads[1].headers["range"] == f"bytes={len(data) // 2}-"
