"""Dead letters: one JSON line per bad input, in ``OUT/dead_letter/<name>.jsonl``."""

from __future__ import annotations

from collections.abc import Sequence

from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR
from beam_tfrecords.transforms.io import files

__all__ = ["write_dead_letters"]


def write_dead_letters(output: str, name: str, letters: Sequence[DeadLetter]) -> str:
    """Writes ``letters`` to ``OUT/dead_letter/<name>.jsonl``.

    Returns:
      The file's path relative to ``output``; ``''`` when there are no letters
      (no file is written).
    """
    if not letters:
        return ""
    relative = f"{DEAD_LETTER_DIR}/{name}.jsonl"
    files.write_bytes(files.join(output, relative),
                      "".join(d.to_json_line() for d in letters).encode("utf-8"))
    return relative
