"""The listing the launcher hands to a listing step in another process, as data.

On a runner whose steps run elsewhere (Dataflow, the multi-process DirectRunner)
the launcher writes its listing to the run's temporary folder on the output, and
the listing step reads it there instead of listing again. That folder is storage
other people may be able to write to, so what is handed over is plain data,
never code: Arrow IPC files, read with nothing but Arrow's and JSON's parsers.

- The hand-off (``HANDOFF_NAME``): its schema's metadata holds one JSON header
  under ``beam-tfrecords``: format and version, the listing's arguments
  (``graph_args``), and every field of the ``Listing`` but the references
  (layout, vocabulary, dead letters, skipped paths, ...); its one record batch is
  the index of the parts: each part's file name, reference count and SHA-256.
- The parts (``part_name``, beside it): the references in order, at most
  ``PART_ROWS`` in each, one record batch per file: for a ``RefTable`` its
  columns as they are (``filename`` is the blob and offsets of relative paths,
  as one ``large_binary`` column, not copied; the annotations likewise, in a column
  of their own when the table has them), for a list of ``ImageRef`` one row
  each (strings as UTF-8 with ``surrogatepass``, so names that are not UTF-8 come
  back as they were; extra features as JSON; when any reference carries
  annotations, an ``annotation`` column of their bytes, plain JSON decoded on the
  worker by ``codec.annotation_bytes``). A step that works on one part reads
  that file alone.

The launcher puts the hand-off's SHA-256 into the job graph (the listing step's
arguments), and the step checks it (``check_digest``) before it parses a byte;
the hand-off holds each part's SHA-256, checked before the part is parsed
(``decode_part``): a file changed or replaced after the launcher wrote it is
refused, whatever it holds. The hand-off of a 1M-image listing is ~70 MB (``benchmarks/bench_planning.py
--handoff`` measures writing and reading it against the pickle it replaced).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.plan.layouts import Listing
from beam_tfrecords.transforms.plan.ref_table import RefTable

__all__ = ["HANDOFF_NAME", "PART_ROWS", "HandoffError", "check_digest", "decode_listing", "decode_part",
           "encode_listing", "encode_part", "graph_args", "listing_parts", "part_name"]

HANDOFF_NAME = "listing.arrow"
_FORMAT = "beam-tfrecords listing"
_VERSION = 3  # 3: a list of references carries each object's generation and CRC-32C.
_KEY = b"beam-tfrecords"
_TEXT = "surrogatepass"  # Any Python str to UTF-8 and back, lone surrogates included.
_TABLE_COLUMNS = (("filename", pa.large_binary()), ("size", pa.int64()), ("split", pa.int32()),
                  ("label", pa.int32()), ("key_high", pa.uint64()), ("key_low", pa.uint64()),
                  ("stamp", pa.int64()), ("crc", pa.int64()))
_LIST_COLUMNS = (("split", pa.large_binary()), ("key", pa.large_binary()),
                 ("filename", pa.large_binary()), ("path", pa.large_binary()), ("size", pa.int64()),
                 ("label", pa.int64()), ("label_text", pa.large_binary()), ("extra", pa.large_binary()),
                 ("generation", pa.int64()), ("crc", pa.int64()))
# A list whose references carry annotations (``ImageRef.annotation``) has one column more;
# without any, a part is written as before the column existed (byte for byte).
_ANNOTATION_COLUMN = ("annotation", pa.large_binary())
_ANNOTATED_COLUMNS = (*_LIST_COLUMNS, _ANNOTATION_COLUMN)
_ANNOTATED_TABLE_COLUMNS = (*_TABLE_COLUMNS, _ANNOTATION_COLUMN)


class HandoffError(ValueError):
    """A listing hand-off that is not the one the launcher wrote, or not one at all."""


# Where the listing's arguments hold ``only`` (an incremental run's files to convert).
_ONLY = 9


def graph_args(args: Sequence) -> tuple:
    """The listing's arguments as the job graph carries them when the listing is
    handed over: ``only`` (an incremental run's new and changed files, maybe
    millions of names, against Dataflow's ~10 MB job graph) replaced by one
    ``sha256:<hex>`` of its names; the names are in the hand-off itself (the
    listing holds only those files), which the graph's digest of it vouches for."""
    args = tuple(args)
    if len(args) <= _ONLY or not args[_ONLY] or _is_only_digest(args[_ONLY]):
        return args
    names = "\n".join(sorted(args[_ONLY])).encode("utf-8", _TEXT)
    return (*args[:_ONLY], ("sha256:" + hashlib.sha256(names).hexdigest(),), *args[_ONLY + 1:])


def _is_only_digest(only) -> bool:
    return len(only) == 1 and isinstance(only[0], str) and only[0].startswith("sha256:")


def _plain(args: Sequence) -> list:
    """The listing's arguments as the hand-off records them (``graph_args``) and JSON
    gives them back (tuples become lists)."""
    return json.loads(json.dumps(list(graph_args(args))))


def _letter(letter: DeadLetter) -> list[str]:
    return [letter.source, letter.stage, letter.error, letter.message, letter.row]


def _header(args: Sequence, listing: Listing, refs: dict) -> bytes:
    return json.dumps({
        "format": _FORMAT, "version": _VERSION, "args": _plain(args), "layout": listing.layout,
        "vocabulary": list(listing.vocabulary), "ignored": int(listing.ignored),
        "dead_letters": [_letter(d) for d in listing.dead_letters],
        "extra_features": dict(listing.extra_features),
        "skipped": [_letter(d) for d in listing.skipped], "split_source": listing.split_source,
        "duplicates_dropped": [list(d) for d in listing.duplicates_dropped], "refs": refs,
    }).encode("ascii")  # json.dumps escapes every non-ASCII character (surrogates included).


_NUMPY = {pa.int32(): np.int32, pa.int64(): np.int64, pa.uint64(): np.uint64}


def _array(values: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.array(np.ascontiguousarray(values, dtype=_NUMPY[kind]), type=kind)


def _binary(n: int, blob: bytes, offsets: np.ndarray) -> pa.Array:
    """A blob and its offsets as a ``large_binary`` column, not copied."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(blob)])


def _table_batch(table: RefTable) -> pa.RecordBatch:
    n = len(table)
    names = _binary(n, table.blob, table.offsets)
    keys = table.keys.reshape(-1, 2)
    columns = [names, _array(table.sizes, pa.int64()), _array(table.split_codes, pa.int32()),
               _array(table.labels, pa.int32()), _array(keys[:, 0], pa.uint64()),
               _array(keys[:, 1], pa.uint64()), _array(table.stamps, pa.int64()),
               _array(table.crcs, pa.int64())]
    if table.annotations is not None:
        columns.append(_binary(n, *table.annotations))
    names = [name for name, _ in _ANNOTATED_TABLE_COLUMNS]
    return pa.RecordBatch.from_arrays(columns, names=names[:len(columns)])


def _text(values) -> pa.Array:
    return pa.array([value.encode("utf-8", _TEXT) for value in values], type=pa.large_binary())


def _list_batch(refs: Sequence[ImageRef]) -> pa.RecordBatch:
    columns = [
        _text(r.split for r in refs), _text(r.key for r in refs), _text(r.filename for r in refs),
        _text(r.path for r in refs), pa.array([r.size for r in refs], type=pa.int64()),
        pa.array([r.label for r in refs], type=pa.int64()), _text(r.label_text for r in refs),
        _text(json.dumps([list(e) for e in r.extra]) if r.extra else "" for r in refs),
        pa.array([r.generation for r in refs], type=pa.int64()),
        pa.array([r.crc32c for r in refs], type=pa.int64()),
    ]
    names = [name for name, _ in _LIST_COLUMNS]
    if any(r.annotation for r in refs):
        columns.append(pa.array([r.annotation for r in refs], type=pa.large_binary()))
        names.append(_ANNOTATION_COLUMN[0])
    return pa.RecordBatch.from_arrays(columns, names=names)


# A hand-off holds its references in parts of at most this many (each a file of its
# own, ~20 MB for a folder layout's), so that a step reads only the part it works on.
PART_ROWS = 250_000
_PART_FORMAT = "beam-tfrecords listing part"
_INDEX_COLUMNS = (("name", pa.large_binary()), ("count", pa.int64()), ("sha256", pa.large_binary()))


def part_name(index: int) -> str:
    """The file name of a hand-off's part ``index`` (beside the hand-off)."""
    return f"listing-{index:05d}.arrow"


def listing_parts(refs: Sequence[ImageRef], rows: int = PART_ROWS) -> Iterator[Sequence[ImageRef]]:
    """A listing's references cut into parts of at most ``rows``, in order (a
    ``RefTable`` into tables of its rows, a list into lists), one made at a time;
    one part at least."""
    n = len(refs)
    bounds = list(range(0, n, rows)) + [n] if n else [0, 0]
    for start, end in zip(bounds, bounds[1:]):
        if (start, end) == (0, n):
            yield refs
        elif isinstance(refs, RefTable):
            yield refs.rows(np.arange(start, end))
        else:
            yield list(refs[start:end])


def encode_part(refs: Sequence[ImageRef], sink) -> None:
    """Writes one part of a listing's references to ``sink`` (a binary stream)."""
    if isinstance(refs, RefTable):
        batch = _table_batch(refs)
        meta = {"kind": "table", "root": refs.root, "split_names": list(refs.split_names),
                "vocabulary": list(refs.vocabulary)}
    else:
        batch = _list_batch(list(refs))
        meta = {"kind": "list"}
    header = json.dumps({"format": _PART_FORMAT, "version": _VERSION, "refs": meta}).encode("ascii")
    with pa.ipc.new_file(sink, batch.schema.with_metadata({_KEY: header})) as writer:
        writer.write_batch(batch)


def encode_listing(args: Sequence, listing: Listing, sink, parts: Sequence[tuple[str, int, str]]) -> None:
    """Writes the hand-off of ``listing`` (made with the listing arguments ``args``) to
    ``sink``, a binary stream: every field of the listing but its references, and
    the index of the parts that hold them (``(file name, references, SHA-256)``
    each, written with ``encode_part``; the hand-off's digest vouches for theirs).
    ``Listing.files`` is not written."""
    batch = pa.RecordBatch.from_arrays(
        [pa.array([name.encode("utf-8") for name, _, _ in parts], type=pa.large_binary()),
         pa.array([count for _, count, _ in parts], type=pa.int64()),
         pa.array([digest.encode("ascii") for _, _, digest in parts], type=pa.large_binary())],
        names=[name for name, _ in _INDEX_COLUMNS])
    refs = listing.refs
    meta = {"kind": "table" if isinstance(refs, RefTable) else "list",
            "bytes": int(refs.sizes.sum()) if isinstance(refs, RefTable) else sum(r.size for r in refs)}
    schema = batch.schema.with_metadata({_KEY: _header(args, listing, meta)})
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)


def check_digest(data, expected: str, where: str) -> None:
    """Raises ``HandoffError`` unless ``data`` has the SHA-256 (hex) ``expected``."""
    actual = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(actual, str(expected).lower()):
        raise HandoffError(
            f"the listing handed over in {where} is not the one the launcher wrote (its SHA-256 "
            f"is {actual[:16]}..., the job expects {str(expected)[:16]}...): it was changed in "
            "the output's temporary folder after the run started, so it was not read; check who "
            "else can write to the output")


def _strings(column: pa.Array) -> list[str]:
    return [value.decode("utf-8", _TEXT) for value in column.to_pylist()]


def _numbers(column: pa.Array, dtype) -> np.ndarray:
    if column.null_count:
        raise HandoffError("a numeric column holds nulls")
    return np.array(column.to_numpy(zero_copy_only=False), dtype=dtype)  # A copy of our own.


def _letters(items) -> list[DeadLetter]:
    return [DeadLetter(*(str(field) for field in item)) for item in items]


def _blob(column: pa.Array, what: str) -> tuple[bytes, np.ndarray]:
    """A ``large_binary`` column as a blob and its offsets (from 0), checked."""
    n = len(column)
    if column.null_count:
        raise HandoffError(f"a {what} is null")
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], np.int64, count=n + 1, offset=column.offset * 8).copy()
    if n and (np.any(np.diff(offsets) < 0) or offsets[0] < 0 or offsets[-1] > buffers[2].size):
        raise HandoffError(f"{what} offsets out of order")
    start = int(offsets[0]) if n else 0
    blob = buffers[2][start:int(offsets[-1])].to_pybytes() if n else b""
    return blob, offsets - start


def _table(batch: pa.RecordBatch, meta: dict) -> RefTable:
    n = batch.num_rows
    blob, offsets = _blob(batch.column("filename"), "file name")
    split_names, vocabulary = [str(s) for s in meta["split_names"]], [str(v) for v in meta["vocabulary"]]
    codes, labels = _numbers(batch.column("split"), np.int32), _numbers(batch.column("label"), np.int32)
    if n and (codes.min() < 0 or codes.max() >= len(split_names)
              or labels.min() < 0 or labels.max() >= len(vocabulary)):
        raise HandoffError("a split or label code is out of range")
    keys = np.stack([_numbers(batch.column("key_high"), np.uint64),
                     _numbers(batch.column("key_low"), np.uint64)], axis=1).reshape(-1, 2)
    return RefTable(str(meta["root"]), blob, offsets, _numbers(batch.column("size"), np.int64),
                    codes, split_names, labels, vocabulary, keys,
                    _numbers(batch.column("stamp"), np.int64), _numbers(batch.column("crc"), np.int64),
                    _blob(batch.column("annotation"), "annotation")
                    if batch.num_columns > len(_TABLE_COLUMNS) else None)


def _refs(batch: pa.RecordBatch) -> list[ImageRef]:
    columns = {name: batch.column(name) for name, _ in _LIST_COLUMNS}
    text = {name: _strings(columns[name]) for name in ("split", "key", "filename", "path", "label_text",
                                                        "extra")}
    sizes, labels = columns["size"].to_pylist(), columns["label"].to_pylist()
    generations, crcs = columns["generation"].to_pylist(), columns["crc"].to_pylist()
    annotations = [b""] * batch.num_rows
    if batch.num_columns > len(_LIST_COLUMNS):
        column = batch.column(_ANNOTATION_COLUMN[0])
        if column.null_count:
            raise HandoffError("an annotation is null")
        annotations = column.to_pylist()
    return [ImageRef(text["split"][i], text["key"][i], text["filename"][i], text["path"][i],
                     int(sizes[i]), int(labels[i]), text["label_text"][i],
                     tuple(tuple(e) for e in json.loads(text["extra"][i])) if text["extra"][i] else (),
                     int(generations[i]), int(crcs[i]), annotations[i])
            for i in range(batch.num_rows)]


def _one_batch(data, expected) -> tuple[dict, pa.RecordBatch]:
    reader = pa.ipc.open_file(pa.py_buffer(data))
    header = json.loads((reader.schema.metadata or {})[_KEY])
    if reader.num_record_batches != 1:
        raise HandoffError(f"{reader.num_record_batches} record batches, expected 1")
    batch = reader.get_batch(0)
    if expected is not None and [(f.name, f.type) for f in batch.schema] != list(expected):
        raise HandoffError("its columns are not a listing's")
    return header, batch


def _refused(err: Exception) -> HandoffError:
    return HandoffError(f"not a listing hand-off: {type(err).__name__}: "
                        f"{str(err).splitlines()[0][:200] if str(err) else ''}")


def decode_listing(data, args: Sequence) -> tuple[Listing, list[tuple[str, int, str]], int]:
    """The listing a hand-off holds, without its references; the index of its parts
    ``(file name, references, SHA-256)``; and the bytes of the images it lists
    (check the hand-off's digest first: ``check_digest``; each part's is checked
    when it is read: ``decode_part``).

    Raises:
      HandoffError: when ``data`` is not such a file, or was made for arguments
        other than ``args``.
    """
    try:
        header, batch = _one_batch(data, _INDEX_COLUMNS)
        if header.get("format") != _FORMAT or header.get("version") != _VERSION:
            raise HandoffError("not a listing hand-off of this version")
        if header["args"] != _plain(args):
            raise HandoffError("it holds the listing of other options than this step's")
        names, counts, digests = (batch.column(name).to_pylist() for name, _ in _INDEX_COLUMNS)
        parts = [(name.decode("utf-8"), int(count), digest.decode("ascii"))
                 for name, count, digest in zip(names, counts, digests)]
        if any("/" in name or not name.startswith("listing-") for name, _, _ in parts):
            raise HandoffError("a part's name is not a part's")
        listing = Listing(
            layout=str(header["layout"]), refs=[], vocabulary=[str(v) for v in header["vocabulary"]],
            ignored=int(header["ignored"]), dead_letters=_letters(header["dead_letters"]),
            extra_features={str(k): str(v) for k, v in header["extra_features"].items()},
            skipped=_letters(header["skipped"]), split_source=str(header["split_source"]),
            duplicates_dropped=[tuple(str(x) for x in d) for d in header["duplicates_dropped"]])
        return listing, parts, int(header["refs"]["bytes"])
    except HandoffError:
        raise
    except (pa.ArrowException, KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise _refused(err) from err


def decode_part(data, expected_sha256: str, where: str) -> list[ImageRef] | RefTable:
    """The references one part of a hand-off holds, its SHA-256 checked first.

    Raises:
      HandoffError: when its digest is not ``expected_sha256`` (from the hand-off's
        index), or it is not a part.
    """
    check_digest(data, expected_sha256, where)
    try:
        header, batch = _one_batch(data, None)
        if header.get("format") != _PART_FORMAT or header.get("version") != _VERSION:
            raise HandoffError("not a listing part of this version")
        meta = header["refs"]
        expected = {"table": [_TABLE_COLUMNS, _ANNOTATED_TABLE_COLUMNS],
                    "list": [_LIST_COLUMNS, _ANNOTATED_COLUMNS]}[meta["kind"]]
        if [(f.name, f.type) for f in batch.schema] not in [list(columns) for columns in expected]:
            raise HandoffError("its columns are not a listing's")
        return _table(batch, meta) if meta["kind"] == "table" else _refs(batch)
    except HandoffError as err:
        raise HandoffError(f"{where}: {err}") from err
    except (pa.ArrowException, KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise HandoffError(f"{where}: {_refused(err)}") from err
