"""One path, one outcome: odd entries in an image folder are each converted once, or
dead-lettered, or passed over with a reason, and none stops the run."""

import json
import os

import pytest

from beam_tfrecords.cli import main
from beam_tfrecords.samples import make_class_folder_sample
from tests.conftest import load_manifest, read_dataset

pytestmark = pytest.mark.e2e

SECRET = "password=hunter2 do-not-leak"


@pytest.fixture()
def odd_tree(tmp_path):
    root = tmp_path / "in"
    relative = make_class_folder_sample(str(root), per_class=5, splits=None)
    os.symlink(root / "circles", root / "circles_again")      # the same folder under another name
    os.symlink(root, root / "squares" / "loop")                # a link loop
    os.mkfifo(root / "stripes" / "pipe.jpg")                   # a FIFO named like an image
    os.mkdir(root / "stripes" / "folder.jpg")                  # a folder named like an image
    (tmp_path / "secret.txt").write_text(SECRET)
    os.symlink(tmp_path / "secret.txt", root / "triangles" / "leak.jpg")  # not an image
    bad_name = os.fsencode(str(root / "triangles")) + b"/caf\xe9.jpg"      # not UTF-8
    with open(bad_name, "wb") as f, open(root / relative[0], "rb") as good:
        f.write(good.read())
    return root, relative


def test_each_odd_path_has_one_outcome(odd_tree, tmp_path, capsys):
    root, relative = odd_tree
    out = str(tmp_path / "out")
    assert main(["convert", "--input", str(root), "--output", out, "--max_bad_fraction", "0.2"]) == 0
    printed = capsys.readouterr().out
    names = sorted(r["image/filename"][0].decode() for split in read_dataset(out).values() for r in split)
    assert names == sorted(relative)  # Each real image once; nothing through the links.
    manifest = load_manifest(out)
    assert manifest["input"]["skipped"]["by_reason"] == {
        "duplicate": 1, "folder_named_like_an_image": 1, "link_loop": 1, "not_a_regular_file": 1,
        "link_outside_input": 1}
    with open(os.path.join(out, manifest["input"]["skipped"]["file"]), encoding="utf-8") as f:
        skipped = {os.path.basename(json.loads(line)["source"]): json.loads(line)["error"] for line in f}
    assert skipped == {"circles_again": "duplicate", "loop": "link_loop",
                       "pipe.jpg": "not_a_regular_file", "folder.jpg": "folder_named_like_an_image",
                       "leak.jpg": "link_outside_input"}  # Not followed without --follow_links_outside.
    assert manifest["bad_records"]["by_reason"] == {"bad_file_name": 1}
    letters = []
    for path in manifest["bad_records"]["dead_letter_files"]:
        with open(os.path.join(out, path), encoding="utf-8") as f:
            letters += [json.loads(line) for line in f]
    by_error = {d["error"]: d for d in letters}
    assert by_error["bad_file_name"]["source"].endswith("triangles/caf\\xe9.jpg")
    assert SECRET not in json.dumps(letters) and "hunter2" not in printed  # No content echoed.
    assert "paths passed over while listing" in printed
