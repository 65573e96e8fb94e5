"""A batch of images encoded in one task (a helper process's, or a thread's), handed
back in the shape the shard writer takes it.

The shard writer's record source (``image_steps.ImageRecords``) cuts a shard's
references into batches of a few dozen files (each one ``Chunk``) and hands a
few consecutive batches to a helper as one task. A batch travels as columns (``schemas.elements.RefColumns``) or a slice of a
``plan.ref_table.RefTable``: plain lists or arrays, pickled at C speed, never an
object per file. The helper makes each file's ``ImageRef`` there, builds its
record (``ImageRecordBuilder.framed``) and returns an ``EncodedBatch``: the framed
records and, per record, the tuples ``shard_engine.Chunk`` holds (labels, notes,
contents, image facts) plus the batch's dead letters, so the process that writes
the shard does a constant amount of Python work per batch (plus, per annotated
image, its facts and dropped objects).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import NamedTuple

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, RefColumns
from beam_tfrecords.transforms.io.image_records import ImageRecordBuilder, estimated_record_size

__all__ = ["EncodedBatch", "ImageBatchTask", "batch_bounds", "chunk_fields", "encode_batch", "encode_batches",
           "planned_sizes", "shard_tasks"]

_CHUNK_FILES = 64
_CHUNK_BYTES = 4 << 20
_TASK_BATCHES = 4  # Chunks a helper's task makes at most: fewer hand-offs a file.


class EncodedBatch(NamedTuple):
    """A batch of images encoded: the first nine fields are ``shard_engine.Chunk``'s,
    in its order (``chunk_fields`` completes them for annotated images).

    Attributes:
      framed: the framed records of the good files, concatenated in order.
      records: how many records ``framed`` holds.
      dead: the files the batch refused (dead letters), in file order.
      labels, notes, contents, images: per record, as ``Chunk`` has them.
      inputs: files the batch held.
      annotations: ``()``: an annotated image's facts are made from ``reports``.
      input_bytes: the listed bytes of the batch's files (for progress).
      reports: per annotated image, ``(dead letters before it, its record's index,
        image/filename, its ImageOutcome)``: the writer's process adds its facts and
        the objects it dropped (``io.annotated_output``, which imports Beam's file
        systems: a helper does not import it).
    """

    framed: bytes
    records: int
    dead: tuple[DeadLetter, ...]
    labels: tuple
    inputs: int
    notes: tuple[str, ...]
    contents: tuple[tuple[str, str, str], ...]
    images: tuple[tuple[str, str, int, int], ...]
    annotations: tuple
    input_bytes: int
    reports: tuple = ()


def encode_batch(builder: ImageRecordBuilder, refs: Sequence[ImageRef]) -> EncodedBatch:
    """Encodes ``refs`` in order with ``builder`` (``framed`` per file).

    Equal values among the per-record tuples (labels, image facts, notes) are
    handed back as one object, so they pickle once a batch.
    """
    pieces: list[bytes] = []
    dead: list[DeadLetter] = []
    labels, notes, contents, images, reports = [], [], [], [], []
    same: dict = {}
    inputs = input_bytes = 0
    for ref in refs:
        inputs += 1
        input_bytes += ref.size
        built = builder.framed(ref)
        if isinstance(built, DeadLetter):
            dead.append(built)
            continue
        pieces += built[0]
        outcome = built[1]
        report = outcome.report
        several = report.labels if report is not None else ()
        # Several labels per image: the record counts once under each.
        label = several or ref.label_text or ("" if ref.label == -1 else str(ref.label))
        labels.append(same.setdefault(label, label))
        source = outcome.source_sha256 if outcome.source_sha256 != outcome.sha256 else ""
        contents.append((outcome.sha256, ref.filename, source))
        notes.append(same.setdefault(outcome.note, outcome.note))
        images.append(same.setdefault(outcome.image, outcome.image))
        if report is not None:  # Annotated: its facts and dropped objects are the writer's to add.
            reports.append((len(dead), len(labels) - 1, ref.filename, outcome))
    return EncodedBatch(b"".join(pieces), len(labels), tuple(dead), tuple(labels), inputs, tuple(notes),
                        tuple(contents), tuple(images), (), input_bytes, tuple(reports))


def chunk_fields(batch: EncodedBatch) -> tuple:
    """The fields of the ``shard_engine.Chunk`` a batch makes, in its order: an
    annotated image's facts and the objects it dropped (dead letters after the
    files refused before it) added here, in the writer's process."""
    if not batch.reports:
        return batch[:9]
    from beam_tfrecords.transforms.io.annotated_output import (  # pylint: disable=import-outside-toplevel
        image_facts,
        object_letters,
    )

    dead, facts, added = list(batch.dead), [None] * batch.records, 0
    for before, record, filename, outcome in batch.reports:
        dropped = object_letters(filename, outcome.report)
        dead[before + added:before + added] = dropped
        added += len(dropped)
        facts[record] = image_facts(outcome)
    return (batch.framed, batch.records, tuple(dead), batch.labels, batch.inputs, batch.notes,
            batch.contents, batch.images, tuple(facts) if any(facts) else ())


def encode_batches(builder: ImageRecordBuilder, refs: Sequence[ImageRef],
                   bounds: Sequence[int]) -> tuple[EncodedBatch, ...]:
    """``encode_batch`` of each run ``refs[bounds[i]:bounds[i + 1]]``, in order: a
    few batches in one task, each handed back as its own chunk."""
    as_columns = getattr(refs, "ref_columns", None)
    if as_columns is not None:  # A ``RefTable``: its references made from its arrays at once.
        refs = as_columns()
    cut = getattr(refs, "span", None) or (lambda a, b: refs[a:b])
    return tuple(encode_batch(builder, cut(a, b)) for a, b in zip(bounds, bounds[1:]))


@dataclasses.dataclass(frozen=True)
class ImageBatchTask:
    """``encode_batches`` with one builder: the picklable task a pool runs, on
    ``(refs, bounds)``."""

    builder: ImageRecordBuilder

    def __call__(self, item: tuple[Sequence[ImageRef], Sequence[int]]) -> tuple[EncodedBatch, ...]:
        return encode_batches(self.builder, *item)


def batch_bounds(sizes: Sequence[int], most_files: int, most_bytes: int) -> list[int]:
    """Where consecutive runs of files begin, and the end (``[0, ..., len(sizes)]``):
    each run holds at most ``most_files`` files and about ``most_bytes`` bytes (a
    file that alone exceeds it is a run of its own)."""
    bounds, size, start = [0], 0, 0
    for index, item in enumerate(sizes):
        if index > start and (index - start >= most_files or size + item > most_bytes):
            bounds.append(index)
            start, size = index, 0
        size += item
    if len(sizes):
        bounds.append(len(sizes))
    return bounds


def shard_tasks(refs: Sequence[ImageRef], workers: int) -> list[tuple[Sequence[ImageRef], list[int]]]:
    """A shard's references as tasks ``(refs, bounds)``: consecutive runs (batches,
    one chunk each) of at most _CHUNK_FILES files and about _CHUNK_BYTES bytes, up
    to _TASK_BATCHES of them a task (and no more than _CHUNK_BYTES bytes, so no more
    is in flight than before) while that leaves each of ``workers`` several tasks.
    Each task's references are a table of their own for a ``plan.ref_table.RefTable``
    (which has ``sizes``), else columns of their own (no ``ImageRef`` pickled)."""
    table_sizes = getattr(refs, "sizes", None)
    if table_sizes is not None:
        sizes = table_sizes.tolist()
    else:
        refs = refs if isinstance(refs, RefColumns) else RefColumns.of(refs)
        sizes = refs.column("size")
    cut = refs.span
    bounds = batch_bounds(sizes, _CHUNK_FILES, _CHUNK_BYTES)
    step = max(1, min(_TASK_BATCHES, (len(bounds) - 1) // (4 * max(1, workers))))
    ends = [0, *itertools.accumulate(sizes)]
    tasks, first = [], 0
    while first < len(bounds) - 1:
        last = first + 1  # Batches first..last-1; no more bytes a task than a batch may hold.
        while (last < len(bounds) - 1 and last - first < step
               and ends[bounds[last + 1]] - ends[bounds[first]] <= _CHUNK_BYTES):
            last += 1
        cuts = bounds[first:last + 1]
        tasks.append((cut(cuts[0], cuts[-1]), [b - cuts[0] for b in cuts]))
        first = last
    return tasks


def planned_sizes(refs: RefColumns) -> list[int]:
    """``estimated_record_size`` of each reference, from its columns: the part that
    depends on the label, its text and the extra features is worked out once for
    each of their combinations."""
    overheads: dict = {}

    def overhead(label: int, text: str, extra: tuple) -> int:
        found = overheads.get((label, text, extra))
        if found is None:
            found = overheads[label, text, extra] = estimated_record_size(
                ImageRef("", "", "", "", 0, label, text, extra))
        return found

    names = refs.column("filename")
    return [overhead(label, text, extra) + size + len(name.encode("utf-8")) + len(note)
            for label, text, extra, size, name, note in zip(
                refs.column("label"), refs.column("label_text"), refs.column("extra"),
                refs.column("size"), names, refs.column("annotation"))]
