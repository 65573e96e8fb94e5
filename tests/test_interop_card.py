"""The dataset card's "Loading it" snippets run as pasted with TensorFlow and TFDS
(issue 22, item 5): on an ``--incremental`` dataset, the TFDS snippet
(``tfds.builder_from_directories`` over the folder and its part) and the tf.data one
read every record of the split, the part's included."""

from __future__ import annotations

import html
import re
import shutil

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.pipeline import convert
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.schemas.config import ConvertConfig

pytestmark = pytest.mark.interop

tfds = pytest.importorskip("tensorflow_datasets")


def test_card_snippets_read_every_part(tmp_path, monkeypatch):
    source, out = tmp_path / "in", tmp_path / "out"
    make_class_folder_sample(str(source), per_class=2, splits=None, classes=("a", "b"),
                             size_range=(32, 40))
    config = ConvertConfig(input=str(source), output=str(out), encode_processes=0, incremental=True)
    assert convert(config).ok
    shutil.copy(source / "a" / "a_0000.jpg", source / "a" / "later.jpg")
    assert convert(config).ok
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", "out", "--records", "0", "--html", "card.html"]) == 0
    page = (tmp_path / "card.html").read_text()
    snippets = dict(re.findall(r"<h3>([^<]*)</h3><pre><code>(.*?)</code></pre>", page, re.S))
    counts = {}
    for reader in ("TFDS", "tf.data"):
        scope: dict = {"print": lambda *args, **kwargs: None}
        exec(html.unescape(snippets[reader]), scope)  # noqa: S102 - the card's own snippet.
        counts[reader] = sum(1 for _ in scope["ds"])
    assert "builder_from_directories([\n    'out',\n    'out/part-00001'," in html.unescape(snippets["TFDS"])
    assert counts == {"TFDS": 5, "tf.data": 5}  # 4 of the first run, 1 of the part.
