"""Statistics of the records a run wrote, per split: mergeable summaries and their JSON.

The manifest's ``splits.<split>.statistics`` (the JSON shape is documented in
``schemas.manifest``) is built from small partial summaries that merge in any
order, so they are computed in the same pass that writes the records:

- tables: per Arrow batch of CSV cells, once each row's split is known
  (``table_batch_statistics``, in the process that encodes the batch), with
  Arrow compute and numpy only (no Python loop per cell); the batches of a file
  merge into its ``SpoolInfo``, the files of a run into the ``InputSummary``.
- images: per shard, in the writer, from what the reader already learnt of each
  image's header (``image_counts``, carried on ``ShardResult.image_counts``).

Rows and images sent to the dead letter are not counted: statistics describe
what was written. Tables grouped into sequences (``--sequence_key``) get record
counts only.

Summaries:

- numbers (int64, float, bool columns; lists: every value): count, missing,
  non-finite values, min, max, mean and population standard deviation (merged
  with Chan's parallel formulas). Floats are summarised as written (float32).
- strings: missing, approximate distinct values (a KMV sketch: the ``SKETCH_SIZE``
  smallest 64-bit hashes of the values, about 3% error), and the top values:
  exact counts while a split has at most ``TOP_CAPACITY`` distinct values, then a
  mergeable Misra-Gries summary with that many counters (Agarwal et al., 2012),
  whose counts are lower bounds off by at most ``values / (TOP_CAPACITY + 1)``;
  ``top_values_exact`` says which.
- bytes (base64 cells): missing and distinct only.
- images: counts of formats, modes, widths, heights (exact, since sizes are
  whole numbers; quantiles come from them) and classes.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from beam_tfrecords.schemas.elements import InputSummary, ShardResult
from beam_tfrecords.schemas.table_schema import TRUE_WORDS, ColumnSpec, TableSchema


class _LazyCompute:
    """``pyarrow.compute``, imported on first use: the ~0.1 s its import takes is
    not paid by runs whose statistics never call it (images)."""

    def __getattr__(self, name: str):
        global pc  # pylint: disable=global-statement
        import pyarrow.compute  # pylint: disable=import-outside-toplevel

        pc = pyarrow.compute
        return getattr(pc, name)


pc = _LazyCompute()

__all__ = [
    "QUANTILES",
    "SKETCH_SIZE",
    "TOP_CAPACITY",
    "TOP_VALUES",
    "NumericSummary",
    "StringSummary",
    "TableStatistics",
    "image_counts",
    "image_statistics_json",
    "merge_table_statistics",
    "split_statistics",
    "string_hashes",
    "table_batch_statistics",
]

TOP_VALUES = 10
TOP_CAPACITY = 1024
SKETCH_SIZE = 1024
QUANTILES = (0, 5, 50, 95, 100)
# Top values are shown cut to this many characters (they are counted whole).
_SHOWN_CHARS = 120
# A longer value is counted by its first _SHOWN_CHARS characters and its hash (_top_keys).
_TOP_KEY_CHARS = 4096
_U64 = np.uint64


# --- hashing ------------------------------------------------------------------------

_BASE = _U64(0x100000001B3)
_powers_cache = np.ones(1, dtype=np.uint64)
# The base is odd, so it has an inverse modulo 2**64; its squarings, for _inverse_powers.
_INVERSE_SQUARES = [_U64(pow(0x100000001B3, -(1 << k), 2**64)) for k in range(64)]


def _powers(n: int) -> np.ndarray:
    """``_BASE ** i`` modulo 2**64 for ``i < n``."""
    global _powers_cache  # pylint: disable=global-statement
    if len(_powers_cache) < n:
        powers = np.full(max(n, 2 * len(_powers_cache)), _BASE, dtype=np.uint64)
        powers[0] = 1
        _powers_cache = np.multiply.accumulate(powers)  # Wraps modulo 2**64.
    return _powers_cache[:n]


def _inverse_powers(exponents: np.ndarray) -> np.ndarray:
    """``_BASE ** -e`` modulo 2**64 for each ``e`` (square and multiply, one bit a step)."""
    out = np.ones(len(exponents), dtype=np.uint64)
    e = exponents.astype(np.uint64)
    k = 0
    while e.any():
        odd = (e & _U64(1)).astype(bool)
        out[odd] *= _INVERSE_SQUARES[k]
        e >>= _U64(1)
        k += 1
    return out


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: every input bit reaches every output bit."""
    h = h + _U64(0x9E3779B97F4A7C15)
    h = (h ^ (h >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> _U64(27))) * _U64(0x94D049BB133111EB)
    return h ^ (h >> _U64(31))


def string_hashes(values: pa.Array) -> np.ndarray:
    """A 64-bit hash of each string (or binary) value, computed a slice of the array
    at a time (about ``_HASH_BYTES`` of text: the work arrays take 8 bytes a byte):
    a polynomial of its bytes modulo 2**64 and its length, then mixed. Equal values
    hash equal in every process (no seed), so sketches merge."""
    array = values.cast(pa.binary()) if values.type != pa.binary() else values
    n = len(array)
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int32, count=n + 1,
                            offset=array.offset * 4).astype(np.int64)
    long = np.diff(offsets) > _HASH_BYTES
    if long.any():  # Hashed on their own, a piece at a time (a slice's work arrays hold 8x its bytes).
        hashes = np.empty(n, dtype=np.uint64)
        short = np.flatnonzero(~long)
        if len(short):
            hashes[short] = string_hashes(array.take(pa.array(short)))
        for i in np.flatnonzero(long).tolist():
            hashes[i] = _long_hash(array.buffers()[2], int(offsets[i]), int(offsets[i + 1]))
        return hashes
    if offsets[-1] - offsets[0] <= _HASH_BYTES:
        return _slice_hashes(array, offsets)
    cuts = np.unique(np.searchsorted(offsets, np.arange(offsets[0], offsets[-1], _HASH_BYTES)))
    bounds = [*(int(c) for c in cuts if 0 < c < n), n]
    parts, start = [], 0
    for end in bounds:
        part = array.slice(start, end - start)
        parts.append(_slice_hashes(part, offsets[start:end + 1]))
        start = end
    return np.concatenate(parts)


_HASH_BYTES = 1 << 20


def _slice_hashes(array: pa.Array, offsets: np.ndarray) -> np.ndarray:
    # A value's polynomial sums (byte + 1) * BASE**i over its bytes' positions i in the
    # value; summed over positions in the slice instead (one running sum for all), it is
    # BASE**start times too large, which BASE's inverse takes off.
    data = array.buffers()[2]
    first = int(offsets[0])
    size = int(offsets[-1]) - first
    body = (np.frombuffer(data, dtype=np.uint8, count=size, offset=first) if data is not None and size
            else np.empty(0, dtype=np.uint8)).astype(np.uint64)
    body += _U64(1)
    body *= _powers(size)
    sums = np.zeros(size + 1, dtype=np.uint64)
    np.cumsum(body, dtype=np.uint64, out=sums[1:])
    starts = offsets - first
    lengths = np.diff(offsets)
    hashes = (sums[starts[1:]] - sums[starts[:-1]]) * _inverse_powers(starts[:-1])
    return _mix(hashes ^ (lengths.astype(np.uint64) * _U64(0xC2B2AE3D27D4EB4F)))


def _long_hash(data: pa.Buffer, start: int, end: int) -> np.uint64:
    """``_slice_hashes``' hash of the one value in bytes ``[start, end)`` of ``data``,
    summed a ``_HASH_BYTES`` piece at a time: its polynomial is each piece's own times
    ``BASE`` to the piece's position (modulo 2**64, as the whole)."""
    total = 0
    for at in range(start, end, _HASH_BYTES):
        size = min(_HASH_BYTES, end - at)
        body = np.frombuffer(data, dtype=np.uint8, count=size, offset=at).astype(np.uint64)
        body += _U64(1)
        body *= _powers(size)
        piece = int(body.sum(dtype=np.uint64))
        total = (total + piece * pow(int(_BASE), at - start, 2**64)) % 2**64
    length = ((end - start) * 0xC2B2AE3D27D4EB4F) % 2**64
    return _mix(np.array([total ^ length], dtype=np.uint64))[0]


def _sketch(hashes: np.ndarray) -> np.ndarray:
    """The ``SKETCH_SIZE`` smallest distinct hashes, sorted."""
    if len(hashes) > 4 * SKETCH_SIZE:
        # Those up to the SKETCH_SIZE-th smallest hold them, unless repeats hide some.
        bound = np.partition(hashes, SKETCH_SIZE - 1)[SKETCH_SIZE - 1]
        smallest = np.unique(hashes[hashes <= bound])
        if len(smallest) >= SKETCH_SIZE:
            return smallest[:SKETCH_SIZE]
    return np.unique(hashes)[:SKETCH_SIZE]


# --- numbers --------------------------------------------------------------------------


@dataclasses.dataclass
class NumericSummary:
    """Count, missing, min, max, mean and spread of a numeric feature's values.

    Attributes:
      missing: rows whose cell was empty (with a ``default``, those rows hold the
        default, which the value statistics include).
      count: finite values summarised (a list column has several a row).
      non_finite: NaN and infinite values (left out of min, max, mean and std).
      mean, m2: the mean and the sum of squared deviations from it.
      minimum, maximum: ``None`` while ``count`` is 0.
      integer: whether the values are whole numbers (min and max print as ints).
    """

    missing: int = 0
    count: int = 0
    non_finite: int = 0
    mean: float = 0.0
    m2: float = 0.0
    minimum: float | int | None = None
    maximum: float | int | None = None
    integer: bool = False

    @classmethod
    def of(cls, values: np.ndarray, missing: int, integer: bool) -> NumericSummary:
        """The summary of an array of values (``float64``, or ``int64`` for ints)."""
        finite = values if integer else values[np.isfinite(values)]
        summary = cls(missing=missing, non_finite=len(values) - len(finite), integer=integer)
        if len(finite):
            as_float = finite.astype(np.float64)
            summary.count = len(finite)
            summary.mean = float(as_float.mean())
            summary.m2 = float(((as_float - summary.mean) ** 2).sum())
            low, high = finite.min(), finite.max()
            summary.minimum, summary.maximum = (int(low), int(high)) if integer else (float(low), float(high))
        return summary

    def merge(self, other: NumericSummary) -> NumericSummary:
        """Adds ``other`` into this summary; returns it."""
        self.missing += other.missing
        self.non_finite += other.non_finite
        if other.count:
            if not self.count:
                self.minimum, self.maximum = other.minimum, other.maximum
            else:
                self.minimum = min(self.minimum, other.minimum)
                self.maximum = max(self.maximum, other.maximum)
            total = self.count + other.count
            delta = other.mean - self.mean
            self.mean += delta * other.count / total
            self.m2 += other.m2 + delta * delta * self.count * other.count / total
            self.count = total
        return self

    def to_json(self) -> dict:
        empty = not self.count
        return {
            "kind": "numeric",
            "count": self.count,
            "missing": self.missing,
            "non_finite": self.non_finite,
            "min": None if empty else self.minimum,
            "max": None if empty else self.maximum,
            "mean": None if empty else self.mean,
            "std": None if empty else math.sqrt(max(self.m2, 0.0) / self.count),
        }


# --- strings ------------------------------------------------------------------------


def _empty_strings() -> pa.Array:
    return pa.array([], type=pa.string())


def _top_keys(values: pa.Array, hashes: np.ndarray) -> pa.Array:
    """The values as the top-value counters hold them: one longer than
    ``_TOP_KEY_CHARS`` characters by its first ``_SHOWN_CHARS`` and its hash (shown
    as the same cut text, counted apart from other values), so a counter never
    holds a cell of many megabytes through the run."""
    long = pc.greater(pc.utf8_length(values), _TOP_KEY_CHARS)
    if not pc.any(long).as_py():
        return values
    rows = np.flatnonzero(long.to_numpy(zero_copy_only=False)).tolist()
    shown = pa.concat_arrays([pc.utf8_slice_codeunits(values.slice(row, 1), 0, _SHOWN_CHARS)
                              for row in rows])  # Not a copy of each value first (take).
    keys = pc.binary_join_element_wise(
        shown, pa.array([f"\x00{int(hashes[row]):016x}" for row in rows], type=pa.string()), "")
    return pc.replace_with_mask(values, long, keys)


def _reduce_top(values: pa.Array, counts: np.ndarray) -> tuple[pa.Array, np.ndarray, int]:
    """Misra-Gries reduction to ``TOP_CAPACITY`` counters: every count less the
    (capacity + 1)-th largest, dropping those left at zero; returns what was taken
    off each (0 when nothing was)."""
    if len(counts) <= TOP_CAPACITY:
        return values, counts, 0
    order = np.argsort(-counts, kind="stable")
    cut = int(counts[order[TOP_CAPACITY]])
    keep = order[:TOP_CAPACITY]
    left = counts[keep] - cut
    keep, left = keep[left > 0], left[left > 0]
    return values.take(pa.array(keep)), left, cut


@dataclasses.dataclass
class StringSummary:
    """Missing, distinct (KMV sketch) and top values of a string or bytes feature.

    Attributes:
      missing: rows whose cell was empty (see ``NumericSummary.missing``).
      count: values summarised.
      sketch: the smallest distinct 64-bit hashes of the values (``SKETCH_SIZE`` at most).
      top_values, top_counts: value counts (exact, or a Misra-Gries summary once
        ``undercount`` > 0); empty for bytes (``with_top`` false).
      undercount: what the Misra-Gries reductions took off every count, in all: a
        bound on how far below its true count a value's count may be.
    """

    missing: int = 0
    count: int = 0
    sketch: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    top_values: pa.Array = dataclasses.field(default_factory=_empty_strings)
    top_counts: np.ndarray = dataclasses.field(default_factory=lambda: np.empty(0, dtype=np.int64))
    undercount: int = 0
    with_top: bool = True

    @classmethod
    def of(cls, values: pa.Array, missing: int, with_top: bool = True,
           extra: Mapping[str, int] | None = None) -> StringSummary:
        """The summary of an array of strings, plus ``extra`` ``{value: count}`` (defaults)."""
        long = None
        if with_top and len(values) and pc.max(pc.binary_length(values)).as_py() > _TOP_KEY_CHARS:
            # Counted by their keys (_top_keys), hashed whole: no copy of a long value.
            long = string_hashes(values)
            values = _top_keys(values.cast(pa.string()), long)
        counted = pc.value_counts(values) if len(values) else None
        distinct = counted.field("values") if counted is not None else _empty_strings()
        counts = (counted.field("counts").to_numpy(zero_copy_only=False).astype(np.int64)
                  if counted is not None else np.empty(0, dtype=np.int64))
        if extra:
            distinct = pa.concat_arrays([distinct.cast(pa.string()),
                                         pa.array(list(extra), type=pa.string())])
            counts = np.concatenate([counts, np.fromiter(extra.values(), dtype=np.int64)])
            table = pa.table({"v": distinct, "c": counts}).group_by("v").aggregate([("c", "sum")])
            distinct = table.column("v").combine_chunks()
            counts = table.column("c_sum").to_numpy()
        if long is None:
            hashes = string_hashes(distinct)
        else:
            hashes = np.concatenate([long, string_hashes(pa.array(list(extra or ()), type=pa.string()))])
        summary = cls(missing=missing, count=int(counts.sum()), sketch=_sketch(hashes), with_top=with_top)
        if with_top:
            summary.top_values, summary.top_counts, summary.undercount = _reduce_top(
                distinct.cast(pa.string()), counts)
        return summary

    def merge(self, other: StringSummary) -> StringSummary:
        """Adds ``other`` into this summary; returns it."""
        self.missing += other.missing
        self.count += other.count
        self.sketch = _sketch(np.concatenate([self.sketch, other.sketch]))
        if self.with_top and len(other.top_counts):
            if len(self.top_counts):
                table = pa.table({
                    "v": pa.concat_arrays([self.top_values, other.top_values]),
                    "c": np.concatenate([self.top_counts, other.top_counts]),
                }).group_by("v").aggregate([("c", "sum")])
                values, counts = table.column("v").combine_chunks(), table.column("c_sum").to_numpy()
            else:
                values, counts = other.top_values, other.top_counts
            self.top_values, self.top_counts, cut = _reduce_top(values, counts)
            self.undercount += other.undercount + cut
        elif self.with_top:
            self.undercount += other.undercount
        return self

    @property
    def distinct(self) -> tuple[int, bool]:
        """``(distinct values, exact)``: exact while every value has a top counter, or
        the sketch holds every value's hash (fewer than ``SKETCH_SIZE``; 64-bit hashes
        collide too rarely to matter); else the KMV estimate."""
        if self.with_top and not self.undercount:
            return len(self.top_counts), True
        if len(self.sketch) < SKETCH_SIZE:  # Every distinct hash is held: a count.
            return len(self.sketch), True
        estimate = (SKETCH_SIZE - 1) * 2.0**64 / (float(self.sketch[-1]) + 1.0)
        return int(round(estimate)), False

    def to_json(self) -> dict:
        distinct, exact = self.distinct
        out = {"kind": "string" if self.with_top else "bytes", "count": self.count,
               "missing": self.missing, "distinct": distinct, "distinct_exact": exact}
        if self.with_top:
            pairs = sorted(zip(self.top_values.to_pylist(), self.top_counts.tolist()),
                           key=lambda p: (-p[1], p[0]))[:TOP_VALUES]
            out["top_values"] = [
                {"value": v if len(v) <= _SHOWN_CHARS else v[:_SHOWN_CHARS] + "...", "count": c}
                for v, c in pairs]
            out["top_values_exact"] = not self.undercount
        return out


# --- tables -------------------------------------------------------------------------


@dataclasses.dataclass
class TableStatistics:
    """A split's partial table statistics: rows summarised and each feature's summary."""

    rows: int = 0
    features: dict = dataclasses.field(default_factory=dict)  # feature name → summary

    def merge(self, other: TableStatistics) -> TableStatistics:
        """Adds ``other`` into these statistics; returns them."""
        self.rows += other.rows
        for name, summary in other.features.items():
            mine = self.features.get(name)
            self.features[name] = summary if mine is None else mine.merge(summary)
        return self

    def to_json(self) -> dict:
        return {name: self.features[name].to_json() for name in sorted(self.features)}


def _cells_present(spec: ColumnSpec, cells: pa.Array) -> tuple[pa.Array, int]:
    """The non-empty cells (trimmed unless a string), and how many were empty."""
    text = cells if spec.type == "string" else pc.utf8_trim_whitespace(cells)
    empty = pc.equal(text, "")
    missing = int(pc.sum(empty).as_py() or 0)
    return (text.filter(pc.invert(empty)) if missing else text), missing


def _pieces(spec: ColumnSpec, present: pa.Array) -> pa.Array:
    """The values of non-empty cells: list cells split on the delimiter."""
    if not spec.is_list:
        return present
    pieces = pc.list_flatten(pc.split_pattern(present, pattern=spec.delimiter))
    return pieces if spec.type == "string" else pc.utf8_trim_whitespace(pieces)


def _defaults(spec: ColumnSpec) -> list:
    if spec.default is None:
        return []
    return list(spec.default) if isinstance(spec.default, list) else [spec.default]


def _numbers(spec: ColumnSpec, pieces: pa.Array) -> np.ndarray:
    """Values of an int64, float or bool column, as written (floats as float32)."""
    if spec.type == "bool":
        truth = pc.is_in(pc.utf8_lower(pieces), value_set=pa.array(sorted(TRUE_WORDS)))
        return truth.to_numpy(zero_copy_only=False).astype(np.int64)
    if spec.type == "int64":
        try:
            text = pieces
            if pc.any(pc.starts_with(pieces, "+")).as_py():
                text = pc.replace_substring_regex(pieces, pattern=r"^\+", replacement="")
            return pc.cast(text, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # Whatever Arrow does not parse.
            return np.array([int(p) for p in pieces.to_pylist()], dtype=np.int64)
    try:
        numbers = pc.cast(pieces, pa.float64()).to_numpy(zero_copy_only=False)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        numbers = np.array([float(p) for p in pieces.to_pylist()], dtype=np.float64)
    return numbers.astype(np.float32).astype(np.float64)


def _column_summary(spec: ColumnSpec, cells: pa.Array):
    present, missing = _cells_present(spec, cells)
    pieces = _pieces(spec, present)
    defaults = _defaults(spec) if missing else []
    if spec.type in ("int64", "float", "bool"):
        values = _numbers(spec, pieces)
        if defaults:
            fill = np.tile(np.asarray([int(bool(d)) if spec.type == "bool" else d for d in defaults],
                                      dtype=values.dtype), missing)
            values = np.concatenate([values, fill.astype(np.float32).astype(np.float64)
                                     if spec.type == "float" else fill])
        return NumericSummary.of(values, missing, integer=spec.type != "float")
    extra = Counter({str(d): missing for d in defaults}) if defaults else None
    return StringSummary.of(pieces, missing, with_top=spec.type == "string", extra=extra)


def _batch_statistics(schema: TableSchema, batch: pa.RecordBatch) -> TableStatistics:
    stats = TableStatistics(rows=batch.num_rows)
    for spec in schema.kept:
        stats.features[spec.feature_name] = _column_summary(spec, batch.column(spec.name))
    return stats


def table_batch_statistics(schema: TableSchema, batch: pa.RecordBatch, status: np.ndarray,
                           splits: Sequence[str]) -> dict[str, TableStatistics]:
    """Per split, the statistics of a batch's rows that were written.

    Args:
      schema: the table schema (its kept columns are summarised).
      batch: the rows, one string column per CSV column.
      status: per row, the index of its split in ``splits``, or a negative value
        for a row not written (blank, or sent to the dead letter).
      splits: split names.
    """
    kept = [spec.name for spec in schema.kept]
    columns = batch.select(kept) if kept else batch
    out = {}
    for k, split in enumerate(splits):
        mask = status == k
        rows = int(mask.sum())
        if rows:
            part = columns if rows == batch.num_rows else columns.filter(pa.array(mask))
            out[split] = _batch_statistics(schema, part)
    return out


def merge_table_statistics(parts: Iterable[tuple[str, TableStatistics | None]]
                           ) -> tuple[tuple[str, TableStatistics], ...]:
    """``(split, statistics)`` pairs merged per split, sorted by split (the inputs
    are left unchanged)."""
    merged: dict[str, TableStatistics] = {}
    for split, stats in parts:
        if stats is None:
            continue
        into = merged.setdefault(split, TableStatistics())
        into.merge(_copy(stats))
    return tuple(sorted(merged.items()))


def _copy(stats: TableStatistics) -> TableStatistics:
    return TableStatistics(stats.rows, {name: dataclasses.replace(summary)
                                        for name, summary in stats.features.items()})


# --- images -------------------------------------------------------------------------


def image_counts(images: Iterable[tuple[str, str, int, int]]) -> Counter:
    """``Counter`` of ``format/…``, ``mode/…``, ``width/…`` and ``height/…`` from
    each image's ``(format, mode, width, height)`` as stored."""
    counts: Counter = Counter()
    for image_format, mode, width, height in images:
        counts[f"format/{image_format}"] += 1
        counts[f"mode/{mode}"] += 1
        counts[f"width/{width}"] += 1
        counts[f"height/{height}"] += 1
    return counts


def _quantiles(sizes: Mapping[int, int]) -> dict | None:
    """Nearest-rank quantiles of whole numbers given as ``{value: count}``: the
    smallest value whose share of values at or below it reaches ``q``% (numpy's
    ``percentile(..., method="inverted_cdf")``)."""
    if not sizes:
        return None
    values = np.array(sorted(sizes), dtype=np.int64)
    ranks = np.cumsum([sizes[v] for v in values.tolist()])
    total = int(ranks[-1])
    out = {}
    for q in QUANTILES:
        rank = max(1, math.ceil(q / 100 * total - 1e-9))
        out[f"p{q}"] = int(values[np.searchsorted(ranks, rank)])
    return out


def image_statistics_json(counts: Mapping[str, int], classes: Mapping[str, int]) -> dict:
    """The ``images`` part of a split's statistics, from merged ``image_counts``."""
    kinds: dict[str, dict] = {"format": {}, "mode": {}, "width": {}, "height": {}}
    for key, count in counts.items():
        kind, _, value = key.partition("/")
        if kind in kinds and count:
            kinds[kind][int(value) if kind in ("width", "height") else value] = count
    return {
        "formats": dict(sorted(kinds["format"].items())),
        "modes": dict(sorted(kinds["mode"].items())),
        "width": _quantiles(kinds["width"]),
        "height": _quantiles(kinds["height"]),
        "classes": dict(sorted(classes.items())),
    }


# --- per split ----------------------------------------------------------------------


def split_statistics(results: Sequence[ShardResult], summary: InputSummary) -> dict[str, dict]:
    """``{split: statistics}`` of what was written (see ``schemas.manifest``)."""
    by_split: dict[str, list[ShardResult]] = {}
    for result in results:
        by_split.setdefault(result.split, []).append(result)
    tables = dict(summary.statistics)
    out = {}
    for split, split_results in sorted(by_split.items()):
        stats: dict = {"records": sum(r.records for r in split_results)}
        if summary.layout == "table" and not summary.sequence_features:
            part = tables.get(split)
            stats["features"] = part.to_json() if part is not None else {}
        elif summary.layout not in ("table", "records"):
            counts: Counter = Counter()
            classes: Counter = Counter()
            for result in split_results:
                counts.update(dict(result.image_counts))
                classes.update(dict(result.label_counts))
            stats["images"] = image_statistics_json(counts, classes)
        out[split] = stats
    return out
