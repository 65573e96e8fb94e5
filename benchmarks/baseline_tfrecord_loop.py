"""Single-process baseline: a plain Python loop over the ``tfrecord`` package.

What someone writes who needs TFRecords without TensorFlow and without Beam:
one process, one loop, ``tfrecord.TFRecordWriter(path).write({name: (value,
"byte"|"int"|"float")})`` per record, and a new shard file once the current
one has reached ``SHARD_BYTES``.

    python benchmarks/baseline_tfrecord_loop.py --input DIR|FILE.csv --output DIR

Images (``--input`` a folder): the files with an image extension, listed with
``os.walk`` in sorted order, each read whole and written as one Example with
the features our converter and the naive Beam baseline write: ``image/encoded``
(the file's bytes), ``image/format``, ``image/height``, ``image/width`` and
``image/channels`` (from Pillow's header parse: ``Image.open`` reads the
header, it does not decode the pixels), ``image/class/label`` and
``image/class/text``, ``image/filename`` (relative to the input) and
``image/key/sha256``. Labels follow ``baseline_images.py``: the CIFAR layout
(``labels.txt`` plus ``<split>/<ID>_<CLASS>.png``) or one folder per class.

Table (``--input`` a ``.csv`` file): the file is parsed with ``csv.reader``
(which, unlike reading line by line, keeps quoted newlines inside their field)
and each row becomes an Example with the columns of ``datasets_csv.py``
hard-coded, typed as in ``baseline_csv.py``; a row that does not convert is
dropped and counted.

What it does not do, unlike our converter: decode or check any image (a
truncated or corrupt file is written as is), split, shuffle, balance shard
sizes (the last shard is whatever is left), dead-letter bad inputs (it skips
bad rows with a count, and a bad image header stops the run), read back or
checksum what it wrote, write a manifest, or use more than one core. Its
Examples are not serialized deterministically (``tfrecord`` does not ask for
it), so shard bytes may differ between runs even for the same records.

At the end it prints ``records: N; shards: M; dropped: D`` on stdout.
"""

import argparse
import csv
import hashlib
import os

import tfrecord
from PIL import Image

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
SHARD_BYTES = 150e6  # The same target as the naive Beam baselines.
FLAGS = {"True": 1, "False": 0}


class ShardedWriter:
    """Writes records through ``tfrecord.TFRecordWriter``, rolling to a new file
    ``data-NNNNN.tfrecord`` once the current one holds ``SHARD_BYTES`` or more."""

    def __init__(self, output):
        self.output = output
        self.shards = 0
        self.records = 0
        self._writer = None

    def write(self, datum):
        """Writes one Example given as ``{name: (value, "byte"|"int"|"float")}``."""
        if self._writer is None:
            path = os.path.join(self.output, f"data-{self.shards:05d}.tfrecord")
            self._writer = tfrecord.TFRecordWriter(path)
            self.shards += 1
        self._writer.write(datum)
        self.records += 1
        if self._writer.file.tell() >= SHARD_BYTES:
            self.close()

    def close(self):
        """Closes the current shard, if any."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _image_paths(root):
    """Sorted paths of the image files under ``root``."""
    paths = []
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        paths += [os.path.join(folder, n) for n in sorted(names)
                  if n.lower().endswith(IMAGE_EXTENSIONS)]
    return paths


def convert_images(root, writer):
    """Writes one Example per image file under ``root``; returns 0 (none dropped)."""
    paths = _image_paths(root)
    labels_path = os.path.join(root, "labels.txt")
    cifar_layout = os.path.exists(labels_path)
    if cifar_layout:
        with open(labels_path) as f:
            class_names = f.read().split()
    else:
        class_names = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
    label_of = {name: i for i, name in enumerate(class_names)}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        with Image.open(path) as img:  # Header only: no pixel decode.
            width, height = img.size
            image_format = img.format.lower()
            channels = len(img.getbands())
        if cifar_layout:
            text = os.path.splitext(os.path.basename(path))[0].split("_", 1)[1]
        else:
            text = os.path.basename(os.path.dirname(path))
        writer.write({
            "image/encoded": (data, "byte"),
            "image/format": (image_format.encode(), "byte"),
            "image/height": (height, "int"),
            "image/width": (width, "int"),
            "image/channels": (channels, "int"),
            "image/class/label": (label_of[text], "int"),
            "image/class/text": (text.encode(), "byte"),
            "image/filename": (os.path.relpath(path, root).encode(), "byte"),
            "image/key/sha256": (hashlib.sha256(data).hexdigest().encode(), "byte"),
        })
    return 0


def convert_table(path, writer):
    """Writes one Example per CSV row; returns the number of rows dropped."""
    dropped = 0
    with open(path, newline="") as f:
        rows = csv.reader(f)
        next(rows)  # Header.
        for fields in rows:
            try:
                flag, count, animal, score, comment, maybe, ids = fields
                datum = {
                    "flag": (FLAGS[flag], "int"),
                    "count": (int(count), "int"),
                    "animal": (animal.encode(), "byte"),
                    "score": (float(score), "float"),
                    "comment": (comment.encode(), "byte"),
                    "maybe": (float(maybe) if maybe else 0.0, "float"),
                    "ids": ([int(i) for i in ids.split(";")] if ids else [], "int"),
                }
            except (ValueError, KeyError):
                dropped += 1
                continue
            writer.write(datum)
    return dropped


def main(argv=None):
    """Parses the command line, converts, and prints the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", required=True, help="folder of images or a .csv file")
    parser.add_argument("--output", required=True, help="folder for the shards")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    writer = ShardedWriter(args.output)
    try:
        if os.path.isdir(args.input):
            dropped = convert_images(args.input.rstrip("/"), writer)
        else:
            dropped = convert_table(args.input, writer)
    finally:
        writer.close()
    print(f"records: {writer.records}; shards: {writer.shards}; dropped: {dropped}",
          flush=True)


if __name__ == "__main__":
    main()
