"""A fault-injecting HTTP/1.1 reverse proxy for GCS tests, on loopback.

``FaultProxy`` sits between a GCS client (google-cloud-storage, Beam's GCS
filesystem) and ``gcp-storage-emulator`` (``tests/harness/gcs_emulator.py``): point
``STORAGE_EMULATOR_HOST`` (or a client's ``api_endpoint``) at ``proxy.url`` and
every request goes through it::

    with FaultProxy(gcs.url) as proxy:
        rule = proxy.status_burst(503, 2, match=object_name_contains("shard-00001"))
        ...  # client calls through proxy.url
        assert rule.fired == 2
        print(proxy.log)

Forwarding. Each client request (method, request target, headers, body) is sent
to the upstream on a fresh connection, and the upstream's response (status,
reason, headers, body) is relayed as it came. Bodies are streamed in 64 KiB
blocks, not buffered (except upload-initiation and multipart-upload bodies, which
are read to learn the object name; see below): ``Content-Length`` bodies as they
are, chunked request bodies with their chunk framing byte for byte. Only the
hop-by-hop headers (``Connection``, ``Keep-Alive``, ``Expect``, ...) are dropped; the
proxy answers ``Expect: 100-continue`` itself. ``Host`` is passed through
unchanged, which matters: the emulator builds a resumable upload's ``Location``
from ``Host``, so the session URL it hands out points at the proxy again. The
proxy only ever connects to the upstream address given at construction, which must
be a loopback IP; an absolute-form request target (``GET http://elsewhere/...``)
is reduced to its path and query and still sent upstream. If the upstream answers
before it has read the whole body and closes (the emulator does: a 404 for an
unknown upload session, say), the proxy stops sending, still reads the client's
body to its end, and relays the answer; an upstream it cannot reach or that
sends no answer gives the client a 502 (``proxy.upstream_errors`` says why).

Faults. Rules are tried in the order they were added; the first active rule whose
``match`` accepts the request fires (its ``fired`` counter goes up and, for a
counted rule, ``remaining`` down). What each does on the wire:

- ``status_burst(status, count)``: the request body is read and discarded, and the
  proxy answers ``status`` (503/429/...) with a small JSON error body (the shape
  GCS uses: ``{"error": {"code", "message", "errors": [...]}}``) and
  ``Content-Length``, keeping the client connection open. Nothing reaches the
  upstream.
- ``outage(status=503)``: the same, for every matching request, until the rule is
  removed (``proxy.remove(rule)`` / ``proxy.clear()``).
- ``reset_after_forward(count)``: the request goes upstream in full and the whole
  upstream response is read (so the emulator has acted on it, e.g. stored the
  object an upload's last request completes); then the client socket is closed
  with ``SO_LINGER`` 0, which sends a TCP RST and no response byte. The client
  sees ``ConnectionResetError`` ("Connection aborted") on its request.
- ``truncate_download(count)``: only for media downloads (``alt=media`` or a
  ``/download/`` path; the given ``match`` is and-ed with that). The request is
  forwarded, the status line and headers are relayed with the full
  ``Content-Length``, then only the first half of the body (rounded down) is sent
  and the connection is closed normally (FIN). The client sees a short read
  (urllib3 ``IncompleteRead`` / requests ``ChunkedEncodingError``).

Matching. ``match`` is either a ``Match`` (the helpers below: ``any_request()``,
``object_name_contains(text)``, ``downloads()``, ``upload_completions()``,
``methods(...)``; combine them with ``&``, ``|``, ``~``) or any callable
``(method, target) -> bool`` on the method and the raw path+query. Object names
are matched decoded, wherever the JSON API puts them:

- ``/storage/v1/b/B/o/ENCODED`` and ``/download/storage/v1/b/B/o/ENCODED?alt=media``
  (the rest of the path after ``/o/``, percent-decoded, less a ``/acl``,
  ``/compose``, ``/copyTo/...`` or ``/rewriteTo/...`` suffix; google-cloud-storage
  leaves "/" in names unencoded);
- ``/upload/storage/v1/b/B/o?uploadType=...&name=...`` (the ``name`` parameter);
- a resumable upload's initiation (``uploadType=resumable`` without ``name=``):
  the ``name`` of its JSON body; a multipart upload: the ``name`` of its first
  (metadata) part;
- a resumable upload's later requests (``...&upload_id=ID``, which carry no name):
  the name the proxy saw when it relayed the initiation that created ``ID``.

``proxy.log`` lists every request as ``LogEntry(method, target, outcome, headers,
object_name)``: ``outcome`` is the relayed status (int) or, for an injected
fault, a string ``"status_burst:503"``, ``"outage:503"``,
``"reset_after_forward:200"``, ``"truncate_download:200"`` (the kind, and the
status the client was shown or, for a reset, the status upstream answered and the
client never got); ``"upstream_error:502"`` when the upstream failed. An entry is
added before the client gets its answer, so when a client call returns, all its
requests are in the log.

Observed behaviour (google-cloud-storage 3.17.1, google-resumable-media 2.11,
gcp-storage-emulator 2026.7.19, Apache Beam 2.77; shown by ``tests/test_fault_proxy.py``):

- ``upload_from_string`` of up to 8 MiB is one multipart POST (the name only in
  the body's metadata part), even with ``blob.chunk_size`` set. ``blob.open("wb")``
  (``BlobWriter``, which Beam's ``GcsIO`` writes through), and ``upload_from_file``
  with no size, are resumable: a POST with the name in a JSON body opens the session
  (``Location: ...&upload_id=BUCKET:NAME:TIMESTAMP``), then ``chunk_size`` PUTs with
  ``Content-Range: bytes A-B/*`` answered 308, the last ``bytes A-B/TOTAL``, 200.
  google-cloud-storage leaves "/" in object names unencoded in paths
  (``/o/dir/a%20b.bin``).
- google-cloud-storage 3.17 sends ``GET /storage/v1/b/BUCKET?projection=noAcl``
  from a background thread (its bucket-metadata cache, on first use of a bucket;
  a bucket-existence check after a 404): the log's order around it is arbitrary,
  and an ``any_request()`` rule can hit it.
- A 503 or 429 burst on an upload is absorbed by the client's retry (uploads are
  retried by default in 3.x) and the stored bytes are equal. The default retry
  sleeps ~1 s, 2 s, 4 s ... (jittered; a 429 burst of 2 took 1.5 s) for up to
  120 s, so tests pass a fast ``retry=`` and a ``timeout=``.
- An outage (503) on one object: with ``retry=None`` an upload or download raises
  ``google.api_core.exceptions.ServiceUnavailable`` at once; with a retry it is
  attempted until the retry's timeout and then raises
  ``google.api_core.exceptions.RetryError`` (the 503 as its cause). Other objects
  are unaffected.
- A reset after forwarding a resumable upload's last PUT: the emulator has stored
  the object, complete and correct. The client retries that PUT on the same
  session, and the emulator, which forgets a session once it completes, answers
  404 where real GCS answers 200/201 with the object's resource. So the write
  fails though the object is there: ``BlobWriter`` (and Beam's ``GcsIO`` writer)
  raise ``google.cloud.storage.exceptions.InvalidResponse`` (status 404),
  ``upload_from_file`` raises ``google.api_core.exceptions.NotFound``. This is an
  emulator artefact; do not build on it. A multipart upload reset the same way is
  sent again and succeeds (a new generation); with ``retry=None`` the client gets
  ``requests.exceptions.ConnectionError`` ("Connection aborted",
  ``ConnectionResetError``) although the object was stored.
- A truncated download is resumed by the client: it repeats the GET with
  ``Range: bytes=N-``, N the bytes it had consumed (e.g. 147456 of the 150000
  the proxy sent, of 300000), the emulator answers 206 with the rest, and
  ``download_as_bytes`` returns the full, correct bytes. With ``retry=None`` the
  short read surfaces as ``requests.exceptions.ChunkedEncodingError``
  (``IncompleteRead(150000 bytes read, 150000 more expected)``).
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import re
import socket
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = [
    "FaultProxy",
    "FaultRule",
    "LogEntry",
    "Match",
    "RequestInfo",
    "any_request",
    "downloads",
    "methods",
    "object_name_contains",
    "object_name_of",
    "request_kind",
    "target_contains",
    "upload_completions",
]

BLOCK = 64 * 1024
PEEK_LIMIT = 16 * 1024 * 1024  # Largest upload-initiation / multipart body read to find the name.
UPSTREAM_TIMEOUT_SECONDS = 60.0
CLIENT_IDLE_TIMEOUT_SECONDS = 60.0

# Not forwarded either way (RFC 9110 7.6.1), plus Expect, which the proxy answers.
_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization",
    "te", "trailer", "upgrade", "expect",
})


# -- requests and matching -----------------------------------------------------------


class RequestInfo(NamedTuple):
    """What a rule's ``match`` can look at."""

    method: str
    target: str          # Raw path + query, as the client sent it.
    path: str            # Raw (still percent-encoded) path.
    query: dict          # parse_qs of the query: name -> [values].
    headers: dict        # Lower-case header name -> value.
    object_name: str | None  # Decoded object name, when the request names one (see module doc).


def object_name_of(target: str) -> str | None:
    """The decoded object name a JSON API request target names in its URL, or None.

    Looks at ``.../o/ENCODED[/...]`` and at a ``name=`` query parameter; not at
    bodies or upload sessions (the proxy adds those, see ``RequestInfo.object_name``).
    """
    parts = urlsplit(target)
    name = parse_qs(parts.query).get("name")
    if name:
        return name[0]
    # .../b/BUCKET/o/NAME[/subresource]. google-cloud-storage percent-encodes the name
    # but leaves "/" as is, so NAME is the rest of the path, less a known subresource.
    match = _OBJECT_PATH.search(parts.path)
    if not match:
        return None
    rest = match.group(1)
    for marker in ("/copyTo/b/", "/rewriteTo/b/"):
        rest = rest.split(marker, 1)[0]
    rest = _SUBRESOURCE.sub("", rest)
    return unquote(rest) if rest else None


_OBJECT_PATH = re.compile(r"/b/[^/]+/o/(.+)$")
_SUBRESOURCE = re.compile(r"/(?:compose|acl(?:/[^/]*)?)$")


class Match:
    """A predicate on a ``RequestInfo``; combine with ``&``, ``|``, ``~``."""

    def __init__(self, test: Callable[[RequestInfo], bool], description: str):
        self.test = test
        self.description = description

    def __call__(self, info: RequestInfo) -> bool:
        return bool(self.test(info))

    def __and__(self, other: Match) -> Match:
        other = as_match(other)
        return Match(lambda i: self(i) and other(i), f"({self.description} and {other.description})")

    def __or__(self, other: Match) -> Match:
        other = as_match(other)
        return Match(lambda i: self(i) or other(i), f"({self.description} or {other.description})")

    def __invert__(self) -> Match:
        return Match(lambda i: not self(i), f"not {self.description}")

    def __repr__(self) -> str:
        return f"Match({self.description})"


def as_match(match) -> Match:
    """A ``Match`` as is; None as ``any_request()``; a ``(method, target)`` callable wrapped."""
    if match is None:
        return any_request()
    if isinstance(match, Match):
        return match
    if callable(match):
        return Match(lambda i: match(i.method, i.target), getattr(match, "__name__", repr(match)))
    raise TypeError(f"match must be a Match, a (method, target) callable or None, not {match!r}")


def any_request() -> Match:
    return Match(lambda i: True, "any request")


def object_name_contains(text: str) -> Match:
    """Requests on an object whose decoded name contains ``text`` (see module doc)."""
    return Match(lambda i: i.object_name is not None and text in i.object_name,
                 f"object name contains {text!r}")


def methods(*names: str) -> Match:
    wanted = {n.upper() for n in names}
    return Match(lambda i: i.method in wanted, f"method in {sorted(wanted)}")


def target_contains(text: str) -> Match:
    """The raw path+query contains ``text``."""
    return Match(lambda i: text in i.target, f"target contains {text!r}")


def _is_download(info: RequestInfo) -> bool:
    if info.method != "GET":
        return False
    return "media" in info.query.get("alt", ()) or info.path.startswith("/download/")


def request_kind(method: str, target: str) -> str:
    """What a JSON API request does, for counting a log: ``rewrite``, ``copy``,
    ``delete``, ``list``, ``download``, ``metadata`` (an object's), ``bucket`` (a
    bucket's metadata), ``upload`` (a multipart, media or resumable request),
    ``batch``, else ``"<METHOD> other"``."""
    path = urlsplit(target).path
    query = parse_qs(urlsplit(target).query)
    if path.startswith("/batch/"):
        return "batch"
    if "/rewriteTo/b/" in path:
        return "rewrite"
    if "/copyTo/b/" in path:
        return "copy"
    if path.startswith("/upload/") or "upload_id" in query:
        return "upload"
    if method == "DELETE":
        return "delete"
    if method == "GET" and ("media" in query.get("alt", ()) or path.startswith("/download/")):
        return "download"
    if method == "GET" and re.search(r"/b/[^/]+/o/?$", path):
        return "list"
    if method == "GET" and _OBJECT_PATH.search(path):
        return "metadata"
    if method == "GET" and re.search(r"/b/[^/]+/?$", path):
        return "bucket"
    return f"{method} other"


def downloads() -> Match:
    """Media downloads: ``GET ...?alt=media`` or ``GET /download/...``."""
    return Match(_is_download, "media download")


def _completes_upload(info: RequestInfo) -> bool:
    upload_type = info.query.get("uploadType", [""])[0]
    if "upload_id" in info.query:
        if info.method not in ("PUT", "POST"):
            return False
        content_range = info.headers.get("content-range", "").strip()
        if not content_range:
            return True  # The whole object in one request.
        _, _, spec = content_range.partition(" ")
        span, _, total = spec.partition("/")
        if total in ("", "*"):
            return False
        if span == "*":
            return True  # "bytes */TOTAL": finalizes once the server has TOTAL bytes.
        _, _, end = span.partition("-")
        try:
            return int(end) + 1 == int(total)
        except ValueError:
            return False
    return info.method == "POST" and upload_type in ("multipart", "media")


def upload_completions() -> Match:
    """The request that completes an upload: a multipart/media POST, or a resumable
    session's last request (its ``Content-Range`` reaches the total, or it has none)."""
    return Match(_completes_upload, "request completing an upload")


# -- rules and log ---------------------------------------------------------------------


class FaultRule:
    """One fault; ``fired`` counts how often it hit. Made by ``FaultProxy``'s methods."""

    def __init__(self, kind: str, match: Match, count: int | None, status: int | None):
        self.kind = kind
        self.match = match
        self.remaining = count  # None: until removed.
        self.status = status
        self.fired = 0
        self.removed = False

    @property
    def active(self) -> bool:
        return not self.removed and (self.remaining is None or self.remaining > 0)

    def __repr__(self) -> str:
        left = "unlimited" if self.remaining is None else f"{self.remaining} left"
        status = f" {self.status}" if self.status else ""
        return f"<FaultRule {self.kind}{status} on {self.match.description}: fired {self.fired}, {left}>"


class LogEntry(NamedTuple):
    method: str
    target: str
    outcome: int | str  # Relayed status, or "KIND:STATUS" for a fault (see module doc).
    headers: dict       # The request's headers, lower-case names.
    object_name: str | None  # As rules saw it (RequestInfo.object_name).


def _error_body(status: int, kind: str) -> bytes:
    reason = {429: "rateLimitExceeded", 503: "backendError"}.get(status, "backendError")
    message = f"{http.client.responses.get(status, 'Error')} (injected by FaultProxy: {kind})"
    return json.dumps({"error": {"code": status, "message": message,
                                 "errors": [{"message": message, "domain": "global", "reason": reason}]}}
                      ).encode()


def _name_from_body(headers: dict, body: bytes) -> str | None:
    """``name`` of an upload's JSON metadata: the whole body, or a multipart body's first part."""
    content_type = headers.get("content-type", "")
    try:
        if content_type.startswith("multipart/"):
            boundary = None
            for param in content_type.split(";")[1:]:
                key, _, value = param.strip().partition("=")
                if key.lower() == "boundary":
                    boundary = value.strip('"').encode()
            if not boundary:
                return None
            delimiter = b"--" + boundary
            start = body.index(delimiter) + len(delimiter)
            end = body.index(delimiter, start)
            part = body[start:end]
            _, _, content = part.partition(b"\r\n\r\n")
            meta = json.loads(content.strip())
        elif body:
            meta = json.loads(body)
        else:
            return None
    except (ValueError, UnicodeDecodeError):
        return None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


# -- the proxy -------------------------------------------------------------------------


class _ClientGone(Exception):
    """The client closed its connection or sent a malformed body."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False
    proxy: FaultProxy

    def handle_error(self, request, client_address):
        # Connections the proxy resets on purpose, or clients drop, are no news.
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_IDLE_TIMEOUT_SECONDS  # An idle keep-alive connection ends after this.
    server: _Server

    def log_message(self, format, *args):  # noqa: A002  (quiet)
        pass

    def setup(self):
        super().setup()
        # Each answer goes out as written (headers, then body), not held back until the
        # client acknowledges the previous piece (Nagle): ~40 ms per request on a kept-alive
        # loopback connection otherwise.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.proxy._track(self.connection, add=True)

    def finish(self):
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    # Every method goes the same way.
    def do_GET(self):
        self._proxy()

    do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_GET

    # -- request side -----------------------------------------------------------

    def _header_dict(self) -> dict:
        return {k.lower(): v for k, v in self.headers.items()}

    def _body_pieces(self) -> Iterator[tuple[bytes, bytes]]:
        """The request body as (raw bytes to forward, decoded bytes) pieces."""
        length = self.headers.get("Content-Length")
        chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        if chunked:
            while True:
                line = self.rfile.readline(65537)
                if not line.endswith(b"\n"):
                    raise _ClientGone("bad chunk size line")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    raw = [line]
                    while True:  # Trailers, then the empty line.
                        trailer = self.rfile.readline(65537)
                        if not trailer:
                            raise _ClientGone("client closed inside chunked trailers")
                        raw.append(trailer)
                        if trailer in (b"\r\n", b"\n"):
                            break
                    yield b"".join(raw), b""
                    return
                yield line, b""
                left = size
                while left:
                    data = self.rfile.read(min(BLOCK, left))
                    if not data:
                        raise _ClientGone("client closed inside a chunk")
                    left -= len(data)
                    yield data, data
                crlf = self.rfile.readline(3)
                yield crlf, b""
        elif length:
            left = int(length)
            while left:
                data = self.rfile.read(min(BLOCK, left))
                if not data:
                    raise _ClientGone("client closed inside the body")
                left -= len(data)
                yield data, data

    def _request_info(self) -> tuple[RequestInfo, list[bytes] | None]:
        """The request's info and, if the body had to be read to find the name, its raw pieces."""
        proxy = self.server.proxy
        target = self.path
        if "://" in target.split("?", 1)[0]:  # Absolute form: keep path and query only.
            parts = urlsplit(target)
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        parts = urlsplit(target)
        query = parse_qs(parts.query, keep_blank_values=True)
        headers = self._header_dict()
        name = object_name_of(target)
        buffered = None
        if name is None and "upload_id" in query:
            name = proxy._session_name(query["upload_id"][0])
        elif (name is None and self.command == "POST"
              and query.get("uploadType", [""])[0] in ("resumable", "multipart")):
            length = headers.get("content-length")
            if length is None or int(length) <= PEEK_LIMIT:
                buffered, decoded = [], []
                for raw, data in self._body_pieces():
                    buffered.append(raw)
                    decoded.append(data)
                name = _name_from_body(headers, b"".join(decoded))
        info = RequestInfo(self.command, target, parts.path, query, headers, name)
        return info, buffered

    # -- response side ----------------------------------------------------------

    def _send_head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        self.send_response_only(status, reason)
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()

    def _answer(self, status: int, body: bytes, content_type: str = "application/json; charset=UTF-8"):
        self._send_head(status, http.client.responses.get(status, ""), [
            ("Content-Type", content_type), ("Content-Length", str(len(body)))])
        if self.command != "HEAD":
            self.wfile.write(body)

    def _reset(self) -> None:
        """Closes the client connection with a TCP RST (SO_LINGER 0), sending nothing more."""
        self.close_connection = True
        sock = self.connection
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.rfile.close()  # Drops the makefile reference so close() really closes.
        with contextlib.suppress(OSError):
            sock.close()

    # -- the exchange -------------------------------------------------------------

    def _proxy(self) -> None:
        try:
            self._exchange()
        except (_ClientGone, OSError):  # The client went away (or timed out) mid-request.
            self.close_connection = True

    def _exchange(self) -> None:
        proxy = self.server.proxy
        info, buffered = self._request_info()
        rule = proxy._pick(info)
        kind = rule.kind if rule else None

        if kind in ("status_burst", "outage"):
            if buffered is None:
                for _ in self._body_pieces():
                    pass
            proxy._record(info, f"{kind}:{rule.status}")
            self._answer(rule.status, _error_body(rule.status, kind))
            return

        try:
            conn, response = self._forward(info, buffered)
        except _ClientGone:
            proxy._record(info, "client_error")
            raise
        except (OSError, http.client.HTTPException) as err:
            self.close_connection = True
            proxy._record(info, "upstream_error:502")
            proxy._note_upstream_error(info, err)
            self._answer(502, _error_body(502, f"upstream error: {err}"))
            return

        try:
            self._learn_session(info, response)
            if kind == "reset_after_forward":
                with contextlib.suppress(OSError, http.client.HTTPException):
                    response.read()
                proxy._record(info, f"{kind}:{response.status}")
                self._reset()
                return
            if kind == "truncate_download":
                body = response.read()
                proxy._record(info, f"{kind}:{response.status}")
                self._send_head(response.status, response.reason,
                                self._relay_headers(response, content_length=len(body)))
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True  # Then FIN: the server shuts the socket down.
                return
            proxy._record(info, response.status)
            self._relay(response)
        finally:
            response.close()
            conn.close()

    def _forward(self, info: RequestInfo, buffered: list[bytes] | None):
        proxy = self.server.proxy
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                          timeout=proxy.upstream_timeout)
        pieces = buffered if buffered is not None else (raw for raw, _ in self._body_pieces())
        error = None  # The first upstream error; the client's body is read to its end regardless.
        try:
            try:
                conn.putrequest(info.method, info.target, skip_host=True, skip_accept_encoding=True)
                drop = set(_HOP_BY_HOP)
                for token in self.headers.get("Connection", "").split(","):
                    drop.add(token.strip().lower())
                for key, value in self.headers.items():
                    if key.lower() not in drop:
                        conn.putheader(key, value)
                conn.putheader("Connection", "close")
                conn.endheaders()
            except OSError as err:
                error = err
            for raw in pieces:
                if error is None:
                    try:
                        conn.send(raw)
                    except OSError as err:
                        # The upstream answered early and closed (the emulator does so,
                        # without reading the body, e.g. a 404 for an unknown upload
                        # session): its answer may be waiting; read it below.
                        error = err
            if error is not None and conn.sock is None:
                raise error
            try:
                return conn, conn.getresponse()
            except (OSError, http.client.HTTPException) as err:
                raise (error or err) from None
        except BaseException:
            conn.close()
            raise

    def _learn_session(self, info: RequestInfo, response: http.client.HTTPResponse) -> None:
        location = response.getheader("Location")
        if not location or info.object_name is None or "upload_id" in info.query:
            return
        upload_id = parse_qs(urlsplit(location).query).get("upload_id")
        if upload_id:
            self.server.proxy._remember_session(upload_id[0], info.object_name)

    @staticmethod
    def _relay_headers(response: http.client.HTTPResponse, content_length: int | None = None,
                       chunked: bool = False) -> list[tuple[str, str]]:
        drop = set(_HOP_BY_HOP) | {"transfer-encoding"}
        for token in (response.getheader("Connection") or "").split(","):
            drop.add(token.strip().lower())
        if content_length is not None:
            drop.add("content-length")
        headers = [(k, v) for k, v in response.getheaders() if k.lower() not in drop]
        if content_length is not None:
            headers.append(("Content-Length", str(content_length)))
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        return headers

    def _relay(self, response: http.client.HTTPResponse) -> None:
        no_body = (self.command == "HEAD" or response.status in (204, 304) or 100 <= response.status < 200)
        if no_body:
            self._send_head(response.status, response.reason, self._relay_headers(response))
            response.read()
            return
        if response.length is not None and not response.chunked:
            self._send_head(response.status, response.reason, self._relay_headers(response))
            left = response.length
            while left:
                data = response.read(min(BLOCK, left))
                if not data:  # Upstream closed early: so does the client connection.
                    self.close_connection = True
                    return
                left -= len(data)
                self.wfile.write(data)
            return
        # Chunked or close-delimited upstream body: chunked to the client.
        self._send_head(response.status, response.reason, self._relay_headers(response, chunked=True))
        while True:
            data = response.read1(BLOCK) if hasattr(response, "read1") else response.read(BLOCK)
            if not data:
                break
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.write(b"0\r\n\r\n")


class FaultProxy:
    """A threaded reverse proxy on 127.0.0.1:<free port> in front of ``upstream``.

    Args:
      upstream: ``http://HOST:PORT`` of the emulator; HOST must be a loopback IP
        (or ``localhost``, taken as 127.0.0.1).
      upstream_timeout: seconds for connecting to and each read from the upstream.
    """

    def __init__(self, upstream: str, upstream_timeout: float = UPSTREAM_TIMEOUT_SECONDS):
        parts = urlsplit(upstream if "://" in upstream else f"http://{upstream}")
        if parts.scheme != "http" or not parts.port:
            raise ValueError(f"upstream must be http://HOST:PORT, not {upstream!r}")
        host = "127.0.0.1" if parts.hostname == "localhost" else parts.hostname
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"upstream must be a loopback address, not {upstream!r}")
        self.upstream_host: str = host
        self.upstream_port: int = parts.port
        self.upstream_timeout = upstream_timeout
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []
        self._log: list[LogEntry] = []
        self._sessions: dict[str, str] = {}
        self._upstream_errors: list[tuple[str, str, str]] = []
        self._connections: set[socket.socket] = set()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> FaultProxy:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"FaultProxy:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops listening and drops every open client connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._lock:
            connections = list(self._connections)
        for sock in connections:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("FaultProxy is not running")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: the value for ``STORAGE_EMULATOR_HOST``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def upstream(self) -> str:
        return f"http://{self.upstream_host}:{self.upstream_port}"

    # -- rules -------------------------------------------------------------------

    def _add(self, kind: str, match, count: int | None, status: int | None) -> FaultRule:
        if count is not None and count < 1:
            raise ValueError(f"count must be at least 1, not {count}")
        rule = FaultRule(kind, as_match(match), count, status)
        with self._lock:
            self._rules.append(rule)
        return rule

    def status_burst(self, status: int = 503, count: int = 1, match=None) -> FaultRule:
        """Answers the next ``count`` matching requests with ``status`` (not forwarded)."""
        return self._add("status_burst", match, count, status)

    def outage(self, match=None, status: int = 503) -> FaultRule:
        """Answers every matching request with ``status`` until the rule is removed."""
        return self._add("outage", match, None, status)

    def reset_after_forward(self, count: int = 1, match=None) -> FaultRule:
        """Forwards the next ``count`` matching requests, then resets the client connection."""
        return self._add("reset_after_forward", match, count, None)

    def truncate_download(self, count: int = 1, match=None) -> FaultRule:
        """Relays only the first half of the next ``count`` matching media downloads' bodies."""
        return self._add("truncate_download", downloads() & as_match(match), count, None)

    def remove(self, rule: FaultRule) -> None:
        with self._lock:
            rule.removed = True
            if rule in self._rules:
                self._rules.remove(rule)

    def clear(self) -> None:
        """Removes every rule (their counters stay readable on the rule objects)."""
        with self._lock:
            for rule in self._rules:
                rule.removed = True
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def _pick(self, info: RequestInfo) -> FaultRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.active and rule.match(info):
                    rule.fired += 1
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return rule
        return None

    # -- log and state -------------------------------------------------------------

    @property
    def log(self) -> list[LogEntry]:
        """Every request so far, in the order their outcome was known (a copy).

        An entry is added before the client receives the answer, so once a client
        call returns, all of its requests are in the log."""
        with self._lock:
            return list(self._log)

    def faults(self) -> list[LogEntry]:
        """The log entries of injected faults."""
        return [e for e in self.log if isinstance(e.outcome, str)]

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def _record(self, info: RequestInfo, outcome: int | str) -> None:
        # Called before the client gets the (last byte of the) answer, so a client
        # that has its answer finds the request in the log.
        with self._lock:
            self._log.append(LogEntry(info.method, info.target, outcome, info.headers, info.object_name))

    @property
    def upstream_errors(self) -> list[tuple[str, str, str]]:
        """(method, target, error) for each request the upstream failed (answered 502)."""
        with self._lock:
            return list(self._upstream_errors)

    def _note_upstream_error(self, info: RequestInfo, err: BaseException) -> None:
        with self._lock:
            self._upstream_errors.append((info.method, info.target, repr(err)))

    def _remember_session(self, upload_id: str, name: str) -> None:
        with self._lock:
            self._sessions[upload_id] = name

    def _session_name(self, upload_id: str) -> str | None:
        with self._lock:
            return self._sessions.get(upload_id)

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(sock)
            else:
                self._connections.discard(sock)
