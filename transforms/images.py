"""ListImages: find the images of a dataset and label them, without reading them.

The listing is metadata only (path, size, split, label), so it costs memory in
proportion to the file count. It runs in one worker, as a file match does;
everything after it is spread over shards.
"""

from __future__ import annotations

import logging
from collections import Counter

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError

from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.elements import ImageRefs, InputSummary
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.helpers import SMALL_FILE_BYTES, helper_pool
from beam_tfrecords.transforms.plan.layouts import (
    CIFAR_LABELS_FILE,
    Listing,
    detect_layout,
    list_cifar,
    list_class_folders,
    list_csv_manifest,
    parse_labels_text,
    resolve_input,
)

__all__ = ["DEAD_LETTER_DIR", "ListImages", "list_images"]

DEAD_LETTER_DIR = "dead_letter"
SUMMARY_TAG = "summary"
_log = logging.getLogger(__name__)


def list_images(config: ConvertConfig) -> Listing:
    """Lists and labels the images that ``config.input`` names.

    Raises:
      ValueError: when the labels file or CSV manifest cannot be used (these are
        caught before the pipeline runs; see ``beam_pipeline.convert``).
    """
    layout, root, pattern = resolve_input(config.input, config.layout)
    labels = parse_labels_text(files.read_text(config.labels)) if config.labels else None
    if layout == "csv":
        under_root = dict(files.list_files(files.join(root, "**")))

        def size_of(path: str) -> int | None:
            if path in under_root:
                return under_root[path]
            try:
                found = files.list_files(path, limit=1)
            except BeamIOError:
                return None
            return found[0][1] if found else None

        return list_csv_manifest(config.input, files.read_text(config.input), size_of, labels)
    found = files.list_files(pattern)
    if layout == "auto":
        layout = detect_layout(root, (path for path, _ in found))
    if layout == "cifar":
        labels_text = "\n".join(labels) if labels else files.read_text(files.join(root, CIFAR_LABELS_FILE))
        return list_cifar(root, found, labels_text)
    return list_class_folders(root, found, labels)


def _write_dead_letters(output: str, name: str, letters) -> str:
    """Writes dead letters as JSON lines; returns the path relative to ``output``."""
    if not letters:
        return ""
    relative = f"{DEAD_LETTER_DIR}/{name}.jsonl"
    files.write_bytes(files.join(output, relative),
                      "".join(d.to_json_line() for d in letters).encode("utf-8"))
    return relative


class _ListImagesFn(beam.DoFn):
    """Impulse → one ``ImageRefs`` of all images (main) and one ``InputSummary``
    (tagged ``summary``)."""

    def __init__(self, config: ConvertConfig):
        self._config = config

    def process(self, _):
        config = self._config
        listing = list_images(config)
        if config.encode_processes > 0 and listing.refs and (
            sum(r.size for r in listing.refs) < SMALL_FILE_BYTES * len(listing.refs)
        ):
            # Small files: start the shard writers' helper processes while planning runs.
            helper_pool(config.encode_processes)
        _, root, _ = resolve_input(config.input, config.layout)
        dead_path = _write_dead_letters(config.output, "listing", listing.dead_letters)
        bad = Counter(d.error for d in listing.dead_letters)
        images = len(listing.refs) + len(listing.dead_letters)
        _log.info(
            "Listed %d images (%d refused, %d other files ignored) in layout %s",
            images, len(listing.dead_letters), listing.ignored, listing.layout,
        )
        beam.metrics.Metrics.counter("list", "images").inc(len(listing.refs))
        beam.metrics.Metrics.counter("list", "dead_letter").inc(len(listing.dead_letters))
        yield beam.pvalue.TaggedOutput(
            SUMMARY_TAG,
            InputSummary(
                root=root,
                layout=listing.layout,
                input_files=images,
                input_bytes=sum(r.size for r in listing.refs),
                ignored_files=listing.ignored,
                vocabulary=tuple(listing.vocabulary),
                extra_features=tuple(listing.extra_features.items()),
                bad_counts=tuple(sorted(bad.items())),
                dead_letter_path=dead_path,
            ),
        )
        yield ImageRefs.pack(listing.refs)


class ListImages(beam.PTransform):
    """Lists the images of ``config.input``.

    Returns a ``DoOutputsTuple``: ``.refs`` holds one ``ImageRefs`` element;
    ``.summary`` holds one ``InputSummary``.
    """

    def __init__(self, config: ConvertConfig):
        super().__init__()
        self._config = config

    def expand(self, pbegin):
        return (
            pbegin
            | "Impulse" >> beam.Create([None])
            | "ListAndLabel"
            >> beam.ParDo(_ListImagesFn(self._config)).with_outputs(SUMMARY_TAG, main="refs")
        )
