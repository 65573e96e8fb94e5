"""The flags of annotated images (issue 21): which annotated layout a run reads, and the
combinations of flags that cannot work, refused before anything runs (exit 2, one line
saying what to change).

``annotated_config`` is called by the preflight once the config is resolved: it picks
the layout ``--layout auto`` means (``transforms.annotated_inputs.
detect_annotated_layout``), makes the paths of ``--annotations`` and ``--masks``
absolute, and refuses what an annotated layout does not do yet: ``--incremental``,
``--skip_unchanged`` with VOC, YOLO and masks (their files are not in the input's
fingerprint; a COCO file and a CSV are role files of it, so they may),
``--list_on_workers``, ``--drop_duplicates`` and ``--split_by content``; and
``--labels`` with COCO and YOLO (their annotations number the classes).
"""

from __future__ import annotations

import dataclasses
import os

from beam_tfrecords.run_plan import ConvertError
from beam_tfrecords.schemas.annotations import ANNOTATION_LAYOUTS
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.options import ANNOTATION_OPTIONS, CONVERT_OPTIONS
from beam_tfrecords.transforms.annotated_inputs import (
    AmbiguousManifest,
    AnnotatedRefused,
    AnnotationArgs,
    detect_annotated_layout,
)
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.plan.annotated_listing import annotation_parts
from beam_tfrecords.transforms.plan.label_map_file import read_label_map

__all__ = ["annotated_config", "refuse_annotation_flags"]

# Flag -> the layouts it applies to (given with another layout, the run is refused).
_FLAG_LAYOUTS = (
    ("--annotations", "annotations", ("coco",)),
    ("--instance_masks", "instance_masks", ("coco",)),
    ("--masks", "masks", ("masks",)),
    ("--box_columns", "box_columns", ("box_csv",)),
    ("--box_units", "box_units", ("box_csv",)),
    ("--label_separator", "label_separator", ("multi_label",)),
    ("--drop_empty", "drop_empty", ANNOTATION_LAYOUTS),
)
_DEFAULTS = {o.name: o.default for o in CONVERT_OPTIONS if o.name in ANNOTATION_OPTIONS}


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path and files.is_local(path) else path


def _given(config: ConvertConfig) -> list[tuple[str, tuple[str, ...]]]:
    def value(name: str):
        given = getattr(config, name)
        return tuple(given) if isinstance(given, list) else given

    return [(flag, layouts) for flag, name, layouts in _FLAG_LAYOUTS if value(name) != _DEFAULTS[name]]


def refuse_annotation_flags(config: ConvertConfig) -> None:
    """Refuses the annotation flags that cannot go together whatever the input (called
    before any input or bucket is looked at).

    Raises:
      ConvertError: naming what to change.
    """
    if config.annotations and config.masks:
        raise ConvertError("--annotations (COCO) and --masks (semantic masks) are two layouts; give one")
    if config.masks and config.list_on_workers:
        raise ConvertError("--masks pairs every image with its mask on the launcher; drop "
                           "--list_on_workers")
    if config.instance_masks and not config.annotations and config.layout in ("auto", "coco"):
        raise ConvertError("--instance_masks renders COCO segmentations: give --annotations "
                           "instances.json (or drop --instance_masks)")


def _refuse_for_layout(config: ConvertConfig) -> None:
    layout = config.layout
    for flag, layouts in _given(config):
        if layout not in layouts:
            what = "an annotated layout" if len(layouts) > 1 else f"--layout {layouts[0]}"
            raise ConvertError(f"{flag} applies only to {what}; the input is read as --layout "
                               f"{layout}: remove {flag} (or give --layout)")
    if layout not in ANNOTATION_LAYOUTS:
        return
    # --skip_unchanged sees the annotation file change where it is one file (a role file of
    # the input's fingerprint); VOC's and YOLO's files and the masks are not fingerprinted.
    unseen = layout in ("voc", "yolo", "masks")
    given = [flag for flag, on in (
        ("--incremental", config.incremental), ("--skip_unchanged", config.skip_unchanged and unseen),
        ("--list_on_workers", config.list_on_workers), ("--drop_duplicates", config.drop_duplicates),
        ("--split_by content", config.split_by == "content")) if on]
    if given:
        raise ConvertError(f"{given[0]} does not work with annotated images (--layout {layout}) yet: "
                           "drop it (a full run with --overwrite rebuilds the dataset)")
    if config.labels and layout in ("coco", "yolo"):
        raise ConvertError(f"--labels: with --layout {layout} the annotations number the classes "
                           f"({'the categories' if layout == 'coco' else 'data.yaml'}); drop --labels")
    if layout == "coco" and not config.annotations:
        raise ConvertError("--layout coco needs --annotations instances.json (or "
                           "train=a.json,validation=b.json)")
    if layout == "masks" and not config.masks:
        raise ConvertError("--layout masks needs --masks DIR, the folder of the PNG masks")
    if layout in ("coco", "masks", "voc", "yolo") and config.input.lower().endswith(".csv"):
        raise ConvertError(f"--layout {layout} reads a folder of images; --input {config.input} is a "
                           "CSV file (box CSVs are --layout box_csv)")
    if layout in ("box_csv", "multi_label") and not config.input.lower().endswith(".csv"):
        raise ConvertError(f"--layout {layout} reads a CSV manifest; --input {config.input} is not "
                           "a .csv file")


def _check_files(config: ConvertConfig) -> ConvertConfig:
    """``--annotations`` and ``--masks`` made absolute, and checked to exist."""
    if config.annotations:
        try:
            parts = annotation_parts(config.annotations)
        except ValueError as err:
            raise ConvertError(str(err)) from None
        parts = tuple((split, _absolute(path)) for split, path in parts)
        for _, path in parts:
            if not files.exists(path):
                raise ConvertError(f"--annotations: {path} does not exist")
        text = ",".join(f"{split}={path}" if split else path for split, path in parts)
        config = dataclasses.replace(config, annotations=text)
    if config.masks:
        masks = _absolute(config.masks).rstrip("/")
        if not files.list_files(files.join(masks, "**"), limit=1):
            raise ConvertError(f"--masks: no files under {masks}")
        config = dataclasses.replace(config, masks=masks)
    return config


def _known_labels(config: ConvertConfig) -> frozenset[str] | None:
    """The classes ``--labels`` names (``None``: not given, or not readable here: the
    image checks say why)."""
    if not config.labels:
        return None
    try:
        return frozenset(name for _, name in read_label_map(files.read_text(_absolute(config.labels))).items)
    except (OSError, ValueError):
        return None


def annotated_config(config: ConvertConfig) -> ConvertConfig:
    """The config with its annotated layout decided (``--layout auto``) and the paths of
    its annotation flags absolute; unchanged for an input that is not annotated.

    Raises:
      ConvertError: a combination of flags that cannot work, naming what to change.
    """
    if config.layout == "table":
        return config
    refuse_annotation_flags(config)
    if config.layout == "auto":
        try:
            layout = detect_annotated_layout(config.input, AnnotationArgs.of(config), config.image_column,
                                             config.label_column, _known_labels(config))
        except AmbiguousManifest as err:
            raise ConvertError(str(err)) from None
        except AnnotatedRefused as err:  # A folder taken for an annotated one: say how to keep it plain.
            raise ConvertError(f"{err}; or, if its folders are classes, say --layout class_folders") from None
        except (OSError, ValueError):
            layout = None  # Not readable as one: the image checks say why.
        if layout is not None:
            config = dataclasses.replace(config, layout=layout)
    _refuse_for_layout(config)
    if config.layout not in ANNOTATION_LAYOUTS:
        return config
    return _check_files(config)
