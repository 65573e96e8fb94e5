"""Class and split names that must not be told apart by how they are written.

Two names that differ only in Unicode normalization (NFC ``café`` and NFD
``café`` print the same) or in letter case (``Cat`` and ``cat``; ``TRAIN`` and
``train``, whose shard files collide on a case-insensitive file system such as
macOS's or Windows', or once copied there) would silently make two classes or
two splits. They are compared after NFC normalization and Unicode case folding,
always: where the output lands, or is copied to later, is not known when the
run starts. Pure.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

__all__ = ["check_names", "find_clash", "name_key"]


def name_key(name: str) -> str:
    """The form two names are compared in: NFC, case-folded, NFC again (case
    folding may leave a string that is not NFC)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name).casefold())


def find_clash(names: Iterable[str]) -> tuple[str, str] | None:
    """The first two different names (in sorted order) with the same ``name_key``,
    or ``None`` when every name has a key of its own."""
    seen: dict[str, str] = {}
    for name in sorted(set(names)):
        key = name_key(name)
        other = seen.get(key)
        if other is not None:
            return other, name
        seen[key] = name
    return None


def check_names(kind: str, names: Iterable[str]) -> None:
    """Refuses names that differ only in Unicode normalization or letter case.

    Args:
      kind: what the names are, for the message (``class folders``, ``split
        folders``, ``classes in labels.txt``, ...).
      names: the names.

    Raises:
      ValueError: naming both (escaped, so the difference shows) and what to do.
    """
    clash = find_clash(names)
    if clash is None:
        return
    first, second = clash
    nfc = unicodedata.normalize
    if nfc("NFC", first) == nfc("NFC", second):
        how = "Unicode normalization (NFC vs NFD)"
    elif first == nfc("NFC", first) and second == nfc("NFC", second):
        how = "letter case"
    else:
        how = "Unicode normalization and letter case"
    raise ValueError(
        f"{kind} {ascii(first)} and {ascii(second)} differ only in {how}: one name to a reader, "
        "they would be kept apart as two (and collide on a case-insensitive file system); rename "
        "one so that the name is written one way")
