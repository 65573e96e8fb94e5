"""Dead letters: one JSON line per bad input, in ``OUT/dead_letter/<name>.jsonl``.

``<name>`` is made from the input (a table file's name, a split and shard): it is
made safe first (``safe_name``), so a file name never holds a glob character, a
path separator or a control character. Each file is recorded in the output's
journal before it is written (``transforms.io.ownership``), so that the next run
can tell it from a user's file of the same name and remove it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from beam_tfrecords.schemas.elements import DeadLetter
from beam_tfrecords.schemas.manifest import DEAD_LETTER_DIR
from beam_tfrecords.transforms.io.ownership import write_owned

__all__ = ["safe_name", "write_dead_letters"]

# Letters and digits (any script), '_', '-' and '.' are kept; everything else is replaced.
_UNSAFE = re.compile(r"[^\w.-]")
_MAX_CHARS = 120


def safe_name(name: str) -> str:
    """``name`` as a file name: letters and digits (any script), '_', '-' and '.'
    are kept; anything else ('[', '*', '/', spaces, control characters, ...)
    becomes '_' (a leading '.' is dropped), and then the first 8 hex digits of the
    name's SHA-256 are added, so that two names that differ only there stay two
    files (``a[1]-00000`` -> ``a_1_-00000-460ac966``). A name that is safe
    already (and at most 120 characters) stays as it is."""
    safe = _UNSAFE.sub("_", name).lstrip(".")
    if safe == name and len(name) <= _MAX_CHARS:
        return name
    digest = hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{safe[:_MAX_CHARS]}-{digest}"


def write_dead_letters(output: str, name: str, letters: Sequence[DeadLetter]) -> str:
    """Writes ``letters`` to ``OUT/dead_letter/<safe_name(name)>.jsonl``.

    Returns:
      The file's path relative to ``output``; ``''`` when there are no letters
      (no file is written).
    """
    if not letters:
        return ""
    relative = f"{DEAD_LETTER_DIR}/{safe_name(name)}.jsonl"
    write_owned(output, relative, "".join(d.to_json_line() for d in letters).encode("utf-8"))
    return relative
