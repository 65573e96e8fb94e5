"""Naive Beam baseline: images to tf.train.Example records in fixed TFRecord shards.

What a competent engineer writes without tuning anything: match every file,
read each one whole, build an Example, and let ``WriteToTFRecord`` spread the
records over ``round(input bytes / 150 MB)`` shards.

    python benchmarks/baseline_images.py --input DIR --output DIR [beam flags]

Labels: if ``DIR/labels.txt`` exists the set has the CIFAR layout
(``<split>/<ID>_<CLASS>.png``) and the label is the line number of CLASS in
``labels.txt``; otherwise files sit in ``DIR/<class>/`` and the label is the
index of the folder name among the sorted class folders.
"""

import argparse
import hashlib
import io
import posixpath

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from PIL import Image

from beam_tfrecords.schemas.proto import example_pb2

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".gif", ".bmp", ".webp")
SHARD_BYTES = 150e6


def is_image(metadata):
    """Tells whether a matched file is an image, by its extension."""
    return metadata.path.lower().endswith(IMAGE_EXTENSIONS)


def class_of(path, cifar_layout):
    """Returns the class name of an image path (from its name or its folder)."""
    if cifar_layout:
        return posixpath.splitext(posixpath.basename(path))[0].split("_", 1)[1]
    return posixpath.basename(posixpath.dirname(path))


def encode(readable_file, root, class_names, cifar_layout):
    """Builds the serialized Example of one image file.

    Args:
        readable_file: A ``fileio.ReadableFile``.
        root: Input folder; ``image/filename`` is the path relative to it.
        class_names: Class names in label order.
        cifar_layout: Whether classes come from file names (CIFAR layout).

    Returns:
        The Example, serialized deterministically.
    """
    path = readable_file.metadata.path
    data = readable_file.read()
    with Image.open(io.BytesIO(data)) as img:
        width, height = img.size
        image_format = img.format.lower()
        channels = len(img.getbands())
    text = class_of(path, cifar_layout)

    def feature(values):
        if isinstance(values[0], bytes):
            return example_pb2.Feature(bytes_list=example_pb2.BytesList(value=values))
        return example_pb2.Feature(int64_list=example_pb2.Int64List(value=values))

    features = {
        "image/encoded": feature([data]),
        "image/format": feature([image_format.encode()]),
        "image/height": feature([height]),
        "image/width": feature([width]),
        "image/channels": feature([channels]),
        "image/class/label": feature([class_names.index(text)]),
        "image/class/text": feature([text.encode()]),
        "image/filename": feature([posixpath.relpath(path, root).encode()]),
        "image/key/sha256": feature([hashlib.sha256(data).hexdigest().encode()]),
    }
    example = example_pb2.Example(features=example_pb2.Features(feature=features))
    return example.SerializeToString(deterministic=True)


def main(argv=None):
    """Parses the command line and runs the pipeline to completion."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--input", required=True, help="folder of images")
    parser.add_argument("--output", required=True, help="folder for the shards")
    args, beam_args = parser.parse_known_args(argv)

    root = args.input.rstrip("/")
    pattern = posixpath.join(root, "**")
    images = [m for m in FileSystems.match([pattern])[0].metadata_list if is_image(m)]
    labels_path = posixpath.join(root, "labels.txt")
    cifar_layout = FileSystems.exists(labels_path)
    if cifar_layout:
        with FileSystems.open(labels_path) as f:
            class_names = f.read().decode().split()
    else:
        class_names = sorted({class_of(m.path, False) for m in images})
    num_shards = max(1, round(sum(m.size_in_bytes for m in images) / SHARD_BYTES))

    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        _ = (pipeline
             | fileio.MatchFiles(pattern)
             | beam.Filter(is_image)
             | fileio.ReadMatches()
             | beam.Map(encode, root, class_names, cifar_layout)
             | beam.io.WriteToTFRecord(posixpath.join(args.output, "data"),
                                       file_name_suffix=".tfrecord",
                                       num_shards=num_shards))


if __name__ == "__main__":
    main()
