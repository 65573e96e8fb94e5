"""A piece of ``inputs.jsonl`` completed with its files' content hashes: the work of
``transforms.gather``'s gathering step for one piece, in the step's process or, for a
run whose temporary folder is local, in a helper process (``transforms.io.helpers``)
while the step tallies copies. It imports no Beam (a helper does not load it): the
step hands its file functions, a helper uses plain files.
"""

from __future__ import annotations

import marshal
import os
from collections.abc import Callable, Iterable, Sequence

from beam_tfrecords.schemas.inputs import complete_lines

__all__ = ["complete_local_piece", "complete_piece", "piece_bytes"]


def piece_bytes(ranges: Sequence[tuple[str, int, int]], open_read: Callable) -> bytes:
    """A piece's lines, read range by range with ``open_read(path)`` (a source that does
    not end its last line has one added, so that two sources never run into one line)."""
    parts = []
    for source, start, end in ranges:
        if start == end:
            continue
        with open_read(source) as stream:
            stream.seek(start)
            data = stream.read(end - start)
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    return b"".join(parts)


def complete_piece(ranges: Sequence[tuple[str, int, int]], digests: dict, excluded: set, path: str,
                   open_read: Callable, write_bytes: Callable) -> tuple:
    """Completes the lines of ``ranges`` with ``digests`` (``filename -> sha256``),
    leaving out ``excluded``, and writes them (then the files' fingerprint tokens) to
    ``path`` with ``write_bytes(path, data)``. Returns ``(lines_size, size,
    role_tokens, files, first_key, last_key)``."""
    data = piece_bytes(ranges, open_read)
    source, start, _ = ranges[0]
    where = f"{source.rsplit('/', 1)[-1]} (a piece from byte {start:,})"
    part = complete_lines(data, digests, excluded, source=where, sort=True)
    del data
    write_bytes(path, part.lines + part.file_tokens)
    return (len(part.lines), len(part.lines) + len(part.file_tokens), part.role_tokens, part.files,
            part.first_key, part.last_key)


def _write_local(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as out:
        out.write(data)


def _open_local(path: str):
    return open(path, "rb")  # pylint: disable=consider-using-with  # Closed by the caller's with.


def complete_local_piece(ranges: Sequence[tuple[str, int, int]], names: Iterable[bytes], excluded: set,
                         path: str) -> tuple:
    """``complete_piece`` of local files, in a helper process: ``names`` are the
    marshalled ``[(filename, sha256), ...]`` lists the step was handed."""
    digests: dict = {}
    for blob in names:
        digests.update(marshal.loads(blob))
    return complete_piece(ranges, digests, excluded, path, _open_local, _write_local)
