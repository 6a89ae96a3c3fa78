"""Recovery records: what a blocked run tells the person who must decide what happens next.

A record routes the next action: a stable operation, the retained payload, explicit uncertainty,
and a phase that forbids blind re-dispatch. Its ``state_revision`` is filled in by the store, in
the statement that blocks the run, so it always names the revision the block created.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..types import (
    ApprovalRecord,
    OperationRecord,
    Resolution,
    RunRecord,
    RunStatus,
    UnreadableRun,
)
from .effects import Applied, Declared, Effect, NotApplied, Unknown
from .limits import OPTIONS, Stop, limits_ref
from .secrets import redact_json, redact_text

if TYPE_CHECKING:
    pass

RECORD_SCHEMA_VERSION = 1
# The phase of a run blocked on a transaction step whose function ended the step's transaction.
UNCERTAIN_PHASE = "transaction_uncertain"


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
    UNCERTAIN_PHASE: [
        "the step's function (or a library it handed the driver's connection to) committed or"
        " rolled back the step's transaction itself: some or all of its writes may be in the"
        " database without the step, and the step is not run again until you say",
        "look for its writes; if they are there: safepoint resolve RUN --applied --receipt"
        " '<the value the step returns>' --revision <state_revision> --by <you> --evidence"
        " '<how you know>' (the run carries on with that value; the function is not called"
        " again)",
        "if none is (or you removed them): safepoint resolve RUN --not-applied --revision"
        " <state_revision> --by <you> (the step runs again, from nothing)",
        "fix the function before it runs again: it must not end the step's transaction — return"
        " to commit, raise to roll back; hand a library the connection only if it leaves the"
        " transaction to its caller",
        "or give the run up: safepoint resolve RUN --abandon --revision <state_revision> --by <you>",
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
        "read the store's refusal in the evidence; fix the data or code that caused it, then resume",
    ],
    "history_limit": [
        "the run's history (its events and steps) reached its hard limit: it records nothing new",
        "have the workflow carry its state into a successor before the limit: call"
        " run.continue_as_new(state) at a deterministic point (every N iterations, say);"
        " deploy that under the same workflow version, then resume RUN — it replays to that"
        " point and continues as new (effects with an explicit operation_id are not sent"
        " again)",
        "or give the run up: safepoint resolve RUN --abandon --revision <state_revision> --by <you>",
    ],
    "limit_reached": [
        "the run stopped at a limit a person may raise; nothing of it is lost, and no step or"
        " effect done is done again when it goes on",
        "raise it: safepoint limits RUN <option> <more> --by <you> [--reason '<why>']"
        " (or safepoint.extend_limits); a worker then carries the run on, or: safepoint resume RUN",
        "or give the run up: safepoint cancel RUN --by <you>",
    ],
    "forked_effect": [
        "this run is a fork, and its code asks for an operation that the run it was forked from"
        " sent (see the reason): a fork never sends it again under a key of its own unless told",
        "to send it as the fork's own: fork that run again from the same step with --resend"
        " <operation_id> (sp.fork(..., resend=[...])), and run the new fork; give this one up:"
        " safepoint resolve RUN --abandon --revision <state_revision> --by <you>",
        "if that run holds it unsettled: settle it there first, then resume RUN — the fork takes"
        " the outcome settled there",
        "or deploy code that asks for it with the payload that run sent, then resume RUN",
    ],
    "continue_as_new": [
        "the successor's run id is taken by another run: rename or remove that run, then"
        " resume RUN; or give the run up: safepoint resolve RUN --abandon --revision"
        " <state_revision> --by <you>",
    ],
}


def build_record(
    run: RunRecord | UnreadableRun,
    *,
    phase: str,
    reason: str,
    step_id: str | None = None,
    op: OperationRecord | None = None,
    evidence: dict[str, Any] | None = None,
    authorization: ApprovalRecord | None = None,
    stop: Stop | None = None,
) -> dict[str, Any]:
    """The recovery record of DESIGN §4 as a JSON-ready dict. ``authorization`` is the approval
    under which ``op`` was dispatched (``op.approval_id``), named by ``authorization_ref``. A run
    whose row cannot be read (``UnreadableRun``) gets what of it can be read ("?" for a name
    that cannot, no limits). A run stopped at a limit (phase ``limit_reached``) names it:
    ``stop`` gives ``limit``, ``allowed``, ``spent`` and the ``step_id`` it stopped before."""
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
            evidence.setdefault(
                "authorization",
                {
                    "approval_id": authorization.approval_id,
                    "by": authorization.approved_by,
                    "payload_digest": authorization.payload_digest,
                    "target_digest": authorization.target_digest,
                    "approved_at": authorization.approved_at,
                    "expires_at": authorization.expires_at,
                },
            )
    return {
        "schema_version": RECORD_SCHEMA_VERSION,
        "task_id": run.run_id,
        "workflow": run.workflow or "?",
        "workflow_version": f"{run.workflow or '?'}@{run.workflow_version or '?'}",
        "state_revision": None,  # set by the store when it commits the block
        "phase": phase,
        "reason": reason,
        "step_id": (stop.step_id if stop else step_id) if op is None else op.step_id,
        "limit": stop.limit if stop else None,
        "allowed": stop.allowed if stop else None,
        "spent": stop.spent if stop else None,
        "operation_id": op.operation_id if op else None,
        "effect": op.effect if op else None,
        "effect_key": op.effect_key if op else None,
        "payload_ref": op.payload_ref if op else None,
        "effect_status": op.state.value if op else None,
        "dispatch_count": op.dispatch_count if op else None,
        "first_dispatched_at": op.first_dispatched_at if op else None,
        "receipt_ref": (
            f"operation:{op.run_id}/{op.operation_id}/receipt" if op and op.receipt is not None else None
        ),
        "authorization_ref": authorization_ref,
        "limits_ref": limits_ref(run) if isinstance(run, RunRecord) else None,
        "evidence_refs": ([f"operation:{op.run_id}/{op.operation_id}"] if op else [])
        + ([authorization_ref] if authorization_ref else []),
        "evidence": evidence,
        "next_actions": _next_actions(phase, stop),
    }


def _next_actions(phase: str, stop: Stop | None) -> list[str]:
    """What a person can do: the phase's actions, a stop's naming the option that raises it."""
    actions = _NEXT_ACTIONS.get(phase, [])
    if stop is None or stop.limit not in OPTIONS:
        return actions
    more = "<a later moment: ISO or +30m>" if stop.limit == "deadline" else f"<more than {stop.spent:g}>"
    return [action.replace("<option> <more>", f"{OPTIONS[stop.limit]} {more}") for action in actions]


def refusal(run: RunRecord, expected_revision: int, resolution: Resolution) -> str:
    """Why a resolution could not be applied to ``run`` as it now stands."""
    if run.status is not RunStatus.BLOCKED:
        return f"the run is {run.status.value}, not blocked"
    if run.state_revision != expected_revision:
        return (
            f"the run moved on: it is at revision {run.state_revision}, the record you"
            f" resolved was at revision {expected_revision}"
        )
    if resolution.step_id is not None:
        return f"transaction step {resolution.step_id!r} is not recorded as uncertain in this run"
    return (
        f"operation {resolution.operation_id!r} is not uncertain (dispatching, unknown or"
        " applied) in this run"
    )


@dataclass(frozen=True, slots=True)
class OwnerCheck:
    """What the effect's owner said before a person's "not applied" sends an effect again."""

    asked: bool  # its reconcile was called
    answer: str | None  # "applied", "not_applied", "unknown"; None when not asked
    refused: bool  # the resolution must not go ahead
    forced: bool  # it goes ahead only because the person overrode a doubt
    note: str  # what the person is told, and what is recorded
    receipt: Any = None  # "applied": what the owner holds
    not_asked: str | None = None  # why not: NOT_IMPORTED, AMBIGUOUS or NO_RECONCILE

    def detail(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "answer": self.answer,
            "forced": self.forced,
            "not_asked": self.not_asked,
            "note": self.note,
        }


# Why an owner was not asked.
NOT_IMPORTED = "not_imported"  # the effect's code is not imported in the resolving process
AMBIGUOUS = "ambiguous"  # effects of that name with different reconcile functions
NO_RECONCILE = "no_reconcile"  # the effect has no way to ask its owner


def unasked(found: Declared, *, force: bool) -> OwnerCheck | None:
    """Why the owner of ``found`` cannot be asked; None when it can (it has a reconcile)."""
    name = found.name
    if not found.known:
        return OwnerCheck(
            False,
            None,
            False,
            False,
            f"the owner was not asked: effect {name!r} is not declared in this"
            " process (its code is not imported: resolve with --import MODULE,"
            " or call sp.resolve where the application is imported)",
            not_asked=NOT_IMPORTED,
        )
    if found.ambiguous:
        doubt = (
            f"the owner was not asked: effects named {name!r} with different reconcile"
            f" functions are declared in this process ({'; '.join(found.origins)}), so"
            " which owner holds the operation is unknown; give each effect a name of its"
            " own"
        )
        return _doubt(doubt, asked=False, answer=None, force=force, not_asked=AMBIGUOUS)
    assert found.effect is not None
    if found.effect.reconcile is None:
        return OwnerCheck(
            False,
            None,
            False,
            False,
            f"the owner was not asked: effect {name!r} has no reconcile function",
            not_asked=NO_RECONCILE,
        )
    return None


def owner_says(
    answer: Any, *, effect: Effect, now: int, first_dispatched_at: int | None, force: bool
) -> OwnerCheck:
    """What the owner's answer to ``reconcile(key)`` allows a person's "not applied" to do.

    ``Applied`` refuses it, whatever ``force`` says: the owner holds the effect, and sending it
    again would apply it twice. ``NotApplied`` lets it go ahead — unless the first dispatch was
    longer ago than the owner remembers keys, when "not found" may mean "forgotten". Anything
    else is doubt, which refuses it unless the person overrides it (``force``)."""
    if isinstance(answer, Applied):
        receipt = redact_json(answer.receipt)
        shown = json.dumps(receipt, ensure_ascii=False, separators=(",", ":"), default=str)
        return OwnerCheck(
            True,
            "applied",
            True,
            False,
            f"the owner has it: {effect.name!r} reconcile reports the operation"
            f" applied, with receipt {shown}; it must not be sent again — mark"
            f" it applied instead: --applied --receipt {shlex.quote(shown)}",
            receipt,
        )
    if isinstance(answer, NotApplied):
        retention = effect.dedup_retention
        if (
            retention is not None
            and first_dispatched_at is not None
            and now - first_dispatched_at >= retention.total_seconds() * 1000
        ):
            return _doubt(
                f"the owner reports it not applied, but the first dispatch was"
                f" {(now - first_dispatched_at) / 1000:.0f}s ago, past the owner's"
                f" dedup retention of {retention}: it may have forgotten the key",
                asked=True,
                answer="not_applied",
                force=force,
            )
        return OwnerCheck(True, "not_applied", False, False, "the owner was asked and reports it not applied")
    if isinstance(answer, Unknown):
        return _doubt(
            f"the owner could not say: {redact_text(answer.reason)}",
            asked=True,
            answer="unknown",
            force=force,
        )
    return _doubt(
        f"reconcile returned {type(answer).__name__}, not Applied, NotApplied or Unknown",
        asked=True,
        answer="unknown",
        force=force,
    )


def _doubt(
    reason: str, *, asked: bool, answer: str | None, force: bool, not_asked: str | None = None
) -> OwnerCheck:
    if force:
        return OwnerCheck(
            asked,
            answer,
            False,
            True,
            f"{reason}; sent again all the same: the person forced it",
            not_asked=not_asked,
        )
    return OwnerCheck(
        asked,
        answer,
        True,
        False,
        f"{reason}; to send it again under the same key regardless, resolve"
        " again with force=True (CLI: --force), or mark it --applied or"
        " --abandon",
        not_asked=not_asked,
    )
