"""Statistics of the annotations a run wrote: a mergeable accumulator and its JSON.

Issue 21: the manifest reports, per split, what the annotated records hold. Each shard
folds the images it writes into an ``AnnotationStatistics`` (``add``), the commit merges
the shards' (``merge``, in any order: every figure is a whole-number count, so the result
does not depend on the order) and writes ``to_json``. The facts given per image are plain
values taken AFTER the geometry (what the record holds): the output image's width and
height and, per kept object, its class id and its box area in output pixels.

Reported (``to_json``):

- ``images``, ``images_without_objects``, ``objects``;
- ``objects_per_image``: ``min``, ``max``, ``mean`` and a histogram over the bins
  ``0, 1, 2, 3-5, 6-10, 11-20, 21+`` (``HISTOGRAM_BINS``), in bin order;
- ``areas``: objects by COCO's area ranges, by box area in output pixels: ``small``
  below 32², ``medium`` below 96², ``large`` from 96² (``AREA_RANGES``);
- ``classes``: per class id (in id order) its text (from the ``LabelMap``; ``null`` for
  an id the map lacks), its objects and their ``areas``;
- ``problems``: counts by reason (``box_clipped``, ``box_empty``, the reasons of
  ``schemas.annotations.PROBLEM_REASONS`` and whatever else the builder counts).

Keys come out sorted at every level, so ``json.dumps`` gives the same bytes with or
without ``sort_keys``. ``object_class_shares`` gives the classes' shares of the objects,
``{class text: share}``, the shape the drift gate compares a categorical feature's
value shares in.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping

from beam_tfrecords.schemas.annotations import LabelMap

__all__ = [
    "AREA_RANGES",
    "HISTOGRAM_BINS",
    "AnnotationStatistics",
    "area_range",
    "object_class_shares",
]

# COCO's area ranges: (name, upper bound exclusive), the last one unbounded.
AREA_RANGES = (("small", 32 ** 2), ("medium", 96 ** 2), ("large", math.inf))
# Objects per image: (bin name, lowest count, highest count), the last one unbounded.
HISTOGRAM_BINS = (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3-5", 3, 5), ("6-10", 6, 10),
                  ("11-20", 11, 20), ("21+", 21, math.inf))
# A box area may pass its image's by this share (float noise in the geometry).
_AREA_SLACK = 1e-6


def area_range(area: float) -> str:
    """COCO's range of a box area in pixels: ``small`` (< 32²), ``medium`` (< 96²) or
    ``large``."""
    return next(name for name, below in AREA_RANGES if area < below)


def _areas_json(counts: Mapping[str, int]) -> dict[str, int]:
    return {name: counts.get(name, 0) for name, _ in sorted(AREA_RANGES)}


@dataclasses.dataclass
class AnnotationStatistics:
    """Annotation facts of some images, mergeable.

    Attributes:
      per_image: images by how many objects they kept (``{objects: images}``).
      classes: objects by class id.
      areas: objects by ``(class id, area range)``.
      problems: counts by reason.
    """

    per_image: Counter = dataclasses.field(default_factory=Counter)
    classes: Counter = dataclasses.field(default_factory=Counter)
    areas: Counter = dataclasses.field(default_factory=Counter)
    problems: Counter = dataclasses.field(default_factory=Counter)

    def add(self, width: int, height: int, objects: Iterable[tuple[int, float]],
            counts: Iterable[tuple[str, int]] = ()) -> AnnotationStatistics:
        """Adds one image as written; returns these statistics.

        Args:
          width, height: the output image's size in pixels.
          objects: per kept object, ``(class id, box area in output pixels)``.
          counts: ``(reason, n)`` pairs met on this image (``DetectionFeatures.counts``).

        Raises:
          ValueError: a size that is not positive, or an area that is not a finite
            number from 0 to the image's (the caller mixed up its frames).
        """
        if width <= 0 or height <= 0:
            raise ValueError(f"an image of {width}x{height} pixels")
        objects = list(objects)
        for _, area in objects:  # All checked first: a refused image adds nothing.
            if not 0 <= area <= width * height * (1 + _AREA_SLACK):
                raise ValueError(f"a box area of {area} pixels in a {width}x{height} image")
        for label, area in objects:
            self.classes[label] += 1
            self.areas[(label, area_range(area))] += 1
        self.per_image[len(objects)] += 1
        return self.add_counts(counts)

    def add_counts(self, counts: Iterable[tuple[str, int]]) -> AnnotationStatistics:
        """Adds ``(reason, n)`` pairs (problems met outside any image written, too)."""
        for reason, n in counts:
            self.problems[reason] += n
        return self

    def merge(self, other: AnnotationStatistics) -> AnnotationStatistics:
        """Adds ``other`` into these statistics; returns them."""
        self.per_image.update(other.per_image)
        self.classes.update(other.classes)
        self.areas.update(other.areas)
        self.problems.update(other.problems)
        return self

    def _per_image_json(self, images: int, objects: int) -> dict:
        present = [k for k, n in self.per_image.items() if n]
        histogram = [{"images": sum(n for k, n in self.per_image.items() if low <= k <= high),
                      "objects": name} for name, low, high in HISTOGRAM_BINS]
        return {"histogram": histogram,
                "max": max(present) if present else None,
                "mean": objects / images if images else None,
                "min": min(present) if present else None}

    def to_json(self, label_map: LabelMap) -> dict:
        """The statistics (see the module docstring), keys sorted at every level."""
        images = sum(self.per_image.values())
        objects = sum(self.classes.values())
        names = dict(label_map.items)
        overall: Counter = Counter()
        by_class: dict[int, Counter] = {}
        for (label, name), n in self.areas.items():
            overall[name] += n
            by_class.setdefault(label, Counter())[name] += n
        classes = [{"areas": _areas_json(by_class.get(label, {})), "id": label,
                    "objects": self.classes[label], "text": names.get(label)}
                   for label in sorted(k for k, n in self.classes.items() if n)]
        return {
            "areas": _areas_json(overall),
            "classes": classes,
            "images": images,
            "images_without_objects": self.per_image.get(0, 0),
            "objects": objects,
            "objects_per_image": self._per_image_json(images, objects),
            "problems": {reason: n for reason, n in sorted(self.problems.items()) if n},
        }


def object_class_shares(statistics: Mapping) -> dict[str, float]:
    """Each class's share of the objects, ``{class text: share}`` in text order, from
    ``AnnotationStatistics.to_json`` (a run's, or an old manifest's): the shape the drift
    gate compares a categorical feature's value shares in. A class without text counts
    as ``"id N"``; classes that share a text add up. Empty when there are no objects."""
    objects = statistics.get("objects") or 0
    if not objects:
        return {}
    counts: Counter = Counter()
    for entry in statistics.get("classes") or ():
        text = entry.get("text")
        counts[text if text is not None else f"id {entry['id']}"] += entry["objects"]
    return {text: counts[text] / objects for text in sorted(counts)}
