"""The PostgreSQL store's approvals: the gate a run waits at, a person's approval and its
revocation, serialised with the dispatch on the run's row lock (the decisions are in
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
from ...errors import StoreError
from ...types import ApprovalGate, ApprovalRecord, ApprovalRequest, ApprovalRevocation, Claim
from .._rows import operation_record
from ..ledger import approval_words, revoke_reasons
from ..plans import Plan
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresApprovals(PostgresBase):
    """The PostgreSQL store's approvals: the gate a run waits at, a person's approval and its."""

    def await_approval(
        self, claim: Claim, operation_id: str, target_digest: str | None
    ) -> Plan[ApprovalGate]:
        # The fence takes the runs row lock first: an approval being given now either
        # committed before (and is read below) or waits for this transaction to end.
        owned = yield from self._fenced(claim, "await_approval_fence")
        rows = yield _q(
            "await_approval", run_id=claim.run_id, operation_id=operation_id, target_digest=target_digest
        )
        if not rows:
            raise StoreError(
                f"operation {operation_id!r} is not in a dispatchable state",
                run_id=claim.run_id,
                operation_id=operation_id,
            )
        op = operation_record(rows[0], self.codec)
        approvals = yield from self.approvals_of(claim.run_id, operation_id)
        now = int(owned["now"])
        approval = authorizing(approvals, payload_digest=op.payload_ref, target_digest=target_digest, now=now)
        if approval is not None:
            return ApprovalGate(approval)
        waiting = waiting_record(op, target_digest=target_digest, approvals=approvals, now=now)
        event = yield from self._event_params(waiting, claim.run_id, "run.waiting")
        yield from self._fenced(
            claim,
            "wait_for_approval",
            waiting_for=self._sealed(waiting, "safepoint_runs", "waiting_for", claim.run_id),
            step_id=op.step_id,
            operation_id=operation_id,
            **event,
        )
        return ApprovalGate(None, waiting)

    def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> Plan[ApprovalRecord]:
        run, op, approvals = yield from self.step_approvals(run_id, step_id)
        now = yield from self.now()
        new, approval, release = plan_approval(run, step_id, op, approvals, request, now)
        if new is not None:
            yield _q(
                "approve",
                approval_id=new.approval_id,
                run_id=run_id,
                operation_id=new.operation_id,
                step_id=new.step_id,
                payload_digest=new.payload_digest,
                target_digest=new.target_digest,
                approved_by=new.approved_by,
                evidence=approval_words(self.codec, new.evidence, "evidence", run_id, new.approval_id),
                approved_at=new.approved_at,
                expires_at=new.expires_at,
            )
        if new is not None or release:
            yield _q(
                "approve_run",
                run_id=run_id,
                release=release,
                step_id=approval.step_id,
                operation_id=approval.operation_id,
                by=approval.approved_by,
                **(
                    yield from self._event_params(
                        approved_detail(approval, released=release), run_id, "effect.approved"
                    )
                ),
            )
            if release:  # claimable again: wake a waiting worker
                yield from self.wake_workers(run.workflow)
        return approval

    def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> Plan[list[ApprovalRecord]]:
        # Under the runs row lock: a dispatch of this operation (whose fenced statement takes
        # the lock first) committed before — it is too late — or waits for this revocation to
        # commit, and then reads the approvals, in a later statement, as revoked.
        run, op, approvals = yield from self.step_approvals(run_id, step_id)
        now = yield from self.now()
        revoked = plan_revocation(run, step_id, op, approvals, revocation, now)
        of = revoked[0]  # never empty: plan_revocation refuses when nothing is in force
        yield _q(
            "revoke_approval",
            run_id=run_id,
            operation_id=of.operation_id,
            step_id=of.step_id,
            now=now,
            revoked_by=revocation.by,
            **revoke_reasons(self.codec, revocation.reason, run_id, revoked),
            **(yield from self._event_params(revocation_detail(revoked), run_id, "effect.approval_revoked")),
        )
        return revoked
