"""The product's shape, read from its source with ``ast``: layers, cycles, private
names, sizes and file names.

The layer order is declared once, in ``docs/layers.md`` (its ``layers`` block, top
to bottom): the public API, ``__main__`` and demo → cli → console, scratch, samples,
inspect → pipeline → job_graph → preflight → its parts → updates → verify → the
listing front ends (listing_plan, worker_listing, image_contents) → the converters
(image_steps, tables, sequences; peers) → image_plans → the image listing and the table readers
(image_listing, csv_segments, typed_tables; peers) → table_spooling → spools →
shard_engine → shard_verification → commit_step → gather → ``transforms/io`` and
``transforms/plan`` (peers) → ``transforms/codec`` → ``transforms/quality`` →
``schemas``. Every import of a product module by another counts, lazy ones inside
functions too, and the test fails on:

- an import of a module on a higher line, or of a peer named on the same line;
- an import cycle between product modules (through any number of them);
- a private name (``_x``) imported from another module, or read as ``module._x``;
- a function over 80 lines, a class over 300 or a module over 700 (generated protobuf
  code aside), unless it is in the allowlist below with its size there as a ceiling:
  an entry may shrink (and leaves the list once under the limit), never grow, and a
  new offender fails;
- two product modules with one file name, beyond the allowlisted clashes.

Modules named in strings (``importlib.import_module``: the package top's lazy public
names, the helper processes' preloads) are not read; ``if TYPE_CHECKING:`` imports are.
The checks are plain functions over ``{module: source}``; the self-tests at the end
plant each fault in synthetic source and see each check catch it.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
# Repository folder -> installed package name (setup.py's _FOLDERS).
FOLDERS = {"beam_pipeline": "beam_tfrecords", "transforms": "beam_tfrecords.transforms",
           "schemas": "beam_tfrecords.schemas"}
GENERATED = re.compile(r"_pb2$")
MAX_FUNCTION, MAX_CLASS, MAX_MODULE = 80, 300, 700

# Offenders allowed, each at its size then: a ceiling, never to grow (none left).
LONG_MODULES: dict[str, int] = {}
LONG_CLASSES: dict[str, int] = {}
LONG_FUNCTIONS: dict[str, int] = {}
# File names more than one product module has, with how many have it.
NAME_CLASHES: dict[str, int] = {}


# --- reading the source ------------------------------------------------------------


def product_sources(root: Path = ROOT) -> dict[str, str]:
    """Every product module's source, by its path without ``.py`` (``transforms/io/gcs``)."""
    sources = {}
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            sources[path.relative_to(root).with_suffix("").as_posix()] = path.read_text()
    return sources


def dotted_name(module: str) -> str:
    """``transforms/io/gcs`` -> ``beam_tfrecords.transforms.io.gcs``."""
    folder, *rest = module.split("/")
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([FOLDERS[folder], *rest])


def read_layers(text: str) -> list[list[str]]:
    """The ``layers`` block of a Markdown text: one list of entries per line, top first."""
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "no ```layers block"
    return [line.split() for line in block.group(1).splitlines() if line.strip()]


def imports_of(module: str, source: str, modules: Sequence[str]) -> Iterator[tuple[str, str, int]]:
    """``(imported module, private name or "", line)`` for every import of a product
    module in a module's source, at any depth (lazy imports inside functions too), and
    for every ``alias._x`` read through an imported module's name."""
    by_dotted = {dotted_name(m): m for m in modules}
    package = dotted_name(module).rsplit(".", 1)[0] if not module.endswith("__init__") \
        else dotted_name(module)
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _longest_module(alias.name, by_dotted)
                if target:
                    yield target, "", node.lineno
                    if alias.asname and dotted_name(target) == alias.name:
                        aliases[alias.asname] = target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in by_dotted:  # from package import module
                    yield by_dotted[full], "", node.lineno
                    aliases[alias.asname or alias.name] = by_dotted[full]
                elif base in by_dotted:
                    private = alias.name if _is_private(alias.name) else ""
                    yield by_dotted[base], private, node.lineno
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and _is_private(node.attr)):
            yield aliases[node.value.id], node.attr, node.lineno


def _longest_module(name: str, by_dotted: Mapping[str, str]) -> str:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in by_dotted:
            return by_dotted[".".join(parts[:end])]
    return ""


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Which product modules each product module imports (itself left out)."""
    graph: dict[str, set[str]] = {module: set() for module in sources}
    for module, source in sources.items():
        for target, _, _ in imports_of(module, source, list(sources)):
            if target != module:
                graph[module].add(target)
    return graph


# --- the checks --------------------------------------------------------------------


def layer_of(module: str, layers: Sequence[Sequence[str]]) -> tuple[int, str]:
    """``(line, entry)`` of the one layer entry that covers a module."""
    found = [(line, entry) for line, entries in enumerate(layers) for entry in entries
             if entry == module or (entry.endswith("/*") and module.startswith(entry[:-1]))]
    if len(found) != 1:
        raise AssertionError(f"{module} is under {len(found)} layer entries: {found}")
    return found[0]


def upward_imports(sources: Mapping[str, str], layers: Sequence[Sequence[str]]) -> list[str]:
    """Each import of a module on a higher line, or of a peer on the same line."""
    bad = []
    for module, source in sources.items():
        line, entry = layer_of(module, layers)
        for target, _, lineno in imports_of(module, source, list(sources)):
            target_line, target_entry = layer_of(target, layers)
            if target_line < line or (target_line == line and target_entry != entry):
                way = "up" if target_line < line else "sideways"
                bad.append(f"{module}:{lineno} imports {target} ({way})")
    return sorted(set(bad))


def import_cycles(sources: Mapping[str, str]) -> list[list[str]]:
    """The product modules that import one another round a cycle, each set sorted."""
    graph = import_graph(sources)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components.
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def private_imports(sources: Mapping[str, str]) -> list[str]:
    """Each private name one product module takes from another."""
    return sorted({f"{module}:{lineno} takes {name} from {target}"
                   for module, source in sources.items()
                   for target, name, lineno in imports_of(module, source, list(sources))
                   if name and target != module})


def sizes(sources: Mapping[str, str]) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """Lines of every module, class and function (``module::Outer.name``), def line to
    last line; generated protobuf modules left out."""
    modules, classes, functions = {}, {}, {}
    for module, source in sources.items():
        if GENERATED.search(module):
            continue
        modules[module] = len(source.splitlines())

        def walk(node: ast.AST, prefix: str, module: str = module) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{module}::{prefix}{child.name}"
                    size = child.end_lineno - child.lineno + 1
                    (classes if isinstance(child, ast.ClassDef) else functions)[name] = size
                    walk(child, f"{prefix}{child.name}.", module)
                else:
                    walk(child, prefix, module)

        walk(ast.parse(source), "")
    return modules, classes, functions


def oversized(measured: Mapping[str, int], limit: int, allowed: Mapping[str, int]) -> list[str]:
    """Each size over the limit and over its allowlisted ceiling (or not allowlisted)."""
    return sorted(f"{name}: {size} lines (limit {limit}"
                  + (f", allowlisted at {allowed[name]})" if name in allowed else ")")
                  for name, size in measured.items()
                  if size > limit and size > allowed.get(name, limit))


def name_clashes(sources: Mapping[str, str]) -> dict[str, int]:
    """File names more than one product module has (``__init__.py`` aside), with counts."""
    counts: dict[str, int] = {}
    for module in sources:
        name = module.rsplit("/", 1)[-1] + ".py"
        if name != "__init__.py":
            counts[name] = counts.get(name, 0) + 1
    return {name: count for name, count in sorted(counts.items()) if count > 1}


# --- the product -------------------------------------------------------------------

SOURCES = product_sources()
LAYERS = read_layers((ROOT / "docs" / "layers.md").read_text())


def test_every_module_is_in_one_layer():
    for module in SOURCES:
        layer_of(module, LAYERS)
    named = [entry for entries in LAYERS for entry in entries if not entry.endswith("/*")]
    assert sorted(set(named) - set(SOURCES)) == [], "layer entries that name no module"


def test_no_import_points_up_the_layers():
    assert upward_imports(SOURCES, LAYERS) == []


def test_no_import_cycle():
    assert import_cycles(SOURCES) == []


def test_no_private_name_crosses_a_module():
    assert private_imports(SOURCES) == []


def test_sizes_stay_under_the_limits_or_their_ceilings():
    modules, classes, functions = sizes(SOURCES)
    assert oversized(modules, MAX_MODULE, LONG_MODULES) == []
    assert oversized(classes, MAX_CLASS, LONG_CLASSES) == []
    assert oversized(functions, MAX_FUNCTION, LONG_FUNCTIONS) == []
    # An allowlist entry names something still over its limit (a fixed, split or renamed
    # one goes from the list).
    for allowed, measured, limit in ((LONG_MODULES, modules, MAX_MODULE),
                                     (LONG_CLASSES, classes, MAX_CLASS),
                                     (LONG_FUNCTIONS, functions, MAX_FUNCTION)):
        assert sorted(n for n in allowed if measured.get(n, 0) <= limit) == [], "stale entries"


def test_file_names_clash_no_more_than_allowlisted():
    clashes = name_clashes(SOURCES)
    assert {n: c for n, c in clashes.items() if c > NAME_CLASHES.get(n, 1)} == {}
    assert sorted(set(NAME_CLASHES) - set(clashes)) == [], "stale entries"


# --- the checks catch what they are for (planted faults in synthetic source) -------

_TOY_LAYERS = [["beam_pipeline/cli"], ["transforms/a", "transforms/b"], ["transforms/io/*"],
               ["schemas/*"]]
_CLEAN = {
    "beam_pipeline/cli": "from beam_tfrecords.transforms import a\n"
                         "import beam_tfrecords.schemas.s as s\nprint(s.VALUE)\n",
    "transforms/a": "from beam_tfrecords.transforms.io.x import helper\n",
    "transforms/b": "def f():\n    from beam_tfrecords.transforms.io import y\n    return y\n",
    "transforms/io/x": "from beam_tfrecords.transforms.io.y import thing\n"
                       "from beam_tfrecords.schemas.s import VALUE\n",
    "transforms/io/y": "thing = 1\n",
    "schemas/s": "VALUE = 1\n_hidden = 2\n",
}


def _planted(**changes: str) -> dict[str, str]:
    sources = dict(_CLEAN)
    for module, extra in changes.items():
        sources[module.replace("__", "/")] = sources.get(module.replace("__", "/"), "") + extra
    return sources


def test_the_checks_pass_clean_source():
    assert upward_imports(_CLEAN, _TOY_LAYERS) == []
    assert import_cycles(_CLEAN) == []
    assert private_imports(_CLEAN) == []


@pytest.mark.parametrize("module, line, expected", [
    # Up one layer, lazily inside a function.
    ("schemas__s", "def g():\n    from beam_tfrecords.transforms.io import x\n",
     "schemas/s:4 imports transforms/io/x (up)"),
    # Up, with `import a.b as c`.
    ("transforms__io__y", "import beam_tfrecords.cli as cli\n",
     "transforms/io/y:2 imports beam_pipeline/cli (up)"),
    # Sideways: two peers named on one line.
    ("transforms__a", "from beam_tfrecords.transforms.b import f\n",
     "transforms/a:2 imports transforms/b (sideways)"),
])
def test_an_upward_import_fails(module, line, expected):
    assert upward_imports(_planted(**{module: line}), _TOY_LAYERS) == [expected]


def test_a_cycle_fails_through_three_modules_and_a_lazy_import():
    sources = _planted(transforms__io__y="def h():\n    import beam_tfrecords.transforms.a\n")
    assert import_cycles(sources) == [["transforms/a", "transforms/io/x", "transforms/io/y"]]


@pytest.mark.parametrize("line", [
    "from beam_tfrecords.schemas.s import VALUE, _hidden\n",
    "from beam_tfrecords.schemas import s\nprint(s._hidden)\n",
])
def test_a_private_import_fails(line):
    found = private_imports(_planted(transforms__a=line))
    assert len(found) == 1 and found[0].startswith("transforms/a:") and "_hidden" in found[0]


def test_an_81_line_function_fails_and_80_passes():
    def source(lines: int) -> str:
        return "class C:\n    def long(self):\n" + "        x = 1\n" * (lines - 1)

    _, _, at_limit = sizes({"transforms/a": source(80)})
    _, _, over = sizes({"transforms/a": source(81)})
    assert oversized(at_limit, MAX_FUNCTION, {}) == []
    assert oversized(over, MAX_FUNCTION, {}) == ["transforms/a::C.long: 81 lines (limit 80)"]
    # An allowlisted ceiling holds it, and fails it once it grows past.
    assert oversized(over, MAX_FUNCTION, {"transforms/a::C.long": 81}) == []
    assert oversized(over, MAX_FUNCTION, {"transforms/a::C.long": 90}) == []
    _, _, grown = sizes({"transforms/a": source(91)})
    assert oversized(grown, MAX_FUNCTION, {"transforms/a::C.long": 90}) == [
        "transforms/a::C.long: 91 lines (limit 80, allowlisted at 90)"]


def test_a_clashing_file_name_is_found():
    assert name_clashes({"transforms/shards": "", "transforms/plan/shards": "",
                         "transforms/a": ""}) == {"shards.py": 2}
