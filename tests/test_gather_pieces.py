"""``inputs.jsonl`` completed in many pieces (``transforms.gather``): the path every run
of more than ~300,000 files takes (a piece holds ~32 MB of lines). Cut into pieces
of a few lines here, a run publishes the same ``inputs.jsonl``, fingerprint and shards
as a run that completes it in one piece, copies reported the same."""

from __future__ import annotations

import hashlib
import io
import json
import os

import pytest
from PIL import Image

from beam_tfrecords import ConvertConfig, convert
from beam_tfrecords.transforms import gather

pytestmark = pytest.mark.e2e


def _folder(root) -> str:
    for index in range(120):
        folder = root / ("cat" if index % 3 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        shade = index % 40  # Every 40th image a copy of another: duplicates across pieces.
        Image.new("RGB", (3 + shade % 5, 4), (shade * 5, 9, 200 - shade)).save(buffer, "PNG")
        (folder / f"{index:04d}.png").write_bytes(buffer.getvalue())
    return str(root)


def _published(out: str) -> dict:
    manifest = json.load(open(os.path.join(out, "manifest.json"), encoding="utf-8"))
    shards = {n: hashlib.sha256(open(os.path.join(out, n), "rb").read()).hexdigest()
              for n in sorted(os.listdir(out)) if n.endswith(".tfrecord")}
    with open(os.path.join(out, "inputs.jsonl"), "rb") as f:
        inputs = f.read()
    return {"shards": shards, "inputs": inputs, "input": manifest["input"],
            "duplicates": manifest.get("duplicates")}


def test_many_pieces_publish_what_one_piece_publishes(tmp_path, monkeypatch):
    root = _folder(tmp_path / "in")
    one = convert(ConvertConfig(input=root, output=str(tmp_path / "one"), encode_processes=0))
    assert one.ok
    seen = []
    original = gather.input_pieces

    def small_pieces(temp_dir, input_units, piece_bytes=gather.PIECE_BYTES):
        pieces = original(temp_dir, input_units, 700)  # A few lines each.
        seen.append(len(pieces))
        return pieces

    monkeypatch.setattr(gather, "input_pieces", small_pieces)
    gather._found_pieces.clear()  # pylint: disable=protected-access
    many = convert(ConvertConfig(input=root, output=str(tmp_path / "many"), encode_processes=0))
    assert many.ok and seen and max(seen) >= 10, seen
    first, second = _published(str(tmp_path / "one")), _published(str(tmp_path / "many"))
    assert first["inputs"].count(b"\n") == 120 and first["input"]["files_list"]["files"] == 120
    assert first["duplicates"]["groups"] == 40, first["duplicates"]  # Copies across pieces, found.
    assert second == first
