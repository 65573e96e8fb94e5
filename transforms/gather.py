"""What the commit needs of every record, gathered on the workers, so that the
commit itself holds counts, not contents.

Every image record has a content entry (its image's SHA-256, its
``image/filename``, the file's own SHA-256 when that differs), which its shard's
writer put in a side file (``transforms.io.contents``). From those files:

- **Duplicates**: each shard's entries are sent, a batch per hash bucket (a
  range of content hashes), to the worker that holds that bucket; it finds the
  contents held more than once and tallies them (``quality.duplicates.DuplicateTally``:
  every group counted, the first ``LISTED_GROUPS`` of each kind listed); the
  tallies are merged into the one report the commit publishes.
- **inputs.jsonl**: the launcher's file (and, for a listing made on the workers,
  each unit's) is cut into pieces at line ends, in order; each file's content
  hash is sent to the piece that holds its line (pieces are ranges of paths), a
  worker completes each piece (``schemas.inputs.complete_lines``), and one step
  joins the pieces in order into the staged file while computing its SHA-256 and
  the input fingerprint (``InputsFingerprint``), a block at a time.

The commit receives one ``Gathered``: the duplicates report and the staged
``inputs.jsonl`` (path, size, digest, file count, fingerprint). No step holds
every record's entry. ``gather_in_process`` gives the same from the side files
in one process (for a caller of ``commit_run`` without the pipeline).
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import heapq
import json
import logging
import marshal
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from beam_tfrecords.schemas.elements import CompletedInputs, ShardResult
from beam_tfrecords.schemas.inputs import (
    INPUTS_NAME,
    UNIT_INPUTS_DIR,
    InputsFingerprint,
    complete_inputs,
    unit_inputs_name,
)
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.io.contents import paused_gc, shard_contents
from beam_tfrecords.transforms.io.helpers import live_helper_pool
from beam_tfrecords.transforms.io.piece_completion import complete_local_piece, complete_piece
from beam_tfrecords.transforms.quality.duplicates import DuplicateTally, content_groups, duplicate_report

__all__ = ["COMPLETED_INPUTS", "GatherContents", "Gathered", "gather_in_process", "input_pieces", "join_gathered"]

_log = logging.getLogger(__name__)
# The completed inputs.jsonl, staged in the run's temporary folder (the launcher's
# own file there is never overwritten: a retried piece reads it again).
COMPLETED_INPUTS = "inputs.completed.jsonl"
_PIECES_DIR = "inputs-completed"
# inputs.jsonl is completed in pieces of about this many bytes (~250,000 lines), and
# in at least _SOME_PIECES of them once it holds _SOME_PIECES MiB (~10,000 lines a
# MiB): pieces the helper processes of a local run complete side by side.
PIECE_BYTES = 32 << 20
_SOME_PIECES = 4
_PIECE_BYTES_AT_LEAST = 1 << 20
# Duplicates are found in this many content-hash buckets (a bucket holds 1/64 of the
# records: ~160,000 at 10M, ~30 MB).
BUCKETS = 64


@dataclasses.dataclass(frozen=True)
class Gathered:
    """What the commit learns of every record.

    Attributes:
      duplicates: the duplicates report (``quality.duplicates.duplicate_report``; ``{}``
        when every content is unique).
      inputs: the completed ``inputs.jsonl``, staged; ``None`` when the run has none.
    """

    duplicates: dict
    inputs: CompletedInputs | None



@dataclasses.dataclass(frozen=True)
class _Piece:
    """Consecutive lines of the run's ``inputs.jsonl`` sources: ``ranges`` of
    ``(source, start, end)`` (bytes, at line ends), in order; ``first_key``: the
    sort key of its first line (``None`` when it has none)."""

    index: int
    ranges: tuple[tuple[str, int, int], ...]
    first_key: tuple | None


@dataclasses.dataclass(frozen=True)
class _DonePiece:
    """A completed piece, sorted, in a file of its own (``path``): its lines
    (``lines_size`` bytes), then its files' fingerprint tokens; and what the join
    checks and adds up."""

    index: int
    path: str
    lines_size: int
    size: int
    role_tokens: tuple
    files: int
    first_key: tuple | None
    last_key: tuple | None


def _sources(temp_dir: str, input_units: int) -> list[tuple[str, int]]:
    """``(path, size)`` of the run's ``inputs.jsonl`` sources, in order: the launcher's
    (when it wrote one), then each listing unit's (found with one listing).

    Raises:
      FileNotFoundError: naming a listing unit's file that is not there.
    """
    launcher = files.join(temp_dir, INPUTS_NAME)
    found = [(launcher, _size(launcher))] if files.exists(launcher) else []
    if input_units:
        sizes = dict(files.list_under(files.join(temp_dir, UNIT_INPUTS_DIR)))
        for unit in range(input_units):
            path = files.join(temp_dir, UNIT_INPUTS_DIR, unit_inputs_name(unit))
            if path not in sizes:
                raise FileNotFoundError(f"{path}: a listing unit's inputs.jsonl lines are missing")
            found.append((path, sizes[path]))
    return found


def _size(path: str) -> int:
    return FileSystems.get_filesystem(path).metadata(path).size_in_bytes


def _line_key(line: bytes) -> tuple | None:
    """The sort key ``(no role, role, path)`` of a line; ``None`` for a blank or bad line
    (that piece's completion names it)."""
    try:
        value = json.loads(line)
        role = str(value.get("role", ""))
        return role == "", role, str(value["path"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _line_ranges(path: str, size: int, piece_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``path`` cut at line ends into ranges of about ``piece_bytes``
    (a small file is one range, and is not read)."""
    bounds = [0]
    if size > piece_bytes:
        with files.open_read(path) as stream:
            for offset in range(piece_bytes, size, piece_bytes):
                if offset <= bounds[-1]:
                    continue
                stream.seek(offset - 1)
                stream.readline()  # To the end of the line that holds byte offset - 1.
                if stream.tell() < size:
                    bounds.append(stream.tell())
    return list(zip(bounds, bounds[1:] + [size]))


def _first_key(ranges: Sequence[tuple[str, int, int]]) -> tuple | None:
    """The sort key of the first line of ``ranges`` (one short read, usually)."""
    for source, start, end in ranges:
        if start == end:
            continue
        with files.open_read(source) as stream:
            stream.seek(start)
            while stream.tell() < end:
                line = stream.readline()
                if line.strip():
                    return _line_key(line)  # None for a bad line: its completion names it.
    return None


def input_pieces(temp_dir: str, input_units: int, piece_bytes: int = PIECE_BYTES) -> list[_Piece]:
    """The run's ``inputs.jsonl`` sources (the launcher's file, then each listing
    unit's), in order, as pieces of about ``piece_bytes``: a large file cut at line
    ends, small ones taken together, each piece with its first line's key (one
    listing, and a few short reads per piece)."""
    groups: list[list[tuple[str, int, int]]] = [[]]
    held = 0
    sources = _sources(temp_dir, input_units)
    piece_bytes = min(piece_bytes, max(_PIECE_BYTES_AT_LEAST, sum(size for _, size in sources) // _SOME_PIECES))
    for source, size in sources:
        for start, end in _line_ranges(source, size, piece_bytes):
            if groups[-1] and held + end - start > piece_bytes:
                groups.append([])
                held = 0
            groups[-1].append((source, start, end))
            held += end - start
    return [_Piece(index, tuple(ranges), _first_key(ranges))
            for index, ranges in enumerate(groups) if ranges]


_found_pieces: dict[tuple[str, int], list[_Piece]] = {}
_found_lock = threading.Lock()


def _run_pieces(temp_dir: str, input_units: int) -> list[_Piece]:
    """``input_pieces`` of a run, found once per worker process (its files do not
    change once every file was listed)."""
    key = (temp_dir, input_units)
    with _found_lock:
        if key not in _found_pieces:
            if len(_found_pieces) > 8:
                _found_pieces.clear()
            _found_pieces[key] = input_pieces(temp_dir, input_units)
        return _found_pieces[key]


def _router(pieces: Sequence[_Piece]):
    """``filename -> piece index``: the piece whose path range holds the file's line."""
    keyed = [(p.first_key, p.index) for p in sorted(pieces, key=lambda p: p.index) if p.first_key]
    keys = [key for key, _ in keyed]
    if not keyed:
        return lambda _: -1

    # Lines of files without a role only (the usual run): routed by path alone, with no
    # key tuple made per name.
    paths = [key[2] for key in keys] if all(key[0] is True and key[1] == "" for key in keys) else None

    def route(filename: str) -> int:
        at = bisect.bisect_right(paths, filename) if paths is not None else bisect.bisect_right(
            keys, (True, "", filename))
        return keyed[max(0, at - 1)][1]

    if len(keyed) == 1:
        route.only = keyed[0][1]
    return route


class _ReadContentsFn(beam.DoFn):
    """``ShardResult`` → ``(("bucket", b), ("entries", [(sha256, split, filename), ...]))``
    per content-hash bucket, and ``(("piece", i), ("names", [(filename, file sha256), ...]))``
    per ``inputs.jsonl`` piece, each list marshalled (``_GatherFn`` loads it).

    The pieces are found once per worker (``input_pieces``: a few short reads); every
    listing unit's piece exists by then, since every shard's plan needed every unit.
    """

    def __init__(self, temp_dir: str, input_units: int):
        self._temp_dir = temp_dir
        self._units = input_units
        self._route = None

    def process(self, result: ShardResult) -> Iterator:
        if not result.contents_count:
            return
        with paused_gc():
            parts = self._parts(result)
        yield from parts

    def _parts(self, result: ShardResult) -> list:
        if self._route is None:
            pieces = _run_pieces(self._temp_dir, self._units)
            self._route = _router(pieces) if pieces else False
        route = self._route
        entries = list(shard_contents(result))
        split, crc32 = result.split, zlib.crc32
        by_bucket: dict[int, list] = {}
        for digest, filename, _ in entries:  # The bucket: CRC-32 of the hash, modulo BUCKETS.
            key = crc32(digest.encode("ascii", "replace")) % BUCKETS
            if key in by_bucket:
                by_bucket[key].append((digest, split, filename))
            else:
                by_bucket[key] = [(digest, split, filename)]
        by_piece: dict[int, list] = {}
        if route:
            names = [(filename, source or digest) for digest, filename, source in entries]
            only = getattr(route, "only", None)  # One piece: every name is routed to it.
            if only is not None:
                by_piece[only] = names
            else:
                for name in names:
                    by_piece.setdefault(route(name[0]), []).append(name)
        # Each list marshalled at once (tuples of str only; every worker runs one Python):
        # the runner then moves a few blobs through the group, not three objects a
        # record, each coded on its own.
        dumps = marshal.dumps
        return ([(("bucket", bucket), ("entries", dumps(entries))) for bucket, entries in by_bucket.items()]
                + [(("piece", index), ("names", dumps(names))) for index, names in by_piece.items()])


def _pieces(_, temp_dir: str, input_units: int) -> Iterator:
    """Every ``inputs.jsonl`` piece, as an element of its own (so that a piece no
    record's hash reaches is completed too)."""
    for piece in _run_pieces(temp_dir, input_units):
        yield ("piece", piece.index), ("piece", piece)


class _RouteNamesFn(beam.DoFn):
    """filename → ``(("piece", i), ("excluded", [filename]))``: the piece whose line it
    leaves out."""

    def __init__(self, temp_dir: str, input_units: int):
        self._temp_dir = temp_dir
        self._units = input_units
        self._route = None

    def process(self, filename: str) -> Iterator:
        if self._route is None:
            pieces = _run_pieces(self._temp_dir, self._units)
            self._route = _router(pieces) if pieces else False
        if self._route:
            yield ("piece", self._route(filename)), ("excluded", [filename])


class _GatherFn(beam.DoFn):
    """A content-hash bucket → ``(None, ("tally", DuplicateTally))`` of its groups of
    copies; an ``inputs.jsonl`` piece with its files' hashes → ``(None, ("piece",
    _DonePiece))``, its lines completed (sorted) and written.

    A run whose temporary folder is local and whose helper processes still run (the
    local runner's) has its pieces completed there (``io.piece_completion``), side by
    side, while this process tallies the buckets; they are handed on at the bundle's
    end."""

    def __init__(self, temp_dir: str):
        self._temp_dir = temp_dir
        self._pending: list = []

    def start_bundle(self) -> None:
        self._pending = []

    def process(self, element) -> Iterator:
        (kind, index), values = element
        with paused_gc():
            done = self._bucket(values) if kind == "bucket" else self._piece(index, values)
        if done is not None:
            yield None, done

    def finish_bundle(self) -> Iterator:
        pending, self._pending = self._pending, []
        for index, future in pending:
            yield GlobalWindows.windowed_value((None, ("piece", self._done(index, future.result()))))

    @staticmethod
    def _bucket(values) -> tuple:
        tally = DuplicateTally()
        entries = (entry for _, batch in values for entry in marshal.loads(batch))
        for digest, group in content_groups(entries):
            tally.add(digest, group)
        return "tally", tally

    def _piece(self, index: int, values) -> tuple | None:
        found, names, excluded = [], [], set()
        for what, value in values:
            if what == "piece":
                found.append(value)
            elif what == "names":
                names.append(value)
            else:
                excluded.update(value)
        if not found:
            return None
        ranges, path = found[0].ranges, self._piece_path(index)
        pool = live_helper_pool() if files.is_local(self._temp_dir) else None
        if pool is not None:
            self._pending.append((index, pool.submit(complete_local_piece, ranges, names, excluded, path)))
            return None
        digests: dict = {}
        for blob in names:
            digests.update(marshal.loads(blob))
        return "piece", self._done(index, complete_piece(ranges, digests, excluded, path, files.open_read,
                                                         files.write_bytes))

    def _piece_path(self, index: int) -> str:
        return files.join(self._temp_dir, _PIECES_DIR, f"piece-{index:06d}")

    def _done(self, index: int, made: tuple) -> _DonePiece:
        lines_size, size, role_tokens, count, first_key, last_key = made
        return _DonePiece(index, self._piece_path(index), lines_size, size, role_tokens, count, first_key,
                          last_key)


def _ordered(done: Sequence[_DonePiece]) -> bool:
    """Whether the pieces, each in order, follow one another without overlapping."""
    last = None
    for piece in done:
        if piece.first_key is not None:
            if last is not None and piece.first_key < last:
                return False
            last = piece.last_key
    return True


def _lines(path: str, start: int, end: int) -> Iterator[bytes]:
    """The lines in bytes ``[start, end)`` of ``path``, one at a time."""
    with files.open_read(path) as stream:
        stream.seek(start)
        while stream.tell() < end:
            yield stream.readline()


def _merged(ranges: Sequence[tuple[str, int, int]], key) -> Iterator[bytes]:
    """The lines of ranges each sorted by ``key``, merged in that order, a line at a time."""
    return heapq.merge(*(_lines(*r) for r in ranges), key=key)


def _token_path(line: bytes) -> str:
    return json.loads(line)[1]


def join_gathered(parts: Iterable[tuple[str, object]], temp_dir: str, options_fingerprint: str) -> Gathered:
    """``GatherContents``' parts → ``Gathered``, in the commit: the buckets' tallies
    merged into the report, and the completed pieces joined in order into the
    staged ``inputs.jsonl`` (its SHA-256 and the input fingerprint computed as it is
    written, a block at a time; pieces whose path ranges overlap, which the files
    this product writes never do, are merged line by line)."""
    tally, done = DuplicateTally(), []
    for kind, value in parts:
        if kind == "tally":
            tally.merge(value)
        else:
            done.append(value)
    if not done:
        return Gathered(tally.report(), None)
    done.sort(key=lambda p: p.index)
    line_ranges = [(p.path, 0, p.lines_size) for p in done]
    token_ranges = [(p.path, p.lines_size, p.size) for p in done]
    if _ordered(done):
        lines = (block for r in line_ranges for block in files.read_range(*r))
        tokens = (block for r in token_ranges for block in files.read_range(*r))
    else:
        lines = _merged(line_ranges, _line_key)
        tokens = _merged(token_ranges, _token_path)
    staged = files.join(temp_dir, COMPLETED_INPUTS)
    sha256, size, fingerprint = hashlib.sha256(), 0, InputsFingerprint(options_fingerprint)
    with files.open_write(staged) as out:
        for block in lines:
            out.write(block)
            sha256.update(block)
            size += len(block)
    for block in tokens:
        fingerprint.add_files(block)
    role_tokens = [token for piece in done for token in piece.role_tokens]
    return Gathered(tally.report(), CompletedInputs(staged, size, sha256.hexdigest(),
                                                    sum(p.files for p in done),
                                                    fingerprint.finish(role_tokens)))


def _entries(results: Iterable[ShardResult]) -> Iterator[tuple[str, str, str, str]]:
    """``(sha256, split, filename, file sha256 or '')`` of every record, from the side files."""
    for result in sorted(results, key=lambda r: (r.split, r.index)):
        for digest, filename, source in shard_contents(result):
            yield digest, result.split, filename, source


def _complete_whole(temp_dir: str, input_units: int, options_fingerprint: str,
                    results: Sequence[ShardResult], excluded: set[str]) -> CompletedInputs | None:
    sources = _sources(temp_dir, input_units)
    if not sources:
        return None
    data = b"".join(files.read_bytes(source) for source, _ in sources)
    digests = {filename: source or digest for digest, _, filename, source in _entries(results)}
    if excluded:
        data = b"".join(line + b"\n" for line in data.split(b"\n") if line.strip()
                        and not _excluded(line, excluded))
    inputs_bytes, count, fingerprint = complete_inputs(data, digests, options_fingerprint)
    staged = files.join(temp_dir, COMPLETED_INPUTS)
    files.write_bytes(staged, inputs_bytes)
    return CompletedInputs(staged, len(inputs_bytes), hashlib.sha256(inputs_bytes).hexdigest(), count,
                           fingerprint)


def _excluded(line: bytes, excluded: set[str]) -> bool:
    key = _line_key(line)
    return key is not None and key[0] and key[2] in excluded


def gather_in_process(temp_dir: str, input_units: int, options_fingerprint: str,
                      results: Sequence[ShardResult], excluded: Iterable[str] = ()) -> Gathered:
    """What ``GatherContents`` gives, made in this process from the side files (its
    memory grows with the records: for callers of ``commit_run`` without a pipeline)."""
    duplicates = duplicate_report((digest, split, filename) for digest, split, filename, _ in _entries(results))
    return Gathered(duplicates, _complete_whole(temp_dir, input_units, options_fingerprint, results,
                                                set(excluded)))


class GatherContents(beam.PTransform):
    """``ShardResult`` s → the parts of the commit's ``Gathered``, found on the workers
    from the shards' side files, under the key ``None`` (the commit groups them with
    its own): ``("tally", DuplicateTally)`` per content-hash bucket (its groups of
    copies) and ``("piece", ...)`` per ``inputs.jsonl`` piece (completed, written
    beside it); ``join_gathered`` makes the ``Gathered`` of them in the commit.

    Args:
      temp_dir: the run's temporary folder (the launcher's ``inputs.jsonl``, the
        units' pieces, and what this step stages).
      input_units: the listing units whose ``inputs.jsonl`` pieces follow the
        launcher's (``--list_on_workers``; 0 otherwise).
      listed: a PCollection of one element made once every input file was listed
        (the run's ``InputSummary``): the pieces of ``inputs.jsonl`` are cut then.
      excluded: a PCollection of ``image/filename`` s listed by the launcher but left
        out by the run before any shard (copies dropped on the workers, files that
        could not be read to hash), whose lines ``inputs.jsonl`` does not keep; or
        ``None``.

    Its steps are few and plain (Beam builds every applied transform at some cost,
    and a local run pays it on every run): one group per kind of key.
    """

    def __init__(self, temp_dir: str, input_units: int, listed, excluded=None):
        super().__init__()
        self._listed = listed
        self._temp_dir = temp_dir
        self._units = input_units
        self._excluded = excluded

    def expand(self, results):
        keyed = [
            results | "ReadContents" >> beam.ParDo(_ReadContentsFn(self._temp_dir, self._units)),
            # Every piece, as soon as the run's summary says every file was listed.
            self._listed | "Pieces" >> beam.FlatMap(_pieces, self._temp_dir, self._units),
        ]
        if self._excluded is not None:
            keyed.append(self._excluded | "RouteLeftOut" >> beam.ParDo(
                _RouteNamesFn(self._temp_dir, self._units)))
        return (
            keyed
            | "Keyed" >> beam.Flatten()
            | "ByBucketOrPiece" >> beam.GroupByKey()
            | "FindCopiesCompletePieces" >> beam.ParDo(_GatherFn(self._temp_dir))
        )
