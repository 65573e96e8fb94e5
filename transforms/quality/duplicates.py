"""Duplicates and leakage: images whose content appears more than once, and those
that appear in more than one split (an evaluation set holding training images).

The content is the SHA-256 of the image as stored (``image/key/sha256``), which
every record carries, so the report costs no extra read. Pure Python.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

__all__ = ["LISTED_GROUPS", "DuplicateTally", "content_groups", "duplicate_report", "keep_first"]

# Groups listed in the manifest per kind (all are counted).
LISTED_GROUPS = 1000


def duplicate_report(records: Iterable[tuple[str, str, str]]) -> dict:
    """The duplicates among ``(sha256, split, filename)`` of every record, in one process.

    Returns:
      ``{}`` when every content is unique; else ``{"groups", "images",
      "across_splits", "within_split"}``: counts, then the groups (each
      ``{"sha256", "files": [{"split", "filename"}, ...]}``, files and groups
      sorted) whose copies sit in more than one split, and those within one
      split, at most ``LISTED_GROUPS`` of each (``"listed"`` says how many).
      ``DuplicateTally`` makes the same report from groups found elsewhere.
    """
    tally = DuplicateTally()
    for digest, files in content_groups(records):
        tally.add(digest, files)
    return tally.report()


def content_groups(records: Iterable[tuple[str, str, str]]) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """``(sha256, [(split, filename), ...])`` of each content that more than one of
    the ``(sha256, split, filename)`` records holds (in the order first seen)."""
    seen: dict[str, tuple[str, str]] = {}
    groups: dict[str, list[tuple[str, str]]] = {}
    for digest, split, filename in records:
        first = seen.get(digest)
        if first is None:
            seen[digest] = (split, filename)
        elif digest in groups:
            groups[digest].append((split, filename))
        else:
            groups[digest] = [first, (split, filename)]
    yield from groups.items()


class DuplicateTally:
    """The duplicates report built from groups of copies, one group at a time and
    in any order (groups found on many workers are tallied, and tallies merged):
    every group is counted; only the first ``LISTED_GROUPS`` of each kind, in the
    report's order, are kept."""

    def __init__(self):
        self.groups = self.images = self.across = self.within = 0
        # (sort key, sha256, files) of the groups listed so far, the smallest kept.
        self.across_list: list = []
        self.within_list: list = []

    def add(self, digest: str, files: Iterable[tuple[str, str]]) -> None:
        """Counts one group (``files``: ``(split, filename)`` of its two or more copies)."""
        files = sorted(files)
        self.groups += 1
        self.images += len(files)
        entry = (files, digest)
        if len({split for split, _ in files}) > 1:
            self.across += 1
            self.across_list.append(entry)
            self.across_list = _trimmed(self.across_list)
        else:
            self.within += 1
            self.within_list.append(entry)
            self.within_list = _trimmed(self.within_list)

    def merge(self, other: DuplicateTally) -> DuplicateTally:
        """Adds ``other``'s groups to this tally (and returns it)."""
        self.groups += other.groups
        self.images += other.images
        self.across += other.across
        self.within += other.within
        self.across_list = _trimmed(self.across_list + other.across_list)
        self.within_list = _trimmed(self.within_list + other.within_list)
        return self

    def report(self) -> dict:
        """The report ``duplicate_report`` describes (``{}`` without groups)."""
        if not self.groups:
            return {}

        def section(count: int, entries: list) -> dict:
            listed = [{"sha256": digest, "files": [{"split": s, "filename": f} for s, f in files]}
                      for files, digest in sorted(entries)[:LISTED_GROUPS]]
            return {"groups": count, "listed": min(count, LISTED_GROUPS), "list": listed}

        return {"groups": self.groups, "images": self.images,
                "across_splits": section(self.across, self.across_list),
                "within_split": section(self.within, self.within_list)}


def _trimmed(kept: list) -> list:
    """``kept``, cut to its ``LISTED_GROUPS`` smallest once it holds more than twice
    that (so adding one at a time stays cheap)."""
    return heapq.nsmallest(LISTED_GROUPS, kept) if len(kept) > 2 * LISTED_GROUPS else kept


def keep_first(items: Iterable[tuple[str, str, object]]) -> tuple[list, list[tuple[object, object]]]:
    """Of ``(content, key, item)``, the first item by key of each content.

    Returns:
      ``(kept items in their given order, [(dropped item, the kept item it copies), ...])``.
    """
    items = list(items)
    first: dict[str, tuple[str, object]] = {}
    for content, key, item in items:
        if content not in first or key < first[content][0]:
            first[content] = (key, item)
    kept, dropped = [], []
    for content, key, item in items:
        keeper = first[content]
        if keeper[0] == key and keeper[1] is item:
            kept.append(item)
        else:
            dropped.append((item, keeper[1]))
    return kept, dropped
