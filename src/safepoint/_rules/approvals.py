"""Approvals: a person authorizes one prepared effect, bound to exactly what they approved.

An effect run with ``approval=True`` is prepared (its payload durable and digested) and then
stops at the gate between prepared and dispatching until a person approves it. An approval is
bound to the payload's digest and to the digest of the target's state (what the effect's
``target_state`` read when the run asked; None for an effect without one), and may expire. It
authorizes a dispatch only while both digests still match and it has not expired on the
store's clock; otherwise the run waits again (``ApprovalInvalid``).

A gate takes one approval: a second person's approval while one still authorizes the dispatch
— before it, or after the effect went out under it — is refused (``GateApproved``, naming the
approval in force), and nothing is written; the same person approving again gets theirs back.
So k people approving one parked gate at the same instant release it once. Once no approval
authorizes it any more (expired, revoked, or bound to a payload or target that changed), a new
one may be given — a re-dispatch after a reconcile that found nothing needs one.

A person may also take an approval back while the effect's outcome is not recorded
(``revoke_approval``): every approval of the effect still in force is marked revoked, and
authorizes nothing from then on — no first dispatch, and no re-dispatch after a reconcile that
found nothing. A revocation and a dispatch of the same effect are serialised by the store —
whichever commits first wins: either the effect went out under the approval before the
revocation (what may have happened is reconciled, never recalled) or the revocation committed
and the dispatch is refused (the run waits again). Once the outcome is recorded, a revocation
is refused as too late.

The decisions are the small I/O-free functions below, shared by every store: the store makes
them inside the transaction that checks the fence (``await_approval``, ``mark_dispatching``) or
that records the approval (``approve``) or its revocation (``revoke_approval``), so no approval
can slip between a look and a write. ``approve`` / ``approve_async`` and ``revoke_approval`` /
``revoke_approval_async`` are the public entry points.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import ApprovalInvalid, ApprovalRefused, AwaitingApproval, GateApproved
from ..types import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalRevocation,
    EffectState,
    OperationRecord,
    RunRecord,
    RunStatus,
)
from .moments import instant
from .waits import APPROVAL, waiting_kind

if TYPE_CHECKING:
    pass

# An approval authorizes a dispatch still to come, or a re-dispatch of an uncertain one.
_APPROVABLE = (EffectState.PREPARED, EffectState.DISPATCHING, EffectState.UNKNOWN)


# ``approvals`` below are one operation's, in the order they were given (as stores list them).


def authorizing(
    approvals: list[ApprovalRecord], *, payload_digest: str, target_digest: str | None, now: int
) -> ApprovalRecord | None:
    """The newest approval that authorizes dispatching this payload on this target now."""
    valid = [a for a in approvals if a.authorizes(payload_digest, target_digest, now)]
    return valid[-1] if valid else None


def unauthorized(
    approvals: list[ApprovalRecord], *, payload_digest: str, target_digest: str | None, now: int
) -> tuple[str, bool]:
    """Why no approval authorizes the dispatch, and whether one had been given (invalidated)."""
    if not approvals:
        return "it needs a person's approval before it is dispatched", False
    latest = approvals[-1]
    who = latest.approved_by
    if latest.revoked_at is not None:
        return (
            f"the approval by {who} was revoked by {latest.revoked_by} at"
            f" {instant(latest.revoked_at)}: {latest.revoke_reason}"
        ), True
    if latest.payload_digest != payload_digest:
        return (
            f"the payload changed since {who} approved it ({latest.payload_digest[:19]}…"
            f" is now {payload_digest[:19]}…)"
        ), True
    if latest.target_digest != target_digest:
        return (
            f"the target's state changed since {who} approved it (the approval was for"
            f" state {_short(latest.target_digest)}, it is now {_short(target_digest)})"
        ), True
    if latest.expires_at is not None and latest.expires_at <= now:
        return f"the approval by {who} expired at {instant(latest.expires_at)}", True
    return "no approval given authorizes it", True


def _short(digest: str | None) -> str:
    return "none" if digest is None else f"{digest[:19]}…"


def waiting_record(
    op: OperationRecord, *, target_digest: str | None, approvals: list[ApprovalRecord], now: int
) -> dict[str, Any]:
    """What a run waits for, as recorded on it (``RunRecord.waiting_for``)."""
    reason, invalidated = unauthorized(
        approvals, payload_digest=op.payload_ref, target_digest=target_digest, now=now
    )
    return {
        "kind": APPROVAL,
        "operation_id": op.operation_id,
        "step_id": op.step_id,
        "effect": op.effect,
        "payload_digest": op.payload_ref,
        "target_digest": target_digest,
        "reason": reason,
        "invalidated": invalidated,
        "since": now,
    }


def awaiting(run_id: str, waiting_for: dict[str, Any]) -> AwaitingApproval:
    """The error a waiting run raises: ``ApprovalInvalid`` when an approval had been given."""
    error = ApprovalInvalid if waiting_for.get("invalidated") else AwaitingApproval
    return error(
        run_id,
        str(waiting_for["step_id"]),
        str(waiting_for["operation_id"]),
        str(waiting_for["payload_digest"]),
        waiting_for.get("target_digest"),
        str(waiting_for["reason"]),
    )


def refused_dispatch(op: OperationRecord, approvals: list[ApprovalRecord], now: int) -> ApprovalInvalid:
    """What ``mark_dispatching`` raises for an operation no approval authorizes."""
    reason, _ = unauthorized(
        approvals, payload_digest=op.payload_ref, target_digest=op.target_digest, now=now
    )
    return ApprovalInvalid(
        op.run_id,
        op.step_id,
        op.operation_id,
        op.payload_ref,
        op.target_digest,
        f"the store refused the dispatch: {reason}",
    )


def may_reprepare(op: OperationRecord, *, replans: bool = False) -> bool:
    """Whether an operation may take a new payload: it never left (prepared, and never marked
    dispatching: an operation back to prepared after a dispatch — found not applied — may still
    have a request on its way under its key, which must never carry another payload), and
    either it needs approval (so the new payload must be approved anew) or the run re-plans
    (compatibility policy ``replan``)."""
    return op.state is EffectState.PREPARED and op.dispatch_count == 0 and (op.approval_required or replans)


def plan_approval(
    run: RunRecord,
    step_id: str,
    op: OperationRecord | None,
    approvals: list[ApprovalRecord],
    request: ApprovalRequest,
    now: int,
) -> tuple[ApprovalRecord | None, ApprovalRecord, bool]:
    """Decide an approval: (the approval to insert or None, the approval to return, whether
    the run — waiting for exactly this operation — is released to be claimed again).

    Raises ``ApprovalRefused`` when it does not fit the run as it stands — ``GateApproved``
    when another approval authorizes the dispatch already (the gate takes one), or authorized
    one that went out."""

    def refuse(reason: str) -> ApprovalRefused:
        return ApprovalRefused(run.run_id, step_id, reason)

    if run.status.terminal:
        raise refuse(f"the run is {run.status.value}; nothing is left to approve")
    if op is None:
        raise refuse(
            "the step has no prepared effect yet, and an approval binds to the exact"
            " payload: approve once the run waits for it (`safepoint runs --status"
            " waiting`)"
        )
    if not op.approval_required:
        raise refuse(f"effect {op.operation_id!r} does not ask for approval")
    if op.state not in _APPROVABLE:
        raise refuse(
            f"effect {op.operation_id!r} is already {op.state.value}; an approval"
            " authorizes only a dispatch still to come"
        )
    if request.payload_digest is not None and request.payload_digest != op.payload_ref:
        raise refuse(
            f"you approved payload {request.payload_digest}, but the effect now"
            f" carries {op.payload_ref}: look at it again with `safepoint show"
            f" {run.run_id}`"
        )
    expires_at = request.expires_at
    if expires_at is None and request.ttl_ms is not None:
        expires_at = now + request.ttl_ms
    if expires_at is not None and expires_at <= now:
        raise refuse(f"it would expire ({instant(expires_at)}) before it is given")
    release = (
        run.status is RunStatus.WAITING and (run.waiting_for or {}).get("operation_id") == op.operation_id
    )
    for given in approvals:  # the same person approving the same thing again: no new approval
        if given.approved_by == request.by and given.authorizes(op.payload_ref, op.target_digest, now):
            return None, given, release
    in_force = authorizing(approvals, payload_digest=op.payload_ref, target_digest=op.target_digest, now=now)
    if in_force is not None:  # the gate has its approval: a second one would be read by nothing
        raise gate_approved(run, step_id, op, in_force)
    approval = ApprovalRecord(
        approval_id=request.approval_id,
        run_id=run.run_id,
        operation_id=op.operation_id,
        step_id=op.step_id,
        payload_digest=op.payload_ref,
        target_digest=op.target_digest,
        approved_by=request.by,
        approved_at=now,
        expires_at=expires_at,
        evidence=request.evidence,
    )
    return approval, approval, release


def gate_approved(run: RunRecord, step_id: str, op: OperationRecord, given: ApprovalRecord) -> GateApproved:
    """The refusal of a second approval of ``op``'s gate while ``given`` authorizes it: before
    the dispatch (one approval per gate: revoke it to approve anew), or after the effect went
    out under it (what happened is reconciled; an approval now would authorize nothing)."""
    went_out = op.state is not EffectState.PREPARED or op.dispatch_count > 0
    by = f"{given.approved_by} at {instant(given.approved_at)} (approval {given.approval_id})"
    if went_out:
        reason = (
            f"effect {op.operation_id!r} went out under the approval of {by}, which still"
            " authorizes it: another approval would authorize nothing — its outcome is"
            f" reconciled with its owner (`safepoint show {run.run_id}`)"
        )
    else:
        until = "" if given.expires_at is None else f", until {instant(given.expires_at)}"
        reason = (
            f"the gate is approved already, by {by}{until}: a gate takes one approval — to"
            f" approve it anew, revoke that one first (`safepoint revoke {run.run_id} {step_id}`)"
        )
    return GateApproved(
        run.run_id,
        step_id,
        reason,
        operation_id=op.operation_id,
        approval_id=given.approval_id,
        approved_by=given.approved_by,
        approved_at=given.approved_at,
        went_out=went_out,
    )


def approval_detail(approval: ApprovalRecord, *, released: bool) -> dict[str, Any]:
    """The detail of an ``effect.approved`` event."""
    return {
        "approval_id": approval.approval_id,
        "payload_digest": approval.payload_digest,
        "target_digest": approval.target_digest,
        "expires_at": approval.expires_at,
        "evidence": approval.evidence,
        "released": released,
    }


# An operation in one of these states has its outcome: nothing is dispatched for it again.
_SETTLED_STATES = (EffectState.APPLIED, EffectState.ACCEPTED, EffectState.REJECTED)


def plan_revocation(
    run: RunRecord,
    step_id: str,
    op: OperationRecord | None,
    approvals: list[ApprovalRecord],
    revocation: ApprovalRevocation,
    now: int,
) -> list[ApprovalRecord]:
    """Decide a revocation: the approvals of the operation as they are once revoked (every
    one still in force, in the order they were given).

    The run's status is left as it is. A waiting run waits on; a running one meets the gate
    again in ``mark_dispatching``; a run an approval released (pending) is claimed and
    replayed to its gate, which makes it wait again, naming the revocation. Putting a pending
    run back to waiting here would have to know why it is pending (a released approval, a
    worker that let it go, a cancel to settle) and the target's state as it reads now — the
    gate knows both, so it alone decides whether the run waits.

    Raises ``ApprovalRefused`` (``revoking``) when there is nothing to revoke."""

    def refuse(reason: str) -> ApprovalRefused:
        return ApprovalRefused(run.run_id, step_id, reason, revoking=True)

    if op is None:
        raise refuse(
            "the step has no prepared effect, so nothing of it was approved (see"
            f" the run's effects with `safepoint show {run.run_id}`)"
        )
    # Until the owner's outcome is recorded a dispatch may still come: the first, one after a
    # dispatch that provably never left, or one after a reconcile that found nothing. A
    # revocation withdraws those; one that may already have happened is reconciled, never
    # recalled.
    if op.state in _SETTLED_STATES:
        raise refuse(
            f"too late: effect {op.operation_id!r} is {op.state.value}; a revocation"
            " withdraws only dispatches still to come"
        )
    if run.status.terminal:
        raise refuse(f"the run is {run.status.value}; nothing will be dispatched under its approvals")
    in_force = [a for a in approvals if not a.revoked]
    if not in_force:
        if approvals:
            last = approvals[-1]
            raise refuse(
                f"every approval of effect {op.operation_id!r} was revoked already"
                f" (the last by {last.revoked_by} at {instant(last.revoked_at or now)}):"
                " nothing is left to revoke"
            )
        raise refuse(f"effect {op.operation_id!r} has no approval to revoke")
    return [
        replace(a, revoked_at=now, revoked_by=revocation.by, revoke_reason=revocation.reason)
        for a in in_force
    ]


def revocable(
    run: RunRecord, operations: Mapping[str, OperationRecord], approvals: list[ApprovalRecord]
) -> list[str]:
    """The steps whose approval a person may still take back (what ``plan_revocation``
    accepts): an approval in force of an effect whose outcome is not recorded yet, in a run
    that goes on."""
    if run.status.terminal:
        return []
    return sorted(
        {
            a.step_id
            for a in approvals
            if not a.revoked
            and (op := operations.get(a.operation_id)) is not None
            and op.state not in _SETTLED_STATES
        }
    )


def approvable(run: RunRecord, operations: Mapping[str, OperationRecord]) -> list[str]:
    """The steps whose effect a person may approve now (what ``plan_approval`` accepts): an
    effect that asks for approval, prepared, whose dispatch is still to come, in a run that goes
    on — the one the run waits for first."""
    if run.status.terminal:
        return []
    steps = sorted(
        {op.step_id for op in operations.values() if op.approval_required and op.state in _APPROVABLE}
    )
    waiting = (
        (run.waiting_for or {}).get("step_id")
        if run.status is RunStatus.WAITING and waiting_kind(run.waiting_for) == APPROVAL
        else None
    )
    if isinstance(waiting, str) and waiting in steps:
        steps = [waiting] + [step for step in steps if step != waiting]
    return steps


def revocation_detail(revoked: list[ApprovalRecord]) -> dict[str, Any]:
    """The detail of an ``effect.approval_revoked`` event (who revoked is its worker)."""
    return {
        "approval_ids": [a.approval_id for a in revoked],
        "approved_by": [a.approved_by for a in revoked],
        "reason": revoked[0].revoke_reason,
    }
