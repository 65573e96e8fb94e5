"""beam-tfrecords: images and tables to verified, size-banded TFRecord shards.

Installed, this folder is the package ``beam_tfrecords``; ``transforms`` and
``schemas`` are its subpackages. The public API is importable from the top::

    from beam_tfrecords import ConvertConfig, convert, build_pipeline
    from beam_tfrecords import ImagesToExamples, RowsToExamples, WriteVerifiedShards
    from beam_tfrecords import DataSource, tf_dataset  # reading a dataset back

Names load on first use, so a helper process that imports only a codec does not
pay for Beam.
"""

from __future__ import annotations

import importlib

from beam_tfrecords.schemas.version import __version__

__all__ = [
    "ConvertConfig",
    "ConvertError",
    "ConvertResult",
    "DataSource",
    "ImagesToExamples",
    "RowsToExamples",
    "WriteVerifiedShards",
    "__version__",
    "build_pipeline",
    "convert",
    "dataset_shards",
    "submit",
    "tf_dataset",
]

_EXPORTS = {
    "ConvertConfig": "beam_tfrecords.schemas.config",
    "ConvertError": "beam_tfrecords.pipeline",
    "ConvertResult": "beam_tfrecords.pipeline",
    "DataSource": "beam_tfrecords.data_source",
    "ImagesToExamples": "beam_tfrecords.transforms.image_steps",
    "RowsToExamples": "beam_tfrecords.transforms.tables",
    "WriteVerifiedShards": "beam_tfrecords.transforms.shard_engine",
    "build_pipeline": "beam_tfrecords.pipeline",
    "convert": "beam_tfrecords.pipeline",
    "dataset_shards": "beam_tfrecords.verify",
    "submit": "beam_tfrecords.pipeline",
    "tf_dataset": "beam_tfrecords.data_source",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'beam_tfrecords' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
