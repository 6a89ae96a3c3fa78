"""The operator's verbs on a run that already exists: approve or revoke an effect's approval,
and resolve a blocked run. Each checks what a person typed, then carries its decision out as a
flow, so that the sync and the async verb share one body; the decisions themselves are in
``_rules.approvals`` and ``_rules.recovery``, and the stores make them inside the transaction
that checks the run's state.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import warnings
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from .._rules.canonical import require_json
from .._rules.effects import Effect, EffectKey, Unknown, key_is_minted, lookup
from .._rules.ids import check_id, check_run_id, check_who, check_words
from .._rules.recovery import NOT_IMPORTED, UNCERTAIN_PHASE, owner_says, refusal, unasked
from .._rules.secrets import refuse_secrets
from ..errors import ResolutionRefused, UsageError
from ..storage.base import Store
from ..types import (
    ApprovalRecord,
    ApprovalRequest,
    ApprovalRevocation,
    EffectState,
    Resolution,
    ResolutionAction,
    RunRecord,
    RunStatus,
)
from . import host
from .flow import Flow, adrive, drive, io, require_store
from .lifecycle import chain_head

if TYPE_CHECKING:
    from ..storage.base import AsyncStore

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


# -- approvals --------------------------------------------------------------------------------


def _request(
    by: str, expires: timedelta | datetime | None, evidence: str | None, payload_digest: str | None
) -> ApprovalRequest:
    check_who(by, "approves")
    if evidence is not None and not isinstance(evidence, str):
        raise UsageError("evidence is a sentence, a link or a ticket id: a string")
    check_words(evidence, "the approval's evidence")
    refuse_secrets([by, evidence], "the approval")
    if payload_digest is not None and not (
        isinstance(payload_digest, str) and _DIGEST.fullmatch(payload_digest)
    ):
        raise UsageError(
            f"payload_digest {payload_digest!r} is not a digest: it reads"
            " 'sha256:' and 64 hex digits (as `safepoint show RUN` prints it)"
        )
    ttl_ms = expires_at = None
    if isinstance(expires, timedelta):
        ttl_ms = int(expires.total_seconds() * 1000)
        if ttl_ms <= 0:
            raise UsageError("expires must be a positive duration (or a moment to come)")
    elif isinstance(expires, datetime):
        if expires.tzinfo is None:
            raise UsageError("expires needs a timezone-aware datetime (e.g. with tzinfo=UTC)")
        expires_at = int(expires.timestamp() * 1000)
    elif expires is not None:
        raise UsageError(
            "expires is a timedelta (from now, on the store's clock), a datetime, or None (does not expire)"
        )
    return ApprovalRequest(
        approval_id=host.current.token(),
        by=by,
        evidence=evidence,
        ttl_ms=ttl_ms,
        expires_at=expires_at,
        payload_digest=payload_digest,
    )


def approve(
    store: Store,
    run_id: str,
    step_id: str,
    /,
    *,
    by: str,
    expires: timedelta | datetime | None = None,
    evidence: str | None = None,
    payload_digest: str | None = None,
) -> ApprovalRecord:
    """Approve the effect that step ``step_id`` of ``run_id`` prepared; return the approval.

    The approval is bound to the payload the effect carries and to the state its target was
    last seen in (when the run started waiting), and lasts until ``expires`` (a timedelta from
    now on the store's clock, or a datetime; None: no expiry). Pass ``payload_digest`` (as
    ``safepoint show`` prints it) to approve only the payload you looked at. A run waiting for
    this effect becomes claimable again: resume it, or let a worker take it. An approval given
    before the run reaches its gate is kept and found there. The step must have prepared its
    effect (``ApprovalRefused`` otherwise). The same person approving the same payload and
    target again, while their approval holds, gets that approval back.

    At most once: a gate takes one approval. Another person's approval while one still
    authorizes the dispatch — before it, or after the effect went out under it — is refused
    (``GateApproved``, naming the approval in force) and nothing is written: revoke that one to
    approve anew. The store decides it under the run's row lock, in the transaction that
    records the approval, so k people approving at the same instant release the gate once.

    A run that continued as new passes the approval on to the run that carries its chain on
    (the one that can be waiting), so the id ``start`` was given serves the whole chain.

    >>> approve(store, "refund-8472", "refund", by="ana", expires=timedelta(hours=2))  # doctest: +SKIP
    """
    require_store(store, "approve")
    approval: ApprovalRecord = drive(
        store, _approve_flow(run_id, step_id, _request(by, expires, evidence, payload_digest))
    )
    return approval


async def approve_async(
    store: Store | AsyncStore,
    run_id: str,
    step_id: str,
    /,
    *,
    by: str,
    expires: timedelta | datetime | None = None,
    evidence: str | None = None,
    payload_digest: str | None = None,
) -> ApprovalRecord:
    """``approve`` from async code."""
    require_store(store, "approve_async")
    approval: ApprovalRecord = await adrive(
        store, _approve_flow(run_id, step_id, _request(by, expires, evidence, payload_digest))
    )
    return approval


def _approve_flow(run_id: str, step_id: str, request: ApprovalRequest) -> Flow[ApprovalRecord]:
    run_id = yield from _carried_on_by(run_id, step_id)
    return (yield from io(Store.approve, run_id, step_id, request))


def _carried_on_by(run_id: str, step_id: str) -> Flow[str]:
    """The id of the run that carries ``run_id``'s chain on: itself, or its latest successor
    (the ids as a person typed them checked first: nothing is looked up under a malformed one).
    """
    check_id(step_id, "step id")  # as recorded: a fan-out's or occurrence's id included
    run = yield from chain_head((yield from io(Store.get_run, check_run_id(run_id))))
    return run.run_id


def _revocation(by: str, reason: str) -> ApprovalRevocation:
    check_who(by, "revokes the approval")
    if not isinstance(reason, str) or not reason.strip():
        raise UsageError(
            "say why the approval is revoked: reason='…' (recorded, and shown to whoever looks at the run)"
        )
    check_words(reason, "the revocation's reason")
    refuse_secrets([by, reason], "the revocation")
    return ApprovalRevocation(by=by, reason=reason)


def revoke_approval(
    store: Store, run_id: str, step_id: str, /, *, by: str, reason: str
) -> list[ApprovalRecord]:
    """Take back the approval of the effect step ``step_id`` of ``run_id`` prepared, before it
    is dispatched; return the approvals revoked (every one still in force).

    A revoked approval authorizes nothing: the run does not dispatch the effect, and waits
    again (``ApprovalInvalid``, naming the revocation) when it reaches its gate, until someone
    approves it anew. A dispatch racing the revocation is decided by the store: whichever
    commits first wins. ``ApprovalRefused`` when there is nothing to revoke — no approval in
    force, or too late: the effect was dispatched already (its outcome is what the run
    reconciles). ``reason`` is recorded, with ``by``, in an ``effect.approval_revoked`` event.

    A run that continued as new passes the revocation on to the run that carries its chain on,
    as ``approve`` does.

    >>> revoke_approval(store, "refund-8472", "refund", by="ana",
    ...                 reason="customer withdrew the request")  # doctest: +SKIP
    """
    require_store(store, "revoke_approval")
    revoked: list[ApprovalRecord] = drive(store, _revoke_flow(run_id, step_id, _revocation(by, reason)))
    return revoked


async def revoke_approval_async(
    store: Store | AsyncStore, run_id: str, step_id: str, /, *, by: str, reason: str
) -> list[ApprovalRecord]:
    """``revoke_approval`` from async code."""
    require_store(store, "revoke_approval_async")
    revoked: list[ApprovalRecord] = await adrive(
        store, _revoke_flow(run_id, step_id, _revocation(by, reason))
    )
    return revoked


def _revoke_flow(run_id: str, step_id: str, revocation: ApprovalRevocation) -> Flow[list[ApprovalRecord]]:
    run_id = yield from _carried_on_by(run_id, step_id)
    return (yield from io(Store.revoke_approval, run_id, step_id, revocation))


# -- resolutions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settled:
    """A resolution as it was applied: the run as it now stands, the decision recorded (with
    its owner check), and the effect key a "not applied" operation is sent again under."""

    run: RunRecord
    decision: Resolution
    effect_key: str | None = None


def resolve(
    store: Store,
    run_id: str,
    action: ResolutionAction | str,
    *,
    revision: int,
    by: str,
    operation_id: str | None = None,
    receipt: Any = None,
    evidence: str | None = None,
    force: bool = False,
) -> RunRecord:
    """Apply a person's decision to a blocked run and return the run as it now stands.

    ``applied``: the operation happened; ``receipt`` is what its owner holds, and the run
    carries on from it. ``not_applied``: it did not; the run dispatches it again under the same
    key. ``abandon``: the run ends, cancelled. ``revision`` is the state revision of the
    recovery record the decision was made on: if the run moved since, the decision is refused.
    Repeating a resolution that was applied is harmless: it returns the run unchanged.

    Before a ``not_applied`` sends the effect again, its owner is asked (``reconcile(key)``)
    when this process declares the effect — it imported the code that constructs it. If the
    owner has it, the decision is refused (``ResolutionRefused``, with the receipt to mark it
    applied by); if it cannot say, or its reconcile raises, the decision is refused unless
    ``force=True``. Whether the owner was asked, what it said and whether it was forced are
    recorded with the decision; when the effect's code is not imported here, nobody asked it,
    and a ``UserWarning`` says so.

    A run blocked on a transaction step whose function ended the step's transaction (recovery
    record phase ``transaction_uncertain``: its writes may have committed) is decided the same
    way, by a person who looked in the database: ``applied`` records the step with ``receipt``
    as the value it returns (the function is not called again); ``not_applied`` lets it run
    again, from nothing — nobody else can be asked.
    """
    require_store(store, "resolve")
    settled = settle(
        store,
        run_id,
        action,
        revision=revision,
        by=by,
        operation_id=operation_id,
        receipt=receipt,
        evidence=evidence,
        force=force,
    )
    check = settled.decision.owner_check
    if check is not None and check.get("not_asked") == NOT_IMPORTED:
        warnings.warn(check["note"], UserWarning, stacklevel=2)
    return settled.run


def settle(
    store: Store,
    run_id: str,
    action: ResolutionAction | str,
    *,
    revision: int,
    by: str,
    operation_id: str | None = None,
    receipt: Any = None,
    evidence: str | None = None,
    force: bool = False,
) -> Settled:
    """``resolve``, returning what the operator tools show: the decision as recorded (with the
    owner check) and the effect key it is sent again under."""
    chosen = one_action(action)
    check_run_id(run_id)
    if operation_id is not None:
        check_id(operation_id, "operation id")
    check_who(by, "resolves the run")
    if receipt is not None:
        if chosen is not ResolutionAction.APPLIED:
            raise UsageError("only an operation marked applied takes a receipt")
        require_json(receipt, "the receipt")
        refuse_secrets(receipt, "the receipt")
    if not isinstance(force, bool):
        raise UsageError(f"force is True or False, not {force!r}")
    if force and chosen is not ResolutionAction.NOT_APPLIED:
        raise UsageError(
            f"force=True contradicts {chosen.value!r}: it only overrides the"
            " owner's doubt about a not_applied resolution (and sends the effect"
            " again regardless)"
        )
    check_words(evidence, "the resolution's evidence")
    refuse_secrets([by, evidence], "the resolution")
    decision = Resolution(action=chosen, by=by, operation_id=operation_id, receipt=receipt, evidence=evidence)
    if operation_id is None and chosen is not ResolutionAction.ABANDON:
        decision = _with_named_operation(store, run_id, revision, decision)
    if chosen is ResolutionAction.APPLIED and receipt is None and decision.step_id is None:
        raise UsageError(
            "marking an operation applied needs its receipt as evidence: the"
            " object the owner holds (e.g. the charge it returns by key)"
        )
    key = None
    if chosen is ResolutionAction.NOT_APPLIED and decision.step_id is None:
        decision, key = _checked_with_owner(store, run_id, revision, decision, force)
    return Settled(store.resolve(run_id, revision, decision), decision, key)


def one_action(action: Any) -> ResolutionAction:
    """The one resolution asked for: "applied", "not_applied" or "abandon" — never two at once,
    nor a guess."""
    try:
        return ResolutionAction(action)
    except (ValueError, TypeError):
        choices = ", ".join(repr(a.value) for a in ResolutionAction)
        raise UsageError(
            f"a resolution is exactly one of {choices}, not {action!r}: they contradict each other"
        ) from None


def _checked_with_owner(
    store: Store, run_id: str, revision: int, decision: Resolution, force: bool
) -> tuple[Resolution, str | None]:
    """``decision`` (not applied) with what the effect's owner said; refused when the owner
    has the effect, or doubts and nobody forced it."""
    ledger = store.load_ledger(run_id)
    op = ledger.operations.get(decision.operation_id or "")
    key = None if op is None else op.effect_key
    if (
        op is None
        or ledger.run.status is not RunStatus.BLOCKED
        or ledger.run.state_revision != revision
        or op.state not in (EffectState.DISPATCHING, EffectState.UNKNOWN)
    ):
        # The store refuses it as it stands — unless it repeats the resolution recorded, which
        # carries that one's owner check: asking again now would ask after the re-dispatch.
        return _as_recorded(store, run_id, decision), key
    if not key_is_minted(op, ledger.run, store.identity):
        # The owner knows the operation by the key minted: asked under another, it can only
        # say "not found", which must not stand as its word.
        raise ResolutionRefused(
            run_id,
            f"the owner was not asked: operation {op.operation_id!r}"
            f" holds {op.effect_key!r}, which is not the key minted for"
            " it (altered after it was recorded) — put the minted key back"
            " (from a backup) and resolve again, or look it up at its owner"
            " and mark it --applied or --abandon",
        )
    found = lookup(op.effect)
    check = unasked(found, force=force)
    if check is None:
        effect = found.effect
        assert effect is not None
        answer = _ask(effect, EffectKey(op.effect_key, op.operation_id, run_id, ledger.run.fence))
        check = owner_says(
            answer, effect=effect, now=store.now(), first_dispatched_at=op.first_dispatched_at, force=force
        )
    if check.refused:
        raise ResolutionRefused(run_id, check.note, owner_answer=check.answer, receipt=check.receipt)
    return replace(decision, owner_check=check.detail()), key


def _ask(effect: Effect, key: EffectKey) -> Any:
    """The owner's answer to ``reconcile(key)``; a reconcile that raises answers Unknown."""
    assert effect.reconcile is not None
    try:
        answer = host.current.owner_call(effect, "reconcile")(key)
        if inspect.isawaitable(answer):
            answer = _awaited(answer)
    except Exception as exc:
        return Unknown(f"reconcile raised {type(exc).__name__}: {exc}")
    return answer


def _awaited(awaitable: Awaitable[Any]) -> Any:
    """An async reconcile's answer, from plain code — on a thread of its own when this thread
    already runs an event loop (``sp.resolve`` called from async code)."""

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def _as_recorded(store: Store, run_id: str, decision: Resolution) -> Resolution:
    """``decision`` with the owner check of the resolution recorded last, when it is that
    same decision."""
    resolved = [e for e in store.events(run_id) if e.kind == "run.resolved"]
    if resolved and isinstance(resolved[-1].detail, dict):
        recorded = dict(resolved[-1].detail)
        check = recorded.pop("owner_check", None)
        if recorded == decision.detail() and isinstance(check, dict):
            return replace(decision, owner_check=check)
    return decision


def _with_named_operation(store: Store, run_id: str, revision: int, decision: Resolution) -> Resolution:
    """The operation the recovery record names (or the transaction step it holds uncertain) —
    or, once resolved, the one the last resolution named (so that repeating it stays
    harmless)."""
    run = store.get_run(run_id)
    record = run.recovery_record or {}
    operation_id = record.get("operation_id")
    if operation_id is None and record.get("phase") == UNCERTAIN_PHASE:
        return replace(decision, step_id=record.get("step_id"))
    if operation_id is None:
        resolved = [e for e in store.events(run_id) if e.kind == "run.resolved"]
        operation_id = resolved[-1].operation_id if resolved else None
        step_id = (
            resolved[-1].detail.get("step_id") if resolved and isinstance(resolved[-1].detail, dict) else None
        )
        if operation_id is None and isinstance(step_id, str):
            return replace(decision, step_id=step_id)
    if operation_id is None:
        reason = (
            "its recovery record names no operation; name one"
            if run.status is RunStatus.BLOCKED
            else refusal(run, revision, decision)
        )
        raise ResolutionRefused(run_id, reason)
    return replace(decision, operation_id=operation_id)
