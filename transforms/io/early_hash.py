"""The content hash of a table the CLI was given, started before Beam is imported.

``convert --input TABLE`` records the table's SHA-256 in the input fingerprint
(``io.fingerprint.hash_entries``): ~0.5 s a GB on one core, which the preflight
waited for. The CLI starts it in a thread at its very start (``hash_early``), while
its imports run on the other core; ``hash_entries`` takes the result
(``take_early_hash``) when the file's size and modification time are still those
it had then, and hashes the file itself otherwise. Light: no Beam, no numpy.
"""

from __future__ import annotations

import os
import stat
import threading

from beam_tfrecords.transforms.io.bounded_read import InputRefused, sha256_input

__all__ = ["hash_early", "take_early_hash"]


class _Hash:
    """One file's hash in the making: ``(size, mtime_ns)`` when it started, and its
    hex digest ('' when the file could not be hashed) once ``done`` is set."""

    def __init__(self, size: int, mtime_ns: int):
        self.size = size
        self.mtime_ns = mtime_ns
        self.digest = ""
        self.done = threading.Event()


_EARLY: dict[str, _Hash] = {}


def hash_early(path: str) -> None:
    """Starts hashing the local regular file ``path`` in a daemon thread (nothing for
    anything else, or a path started already)."""
    path = os.path.abspath(path)
    if path in _EARLY:
        return
    try:
        info = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode):
        return
    job = _EARLY[path] = _Hash(info.st_size, info.st_mtime_ns)

    def run() -> None:
        try:
            job.digest = sha256_input(path, job.size)
        except (OSError, InputRefused):
            job.digest = ""
        finally:
            job.done.set()

    threading.Thread(target=run, name="hash-early", daemon=True).start()


def take_early_hash(path: str, size: int, mtime_ns: int) -> str:
    """The SHA-256 ``hash_early`` made of ``path``, waited for, when the file had
    ``size`` and ``mtime_ns`` then too; '' when it made none (or the file has changed
    since, or could not be read): the caller hashes the file itself."""
    job = _EARLY.get(os.path.abspath(path))
    if job is None or (job.size, job.mtime_ns) != (size, mtime_ns):
        return ""
    job.done.wait()
    return job.digest
