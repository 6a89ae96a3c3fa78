"""Retrying a failed run: which runs may be retried, which failed step's record moves into the
history so that it runs again, and which rejected operations may be sent again.

A retry never undoes what a run did. Everything recorded before the failed step replays; the
failed step's record (and its failed attempts) moves into the history, so the step runs again;
the run becomes pending. The effect ledger is kept as it is: an operation that was applied, or
whose outcome is uncertain, is never sent again by a retry (the first replays its receipt, the
second is reconciled as after any crash). Only an operation its owner *rejected* — a definite
"no", nothing applied — may be sent again, and only when the person retrying names it: as its
next attempt, under a key derived from the key minted for it and the attempt
(``effects.attempt_key``), never under a fresh key.

These functions decide on the ledger as read; the store carries the decision out in one
transaction, compare-and-set on the state revision it was made on (``Store.retry_run``), so a
run that moved meanwhile refuses it (``retry_refusal`` says why). ``safepoint.retry`` is the
public entry point.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import RetryRefused
from ..types import (
    EffectState,
    Ledger,
    LedgerIdentity,
    OperationRecord,
    Resend,
    RunRecord,
    RunRetry,
    RunStatus,
    StepStatus,
)
from .effects import next_attempt_key
from .transactions import is_uncertain

# The one limit whose stop is at a failed step: its attempts ran out (see ``retry_refusal``).
_AT_A_STEP = "step_attempts"


def retry_refusal(run: RunRecord, expected_revision: int) -> str | None:
    """Why ``run`` cannot be retried from ``expected_revision`` as it now stands, or None.

    A ``failed`` run can be. So can a ``stopped`` one whose stop was at a failed step — a read
    or model step that used all its attempts (limit ``step_attempts``): its attempts start
    again. Any other stop is a limit a retry would meet again at once: raise it instead
    (``extend_limits``)."""
    if run.status is RunStatus.STOPPED:
        limit, _ = stopped_at(run)
        if limit != _AT_A_STEP:
            return (
                f"it stopped at its {limit or 'a'} limit, which a retry would meet again at once:"
                f" raise the limit instead (safepoint.extend_limits, or `safepoint limits"
                f" {run.run_id} …`), and the run carries on"
            )
    elif run.status is not RunStatus.FAILED:
        return _not_failed(run)
    if run.cancel_requested_at is not None:
        return (
            "a cancel was asked for it before it ended: carried on, it would only stop and"
            " end cancelled, so it is not retried"
        )
    if run.state_revision != expected_revision:
        return (
            f"the run moved since revision {expected_revision} (it is now at"
            f" {run.state_revision}): look at it again (`safepoint show {run.run_id}`) and retry"
            " what it says now"
        )
    return None


def _not_failed(run: RunRecord) -> str:
    status = run.status
    if status is RunStatus.COMPLETED:
        return "it completed: its result stands, and there is nothing to retry"
    if status in (RunStatus.PENDING, RunStatus.RUNNING):
        return f"it is {status.value}: it is being carried on — only a failed run is retried"
    if status is RunStatus.BLOCKED:
        phase = (run.recovery_record or {}).get("phase", "?")
        return (
            f"it is blocked (phase {phase}): a person must settle it first — an effect whose"
            f" outcome is uncertain is reconciled or resolved, never sent again by a retry (see"
            f" `safepoint record {run.run_id}`, then `safepoint resolve`)"
        )
    if status is RunStatus.WAITING:
        return "it is waiting (for an approval, a message or a timer): it is not failed"
    if status is RunStatus.CANCELLED:
        return "it was cancelled: a cancelled run is never carried on again"
    return f"it is {status.value}, not failed"


def stopped_at(run: RunRecord) -> tuple[str | None, str | None]:
    """(the limit a stopped run reached, the step it stopped at), from its recovery record."""
    record: dict[str, Any] = run.recovery_record or {}
    found = record.get("evidence")
    evidence: dict[str, Any] = found if isinstance(found, dict) else {}
    limit = record.get("limit", evidence.get("limit"))
    step_id = record.get("step_id", evidence.get("step_id"))
    return (
        limit if isinstance(limit, str) else None,
        step_id if isinstance(step_id, str) else None,
    )


def retriable_steps(ledger: Ledger) -> list[str]:
    """The steps a retry can take up, in the order they were recorded: each step with a failed
    record, and each with failed attempts and no record (its attempts ran out: stopped) — never
    a transaction step recorded as uncertain, which may have committed: a person resolves it."""
    failed = {
        sid: step.seq
        for sid, step in ledger.steps.items()
        if step.status is StepStatus.FAILED and not is_uncertain(step)
    }
    unrecorded = [sid for sid, tried in ledger.attempts.items() if tried and sid not in ledger.steps]
    last = max((step.seq for step in ledger.steps.values()), default=0)
    for offset, sid in enumerate(sorted(unrecorded)):
        failed[sid] = last + 1 + offset
    return sorted(failed, key=failed.__getitem__)


def failed_step(ledger: Ledger) -> str | None:
    """The failed step a retry takes up when none is named: the latest failed step whose
    failure is the run's error (or, for a stopped run, the step it stopped at) — None when the
    workflow itself raised (no failed step's error is the run's)."""
    run, retriable = ledger.run, retriable_steps(ledger)
    if run.status is RunStatus.STOPPED:
        _, at = stopped_at(run)
        return at if at in retriable else None
    error = run.error or {}
    if error.get("type") not in ("StepFailed", "WaitTimedOut"):  # a wait's timeout: waits again
        return None
    if error.get("step_id") in retriable:
        return str(error["step_id"])
    # recorded before runs said where they failed: the step the message names
    message = str(error.get("message", ""))
    for sid in reversed(retriable):
        if message.startswith(f"step {sid!r} of run "):
            return sid
    return None


def plan_retry(
    ledger: Ledger,
    identity: LedgerIdentity,
    *,
    by: str,
    reason: str | None,
    step: str | None,
    resend: Iterable[str],
    expected_revision: int,
) -> RunRetry:
    """The retry of the run ``ledger`` holds: the failed step taken up (``step``, or the one
    ``failed_step`` finds), the steps whose failed records move into the history, and the
    rejected operations ``resend`` names (by operation id or by their step's id) sent again as
    their next attempt. ``RetryRefused`` for a run that cannot be retried, a step that did not
    fail, or a name that is not a rejected operation of the run — saying what can be named."""
    run = ledger.run
    refused = retry_refusal(run, expected_revision)
    if refused is not None:
        raise RetryRefused(run.run_id, refused)
    retriable = retriable_steps(ledger)
    if step is not None and step in ledger.steps and is_uncertain(ledger.steps[step]):
        raise RetryRefused(
            run.run_id,
            f"transaction step {step!r} may have committed (its function ended its transaction):"
            " a retry never runs it again — a person resolves it applied or not applied"
            f" (`safepoint record {run.run_id}`, then `safepoint resolve`)",
        )
    if step is not None and step not in retriable:
        raise RetryRefused(run.run_id, f"step {step!r} did not fail; {_which_steps(retriable)}")
    chosen = step if step is not None else failed_step(ledger)
    resent = [_resend(op, run, identity) for op in _named_operations(ledger, resend)]
    moved = [chosen] if chosen is not None else []
    for again in resent:  # an effect step with a failed record of its own runs again too
        if again.step_id in retriable and again.step_id not in moved:
            moved.append(again.step_id)
    return RunRetry(by=by, reason=reason, step_id=chosen, moved=tuple(moved), resend=tuple(resent))


def _which_steps(retriable: list[str]) -> str:
    if not retriable:
        return "no step of the run failed (the workflow itself raised): leave step= out"
    return "the failed steps of the run: " + ", ".join(repr(sid) for sid in retriable)


def _named_operations(ledger: Ledger, names: Iterable[str]) -> list[OperationRecord]:
    """The rejected operations ``names`` name, each once, in the order named."""
    run, operations = ledger.run, ledger.operations
    by_step = {op.step_id: op for op in operations.values()}
    named: dict[str, OperationRecord] = {}
    for name in names:
        op = operations.get(name) or by_step.get(name)
        if op is None:
            reason = f"{name!r} names no operation of the run, nor an effect step of it"
        elif op.state is not EffectState.REJECTED:
            reason = f"operation {op.operation_id!r} (step {op.step_id!r}) {_never_again(op)}"
        else:
            named.setdefault(op.operation_id, op)
            continue
        raise RetryRefused(run.run_id, f"{reason}; {_sendable(operations.values())}")
    return list(named.values())


def _never_again(op: OperationRecord) -> str:
    """Why a retry does not send ``op`` again."""
    if op.state in (EffectState.ACCEPTED, EffectState.APPLIED):
        return f"was {op.state.value}: what happened is never sent again (its receipt is replayed)"
    if op.state in (EffectState.DISPATCHING, EffectState.UNKNOWN):
        return (
            f"is {op.state.value}: its outcome is uncertain, so it is reconciled with its owner"
            " under its own key — never sent again under another"
        )
    return f"is {op.state.value}: it was never rejected (the run sends it when it reaches it)"


def _sendable(operations: Iterable[OperationRecord]) -> str:
    rejected = [op for op in operations if op.state is EffectState.REJECTED]
    if not rejected:
        return "resend names an operation its owner rejected, and this run holds none"
    return "what resend can name (the operations its owner rejected): " + ", ".join(
        f"{op.operation_id!r} (step {op.step_id!r})" for op in rejected
    )


def _resend(op: OperationRecord, run: RunRecord, identity: LedgerIdentity) -> Resend:
    key = next_attempt_key(op, run, identity)
    if key is None:
        raise RetryRefused(
            run.run_id,
            f"operation {op.operation_id!r} holds {op.effect_key!r}, which is not the key minted"
            " for it (altered after it was recorded): no key is derived from it, and nothing is"
            " sent under it — put the minted key back (from a backup) first",
        )
    return Resend(
        operation_id=op.operation_id, step_id=op.step_id, key_attempt=op.key_attempt + 1, effect_key=key
    )


def kept_rejected(ledger: Ledger, retry: RunRetry) -> list[OperationRecord]:
    """The rejected operations a retry does not send again: the run replays their rejection
    when it reaches them (name one in ``resend`` to send it again)."""
    resent = {again.operation_id for again in retry.resend}
    return [
        op
        for op in ledger.operations.values()
        if op.state is EffectState.REJECTED and op.operation_id not in resent
    ]


def retried_detail(retry: RunRetry, previous: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ``run.retried`` event's detail: who, why, the step taken up, and each operation sent
    again with its new attempt and key and, from ``previous`` (by operation id), what its last
    attempt had ended in."""
    return {
        "by": retry.by,
        "reason": retry.reason,
        "step_id": retry.step_id,
        "moved": list(retry.moved),
        "resent": [
            {
                "operation_id": again.operation_id,
                "step_id": again.step_id,
                "key_attempt": again.key_attempt,
                "effect_key": again.effect_key,
                "previous": previous.get(again.operation_id),
            }
            for again in retry.resend
        ],
    }
