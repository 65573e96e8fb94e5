"""``gs://`` helpers: the CRC-32C GCS reports for an object, and no credential stall
against a storage emulator.

GCS reports an object's CRC-32C as base64 of the big-endian uint32
(``"yZRlqg=="``); the manifest stores hex (``google_crc32c``'s ``hexdigest``,
``"c99465aa"``). ``crc32c_gcs_to_hex`` and ``crc32c_hex_to_gcs`` convert.

Credentials. Beam 2.77's GCS filesystem builds a storage client per call
(``gcsio.create_storage_client``) from ``apache_beam.internal.gcp.auth``, which
runs ``google.auth.default()`` once per process under
``retry.with_exponential_backoff(num_retries=4, initial_delay_secs=2)``: with no
credentials that is 15-30 s of sleeping before it gives up and connects
anonymously. No pipeline option changes that (``--no_auth`` is read only by the
Dataflow runner), and no environment variable makes ``google.auth.default()``
return anonymous credentials. ``use_anonymous_credentials()`` records Beam's
give-up outcome (no credentials: an anonymous client) up front, so the first
GCS call goes straight out. google-cloud-storage sends an anonymous client to
``STORAGE_EMULATOR_HOST`` when that is set.

Importing this module does that when (and only when) ``STORAGE_EMULATOR_HOST``
is set, so ``--beam_plugin beam_tfrecords.transforms.io.gcs`` carries it into Beam's worker
processes. On real GCS never set ``STORAGE_EMULATOR_HOST`` (nor
``NO_GCE_CHECK=true`` on GCE/Dataflow machines, where the metadata server *is*
the credential source): then nothing here changes how Beam authenticates.
"""

from __future__ import annotations

import base64
import binascii
import concurrent.futures
import dataclasses
import os
import threading

__all__ = [
    "EMULATOR_ENV",
    "PROBE_ENV",
    "THREADS",
    "ObjectInfo",
    "ObjectUnreadable",
    "READ_RETRY_SECONDS",
    "check_reachable",
    "copy_generation",
    "crc32c_gcs_to_hex",
    "crc32c_hex_to_gcs",
    "create_if_absent",
    "delete_generation",
    "delete_objects",
    "emulator_host",
    "is_gcs",
    "list_objects",
    "object_crc32c",
    "object_info",
    "open_object",
    "parallel",
    "read_generation",
    "read_object",
    "replace_generation",
    "storage_client",
    "use_anonymous_credentials",
]

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
# Seconds a run waits to reach a bucket before refusing to start (default 60).
PROBE_ENV = "BEAM_TFRECORDS_GCS_PROBE_SECONDS"
_PROBE_SECONDS = 60.0

_lock = threading.Lock()
_gcsio = None


def _forget_client() -> None:
    """After a fork, in the child: the parent's client is not the child's (its
    connections' sockets are the parent's too); the child makes its own on first use."""
    global _gcsio, _lock  # pylint: disable=global-statement
    _gcsio, _lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_client)
# Requests at a time in a batch of object operations (``parallel``): Beam's own file
# sink renames with up to 64 threads; the client's connection pool is widened to it.
THREADS = 32


def is_gcs(path: str) -> bool:
    """Whether ``path`` is a ``gs://`` URI."""
    return path.startswith("gs://")


def crc32c_hex_to_gcs(hex_digest: str) -> str:
    """``"c99465aa"`` (8 hex digits, as ``google_crc32c.Checksum.hexdigest``) to
    GCS's ``crc32c`` field (base64 of the 4 big-endian bytes, ``"yZRlqg=="``)."""
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raise ValueError(f"not a hex CRC-32C: {hex_digest!r}") from None
    if len(raw) != 4:
        raise ValueError(f"not a CRC-32C (8 hex digits): {hex_digest!r}")
    return base64.b64encode(raw).decode("ascii")


def crc32c_gcs_to_hex(value: str) -> str:
    """GCS's ``crc32c`` field (base64 of the 4 big-endian bytes) to 8 lower-case hex digits."""
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"not a GCS crc32c (base64): {value!r}") from None
    if len(raw) != 4:
        raise ValueError(f"not a GCS crc32c (4 bytes in base64): {value!r}")
    return raw.hex()


def emulator_host() -> str | None:
    """``STORAGE_EMULATOR_HOST`` (``http://127.0.0.1:PORT``), or ``None`` on real GCS."""
    return os.environ.get(EMULATOR_ENV) or None


def use_anonymous_credentials() -> bool:
    """Makes Beam's GCS filesystem in this process connect anonymously at once.

    Sets Beam's per-process credential cache to "none found", the outcome its
    credential lookup reaches after its retries, so no call waits on
    ``google.auth.default()`` or the metadata server. Credentials already
    looked up in this process are kept. For emulators and public buckets only.

    Returns:
      Whether this call set it (``False``: the process had already looked).
    """
    from apache_beam.internal.gcp import auth  # pylint: disable=import-outside-toplevel

    creds = auth._Credentials  # pylint: disable=protected-access
    with creds._credentials_lock:  # pylint: disable=protected-access
        if creds._credentials_init:  # pylint: disable=protected-access
            return False
        creds._credentials = None  # pylint: disable=protected-access
        creds._credentials_init = True  # pylint: disable=protected-access
    return True


def _client():
    """Beam's ``GcsIO``, one per process (it holds one storage client)."""
    global _gcsio  # pylint: disable=global-statement
    with _lock:
        if _gcsio is None:
            # pylint: disable=import-outside-toplevel
            from apache_beam.io.gcp.gcsio import GcsIO
            from apache_beam.options.pipeline_options import PipelineOptions

            _gcsio = GcsIO(pipeline_options=PipelineOptions([]))
            _widen_pool(_gcsio.client)
        return _gcsio


def _widen_pool(client) -> None:
    """Lets ``THREADS`` requests of the one storage client share its HTTP session
    (requests keeps 10 connections per host by default, and drops the others
    after use with a warning each)."""
    import requests.adapters  # pylint: disable=import-outside-toplevel

    session = getattr(client, "_http", None)
    if session is None or not hasattr(session, "mount"):
        return
    for scheme in ("https://", "http://"):
        session.mount(scheme, requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=THREADS))


def parallel(function, items, threads: int = THREADS) -> list[tuple[object, Exception]]:
    """Calls ``function(item)`` for every item, up to ``threads`` at a time, and waits
    for all of them: a batch of storage operations as single requests through the
    process's one storage client (not GCS batch requests, which fake-gcs-server and
    gcp-storage-emulator cannot answer; real GCS runs a batch's parts one by one all
    the same).

    Returns:
      ``(item, error)`` of every call that raised an ``Exception``, in item order.
      Anything else raised (``KeyboardInterrupt``, ...) is raised again once every
      call has ended.
    """
    items = list(items)
    if len(items) <= 1 or threads <= 1:
        outcomes = []
        for item in items:
            try:
                function(item)
            except Exception as err:  # pylint: disable=broad-except
                outcomes.append((item, err))
        return outcomes
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(items)),
                                               thread_name_prefix="gcs-batch") as pool:
        done = [pool.submit(function, item) for item in items]
        concurrent.futures.wait(done)
    failed, fatal = [], None
    for item, future in zip(items, done):
        error = future.exception()
        if isinstance(error, Exception):
            failed.append((item, error))
        elif error is not None and fatal is None:
            fatal = error
    if fatal is not None:
        raise fatal
    return failed


def object_crc32c(path: str) -> str | None:
    """The CRC-32C GCS reports for a ``gs://`` object, as 8 lower-case hex digits.

    ``None`` for a path that is not ``gs://`` (or an object without a crc32c).

    Raises:
      FileNotFoundError: when the object does not exist.
    """
    if not is_gcs(path):
        return None
    from google.api_core.exceptions import NotFound  # pylint: disable=import-outside-toplevel

    try:
        value = _client().checksum(path)
    except NotFound:
        raise FileNotFoundError(f"{path} does not exist") from None
    return crc32c_gcs_to_hex(value) if value else None


def _blob(path: str, generation: int | None = None):
    bucket, _, name = path[len("gs://"):].partition("/")
    blob = _client().client.bucket(bucket).blob(name, generation=generation)
    # No chunk size: an upload of this blob is one multipart request (see _upload).
    blob.chunk_size = None
    return blob


def _upload(path: str, data: bytes, generation: int) -> bool:
    """Writes a small object only if the live object has ``generation`` (0: none).

    Real GCS honours ``ifGenerationMatch`` on every kind of upload. The
    fake-gcs-server the tests use honours it only on a multipart upload (a
    ``uploadType=media`` or resumable upload ignores it, and gcp-storage-emulator
    ignores it everywhere), so this is always one multipart request:
    ``upload_from_string`` without a chunk size sends data of up to 8 MB that way.
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import PreconditionFailed

    if len(data) > 8 << 20:
        raise ValueError(f"{path}: {len(data)} bytes is too large for one multipart upload")
    try:
        _blob(path).upload_from_string(data, if_generation_match=generation)
    except PreconditionFailed:
        return False
    return True


def create_if_absent(path: str, data: bytes) -> bool:
    """Writes a small ``gs://`` object only if no object has that name (a GCS
    precondition, so two writers cannot both succeed).

    Returns:
      ``True`` when this call created it; ``False`` when it already existed.
    """
    return _upload(path, data, 0)


def replace_generation(path: str, data: bytes, generation: int) -> bool:
    """Replaces a small ``gs://`` object only if it still is ``generation`` (so of
    two writers that read the same generation, one succeeds).

    Returns:
      ``True`` when this call replaced it; ``False`` when it had changed or gone.
    """
    if generation <= 0:
        raise ValueError(f"{path}: a generation to replace must be positive, got {generation}")
    return _upload(path, data, generation)


def read_generation(path: str) -> tuple[bytes, int] | None:
    """A ``gs://`` object's bytes and the generation they are of; ``None`` when there
    is no such object (or it was replaced while being read: read again)."""
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import NotFound

    bucket, _, name = path[len("gs://"):].partition("/")
    blob = _client().client.bucket(bucket).get_blob(name)
    if blob is None:
        return None
    generation = int(blob.generation)  # (A download resets it from headers some servers omit.)
    try:  # The download names the generation get_blob saw.
        return blob.download_as_bytes(checksum=None), generation
    except NotFound:
        return None


def delete_generation(path: str, generation: int) -> bool:
    """Deletes a ``gs://`` object only if it still is ``generation``.

    Real GCS honours the precondition; both emulators the tests use ignore it on
    deletes (and delete whatever is there), so nothing may depend on it there.

    Returns:
      ``True`` when this call deleted it; ``False`` when it had changed or gone.
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import NotFound, PreconditionFailed

    try:
        _blob(path).delete(if_generation_match=generation)
    except (NotFound, PreconditionFailed):
        return False
    return True


def copy_generation(source: str, target: str, generation: int) -> None:
    """Copies generation ``generation`` of ``source`` to ``target`` (a server-side
    rewrite, in as many calls as GCS asks for), and only that one.

    The rewrite names the source generation (``sourceGeneration``: another
    generation is never copied; after a replacement the verified one is gone, 404,
    unless the bucket keeps old versions, and then it is what is copied) and makes
    the live source generation a precondition (``ifSourceGenerationMatch``: 412
    when it changed). Real GCS honours both; the fake-gcs-server of the tests
    honours the first and ignores the second; gcp-storage-emulator ignores both.

    Raises:
      FileNotFoundError: when ``source`` no longer is ``generation``.
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import NotFound, PreconditionFailed
    from google.cloud.storage.retry import DEFAULT_RETRY

    if generation <= 0:
        raise ValueError(f"{source}: a generation to copy must be positive, got {generation}")
    origin, copy = _blob(source, generation), _blob(target)
    token = None
    try:
        while True:
            # Retried as a whole: the same source generation to the same name again.
            token, _, _ = copy.rewrite(origin, token=token, if_source_generation_match=generation,
                                       retry=DEFAULT_RETRY)
            if token is None:
                return
    except (NotFound, PreconditionFailed) as err:
        raise FileNotFoundError(f"{source} is no longer generation {generation} "
                                f"({type(err).__name__})") from err


def delete_objects(paths: list[str], threads: int = THREADS) -> None:
    """Deletes ``gs://`` objects, one request each (``threads`` at a time, see
    ``parallel``); missing ones are not an error.

    Raises:
      The first error of a delete that failed, once every delete has ended.
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core.exceptions import NotFound
    from google.cloud.storage.retry import DEFAULT_RETRY

    def delete(path: str) -> None:
        try:
            _blob(path).delete(retry=DEFAULT_RETRY)
        except NotFound:
            pass

    failed = parallel(delete, paths, threads)
    if failed:
        raise failed[0][1]


@dataclasses.dataclass(frozen=True)
class ObjectInfo:
    """What GCS says of an object: size, generation and CRC-32C (8 hex digits, or
    ``None`` when it reports none)."""

    size: int
    generation: int
    crc32c: str | None


def object_info(path: str) -> ObjectInfo:
    """The size, generation and CRC-32C of a ``gs://`` object (one metadata request).

    Raises:
      FileNotFoundError: when the object does not exist.
    """
    # pylint: disable=import-outside-toplevel
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, _, name = path[len("gs://"):].partition("/")
    blob = _client().client.bucket(bucket).get_blob(name, retry=DEFAULT_RETRY)
    if blob is None:
        raise FileNotFoundError(f"{path} does not exist")
    return ObjectInfo(int(blob.size), int(blob.generation),
                      crc32c_gcs_to_hex(blob.crc32c) if blob.crc32c else None)


# -- reading an input object: one media GET of the listed generation -------------------

# A read that GCS answers 429, 408 or 5xx (or whose connection breaks) is tried again
# after 0.5 s, 1 s, 2 s, 4 s, then every 8 s (each wait drawn at random up to that),
# for at most this many seconds; then it is a storage error (``ServiceUnavailable``).
READ_RETRY_SECONDS = 60.0
_READ_RETRY_DELAYS = (0.5, 8.0, 2.0)  # initial, maximum, multiplier
# Connections the process's client keeps open per host (requests' default is 10): a
# worker reads with several threads, and the commit renames with a pool.
_POOL_CONNECTIONS = 32


class ObjectUnreadable(Exception):
    """A ``gs://`` object that cannot be read as it was listed: ``why`` is ``gone``
    (deleted), ``changed`` (another generation in its place) or ``refused``
    (401/403); ``message`` says so, for a dead letter (neither the path nor any
    content)."""

    def __init__(self, why: str, message: str):
        super().__init__(why, message)
        self.why = why
        self.message = message


def storage_client():
    """The process's one google-cloud-storage client (that of Beam's ``GcsIO``, made
    on first use with Beam's credentials; see the module docstring), with a
    connection pool sized for reading with threads."""
    client = _client().client
    if not getattr(client, "_beam_tfrecords_pool", False):
        from requests.adapters import HTTPAdapter  # pylint: disable=import-outside-toplevel

        with _lock:
            if not getattr(client, "_beam_tfrecords_pool", False):
                adapter = HTTPAdapter(pool_connections=_POOL_CONNECTIONS, pool_maxsize=_POOL_CONNECTIONS)
                client._http.mount("https://", adapter)  # pylint: disable=protected-access
                client._http.mount("http://", adapter)  # pylint: disable=protected-access
                client._beam_tfrecords_pool = True  # pylint: disable=protected-access
    return client


class _Bounded:
    """A download's sink: passes at most ``limit`` bytes on and keeps their count and
    (with ``crc``) their CRC-32C; raises ``_Enough`` past the limit."""

    def __init__(self, sink, limit: int, crc: bool):
        self.sink = sink
        self.limit = limit
        self.count = 0
        self.crc = None
        if crc:
            import google_crc32c  # pylint: disable=import-outside-toplevel

            self.crc = google_crc32c.Checksum()

    def write(self, data) -> int:
        room = self.limit - self.count
        if len(data) > room:
            data = data[:room]
        if data:
            self.sink.write(data)
            if self.crc is not None:
                self.crc.update(data)
            self.count += len(data)
        if self.count >= self.limit:
            raise _Enough()
        return len(data)


class _Enough(Exception):
    """The bytes asked for have been read: the download stops there."""


def _read_retry():
    # pylint: disable=import-outside-toplevel
    from google.cloud.storage.retry import DEFAULT_RETRY

    initial, maximum, multiplier = _READ_RETRY_DELAYS
    return DEFAULT_RETRY.with_delay(initial=initial, maximum=maximum,
                                    multiplier=multiplier).with_timeout(READ_RETRY_SECONDS)


def _gone(path: str, generation: int) -> ObjectUnreadable:
    """Why a 404 answered a read of ``generation`` (0: the live object): the object
    deleted, or another generation in its place (one metadata request, on this
    path only)."""
    # pylint: disable=import-outside-toplevel
    from google.api_core import exceptions as api

    if generation:
        bucket, _, name = path[len("gs://"):].partition("/")
        try:
            live = storage_client().bucket(bucket).get_blob(name, retry=_read_retry())
        except api.GoogleAPIError:
            live = None
        if live is not None and live.generation and int(live.generation) != generation:
            return _changed(generation, int(live.generation))
    return ObjectUnreadable("gone", "the object no longer exists (deleted after the listing); not converted")


def _changed(listed: int, found: int | None = None) -> ObjectUnreadable:
    now = f", generation {found} now" if found else ""
    return ObjectUnreadable("changed", f"the object changed since the listing (generation {listed} "
                            f"listed{now}); not converted")


def read_object(path: str, sink, limit: int, generation: int = 0, crc32c: int = -1) -> int:
    """Writes at most ``limit`` bytes of a ``gs://`` object to ``sink`` (its ``write``),
    from one media GET of generation ``generation`` (0: the live one), through the
    process's one client (``storage_client``): no metadata request, no new client.

    The GET asks for bytes ``0..limit-1`` (a ``Range``) and names the generation, so
    it reads exactly the object the listing saw: GCS answers 404 for a generation
    that is no longer there (unless the bucket keeps old versions, when that one is
    read). A server that serves another generation all the same (an emulator) is
    caught by the generation it reports, or by ``crc32c`` (the listed CRC-32C, -1:
    not known; checked when the whole object was read).

    Returns:
      The bytes written (``limit`` when the object is larger than ``limit - 1``).

    Raises:
      ObjectUnreadable: the object was deleted, replaced, or is refused (401/403).
      google.api_core.exceptions.ServiceUnavailable: GCS kept answering 429/5xx
        (or dropping the connection) for ``READ_RETRY_SECONDS``.
      google.api_core.exceptions.GoogleAPICallError: another refusal (400, ...).
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core import exceptions as api

    if limit < 1:
        raise ValueError(f"{path}: a read must ask for at least one byte, not {limit}")
    bucket, _, name = path[len("gs://"):].partition("/")
    blob = storage_client().bucket(bucket).blob(name, generation=generation or None)
    bounded = _Bounded(sink, limit, crc32c >= 0)
    try:
        blob.download_to_file(bounded, start=0, end=limit - 1, raw_download=True, checksum=None,
                              retry=_read_retry())
    except _Enough:
        pass
    except api.NotFound:
        raise _gone(path, generation) from None
    except (api.Forbidden, api.Unauthorized) as err:
        raise ObjectUnreadable("refused", f"GCS refused to serve the object ({err.code} "
                               f"{type(err).__name__}): the credentials in use may not read it; "
                               "not converted") from None
    except api.RequestRangeNotSatisfiable:
        pass  # A range from byte 0 of an empty object: nothing to read.
    except api.RetryError as err:
        cause = err.cause if err.cause is not None else err
        raise api.ServiceUnavailable(
            f"{path}: GCS did not serve the object in {READ_RETRY_SECONDS:.0f} s of retries: "
            f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}") from None
    served = blob._properties.get("generation")  # pylint: disable=protected-access  # The response's.
    if generation and served and int(served) != generation:
        raise _changed(generation, int(served))
    if bounded.crc is not None and bounded.count < limit:
        if int.from_bytes(bounded.crc.digest(), "big") != crc32c:
            raise ObjectUnreadable("changed", "the object changed since the listing (its bytes do not "
                                   "match the CRC-32C listed); not converted")
    return bounded.count


def open_object(path: str):
    """A binary stream of a ``gs://`` object (Beam's reader, from the process's one
    ``GcsIO``: one metadata request, then ranged media requests of that
    generation as it is read, retried as Beam retries them).

    Raises:
      google.api_core.exceptions.NotFound, Forbidden, Unauthorized: as GCS answered,
        with a message naming the object and what happened (a file listed and then
        deleted or locked, say), not GCS's URL.
    """
    # pylint: disable=import-outside-toplevel
    from google.api_core import exceptions as api

    try:
        return _client().open(path, "rb")
    except api.NotFound:
        raise api.NotFound(f"{path}: no such object (deleted after it was listed?)") from None
    except (api.Forbidden, api.Unauthorized) as err:
        raise type(err)(f"{path}: GCS refused to serve the object ({type(err).__name__}): the "
                        "credentials in use may not read it") from None


def list_objects(folder: str, below: bool = True) -> dict[str, ObjectInfo]:
    """The objects in a ``gs://`` folder, by path, with their size, generation and
    CRC-32C: one listing (a request per 1,000 objects), instead of a metadata
    request per object. ``below=False``: only those directly in it (not in its
    subfolders). The folder's name is taken literally (no glob)."""
    # pylint: disable=import-outside-toplevel
    from google.cloud.storage.retry import DEFAULT_RETRY

    bucket, _, name = folder[len("gs://"):].partition("/")
    prefix = name.rstrip("/") + "/" if name.strip("/") else ""
    blobs = _client().client.list_blobs(bucket, prefix=prefix or None,
                                        delimiter=None if below else "/", retry=DEFAULT_RETRY)
    return {f"gs://{bucket}/{b.name}": ObjectInfo(int(b.size), int(b.generation),
                                                  crc32c_gcs_to_hex(b.crc32c) if b.crc32c else None)
            for b in blobs}


def _probe(bucket: str, prefix: str, seconds: float) -> None:
    # pylint: disable=import-outside-toplevel
    from google.api_core.retry import Retry

    client = _client().client
    retry = Retry(initial=0.5, maximum=4.0, multiplier=2.0, timeout=seconds)
    pages = client.list_blobs(bucket, prefix=prefix, max_results=1, timeout=(5, 15), retry=retry)
    list(pages)


def check_reachable(path: str, seconds: float | None = None) -> None:
    """Checks, within ``seconds``, that the bucket of a ``gs://`` path answers a
    listing (what a run does first with it).

    Raises:
      ConnectionError: when GCS did not answer in time (network, DNS, emulator
        down, a credential lookup that stalls).
      FileNotFoundError: when the bucket does not exist.
      PermissionError: when the credentials may not list the bucket.
    """
    if not is_gcs(path):
        return
    if seconds is None:
        seconds = float(os.environ.get(PROBE_ENV) or _PROBE_SECONDS)
    # pylint: disable=import-outside-toplevel
    from google.api_core import exceptions as api

    bucket, _, name = path[len("gs://"):].partition("/")
    outcome: list = []

    def probe():
        try:
            _probe(bucket, name, seconds)
            outcome.append(None)
        except BaseException as err:  # pylint: disable=broad-except
            outcome.append(err)

    # A thread, so that a stall anywhere (credentials, DNS, a silent peer) is bounded too.
    thread = threading.Thread(target=probe, name="gcs-probe", daemon=True)
    thread.start()
    thread.join(seconds + 1.0)
    where = f"gs://{bucket}" + (f" (storage emulator {emulator_host()})" if emulator_host() else "")
    if not outcome:
        raise ConnectionError(f"{where} did not answer within {seconds:.0f} s; check the network "
                              f"and credentials (or set {PROBE_ENV} to wait longer)")
    err = outcome[0]
    if err is None:
        return
    if isinstance(err, api.NotFound):
        raise FileNotFoundError(f"bucket gs://{bucket} does not exist")
    if isinstance(err, (api.Forbidden, api.Unauthorized)):
        raise PermissionError(f"the credentials in use may not list gs://{bucket} "
                              f"({type(err).__name__}); check the account and its roles")
    cause = getattr(err, "cause", None) or err
    first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    raise ConnectionError(f"{where} could not be reached within {seconds:.0f} s: "
                          f"{first[:300]}")


if emulator_host():
    use_anonymous_credentials()
