"""Store conformance: effects."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from ..._rules.canonical import digest, dumps
from ...errors import HistoryLimitReached, StoreError
from ...types import JSON, EffectState, StepKind
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import LARGE, SHORT_LEASE_MS, ConformanceBase, _uid, make_operation, make_step, stamped_between


class EffectTests(ConformanceBase):
    """The conformance tests of effects."""

    @exercises(VALUES, ACROSS_RUNS)
    def test_prepare_effect_stores_the_payload_and_a_prepared_operation(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"ticket:create:{_uid()}", {"to": "ana", "n": 1})
        t0 = store.now()
        store.prepare_effect(claim, op, payload)
        t1 = store.now()
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert stamped_between(t0, stored.prepared_at, t1)
        assert stored == replace(
            op, fence=claim.fence, prepared_at=stored.prepared_at, updated_at=stored.updated_at
        )
        assert (stored.state, stored.dispatch_count, stored.first_dispatched_at) == (
            EffectState.PREPARED,
            0,
            None,
        )
        assert store.get_artifact(op.payload_ref) == payload
        raw = b"\x00\xff not utf-8 \xfe"
        op2 = replace(op, operation_id=f"raw-{_uid()}", payload_ref=digest(raw))
        store.prepare_effect(claim, op2, raw)
        assert store.get_artifact(digest(raw)) == raw

    def test_prepare_effect_refuses_a_payload_that_does_not_match_its_digest(self) -> None:
        """``ValueError``, whoever asks: a caller's mistake is named as one even by a worker
        whose fence is stale (the payload is checked before anything else), and nothing is
        written."""
        store = self.store()
        run, stale = self.start(store, lease_ms=SHORT_LEASE_MS)
        claim = self.take_over(store, run.run_id)
        op, _ = make_operation(run.run_id, f"op-{_uid()}")
        before = self.snapshot(store, run.run_id)
        for holder in (claim, stale):
            with pytest.raises(ValueError, match="does not match"):
                store.prepare_effect(holder, op, b'{"other":"bytes"}')
            with pytest.raises(ValueError, match="does not match"):
                store.prepare_and_mark_dispatching(holder, op, b'{"other":"bytes"}')
        assert self.snapshot(store, run.run_id) == before

    def test_mark_dispatching_counts_dispatches_and_keeps_the_first_time(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        t0 = store.now()
        first = store.mark_dispatching(claim, op.operation_id)
        t1 = store.now()
        assert (first.state, first.dispatch_count, first.fence) == (EffectState.DISPATCHING, 1, claim.fence)
        assert first.first_dispatched_at is not None
        assert stamped_between(t0, first.first_dispatched_at, t1)
        assert store.load_ledger(run.run_id).operations[op.operation_id] == first
        # unknown → dispatching, prepared (NotSent) → dispatching, dispatching → dispatching
        for count, before in enumerate((EffectState.UNKNOWN, EffectState.PREPARED, None), 2):
            time.sleep(0.005)
            if before is not None:
                store.record_outcome(claim, op.operation_id, before, error={"type": "Timeout"})
            again = store.mark_dispatching(claim, op.operation_id)
            assert (again.state, again.dispatch_count) == (EffectState.DISPATCHING, count)
            assert again.first_dispatched_at == first.first_dispatched_at
            assert (again.effect_key, again.payload_ref) == (op.effect_key, op.payload_ref)
            assert store.load_ledger(run.run_id).operations[op.operation_id] == again

    @pytest.mark.parametrize("settled", [EffectState.ACCEPTED, EffectState.REJECTED, EffectState.APPLIED])
    def test_a_settled_operation_is_never_dispatched_again(self, settled: EffectState) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        evidence: JSON = {"status": 402, "reason": "card declined"}
        store.record_outcome(claim, op.operation_id, settled, receipt={"id": 1}, error=evidence)
        before = self.snapshot(store, run.run_id)
        stored = before[0].operations[op.operation_id]
        assert (stored.state, stored.receipt, stored.error) == (settled, {"id": 1}, evidence)
        with pytest.raises(StoreError):
            store.mark_dispatching(claim, op.operation_id)
        with pytest.raises(StoreError):
            store.mark_dispatching(claim, f"no-such-op-{_uid()}")
        assert self.snapshot(store, run.run_id) == before

    @exercises(VALUES, ACROSS_RUNS)
    def test_prepare_and_mark_dispatching_leaves_what_the_two_writes_leave(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        apart, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, apart, payload)
        store.mark_dispatching(claim, apart.operation_id)
        before = store.get_run(run.run_id)
        op, data = make_operation(run.run_id, f"op-{_uid()}", {"to": "ana", "n": 2})
        t0 = store.now()
        got = store.prepare_and_mark_dispatching(claim, op, data)
        t1 = store.now()
        assert (got.state, got.dispatch_count, got.fence) == (EffectState.DISPATCHING, 1, claim.fence)
        assert got.first_dispatched_at is not None
        assert stamped_between(t0, got.prepared_at, t1)
        assert stamped_between(t0, got.first_dispatched_at, t1)
        assert got.prepared_at <= (got.first_dispatched_at or 0)  # both the server's clock
        assert (got.effect_key, got.payload_ref, got.step_id, got.effect) == (
            op.effect_key,
            op.payload_ref,
            op.step_id,
            op.effect,
        )
        ledger, events = self.snapshot(store, run.run_id)
        assert ledger.operations[op.operation_id] == got
        assert store.get_artifact(op.payload_ref) == data
        assert [
            (e.kind, e.step_id, e.fence, e.worker, e.detail)
            for e in events
            if e.operation_id == op.operation_id
        ] == [
            (
                "effect.prepared",
                op.step_id,
                claim.fence,
                "worker-a",
                {"effect": op.effect, "payload_ref": op.payload_ref},
            ),
            ("effect.dispatching", op.step_id, claim.fence, "worker-a", {"dispatch": 1}),
        ]
        # the history and the revision move as the two writes move them
        assert ledger.run.event_count == len(events) == before.event_count + 2
        assert ledger.run.state_revision - before.state_revision == (
            before.state_revision - run.state_revision
        )
        # the operation goes on as any other: an outcome, or another dispatch
        store.record_outcome(claim, op.operation_id, EffectState.UNKNOWN, error={"type": "Timeout"})
        again = store.mark_dispatching(claim, op.operation_id)
        assert (again.dispatch_count, again.first_dispatched_at) == (2, got.first_dispatched_at)

    def test_prepare_and_mark_dispatching_refuses_whole(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        before = self.snapshot(store, run.run_id)
        with pytest.raises(ValueError, match="does not match"):  # bytes not of the digest
            store.prepare_and_mark_dispatching(claim, op, b'{"other":"bytes"}')
        with pytest.raises(ValueError, match="approval"):  # a gate stands between the two
            store.prepare_and_mark_dispatching(
                claim, replace(op, approval_required=True, target_digest=self.TARGET), payload
            )
        assert self.snapshot(store, run.run_id) == before
        store.prepare_effect(claim, op, payload)
        prepared = self.snapshot(store, run.run_id)
        with pytest.raises(StoreError):  # prepared already: it does not go on to dispatching
            store.prepare_and_mark_dispatching(claim, op, payload)
        assert self.snapshot(store, run.run_id) == prepared

    def test_prepare_and_mark_dispatching_is_held_to_the_history_limit_as_a_prepare(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(None, 3))  # history 1: run.started
        store.record_step(claim, make_step(run.run_id, "s1", 1))  # 2
        # The prepare fits (3); its "dispatching" is never held to the limit: it goes in too.
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        assert store.prepare_and_mark_dispatching(claim, op, payload).dispatch_count == 1
        assert store.get_run(run.run_id).history_size == 4
        before = self.snapshot(store, run.run_id)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        with pytest.raises(HistoryLimitReached):
            store.prepare_and_mark_dispatching(claim, second, data)
        assert self.snapshot(store, run.run_id) == before

    def test_record_outcome_writes_the_operation_and_its_step_in_one_commit(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.APPLIED, receipt={"id": "T-9"})
        applied = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (applied.state, applied.receipt, applied.error) == (EffectState.APPLIED, {"id": "T-9"}, None)
        step = make_step(
            run.run_id,
            op.step_id,
            1,
            kind=StepKind.EFFECT,
            name=op.effect,
            result={"id": "T-9"},
            operation_id=op.operation_id,
        )
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": "T-9"}, step=step)
        ledger = store.load_ledger(run.run_id)
        accepted = ledger.operations[op.operation_id]
        assert (accepted.state, accepted.receipt, accepted.dispatch_count) == (
            EffectState.ACCEPTED,
            {"id": "T-9"},
            1,
        )
        loaded = ledger.steps[op.step_id]
        assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        # atomic: an outcome for an operation that does not exist writes no step either
        before = self.snapshot(store, run.run_id)
        with pytest.raises(StoreError):
            store.record_outcome(
                claim, f"no-such-op-{_uid()}", EffectState.ACCEPTED, step=make_step(run.run_id, "orphan", 2)
            )
        assert self.snapshot(store, run.run_id) == before

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_outcome_with_a_large_result_keeps_it_as_an_artifact(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_and_mark_dispatching(claim, op, payload)
        receipt = {"id": "T-1", "blob": LARGE, "op": op.operation_id}
        step = make_step(
            run.run_id,
            op.step_id,
            1,
            kind=StepKind.EFFECT,
            name=op.effect,
            result=receipt,
            operation_id=op.operation_id,
        )
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt=receipt, step=step)
        ledger = store.load_ledger(run.run_id)
        assert ledger.operations[op.operation_id].receipt == receipt
        assert ledger.steps[op.step_id] == replace(
            step, fence=claim.fence, recorded_at=ledger.steps[op.step_id].recorded_at
        )
        text = dumps(receipt).encode()
        assert store.get_artifact(digest(text)) == text

    def test_effect_transitions_are_events_with_fence_and_worker(self) -> None:
        store = self.store()
        run, old = self.start(store, owner="worker-a", lease_ms=SHORT_LEASE_MS)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(old, op, payload)
        store.mark_dispatching(old, op.operation_id)
        store.record_outcome(old, op.operation_id, EffectState.UNKNOWN, error={"type": "Timeout"})
        claim = self.take_over(store, run.run_id, owner="worker-b")
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        got = [
            (e.kind, e.operation_id, e.fence, e.worker)
            for e in store.events(run.run_id)
            if e.kind.startswith("effect.")
        ]
        assert got == [
            ("effect.prepared", op.operation_id, 1, "worker-a"),
            ("effect.dispatching", op.operation_id, 1, "worker-a"),
            ("effect.unknown", op.operation_id, 1, "worker-a"),
            ("effect.dispatching", op.operation_id, 2, "worker-b"),
            ("effect.accepted", op.operation_id, 2, "worker-b"),
        ]
