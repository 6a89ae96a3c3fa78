"""The public surface, enforced: each public module's ``__all__`` is sorted and complete, the
top level holds exactly the names chosen for it, and every public name is documented.

"Complete" means every public name a module's source binds is listed. A module lists what it
defines (its classes, functions and constants); its imports are what it uses. A package's
``__init__`` also lists what it imports from a private module, because that import is the only
public way to reach the name; what it imports from another public module is listed there.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import safepoint
import safepoint.errors
import safepoint.types

PUBLIC_MODULES = (
    "safepoint",
    "safepoint.errors",
    "safepoint.types",
    "safepoint.storage",
    "safepoint.testing",
    "safepoint.otel",
)

# What a workflow's code uses every day. Adding a name here is a decision about the public API,
# not a side effect of importing it: everything else has a home in errors, types or testing.
TOP_LEVEL = frozenset(
    {
        # the verbs
        "workflow",
        "start",
        "start_async",
        "submit",
        "submit_async",
        "resume",
        "resume_async",
        "cancel",
        "cancel_async",
        "approve",
        "approve_async",
        "revoke_approval",
        "revoke_approval_async",
        "resolve",
        "extend_limits",
        "extend_limits_async",
        "fork",
        "fork_async",
        "retry",
        "retry_async",
        "send",
        "send_async",
        "answer",
        "answer_async",
        # retention: what an operator's scheduled job calls
        "prune",
        "prune_async",
        "record_schema",
        # a run as a portable file (safepoint export), for a replay or another machine
        "export_run",
        "export_run_async",
        "open_store",
        "open_async_store",
        # the run whose workflow is executing (for helpers and integrations)
        "current_run",
        "current_effect_key",
        # the types a step is written with
        "Workflow",
        "Run",
        "AsyncRun",
        "Worker",
        "Effect",
        "EffectKey",
        "Applied",
        "NotApplied",
        "Unknown",
        "NotSent",
        "Rejected",
        "Secret",
        "Transcript",
        "reads_messages_only",  # a model function that hands a Transcript's items to an SDK
        "Budget",
        "Retry",
        "HistoryLimit",
        "Unfinished",  # what a call given slice= returns when the run goes on
        "Store",
        "AsyncStore",
        # the errors worth catching
        "SafepointError",
        "UsageError",
        "RunBlocked",
        "AwaitingApproval",
        "AwaitingMessage",
        "RunWaiting",
        "WaitTimedOut",
        "RunFailed",
        "LimitReached",
        "RunCancelled",
        "StepFailed",
        "NeedsReconciliation",
        "StoreError",
        "StoreUnavailable",
        "LostOwnership",
    }
)


def public_module(name: str) -> ModuleType:
    return importlib.import_module(name)


def listing_order(name: str) -> tuple[int, str]:
    """The order ruff (RUF022) keeps ``__all__`` in: CONSTANTS, then Classes, then functions."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def runtime_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's top-level statements, into ``if``/``try`` blocks but not ``if TYPE_CHECKING``
    (what is bound there exists only for the type checker)."""
    for node in body:
        if isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                yield from runtime_statements(node.body)
            yield from runtime_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from runtime_statements(block)
        else:
            yield node


def bound_publicly(module: ModuleType) -> set[str]:
    """The public names ``module``'s source binds that its ``__all__`` must list."""
    path = Path(str(module.__file__))
    is_package = path.name == "__init__.py"
    package = module.__name__ if is_package else module.__name__.rpartition(".")[0]
    names: set[str] = set()
    for node in runtime_statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom) and is_package:
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            if source.startswith("safepoint.") and any(part.startswith("_") for part in source.split(".")):
                names.update(alias.asname or alias.name for alias in node.names)
    return {name for name in names if not name.startswith("_")}


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_every_public_module_lists_its_public_names_sorted(name: str) -> None:
    module = public_module(name)
    listed = module.__all__
    assert listed == sorted(listed, key=listing_order)
    assert len(set(listed)) == len(listed)
    assert [missing for missing in listed if not hasattr(module, missing)] == []
    assert sorted(bound_publicly(module) - set(listed)) == []


def test_the_top_level_holds_exactly_the_chosen_names() -> None:
    assert set(safepoint.__all__) == TOP_LEVEL
    assert isinstance(safepoint.__version__, str)
    # and it imports nothing it does not export (submodules aside)
    public = {
        name
        for name, value in vars(safepoint).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert public - {"annotations"} <= set(safepoint.__all__)


def test_every_error_and_record_of_the_top_level_is_also_in_its_own_module() -> None:
    """``safepoint.errors`` holds every error safepoint raises and ``safepoint.types`` every
    record and enum, the few the top level shows included. (``NotSent`` and ``Rejected`` are
    no errors of safepoint's: an effect's own code raises them, and they live with ``Effect``.)"""
    homes = {module.__name__: module for module in (safepoint.errors, safepoint.types)}
    for name in safepoint.__all__:
        value = getattr(safepoint, name)
        home = homes.get(getattr(value, "__module__", ""))
        if home is not None:
            assert name in home.__all__, name
            assert getattr(home, name) is value, name


def test_every_public_name_has_a_docstring_of_its_own() -> None:
    """A class or function of safepoint's has one — not the one a dataclass writes for itself
    (its signature), nor none. A constant or type alias cannot carry one, so its module's
    docstring names it (``NAME``)."""
    undocumented = []
    for module_name in PUBLIC_MODULES:
        module = public_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            own = (inspect.isclass(value) or inspect.isfunction(value)) and getattr(
                value, "__module__", ""
            ).startswith("safepoint")
            if own:
                doc = (value.__doc__ or "").strip()
                documented = bool(doc) and not doc.startswith(f"{name}(")
            else:
                documented = f"``{name}``" in (module.__doc__ or "")
            if not documented:
                undocumented.append(f"{module_name}.{name}")
    assert undocumented == []


def test_crash_at_arms_one_point_for_its_block_and_disarms_it_on_leaving() -> None:
    from safepoint.testing import CRASH_POINTS, SimulatedCrash, crash_at

    store = safepoint.open_store("memory:")

    @safepoint.workflow("public-surface-crash-at")
    def flow(run: safepoint.Run) -> str:
        return run.pure("first", lambda: "done")

    assert "step.after_record" in CRASH_POINTS
    with crash_at("step.after_record:first"), pytest.raises(SimulatedCrash) as crashed:
        safepoint.start(store, flow, run_id="r", lease_ms=0)
    assert (crashed.value.point, crashed.value.step_id) == ("step.after_record", "first")
    assert safepoint.resume(store, "r") == "done"  # disarmed: the resume runs to the end
    with pytest.raises(safepoint.UsageError, match="unknown crash point"), crash_at("step.nowhere"):
        pass
    store.close()


def test_the_testing_tools_load_when_first_asked_for() -> None:
    """A child process of the kill harness imports ``safepoint.testing``; it must not pay for
    the owner service, the harness or pytest (which the conformance suite needs) unless used."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, safepoint.testing;"
            " print(sorted(m for m in sys.modules if m.startswith('safepoint.testing.')"
            " or m == 'pytest'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert loaded.strip() == "[]"
    from safepoint.testing import KillHarness, StoreConformance

    assert KillHarness.__module__ == "safepoint.testing.kill"
    assert StoreConformance.__module__ == "safepoint.testing.conformance"


def test_the_top_level_loads_its_names_when_first_asked_for() -> None:
    """Every command and every worker start imports ``safepoint``: the import itself loads none
    of the engine, the rules, the types or the stores; each name loads its own module when a
    program first uses it, and a store's module loads when ``open_store`` opens one."""
    import subprocess
    import sys

    def loaded(code: str) -> set[str]:
        shown = subprocess.run(
            [sys.executable, "-c", f"import sys; {code}; print(sorted(sys.modules))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return {m for m in ast.literal_eval(shown.strip()) if m.startswith("safepoint") or m == "asyncio"}

    assert loaded("import safepoint") == {"safepoint"}
    registered = loaded("import safepoint; safepoint.workflow")
    assert "safepoint._engine.workflow" in registered
    assert {"safepoint._rules.fork", "safepoint.storage", "safepoint.storage.sqlite"} & registered == set()
    opened = loaded("import safepoint; safepoint.open_store('memory:')")
    assert "safepoint.storage.sqlite" in opened
    assert {"safepoint.storage.postgres", "safepoint._engine.worker", "asyncio"} & opened == set()
    # and what the package held as attributes when it imported everything, it still holds
    assert "safepoint.types" in loaded("import safepoint; safepoint.types.RunStatus")
    assert dir(safepoint) == sorted({*dir(safepoint), *safepoint.__all__, "errors", "types", "storage"})
