"""Turning one image file into one framed record, or into a dead letter.

This module imports no Beam at load time, so the shard writer's helper
processes start in a fraction of a second: they only need ``schemas``. Paths
with a ``scheme://`` are read through Beam's filesystems, imported on first use.
"""

from __future__ import annotations

from schemas.image_example import encode_image_example
from schemas.images import ImageError, inspect_image
from schemas.records import DeadLetter, ImageRef
from schemas.tfrecord import frame_record

__all__ = ["encode_chunk", "encode_image"]


def _read(path: str) -> bytes:
    if "://" not in path:
        with open(path, "rb") as f:
            return f.read()
    from transforms import files  # pylint: disable=import-outside-toplevel

    return files.read_bytes(path)


def _read_errors() -> tuple[type[BaseException], ...]:
    try:
        from apache_beam.io.filesystem import BeamIOError  # pylint: disable=import-outside-toplevel
    except ImportError:  # pragma: no cover - Beam is a dependency.
        return (OSError,)
    return (OSError, BeamIOError)


def encode_image(ref: ImageRef, validate: str) -> bytes | DeadLetter:
    """Reads, checks and encodes one image: its framed record, or why it was refused."""
    try:
        data = _read(ref.path)
    except _read_errors() as err:
        return DeadLetter(ref.path, "read", "read_error", f"cannot read the file: {err}")
    try:
        info = inspect_image(data, validate)
    except ImageError as err:
        return DeadLetter(ref.path, "validate", err.reason, err.message)
    try:
        example = encode_image_example(
            data, info, ref.label, ref.label_text, ref.filename, ref.extra
        )
    except (ValueError, TypeError, OverflowError) as err:
        return DeadLetter(ref.path, "encode", "encode_error", f"cannot encode the record: {err}")
    return frame_record(example)


def encode_chunk(chunk: list[ImageRef], validate: str) -> tuple[bytes, list[int | DeadLetter]]:
    """``encode_image`` over a run of files: one task for a thread or a process.

    Returns:
      The framed records of the good files, concatenated in order (one object to
      pass back instead of many), and per file either its framed size or its
      dead letter.
    """
    framed, outcomes = [], []
    for ref in chunk:
        outcome = encode_image(ref, validate)
        if isinstance(outcome, DeadLetter):
            outcomes.append(outcome)
        else:
            framed.append(outcome)
            outcomes.append(len(outcome))
    return b"".join(framed), outcomes
