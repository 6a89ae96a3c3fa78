"""The SQLite store's steps: recorded one by one or in a batch, failed attempts, and the lease
the heartbeat renews — each a fenced write (``fence_check``) in one transaction."""

from __future__ import annotations

import sqlite3
from typing import Any

from ..._rules.canonical import dumps
from ..._rules.history import warn
from ..._rules.kinds import KINDS
from ...errors import ClaimedInFamily, LostOwnership
from ...types import AttemptRecord, Claim, StepRecord
from .connection import SQL, SqliteConnection


class SqliteSteps(SqliteConnection):
    """A run's steps, as its worker records them."""

    @staticmethod
    def _claim_in_family(
        conn: sqlite3.Connection, run_id: str, operation_id: str, claim_key: str | None
    ) -> None:
        """Take the family's claim on ``claim_key`` for ``run_id``'s ``operation_id``, as sent, in
        the dispatch's transaction (after its write: a refusal rolls it back), or
        ``ClaimedInFamily`` naming the run that holds it. An operation with no family key (one
        prepared before families were recorded) claims nothing."""
        if claim_key is None:
            return
        params = {"run_id": run_id, "operation_id": operation_id, "claim_key": claim_key}
        if conn.execute(SQL["family_claim"], params).fetchone() is not None:
            return
        holder = conn.execute(SQL["family_holder"], params).fetchone()
        raise ClaimedInFamily(run_id, operation_id, holder["run_id"], holder["operation_id"])

    def _upsert_step(self, conn: sqlite3.Connection, claim: Claim, step: StepRecord, now: int) -> None:
        conn.execute(SQL["record_step"], self._step_row(conn, claim, step, now))

    def _step_row(self, conn: sqlite3.Connection, claim: Claim, step: StepRecord, now: int) -> dict[str, Any]:
        """A step's columns as the parameters of the statements that record it (its result
        inline or as an artifact, its result and error sealed with a codec)."""
        place = (claim.run_id, step.step_id)
        result, result_ref = self._put_value(conn, step.result, now, "safepoint_steps", "result", *place)
        return {
            "run_id": claim.run_id,
            "step_id": step.step_id,
            "seq": step.seq,
            "kind": step.kind.value,
            "name": step.name,
            "input_hash": step.input_hash,
            "status": step.status.value,
            "result": result,
            "result_ref": result_ref,
            "error": None
            if step.error is None
            else self._sealed(step.error, "safepoint_steps", "error", *place),
            "next_step_id": step.next_step_id,
            "attempt": step.attempt,
            "model_id": step.model_id,
            "prompt_hash": step.prompt_hash,
            "observed_at": step.observed_at,
            "operation_id": step.operation_id,
            "fence": claim.fence,
            "now": now,
            "tokens": step.tokens,
            "cost": step.cost,
        }

    def record_step(self, claim: Claim, step: StepRecord) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, step=step, new_work=True, limited=True)
            self._upsert_step(conn, claim, step, now)
            self._add_usage(conn, claim, [step])
        warn(due)

    @staticmethod
    def _add_usage(conn: sqlite3.Connection, claim: Claim, steps: list[StepRecord]) -> None:
        """Add what the model steps among ``steps`` spent to the run's totals: tokens, cost, and
        each model call (a turn), in the commit that records them."""
        tokens, cost, calls = 0, 0.0, 0
        for step in steps:  # one pass, no generators: this is on every step's commit
            if KINDS[step.kind].model_call:
                tokens, cost, calls = tokens + (step.tokens or 0), cost + (step.cost or 0), calls + 1
        if calls:
            conn.execute(
                SQL["record_step_usage"],
                {"run_id": claim.run_id, "tokens": tokens, "cost": cost, "model_calls": calls},
            )

    def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None:
        if not steps:
            return
        now = self.now()
        with self._write() as conn:
            row = conn.execute(
                SQL["record_steps"],
                {
                    "run_id": claim.run_id,
                    "fence": claim.fence,
                    "lease_expires_at": now + claim.lease_ms,
                    "now": now,
                    "step_ids": dumps([step.step_id for step in steps]),
                },
            ).fetchone()
            if row is None:
                raise self._refused(conn, claim, now, limited=True)
            due = self._soft_limit_warning(conn, claim, row, now)
            for step in steps:
                self._upsert_step(conn, claim, step, now)
            self._add_usage(conn, claim, steps)
        warn(due)

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, new_work=True)
            conn.execute(
                SQL["record_attempt"],
                {
                    "run_id": claim.run_id,
                    "step_id": attempt.step_id,
                    "attempt": attempt.attempt,
                    "kind": attempt.kind.value,
                    "name": attempt.name,
                    "input_hash": attempt.input_hash,
                    "error": self._sealed(
                        attempt.error,
                        "safepoint_attempts",
                        "error",
                        claim.run_id,
                        attempt.step_id,
                        attempt.attempt,
                    ),
                    "retry_at": attempt.retry_at,
                    "fence": claim.fence,
                    "now": now,
                },
            )
        warn(due)

    def renew_lease(self, claim: Claim) -> None:
        with self._write() as conn:
            cursor = conn.execute(
                SQL["renew_lease"],
                {
                    "run_id": claim.run_id,
                    "fence": claim.fence,
                    "lease_expires_at": (now := self.now()) + claim.lease_ms,
                    "now": now,
                },
            )
            if cursor.rowcount != 1:
                raise LostOwnership(claim.run_id, claim.fence)
