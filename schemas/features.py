"""Feature specs: the name, dtype and shape of every feature a record carries.

The manifest records the spec, so a reader can build ``tf.io.parse_example``'s
feature description from it without knowing how the data was converted.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence

from beam_tfrecords.schemas.annotations import DETECTION_KEYS

__all__ = ["DTYPES", "FEATURE_NAME_PRESETS", "IMAGE_FEATURE_SPEC", "FeatureNames", "FeatureSpec",
           "canonical_features", "image_feature_spec", "output_feature_name", "parse_feature_names",
           "renamed_spec"]

# Feature dtypes, named as TensorFlow names them (tf.string, tf.int64, tf.float32).
DTYPES = ("string", "int64", "float32")


class FeatureSpec:
    """Name → (dtype, shape) of the features every record carries.

    ``shape`` is a list of ints (``[]`` for a scalar, ``[None]`` for a variable-length
    list). A TensorFlow reader turns it into a parse spec with::

        {name: tf.io.FixedLenFeature(s["shape"], s["dtype"]) for name, s in spec.items()}
    """

    def __init__(self, entries: Mapping[str, tuple[str, Sequence[int | None]]]):
        for name, (dtype, _) in entries.items():
            if dtype not in DTYPES:
                raise ValueError(f"feature {name!r}: dtype must be one of {DTYPES}, got {dtype!r}")
        self._entries = {name: (dtype, list(shape)) for name, (dtype, shape) in entries.items()}

    def entries(self) -> list[tuple[str, str, list]]:
        """``[(name, dtype, shape), ...]`` sorted by name."""
        return [(name, dtype, list(shape)) for name, (dtype, shape) in sorted(self._entries.items())]

    def to_json(self) -> dict:
        """The spec as ``{name: {"dtype": ..., "shape": [...]}}``, sorted by name."""
        return {
            name: {"dtype": dtype, "shape": shape}
            for name, (dtype, shape) in sorted(self._entries.items())
        }


IMAGE_FEATURE_SPEC = FeatureSpec(
    {
        "image/encoded": ("string", []),
        "image/format": ("string", []),
        "image/height": ("int64", []),
        "image/width": ("int64", []),
        "image/channels": ("int64", []),
        "image/class/label": ("int64", []),
        "image/class/text": ("string", []),
        "image/filename": ("string", []),
        "image/key/sha256": ("string", []),
    }
)


def image_feature_spec(extra_features: dict[str, str] | None = None) -> FeatureSpec:
    """The image features plus scalar extras (``{name: dtype}``, e.g. CSV columns)."""
    entries = {name: (dtype, shape) for name, dtype, shape in IMAGE_FEATURE_SPEC.entries()}
    for name, dtype in (extra_features or {}).items():
        entries[name] = (dtype, [])
    return FeatureSpec(entries)


# ``--feature_names`` presets: the keys the tutorials this product grew from read
# (TensorFlow's TFRecord tutorial; a CIFAR-10 notebook). Canonical name -> output name;
# features a preset does not name keep their canonical names.
FEATURE_NAME_PRESETS: dict[str, dict[str, str]] = {
    "tutorial": {
        "image/encoded": "image_raw",
        "image/height": "height",
        "image/width": "width",
        "image/channels": "depth",
        "image/class/label": "label",
    },
    "cifar_notebook": {
        "image/encoded": "img",
        "image/class/label": "label",
    },
}


# What the tutorials' readers (their feature descriptions) take each feature a preset
# renames to be: one value per record (FixedLenFeature([], ...)) of this dtype.
_PRESET_READS = {
    "image/encoded": "string",
    "image/height": "int64",
    "image/width": "int64",
    "image/channels": "int64",
    "image/class/label": "int64",
}


def output_feature_name(renames: Mapping[str, str] | None, name: str) -> str:
    """The key a feature carries in the records: its canonical ``name`` (``image/encoded``)
    as renamed by ``--feature_names`` (the manifest's ``feature_names``, canonical ->
    output, renamed features only), else ``name`` itself."""
    return (renames or {}).get(name, name)


# An output name: '/'-parts of letters, digits, '_', '.' and '-', each with a letter,
# digit or '_' first (no empty part, no '.' or '..' part, no trailing '/').
# TensorFlow takes any string as a key; this keeps names that a flag, a file name
# (TFDS's <feature>.labels.txt) and a shell pass through unchanged, that cannot
# hold ',' or '=' (the flag's separators) and that cannot climb out of a folder.
_OUTPUT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*")
_FLAG = "--feature_names"
# The keys this product's records give features by role (image, detection, masks,
# several labels): a reader that finds a role by its key would take a feature
# renamed to one of them for that role, so no output name may be one.
_CANONICAL_KEYS = frozenset(name for name, _, _ in IMAGE_FEATURE_SPEC.entries()) | frozenset(DETECTION_KEYS)


@dataclasses.dataclass(frozen=True)
class FeatureNames:
    """A parsed ``--feature_names``: at most one preset (``FEATURE_NAME_PRESETS``),
    and ``CANONICAL=OUTPUT`` pairs, combined.

    A preset may be combined with pairs (``tutorial,image/filename=name``): a pair
    may rename a feature the preset does not, never one the preset renames, nor
    to an output name the preset uses. Parsing checks what can be checked without
    the records (syntax, names, two features to one name); ``check_keys`` and
    ``check_spec`` check the rest against the features a run's records hold.

    Attributes:
      preset: the preset named, or ``""``.
      renames: canonical name -> output name, the preset's and the pairs', sorted.
    """

    preset: str
    renames: dict[str, str]

    def check_keys(self, keys: Iterable[str], what: str = "the records", shaped: Iterable[str] = ()) -> None:
        """Refuses renames the records' features ``keys`` (canonical names) do not
        allow: a feature they do not hold (one a preset needs, or a pair's), an
        output name one of them already has (even one renamed away) or gets once
        renamed, another role's canonical key (``image/class/label`` on records
        without one), or a ``<name>/shape`` feature renamed on its own.

        Args:
          keys: the records' features, canonical names (a table's ``<name>/shape``
            features included).
          what: the records, as the message names them.
          shaped: the features whose ``<name>/shape`` feature (a table's shaped
            column) follows their name: ``pixels=px`` writes ``px/shape``.

        Raises:
          ValueError: one line naming the entry to change.
        """
        keys = set(keys)
        follows = {f"{name}/shape": name for name in shaped if f"{name}/shape" in keys}
        needed = FEATURE_NAME_PRESETS.get(self.preset, {})
        for canonical, output in self.renames.items():
            if canonical not in keys:
                if canonical in needed:
                    raise ValueError(f"{_FLAG} {self.preset}: the preset needs {canonical!r}, which "
                                     f"{what} do not hold; convert without the preset, or rename "
                                     "the features they hold with CANONICAL=OUTPUT pairs")
                raise ValueError(f"{_FLAG}: {canonical!r} is not a feature of {what}; rename one of: "
                                 f"{', '.join(sorted(keys))}")
            if canonical in follows:
                raise ValueError(f"{_FLAG}: {canonical}={output}: {canonical!r} is the shape of "
                                 f"{follows[canonical]!r} and follows its name; rename "
                                 f"{follows[canonical]!r} instead")
            if output in keys:
                raise ValueError(f"{_FLAG}: {canonical}={output} collides with the feature "
                                 f"{output!r} {what} already hold; choose another output name")
            if output in _CANONICAL_KEYS:
                raise ValueError(f"{_FLAG}: {canonical}={output}: {output!r} is the key of another "
                                 f"feature of this product's records, which {what} do not hold (a "
                                 "reader finding features by that key would take this one for it); "
                                 "choose another output name")
        # A shape follows its feature's new name: pixels=px writes px/shape.
        moved = {f"{self.renames[base]}/shape": f"{base}={self.renames[base]}"
                 for base in follows.values() if base in self.renames}
        for shape, entry in sorted(moved.items()):
            taken = [f"{c}={o}" for c, o in self.renames.items() if o == shape]
            if taken or shape in keys:
                raise ValueError(f"{_FLAG}: {taken[0] if taken else entry} collides with "
                                 f"{shape!r}, the shape feature that {entry} gives {what}; choose "
                                 "another output name")

    def check_spec(self, spec: FeatureSpec, what: str = "the records", shaped: Iterable[str] = ()) -> None:
        """``check_keys`` against the features of ``spec`` (canonical names), and for
        a preset, the dtype and shape each feature it renames has: its tutorial's
        reader parses each as one value per record (a scalar int64 label, height,
        width and depth, one bytes image).

        Raises:
          ValueError: one line naming what to change.
        """
        held = {name: (dtype, shape) for name, dtype, shape in spec.entries()}
        self.check_keys(held, what, shaped)
        for canonical in FEATURE_NAME_PRESETS.get(self.preset, {}):
            dtype, shape = held[canonical]
            if (dtype, shape) != (_PRESET_READS[canonical], []):
                had = (f"a variable-length list of {dtype}" if shape == [None] else
                       f"{dtype} values of shape {shape}" if shape else f"one {dtype}")
                raise ValueError(f"{_FLAG} {self.preset}: the preset's reader parses {canonical!r} "
                                 f"(as {self.renames[canonical]!r}) as one {_PRESET_READS[canonical]} "
                                 f"per record, but {what} hold {had}; convert without the preset, "
                                 "or rename with CANONICAL=OUTPUT pairs and read the features by "
                                 "the manifest's spec")


def parse_feature_names(text: str | None) -> FeatureNames:
    """``--feature_names``: a preset (``tutorial``, ``cifar_notebook``), pairs
    ``image/encoded=img,image/class/label=label``, or a preset and pairs.

    Raises:
      ValueError: one line naming the entry to change (an unknown preset, a
        malformed pair, an empty or invalid name, two presets, a feature renamed
        twice or two features to one name).
    """
    if text is None:
        return FeatureNames("", {})
    presets = ", ".join(FEATURE_NAME_PRESETS)
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise ValueError(f"{_FLAG} {text!r} has an empty entry; give a preset ({presets}) and/or "
                         "CANONICAL=OUTPUT pairs separated by commas")
    preset, pairs = "", {}
    for item in items:
        if "=" not in item:
            if item not in FEATURE_NAME_PRESETS:
                raise ValueError(f"{_FLAG}: {item!r} is neither a preset ({presets}) nor a "
                                 "CANONICAL=OUTPUT pair (e.g. image/encoded=img)")
            if preset:
                raise ValueError(f"{_FLAG}: give one preset, not {preset} and {item}")
            preset = item
            continue
        canonical, _, output = (part.strip() for part in item.partition("="))
        if not canonical or not output or "=" in output:
            raise ValueError(f"{_FLAG}: {item!r} is not CANONICAL=OUTPUT (two non-empty names, "
                             "e.g. image/encoded=img)")
        if not _OUTPUT_NAME.fullmatch(output):
            raise ValueError(f"{_FLAG}: {output!r} cannot name a feature; use letters, digits, "
                             "'_', '.', '-' and '/' between parts (not first or last), each part "
                             "starting with a letter, digit or '_' (no '.' or '..' parts)")
        if canonical in pairs:
            raise ValueError(f"{_FLAG} renames {canonical!r} twice")
        if canonical == output:
            raise ValueError(f"{_FLAG}: {item!r} renames a feature to its own name; leave it out")
        pairs[canonical] = output
    renames = dict(FEATURE_NAME_PRESETS.get(preset, {}))
    for canonical, output in pairs.items():
        if canonical in renames:
            raise ValueError(f"{_FLAG}: the preset {preset} renames {canonical!r} to "
                             f"{renames[canonical]!r}; drop {canonical}={output} or the preset")
        renames[canonical] = output
    outputs = sorted(renames.values())
    twice = sorted({o for o in outputs if outputs.count(o) > 1})
    if twice:
        names = [c for c, o in sorted(renames.items()) if o == twice[0]]
        raise ValueError(f"{_FLAG} gives {' and '.join(names)} one name, {twice[0]!r}; give each "
                         "feature its own")
    return FeatureNames(preset, dict(sorted(renames.items())))


def renamed_spec(spec: FeatureSpec, renames: Mapping[str, str] | None) -> FeatureSpec:
    """``spec`` with its features under their output names (``output_feature_name``)."""
    if not renames:
        return spec
    return FeatureSpec({output_feature_name(renames, name): (dtype, shape)
                        for name, dtype, shape in spec.entries()})


def canonical_features(renames: Mapping[str, str] | None, features: Mapping[str, object]) -> dict:
    """A record's features (``{output name: values}``) under their canonical names,
    for a reader that looks features up by role (``inspect``'s contact sheet)."""
    if not renames:
        return dict(features)
    back = {output: canonical for canonical, output in renames.items()}
    return {back.get(name, name): values for name, values in features.items()}
