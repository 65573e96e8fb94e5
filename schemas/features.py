"""Feature specs: the name, dtype and shape of every feature a record carries.

The manifest records the spec, so a reader can build ``tf.io.parse_example``'s
feature description from it without knowing how the data was converted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["DTYPES", "FEATURE_NAME_PRESETS", "IMAGE_FEATURE_SPEC", "FeatureSpec", "image_feature_spec",
           "output_feature_name"]

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


def output_feature_name(renames: Mapping[str, str] | None, name: str) -> str:
    """The key a feature carries in the records: its canonical ``name`` (``image/encoded``)
    as renamed by ``--feature_names`` (the manifest's ``feature_names``, canonical ->
    output, renamed features only), else ``name`` itself."""
    return (renames or {}).get(name, name)
