"""Named points in a run where a test can stop the process, to prove the commit order.

``BEAM_TFRECORDS_HOLD_AT=<point>`` and ``BEAM_TFRECORDS_HOLD_DIR=<folder>`` make the
first process that reaches ``<point>`` create ``<folder>/<point>`` and then wait
there; the test sees the file and kills the process tree (``kill -9``) at that
exact place. Unset (always, outside tests), ``hold_point`` is one dict lookup.
"""

from __future__ import annotations

import os
import time

__all__ = ["POINTS", "hold_point"]

POINTS = (
    "listing",          # inputs being listed or read
    "mid_write",        # a shard partly written under its temporary name
    "mid_verify",       # a written shard being re-read
    "before_commit",    # every shard verified, nothing published yet
    "mid_commit",       # some shards moved to their final names, no manifest yet
    "manifest_staged",  # every shard at its final name, manifest not yet published
)
_ENV_POINT = "BEAM_TFRECORDS_HOLD_AT"
_ENV_DIR = "BEAM_TFRECORDS_HOLD_DIR"


def hold_point(name: str) -> None:
    """Waits forever at ``name`` when a test asked for it; otherwise returns at once."""
    if os.environ.get(_ENV_POINT) != name:
        return
    folder = os.environ.get(_ENV_DIR, ".")
    try:
        fd = os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return  # Another process holds here already; let this one go on.
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    while True:
        time.sleep(1)
