"""The main module that helper processes start from: all but empty.

multiprocessing's spawn re-runs the parent's ``__main__`` in every child. The
shard writer's helpers are spawned with this module standing in as
``__main__``, so a child never re-runs the user's script or CLI (which would
repeat its side effects, or load Beam for nothing).

Run as a helper's main (``__mp_main__``), before anything imports numpy, it
tells numpy's OpenBLAS to start no threads: a helper does no linear algebra,
and OpenBLAS's thread per core cost ~0.1 s of CPU per helper to start (0.39 s
for a pool of two on 2 cores, 0.30 s without). Imported in the parent (to
stand in while helpers spawn), it does nothing.
"""

import os

if __name__ == "__mp_main__":
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
