"""The PostgreSQL store's history: re-planning a run, and continuing it as new (the run
ended and its successor created in one statement)."""

from __future__ import annotations

from ..._rules.canonical import dumps
from ..._rules.kinds import KEPT_ON_REPLAN
from ...errors import RunConflict
from ...types import Claim, RunRecord
from ..base import NewRun, Replan, retry_json
from ..ledger import json_or_none
from ..plans import Plan
from ..resealing import bind_abandoned
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresHistory(PostgresBase):
    """The PostgreSQL store's history: re-planning a run, and continuing it as new (the run."""

    def replan(self, claim: Claim, change: Replan) -> Plan[None]:
        yield from self._fenced(
            claim,
            "replan",
            workflow_version=change.workflow_version,
            workflow_fingerprint=change.workflow_fingerprint,
            workflow_manifest=json_or_none(change.workflow_manifest),
            step_id=change.step_id,
            operation_id=None,
            detail=dumps(change.detail()),
        )
        if change.step_id is not None:
            moved = yield _q(
                "replan_abandon_steps",
                run_id=claim.run_id,
                step_id=change.step_id,
                through_seq=change.through_seq,
                fence=claim.fence,
                worker=claim.owner,
                reason=change.reason,
                keep=list(change.keep),
                kept=KEPT_ON_REPLAN,
            )
            if self.codec is not None:  # the steps' sealed values, bound to their events
                for event_id, detail in bind_abandoned(self.codec, moved):
                    yield _q("reseal_events_update", event_id=event_id, detail=detail)

    def continue_as_new(self, claim: Claim, successor: NewRun) -> Plan[tuple[RunRecord, Claim | None]]:
        inputs, inputs_ref = yield from self._put_value(
            successor.inputs, "safepoint_runs", "inputs", successor.run_id
        )
        row = yield from self._fenced(
            claim,
            "continue_as_new",
            successor_run_id=successor.run_id,
            workflow=successor.workflow,
            workflow_version=successor.workflow_version,
            input_hash=successor.input_hash,
            inputs=inputs,
            inputs_ref=inputs_ref,
            owner=successor.owner,
            successor_lease_ms=successor.lease_ms,
            resume_budget=successor.resume_budget,
            history_soft_limit=successor.history_soft_limit,
            history_hard_limit=successor.history_hard_limit,
            workflow_fingerprint=successor.workflow_fingerprint,
            workflow_manifest=json_or_none(successor.workflow_manifest),
            deadline_at=successor.deadline_at,
            deadline_ms=successor.deadline_ms,
            token_budget=successor.token_budget,
            model_call_budget=successor.model_call_budget,
            step_attempt_limit=successor.step_attempt_limit,
            cost_budget=successor.cost_budget,
            step_attempts=retry_json(successor.step_attempts),
            parent_detail=dumps({"successor": successor.run_id}),
            detail=dumps(
                {
                    "workflow": successor.workflow,
                    "version": successor.workflow_version,
                    "continues": claim.run_id,
                }
            ),
        )
        if row["successor"] is None:
            # Never our own successor: the run would have ended continued with it. Raising
            # rolls the whole statement back.
            raise RunConflict(successor.run_id, f"and does not continue run {claim.run_id!r}")
        run = yield from self.get_run(successor.run_id)
        if successor.owner is None:  # left for any worker: wake one
            yield from self.wake_workers(successor.workflow)
            return run, None
        return run, Claim(
            run.run_id,
            successor.owner,
            run.fence,
            run.state_revision,
            int(row["lease_expires_at"]),
            successor.lease_ms,
        )
