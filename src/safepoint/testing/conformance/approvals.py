"""Store conformance: approvals."""

from __future__ import annotations

import functools
import time
from dataclasses import replace

import pytest

from ..._rules.canonical import canonical, digest
from ...errors import (
    ApprovalInvalid,
    ApprovalRefused,
    Cancelled,
    GateApproved,
    LostOwnership,
    RunNotFound,
    StoreError,
)
from ...types import ApprovalGate, ApprovalRecord, ApprovalRevocation, EffectState, RunStatus
from ._concerns import ACROSS_RUNS, CLAIMS, CONCURRENCY, CONTROL, VALUES, exercises
from ._support import (
    LONG_LEASE_MS,
    SHORT_LEASE_MS,
    ConformanceBase,
    _uid,
    at_once,
    expire,
    in_threads,
    make_operation,
    make_step,
    stamped_between,
)

# An approval that lapses, given long enough that a dispatch under it is never too late.
_DISPATCH_TTL_MS = 500


class ApprovalTests(ConformanceBase):
    """The conformance tests of approvals."""

    def test_an_operation_that_needs_approval_is_prepared_as_such(self) -> None:
        store = self.store()
        run, _, op = self._gated(store)
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (stored.approval_required, stored.target_digest, stored.approval_id) == (
            True,
            self.TARGET,
            None,
        )
        assert store.approvals(run.run_id) == []

    @exercises(VALUES, CLAIMS, ACROSS_RUNS)
    def test_the_gate_without_an_approval_makes_the_run_wait_released(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        gate = store.await_approval(claim, op.operation_id, self.MOVED)
        assert isinstance(gate, ApprovalGate)
        assert gate.approval is None
        waiting = store.get_run(run.run_id)
        assert (waiting.status, waiting.owner, waiting.lease_expires_at) == (RunStatus.WAITING, None, None)
        assert waiting.waiting_for == gate.waiting_for
        assert gate.waiting_for is not None
        assert {
            k: gate.waiting_for[k]
            for k in ("operation_id", "step_id", "payload_digest", "target_digest", "invalidated")
        } == {
            "operation_id": op.operation_id,
            "step_id": op.step_id,
            "payload_digest": op.payload_ref,
            "target_digest": self.MOVED,
            "invalidated": False,
        }
        # the gate records the target's state it read: what an approval will be bound to
        assert store.load_ledger(run.run_id).operations[op.operation_id].target_digest == (self.MOVED)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.operation_id, event.fence) == ("run.waiting", op.operation_id, claim.fence)
        assert waiting.event_count == len(store.events(run.run_id))
        with pytest.raises(LostOwnership):  # the worker let the run go
            store.record_step(claim, make_step(run.run_id, "after", 1))
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        assert run.run_id in {r.run_id for r in store.list_runs(RunStatus.WAITING, 50)}

    @exercises(VALUES, CLAIMS)
    def test_approving_binds_to_the_recorded_digests_and_releases_the_waiting_run(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.MOVED)
        t0 = store.now()
        approval = store.approve(run.run_id, op.step_id, self._request(ttl_ms=60_000, evidence="ticket 12"))
        t1 = store.now()
        assert (approval.run_id, approval.operation_id, approval.step_id) == (
            run.run_id,
            op.operation_id,
            op.step_id,
        )
        assert (approval.payload_digest, approval.target_digest, approval.approved_by, approval.evidence) == (
            op.payload_ref,
            self.MOVED,
            "ana",
            "ticket 12",
        )
        assert stamped_between(t0, approval.approved_at, t1)
        assert approval.expires_at == approval.approved_at + 60_000
        assert store.approvals(run.run_id) == [approval]
        released = store.get_run(run.run_id)
        assert (released.status, released.waiting_for, released.owner) == (RunStatus.PENDING, None, None)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.worker, event.detail["approval_id"], event.detail["released"]) == (
            "effect.approved",
            "ana",
            approval.approval_id,
            True,
        )
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        gate = store.await_approval(taken, op.operation_id, self.MOVED)
        assert gate == ApprovalGate(approval)
        assert store.get_run(run.run_id).status is RunStatus.RUNNING

    def test_an_approval_given_before_the_run_waits_is_found_by_the_gate(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        approval = store.approve(run.run_id, op.step_id, self._request())
        assert approval.target_digest == self.TARGET  # as read when it was prepared
        still = store.get_run(run.run_id)
        assert (still.status, still.owner) == (RunStatus.RUNNING, "worker-a")  # not released
        gate = store.await_approval(claim, op.operation_id, self.TARGET)
        assert gate.approval == approval
        assert store.get_run(run.run_id).status is RunStatus.RUNNING
        dispatching = store.mark_dispatching(claim, op.operation_id)
        assert (dispatching.state, dispatching.approval_id) == (EffectState.DISPATCHING, approval.approval_id)

    @exercises(VALUES, CONCURRENCY)
    def test_a_gate_racing_an_approval_never_loses_it(self) -> None:
        """Whichever commits first, the run either passes its gate or is released."""
        stores = [self.store(), self.store()]
        for _ in range(8):
            run, claim, op = self._gated(stores[0])
            gate_it = functools.partial(stores[0].await_approval, claim, op.operation_id, self.TARGET)
            approve_it = functools.partial(stores[1].approve, run.run_id, op.step_id, self._request())
            gate, _ = in_threads(gate_it, approve_it)
            now = stores[0].get_run(run.run_id)
            assert isinstance(gate, ApprovalGate)
            if gate.approval is None:
                assert now.status is RunStatus.PENDING, "an approval was lost to the gate"
            else:
                assert now.status is RunStatus.RUNNING

    def test_mark_dispatching_refuses_an_operation_no_approval_authorizes(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(ApprovalInvalid) as refused:
            store.mark_dispatching(claim, op.operation_id)
        assert (refused.value.operation_id, refused.value.payload_digest) == (op.operation_id, op.payload_ref)
        assert self.snapshot(store, run.run_id) == before
        # an approval of another target's state does not authorize it either
        store.approve(run.run_id, op.step_id, self._request())
        other, other_claim, other_op = self._gated(store, target=self.MOVED)
        store.approve(other.run_id, other_op.step_id, self._request())
        gate = store.await_approval(other_claim, other_op.operation_id, self.TARGET)
        assert gate.approval is None  # the target changed since: the run waits
        # nor an expired one, on the store's clock
        late, late_claim, late_op = self._gated(store)
        store.approve(late.run_id, late_op.step_id, self._request(ttl_ms=SHORT_LEASE_MS))
        expire()
        before = self.snapshot(store, late.run_id)
        with pytest.raises(ApprovalInvalid, match="expired"):
            store.mark_dispatching(late_claim, late_op.operation_id)
        assert self.snapshot(store, late.run_id) == before
        # a valid one does, and is named on the operation
        ok = store.mark_dispatching(claim, op.operation_id)
        assert ok.state is EffectState.DISPATCHING
        [approval] = store.approvals(run.run_id)
        assert ok.approval_id == approval.approval_id
        assert store.load_ledger(run.run_id).operations[op.operation_id] == ok

    def test_approving_again_returns_the_same_approval(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        first = store.approve(run.run_id, op.step_id, self._request())
        released = self.snapshot(store, run.run_id)
        again = store.approve(run.run_id, op.step_id, self._request())
        assert again == first
        assert self.snapshot(store, run.run_id) == released
        # another person: the gate has its approval, in force — refused, naming it
        with pytest.raises(GateApproved) as refused:
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert (refused.value.approval_id, refused.value.approved_by, refused.value.went_out) == (
            first.approval_id,
            "ana",
            False,
        )
        assert (refused.value.operation_id, refused.value.approved_at) == (op.operation_id, first.approved_at)
        assert self.snapshot(store, run.run_id) == released
        store.revoke_approval(run.run_id, op.step_id, ApprovalRevocation(by="carol", reason="bo decides"))
        other = store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert other.approval_id != first.approval_id
        assert [a.approved_by for a in store.approvals(run.run_id)] == ["ana", "bo"]

    def test_an_approval_after_the_effect_went_out_under_one_in_force_is_refused(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        ana = store.approve(run.run_id, op.step_id, self._request(ttl_ms=_DISPATCH_TTL_MS))
        store.mark_dispatching(claim, op.operation_id)  # it went out under ana's approval
        before = self.snapshot(store, run.run_id)
        with pytest.raises(GateApproved) as refused:
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert (refused.value.approval_id, refused.value.went_out) == (ana.approval_id, True)
        assert self.snapshot(store, run.run_id) == before
        assert store.approve(run.run_id, op.step_id, self._request()) == ana  # ana again: hers
        store.record_outcome(claim, op.operation_id, EffectState.UNKNOWN, error={"type": "Timeout"})
        # once it lapsed, a re-dispatch (after a reconcile that finds nothing) needs another
        deadline = time.monotonic() + 10
        while store.await_approval(claim, op.operation_id, self.TARGET).approval is not None:
            assert time.monotonic() < deadline, "the approval never lapsed"
            time.sleep(0.05)
        again = store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert again.approved_by == "bo"

    @exercises(VALUES, CONCURRENCY)
    def test_k_approvals_at_the_same_instant_keep_one(self) -> None:
        """k people, each on a store object of its own, approve the parked gate at once: one
        approval is kept and releases the run; every other is refused, naming it."""
        stores = [self.store() for _ in range(5)]
        for trial in range(4):
            run, claim, op = self._gated(stores[0])
            stores[0].await_approval(claim, op.operation_id, self.TARGET)
            results = at_once(
                *(
                    functools.partial(own.approve, run.run_id, op.step_id, self._request(by=f"p{n}"))
                    for n, own in enumerate(stores)
                )
            )
            given = [r for r in results if isinstance(r, ApprovalRecord)]
            refused = [r for r in results if isinstance(r, GateApproved)]
            assert (len(given), len(refused)) == (1, len(stores) - 1), (trial, results)
            assert {r.approval_id for r in refused} == {given[0].approval_id}
            assert stores[0].approvals(run.run_id) == given
            approved = [e for e in stores[0].events(run.run_id) if e.kind == "effect.approved"]
            assert [e.detail["released"] for e in approved] == [True]

    def test_an_approval_that_does_not_fit_is_refused_and_changes_nothing(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        plain, data = make_operation(run.run_id, f"plain-{_uid()}")
        store.prepare_effect(claim, plain, data)
        before = self.snapshot(store, run.run_id)
        wrong_payload = "sha256:" + "0" * 64
        for step_id, request, why in [
            (f"step.never-{_uid()}", self._request(), "no prepared effect"),
            (plain.step_id, self._request(), "does not ask for approval"),
            (op.step_id, self._request(payload_digest=wrong_payload), "now carries"),
            (op.step_id, self._request(expires_at=store.now() - 1), "expire"),
        ]:
            with pytest.raises(ApprovalRefused, match=why):
                store.approve(run.run_id, step_id, request)
        assert self.snapshot(store, run.run_id) == before
        assert store.approvals(run.run_id) == []
        with pytest.raises(RunNotFound):
            store.approve(f"missing-{_uid()}", op.step_id, self._request())
        approval = store.approve(run.run_id, op.step_id, self._request(payload_digest=op.payload_ref))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        with pytest.raises(ApprovalRefused, match="already accepted"):
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        with pytest.raises(ApprovalRefused, match="completed"):
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert store.approvals(run.run_id) == [approval]

    def test_an_approval_of_an_operation_the_run_does_not_wait_for_releases_nothing(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        second = replace(second, approval_required=True, target_digest=None)
        store.prepare_effect(claim, second, data)
        store.await_approval(claim, op.operation_id, self.TARGET)
        approval = store.approve(run.run_id, second.step_id, self._request())
        assert approval.target_digest is None
        assert store.get_run(run.run_id).status is RunStatus.WAITING

    @exercises(CONTROL, CLAIMS)
    def test_a_waiting_run_is_claimed_by_name_but_not_by_claim_next(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        waiting = store.get_run(run.run_id)
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        again = store.claim_run(run.run_id, waiting.state_revision, "worker-b", LONG_LEASE_MS)
        assert again is not None
        now = store.get_run(run.run_id)
        assert (now.status, now.owner, now.waiting_for, now.resume_count) == (
            RunStatus.RUNNING,
            "worker-b",
            None,
            0,
        )

    @exercises(VALUES, ACROSS_RUNS)
    def test_reprepare_gives_a_never_dispatched_operation_a_new_payload(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.approve(run.run_id, op.step_id, self._request())
        data = canonical({"op": op.operation_id, "amount": 7})
        revised = replace(op, payload_ref=digest(data), target_digest=self.MOVED)
        store.reprepare_effect(claim, revised, data)
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (stored.payload_ref, stored.target_digest, stored.effect_key) == (
            revised.payload_ref,
            self.MOVED,
            op.effect_key,
        )  # the key never changes
        assert store.get_artifact(revised.payload_ref) == data
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.detail["payload_ref"]) == ("effect.prepared", revised.payload_ref)
        with pytest.raises(ApprovalInvalid, match="payload changed"):
            store.mark_dispatching(claim, op.operation_id)  # the approval was of the old one
        # an operation that may have been dispatched keeps its payload
        store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        before = self.snapshot(store, run.run_id)
        other = canonical({"other": revised.operation_id})
        with pytest.raises(StoreError, match="no longer prepared"):
            store.reprepare_effect(claim, replace(revised, payload_ref=digest(other)), other)
        assert self.snapshot(store, run.run_id) == before

    @exercises(VALUES, CLAIMS)
    def test_cancelling_a_waiting_run_ends_it_unless_an_effect_is_uncertain(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        ended = store.request_cancel(run.run_id, "ops", "not needed")
        assert (ended.status, ended.waiting_for) == (RunStatus.CANCELLED, None)
        assert store.events(run.run_id)[-1].kind == "run.cancelled"
        # an effect dispatched once (its approval lapsed before a re-dispatch) is settled first
        run, claim, op = self._gated(store)
        # (long enough to dispatch under it on a busy machine; then waited out on the store's clock)
        store.approve(run.run_id, op.step_id, self._request(ttl_ms=_DISPATCH_TTL_MS))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.UNKNOWN, error={"type": "Timeout"})
        deadline = time.monotonic() + 10
        while store.await_approval(claim, op.operation_id, self.TARGET).approval is not None:
            assert time.monotonic() < deadline, "the approval never lapsed"
            time.sleep(0.05)
        marked = store.request_cancel(run.run_id, "ops")
        assert (marked.status, marked.cancel_requested_at is not None) == (RunStatus.PENDING, True)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        with pytest.raises(Cancelled):  # it may settle the effect, but dispatch nothing
            store.mark_dispatching(taken, op.operation_id)
