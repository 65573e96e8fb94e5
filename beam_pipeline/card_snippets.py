"""The dataset card's "Loading it" snippets, each fitted to the dataset it describes.

A snippet is given only when it runs as pasted on that dataset; otherwise the
card says why it is left out: ``DataSource`` (PyTorch, JAX) refuses gzip shards
and ``SequenceExample`` records, ``tf_dataset`` refuses ``SequenceExample``
records, ``decode_images=True`` needs an image feature, and TFDS needs
``dataset_info.json`` in the dataset's folder and in every incremental part's
(``tfds.builder_from_directories`` then reads them all). Pure Python: the card
(``dataset_card``) escapes what it shows.
"""

from __future__ import annotations

import dataclasses
import os

from beam_tfrecords.schemas.features import output_feature_name
from beam_tfrecords.schemas.manifest import manifest_shards

__all__ = ["Snippet", "loading_snippets", "shown_path"]


@dataclasses.dataclass(frozen=True)
class Snippet:
    """One reader's snippet, or why there is none.

    Attributes:
      reader: ``tf.data``, ``TFDS``, ``PyTorch`` or ``JAX (Grain)``.
      code: the lines to copy (``''`` when left out).
      reason: why it is left out (``''`` when given).
    """

    reader: str
    code: str = ""
    reason: str = ""


def shown_path(path: str) -> str:
    """A path as a published card shows it: an absolute local path by its folder
    name only (the folders above it are the writing machine's); a relative one and
    ``gs://`` as written."""
    if "://" in path or not os.path.isabs(path):
        return path
    return os.path.basename(os.path.normpath(path)) or path


def _gzip(manifest: dict, parts: list) -> bool:
    return any(entry.path.endswith(".gz") for m in [manifest] + [p for _, p in parts if p]
               for entry in manifest_shards(m))


def _tfds(path: str, parts: list, tfds_folders: dict) -> Snippet:
    """The TFDS snippet: every folder (the dataset's, each part's) must hold
    ``dataset_info.json``."""
    missing = [f"{path}/{rel}" if rel else path for rel, present in tfds_folders.items() if not present]
    if missing or not tfds_folders:
        return Snippet("TFDS", reason=(
            f"left out: {', '.join(missing) or 'the dataset folder'} holds no dataset_info.json "
            "(no TFDS metadata is written for gzip shards, nor for split names TFDS cannot "
            "parse; a dataset made before it has none)"))
    if not parts:
        return Snippet("TFDS", "import tensorflow_datasets as tfds\n\n"
                       f"builder = tfds.builder_from_directory({path!r})\n"
                       "ds = builder.as_dataset(split=SPLIT)\nprint(builder.info)")
    folders = [path] + [f"{path}/{part_path}" for part_path, _ in parts]
    listed = "".join(f"\n    {folder!r}," for folder in folders)
    return Snippet("TFDS", "import tensorflow_datasets as tfds\n\n"
                   f"builder = tfds.builder_from_directories([{listed}\n])  # every part's records\n"
                   "ds = builder.as_dataset(split=SPLIT)\nprint(builder.info)")


def loading_snippets(location: str, manifest: dict, parts: list, tfds_folders: dict) -> list[Snippet]:
    """The snippets for tf.data, TFDS, PyTorch and JAX of the dataset at ``location``.

    Args:
      location: the dataset as given (shown by ``shown_path``).
      manifest: its root manifest.
      parts: ``[(part path, its manifest or None)]``.
      tfds_folders: per folder (``''`` for the dataset's, then each part's path),
        whether it holds ``dataset_info.json``.
    """
    path = shown_path(location.rstrip("/") or location)
    splits = list(manifest["splits"])
    split = repr("train" if "train" in splits or not splits else splits[0])
    spec = manifest.get("features") or {}
    names = manifest.get("feature_names")
    image_key = output_feature_name(names, "image/encoded")
    label_key = output_feature_name(names, "image/class/label")
    first = repr(image_key if image_key in spec else next(iter(spec), "feature"))
    second = repr(label_key if label_key in spec else next(iter(list(spec)[1:]), "feature"))
    images = ", decode_images=True" if image_key in spec else ""
    sequences = bool(manifest.get("sequence_features"))
    source = (f"source = beam_tfrecords.DataSource({path!r}, {split}{images})\n")
    if sequences:
        refused = ("left out: it holds SequenceExample records (--sequence_key), which "
                   "beam_tfrecords.DataSource and tf_dataset refuse; parse them with "
                   "tf.io.parse_single_sequence_example")
        tf_data = Snippet("tf.data", reason=refused)
    elif not spec:
        refused = "left out: the manifest has no feature spec"
        tf_data = Snippet("tf.data", reason=refused)
    else:
        refused = ("left out: its shards are gzip-compressed, which beam_tfrecords.DataSource "
                   "refuses (use the tf.data snippet)") if _gzip(manifest, parts) else ""
        tf_data = Snippet("tf.data", "import beam_tfrecords\n\n"
                          f"ds = beam_tfrecords.tf_dataset({path!r}, {split}{images})\n"
                          f"for record in ds.take(1):\n    print(record[{first}])")
    tfds = _tfds(path, parts, tfds_folders)
    tfds = dataclasses.replace(tfds, code=tfds.code.replace("SPLIT", split))
    if refused:
        return [tf_data, tfds, Snippet("PyTorch", reason=refused), Snippet("JAX (Grain)", reason=refused)]
    return [tf_data, tfds,
            Snippet("PyTorch", "import beam_tfrecords\nfrom torch.utils.data import DataLoader\n\n"
                    + source + "loader = DataLoader(source, batch_size=32, shuffle=True, "
                    "num_workers=4, collate_fn=list)\nfor batch in loader:\n"
                    f"    print(len(batch), batch[0][{first}])\n    break"),
            Snippet("JAX (Grain)", "import beam_tfrecords\nimport grain.python as grain\n"
                    "import numpy as np\n\n" + source
                    + "ds = (grain.MapDataset.source(source).shuffle(seed=0)\n"
                    f"      .map(lambda r: (np.asarray(r[{first}]), np.asarray(r[{second}]))))\n"
                    "print(len(source), ds[0])")]
