"""A person's verb on a run's limits: ``extend_limits`` raises (or sets) a run's budgets, its
deadline, its step attempts or its resume budget, sync and async, as one flow.

The decisions — what may be asked, what the new limits are, what is refused — are in
``_rules.limits`` (``asked_limits``, ``planned_change``); the store applies the change as a
compare-and-set on the run's state revision (``Store.extend_limits``). A stopped run becomes
pending, and any worker (or a resume) carries it on; a running run's worker reads the new
limits before it stops at one (``RunCore.reread_limits``), so a raise made while it runs takes
effect, and one made in the very moment it stops wins (``Store.stop_run`` refuses the stop).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._rules.ids import check_run_id, check_who, check_words
from .._rules.limits import AskedLimits, asked_limits, planned_change
from .._rules.secrets import refuse_secrets
from ..errors import LimitsRefused, UsageError
from ..storage.base import Store
from ..types import RunRecord
from .flow import Flow, Sleep, adrive, drive, io, require_store
from .lifecycle import chain_head

if TYPE_CHECKING:
    from ..storage.base import AsyncStore

# How often a change asked without a revision is computed again when a worker moved the run
# between its read and its write (each step moves a running run's revision), and the pause
# before each new try: doubling from 2 ms, at most 50 ms — a running run's worker writes in
# bursts, and the change lands in a gap between them.
_TRIES = 25
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.002, 0.05


def extend_limits(
    store: Store,
    run_id: str,
    /,
    *,
    tokens: int | None = None,
    cost: float | None = None,
    model_calls: int | None = None,
    deadline: timedelta | datetime | None = None,
    step_attempts: int | None = None,
    resume_budget: int | None = None,
    by: str,
    reason: str | None = None,
    expected_revision: int | None = None,
) -> RunRecord:
    """Raise (or set) a run's limits and return the run as it now stands.

    ``tokens``, ``cost`` and ``model_calls`` are its budgets (the model calls it may make:
    turns), ``deadline`` a ``timedelta`` from now (on the store's clock) or an aware
    ``datetime``, ``step_attempts`` the attempts every retried read and model step gets (at
    least), ``resume_budget`` the takeovers it may have; a limit left ``None`` stays as it is.
    What the run spent is never reset, and a limit cannot be lowered below it
    (``LimitsRefused``). The change is recorded in the run's history (a ``run.limits_extended``
    event: ``by``, ``reason``, the old and new limits).

    A run stopped at a limit becomes pending: a worker picks it up, or ``resume`` carries it on
    — from where it stopped, replaying everything before (no model call is made twice, no
    effect sent twice). A stopped run whose limit would still stop it is refused. A running or
    waiting run just gets the new limits: its worker reads them before it stops at one.

    ``expected_revision``: the state revision you looked at (``safepoint show``); if the run
    moved since, the change is refused. Without it, the change is computed on the run as it is
    read, and again if a worker moved it meanwhile. A run that continued as new passes the
    change on to the run that carries its chain on — whose budgets are what the chain had left
    when it started (continuing is never a way around a limit) — so there a budget set is what
    the chain may spend *from that run on*, and ``safepoint show`` of that run says how much of
    it is spent.

    >>> extend_limits(store, "triage-8472", tokens=400_000, by="ana", reason="long case")  # doctest: +SKIP
    """
    require_store(store, "extend_limits")
    asked = _asked(
        tokens, cost, model_calls, deadline, step_attempts, resume_budget, by, reason, expected_revision
    )
    run: RunRecord = drive(store, _extend_flow(check_run_id(run_id), asked, by, reason, expected_revision))
    return run


async def extend_limits_async(
    store: Store | AsyncStore,
    run_id: str,
    /,
    *,
    tokens: int | None = None,
    cost: float | None = None,
    model_calls: int | None = None,
    deadline: timedelta | datetime | None = None,
    step_attempts: int | None = None,
    resume_budget: int | None = None,
    by: str,
    reason: str | None = None,
    expected_revision: int | None = None,
) -> RunRecord:
    """``extend_limits`` from async code."""
    require_store(store, "extend_limits_async")
    asked = _asked(
        tokens, cost, model_calls, deadline, step_attempts, resume_budget, by, reason, expected_revision
    )
    run: RunRecord = await adrive(
        store, _extend_flow(check_run_id(run_id), asked, by, reason, expected_revision)
    )
    return run


def _asked(
    tokens: int | None,
    cost: float | None,
    model_calls: int | None,
    deadline: timedelta | datetime | None,
    step_attempts: int | None,
    resume_budget: int | None,
    by: str,
    reason: str | None,
    expected_revision: int | None,
) -> AskedLimits:
    """What was asked, checked before anything is read."""
    check_who(by, "changes the limits")
    check_words(reason, "the reason for the change of limits")
    refuse_secrets([by, reason], "the change of limits")
    if expected_revision is not None and (
        isinstance(expected_revision, bool) or not isinstance(expected_revision, int)
    ):
        raise UsageError(
            f"expected_revision={expected_revision!r}: the state revision you looked at, a whole number"
        )
    return asked_limits(
        tokens=tokens,
        cost=cost,
        model_calls=model_calls,
        deadline=deadline,
        step_attempts=step_attempts,
        resume_budget=resume_budget,
    )


def _extend_flow(
    run_id: str, asked: AskedLimits, by: str, reason: str | None, expected_revision: int | None
) -> Flow[RunRecord]:
    """Read the run, decide the change, write it compare-and-set on the revision read (or the
    one the person looked at); when a worker moved the run in between, decide again on the run
    as it then stands — unless the person named the revision: then the change is refused."""
    for tried in range(1 if expected_revision is not None else _TRIES):
        if tried:
            yield Sleep(min(_MAX_PAUSE_S, _FIRST_PAUSE_S * 2 ** (tried - 1)))
        run = yield from io(Store.get_run, run_id)
        if expected_revision is None:  # the chain's head; a named revision is of the run named
            run = yield from chain_head(run)
        now = yield from io(Store.now)
        change = planned_change(
            run, asked, now=now, by=by, reason=reason, expected_revision=expected_revision
        )
        extended = yield from io(Store.extend_limits, run.run_id, run.state_revision, change)
        if extended is not None:
            return extended
    moved = yield from io(Store.get_run, run_id)
    raise LimitsRefused(
        run_id,
        f"the run moved on (it is at revision {moved.state_revision}) while the change was being"
        " written; look at it again and repeat the change",
        state_revision=moved.state_revision,
        expected_revision=expected_revision,
    )
