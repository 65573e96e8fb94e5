"""Ratio splits (``--splits train=0.8,validation=0.1,test=0.1``): a stable hash of
a key picks each item's split, identically on every run, machine and runner.

The key's SHA-256, read as a number in [0, 1), falls into one split's share of
[0, 1) (shares in the order given). Rows hash ``--key_column`` (or the raw row);
images hash the path relative to the input, or, with ``--split_by content``,
the file's SHA-256 (so copies of one image land in one split).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence

__all__ = ["split_fraction", "split_of"]


def split_fraction(key: str) -> float:
    """A stable number in [0, 1) for a key."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") / 2**64


def split_of(key: str, splits: Sequence[tuple[str, float]]) -> str:
    """The split whose share of [0, 1) holds ``split_fraction(key)``."""
    edges = list(itertools.accumulate(share for _, share in splits))
    index = bisect.bisect_right(edges, split_fraction(key))
    return splits[min(index, len(splits) - 1)][0]
