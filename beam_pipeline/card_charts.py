"""The dataset card's pieces of markup: escaped text, tables, inline SVG charts and
thumbnails as ``data:`` URIs.

Everything a dataset or its dead letters hold (a class name, a file name, an
option's value) goes through ``text``: HTML-escaped (``<script>`` shows as text),
with control and other non-printing characters shown escaped (``\\x1b``), and cut
to a length. Charts are inline SVG drawn from the figures given (no script, no
external reference); thumbnails are small JPEGs (PNG when the image has
transparency) made with Pillow and embedded, so the page needs no network.
"""

from __future__ import annotations

import base64
import html
import io
import math
import unicodedata
from collections.abc import Mapping, Sequence

from PIL import Image

__all__ = [
    "bar_chart",
    "code",
    "data_uri",
    "figure",
    "quantile_chart",
    "range_chart",
    "table",
    "text",
]

_BAR = "#4c72b0"
_ACCENT = "#dd8452"
_WIDTH = 360
_ROW = 18
_LABEL = 150  # Room for a bar's label at least, px (more when the labels need it).
_LABEL_CHARS = 40  # A longer label is cut in its middle (its full text in a tooltip).


def text(value: object, limit: int = 200) -> str:
    """``value`` as escaped HTML text: non-printing characters shown escaped, cut
    to ``limit`` characters (``...`` marks a cut)."""
    shown = value if isinstance(value, str) else str(value)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
    if len(shown) > limit:
        shown = shown[: limit - 3] + "..."
    return html.escape(shown, quote=True)


def code(value: str) -> str:
    """Lines of code as escaped HTML text for a ``<pre>``: like ``text``, but line
    breaks kept and nothing cut."""
    return "\n".join(text(line, 10_000) for line in value.split("\n"))


def figure(value: float) -> str:
    """A number as people read it: whole numbers with thousands separators, others
    with up to 4 significant digits."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if not isinstance(value, float):
        return text(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    """An HTML table; ``headers`` are escaped, ``rows`` hold markup already escaped."""
    head = "".join(f"<th>{text(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _svg(width: int, height: int, body: str, title: str) -> str:
    # Inline SVG in HTML needs no namespace: the page names no URL at all.
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">'
            f'<title>{text(title)}</title>{body}</svg>')


def _printable(value: object) -> str:
    shown = value if isinstance(value, str) else str(value)
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)


def _cut_middle(label: str, limit: int = _LABEL_CHARS) -> str:
    """``label`` cut in its middle to ``limit`` characters (``…`` marks the cut):
    labels sharing a long prefix or suffix stay apart."""
    if len(label) <= limit:
        return label
    head = (limit - 1) // 2
    return label[:head] + "…" + label[len(label) - (limit - 1 - head):]


def _short_labels(labels: Sequence[str]) -> list[str]:
    """Each label cut to fit (``_cut_middle``); labels the cut made equal get their
    row number, so distinct labels stay distinct."""
    shown = [_cut_middle(label) for label in labels]
    seen: dict[str, int] = {}
    for label in shown:
        seen[label] = seen.get(label, 0) + 1
    return [f"{s[:_LABEL_CHARS - 5]}… #{i + 1}" if seen[s] > 1 and s != full else s
            for i, (s, full) in enumerate(zip(shown, labels))]


def _text_px(label: str) -> float:
    """A label's width in px at the charts' 11 px font, erring wide (wide East Asian
    characters count double)."""
    return sum(11.0 if unicodedata.east_asian_width(c) in "WF" else 7.0 for c in label)


def bar_chart(items: Sequence[tuple[str, float]], title: str, colour: str = _BAR) -> str:
    """Horizontal bars, one per ``(label, value)``, scaled to the largest value and
    labelled with it. The labels get the room they need (a long one is cut in its
    middle, its full text in an SVG ``<title>`` tooltip): none is clipped."""
    if not items:
        return '<p class="none">none</p>'
    top = max((v for _, v in items), default=0) or 1
    full = [_printable(label) for label, _ in items]
    shown = _short_labels(full)
    room = max(_LABEL, int(max(_text_px(s) for s in shown)) + 12)
    span = _WIDTH - _LABEL - 70
    rows = []
    for i, ((_, value), label, cut) in enumerate(zip(items, full, shown)):
        y = i * _ROW
        width = max(1.0, span * value / top) if value else 0
        rows.append(
            f'<text x="{room - 6}" y="{y + 13}" text-anchor="end"><title>{text(label, 2000)}</title>'
            f'{text(cut, 10_000)}</text>'
            f'<rect x="{room}" y="{y + 3}" width="{width:.1f}" height="{_ROW - 6}" fill="{colour}"/>'
            f'<text x="{room + width + 4:.1f}" y="{y + 13}">{figure(value)}</text>')
    return _svg(room + span + 70, len(items) * _ROW + 4, "".join(rows), title)


def _scale(low: float, high: float, x0: float, x1: float):
    span = (high - low) or 1.0
    return lambda v: x0 + (x1 - x0) * (v - low) / span


def range_chart(stats: Mapping, title: str) -> str:
    """A numeric feature's spread on one axis from ``min`` to ``max``: the band of
    ``mean`` ± ``std`` (clipped to the range) and a mark at the mean, labelled. The
    manifest keeps these figures, not the values, so this is what can be drawn."""
    low, high, mean, std = (stats.get(k) for k in ("min", "max", "mean", "std"))
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high, mean)):
        return '<p class="none">no finite values</p>'
    std = std if isinstance(std, (int, float)) and math.isfinite(std) else 0.0
    at = _scale(low, high, 10, 330)
    band0, band1 = at(max(low, mean - std)), at(min(high, mean + std))
    body = (f'<line x1="10" y1="20" x2="330" y2="20" stroke="#999"/>'
            f'<rect x="{band0:.1f}" y="12" width="{max(1.0, band1 - band0):.1f}" height="16" '
            f'fill="{_BAR}" opacity="0.5"/>'
            f'<line x1="{at(mean):.1f}" y1="8" x2="{at(mean):.1f}" y2="32" stroke="{_ACCENT}" '
            f'stroke-width="3"/>'
            f'<text x="10" y="46">{figure(low)}</text>'
            f'<text x="330" y="46" text-anchor="end">{figure(high)}</text>'
            f'<text x="{at(mean):.1f}" y="46" text-anchor="middle">mean {figure(mean)}</text>')
    return _svg(340, 52, body, title)


def quantile_chart(quantiles: Mapping, title: str) -> str:
    """A box plot of nearest-rank quantiles ``p0, p5, p50, p95, p100`` (an image
    size's), the five figures written under it."""
    keys = ("p0", "p5", "p50", "p95", "p100")
    values = [quantiles.get(k) for k in keys]
    if not all(isinstance(v, (int, float)) for v in values):
        return '<p class="none">none</p>'
    at = _scale(values[0], values[-1], 10, 330)
    p0, p5, p50, p95, p100 = (at(v) for v in values)
    body = (f'<line x1="{p0:.1f}" y1="20" x2="{p100:.1f}" y2="20" stroke="#999"/>'
            f'<rect x="{p5:.1f}" y="10" width="{max(1.0, p95 - p5):.1f}" height="20" fill="{_BAR}" '
            f'opacity="0.5"/>'
            f'<line x1="{p50:.1f}" y1="6" x2="{p50:.1f}" y2="34" stroke="{_ACCENT}" stroke-width="3"/>'
            + '<text x="10" y="50">' + " · ".join(f"{k} {figure(v)}" for k, v in zip(keys, values))
            + "</text>")
    return _svg(340, 58, body, title)


def data_uri(image: Image.Image) -> str:
    """``image`` as a ``data:`` URI: JPEG (quality 80), PNG when it has alpha."""
    out = io.BytesIO()
    if image.mode in ("RGBA", "LA"):
        image.save(out, "PNG", optimize=True)
        kind = "png"
    else:
        image.convert("RGB").save(out, "JPEG", quality=80)
        kind = "jpeg"
    return f"data:image/{kind};base64," + base64.b64encode(out.getvalue()).decode("ascii")
