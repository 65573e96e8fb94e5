"""Columns of table cells to feature entries, and entries to framed records, without a
Python loop per cell.

A record is a TFRecord frame around an Example, and an Example is its feature
entries in name order behind a tag and a length (see ``codec.example``). Every
byte of that but the frame's data CRC is built here for a whole column at once:

* the varints of a column of numbers are an ``(n, width)`` byte matrix with a mask
  of the bytes each row uses; the fixed bytes around them (tags, the entry's key)
  are matrices too, and the matrices side by side, masked, are the rows' bytes in
  row order (``_pack``);
* payloads of any length (strings, packed lists) stay Arrow binary arrays, and a
  row's entry is its head and payload joined by Arrow's ``binary_join_element_wise``;
  an Example is its entries joined the same way;
* the frame's length CRC is a table-driven CRC-32C over the 8 length bytes of all
  records at once; the data CRC is one ``google_crc32c`` call per record.

Cells are parsed by Arrow only where that gives what ``table_rows``'s per-cell
parser gives: a cell in a narrower form (plain ASCII digits, signs, ASCII
spaces) than the parser takes. Every other cell is marked for the per-cell path,
which encodes it, or names the row's error, exactly as before.
"""

from __future__ import annotations

import re

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from beam_tfrecords.schemas.table_schema import FALSE_WORDS, FLOAT32_MAX, TRUE_WORDS, ColumnSpec
from beam_tfrecords.transforms.codec.example import entry_prefix

__all__ = ["blob", "column_entries", "frame_examples", "vectorized"]

_BINARY = pa.large_binary()
_NOTHING = pa.scalar(b"", type=_BINARY)
_U64 = np.uint64
# Spaces Arrow trims here; Python's str.strip() trims these and more (a cell with
# other spaces goes to the per-cell path, which trims as Python does).
_SPACES = " \t\n\r\x0b\x0c"
_DIGITS = r"-?[0-9]{1,18}"  # Fits int64 whatever its digits; Arrow's cast would also take hex.
_DECIMAL = r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"  # No nan/inf words.
_TAGS = {"string": b"\x0a", "float": b"\x12", "int64": b"\x1a", "bool": b"\x1a"}


def vectorized(spec: ColumnSpec) -> bool:
    """Whether ``column_entries`` encodes this column: one-value string, int64, float and
    bool columns, and int64 and float lists, without a shape."""
    if spec.shape is not None or spec.encoding != "flat":
        return False
    return spec.type in ("int64", "float") if spec.is_list else spec.type in _TAGS


# --- bytes of a column, as masked matrices ------------------------------------------


class _Varints:
    """Each value's protobuf varint: ``matrix`` row ``i`` holds value ``i``'s bytes,
    left-aligned; ``mask`` (``None`` when every row uses every column) marks them."""

    def __init__(self, values: np.ndarray):
        v = values.view(_U64) if values.dtype == np.int64 else values.astype(_U64, copy=False)
        n = len(v)
        width = max(1, (int(v.max()).bit_length() + 6) // 7) if n else 1
        self.matrix = np.empty((n, width), dtype=np.uint8)
        self.mask = None if width == 1 else np.empty((n, width), dtype=bool)
        for b in range(width):
            part = v >> _U64(7 * b) if b else v
            more = part >= _U64(0x80)
            self.matrix[:, b] = (part & _U64(0x7F)).astype(np.uint8) | (more.view(np.uint8) << 7)
            if self.mask is not None:
                self.mask[:, b] = part != 0 if b else True
        self.widths = (np.ones(n, dtype=np.int64) if self.mask is None
                       else self.mask.sum(axis=1, dtype=np.int64))

    def packed(self) -> np.ndarray:
        """All the varints, end to end."""
        return self.matrix.ravel() if self.mask is None else self.matrix[self.mask]


def _binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A large_binary array over ``data`` (uint8) cut at ``offsets`` (int64), no copy."""
    return pa.LargeBinaryArray.from_buffers(
        _BINARY, len(offsets) - 1,
        [None, pa.py_buffer(np.ascontiguousarray(offsets, dtype=np.int64)),
         pa.py_buffer(np.ascontiguousarray(data, dtype=np.uint8))])


def _pack(parts: list, n: int) -> pa.Array:
    """Per row, its bytes of every part in order, as a large_binary array.

    A part is ``bytes`` (the same in every row), a ``_Varints``, or an ``(n, w)``
    uint8 matrix (``w`` bytes in every row).
    """
    matrices, masks = [], []
    for part in parts:
        if isinstance(part, bytes):
            matrices.append(np.broadcast_to(np.frombuffer(part, dtype=np.uint8), (n, len(part))))
            masks.append(None)
        elif isinstance(part, _Varints):
            matrices.append(part.matrix)
            masks.append(part.mask)
        else:
            matrices.append(part)
            masks.append(None)
    matrix = np.concatenate(matrices, axis=1)
    width = matrix.shape[1]
    if all(m is None for m in masks):
        return _binary(np.arange(n + 1, dtype=np.int64) * width, matrix.ravel())
    mask = np.concatenate([np.ones(m.shape, dtype=bool) if k is None else k
                           for m, k in zip(matrices, masks)], axis=1)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(mask.sum(axis=1, dtype=np.int64), out=offsets[1:])
    return _binary(offsets, matrix[mask])


def _entry_head(name: str, tag: bytes, list_sizes: np.ndarray) -> list:
    """The parts of each row's entry before its list's content (``list_sizes`` bytes):
    entry tag and length, key, feature length, list tag and length."""
    list_head = _Varints(list_sizes)
    feature = 1 + list_head.widths + list_sizes
    feature_head = _Varints(feature)
    prefix = entry_prefix(name)
    entry = _Varints(len(prefix) + feature_head.widths + feature)
    return [b"\x0a", entry, prefix, feature_head, tag, list_head]


def _lengths(array: pa.Array) -> np.ndarray:
    return pc.binary_length(array).to_numpy(zero_copy_only=False).astype(np.int64)


def _join(*arrays) -> pa.Array:
    return pc.binary_join_element_wise(*arrays, _NOTHING)


# --- one column ---------------------------------------------------------------------


def _trimmed(cells: pa.Array) -> pa.Array:
    return pc.utf8_trim(cells, characters=_SPACES)


def _whole(text: pa.Array, pattern: str) -> np.ndarray:
    return pc.match_substring_regex(text, f"^(?:{pattern})$").to_numpy(zero_copy_only=False)


def _string_entries(name: str, cells: pa.Array) -> pa.Array:
    values = cells.cast(_BINARY)
    sizes = _lengths(values)
    value_head = _Varints(sizes)
    head = _pack([*_entry_head(name, b"\x0a", 1 + value_head.widths + sizes), b"\x0a", value_head],
                 len(sizes))
    return _join(head, values)


def _int_entries(name: str, values: np.ndarray) -> pa.Array:
    varints = _Varints(values)
    sizes = varints.widths  # 1 to 10: one byte each.
    return _pack([*_entry_head(name, b"\x1a", 2 + sizes), b"\x0a",
                  sizes.astype(np.uint8).reshape(-1, 1), varints], len(values))


def _float32_bytes(values: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # Values not finite in float32 are left to the per-cell path.
        return values.astype("<f4").view(np.uint8)


def _float_entries(name: str, values: np.ndarray) -> pa.Array:
    n = len(values)
    head = _pack([*_entry_head(name, b"\x12", np.full(1, 6, dtype=np.int64)), b"\x0a\x04"], 1)
    return _pack([head[0].as_py(), _float32_bytes(values).reshape(n, 4)], n)  # The same head in every row.


def _list_entries(name: str, kind: str, counts: np.ndarray, values: np.ndarray) -> pa.Array:
    """Entries of lists of at least one value each (``counts``), ``values`` end to end."""
    if kind == "int64":
        varints = _Varints(values)
        data, widths = varints.packed(), varints.widths
    else:
        data, widths = _float32_bytes(values), np.full(len(values), 4, dtype=np.int64)
    ends = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(widths, out=ends[1:])
    starts = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    bounds = ends[starts]
    sizes = np.diff(bounds)
    size_head = _Varints(sizes)
    head = _pack([*_entry_head(name, _TAGS[kind], 1 + size_head.widths + sizes), b"\x0a", size_head],
                 len(counts))
    return _join(head, _binary(bounds, data))


def _values(kind: str, text: pa.Array) -> np.ndarray:
    """The numbers of cells that match ``_number`` (spaces around them are trimmed
    only when the cast finds some)."""
    kind = pa.int64() if kind == "int64" else pa.float64()
    try:
        return pc.cast(text, kind).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return pc.cast(_trimmed(text), kind).to_numpy(zero_copy_only=False)


def _number(kind: str, delimiter: str = "") -> str:
    """A pattern of one number, with spaces around it (not those of ``delimiter``)."""
    spaces = "".join(c for c in _SPACES if c not in delimiter)
    pad = f"[{re.escape(spaces)}]*" if spaces else ""
    return f"{pad}(?:{_DIGITS if kind == 'int64' else _DECIMAL}){pad}"


def _not_finite_float32(values: np.ndarray) -> np.ndarray:
    """Values with no finite float32: NaN, infinities (``1e400`` reads as one) and finite
    values outside the float32 range. The per-cell path refuses them, or encodes the
    non-finite ones a column allows."""
    with np.errstate(invalid="ignore"):
        return ~np.isfinite(values) | (np.abs(values) > FLOAT32_MAX)


def column_entries(spec: ColumnSpec, cells: pa.Array, empty_entry: bytes | None
                   ) -> tuple[pa.Array, np.ndarray]:
    """Each row's serialized feature entry, for a column ``vectorized`` accepts.

    A column whose first rows hold few distinct cells (flags, categories, small
    counts) is encoded a distinct cell at a time (``dictionary_encode``), then taken
    per row.

    Args:
      spec: the column.
      cells: its cells, a string array without nulls.
      empty_entry: the entry of an empty cell (its default, or no value), or ``None``
        when an empty cell is an error (a required column).

    Returns:
      The entries (a large_binary array), and per row whether its cell is left to
      the per-cell path (its entry here is a placeholder).
    """
    if len(cells) > _SAMPLE and pc.count_distinct(cells.slice(0, _SAMPLE)).as_py() <= _FEW:
        encoded = pc.dictionary_encode(cells)
        if len(encoded.dictionary) <= len(cells) // 4:
            entries, rest = _column_entries(spec, encoded.dictionary, empty_entry)
            return entries.take(encoded.indices), rest[encoded.indices.to_numpy(zero_copy_only=False)]
    return _column_entries(spec, cells, empty_entry)


_SAMPLE, _FEW = 1024, 64


def _column_entries(spec: ColumnSpec, cells: pa.Array, empty_entry: bytes | None
                    ) -> tuple[pa.Array, np.ndarray]:
    n = len(cells)
    name, kind = spec.feature_name, spec.type
    if kind == "string":
        empty = pc.equal(cells, "").to_numpy(zero_copy_only=False)
        entries, rest = _string_entries(name, cells), np.zeros(n, dtype=bool)
    elif spec.is_list:
        entries, rest, empty = _list_column(spec, cells)
    elif kind == "bool":
        text = _trimmed(cells)
        empty = pc.equal(text, "").to_numpy(zero_copy_only=False)
        lower = pc.ascii_lower(text)
        true = pc.is_in(lower, value_set=pa.array(sorted(TRUE_WORDS))).to_numpy(zero_copy_only=False)
        false = pc.is_in(lower, value_set=pa.array(sorted(FALSE_WORDS))).to_numpy(zero_copy_only=False)
        entries, rest = _int_entries(name, true.astype(np.int64)), ~(true | false | empty)
    else:
        # A cell of spaces only is empty too, which the per-cell path finds.
        empty = _lengths(cells) == 0
        good = _whole(cells, _number(kind))
        values = _values(kind, pc.if_else(pa.array(good), cells, "0"))
        if kind == "int64":
            entries = _int_entries(name, values)
        else:
            good &= ~_not_finite_float32(values)
            entries = _float_entries(name, values)
        rest = ~(good | empty)
    if empty.any():
        if empty_entry is None:
            rest |= empty
        else:
            entries = pc.if_else(pa.array(empty), pa.scalar(empty_entry, type=_BINARY), entries)
    return entries, rest


def _list_column(spec: ColumnSpec, cells: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """``(entries, per-cell rows, empty rows)`` of an int64 or float list column."""
    delimiter = spec.delimiter
    empty = _lengths(cells) == 0  # A cell of spaces only is left to the per-cell path.
    # Spaces around a value, unless the delimiter is one of them (then a cell split on it
    # must not hold empty pieces: the per-cell path names those errors).
    value = _number(spec.type, delimiter)
    good = _whole(cells, f"{value}(?:{re.escape(delimiter)}{value})*")
    lists = pc.split_pattern(pc.if_else(pa.array(good), cells, "0"), pattern=delimiter)
    values = _values(spec.type, pc.list_flatten(lists))
    counts = pc.list_value_length(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    if spec.type == "float":
        bad = _not_finite_float32(values)
        if bad.any():
            rows = np.repeat(np.arange(len(counts)), counts)
            good[rows[bad]] = False
    return _list_entries(spec.feature_name, spec.type, counts, values), ~(good | empty), empty


# --- records ------------------------------------------------------------------------


def _crc_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc_table()
_MASK_DELTA = np.uint32(0xA282EAD8)


def _masked_crc32c_of_u64(values: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC-32C of each value's 8 little-endian bytes."""
    octets = values.astype("<u8").view(np.uint8).reshape(-1, 8)
    crc = np.full(len(values), 0xFFFFFFFF, dtype=np.uint32)
    for k in range(8):
        crc = _CRC_TABLE[(crc ^ octets[:, k]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return _mask(crc ^ np.uint32(0xFFFFFFFF))


def _mask(crc: np.ndarray) -> np.ndarray:
    """``tfrecord.mask_crc`` of each value."""
    return ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + _MASK_DELTA  # Wraps mod 2**32.


def frame_examples(entries: list[pa.Array], rows: int) -> pa.Array:
    """Framed records, one a row, of the Examples holding each row's entries.

    Args:
      entries: per feature in name order, each row's serialized entry; the list is
        emptied once they are joined (so a long row's entries go before its record
        is built).
      rows: the number of rows (every array has this length).

    Returns:
      A large_binary array of framed TFRecord records.
    """
    body = _summed_lengths(entries, rows)
    body_head = _Varints(body)
    examples = _join(_pack([b"\x0a", body_head], rows), *entries)
    entries.clear()
    sizes = 1 + body_head.widths + body
    starts = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    data_crc = _data_crcs(examples, starts)
    head = np.empty((rows, 12), dtype=np.uint8)
    head[:, :8] = sizes.astype("<u8").view(np.uint8).reshape(rows, 8)
    head[:, 8:] = _masked_crc32c_of_u64(sizes).astype("<u4").view(np.uint8).reshape(rows, 4)
    tail = _mask(data_crc).astype("<u4").view(np.uint8).reshape(rows, 4)
    records = _join(_pack([head], rows), examples, _pack([tail], rows))
    if starts[-1] > _VIEW_BYTES:  # A long row's Examples: their memory back to the system now
        del examples  # (Arrow's pool would keep it beside the records).
        pa.default_memory_pool().release_unused()
    return records


def _summed_lengths(arrays: list[pa.Array], rows: int) -> np.ndarray:
    """Per row, the lengths of its values in every array, summed."""
    total = np.zeros(rows, dtype=np.int64)
    for array in arrays:
        total += _lengths(array)
    return total


def _data_view(array: pa.Array) -> pa.Buffer:
    """The values of a large_binary array end to end, in place."""
    offsets = np.frombuffer(array.buffers()[1], dtype=np.int64, count=len(array) + 1, offset=array.offset * 8)
    data = array.buffers()[2]
    if data is None:
        return pa.py_buffer(b"")
    return data.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))


def _data_crcs(array: pa.Array, starts: np.ndarray) -> np.ndarray:
    """The CRC-32C of each value of a large_binary array (value ``i`` is bytes
    ``starts[i]:starts[i + 1]`` of its data), copying out at most ``_VIEW_BYTES`` of
    whole values at a time, or a value over that ``_CRC_PIECE`` at a time."""
    rows = len(starts) - 1
    view = _data_view(array)
    crcs = np.empty(rows, dtype=np.uint32)
    crc = google_crc32c.value
    row = 0
    while row < rows:
        stop = max(row + 1, int(np.searchsorted(starts, starts[row] + _VIEW_BYTES, side="right")) - 1)
        base, end = int(starts[row]), int(starts[stop])
        if end - base > _VIEW_BYTES:  # One long value.
            value = 0
            for at in range(base, end, _CRC_PIECE):
                value = google_crc32c.extend(value, view.slice(at, min(_CRC_PIECE, end - at)).to_pybytes())
            crcs[row] = value
        else:
            data = view.slice(base, end - base).to_pybytes()
            local = (starts[row:stop + 1] - base).tolist()
            crcs[row:stop] = np.fromiter(map(crc, map(data.__getitem__, map(slice, local[:-1], local[1:]))),
                                         dtype=np.uint32, count=stop - row)
        row = stop
    return crcs


_VIEW_BYTES = 16 << 20
_CRC_PIECE = 1 << 20


def blob(records: pa.Array) -> tuple[bytes | pa.Buffer, np.ndarray]:
    """The records end to end (over ``_VIEW_BYTES``, a long row's, left in place as an
    Arrow buffer instead of copied), and each one's size."""
    view = _data_view(records)
    return (view if view.size > _VIEW_BYTES else view.to_pybytes()), _lengths(records)

