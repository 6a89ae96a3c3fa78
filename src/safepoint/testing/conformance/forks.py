"""Store conformance: forks — a run made from another's prefix, and an operation found in a
run's fork ancestry."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from ...errors import ClaimedInFamily, ForkRefused, RunConflict, RunNotFound
from ...storage.base import ForkRun, Store
from ...types import Claim, EffectState, OperationRecord, RunRecord, RunStatus, StepKind
from ._support import SHORT_LEASE_MS, ConformanceBase, _uid, expire, make_operation, make_step

_PAUSE_S = 0.01  # apart on every store's clock (milliseconds), so that "before" is strict


class ForkTests(ConformanceBase):
    """The conformance tests of forks."""

    def _accept(self, store: Store, claim: Claim, step_id: str, seq: int, **payload: int) -> OperationRecord:
        return self.accepted(store, claim, step_id, seq, **payload)

    def _source(
        self, store: Store, **kw: object
    ) -> tuple[RunRecord, Claim, OperationRecord, OperationRecord]:
        """A run that read, asked a model, sent an effect, recorded ``b`` and sent another: its
        steps ``a``, ``m``, ``send``, ``b``, ``send2``; released, as a run that ended is."""
        run, claim = self.start(store, **kw)  # type: ignore[arg-type]
        store.record_step(claim, make_step(run.run_id, "a", 1, kind=StepKind.READ, observed_at=5))
        store.record_step(claim, make_step(run.run_id, "m", 2, kind=StepKind.MODEL, tokens=120, cost=0.25))
        first = self._accept(store, claim, "send", 3)
        store.record_step(claim, make_step(run.run_id, "b", 4))
        second = self._accept(store, claim, "send2", 5, n=2)
        return run, claim, first, second

    def _ended(self, store: Store, **kw: object) -> tuple[RunRecord, OperationRecord, OperationRecord]:
        run, claim, first, second = self._source(store, **kw)
        store.finish_run(claim, RunStatus.COMPLETED, result={"done": True})
        return store.get_run(run.run_id), first, second

    @staticmethod
    def _fork(source: RunRecord, from_step: str, **fields: object) -> ForkRun:
        fields.setdefault("run_id", f"fork-{_uid()}")
        return ForkRun(source_run_id=source.run_id, from_step=from_step, by="ana", **fields)  # type: ignore[arg-type]

    def test_a_fork_copies_its_sources_steps_before_its_step_and_their_operations(self) -> None:
        store = self.store()
        source, first, second = self._ended(store)
        before = self.snapshot(store, source.run_id)
        fork = store.fork_run(self._fork(source, "b", reason="try the tail again"))
        assert (fork.status, fork.owner, fork.fence, fork.resume_count) == (RunStatus.PENDING, None, 0, 0)
        assert (fork.workflow, fork.workflow_version, fork.inputs, fork.input_hash) == (
            source.workflow,
            source.workflow_version,
            source.inputs,
            source.input_hash,
        )
        assert (fork.workflow_fingerprint, fork.workflow_manifest) == (
            source.workflow_fingerprint,
            source.workflow_manifest,
        )
        assert (fork.chain_id, fork.chain_index, fork.parent_run_id) == (fork.run_id, 0, None)
        assert fork.forked_from == {"run_id": source.run_id, "step_id": "b"}
        # what the copied steps spent is spent: a model step of 120 tokens
        assert (fork.tokens_spent, fork.cost_spent, fork.model_calls_spent) == (120, 0.25, 1)
        assert (fork.step_count, fork.event_count, fork.result, fork.error) == (3, 1, None, None)
        ledger = store.load_ledger(fork.run_id)
        original = before[0]
        assert sorted(ledger.steps) == ["a", "m", "send"]
        for step_id in ("a", "m", "send"):
            assert ledger.steps[step_id] == replace(original.steps[step_id], run_id=fork.run_id)
        assert ledger.operations == {first.operation_id: replace(first, run_id=fork.run_id)}
        assert ledger.attempts == {}
        # filed under the fork's own chain: a successor of the fork finds it there
        assert store.chain_operation(fork.run_id, first.operation_id) == ledger.operations[first.operation_id]
        assert store.chain_operation(fork.run_id, second.operation_id) is None
        [forked] = store.events(fork.run_id)
        assert (forked.kind, forked.step_id, forked.worker) == ("run.forked", "b", "ana")
        assert forked.detail == {
            "from": {"run_id": source.run_id, "step_id": "b"},
            "by": "ana",
            "reason": "try the tail again",
            "steps_copied": 3,
            "operations_copied": [first.operation_id],
            "resend": [],
            "workflow_version": source.workflow_version,
            "current_code": False,
        }
        ledger_after, events_after = self.snapshot(store, source.run_id)
        assert events_after[:-1] == before[1]
        made = events_after[-1]
        assert (made.kind, made.step_id, made.worker) == ("run.fork_made", "b", "ana")
        assert made.detail == {
            "fork": fork.run_id,
            "step_id": "b",
            "by": "ana",
            "reason": "try the tail again",
        }
        # the source is as it was, but for the event it counts
        assert ledger_after == replace(
            before[0], run=replace(before[0].run, event_count=before[0].run.event_count + 1)
        )

    def test_a_fork_on_current_code_is_recorded_under_that_code(self) -> None:
        store = self.store()
        source, _, _ = self._ended(store)
        manifest = {"tools": {"t": "sha256:1"}, "models": ["m-2"], "prompts": {}}
        fork = store.fork_run(
            self._fork(
                source,
                "send",
                current_code=True,
                workflow_version="v2",
                workflow_fingerprint="fp-2",
                workflow_manifest=manifest,
            )
        )
        assert (fork.workflow_version, fork.workflow_fingerprint, fork.workflow_manifest) == (
            "v2",
            "fp-2",
            manifest,
        )
        assert store.events(fork.run_id)[0].detail["current_code"] is True
        assert store.events(fork.run_id)[0].detail["workflow_version"] == "v2"
        # from the first step: nothing copied, nothing spent
        first = store.fork_run(self._fork(source, "a"))
        assert (first.step_count, first.tokens_spent, first.model_calls_spent) == (0, 0, 0)
        assert store.load_ledger(first.run_id).steps == {}

    def test_a_fork_from_a_step_not_recorded_is_refused_listing_the_steps_it_can_start_from(self) -> None:
        store = self.store()
        source, _, _ = self._ended(store)
        before = self.snapshot(store, source.run_id)
        request = self._fork(source, "nope")
        with pytest.raises(ForkRefused) as refused:
            store.fork_run(request)
        assert refused.value.choices == ("a", "m", "send", "b", "send2")
        assert "'send2'" in refused.value.message
        assert "'nope'" in refused.value.message
        assert self.snapshot(store, source.run_id) == before
        with pytest.raises(RunNotFound):
            store.get_run(request.run_id)
        with pytest.raises(RunNotFound):
            store.fork_run(
                ForkRun(source_run_id=f"missing-{_uid()}", from_step="a", run_id=f"f-{_uid()}", by="ana")
            )

    def test_a_run_held_by_a_live_worker_is_not_forked_and_one_whose_lease_ran_out_is(self) -> None:
        store = self.store()
        run, claim, _, _ = self._source(store)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(ForkRefused, match="worker-a"):
            store.fork_run(self._fork(store.get_run(run.run_id), "b"))
        assert self.snapshot(store, run.run_id) == before
        store.release_run(claim)  # let go: released, running with no owner
        assert store.fork_run(self._fork(run, "b")).status is RunStatus.PENDING
        expiring, _, _, _ = self._source(store, lease_ms=SHORT_LEASE_MS)
        expire()
        assert store.fork_run(self._fork(expiring, "b")).forked_from == {
            "run_id": expiring.run_id,
            "step_id": "b",
        }

    def test_a_prefix_holding_an_operation_that_may_have_happened_is_refused_naming_it(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "a", 1))
        time.sleep(_PAUSE_S)
        op, data = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, data)
        store.mark_dispatching(claim, op.operation_id)  # in flight when the worker died
        time.sleep(_PAUSE_S)
        store.record_step(claim, make_step(run.run_id, "b", 3))  # a sibling branch's, say
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "reconcile_effect"})
        before = self.snapshot(store, run.run_id)
        with pytest.raises(ForkRefused) as refused:
            store.fork_run(self._fork(run, "b"))
        assert refused.value.operation_id == op.operation_id
        assert "dispatching" in refused.value.message
        assert self.snapshot(store, run.run_id) == before
        # from before it, it is the fork's tail: the fork is made (its effect step finds it
        # unsettled in the source when it gets there)
        assert store.fork_run(self._fork(run, "a")).step_count == 0

    def test_a_fork_id_that_exists_is_refused_and_nothing_is_written(self) -> None:
        store = self.store()
        source, _, _ = self._ended(store)
        other = self.submit(store)
        before = self.snapshot(store, source.run_id), self.snapshot(store, other.run_id)
        with pytest.raises(RunConflict):
            store.fork_run(self._fork(source, "b", run_id=other.run_id))
        with pytest.raises(RunConflict):  # nor the source's own id
            store.fork_run(self._fork(source, "b", run_id=source.run_id))
        assert (self.snapshot(store, source.run_id), self.snapshot(store, other.run_id)) == before
        made = store.fork_run(self._fork(source, "b"))
        with pytest.raises(RunConflict):  # the same fork asked for again
            store.fork_run(self._fork(source, "b", run_id=made.run_id))
        assert len(store.events(made.run_id)) == 1

    def test_resend_names_operations_the_forks_tail_may_ask_for(self) -> None:
        store = self.store()
        source, first, second = self._ended(store)
        with pytest.raises(ForkRefused) as copied:
            store.fork_run(self._fork(source, "b", resend=(first.operation_id,)))
        assert copied.value.operation_id == first.operation_id
        assert "copied prefix" in copied.value.message
        with pytest.raises(ForkRefused) as unknown:
            store.fork_run(self._fork(source, "b", resend=("nope",)))
        assert unknown.value.choices == (second.operation_id,)
        fork = store.fork_run(self._fork(source, "b", resend=(second.operation_id, second.operation_id)))
        assert fork.forked_from == {
            "run_id": source.run_id,
            "step_id": "b",
            "resend": [second.operation_id],
            "resent_by": {second.operation_id: fork.run_id},
        }
        assert store.events(fork.run_id)[0].detail["resend"] == [second.operation_id]

    def test_a_family_operation_is_held_by_the_first_member_to_send_it(self) -> None:
        """Two forks of one run ask for one operation of the family (one family key): the
        first to mark it dispatching holds it; the other's dispatch is refused, nothing
        written, naming the holder — and finds the holder's operation through its family."""
        store = self.store()
        source, _, _ = self._ended(store)
        fork = store.fork_run(self._fork(source, "b"))
        other = store.fork_run(self._fork(source, "b"))
        assert fork.family_id == other.family_id == (source.family_id or source.run_id)
        assert fork.family_generation == other.family_generation == source.family_generation
        held, data = make_operation(fork.run_id, "route", {"n": 1})
        held = replace(held, family_key="op route")
        claim = store.claim_run(fork.run_id, fork.state_revision, "worker-a", 60_000)
        assert claim is not None
        sent = store.prepare_and_mark_dispatching(claim, held, data)
        assert store.family_operation(fork.run_id, "op route") is None  # its own
        assert store.family_operation(source.run_id, "op route") == sent
        late, late_data = make_operation(other.run_id, "route", {"n": 1})
        late = replace(late, family_key="op route")
        other_claim = store.claim_run(other.run_id, other.state_revision, "worker-b", 60_000)
        assert other_claim is not None
        with pytest.raises(ClaimedInFamily) as refused:  # prepared and sent in one: refused
            store.prepare_and_mark_dispatching(other_claim, late, late_data)
        assert (refused.value.holder_run_id, refused.value.holder_operation_id) == (fork.run_id, "route")
        assert "route" not in store.load_ledger(other.run_id).operations  # nothing written
        store.prepare_effect(other_claim, late, late_data)
        with pytest.raises(ClaimedInFamily):  # prepared first, then sent: refused all the same
            store.mark_dispatching(other_claim, "route")
        kept = store.load_ledger(other.run_id).operations["route"]
        assert (kept.state, kept.dispatch_count) == (EffectState.PREPARED, 0)
        store.record_outcome(claim, "route", EffectState.ACCEPTED, receipt={"id": "r-1"})
        found = store.family_operation(other.run_id, "op route")
        assert found is not None
        assert (found.run_id, found.state, found.receipt) == (
            fork.run_id,
            EffectState.ACCEPTED,
            {"id": "r-1"},
        )
        assert store.family_operation(other.run_id, "op nope") is None

    def test_the_holder_keeps_its_claim_unless_its_dispatch_provably_never_left(self) -> None:
        """A member whose dispatch went back to prepared keeps the family's claim — a request
        of it may still be on its way, and only its key absorbs that — unless that dispatch
        provably never left (``not_sent``): then the next member to send takes the claim."""
        store = self.store()
        source, _, _ = self._ended(store)
        fork = store.fork_run(self._fork(source, "b"))
        other = store.fork_run(self._fork(source, "b"))
        held, data = make_operation(fork.run_id, "route", {"n": 1})
        held = replace(held, family_key="op route")
        claim = store.claim_run(fork.run_id, fork.state_revision, "worker-a", 60_000)
        assert claim is not None
        store.prepare_and_mark_dispatching(claim, held, data)
        store.record_outcome(claim, "route", EffectState.PREPARED)  # found not applied, say
        late, late_data = make_operation(other.run_id, "route", {"n": 1})
        late = replace(late, family_key="op route")
        other_claim = store.claim_run(other.run_id, other.state_revision, "worker-b", 60_000)
        assert other_claim is not None
        store.prepare_effect(other_claim, late, late_data)
        with pytest.raises(ClaimedInFamily):  # still the holder's
            store.mark_dispatching(other_claim, "route")
        store.mark_dispatching(claim, "route")  # the holder sends it again
        store.record_outcome(claim, "route", EffectState.PREPARED, not_sent=True)  # never left
        sent = store.mark_dispatching(other_claim, "route")  # given back: the next sender takes it
        assert (sent.state, sent.dispatch_count) == (EffectState.DISPATCHING, 1)
        with pytest.raises(ClaimedInFamily):  # and holds it now
            store.mark_dispatching(claim, "route")

    def test_a_fork_copies_a_step_that_took_its_outcome_from_its_source(self) -> None:
        """An effect step of a fork that took the source's outcome is recorded with no operation
        of its own: a fork of that fork copies the step, and finds the operation up the line."""
        store = self.store()
        source, _, second = self._ended(store)
        fork = store.fork_run(self._fork(source, "b"))
        claim = store.claim_run(fork.run_id, fork.state_revision, "worker-b", 60_000)
        assert claim is not None
        store.record_step(claim, make_step(fork.run_id, "b", 4))
        taken = make_step(
            fork.run_id,
            "send2",
            5,
            kind=StepKind.EFFECT,
            operation_id=second.operation_id,
            result={"id": "send2"},
        )
        store.record_step(claim, taken)
        store.record_step(claim, make_step(fork.run_id, "c", 6))
        store.finish_run(claim, RunStatus.COMPLETED, result={})
        grandchild = store.fork_run(self._fork(store.get_run(fork.run_id), "c"))
        ledger = store.load_ledger(grandchild.run_id)
        assert sorted(ledger.steps) == ["a", "b", "m", "send", "send2"]
        assert sorted(ledger.operations) == sorted(store.load_ledger(fork.run_id).operations)
