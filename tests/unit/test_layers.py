"""The layering of the package, enforced: every import goes down (or stays in its layer), the
rules do no I/O, no module imports itself through others, and every module is small enough to
read in one sitting.

The layers, bottom to top (ARCHITECTURE.md says what each holds):

    rules     safepoint.errors, safepoint.types, safepoint._rules.*   decisions, no I/O
    storage   safepoint.storage.*                                       the ledger's stores
    engine    safepoint._engine.*                                       runs against a store
    facade    safepoint (its __init__)                                  the public names
    integrations  safepoint.integrations.*                              one module per agent SDK
    testing   safepoint.testing.*                                       tools to prove workflows
    ops       safepoint.ops.*, safepoint.__main__, safepoint.otel       the CLI, dashboard, demo,
                                                                        telemetry
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import safepoint

PACKAGE = Path(safepoint.__file__).parent
LAYERS = ("rules", "storage", "engine", "facade", "integrations", "testing", "ops")
# An integration is written on the public API alone, as a user's code would be: what it needs
# from below the facade is a public name missing, not a reason to reach into the engine.
PUBLIC_MODULES = frozenset(
    {"safepoint", "safepoint.errors", "safepoint.types", "safepoint.storage", "safepoint.storage.base"}
)
# What the rules may not import: anything that reaches a store, the network, a file or a process.
IO_MODULES = frozenset(
    {
        "sqlite3",
        "psycopg",
        "psycopg_pool",
        "socket",
        "http",
        "urllib",
        "subprocess",
        "os",
        "asyncio",
        "concurrent",
        "pathlib",
        "shutil",
        "tempfile",
        "signal",
        "select",
        "selectors",
        "ssl",
    }
)


def module_name(path: Path) -> str:
    parts = ["safepoint", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top in ("errors", "types", "_rules"):
        return "rules"
    if top in ("storage", "_engine", "testing"):
        return {"storage": "storage", "_engine": "engine", "testing": "testing"}[top]
    # safepoint.otel watches the engine through its private observer seam, as an operator's
    # tool does: nothing in the package imports it.
    if top in ("ops", "__main__", "otel"):
        return "ops"
    if top == "integrations":
        return "integrations"
    if top == "":
        return "facade"
    raise AssertionError(f"{module} sits in no layer: put it in one of the subpackages")


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, module imported) for every import the module makes, wherever it is written
    (at the top, inside a function, under TYPE_CHECKING); ``source``: the module's text, read
    from its file unless given."""
    path = MODULES[module] if source is None else PACKAGE / "_given.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    text = path.read_text() if source is None else source
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from pkg import name` imports the module pkg.name when there is one
            named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            yield from ((node.lineno, name) for name in (named or [target]))


def internal(module: str) -> bool:
    return module == "safepoint" or module.startswith("safepoint.")


def test_every_module_sits_in_a_layer() -> None:
    for module in MODULES:
        assert layer_of(module) in LAYERS


def test_every_import_goes_down_or_stays_in_its_layer() -> None:
    wrong = []
    for module, path in MODULES.items():
        here = LAYERS.index(layer_of(module))
        for line, target in imports_of(module):
            if internal(target) and LAYERS.index(layer_of(target)) > here:
                wrong.append(
                    f"{path.relative_to(PACKAGE)}:{line} ({layer_of(module)})"
                    f" imports {target} ({layer_of(target)})"
                )
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_the_rules_do_no_io() -> None:
    wrong = [
        f"{MODULES[m].relative_to(PACKAGE)}:{line} imports {target}"
        for m in MODULES
        if layer_of(m) == "rules"
        for line, target in imports_of(m)
        if target.split(".")[0] in IO_MODULES
    ]
    assert not wrong, "the rules decide, they do no I/O:\n" + "\n".join(wrong)


def test_no_module_imports_itself_through_others() -> None:
    graph = {m: sorted({t for _, t in imports_of(m) if t in MODULES and t != m}) for m in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in graph[node]:
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module)
    # The facade and a package's __init__ re-export their modules; an import of the package
    # from one of its own modules is the cycle this test is for.
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def private_reaches(module: str, source: str | None = None) -> list[str]:
    """The imports by which an integration reaches below the public API."""
    return [
        f"{module}:{line} imports {target}"
        for line, target in imports_of(module, source)
        if internal(target) and target not in PUBLIC_MODULES and layer_of(target) != "integrations"
    ]


def test_integrations_use_the_public_api_only() -> None:
    wrong = [found for m in MODULES if layer_of(m) == "integrations" for found in private_reaches(m)]
    assert not wrong, "an integration uses the public API only:\n" + "\n".join(wrong)


def test_an_integration_reaching_below_the_facade_is_caught() -> None:
    source = (
        "import safepoint as sp\n"
        "from safepoint.types import JSON\n"
        "from safepoint._engine.core import RunCore\n"
    )
    assert private_reaches("safepoint.integrations.example", source) == [
        "safepoint.integrations.example:3 imports safepoint._engine.core"
    ]


# The integrations layer is empty until the first SDK integration lands.
@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer != "integrations"])
def test_each_layer_holds_modules(layer: str) -> None:
    assert any(layer_of(m) == layer for m in MODULES)


# The house's size for a module: read in one sitting, and about one concept. Its names are the
# ones it defines at its top level (into module-level `if` and `try` blocks): its classes,
# functions and assigned names, private ones too. What it imports is what it uses, not what it
# holds (as `test_public_surface` has it): imports are not counted.
MAX_LINES = 800
MAX_NAMES = 50


def top_level_names(source: str) -> set[str]:
    """The names a module's source defines at its top level."""
    names: set[str] = set()

    def bind(target: ast.expr) -> None:
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Tuple | ast.List):
            for item in target.elts:
                bind(item)
        elif isinstance(target, ast.Starred):
            bind(target.value)

    def define(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                bind(node.target)
            elif isinstance(node, ast.If):
                define(node.body)
                define(node.orelse)
            elif isinstance(node, ast.Try | ast.TryStar):
                for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                    define(block)

    define(ast.parse(source).body)
    return names


def test_top_level_names_are_what_a_module_defines_not_what_it_imports() -> None:
    source = (
        "from __future__ import annotations\n"
        "import re\n"
        "from typing import TYPE_CHECKING, Any\n"
        "if TYPE_CHECKING:\n"
        "    from .types import RunRecord\n"
        "    Row = dict[str, Any]\n"
        "LIMIT = 3\n"
        "_cache: dict[str, int] = {}\n"
        "first, (second, *rest) = 1, (2, 3)\n"
        "LIMIT += 1\n"
        "try:\n"
        "    import orjson\n"
        "    FAST = True\n"
        "except ImportError:\n"
        "    FAST = False\n"
        "def read(row: Row) -> RunRecord:\n"
        "    inner = 1\n"
        "    return row\n"
        "class Reading:\n"
        "    columns = ()\n"
        "async def aread() -> None: ...\n"
    )
    expected = {"Row", "LIMIT", "_cache", "first", "second", "rest", "FAST", "read", "Reading", "aread"}
    assert top_level_names(source) == expected


def test_every_module_is_small_enough_to_read_in_one_sitting() -> None:
    wrong = []
    for path in MODULES.values():
        source = path.read_text()
        lines, names = len(source.splitlines()), len(top_level_names(source))
        if lines > MAX_LINES:
            wrong.append(f"{path.relative_to(PACKAGE)}: {lines} lines (at most {MAX_LINES})")
        if names > MAX_NAMES:
            wrong.append(f"{path.relative_to(PACKAGE)}: {names} top-level names (at most {MAX_NAMES})")
    assert not wrong, (
        "modules over the house's size (split each along a seam in what it does):\n" + "\n".join(wrong)
    )
