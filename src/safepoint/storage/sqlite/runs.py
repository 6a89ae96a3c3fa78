"""The SQLite store's runs: creating, reading and claiming them, waiting for work, and their
ends — finished by their worker, released, cancelled, or settled by a person."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

from ..._rules.canonical import dumps
from ..._rules.fencing import abandoned_error, cancelled_error
from ..._rules.recovery import refusal
from ...errors import LostOwnership, ResolutionRefused
from ...types import (
    JSON,
    Claim,
    EffectState,
    Resolution,
    ResolutionAction,
    RunRecord,
    RunStatus,
)
from ..base import NewRun, retry_json
from ..codec import seal_record
from ..ledger import json_or_none
from .connection import SQL, SqliteConnection


class SqliteRuns(SqliteConnection):
    """Runs, from their creation to their end."""

    def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        now = self.now()
        with self._write() as conn:
            created = self._insert_run(conn, new, now)
        return self._created(new, created, now)

    def _insert_run(
        self, conn: sqlite3.Connection, new: NewRun, now: int, *, parent: Mapping[str, Any] | None = None
    ) -> bool:
        """Insert ``new`` with its first event — a successor of ``parent`` (its chain's row,
        continue as new) or a chain of its own; False when the run id exists."""
        claimed = new.owner is not None
        fence = 1 if claimed else 0
        inputs, inputs_ref = self._put_value(conn, new.inputs, now, "safepoint_runs", "inputs", new.run_id)
        cursor = conn.execute(
            SQL["create_run"],
            {
                "run_id": new.run_id,
                "workflow": new.workflow,
                "workflow_version": new.workflow_version,
                "status": (RunStatus.RUNNING if claimed else RunStatus.PENDING).value,
                "input_hash": new.input_hash,
                "inputs": inputs,
                "inputs_ref": inputs_ref,
                "owner": new.owner,
                "lease_expires_at": now + new.lease_ms if claimed else None,
                "fence": fence,
                "resume_budget": new.resume_budget,
                "workflow_fingerprint": new.workflow_fingerprint,
                "workflow_manifest": json_or_none(new.workflow_manifest),
                "deadline_at": new.deadline_at,
                "deadline_ms": new.deadline_ms,
                "token_budget": new.token_budget,
                "cost_budget": new.cost_budget,
                "model_call_budget": new.model_call_budget,
                "step_attempt_limit": new.step_attempt_limit,
                "step_attempts": retry_json(new.step_attempts),
                "history_soft_limit": new.history_soft_limit,
                "history_hard_limit": new.history_hard_limit,
                "chain_id": parent["chain_id"] if parent else None,
                "chain_index": parent["chain_index"] + 1 if parent else 0,
                "parent_run_id": parent["run_id"] if parent else None,
                "family_id": parent["family_id"] if parent else None,
                "family_generation": parent["family_generation"] + 1 if parent else 0,
                "now": now,
            },
        )
        if cursor.rowcount != 1:
            return False
        detail = {"workflow": new.workflow, "version": new.workflow_version}
        if parent is not None:
            detail["continues"] = parent["run_id"]
        self._event(
            conn,
            new.run_id,
            now,
            "run.started" if claimed else "run.submitted",
            fence=fence,
            worker=new.owner,
            detail=detail,
        )
        return True

    def _created(self, new: NewRun, created: bool, now: int) -> tuple[RunRecord, Claim | None]:
        run = self.get_run(new.run_id)
        if not (created and new.owner):
            return run, None
        return run, Claim(new.run_id, new.owner, 1, run.state_revision, now + new.lease_ms, new.lease_ms)

    def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Claim | None:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(
                SQL["claim_run"],
                {
                    "run_id": run_id,
                    "expected_revision": expected_revision,
                    "owner": owner,
                    "lease_expires_at": now + lease_ms,
                    "now": now,
                    "dead_owner": dead_owner,
                },
            ).fetchone()
            if row is None:
                return None
            self._event(
                conn,
                run_id,
                now,
                "run.claimed",
                fence=row["fence"],
                worker=owner,
                detail={"took_over_from": dead_owner} if dead_owner else None,
            )
        return Claim(run_id, owner, row["fence"], row["state_revision"], row["lease_expires_at"], lease_ms)

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(SQL["claim_next"], {"now": now, "workflows": dumps(workflows)}).fetchone()
            if row is None:
                return None
            taken = conn.execute(
                SQL["claim_run"],
                {
                    "run_id": row["run_id"],
                    "expected_revision": row["state_revision"],
                    "owner": owner,
                    "lease_expires_at": now + lease_ms,
                    "now": now,
                    "dead_owner": None,
                },
            ).fetchone()
            self._event(conn, row["run_id"], now, "run.claimed", fence=taken["fence"], worker=owner)
        return Claim(
            row["run_id"], owner, taken["fence"], taken["state_revision"], taken["lease_expires_at"], lease_ms
        )

    # -- the run's end -----------------------------------------------------------------------

    def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None:
        now = self.now()
        with self._write() as conn:
            self._finish(
                conn, claim, status, now, result=result, error=error, recovery_record=recovery_record
            )

    def _finish(
        self,
        conn: sqlite3.Connection,
        claim: Claim,
        status: RunStatus,
        now: int,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
        detail: JSON = None,
    ) -> None:
        """``finish_run`` in the caller's write transaction; ``detail``: its event's, when not
        the error (or the recovery record's phase)."""
        result_text, result_ref = self._put_value(conn, result, now, "safepoint_runs", "result", claim.run_id)
        cursor = conn.execute(
            SQL["finish_run"],
            {
                "run_id": claim.run_id,
                "fence": claim.fence,
                "status": status.value,
                "result": result_text,
                "result_ref": result_ref,
                "error": self._sealed(error, "safepoint_runs", "error", claim.run_id),
                "recovery_record": None
                if recovery_record is None
                else dumps(
                    recovery_record
                    if self.codec is None
                    else seal_record(self.codec, recovery_record, claim.run_id)
                ),
                "now": now,
            },
        )
        if cursor.rowcount != 1:
            raise LostOwnership(claim.run_id, claim.fence)
        self._event(
            conn,
            claim.run_id,
            now,
            f"run.{status.value}",
            fence=claim.fence,
            worker=claim.owner,
            detail=detail or error or ({"phase": recovery_record.get("phase")} if recovery_record else None),
        )

    def release_run(self, claim: Claim) -> None:
        with self._write() as conn:
            conn.execute(
                SQL["release_run"], {"run_id": claim.run_id, "fence": claim.fence, "now": self.now()}
            )

    def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord:
        now = self.now()
        detail = {"by": by, "reason": reason}
        with self._write() as conn:
            row = conn.execute(
                SQL["request_cancel"],
                {
                    "run_id": run_id,
                    "now": now,
                    "error": self._sealed(cancelled_error(by, reason), "safepoint_runs", "error", run_id),
                },
            ).fetchone()
            if row is not None:
                self._event(
                    conn,
                    run_id,
                    now,
                    "run.cancelled" if row["status"] == "cancelled" else "run.cancel_requested",
                    worker=by,
                    detail=detail,
                )
            return self._read_back(run_id)

    def _read_back(self, run_id: str) -> RunRecord:
        """The run a person's write just changed, read in that write's transaction: a run whose
        row cannot be read raises ``CorruptRecord`` and the write rolls back — as on every
        store, nothing changes a run nobody can read but the worker that blocks it."""
        return self.get_run(run_id)

    def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> RunRecord:
        now = self.now()
        abandon = resolution.action is ResolutionAction.ABANDON
        try:
            with self._write() as conn:
                if (
                    conn.execute(
                        SQL["resolve"],
                        {
                            "run_id": run_id,
                            "expected_revision": expected_revision,
                            "now": now,
                            "status": (RunStatus.CANCELLED if abandon else RunStatus.RUNNING).value,
                            "error": self._sealed(
                                abandoned_error(resolution), "safepoint_runs", "error", run_id
                            )
                            if abandon
                            else None,
                        },
                    ).rowcount
                    != 1
                ):
                    raise _NotApplicable
                if resolution.step_id is not None and not abandon:
                    self._resolve_transaction(conn, run_id, resolution, now)
                elif (
                    not abandon
                    and conn.execute(
                        SQL["resolve_operation"],
                        {
                            "run_id": run_id,
                            "operation_id": resolution.operation_id,
                            "now": now,
                            "to_state": (
                                EffectState.ACCEPTED
                                if resolution.action is ResolutionAction.APPLIED
                                else EffectState.PREPARED
                            ).value,
                            "receipt": self._sealed(
                                resolution.receipt,
                                "safepoint_operations",
                                "receipt",
                                run_id,
                                resolution.operation_id,
                            ),
                        },
                    ).rowcount
                    != 1
                ):
                    raise _NotApplicable  # rolls the run's update back with it
                self._event(
                    conn,
                    run_id,
                    now,
                    "run.resolved",
                    operation_id=resolution.operation_id,
                    worker=resolution.by,
                    detail=resolution.detail(),
                )
                return self._read_back(run_id)
        except _NotApplicable:
            # the same decision twice is harmless; anything else is refused
            if not self._reading(self._ledger.resolved_already(run_id, resolution)):
                run = self.get_run(run_id)
                raise ResolutionRefused(run_id, refusal(run, expected_revision, resolution)) from None
        return self.get_run(run_id)

    def _resolve_transaction(
        self, conn: sqlite3.Connection, run_id: str, resolution: Resolution, now: int
    ) -> None:
        """A person's decision on a transaction step recorded as uncertain: recorded completed
        with the value they gave (applied), or its record gone (not applied: it runs again)."""
        place = {"run_id": run_id, "step_id": resolution.step_id}
        if resolution.action is ResolutionAction.APPLIED:
            result, result_ref = self._put_value(
                conn, resolution.receipt, now, "safepoint_steps", "result", run_id, resolution.step_id
            )
            changed = conn.execute(
                SQL["resolve_transaction_applied"],
                {**place, "result": result, "result_ref": result_ref, "now": now},
            ).rowcount
        else:
            changed = conn.execute(SQL["resolve_transaction_not_applied"], place).rowcount
            conn.execute(SQL["resolve_transaction_uncounted"], place)
        if changed != 1:
            raise _NotApplicable  # rolls the run's update back with it


class _NotApplicable(Exception):
    pass
