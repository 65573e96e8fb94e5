"""Named points in a run where a test can stop the process, to prove the commit order.

``BEAM_TFRECORDS_HOLD_AT=<point>`` and ``BEAM_TFRECORDS_HOLD_DIR=<folder>`` make the
first process that reaches ``<point>`` create ``<folder>/<point>`` and then wait
there; the test sees the file and either kills the process tree (``kill -9``) at
that exact place, or deletes the file, and the process goes on (no process holds
at that point again: ``<folder>/<point>.claimed`` stays).

They are test hooks, honoured only with the test switch
``BEAM_TFRECORDS_TEST_HOOKS=1`` (and then logged as a WARNING by every process
that meets them): a production run that inherits ``BEAM_TFRECORDS_HOLD_AT`` from
somewhere would otherwise wait forever, holding its output's lock. Without the
switch they are ignored, and said so once per process. Unset (always, outside
tests), ``hold_point`` is one dict lookup.
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = ["COMMIT_POINTS", "HOOKS_ENV", "POINTS", "announce_hooks", "hold_point", "test_hooks_on"]

POINTS = (
    "listing",          # inputs being listed or read
    "mid_write",        # a shard partly written under its temporary name
    "mid_verify",       # a written shard being re-read
    "before_commit",    # every shard verified, nothing published yet
    "mid_commit",       # some shards moved to their final names, no manifest yet
    "manifest_staged",  # every shard at its final name, manifest not yet published
)
# Inside the commit, each of which a retried commit must get past (issue 19;
# tests/test_dataflow_commit_retry.py stops a commit at each and runs it again):
COMMIT_POINTS = (
    "before_commit",        # manifest and decisions staged, journal written, nothing moved
    "rename",               # before each move (the first of them holds)
    "kept_aside",           # a file of the old dataset kept aside, the new one not yet in its place
    "rename_copied",        # gs://: a shard copied to its final name, its source not deleted
    "mid_commit",           # half the moves made
    "manifest_staged",      # every move made, the new manifest not published
    "manifest_published",   # the new manifest published, stale files not removed
    "before_register",      # an incremental part published, not yet listed in the dataset
    "before_report",        # stale files removed (or a failed run's temporaries), no report
    "report_written",       # the run report written, temporaries and lock still there
    "temporaries_removed",  # the temporary folder removed, the lock not released
)
# Also, not crash points: ``lock_takeover`` (a gone holder's lock read, not yet taken
# over), ``dataflow_submit`` (the output locked, the Dataflow job not yet submitted) and
# ``lock_record`` (the lock read, the submitted job's id not yet written into it).
HOOKS_ENV = "BEAM_TFRECORDS_TEST_HOOKS"
_ENV_POINT = "BEAM_TFRECORDS_HOLD_AT"
_ENV_DIR = "BEAM_TFRECORDS_HOLD_DIR"
_POLL_SECONDS = 0.05
_log = logging.getLogger(__name__)
_said = threading.Lock()
_told: set[str] = set()


def test_hooks_on() -> bool:
    """Whether this process runs under the test switch (``BEAM_TFRECORDS_TEST_HOOKS=1``)."""
    return os.environ.get(HOOKS_ENV) == "1"


def _once(key: str, level: int, message: str, *args) -> None:
    with _said:
        if key in _told:
            return
        _told.add(key)
    _log.log(level, message, *args)


def announce_hooks() -> str | None:
    """Logs (a WARNING, once per process) that a hold point is asked for, and
    whether it is honoured; returns the point when it is, else ``None``."""
    point = os.environ.get(_ENV_POINT)
    if point is None:
        return None
    if not test_hooks_on():
        _once("ignored", logging.WARNING, "%s=%r is set but ignored: it is a test hook, honoured "
              "only with %s=1", _ENV_POINT, point[:40], HOOKS_ENV)
        return None
    _once("active", logging.WARNING, "TEST HOOKS ACTIVE (%s=1): this run stops at hold point %r",
          HOOKS_ENV, point[:40])
    return point


def hold_point(name: str) -> None:
    """Waits at ``name`` when a test asked for it (see the module docstring);
    otherwise returns at once."""
    if os.environ.get(_ENV_POINT) is None or announce_hooks() != name:
        return
    folder = os.environ.get(_ENV_DIR, ".")
    flag = os.path.join(folder, name)
    try:  # Claimed once for good: after a release, no process holds here again.
        os.close(os.open(flag + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return  # Another process holds (or held) here already; let this one go on.
    fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    _log.warning("TEST HOOK: holding at %r until %s is removed", name, flag)
    while os.path.exists(flag):
        time.sleep(_POLL_SECONDS)
    _log.warning("TEST HOOK: released at %r", name)
