"""The benchmarks' memory figure of a process tree: its PSS, and the RSS summed beside it.

The CLI forks its helper processes: each shares most of its pages with the launcher.
Summed over the tree, RSS counts such a page once per process; PSS splits it among
them, so the tree's PSS is its memory. A tree of a process and a forked child
sharing 64 MB must show 64 MB once in its PSS and twice in its summed RSS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_images  # noqa: E402  # pylint: disable=wrong-import-position

MB = 1 << 20

_SHARING = textwrap.dedent("""
    import os, sys, time
    shared = bytearray(64 << 20)
    for i in range(0, len(shared), 4096):
        shared[i] = 1  # Every page resident.
    end, keep = os.pipe()
    if os.fork() == 0:  # Ends when its parent does (the pipe's last writer gone).
        os.close(keep)
        os.read(end, 1)
        os._exit(0)
    print("ready", flush=True)
    time.sleep(30)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs /proc/<pid>/smaps_rollup")
def test_a_forked_childs_shared_pages_count_once_in_the_trees_pss():
    tree = subprocess.Popen([sys.executable, "-c", _SHARING], stdout=subprocess.PIPE, text=True)
    try:
        assert tree.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        rss, pss = bench_images.tree_memory_bytes(tree.pid)
    finally:
        tree.kill()
        tree.wait()
    assert rss - pss > 56 * MB  # The 64 MB counted twice in the RSS, once in the PSS.
    assert 64 * MB < pss < 64 * MB + rss / 2
    assert bench_images.tree_memory_bytes(tree.pid) == (0, 0)  # Gone: nothing left to count.
