"""Small synthetic image datasets, for the demo and the tests.

Each class has a look of its own (circles, squares, stripes, ...) so a contact
sheet read back from the shards shows at a glance that labels match pictures.
Generation is seeded: the same call makes the same bytes.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageDraw

__all__ = [
    "CLASSES",
    "make_cifar_sample",
    "make_class_folder_sample",
    "make_csv_manifest_sample",
    "render_image",
]

CLASSES = ("circles", "squares", "stripes", "triangles")
_FORMATS = {"jpeg": ".jpg", "png": ".png", "gif": ".gif"}


def render_image(cls: str, width: int, height: int, rng: np.random.Generator) -> Image.Image:
    """An RGB picture of class ``cls``: a coloured background and its shapes."""
    base = rng.integers(40, 200, size=3)
    ramp = np.linspace(0, 1, width, dtype=np.float32)[None, :, None]
    pixels = base[None, None, :] * (0.6 + 0.4 * ramp) + rng.normal(0, 6, (height, width, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
    side = min(width, height)
    for _ in range(3):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        r = int(rng.integers(side // 10 + 1, side // 4 + 2))
        if cls == "circles":
            draw.ellipse((x - r, y - r, x + r, y + r), fill=colour)
        elif cls == "squares":
            draw.rectangle((x - r, y - r, x + r, y + r), fill=colour)
        elif cls == "triangles":
            draw.polygon(((x, y - r), (x - r, y + r), (x + r, y + r)), fill=colour)
        else:
            step = max(2, side // 8)
            for i in range(0, width, 2 * step):
                draw.rectangle((i, 0, i + step - 1, height), fill=colour)
            break
    return image


def _encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    if fmt == "jpeg":
        image.save(out, "JPEG", quality=90)
    elif fmt == "gif":
        image.convert("P", palette=Image.Palette.ADAPTIVE).save(out, "GIF")
    else:
        image.save(out, "PNG")
    return out.getvalue()


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def make_class_folder_sample(
    root: str,
    per_class: int = 10,
    splits: Sequence[str] | None = ("train", "validation", "test"),
    classes: Sequence[str] = CLASSES,
    size_range: tuple[int, int] = (64, 160),
    formats: Sequence[str] = ("jpeg", "png"),
    seed: int = 0,
) -> list[str]:
    """Writes ``ROOT[/<split>]/<class>/<name>.<ext>`` and a stray ``README.txt``.

    Returns:
      The relative paths of the images written, sorted.
    """
    rng = np.random.default_rng(seed)
    written = []
    for split in splits or (None,):
        for cls in classes:
            for i in range(per_class):
                fmt = formats[i % len(formats)]
                width = int(rng.integers(size_range[0], size_range[1] + 1))
                height = int(rng.integers(size_range[0], size_range[1] + 1))
                parts = [p for p in (split, cls, f"{cls}_{i:04d}{_FORMATS[fmt]}") if p]
                rel = "/".join(parts)
                _write(os.path.join(root, rel), _encode(render_image(cls, width, height, rng), fmt))
                written.append(rel)
    _write(os.path.join(root, "README.txt"), b"synthetic sample dataset\n")
    return sorted(written)


def make_cifar_sample(
    root: str,
    counts: dict[str, int] | None = None,
    classes: Sequence[str] = CLASSES,
    seed: int = 0,
) -> list[str]:
    """Writes ``ROOT/<split>/<ID>_<CLASS>.png`` (32×32) and ``ROOT/labels.txt``."""
    rng = np.random.default_rng(seed)
    counts = counts or {"train": 20, "test": 8}
    _write(os.path.join(root, "labels.txt"), "".join(f"{c}\n" for c in classes).encode())
    written = []
    for split, n in counts.items():
        for i in range(n):
            cls = classes[i % len(classes)]
            rel = f"{split}/{i}_{cls}.png"
            _write(os.path.join(root, rel), _encode(render_image(cls, 32, 32, rng), "png"))
            written.append(rel)
    return sorted(written)


def make_csv_manifest_sample(root: str, n: int = 12, seed: int = 0) -> list[dict]:
    """Writes images under ``ROOT/images/`` and ``ROOT/manifest.csv`` naming them.

    The CSV has columns image, label (class names), split, and two extra columns:
    ``weight`` (float) and ``source_id`` (int) and ``note`` (text with commas).

    Returns:
      The rows written, as dicts.
    """
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        cls = CLASSES[i % len(CLASSES)]
        rel = f"images/{i:03d}.png" if i % 2 else f"images/{i:03d}.jpg"
        fmt = "png" if i % 2 else "jpeg"
        _write(os.path.join(root, rel), _encode(render_image(cls, 48, 40, rng), fmt))
        rows.append(
            {
                "image": rel,
                "label": cls,
                "split": "train" if i % 3 else "test",
                "weight": f"{0.5 + i / 4:.2f}",
                "source_id": str(1000 + i),
                "note": f"shot {i}, batch A",
            }
        )
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    _write(os.path.join(root, "manifest.csv"), out.getvalue().encode())
    return rows
