"""Workflows: the ``Workflow`` type, the ``@workflow`` decorator and the registry.

A workflow is registered under a stable name and an explicit version; the registry is what this
process's code can continue, and where a run's recorded workflow name is looked up when it is
resumed or claimed (``workflow_of``). Running one is the lifecycle's (``lifecycle``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from .._rules.compat import fingerprint, manifest_of
from .._rules.history import DEFAULT_HISTORY_LIMIT, as_history_limit
from .._rules.ids import check_id
from .._rules.limits import as_retry, deadline_of
from .._rules.secrets import refuse_secrets
from ..errors import UsageError, WorkflowNotFound
from ..types import Budget, Compatibility, HistoryLimit, Retry, RunRecord

DEFAULT_RESUME_BUDGET = 20


@dataclass(frozen=True, slots=True)
class Workflow:
    """A registered workflow: what ``@workflow`` returns and ``start`` takes."""

    name: str
    version: str
    fn: Callable[..., Any]
    resume_budget: int | None = DEFAULT_RESUME_BUDGET
    compatibility: Compatibility = Compatibility.REFUSE
    manifest: dict[str, Any] = field(default_factory=manifest_of)
    step_attempts: Retry | None = None  # default attempts of its read and model steps
    budget: Budget | None = None  # model tokens / cost a run may spend
    deadline: timedelta | None = None  # how long after its creation a run may start new work
    history_limit: HistoryLimit = DEFAULT_HISTORY_LIMIT

    @property
    def fingerprint(self) -> str:
        """The digest of the tool schemas, model ids and prompt hashes this code declares."""
        return fingerprint(self.manifest)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """A workflow runs against a ledger, never as a plain call: say how to run it."""
        verb = "start_async" if self.is_async else "start"
        raise UsageError(
            f"workflow {self.name!r} is not called directly: run it with"
            f" safepoint.{verb}(store, {self.fn.__name__}, *args, run_id=…) (or"
            " safepoint.submit(...) for a worker); the ledger gives it its run"
        )


_registry: dict[str, Workflow] = {}


def workflow(
    name: str,
    *,
    version: str = "1",
    resume_budget: int | None = None,
    compatibility: Compatibility | str = Compatibility.REFUSE,
    tools: Any = None,
    models: list[str] | None = None,
    prompts: dict[str, str] | None = None,
    step_attempts: Retry | int | None = None,
    budget: Budget | None = None,
    deadline: timedelta | None = None,
    history_limit: HistoryLimit | tuple[int | None, int | None] | None = None,
) -> Callable[[Callable[..., Any]], Workflow]:
    """Register a workflow under a stable name and an explicit version.

    The version is yours to bump: nothing is inferred from source code, so a deploy strands
    nothing by itself. Declare what the workflow's model steps depend on — the ``tools`` schemas
    offered to the model, the ``models`` called, the ``prompts`` (name → text) — and each run
    records their fingerprint. A run recorded by another version or fingerprint, or whose
    recorded step answers another question than the one now asked, is handled by
    ``compatibility``: ``"refuse"`` (default) blocks it with the recovery record; ``"replan"``
    abandons the stale tail of recorded observations and decisions (kept in the history),
    carries on from the last step still valid, and keeps the effect ledger: an operation that
    already happened returns its receipt instead of being dispatched again.
    ``resume_budget`` is how often one run may be taken over (its worker died or stopped) before
    it fails loudly with ``BudgetExhausted`` (default 20; it is recorded with each run).
    ``history_limit`` bounds each run's history, its events and steps: ``HistoryLimit(soft=,
    hard=)`` or a ``(soft, hard)`` pair (default 10 000 and 50 000; recorded with each run).
    Past soft the run warns; at hard it records nothing new and blocks — long runs
    ``run.continue_as_new(state)`` before that.

    Limits recorded with each run, which no restart resets: ``step_attempts`` (a ``Retry`` or a
    number) is how often a read or model step is attempted when it names no ``retry=`` of its
    own (default 1: no retry); ``budget`` (``Budget(tokens=…, cost=…)``) is what its model calls
    may spend; ``deadline`` (a ``timedelta`` from the run's creation) is when it stops starting
    new work and fails with ``DeadlineExceeded``. ``start`` and ``submit`` may set the last two
    per run.

    >>> @workflow("support-follow-up", version="v3")
    ... def follow_up(run: Run, case_id: str) -> dict: ...
    """
    check_id(name, "workflow name")
    check_id(str(version), "workflow version")

    if resume_budget is not None and resume_budget < 0:
        raise UsageError("resume_budget is a count of takeovers: 0 or more")
    try:
        policy = Compatibility(compatibility)
    except ValueError:
        raise UsageError(f"compatibility={compatibility!r}: use 'refuse' or 'replan'") from None
    manifest = manifest_of(tools, models, prompts)
    refuse_secrets(manifest, "the workflow's manifest")  # recorded with every run
    attempts = as_retry(step_attempts, "step_attempts")
    if budget is not None and not isinstance(budget, Budget):
        raise UsageError(f"budget={budget!r}: pass safepoint.Budget(tokens=..., cost=...)")
    if deadline is not None and not isinstance(deadline, timedelta):
        raise UsageError(
            f"deadline={deadline!r}: a workflow's deadline is a timedelta, counted from each run's creation"
        )
    deadline_of(deadline)  # validated here, not at the first start
    limit = as_history_limit(history_limit)

    def register(fn: Callable[..., Any]) -> Workflow:
        registered = Workflow(
            name,
            str(version),
            fn,
            DEFAULT_RESUME_BUDGET if resume_budget is None else resume_budget,
            compatibility=policy,
            manifest=manifest,
            step_attempts=attempts,
            budget=budget,
            deadline=deadline,
            history_limit=limit,
        )
        _register(registered)
        return registered

    return register


def _register(wf: Workflow) -> None:
    """Register ``wf`` under its name: a new version replaces the one registered (a deploy
    within one process), and the same code registered again (a module reloaded) is taken
    again. Another function under the same name and version is refused: one of the two would
    silently never run, and runs recorded by one would be replayed by the other."""
    known = _registry.get(wf.name)
    if (
        known is not None
        and known.version == wf.version
        and known.fn is not wf.fn
        and _code_name(known.fn) != _code_name(wf.fn)
    ):
        raise UsageError(
            f"workflow {wf.name!r} version {wf.version!r} is registered already,"
            f" by {_code_name(known.fn)}; {_code_name(wf.fn)} cannot take the"
            " same name and version — give it a name of its own, or bump the"
            " version if it replaces the first"
        )
    _registry[wf.name] = wf


def forget_workflows(*names: str) -> None:
    """Forget the workflows registered under ``names`` (all of them, given none), as a new
    process would not know them: for a test that deploys changed code under the same name and
    version within one process. (``safepoint.testing.forget_workflows``.)"""
    for name in names or list(_registry):
        _registry.pop(name, None)


def _code_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def registered(name: str) -> Workflow | None:
    return _registry.get(name)


def registered_versions() -> list[str]:
    """What this process's code can continue: ``name@version`` of each registered workflow, or
    just ``name`` (any version) for one whose compatibility policy is ``replan``."""
    return sorted(
        wf.name if wf.compatibility is Compatibility.REPLAN else f"{wf.name}@{wf.version}"
        for wf in _registry.values()
    )


def workflow_of(run: RunRecord) -> Workflow:
    """The workflow registered under the name ``run`` recorded: ``WorkflowNotFound`` when this
    process's code has none."""
    wf = _registry.get(run.workflow)
    if wf is None:
        raise WorkflowNotFound(run.workflow, run.run_id)
    return wf
