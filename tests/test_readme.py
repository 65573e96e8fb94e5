"""The README's examples run as written."""

import json
import os
import re

import pytest

pytestmark = pytest.mark.beam

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def _python_block_after(heading: str) -> str:
    with open(README, encoding="utf-8") as f:
        text = f.read()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_beam_transforms_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_block_after("### Beam transforms for your own pipeline"), README, "exec"), {})
    for out, records in (("out/records", 1000), ("out/images", 20), ("out/table", 2)):
        with open(tmp_path / out / "manifest.json", encoding="utf-8") as f:
            manifest = json.load(f)
        assert sum(s["records"] for s in manifest["splits"].values()) == records, out
