"""The SQLite store's effects: an operation walking the dispatch protocol — prepared,
dispatching (through the approval gate when it needs one), its outcome — and a payload
prepared anew before it was ever sent. Each a fenced write in one transaction."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from typing import Any

from ..._rules.approvals import authorizing, refused_dispatch
from ..._rules.canonical import dumps
from ..._rules.history import warn
from ...errors import HistoryWarning, StoreError
from ...types import JSON, Claim, EffectState, OperationRecord, StepRecord
from .._rows import operation_record
from ..base import check_payload, refuse_gated
from .connection import SQL
from .steps import SqliteSteps


class SqliteEffects(SqliteSteps):
    """Effect operations, as a run's worker dispatches them."""

    def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._prepare(conn, claim, op, payload, now)
        warn(due)

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        now = self.now()
        with self._write() as conn:
            op, due = self._mark_dispatching(conn, claim, operation_id, now)
        warn(due)
        return op

    def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> OperationRecord:
        """The rows and events ``prepare_effect`` and ``mark_dispatching`` would leave, in one
        transaction of fewer statements: one fence for both writes, the operation inserted
        "dispatching", both events in one statement."""
        refuse_gated(op)
        check_payload(op, payload)
        now = self.now()
        with self._write() as conn:
            # held to the hard limit as the prepare is; its dispatching event never is
            due = self._fence_check(conn, claim, now, events=2, new_work=True, limited=True, dispatching=True)
            self._put_artifact(conn, payload, now, op.payload_ref)  # checked above
            conn.execute(SQL["prepare_effect"], self._prepare_params(claim, op, now, dispatching=True))
            self._claim_in_family(conn, claim.run_id, op.operation_id, op.family_key)
            conn.execute(
                SQL["prepare_and_mark_dispatching_events"],
                {
                    "run_id": claim.run_id,
                    "now": now,
                    "step_id": op.step_id,
                    "operation_id": op.operation_id,
                    "fence": claim.fence,
                    "worker": claim.owner,
                    # the effect and the payload's digest: nothing of the caller's, kept in clear
                    "detail": dumps({"effect": op.effect, "payload_ref": op.payload_ref}),
                    "dispatching_detail": dumps({"dispatch": 1}),
                },
            )
        warn(due)
        # the row as the statements above left it, every other column at its default
        return OperationRecord(
            run_id=claim.run_id,
            operation_id=op.operation_id,
            step_id=op.step_id,
            effect=op.effect,
            state=EffectState.DISPATCHING,
            payload_ref=op.payload_ref,
            effect_key=op.effect_key,
            dispatch_count=1,
            first_dispatched_at=now,
            fence=claim.fence,
            prepared_at=now,
            updated_at=now,
            dedup_retention_ms=op.dedup_retention_ms,
            family_key=op.family_key,
        )

    @staticmethod
    def _prepare_params(claim: Claim, op: OperationRecord, now: int, *, dispatching: bool) -> dict[str, Any]:
        return {
            "run_id": claim.run_id,
            "operation_id": op.operation_id,
            "step_id": op.step_id,
            "effect": op.effect,
            "payload_ref": op.payload_ref,
            "effect_key": op.effect_key,
            "fence": claim.fence,
            "now": now,
            "dedup_retention_ms": op.dedup_retention_ms,
            "dispatching": int(dispatching),
            "family_key": op.family_key,
        }

    def _prepare(
        self, conn: sqlite3.Connection, claim: Claim, op: OperationRecord, payload: bytes, now: int
    ) -> HistoryWarning | None:
        """``prepare_effect``'s statements, in the caller's transaction."""
        check_payload(op, payload)
        due = self._fence_check(conn, claim, now, events=1, new_work=True, limited=True)
        self._put_artifact(conn, payload, now, op.payload_ref)  # checked above
        conn.execute(SQL["prepare_effect"], self._prepare_params(claim, op, now, dispatching=False))
        if op.approval_required:
            conn.execute(
                SQL["await_approval"],
                {
                    "run_id": claim.run_id,
                    "operation_id": op.operation_id,
                    "target_digest": op.target_digest,
                    "now": now,
                },
            )
        self._event(
            conn,
            claim.run_id,
            now,
            "effect.prepared",
            step_id=op.step_id,
            operation_id=op.operation_id,
            fence=claim.fence,
            worker=claim.owner,
            detail={"effect": op.effect, "payload_ref": op.payload_ref},
            clear=True,  # the effect and the payload's digest: nothing of the caller's
        )
        return due

    def _mark_dispatching(
        self, conn: sqlite3.Connection, claim: Claim, operation_id: str, now: int
    ) -> tuple[OperationRecord, HistoryWarning | None]:
        """``mark_dispatching``'s statements, in the caller's transaction."""
        # an operation already prepared is sent whatever the history: never held to it
        due = self._fence_check(conn, claim, now, events=1, new_work=True)
        row = conn.execute(
            SQL["mark_dispatching"],
            {"run_id": claim.run_id, "operation_id": operation_id, "fence": claim.fence, "now": now},
        ).fetchone()
        if row is None:
            raise StoreError(
                f"operation {operation_id!r} is not in a dispatchable state",
                run_id=claim.run_id,
                operation_id=operation_id,
            )
        op = operation_record(row, self.codec)
        if op.approval_required:  # the gate, on this transaction's clock: or nothing is written
            approvals = self._within(conn, self._ledger.approvals_of(claim.run_id, operation_id))
            approval = authorizing(
                approvals, payload_digest=op.payload_ref, target_digest=op.target_digest, now=now
            )
            if approval is None:
                raise refused_dispatch(op, approvals, now)
            conn.execute(
                SQL["mark_dispatching_approved"],
                {"run_id": claim.run_id, "operation_id": operation_id, "approval_id": approval.approval_id},
            )
            op = replace(op, approval_id=approval.approval_id)
        self._claim_in_family(conn, claim.run_id, operation_id, op.family_key)
        self._event(
            conn,
            claim.run_id,
            now,
            "effect.dispatching",
            step_id=op.step_id,
            operation_id=operation_id,
            fence=claim.fence,
            worker=claim.owner,
            detail={"dispatch": op.dispatch_count},
        )
        return op, due

    def record_outcome(
        self,
        claim: Claim,
        operation_id: str,
        state: EffectState,
        *,
        receipt: JSON = None,
        error: JSON = None,
        step: StepRecord | None = None,
        not_sent: bool = False,
    ) -> None:
        now = self.now()
        with self._write() as conn:
            # an outcome is never held to the history limit: what happened is always recorded
            due = self._fence_check(conn, claim, now, events=1, step=step)
            cursor = conn.execute(
                SQL["record_outcome"],
                {
                    "run_id": claim.run_id,
                    "operation_id": operation_id,
                    "state": state.value,
                    "receipt": self._sealed(
                        receipt, "safepoint_operations", "receipt", claim.run_id, operation_id
                    ),
                    "error": self._sealed(error, "safepoint_operations", "error", claim.run_id, operation_id),
                    "fence": claim.fence,
                    "now": now,
                },
            )
            if cursor.rowcount != 1:
                raise StoreError(
                    f"no operation {operation_id!r} in run {claim.run_id!r}",
                    run_id=claim.run_id,
                    operation_id=operation_id,
                )
            if not_sent:  # provably never left: the family's claim goes back (see Store.record_outcome)
                conn.execute(SQL["family_release"], {"run_id": claim.run_id, "operation_id": operation_id})
            if step is not None:
                self._upsert_step(conn, claim, step, now)
            self._event(
                conn,
                claim.run_id,
                now,
                f"effect.{state.value}",
                step_id=step.step_id if step else None,
                operation_id=operation_id,
                fence=claim.fence,
                worker=claim.owner,
                detail={"error": error} if error is not None else None,
            )
        warn(due)

    def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        check_payload(op, payload)
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=1, new_work=True)
            self._put_artifact(conn, payload, now, op.payload_ref)  # checked above
            if (
                conn.execute(
                    SQL["reprepare_effect"],
                    {
                        "run_id": claim.run_id,
                        "operation_id": op.operation_id,
                        "payload_ref": op.payload_ref,
                        "target_digest": op.target_digest,
                        "fence": claim.fence,
                        "now": now,
                    },
                ).rowcount
                != 1
            ):
                raise StoreError(
                    f"operation {op.operation_id!r} is no longer prepared: its"
                    " payload cannot change (it may have been sent)",
                    run_id=claim.run_id,
                    operation_id=op.operation_id,
                )
            self._event(
                conn,
                claim.run_id,
                now,
                "effect.prepared",
                step_id=op.step_id,
                operation_id=op.operation_id,
                fence=claim.fence,
                worker=claim.owner,
                detail={"effect": op.effect, "payload_ref": op.payload_ref, "revised": True},
                clear=True,
            )
        warn(due)
