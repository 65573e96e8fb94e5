"""``inspect``: look at a dataset: its summary, some records, a contact sheet.

The contact sheets, one per split, are drawn from the records themselves
(decoded from ``image/encoded``, captioned with ``image/class/label``,
``image/class/text`` and ``image/filename``), so they show what a reader of the
shards will get. A record's boxes and masks, if any, are drawn over its
thumbnail (``beam_pipeline.sheet_drawing``).

The dataset is read as every reader reads it (``beam_pipeline.verify``): a
malformed manifest, or one naming a path outside its folder, fails with one
line. Records are read one at a time, each at most ``max_record`` bytes
(default 256 MiB) and, in a plain shard, no more than the file holds: a length
field claiming more fails (``UnreadableShard``) before anything is allocated.
A sheet's file name is made from a split name only once it is proved to name a
file (``schemas.shards.is_valid_split_name``), so a manifest cannot steer it.
"""

from __future__ import annotations

import gzip
import io
import itertools
import math
import posixpath
import zlib

from PIL import Image, ImageDraw, UnidentifiedImageError

from beam_tfrecords.schemas.manifest import MANIFEST_NAME, manifest_shards, parse_manifest, shown_value
from beam_tfrecords.schemas.shards import is_valid_split_name
from beam_tfrecords.sheet_drawing import annotate_thumbnail
from beam_tfrecords.transforms.codec.example import example_to_dict
from beam_tfrecords.transforms.codec.tfrecord import RecordError, iter_records, stream_size
from beam_tfrecords.transforms.io import files
from beam_tfrecords.verify import dataset_path, manifest_text, part_manifest

__all__ = [
    "MAX_RECORD_BYTES",
    "UnreadableShard",
    "contact_sheet",
    "contact_sheets",
    "describe_record",
    "read_manifest",
    "sample_records",
    "thumbnail",
]

# The largest record inspect reads (a length field claiming more fails before any
# allocation): as large as a table row or an image file may be by default.
MAX_RECORD_BYTES = 256 << 20

_THUMB = 132
_LINE = 12
_CAPTION = 2 * _LINE + 4
_MAX_COLUMNS = 8
_CHARS = 21  # Caption characters that fit under a thumbnail.


class UnreadableShard(ValueError):
    """A shard whose records cannot be read: the message names the shard, and for
    a fault in its framing the record index and byte offset."""


def read_manifest(location: str) -> tuple[str, dict]:
    """``(path, manifest)`` of the dataset at ``location``, checked.

    Raises:
      ValueError: one line: no manifest, or one that is malformed or names a
        path outside its folder (its parts' folders and manifests included).
    """
    path = files.join(location, MANIFEST_NAME)
    text = manifest_text(path)
    if text is None:
        raise ValueError(f"{path} does not exist: not a finished dataset (verify --scan_only "
                         "CRC-scans its TFRecord files)")
    manifest = parse_manifest(text, path)
    for index, part in enumerate(manifest.get("parts", [])):
        part_manifest(location, path, index, part)  # Its folder and manifest stay inside.
    return path, manifest


def _records(path: str, count: int, max_record: int) -> list[bytes]:
    """The first ``count`` records of a shard, each read within the bounds."""
    try:
        with files.open_read(path) as raw:
            if path.endswith(".gz"):
                with gzip.GzipFile(fileobj=raw, mode="rb") as stream:
                    return list(itertools.islice(iter_records(stream, max_record=max_record), count))
            return list(itertools.islice(
                iter_records(raw, size=stream_size(raw), max_record=max_record), count))
    except RecordError as err:
        raise UnreadableShard(f"{path}: {err}") from None
    except (zlib.error, EOFError) as err:
        raise UnreadableShard(f"{path}: corrupt gzip stream: {err}") from None
    except OSError as err:
        raise UnreadableShard(f"{path}: cannot read: {err}") from None


def sample_records(location: str, per_split: int = 8,
                   max_record: int = MAX_RECORD_BYTES) -> list[tuple[str, dict]]:
    """The first ``per_split`` records of each split, parsed: ``[(split, features)]``.

    Raises:
      ValueError: when the manifest is missing, malformed or names a path outside
        its folder.
      UnreadableShard: when a shard's records cannot be read (a record claiming
        more than ``max_record`` bytes, or more than the file holds, included).
    """
    source, manifest = read_manifest(location)
    # The first run's shards, then each incremental part's (a split only a part holds too).
    shards: dict[str, list[str]] = {}
    for folder, path, held in [(location, source, manifest)] + _parts(location, source, manifest):
        for entry in manifest_shards(held):
            shards.setdefault(entry.split, []).append(dataset_path(folder, entry.path, entry.key, path))
    out = []
    for split, paths in shards.items():
        taken = 0
        for path in paths:
            if taken >= per_split:
                break
            for record in _records(path, per_split - taken, max_record):
                out.append((split, example_to_dict(record)))
                taken += 1
    return out


def _parts(location: str, source: str, manifest: dict) -> list[tuple[str, str, dict]]:
    """``(folder, manifest path, manifest)`` of each incremental part whose manifest
    is there (a missing one is ``verify``'s to report)."""
    found = []
    for index, part in enumerate(manifest.get("parts", [])):
        folder, path, text = part_manifest(location, source, index, part)
        if text is not None:
            found.append((folder, path, parse_manifest(text, path)))
    return found


def describe_record(features: dict) -> str:
    """One line per feature, with long byte strings cut short."""
    lines = []
    for name in sorted(features):
        values = features[name]
        shown = [
            (f"<{len(v)} bytes>" if len(v) > 64 else v.decode("utf-8", "replace"))
            if isinstance(v, bytes) else v
            for v in values
        ]
        lines.append(f"    {name}: {shown[0] if len(shown) == 1 else shown}")
    return "\n".join(lines)


def thumbnail(data: bytes) -> Image.Image:
    """An encoded image as an RGB thumbnail of at most 128x128 (16-bit: its top 8 bits)."""
    with Image.open(io.BytesIO(data)) as image:
        if image.mode.startswith("I;16") or image.mode == "I":  # 16-bit: show the top 8 bits.
            image = image.convert("I").point(lambda v: v / 256).convert("L")
        elif image.mode in ("P", "PA", "LA"):
            image = image.convert("RGBA")
        thumb = image.convert("RGB")
    thumb.thumbnail((_THUMB - 4, _THUMB - 4))
    return thumb


def _fit(text: str) -> str:
    return text if len(text) <= _CHARS else "..." + text[-(_CHARS - 3):]


def contact_sheet(records: list[tuple[str, dict]], out_path: str) -> int:
    """Draws the records' images in a grid sized to their number, each captioned
    with its label index and class, then its file name; returns how many."""
    columns = max(1, min(_MAX_COLUMNS, math.ceil(math.sqrt(len(records)))))
    rows = max(1, -(-len(records) // columns))
    sheet = Image.new("RGB", (columns * _THUMB, rows * (_THUMB + _CAPTION)), "white")
    draw = ImageDraw.Draw(sheet)
    drawn = 0
    for i, (_, features) in enumerate(records):
        x, y = (i % columns) * _THUMB, (i // columns) * (_THUMB + _CAPTION)
        try:
            thumb = annotate_thumbnail(thumbnail(features["image/encoded"][0]), features)
        except (UnidentifiedImageError, OSError, KeyError, IndexError, ValueError):
            draw.text((x + 4, y + 40), "unreadable", fill="red")
            continue
        sheet.paste(thumb, (x + (_THUMB - thumb.width) // 2, y + (_THUMB - thumb.height) // 2))
        label = (features.get("image/class/label") or [""])[0]  # Several labels: maybe none.
        text = (features.get("image/class/text") or [b""])[0].decode("utf-8", "replace")
        name = features.get("image/filename", [b""])[0].decode("utf-8", "replace")
        draw.text((x + 3, y + _THUMB), _fit(f"{label} {text}"), fill="black")
        draw.text((x + 3, y + _THUMB + _LINE), _fit(posixpath.basename(name) or name), fill="dimgray")
        drawn += 1
    out = io.BytesIO()
    fmt = Image.registered_extensions().get(posixpath.splitext(out_path)[1].lower(), "PNG")
    sheet.save(out, fmt if fmt in ("PNG", "JPEG", "WEBP", "BMP", "TIFF") else "PNG")
    files.write_bytes(out_path, out.getvalue())
    return drawn


def contact_sheets(records: list[tuple[str, dict]], out_path: str) -> list[tuple[str, str, int]]:
    """One contact sheet per split, ``OUT-<split>.png`` beside ``out_path``
    (``sheet.png`` -> ``sheet-train.png``, ...); returns ``(split, path, drawn)``.

    Raises:
      ValueError: for a split name that cannot name a file (``/../../x``), before
        any sheet is written.
    """
    stem, ext = posixpath.splitext(out_path)
    for split in sorted({split for split, _ in records}):
        if not is_valid_split_name(split):  # It would name another file: refuse it.
            raise ValueError(f"split name {shown_value(split)} cannot name a contact sheet file "
                             "(letters, digits, '_' and '.')")
    made = []
    for split, group in itertools.groupby(records, key=lambda r: r[0]):
        path = f"{stem}-{split}{ext or '.png'}"
        made.append((split, path, contact_sheet(list(group), path)))
    return made
