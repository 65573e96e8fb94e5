"""``--drop_duplicates`` and ``--split_by content`` on the workers (``HashImages``):
no image is read on the launcher to hash it.

The listing's parts (``ListingPart``) are spread over workers, which hash each
image (``io.bounded_read.sha256_input``, 16 threads a part) and send the
result to the worker of its content-hash bucket. A bucket's worker sees every
copy of each content it holds, so it decides as the one-process listing did
(``images.list_images``): with ``--split_by content`` each image's split is
``split_of(its SHA-256)`` and its ordering key ``stable_key(split, name)``;
with ``--drop_duplicates`` the copy with the smallest ordering key is kept
(ties in listing order) and the others are left out as copies of it. Each
part then takes back its rows' decisions and goes on to the shard plan with
its new splits and without the copies and the files that could not be read
(dead-lettered at stage ``read``, as before). What was dropped is known only
then: the run's summary gets it (``add_contents_outcome``), and the commit
leaves those files out of ``inputs.jsonl`` (``HashImages.left_out``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import zlib
from collections import Counter
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef, InputSummary, ListingPart
from beam_tfrecords.transforms.image_listing import content_key, pack_refs, part_refs
from beam_tfrecords.transforms.io import progress
from beam_tfrecords.transforms.io.dead_letters import write_dead_letters
from beam_tfrecords.transforms.plan.ref_table import RefTable
from beam_tfrecords.transforms.plan.shard_cuts import stable_key
from beam_tfrecords.transforms.quality.splits import split_of

__all__ = ["ContentsOutcome", "HashImages", "add_contents_outcome"]

# Images are sent to this many content-hash buckets (~160,000 in each at 10M).
BUCKETS = 64
_THREADS = 16
_DEAD_TAG = "dead_letter"
_DEAD_ROWS_TAG = "dead_rows"
_DROPPED_TAG = "dropped"
# Dead letters of files that could not be read to hash: OUT/dead_letter/contents.jsonl.
DEAD_LETTER_NAME = "contents"


@dataclasses.dataclass(frozen=True)
class ContentsOutcome:
    """What hashing on the workers left out, for the run's summary.

    Attributes:
      bad_counts: ``((reason, count), ...)`` of the files that could not be read.
      dead_letter_path: their dead-letter file ('' when none).
      dropped: ``(filename, split, filename it copies)`` of the copies left out, sorted.
      bytes_left_out: the bytes of those files and the copies (not converted).
    """

    bad_counts: tuple[tuple[str, int], ...] = ()
    dead_letter_path: str = ""
    dropped: tuple[tuple[str, str, str], ...] = ()
    bytes_left_out: int = 0


def _bucket(digest: str) -> int:
    return zlib.crc32(digest.encode("ascii", "replace")) % BUCKETS


class _HashPartFn(beam.DoFn):
    """A part → ``(("bucket", b), ("hashed", [(sha256, part, row, filename, split, key,
    size), ...]))`` per bucket; tagged ``dead_rows``: ``(("part", index), ("dead", rows))``
    of the rows that could not be read, and ``dead_letter``: ``(DeadLetter, size)`` of each."""

    def __init__(self, max_file_bytes: int):
        self._max_file_bytes = max_file_bytes
        self._pool = None

    def setup(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(_THREADS, thread_name_prefix="hash-image")

    def teardown(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def process(self, part: ListingPart) -> Iterator:
        refs = part_refs(part)
        by_bucket: dict[int, list] = {}
        dead = []
        contents = self._pool.map(lambda ref: (ref, content_key(ref, self._max_file_bytes)), refs)
        for row, (ref, content) in enumerate(contents):
            if isinstance(content, DeadLetter):
                dead.append(row)
                yield beam.pvalue.TaggedOutput(_DEAD_TAG, (content, ref.size))
            else:
                by_bucket.setdefault(_bucket(content), []).append(
                    (content, part.index, row, ref.filename, ref.split, ref.key, ref.size))
        beam.metrics.Metrics.counter("images", "hashed").inc(part.count - len(dead))
        if dead:  # Planned as inputs by the listing step: taken here, left out.
            progress.add(inputs=len(dead))
        for bucket, entries in by_bucket.items():
            yield ("bucket", bucket), ("hashed", entries)
        if dead:
            yield beam.pvalue.TaggedOutput(_DEAD_ROWS_TAG, (("part", part.index), ("dead", dead)))


class _DecideFn(beam.DoFn):
    """A bucket's images → each part's rows' new splits and the copies it drops:
    ``(("part", index), ("split", [(row, split), ...]) | ("drop", [row, ...]))``;
    tagged ``dropped``: ``((filename, split, filename it copies), size)``."""

    def __init__(self, splits: tuple, drop_duplicates: bool):
        self._splits = splits
        self._drop = drop_duplicates

    def process(self, element) -> Iterator:
        _, values = element
        by_content: dict[str, list] = {}
        for _, batch in values:
            for digest, part, row, filename, split, key, size in batch:
                by_content.setdefault(digest, []).append((key, part, row, filename, split, size))
        splits: dict[int, list] = {}
        drops: dict[int, list] = {}
        for digest, copies in by_content.items():
            if self._splits:
                split = split_of(digest, self._splits)
                copies = [(stable_key(split, filename), part, row, filename, split, size)
                          for _, part, row, filename, _, size in copies]
                for _, part, row, _, _, _ in copies:
                    splits.setdefault(part, []).append((row, split))
            if self._drop and len(copies) > 1:
                keeper = min(copies, key=lambda c: c[:3])
                for copy in copies:
                    if copy is not keeper:
                        drops.setdefault(copy[1], []).append(copy[2])
                        progress.add(inputs=1)  # Planned as an input: taken here, left out.
                        yield beam.pvalue.TaggedOutput(_DROPPED_TAG, ((copy[3], copy[4], keeper[3]), copy[5]))
        for part, rows in splits.items():
            yield ("part", part), ("split", rows)
        for part, rows in drops.items():
            yield ("part", part), ("drop", rows)


def _rebuilt(element) -> Iterator[ListingPart]:
    """A part and its rows' decisions → the part with its new splits (and keys),
    without the rows left out."""
    _, values = element
    parts, gone, new_split = [], set(), {}
    for kind, value in values:
        if kind == "part":
            parts.append(value)
        elif kind == "split":
            new_split.update(value)
        else:  # "dead", "drop"
            gone.update(value)
    if not parts:
        return
    (part,) = parts
    refs = part_refs(part)
    keep = np.ones(len(refs), bool)
    keep[sorted(gone)] = False
    if isinstance(refs, RefTable):
        if new_split:
            names = {refs.filename(row): split for row, split in new_split.items()}
            refs = refs.with_splits(lambda name: names.get(name, refs.split_names[0]))
        kept: Sequence[ImageRef] = refs.select(keep)
    else:
        kept = [dataclasses.replace(ref, split=new_split[row], key=stable_key(new_split[row], ref.filename))
                if row in new_split else ref for row, ref in enumerate(refs) if keep[row]]
    yield ListingPart(part.index, len(kept), refs=pack_refs(kept))


def _keyed_part(part: ListingPart):
    return ("part", part.index), ("part", part)


def _outcome(element, output: str) -> ContentsOutcome:
    """``(None, [("dead", DeadLetter) | ("dropped", triple), ...])`` → the outcome, the
    dead letters written."""
    _, values = element
    values = list(values)
    dead = sorted((v for kind, (v, _) in values if kind == "dead"), key=lambda d: d.source)
    dropped = tuple(sorted(v for kind, (v, _) in values if kind == "dropped"))
    path = write_dead_letters(output, DEAD_LETTER_NAME, dead)
    return ContentsOutcome(tuple(sorted(Counter(d.error for d in dead).items())), path, dropped,
                           sum(size for _, (_, size) in values))


def _tagged(value, kind: str):
    return None, (kind, value)


def _left_out(value) -> str:
    """The ``image/filename`` of a file left out: a dead letter's source, a copy's name."""
    what, _ = value
    return what.source if isinstance(what, DeadLetter) else what[0]


def with_contents_outcome(summary: InputSummary, outcome: ContentsOutcome | None) -> InputSummary:
    """The listing's summary plus what hashing on the workers left out."""
    if outcome is None:
        return summary
    bad = Counter(dict(summary.bad_counts))
    bad.update(dict(outcome.bad_counts))
    paths = tuple(sorted(summary.dead_letter_paths + ((outcome.dead_letter_path,)
                                                      if outcome.dead_letter_path else ())))
    return dataclasses.replace(summary, bad_counts=tuple(sorted(bad.items())), dead_letter_paths=paths,
                               duplicates_dropped=summary.duplicates_dropped + outcome.dropped,
                               input_bytes=summary.input_bytes - outcome.bytes_left_out)


def add_contents_outcome(summary, outcome):
    """``summary`` (one ``InputSummary``) with ``HashImages.outcome`` added: for the commit."""
    return summary | "AddContentsOutcome" >> beam.Map(
        with_contents_outcome, beam.pvalue.AsSingleton(outcome, default_value=None))


class HashImages(beam.PTransform):
    """``ListingPart`` s → the same parts, each image's split picked by its content
    (``splits`` given) and copies dropped (``drop_duplicates``), every image
    hashed on the workers (see the module docstring).

    After ``expand``: ``outcome`` is a PCollection of at most one
    ``ContentsOutcome`` (see ``add_contents_outcome``), ``left_out`` one of the
    ``image/filename`` s left out (for ``Commit``'s ``left_out``).

    Args:
      output: where dead letters are written: the run's temporary folder
        (``ShardTarget.temp_dir``; the commit moves them to the output).
      splits: ratio splits to pick by content, or ``()``.
      drop_duplicates: leave out copies.
      max_file_bytes: a file larger than this is dead-lettered unread.
    """

    def __init__(self, output: str, splits: tuple = (), drop_duplicates: bool = False,
                 max_file_bytes: int = 0):
        super().__init__()
        self._output = output
        self._splits = tuple(splits)
        self._drop = drop_duplicates
        self._max_file_bytes = max_file_bytes or None
        self.outcome = None
        self.left_out = None

    def expand(self, parts):
        parts = parts | "SpreadParts" >> beam.Reshuffle()
        hashed = parts | "Hash" >> beam.ParDo(_HashPartFn(self._max_file_bytes)).with_outputs(
            _DEAD_TAG, _DEAD_ROWS_TAG, main="hashed")
        decided = (
            hashed.hashed
            | "ByContent" >> beam.GroupByKey()
            | "Decide" >> beam.ParDo(_DecideFn(self._splits, self._drop)).with_outputs(
                _DROPPED_TAG, main="decided")
        )
        dead, dropped = hashed[_DEAD_TAG], decided[_DROPPED_TAG]
        self.outcome = (
            (dead | "TagDead" >> beam.Map(_tagged, "dead"),
             dropped | "TagDropped" >> beam.Map(_tagged, "dropped"))
            | "LeftOut" >> beam.Flatten()
            | "AllLeftOut" >> beam.GroupByKey()
            | "Outcome" >> beam.Map(_outcome, self._output)
        )
        self.left_out = (dead, dropped) | "LeftOutFiles" >> beam.Flatten() | "Names" >> beam.Map(_left_out)
        return (
            (parts | "KeyParts" >> beam.Map(_keyed_part), hashed[_DEAD_ROWS_TAG], decided.decided)
            | "Decisions" >> beam.Flatten()
            | "ByPart" >> beam.GroupByKey()
            | "Rebuild" >> beam.FlatMap(_rebuilt)
        )
