"""What an annotated run (issue 21) adds to its shards' results and to its commit.

Shards. Each image the record builder encoded with an annotation attachment has a
report (``ImageOutcome.report``, an ``AttachReport``): counts by reason, the objects
it dropped (``AnnotationProblem``, the image kept) and, per object written, its
class id and box area in output pixels. ``image_facts`` keeps of an outcome what
the statistics need, ``(width, height, objects, counts)``; the shard writer folds
its records' facts into one ``AnnotationStatistics`` (``fold_facts``) and writes
each dropped object as a dead letter of stage ``object`` (``object_letters``) into
the shard's dead-letter file, beside its images' letters. The error budget counts
images: ``image_bad_counts`` leaves the ``object`` letters out of a shard's bad
counts (the manifest counts them by reason under ``annotations.problems``).

Counts by reason. A report's ``counts`` hold what the builder counted (``box_clipped``,
``box_empty``, ``exif_rotated``, ...); a dropped object whose reason the counts do
not hold (``box_not_finite``) is added once per object (``report_counts``).

Commit. ``split_statistics`` merges the shards' statistics per split (in any
order); ``annotations_json`` is the manifest's ``annotations`` section;
``label_map_bytes`` the bytes of ``label_map.pbtxt``, which the commit stages in
its temporary folder (``stage_label_map``) and moves beside the manifest with the
shards (journalled, ownership-checked: ``transforms.io.commit.publish``);
``annotated_feature_spec`` the manifest's feature spec of the records written.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.annotations import DETECTION_KEYS, LABEL_MAP_NAME, AnnotatedRun, LabelMap
from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.features import FeatureSpec, image_feature_spec
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.image_records import AttachReport
from beam_tfrecords.transforms.io.ownership import Claim
from beam_tfrecords.transforms.quality.annotation_stats import AnnotationStatistics

__all__ = [
    "CUSTOM_LAYOUT",
    "OBJECT_STAGE",
    "annotated_feature_spec",
    "annotations_json",
    "annotations_section",
    "fold_facts",
    "image_bad_counts",
    "image_facts",
    "label_map_bytes",
    "merged_statistics",
    "object_letters",
    "report_counts",
    "split_statistics",
    "split_statistics_json",
    "stage_label_map",
    "vocabulary_of",
]

OBJECT_STAGE = "object"
# The layout a library user's run is recorded with when it passes its own
# AnnotationAttach to convert(attach=...) (no --layout was given).
CUSTOM_LAYOUT = "custom"
# The per-object keys (lists, one value per object).
_OBJECT_KEYS = tuple(k for k in DETECTION_KEYS if k.startswith("image/object/") and k != "image/object/mask")
_SEGMENTATION_KEYS = ("image/segmentation/class/encoded", "image/segmentation/class/format")
_CLASS_KEYS = ("image/class/label", "image/class/text")


_BOXLESS = ("multi_label",)  # Layouts whose objects the statistics do not count.


def report_counts(report: AttachReport) -> tuple[tuple[str, int], ...]:
    """A report's counts by reason, with each dropped object whose reason they do
    not count added (see the module docstring), sorted."""
    counts = Counter(dict(report.counts))
    counted = set(counts)
    for problem in report.problems:
        if problem.reason not in counted:
            counts[problem.reason] += 1
    return tuple(sorted((reason, n) for reason, n in counts.items() if n))


def image_facts(outcome) -> tuple | None:
    """``(width, height, objects, counts)`` of an ``ImageOutcome`` with a report (the
    stored image's size, ``AttachReport.objects``, ``report_counts``); ``None``
    for an image encoded without one (a plain record)."""
    report = outcome.report
    if report is None:
        return None
    return (outcome.image[2], outcome.image[3], tuple(report.objects), report_counts(report))


def object_letters(filename: str, report: AttachReport | None) -> list[DeadLetter]:
    """The objects a report dropped, as dead letters of stage ``object``: the source
    names the object (file, line or id), the error its reason, the message its
    detail and the image (``filename``, as ``image/filename``), which was kept."""
    if report is None:
        return []
    return [DeadLetter(problem.source or filename, OBJECT_STAGE, problem.reason,
                       f"{problem.detail}; the object was left out of {filename}, the image kept")
            for problem in report.problems]


def image_bad_counts(letters: Iterable[DeadLetter]) -> tuple[tuple[str, int], ...]:
    """Dead letters by reason, those of dropped objects (stage ``object``) left out:
    what the error budget counts (images)."""
    return tuple(sorted(Counter(d.error for d in letters if d.stage != OBJECT_STAGE).items()))


def fold_facts(facts: Iterable[tuple | None], into: AnnotationStatistics | None = None
               ) -> AnnotationStatistics | None:
    """Adds images' facts (``image_facts``; ``None`` ones skipped) to ``into`` (a new
    accumulator when ``None`` and some image has facts); returns it."""
    for fact in facts:
        if fact is None:
            continue
        into = into if into is not None else AnnotationStatistics()
        width, height, objects, counts = fact
        into.add(width, height, objects, counts)
    return into


def merged_statistics(total: AnnotationStatistics | None,
                      more: AnnotationStatistics | None) -> AnnotationStatistics | None:
    """``total`` with ``more`` merged in (a new accumulator, the arguments unchanged);
    ``None`` when both are."""
    if more is None:
        return total
    return AnnotationStatistics().merge(total or AnnotationStatistics()).merge(more)


def split_statistics(results: Iterable) -> dict[str, AnnotationStatistics]:
    """The shards' annotation statistics (``ShardResult.annotations``) merged per
    split; splits without any are left out."""
    merged: dict[str, AnnotationStatistics] = {}
    for result in results:
        stats = getattr(result, "annotations", None)
        if stats is not None:
            merged.setdefault(result.split, AnnotationStatistics()).merge(stats)
    return merged


def label_map_bytes(label_map: LabelMap) -> bytes:
    """``label_map.pbtxt`` as written: ``LabelMap.to_pbtxt`` in UTF-8."""
    return label_map.to_pbtxt().encode("utf-8")


def stage_label_map(output: str, temp_dir: str, label_map: LabelMap) -> tuple[str, str, Claim]:
    """Writes ``label_map.pbtxt`` into the run's temporary folder; returns the move
    the commit makes (``(staged path, final path)``) and what its journal records."""
    data = label_map_bytes(label_map)
    staged, final = files.join(temp_dir, LABEL_MAP_NAME), files.join(output, LABEL_MAP_NAME)
    if files.read_bytes_if_exists(staged) != data:
        files.write_bytes(staged, data)
    return staged, final, Claim(LABEL_MAP_NAME, len(data), hashlib.sha256(data).hexdigest())


def annotated_feature_spec(annotated: AnnotatedRun, extra_features: Mapping[str, str] | None = None
                           ) -> FeatureSpec:
    """The features of an annotated run's records: the image's (but ``image/class/*``
    for detection layouts, which write classes per object), ``image/source_id``,
    the per-object lists (shape ``[None]``), ``image/object/mask`` with instance
    masks, the semantic mask's two keys with ``--masks``, and for several labels
    per image ``image/class/label`` and ``text`` as lists. A ``custom`` run (a
    library user's attachment) keeps the listing's one label per image."""
    entries = {name: (dtype, shape) for name, dtype, shape in image_feature_spec(extra_features).entries()}
    layout = annotated.layout
    if layout != CUSTOM_LAYOUT:
        for name in _CLASS_KEYS:
            entries.pop(name, None)
    entries["image/source_id"] = (DETECTION_KEYS["image/source_id"], [])
    if layout == "multi_label":
        entries.update({name: (DETECTION_KEYS[name], [None]) for name in _CLASS_KEYS})
    else:
        entries.update({name: (DETECTION_KEYS[name], [None]) for name in _OBJECT_KEYS})
    if annotated.instance_masks:
        entries["image/object/mask"] = (DETECTION_KEYS["image/object/mask"], [None])
    if layout == "masks" or annotated.mask_root:
        entries.update({name: (DETECTION_KEYS[name], []) for name in _SEGMENTATION_KEYS})
    return FeatureSpec(entries)


def annotations_json(annotated: AnnotatedRun, per_split: Mapping[str, AnnotationStatistics],
                     label_map_sha256: str, object_letters_total: int = 0) -> dict:
    """The manifest's ``annotations`` section (keys sorted at every level).

    ``label_map``: the file beside the manifest (``path``, ``sha256``) and its
    ``items`` ``[{"id", "name"}]`` in id order: the ids are the ones the records'
    ``image/object/class/label`` hold (COCO's category ids as given, so they need
    not be contiguous; else 1, 2, ... in the label map's order; 0 is the
    background). ``problems``: by reason, the launcher's (reading the annotations)
    and the workers' (each image against its annotations) added up.
    ``images_without_objects``: written with no object (negative examples; for
    ``masks``, an image's objects are the classes its written mask holds, 0 the
    background left out: images without a mask or with background only; for
    ``multi_label``, the images without labels, as the launcher counted them), as
    ``statistics.images_without_objects`` says but for ``multi_label``;
    ``listed_without_objects``: the images without objects the launcher's listing
    found (before any image was read), kept or left out by ``--drop_empty``;
    ``dropped_empty``: those left out (so ``listed_without_objects - dropped_empty``
    were listed to be written); ``objects_dead_lettered``:
    the ``object`` dead letters written.
    ``statistics``: all splits' merged (``AnnotationStatistics.to_json``; each
    split's are in its ``statistics.annotations``).
    """
    total = AnnotationStatistics()
    for stats in per_split.values():
        total.merge(stats)
    problems = Counter(dict(annotated.problems))
    problems.update(total.problems)
    return {
        "dropped_empty": annotated.dropped_empty,
        # Several labels: an image's objects are its labels, which the launcher saw: its
        # count, not the statistics' (no boxes at all). Semantic masks: the classes each
        # written mask holds, in the statistics (AnnotationOptions.mask_classes).
        "images_without_objects": (annotated.images_without_objects if annotated.layout in _BOXLESS
                                   else total.per_image.get(0, 0)),
        "listed_without_objects": annotated.images_without_objects + annotated.dropped_empty,
        "label_map": {"items": [{"id": label, "name": name} for label, name in annotated.label_map.items],
                      "path": LABEL_MAP_NAME, "sha256": label_map_sha256},
        "layout": annotated.layout,
        "objects_dead_lettered": object_letters_total,
        "problems": {reason: n for reason, n in sorted(problems.items()) if n},
        "statistics": total.to_json(annotated.label_map),
    }


def vocabulary_of(label_map: LabelMap) -> list[str]:
    """The manifest's vocabulary of an annotated run: the class names in id order."""
    return [name for _, name in sorted(label_map.items)]



def split_statistics_json(annotated: AnnotatedRun | None, results: Iterable) -> dict[str, dict]:
    """Each split's annotation statistics as JSON (``{}`` for a plain run): what the
    commit puts in ``splits.<split>.statistics.annotations`` and the drift gate
    compares (object class shares)."""
    if annotated is None:
        return {}
    return {split: stats.to_json(annotated.label_map)
            for split, stats in sorted(split_statistics(results).items())}


def annotations_section(annotated: AnnotatedRun, results: Sequence) -> dict:
    """``annotations_json`` of a run's shard results."""
    return annotations_json(annotated, split_statistics(results),
                            hashlib.sha256(label_map_bytes(annotated.label_map)).hexdigest(),
                            sum(getattr(r, "objects_dead_lettered", 0) for r in results))
