"""Instance masks (transforms/codec/masks.py): rendered exactly as pycocotools renders them,
covering each polygon's area, and stored as a PNG that reads back exactly.

The comparisons need pycocotools (the test extra: a reference implementation, never a
run-time dependency); they skip, saying so, where it is not installed. The other tests
need nothing but the product.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from beam_tfrecords.schemas.annotations import Polygons, Rle
from beam_tfrecords.transforms.codec.masks import (
    MaskError,
    decode_mask_png,
    encode_mask_png,
    mask_to_rle,
    render_mask,
    render_polygons,
    render_rle,
    ring_area_perimeter,
    rle_from_string,
    rle_to_string,
)

pytestmark = [
    pytest.mark.unit,
    # pycocotools 2.0.11 with numpy 2 warns about its own array interface on every decode.
    pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning"),
]

# Named shapes, in pixels, on a 40 x 48 (height x width) image.
HEIGHT, WIDTH = 40, 48
SHAPES = {
    "triangle": ((5.2, 3.1, 30.7, 8.4, 12.5, 33.9),),
    "rectangle_on_pixel_edges": ((4.0, 4.0, 20.0, 4.0, 20.0, 12.0, 4.0, 12.0),),
    "concave_l": ((2, 2, 30, 2, 30, 10, 12, 10, 12, 36, 2, 36),),
    "concave_star": (tuple(v for k in range(10) for v in (
        24 + (17 if k % 2 == 0 else 6.5) * math.cos(k * math.pi / 5),
        20 + (17 if k % 2 == 0 else 6.5) * math.sin(k * math.pi / 5))),),
    "two_rings_apart": ((1.5, 1.5, 10.5, 1.5, 10.5, 9.5), (30, 25, 45.5, 25, 45.5, 38, 30, 38)),
    "two_rings_overlapping": ((5, 5, 25, 5, 25, 25, 5, 25), (15.3, 15.3, 35.8, 15.3, 35.8, 33.1)),
    "past_the_edges": ((-6.3, -4.0, 55.0, 10.2, 20.0, 47.5),),
    "closed_with_repeated_point": ((3, 3, 20, 3, 20, 3, 20, 17, 3, 17, 3, 3),),
}


def _star_shaped(rng: np.random.Generator, height: int, width: int) -> tuple[float, ...]:
    """A simple (non self-intersecting) ring: sorted angles, random radii around a centre."""
    count = int(rng.integers(3, 24))
    angles = np.sort(rng.uniform(0, 2 * math.pi, count))
    radii = rng.uniform(2, min(height, width) / 2, count)
    cx, cy = width / 2, height / 2
    return tuple(float(round(v, 2)) for a, r in zip(angles, radii)
                 for v in (cx + r * math.cos(a), cy + r * math.sin(a)))


def _random_masks(count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(21)
    masks = [np.zeros((3, 4), np.uint8), np.ones((3, 4), np.uint8)]
    while len(masks) < count:
        height, width = (int(v) for v in rng.integers(1, 30, 2))
        masks.append((rng.random((height, width)) < rng.random()).astype(np.uint8))
    return masks


# --- against pycocotools (the reference implementation) ---

@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_polygons_match_pycocotools_pixel_for_pixel(shape):
    coco = pytest.importorskip("pycocotools.mask", reason="pycocotools (the test extra) is not installed")
    rings = SHAPES[shape]
    expected = np.amax(coco.decode(coco.frPyObjects([list(r) for r in rings], HEIGHT, WIDTH)), axis=2)
    got = render_polygons(Polygons(rings), HEIGHT, WIDTH)
    assert got.dtype == np.uint8 and got.shape == (HEIGHT, WIDTH)
    assert expected.sum() > 0
    assert np.array_equal(got, expected), f"{int((got != expected).sum())} pixels differ"


@pytest.mark.parametrize("chunk", [None, 5])
def test_random_polygons_match_pycocotools(chunk, monkeypatch):
    coco = pytest.importorskip("pycocotools.mask", reason="pycocotools (the test extra) is not installed")
    if chunk:  # the outline walked a few points at a time: the seams change nothing
        monkeypatch.setattr("beam_tfrecords.transforms.codec.masks._CHUNK_POINTS", chunk)
    rng = np.random.default_rng(7)
    differing = []
    for trial in range(300):
        height, width = (int(v) for v in rng.integers(5, 90, 2))
        rings = [rng.uniform(-4, max(height, width) + 4, 2 * int(rng.integers(3, 16))).round(trial % 3)
                 for _ in range(int(rng.integers(1, 4)))]
        expected = np.amax(coco.decode(coco.frPyObjects([r.tolist() for r in rings], height, width)), axis=2)
        got = render_polygons(Polygons(tuple(tuple(r.tolist()) for r in rings)), height, width)
        if not np.array_equal(got, expected):
            differing.append(trial)
    assert differing == []


def test_rle_both_forms_match_pycocotools():
    coco = pytest.importorskip("pycocotools.mask", reason="pycocotools (the test extra) is not installed")
    for mask in _random_masks(60):
        height, width = mask.shape
        reference = coco.encode(np.asfortranarray(mask))
        runs = mask_to_rle(mask).counts
        # Compressed: the same string both ways.
        assert rle_to_string(runs) == reference["counts"].decode("ascii")
        assert rle_from_string(reference["counts"].decode("ascii")) == runs
        # Uncompressed: pycocotools' reading of the counts list equals ours.
        uncompressed = coco.decode(coco.frPyObjects({"size": [height, width], "counts": list(runs)}, height, width))
        assert np.array_equal(render_rle(Rle((height, width), runs)), uncompressed)
        assert np.array_equal(uncompressed, mask)


# --- independent of pycocotools ---

def test_polygon_masks_cover_their_area_within_the_perimeter():
    rng = np.random.default_rng(3)
    cases = [(ring, HEIGHT, WIDTH) for shape in ("triangle", "rectangle_on_pixel_edges", "concave_l",
                                                 "concave_star") for ring in SHAPES[shape]]
    cases += [(_star_shaped(rng, 64, 80), 64, 80) for _ in range(40)]
    for ring, height, width in cases:
        area, perimeter = ring_area_perimeter(ring)
        mask = render_polygons(Polygons((ring,)), height, width)
        assert set(np.unique(mask)) <= {0, 1}
        assert abs(int(mask.sum()) - area) <= perimeter, (ring, int(mask.sum()), area, perimeter)
    # A rectangle on pixel edges is exactly its pixels.
    assert int(render_polygons(Polygons(SHAPES["rectangle_on_pixel_edges"]), HEIGHT, WIDTH).sum()) == 16 * 8


def test_rle_by_hand_and_its_errors():
    # 2 x 3 (height x width), column-major: column 0 = (0, 1), column 1 = (1, 1), column 2 = (0, 0).
    mask = render_rle(Rle((2, 3), (1, 3, 2)))
    assert mask.tolist() == [[0, 1, 0], [1, 1, 0]]
    assert mask_to_rle(mask) == Rle((2, 3), (1, 3, 2))
    assert mask_to_rle(np.ones((2, 2), np.uint8)).counts == (0, 4)  # starts with background, empty
    assert rle_from_string(rle_to_string((5, 0, 70000, 3, 1))) == (5, 0, 70000, 3, 1)
    with pytest.raises(MaskError, match="add up to 5 pixels"):
        render_rle(Rle((2, 3), (1, 4)))
    with pytest.raises(MaskError, match="is not the image's"):
        render_mask(Rle((2, 3), (6,)), 3, 2)
    with pytest.raises(MaskError, match="outside COCO's alphabet"):
        rle_from_string("a b")
    with pytest.raises(MaskError, match="ends inside a count"):
        rle_from_string("1o")
    assert render_mask(None, 2, 3).tolist() == [[0, 0, 0], [0, 0, 0]]
    with pytest.raises(MaskError, match="farther than 144 pixels"):
        render_polygons(Polygons(((0, 0, 10, 0, 1e9, 10),)), 20, 20)
    with pytest.raises(MaskError, match="fewer than three points"):
        render_polygons(Polygons(((0, 0, 10, 0),)), 20, 20)


def test_png_round_trips_exactly_and_is_deterministic():
    mask = render_polygons(Polygons(SHAPES["concave_star"]), HEIGHT, WIDTH)
    data = encode_mask_png(mask)
    assert data == encode_mask_png(mask.copy())
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.mode, image.size) == ("PNG", "L", (WIDTH, HEIGHT))
    back = decode_mask_png(data)
    assert back.dtype == np.uint8 and np.array_equal(back, mask) and int(back.max()) == 1
    for mask in _random_masks(8):
        assert np.array_equal(decode_mask_png(encode_mask_png(mask)), mask)
    with pytest.raises(MaskError, match="0s and 1s"):
        encode_mask_png(mask * 255)
    with pytest.raises(MaskError, match="not a readable PNG"):
        decode_mask_png(b"not a png at all")
    rgb = io.BytesIO()
    Image.new("RGB", (2, 2)).save(rgb, format="PNG")
    with pytest.raises(MaskError, match="mode RGB"):
        decode_mask_png(rgb.getvalue())
