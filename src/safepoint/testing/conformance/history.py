"""Store conformance: bounded history and continue-as-new."""

from __future__ import annotations

import warnings

import pytest

from ...errors import Cancelled, HistoryLimitReached, HistoryWarning, LostOwnership, RunConflict, RunNotFound
from ...storage.base import Replan
from ...types import Claim, EffectState, RunStatus, StepKind
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import (
    LARGE,
    LONG_LEASE_MS,
    ConformanceBase,
    _uid,
    make_attempt,
    make_operation,
    make_step,
    stamped_between,
)


class HistoryTests(ConformanceBase):
    """The conformance tests of bounded history and continue-as-new."""

    def test_the_history_counts_every_event_and_every_new_step(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        assert (run.event_count, run.step_count, run.history_size) == (1, 0, 1)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.record_step(claim, make_step(run.run_id, "s1", 1, result="re-read"))  # replaces
        store.record_step(claim, make_step(run.run_id, "s2", 2))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        step = make_step(run.run_id, op.step_id, 3, kind=StepKind.EFFECT, operation_id=op.operation_id)
        for _ in range(2):  # the second outcome is an event, its step row is replaced
            store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1}, step=step)
        ledger, events = self.snapshot(store, run.run_id)
        assert (ledger.run.event_count, ledger.run.step_count) == (len(events), len(ledger.steps))
        assert (len(events), len(ledger.steps)) == (5, 3)
        assert ledger.run.history_size == 8

    def test_history_limits_and_the_chain_are_recorded_with_the_run(self) -> None:
        store = self.store()
        run, _ = self.start(store, history=(100, 500))
        assert (run.history_soft_limit, run.history_hard_limit, run.history_warned_at) == (100, 500, None)
        assert (run.chain_id, run.chain_index, run.parent_run_id, run.successor_run_id) == (
            run.run_id,
            0,
            None,
            None,
        )
        assert store.get_run(run.run_id) == run
        unlimited = self.submit(store)
        assert (unlimited.history_soft_limit, unlimited.history_hard_limit) == (None, None)

    def test_the_hard_history_limit_refuses_new_work_in_the_fenced_write(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(None, 5))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)  # history 2
        for seq in (1, 2, 3):
            store.record_step(claim, make_step(run.run_id, f"s{seq}", seq))  # 3, 4, 5
        before = self.snapshot(store, run.run_id)
        with pytest.raises(HistoryLimitReached) as refused:
            store.record_step(claim, make_step(run.run_id, "s4", 4))
        assert (refused.value.run_id, refused.value.size, refused.value.limit) == (run.run_id, 5, 5)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        with pytest.raises(HistoryLimitReached):
            store.prepare_effect(claim, second, data)
        assert self.snapshot(store, run.run_id) == before  # refused whole: not even the lease
        # A step recorded again adds nothing; what is in flight is sent and settled, and the
        # run ends, whatever the history.
        store.record_step(claim, make_step(run.run_id, "s3", 3, result="re-read"))
        store.mark_dispatching(claim, op.operation_id)
        step = make_step(run.run_id, op.step_id, 5, kind=StepKind.EFFECT, operation_id=op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1}, step=step)
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "history_limit"})
        ledger, events = self.snapshot(store, run.run_id)
        assert ledger.operations[op.operation_id].state is EffectState.ACCEPTED
        assert "s4" not in ledger.steps
        assert second.operation_id not in ledger.operations
        assert (ledger.run.status, ledger.run.history_size) == (RunStatus.BLOCKED, 9)
        assert ledger.run.history_size == len(events) + len(ledger.steps)

    def test_the_soft_history_limit_is_recorded_once_and_warns(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(3, 50))
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        assert store.get_run(run.run_id).history_warned_at is None
        with pytest.warns(HistoryWarning, match=run.run_id):
            store.record_step(claim, make_step(run.run_id, "s2", 2))  # history 3: the limit
        warned = store.get_run(run.run_id)
        assert warned.history_warned_at is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error", HistoryWarning)  # a second warning would raise
            store.record_step(claim, make_step(run.run_id, "s3", 3))
            op, payload = make_operation(run.run_id, f"op-{_uid()}")
            store.prepare_effect(claim, op, payload)
            store.mark_dispatching(claim, op.operation_id)
            store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        ledger, events = self.snapshot(store, run.run_id)
        [event] = [e for e in events if e.kind == "run.history_warning"]
        assert (event.fence, event.worker, event.detail) == (
            claim.fence,
            "worker-a",
            {"history": 4, "soft": 3, "hard": 50},
        )
        assert ledger.run.history_warned_at == warned.history_warned_at
        assert ledger.run.event_count == len(events)

    @exercises(VALUES, ACROSS_RUNS)
    def test_continue_as_new_ends_the_run_and_starts_its_successor_at_once(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(10, 20))
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        kept, _ = self.snapshot(store, run.run_id)
        successor = self.successor(
            run.run_id,
            inputs={"args": [{"carried": LARGE}], "kwargs": {}},
            resume_budget=3,
            history_soft_limit=10,
            history_hard_limit=20,
        )
        t0 = store.now()
        child, child_claim = store.continue_as_new(claim, successor)
        t1 = store.now()
        assert child_claim == Claim(
            successor.run_id, "worker-a", 1, child.state_revision, child.lease_expires_at or 0, LONG_LEASE_MS
        )
        assert stamped_between(t0 + LONG_LEASE_MS, child.lease_expires_at, t1 + LONG_LEASE_MS)
        assert (child.status, child.owner, child.fence, child.resume_count, child.inputs) == (
            RunStatus.RUNNING,
            "worker-a",
            1,
            0,
            successor.inputs,
        )
        assert (child.parent_run_id, child.chain_id, child.chain_index, child.successor_run_id) == (
            run.run_id,
            run.run_id,
            1,
            None,
        )
        assert (child.resume_budget, child.history_soft_limit, child.history_hard_limit) == (3, 10, 20)
        ended = store.get_run(run.run_id)
        assert (ended.status, ended.successor_run_id, ended.owner, ended.lease_expires_at) == (
            RunStatus.CONTINUED,
            successor.run_id,
            None,
            None,
        )
        assert ended.status.terminal
        # nothing of the parent's history is carried: the successor has its own, fresh
        ledger, events = self.snapshot(store, child.run_id)
        assert (ledger.steps, ledger.operations) == ({}, {})
        assert [(e.kind, e.fence, e.worker) for e in events] == [("run.started", 1, "worker-a")]
        assert (child.event_count, child.step_count) == (1, 0)
        parent, parent_events = self.snapshot(store, run.run_id)
        assert (parent.steps, parent.operations) == (kept.steps, kept.operations)
        assert (parent_events[-1].kind, parent_events[-1].detail) == (
            "run.continued",
            {"successor": successor.run_id},
        )
        assert parent.run.event_count == len(parent_events)
        with pytest.raises(LostOwnership):  # the parent's worker moved on to the successor
            store.record_step(claim, make_step(run.run_id, "late", 9))
        assert store.claim_run(run.run_id, ended.state_revision, "worker-b", LONG_LEASE_MS) is None
        # the chain goes on from the successor
        grandchild, _ = store.continue_as_new(child_claim, self.successor(run.run_id, n=2))
        assert (grandchild.parent_run_id, grandchild.chain_id, grandchild.chain_index) == (
            child.run_id,
            run.run_id,
            2,
        )
        assert store.get_run(child.run_id).successor_run_id == grandchild.run_id

    def test_continue_as_new_is_refused_once_a_cancel_is_asked(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.request_cancel(run.run_id, "ops")
        before = self.snapshot(store, run.run_id)
        with pytest.raises(Cancelled):
            store.continue_as_new(claim, self.successor(run.run_id))
        assert self.snapshot(store, run.run_id) == before
        with pytest.raises(RunNotFound):
            store.get_run(f"{run.run_id}~1")

    def test_a_successor_id_held_by_another_run_is_a_conflict_that_changes_nothing(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        other = self.submit(store, run_id=f"{run.run_id}~1")
        before = self.snapshot(store, run.run_id)
        with pytest.raises(RunConflict):
            store.continue_as_new(claim, self.successor(run.run_id))
        assert self.snapshot(store, run.run_id) == before
        assert store.get_run(other.run_id) == other

    def test_a_successor_finds_what_its_chain_settled_by_operation_id(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        settled = {}
        for state in (EffectState.ACCEPTED, EffectState.REJECTED, EffectState.PREPARED):
            op, payload = make_operation(run.run_id, f"op-{state.value}-{_uid()}")
            store.prepare_effect(claim, op, payload)
            if state is not EffectState.PREPARED:
                store.mark_dispatching(claim, op.operation_id)
                store.record_outcome(
                    claim,
                    op.operation_id,
                    state,
                    receipt={"id": 7},
                    error={"status": 402} if state is EffectState.REJECTED else None,
                )
            settled[state] = op.operation_id
        parent = store.load_ledger(run.run_id)
        child, child_claim = store.continue_as_new(claim, self.successor(run.run_id))
        assert child_claim is not None
        for state in (EffectState.ACCEPTED, EffectState.REJECTED):
            found = store.chain_operation(run.run_id, settled[state])
            assert found == parent.operations[settled[state]]
            assert (found.run_id, found.state) == (run.run_id, state)
        assert store.chain_operation(run.run_id, settled[EffectState.PREPARED]) is None
        assert store.chain_operation(run.run_id, f"no-such-op-{_uid()}") is None
        stranger, _ = self.start(store)  # another chain sees none of it
        assert store.chain_operation(stranger.run_id, settled[EffectState.ACCEPTED]) is None
        # what the successor settles is found under the chain too
        op, payload = make_operation(child.run_id, f"op-child-{_uid()}")
        store.prepare_effect(child_claim, op, payload)
        store.mark_dispatching(child_claim, op.operation_id)
        store.record_outcome(child_claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 8})
        found = store.chain_operation(run.run_id, op.operation_id)
        assert found is not None
        assert (found.run_id, found.receipt) == (child.run_id, {"id": 8})

    def test_a_warning_the_store_records_is_always_issued_once(self) -> None:
        """Whichever worker write finds the history at its soft limit first — here the retry of
        an attempt — the warning it records is the one issued."""
        store = self.store()
        run, claim = self.start(store, history=(1, 50))  # run.started: at the soft limit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store.record_attempt(claim, make_attempt(run.run_id, "s1", 1))
            store.record_step(claim, make_step(run.run_id, "s1", 1))
        issued = [w for w in caught if issubclass(w.category, HistoryWarning)]
        recorded = [e for e in store.events(run.run_id) if e.kind == "run.history_warning"]
        assert (len(recorded), len(issued)) == (1, 1)

    def test_a_re_plan_moves_abandoned_steps_from_the_step_count_to_the_events(self) -> None:
        """An abandoned step leaves the steps for the history's events: the history is what is
        stored, counted once."""
        store = self.store()
        run, claim = self.start(store)
        for seq in (1, 2, 3):
            store.record_step(claim, make_step(run.run_id, f"s{seq}", seq))
        store.replan(claim, Replan(reason="inputs moved", step_id="s2", through_seq=3))
        ledger, events = self.snapshot(store, run.run_id)
        assert sorted(ledger.steps) == ["s1"]
        assert (ledger.run.step_count, ledger.run.event_count) == (1, len(events))
        assert ledger.run.history_size == len(events) + len(ledger.steps)
        store.record_step(claim, make_step(run.run_id, "s2", 4))  # asked again: a new step
        assert store.get_run(run.run_id).step_count == 2

    def test_a_re_plan_keeps_the_steps_it_is_told_to_keep(self) -> None:
        """Inside a fan-out, a sibling branch's steps recorded after the stale step do not
        answer the changed question: the re-plan names them, and they stay."""
        store = self.store()
        run, claim = self.start(store)
        for seq, sid in enumerate(("fan.a/s", "fan.b/s", "fan.a/t", "fan.b/t", "join"), 1):
            store.record_step(claim, make_step(run.run_id, sid, seq))
        store.replan(
            claim,
            Replan(reason="inputs moved", step_id="fan.a/s", through_seq=5, keep=("fan.b/s", "fan.b/t")),
        )
        ledger, events = self.snapshot(store, run.run_id)
        assert sorted(ledger.steps) == ["fan.b/s", "fan.b/t"]
        assert [e.step_id for e in events if e.kind == "step.abandoned"] == ["fan.a/s", "fan.a/t", "join"]
        assert (ledger.run.step_count, ledger.run.event_count) == (2, len(events))
