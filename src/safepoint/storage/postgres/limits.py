"""The PostgreSQL store's limits: a worker stopping its run at one, and a person changing them
— each under the run's row lock, in one transaction (the decisions are in
``safepoint._rules.limits``)."""

from __future__ import annotations

from typing import Any

from ..._rules.fencing import fence_holds
from ..._rules.limits import limits_extended_detail, recorded_limits
from ...errors import LostOwnership
from ...types import Claim, LimitChange, RunLimits, RunRecord, RunStatus
from ..plans import Plan
from .connection import QUERIES as _q
from .runs import PostgresRuns


class PostgresLimits(PostgresRuns):
    """Runs stopped at a limit, and limits raised."""

    def stop_run(
        self, claim: Claim, seen: RunLimits, *, error: dict[str, Any], recovery_record: dict[str, Any]
    ) -> Plan[bool]:
        rows = yield _q("stop_run_limits", run_id=claim.run_id)  # the row lock, held to the end
        if not rows or not fence_holds(claim, rows[0]["fence"], rows[0]["status"]):
            raise LostOwnership(claim.run_id, claim.fence)
        if recorded_limits(rows[0]) != seen:
            return False  # a person changed them since the worker read them
        detail = {k: recovery_record.get(k) for k in ("limit", "allowed", "spent", "step_id")}
        yield from self.finish_run(
            claim,
            RunStatus.STOPPED,
            result=None,
            error=error,
            recovery_record=recovery_record,
            detail={"type": error.get("type"), **detail},
        )
        return True

    def extend_limits(
        self, run_id: str, expected_revision: int, change: LimitChange
    ) -> Plan[RunRecord | None]:
        # the row locked until the change commits; RunNotFound, or CorruptRecord: nothing changes
        run = yield from self.run_record((yield from self.run_row(run_id, "lock_run")))
        if run.state_revision != expected_revision or run.status.terminal:
            return None
        new = change.new
        yield _q(
            "extend_limits",
            run_id=run_id,
            expected_revision=expected_revision,
            tokens=new.tokens,
            cost=new.cost,
            model_calls=new.model_calls,
            deadline=new.deadline,
            step_attempts=new.step_attempts,
            resume_budget=new.resume_budget,
            by=change.by,
            **(
                yield from self._event_params(
                    limits_extended_detail(change, run.status), run_id, "run.limits_extended"
                )
            ),
        )
        if run.status is RunStatus.STOPPED:  # pending again: wake a waiting worker
            yield from self.wake_workers(run.workflow)
        return (yield from self.get_run(run_id))
