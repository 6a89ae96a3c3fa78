"""Recovery records: what a blocked run tells the person who must decide what happens next.

A record routes the next action: a stable operation, the retained payload, explicit uncertainty,
and a phase that forbids blind re-dispatch. Its ``state_revision`` is filled in by the store, in
the statement that blocks the run, so it always names the revision the block created.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ._canonical import require_json
from ._limits import limits_ref
from ._secrets import redact, redact_json, refuse_secrets
from .errors import ResolutionRefused, UsageError
from .types import (
    ApprovalRecord,
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
        " --by <you> (it is then dispatched again, under the same key)",
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
    # Reasons quote what reconcile and verifiers said, which may quote credentials.
    reason, evidence = redact(reason), redact_json(evidence)
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


def resolve(store: Store, run_id: str, action: ResolutionAction | str, *, revision: int,
            by: str, operation_id: str | None = None, receipt: Any = None,
            evidence: str | None = None) -> RunRecord:
    """Apply a person's decision to a blocked run and return the run as it now stands.

    ``applied``: the operation happened; ``receipt`` is what its owner holds, and the run
    carries on from it. ``not_applied``: it did not; the run dispatches it again under the same
    key. ``abandon``: the run ends, cancelled. ``revision`` is the state revision of the
    recovery record the decision was made on: if the run moved since, the decision is refused.
    Repeating a resolution that was applied is harmless: it returns the run unchanged.
    """
    chosen = ResolutionAction(action)
    if not by or not isinstance(by, str):
        raise UsageError("say who resolves the run: by='name'")
    if chosen is ResolutionAction.APPLIED:
        if receipt is None:
            raise UsageError("marking an operation applied needs its receipt as evidence: the"
                             " object the owner holds (e.g. the charge it returns by key)")
        require_json(receipt, "the receipt")
        refuse_secrets(receipt, "the receipt")
    elif receipt is not None:
        raise UsageError("only an operation marked applied takes a receipt")
    refuse_secrets([by, evidence], "the resolution")
    decision = Resolution(action=chosen, by=by, operation_id=operation_id, receipt=receipt,
                          evidence=evidence)
    if operation_id is None and chosen is not ResolutionAction.ABANDON:
        decision = _with_named_operation(store, run_id, revision, decision)
    return store.resolve(run_id, revision, decision)


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
