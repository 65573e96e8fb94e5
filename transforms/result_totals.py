"""Shard results as the commit keeps them (``FoldedResults``): counts summed per split
as the results arrive, so the commit holds a few counts per split, not every shard's."""

from __future__ import annotations

import dataclasses
from collections import Counter

from beam_tfrecords.schemas.elements import ShardResult
from beam_tfrecords.transforms.io import annotated_output as annotated_io

__all__ = ["FoldedResults"]


class FoldedResults:
    """Shard results as the commit keeps them: each split's label, image and note
    counts summed as the results arrive, and carried by the split's first shard's
    result alone (whatever reads them sums a split's: the manifest's label counts,
    the statistics, the image notes; an annotated run's statistics likewise), so the
    commit holds a few counts per split, not a thousand classes per shard."""

    _COUNTS = ("label_counts", "image_counts", "note_counts")

    def __init__(self):
        self._results: list[ShardResult] = []
        self._totals: dict[str, dict[str, Counter]] = {}

    def add(self, result: ShardResult) -> None:
        totals = self._totals.setdefault(result.split, {name: Counter() for name in self._COUNTS})
        for name in self._COUNTS:
            totals[name].update(dict(getattr(result, name)))
        totals["annotations"] = annotated_io.merged_statistics(totals.get("annotations"), result.annotations)
        self._results.append(dataclasses.replace(result, label_counts=(), image_counts=(), note_counts=(),
                                                 annotations=None))

    def results(self) -> list[ShardResult]:
        first: dict[str, int] = {}
        for number, result in enumerate(self._results):
            if result.split not in first or result.index < self._results[first[result.split]].index:
                first[result.split] = number
        for split, number in first.items():
            totals = self._totals[split]
            self._results[number] = dataclasses.replace(
                self._results[number], annotations=totals["annotations"],
                **{name: tuple(sorted(totals[name].items())) for name in self._COUNTS})
        return self._results
