"""Issue 23 (TAIL): ``inputs.jsonl`` lines made a block at a time give the bytes the
line-by-line forms gave: the launcher's first lines from a local listing's columns
(``fingerprint.write_inputs``), and the commit's completed lines of plain local-file
lines (``schemas.inputs.complete_lines``)."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from beam_tfrecords.schemas.inputs import InputFile, complete_lines, encode_inputs, file_line
from beam_tfrecords.transforms.io.fingerprint import table_entries, write_inputs
from beam_tfrecords.transforms.plan.layouts import list_class_folders

pytestmark = pytest.mark.unit

ROOT = "/data/photos"
_ROLES = [InputFile("labels.txt", 4, 5, "ab" * 32, role="labels")]


def _local_table(count: int, zero_every: int = 0):
    """A local class-folder listing's table (``mtime_ns`` stamps), names that need
    JSON escapes among them, some stamps 0 when ``zero_every``."""
    rng = np.random.default_rng(count)
    names = ["a", "é", 'q"uote', "z\\back", "日本", "tab\there", "plain"]
    listed = []
    for i in range(count):
        name = f"{names[i % len(names)]}_{int(rng.integers(0, 10**6)):07d}.png"
        stamp = 0 if zero_every and i % zero_every == 0 else 1763800000000000000 + i
        listed.append((f"{ROOT}/{('train', 'val')[i % 2]}/c{i % 3}/{name}", int(rng.integers(1, 10**6)), stamp, -1))
    return list_class_folders(ROOT, iter(listed), compact=True).refs


@pytest.mark.parametrize("zero_every", [0, 5])
def test_write_inputs_from_columns_equals_encode_inputs(tmp_path, zero_every):
    table = _local_table(700, zero_every)
    path = str(tmp_path / "inputs.jsonl")
    write_inputs(path, _ROLES, table)
    assert open(path, "rb").read() == encode_inputs(_ROLES + table_entries(table))
    rows = np.arange(0, len(table), 3)
    write_inputs(path, (), table, rows)
    assert open(path, "rb").read() == encode_inputs(table_entries(table, rows))
    with pytest.raises(ValueError):
        write_inputs(path, [InputFile("x", 1)], table)


def _reference(lines: list[str], digests: dict, excluded: set) -> tuple[bytes, bytes, int]:
    """Completed lines and fingerprint tokens as json.loads and json.dumps make them."""
    texts, tokens, files = [], [], 0
    for line in lines:
        value = json.loads(line)
        path, role = value["path"], value.get("role", "")
        if not role and path in excluded:
            continue
        sha256 = digests.get(path, "") if not role else value.get("sha256", "")
        out = {key: value[key] for key in ("path", "role", "size", "mtime_ns") if key in value}
        if sha256:
            out["sha256"] = sha256
        texts.append(json.dumps(out, ensure_ascii=False) + "\n")
        if not role:
            files += 1
            content = f"sha256:{sha256}" if sha256 else f"mtime_ns:{value.get('mtime_ns', 0)}:generation:"
            tokens.append(json.dumps(["", path, value["size"], content]) + "\n")
    return "".join(texts).encode(), "".join(tokens).encode(), files


@pytest.mark.parametrize("digest_kind, letters", [("hex", "abc"), ("hex", "abé日"), ("escaped", "abc"),
                                                  ("some missing", "abc")])
def test_complete_lines_in_bulk_equals_line_by_line(digest_kind, letters):
    rnd = random.Random(23)
    paths = sorted({f"{rnd.choice(letters)}/{rnd.randint(0, 10**6):07d}.png" for _ in range(3000)})
    role = '{"path": "labels.txt", "role": "labels", "size": 4, "sha256": "' + "cd" * 32 + '"}'
    lines = [role] + [file_line(p, rnd.randint(0, 10**9), rnd.choice([0, 1763800000000000000 + i]))[:-1]
                      for i, p in enumerate(paths)]
    digests = {p: hashlib.sha256(p.encode()).hexdigest() for p in paths}
    if digest_kind == "escaped":
        digests[paths[7]] = 'x"é'
    elif digest_kind == "some missing":
        digests = {p: d for i, (p, d) in enumerate(digests.items()) if i % 4}
    excluded = set(paths[10:40])
    part = complete_lines(("\n".join(lines) + "\n").encode(), digests, excluded, sort=True)
    expected_lines, expected_tokens, files = _reference(lines, digests, excluded)
    assert (part.lines, part.file_tokens, part.files) == (expected_lines, expected_tokens, files)
    kept = [p for p in paths if p not in excluded]
    assert (part.first_key, part.last_key, part.in_order) == ((False, "labels", "labels.txt"),
                                                             (True, "", kept[-1]), True)
    shuffled = lines[:1] + rnd.sample(lines[1:], len(lines) - 1)  # Out of order: sorted, the same.
    again = complete_lines(("\n".join(shuffled) + "\n").encode(), digests, excluded, sort=True)
    assert (again.lines, again.file_tokens) == (expected_lines, expected_tokens)
