"""A local folder listed a folder at a time, as columns (issue 23, LIST): the same
files, notes, references, order and dead letters as a stream of paths gives."""

import dataclasses
import os
import re

import pytest

from beam_tfrecords.samples import make_cifar_sample
from beam_tfrecords.transforms import image_listing
from beam_tfrecords.transforms.codec.image_inspection import is_image_filename
from beam_tfrecords.transforms.io import files, folder_walk
from beam_tfrecords.transforms.plan import ref_table
from beam_tfrecords.transforms.plan.ref_table import RefTable


def _tree(root):
    """Class folders with what a walk must pass over or note: hard links (one folder and
    two), a FIFO, links to a file, a folder, a loop and outside, a broken link, a
    folder named like an image, a non-image file, a name that is not UTF-8."""
    outside = root.parent / "outside"
    (outside / "o").mkdir(parents=True)
    (outside / "o" / "x.png").write_bytes(b"o")
    for folder in ("in/cat", "in/dog", "in/x.png/bird", "in/deep/a/b"):
        (root.parent / folder).mkdir(parents=True, exist_ok=True)
    (root / "cat" / "1.png").write_bytes(b"one")
    (root / "cat" / "2.JPG").write_bytes(b"two!")
    os.link(root / "cat" / "1.png", root / "cat" / "0hard.png")
    os.link(root / "cat" / "2.JPG", root / "dog" / "hard2.jpg")
    (root / "dog" / "3.png").write_bytes(b"three")
    (root / "dog" / ".png").write_bytes(b"dot file")
    (root / "dog" / "notes.txt").write_bytes(b"text")
    os.mkfifo(root / "dog" / "fifo.png")
    os.symlink("../cat", root / "dog" / "linkcat")
    os.symlink("..", root / "cat" / "loop")
    os.symlink(str(outside), root / "outside_link")
    os.symlink("cat/1.png", root / "filelink.png")
    os.symlink("nowhere", root / "broken.png")
    (root / "x.png" / "bird" / "b.gif").write_bytes(b"bird")
    (root / "deep" / "a" / "b" / "é.png").write_bytes(b"deep")
    (root / "top.png").write_bytes(b"top")
    with open(os.fsencode(str(root / "cat")) + b"/bad\xff.png", "wb") as out:
        out.write(b"bad")


@pytest.mark.unit
def test_a_folder_scan_equals_an_entry_by_entry_scan(tmp_path):
    """The fast scan (listdir and lstat at the folder's descriptor) finds what the
    scan entry by entry finds (its fallback), with the same notes."""
    root = tmp_path / "in"
    _tree(root)
    for folder in (root, root / "cat", root / "dog"):
        fast_notes, slow_notes = [], []
        fast = folder_walk._scan(str(folder), fast_notes.append)  # pylint: disable=protected-access
        slow = folder_walk._scan_entries(str(folder), str(folder) + "/", slow_notes.append)  # pylint: disable=protected-access
        assert (fast.prefix, fast.names, fast.dirs, fast.links) == (slow.prefix, slow.names, slow.dirs, slow.links)
        assert [info.st_ino for info in fast.infos] == [info.st_ino for info in slow.infos]
        assert fast_notes == slow_notes


@pytest.mark.unit
def test_the_walk_lists_each_file_once_and_notes_what_it_passes_over(tmp_path):
    root = tmp_path / "in"
    _tree(root)
    skipped = []
    found = list(files.list_stamped(f"{root}/**", skipped=skipped))
    shown = [path[len(str(root)) + 1:] for path, *_ in found]
    assert shown == ["top.png", "cat/0hard.png", "cat/2.JPG", "cat/bad\udcff.png", "deep/a/b/é.png",
                     "dog/.png", "dog/3.png", "dog/notes.txt", "x.png/bird/b.gif"]
    assert [size for _, size, _, _ in found] == [3, 3, 4, 3, 4, 8, 5, 4, 4]
    notes = [(path[len(str(root)) + 1:], reason) for path, reason, _ in skipped]
    assert notes == [("x.png", "folder_named_like_an_image"),
                     ("cat/1.png", "duplicate"), ("dog/fifo.png", "not_a_regular_file"),
                     ("dog/hard2.jpg", "duplicate"), ("broken.png", "unreadable"),
                     ("cat/loop", "link_loop"), ("dog/linkcat", "duplicate"),
                     ("filelink.png", "duplicate"), ("outside_link", "link_outside_input")]
    assert "the same file as cat/0hard.png" in skipped[1][2]
    assert "the same file as cat/2.JPG" in skipped[3][2] and "as the input folder" in skipped[5][2]
    batches = list(files.folder_batches(f"{root}/**", follow_outside=True))
    assert [(b.prefix[len(str(root)):], b.names) for b in batches][-1] == ("/outside_link/o/", ["x.png"])
    assert files.folder_batches(f"{root}/*/**") is None and files.folder_batches("gs://b/x/**") is None


@pytest.mark.unit
def test_image_names_and_cifar_names_at_once_equal_one_at_a_time():
    names = ["a.png", ".png", "..png", ".a.jpg", "a..jpg", "x.JpEg", "a.png.txt", "...", "noext", "a.",
             "İ.tif", "a.tİf", "b.\u212apng", "c.TIFF", "d.webp~", "日本.gif", "1_cat.png", "x_y_z.bmp"]
    assert ref_table._image_names(names) == [is_image_filename(n) for n in names]  # pylint: disable=protected-access
    pattern = re.compile(r"^(?P<id>[^_/]+)_(?P<cls>[^/]+)\.[A-Za-z0-9]+$")
    for batch in (["1_cat.png", "22_big_dog.jpeg", "3_a.b.png"],
                  ["1_cat.png", "nocls.png", "_x.png", "1_.png", "2_cat.pn~", "4_cat.p_g"],
                  ["1_cat.png", "2_c\nat.png"], ["5_é.PNG"]):
        expected = [m["cls"] if m else None for m in map(pattern.match, batch)]
        assert ref_table._cifar_classes(batch) == expected, batch  # pylint: disable=protected-access


def _facts(listing):
    fields = {f.name: getattr(listing, f.name) for f in dataclasses.fields(listing) if f.name not in ("refs", "files")}
    return list(listing.refs), fields


@pytest.mark.unit
@pytest.mark.parametrize("layout", ["class_folders", "cifar"])
def test_a_folder_listed_in_batches_equals_the_stream_and_the_list(tmp_path, monkeypatch, layout):
    """The listing of a folder (batches, a table in path order) holds the references of
    the stream of paths (a glob takes it) and of the list of before, in the same order,
    with the same dead letters, ignored files and notes."""
    root = tmp_path / "in"
    if layout == "cifar":
        make_cifar_sample(str(root))
        (root / "train" / "no_class_here.png").write_bytes(b"x")
        (root / "train" / "7_zebra.png").write_bytes(b"x")
        (root / "stray.png").write_bytes(b"x")
    else:
        _tree(root)
    batched = image_listing.list_images(str(root), layout=layout)
    assert isinstance(batched.refs, RefTable) and len(batched.refs) > 3
    assert [ref.filename for ref in batched.refs] == sorted(ref.filename for ref in batched.refs)
    streamed = image_listing.list_images(str(root) + "/[!!]**", layout=layout)
    assert _facts(streamed) == _facts(batched)
    monkeypatch.setattr(image_listing, "COMPACT_LISTING_REFS", 10**9)
    listed = image_listing.list_images(str(root), layout=layout)
    assert isinstance(listed.refs, list) and _facts(listed) == _facts(batched)
    errors = {d.error for d in batched.dead_letters}
    assert errors >= ({"unlabeled", "unknown_class"} if layout == "cifar" else {"no_class_folder", "bad_file_name"})
