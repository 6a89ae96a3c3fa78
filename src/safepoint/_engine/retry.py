"""A person's retry of a failed run: ``retry`` and ``retry_async``, one flow for both.

The flow checks what the person typed, reads the run (the one that carries its chain on) and
its ledger, has ``_rules.retry`` decide which failed step runs again and which rejected
operations are sent again, and asks the store to carry that out, compare-and-set on the
revision it read (``Store.retry_run``). The run is then pending: a worker takes it, or
``resume`` carries it on — everything before the failed step replays, the step runs again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._rules.ids import check_id, check_run_id, check_who, check_words
from .._rules.retry import kept_rejected, plan_retry
from .._rules.secrets import refuse_secrets
from ..errors import UsageError
from ..storage.base import Store
from ..types import LedgerIdentity, OperationRecord, RunRecord, RunRetry, StepRecord
from .flow import Flow, adrive, drive, io, require_store
from .lifecycle import chain_head

if TYPE_CHECKING:
    from ..storage.base import AsyncStore


@dataclass(frozen=True, slots=True)
class Retried:
    """A retry as it was carried out, for the operator tools to show: the run as it now
    stands, the retry recorded, the failed records it moved into the history (as they were),
    the rejected operations it left rejected (the run replays their rejection), and the error
    the run had failed with."""

    run: RunRecord
    retry: RunRetry
    moved: tuple[StepRecord, ...] = ()
    kept_rejected: tuple[OperationRecord, ...] = ()
    failed_with: dict[str, Any] | None = None


def retry(
    store: Store,
    run_id: str,
    *,
    by: str,
    reason: str | None = None,
    resend: Iterable[str] | str = (),
    step: str | None = None,
    expected_revision: int | None = None,
) -> RunRecord:
    """Carry a failed run on from its failed step; return the run as it now stands (pending).

    The failed step's record — the latest failed step whose failure is the run's error, or
    the failed step ``step`` names — moves into the run's history (a ``step.retried`` event,
    with what it had recorded and its failed attempts), and the run becomes pending: a worker
    takes it (or ``resume`` it). Everything recorded before replays; the step runs again, its
    attempts counted from one. A run that failed because its workflow itself raised (a bug,
    since fixed and deployed) is retried the same way, with no step moved; the compatibility
    policy applies to the code that carries it on, as on any resume.

    The effect ledger is kept: an operation that was applied is never sent again (its receipt
    replays), nor is one whose outcome is uncertain (it is reconciled with its owner). An
    operation its owner *rejected* is sent again only when ``resend`` names it — by operation
    id or by its step's id — as its next attempt, under a key derived from the key minted for it
    and the attempt (``OperationRecord.key_attempt``). Anything else named in ``resend`` is a
    ``RetryRefused`` saying what can be named, and so is a run that is not failed (a blocked
    run is resolved first; a stopped one has its limit raised, unless it stopped because a
    step used its attempts) or that moved since ``expected_revision`` (the revision you looked
    at; by default the one read now). ``by`` and ``reason`` are recorded in the ``run.retried``
    event. A run that continued as new is retried where its chain failed.

    >>> retry(store, "case-8472-follow-up", by="ana", reason="the case service is back")  # doctest: +SKIP
    """
    require_store(store, "retry")
    done: Retried = drive(
        store, retry_flow(store.identity, run_id, by, reason, names(resend), step, expected_revision)
    )
    return done.run


async def retry_async(
    store: Store | AsyncStore,
    run_id: str,
    *,
    by: str,
    reason: str | None = None,
    resend: Iterable[str] | str = (),
    step: str | None = None,
    expected_revision: int | None = None,
) -> RunRecord:
    """``retry`` from async code."""
    require_store(store, "retry_async")
    done: Retried = await adrive(
        store, retry_flow(store.identity, run_id, by, reason, names(resend), step, expected_revision)
    )
    return done.run


def names(resend: Iterable[str] | str) -> tuple[str, ...]:
    """The operations ``resend`` names: one name, or several."""
    if isinstance(resend, str):
        resend = (resend,)
    try:
        given = tuple(resend)
    except TypeError:
        raise UsageError(
            f"resend names operations by operation id or step id: a string or a list of them, not {resend!r}"
        ) from None
    return tuple(check_id(name, "operation id or step id") for name in given)


def retry_flow(
    identity: LedgerIdentity,
    run_id: str,
    by: str,
    reason: str | None,
    resend: tuple[str, ...],
    step: str | None,
    expected_revision: int | None,
) -> Flow[Retried]:
    """``retry`` as a flow, returning what the operator tools show (see ``Retried``); the
    store's ``identity`` derives the keys of operations sent again."""
    check_run_id(run_id)
    check_who(by, "retries the run")
    if reason is not None and not isinstance(reason, str):
        raise UsageError("reason is a sentence saying why the run is retried: a string")
    check_words(reason, "the retry's reason")
    refuse_secrets([by, reason], "the retry")
    if step is not None:
        check_id(step, "step id")  # as recorded: a fan-out's or occurrence's id included
    if expected_revision is not None and (
        isinstance(expected_revision, bool) or not isinstance(expected_revision, int)
    ):
        raise UsageError(
            f"expected_revision is the state revision you looked at (an int), not {expected_revision!r}"
        )
    run = yield from chain_head((yield from io(Store.get_run, run_id)))
    ledger = yield from io(Store.load_ledger, run.run_id)
    revision = ledger.run.state_revision if expected_revision is None else expected_revision
    planned = plan_retry(
        ledger, identity, by=by, reason=reason, step=step, resend=resend, expected_revision=revision
    )
    now = yield from io(Store.retry_run, run.run_id, revision, planned)
    moved = tuple(ledger.steps[sid] for sid in planned.moved if sid in ledger.steps)
    return Retried(now, planned, moved, tuple(kept_rejected(ledger, planned)), ledger.run.error)
