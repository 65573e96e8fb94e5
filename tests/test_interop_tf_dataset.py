"""beam_tfrecords.tf_dataset against DataSource, record by record, with the real TensorFlow
(the test extra): an image dataset (images decoded too) and a table dataset."""

from __future__ import annotations

import numpy as np
import pytest

from beam_tfrecords import DataSource, tf_dataset
from tests.test_data_source import as_lists, make_image_dataset, make_table_dataset
from tests.test_data_source_fixes import make_cmyk_dataset

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    base = tmp_path_factory.mktemp("interop")
    make_image_dataset(base / "images", base / "images_out")
    make_table_dataset(base / "table", base / "table_out")
    make_cmyk_dataset(base / "cmyk", base / "cmyk_out")
    return {"images": str(base / "images_out"), "table": str(base / "table_out"),
            "cmyk": str(base / "cmyk_out")}


def _numpy(record: dict) -> dict:
    return {name: value.numpy() for name, value in record.items()}


def _lists(record: dict) -> dict:
    return {name: np.asarray(value).reshape(-1).tolist() for name, value in record.items()}


@pytest.mark.parametrize("kind", ["images", "table"])
def test_tf_dataset_equals_data_source_record_by_record(datasets, kind):
    source = DataSource(datasets[kind], "train")
    parsed = [_numpy(r) for r in tf_dataset(datasets[kind], "train")]
    assert len(parsed) == len(source) > 0
    for i, record in enumerate(parsed):
        assert _lists(record) == as_lists(source[i]), i
        for name, spec in source.feature_spec.items():  # The spec's shapes, as TensorFlow parses them.
            if None not in spec["shape"]:
                assert list(np.shape(record[name])) == spec["shape"], name


def test_decoded_images_agree(datasets):
    source = DataSource(datasets["images"], "train", decode_images=True)
    key = "image/encoded"
    formats = set()
    for i, record in enumerate(tf_dataset(datasets["images"], "train", decode_images=True)):
        ours, theirs = source[i][key], record[key].numpy()
        assert ours.shape == theirs.shape, i
        image_format = record["image/format"].numpy()
        formats.add(image_format)
        if ours.dtype == np.uint16:  # TensorFlow's decode_image gives uint8 (scaled) for 16 bits.
            assert theirs.dtype == np.uint8
        elif image_format == b"png":
            assert np.array_equal(ours, theirs), i
        else:  # Two JPEG decoders (Pillow's, TensorFlow's): chroma upsampling a few levels apart.
            apart = np.abs(ours.astype(int) - theirs)
            assert apart.mean() < 2 and apart.max() <= 8, (i, apart.mean(), apart.max())
    assert formats == {b"jpeg", b"png"}


def test_variable_length_columns_batch_with_ragged_batch_not_batch(datasets):
    """README: ``.batch()`` cannot stack a table's variable-length columns; ``ragged_batch``
    (or ``padded_batch``) does."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    table = tf_dataset(datasets["table"], "train")
    with pytest.raises(tf.errors.InvalidArgumentError, match="Cannot add tensor to the batch"):
        next(iter(table.batch(4)))
    batch = next(iter(table.ragged_batch(4)))
    source = DataSource(datasets["table"], "train")
    assert isinstance(batch["ids"], tf.RaggedTensor) and batch["id"].shape == (4,)
    assert batch["ids"].to_list() == [source[i]["ids"].tolist() for i in range(4)]


def test_a_cmyk_jpeg_decodes_to_the_records_channels_in_both_readers(datasets):
    """``--image_bytes original`` keeps a CMYK JPEG; TensorFlow and Pillow both give RGB."""
    source = DataSource(datasets["cmyk"], "train", decode_images=True)
    for i, record in enumerate(tf_dataset(datasets["cmyk"], "train", decode_images=True)):
        theirs, ours = record["image/encoded"].numpy(), source[i]["image/encoded"]
        stated = (record["image/height"].numpy(), record["image/width"].numpy(), record["image/channels"].numpy())
        assert theirs.shape == ours.shape == stated and stated[2] == 3, i
        assert np.abs(ours.astype(int) - theirs).mean() < 4, i  # Two JPEG decoders.
