"""Store conformance: revoking approvals."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ...errors import ApprovalInvalid, ApprovalRefused, RunNotFound
from ...types import ApprovalRevocation, Claim, EffectState, OperationRecord, RunRecord, RunStatus
from ._concerns import CLAIMS, CONCURRENCY, VALUES, exercises
from ._support import LONG_LEASE_MS, ConformanceBase, _uid, in_threads, make_operation, stamped_between


class RevocationTests(ConformanceBase):
    """The conformance tests of revoking approvals."""

    WITHDRAWN = ApprovalRevocation(by="carol", reason="the customer withdrew the request")

    @exercises(VALUES, CLAIMS)
    def test_revoking_withdraws_every_approval_in_force_and_the_dispatch_is_refused(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        ana = store.approve(run.run_id, op.step_id, self._request(ttl_ms=60_000))
        # the target moved since ana approved: the gate waits again, and bo approves it as it is
        # now — ana's approval is still in force (not revoked, not expired), for the old target
        assert store.await_approval(claim, op.operation_id, self.MOVED).approval is None
        reclaimed = store.claim_run(run.run_id, store.get_run(run.run_id).state_revision, "worker-a", 60_000)
        assert reclaimed is not None
        claim = reclaimed
        bo = store.approve(run.run_id, op.step_id, self._request(by="bo", evidence="OPS-1"))
        before = store.get_run(run.run_id)
        t0 = store.now()
        revoked = store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        t1 = store.now()
        assert [(a.approval_id, a.revoked_by, a.revoke_reason) for a in revoked] == [
            (ana.approval_id, "carol", self.WITHDRAWN.reason),
            (bo.approval_id, "carol", self.WITHDRAWN.reason),
        ]
        assert all(stamped_between(t0, a.revoked_at, t1) for a in revoked)
        assert revoked == [
            replace(
                ana, revoked_at=revoked[0].revoked_at, revoked_by="carol", revoke_reason=self.WITHDRAWN.reason
            ),
            replace(
                bo, revoked_at=revoked[0].revoked_at, revoked_by="carol", revoke_reason=self.WITHDRAWN.reason
            ),
        ]
        assert store.approvals(run.run_id) == revoked  # read back with every field
        after = store.get_run(run.run_id)
        # the status stays: the gate decides whether the run waits
        assert (after.status, after.owner, after.fence) == (RunStatus.RUNNING, "worker-a", claim.fence)
        assert after.state_revision > before.state_revision
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.step_id, event.operation_id, event.worker, event.fence) == (
            "effect.approval_revoked",
            op.step_id,
            op.operation_id,
            "carol",
            None,
        )
        assert event.detail == {
            "approval_ids": [ana.approval_id, bo.approval_id],
            "approved_by": ["ana", "bo"],
            "reason": self.WITHDRAWN.reason,
        }
        assert after.event_count == len(store.events(run.run_id))
        # the dispatch is refused, naming the revocation, and writes nothing
        unchanged = self.snapshot(store, run.run_id)
        with pytest.raises(ApprovalInvalid, match="revoked by carol") as refused:
            store.mark_dispatching(claim, op.operation_id)
        assert self.WITHDRAWN.reason in refused.value.reason
        assert self.snapshot(store, run.run_id) == unchanged
        # the gate makes the run wait, naming the revocation
        gate = store.await_approval(claim, op.operation_id, self.TARGET)
        assert gate.approval is None
        assert gate.waiting_for is not None
        assert gate.waiting_for["invalidated"] is True
        assert "revoked by carol" in gate.waiting_for["reason"]
        # approved anew: a new approval, and the dispatch goes out under it
        again = store.approve(run.run_id, op.step_id, self._request())
        assert again.approval_id != ana.approval_id
        assert again.revoked_at is None
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        assert store.mark_dispatching(taken, op.operation_id).approval_id == again.approval_id

    @exercises(VALUES, CLAIMS)
    def test_a_run_an_approval_released_meets_the_revocation_at_its_gate(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        store.approve(run.run_id, op.step_id, self._request())
        assert store.get_run(run.run_id).status is RunStatus.PENDING
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        assert store.get_run(run.run_id).status is RunStatus.PENDING  # left for the gate
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(taken, op.operation_id)
        gate = store.await_approval(taken, op.operation_id, self.TARGET)
        assert gate.approval is None
        waiting = store.get_run(run.run_id)
        assert waiting.status is RunStatus.WAITING
        assert waiting.waiting_for is not None
        assert "revoked by carol" in waiting.waiting_for["reason"]
        op_now = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (op_now.state, op_now.dispatch_count) == (EffectState.PREPARED, 0)

    def test_a_revocation_that_does_not_fit_is_refused_and_changes_nothing(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        plain, data = make_operation(run.run_id, f"plain-{_uid()}")
        store.prepare_effect(claim, plain, data)

        def refused(step_id: str, why: str, run_id: str = run.run_id) -> None:
            before = self.snapshot(store, run_id), store.approvals(run_id)
            with pytest.raises(ApprovalRefused, match=why) as error:
                store.revoke_approval(run_id, step_id, self.WITHDRAWN)
            assert (error.value.revoking, error.value.step_id) == (True, step_id)
            assert (self.snapshot(store, run_id), store.approvals(run_id)) == before

        refused(f"step.never-{_uid()}", "no prepared effect")
        refused(plain.step_id, "no approval to revoke")
        refused(op.step_id, "no approval to revoke")
        with pytest.raises(RunNotFound):
            store.revoke_approval(f"missing-{_uid()}", op.step_id, self.WITHDRAWN)
        store.approve(run.run_id, op.step_id, self._request())
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        refused(op.step_id, "revoked already")
        # once its outcome is recorded: too late, the dispatch is in the past
        approval = store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        refused(op.step_id, r"too late: .* is accepted")
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        refused(op.step_id, "too late")
        assert store.approvals(run.run_id)[-1] == approval  # never revoked
        # a dispatch that provably never left (back to prepared): the next one may be withdrawn
        again, again_claim, again_op = self._gated(store)
        store.approve(again.run_id, again_op.step_id, self._request())
        store.mark_dispatching(again_claim, again_op.operation_id)
        store.record_outcome(
            again_claim,
            again_op.operation_id,
            EffectState.PREPARED,
            error={"type": "NotSent", "message": "connection refused"},
        )
        store.revoke_approval(again.run_id, again_op.step_id, self.WITHDRAWN)
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(again_claim, again_op.operation_id)
        # dispatched, its outcome unknown: what may have happened is reconciled, but the
        # dispatch a "not applied" would call for is withdrawn
        unsure, unsure_claim, unsure_op = self._gated(store)
        store.approve(unsure.run_id, unsure_op.step_id, self._request())
        store.mark_dispatching(unsure_claim, unsure_op.operation_id)
        store.revoke_approval(unsure.run_id, unsure_op.step_id, self.WITHDRAWN)
        store.record_outcome(
            unsure_claim,
            unsure_op.operation_id,
            EffectState.UNKNOWN,
            error={"type": "TimeoutError", "message": "no answer"},
        )
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(unsure_claim, unsure_op.operation_id)
        # a cancelled run dispatches nothing: there is nothing to take back
        ended, ended_claim, ended_op = self._gated(store)
        store.await_approval(ended_claim, ended_op.operation_id, self.TARGET)
        store.approve(ended.run_id, ended_op.step_id, self._request())  # released: pending
        assert store.request_cancel(ended.run_id, "ops").status is RunStatus.CANCELLED
        refused(ended_op.step_id, "cancelled", run_id=ended.run_id)

    def test_a_revocation_and_a_dispatch_whichever_commits_first_wins(self) -> None:
        store = self.store()
        # the dispatch first: it went out under the approval, which the revocation leaves as
        # the one that authorized it; only dispatches still to come are withdrawn
        run, claim, op = self._gated(store)
        approval = store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        dispatched = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (dispatched.state, dispatched.approval_id) == (EffectState.DISPATCHING, approval.approval_id)
        assert [a.approval_id for a in store.approvals(run.run_id) if a.revoked] == [approval.approval_id]
        # the revocation first: the dispatch is refused and nothing leaves
        run, claim, op = self._gated(store)
        store.approve(run.run_id, op.step_id, self._request())
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(claim, op.operation_id)
        prepared = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (prepared.state, prepared.dispatch_count) == (EffectState.PREPARED, 0)

    @exercises(VALUES, CONCURRENCY)
    def test_a_revocation_racing_a_dispatch_never_lets_both_win(self) -> None:
        """Run concurrently, on two store objects: a dispatch goes out only under an approval
        not yet revoked — it commits before the revocation, or it is refused."""
        stores = [self.store(), self.store()]
        for _ in range(8):
            run, claim, op = self._gated(stores[0])
            stores[0].approve(run.run_id, op.step_id, self._request())

            def dispatch(claim: Claim = claim, op: OperationRecord = op) -> str:
                try:
                    stores[0].mark_dispatching(claim, op.operation_id)
                except ApprovalInvalid:
                    return "refused"
                return "dispatched"

            def revoke(run: RunRecord = run, op: OperationRecord = op) -> str:
                try:
                    stores[1].revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
                except ApprovalRefused:
                    return "too late"
                return "revoked"

            outcome = tuple(in_threads(dispatch, revoke))
            assert outcome in {("dispatched", "revoked"), ("refused", "revoked")}, outcome
            now = stores[0].load_ledger(run.run_id).operations[op.operation_id]
            assert [a.revoked_at is not None for a in stores[0].approvals(run.run_id)] == [True]
            kinds = [
                e.kind
                for e in stores[0].events(run.run_id)
                if e.kind in ("effect.dispatching", "effect.approval_revoked")
            ]
            if outcome[0] == "dispatched":
                assert (now.state, now.dispatch_count) == (EffectState.DISPATCHING, 1)
                assert kinds == ["effect.dispatching", "effect.approval_revoked"]
            else:
                assert (now.state, now.dispatch_count) == (EffectState.PREPARED, 0)
                assert kinds == ["effect.approval_revoked"]
