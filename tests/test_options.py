"""The ``convert`` options are declared once (``schemas.options``), and what is read
off the declarations follows them: the README's flag table, and an option planted
next to the others reaching the parser, the config, the refusals and the template."""

import dataclasses
import importlib
import os
import re

import pytest

from beam_tfrecords.cli import convert_parser
from beam_tfrecords.schemas.config import ConvertConfig
from beam_tfrecords.schemas.options import (
    CONVERT_OPTIONS,
    IMAGES,
    TABLES,
    Option,
    flags_only_for,
    option_fields,
    option_values,
)

pytestmark = pytest.mark.unit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        return f.read()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end != -1 else len(text)]


def _flag_table(text: str) -> dict[str, str]:
    """The README's ``convert`` flag table: each flag of a row's first cell -> its
    default cell (a row of two flags has two defaults, comma-separated)."""
    section = _section(text, "## Convert")
    table = {}
    for row in section.splitlines():
        if not row.startswith("| `--"):
            continue
        first, default, _ = (cell.strip() for cell in row.strip("|").split("|", 2))
        flags = re.findall(r"`(--\w+)", first)
        defaults = [d.strip() for d in default.split(",")] if len(flags) > 1 and default else [default] * len(flags)
        table.update(zip(flags, defaults))
    return table


def test_the_readme_flag_table_is_the_declared_options():
    text = _readme()
    table = _flag_table(text)
    declared = {o.flag: o for o in CONVERT_OPTIONS}
    assert sorted(set(table) - set(declared)) == []  # No row names a flag convert does not take.
    # Every option is in the table, but the tables' own, which their section names.
    tables_section = _section(text, "## Tables (CSV, Parquet, JSON Lines)")
    for flag, option in declared.items():
        if option.kinds <= TABLES:
            assert re.search(r"`[^`\n]*" + re.escape(flag) + r"\b", tables_section), flag
        else:
            assert flag in table, f"{flag} is missing from the README's flag table"
    for flag, cell in table.items():  # Each default the table gives is the declared one.
        option = declared[flag]
        value = re.match(r"`([^`]*)`", cell)
        if cell == "(required)":
            assert option.required, flag
        elif cell == "off":
            assert option.switch and option.default is False, flag
        elif value and isinstance(option.default, (int, float)):
            assert float(value.group(1)) == option.default, flag
        elif value:
            assert value.group(1) == option.default, flag
    assert len(table) >= 40


@pytest.fixture(name="make_metadata")
def _make_metadata(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(REPO, "dataflow"))
    return importlib.import_module("make_metadata")


def _at_least_zero(flag, value):
    if value < 0:
        raise ValueError(f"{flag} must be 0 or more; got {value}")


def test_an_option_declared_once_reaches_parser_config_refusals_and_template(make_metadata):
    planted = Option("max_widgets", "resize", "draw at most N widgets on an image (default 0: none)",
                     0, "int", int, kinds=IMAGES, check=_at_least_zero)
    options = (*CONVERT_OPTIONS, planted)

    parser = convert_parser(options=options)  # The flag, in its --help section.
    resize_help = parser.format_help().split("resize and re-encode images")[1].split("\n\n")[0]
    assert "--max_widgets MAX_WIDGETS" in resize_help and "draw at most N widgets" in resize_help
    args = parser.parse_args(["--input", "in", "--output", "out", "--max_widgets", "3"])
    assert args.max_widgets == 3 and parser.parse_args(["--input", "i", "--output", "o"]).max_widgets == 0

    @option_fields(options, [f.name for f in dataclasses.fields(ConvertConfig)])
    class Planted(ConvertConfig):  # ConvertConfig as it would be with the option declared.
        pass

    config = Planted(**option_values(vars(args), options))  # The field, after those recorded.
    assert config.max_widgets == 3 and list(config.to_json())[-1] == "max_widgets"
    assert Planted(input="in", output="out").max_widgets == 0
    with pytest.raises(ValueError, match=r"^--max_widgets must be 0 or more; got -1$"):
        Planted(input="in", output="out", max_widgets=-1)  # Its check, with the others.
    with pytest.raises(ValueError, match=r"^--layout must be one of"):
        Planted(input="in", output="out", layout="folders")

    # Refused with a table, as the other image flags are.
    assert ("--max_widgets", "max_widgets") in flags_only_for(IMAGES, options)
    assert ("--max_widgets", "max_widgets") not in flags_only_for(TABLES, options)

    (param,) = [p for p in make_metadata.metadata(options)["parameters"] if p["name"] == "max_widgets"]
    assert (param["paramType"], param["defaultValue"], param["helpText"]) == (
        "NUMBER", "0", "Draw at most N widgets on an image (default 0: none)")


def test_the_config_is_the_declared_options_in_the_recorded_order():
    fields = dataclasses.fields(ConvertConfig)
    declared = {o.name: o for o in CONVERT_OPTIONS if o.config}
    assert sorted(f.name for f in fields) == sorted(declared)
    for field in fields:
        option = declared[field.name]
        assert field.type == option.annotation, field.name
        assert field.default == (dataclasses.MISSING if option.required else option.default), field.name
    # The order manifests record the options in (to_json), which a new option only extends.
    assert [f.name for f in fields][:8] == ["input", "output", "layout", "labels", "compression",
                                           "validate", "max_pixels", "image_bytes"]
    assert [f.name for f in fields].index("reread") == 52  # The last of those: new ones go after it.
