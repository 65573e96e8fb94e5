"""The listing the launcher hands to a listing step in another process, as data.

On a runner whose steps run elsewhere (Dataflow, the multi-process DirectRunner)
the launcher writes its listing to the run's temporary folder on the output, and
the listing step reads it there instead of listing again. That folder is storage
other people may be able to write to, so what is handed over is plain data,
never code: an Arrow IPC file (``HANDOFF_NAME``), read with nothing but Arrow's
and JSON's parsers.

- Its schema's metadata holds one JSON header under ``beam-tfrecords``: format
  and version, the listing's arguments, and every field of the ``Listing`` but
  the references (layout, vocabulary, dead letters, skipped paths, ...).
- Its one record batch holds the references: for a ``RefTable`` its columns as
  they are (``filename`` is the blob and offsets of relative paths, as one
  ``large_binary`` column, not copied), for a list of ``ImageRef`` one row each
  (strings as UTF-8 with ``surrogatepass``, so names that are not UTF-8 come back
  as they were; extra features as JSON).

The launcher puts the file's SHA-256 into the job graph (the listing step's
arguments), and the step checks it (``check_digest``) before it parses a byte: a
file changed or replaced after the launcher wrote it is refused, whatever it
holds. The hand-off of a 1M-image listing is ~70 MB (``benchmarks/bench_planning.py
--handoff`` measures writing and reading it against the pickle it replaced).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.plan.layouts import Listing
from beam_tfrecords.transforms.plan.ref_table import RefTable

__all__ = ["HANDOFF_NAME", "HandoffError", "check_digest", "decode_listing", "encode_listing"]

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


class HandoffError(ValueError):
    """A listing hand-off that is not the one the launcher wrote, or not one at all."""


def _plain(args: Sequence) -> list:
    """The listing's arguments as JSON gives them back (tuples become lists)."""
    return json.loads(json.dumps(list(args)))


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


def _table_batch(table: RefTable) -> pa.RecordBatch:
    n = len(table)
    offsets = np.ascontiguousarray(table.offsets, dtype=np.int64)
    names = pa.Array.from_buffers(pa.large_binary(), n,
                                  [None, pa.py_buffer(offsets), pa.py_buffer(table.blob)])
    keys = table.keys.reshape(-1, 2)
    columns = [names, _array(table.sizes, pa.int64()), _array(table.split_codes, pa.int32()),
               _array(table.labels, pa.int32()), _array(keys[:, 0], pa.uint64()),
               _array(keys[:, 1], pa.uint64()), _array(table.stamps, pa.int64()),
               _array(table.crcs, pa.int64())]
    return pa.RecordBatch.from_arrays(columns, names=[name for name, _ in _TABLE_COLUMNS])


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
    return pa.RecordBatch.from_arrays(columns, names=[name for name, _ in _LIST_COLUMNS])


def encode_listing(args: Sequence, listing: Listing, sink) -> None:
    """Writes ``listing`` (made with the listing arguments ``args``) to ``sink``, a
    binary stream, as the hand-off file (``Listing.files`` is not written)."""
    refs = listing.refs
    if isinstance(refs, RefTable):
        batch = _table_batch(refs)
        meta = {"kind": "table", "root": refs.root, "split_names": list(refs.split_names),
                "vocabulary": list(refs.vocabulary)}
    else:
        batch = _list_batch(list(refs))
        meta = {"kind": "list"}
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


def _table(batch: pa.RecordBatch, meta: dict) -> RefTable:
    n = batch.num_rows
    names = batch.column("filename")
    if names.null_count:
        raise HandoffError("a file name is null")
    buffers = names.buffers()
    offsets = np.frombuffer(buffers[1], np.int64, count=n + 1, offset=names.offset * 8).copy()
    if n and (np.any(np.diff(offsets) < 0) or offsets[0] < 0 or offsets[-1] > buffers[2].size):
        raise HandoffError("file name offsets out of order")
    start = int(offsets[0]) if n else 0
    blob = buffers[2][start:int(offsets[-1])].to_pybytes() if n else b""
    offsets -= start
    split_names, vocabulary = [str(s) for s in meta["split_names"]], [str(v) for v in meta["vocabulary"]]
    codes, labels = _numbers(batch.column("split"), np.int32), _numbers(batch.column("label"), np.int32)
    if n and (codes.min() < 0 or codes.max() >= len(split_names)
              or labels.min() < 0 or labels.max() >= len(vocabulary)):
        raise HandoffError("a split or label code is out of range")
    keys = np.stack([_numbers(batch.column("key_high"), np.uint64),
                     _numbers(batch.column("key_low"), np.uint64)], axis=1).reshape(-1, 2)
    return RefTable(str(meta["root"]), blob, offsets, _numbers(batch.column("size"), np.int64),
                    codes, split_names, labels, vocabulary, keys,
                    _numbers(batch.column("stamp"), np.int64), _numbers(batch.column("crc"), np.int64))


def _refs(batch: pa.RecordBatch) -> list[ImageRef]:
    columns = {name: batch.column(name) for name, _ in _LIST_COLUMNS}
    text = {name: _strings(columns[name]) for name in ("split", "key", "filename", "path", "label_text",
                                                        "extra")}
    sizes, labels = columns["size"].to_pylist(), columns["label"].to_pylist()
    generations, crcs = columns["generation"].to_pylist(), columns["crc"].to_pylist()
    return [ImageRef(text["split"][i], text["key"][i], text["filename"][i], text["path"][i],
                     int(sizes[i]), int(labels[i]), text["label_text"][i],
                     tuple(tuple(e) for e in json.loads(text["extra"][i])) if text["extra"][i] else (),
                     int(generations[i]), int(crcs[i]))
            for i in range(batch.num_rows)]


def decode_listing(data, args: Sequence) -> Listing:
    """The listing a hand-off file holds (check its digest first: ``check_digest``).

    Raises:
      HandoffError: when ``data`` is not such a file, or was made for arguments
        other than ``args``.
    """
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        header = json.loads((reader.schema.metadata or {})[_KEY])
        if header.get("format") != _FORMAT or header.get("version") != _VERSION:
            raise HandoffError("not a listing hand-off of this version")
        if header["args"] != _plain(args):
            raise HandoffError("it holds the listing of other options than this step's")
        meta = header["refs"]
        expected = {"table": _TABLE_COLUMNS, "list": _LIST_COLUMNS}[meta["kind"]]
        if reader.num_record_batches != 1:
            raise HandoffError(f"{reader.num_record_batches} record batches, expected 1")
        batch = reader.get_batch(0)
        if [(f.name, f.type) for f in batch.schema] != list(expected):
            raise HandoffError("its columns are not a listing's")
        refs = _table(batch, meta) if meta["kind"] == "table" else _refs(batch)
        return Listing(
            layout=str(header["layout"]), refs=refs, vocabulary=[str(v) for v in header["vocabulary"]],
            ignored=int(header["ignored"]), dead_letters=_letters(header["dead_letters"]),
            extra_features={str(k): str(v) for k, v in header["extra_features"].items()},
            skipped=_letters(header["skipped"]), split_source=str(header["split_source"]),
            duplicates_dropped=[tuple(str(x) for x in d) for d in header["duplicates_dropped"]])
    except HandoffError:
        raise
    except (pa.ArrowException, KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        raise HandoffError(f"not a listing hand-off: {type(err).__name__}: "
                           f"{str(err).splitlines()[0][:200] if str(err) else ''}") from err
