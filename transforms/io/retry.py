"""Trying a storage step again, with backoff: the one retry loop of the shard
writer and verifier (``transforms/shard_engine.py``).

A step is run up to ``ATTEMPTS`` times in all, waiting ``BACKOFF_SECONDS``, then
twice that, and so on, between attempts; each retry is logged as a warning that
says what failed, which attempt of how many, and the wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["ATTEMPTS", "BACKOFF_SECONDS", "retried"]

# A step whose storage fails is run this many times in all, waiting 1 s, 2 s, ... between.
ATTEMPTS = 3
BACKOFF_SECONDS = 1.0

T = TypeVar("T")


def retried(attempt: Callable[[], T], failure: Callable[[T], str], subject: Callable[[T], str],
            again: str, log: logging.Logger, attempts: int = ATTEMPTS) -> T:
    """Runs ``attempt`` until ``failure`` finds nothing to retry, or ``attempts`` times.

    Args:
      attempt: one try of the step; returns its outcome (errors to retry are
        caught in it and returned as part of the outcome).
      failure: an outcome → why it is to be tried again ('' when it is not).
      subject: an outcome → what failed, for the warning ("Writing <path>").
      again: what happens next, for the warning ("retrying", "re-reading").
      log: the caller's logger, which logs the warning (it is the step's).
      attempts: how many tries in all (at least 1).

    Returns:
      The last outcome: the first that needs no retry, or the last try's.
    """
    for number in range(1, attempts + 1):
        outcome = attempt()
        reason = failure(outcome)
        if not reason or number == attempts:
            return outcome
        wait = BACKOFF_SECONDS * 2 ** (number - 1)
        log.warning("%s failed (attempt %d of %d), %s in %.0f s: %s",
                     subject(outcome), number, attempts, again, wait, reason)
        time.sleep(wait)
    raise ValueError(f"attempts must be at least 1, got {attempts}")
