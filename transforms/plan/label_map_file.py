"""``--labels`` of an annotated layout: a labels file, or the Object Detection API's
``label_map.pbtxt``.

A labels file names one class per line (``plan.layouts.parse_labels_text``); for the
annotated layouts the class on line ``i`` (from 0) gets id ``i + 1`` (0 is the
background). A ``label_map.pbtxt`` (what Object Detection API users have, and what
this product writes beside its shards) gives the ids itself::

    item {
      id: 1
      name: 'dog'          # or "dog"; display_name is read when there is no name
    }

``read_label_map`` tells the two apart (a file whose first token, past ``#``
comments, is ``item`` followed by ``{``) and reads either. The pbtxt reader is a small
tokenizer for that one message: ``item`` blocks of ``id``, ``name``, ``display_name``
(other fields, such as ``keypoints`` or ``frequency``, are read past), quoted strings
with backslash escapes, never evaluated. Refused, naming the line: a block without an
id or a name, an id that is not a whole number above 0, an id or a name given twice,
text that is not the message.
"""

from __future__ import annotations

import re

from beam_tfrecords.schemas.annotations import LabelMap
from beam_tfrecords.transforms.plan.layouts import parse_labels_text

__all__ = ["is_label_map_pbtxt", "parse_label_map_pbtxt", "read_label_map"]

_TOKEN = re.compile(r"""\s+|#[^\n]*|(?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")|(?P<word>[^\s{}:'"#]+)|(?P<mark>[{}:])""")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"'}


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """``(kind, value, line)`` per token: ``string`` (unquoted), ``word``, ``mark``.

    Raises:
      ValueError: a character no token starts with (an unclosed quote).
    """
    out, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        line = text.count("\n", 0, at) + 1
        if match is None:
            raise ValueError(f"line {line} of the label map does not parse (an unclosed quote?)")
        kind = match.lastgroup
        if kind == "string":
            body = match.group(kind)[1:-1]
            out.append((kind, re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body), line))
        elif kind is not None:
            out.append((kind, match.group(kind), line))
        at = match.end()
    return out


def is_label_map_pbtxt(text: str) -> bool:
    """Whether ``text`` is a ``label_map.pbtxt`` (its first token ``item``, then ``{``)."""
    try:
        tokens = _tokens(text[:4096])
    except ValueError:
        tokens = []
    if len(tokens) < 2:
        return bool(tokens) and tokens[0][1] == "item" and "{" in text
    return tokens[0][1] == "item" and tokens[1][1] == "{"


def _skip_value(tokens: list, at: int) -> int:
    """The index after a field's value (a scalar, or a ``{ ... }`` message)."""
    if tokens[at][1] != "{":
        return at + 1
    depth = 0
    while at < len(tokens):
        depth += {"{": 1, "}": -1}.get(tokens[at][1], 0) if tokens[at][0] == "mark" else 0
        at += 1
        if depth == 0:
            return at
    raise ValueError("the label map ends inside a block")


def _item(tokens: list, at: int) -> tuple[dict, int]:
    """One ``item { ... }`` block from ``tokens[at]`` (just past its ``{``): its fields."""
    fields: dict = {}
    while at < len(tokens):
        kind, value, line = tokens[at]
        if kind == "mark" and value == "}":
            return fields, at + 1
        if kind != "word":
            raise ValueError(f"line {line} of the label map: a field name was expected")
        at += 1
        if at < len(tokens) and tokens[at][1] == ":":
            at += 1
        if at >= len(tokens):
            break
        if value in ("id", "name", "display_name"):
            if value in fields:
                raise ValueError(f"line {line} of the label map: {value} given twice in one item")
            fields[value] = (tokens[at], line)
            at += 1
        else:
            at = _skip_value(tokens, at)
    raise ValueError("the label map ends inside an item")


def _entry(fields: dict, line: int) -> tuple[int, str]:
    if "id" not in fields:
        raise ValueError(f"the item at line {line} of the label map has no id")
    (kind, value, _), _ = fields["id"]
    if kind != "word" or not value.isdigit() or int(value) <= 0:
        raise ValueError(f"the item at line {line} of the label map: its id is not a whole number above 0 "
                         "(0 is the background)")
    named = fields.get("name") or fields.get("display_name")
    if named is None or named[0][0] not in ("string", "word") or not named[0][1].strip():
        raise ValueError(f"the item at line {line} of the label map has no name")
    return int(value), named[0][1].strip()


def parse_label_map_pbtxt(text: str) -> LabelMap:
    """The ``LabelMap`` of a ``label_map.pbtxt`` text, in id order (see the module).

    Raises:
      ValueError: naming the line, when the text is not one (see the module).
    """
    tokens = _tokens(text)
    items, at = [], 0
    while at < len(tokens):
        kind, value, line = tokens[at]
        if value != "item" or at + 1 >= len(tokens) or tokens[at + 1][1] != "{":
            raise ValueError(f"line {line} of the label map: 'item {{' was expected")
        fields, at = _item(tokens, at + 2)
        items.append((*_entry(fields, line), line))
    if not items:
        raise ValueError("the label map holds no item")
    ids, names = {}, {}
    for label, name, line in items:
        if label in ids:
            raise ValueError(f"id {label} appears twice in the label map (lines {ids[label]} and {line})")
        if name in names:
            raise ValueError(f"a name appears twice in the label map (lines {names[name]} and {line})")
        ids[label], names[name] = line, line
    return LabelMap(tuple(sorted((label, name) for label, name, _ in items)))


def read_label_map(text: str) -> LabelMap:
    """``--labels`` for an annotated layout: a ``label_map.pbtxt``'s ids and names, or a
    labels file's names numbered from 1 in line order.

    Raises:
      ValueError: the file cannot be used (``parse_labels_text``, ``parse_label_map_pbtxt``).
    """
    if is_label_map_pbtxt(text):
        return parse_label_map_pbtxt(text)
    return LabelMap(tuple(enumerate(parse_labels_text(text), start=1)))
