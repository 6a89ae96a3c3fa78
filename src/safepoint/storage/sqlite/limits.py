"""The SQLite store's limits: a worker stopping its run at one, and a person changing them —
each checked against the run as it stands, in one transaction (the decisions are in
``safepoint._rules.limits``)."""

from __future__ import annotations

from typing import Any

from ..._rules.fencing import fence_holds
from ..._rules.limits import limits_extended_detail, recorded_limits
from ...errors import LostOwnership
from ...types import Claim, LimitChange, RunLimits, RunRecord, RunStatus
from .connection import SQL
from .runs import SqliteRuns


class SqliteLimits(SqliteRuns):
    """Runs stopped at a limit, and limits raised."""

    def stop_run(
        self, claim: Claim, seen: RunLimits, *, error: dict[str, Any], recovery_record: dict[str, Any]
    ) -> bool:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(SQL["stop_run_limits"], {"run_id": claim.run_id}).fetchone()
            if row is None or not fence_holds(claim, row["fence"], row["status"]):
                raise LostOwnership(claim.run_id, claim.fence)
            if recorded_limits(row) != seen:
                return False  # a person changed them since the worker read them
            detail = {k: recovery_record.get(k) for k in ("limit", "allowed", "spent", "step_id")}
            self._finish(
                conn,
                claim,
                RunStatus.STOPPED,
                now,
                error=error,
                recovery_record=recovery_record,
                detail={"type": error.get("type"), **detail},
            )
        return True

    def extend_limits(self, run_id: str, expected_revision: int, change: LimitChange) -> RunRecord | None:
        now = self.now()
        with self._write() as conn:
            run = self._read_back(run_id)  # RunNotFound, or CorruptRecord: nothing is changed
            if run.state_revision != expected_revision or run.status.terminal:
                return None
            new = change.new
            conn.execute(
                SQL["extend_limits"],
                {
                    "run_id": run_id,
                    "expected_revision": expected_revision,
                    "tokens": new.tokens,
                    "cost": new.cost,
                    "model_calls": new.model_calls,
                    "deadline": new.deadline,
                    "step_attempts": new.step_attempts,
                    "resume_budget": new.resume_budget,
                    "now": now,
                },
            )
            self._event(
                conn,
                run_id,
                now,
                "run.limits_extended",
                worker=change.by,
                detail=limits_extended_detail(change, run.status),
            )
            return self._read_back(run_id)
