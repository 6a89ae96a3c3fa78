"""Recovery records: what a blocked run tells the person who must decide what happens next.

A record routes the next action: a stable operation, the retained payload, explicit uncertainty,
and a phase that forbids blind re-dispatch. Its ``state_revision`` is filled in by the store, in
the statement that blocks the run, so it always names the revision the block created.
"""

from __future__ import annotations

from typing import Any

from .types import OperationRecord, RunRecord

RECORD_SCHEMA_VERSION = 1

# What a person can do about each phase; shown by the CLI beside the record.
_NEXT_ACTIONS: dict[str, list[str]] = {
    "reconcile_effect": [
        "look the operation up at its owner by effect_key",
        "if it happened: resolve the run as applied, with the owner's receipt as evidence",
        "if it did not: resolve the run as not applied; it is then dispatched with the same key",
        "or resume later, when the owner can answer",
    ],
    "verify_effect": [
        "inspect the receipt at the owner; resolve as applied if it is right, or abandon",
    ],
    "stale_checkpoint": [
        "revert the code or input change that moved this step's inputs, then resume",
        "or start a new run for the new inputs",
    ],
    "incompatible_workflow": [
        "deploy the recorded workflow version to finish this run, or start a new run",
    ],
    "unreadable_record": [
        "restore the named row or artifact from a backup, then resume",
    ],
    "store_refused": [
        "read the store's refusal in the evidence; fix the data or code that caused it,"
        " then resume",
    ],
}


def build_record(run: RunRecord, *, phase: str, reason: str, step_id: str | None = None,
                 op: OperationRecord | None = None,
                 evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """The recovery record of DESIGN §4 as a JSON-ready dict."""
    evidence = dict(evidence or {})
    if op is not None and op.error is not None:
        evidence.setdefault("last_error", op.error)
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "task_id": run.run_id,
        "workflow": run.workflow,
        "workflow_version": f"{run.workflow}@{run.workflow_version}",
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
        "authorization_ref": None,
        "limits_ref": None,
        "evidence_refs": [f"operation:{op.run_id}/{op.operation_id}"] if op else [],
        "evidence": evidence,
        "next_actions": _NEXT_ACTIONS.get(phase, []),
    }
