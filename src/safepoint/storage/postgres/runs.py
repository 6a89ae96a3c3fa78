"""The PostgreSQL store's runs: created, claimed, and ended — finished by their worker,
released, cancelled, or settled by a person. (Reading them is every store's: ``LedgerReads``.)"""

from __future__ import annotations

from typing import Any

from ..._rules.canonical import dumps
from ..._rules.fencing import abandoned_error, cancelled_error
from ..._rules.recovery import refusal
from ...errors import ResolutionRefused
from ...types import JSON, Claim, EffectState, Resolution, ResolutionAction, RunRecord, RunStatus
from ..base import NewRun, retry_json
from ..codec import seal_record
from ..ledger import event_json, json_or_none, stored
from ..plans import Plan
from .connection import CLAIM_CANDIDATES, PostgresBase, _claim
from .connection import QUERIES as _q


class PostgresRuns(PostgresBase):
    """The PostgreSQL store's runs: created, claimed, and ended — finished by their worker,."""

    def create_run(self, new: NewRun) -> Plan[tuple[RunRecord, Claim | None]]:
        inputs, inputs_ref = yield from self._put_value(new.inputs, "safepoint_runs", "inputs", new.run_id)
        created = yield _q(
            "create_run",
            run_id=new.run_id,
            workflow=new.workflow,
            workflow_version=new.workflow_version,
            input_hash=new.input_hash,
            inputs=inputs,
            inputs_ref=inputs_ref,
            owner=new.owner,
            lease_ms=new.lease_ms,
            resume_budget=new.resume_budget,
            workflow_fingerprint=new.workflow_fingerprint,
            workflow_manifest=json_or_none(new.workflow_manifest),
            deadline_at=new.deadline_at,
            deadline_ms=new.deadline_ms,
            token_budget=new.token_budget,
            model_call_budget=new.model_call_budget,
            step_attempt_limit=new.step_attempt_limit,
            cost_budget=new.cost_budget,
            step_attempts=retry_json(new.step_attempts),
            history_soft_limit=new.history_soft_limit,
            history_hard_limit=new.history_hard_limit,
            detail=dumps({"workflow": new.workflow, "version": new.workflow_version}),
        )
        if created:
            row = created[0]
            if new.owner is None:
                yield from self.wake_workers(new.workflow)
        else:
            row = yield from self.run_row(new.run_id)
        run = yield from self.run_record(row)
        if not created or new.owner is None:
            return run, None
        return run, Claim(
            run.run_id, new.owner, run.fence, run.state_revision, int(row["lease_expires_at"]), new.lease_ms
        )

    def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Plan[Claim | None]:
        rows = yield _q(
            "claim_run",
            run_id=run_id,
            expected_revision=expected_revision,
            owner=owner,
            lease_ms=lease_ms,
            dead_owner=dead_owner,
            detail=dumps({"took_over_from": dead_owner}) if dead_owner else None,
        )
        return _claim(rows[0], owner, lease_ms) if rows else None

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Plan[Claim | None]:
        if self.claim == "per_run":
            return (yield from self._claim_per_run(owner, lease_ms, workflows))
        rows = yield _q("claim_next", owner=owner, lease_ms=lease_ms, workflows=list(workflows))
        return _claim(rows[0], owner, lease_ms) if rows else None

    @staticmethod
    def _claim_per_run(owner: str, lease_ms: int, workflows: list[str]) -> Plan[Claim | None]:
        """claim_next in statements that each touch one run, or read without a lock: what a
        database sharded by run_id runs. The oldest candidates are tried in order; one taken
        meanwhile by another worker is passed over, as SKIP LOCKED passes it over."""
        after: dict[str, Any] = {"after_created": None, "after_run_id": None}
        while True:
            candidates = yield _q(
                "claim_candidates", workflows=list(workflows), limit=CLAIM_CANDIDATES, **after
            )
            for candidate in candidates:
                rows = yield _q(
                    "claim_candidate",
                    run_id=candidate["run_id"],
                    owner=owner,
                    lease_ms=lease_ms,
                    workflows=list(workflows),
                )
                if rows:
                    return _claim(rows[0], owner, lease_ms)
            if len(candidates) < CLAIM_CANDIDATES:
                return None  # every runnable run was tried: taken by others, or none is left
            last = candidates[-1]
            after = {"after_created": last["created_at"], "after_run_id": last["run_id"]}

    def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> Plan[RunRecord]:
        # the statement decides which event it is (cancelled at once, or asked): sealed, the
        # detail is sealed for each, with the one id taken for it
        detail = {"by": by, "reason": reason}
        event = yield from self._event_params(detail, run_id, "run.cancel_requested")
        cancelled = event_json(self.codec, detail, run_id, "run.cancelled", event["event_id"])
        rows = yield _q(
            "request_cancel",
            run_id=run_id,
            by=by,
            **event,
            cancelled_detail=cancelled,
            error=self._sealed(cancelled_error(by, reason), "safepoint_runs", "error", run_id),
        )
        if rows and rows[0]["status"] == RunStatus.PENDING.value:  # to settle: wake a worker
            yield from self.wake_workers(rows[0]["workflow"])
        return (yield from self.get_run(run_id))

    def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
        detail: dict[str, Any] | None = None,
    ) -> Plan[None]:
        """(``detail``: the event's, when not the error or the recovery record's phase.)"""
        record = None
        if recovery_record is not None:  # the statement puts in the revision it creates
            kept = {k: v for k, v in recovery_record.items() if k != "state_revision"}
            record = dumps(kept if self.codec is None else seal_record(self.codec, kept, claim.run_id))
        detail = detail or error or ({"phase": recovery_record.get("phase")} if recovery_record else None)
        result_text, result_ref = yield from self._put_value(result, "safepoint_runs", "result", claim.run_id)
        yield from self._fenced(
            claim,
            "finish_run",
            status=status.value,
            result=result_text,
            result_ref=result_ref,
            error=self._sealed(error, "safepoint_runs", "error", claim.run_id),
            recovery_record=record,
            event_kind=f"run.{status.value}",
            **(yield from self._event_params(detail, claim.run_id, f"run.{status.value}")),
        )

    def release_run(self, claim: Claim) -> Plan[None]:
        rows = yield _q("release_run", run_id=claim.run_id, fence=claim.fence)
        if rows:  # the run is claimable again: wake a waiting worker (a stale release: no-op)
            yield from self.wake_workers(rows[0]["workflow"])

    def _resolve_transaction(
        self, run_id: str, resolution: Resolution, common: dict[str, Any]
    ) -> Plan[list[Any]]:
        """A person's decision on a transaction step recorded as uncertain: recorded completed
        with the value they gave (applied; a large one as an artifact first), or its record
        gone (not applied: it runs again)."""
        applied = resolution.action is ResolutionAction.APPLIED
        result = result_ref = None
        if applied:
            result, result_ref, data = stored(
                resolution.receipt,
                self.inline_limit,
                self.codec,
                "safepoint_steps",
                "result",
                run_id,
                resolution.step_id,
            )
            if result_ref is not None and data is not None:
                yield _q("insert_artifact", run_id=run_id, digest=result_ref, size=len(data), content=data)
        rows: list[Any] = yield _q(
            "resolve_transaction_step",
            **common,
            step_id=resolution.step_id,
            applied=applied,
            result=result,
            result_ref=result_ref,
        )
        return rows

    def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> Plan[RunRecord]:
        common = {
            "run_id": run_id,
            "expected_revision": expected_revision,
            "operation_id": resolution.operation_id,
            "by": resolution.by,
            **(yield from self._event_params(resolution.detail(), run_id, "run.resolved")),
        }
        if resolution.action is ResolutionAction.ABANDON:
            error = self._sealed(abandoned_error(resolution), "safepoint_runs", "error", run_id)
            rows = yield _q("resolve_abandon", **common, error=error)
        elif resolution.step_id is not None:
            rows = yield from self._resolve_transaction(run_id, resolution, common)
            if rows:  # released: wake a waiting worker
                yield from self.wake_workers(rows[0]["workflow"])
        else:
            rows = yield _q(
                "resolve",
                **common,
                to_state=(
                    EffectState.ACCEPTED
                    if resolution.action is ResolutionAction.APPLIED
                    else EffectState.PREPARED
                ).value,
                receipt=self._sealed(
                    resolution.receipt, "safepoint_operations", "receipt", run_id, resolution.operation_id
                ),
            )
            if rows:  # released: wake a waiting worker
                yield from self.wake_workers(rows[0]["workflow"])
        run = yield from self.get_run(run_id)
        # the same decision twice is harmless; anything else is refused
        if not rows and not (yield from self.resolved_already(run_id, resolution)):
            raise ResolutionRefused(run_id, refusal(run, expected_revision, resolution))
        return run
