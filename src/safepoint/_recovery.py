"""Recovery records: what a blocked run tells the person who must decide what happens next.

A record routes the next action: a stable operation, the retained payload, explicit uncertainty,
and a phase that forbids blind re-dispatch. Its ``state_revision`` is filled in by the store, in
the statement that blocks the run, so it always names the revision the block created.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shlex
import warnings
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ._canonical import require_json
from ._declared import Declared, lookup
from ._effects import Applied, Effect, EffectKey, NotApplied, Unknown, key_is_minted
from ._flow import require_store
from ._ids import check_id, check_run_id, check_who, check_words
from ._limits import limits_ref
from ._secrets import redact_json, redact_text, refuse_secrets
from .errors import ResolutionRefused, UsageError
from .types import (
    ApprovalRecord,
    EffectState,
    OperationRecord,
    Resolution,
    ResolutionAction,
    RunRecord,
    RunStatus,
    UnreadableRun,
)

if TYPE_CHECKING:
    from .storage.base import Store

RECORD_SCHEMA_VERSION = 1


def record_schema() -> dict[str, Any]:
    """The published JSON Schema of recovery records (``safepoint/schemas/``), for tools that
    read them."""
    from importlib import resources

    text = resources.files("safepoint").joinpath("schemas", "recovery-record.schema.json")
    loaded: dict[str, Any] = json.loads(text.read_text("utf-8"))
    return loaded

# What a person can do about each phase; shown by the CLI beside the record.
_NEXT_ACTIONS: dict[str, list[str]] = {
    "reconcile_effect": [
        "look the operation up at its owner by effect_key",
        "if it happened: safepoint resolve RUN --applied --receipt '<the owner's object>'"
        " --revision <state_revision> --by <you> --evidence '<how you know>'",
        "if it did not: safepoint resolve RUN --not-applied --revision <state_revision>"
        " --by <you> --import <your module> (its owner is asked first; it is then dispatched"
        " again, under the same key)",
        "or resume later, when the owner can answer; or give up: safepoint resolve RUN"
        " --abandon --revision <state_revision> --by <you>",
    ],
    "verify_effect": [
        "inspect the receipt at the owner; if it is right: safepoint resolve RUN --applied"
        " --receipt '<the owner's object>' --revision <state_revision> --by <you>",
        "otherwise: safepoint resolve RUN --abandon --revision <state_revision> --by <you>",
    ],
    "stale_checkpoint": [
        "revert the code or input change that moved this step's inputs, then resume",
        "or register the workflow with compatibility='replan' and resume: this step and the"
        " observations after it are asked again, the effects already done are kept",
        "or start a new run for the new inputs (and abandon this one)",
    ],
    "replay_mismatch": [
        "the code now takes another path at this step: deploy the code that recorded the run,"
        " then resume; or abandon it and start a new run",
    ],
    "incompatible_workflow": [
        "deploy the code that recorded this run (see the changes in the evidence), then resume",
        "or register the workflow with compatibility='replan' and resume: the stale steps are"
        " abandoned, the effects already done are kept",
        "or give it up: safepoint resolve RUN --abandon --revision <state_revision> --by <you>",
    ],
    "unreadable_record": [
        "restore the named row or artifact from a backup, then resume",
    ],
    "store_refused": [
        "read the store's refusal in the evidence; fix the data or code that caused it,"
        " then resume",
    ],
    "history_limit": [
        "the run's history (its events and steps) reached its hard limit: it records nothing"
        " new",
        "have the workflow carry its state into a successor before the limit: call"
        " run.continue_as_new(state) at a deterministic point (every N iterations, say);"
        " deploy that under the same workflow version, then resume RUN — it replays to that"
        " point and continues as new (effects with an explicit operation_id are not sent"
        " again)",
        "or give the run up: safepoint resolve RUN --abandon --revision <state_revision>"
        " --by <you>",
    ],
    "continue_as_new": [
        "the successor's run id is taken by another run: rename or remove that run, then"
        " resume RUN; or give the run up: safepoint resolve RUN --abandon --revision"
        " <state_revision> --by <you>",
    ],
}


def build_record(run: RunRecord | UnreadableRun, *, phase: str, reason: str,
                 step_id: str | None = None,
                 op: OperationRecord | None = None,
                 evidence: dict[str, Any] | None = None,
                 authorization: ApprovalRecord | None = None) -> dict[str, Any]:
    """The recovery record of DESIGN §4 as a JSON-ready dict. ``authorization`` is the approval
    under which ``op`` was dispatched (``op.approval_id``), named by ``authorization_ref``. A run
    whose row cannot be read (``UnreadableRun``) gets what of it can be read ("?" for a name
    that cannot, no limits)."""
    evidence = dict(evidence or {})
    if op is not None and op.error is not None:
        evidence.setdefault("last_error", op.error)
    # Reasons and evidence quote what owners, reconcile and verifiers said, which may quote
    # credentials. (The approval below holds nothing of the kind: who approved was refused
    # if it looked like one, and "authorization" would read as a credential's key.)
    reason, evidence = redact_text(reason), dict(redact_json(evidence))
    authorization_ref = None
    if op is not None and op.approval_id is not None:
        authorization_ref = f"approval:{op.run_id}/{op.operation_id}/{op.approval_id}"
        if authorization is not None:
            evidence.setdefault("authorization", {
                "approval_id": authorization.approval_id, "by": authorization.approved_by,
                "payload_digest": authorization.payload_digest,
                "target_digest": authorization.target_digest,
                "approved_at": authorization.approved_at,
                "expires_at": authorization.expires_at})
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "task_id": run.run_id,
        "workflow": run.workflow or "?",
        "workflow_version": f"{run.workflow or '?'}@{run.workflow_version or '?'}",
        "state_revision": None,  # set by the store when it commits the block
        "phase": phase,
        "reason": reason,
        "step_id": step_id if op is None else op.step_id,
        "operation_id": op.operation_id if op else None,
        "effect": op.effect if op else None,
        "effect_key": op.effect_key if op else None,
        "payload_ref": op.payload_ref if op else None,
        "effect_status": op.state.value if op else None,
        "dispatch_count": op.dispatch_count if op else None,
        "first_dispatched_at": op.first_dispatched_at if op else None,
        "receipt_ref": (f"operation:{op.run_id}/{op.operation_id}/receipt"
                        if op and op.receipt is not None else None),
        "authorization_ref": authorization_ref,
        "limits_ref": limits_ref(run) if isinstance(run, RunRecord) else None,
        "evidence_refs": ([f"operation:{op.run_id}/{op.operation_id}"] if op else [])
        + ([authorization_ref] if authorization_ref else []),
        "evidence": evidence,
        "next_actions": _NEXT_ACTIONS.get(phase, []),
    }


def refusal(run: RunRecord, expected_revision: int, resolution: Resolution) -> str:
    """Why a resolution could not be applied to ``run`` as it now stands."""
    if run.status is not RunStatus.BLOCKED:
        return f"the run is {run.status.value}, not blocked"
    if run.state_revision != expected_revision:
        return (f"the run moved on: it is at revision {run.state_revision}, the record you"
                f" resolved was at revision {expected_revision}")
    return (f"operation {resolution.operation_id!r} is not uncertain (dispatching, unknown or"
            " applied) in this run")


@dataclass(frozen=True, slots=True)
class OwnerCheck:
    """What the effect's owner said before a person's "not applied" sends an effect again."""

    asked: bool               # its reconcile was called
    answer: str | None        # "applied", "not_applied", "unknown"; None when not asked
    refused: bool             # the resolution must not go ahead
    forced: bool              # it goes ahead only because the person overrode a doubt
    note: str                 # what the person is told, and what is recorded
    receipt: Any = None       # "applied": what the owner holds
    not_asked: str | None = None  # why not: NOT_IMPORTED, AMBIGUOUS or NO_RECONCILE

    def detail(self) -> dict[str, Any]:
        return {"asked": self.asked, "answer": self.answer, "forced": self.forced,
                "not_asked": self.not_asked, "note": self.note}


# Why an owner was not asked.
NOT_IMPORTED = "not_imported"  # the effect's code is not imported in the resolving process
AMBIGUOUS = "ambiguous"        # effects of that name with different reconcile functions
NO_RECONCILE = "no_reconcile"  # the effect has no way to ask its owner


def unasked(found: Declared, *, force: bool) -> OwnerCheck | None:
    """Why the owner of ``found`` cannot be asked; None when it can (it has a reconcile)."""
    name = found.name
    if not found.known:
        return OwnerCheck(False, None, False, False,
                          f"the owner was not asked: effect {name!r} is not declared in this"
                          " process (its code is not imported: resolve with --import MODULE,"
                          " or call sp.resolve where the application is imported)",
                          not_asked=NOT_IMPORTED)
    if found.ambiguous:
        doubt = (f"the owner was not asked: effects named {name!r} with different reconcile"
                 f" functions are declared in this process ({'; '.join(found.origins)}), so"
                 " which owner holds the operation is unknown; give each effect a name of its"
                 " own")
        return _doubt(doubt, asked=False, answer=None, force=force, not_asked=AMBIGUOUS)
    assert found.effect is not None
    if found.effect.reconcile is None:
        return OwnerCheck(False, None, False, False,
                          f"the owner was not asked: effect {name!r} has no reconcile"
                          " function", not_asked=NO_RECONCILE)
    return None


def owner_says(answer: Any, *, effect: Effect, now: int, first_dispatched_at: int | None,
               force: bool) -> OwnerCheck:
    """What the owner's answer to ``reconcile(key)`` allows a person's "not applied" to do.

    ``Applied`` refuses it, whatever ``force`` says: the owner holds the effect, and sending it
    again would apply it twice. ``NotApplied`` lets it go ahead — unless the first dispatch was
    longer ago than the owner remembers keys, when "not found" may mean "forgotten". Anything
    else is doubt, which refuses it unless the person overrides it (``force``)."""
    if isinstance(answer, Applied):
        receipt = redact_json(answer.receipt)
        shown = json.dumps(receipt, ensure_ascii=False, separators=(",", ":"), default=str)
        return OwnerCheck(True, "applied", True, False,
                          f"the owner has it: {effect.name!r} reconcile reports the operation"
                          f" applied, with receipt {shown}; it must not be sent again — mark"
                          f" it applied instead: --applied --receipt {shlex.quote(shown)}",
                          receipt)
    if isinstance(answer, NotApplied):
        retention = effect.dedup_retention
        if (retention is not None and first_dispatched_at is not None
                and now - first_dispatched_at >= retention.total_seconds() * 1000):
            return _doubt(f"the owner reports it not applied, but the first dispatch was"
                          f" {(now - first_dispatched_at) / 1000:.0f}s ago, past the owner's"
                          f" dedup retention of {retention}: it may have forgotten the key",
                          asked=True, answer="not_applied", force=force)
        return OwnerCheck(True, "not_applied", False, False,
                          "the owner was asked and reports it not applied")
    if isinstance(answer, Unknown):
        return _doubt(f"the owner could not say: {redact_text(answer.reason)}", asked=True,
                      answer="unknown", force=force)
    return _doubt(f"reconcile returned {type(answer).__name__}, not Applied, NotApplied or"
                  " Unknown", asked=True, answer="unknown", force=force)


def _doubt(reason: str, *, asked: bool, answer: str | None, force: bool,
           not_asked: str | None = None) -> OwnerCheck:
    if force:
        return OwnerCheck(asked, answer, False, True,
                          f"{reason}; sent again all the same: the person forced it",
                          not_asked=not_asked)
    return OwnerCheck(asked, answer, True, False,
                      f"{reason}; to send it again under the same key regardless, resolve"
                      " again with force=True (CLI: --force), or mark it --applied or"
                      " --abandon", not_asked=not_asked)


@dataclass(frozen=True, slots=True)
class Settled:
    """A resolution as it was applied: the run as it now stands, the decision recorded (with
    its owner check), and the effect key a "not applied" operation is sent again under."""

    run: RunRecord
    decision: Resolution
    effect_key: str | None = None


def resolve(store: Store, run_id: str, action: ResolutionAction | str, *, revision: int,
            by: str, operation_id: str | None = None, receipt: Any = None,
            evidence: str | None = None, force: bool = False) -> RunRecord:
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
    """
    require_store(store, "resolve")
    settled = settle(store, run_id, action, revision=revision, by=by,
                     operation_id=operation_id, receipt=receipt, evidence=evidence, force=force)
    check = settled.decision.owner_check
    if check is not None and check.get("not_asked") == NOT_IMPORTED:
        warnings.warn(check["note"], UserWarning, stacklevel=2)
    return settled.run


def settle(store: Store, run_id: str, action: ResolutionAction | str, *, revision: int,
           by: str, operation_id: str | None = None, receipt: Any = None,
           evidence: str | None = None, force: bool = False) -> Settled:
    """``resolve``, returning what the operator tools show: the decision as recorded (with the
    owner check) and the effect key it is sent again under."""
    chosen = one_action(action)
    check_run_id(run_id)
    if operation_id is not None:
        check_id(operation_id, "operation id")
    check_who(by, "resolves the run")
    if chosen is ResolutionAction.APPLIED:
        if receipt is None:
            raise UsageError("marking an operation applied needs its receipt as evidence: the"
                             " object the owner holds (e.g. the charge it returns by key)")
        require_json(receipt, "the receipt")
        refuse_secrets(receipt, "the receipt")
    elif receipt is not None:
        raise UsageError("only an operation marked applied takes a receipt")
    if not isinstance(force, bool):
        raise UsageError(f"force is True or False, not {force!r}")
    if force and chosen is not ResolutionAction.NOT_APPLIED:
        raise UsageError(f"force=True contradicts {chosen.value!r}: it only overrides the"
                         " owner's doubt about a not_applied resolution (and sends the effect"
                         " again regardless)")
    check_words(evidence, "the resolution's evidence")
    refuse_secrets([by, evidence], "the resolution")
    decision = Resolution(action=chosen, by=by, operation_id=operation_id, receipt=receipt,
                          evidence=evidence)
    if operation_id is None and chosen is not ResolutionAction.ABANDON:
        decision = _with_named_operation(store, run_id, revision, decision)
    key = None
    if chosen is ResolutionAction.NOT_APPLIED:
        decision, key = _checked_with_owner(store, run_id, revision, decision, force)
    return Settled(store.resolve(run_id, revision, decision), decision, key)


def one_action(action: Any) -> ResolutionAction:
    """The one resolution asked for: "applied", "not_applied" or "abandon" — never two at once,
    nor a guess."""
    try:
        return ResolutionAction(action)
    except (ValueError, TypeError):
        choices = ", ".join(repr(a.value) for a in ResolutionAction)
        raise UsageError(f"a resolution is exactly one of {choices}, not {action!r}: they"
                         " contradict each other", action=action) from None


def _checked_with_owner(store: Store, run_id: str, revision: int, decision: Resolution,
                        force: bool) -> tuple[Resolution, str | None]:
    """``decision`` (not applied) with what the effect's owner said; refused when the owner
    has the effect, or doubts and nobody forced it."""
    ledger = store.load_ledger(run_id)
    op = ledger.operations.get(decision.operation_id or "")
    key = None if op is None else op.effect_key
    if (op is None or ledger.run.status is not RunStatus.BLOCKED
            or ledger.run.state_revision != revision
            or op.state not in (EffectState.DISPATCHING, EffectState.UNKNOWN)):
        # The store refuses it as it stands — unless it repeats the resolution recorded, which
        # carries that one's owner check: asking again now would ask after the re-dispatch.
        return _as_recorded(store, run_id, decision), key
    if not key_is_minted(op, ledger.run, store.identity):
        # The owner knows the operation by the key minted: asked under another, it can only
        # say "not found", which must not stand as its word.
        raise ResolutionRefused(run_id, f"the owner was not asked: operation {op.operation_id!r}"
                                f" holds {op.effect_key!r}, which is not the key minted for"
                                " it (altered after it was recorded) — put the minted key back"
                                " (from a backup) and resolve again, or look it up at its owner"
                                " and mark it --applied or --abandon")
    found = lookup(op.effect)
    check = unasked(found, force=force)
    if check is None:
        effect = found.effect
        assert effect is not None
        answer = _ask(effect, EffectKey(op.effect_key, op.operation_id, run_id,
                                        ledger.run.fence))
        check = owner_says(answer, effect=effect, now=store.now(),
                           first_dispatched_at=op.first_dispatched_at, force=force)
    if check.refused:
        raise ResolutionRefused(run_id, check.note)
    return replace(decision, owner_check=check.detail()), key


def _ask(effect: Effect, key: EffectKey) -> Any:
    """The owner's answer to ``reconcile(key)``; a reconcile that raises answers Unknown."""
    assert effect.reconcile is not None
    try:
        answer = effect.reconcile(key)
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


def _with_named_operation(store: Store, run_id: str, revision: int,
                          decision: Resolution) -> Resolution:
    """The operation the recovery record names — or, once resolved, the one the last
    resolution named (so that repeating it stays harmless)."""
    run = store.get_run(run_id)
    operation_id = (run.recovery_record or {}).get("operation_id")
    if operation_id is None:
        resolved = [e for e in store.events(run_id) if e.kind == "run.resolved"]
        operation_id = resolved[-1].operation_id if resolved else None
    if operation_id is None:
        reason = ("its recovery record names no operation; name one"
                  if run.status is RunStatus.BLOCKED else refusal(run, revision, decision))
        raise ResolutionRefused(run_id, reason)
    return replace(decision, operation_id=operation_id)
