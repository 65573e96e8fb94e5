"""Large listings held as columns (``RefTable``): the same references, dead letters,
shard plans and shard bytes as the list of ``ImageRef`` they replace."""

import glob
import hashlib
import os
import pickle

import numpy as np
import pytest

from beam_tfrecords.samples import make_cifar_sample, make_class_folder_sample
from beam_tfrecords.schemas.elements import ImageRef, ImageRefs
from beam_tfrecords.schemas.inputs import (
    InputFile,
    complete_inputs,
    decode_inputs,
    encode_inputs,
    encode_inputs_chunks,
    input_fingerprint,
)
from beam_tfrecords.schemas.shards import ShardBand, shard_name
from beam_tfrecords.transforms import image_listing
from beam_tfrecords.transforms import image_steps as images
from beam_tfrecords.transforms.image_steps import estimated_record_size, image_shards, pack_refs
from beam_tfrecords.transforms.io.fingerprint import file_entries, table_entries, table_lines
from beam_tfrecords.transforms.plan.layouts import list_cifar, list_class_folders
from beam_tfrecords.transforms.plan.ref_table import PathBuffer, RefTable
from beam_tfrecords.transforms.plan.shard_cuts import cut_shards, stable_key

ROOT = "gs://b/data"


def _files(count, seed=0, splits=("train", "val", "test")):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        split = splits[rng.integers(len(splits))]
        out.append((f"{ROOT}/{split}/class_{rng.integers(7):02d}/img_{i:06d}.jpg", int(rng.integers(1, 90_000))))
    return out


def _listing_facts(listing):
    return (sorted(listing.refs, key=lambda r: (r.filename, r.size)), listing.dead_letters,
            listing.vocabulary, listing.ignored, listing.split_source, listing.layout)


ODD = [
    (f"{ROOT}/train/cat/a.jpg", 10), (f"{ROOT}/train/cat/sub/b.png", 11),
    (f"{ROOT}/train/loose.jpg", 12), (f"{ROOT}/val/dog/c.jpg", 13), (f"{ROOT}/val/emu/é.jpg", 14),
    (f"{ROOT}/README.txt", 1), (f"{ROOT}/test/cat/d.gif", 15),
]


@pytest.mark.parametrize("files, labels", [
    (_files(3000), None),
    (_files(500, splits=("cat", "dog")), None),
    (ODD, None),
    (ODD, ["dog", "cat"]),
    ([(f"{ROOT}/x.jpg", 3), (f"{ROOT}/cat/y.jpg", 4)], None),
    ([(f"{ROOT}/bad split/cat/a.jpg", 3)], None),
    ([], None),
])
@pytest.mark.unit
def test_class_folders_compact_equals_list(files, labels):
    compact = list_class_folders(ROOT, iter(files), labels, compact=True)
    plain = list_class_folders(ROOT, files, labels)
    assert isinstance(compact.refs, RefTable) and isinstance(plain.refs, list)
    assert _listing_facts(compact) == _listing_facts(plain)
    assert [r.filename for r in plain.refs] == sorted(r.filename for r in plain.refs)
    assert all(r.key == stable_key(r.split, r.filename) and r.path == f"{ROOT}/{r.filename}"
               for r in compact.refs)


@pytest.mark.unit
def test_cifar_compact_equals_list():
    files = [(f"{ROOT}/train/1_cat.png", 5), (f"{ROOT}/test/2_dog.png", 6), (f"{ROOT}/test/3_emu.png", 7),
             (f"{ROOT}/test/odd.png", 8), (f"{ROOT}/labels.txt", 9), (f"{ROOT}/train/x/4_cat.png", 3)]
    compact = list_cifar(ROOT, iter(files), "cat\ndog\n", compact=True)
    plain = list_cifar(ROOT, files, "cat\ndog\n")
    assert _listing_facts(compact) == _listing_facts(plain)
    assert [d.error for d in plain.dead_letters] == ["unknown_class", "unlabeled", "unlabeled"]


@pytest.mark.unit
def test_mixed_split_folders_are_refused_either_way():
    files = [(f"{ROOT}/train/cat/a.jpg", 1), (f"{ROOT}/cats/b.jpg", 2)]
    for compact in (True, False):
        with pytest.raises(ValueError, match="ambiguous"):
            list_class_folders(ROOT, iter(files), compact=compact)


@pytest.mark.unit
def test_table_is_a_sequence_of_refs_and_pickles_small():
    table = list_class_folders(ROOT, iter(_files(2000)), compact=True).refs
    refs = list(table)
    assert len(refs) == len(table) == 2000
    assert table[0] == refs[0] and table[-1] == refs[-1] and table[3:6] == refs[3:6]
    assert table == refs
    assert isinstance(refs[0], ImageRef)
    packed = pack_refs(table)
    assert packed.count == 2000 and packed.unpack() == refs
    # Columns: ~84 bytes plus the path a reference (stamps and crc32c included).
    assert len(packed.packed) < 100 * 2000 < len(ImageRefs.pack(refs).packed)
    assert table.split_counts() == {s: sum(r.split == s for r in refs) for s in ("train", "val", "test")}
    kept = table.select(np.arange(2000) % 3 == 0)
    assert list(kept) == refs[::3]


def _old_plan(refs, band, compression="none"):
    """The plan of before issue 11, written out: the oracle."""
    by_split = {}
    for ref in refs:
        by_split.setdefault(ref.split, []).append(ref)
    specs = []
    for split in sorted(by_split):
        items = sorted(by_split[split], key=lambda r: (r.key, r.filename))
        sizes = [estimated_record_size(r) for r in items]
        num_shards, shard_of = cut_shards(sizes, band)
        members = [[] for _ in range(num_shards)]
        for position, index in enumerate(shard_of.tolist()):
            members[index].append(position)
        for index, positions in enumerate(members):
            specs.append((split, index, num_shards, shard_name(split, index, num_shards, compression),
                          sum(sizes[p] for p in positions), tuple(items[p] for p in positions)))
    return specs


@pytest.mark.parametrize("band", [ShardBand(1_000_000, 2_000_000), ShardBand(50_000, 60_000),
                                  ShardBand(10**9, 2 * 10**9)])
@pytest.mark.unit
def test_table_plan_equals_list_plan(band):
    listing = list_class_folders(ROOT, iter(_files(4000, seed=3)), compact=True)
    expected = _old_plan(sorted(listing.refs, key=lambda r: r.filename), band)
    for element in (pack_refs(listing.refs), ImageRefs.pack(list(listing.refs))):
        got = [(s.split, s.index, s.num_shards, s.name, s.planned_bytes, s.records.unpack())
               for s in image_shards(element, band, "none")]
        assert got == expected


@pytest.mark.unit
def test_path_buffer_gives_back_what_it_was_given():
    given = [(f"{ROOT}/a/é.jpg", 1, 7, 0xFFFFFFFF), ("gs://other/x.jpg", 2, 0, -1),
             (f"{ROOT}/b", 3, 1763800000123456789, 5)] * 3
    buffer = PathBuffer(ROOT)
    for item in given:
        buffer.add(*item)
    assert list(buffer) == given and len(buffer) == 9
    with pytest.raises(UnicodeEncodeError):
        buffer.add(f"{ROOT}/bad\udcff.jpg", 1)


@pytest.mark.unit
def test_list_images_splits_on_a_table_equal_the_list(tmp_path, monkeypatch):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=5, splits=None)
    splits = (("train", 0.7), ("test", 0.3))
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 10**9)
    plain = images.list_images(root, splits=splits)
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 0)
    compact = images.list_images(root, splits=splits)
    assert isinstance(compact.refs, RefTable) and isinstance(plain.refs, list)
    assert _listing_facts(compact) == _listing_facts(plain)


def _shard_digests(out):
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest()
            for p in glob.glob(os.path.join(out, "*.tfrecord"))}


@pytest.mark.e2e
@pytest.mark.parametrize("make", [make_class_folder_sample, make_cifar_sample])
def test_compact_listing_writes_the_same_shards(tmp_path, monkeypatch, run_convert, make):
    root = str(tmp_path / "in")
    make(root)
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 10**9)
    plain = run_convert(root, str(tmp_path / "plain"), shard_min_mb=0.002, shard_max_mb=0.004)
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 0)
    compact = run_convert(root, str(tmp_path / "compact"), shard_min_mb=0.002, shard_max_mb=0.004)
    assert plain.ok and compact.ok
    digests = _shard_digests(str(tmp_path / "plain"))
    assert len(digests) > 2
    assert _shard_digests(str(tmp_path / "compact")) == digests
    inputs = [open(tmp_path / d / "inputs.jsonl", "rb").read() for d in ("plain", "compact")]
    assert inputs[0] == inputs[1]


@pytest.mark.unit
def test_table_pickles_as_columns():
    table = list_class_folders(ROOT, iter(_files(100)), compact=True).refs
    again = pickle.loads(pickle.dumps(table))
    assert again == table and isinstance(again, RefTable)


def _stamped(count, seed=0):
    """``(path, size, stamp, crc)`` as a GCS listing gives them, in no sorted order."""
    rng = np.random.default_rng(seed)
    names = ["a", "b", "é", 'q"uote', "z\\back", "日本"]
    out = []
    for i in range(count):
        split = ("train", "val")[i % 2]
        name = f"{names[i % len(names)]}_{int(rng.integers(0, 10**6)):07d}.jpg"
        crc = -1 if i % 7 == 0 else int(rng.integers(0, 2**32))
        out.append((f"{ROOT}/{split}/c{i % 3}/{name}", int(rng.integers(1, 10**6)),
                    0 if i % 11 == 0 else 1763800000000000 + i, crc))
    return out


@pytest.mark.unit
def test_inputs_lines_from_columns_equal_encode_inputs():
    listed = _stamped(3000)
    table = list_class_folders(ROOT, iter(listed), compact=True).refs
    entries = table_entries(table)
    expected_entries = [InputFile(p[len(ROOT) + 1:], size, generation=str(stamp) if stamp else "",
                                  crc32c="%08x" % crc if crc >= 0 else "")
                        for p, size, stamp, crc in listed]
    assert sorted(entries, key=lambda e: e.path) == sorted(expected_entries, key=lambda e: e.path)
    roles = [InputFile("/x/labels.txt", 4, 5, "ab" * 32, role="labels")]
    streamed = b"".join(encode_inputs_chunks(roles, table_lines(table)))
    assert streamed == encode_inputs(roles + expected_entries)
    rows = np.arange(0, len(table), 3)
    assert b"".join(encode_inputs_chunks((), table_lines(table, rows))) == encode_inputs(
        table_entries(table, rows))


@pytest.mark.unit
def test_path_order_sorts_by_utf8_bytes_like_strings():
    table = list_class_folders(ROOT, iter(_stamped(500, seed=2)), compact=True).refs
    names = [table.filename(i) for i in range(len(table))]
    assert [names[i] for i in table.path_order()] == sorted(names)
    ordered = table.rows(table.path_order())
    assert ordered.path_order().tolist() == list(range(len(table)))


@pytest.mark.unit
def test_local_stamps_are_what_stat_says(tmp_path):
    root = str(tmp_path / "in")
    make_class_folder_sample(root, per_class=3, splits=None)
    listing = images.list_images(root)
    entries = table_entries(listing.files)
    paths = [(os.path.join(root, e.path), e.size) for e in entries]
    assert entries == file_entries(root, paths, [e.path for e in entries])


@pytest.mark.unit
def test_table_shard_specs_carry_their_rows_as_tables():
    listing = list_class_folders(ROOT, iter(_files(3000, seed=5)), compact=True)
    specs = list(image_shards(pack_refs(listing.refs), ShardBand(1_000_000, 2_000_000), "none"))
    assert len(specs) > 3
    for spec in specs:
        rows = spec.records.unpack()
        assert isinstance(rows, RefTable) and len(rows) == spec.records.count
    assert sum(spec.records.count for spec in specs) == len(listing.refs)


@pytest.mark.unit
def test_completing_inputs_in_one_pass_equals_the_entries_way():
    """The commit's one pass over inputs.jsonl (content hashes set, count and
    fingerprint) gives the bytes, count and fingerprint of decoding every line
    into an InputFile, replacing its hash, encoding and fingerprinting them."""
    rng = np.random.default_rng(7)
    entries = [InputFile("/data/labels.txt", 40, 123, sha256="ab" * 32, role="labels"),
               InputFile("/data/schema.json", 9, 0, crc32c="0000abcd", generation="17", role="schema")]
    for i in range(400):
        name = f"{'äöü'[i % 3]}\"x\\/{i:04d}.jpg" if i % 7 == 0 else f"c{i % 5}/{i:04d}.png"
        if i % 2:
            entries.append(InputFile(name, int(rng.integers(0, 10**6)), int(rng.integers(1, 2**62))))
        else:
            entries.append(InputFile(name, int(rng.integers(0, 10**6)), generation=str(i),
                                     crc32c=f"{i:08x}", sha256="cd" * 32 if i % 4 == 0 else ""))
    digests = {e.path: f"{i:064x}" for i, e in enumerate(entries) if i % 3 == 0}
    digests["/data/labels.txt"] = "ee" * 32  # A role file's name: its entry keeps its own hash.
    data = encode_inputs(entries)
    completed = [e if e.role or e.path not in digests else
                 InputFile(e.path, e.size, e.mtime_ns, digests[e.path], e.generation, e.crc32c)
                 for e in decode_inputs(data)]
    expected = (encode_inputs(completed), sum(1 for e in completed if not e.role),
                input_fingerprint(completed, "options"))
    assert complete_inputs(data, digests, "options") == expected
    # Lines out of encode_inputs' order (a file written by hand): sorted, same result.
    shuffled = data.splitlines(keepends=True)
    np.random.default_rng(3).shuffle(shuffled)
    assert complete_inputs(b"".join(shuffled), digests, "options") == expected
    # Longer than a block of lines.
    many = [InputFile(f"f/{i:07d}.png", i, i + 1) for i in range(70_000)]
    many_digests = {e.path: f"{i:064x}" for i, e in enumerate(many) if i % 2}
    done = [InputFile(e.path, e.size, e.mtime_ns, many_digests.get(e.path, "")) for e in many]
    assert complete_inputs(encode_inputs(many), many_digests, "o") == (
        encode_inputs(done), 70_000, input_fingerprint(done, "o"))
    assert expected[0] != data and expected[1] == 400
    lines = data.splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"size"', b'"sise"')
    with pytest.raises(ValueError, match="inputs.jsonl line 2: 'size'"):
        complete_inputs(b"".join(lines), digests, "options")
