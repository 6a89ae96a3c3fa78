"""The run lifecycle, as flows: starting a run, claiming it, loading its ledger, executing the
workflow, and ending it.

``start_flow`` creates a run (or finds the one with this run id) and executes it; ``resume_flow``
takes over an existing run from wherever its ledger stands. Both end in ``_execute_flow``, which
runs the workflow function from its start against the ledger — replay makes that cheap — and
records how it ended: completed, failed, blocked, stopped at a limit, or continued as new (and
then executes the successor too, so the first run's caller gets the chain's result). The verbs
that carry these flows out, sync or async, are in ``verbs``. Reading order: ``start_flow`` / ``resume_flow``,
``claimed_flow`` (the resume procedure), ``_executed`` and the endings.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from .._rules.canonical import input_hash, require_json
from .._rules.compat import changes
from .._rules.effects import key_is_minted
from .._rules.fencing import cancelled_error, plan_claim
from .._rules.history import successor_run_id
from .._rules.ids import check_run_id
from .._rules.limits import (
    carried_limits,
    deadline_of,
    limits_of,
    merged_budget,
    past_deadline,
    run_default,
    stop_error,
    stop_of,
)
from .._rules.recovery import build_record
from .._rules.secrets import redact_text, redacted_message, refuse_secrets
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    BudgetExhausted,
    Cancelled,
    ContinueAsNew,
    CorruptRecord,
    DeadlineExceeded,
    DecryptionFailed,
    EffectRejected,
    IncompatibleWorkflow,
    KeyUnavailable,
    LimitReached,
    LostOwnership,
    NeedsReconciliation,
    RunBlocked,
    RunCancelled,
    RunConflict,
    RunFailed,
    RunOwned,
    RunWaiting,
    SafepointError,
    SliceEnded,
    StepAttemptsExhausted,
    StepFailed,
    StoreError,
    StoreUnavailable,
    UsageError,
    WaitTimedOut,
)
from ..storage.base import NewRun, Replan, Store
from ..types import (
    Budget,
    Claim,
    Compatibility,
    EffectState,
    Ledger,
    LedgerIdentity,
    OperationRecord,
    RunRecord,
    RunStatus,
    UnreadableRun,
)
from . import host, observe
from .core import RunCore, finish_blocked
from .crashpoints import SimulatedCrash, crashpoint
from .current import running
from .flow import Call, Flow, R, Sleep, io
from .observe import Execution
from .ownership import Heartbeat, owner_is_gone, worker_id
from .run import AsyncRun, Run
from .slices import SliceClock, end_slice
from .workflow import Workflow

if TYPE_CHECKING:
    pass

_ATTACH_POLL_MAX_S = 1.0


def _run_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    inputs = {"args": list(args), "kwargs": kwargs}
    require_json(inputs, "workflow inputs", allow_tuples=True)
    refuse_secrets(inputs, "the workflow inputs")
    return inputs


Deadline = timedelta | datetime | None


def new_run(
    wf: Workflow,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    run_id: str | None,
    owner: str | None,
    lease_ms: int,
    budget: Budget | None = None,
    deadline: Deadline = None,
) -> NewRun:
    if not isinstance(wf, Workflow):
        hint = (
            ' (it is a plain function: decorate it with @safepoint.workflow("name"))' if callable(wf) else ""
        )
        raise UsageError(
            f"the workflow to run goes after the store, and got"
            f" {type(wf).__name__} there{hint}: pass the function decorated with"
            " @safepoint.workflow(...)"
        )
    run_id = host.current.token() if run_id is None else check_run_id(run_id)
    spend = merged_budget(wf.budget, budget)
    deadline_at, deadline_ms = deadline_of(deadline if deadline is not None else wf.deadline)
    return _new_run_record(
        wf,
        _run_inputs(args, kwargs),
        run_id,
        owner,
        lease_ms,
        deadline_at=deadline_at,
        deadline_ms=deadline_ms,
        token_budget=spend.tokens,
        cost_budget=spend.cost,
        model_call_budget=spend.model_calls,
    )


def _new_run_record(
    wf: Workflow, inputs: dict[str, Any], run_id: str, owner: str | None, lease_ms: int, **limits: Any
) -> NewRun:
    """A run of ``wf`` as the store records it, with ``limits`` (deadline, budgets, and for a
    successor the limits its chain carries on) and what the workflow itself says (versions,
    fingerprint, attempts, history limits, the resume budget unless carried)."""
    limits.setdefault("resume_budget", wf.resume_budget)
    return NewRun(
        run_id=run_id,
        workflow=wf.name,
        workflow_version=wf.version,
        input_hash=input_hash(inputs),
        inputs=inputs,
        owner=owner,
        lease_ms=lease_ms,
        history_soft_limit=wf.history_limit.soft,
        history_hard_limit=wf.history_limit.hard,
        workflow_fingerprint=wf.fingerprint,
        workflow_manifest=wf.manifest,
        step_attempts=wf.step_attempts,
        **limits,
    )


def cancel_flow(run_id: str, by: str, reason: str | None) -> Flow[RunRecord]:
    run = yield from io(Store.request_cancel, run_id, by, reason)
    # A continued run's work goes on in its successor (which may continue again meanwhile).
    while run.status is RunStatus.CONTINUED and run.successor_run_id is not None:
        run = yield from io(Store.request_cancel, run.successor_run_id, by, reason)
    return run


def block_claimed(claim: Claim, error: StoreError) -> Flow[None]:
    found = yield from io(Store.find_run, claim.run_id)
    yield from _block_unreadable(claim, found, error)


# -- carrying flows out --------------------------------------------------------------------------


# -- the flows ------------------------------------------------------------------------------------


def get_run_flow(run_id: str) -> Flow[RunRecord]:
    return (yield from io(Store.get_run, run_id))


def submit_flow(new: NewRun) -> Flow[str]:
    run, _ = yield from io(Store.create_run, new)
    _check_same_run(run, new)
    return run.run_id


def _check_same_run(run: RunRecord, new: NewRun) -> None:
    if run.workflow != new.workflow:
        raise RunConflict(run.run_id, f"for workflow {run.workflow!r}")
    if run.input_hash != new.input_hash:
        raise RunConflict(run.run_id, "with other inputs")


def start_flow(
    store: Any, wf: Workflow, new: NewRun, attach_timeout: float, slice_clock: SliceClock | None = None
) -> Flow[Any]:
    run, claim = yield from io(Store.create_run, new)
    if claim is None:
        _check_same_run(run, new)
        if slice_clock is not None:  # a live worker is waited for within the slice only
            attach_timeout = min(attach_timeout, slice_clock.remaining())
        return (yield from _attach_flow(store, wf, run, new.lease_ms, attach_timeout, slice_clock))
    crashpoint("run.after_start")
    watch = observe.started(run, claim, time.time_ns())
    return (yield from _execute_flow(store, wf, claim, run, {}, {}, slice_clock=slice_clock, watch=watch))


def outcome_of(run: RunRecord) -> Any:
    """The outcome of a run that needs no worker: its result, or the error it ended with (a
    stopped run: the ``LimitReached`` it stopped with, its recovery record attached)."""
    if run.status is RunStatus.COMPLETED:
        return run.result
    if run.status is RunStatus.STOPPED:  # until a person raises its limit: it changes nothing
        raise stop_error(run)
    error = run.error or {}
    if run.status is RunStatus.CANCELLED:
        raise RunCancelled(run.run_id, str(error.get("message", "cancelled")))
    raise RunFailed(run.run_id, str(error.get("type", "error")), str(error.get("message", "")))


def _attach_flow(
    store: Any,
    wf: Workflow,
    run: RunRecord,
    lease_ms: int,
    timeout: float,
    slice_clock: SliceClock | None = None,
) -> Flow[Any]:
    """Wait for a live worker to finish the run (or die, and then take it over)."""
    deadline = host.current.monotonic() + timeout
    pause = 0.02
    while True:
        try:
            return (yield from resume_flow(store, wf, run, lease_ms, slice_clock))
        except RunOwned:
            if host.current.monotonic() >= deadline:
                raise
        yield Sleep(pause)
        pause = min(pause * 2, _ATTACH_POLL_MAX_S)
        run = yield from io(Store.get_run, run.run_id)


def resume_flow(
    store: Any, wf: Workflow, run: RunRecord, lease_ms: int, slice_clock: SliceClock | None = None
) -> Flow[Any]:
    run = yield from chain_head(run)  # a continued run: resume the chain where it is
    if run.status.terminal or run.status is RunStatus.STOPPED:
        return outcome_of(run)
    claim = None
    for _ in range(3):  # the revision may move under us (a finishing worker); look again
        plan = plan_claim(run, owner_gone=run.owner is not None and owner_is_gone(run.owner))
        claim = yield from io(
            Store.claim_run, run.run_id, run.state_revision, worker_id(), lease_ms, dead_owner=plan.dead_owner
        )
        if claim is not None:
            break
        run = yield from chain_head((yield from io(Store.get_run, run.run_id)))
        if run.status.terminal or run.status is RunStatus.STOPPED:
            return outcome_of(run)
    if claim is None:
        raise RunOwned(run.run_id, run.owner or "?", run.lease_expires_at or 0)
    return (yield from claimed_flow(store, wf, claim, run, slice_clock))


def claimed_flow(
    store: Any, wf: Workflow, claim: Claim, run: RunRecord, slice_clock: SliceClock | None = None
) -> Flow[Any]:
    """The resume procedure, once this worker owns the run: load the ledger in one batch and
    check that every record and artifact the run needs is there and intact; check that this
    code may continue it (version and fingerprint, by the compatibility policy); check its
    limits (resume budget, deadline: a spent one stops the run); then execute — replay
    classifies each recorded step and operation by DESIGN §3 as the workflow reaches it.
    Anything that cannot go on blocks with the recovery record. An installed observer follows
    it from here, as one run execution (see ``observe``)."""
    began = time.time_ns()
    try:
        ledger = yield from _load_intact(claim, run, store.identity)
    except BaseException as exc:
        if (unread := observe.started(run, claim, began)) is not None:
            unread.ended(observe.call_status(exc, otherwise="failed"), exc, time.time_ns())
        raise
    # the run as this claim left it (its resume count), from the ledger just loaded
    watch = observe.started(ledger.run, claim, began)
    if watch is None:
        ready = yield from _ready_flow(store, wf, claim, ledger)
    else:
        ready = yield from _watched(watch, _ready_flow(store, wf, claim, ledger), ending=False)
    if isinstance(ready, _Again):  # stopped at a limit a person raised in that moment: again
        return (yield from resume_flow(store, wf, ready.run, claim.lease_ms, slice_clock))
    return (
        yield from _execute_flow(
            store,
            wf,
            claim,
            ready.run,
            dict(ready.steps),
            dict(ready.operations),
            ready.attempts,
            slice_clock=slice_clock,
            watch=watch,
        )
    )


def _ready_flow(store: Any, wf: Workflow, claim: Claim, ledger: Ledger) -> Flow[Ledger | _Again]:
    """``claimed_flow``'s checks of the loaded ledger before the workflow runs: the ledger to
    execute, or ``_Again`` for a run that stopped at a limit here and was released (to be
    claimed again)."""
    try:
        run = yield from _check_compatible(wf, claim, ledger.run)
    except Cancelled as exc:  # re-planning is new work: refused once a cancel is asked for
        yield from _end_cancelled(_core(store, wf, claim, ledger), exc)
    except DeadlineExceeded as exc:  # … or once the deadline passed
        return (yield from _end_for_limit(_core(store, wf, claim, ledger), exc))
    ledger = replace(ledger, run=run)
    if run.resume_budget is not None and run.resume_count > run.resume_budget:
        return (
            yield from _end_for_limit(
                _core(store, wf, claim, ledger),
                BudgetExhausted(run.run_id, run.resume_budget, run.resume_count),
                f"the resume budget ({run.resume_budget}) ran out",
            )
        )
    if run.deadline_at is not None and past_deadline(run, (yield from io(Store.now))):
        core = _core(store, wf, claim, ledger)
        if not core.uncertain_operations():
            return (
                yield from _end_for_limit(
                    core, DeadlineExceeded(run.run_id, run.deadline_at), "the deadline passed"
                )
            )
        # else: replay and settle the uncertain effect; the store refuses anything new, and
        # the run then stops (or blocks, if the effect stays uncertain)
    return ledger


def _check_key(op: OperationRecord, run: RunRecord, identity: LedgerIdentity) -> None:
    """``CorruptRecord`` unless ``op`` holds the key minted for it (see ``key_is_minted``)."""
    if not key_is_minted(op, run, identity):
        raise CorruptRecord(
            "safepoint_operations",
            f"{run.run_id}/{op.operation_id}",
            f"its effect_key {op.effect_key!r} is not the key minted for operation"
            f" {op.operation_id!r}: it was altered after it was recorded, and nothing is"
            " reconciled or sent under it — put the minted key back (from a backup), or look"
            " the operation up at its owner and resolve the run",
        )


def _load_intact(claim: Claim, run: RunRecord, identity: LedgerIdentity) -> Flow[Ledger]:
    """The ledger, with the payload of every operation that may still be sent read back and
    checked against its digest, and its stored key checked against the key minted for it —
    before anything is replayed, not when the run reaches it — and the run's inputs checked to
    be what a workflow is called with."""
    try:
        ledger = yield from io(Store.load_ledger, run.run_id)
        _check_inputs(ledger.run)
        for op in ledger.operations.values():
            if op.state not in (EffectState.ACCEPTED, EffectState.REJECTED):
                _check_key(op, ledger.run, identity)
                yield from io(Store.get_artifact, op.payload_ref)
    except _UNREADABLE as exc:
        yield from _block_unreadable(claim, run, exc)
        raise
    return ledger


def _check_inputs(run: RunRecord) -> None:
    """A run's stored inputs are what ``_run_inputs`` records; any other value (readable JSON
    of another shape) is a record the workflow cannot be called with."""
    inputs = run.inputs
    if not (
        isinstance(inputs, dict)
        and isinstance(inputs.get("args"), list)
        and isinstance(inputs.get("kwargs"), dict)
    ):
        raise CorruptRecord(
            "safepoint_runs",
            f"run_id={run.run_id}",
            f"inputs: {str(inputs)[:200]!r} are not a workflow run's inputs (an object of args and kwargs)",
        )


def _block_unreadable(claim: Claim, run: RunRecord | UnreadableRun, exc: StoreError) -> Flow[None]:
    """Block the claimed run for a person: ``exc`` says what of its record cannot be read."""
    record = build_record(
        run,
        phase="unreadable_record",
        reason=exc.message,
        evidence={"type": type(exc).__name__, **{k: str(v) for k, v in vars(exc).items() if k != "message"}},
    )
    yield from io(Store.finish_run, claim, RunStatus.BLOCKED, recovery_record=record)


def _check_compatible(wf: Workflow, claim: Claim, run: RunRecord) -> Flow[RunRecord]:
    """The run as this code continues it: unchanged, re-planned under this code's version and
    fingerprint (``replan``), or blocked with what changed (``refuse``)."""
    differences = changes(
        run.workflow_version,
        run.workflow_manifest,
        run.workflow_fingerprint,
        wf.version,
        wf.manifest,
        wf.fingerprint,
    )
    if not differences:
        return run
    if wf.compatibility is Compatibility.REPLAN:
        yield from io(
            Store.replan,
            claim,
            Replan(
                reason="the workflow changed: " + "; ".join(differences),
                workflow_version=wf.version,
                workflow_fingerprint=wf.fingerprint,
                workflow_manifest=wf.manifest,
            ),
        )
        return replace(
            run,
            workflow_version=wf.version,
            workflow_fingerprint=wf.fingerprint,
            workflow_manifest=wf.manifest,
        )
    error = IncompatibleWorkflow(
        run.run_id, f"{run.workflow}@{run.workflow_version}", f"{wf.name}@{wf.version}", changes=differences
    )
    record = build_record(
        run, phase="incompatible_workflow", reason=error.message, evidence={"changes": differences}
    )
    error.record = yield from finish_blocked(claim, record)
    raise error


def _core(store: Any, wf: Workflow, claim: Claim, ledger: Ledger) -> RunCore:
    return RunCore(
        store,
        claim,
        ledger.run,
        dict(ledger.steps),
        dict(ledger.operations),
        is_async=wf.is_async,
        replans=wf.compatibility is Compatibility.REPLAN,
        attempts=ledger.attempts,
        default_retry=run_default(ledger.run.step_attempts, wf.step_attempts),
    )


@dataclass(frozen=True, slots=True)
class _Again:
    """How a run ended that was stopping at a limit a person raised in that very moment: it is
    released (``run``, as it now stands), to be carried on."""

    run: RunRecord


@dataclass(frozen=True, slots=True)
class _Continued:
    """How a run ended that continued as new: its successor, and this worker's claim on it
    (None for a successor left for any worker)."""

    run: RunRecord
    claim: Claim | None


def _watched(watch: Execution, flow: Flow[R], *, ending: bool = True) -> Flow[R]:
    """``flow``, with ``watch`` told how the execution ended — when it raised, or (``ending``)
    whatever it returned: its result, or the lifecycle's own ending that carries on elsewhere
    (a successor, a limit raised as the run stopped)."""
    try:
        value = yield from flow
    except BaseException as exc:
        watch.ended(observe.call_status(exc, otherwise="failed"), exc, time.time_ns())
        raise
    if isinstance(value, _Continued):
        watch.ended("continued", None, time.time_ns())
    elif isinstance(value, _Again):
        watch.ended("released", None, time.time_ns())
    elif ending:
        watch.ended(observe.returned_status(value), None, time.time_ns())
    return value


def _execute_flow(
    store: Any,
    wf: Workflow,
    claim: Claim,
    run: RunRecord,
    steps: dict[str, Any],
    operations: dict[str, Any],
    attempts: dict[str, Any] | None = None,
    *,
    slice_clock: SliceClock | None = None,
    watch: Execution | None = None,
) -> Flow[Any]:
    """Run the workflow function against the ledger and record how it ended. A run that
    continues as new is followed by its successor, executed here in turn (a loop, not a
    recursion: a chain may be long), so the caller gets the chain's result. ``watch``: what
    the installed observer follows of this execution (a successor is an execution of its own)."""
    while True:
        executed = _execute_run_flow(store, wf, claim, run, steps, operations, attempts, slice_clock, watch)
        ended = yield from (executed if watch is None else _watched(watch, executed))
        if isinstance(ended, _Again):  # a limit raised as the run stopped: carry it on
            return (yield from resume_flow(store, wf, ended.run, claim.lease_ms, slice_clock))
        if not isinstance(ended, _Continued):
            return ended
        if ended.claim is None:  # not claimed here: take it like any other run
            return (yield from resume_flow(store, wf, ended.run, claim.lease_ms, slice_clock))
        claim, run, steps, operations, attempts = ended.claim, ended.run, {}, {}, {}
        watch = observe.started(run, claim, time.time_ns())


def _execute_run_flow(
    store: Any,
    wf: Workflow,
    claim: Claim,
    run: RunRecord,
    steps: dict[str, Any],
    operations: dict[str, Any],
    attempts: dict[str, Any] | None,
    slice_clock: SliceClock | None = None,
    watch: Execution | None = None,
) -> Flow[Any]:
    """One run of the workflow function against the ledger, and how it ended. Once it ended,
    its run object records nothing more (see ``RunCore.close``)."""
    core = _core(store, wf, claim, Ledger(run, steps, operations, attempts or {}))
    core.slice_clock = slice_clock
    core.watch = watch
    try:
        return (yield from _executed(core, store, wf, claim, run))
    finally:
        core.close()


def _executed(core: RunCore, store: Any, wf: Workflow, claim: Claim, run: RunRecord) -> Flow[Any]:
    args, kwargs = run.inputs["args"], run.inputs["kwargs"]
    handle = AsyncRun(core) if wf.is_async else Run(core)
    try:
        with Heartbeat(store, claim), running(handle):
            result = yield Call(wf.fn, (handle, *args), kwargs)
            yield from core.flush()  # the pure steps still pending, before the run ends
    except (LostOwnership, SimulatedCrash) as exc:
        # this worker must stop; the ledger already says everything it may say
        raise _how_it_stopped(core, exc)  # noqa: B904 (exc itself, or what it ended)
    except Cancelled as exc:
        return (yield from _end_cancelled(core, exc))
    except ContinueAsNew as signal:
        return (yield from _continue_flow(core, wf, signal))
    except _STOPPING:
        yield from _release(claim)  # the process or task is stopping, not the run
        raise
    except BaseException as exc:
        if (signalled := _signalled(core, wf)) is not None:  # swallowed, then failed
            return (yield from signalled)
        if core.release_on_halt:
            yield from _release(claim)  # an interrupted effect: the next worker reconciles it
            if core.halted is exc:
                raise
            raise core.halted from exc  # type: ignore[misc]
        if core.halted is not None:
            if core.halted is exc:
                if isinstance(exc, _UNREADABLE):  # a record of the run met unreadable
                    yield from _store_refused(core, exc)
                raise
            raise core.halted from exc  # agent code swallowed the block and failed otherwise
        if isinstance(exc, StoreError):
            yield from _store_refused(core, exc)
            raise
        yield from _end_failed(core, exc)
    if (signalled := _signalled(core, wf)) is not None:  # swallowed, and the workflow returned
        return (yield from signalled)
    if core.halted is not None:
        if core.release_on_halt:
            yield from _release(claim)
        raise core.halted  # agent code swallowed it; the run must not complete
    yield from _block_if_uncertain(core, "the workflow returned", None)
    try:
        require_json(result, "workflow result")
        refuse_secrets(result, "the workflow result")
    except UsageError as exc:
        yield from io(
            Store.finish_run,
            claim,
            RunStatus.FAILED,
            error={"type": type(exc).__name__, "message": redact_text(exc.message)},
        )
        raise
    crashpoint("run.before_complete")
    yield from io(Store.finish_run, claim, RunStatus.COMPLETED, result=result)
    return result


def _end_failed(core: RunCore, exc: BaseException) -> Flow[NoReturn]:
    """The workflow raised: the run ends failed with the error (or blocks, while an effect of it
    is uncertain), and the error goes on — as ``RunFailed`` unless safepoint raised it."""
    yield from _block_if_uncertain(
        core, f"the workflow raised {type(exc).__name__}: {redact_text(str(exc))}", exc
    )
    with contextlib.suppress(SafepointError, Cancelled, LostOwnership):
        yield from core.flush()  # best effort: what was computed, for the person reading
    error = {"type": type(exc).__name__, "message": redacted_message(str(exc), 4000)}
    if isinstance(exc, (StepFailed, EffectRejected, WaitTimedOut)):  # what a retry takes up
        error["step_id"] = exc.step_id
        if isinstance(exc, EffectRejected):
            error["operation_id"] = exc.operation_id
    yield from io(Store.finish_run, core.claim, RunStatus.FAILED, error=error)
    if isinstance(exc, SafepointError):
        raise exc
    raise RunFailed(core.run.run_id, error["type"], error["message"]) from exc


def _end_cancelled(core: RunCore, signal: Cancelled) -> Flow[NoReturn]:
    """The run was asked to stop and nothing new was started: it ends cancelled — unless an
    effect of it is still uncertain, which a person must settle first (it blocks)."""
    yield from _block_if_uncertain(core, "the run was cancelled", signal)
    asked = [e for e in (yield from io(Store.events, core.run.run_id)) if e.kind == "run.cancel_requested"]
    detail = asked[-1].detail if asked else {}
    error = cancelled_error(str(detail.get("by", "?")), detail.get("reason"))
    yield from io(Store.finish_run, core.claim, RunStatus.CANCELLED, error=error)
    raise RunCancelled(core.run.run_id, str(error.get("message"))) from signal


def _signalled(core: RunCore, wf: Workflow) -> Flow[Any] | None:
    """How the run ends when agent code swallowed a stop, a reached limit or a continue
    signal: as the signal said, all the same. None when there was none."""
    if isinstance(core.halted, Cancelled):
        return _end_cancelled(core, core.halted)
    if isinstance(core.halted, LimitReached):
        return _end_for_limit(core, core.halted)
    if isinstance(core.halted, ContinueAsNew):
        return _continue_flow(core, wf, core.halted)
    if isinstance(core.halted, SliceEnded):  # the call's slice was spent: released, unfinished
        return end_slice(core.flush(), core.claim, core.halted)
    return None


def _continue_flow(core: RunCore, wf: Workflow, signal: ContinueAsNew) -> Flow[_Continued | _Again]:
    """The run ends continued and its successor starts with the carried state, in one store
    transaction — unless an effect of the run is still uncertain (it blocks: a successor must
    not start while the chain's effect ledger has a hole) or a cancel was asked for (the store
    refuses, and the run ends cancelled: continuing cannot escape the request), or the deadline
    passed (refused too: the run stops)."""
    yield from _block_if_uncertain(core, "the workflow continued as new", signal)
    # The chain is one task: its successor keeps the deadline and what is left of the budgets.
    successor = _new_run_record(
        wf,
        signal.inputs,
        successor_run_id(core.run),
        core.claim.owner,
        core.claim.lease_ms,
        **carried_limits(core.run),
    )
    crashpoint("run.before_continue")
    try:
        # the run's record stays whole (its pure steps written), though nothing replays it
        yield from core.flush()
        run, claim = yield from io(Store.continue_as_new, core.claim, successor)
    except Cancelled as exc:
        return (yield from _end_cancelled(core, exc))
    except DeadlineExceeded as exc:  # a successor cannot outlive the chain's deadline
        return (yield from _end_for_limit(core, exc))
    except RunConflict as exc:
        yield from core.block(RunBlocked(exc.message, run_id=core.run.run_id), phase="continue_as_new")
        raise
    crashpoint("run.after_continue")
    return _Continued(run, claim)


def _how_it_stopped(core: RunCore, exc: BaseException) -> BaseException:
    """What a worker that must stop raises: ``exc`` — unless a fan-out branch's write was
    refused because its sibling had blocked the run, or made it wait (for an approval, a
    message, a timer), under this very fence: that is how the run stopped."""
    if (
        isinstance(exc, LostOwnership)
        and isinstance(core.halted, (RunBlocked, RunWaiting))
        and not core.release_on_halt
    ):
        return core.halted
    return exc


# Signals that stop this process or task, not the run: it is released for the next worker.
_STOPPING = (KeyboardInterrupt, SystemExit, asyncio.CancelledError)


def _release(claim: Claim) -> Flow[None]:
    """Best effort: a release that cannot be written only means waiting out the lease."""
    with contextlib.suppress(StoreError, LostOwnership):
        yield from io(Store.release_run, claim)


# A record of the run that cannot be read: it will not read better on the next resume, so the
# run blocks for a person (``unreadable_record``) rather than be taken over again and again.
_UNREADABLE = (CorruptRecord, ArtifactMissing, ArtifactCorrupt)


def _store_refused(core: RunCore, exc: StoreError) -> Flow[None]:
    """An unreachable database is transient: the run stays as it is, resumable — and so is a
    value this process has not the key for (or not the right one): a worker with the keyring
    carries it on. A store that answers but refuses the write (bad data, a constraint) would
    refuse it again on every resume, so the run blocks for a person instead of retrying
    forever."""
    if isinstance(exc, (StoreUnavailable, KeyUnavailable, DecryptionFailed)):
        return
    if isinstance(exc, _UNREADABLE):
        # met mid-run: a record of the run cannot be read — the same block as at its load
        with contextlib.suppress(StoreError, LostOwnership):
            yield from _block_unreadable(core.claim, core.run, exc)
        return
    record = build_record(
        core.run,
        phase="store_refused",
        reason=exc.message,
        evidence={"type": type(exc).__name__, "cause": redacted_message(repr(exc.__cause__), 2000)},
    )
    with contextlib.suppress(StoreError, LostOwnership):
        yield from io(Store.finish_run, core.claim, RunStatus.BLOCKED, recovery_record=record)


def _end_for_limit(core: RunCore, error: LimitReached, how: str | None = None) -> Flow[_Again]:
    """A limit was reached — while the run executed (a budget spent, the deadline passed, a
    step's attempts used up) or found spent when it was taken over (the resume budget, the
    deadline): nothing new was started after it. The run stops, resumably (status
    ``stopped``, recovery record phase ``limit_reached``), and ``error`` goes on with that
    record — or it blocks, while an effect is uncertain. A person who raised the limit in the
    moment it stopped wins: nothing is stopped, the run is released and carried on
    (``_Again``)."""
    yield from _block_if_uncertain(core, how or f"the run reached a limit ({type(error).__name__})", error)
    with contextlib.suppress(SafepointError, Cancelled, LostOwnership):
        yield from core.flush()  # best effort: what was computed, kept for the run's next turn
    stop = stop_of(error, (yield from io(Store.now)))
    evidence = {}
    if isinstance(error, StepAttemptsExhausted):
        evidence["last_error"] = {"type": error.error_type, "message": error.error_message}
    record = build_record(core.run, phase="limit_reached", reason=error.message, stop=stop, evidence=evidence)
    stopped = yield from io(
        Store.stop_run,
        core.claim,
        limits_of(core.run),
        error={"type": type(error).__name__, "message": error.message},
        recovery_record=record,
    )
    if not stopped:  # its limits moved since this worker read them: look again, from the ledger
        yield from _release(core.claim)
        return _Again((yield from io(Store.get_run, core.run.run_id)))
    with contextlib.suppress(StoreError):
        record = (yield from io(Store.get_run, core.run.run_id)).recovery_record or record
    error.record = record
    raise error


def _block_if_uncertain(core: RunCore, how: str, cause: BaseException | None) -> Flow[None]:
    """A run ends only with every effect settled: one left uncertain (agent code caught the
    error of an interrupted dispatch and carried on) blocks the run instead."""
    uncertain = core.uncertain_operations()
    if not uncertain:
        return
    op = uncertain[0]
    error = NeedsReconciliation(
        core.run.run_id, op.step_id, op.operation_id, f"{how} while this effect was still {op.state.value}"
    )
    # applied: the owner's receipt is there, only acceptance is missing — never "not applied"
    phase = "verify_effect" if op.state is EffectState.APPLIED else "reconcile_effect"
    yield from core.record_block(error, phase=phase, op=op)
    raise error from cause


def chain_head(run: RunRecord) -> Flow[RunRecord]:
    """The run that carries ``run``'s chain on: ``run`` itself unless it continued as new (its
    successor may have continued again meanwhile)."""
    while run.status is RunStatus.CONTINUED and run.successor_run_id is not None:
        run = yield from io(Store.get_run, run.successor_run_id)
    return run
