"""The tutorials this product grew from read our output with their own parsing code.

Issue 22, item 6: ``--feature_names tutorial`` and ``--feature_names cifar_notebook``
write the keys TensorFlow's TFRecord tutorial and a CIFAR-10 notebook read (seeds
``000_*`` and ``004_*`` in the shared folder). Their parsing code is copied below as
the tutorials print it; only the TF1 names are ported to TF2 (``tf.FixedLenFeature``
-> ``tf.io.FixedLenFeature``, ``tf.parse_single_example`` ->
``tf.io.parse_single_example``). The notebook's source images are pjreddie.com's
``cifar.tgz``, ``<id>_<class>.png`` files: PNG bytes it decodes with
``tf.image.decode_jpeg``, which TensorFlow documents as also decoding PNG. Our CIFAR
sample is that layout (PNG); a third conversion stores JPEG (``--image_format
jpeg``), so the notebook's decode_jpeg is also run over real JPEG bytes.

TensorFlow is imported once, by this module (the ``interop`` tier; the ``test`` extra).
"""

import hashlib
import io
import os

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_cifar_sample
from tests.conftest import load_manifest, read_dataset

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.interop


# --- TensorFlow's TFRecord tutorial (seed 000), as printed ----------------------------

# Создадим словарь описывающий свойства.
image_feature_description = {
    'height': tf.io.FixedLenFeature([], tf.int64),
    'width': tf.io.FixedLenFeature([], tf.int64),
    'depth': tf.io.FixedLenFeature([], tf.int64),
    'label': tf.io.FixedLenFeature([], tf.int64),
    'image_raw': tf.io.FixedLenFeature([], tf.string),
}

def _parse_image_function(example_proto):
  # Распарсим входной tf.Example proto используя вышесозданный словарь.
  return tf.io.parse_single_example(example_proto, image_feature_description)


# --- The CIFAR-10 notebook (seed 004), TF1 names ported ------------------------------

def parser(serialized_example):
  """
  Função para decodificar um exemplo do TFRecord de acordo com
  o tipo de cada uma das features
  """

  # Cria um dict que dita o shape, type e dafault de cada feature
  features_dict = {
          'img': tf.io.FixedLenFeature([], tf.string),
          'label': tf.io.FixedLenFeature([], tf.int64),
      }

  # Deserealiza o exemplo
  features = tf.io.parse_single_example(
      serialized_example,
      features=features_dict)

  # Decodifica a imagem de bytes para int8 e determina o tamanho para 32X32X3
  image  = tf.image.decode_jpeg(features['img'], channels=3)
  image.set_shape([32 , 32,3])

  # Assegura que as labels estão no tipo int32
  label = tf.cast(features['label'], tf.int32)

  return image, label


# --- our conversions ---------------------------------------------------------------

CONVERSIONS = {
    "tutorial": ("--feature_names", "tutorial"),
    "cifar_notebook": ("--feature_names", "cifar_notebook"),
    "cifar_notebook_jpeg": ("--feature_names", "cifar_notebook", "--image_format", "jpeg"),
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A CIFAR sample (``<split>/<id>_<class>.png``, labels.txt) converted once per
    entry of ``CONVERSIONS`` through the CLI's main(): ``{name: output folder}``."""
    work = tmp_path_factory.mktemp("tutorials")
    root = str(work / "cifar")
    make_cifar_sample(root, {"train": 6, "test": 4})
    outputs = {}
    for name, flags in CONVERSIONS.items():
        out = str(work / name)
        assert main(["convert", "--input", root, "--output", out, "--encode_processes", "0",
                     *flags]) == 0
        outputs[name] = out
    return root, outputs


def _shards(out: str, split: str) -> list[str]:
    return [os.path.join(out, s["path"]) for s in load_manifest(out)["splits"][split]["shards"]]


def _expected(root: str, out: str, split: str) -> list[tuple[int, bytes, str]]:
    """``(label, stored image bytes, source file)`` of a split's records, in order, as
    protobuf reads them, the label from the file's name (``<id>_<class>.png``)."""
    vocabulary = load_manifest(out)["labels"]["vocabulary"]
    records = [r for name, rs in read_dataset(out).items() if name.startswith(split + "-") for r in rs]
    expected = []
    for record in records:
        filename = record["image/filename"][0].decode()
        label = vocabulary.index(filename.rsplit("_", 1)[1].rsplit(".", 1)[0])
        image = record.get("image_raw", record.get("img"))[0]
        expected.append((label, image, os.path.join(root, filename)))
    return expected


def test_tutorial_reads_the_tutorial_preset(converted):
    root, outputs = converted
    out = outputs["tutorial"]
    raw_image_dataset = tf.data.TFRecordDataset(_shards(out, "train"))
    parsed_image_dataset = raw_image_dataset.map(_parse_image_function)
    parsed = list(parsed_image_dataset)
    expected = _expected(root, out, "train")
    assert len(parsed) == len(expected) == load_manifest(out)["splits"]["train"]["records"] == 6
    for image_features, (label, _, source) in zip(parsed, expected):
        with open(source, "rb") as f:
            data = f.read()
        image_raw = image_features['image_raw'].numpy()
        assert hashlib.sha256(image_raw).digest() == hashlib.sha256(data).digest()  # The file's bytes.
        assert image_features["label"].numpy() == label
        height, width, depth = (int(image_features[k].numpy()) for k in ("height", "width", "depth"))
        assert (height, width, depth) == (32, 32, 3) == tuple(tf.image.decode_jpeg(image_raw).shape)


@pytest.mark.parametrize("name", ["cifar_notebook", "cifar_notebook_jpeg"])
def test_cifar_notebook_reads_its_preset(converted, name):
    root, outputs = converted
    out = outputs[name]
    for split in ("train", "test"):
        dataset = tf.data.TFRecordDataset(_shards(out, split)).map(parser)
        read = [(image.numpy(), int(label.numpy())) for image, label in dataset]
        expected = _expected(root, out, split)
        assert len(read) == len(expected) == load_manifest(out)["splits"][split]["records"]
        for (image, label), (want_label, stored, _) in zip(read, expected):
            assert label == want_label
            assert image.shape == (32, 32, 3) and image.dtype == np.uint8
            pixels = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))
            if name.endswith("_jpeg"):  # Real JPEG bytes; two JPEG decoders may differ by a step.
                assert stored[:3] == b"\xff\xd8\xff"
                assert np.abs(image.astype(int) - pixels).max() <= 8
            else:  # PNG, as the notebook's own source: decode_jpeg decodes it exactly.
                assert stored[:8] == b"\x89PNG\r\n\x1a\n"
                assert np.array_equal(image, pixels)


def test_tutorial_code_fails_on_other_names(converted):
    """The check can fail: the tutorial's parser refuses the notebook's keys."""
    _, outputs = converted
    dataset = tf.data.TFRecordDataset(_shards(outputs["cifar_notebook"], "train"))
    with pytest.raises(tf.errors.InvalidArgumentError, match="is required but could not be found"):
        list(dataset.map(_parse_image_function))
