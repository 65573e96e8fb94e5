"""Writes ``dataflow/metadata.json``, the Flex Template's parameters, from the
``convert`` options' declarations (``beam_tfrecords.schemas.options``), which the
command line's parser is made from too.

One parameter per option, in ``convert --help``'s order: its flag's name, its help,
whether it is required, its default, and a type and regex read from the declaration
(a choice: ``ENUM``; a flag without a value: ``BOOLEAN``, ``true`` or ``false``;
``int``/``float``: ``NUMBER``; anything else: ``TEXT``). Only what a declaration
does not say is written here: which flags are paths (a picker in the Dataflow UI, and
``gs://`` only, since the workers cannot see the launcher's disk); the flags a
template cannot use (``flex_main.TEMPLATE_REFUSES``) are left out.
An option declared for ``convert`` becomes a parameter on the next run of this script;
``tests/test_dataflow_template.py`` fails while the file is out of date.

    python dataflow/make_metadata.py           # writes dataflow/metadata.json (make metadata)
    python dataflow/make_metadata.py --check   # exit 1 when the file differs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence

from flex_main import TEMPLATE_REFUSES

from beam_tfrecords.schemas.options import CONVERT_OPTIONS, Option

__all__ = ["METADATA_FILE", "metadata", "parameter", "render"]

METADATA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "metadata.json")

NAME = "beam-tfrecords convert"
DESCRIPTION = (
    "Converts images (class folders, CIFAR layout or a CSV image manifest) or tables (CSV, "
    "Parquet, JSON Lines) into verified tf.train.Example / SequenceExample TFRecord shards "
    "of a chosen size band, and writes manifest.json (only when every shard verified), "
    "dead_letter/ and run_report.json to the output folder. The same flags as "
    "`beam-tfrecords convert`, every one but --report_json; a flag without a value takes "
    "true or false. Dataflow runs it with --encode_processes 0 automatically."
)

# Flags whose value is a path, and how the Dataflow UI offers it. They take gs:// only.
PATH_TYPES = {
    "input": "TEXT",  # A folder, a glob or a CSV file: no one picker fits all three.
    "output": "GCS_WRITE_FOLDER",
    "labels": "GCS_READ_FILE",
    "schema": "GCS_READ_FILE",
    "masks": "GCS_READ_FOLDER",
    "compare_to": "TEXT",  # A manifest, a dataset folder, or 'previous'.
}
_GCS = r"^gs://[^\n\r]+$"
_PATH_REGEXES = {"compare_to": r"^(previous|gs://[^\n\r]+)$"}

_INT = r"^-?[0-9]+$"
_FLOAT = r"^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_TEXT = r"^[^\n\r]+$"
_WORDS = {"mb": "MB", "csv": "CSV", "jpeg": "JPEG"}


def _label(name: str) -> str:
    words = [_WORDS.get(word, word) for word in name.split("_")]
    return " ".join([words[0][:1].upper() + words[0][1:], *words[1:]])


def parameter(option: Option) -> dict:
    """The template parameter of one ``convert`` option."""
    name = option.flag[2:]
    param: dict = {"name": name, "label": _label(name), "helpText": option.help[:1].upper() + option.help[1:],
                   "isOptional": not option.required}
    if option.switch:
        param.update(paramType="BOOLEAN", regexes=["^(true|false)$"], defaultValue="false")
        return param
    if option.choices:
        param.update(paramType="ENUM",
                     regexes=["^(" + "|".join(re.escape(str(c)) for c in option.choices) + ")$"],
                     enumOptions=[{"value": str(c), "label": str(c)} for c in option.choices])
    elif name in PATH_TYPES:
        param.update(paramType=PATH_TYPES[name], regexes=[_PATH_REGEXES.get(name, _GCS)])
    elif option.parse in (int, float):
        param.update(paramType="NUMBER", regexes=[_INT if option.parse is int else _FLOAT])
    else:
        param.update(paramType="TEXT", regexes=[_TEXT])
    if option.default not in (None, "", ()) and not option.required:
        default = option.default
        param["defaultValue"] = ",".join(default) if isinstance(default, tuple) else str(default)
    return param


def metadata(options: Sequence[Option] = CONVERT_OPTIONS) -> dict:
    """The template's metadata: one parameter per option of ``options`` (default:
    ``convert``'s), but those in ``TEMPLATE_REFUSES``."""
    params = [parameter(option) for option in options if option.flag[2:] not in TEMPLATE_REFUSES]
    return {"name": NAME, "description": DESCRIPTION, "parameters": params}


def render(data: dict) -> str:
    """The file's text."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description="Write or check dataflow/metadata.json.")
    args.add_argument("--check", action="store_true",
                      help="exit 1 (and write nothing) when the file differs from the flags")
    check = args.parse_args(argv).check
    text = render(metadata())
    try:
        with open(METADATA_FILE, encoding="utf-8") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if check:
        if current != text:
            print(f"{METADATA_FILE} differs from the convert flags: run python "
                  "dataflow/make_metadata.py (make metadata)", file=sys.stderr)
            return 1
        return 0
    if current != text:
        with open(METADATA_FILE, "w", encoding="utf-8") as f:
            f.write(text)
    print(f"{METADATA_FILE}: {len(metadata()['parameters'])} parameters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
