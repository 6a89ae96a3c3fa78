"""The run verbs: ``start``, ``submit``, ``resume`` and ``cancel``, sync and async.

Each checks what it was given, then carries out the matching flow of ``lifecycle`` — with
``drive`` against a ``Store``, or ``adrive`` in the caller's event loop — and raises how the run
ended (waiting, blocked, failed, cancelled, at a limit) to the caller without the frames of the
flows behind it. The worker and the test harness's child process use ``run_claimed``,
``claimed_run`` and ``block_unreadable`` for a run they claimed themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import TYPE_CHECKING, Any

from .._rules.ids import check_run_id, check_who, check_words
from .._rules.secrets import refuse_secrets
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    LimitReached,
    LostOwnership,
    RunBlocked,
    RunCancelled,
    RunFailed,
    RunOwned,
    RunWaiting,
    SafepointError,
    StoreError,
    UsageError,
)
from ..storage.base import Store
from ..types import (
    Budget,
    Claim,
    RunRecord,
    RunStatus,
    UnreadableRun,
)
from .flow import Flow, R, adrive, drive, require_store
from .lifecycle import chain_head
from .ownership import DEFAULT_LEASE_MS, worker_id
from .slices import Slice, SliceClock
from .workflow import Workflow, workflow_of

if TYPE_CHECKING:
    from ..storage.base import AsyncStore

from .lifecycle import (
    Deadline,
    block_claimed,
    cancel_flow,
    claimed_flow,
    get_run_flow,
    new_run,
    outcome_of,
    resume_flow,
    start_flow,
    submit_flow,
)


def start(
    store: Store,
    wf: Workflow,
    /,
    *args: Any,
    run_id: str | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
    attach_timeout: float = 300.0,
    budget: Budget | None = None,
    deadline: Deadline = None,
    slice: Slice | None = None,
    **kwargs: Any,
) -> Any:
    """Start a run of ``wf`` and execute it here; return its result.

    Starting a run id that exists never creates a second run: with the same workflow and inputs
    it attaches (returns the recorded result, resumes a run whose worker died, or waits up to
    ``attach_timeout`` seconds for a live worker); otherwise it raises ``RunConflict``.
    An ``async def`` workflow runs in an event loop of its own (use ``start_async`` inside one).
    ``budget`` (its fields override the workflow's) and ``deadline`` (a ``timedelta`` from now,
    or an aware ``datetime``) are recorded with a new run; an existing run keeps its own.
    ``slice`` (a ``timedelta`` or seconds, measured from this call) bounds how long this call
    carries the run on: once it is spent the run stops at its next step boundary, is released
    at once, and ``Unfinished`` is returned instead of the result (see ``resume``); a run held
    by a live worker is waited for within the slice only.
    """
    clock = SliceClock.of(slice)  # from when the call began
    require_store(store, "start")
    new = new_run(wf, args, kwargs, run_id, worker_id(), lease_ms, budget, deadline)
    return _carry_out(store, wf, start_flow(store, wf, new, attach_timeout, clock))


async def start_async(
    store: Store | AsyncStore,
    wf: Workflow,
    /,
    *args: Any,
    run_id: str | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
    attach_timeout: float = 300.0,
    budget: Budget | None = None,
    deadline: Deadline = None,
    slice: Slice | None = None,
    **kwargs: Any,
) -> Any:
    """``start`` in the caller's event loop: an ``async def`` workflow runs on this loop, and
    an async store (``open_async_store``) is awaited, never blocking it."""
    clock = SliceClock.of(slice)
    require_store(store, "start_async")
    new = new_run(wf, args, kwargs, run_id, worker_id(), lease_ms, budget, deadline)
    return await _carry_out_async(store, wf, start_flow(store, wf, new, attach_timeout, clock))


def submit(
    store: Store,
    wf: Workflow,
    /,
    *args: Any,
    run_id: str | None = None,
    budget: Budget | None = None,
    deadline: Deadline = None,
    **kwargs: Any,
) -> str:
    """Enqueue a run of ``wf`` for any worker (``safepoint worker``) to execute; return its id.

    Submitting a run id that exists never creates a second run: with the same workflow and
    inputs it returns the id; otherwise it raises ``RunConflict``. ``budget`` and ``deadline``
    as for ``start`` (a relative deadline counts from now, not from when a worker claims it).
    """
    require_store(store, "submit")
    new = new_run(wf, args, kwargs, run_id, None, 0, budget, deadline)
    return str(drive(store, submit_flow(new)))


async def submit_async(
    store: Store | AsyncStore,
    wf: Workflow,
    /,
    *args: Any,
    run_id: str | None = None,
    budget: Budget | None = None,
    deadline: Deadline = None,
    **kwargs: Any,
) -> str:
    """``submit`` from async code."""
    require_store(store, "submit_async")
    new = new_run(wf, args, kwargs, run_id, None, 0, budget, deadline)
    return str(await adrive(store, submit_flow(new)))


def resume(
    store: Store,
    run_id: str,
    /,
    *,
    lease_ms: int = DEFAULT_LEASE_MS,
    slice: Slice | None = None,
) -> Any:
    """Take over ``run_id`` and carry it on from its ledger; return its result.

    A completed run returns its recorded result; a failed run raises ``RunFailed``; a run
    stopped at a limit raises the ``LimitReached`` it stopped with (its recovery record
    attached) and changes nothing, until a person raises the limit (``extend_limits``); a blocked
    run is tried again (the block is re-established if its cause remains); a waiting run looks
    at its gate again and, while it still cannot go on, waits on as it was (raising
    ``AwaitingApproval`` / ``ApprovalInvalid`` while no approval authorizes the effect,
    ``AwaitingMessage`` while no message came, ``Sleeping`` until its timer is due — its
    timeout and due instant unchanged); a run held by a live worker raises ``RunOwned``.

    ``slice`` (a ``timedelta`` or seconds, measured from this call on the monotonic clock)
    bounds how long this call carries the run on — for a serverless function or a job runner
    whose platform cuts it at a ceiling. Once it is spent, the run stops at its next step
    boundary (never inside an effect's dispatch; in a fan-out, at each branch's next step),
    writes its pending pure steps, is released at once (the next call claims it without
    waiting for a lease to expire) and ``Unfinished`` is returned instead of the result. A call
    always moves the run at least one new step on, however short its slice.
    """
    clock = SliceClock.of(slice)
    require_store(store, "resume")
    return resume_record(store, store.get_run(check_run_id(run_id)), lease_ms, clock)


def resume_record(
    store: Store, run: RunRecord, lease_ms: int = DEFAULT_LEASE_MS, slice_clock: SliceClock | None = None
) -> Any:
    """``resume`` from a run record read earlier: the claim compares against *its* revision,
    so two resumers holding the same record race on one compare-and-set."""
    if run.status is RunStatus.CONTINUED:
        run = drive(store, chain_head(run))
    if run.status.terminal or run.status is RunStatus.STOPPED:
        return _outcome(run)  # needs no workflow code: the ending (or the stop) is recorded
    wf = workflow_of(run)
    return _carry_out(store, wf, resume_flow(store, wf, run, lease_ms, slice_clock))


async def resume_async(
    store: Store | AsyncStore,
    run_id: str,
    /,
    *,
    lease_ms: int = DEFAULT_LEASE_MS,
    slice: Slice | None = None,
) -> Any:
    """``resume`` in the caller's event loop (``slice`` as for ``resume``)."""
    clock = SliceClock.of(slice)
    require_store(store, "resume_async")
    run = await adrive(store, get_run_flow(check_run_id(run_id)))
    if run.status is RunStatus.CONTINUED:
        run = await adrive(store, chain_head(run))
    if run.status.terminal or run.status is RunStatus.STOPPED:
        return _outcome(run)
    wf = workflow_of(run)
    return await _carry_out_async(store, wf, resume_flow(store, wf, run, lease_ms, clock))


def cancel(store: Store, run_id: str, /, *, by: str, reason: str | None = None) -> RunRecord:
    """Ask a run to stop, for good, and return it as it now stands.

    A pending, waiting or blocked run ends cancelled at once. A running one is marked: its worker
    starts nothing new (no step, no dispatch, no continue-as-new) and ends it cancelled — an
    effect already in flight is recorded or reconciled first, never forgotten. No resume revives
    a cancelled run. An ended run is left as it is; a run that continued as new passes the
    request on to the run that carries its chain on, which is returned.
    """
    require_store(store, "cancel")
    check_who(by, "cancels the run")
    check_words(reason, "the cancellation's reason")
    refuse_secrets([by, reason], "the cancellation")
    run: RunRecord = drive(store, cancel_flow(check_run_id(run_id), by, reason))
    return run


async def cancel_async(
    store: Store | AsyncStore, run_id: str, /, *, by: str, reason: str | None = None
) -> RunRecord:
    """``cancel`` from async code."""
    require_store(store, "cancel_async")
    check_who(by, "cancels the run")
    check_words(reason, "the cancellation's reason")
    refuse_secrets([by, reason], "the cancellation")
    run: RunRecord = await adrive(store, cancel_flow(check_run_id(run_id), by, reason))
    return run


def run_claimed(
    store: Store, wf: Workflow, claim: Claim, run: RunRecord, slice_clock: SliceClock | None = None
) -> Any:
    """Carry on a run this worker has just claimed (a worker's entry point)."""
    return _carry_out(store, wf, claimed_flow(store, wf, claim, run, slice_clock))


def claimed_run(store: Store, claim: Claim) -> RunRecord:
    """The run a worker has just claimed (``claim_next``), read back; ``CorruptRecord`` when its
    own row cannot be read (for ``block_unreadable``), ``KeyUnavailable`` / ``DecryptionFailed``
    when this store's keyring cannot open it."""
    found = store.find_run(claim.run_id)
    if isinstance(found, UnreadableRun):
        # read whole, for the error itself: a value this process has no key for (or not the
        # right one) is KeyUnavailable / DecryptionFailed, which gives the run back, not a block
        with contextlib.suppress(CorruptRecord, ArtifactMissing, ArtifactCorrupt):
            store.get_run(claim.run_id)
        raise CorruptRecord("safepoint_runs", f"run_id={claim.run_id}", found.reason)
    return found


def block_unreadable(store: Store, claim: Claim, error: StoreError) -> None:
    """Block a claimed run whose record (``error`` says which) cannot be read — phase
    ``unreadable_record`` — unless the flow that found it did already (then the fence refuses
    this write). ``finish_run`` needs nothing of the row but the claim's fence, so even a run
    whose own row cannot be read is blocked, by the first worker that claims it, and never
    claimed again. Best effort: a store that fails here leaves the run to its lease."""
    with contextlib.suppress(SafepointError, LostOwnership):
        drive(store, block_claimed(claim, error))


# How a run may end that is an answer, not a fault of safepoint's: raised to the caller with
# no traceback through the flows and drivers behind it (dozens of frames that say nothing about
# the caller's code). Their causes keep their own tracebacks.
_OUTCOMES = (RunWaiting, RunBlocked, RunOwned, RunCancelled, RunFailed, LimitReached)


def _outcome(run: RunRecord) -> Any:
    try:
        return outcome_of(run)
    except _OUTCOMES as outcome:
        raise outcome.with_traceback(None)  # noqa: B904 (the outcome itself, trimmed)


def _carry_out(store: Store, wf: Workflow, flow: Flow[R]) -> R:
    """Run a flow from sync code: plainly, or in an event loop of its own for async code."""
    try:
        if not wf.is_async:
            return drive(store, flow)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(adrive(store, flow))
    except _OUTCOMES as outcome:
        raise outcome.with_traceback(None)  # noqa: B904 (the outcome itself, trimmed)
    flow.close()
    raise UsageError(
        "an async workflow was started from inside a running event loop; use"
        " `await safepoint.start_async(...)` / `resume_async(...)` there"
    )


async def _carry_out_async(store: Store | AsyncStore, wf: Workflow, flow: Flow[R]) -> R:
    try:
        if wf.is_async:
            return await adrive(store, flow)
        if inspect.iscoroutinefunction(getattr(store, "get_run", None)):
            flow.close()
            raise UsageError(
                "a plain def workflow cannot use an async store; make the"
                " workflow async def, or use a sync store"
            )
        # A plain workflow blocks while it runs: give it a thread, keep the loop free.
        return await asyncio.to_thread(drive, store, flow)
    except _OUTCOMES as outcome:
        raise outcome.with_traceback(None)  # noqa: B904 (the outcome itself, trimmed)
