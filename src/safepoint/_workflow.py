"""Workflows: the ``@workflow`` registry, ``start`` and ``resume``.

``start`` creates a run (or finds the one with this run id) and executes it; ``resume`` takes
over an existing run from wherever its ledger stands. Both end in ``_execute``, which runs the
workflow function from its start against the ledger — replay makes that cheap — and records
how it ended: completed, failed, or blocked.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._canonical import input_hash, require_json
from ._crashpoints import SimulatedCrash, crashpoint
from ._ownership import DEFAULT_LEASE_MS, Heartbeat, owner_is_gone, plan_claim, worker_id
from ._recovery import build_record
from ._run import AsyncRun, Run, RunCore, _drive
from .errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    IncompatibleWorkflow,
    LostOwnership,
    NeedsReconciliation,
    RunConflict,
    RunFailed,
    RunOwned,
    SafepointError,
    StoreError,
    UsageError,
    WorkflowNotFound,
)
from .storage.base import NewRun, Store
from .types import Claim, RunRecord, RunStatus

_ATTACH_POLL_MAX_S = 1.0


@dataclass(frozen=True, slots=True)
class Workflow:
    """A registered workflow: what ``@workflow`` returns and ``start`` takes."""

    name: str
    version: str
    fn: Callable[..., Any]

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)


_registry: dict[str, Workflow] = {}


def workflow(name: str, *, version: str = "1") -> Callable[[Callable[..., Any]], Workflow]:
    """Register a workflow under a stable name and an explicit version.

    The version is yours to bump: a run recorded by one version is only continued by the same
    version (nothing is inferred from source code, so a deploy strands nothing by itself).

    >>> @workflow("support-follow-up", version="v3")
    ... def follow_up(run: Run, case_id: str) -> dict: ...
    """
    if not name or not isinstance(name, str):
        raise UsageError("a workflow needs a non-empty name")

    def register(fn: Callable[..., Any]) -> Workflow:
        registered = Workflow(name, str(version), fn)
        _registry[name] = registered
        return registered

    return register


def registered(name: str) -> Workflow | None:
    return _registry.get(name)


def registered_names() -> list[str]:
    return sorted(_registry)


def _run_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    inputs = {"args": list(args), "kwargs": kwargs}
    require_json(inputs, "workflow inputs", allow_tuples=True)
    return inputs


def start(store: Store, wf: Workflow, /, *args: Any, run_id: str | None = None,
          lease_ms: int = DEFAULT_LEASE_MS, attach_timeout: float = 300.0,
          **kwargs: Any) -> Any:
    """Start a run of ``wf`` and execute it here; return its result.

    Starting a run id that exists never creates a second run: with the same workflow and inputs
    it attaches (returns the recorded result, resumes a run whose worker died, or waits up to
    ``attach_timeout`` seconds for a live worker); otherwise it raises ``RunConflict``.
    """
    if not isinstance(wf, Workflow):
        raise UsageError("start() takes a function decorated with @safepoint.workflow(...)")
    inputs = _run_inputs(args, kwargs)
    new = NewRun(run_id=run_id or uuid.uuid4().hex, workflow=wf.name,
                 workflow_version=wf.version, input_hash=input_hash(inputs), inputs=inputs,
                 owner=worker_id(), lease_ms=lease_ms)
    run, claim = store.create_run(new)
    if claim is None:
        _check_same_run(run, new)
        return _attach(store, wf, run, lease_ms, attach_timeout)
    crashpoint("run.after_start")
    return _execute(store, wf, claim, run, {}, {})


def submit(store: Store, wf: Workflow, /, *args: Any, run_id: str | None = None,
           **kwargs: Any) -> str:
    """Enqueue a run of ``wf`` for any worker (``safepoint worker``) to execute; return its id.

    Submitting a run id that exists never creates a second run: with the same workflow and
    inputs it returns the id; otherwise it raises ``RunConflict``.
    """
    if not isinstance(wf, Workflow):
        raise UsageError("submit() takes a function decorated with @safepoint.workflow(...)")
    inputs = _run_inputs(args, kwargs)
    new = NewRun(run_id=run_id or uuid.uuid4().hex, workflow=wf.name,
                 workflow_version=wf.version, input_hash=input_hash(inputs), inputs=inputs,
                 owner=None, lease_ms=0)
    run, _ = store.create_run(new)
    _check_same_run(run, new)
    return run.run_id


def _check_same_run(run: RunRecord, new: NewRun) -> None:
    if run.workflow != new.workflow:
        raise RunConflict(run.run_id, f"for workflow {run.workflow!r}")
    if run.input_hash != new.input_hash:
        raise RunConflict(run.run_id, "with other inputs")


def resume(store: Store, run_id: str, /, *, lease_ms: int = DEFAULT_LEASE_MS) -> Any:
    """Take over ``run_id`` and carry it on from its ledger; return its result.

    A completed run returns its recorded result; a failed run raises ``RunFailed``; a blocked
    run is tried again (the block is re-established if its cause remains); a run held by a live
    worker raises ``RunOwned``.
    """
    run = store.get_run(run_id)
    if run.status.terminal:
        return _ended(run)  # needs no workflow code: the ending is recorded
    wf = _registry.get(run.workflow)
    if wf is None:
        raise WorkflowNotFound(run.workflow, run_id)
    return _resume(store, wf, run, lease_ms)


async def start_async(store: Store, wf: Workflow, /, *args: Any, run_id: str | None = None,
                      lease_ms: int = DEFAULT_LEASE_MS, **kwargs: Any) -> Any:
    """``start`` from inside a running event loop (runs the workflow in a worker thread)."""
    return await asyncio.to_thread(start, store, wf, *args, run_id=run_id, lease_ms=lease_ms,
                                   **kwargs)


async def resume_async(store: Store, run_id: str, /, *,
                       lease_ms: int = DEFAULT_LEASE_MS) -> Any:
    """``resume`` from inside a running event loop."""
    return await asyncio.to_thread(resume, store, run_id, lease_ms=lease_ms)


def _ended(run: RunRecord) -> Any:
    """The outcome of a run that needs no worker: its result, or the error it ended with."""
    if run.status is RunStatus.COMPLETED:
        return run.result
    error = run.error or {}
    raise RunFailed(run.run_id, str(error.get("type", "error")), str(error.get("message", "")))


def _attach(store: Store, wf: Workflow, run: RunRecord, lease_ms: int, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        try:
            return _resume(store, wf, run, lease_ms)
        except RunOwned:
            if time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, _ATTACH_POLL_MAX_S)
        run = store.get_run(run.run_id)


def _resume(store: Store, wf: Workflow, run: RunRecord, lease_ms: int) -> Any:
    if run.status.terminal:
        return _ended(run)
    claim = None
    for _ in range(3):  # the revision may move under us (a finishing worker); look again
        plan = plan_claim(run, store.now(),
                          owner_gone=run.owner is not None and owner_is_gone(run.owner))
        claim = store.claim_run(run.run_id, run.state_revision, worker_id(), lease_ms,
                                dead_owner=plan.dead_owner)
        if claim is not None:
            break
        run = store.get_run(run.run_id)
        if run.status.terminal:
            return _ended(run)
    if claim is None:
        raise RunOwned(run.run_id, run.owner or "?", run.lease_expires_at or 0)
    return run_claimed(store, wf, claim, run)


def run_claimed(store: Store, wf: Workflow, claim: Claim, run: RunRecord) -> Any:
    """Carry on a run this worker has just claimed: load its ledger in one batch, check that
    this code may continue it, and execute."""
    try:
        ledger = store.load_ledger(run.run_id)
    except (CorruptRecord, ArtifactMissing, ArtifactCorrupt) as exc:
        _block_unreadable(store, claim, run, exc)
        raise
    run = ledger.run
    if run.workflow_version != wf.version:
        error = IncompatibleWorkflow(run.run_id, f"{run.workflow}@{run.workflow_version}",
                                     f"{wf.name}@{wf.version}")
        record = build_record(run, phase="incompatible_workflow", reason=error.message)
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)
        error.record = record
        raise error
    return _execute(store, wf, claim, run, dict(ledger.steps), dict(ledger.operations))


def _block_unreadable(store: Store, claim: Claim, run: RunRecord, exc: StoreError) -> None:
    record = build_record(run, phase="unreadable_record", reason=exc.message,
                          evidence={"type": type(exc).__name__, **{
                              k: str(v) for k, v in vars(exc).items() if k != "message"}})
    store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)


def _execute(store: Store, wf: Workflow, claim: Claim, run: RunRecord,
             steps: dict[str, Any], operations: dict[str, Any]) -> Any:
    """Run the workflow function against the ledger and record how it ended."""
    core = RunCore(store, claim, run, steps, operations, is_async=wf.is_async)
    args, kwargs = run.inputs["args"], run.inputs["kwargs"]
    try:
        with Heartbeat(store, claim):
            if wf.is_async:
                result = _run_coroutine(wf.fn(AsyncRun(core), *args, **kwargs))
            else:
                result = wf.fn(Run(core), *args, **kwargs)
    except (LostOwnership, SimulatedCrash):
        raise  # this worker must stop; the ledger already says everything it may say
    except (KeyboardInterrupt, SystemExit):
        # The process is stopping, not the run: release it so another worker need not wait.
        if core.halted is None:
            store.release_run(claim)
        raise
    except BaseException as exc:
        if core.halted is not None:
            if core.halted is exc:
                raise
            raise core.halted from exc  # agent code swallowed the block and failed otherwise
        if isinstance(exc, StoreError):
            raise  # the ledger is unreachable, not the run broken: it stays resumable
        _block_if_uncertain(core, f"the workflow raised {type(exc).__name__}: {exc}", exc)
        error = {"type": type(exc).__name__, "message": str(exc)[:4000]}
        store.finish_run(claim, RunStatus.FAILED, error=error)
        if isinstance(exc, SafepointError):
            raise
        raise RunFailed(run.run_id, error["type"], error["message"]) from exc
    if core.halted is not None:
        raise core.halted  # agent code swallowed the block; the run must not complete
    _block_if_uncertain(core, "the workflow returned", None)
    try:
        require_json(result, "workflow result")
    except UsageError as exc:
        store.finish_run(claim, RunStatus.FAILED,
                         error={"type": type(exc).__name__, "message": exc.message})
        raise
    crashpoint("run.before_complete")
    store.finish_run(claim, RunStatus.COMPLETED, result=result)
    return result


def _block_if_uncertain(core: RunCore, how: str, cause: BaseException | None) -> None:
    """A run ends only with every effect settled: one left uncertain (agent code caught the
    error of an interrupted dispatch and carried on) blocks the run instead."""
    uncertain = core.uncertain_operations()
    if not uncertain:
        return
    op = uncertain[0]
    error = NeedsReconciliation(core.run.run_id, op.step_id, op.operation_id,
                                f"{how} while this effect was still {op.state.value}")
    _drive(core, core.record_block(error, phase="reconcile_effect", op=op))
    raise error from cause


def _run_coroutine(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise UsageError("an async workflow was started from inside a running event loop; use"
                     " `await safepoint.start_async(...)` / `resume_async(...)` there")
