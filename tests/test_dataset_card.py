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
import html as html_lib
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

from beam_tfrecords.card_charts import bar_chart, text
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


def _snippets(html: str) -> dict:
    """The "Loading it" section: per reader, its code (unescaped) or why it is left out."""
    loading = _section(html, "loading")
    return {name: html_lib.unescape(body) for name, body in
            re.findall(r"<h3>([^<]*)</h3>(?:<pre><code>|<p class=\"none\">)(.*?)</(?:code|p)>", loading, re.S)}


def _run_source_line(snippet: str, where: Path, monkeypatch):
    """Runs the snippet's ``DataSource(...)`` line as pasted, from ``where``; the source."""
    monkeypatch.chdir(where)
    line = next(line for line in snippet.splitlines() if "DataSource(" in line)
    scope: dict = {}
    exec("import beam_tfrecords\n" + line, scope)  # noqa: S102 - the card's own snippet.
    return scope["source"]


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
    out = "&#x27;out&#x27;"  # By its folder name (the card names no folder of this machine).
    assert str(image_card["work"]) not in html and "output out" in made
    assert f"beam_tfrecords.tf_dataset({out}, &#x27;train&#x27;, decode_images=True)" in loading
    assert f"tfds.builder_from_directory({out})" in loading
    assert f"beam_tfrecords.DataSource({out}, &#x27;train&#x27;, decode_images=True)" in loading
    assert "grain.MapDataset.source(source)" in loading


@pytest.mark.e2e
def test_image_card_snippets_run_as_pasted(image_card, monkeypatch):
    snippets = _snippets(image_card["html"])
    assert list(snippets) == ["tf.data", "TFDS", "PyTorch", "JAX (Grain)"]
    source = _run_source_line(snippets["PyTorch"], image_card["work"], monkeypatch)
    record = source[0]
    assert len(source) == 7 and record["image/encoded"].shape == (
        int(record["image/height"][()]), int(record["image/width"][()]), 3)


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
    assert main(["inspect", out, "--html", "", "--compare_to", out]) == 2  # An unset variable.
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--html is empty: name the card's file" in err
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
def test_table_card(tmp_path, run_convert, monkeypatch):
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
    snippets = _snippets(html)
    assert "decode_images" not in "".join(snippets.values())  # No image feature to decode.
    source = _run_source_line(snippets["JAX (Grain)"], tmp_path, monkeypatch)
    assert len(source) == manifest["splits"]["train"]["records"] and "age" in source[0]


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
    assert _section(html, "samples").count("<img ") == 6  # The part's 2 records too.
    tfds = _snippets(html)["TFDS"]
    assert "tfds.builder_from_directories([\n    'out',\n    'out/part-00001',\n])" in tfds


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


def _with(facts, **changes):
    """``facts`` with its manifest's keys changed (a deep copy)."""
    manifest = copy.deepcopy(facts.manifest)
    manifest.update(changes)
    return manifest


@pytest.mark.unit
def test_snippets_left_out_where_their_reader_refuses(image_card):
    """Gzip shards: no DataSource, no TFDS (no dataset_info.json); sequences: no
    reader of ours; no dataset_info.json: no TFDS, saying why."""
    facts = gather_facts(str(image_card["out"]), per_split=0)
    assert facts.tfds_folders == {"": True}
    gz = _with(facts)
    for info in gz["splits"].values():
        for shard in info["shards"]:
            shard["path"] += ".gz"
    snippets = _snippets(card_html(type(facts)(location="out", manifest=gz, tfds_folders={"": False})))
    assert "tf_dataset('out', 'train', decode_images=True)" in snippets["tf.data"]
    assert snippets["TFDS"].startswith("left out: out holds no dataset_info.json")
    assert all("gzip-compressed, which beam_tfrecords.DataSource refuses" in snippets[r]
               for r in ("PyTorch", "JAX (Grain)"))
    sequences = _with(facts, sequence_features={"x": {"dtype": "float32"}})
    snippets = _snippets(card_html(type(facts)(location="out", manifest=sequences, tfds_folders={"": True})))
    assert "builder_from_directory('out')" in snippets["TFDS"]
    assert all("SequenceExample records" in snippets[r] for r in ("tf.data", "PyTorch", "JAX (Grain)"))


@pytest.mark.unit
def test_bar_labels_stay_whole_distinct_and_escaped():
    prefix = "a_very_long_class_name_shared_by_many_classes_"
    labels = [prefix + "cat", prefix + "dog", '"><img src=x onerror=alert(1)>' + "x" * 40]
    svg = bar_chart([(label, i + 1) for i, label in enumerate(labels)], "classes")
    shown = re.findall(r"</title>([^<]*)</text>", svg)
    assert len(set(shown)) == 3 and shown[0].endswith("_cat") and shown[1].endswith("_dog")
    assert all(len(html_lib.unescape(s)) <= 40 for s in shown)
    titles = [html_lib.unescape(t) for t in re.findall(r"<text[^>]*><title>([^<]*)</title>", svg)]
    assert titles == labels and "<img" not in svg.replace("<title>", "")
    anchor = float(re.search(r'<text x="([0-9.]+)"[^>]*text-anchor="end"', svg)[1])
    assert anchor >= 7 * 40  # Room for the longest label shown: none starts left of the edge.


@pytest.mark.unit
def test_duplicates_within_a_split_counted_in_groups_across_splits(image_card):
    facts = gather_facts(str(image_card["out"]), per_split=0)
    duplicates = copy.deepcopy(facts.manifest["duplicates"])
    duplicates["across_splits"]["list"][0]["files"].append({"split": "train", "filename": "train/x.jpg"})
    html = card_html(type(facts)(location="out", manifest=_with(facts, duplicates=duplicates)))
    assert ("1 repeat within a split (1 of them also sit in another split)"
            in _visible(_section(html, "duplicates")))
    assert "0 repeat within a split" in _visible(_section(card_html(facts), "duplicates"))


@pytest.mark.unit
def test_boxless_annotations_and_multi_label_captions(image_card):
    """Semantic masks are not an empty detection set; a caption names every label,
    past three as "+N more"."""
    facts = gather_facts(str(image_card["out"]), per_split=1)
    annotations = {"layout": "masks", "images_without_objects": 0,
                   "label_map": {"items": [{"id": 1, "name": "road"}, {"id": 2, "name": "sky"}]}}
    manifest = _with(facts, annotations=annotations)
    for info in manifest["splits"].values():
        info["statistics"]["annotations"] = {"objects": 0, "images": 3, "images_without_objects": 3}
    split, record = facts.samples[0]
    record = dict(record, **{"image/object/class/label": [], "image/class/text": [b"cat", b"dog", b"bird", b"fox", b"owl"],
                             "image/class/label": [2, 3, 4, 5, 6]})
    html = card_html(type(facts)(location="out", manifest=manifest, samples=[(split, record)]))
    classes = _visible(_section(html, "classes"))
    assert "semantic masks" in classes and "2 classes: road, sky" in classes
    assert "objects on 3 images" not in classes and "Box areas (COCO ranges)" not in classes
    samples = _visible(_section(html, "samples"))
    assert "cat, dog, bird +2 more (labels 2, 3, 4 +2 more)" in samples and "object" not in samples
