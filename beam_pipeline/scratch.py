"""The run's own temporary folder: whatever the process puts in ``$TMPDIR`` (Beam
does, on every run) goes into one folder, removed when the run ends.

Beam's DirectRunner makes temporary folders on every run and leaves some behind:
two ``tmp*`` (``python_sdk_dependencies`` in ``transforms/environments.py``, once
for the Prism runner it tries first and once for the loopback environment;
never removed), one ``beam-temp*`` (the Prism job server's, removed only when
that server stops, which it never does when Prism cannot start), and
``beam-requirements-cache`` (the stager's cache of the packages a
``--requirements_file`` names, kept on purpose across runs; empty otherwise).
``keep_requirements_cache`` leaves that cache where Beam keeps it when a run has
a requirements file; otherwise it is empty and goes too. ``RunScratch`` points
Python's ``tempfile`` at a fresh ``$TMPDIR/beam-tfrecords-run-<pid>-<random>/``
for the run and removes it, with all of these in it, on the way out: normal
end, failure, a refusal, Ctrl-C and SIGTERM (``cleanup`` is called from the
CLI's signal handlers). Only ``kill -9`` leaves it; the next run removes such a
folder once the process named in its marker file is gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

__all__ = ["RunScratch", "cleanup", "keep_requirements_cache"]

_PREFIX = "beam-tfrecords-run-"
_MARKER = ".beam-tfrecords-scratch"
_lock = threading.RLock()  # A signal handler may close the scratch while the main thread holds it.
_active: RunScratch | None = None


class RunScratch:
    """``with RunScratch():`` runs the block with ``tempfile`` making everything in a
    folder of its own, removed at the end (whatever happened)."""

    def __init__(self):
        self.path = ""
        self._before: str | None = None

    def __enter__(self) -> RunScratch:
        global _active  # pylint: disable=global-statement
        base = tempfile.gettempdir()
        _remove_abandoned(base)
        self.path = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)
        with open(os.path.join(self.path, _MARKER), "w", encoding="ascii") as f:
            f.write(f"{os.getpid()}\n")
        with _lock:
            self._before, tempfile.tempdir = tempfile.tempdir, self.path
            _active = self
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Restores ``tempfile`` and removes the folder (twice is harmless)."""
        global _active  # pylint: disable=global-statement
        with _lock:
            if _active is self:
                tempfile.tempdir = self._before
                _active = None
        if self.path:
            shutil.rmtree(self.path, ignore_errors=True)  # Links inside are unlinked, not followed.


def _given(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def keep_requirements_cache(beam_args: Sequence[str]) -> list[str]:
    """Beam's flags, with ``--requirements_cache`` at Beam's own default place
    (``$TMPDIR/beam-requirements-cache``) when a ``--requirements_file`` is given
    without one: Beam keeps the packages it downloads there on purpose, for the next
    runs, so that cache must not go with the run's folder. Call before ``RunScratch``."""
    args = list(beam_args)
    if _given(args, "--requirements_file") and not _given(args, "--requirements_cache"):
        args.append(f"--requirements_cache={os.path.join(tempfile.gettempdir(), 'beam-requirements-cache')}")
    return args


def cleanup() -> None:
    """Removes the running run's folder now (from a signal handler, before exiting)."""
    active = _active
    if active is not None:
        active.close()


def _remove_abandoned(base: str) -> None:
    """Removes the folders of runs killed with ``kill -9``: ours by name and marker,
    and the process the marker names is gone."""
    try:
        names = [n for n in os.listdir(base) if n.startswith(_PREFIX)]
    except OSError:
        return
    for name in names:
        folder = os.path.join(base, name)
        try:
            if os.path.islink(folder):
                continue
            with open(os.path.join(folder, _MARKER), encoding="ascii") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue  # No marker of ours: not ours to remove.
        if pid == os.getpid() or _alive(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Another user's process: alive.
    return True
