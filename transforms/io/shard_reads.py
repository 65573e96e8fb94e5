"""Reading a published shard at byte offsets, locally or on ``gs://``, without Beam.

What a map-style reader (``beam_tfrecords.DataSource``) needs: a shard opened once
per process, proved to be the one the manifest lists (its size; on GCS also the
CRC-32C GCS keeps of it), then read at any offset. Locally that is one ``pread``
on a descriptor kept open; on GCS one ranged media GET of the generation seen when
it was opened, so an object replaced since is noticed (GCS answers 404 for a
generation that is gone; a server that serves the live one all the same is caught
by the generation it reports) instead of being read as if nothing had changed.

No Beam import: on GCS this goes through ``gcs.storage_client`` (made on first
use, in the process that reads).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from beam_tfrecords.transforms.io import gcs

__all__ = ["ShardChanged", "ShardFile", "read_small_file"]

_BLOCK = 1 << 20


class ShardChanged(OSError):
    """A shard that is not (or no longer) the file the manifest lists."""


def read_small_file(path: str) -> bytes | None:
    """A small file's bytes (a manifest, an index file); ``None`` when it is missing."""
    if gcs.is_gcs(path):
        found = gcs.read_generation(path)
        return None if found is None else found[0]
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class ShardFile:
    """One shard, opened and proved on first use, read at offsets.

    Args:
      path: the shard's path (local or ``gs://``).
      size: its size in bytes, as the manifest lists it.
      crc32c: its CRC-32C (8 hex digits), as the manifest lists it (checked on GCS,
        where the store keeps one; locally the records' own CRCs are the check).
    """

    def __init__(self, path: str, size: int, crc32c: str):
        self.path = path
        self.size = size
        self.crc32c = crc32c
        self._fd: int | None = None
        self._generation = 0

    def open(self) -> None:
        """Opens and proves the shard now (``read`` does it on first use otherwise);
        nothing when it is open already.

        Raises:
          ShardChanged: when the shard is not the one listed.
          FileNotFoundError: when it is missing.
        """
        if self._fd is None and not self._generation:
            self._open()

    def _open(self) -> None:
        if gcs.is_gcs(self.path):
            info = gcs.object_info(self.path)
            if info.size != self.size or (info.crc32c and info.crc32c != self.crc32c):
                raise ShardChanged(f"{self.path} is not the shard the manifest lists (size "
                                   f"{info.size}, crc32c {info.crc32c}; listed {self.size}, "
                                   f"{self.crc32c})")
            self._generation = info.generation
            return
        fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        found = os.fstat(fd).st_size
        if found != self.size:
            os.close(fd)
            raise ShardChanged(f"{self.path} is {found} bytes; the manifest lists {self.size}")
        self._fd = fd

    def read(self, start: int, length: int) -> bytes:
        """Bytes ``[start, start + length)`` (fewer only when the file is shorter).

        Raises:
          ShardChanged: when the shard is not (or no longer) the one listed.
          FileNotFoundError: when it is missing.
        """
        if self._fd is None and not self._generation:
            self._open()
        if self._fd is not None:
            return os.pread(self._fd, length, start)
        return self._read_gcs(start, length)

    def _read_gcs(self, start: int, length: int) -> bytes:
        # pylint: disable=import-outside-toplevel
        from google.api_core import exceptions as api

        bucket, _, name = self.path[len("gs://"):].partition("/")
        blob = gcs.storage_client().bucket(bucket).blob(name, generation=self._generation)
        try:
            data = blob.download_as_bytes(start=start, end=start + length - 1, raw_download=True,
                                          checksum=None)
        except api.NotFound:
            raise ShardChanged(f"{self.path}: generation {self._generation} is gone (the object "
                               "was replaced or deleted since it was opened)") from None
        served = blob._properties.get("generation")  # pylint: disable=protected-access
        if served and int(served) != self._generation:
            raise ShardChanged(f"{self.path}: generation {served} was served, {self._generation} "
                               "was opened (the object was replaced)")
        return data

    def blocks(self) -> Iterator[bytes]:
        """The whole shard, a block at a time, in order."""
        for start in range(0, self.size, _BLOCK):
            want = min(_BLOCK, self.size - start)
            data = self.read(start, want)
            if len(data) < want:
                raise ShardChanged(f"{self.path} ends before byte {self.size}")
            yield data

    def close(self) -> None:
        """Closes the descriptor (the next read opens the shard again)."""
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self._generation = 0
