"""The SQLite store's approvals: the gate a run waits at, a person's approval and its
revocation — each serialised with the dispatch by ``BEGIN IMMEDIATE`` (the decisions are in
``safepoint._rules.approvals``)."""

from __future__ import annotations

from ..._rules.approvals import approval_detail as approved_detail
from ..._rules.approvals import (
    authorizing,
    plan_approval,
    plan_revocation,
    revocation_detail,
    waiting_record,
)
from ..._rules.history import warn
from ...errors import StoreError
from ...types import (
    ApprovalGate,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalRevocation,
    Claim,
)
from .._rows import operation_record
from ..ledger import approval_words, revoke_reasons
from .connection import SQL, SqliteConnection


class SqliteApprovals(SqliteConnection):
    """Approvals of effects, and the gate they open."""

    def await_approval(self, claim: Claim, operation_id: str, target_digest: str | None) -> ApprovalGate:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, new_work=True)
            row = conn.execute(
                SQL["await_approval"],
                {
                    "run_id": claim.run_id,
                    "operation_id": operation_id,
                    "target_digest": target_digest,
                    "now": now,
                },
            ).fetchone()
            if row is None:
                raise StoreError(
                    f"operation {operation_id!r} is not in a dispatchable state",
                    run_id=claim.run_id,
                    operation_id=operation_id,
                )
            op = operation_record(row, self.codec)
            approvals = self._within(conn, self._ledger.approvals_of(claim.run_id, operation_id))
            approval = authorizing(
                approvals, payload_digest=op.payload_ref, target_digest=target_digest, now=now
            )
            gate = ApprovalGate(approval)
            if approval is None:
                waiting = waiting_record(op, target_digest=target_digest, approvals=approvals, now=now)
                conn.execute(
                    SQL["wait_for_approval"],
                    {
                        "run_id": claim.run_id,
                        "fence": claim.fence,
                        "waiting_for": self._sealed(waiting, "safepoint_runs", "waiting_for", claim.run_id),
                        "now": now,
                    },
                )
                self._event(
                    conn,
                    claim.run_id,
                    now,
                    "run.waiting",
                    step_id=op.step_id,
                    operation_id=operation_id,
                    fence=claim.fence,
                    worker=claim.owner,
                    detail=waiting,
                )
                gate = ApprovalGate(None, waiting)
        warn(due)
        return gate

    def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord:
        now = self.now()
        with self._write() as conn:  # BEGIN IMMEDIATE: serialised with await_approval
            run, op, approvals = self._within(conn, self._ledger.step_approvals(run_id, step_id))
            new, approval, release = plan_approval(run, step_id, op, approvals, request, now)
            if new is not None:
                conn.execute(
                    SQL["approve"],
                    {
                        "approval_id": new.approval_id,
                        "run_id": run_id,
                        "operation_id": new.operation_id,
                        "step_id": new.step_id,
                        "payload_digest": new.payload_digest,
                        "target_digest": new.target_digest,
                        "approved_by": new.approved_by,
                        "evidence": approval_words(
                            self.codec, new.evidence, "evidence", run_id, new.approval_id
                        ),
                        "approved_at": new.approved_at,
                        "expires_at": new.expires_at,
                    },
                )
            if new is not None or release:
                conn.execute(SQL["approve_run"], {"run_id": run_id, "release": release, "now": now})
                self._event(
                    conn,
                    run_id,
                    now,
                    "effect.approved",
                    step_id=approval.step_id,
                    operation_id=approval.operation_id,
                    worker=approval.approved_by,
                    detail=approved_detail(approval, released=release),
                )
        return approval

    def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> list[ApprovalRecord]:
        now = self.now()
        # BEGIN IMMEDIATE: serialised with mark_dispatching, so whichever commits first wins
        with self._write() as conn:
            run, op, approvals = self._within(conn, self._ledger.step_approvals(run_id, step_id))
            revoked = plan_revocation(run, step_id, op, approvals, revocation, now)
            of = revoked[0]  # never empty: plan_revocation refuses when nothing is in force
            conn.execute(
                SQL["revoke_approval"],
                {
                    "run_id": run_id,
                    "operation_id": of.operation_id,
                    "now": now,
                    "revoked_by": revocation.by,
                    **revoke_reasons(self.codec, revocation.reason, run_id, revoked),
                },
            )
            conn.execute(SQL["revoke_approval_run"], {"run_id": run_id, "now": now})
            self._event(
                conn,
                run_id,
                now,
                "effect.approval_revoked",
                step_id=of.step_id,
                operation_id=of.operation_id,
                worker=revocation.by,
                detail=revocation_detail(revoked),
            )
        return revoked
