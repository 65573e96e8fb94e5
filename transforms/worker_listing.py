"""Listing and planning a ``gs://`` image input on the workers (``--list_on_workers``).

The launcher lists folders only (``files.listing_units``: a few delimiter
listings) and makes the layout-wide decisions (layout, whether the top folders
are splits, the labels file). The workers then:

1. **List** the units side by side (``Reshuffle``, then one unit per call), each
   into a ``RefTable`` of its own (``class_folder_table``/``cifar_table``: an
   image's split, class and ordering key depend on its own path only), writing
   the unit's ``inputs.jsonl`` lines to the run's temporary folder.
2. **Cut** in one step from thin columns only: each unit sends its rows' split
   codes, class codes, 128-bit keys and planned sizes (about 40 bytes a file;
   no paths). The step numbers the classes (the sorted class folders found,
   or the labels file), sorts each split by key and cuts it with
   ``cut_shards``: the same cuts as a listing in one process.
3. **Assign**: each unit sends each shard the rows it holds of it; a
   ``GroupByKey`` per shard joins them in key order into the ``ShardSpec`` the
   one-process plan makes (same records, same order, same bytes written).

No worker holds every path; the cut step holds ~40 bytes per file and the
commit joins the units' ``inputs.jsonl`` pieces in unit order (units are
disjoint name ranges, in name order, so that is path order).
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np

from beam_tfrecords.schemas.elements import DeadLetter, ImageRefs, InputSummary, ShardSpec
from beam_tfrecords.schemas.inputs import UNIT_INPUTS_DIR, unit_inputs_name
from beam_tfrecords.schemas.shards import ShardBand
from beam_tfrecords.transforms.image_listing import pack_refs, path_text
from beam_tfrecords.transforms.io import files, progress
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.io.fingerprint import table_lines
from beam_tfrecords.transforms.io.image_records import record_overheads
from beam_tfrecords.transforms.plan.layouts import CIFAR_LABELS_FILE, DEFAULT_SPLIT
from beam_tfrecords.transforms.plan.ref_table import (
    PathBuffer,
    RefTable,
    cifar_table,
    class_folder_table,
    concat_tables,
)
from beam_tfrecords.transforms.plan.shard_cuts import cut_shards, shard_spec
from beam_tfrecords.transforms.quality.splits import split_of

__all__ = ["ListAndPlanOnWorkers", "UnitsToList", "cut_plan"]

_log = logging.getLogger(__name__)
_THIN_TAG = "thin"
# Shards a unit sends its rows to in one piece (see ``CutPlan``).
SHARDS_PER_GROUP = 64
# The order a one-process listing gives its dead letters in: class folders: files
# of no class, then classes not in the labels file, each by path; CIFAR: unlabelled
# files and unknown classes together, by path; then names that are not UTF-8, as listed.
_DEAD_ORDER = {"no_class_folder": 0, "unlabeled": 0, "unknown_class": 1, "bad_file_name": 2}
_CIFAR_DEAD_ORDER = {**_DEAD_ORDER, "unknown_class": 0}


@dataclasses.dataclass(frozen=True)
class UnitsToList:
    """What the launcher decided for a listing the workers make.

    Attributes:
      pattern: the ``gs://`` glob of the input; root: what paths are relative to.
      layout: ``class_folders`` or ``cifar``.
      units: ``files.listing_units(pattern)``, in name order.
      split_folders: whether the top folders are splits (class folders).
      labels: the labels file's class names (CIFAR: ``labels.txt``'s); ``()``: the
        class folders found, sorted.
      splits: ``--splits`` (by path), or ``()``.
      output: the output folder.
      temp_dir: the run's temporary folder (each unit's ``inputs.jsonl`` lines; the
        listing's dead letters, which the commit moves to the output).
      band, compression: the shard plan's band and the shards' compression.
      shards_per_group: shards sent in one group (``CutPlan``).
    """

    pattern: str
    root: str
    layout: str
    units: tuple[tuple[str, tuple | None], ...]
    split_folders: bool
    labels: tuple[str, ...]
    splits: tuple
    output: str
    temp_dir: str
    band: ShardBand
    compression: str
    shards_per_group: int = 64


@dataclasses.dataclass(frozen=True)
class _Thin:
    """What the cut needs of one unit's rows (no paths)."""

    index: int
    split_names: tuple[str, ...]
    vocabulary: tuple[str, ...]
    split_codes: np.ndarray
    labels: np.ndarray
    keys: np.ndarray
    base_sizes: np.ndarray  # File bytes plus name bytes: the planned size less the class's overhead.
    file_bytes: int
    ignored: int
    dead_letters: tuple[DeadLetter, ...]


@dataclasses.dataclass(frozen=True)
class CutPlan:
    """The cut of every split, and what each unit needs of it to send its rows.

    Attributes:
      vocabulary: class names in label order (every unit's labels are mapped to them).
      remaps: per unit, its class codes' labels (``remaps[unit][local_code]``).
      shards: per unit, each row's shard index within its split.
      num_shards: ``{split: shard count}``.
      summary: what the listing found (``InputSummary``).

    Shards travel in ``groups`` of consecutive ones (``shards_per_group``) (splits by
    name, then index): a unit sends each group one piece holding its rows of
    every shard of the group. As keys are hashes, every unit has rows in almost
    every shard; one piece per unit and shard would be a shuffle of single rows.
    """

    vocabulary: tuple[str, ...]
    remaps: dict[int, np.ndarray]
    shards: dict[int, np.ndarray]
    num_shards: dict[str, int]
    summary: InputSummary
    groups: int

    def first_shards(self) -> dict[str, int]:
        """Each split's first shard's place among all shards (splits by name)."""
        first, before = {}, 0
        for split in sorted(self.num_shards):
            first[split] = before
            before += self.num_shards[split]
        return first

    def group_shards(self, group: int) -> Iterator[tuple[str, int]]:
        """``(split, index)`` of the shards of ``group``, in order."""
        total = sum(self.num_shards.values())
        for split, first in self.first_shards().items():
            for index in range(self.num_shards[split]):
                if (first + index) * self.groups // total == group:
                    yield split, index


def list_unit(settings: UnitsToList, index: int) -> tuple[RefTable, int, list[DeadLetter]]:
    """The images of unit ``index`` as a table (its own split and class codes),
    the files ignored as not images, and the inputs refused."""
    found, bad_names = PathBuffer(settings.root), []
    for item in files.list_unit(settings.pattern, settings.units[index]):
        try:
            found.add(*item)
        except UnicodeEncodeError:
            bad_names.append(DeadLetter(path_text(item[0]), "list", "bad_file_name",
                                        "the file name is not UTF-8 text; rename the file"))
    if settings.layout == "cifar":
        listing = cifar_table(settings.root, found, list(settings.labels), CIFAR_LABELS_FILE,
                              DEFAULT_SPLIT)
    else:
        listing = class_folder_table(settings.root, found, list(settings.labels) or None,
                                     lambda _root, _top: settings.split_folders, DEFAULT_SPLIT)
    table = listing.table
    if settings.splits:
        table = table.with_splits(lambda name: split_of(name, settings.splits))
    return table, listing.ignored, list(listing.dead_letters) + bad_names


class _ListUnitFn(beam.DoFn):
    """``unit index`` → ``(index, packed table)``; tagged ``thin``: its ``_Thin``."""

    def __init__(self, settings: UnitsToList):
        self._settings = settings

    def process(self, index: int):
        settings = self._settings
        table, ignored, dead = list_unit(settings, index)
        with files.open_write(files.join(settings.temp_dir, UNIT_INPUTS_DIR, unit_inputs_name(index))) as out:
            block: list[str] = []
            for line in table_lines(table):
                block.append(line)
                if len(block) >= 65536:
                    out.write("".join(block).encode("utf-8"))
                    block = []
            out.write("".join(block).encode("utf-8"))
        beam.metrics.Metrics.counter("list", "units").inc()
        yield beam.pvalue.TaggedOutput(_THIN_TAG, _Thin(
            index, table.split_names, table.vocabulary, table.split_codes, table.labels, table.keys,
            table.sizes + table.name_lengths() + table.annotation_lengths(), int(table.sizes.sum()), ignored,
            tuple(dead)))
        yield index, pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)


def cut_plan(thins: Sequence[_Thin], settings: UnitsToList) -> CutPlan:
    """The one-process plan's cuts, from every unit's thin columns.

    Raises:
      ValueError: when no unit holds an image.
    """
    thins = sorted(thins, key=lambda t: t.index)
    if settings.layout == "cifar" or settings.labels:
        vocabulary = tuple(settings.labels)
    else:
        vocabulary = tuple(sorted(set().union(*(t.vocabulary for t in thins))))
    code = {name: i for i, name in enumerate(vocabulary)}
    overhead = record_overheads(vocabulary)
    remaps = {t.index: np.array([code[name] for name in t.vocabulary] or [0], np.int32) for t in thins}
    shards = {t.index: np.zeros(len(t.keys), np.int32) for t in thins}
    num_shards: dict[str, int] = {}
    images = int(sum(len(t.keys) for t in thins))
    for split in sorted({name for t in thins for name in t.split_names}):
        parts = []
        for t in thins:
            if split in t.split_names:
                rows = np.flatnonzero(t.split_codes == t.split_names.index(split))
                if len(rows):
                    parts.append((t, rows))
        if not parts:
            continue
        keys = np.concatenate([t.keys[rows] for t, rows in parts]).reshape(-1, 2)
        planned = np.concatenate([overhead[remaps[t.index][t.labels[rows]]] + t.base_sizes[rows]
                                  for t, rows in parts])
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        count, shard_of = cut_shards(planned[order], settings.band)
        assigned = np.empty(len(order), np.int32)
        assigned[order] = shard_of
        start = 0
        for t, rows in parts:
            shards[t.index][rows] = assigned[start:start + len(rows)]
            start += len(rows)
        num_shards[split] = count
    rank = _CIFAR_DEAD_ORDER if settings.layout == "cifar" else _DEAD_ORDER
    dead = sorted((d for t in thins for d in t.dead_letters),
                  key=lambda d: (rank.get(d.error, 3), d.source if d.error != "bad_file_name" else ""))
    ignored = sum(t.ignored for t in thins)
    input_bytes = sum(t.file_bytes for t in thins)
    summary = InputSummary(
        root=settings.root,
        layout=settings.layout,
        input_files=images + len(dead),
        input_bytes=input_bytes,
        ignored_files=ignored,
        vocabulary=vocabulary,
        extra_features=(),
        bad_counts=tuple(sorted(Counter(d.error for d in dead).items())),
        dead_letter_path=write_dead_letters(settings.temp_dir, "listing", dead),
    )
    groups = max(1, -(-sum(num_shards.values()) // max(1, settings.shards_per_group)))
    return CutPlan(vocabulary, remaps, shards, num_shards, summary, groups)


def _summary(plan: CutPlan) -> InputSummary:
    refused = sum(n for _, n in plan.summary.bad_counts)
    images = plan.summary.input_files - refused
    _log.info("Listed %d images on the workers (%d refused, %d other files ignored); planned %d shards",
              images, refused, plan.summary.ignored_files, sum(plan.num_shards.values()))
    beam.metrics.Metrics.counter("list", "images").inc(images)
    beam.metrics.Metrics.counter("list", "dead_letter").inc(refused)
    progress.plan(inputs=images, input_bytes=plan.summary.input_bytes)
    progress.plan(shards=sum(plan.num_shards.values()))
    return plan.summary


class _AssignFn(beam.DoFn):
    """``(unit, packed table)`` → ``(group, (unit, packed (rows, their shard indices)))``."""

    def process(self, element, plan: CutPlan) -> Iterator:
        index, packed = element
        table: RefTable = pickle.loads(packed)
        if not len(table):
            return
        table.labels = plan.remaps[index][table.labels]
        table.vocabulary = plan.vocabulary
        shard = plan.shards[index]
        first = plan.first_shards()
        starts = np.array([first.get(name, 0) for name in table.split_names], np.int64)
        group = (starts[table.split_codes] + shard) * plan.groups // max(1, sum(plan.num_shards.values()))
        order = np.argsort(group, kind="stable")
        for rows in np.split(order, np.flatnonzero(np.diff(group[order])) + 1):
            yield int(group[rows[0]]), (index, pickle.dumps((table.rows(rows), shard[rows]),
                                                            protocol=pickle.HIGHEST_PROTOCOL))


def _every_group(plan: CutPlan) -> Iterator:
    """An empty piece for every group, so that shards no row falls in are still written."""
    for group in range(plan.groups):
        yield group, (-1, None)


class _ShardSpecsFn(beam.DoFn):
    """A group's pieces → the ``ShardSpec`` of each of its shards, rows in key order,
    as the one-process plan makes it."""

    def __init__(self, compression: str):
        self._compression = compression

    def process(self, element, plan: CutPlan) -> Iterator[ShardSpec]:
        group, pieces = element
        pieces = [pickle.loads(packed) for _, packed in sorted(pieces, key=lambda p: p[0])
                  if packed is not None]
        table = concat_tables([rows for rows, _ in pieces]) if pieces else None
        runs: dict[tuple[str, int], np.ndarray] = {}
        if table is not None:
            shard = np.concatenate([shards for _, shards in pieces])
            keys = table.keys
            order = np.lexsort((keys[:, 1], keys[:, 0], shard, table.split_codes))
            for rows in np.split(order, np.flatnonzero(np.diff(
                    table.split_codes[order].astype(np.int64) * (1 << 32) + shard[order])) + 1):
                runs[(table.split_names[table.split_codes[rows[0]]], int(shard[rows[0]]))] = rows
            overhead = record_overheads(table.vocabulary)
        for split, index in plan.group_shards(group):
            rows = runs.get((split, index))
            if rows is None:
                planned, records = 0, ImageRefs.pack(())
            else:
                members = table.rows(rows)
                planned = int((overhead[members.labels] + members.sizes + members.name_lengths()
                                   + members.annotation_lengths()).sum())
                records = pack_refs(members)
            yield shard_spec(split, index, plan.num_shards[split], self._compression, planned, records)


class ListAndPlanOnWorkers(beam.PTransform):
    """Lists a ``gs://`` image input unit by unit on the workers and plans its shards.

    Args:
      settings: what the launcher decided (``UnitsToList``).

    Returns ``(specs, summary)``: one ``ShardSpec`` per shard (the specs a
    listing in one process plans), and one ``InputSummary``.
    """

    def __init__(self, settings: UnitsToList):
        super().__init__()
        self._settings = settings

    def expand(self, pbegin):
        settings = self._settings
        listed = (
            pbegin
            | "Units" >> beam.Create(list(range(len(settings.units))))
            | "SpreadUnits" >> beam.Reshuffle()
            | "ListUnit" >> beam.ParDo(_ListUnitFn(settings)).with_outputs(_THIN_TAG, main="tables")
        )
        plan = (
            listed.thin
            | "GatherThin" >> beam.combiners.ToList()
            | "Cut" >> beam.Map(cut_plan, settings)
        )
        pieces = listed.tables | "Assign" >> beam.ParDo(_AssignFn(), beam.pvalue.AsSingleton(plan))
        skeleton = plan | "EveryGroup" >> beam.FlatMap(_every_group)
        specs = (
            (pieces, skeleton)
            | "Pieces" >> beam.Flatten()
            | "ByGroup" >> beam.GroupByKey()
            | "Specs" >> beam.ParDo(_ShardSpecsFn(settings.compression), beam.pvalue.AsSingleton(plan))
            | "SpreadShards" >> beam.Reshuffle()
        )
        summary = plan | "Summary" >> beam.Map(_summary)
        return specs, summary
