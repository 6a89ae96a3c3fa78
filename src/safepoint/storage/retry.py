"""A failed run retried (``Store.retry_run``), written once as a plan for every store.

In one transaction, under the run's row lock (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL:
``lock_run``'s ``FOR UPDATE``): the run is read and checked (``_rules.retry.retry_refusal``);
each step the retry takes up moves into the history — its failed record and its failed attempts
become one ``step.retried`` event, as a re-plan's stale steps become ``step.abandoned`` ones —
so that it runs again, its attempts counted from one; each rejected operation named to be sent
again becomes its next attempt (prepared, under the derived key, its outcome and dispatch count
cleared, what its last attempt ended in kept in the event); and the run becomes pending, its
error and recovery record cleared, compare-and-set on the state revision the retry was planned
on, with a ``run.retried`` event. Anything that no longer fits raises ``RetryRefused`` and rolls
the whole of it back. The plan wakes a worker after it (``LedgerReads.wake_workers``).
"""

from __future__ import annotations

from typing import Any

from .._rules.retry import retried_detail, retry_refusal
from ..errors import RetryRefused, RunNotFound
from ..types import AttemptRecord, RunRecord, RunRetry, StepRecord
from . import _rows
from .ledger import LedgerReads, sealed_event
from .operations import writing
from .plans import Plan


def retry_run_plan(
    reads: LedgerReads, run_id: str, expected_revision: int, retry: RunRetry, now: int
) -> Plan[str]:
    """Carry ``retry`` out (see the module docstring); return the run's workflow name."""
    q = reads.q
    rows = yield q("lock_run", run_id=run_id)
    if not rows:
        raise RunNotFound(run_id)
    run = yield from reads.run_record(rows[0])
    refused = retry_refusal(run, expected_revision)
    if refused is not None:
        raise RetryRefused(run_id, refused)
    events = steps = 0
    for step_id in retry.moved:
        step_rows = yield q("retry_run_step", run_id=run_id, step_id=step_id)
        attempt_rows = yield q("retry_run_attempts", run_id=run_id, step_id=step_id)
        if not step_rows and not attempt_rows:
            raise RetryRefused(run_id, f"step {step_id!r} has no failed record any more")
        found = _rows.ledger(
            run, [(row, _rows.NO_VALUES) for row in step_rows], [], attempt_rows, reads.codec
        )
        detail = _moved_detail(found.steps.get(step_id), found.attempts.get(step_id, []), retry)
        event_id, text = yield from sealed_event(reads, detail, run_id, "step.retried")
        yield q(
            "retry_run_event",
            run_id=run_id,
            now=now,
            kind="step.retried",
            step_id=step_id,
            operation_id=found.steps[step_id].operation_id if step_id in found.steps else None,
            worker=retry.by,
            event_id=event_id,
            detail=text,
        )
        yield q("retry_run_forget_step", run_id=run_id, step_id=step_id)
        yield q("retry_run_forget_attempts", run_id=run_id, step_id=step_id)
        events, steps = events + 1, steps + len(step_rows)
    previous: dict[str, dict[str, Any]] = {}
    for again in retry.resend:
        op_rows = yield q("retry_run_operation", run_id=run_id, operation_id=again.operation_id)
        sent = yield q(
            "retry_run_resend",
            run_id=run_id,
            operation_id=again.operation_id,
            key_attempt=again.key_attempt,
            effect_key=again.effect_key,
            now=now,
        )
        if not op_rows or not sent:
            raise RetryRefused(
                run_id,
                f"operation {again.operation_id!r} is no longer the rejected attempt"
                f" {again.key_attempt - 1} the retry was planned on: look at the run again",
            )
        op = _rows.operation_record(op_rows[0], reads.codec)
        previous[op.operation_id] = {
            "state": op.state.value,
            "key_attempt": op.key_attempt,
            "effect_key": op.effect_key,
            "error": op.error,
            "dispatch_count": op.dispatch_count,
            "first_dispatched_at": op.first_dispatched_at,
        }
    retried = yield q(
        "retry_run",
        run_id=run_id,
        expected_revision=expected_revision,
        now=now,
        events=events + 1,
        steps=steps,
    )
    if not retried:  # the lock says this cannot be; the statement says so itself all the same
        raise RetryRefused(run_id, f"the run moved since revision {expected_revision}")
    event_id, text = yield from sealed_event(reads, retried_detail(retry, previous), run_id, "run.retried")
    yield q(
        "retry_run_event",
        run_id=run_id,
        now=now,
        kind="run.retried",
        step_id=retry.step_id,
        operation_id=None,
        worker=retry.by,
        event_id=event_id,
        detail=text,
    )
    return str(retried[0]["workflow"])


def _moved_detail(step: StepRecord | None, attempts: list[AttemptRecord], retry: RunRetry) -> dict[str, Any]:
    """What a step taken up by a retry had recorded, kept in its ``step.retried`` event."""
    detail: dict[str, Any] = {"by": retry.by, "reason": retry.reason}
    if step is not None:
        detail.update(
            kind=step.kind.value,
            name=step.name,
            seq=step.seq,
            input_hash=step.input_hash,
            status=step.status.value,
            error=step.error,
            attempt=step.attempt,
            operation_id=step.operation_id,
            recorded_at=step.recorded_at,
            recorded_fence=step.fence,
        )
    detail["attempts"] = [
        {
            "attempt": tried.attempt,
            "kind": tried.kind.value,
            "name": tried.name,
            "input_hash": tried.input_hash,
            "error": tried.error,
            "retry_at": tried.retry_at,
            "recorded_at": tried.recorded_at,
            "recorded_fence": tried.fence,
        }
        for tried in attempts
    ]
    return detail


def retry_run(reads: LedgerReads, run_id: str, expected_revision: int, retry: RunRetry) -> Plan[RunRecord]:
    """``Store.retry_run``: the retry (``retry_run_plan``), stamped with the store's clock,
    then a wake-up for the workers, as for a run submitted to them."""
    now = yield from reads.now()
    workflow = yield from retry_run_plan(reads, run_id, expected_revision, retry, now)
    yield from reads.wake_workers(workflow)  # pending now
    return (yield from reads.get_run(run_id))


class RetryOperations:
    """A failed run retried by a person (``operations``)."""

    retry_run = writing(retry_run)
