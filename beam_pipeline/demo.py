"""``make demo``: make a sample dataset, convert it, verify it, draw a contact sheet.

The sample has train/validation/test class folders of JPEG, PNG and GIF images,
a stray text file (ignored) and three broken images (dead-lettered), and is
converted with a small shard band so the output has several shards per split.
It works in a fresh temporary folder (``tempfile.mkdtemp``) unless given one
(``--workdir``, ``make demo DEMO_DIR=...``): an empty or missing folder, or one an
earlier demo made (it holds ``.beam-tfrecords-demo``), of which it replaces only
what it writes itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from beam_tfrecords.cli import main as cli_main
from beam_tfrecords.samples import make_class_folder_sample

__all__ = ["run_demo"]


def _break_some(root: str) -> None:
    """A truncated JPEG, a zero-byte file and a text file named .png."""
    source = os.path.join(root, "train", "circles", "circles_0000.jpg")
    with open(source, "rb") as f:
        jpeg = f.read()
    broken = {
        "train/circles/broken_truncated.jpg": jpeg[: len(jpeg) // 2],
        "train/squares/broken_empty.jpg": b"",
        "validation/stripes/broken_text.png": b"not a picture\n",
    }
    for rel, data in broken.items():
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)


_MARKER = ".beam-tfrecords-demo"


def _prepare(workdir: str) -> str:
    """Makes ``workdir`` ready for the demo; returns '' or why it cannot be used."""
    if os.path.islink(workdir) or (os.path.exists(workdir) and not os.path.isdir(workdir)):
        return f"{workdir} is not a folder"
    os.makedirs(workdir, exist_ok=True)
    names = set(os.listdir(workdir))
    if names and _MARKER not in names:
        return (f"{workdir} is not empty and no earlier demo made it; give an empty or new "
                "folder (or none: a fresh temporary one is made)")
    for name in names:  # An earlier demo's own files only.
        path = os.path.join(workdir, name)
        if name in ("input", "output") and os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif name.startswith("contact_sheet") and name.endswith(".png"):
            os.unlink(path)
    with open(os.path.join(workdir, _MARKER), "w", encoding="utf-8") as f:
        f.write("made by beam-tfrecords' demo (python -m beam_tfrecords.demo)\n")
    return ""


def run_demo(workdir: str) -> int:
    """Runs the demo in ``workdir`` (an empty or new folder, or an earlier demo's,
    whose files are replaced); returns the exit status."""
    problem = _prepare(workdir)
    if problem:
        print(f"demo: error: {problem}", file=sys.stderr)
        return 2
    print(f"== demo folder: {workdir}")
    source, output = os.path.join(workdir, "input"), os.path.join(workdir, "output")
    images = make_class_folder_sample(
        source, per_class=40, size_range=(160, 480), formats=("jpeg", "jpeg", "jpeg", "png", "gif")
    )
    _break_some(source)
    print(f"== sample dataset: {len(images)} images (+3 broken, +1 text file) in {source}")
    steps = [
        ["convert", "--input", source, "--output", output,
         "--shard_min_mb", "1", "--shard_max_mb", "2", "--max_bad_fraction", "0.01"],
        ["verify", output],
        ["inspect", output, "--contact_sheet", os.path.join(workdir, "contact_sheet.png")],
    ]
    for argv in steps:
        print(f"\n== beam-tfrecords {' '.join(argv)}", flush=True)
        code = cli_main(argv)
        if code != 0:
            print(f"demo: step '{argv[0]}' failed with exit status {code}", file=sys.stderr)
            return code
    print(f"\n== done, all in {workdir}\noutput:        {output}"
          f"\nmanifest:      {os.path.join(output, 'manifest.json')}"
          f"\ndead letter:   {os.path.join(output, 'dead_letter')}"
          f"\ncontact sheets: {os.path.join(workdir, 'contact_sheet-<split>.png')}"
          f"\n(remove the folder when done: rm -r {workdir})")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="",
                        help="the demo's folder (default: a fresh temporary folder)")
    workdir = parser.parse_args().workdir or tempfile.mkdtemp(prefix="beam-tfrecords-demo-")
    return run_demo(os.path.abspath(workdir))


if __name__ == "__main__":
    sys.exit(main())
