"""The record builder's attachment for annotated images: ``AnnotationAttach``.

``ImageRecordBuilder(attach=AnnotationAttach(index, label_map, options, render))``
looks each image up in the annotations by its ``image/filename`` (``annotation_key``)
and attaches its detection and segmentation features:

1. when the builder knows the source (``Attachment.resolve``, told its stored size and
   EXIF orientation), it decides the orientation (``codec.orientation.orient``): a
   stated size that is the displayed one asks the builder to store the pixels turned
   as displayed (``Attachment.displayed``: ``--size`` is then the displayed picture's);
   one that is neither refuses the image (``annotation_size_mismatch``);
   it reads the semantic mask, if any (a mask that cannot be read refuses the image,
   ``bad_mask``);
2. once the pixels are moved (``Attachment.follow``), it computes the features in the
   output's frame (``detection_features``); a mask whose size is not the image's
   refuses the image (``mask_size_mismatch``); the counts and the objects dropped
   travel in the outcome (``ImageOutcome.report``, an ``AttachReport`` of
   ``AnnotationProblem``).

Several labels per image go to ``image/class/label`` and ``image/class/text`` as
lists (``Attachment.labels``); with ``AnnotationOptions.several_labels`` (a
``multi_label`` run) every record holds those two lists, empty for an image without
labels, and no ``image/object/*`` key, and the report names the labels written (the
run's per-class counts). An image the index does not hold gets no attachment
(its record is a plain image record): the listing of an annotated run names only the
images the annotations name.

Picklable (module-level class, plain data): it travels to the helper processes with
the builder.
"""

from __future__ import annotations

import dataclasses
import functools
import posixpath
from collections.abc import Mapping

from beam_tfrecords.schemas.annotations import ImageAnnotations, LabelMap
from beam_tfrecords.schemas.config import DEFAULT_MAX_FILE_BYTES
from beam_tfrecords.schemas.elements import ImageRef
from beam_tfrecords.transforms.codec.annotation_bytes import decode_annotations
from beam_tfrecords.transforms.codec.orientation import Orienting, displayed_size, orient
from beam_tfrecords.transforms.io.bounded_read import InputRefused, read_input
from beam_tfrecords.transforms.io.detection_features import Render, detection_features
from beam_tfrecords.transforms.io.image_records import (
    Attachment,
    AttachmentRefused,
    AttachReport,
    Followed,
    Geometry,
    SourceImage,
    read_failure,
)

__all__ = ["AnnotationAttach", "AnnotationOptions", "annotation_key"]


def annotation_key(path: str) -> str:
    """The key an image is looked up by: its path as ``image/filename`` holds it.

    ``image/filename`` is the path relative to the input root for folder layouts
    (``cat/a.jpg``, ``train/cat/a.jpg``, ``JPEGImages/x.jpg``), and for a CSV manifest
    the cell as written, a leading ``/`` dropped (``images/a.jpg``, ``data/x.jpg`` for
    ``/data/x.jpg``, ``gs://b/x.jpg``). Both sides are normalized alike: ``file://``
    and a leading ``/`` dropped, ``./`` and doubled slashes removed (``scheme://``
    paths are kept as they are).
    """
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "://" in path:
        return path
    return posixpath.normpath(path).lstrip("/") if path else path


@dataclasses.dataclass(frozen=True)
class AnnotationOptions:
    """How ``AnnotationAttach`` writes annotations.

    Attributes:
      instance_masks: write ``image/object/mask`` (one PNG per object).
      images_root: the images' folder relative to the input root when the
        annotations' paths are relative to it (``JPEGImages`` for VOC), else ''.
      mask_root: the folder relative semantic-mask paths are under ('' : as given).
      mask_pad: the semantic mask's value where the pixels were padded.
      max_mask_bytes: a semantic mask file larger than this is refused (``bad_mask``).
      several_labels: several labels per image (``multi_label``): records hold
        ``image/class/label`` and ``text`` (empty lists for an image without labels)
        and no per-object key.
      mask_classes: semantic masks without boxes (``masks``): an image's objects are
        the classes (of the label map, 0 the background left out) its written mask
        holds, one each, its area the class's pixels (the annotation statistics),
        and their names its labels (``labels.counts``: records holding each class).
    """

    instance_masks: bool = False
    images_root: str = ""
    mask_root: str = ""
    mask_pad: int = 0
    max_mask_bytes: int = DEFAULT_MAX_FILE_BYTES
    several_labels: bool = False
    mask_classes: bool = False


@dataclasses.dataclass(frozen=True)
class _Resolved:
    """What ``AnnotationAttach`` decided for one image once its source was known."""

    annotations: ImageAnnotations
    orienting: Orienting
    semantic: bytes | None
    labels: tuple[str, ...] = ()


class AnnotationAttach:
    """``attach(ref) -> Attachment | None`` for ``ImageRecordBuilder``: one image's
    annotations as features (see the module's docstring).

    Args:
      index: ``ImageAnnotations`` by path (``ImageAnnotations.path``; keys are
        normalized with ``annotation_key``, after ``options.images_root``), or
        ``None``: each image's annotations travel in its reference
        (``ImageRef.annotation``, see ``codec.annotation_bytes``), the way a run
        carries them to its workers (an index would travel in the job graph).
      label_map: the classes.
      options: ``AnnotationOptions``.
      render: ``render(segmentation, height, width)`` -> a 0/1 ``uint8`` array;
        required with ``options.instance_masks``. Picklable (module level).

    Raises:
      ValueError: instance masks asked without a renderer.
    """

    def __init__(self, index: Mapping[str, ImageAnnotations] | None, label_map: LabelMap,
                 options: AnnotationOptions | None = None, render: Render | None = None):
        self.options = options or AnnotationOptions()
        if self.options.instance_masks and render is None:
            raise ValueError("instance masks need a mask renderer")
        root = self.options.images_root.strip("/")
        self.index = {annotation_key(f"{root}/{key}" if root else key): value
                      for key, value in (index or {}).items()}
        self.label_map = label_map
        self.render = render

    def __call__(self, ref: ImageRef) -> Attachment | None:
        if ref.annotation:
            try:
                annotations = decode_annotations(ref.annotation)
            except ValueError as err:  # Made by the launcher and digest-checked: not expected.
                raise AttachmentRefused("bad_annotation_file", f"the annotations the listing carries: {err}") from None
        else:
            annotations = self.index.get(annotation_key(ref.filename))
        if annotations is None:
            return None
        names = dict(self.label_map.items)
        texts = annotations.texts or tuple(names.get(label, "") for label in annotations.labels)
        labels = tuple(zip(annotations.labels, texts))
        return Attachment(labels=labels, resolve=functools.partial(self.resolve, annotations, labels),
                          several_labels=self.options.several_labels)

    def resolve(self, annotations: ImageAnnotations, labels: tuple[tuple[int, str], ...],
                source: SourceImage) -> Attachment:
        """The attachment once the source is known: the EXIF turns, the mask read.

        Raises:
          AttachmentRefused: ``annotation_size_mismatch``, or ``bad_mask`` (unreadable).
        """
        stored = (source.width, source.height)
        orienting = orient(stored, source.orientation, annotations.stated_size)
        if orienting.mismatch:
            shown = displayed_size(source.width, source.height, source.orientation)
            stated = annotations.stated_size
            raise AttachmentRefused(
                "annotation_size_mismatch",
                f"the annotations ({annotations.source or annotations.path}) state {stated[0]}x{stated[1]}; "
                f"the image is {stored[0]}x{stored[1]}" + (f" ({shown[0]}x{shown[1]} as displayed)"
                                                           if shown != stored else ""))
        semantic = self._mask(annotations) if annotations.mask else None
        resolved = _Resolved(annotations, orienting, semantic, tuple(text for _, text in labels))
        return Attachment(turns=orienting.turns, flip=orienting.flip, labels=labels,
                          follow=functools.partial(self.follow, resolved),
                          displayed=bool(orienting.turns % 4 or orienting.flip),
                          several_labels=self.options.several_labels)

    def follow(self, resolved: _Resolved, geometry: Geometry) -> Followed:
        """The features in the output's frame, and what the run counts.

        Raises:
          AttachmentRefused: ``mask_size_mismatch`` or ``bad_mask``.
        """
        options = self.options
        found = detection_features(resolved.annotations, geometry, self.label_map,
                                   orienting=resolved.orienting, semantic=resolved.semantic,
                                   instance_masks=options.instance_masks, render=self.render,
                                   mask_pad=options.mask_pad, objects=not options.several_labels)
        if found.refused is not None:
            raise AttachmentRefused(found.refused.reason, f"{found.refused.source}: {found.refused.detail}")
        counts = found.counts
        if resolved.orienting.count:
            counts = tuple(sorted(counts + ((resolved.orienting.count, 1),)))
        objects, labels = found.objects, resolved.labels
        if options.mask_classes:
            names = dict(self.label_map.items)
            objects = tuple((label, float(pixels)) for label, pixels in found.mask_classes)
            labels = tuple(names[label] for label, _ in found.mask_classes)
        return Followed(found.features, AttachReport(counts, found.problems, objects, labels))

    def _mask(self, annotations: ImageAnnotations) -> bytes:
        path = annotations.mask
        root = self.options.mask_root
        if root and "://" not in path and not path.startswith("/"):
            path = f"{root.rstrip('/')}/{path}"
        try:
            return read_input(path, None, self.options.max_mask_bytes)
        except InputRefused as refused:
            raise AttachmentRefused("bad_mask", f"the mask {annotations.mask}: {refused.message}") from None
        except OSError as err:
            raise AttachmentRefused("bad_mask", f"the mask {annotations.mask}: {read_failure(err)}") from None
