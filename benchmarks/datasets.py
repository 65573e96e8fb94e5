"""Deterministic synthetic image sets for the image benchmark.

Two layouts, both reproducible from a seed (every image is drawn from its own
``numpy`` generator seeded with ``[seed, split, index]``, so the output does not
depend on how work is spread over processes):

* ``make_cifar_like``: ``root/{train,test}/<ID>_<CLASS>.png`` 32x32 RGB PNGs of
  about 2-3 KB each plus ``root/labels.txt``, like the PNG export of CIFAR-10.
* ``make_photo_like``: ``root/<class>/<name>.jpg`` JPEGs 320-1024 px wide of
  about 150-250 KB each, until a total size is reached.
* ``make_photo_copies``: a photo set made ``copies`` times larger, for scaling
  runs: copy ``k`` of ``src/<class>/<name>.jpg`` is ``root/<class>_copy<k>/<name>.jpg``
  (copy 0 keeps the class name). Copy 0 is a hard link to the source; every
  other copy is a distinct file with distinct bytes (a JPEG comment segment
  naming the copy is inserted after the start-of-image marker). Hard links of
  one file within one set would not do: our converter lists a file reached
  through two paths once (by device and inode), and identical bytes would show
  up in its duplicate report.

A set is complete once ``root/.complete`` exists; it is written last and records
the parameters, so an interrupted or differently sized set is rebuilt and a
complete one is reused as is.

Run as a script to build both sets: ``python benchmarks/datasets.py ROOT``.
"""

import argparse
import io
import json
import multiprocessing
import os
import shutil
import time

import numpy as np
from PIL import Image

CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck")
PHOTO_CLASSES = ("beach", "bridge", "canyon", "desert", "forest",
                 "glacier", "harbor", "meadow", "mountain", "street")
MARKER = ".complete"
_PHOTO_SPLIT = 2  # Seed component that keeps photo images apart from CIFAR splits.
_BATCH = 64  # Photos encoded per round before checking the running total.


def _read_marker(root):
    """Returns the parameters stored in ``root``'s marker, or None if incomplete."""
    try:
        with open(os.path.join(root, MARKER)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _start(root, params):
    """Prepares ``root`` for a build.

    Args:
        root: Target folder.
        params: JSON-serialisable parameters of the requested set.

    Returns:
        True if ``root`` already holds a complete set built with ``params``
        (reported on stdout); otherwise False, after emptying ``root``.
    """
    if _read_marker(root) == params:
        print(f"{params['kind']}: reusing the complete set in {root}", flush=True)
        return True
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    return False


def _finish(root, params, started, kind):
    """Writes the marker and prints a summary of the set in ``root``."""
    files = total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            files += 1
            total += os.path.getsize(os.path.join(folder, name))
    with open(os.path.join(root, MARKER), "w") as f:
        json.dump(params, f)
    print(f"{kind}: generated {files} files, {total / 1e6:.1f} MB in "
          f"{time.perf_counter() - started:.1f} s -> {root}", flush=True)


def _cifar_png(rng):
    """Draws one 32x32 RGB picture: a tinted gradient, a few soft blobs, light noise.

    Args:
        rng: The image's own ``numpy.random.Generator``.

    Returns:
        The PNG-encoded bytes (about 2-3 KB).
    """
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    slope = rng.uniform(-1, 1, 2)
    img = (rng.uniform(40, 215, 3)
           + (slope[0] * (xx - 16) + slope[1] * (yy - 16))[..., None]
           * rng.uniform(1, 4, 3))
    for _ in range(rng.integers(2, 6)):
        cx, cy = rng.uniform(0, 32, 2)
        radius = rng.uniform(3, 12)
        mask = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * radius ** 2))[..., None]
        img = img * (1 - mask) + rng.uniform(0, 255, 3) * mask
    img += rng.normal(0, rng.uniform(5, 12), img.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _write_cifar(job):
    """Pool task: writes one CIFAR-like PNG.

    Args:
        job: ``(path, seed, split_index, image_index)``.
    """
    path, seed, split, index = job
    with open(path, "wb") as f:
        f.write(_cifar_png(np.random.default_rng([seed, split, index])))


def _photo_jpeg(job):
    """Pool task: draws one smooth, noisy photo-like picture.

    The picture is a coarse random colour grid upscaled bicubically plus
    Gaussian noise, which JPEG at quality 90 encodes to about 190 KB on average.

    Args:
        job: ``(seed, index)``.

    Returns:
        The JPEG-encoded bytes.
    """
    seed, index = job
    rng = np.random.default_rng([seed, _PHOTO_SPLIT, index])
    width = int(rng.integers(320, 1025))
    height = int(round(width / rng.uniform(3 / 4, 4 / 3)))
    grid = rng.uniform(0, 255, (*rng.integers(3, 9, 2), 3)).astype(np.uint8)
    img = np.asarray(Image.fromarray(grid).resize((width, height), Image.BICUBIC),
                     dtype=np.float32)
    img += rng.standard_normal(img.shape, dtype=np.float32) * 13
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_cifar_like(root, n=60000, seed=0, processes=2):
    """Builds a CIFAR-10-like PNG set unless ``root`` already holds it.

    Classes are balanced: image ``i`` of a split has class ``i % 10``. With the
    default ``n`` the splits hold 50,000 and 10,000 images; other ``n`` keep
    that 5:1 ratio.

    Args:
        root: Target folder.
        n: Total number of images.
        seed: Seed of the set.
        processes: Size of the worker pool.

    Returns:
        ``root``.
    """
    params = {"kind": "cifar", "n": n, "seed": seed}
    if _start(root, params):
        return root
    started = time.perf_counter()
    with open(os.path.join(root, "labels.txt"), "w") as f:
        f.write("\n".join(CIFAR_CLASSES) + "\n")
    n_train = n * 5 // 6  # 50,000 of 60,000, as in CIFAR-10.
    jobs = []
    for split, (name, count) in enumerate((("train", n_train), ("test", n - n_train))):
        os.makedirs(os.path.join(root, name))
        jobs += [(os.path.join(root, name, f"{i:05d}_{CIFAR_CLASSES[i % 10]}.png"),
                  seed, split, i) for i in range(count)]
    with multiprocessing.Pool(processes) as pool:
        for _ in pool.imap_unordered(_write_cifar, jobs, chunksize=500):
            pass
    _finish(root, params, started, "cifar")
    return root


def make_photo_like(root, total_mb=600, seed=0, processes=2):
    """Builds a photo-like JPEG set of about ``total_mb`` MB unless ``root`` holds it.

    Images are drawn in index order and written until their total size first
    reaches ``total_mb`` (1 MB = 10^6 bytes). Image ``i`` has class ``i % 10``
    and is written as ``root/<class>/img_<i>.jpg``.

    Args:
        root: Target folder.
        total_mb: Size at which to stop.
        seed: Seed of the set.
        processes: Size of the worker pool.

    Returns:
        ``root``.
    """
    params = {"kind": "photo", "total_mb": total_mb, "seed": seed}
    if _start(root, params):
        return root
    started = time.perf_counter()
    for name in PHOTO_CLASSES:
        os.makedirs(os.path.join(root, name))
    target, written, index = total_mb * 1e6, 0, 0
    with multiprocessing.Pool(processes) as pool:
        while written < target:
            batch = pool.map(_photo_jpeg, [(seed, index + k) for k in range(_BATCH)])
            for data in batch:
                cls = PHOTO_CLASSES[index % len(PHOTO_CLASSES)]
                with open(os.path.join(root, cls, f"img_{index:06d}.jpg"), "wb") as f:
                    f.write(data)
                written += len(data)
                index += 1
                if written >= target:
                    break
    _finish(root, params, started, "photo")
    return root


def _marked_copy(data, copy):
    """Returns JPEG bytes with a comment segment naming ``copy`` after the SOI marker.

    The picture decodes to the same pixels; only the file's bytes (and so its
    SHA-256) differ.
    """
    if data[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG: no start-of-image marker")
    comment = f"benchmark copy {copy}".encode()
    segment = b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment
    return data[:2] + segment + data[2:]


def make_photo_copies(src, root, copies, link_from=None):
    """Builds ``copies`` copies of the photo set ``src`` unless ``root`` holds them.

    Args:
        src: A complete set of ``make_photo_like``.
        root: Target folder.
        copies: Number of copies (1 gives a set equal to ``src``, hard-linked).
        link_from: Optional complete set of ``make_photo_copies`` of the same
            ``src`` with at least as many copies; its files are hard-linked
            instead of written again (so a 3x set costs no disk next to a 10x one).

    Returns:
        ``root``.

    Raises:
        ValueError: If ``src`` (or ``link_from``) is not a complete set.
    """
    source = _read_marker(src)
    if source is None or source.get("kind") != "photo":
        raise ValueError(f"{src} is not a complete photo set")
    params = {"kind": "photo_copies", "source": source, "copies": copies}
    if _start(root, params):
        return root
    if link_from is not None:
        other = _read_marker(link_from)
        if (other is None or other.get("source") != source
                or other.get("copies", 0) < copies):
            raise ValueError(f"{link_from} is not a complete copy set of {src} "
                             f"with at least {copies} copies")
    started = time.perf_counter()
    classes = sorted(d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d)))
    for copy in range(copies):
        for cls in classes:
            folder = cls if copy == 0 else f"{cls}_copy{copy}"
            os.makedirs(os.path.join(root, folder))
            for name in sorted(os.listdir(os.path.join(src, cls))):
                target = os.path.join(root, folder, name)
                if link_from is not None:
                    os.link(os.path.join(link_from, folder, name), target)
                elif copy == 0:
                    os.link(os.path.join(src, cls, name), target)
                else:
                    with open(os.path.join(src, cls, name), "rb") as f:
                        data = _marked_copy(f.read(), copy)
                    with open(target, "wb") as f:
                        f.write(data)
    _finish(root, params, started, f"photo x{copies}")
    return root


def main():
    """Builds both sets under the folder given on the command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("root", help="folder to hold cifar/ and photo/")
    parser.add_argument("--photo_mb", type=int, default=600)
    args = parser.parse_args()
    make_cifar_like(os.path.join(args.root, "cifar"))
    make_photo_like(os.path.join(args.root, "photo"), total_mb=args.photo_mb)


if __name__ == "__main__":
    main()
