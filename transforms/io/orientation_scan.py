"""EXIF orientations read on the launcher from the images' first bytes (issue 21).

An annotated image whose annotations state no size is stored as its file holds it and
its boxes are taken as given; when its EXIF orientation is not 1, a viewer shows it
turned, TensorFlow's decoders do not, and boxes drawn on the displayed picture miss
their objects. The plan names such images (``plan_lines.describe_annotated``): this
reads each one's orientation from at most ``HEADER_BYTES`` of its file
(``codec.orientation.header_orientation``), in a pool of threads like the launcher's
other reads. Local files only: a ``gs://`` input is left to the workers, which count
them (``exif_orientation_not_applied``).
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence

from beam_tfrecords.transforms.codec.orientation import header_orientation

__all__ = ["HEADER_BYTES", "READ_THREADS", "orientations"]

HEADER_BYTES = 64 * 1024  # A JPEG's EXIF block (APP1) holds at most 64 KiB.
READ_THREADS = 16


def _orientation(path: str) -> int:
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except (OSError, ValueError):
        return 1  # Not readable here: the workers read it, and refuse it if need be.
    return header_orientation(head)


def orientations(paths: Sequence[str], threads: int = READ_THREADS) -> list[int]:
    """The EXIF orientation (1-8) of each local file of ``paths``, in their order; 1
    for a file without one or that cannot be read."""
    if len(paths) < 2 * threads:
        return [_orientation(path) for path in paths]
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="exif-orientation") as pool:
        return list(pool.map(_orientation, paths, chunksize=64))
