"""``inspect PATH --html FILE``: the dataset card (issue 22, item 5).

One image dataset is converted for the module (a class named ``<script>``, a broken
image named like markup, a test image that is also a training image), its card
written once through the real CLI; the tests read the card's HTML (every section,
the dataset's own figures, escaping, no reference out of the page), render it in
headless Chromium when it is installed, and check where a card may not go. A table
dataset, an annotated one (boxes drawn on the thumbnails), an incremental one and a
manifest without statistics get a card each in-process.
"""

from __future__ import annotations

import base64
import copy
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.card_charts import text
from beam_tfrecords.cli import main
from beam_tfrecords.dataset_card import CARD_MARKER, card_html, card_refusal, gather_facts
from beam_tfrecords.samples import make_class_folder_sample
from beam_tfrecords.sheet_drawing import class_colour
from tests.harness.annotated_sets import make_coco
from tests.harness.attack_table import cli

SECTIONS = ("splits", "classes", "features", "duplicates", "dead-letters", "drift", "samples",
            "made", "loading")
HOSTILE_CLASS = "<script>"
HOSTILE_FILE = "<img src=x onerror=alert(1)>.jpg"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _convert(run_convert, source: Path, out: Path, **options) -> dict:
    result = run_convert(str(source), str(out), encode_processes=0, **options)
    assert result.ok, result.report.status
    return json.loads((out / "manifest.json").read_text())


@pytest.fixture(scope="module")
def image_card(tmp_path_factory):
    """An image dataset and its card, written by ``python -m beam_tfrecords inspect``."""
    from beam_tfrecords.pipeline import convert  # The module fixture cannot use run_convert.
    from beam_tfrecords.schemas.config import ConvertConfig

    work = tmp_path_factory.mktemp("card")
    source = work / "in"
    make_class_folder_sample(str(source), per_class=3, splits=("train", "test"),
                             classes=("cat", HOSTILE_CLASS), size_range=(40, 64))
    (source / "train" / "cat" / HOSTILE_FILE).write_bytes(b"not a picture\n")
    shutil.copy(source / "test" / "cat" / "cat_0000.jpg", source / "train" / "cat" / "copy.jpg")
    out = work / "out"
    result = convert(ConvertConfig(input=str(source), output=str(out), encode_processes=0,
                                   max_bad_fraction=0.5))
    assert result.ok
    run = cli(work, "inspect", str(out), "--records", "0", "--html", "card.html",
              "--compare_to", str(out))
    assert run.exit == 0, run.stderr
    return {"work": work, "out": out, "run": run, "html": (work / "card.html").read_text(),
            "manifest": json.loads((out / "manifest.json").read_text())}


def _section(html: str, key: str) -> str:
    start = html.index(f'<section id="{key}">')
    return html[start:html.index("</section>", start)]


def _visible(fragment: str) -> str:
    """The text of a piece of the page, tags dropped, entities kept."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", fragment))


@pytest.mark.e2e
def test_image_card_holds_every_section_with_the_datasets_figures(image_card):
    html, manifest = image_card["html"], image_card["manifest"]
    assert image_card["run"].stdout.splitlines()[-1].startswith("dataset card: card.html (")
    assert "drift passed" in image_card["run"].stdout
    assert html.count("<section id=") == len(SECTIONS)
    splits = _visible(_section(html, "splits"))
    for split, info in manifest["splits"].items():
        assert f" {split} {info['records']} {info['num_shards']} " in splits
    assert {split: info["records"] for split, info in manifest["splits"].items()} == {"train": 7, "test": 6}
    classes = _section(html, "classes")
    assert "&lt;script&gt;" in classes and ">3</text>" in classes and ">4</text>" in classes
    features = _visible(_section(html, "features"))
    for name in manifest["features"]:
        assert f" {name} " in features
    quantiles = manifest["splits"]["train"]["statistics"]["images"]["width"]
    assert f"p0 {quantiles['p0']} · p5 {quantiles['p5']} · p50 {quantiles['p50']}" in features
    leak = _visible(_section(html, "duplicates"))
    assert "Leakage: 1 contents sit in more than one split" in leak
    assert "test: test/cat/cat_0000.jpg; train: train/cat/copy.jpg" in leak
    letters = _visible(_section(html, "dead-letters"))
    assert "1 bad inputs of 14" in letters and "not_an_image" in letters
    assert "train/cat/&lt;img src=x onerror=alert(1)&gt;.jpg" in letters
    drift = _visible(_section(html, "drift"))
    assert "by --compare_to: passed . 13 checks passed against" in drift
    assert " class_share train cat 0.5714 0.5714 0.1 passed " in drift
    samples = _section(html, "samples")
    assert samples.count("<img ") == 13 and samples.count('src="data:image/jpeg;base64,') == 13
    made = _visible(_section(html, "made"))
    for value in (manifest["created"], manifest["tool"]["version"], manifest["input"]["fingerprint"],
                  "max_bad_fraction 0.5"):
        assert value in made
    loading = _section(html, "loading")
    out = repr(str(image_card["out"])).replace("'", "&#x27;")
    assert f"beam_tfrecords.tf_dataset({out}, &#x27;train&#x27;, decode_images=True)" in loading
    assert f"tfds.builder_from_directory({out})" in loading
    assert f"beam_tfrecords.DataSource({out}, &#x27;train&#x27;, decode_images=True)" in loading
    assert "grain.MapDataset.source(source)" in loading


@pytest.mark.e2e
def test_image_card_escapes_everything_and_reaches_nothing(image_card):
    html = image_card["html"]
    assert CARD_MARKER in html[:400] and "default-src 'none'" in html[:600]
    assert "<script" not in html.lower() and "onerror=alert(1)>" not in html
    assert "http://" not in html and "https://" not in html
    assert all(src.startswith("data:image/") for src in re.findall(r'src="([^"]*)"', html))
    assert not re.search(r"\b(href|url\(|@import|srcset)", html)


@pytest.mark.unit
def test_text_escapes_markup_and_control_characters():
    assert text('<script>alert("x")</script>\x1b[31m') == (
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;\\x1b[31m")
    assert text("a" * 300, 10) == "aaaaaaa..."


@pytest.mark.e2e
def test_card_renders_in_headless_chromium(image_card):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium): the card "
                    "is not rendered in a browser here")
    work = image_card["work"]
    shot = work / "card.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", f"--user-data-dir={work / 'chromium'}", f"--screenshot={shot}",
                    "--window-size=1280,2400", (work / "card.html").as_uri()],
                   check=True, capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB"))
    assert pixels.shape == (2400, 1280, 3)
    colours = np.unique(pixels.reshape(-1, 3), axis=0)
    assert len(colours) > 500  # Text, charts and photos; a blank or error page has a few.
    bar = np.all(pixels == (0x4C, 0x72, 0xB0), axis=2).sum()
    assert bar > 2000  # The class bars, in the charts' colour.


@pytest.mark.e2e
def test_card_goes_only_where_it_may(image_card, capsys):
    work, out = image_card["work"], str(image_card["out"])
    notes = work / "notes.html"
    notes.write_bytes(b"<p>my notes</p>")
    assert main(["inspect", out, "--html", str(notes)]) == 2
    assert notes.read_bytes() == b"<p>my notes</p>"
    assert "is not a dataset card this command wrote" in capsys.readouterr().err
    inside = os.path.join(out, "card.html")
    assert main(["inspect", out, "--html", inside]) == 2
    assert not os.path.exists(inside) and "inside the dataset folder" in capsys.readouterr().err
    assert main(["inspect", out, "--html", str(work / "no" / "card.html")]) == 2
    assert main(["inspect", out, "--html", str(work / "c.html"), "--compare_to", str(work / "none")]) == 2
    assert "--compare_to:" in capsys.readouterr().err and not (work / "c.html").exists()
    assert main(["inspect", str(work / "missing"), "--html", str(work / "c.html")]) == 2
    assert "does not exist" in capsys.readouterr().err
    before = (work / "card.html").stat().st_mtime_ns
    assert main(["inspect", out, "--records", "0", "--html", str(work / "card.html")]) == 0
    assert (work / "card.html").stat().st_mtime_ns >= before  # Its own card: replaced.


@pytest.mark.unit
def test_card_refusal(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    assert "inside the dataset folder" in card_refusal(str(data / "x" / "c.html"), str(data))
    assert "is a folder" in card_refusal(str(tmp_path), str(data))
    assert card_refusal(str(tmp_path / "data2.html"), str(data)) == ""
    (tmp_path / "old.html").write_text(f"<!DOCTYPE html><html><head>{CARD_MARKER}")
    assert card_refusal(str(tmp_path / "old.html"), str(data)) == ""
    (tmp_path / "link.html").symlink_to(tmp_path / "nowhere.html")
    assert "is a symbolic link" in card_refusal(str(tmp_path / "link.html"), str(data))


@pytest.mark.unit
def test_card_without_statistics(image_card):
    facts = gather_facts(str(image_card["out"]), per_split=1)
    manifest = copy.deepcopy(facts.manifest)
    for info in manifest["splits"].values():
        del info["statistics"]
    del manifest["duplicates"]
    html = card_html(type(facts)(location=facts.location, manifest=manifest, samples=facts.samples))
    assert _visible(_section(html, "features")).count("No statistics in the manifest.") == 2
    assert "Not compared" in _section(html, "drift")


@pytest.mark.e2e
def test_table_card(tmp_path, run_convert):
    rows = ["age,city,split"] + [f"{'' if i % 4 == 0 else 20 + i},{'<b>' if i % 3 else 'Oslo'},"
                                 f"{'train' if i % 5 else 'test'}" for i in range(20)]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    manifest = _convert(run_convert, tmp_path / "t.csv", tmp_path / "out", split_column="split")
    assert main(["inspect", str(tmp_path / "out"), "--records", "0", "--html",
                 str(tmp_path / "card.html")]) == 0
    html = (tmp_path / "card.html").read_text()
    age = manifest["splits"]["train"]["statistics"]["features"]["age"]
    features = _visible(_section(html, "features"))
    assert f"age numeric {age['count']} {age['missing']} (" in features
    assert f"mean {age['mean']:.4g}" in features and f"{age['min']} {age['max']}" in features
    assert "&lt;b&gt; " in features and "<b>" not in _section(html, "samples").replace("<b>age", "")
    assert "Not checked" in _section(html, "duplicates") and "<img" not in html
    assert _visible(_section(html, "samples")).count(" test ") >= 4  # The split column's cells.


@pytest.mark.e2e
def test_annotated_card_draws_boxes(tmp_path, run_convert):
    made = make_coco(tmp_path / "coco")
    flags = dict(zip(made.flags[::2], made.flags[1::2]))
    _convert(run_convert, Path(flags["--input"]), tmp_path / "out",
             annotations=flags["--annotations"], instance_masks=True)
    assert main(["inspect", str(tmp_path / "out"), "--records", "0", "--html",
                 str(tmp_path / "card.html")]) == 0
    html = (tmp_path / "card.html").read_text()
    assert "6 objects on 4 images (1 without any)" in _visible(_section(html, "classes"))
    uris = re.findall(r'src="data:image/jpeg;base64,([^"]*)"', _section(html, "samples"))
    assert len(uris) == 4
    coloured = 0
    for uri in uris:
        with Image.open(io.BytesIO(base64.b64decode(uri))) as image:
            pixels = np.asarray(image.convert("RGB")).astype(int)
        coloured += any((np.abs(pixels - colour).sum(axis=2) < 60).sum() > 20 for colour in map(class_colour, (3, 7, 18)))
    assert coloured >= 2  # Boxes in their class colours (JPEG: near, not equal).


@pytest.mark.e2e
def test_incremental_card_counts_every_part(tmp_path, run_convert):
    source = tmp_path / "in"
    make_class_folder_sample(str(source), per_class=2, splits=None, classes=("a", "b"),
                             size_range=(32, 40))
    _convert(run_convert, source, tmp_path / "out", incremental=True)
    shutil.copy(source / "a" / "a_0000.jpg", source / "a" / "later.jpg")
    Image.new("RGB", (33, 35), (9, 99, 199)).save(source / "b" / "later.png")
    manifest = _convert(run_convert, source, tmp_path / "out", incremental=True)
    assert [p["records"] for p in manifest["parts"]] == [2]
    assert main(["inspect", str(tmp_path / "out"), "--records", "0", "--html",
                 str(tmp_path / "card.html")]) == 0
    html = (tmp_path / "card.html").read_text()
    splits = _visible(_section(html, "splits"))
    assert "1 incremental parts add to them" in splits and " part-00001 " in splits
    assert "In all: train 6 records in 2 shards" in splits
    classes = _section(html, "classes")
    assert classes.count(">3</text>") == 2  # 2 of each class, then 1 more of each.


@pytest.mark.unit
def test_card_follows_renamed_features(image_card):
    """With ``feature_names`` (``--feature_names``), thumbnails and snippets use the
    output keys the manifest names."""
    facts = gather_facts(str(image_card["out"]), per_split=2)
    renames = {"image/encoded": "img", "image/class/label": "label"}
    manifest = copy.deepcopy(facts.manifest)
    manifest["feature_names"] = renames
    manifest["features"] = {renames.get(k, k): v for k, v in manifest["features"].items()}
    samples = [(split, {renames.get(k, k): v for k, v in features.items()})
               for split, features in facts.samples]
    html = card_html(type(facts)(location=facts.location, manifest=manifest, samples=samples))
    assert _section(html, "samples").count('src="data:image/jpeg;base64,') == 4
    assert "r[&#x27;img&#x27;]), np.asarray(r[&#x27;label&#x27;])" in _section(html, "loading")
