"""The image record builder: every image record the product writes is made here.

One path, whatever the input (a local or ``gs://`` folder of class folders, CIFAR,
a CSV manifest, a listing made on the workers, a ``--size``/readable conversion,
``ImagesToExamples``): ``ImageRecordBuilder`` reads an image's bytes (bounded,
``io.bounded_read``), inspects them (``codec.image_inspection.inspect_image``), makes them
readable or reshapes them (``codec.readable``, ``codec.reshape``), applies the
geometry an attachment asks for, and encodes the features
(``codec.image_example``). Beam-free: the shard writers' helper processes run it.

Attachments, the extension point. A builder may be given ``attach``: a
picklable callable ``attach(ref) -> Attachment | None`` called once per image
with its ``ImageRef`` (``filename``, ``split``, ``label`` say which image it is;
side data is looked up by them). An ``Attachment`` may:

* add features: ``features``, ``((name, dtype, value), ...)`` with dtype
  ``int64``, ``float32`` or ``string`` (one value each, as ``ImageRef.extra``,
  or a tuple of values: a list feature, possibly empty);
* give the image several labels: ``labels``, ``((id, name), ...)``, written as
  the lists ``image/class/label`` and ``image/class/text`` in place of the
  listing's one label (with ``several_labels``, even when empty: an image of a
  several-labels run without any holds the two keys as empty lists). A reference whose ``label`` is -1 (an annotated layout's
  detection image) and that gets no ``labels`` has neither key: its classes are
  per object;
* ask for a geometry change of the pixels, applied after any reshape: ``turns``
  quarter turns clockwise, then ``flip`` (mirrored left to right). The image is
  then decoded and written again (PNG stays PNG, JPEG stays JPEG at the
  reshape's ``--jpeg_quality``, others become PNG). With ``displayed`` (the turns
  and flip show the picture as displayed: its EXIF orientation) and a reshape,
  they are applied BEFORE it instead, in the same decode (one encode): the
  reshape works on the displayed picture, so ``--size W x H`` gives a stored
  ``W x H`` image (``Geometry.first_turns``, ``first_flip``); without it
  ``--size`` applies to the stored pixels, before the turns (an odd turn then
  swaps its sides);
* follow the pixels: ``follow(geometry) -> features``, called with the
  ``Geometry`` applied (scale, crop, pad from a reshape; the turns and flip
  asked), so that side data in source coordinates (points, boxes) is stored in
  the output's (``Geometry.map_point``, ``map_pixel``, ``map_box``). ``follow``
  may return a ``Followed`` instead: the features and an ``AttachReport``
  (counts by reason, problems) that the outcome carries (``ImageOutcome.report``);
* decide once the source is known: ``resolve(source) -> Attachment``, called
  with the ``SourceImage`` (its stored size and EXIF orientation, read only for
  such an attachment) before any pixel moves; what it returns is applied in
  its place (its own ``resolve`` is not called).

An attachment (``attach``, ``resolve`` or ``follow``) refuses an image by raising
``AttachmentRefused(reason, message)``: the image becomes a dead letter (stage
``validate``, error ``reason``).

Reserved feature keys, which an attachment may not add (the image becomes a dead
letter, ``encode_error``, naming the key): the nine every image record holds,
``RESERVED_FEATURES``, and the listing's own extra features (a CSV manifest's
columns). The geometry applied is reported to ``follow`` and in the outcome
(``ImageOutcome.geometry``, for every image that had an attachment; ``None``
for the others). An image with no attachment is encoded exactly as before
attachments existed (the same bytes, by the same code); one whose pixels an
attachment moved has the manifest note ``attached/moved`` unless a conversion
or reshape already gave it one. Shards are cut before images are read, from
file sizes (``estimated_record_size``): an attachment's features and re-encoded
pixels are not in that estimate, so a shard may end a little off its band (the
manifest names such shards, ``shards_outside_band``). ``attach`` runs wherever
images are encoded (helper processes, Dataflow workers): it must pickle, and
give the same answer for the same image.

Bad images never raise: each becomes a ``DeadLetter`` naming it by
``ref.filename`` (stage ``read``, ``validate`` or ``encode``). A storage failure
(GCS answering 429/5xx past its retries) is raised: it fails the shard's
attempt, and is never taken for a bad image.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from beam_tfrecords.schemas.config import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, ImageReshape
from beam_tfrecords.schemas.elements import DeadLetter, ImageRef
from beam_tfrecords.transforms.codec.image_example import image_example_parts, image_example_size
from beam_tfrecords.transforms.codec.image_inspection import (
    ImageError,
    ImageInfo,
    decode_first_frame,
    inspect_image,
    quiet_message,
)
from beam_tfrecords.transforms.codec.orientation import exif_orientation
from beam_tfrecords.transforms.codec.readable import readable_image
from beam_tfrecords.transforms.codec.reshape import reshape_decodes, reshape_image, target_size, transposed
from beam_tfrecords.transforms.codec.tfrecord import RECORD_OVERHEAD, frame_parts
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input

__all__ = [
    "RESERVED_FEATURES",
    "SourceImage",
    "AttachReport",
    "Attachment",
    "AttachmentRefused",
    "EncodedChunk",
    "Followed",
    "Geometry",
    "ImageOutcome",
    "ImageRecordBuilder",
    "estimated_record_size",
    "read_failure",
    "record_overheads",
    "reshape_geometry",
]

Feature = tuple[str, str, object]
RESERVED_FEATURES = frozenset({
    "image/encoded", "image/format", "image/height", "image/width", "image/channels",
    "image/class/label", "image/class/text", "image/filename", "image/key/sha256",
})
# Dimensions assumed when sizing a record before its header is read: they change
# the estimate by a few bytes per record.
_TYPICAL_SIDE = 1024
_TYPICAL_CHANNELS = 3
# Length varints that grow with the file size and name: 4 entries, 4 extra bytes each at most.
_VARINT_SLACK = 16


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How an image's pixels were moved, source to output, in this order: turned
    and flipped first (an EXIF orientation shown as displayed, before a reshape),
    scaled, cropped or padded (a reshape), turned, flipped.

    Coordinates are continuous, in pixels, from the top-left corner: pixel
    ``(col, row)`` covers ``[col, col + 1) x [row, row + 1)``.

    Attributes:
      source: the source image's ``(width, height)``.
      output: the stored image's ``(width, height)``.
      scale: ``(x, y)`` factors of the resize (``(1.0, 1.0)``: none).
      crop: ``(left, top)`` cut off the scaled image (``--fit crop``).
      pad: ``(left, top)`` of black added before the scaled image (``--fit pad``).
      turns: quarter turns clockwise (0-3) after the reshape.
      flip: mirrored left to right, last.
      first_turns: quarter turns clockwise (0-3) of the source, before the reshape
        (the scale, crop and pad are then in the turned picture's frame).
      first_flip: mirrored left to right after ``first_turns``, before the reshape.
    """

    source: tuple[int, int]
    output: tuple[int, int]
    scale: tuple[float, float] = (1.0, 1.0)
    crop: tuple[int, int] = (0, 0)
    pad: tuple[int, int] = (0, 0)
    turns: int = 0
    flip: bool = False
    first_turns: int = 0
    first_flip: bool = False

    @property
    def moved(self) -> bool:
        """Whether any pixel is elsewhere than in the source."""
        return (self.scale != (1.0, 1.0) or self.crop != (0, 0) or self.pad != (0, 0)
                or self.turns % 4 != 0 or self.flip or self.first_turns % 4 != 0 or self.first_flip)

    def map_point(self, x: float, y: float) -> tuple[float, float]:
        """A point of the source, in the output's coordinates (may fall outside it:
        a point cropped away)."""
        x, y = _turned_point(x, y, self.source, self.first_turns, self.first_flip)
        x = x * self.scale[0] - self.crop[0] + self.pad[0]
        y = y * self.scale[1] - self.crop[1] + self.pad[1]
        return _turned_point(x, y, self.output if self.turns % 2 == 0 else self.output[::-1],
                             self.turns, self.flip)

    def map_pixel(self, col: int, row: int) -> tuple[float, float]:
        """The output position of a source pixel's centre, as a pixel index (whole
        numbers when only turned or flipped: a flip maps ``col`` to ``width - 1 - col``)."""
        x, y = self.map_point(col + 0.5, row + 0.5)
        return x - 0.5, y - 0.5

    def map_box(self, box: Sequence[float]) -> tuple[float, float, float, float]:
        """A box ``(x_min, y_min, x_max, y_max)`` of the source, in the output's
        coordinates (still min before max: a turn or flip swaps corners)."""
        (x0, y0), (x1, y1) = self.map_point(box[0], box[1]), self.map_point(box[2], box[3])
        return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


def _turned_point(x, y, size: tuple[int, int], turns: int, flip: bool):
    """A point of a ``size`` frame, turned ``turns`` quarter turns clockwise, then
    mirrored left to right when ``flip`` (numbers or numpy arrays)."""
    width, height = size
    for _ in range(turns % 4):  # One clockwise turn: (x, y) -> (height - y, x).
        x, y, width, height = height - y, x, height, width
    if flip:
        x = width - x
    return x, y


def reshape_geometry(width: int, height: int, spec: ImageReshape | None, turns: int = 0,
                     flip: bool = False) -> Geometry:
    """The geometry ``codec.reshape.reshape_image`` applies to an image of that size
    (turned ``turns`` and flipped first, when given: ``first_turns``, ``first_flip``)."""
    if turns % 4 or flip:
        shown = (height, width) if turns % 2 else (width, height)
        return dataclasses.replace(reshape_geometry(shown[0], shown[1], spec), source=(width, height),
                                   first_turns=turns % 4, first_flip=flip)
    if spec is None or not spec.active:
        return Geometry((width, height), (width, height))
    size = target_size(width, height, spec)
    if size == (width, height):
        return Geometry((width, height), size)
    if not spec.size or spec.fit == "stretch":
        return Geometry((width, height), size, (size[0] / width, size[1] / height))
    scale = (max if spec.fit == "crop" else min)(size[0] / width, size[1] / height)
    scaled = (max(1, round(width * scale)), max(1, round(height * scale)))
    factors = (scaled[0] / width, scaled[1] / height)
    if spec.fit == "crop":
        return Geometry((width, height), size, factors,
                        crop=((scaled[0] - size[0]) // 2, (scaled[1] - size[1]) // 2))
    return Geometry((width, height), size, factors,
                    pad=((size[0] - scaled[0]) // 2, (size[1] - scaled[1]) // 2))


@dataclasses.dataclass(frozen=True)
class SourceImage:
    """What an attachment's ``resolve`` is told of the source image.

    Attributes:
      width, height: as stored in the file (before any EXIF orientation).
      orientation: the EXIF orientation tag (1-8; 1 when absent or unusable).
    """

    width: int
    height: int
    orientation: int = 1


@dataclasses.dataclass(frozen=True)
class AttachReport:
    """What an attachment tells the run about one image besides its features.

    Attributes:
      counts: ``((reason, n), ...)``: things counted (boxes clipped, ...).
      problems: side data not taken as given, the image kept (objects dropped):
        ``schemas.annotations.AnnotationProblem`` for annotations.
      objects: per object written, ``(class id, box area in output pixels)``
        (the run's annotation statistics, ``quality.annotation_stats``).
      labels: the class names written as several labels (``image/class/text``):
        the run counts records per class by them (``labels.counts``).
    """

    counts: tuple[tuple[str, int], ...] = ()
    problems: tuple = ()
    objects: tuple[tuple[int, float], ...] = ()
    labels: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Followed:
    """What a ``follow`` may return: its features and a report."""

    features: tuple[Feature, ...]
    report: AttachReport


class AttachmentRefused(Exception):
    """Raised by an attachment to refuse its image: ``reason`` becomes the dead
    letter's error, ``message`` its sentence (names and numbers, never content)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclasses.dataclass(frozen=True)
class Attachment:
    """What side data adds to one image's record (see the module's docstring).

    Attributes:
      features: extra features ``((name, dtype, value), ...)``, stored as given.
      turns: quarter turns clockwise to apply to the pixels (0-3).
      flip: mirror the pixels left to right (after the turns).
      follow: called with the ``Geometry`` applied; returns more features (or a
        ``Followed``).
      labels: several labels ``((id, name), ...)`` for ``image/class/label`` and
        ``image/class/text`` (empty: the listing's label).
      resolve: called with the ``SourceImage``; returns the attachment to apply.
      displayed: ``turns`` and ``flip`` show the picture as displayed (its EXIF
        orientation): a reshape is sized for the turned picture (see the module).
      several_labels: ``labels`` are the image's labels even when empty (written
        as empty lists, not the listing's label).
    """

    features: tuple[Feature, ...] = ()
    turns: int = 0
    flip: bool = False
    follow: Callable[[Geometry], tuple[Feature, ...] | Followed] | None = None
    labels: tuple[tuple[int, str], ...] = ()
    resolve: Callable[[SourceImage], Attachment] | None = None
    displayed: bool = False
    several_labels: bool = False


class ImageOutcome(NamedTuple):
    """What the builder reports about one image it encoded (a named tuple: one is
    made and pickled per image, on the hot path).

    Attributes:
      size: the framed record's size in bytes.
      note: what the manifest counts (``converted_to_png/<why>``, ``kept/<why>``,
        ``reshape/<what>``, ``attached/moved``) or ''.
      sha256: the SHA-256 of the stored image (``image/key/sha256``).
      source_sha256: the SHA-256 of the file's bytes (equal unless converted).
      image: the stored image's ``(format, mode, width, height)`` (statistics).
      geometry: the geometry applied (an EXIF orientation's turns first, a
        reshape's, then the attachment's turns and flip) when the image had an attachment; else ``None``.
      report: what the attachment's ``follow`` reported (``Followed``), else ``None``.
    """

    size: int
    note: str
    sha256: str
    source_sha256: str
    image: tuple[str, str, int, int]
    geometry: Geometry | None = None
    report: AttachReport | None = None


class EncodedChunk(NamedTuple):
    """A run of files encoded (``ImageRecordBuilder.chunk``), as a helper process
    hands it back.

    Attributes:
      framed: the framed records of the good files, concatenated in order.
      outcomes: per file, its ``ImageOutcome`` or its ``DeadLetter``.
    """

    framed: bytes
    outcomes: list

    def __reduce__(self):
        # Pickled with each outcome as a plain tuple, made named again in one call
        # when unpickled: a named tuple pickled one by one costs ~1 us more per image.
        rows = [tuple(o) if type(o) is ImageOutcome else o for o in self.outcomes]
        return _encoded_chunk, (self.framed, rows)


def _encoded_chunk(framed: bytes, rows: list) -> EncodedChunk:
    make = ImageOutcome._make
    return EncodedChunk(framed, [make(r) if type(r) is tuple else r for r in rows])


# ``ImageOutcome`` from a tuple of all its fields, without its generated ``__new__`` (per image).
_outcome = tuple.__new__


def read_failure(err: BaseException) -> str:
    """A read error's dead-letter message: what went wrong, without the path (a
    dead letter names its file relative to the input root) or any content."""
    return f"cannot read the file: {getattr(err, 'strerror', None) or type(err).__name__}"


def _read_errors() -> tuple[type[BaseException], ...]:
    try:
        from apache_beam.io.filesystem import BeamIOError  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover - Beam is a dependency.
        return (OSError,)
    return (OSError, BeamIOError)


def _turned(data: bytes, info: ImageInfo, attachment: Attachment,
            spec: ImageReshape | None) -> tuple[bytes, ImageInfo]:
    """The image turned and flipped as ``attachment`` asks, written again."""
    out_format = info.format if info.format in ("jpeg", "png") else "png"
    with decode_first_frame(data, info) as im:
        moved = transposed(im, attachment.turns, attachment.flip)
        out = io.BytesIO()
        if out_format == "jpeg":
            moved.save(out, format="JPEG", quality=spec.quality if spec is not None else 90)
        else:
            moved.save(out, format="PNG", compress_level=6)
    unreadable = info.unreadable if out_format == info.format else ""  # A CMYK JPEG stays one.
    width, height = (info.height, info.width) if attachment.turns % 2 else (info.width, info.height)
    return out.getvalue(), dataclasses.replace(info, format=out_format, width=width, height=height,
                                               unreadable=unreadable)


@dataclasses.dataclass(frozen=True)
class ImageRecordBuilder:
    """Builds image records: read bytes, inspect, make readable or reshape, apply
    an attachment's geometry, encode the features.

    Attributes:
      validate: ``headers``, ``structure`` or ``decode`` (see ``inspect_image``).
      max_pixels: images declaring more pixels are dead-lettered (``too_many_pixels``).
      image_bytes: ``readable`` (images tf.io.decode_image cannot read are stored
        as PNG) or ``original`` (every file's bytes as they are).
      reshape: how images are resized and re-encoded (``None`` or inactive: not; an
        inactive one is held as ``None``).
      max_file_bytes: a file larger than this is dead-lettered unread.
      attach: per image, its ``Attachment`` or ``None`` (see the module's docstring).
      names: ``--feature_names``, ``((canonical, output), ...)``: the keys the
        record's features carry (an attachment's included); ``()``: canonical.
    """

    validate: str = "structure"
    max_pixels: int = DEFAULT_MAX_PIXELS
    image_bytes: str = "readable"
    reshape: ImageReshape | None = None
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    attach: Callable[[ImageRef], Attachment | None] | None = None
    names: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        if self.reshape is not None and not self.reshape.active:  # Held as None: checked per image.
            object.__setattr__(self, "reshape", None)

    def framed(self, ref: ImageRef) -> tuple[list[bytes], ImageOutcome] | DeadLetter:
        """Reads and encodes one image: its framed record as pieces (the file's bytes
        among them, not copied) and its outcome, or why it was refused.

        The file is read bounded (``bounded_read.read_input``: a regular file only, at
        most its listed size plus one byte, nothing of one over ``max_file_bytes``; a
        ``gs://`` object in one GET of its listed generation, and one deleted, replaced
        or refused since is a ``read_error``).
        """
        try:
            data = read_input(ref.path, ref.size, self.max_file_bytes, ref.generation, ref.crc32c)
        except InputRefused as refused:
            return DeadLetter(ref.filename, "read", refused.reason, refused.message)
        except _read_errors() as err:
            return DeadLetter(ref.filename, "read", "read_error", read_failure(err))
        built = self._built(ref, data, RECORD_OVERHEAD)
        if isinstance(built, DeadLetter):
            return built
        return frame_parts(built[0], built[1]), built[2]

    def example(self, ref: ImageRef, data: bytes) -> tuple[bytes, ImageOutcome] | DeadLetter:
        """Encodes an image's bytes already read: the serialized Example (unframed)
        and its outcome (``size``: the Example's), or why it was refused."""
        built = self._built(ref, data, 0)
        if isinstance(built, DeadLetter):
            return built
        return b"".join(built[0]), built[2]

    def chunk(self, refs: Sequence[ImageRef]) -> EncodedChunk:
        """``framed`` over a run of files: one task for a thread or a process. Returns
        the framed records of the good files, concatenated in order (each file's
        bytes are copied once, into it), and per file its outcome or dead letter."""
        pieces: list[bytes] = []
        outcomes: list = []
        for ref in refs:
            built = self.framed(ref)
            if isinstance(built, DeadLetter):
                outcomes.append(built)
            else:
                pieces += built[0]
                outcomes.append(built[1])
        return EncodedChunk(b"".join(pieces), outcomes)

    def _built(self, ref: ImageRef, data: bytes, overhead: int) -> tuple | DeadLetter:
        """``(pieces, size, outcome)``: the Example as pieces whose concatenation it
        is (``image_example_parts``), its size, and its ``ImageOutcome`` (``size``
        that plus ``overhead``); or the dead letter."""
        source = data
        geometry = None
        try:
            attachment = self.attach(ref) if self.attach is not None else None
        except AttachmentRefused as refused:
            return _refused(ref, refused)
        try:
            spec, source_info, first = self.reshape, None, (0, False)
            if attachment is not None and spec is not None:
                source_info, attachment, first = self._first(source, attachment)
            data, info, note = self._stored(data, first)
            if attachment is not None:
                if source_info is None:
                    source_info = info
                    attachment = _resolved(attachment, source, source_info)
                geometry = reshape_geometry(source_info.width, source_info.height, spec, *first)
                data, info, note, geometry = _moved(data, info, note, attachment, geometry, spec)
        except AttachmentRefused as refused:
            return _refused(ref, refused)
        except ImageError as err:
            return DeadLetter(ref.filename, "validate", err.reason, quiet_message(err.message))
        except (ValueError, OSError, TypeError, MemoryError) as err:  # Pillow, converting or resizing.
            return DeadLetter(ref.filename, "encode", "conversion_error",
                              quiet_message(f"the image could not be converted: {type(err).__name__}: {err}"))
        # The one content hash: the image/key/sha256 feature, the duplicates report and
        # (the file's own bytes) the input fingerprint.
        digest = hashlib.sha256(data).hexdigest()
        source_digest = digest if data is source else hashlib.sha256(source).hexdigest()
        label, text, extra, report = ref.label, ref.label_text, ref.extra, None
        try:
            if attachment is not None:
                extra, report = _attached(ref, attachment, geometry)
                if attachment.labels or attachment.several_labels:
                    label, text = (tuple(t) for t in zip(*attachment.labels)) if attachment.labels else ((), ())
            if label == -1:  # A detection record: classes per object, no image/class/*.
                label, text = None, None
            parts, size = image_example_parts(data, info, label, text, ref.filename, extra, digest,
                                              dict(self.names) if self.names else None)
        except AttachmentRefused as refused:
            return _refused(ref, refused)
        except (ValueError, TypeError, OverflowError) as err:
            return DeadLetter(ref.filename, "encode", "encode_error",
                              quiet_message(f"cannot encode the record: {err}"))
        return parts, size, _outcome(ImageOutcome, (size + overhead, note, digest, source_digest,
                                                     (info.format, info.mode, info.width, info.height),
                                                     geometry, report))

    def _first(self, source: bytes, attachment: Attachment) -> tuple[ImageInfo, Attachment, tuple[int, bool]]:
        """Before a reshape: the source's header, the attachment resolved, and the
        turns and flip to apply before the reshape (an EXIF orientation shown as
        displayed, ``Attachment.displayed``), then no longer asked of the attachment."""
        source_info = inspect_image(source, "headers", self.max_pixels)
        attachment = _resolved(attachment, source, source_info)
        if not attachment.displayed:
            return source_info, attachment, (0, False)
        return (source_info, dataclasses.replace(attachment, turns=0, flip=False),
                (attachment.turns % 4, attachment.flip))

    def _stored(self, data: bytes, first: tuple[int, bool] = (0, False)) -> tuple[bytes, ImageInfo, str]:
        """Inspects the image and makes it what is stored: ``(bytes, info, note)``.

        With ``image_bytes='readable'``, an image ``tf.io.decode_image`` cannot read as
        stored is stored as a lossless PNG (see ``codec.readable``). The note says what
        a manifest should count: ``converted_to_png/<why>``, ``kept/<why>`` (an image
        kept as it is that a reader should know about: ``png_16_bit``, or, with
        ``original``, the reason TensorFlow cannot read it), or ''. With an active
        ``reshape`` the image is resized and re-encoded as it says (see
        ``codec.reshape``; always readable), turned and flipped first as ``first``
        says (``(turns, flip)``: an attachment's EXIF orientation), and the note is
        ``reshape/<what>``.
        """
        reshape, validate, max_pixels = self.reshape, self.validate, self.max_pixels
        if reshape is not None:
            info = inspect_image(data, "headers", max_pixels)
            decodes = bool(first[0] or first[1]) or reshape_decodes(info, reshape)
            if validate != "headers" and not (info.format == "jpeg" and decodes):
                # A JPEG that is decoded anyway is checked by that decode (every
                # entropy-coded byte is read at any scale); the rest as asked.
                info = inspect_image(data, validate, max_pixels)
            return reshape_image(data, info, reshape, turns=first[0], flip=first[1])
        info = inspect_image(data, validate, max_pixels)
        if info.unreadable and self.image_bytes == "readable":
            data, converted = readable_image(data, info)
            return data, converted, f"converted_to_png/{info.unreadable}"
        if info.unreadable:
            return data, info, f"kept/{info.unreadable}"
        return data, info, "kept/png_16_bit" if info.bit_depth == 16 else ""


def _resolved(attachment: Attachment, source: bytes, info: ImageInfo) -> Attachment:
    """The attachment to apply: ``attachment.resolve``'s answer, told the source
    (its size as stored and EXIF orientation), when it has one; else itself."""
    if attachment.resolve is None:
        return attachment
    return dataclasses.replace(attachment.resolve(SourceImage(info.width, info.height, exif_orientation(source))),
                               resolve=None)


def _moved(data: bytes, info: ImageInfo, note: str, attachment: Attachment, geometry: Geometry,
           spec: ImageReshape | None) -> tuple[bytes, ImageInfo, str, Geometry]:
    """The stored image turned and flipped as the (resolved) ``attachment`` asks
    (after the reshape), and ``geometry`` (the reshape's) followed by those turns."""
    if attachment.turns % 4 or attachment.flip:
        data, info = _turned(data, info, attachment, spec)
        geometry = dataclasses.replace(geometry, output=(info.width, info.height),
                                       turns=attachment.turns % 4, flip=attachment.flip)
        note = note or "attached/moved"
    return data, info, note, geometry


def _refused(ref: ImageRef, refused: AttachmentRefused) -> DeadLetter:
    return DeadLetter(ref.filename, "validate", refused.reason, quiet_message(refused.message))


def _attached(ref: ImageRef, attachment: Attachment,
              geometry: Geometry) -> tuple[tuple[Feature, ...], AttachReport | None]:
    """The listing's extra features and the attachment's, sorted by name, and what
    its ``follow`` reported.

    Raises:
      ValueError: for a key that is reserved, or given twice.
    """
    added, report = tuple(attachment.features), None
    if attachment.follow is not None:
        followed = attachment.follow(geometry)
        if isinstance(followed, Followed):
            followed, report = followed.features, followed.report
        added += tuple(followed)
    taken = RESERVED_FEATURES | {name for name, _, _ in ref.extra}
    seen: set[str] = set()
    for name, _, _ in added:
        if name in taken or name in seen:
            raise ValueError(f"an attachment may not add the feature {name!r}: it is reserved "
                             "or already given")
        seen.add(name)
    return tuple(sorted(ref.extra + added, key=lambda feature: feature[0])), report


@functools.lru_cache(maxsize=4096)
def _record_overhead(label: int, label_text: str, extra: tuple) -> int:
    """Record size less the file's bytes and name, at their varints' widest."""
    return RECORD_OVERHEAD + _VARINT_SLACK + image_example_size(
        0, "jpeg", _TYPICAL_SIDE, _TYPICAL_SIDE, _TYPICAL_CHANNELS, label, label_text, "", extra
    )


def record_overheads(vocabulary: Sequence[str]) -> np.ndarray:
    """Each label's record size less the file's and its name's bytes
    (``estimated_record_size`` of a folder layout's image), as int64 by label."""
    return np.array([_record_overhead(label, text, ()) for label, text in enumerate(vocabulary)] or [0],
                    dtype=np.int64)


def estimated_record_size(ref: ImageRef) -> int:
    """Framed size of the record an image becomes, before its header is read.

    At most a few bytes above the true size (see ``image_example_size`` for the
    exact figure), which is all a plan needs (attachments' features aside). An
    annotated image counts its annotation's bytes (``ImageRef.annotation``) too:
    its objects' features are of that order (rendered masks aside).
    """
    overhead = _record_overhead(ref.label, ref.label_text, ref.extra)
    return overhead + ref.size + len(ref.filename.encode("utf-8")) + len(ref.annotation)
