"""A flow called for its effect must be carried out: ``yield from core.flush()``. Written as a
plain call (``core.flush()``) it builds a generator and drops it — the pure steps stay unwritten,
the run is never blocked, the store is never asked — and nothing says so. This test reads the
package's source and fails on any such call: a call of a flow (a function that yields, or is
typed to return a ``Flow`` or a ``Generator``) whose result is thrown away as a statement of its
own, instead of being ``yield from``-ed, yielded, returned, passed on (to ``drive`` / ``adrive``
or another flow) or kept.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import safepoint

PACKAGE = Path(safepoint.__file__).parent
FLOW_TYPES = frozenset({"Flow", "Generator", "Iterator"})


def _own_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of ``fn``'s own body: not those of the functions and lambdas defined in it."""
    pending: list[ast.AST] = list(fn.body)
    while pending:
        node = pending.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            pending.extend(ast.iter_child_nodes(node))


def _returns_a_flow(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    if isinstance(fn, ast.AsyncFunctionDef):
        return False  # an async generator is iterated with ``async for``, never driven
    annotation = fn.returns
    if isinstance(annotation, ast.Subscript):
        annotation = annotation.value
    if isinstance(annotation, (ast.Name, ast.Attribute)):
        name = annotation.id if isinstance(annotation, ast.Name) else annotation.attr
        if name in FLOW_TYPES:
            return True
    return any(isinstance(node, (ast.Yield, ast.YieldFrom)) for node in _own_nodes(fn))


def _class_name(annotation: ast.expr | None) -> str | None:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(annotation.value, mode="eval").body
    return annotation.id if isinstance(annotation, ast.Name) else None


class Flows:
    """The flows defined in some modules: module-level functions by name, and each class's
    methods with the classes of the attributes its ``__init__`` keeps (``self.core = core``,
    ``core: RunCore``), so that ``self.core.flush()`` is known for a call of ``RunCore.flush``.
    """

    def __init__(self, trees: list[ast.Module]) -> None:
        functions: set[str] = set()
        not_flows: set[str] = set()
        self.methods: dict[str, set[str]] = {}
        self.attributes: dict[str, dict[str, str]] = {}
        self.bases: dict[str, list[str]] = {}
        for tree in trees:
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    (functions if _returns_a_flow(node) else not_flows).add(node.name)
                elif isinstance(node, ast.ClassDef):
                    self._add_class(node)
        # a name that also names a plain function cannot be told apart by reading a call
        self.functions = functions - not_flows

    def _add_class(self, cls: ast.ClassDef) -> None:
        methods = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        self.methods[cls.name] = {m.name for m in methods if _returns_a_flow(m)}
        self.bases[cls.name] = [b.id for b in cls.bases if isinstance(b, ast.Name)]
        kept: dict[str, str] = {}
        for init in (m for m in methods if m.name == "__init__"):
            params = {a.arg: _class_name(a.annotation) for a in init.args.args}
            for node in ast.walk(init):
                if (
                    isinstance(node, ast.Assign)
                    and len(node.targets) == 1
                    and isinstance(target := node.targets[0], ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                    and isinstance(node.value, ast.Name)
                    and (kind := params.get(node.value.id))
                ):
                    kept[target.attr] = kind
        self.attributes[cls.name] = kept

    def flow_methods(self, cls: str) -> set[str]:
        names = set(self.methods.get(cls, ()))
        for base in self.bases.get(cls, ()):
            names |= self.flow_methods(base)
        return names

    def attribute_class(self, cls: str, attr: str) -> str | None:
        if attr in self.attributes.get(cls, {}):
            return self.attributes[cls][attr]
        return next(
            (found for base in self.bases.get(cls, ()) if (found := self.attribute_class(base, attr))), None
        )

    def receiver_class(
        self, receiver: ast.expr, cls: str | None, params: dict[str, str | None]
    ) -> str | None:
        """The class of what a method is called on, when reading says: ``self``, a parameter
        annotated with a class, or an attribute ``__init__`` kept."""
        if isinstance(receiver, ast.Name):
            return cls if receiver.id == "self" and cls else params.get(receiver.id)
        if isinstance(receiver, ast.Attribute):
            owner = self.receiver_class(receiver.value, cls, params)
            return None if owner is None else self.attribute_class(owner, receiver.attr)
        return None

    def local_aliases(
        self, fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None, params: dict[str, str | None]
    ) -> dict[str, str]:
        """The local names ``fn`` binds to an object whose class reading knows (``core =
        self.core``, ``core, sid = self.core, self.sid``), so that ``core.flush()`` is known too."""
        aliases: dict[str, str] = {}
        for node in _own_nodes(fn):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts, strict=False)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for name, source in pairs:
                if isinstance(name, ast.Name) and (kind := self.receiver_class(source, cls, params)):
                    aliases[name.id] = kind
        return aliases

    def discarded_calls(self, tree: ast.Module) -> list[tuple[int, str]]:
        """(line, name) of every call of a flow whose result is dropped: the call is a
        statement of its own. Anywhere else the call stands (``yield from``, ``yield``,
        ``return``, an argument, an assignment), the flow is carried on."""
        found: list[tuple[int, str]] = []

        def visit(node: ast.AST, cls: str | None, params: dict[str, str | None]) -> None:
            if isinstance(node, ast.ClassDef):
                cls, params = node.name, {}
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = {
                    **params,
                    **{
                        a.arg: _class_name(a.annotation)
                        for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                    },
                }
                params.update(self.local_aliases(node, cls, params))
            elif isinstance(node, ast.Expr) and isinstance(call := node.value, ast.Call):
                if isinstance(call.func, ast.Name) and call.func.id in self.functions:
                    found.append((node.lineno, call.func.id))
                elif isinstance(call.func, ast.Attribute):
                    owner = self.receiver_class(call.func.value, cls, params)
                    if owner is not None and call.func.attr in self.flow_methods(owner):
                        found.append((node.lineno, call.func.attr))
            for child in ast.iter_child_nodes(node):
                visit(child, cls, params)

        visit(tree, None, {})
        return sorted(found)


def _package_trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def test_every_flow_called_in_the_package_is_carried_out() -> None:
    trees = _package_trees()
    flows = Flows(list(trees.values()))
    wrong = [
        f"{path.relative_to(PACKAGE)}:{line}: {name}(…) is a flow; its result is dropped,"
        " so it never runs — write `yield from` before it"
        for path, tree in trees.items()
        for line, name in flows.discarded_calls(tree)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_flows_it_knows_include_the_engines_own() -> None:
    """Guard against a check that passes because it recognizes nothing."""
    flows = Flows(list(_package_trees().values()))
    assert {"io", "chain_head", "effect_flow", "_execute_flow"} <= flows.functions
    assert {"flush", "write", "append_new", "block", "step_flow"} <= flows.flow_methods("RunCore")
    assert {"record", "mark_dispatching", "carry_out"} <= flows.flow_methods("EffectDispatch")
    assert flows.attribute_class("EffectDispatch", "core") == "RunCore"
    assert flows.attribute_class("Run", "_core") == "RunCore"  # kept by its base


SNIPPET = """
def notify() -> Flow[None]:
    yield Sleep(0.1)

def shout(text: str) -> str:
    return text.upper()

class Core:
    def flush(self) -> Flow[None]:
        yield from io(Store.record_steps, self.claim, [])

    def take_pending(self) -> list[StepRecord]:
        return []

class Dispatch:
    def __init__(self, core: Core) -> None:
        self.core = core

    def record(self, out) -> Flow[None]:
        self.core.flush()
        notify()
        self.core.take_pending()
        shout("a")
        out.flush()
        yield from self.core.flush()

    def carried_out(self, store, core: Core) -> Flow[None]:
        self.record(None)
        core.flush()
        yield self.core.flush()
        kept = core.flush()
        drive(store, notify())
        mine, n = self.core, 1
        mine.flush()
        return (yield from self.record(kept))
"""


def test_a_flow_called_without_yield_from_is_caught() -> None:
    tree = ast.parse(SNIPPET)
    flows = Flows([tree])
    assert flows.functions == {"notify"}
    assert flows.flow_methods("Dispatch") == {"record", "carried_out"}
    # the store's flush and the plain calls are left alone; the flows dropped are caught
    assert flows.discarded_calls(tree) == [
        (20, "flush"),
        (21, "notify"),
        (28, "record"),
        (29, "flush"),
        (34, "flush"),  # through a local name for self.core
    ]
