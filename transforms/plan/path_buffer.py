"""``PathBuffer``: a listing's paths, sizes, times and CRCs held compactly to be read
again (one UTF-8 blob and arrays; moved out of ``plan.ref_table``, which re-exports it)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator

__all__ = ["PathBuffer"]

_BLOCK = 1 << 16  # Paths joined into the blob a block at a time.


class PathBuffer:
    """A listing's ``(path, size, stamp, crc)`` held compactly, to be read again:
    the paths under ``root`` as UTF-8 relative paths in one growing blob, the
    numbers in arrays (``stamp``: modification time in ns or GCS generation, 0
    when not known; ``crc``: a GCS object's CRC-32C, -1 when not known).

    ``add`` raises ``UnicodeEncodeError`` for a path that is not UTF-8 text.
    """

    def __init__(self, root: str):
        self._prefix = root.rstrip("/") + "/"
        self._blobs: list[bytes] = []
        self._pending: list[bytes] = []
        self._lengths = array("q")
        self._sizes = array("q")
        self._stamps = array("q")
        self._crcs = array("q")
        self._outside: list[int] = []  # Indices of paths stored whole (not under root).

    def add(self, path: str, size: int, stamp: int = 0, crc: int = -1) -> None:
        encoded = path.encode("utf-8")
        if path.startswith(self._prefix):
            encoded = encoded[len(self._prefix.encode("utf-8")):]
        else:
            self._outside.append(len(self._sizes))
        self._pending.append(encoded)
        self._lengths.append(len(encoded))
        self._sizes.append(size)
        self._stamps.append(stamp)
        self._crcs.append(crc)
        if len(self._pending) >= _BLOCK:
            self._blobs.append(b"".join(self._pending))
            self._pending = []

    def __len__(self) -> int:
        return len(self._sizes)

    def __iter__(self) -> Iterator[tuple[str, int, int, int]]:
        if self._pending:
            self._blobs.append(b"".join(self._pending))
            self._pending = []
        outside = set(self._outside)
        index = 0
        for blob in self._blobs:
            offset = 0
            view = memoryview(blob)
            while offset < len(blob):
                end = offset + self._lengths[index]
                text = str(view[offset:end], "utf-8")
                yield ((text if index in outside else self._prefix + text), self._sizes[index],
                       self._stamps[index], self._crcs[index])
                offset = end
                index += 1
