"""``inspect PATH --html FILE``: the dataset card, one self-contained HTML page.

The page says what a dataset is, from what it publishes: ``manifest.json`` (splits,
shards, bytes, classes, statistics, duplicates, bad inputs, options, input
fingerprint), ``run_report.json``, the dead-letter files (a few letters per
reason, as they hold them) and the first records of each split (thumbnails, boxes
and masks drawn as the contact sheet draws them, ``beam_pipeline.sheet_drawing``).
With ``--compare_to``, its statistics are compared with another dataset's by the
drift gate's own rules (``transforms.quality.drift``). It ends with loading
snippets for tf.data, TFDS, PyTorch and JAX.

No network, ever: charts are inline SVG, thumbnails ``data:`` URIs, the style is
inline, and a Content-Security-Policy forbids every fetch. Everything taken from
the dataset is escaped (``card_charts.text``): a class named ``<script>`` shows as
text.

Where the card goes (``card_refusal``): never inside the dataset's folder (a
reader would take it for part of the dataset, and a later run of the converter
would leave it there describing data it replaced), and never over a file that is
not a card this command wrote (one that holds ``CARD_MARKER`` near its start).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import posixpath

from PIL import Image, UnidentifiedImageError

from beam_tfrecords.card_charts import (
    bar_chart,
    code,
    data_uri,
    figure,
    quantile_chart,
    range_chart,
    table,
    text,
)
from beam_tfrecords.card_snippets import loading_snippets, shown_path
from beam_tfrecords.inspect import MAX_RECORD_BYTES, read_manifest, sample_records, thumbnail
from beam_tfrecords.schemas.features import output_feature_name
from beam_tfrecords.schemas.manifest import REPORT_NAME, parse_manifest
from beam_tfrecords.sheet_drawing import annotate_thumbnail
from beam_tfrecords.transforms.io import files
from beam_tfrecords.transforms.quality.drift import DriftGate, baseline_of, compare, drift_manifest_path
from beam_tfrecords.verify import dataset_path, manifest_text, part_manifest

__all__ = ["CARD_MARKER", "CardFacts", "card_html", "card_refusal", "gather_facts", "write_card"]

CARD_MARKER = '<meta name="generator" content="beam-tfrecords dataset card">'
_LETTERS_PER_REASON = 3
_LETTER_LINES = 10_000  # Dead-letter lines read per file at most (each file is bounded too).
_LETTER_BYTES = 4 << 20
_TOP = 10
_TFDS_INFO = "dataset_info.json"
_LABELS_SHOWN = 3  # Labels of a multi-label record in a caption, then "+N more".
_TABLE_ROWS = 5
_BOXLESS = {"masks": "semantic masks (--masks): a class per pixel, one mask PNG per image",
            "multi_label": "several class labels per image"}  # Records of a table dataset shown per split.
_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1180px;color:#222;padding:0 16px}
h1{font-size:24px;margin-bottom:4px}h2{border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:32px}
h3{font-size:15px;margin:16px 0 6px}table{border-collapse:collapse;margin:6px 0 12px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}td.n{text-align:right}.none{color:#777;font-style:italic}
svg{font:11px system-ui,sans-serif;display:block;margin:4px 0}pre{background:#f6f8fa;padding:10px;
overflow-x:auto;border:1px solid #e1e4e8}.grid{display:flex;flex-wrap:wrap;gap:8px}
figure{margin:0;width:140px;font-size:11px;word-break:break-all}figure img{display:block;
max-width:136px;max-height:136px;border:1px solid #ccc}.warn{color:#b00020;font-weight:bold}
.ok{color:#137333;font-weight:bold}.kv{columns:3 300px;column-gap:24px}
.kv div{break-inside:avoid;padding:1px 0;word-break:break-all}.kv b{color:#444}.sub{color:#555}.feat{display:flex;gap:24px;flex-wrap:wrap}
"""
_CSP = ("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
        "img-src data:; style-src 'unsafe-inline'\">")


@dataclasses.dataclass(frozen=True)
class CardFacts:
    """What a card shows, read from the dataset (``gather_facts``).

    Attributes:
      location: the dataset as given (local folder or ``gs://``).
      manifest: its manifest, checked (``parse_manifest``).
      manifest_sha256: the SHA-256 of the manifest's bytes.
      report: ``run_report.json`` (``None`` when absent or not JSON).
      letters: per reason, up to 3 dead letters as their files hold them.
      samples: ``[(split, features)]``, the first records of each split.
      drift: the drift report against ``--compare_to`` (``None`` without it).
      parts: per incremental part, ``(path, its manifest or None)``.
      tfds_folders: per folder (``''``: the dataset's; then each part's path),
        whether it holds ``dataset_info.json`` (the TFDS snippet needs them all).
    """

    location: str
    manifest: dict
    manifest_sha256: str = ""
    report: dict | None = None
    letters: dict = dataclasses.field(default_factory=dict)
    samples: list = dataclasses.field(default_factory=list)
    drift: dict | None = None
    parts: list = dataclasses.field(default_factory=list)
    tfds_folders: dict = dataclasses.field(default_factory=dict)


# --- where the card may go ------------------------------------------------------------

def _folder(path: str) -> str:
    """``path`` as a folder prefix to compare with (``/`` at the end, local made
    absolute and real)."""
    if files.is_local(path):
        path = os.path.realpath(path)
    return path.rstrip("/") + "/"


def card_refusal(out_path: str, location: str) -> str:
    """Why the card may not be written at ``out_path``; ``''`` when it may.

    Refused: a path inside the dataset folder ``location``, a folder, a symbolic
    link, a file whose folder does not exist, and an existing file that is not a card (``CARD_MARKER`` in its first 4 KB): this
    command replaces only what it can prove it wrote.
    """
    if _folder(out_path).startswith(_folder(location)):
        return (f"{out_path} is inside the dataset folder {location}: write the card outside it "
                "(a reader would take it for part of the dataset)")
    if files.is_local(out_path):
        if os.path.islink(out_path):  # It would write where the link points, unseen.
            return f"{out_path} is a symbolic link: name the card's file itself"
        if os.path.isdir(out_path):
            return f"{out_path} is a folder: name the card's file (card.html)"
        parent = os.path.dirname(os.path.abspath(out_path))
        if not os.path.isdir(parent):
            return f"{parent} does not exist: make the folder first"
    if not files.exists(out_path):
        return ""
    with files.open_read(out_path) as f:
        head = f.read(4096)
    if CARD_MARKER.encode() not in head:
        return (f"{out_path} exists and is not a dataset card this command wrote: "
                "it is left as it is (name another file, or remove it)")
    return ""


# --- reading the dataset --------------------------------------------------------------

def _json_file(path: str) -> dict | None:
    data = files.read_bytes_if_exists(path)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _letters(location: str, source: str, manifest: dict) -> dict:
    """Up to ``_LETTERS_PER_REASON`` dead letters per reason, from the files the
    manifest lists (each read up to ``_LETTER_BYTES`` and ``_LETTER_LINES``)."""
    found: dict[str, list[dict]] = {}
    reasons = set((manifest["bad_records"].get("by_reason") or {}))
    for i, rel in enumerate(manifest["bad_records"].get("dead_letter_files", [])):
        if reasons and all(len(found.get(r, [])) >= _LETTERS_PER_REASON for r in reasons):
            break  # Enough of every reason: the other files are not read.
        path = dataset_path(location, rel, f"bad_records.dead_letter_files[{i}]", source)
        try:
            with files.open_read(path) as f:
                data = f.read(_LETTER_BYTES)
        except OSError:
            continue
        for line in itertools.islice(data.splitlines(), _LETTER_LINES):
            try:
                letter = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if not isinstance(letter, dict):
                continue
            reason = str(letter.get("reason") or letter.get("error") or "unknown")
            kept = found.setdefault(reason, [])
            if len(kept) < _LETTERS_PER_REASON:
                kept.append(letter)
    return found


def _drift(manifest: dict, location: str, compare_to: str) -> dict:
    """The drift report of this dataset's statistics against ``compare_to``'s.

    Raises:
      ValueError: when ``compare_to`` names no manifest or a malformed one.
    """
    path = drift_manifest_path(compare_to, location)
    old_text = manifest_text(path)
    if old_text is None:
        raise ValueError(f"--compare_to: {path} does not exist")
    gate = DriftGate(compare_to=compare_to, source=path, baseline=baseline_of(parse_manifest(old_text, path)))
    stats = {split: info.get("statistics") or {"records": info["records"]}
             for split, info in manifest["splits"].items()}
    return compare(gate, manifest.get("features") or {}, stats)


def gather_facts(location: str, *, compare_to: str | None = None, per_split: int = 8,
                 max_record: int = MAX_RECORD_BYTES) -> CardFacts:
    """Reads what the card shows of the dataset at ``location``.

    Raises:
      ValueError: no manifest, a malformed one, a path leading outside the folder,
        or a ``compare_to`` that names no readable manifest.
      UnreadableShard: a shard whose records cannot be read.
    """
    source, manifest = read_manifest(location)
    sha = hashlib.sha256(files.read_bytes(source)).hexdigest()
    parts, letters = [], _letters(location, source, manifest)
    tfds = {"": files.exists(files.join(location, _TFDS_INFO))}
    for index, part in enumerate(manifest.get("parts", [])):
        folder, path, part_text = part_manifest(location, source, index, part)
        part_json = parse_manifest(part_text, path) if part_text else None
        parts.append((part["path"], part_json))
        tfds[part["path"]] = files.exists(files.join(folder, _TFDS_INFO))
        for reason, found in (_letters(folder, path, part_json) if part_json else {}).items():
            letters[reason] = (letters.get(reason, []) + found)[:_LETTERS_PER_REASON]
    return CardFacts(
        location=location, manifest=manifest, manifest_sha256=sha,
        report=_json_file(files.join(location, REPORT_NAME)),
        letters=letters,
        samples=sample_records(location, per_split, max_record),
        drift=_drift(manifest, location, compare_to) if compare_to else None,
        parts=parts, tfds_folders=tfds)


# --- the sections ---------------------------------------------------------------------

def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{text(title)}</h2>{body}</section>'


def _splits(facts: CardFacts) -> str:
    m = facts.manifest
    rows = [[text(split), f'<span class="n">{figure(info["records"])}</span>',
             figure(info["num_shards"]), _bytes(info["bytes"]),
             text(", ".join(info.get("shards_outside_band") or []) or "none")]
            for split, info in m["splits"].items()]
    out = table(["split", "records", "shards", "bytes", "shards outside the size band"], rows)
    if m.get("parts"):
        out += (f"<p>These are the first run's shards; {figure(len(m['parts']))} incremental "
                "parts add to them:</p>")
        out += table(["part", "created", "records", "splits"], [
            [text(p["path"]), text(p.get("created", "")), figure(p.get("records", 0)),
             text(", ".join(f"{s} {n.get('records', 0)}" for s, n in (p.get("splits") or {}).items()))]
            for p in m["parts"]])
        whole = m.get("dataset") or {}
        out += "<p>In all: " + text(", ".join(
            f"{s} {i.get('records', 0):,} records in {i.get('num_shards', 0)} shards"
            for s, i in (whole.get("splits") or {}).items())) + "</p>"
    band = m.get("shard_band_bytes")
    if isinstance(band, list) and len(band) == 2:
        out += f'<p class="sub">Shard size band: {_bytes(band[0])} to {_bytes(band[1])}.</p>'
    return _section("splits", "Splits", out)


def _bytes(n) -> str:
    if not isinstance(n, (int, float)):
        return text(n)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:,} B"


def _classes(facts: CardFacts) -> str:
    m = facts.manifest
    vocabulary = m["labels"]["vocabulary"]
    counts = _whole_counts(facts)
    out = (f"<p>{figure(len(vocabulary))} classes: " + text(", ".join(vocabulary), 600) + "</p>"
           if vocabulary else "")
    charts = ""
    for split, by_label in counts.items() if vocabulary or any(counts.values()) else ():
        if not by_label:
            continue
        items = [(_class_name(vocabulary, label), n) for label, n in by_label.items()]
        charts += f"<div><h3>{text(split)}</h3>{bar_chart(items, f'classes of {split}')}</div>"
    out += f'<div class="feat">{charts}</div>' if charts else ""
    annotated = m.get("annotations") if isinstance(m.get("annotations"), dict) else {}
    if annotated.get("layout") in _BOXLESS:  # No boxes: no objects to count or draw as bars.
        out += _boxless(annotated, any(counts.values()))
    for split, info in m["splits"].items() if annotated.get("layout") not in _BOXLESS else ():
        annotations = (info.get("statistics") or {}).get("annotations")
        if annotations:
            out += _annotations(split, annotations)
    if not out:
        out = '<p class="none">No classes (the records carry no class label).</p>'
    return _section("classes", "Classes", out)


def _whole_counts(facts: CardFacts) -> dict:
    """Class counts per split of the first run's shards and every part's, added."""
    counts: dict[str, dict] = {}
    for manifest in [facts.manifest] + [part for _, part in facts.parts if part]:
        for split, by_label in ((manifest.get("labels") or {}).get("counts") or {}).items():
            into = counts.setdefault(split, {})
            for label, n in by_label.items():
                into[label] = into.get(label, 0) + (n if isinstance(n, int) else 0)
    return counts


def _class_name(vocabulary: list, label) -> str:
    try:
        index = int(label)
    except (TypeError, ValueError):
        return str(label)
    return f"{index} {vocabulary[index]}" if 0 <= index < len(vocabulary) else str(label)


def _boxless(annotated: dict, counted: bool) -> str:
    """What a dataset annotated without boxes (``--masks``, several labels) holds."""
    layout = annotated["layout"]
    names = [str(i.get("name")) for i in (annotated.get("label_map") or {}).get("items") or []
             if isinstance(i, dict)]
    out = (f"<h3>Annotations: {text(_BOXLESS[layout])}</h3><p>No boxes, so no objects per image "
           f"or box areas. {figure(annotated.get('images_without_objects', 0))} images "
           f"without {'a mask' if layout == 'masks' else 'labels'}. Label map: "
           f"{figure(len(names))} classes: {text(', '.join(names), 600)}.</p>")
    if not counted:
        out += ('<p class="none">The manifest holds no per-class counts '
                f"({'pixels or images per class' if layout == 'masks' else 'images per label'}) "
                "for this layout: none are shown.</p>")
    return out


def _annotations(split: str, stats: dict) -> str:
    out = (f"<h3>{text(split)}: objects</h3><p>{figure(stats.get('objects', 0))} objects on "
           f"{figure(stats.get('images', 0))} images "
           f"({figure(stats.get('images_without_objects', 0))} without any).</p>")
    classes = [(f"{c.get('id')} {c.get('text') or ''}".strip(), c.get("objects", 0))
               for c in stats.get("classes") or [] if isinstance(c, dict)]
    out += bar_chart(classes, f"objects per class in {split}")
    hist = (stats.get("objects_per_image") or {}).get("histogram")
    if isinstance(hist, list):  # [{"objects": "3-5", "images": N}, ...] in bin order.
        out += "<p>Images by objects per image:</p>" + bar_chart(
            [(str(b.get("objects", i)), b.get("images", 0)) for i, b in enumerate(hist)
             if isinstance(b, dict)], "images by objects per image")
    areas = stats.get("areas")
    if isinstance(areas, dict):
        out += "<p>Box areas (COCO ranges):</p>" + bar_chart(list(areas.items()), "box areas")
    return out


def _features(facts: CardFacts) -> str:
    m = facts.manifest
    spec = m.get("features") or {}
    out = table(["feature", "dtype", "shape"], [
        [text(name), text(s.get("dtype", "")), text(s.get("shape", ""))]
        for name, s in spec.items() if isinstance(s, dict)]) if spec else ""
    if facts.parts:
        out += ('<p class="sub">The statistics below are of the first run\'s shards; each part\'s '
                "are in its own manifest.json.</p>")
    for split, info in m["splits"].items():
        stats = info.get("statistics")
        if not stats:
            out += f'<h3>{text(split)}</h3><p class="none">No statistics in the manifest.</p>'
            continue
        out += f"<h3>{text(split)} ({figure(stats.get('records', 0))} records)</h3>"
        out += _feature_stats(stats.get("features") or {}, stats.get("records") or 0, split)
        out += _image_stats(stats.get("images"), split)
    return _section("features", "Features and statistics", out)


def _rate(part, whole) -> str:
    if not isinstance(part, int) or not whole:
        return ""
    return f"{figure(part)} ({100 * part / whole:.1f}%)"


def _feature_stats(features: dict, records: int, split: str) -> str:
    rows, charts = [], []
    for name, s in features.items():
        kind = s.get("kind", "")
        detail = ""
        if kind == "numeric":
            detail = (f"mean {figure(s.get('mean'))}, std {figure(s.get('std'))}, "
                      f"non-finite {figure(s.get('non_finite', 0))}")
            charts.append(f"<div><b>{text(name)}</b> (min, mean ± std, max){range_chart(s, name)}</div>")
        elif kind == "string":
            exact = "exact" if s.get("top_values_exact", True) else "lower bounds"
            detail = (f"{figure(s.get('distinct', 0))} distinct"
                      f"{'' if s.get('distinct_exact', True) else ' (estimate)'}")
            top = [(str(v.get("value", "")), v.get("count", 0))
                   for v in (s.get("top_values") or [])[:_TOP] if isinstance(v, dict)]
            charts.append(f"<div><b>{text(name)}</b>: top values ({exact})"
                          f"{bar_chart(top, f'top values of {name} in {split}')}</div>")
        elif kind == "bytes":
            detail = f"{figure(s.get('distinct', 0))} distinct"
        rows.append([text(name), text(kind), figure(s.get("count", 0)),
                     _rate(s.get("missing", 0), records), detail])
    if not rows:
        return ""
    return (table(["feature", "kind", "values", "missing (of records)", "summary"], rows)
            + f'<div class="feat">{"".join(charts)}</div>')


def _image_stats(images: dict | None, split: str) -> str:
    if not isinstance(images, dict):
        return ""
    out = '<div class="feat">'
    for key in ("formats", "modes"):
        if isinstance(images.get(key), dict):
            out += (f"<div><b>{key}</b>"
                    f"{bar_chart(list(images[key].items()), f'image {key} in {split}')}</div>")
    for key in ("width", "height"):
        if isinstance(images.get(key), dict):
            out += (f"<div><b>{key}</b> (px, quantiles)"
                    f"{quantile_chart(images[key], f'image {key} in {split}')}</div>")
    return out + "</div>"


def _duplicates(facts: CardFacts) -> str:
    dup = facts.manifest.get("duplicates")
    if not isinstance(dup, dict) or not dup.get("groups"):
        key = output_feature_name(facts.manifest.get("feature_names"), "image/key/sha256")
        body = (f"<p class=\"ok\">No two records hold the same image content ({text(key)}).</p>"
                if key in (facts.manifest.get("features") or {}) else
                '<p class="none">Not checked: the records carry no content hash (tables).</p>')
        return _section("duplicates", "Duplicates and leakage", body)
    across, within = dup.get("across_splits") or {}, dup.get("within_split") or {}
    leak = across.get("groups", 0)
    # A group across splits may also hold two copies in one split: those repeat within it too.
    both = sum(1 for g in across.get("list") or [] if isinstance(g, dict) and _repeats_in_a_split(g))
    some = "" if across.get("listed", 0) >= leak else "at least "
    out = (f"<p>{figure(dup.get('groups', 0))} contents held by {figure(dup.get('images', 0))} "
           f"records. <span class=\"{'warn' if leak else 'ok'}\">Leakage: {figure(leak)} contents "
           f"sit in more than one split</span>; {some if both else ''}"
           f"{figure(within.get('groups', 0) + both)} repeat within a split"
           + (f" ({figure(both)} of them also sit in another split)" if both else "") + ".</p>")
    for title, part in (("Across splits (leakage)", across), ("Within a split", within)):
        rows = [[text(g.get("sha256", ""), 16), text("; ".join(
            f"{f.get('split')}: {f.get('filename')}" for f in (g.get("files") or [])[:6]), 400)]
            for g in (part.get("list") or [])[:5] if isinstance(g, dict)]
        if rows:
            out += f"<h3>{title}</h3>" + table(["content (sha256)", "records (split: file)"], rows)
    return _section("duplicates", "Duplicates and leakage", out)


def _repeats_in_a_split(group: dict) -> bool:
    splits = [f.get("split") for f in group.get("files") or [] if isinstance(f, dict)]
    return len(splits) > len(set(splits))


def _dead_letters(facts: CardFacts) -> str:
    bad = dict(facts.manifest["bad_records"])
    budget = facts.manifest.get("error_budget") or {}
    if facts.parts:  # Every run's bad inputs, the parts' with them.
        by_reason = dict(bad.get("by_reason") or {})
        for _, part in facts.parts:
            for reason, n in ((part or {}).get("bad_records") or {}).get("by_reason", {}).items():
                by_reason[reason] = by_reason.get(reason, 0) + n
        bad.update(by_reason=by_reason, total=sum(by_reason.values()))
        budget = {}
    out = (f"<p>{figure(bad['total'])} bad inputs"
           + (f" of {figure(budget['inputs'])} (budget {figure(budget.get('max_bad_fraction'))})"
              if isinstance(budget.get("inputs"), int) else "") + ".</p>")
    out += bar_chart(list((bad.get("by_reason") or {}).items()), "bad inputs by reason", "#c44e52")
    for reason, letters in sorted(facts.letters.items()):
        rows = [[text(letter.get("source", ""), 160), text(letter.get("stage", "")),
                 text(letter.get("message", ""), 240)] for letter in letters]
        out += f"<h3>{text(reason)}</h3>" + table(["source", "stage", "message"], rows)
    files_listed = bad.get("dead_letter_files") or []
    if files_listed:
        out += "<p class=\"sub\">Dead-letter files: " + text(", ".join(files_listed), 600) + "</p>"
    return _section("dead-letters", "Dead letters", out)


def _drift_section(facts: CardFacts) -> str:
    drift, source = facts.drift, "--compare_to"
    if drift is None and isinstance(facts.report, dict) and isinstance(facts.report.get("drift"), dict):
        drift, source = facts.report["drift"], "the run's own gate (run_report.json)"
    if drift is None:
        return _section("drift", "Drift", '<p class="none">Not compared (give --compare_to).</p>')
    status, against = str(drift.get("status", "")), str(drift.get("manifest") or drift.get("compare_to") or "")
    shown = (shown_path(posixpath.dirname(against)) + "/" + posixpath.basename(against)
             if os.path.isabs(against) else against)  # By its folder's name, as the snippets.
    message = str(drift.get("message", "")).replace(against, shown) if against else drift.get("message", "")
    out = (f"<p>Against {text(shown)}, by "
           f"{text(source)}: <span class=\"{'warn' if status == 'failed' else 'ok'}\">"
           f"{text(status)}</span>. {text(message, 600)}</p>")
    checks = [c for c in drift.get("checks") or [] if isinstance(c, dict)]
    checks.sort(key=lambda c: (c.get("verdict") != "failed", c.get("verdict") != "not_compared"))
    rows = [[text(c.get("check", "")), text(c.get("split", "")),
             text(c.get("feature") or c.get("class") or ""), text(c.get("old")), text(c.get("new")),
             text(c.get("threshold", "")), text(c.get("verdict", "")), text(c.get("note", ""))]
            for c in checks[:40]]
    rows = [row[:3] + [_cell(c.get("old")), _cell(c.get("new"))] + row[5:]
            for row, c in zip(rows, checks)]
    if rows:
        out += table(["check", "split", "feature / class", "old", "new", "limit", "verdict", "note"], rows)
        if len(checks) > 40:
            out += f"<p class=\"sub\">... and {figure(len(checks) - 40)} more checks.</p>"
    return _section("drift", "Drift", out)


def _cell(value) -> str:
    """A value of a drift check or a record: numbers as ``figure`` shows them."""
    return figure(value) if isinstance(value, (int, float)) else text(value if value is not None else "")


def _inverse(manifest: dict) -> dict:
    return {out: canonical for canonical, out in (manifest.get("feature_names") or {}).items()}


def _enlarged(thumb: Image.Image) -> Image.Image:
    """A thumbnail under 96 px (a 32x32 image) scaled up, pixels kept sharp, so it
    and its boxes can be seen."""
    side = max(thumb.size)
    if side >= 96:
        return thumb
    factor = 128 // side
    return thumb.resize((thumb.width * factor, thumb.height * factor), Image.Resampling.NEAREST)


def _sample_figure(features: dict, inverse: dict, image_key: str, boxes: bool = True) -> str:
    canonical = {inverse.get(k, k): v for k, v in features.items()}
    name = (canonical.get("image/filename") or [b""])[0]
    name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    cls = _listed([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
                   for v in canonical.get("image/class/text") or []])
    labels = [str(v) for v in canonical.get("image/class/label") or []]
    label = _listed(labels)
    if boxes and ("image/object/bbox/xmin" in canonical or "image/object/class/label" in canonical):
        objects = len(canonical.get("image/object/class/label") or canonical.get("image/object/bbox/xmin") or [])
        cls = f"{cls} {objects} object{'s' * (objects != 1)}".strip()
    try:
        image = annotate_thumbnail(_enlarged(thumbnail(features[image_key][0])), canonical)
        img = f'<img src="{data_uri(image)}" alt="{text(name)}">'
    except (UnidentifiedImageError, OSError, KeyError, IndexError, ValueError,
            Image.DecompressionBombError):
        img = '<p class="warn">unreadable</p>'
    caption = (f"{cls} (label{'s' * (len(labels) > 1)} {label})" if cls and label
               else f"{cls or label}")
    return (f"<figure>{img}<figcaption>{text(caption.strip(), 90)}<br>"
            f"<span class=\"sub\">{text(posixpath.basename(name) or name, 60)}</span>"
            "</figcaption></figure>")


def _listed(values: list[str]) -> str:
    """A record's labels (or class names) for a caption: the first few, then ``+N more``."""
    shown = ", ".join(values[:_LABELS_SHOWN])
    return shown + (f" +{len(values) - _LABELS_SHOWN} more" if len(values) > _LABELS_SHOWN else "")


def _record_row(features: dict, names: list) -> list[str]:
    cells = []
    for name in names:
        values = features.get(name, [])
        shown = [f"<{len(v)} bytes>" if isinstance(v, bytes) and len(v) > 64 else
                 v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values[:4]]
        shown = [f"{v:.7g}" if isinstance(v, float) else str(v) for v in shown]
        cells.append(text(", ".join(shown) + (" ..." if len(values) > 4 else ""), 80))
    return cells


def _samples(facts: CardFacts) -> str:
    image_key = output_feature_name(facts.manifest.get("feature_names"), "image/encoded")
    inverse = _inverse(facts.manifest)
    # Semantic masks and multi-label records hold no boxes: no "0 objects" under them.
    annotated = facts.manifest.get("annotations")
    boxes = not isinstance(annotated, dict) or annotated.get("layout") not in _BOXLESS
    out = ""
    for split, group in itertools.groupby(facts.samples, key=lambda s: s[0]):
        records = [features for _, features in group]
        out += f"<h3>{text(split)}</h3>"
        if any(image_key in r for r in records):
            out += ('<div class="grid">' + "".join(_sample_figure(r, inverse, image_key, boxes) for r in records)
                    + "</div>")
        else:
            names = sorted({k for r in records for k in r})[:12]
            out += table(names, [_record_row(r, names) for r in records[:_TABLE_ROWS]])
    return _section("samples", "Sample records", out or '<p class="none">No records.</p>')


def _made(facts: CardFacts) -> str:
    m = facts.manifest
    tool = m.get("tool") or {}
    out = _pairs({"created": m.get("created", ""),
                  "tool": f"{tool.get('name', '')} {tool.get('version', '')}",
                  "manifest sha256": facts.manifest_sha256,
                  "format version": m.get("format_version", "")})
    out += "<h3>Input fingerprint</h3>" + _pairs(m.get("input") or {})
    out += "<h3>Options</h3>" + _pairs({k: shown_path(v) if isinstance(v, str) else v
                                        for k, v in (m.get("options") or {}).items()})
    report = facts.report
    if isinstance(report, dict):
        same = report.get("manifest_sha256") in (None, facts.manifest_sha256)
        out += ("<h3>Last run (run_report.json)</h3>" + (
            "" if same else '<p class="warn">The last run is not the one that made this '
            "manifest (its report names another manifest).</p>") + _pairs(
            {k: report.get(k) for k in ("status", "run_id", "records", "bytes", "shards",
                                        "bad_records") if k in report}))
    else:
        out += '<p class="none">No run_report.json beside the manifest.</p>'
    for path, part in facts.parts:
        if part:
            out += (f"<h3>Part {text(path)}</h3>" + _pairs(
                {"created": part.get("created"), "input": part.get("input")}))
    return _section("made", "How it was made", out)


def _pairs(values: dict) -> str:
    """Keys and values (JSON unless a string), in columns as the page's width allows."""
    return '<div class="kv">' + "".join(
        f"<div><b>{text(k)}</b> {text(json.dumps(v, ensure_ascii=False, default=str) if not isinstance(v, str) else v, 400)}</div>"
        for k, v in values.items()) + "</div>"


def _loading(facts: CardFacts) -> str:
    out = ""
    for snippet in loading_snippets(facts.location, facts.manifest, facts.parts, facts.tfds_folders):
        out += f"<h3>{text(snippet.reader)}</h3>" + (
            f"<pre><code>{code(snippet.code)}</code></pre>" if snippet.code
            else f'<p class="none">{text(snippet.reason, 400)}</p>')
    return _section("loading", "Loading it", out)


def card_html(facts: CardFacts) -> str:
    """The card of ``facts`` as one HTML page (no reference out of it)."""
    m = facts.manifest
    total = sum(info["records"] for info in m["splits"].values())
    whole = (m.get("dataset") or {}).get("records")
    summary = (f"{figure(whole if isinstance(whole, int) else total)} records in "
               f"{figure(len(m['splits']))} splits, {figure(len(m['labels']['vocabulary']))} classes, "
               f"{figure(len(m.get('features') or {}))} features; created {text(m.get('created', ''))}")
    sections = (_splits, _classes, _samples, _features, _duplicates, _dead_letters, _drift_section,
                _made, _loading)
    body = "".join(section(facts) for section in sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"{CARD_MARKER}{_CSP}<title>Dataset card: {text(shown_path(facts.location))}</title>"
            f"<style>{_STYLE}</style></head><body><h1>Dataset card</h1>"
            f"<p class=\"sub\">{text(shown_path(facts.location), 400)}</p><p>{summary}</p>{body}</body></html>\n")


def write_card(facts: CardFacts, out_path: str) -> int:
    """Writes ``card_html(facts)`` to ``out_path`` (local or ``gs://``); returns its
    bytes. The caller checks ``card_refusal`` first."""
    data = card_html(facts).encode("utf-8")
    files.write_bytes(out_path, data)
    return len(data)
