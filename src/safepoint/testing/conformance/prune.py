"""Store conformance: finished runs deleted whole, a batch at a time (``Store.prune_runs``).

Every prune here names the test's own workflow (``PruneRequest.workflow``), so that the suite
can share its database with other tests and never deletes a run it did not make.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from ..._rules.canonical import canonical, digest
from ..._rules.retention import PRUNABLE
from ...errors import ArtifactMissing, RunNotFound
from ...storage.base import ForkRun, Store
from ...storage.prune import PruneBatch, PruneRequest
from ...types import (
    Claim,
    EffectState,
    OperationRecord,
    Resend,
    Resolution,
    ResolutionAction,
    RunRecord,
    RunRetry,
    RunStatus,
)
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import LARGE, ConformanceBase, _uid, make_attempt, make_operation, make_step


class PruneTests(ConformanceBase):
    """The conformance tests of pruning finished runs."""

    def _prune(self, store: Store, **fields: Any) -> PruneBatch:
        """One batch over this test's runs that finished up to now (give or take a second: a
        store's clock may be an estimate of its database's)."""
        fields.setdefault("statuses", PRUNABLE)
        fields.setdefault("before", store.now() + 1_000)
        return store.prune_runs(PruneRequest(workflow=self.workflow, **fields))

    def _sent(
        self, store: Store, claim: Claim, step_id: str, seq: int, *, retention_ms: int | None = 1
    ) -> OperationRecord:
        """An accepted operation of the claimed run, whose owner forgets its key after 1 ms."""
        return self.accepted(store, claim, step_id, seq, retention_ms=retention_ms)

    def _finished(
        self, store: Store, status: RunStatus = RunStatus.COMPLETED, **kw: Any
    ) -> tuple[RunRecord, OperationRecord]:
        """A run that recorded steps (one large), a failed attempt, a message and an effect, then
        ended at ``status``."""
        run, claim = self.start(store, **kw)
        large = {"text": LARGE, "run": run.run_id}  # its own: the suite may share its database
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.record_step(claim, make_step(run.run_id, "big", 2, result=large))
        store.record_attempt(claim, make_attempt(run.run_id, "s3", 1))
        store.send_message(run.run_id, "answer", {"answer": large})
        op = self._sent(store, claim, "send", 3)
        store.finish_run(claim, status, result={"done": large} if status is RunStatus.COMPLETED else None)
        time.sleep(0.002)  # past the operation's 1 ms retention
        return store.get_run(run.run_id), op

    def _gone(self, store: Store, run_id: str) -> None:
        with pytest.raises(RunNotFound):
            store.get_run(run_id)
        assert store.events(run_id) == []
        assert store.messages(run_id) == []
        assert store.approvals(run_id) == []

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_finished_run_is_deleted_whole_with_the_artifacts_only_it_referenced(self) -> None:
        store = self.store()
        run, op = self._finished(store)
        _, events = self.snapshot(store, run.run_id)
        batch = self._prune(store)
        assert batch.runs == (run.run_id,)
        assert batch.rows == {
            "approvals": 0,
            "messages": 1,
            "attempts": 1,
            "steps": 3,
            "operations": 1,
            "events": len(events),
            "runs": 1,
        }
        # the large step result, the run's large result, the message and the payload
        assert batch.artifacts == 4
        assert batch.artifact_bytes > 3 * len(LARGE)
        assert (batch.kept, batch.after) == ((), None)
        self._gone(store, run.run_id)
        with pytest.raises(ArtifactMissing):
            store.get_artifact(op.payload_ref)

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_artifact_another_run_references_is_kept(self) -> None:
        store = self.store()
        run, op = self._finished(store)
        other, claim = self.start(store, workflow=f"other-{_uid()}")
        large = {"text": LARGE, "run": run.run_id}  # the pruned run's large step result
        store.record_step(claim, make_step(other.run_id, "big", 1, result=large))
        shared, _ = make_operation(other.run_id, f"op-{_uid()}")
        shared = replace(shared, payload_ref=op.payload_ref)
        data = canonical({"op": op.operation_id, "amount": 5})  # the pruned run's payload
        assert digest(data) == op.payload_ref
        store.prepare_effect(claim, shared, data)
        batch = self._prune(store)
        assert batch.runs == (run.run_id,)
        # its run result and its message go; of the two values the other run holds too, a store
        # that keeps one copy of a value (SQLite) keeps it, one that keeps a copy per run
        # (PostgreSQL) deletes the pruned run's and keeps the other's
        assert batch.artifacts in (2, 4)
        assert store.get_artifact(op.payload_ref) == data
        assert store.load_ledger(other.run_id).steps["big"].result == large
        store.finish_run(claim, RunStatus.CANCELLED)
        last = store.prune_runs(
            PruneRequest(statuses=PRUNABLE, before=store.now() + 1_000, workflow=other.workflow)
        )
        assert (last.runs, last.artifacts) == ((other.run_id,), 2)  # nothing of either is left
        with pytest.raises(ArtifactMissing):
            store.get_artifact(op.payload_ref)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_run_that_is_not_finished_is_never_touched(self) -> None:
        store = self.store()
        running, claim = self.start(store)
        store.record_step(claim, make_step(running.run_id, "s1", 1))
        pending = self.submit(store)
        blocked, blocked_claim = self.start(store)
        store.finish_run(blocked_claim, RunStatus.BLOCKED, recovery_record={"phase": "test"})
        waiting, waiting_claim, op = self._gated(store)
        store.await_approval(waiting_claim, op.operation_id, self.TARGET)
        batch = self._prune(store, before=store.now() + 60_000)
        assert batch.runs == ()
        for run in (running, pending, blocked, waiting):
            assert store.get_run(run.run_id).run_id == run.run_id
        assert list(store.load_ledger(running.run_id).steps) == ["s1"]

    @exercises(VALUES, ACROSS_RUNS)
    def test_only_the_statuses_asked_for_and_runs_finished_before_the_cut_off_go(self) -> None:
        store = self.store()
        failed, _ = self._finished(store, RunStatus.FAILED)
        cut_off = failed.updated_at + 1  # both stamped by the store's clock
        time.sleep(0.01)
        late, _ = self._finished(store)
        assert self._prune(store, statuses=frozenset({RunStatus.COMPLETED}), before=cut_off).runs == ()
        assert self._prune(store, before=cut_off).runs == (failed.run_id,)
        assert self._prune(store).runs == (late.run_id,)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_dry_run_reports_what_would_go_and_deletes_nothing(self) -> None:
        store = self.store()
        run, _ = self._finished(store)
        before = self.snapshot(store, run.run_id)
        dry = self._prune(store, dry_run=True)
        assert dry.runs == (run.run_id,)
        assert self.snapshot(store, run.run_id) == before
        done = self._prune(store, before=dry.before)
        assert (done.runs, done.rows, done.artifacts, done.artifact_bytes) == (
            dry.runs,
            dry.rows,
            dry.artifacts,
            dry.artifact_bytes,
        )

    @exercises(VALUES, ACROSS_RUNS)
    def test_batches_are_bounded_and_a_cursor_carries_the_prune_on(self) -> None:
        store = self.store()
        runs = [self._finished(store)[0].run_id for _ in range(5)]
        before = store.now() + 1_000
        seen: list[str] = []
        after = None
        for _ in range(10):
            batch = self._prune(store, limit=2, before=before, after=after)
            assert len(batch.runs) <= 2
            seen.extend(batch.runs)
            after = batch.after
            if after is None:
                break
        assert sorted(seen) == sorted(runs)

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_operation_its_owner_may_still_remember_keeps_the_run_unless_forced(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        self._sent(store, claim, "send", 1, retention_ms=3_600_000)
        store.finish_run(claim, RunStatus.COMPLETED)
        undeclared, claim = self.start(store)
        self._sent(store, claim, "send", 1, retention_ms=None)
        store.finish_run(claim, RunStatus.COMPLETED)
        never_sent, claim = self.start(store)
        op, data = make_operation(never_sent.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, data)  # prepared, never dispatched: no owner saw the key
        store.finish_run(claim, RunStatus.CANCELLED)
        batch = self._prune(store)
        assert batch.runs == (never_sent.run_id,)
        assert {kept.run_id for kept in batch.kept} == {run.run_id, undeclared.run_id}
        assert all(kept.forced for kept in batch.kept)
        assert "dedup retention" in next(k.reason for k in batch.kept if k.run_id == run.run_id)
        assert "declares no dedup_retention" in next(
            k.reason for k in batch.kept if k.run_id == undeclared.run_id
        )
        forced = self._prune(store, force=True)
        assert sorted(forced.runs) == sorted([run.run_id, undeclared.run_id])

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_operation_once_sent_keeps_its_run_though_its_count_went_back_to_nothing(self) -> None:
        """A resend (``retry_run``) clears the operation's dispatch count and first dispatch for
        its next attempt, and a "not applied" resolution puts it back to prepared; neither
        makes the owner forget the key it was sent under."""
        store = self.store()
        resent, claim = self.start(store)
        op, data = make_operation(resent.run_id, f"op-{_uid()}")
        op = replace(op, dedup_retention_ms=3_600_000)
        store.prepare_and_mark_dispatching(claim, op, data)
        store.record_outcome(claim, op.operation_id, EffectState.REJECTED, error={"status": 402})
        store.finish_run(claim, RunStatus.FAILED, error={"type": "EffectRejected", "message": "…"})
        failed = store.get_run(resent.run_id)
        again = Resend(op.operation_id, op.step_id, 2, f"key-2-{_uid()}")
        store.retry_run(resent.run_id, failed.state_revision, RunRetry(by="ana", resend=(again,)))
        store.request_cancel(resent.run_id, "ana")  # pending: it ends cancelled before the resend
        assert store.load_ledger(resent.run_id).operations[op.operation_id].dispatch_count == 0

        resolved, claim = self.start(store)
        op, data = make_operation(resolved.run_id, f"op-{_uid()}")
        op = replace(op, dedup_retention_ms=3_600_000)
        store.prepare_and_mark_dispatching(claim, op, data)
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "test"})
        blocked = store.get_run(resolved.run_id)
        decision = Resolution(ResolutionAction.NOT_APPLIED, "ana", operation_id=op.operation_id)
        released = store.resolve(resolved.run_id, blocked.state_revision, decision)
        taken = store.claim_run(resolved.run_id, released.state_revision, "worker-b", 60_000)
        assert taken is not None
        store.finish_run(taken, RunStatus.CANCELLED)  # before it was sent again
        assert store.load_ledger(resolved.run_id).operations[op.operation_id].state is EffectState.PREPARED

        assert store.get_run(resent.run_id).status is RunStatus.CANCELLED
        assert store.get_run(resolved.run_id).status is RunStatus.CANCELLED
        batch = self._prune(store)
        assert batch.runs == ()
        assert {kept.run_id for kept in batch.kept} == {resent.run_id, resolved.run_id}
        assert all(kept.forced and "dedup retention" in kept.reason for kept in batch.kept)
        assert sorted(self._prune(store, force=True).runs) == sorted([resent.run_id, resolved.run_id])

    @exercises(VALUES, ACROSS_RUNS)
    def test_approvals_go_with_their_run(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        store.approve(run.run_id, op.step_id, self._request())
        again = store.claim_run(run.run_id, store.get_run(run.run_id).state_revision, "worker-b", 60_000)
        assert again is not None
        store.finish_run(again, RunStatus.CANCELLED)
        batch = self._prune(store)
        assert batch.runs == (run.run_id,)
        assert (batch.rows["approvals"], batch.rows["operations"]) == (1, 1)
        self._gone(store, run.run_id)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_chain_goes_whole_once_its_last_run_finished(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        self._sent(store, claim, "send", 2)
        child, child_claim = store.continue_as_new(claim, self.successor(run.run_id))
        assert child_claim is not None
        time.sleep(0.002)
        assert self._prune(store).runs == ()  # its last run is running: the chain stays
        assert store.get_run(run.run_id).status is RunStatus.CONTINUED
        store.finish_run(child_claim, RunStatus.COMPLETED)
        batch = self._prune(store)
        assert sorted(batch.runs) == sorted([run.run_id, child.run_id])
        self._gone(store, run.run_id)
        self._gone(store, child.run_id)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_forks_source_stays_while_the_fork_stays(self) -> None:
        store = self.store()
        source, claim = self.start(store)
        store.record_step(claim, make_step(source.run_id, "a", 1))
        self._sent(store, claim, "send", 2)
        store.record_step(claim, make_step(source.run_id, "b", 3))
        store.finish_run(claim, RunStatus.COMPLETED)
        fork = store.fork_run(
            ForkRun(source_run_id=source.run_id, from_step="b", run_id=f"fork-{_uid()}", by="ana")
        )
        batch = self._prune(store)
        assert batch.runs == ()
        assert [(kept.run_id, kept.fork) for kept in batch.kept] == [(source.run_id, True)]
        fork_claim = store.claim_run(fork.run_id, fork.state_revision, "worker-b", 60_000)
        assert fork_claim is not None
        store.finish_run(fork_claim, RunStatus.COMPLETED)
        assert self._prune(store).runs == (fork.run_id,)  # the fork first
        assert self._prune(store).runs == (source.run_id,)  # then its source
        self._gone(store, source.run_id)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_pruned_run_id_used_again_finds_none_of_the_old_runs_records(self) -> None:
        store = self.store()
        run, _ = self._finished(store)
        self._prune(store)
        again, claim = self.start(store, run_id=run.run_id)
        ledger, events = self.snapshot(store, again.run_id)
        assert (ledger.steps, ledger.operations, ledger.attempts) == ({}, {}, {})
        assert store.messages(again.run_id) == []
        assert [event.kind for event in events] == [event.kind for event in store.events(again.run_id)]
        assert all(event.at >= again.created_at for event in events)
        assert claim.fence == 1
