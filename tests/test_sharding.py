"""Tests for transforms.plan.shards: shard counts, shard cuts, keys and file names."""

import re

import numpy as np
import pytest

from beam_tfrecords.schemas.shards import (
    MB,
    ShardBand,
    is_valid_split_name,
    parse_shard_name,
    shard_name,
)
from beam_tfrecords.transforms.plan.shard_cuts import assign_shards, choose_num_shards, stable_key

pytestmark = pytest.mark.unit

BAND = ShardBand.from_mb(100, 200)


def best_count(total: int, band: ShardBand) -> int:
    """Oracle: the count whose mean shard is inside the band and nearest its middle.

    Ties go to the smaller count. Returns 1 below the band's floor.
    """
    if total <= band.min_bytes:
        return 1
    middle = (band.min_bytes + band.max_bytes) / 2
    counts = [n for n in range(1, total // band.min_bytes + 1) if band.holds(total / n)]
    return min(counts, key=lambda n: (abs(total / n - middle), n))


# --------------------------------------------------------------------------
# ShardBand
# --------------------------------------------------------------------------


def test_band_from_mb_and_holds():
    assert BAND == ShardBand(100 * MB, 200 * MB)
    assert BAND.holds(100 * MB) and BAND.holds(200 * MB) and BAND.holds(150 * MB)
    assert not BAND.holds(100 * MB - 1) and not BAND.holds(200 * MB + 1)
    assert ShardBand.from_mb(0.5, 1.5) == ShardBand(500_000, 1_500_000)


@pytest.mark.parametrize("low, high", [(0, 10), (-1, 10), (10, 9)])
def test_band_rejects_bad_bounds(low, high):
    with pytest.raises(ValueError, match=r"must be positive|is below the minimum"):
        ShardBand(low, high)


# --------------------------------------------------------------------------
# choose_num_shards
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "total_mb, expected",
    [
        (0, 1),
        (1, 1),
        (50, 1),
        (100, 1),  # at the floor: one shard
        (150, 1),  # mean 150
        (199, 1),
        (250, 2),  # mean 125 (one shard would be 250, above the band)
        (1000, 7),  # mean 142.9 (6 -> 166.7 is farther)
        (10_000, 67),  # mean 149.25 (66 -> 151.5 is farther)
        (972, 7),  # mean 138.9 (6 -> 162.0 is farther)
        (975, 7),  # mean 139.3 (6 -> 162.5 is farther)
    ],
)
def test_choose_num_shards_table(total_mb, expected):
    total = total_mb * MB
    n = choose_num_shards(total, BAND)
    assert n == expected
    if total > BAND.min_bytes:
        assert BAND.holds(total / n)
        assert n == best_count(total, BAND)


def test_choose_num_shards_band_narrower_than_records_allow():
    band = ShardBand.from_mb(100, 110)
    # 2 shards -> 125 MB (above), 3 shards -> 83 MB (below): no count fits, stay under the cap.
    assert choose_num_shards(250 * MB, band) == 3


def _random_totals_and_bands(seed, count):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        low = int(rng.integers(1, 500)) * MB
        high = low + int(rng.integers(0, 3 * low))
        total = int(rng.integers(0, 200 * high))
        yield total, ShardBand(low, high)


def test_choose_num_shards_mean_in_band_whenever_possible():
    for total, band in _random_totals_and_bands(seed=11, count=3000):
        n = choose_num_shards(total, band)
        assert n >= 1
        if total <= band.min_bytes:
            assert n == 1
            continue
        possible = any(band.holds(total / k) for k in range(1, total // band.min_bytes + 1))
        if possible:
            assert band.holds(total / n), (total, band, n)
        else:
            assert total / n <= band.max_bytes, (total, band, n)


def test_choose_num_shards_mean_nearest_the_middle():
    """Docstring: the mean shard is put as close to the band's middle as the count allows."""
    misses = []
    for total, band in _random_totals_and_bands(seed=12, count=3000):
        if total <= band.min_bytes or not any(
            band.holds(total / k) for k in range(1, total // band.min_bytes + 1)
        ):
            continue
        n, best = choose_num_shards(total, band), best_count(total, band)
        middle = (band.min_bytes + band.max_bytes) / 2
        if abs(total / n - middle) > abs(total / best - middle):
            misses.append((total, band.min_bytes, band.max_bytes, n, best))
    assert not misses, f"{len(misses)} misses (total, min, max, got, best), e.g. {misses[:3]}"


# --------------------------------------------------------------------------
# assign_shards
# --------------------------------------------------------------------------


def check_assignment(sizes, n, shards):
    sizes = list(sizes)
    assert len(shards) == len(sizes)
    assert all(0 <= s < n for s in shards)
    assert all(a <= b for a, b in zip(shards, shards[1:])), "not non-decreasing"
    total = sum(sizes)
    if not sizes or total == 0:
        return
    per_shard = [0] * n
    for size, shard in zip(sizes, shards):
        per_shard[shard] += size
    largest = max(sizes)
    for index, got in enumerate(per_shard):
        assert abs(got - total / n) < largest, (index, got, total / n, largest)


@pytest.mark.parametrize(
    "sizes, n, expected",
    [
        ([], 3, []),
        ([5], 1, [0]),
        ([5], 4, [2]),  # one record lands where its midpoint is
        ([1, 1, 1, 1], 1, [0, 0, 0, 0]),
        ([1, 1, 1, 1], 2, [0, 0, 1, 1]),
        ([1, 1, 1, 1], 4, [0, 1, 2, 3]),
        ([1] * 6, 3, [0, 0, 1, 1, 2, 2]),
        ([0, 0, 0], 2, [0, 0, 0]),
        ([10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2, [0] + [1] * 10),
    ],
)
def test_assign_shards_table(sizes, n, expected):
    shards = assign_shards(sizes, n)
    assert shards == expected
    check_assignment(sizes, n, shards)


@pytest.mark.parametrize("n", [0, -1])
def test_assign_shards_rejects_fewer_than_one_shard(n):
    with pytest.raises(ValueError, match="num_shards must be at least 1"):
        assign_shards([1, 2], n)


@pytest.mark.parametrize("count, n", [(1, 1), (7, 7), (10, 3), (100, 99), (1000, 7), (12345, 64)])
def test_assign_shards_equal_items_fill_every_shard(count, n):
    sizes = [1234] * count
    shards = assign_shards(sizes, n)
    check_assignment(sizes, n, shards)
    assert sorted(set(shards)) == list(range(n))
    counts = np.bincount(shards, minlength=n)
    assert counts.max() - counts.min() <= 1


def test_assign_shards_random_property():
    rng = np.random.default_rng(2024)
    for trial in range(400):
        count = int(rng.integers(1, 400))
        kind = trial % 4
        if kind == 0:
            sizes = rng.integers(1, 10_000, count)
        elif kind == 1:
            sizes = rng.lognormal(10, 2, count).astype(np.int64) + 1  # heavy tail
        elif kind == 2:
            sizes = rng.integers(0, 3, count) * rng.integers(1, 50_000_000, count)  # with zeros
        else:
            sizes = rng.integers(1, 5_000_000_000, count)  # large totals
        sizes = [int(s) for s in sizes]
        n = int(rng.integers(1, count + 5))
        check_assignment(sizes, n, assign_shards(sizes, n))


def test_assign_shards_with_chosen_count_keeps_shards_in_band():
    rng = np.random.default_rng(5)
    sizes = [int(s) for s in rng.integers(50_000, 150_000, 20_000)]  # ~2 GB of small records
    n = choose_num_shards(sum(sizes), BAND)
    per_shard = np.bincount(assign_shards(sizes, n), weights=sizes, minlength=n)
    assert all(BAND.holds(int(b)) for b in per_shard)


# --------------------------------------------------------------------------
# stable_key
# --------------------------------------------------------------------------


def test_stable_key_is_deterministic_hex():
    key = stable_key("train", "cat/1.jpg")
    assert key == stable_key("train", "cat/1.jpg")
    assert re.fullmatch(r"[0-9a-f]{32}", key)


@pytest.mark.parametrize(
    "a, b",
    [
        (("train", "cat/1.jpg"), ("test", "cat/1.jpg")),
        (("train", "cat/1.jpg"), ("train", "cat/2.jpg")),
        (("a", "bc"), ("ab", "c")),  # the separator keeps split and path apart
        (("train", "x"), ("train", "x ")),
    ],
)
def test_stable_key_differs(a, b):
    assert stable_key(*a) != stable_key(*b)


def test_stable_key_spreads_classes():
    """Keys of one class's files do not sort together: sorting by key mixes classes."""
    paths = [f"{cls}/{i}.jpg" for cls in ("cat", "dog") for i in range(50)]
    ordered = sorted(paths, key=lambda p: stable_key("train", p))
    first_half_classes = {p.split("/")[0] for p in ordered[:50]}
    assert first_half_classes == {"cat", "dog"}


# --------------------------------------------------------------------------
# Split and shard names
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["train", "validation", "test", "Train2", "a.b_c", "0", "x_"])
def test_valid_split_names(name):
    assert is_valid_split_name(name)
    assert shard_name(name, 0, 1, "none").startswith(name + "-")


@pytest.mark.parametrize(
    "name", ["", "-x", "_x", ".x", "a b", "a/b", "a-b", "trän", "x\n", "a\\b", "a:b"]
)
def test_invalid_split_names(name):
    assert not is_valid_split_name(name)
    with pytest.raises(ValueError, match=re.escape(f"split name {name!r} cannot name a file")):
        shard_name(name, 0, 1, "none")


@pytest.mark.parametrize(
    "split, index, count, compression, name",
    [
        ("train", 0, 1, "none", "train-00000-of-00001.tfrecord"),
        ("train", 3, 4, "gzip", "train-00003-of-00004.tfrecord.gz"),
        ("validation", 41, 100, "none", "validation-00041-of-00100.tfrecord"),
        ("a.b_c", 99_999, 100_000, "gzip", "a.b_c-99999-of-100000.tfrecord.gz"),
        ("test", 123_456, 200_000, "none", "test-123456-of-200000.tfrecord"),
    ],
)
def test_shard_name_round_trip(split, index, count, compression, name):
    assert shard_name(split, index, count, compression) == name
    assert parse_shard_name(name) == (split, index, count)


@pytest.mark.parametrize("index, count", [(-1, 4), (4, 4), (0, 0)])
def test_shard_name_index_out_of_range(index, count):
    with pytest.raises(ValueError, match=rf"shard index {index} is outside 0\.\.{count - 1}"):
        shard_name("train", index, count, "none")


def test_shard_name_bad_compression():
    with pytest.raises(ValueError, match=r"compression must be one of \('none', 'gzip'\), got 'zip'"):
        shard_name("train", 0, 1, "zip")


@pytest.mark.parametrize(
    "name",
    [
        "train-0000-of-00001.tfrecord",  # 4 digits
        "train-00000-of-00001.tfrecords",
        "train-00000-of-00001.tfrecord.bz2",
        "train-00000-of-00001",
        "-00000-of-00001.tfrecord",
        "train_00000_of_00001.tfrecord",
        "dead_letter.jsonl",
        "train-00000-of-00001.tfrecord.gz.tmp",
        "train-00000-of-00001.tfrecord\n",  # '$' would accept a trailing newline
    ],
)
def test_parse_shard_name_rejects(name):
    assert parse_shard_name(name) is None
