"""The SQLite store's history: re-planning a run (its stale tail moved into the events),
continuing it as new, and a chain's settled operations."""

from __future__ import annotations

from ..._rules.canonical import dumps
from ..._rules.history import warn
from ..._rules.kinds import KEPT_ON_REPLAN
from ...errors import RunConflict
from ...types import Claim, RunRecord
from ..base import NewRun, Replan
from ..ledger import json_or_none
from ..resealing import bind_abandoned
from .connection import SQL
from .runs import SqliteRuns


class SqliteHistory(SqliteRuns):
    """What a run's history becomes: re-planned, or continued by a successor."""

    def replan(self, claim: Claim, change: Replan) -> None:
        now = self.now()
        common = {"run_id": claim.run_id, "fence": claim.fence, "now": now}
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=1, new_work=True)
            self._event(
                conn,
                claim.run_id,
                now,
                "run.replanned",
                step_id=change.step_id,
                fence=claim.fence,
                worker=claim.owner,
                detail=change.detail(),
            )
            if change.workflow_version is not None:
                conn.execute(
                    SQL["replan_adopt_workflow"],
                    {
                        **common,
                        "workflow_version": change.workflow_version,
                        "workflow_fingerprint": change.workflow_fingerprint,
                        "workflow_manifest": json_or_none(change.workflow_manifest),
                    },
                )
            if change.step_id is not None:
                params = {
                    **common,
                    "step_id": change.step_id,
                    "worker": claim.owner,
                    "through_seq": change.through_seq,
                    "reason": change.reason,
                    "keep": dumps(list(change.keep)),
                    "kept": dumps(KEPT_ON_REPLAN),
                }
                moved = conn.execute(SQL["replan_abandon_steps"], params).fetchall()
                if self.codec is not None:  # the steps' sealed values, bound to their events
                    for event_id, detail in bind_abandoned(self.codec, moved):
                        conn.execute(SQL["reseal_events_update"], {"event_id": event_id, "detail": detail})
                deleted = conn.execute(SQL["replan_delete_abandoned_steps"], params).rowcount
                conn.execute(
                    SQL["replan_count_events"],
                    {"run_id": claim.run_id, "events": len(moved), "steps": deleted},
                )
        warn(due)

    def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]:
        now = self.now()
        with self._write() as conn:
            ended = conn.execute(
                SQL["continue_as_new"],
                {
                    "run_id": claim.run_id,
                    "fence": claim.fence,
                    "successor_run_id": successor.run_id,
                    "now": now,
                },
            ).fetchone()
            if ended is None:
                raise self._refused(conn, claim, now)
            self._event(
                conn,
                claim.run_id,
                now,
                "run.continued",
                fence=claim.fence,
                worker=claim.owner,
                detail={"successor": successor.run_id},
            )
            if not self._insert_run(conn, successor, now, parent=ended):
                # Never our own successor: the run would have ended continued with it. Raising
                # rolls the whole continue back.
                raise RunConflict(successor.run_id, f"and does not continue run {claim.run_id!r}")
        return self._created(successor, True, now)
