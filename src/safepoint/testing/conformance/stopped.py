"""Store conformance: runs stopped at a limit, and limits a person raises (``stop_run``,
``extend_limits``, and the model calls counted with the steps that make them)."""

from __future__ import annotations

import pytest

from ..._rules.limits import limits_of
from ...errors import LostOwnership, RunNotFound
from ...storage.base import Store
from ...types import Claim, LimitChange, RunLimits, RunRecord, RunStatus, StepKind, StepStatus
from ._concerns import CLAIMS, CONCURRENCY, CONTROL, VALUES, exercises
from ._support import LONG_LEASE_MS, SHORT_LEASE_MS, ConformanceBase, _uid, in_threads, make_step

ERROR = {"type": "BudgetExhausted", "message": "spent 34 tokens of its tokens budget of 30"}


def stop_record(step_id: str | None = "turn.2") -> dict[str, object]:
    """A recovery record of phase limit_reached, as the engine builds it (trimmed)."""
    return {
        "schema_version": 1,
        "state_revision": None,
        "phase": "limit_reached",
        "limit": "tokens",
        "allowed": 30,
        "spent": 34,
        "step_id": step_id,
        "evidence_refs": [],
    }


class StoppedTests(ConformanceBase):
    """The conformance tests of runs stopped at a limit and of raising a limit."""

    def _limited(self, store: Store, *, owner: str | None = "worker-a") -> tuple[RunRecord, Claim | None]:
        return self.new_run(
            store,
            owner=owner,
            lease_ms=LONG_LEASE_MS if owner else 0,
            token_budget=30,
            cost_budget=1.5,
            model_call_budget=4,
            resume_budget=3,
        )

    def _stopped(self, store: Store) -> tuple[RunRecord, Claim]:
        run, claim = self._limited(store)
        assert claim is not None
        assert store.stop_run(claim, limits_of(run), error=ERROR, recovery_record=stop_record())
        return store.get_run(run.run_id), claim

    @staticmethod
    def _change(run: RunRecord, *, by: str = "ana", **new: object) -> LimitChange:
        old = limits_of(run)
        fields = {**old.as_json(), **new}
        return LimitChange(old=old, new=RunLimits(**fields), by=by, reason="long case")

    @exercises(CONTROL)
    def test_model_calls_are_counted_in_the_commit_of_their_steps(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "m1", 1, kind=StepKind.MODEL, tokens=10))
        store.record_step(claim, make_step(run.run_id, "p1", 2))  # not a model call
        store.record_steps(
            claim,
            [
                make_step(run.run_id, "p2", 3),
                make_step(run.run_id, "m2", 4, kind=StepKind.MODEL),  # no usage reported: still a call
                make_step(run.run_id, "m3", 5, kind=StepKind.MODEL, status=StepStatus.FAILED, result=None),
            ],
        )
        counted = store.get_run(run.run_id)
        assert (counted.model_calls_spent, counted.tokens_spent) == (3, 10)
        store.finish_run(claim, RunStatus.COMPLETED)
        assert store.get_run(run.run_id).model_calls_spent == 3  # what was spent stays spent

    @exercises(VALUES, CLAIMS)
    def test_a_stopped_run_is_released_with_its_record_and_never_claimed(self) -> None:
        store = self.store()
        run, claim = self._stopped(store)
        assert (run.status, run.owner, run.lease_expires_at, run.error) == (
            RunStatus.STOPPED,
            None,
            None,
            ERROR,
        )
        assert run.recovery_record == {**stop_record(), "state_revision": run.state_revision}
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.fence, event.worker) == ("run.stopped", claim.fence, "worker-a")
        assert event.detail == {
            "type": "BudgetExhausted",
            "limit": "tokens",
            "allowed": 30,
            "spent": 34,
            "step_id": "turn.2",
        }
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        assert store.claim_run(run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS) is None
        assert store.get_run(run.run_id).state_revision == run.state_revision
        with pytest.raises(LostOwnership):  # its worker holds nothing any more
            store.record_step(claim, make_step(run.run_id, "late", 9))

    @exercises(CONTROL)
    def test_a_stop_is_refused_when_the_limits_moved_since_the_worker_read_them(self) -> None:
        store = self.store()
        run, claim = self._limited(store)
        assert claim is not None
        extended = store.extend_limits(run.run_id, run.state_revision, self._change(run, tokens=100))
        assert extended is not None
        assert extended.status is RunStatus.RUNNING
        before = self.snapshot(store, run.run_id)
        assert not store.stop_run(claim, limits_of(run), error=ERROR, recovery_record=stop_record())
        assert self.snapshot(store, run.run_id) == before  # nothing written
        assert store.stop_run(claim, limits_of(extended), error=ERROR, recovery_record=stop_record())
        assert store.get_run(run.run_id).status is RunStatus.STOPPED

    @exercises(CONTROL)
    def test_a_stale_worker_cannot_stop_the_run(self) -> None:
        store = self.store()
        run, stale = self._limited(store)
        assert stale is not None
        store.release_run(stale)
        fresh = store.claim_run(
            run.run_id, store.get_run(run.run_id).state_revision, "worker-b", LONG_LEASE_MS
        )
        assert fresh is not None
        with pytest.raises(LostOwnership):
            store.stop_run(stale, limits_of(run), error=ERROR, recovery_record=stop_record())
        assert store.get_run(run.run_id).status is RunStatus.RUNNING

    @exercises(VALUES, CLAIMS)
    def test_extend_limits_makes_a_stopped_run_pending_and_keeps_what_was_spent(self) -> None:
        store = self.store()
        run, claim = self._limited(store)
        assert claim is not None
        store.record_step(claim, make_step(run.run_id, "m1", 1, kind=StepKind.MODEL, tokens=34, cost=0.5))
        assert store.stop_run(claim, limits_of(run), error=ERROR, recovery_record=stop_record())
        stopped = store.get_run(run.run_id)
        change = self._change(stopped, tokens=100, deadline=stopped.created_at + 3_600_000, step_attempts=6)
        extended = store.extend_limits(run.run_id, stopped.state_revision, change)
        assert extended is not None
        assert extended == store.get_run(run.run_id)
        assert (extended.status, extended.error, extended.recovery_record, extended.owner) == (
            RunStatus.PENDING,
            None,
            None,
            None,
        )
        assert limits_of(extended) == change.new
        assert (extended.tokens_spent, extended.cost_spent, extended.model_calls_spent) == (34, 0.5, 1)
        assert extended.state_revision > stopped.state_revision
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.worker) == ("run.limits_extended", "ana")
        assert event.detail == {
            "by": "ana",
            "reason": "long case",
            "old": change.old.as_json(),
            "new": change.new.as_json(),
            "released": True,
        }
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])  # workers take it again
        assert taken is not None
        assert taken.run_id == run.run_id
        assert store.get_run(run.run_id).resume_count == stopped.resume_count  # not a takeover

    @exercises(CONTROL, CONCURRENCY)
    def test_extend_limits_is_a_compare_and_set_on_the_revision(self) -> None:
        store = self.store()
        stopped, _ = self._stopped(store)
        before = self.snapshot(store, stopped.run_id)
        moved = stopped.state_revision - 1
        assert store.extend_limits(stopped.run_id, moved, self._change(stopped, tokens=100)) is None
        assert self.snapshot(store, stopped.run_id) == before
        results = in_threads(  # two people at once, from the same revision: one wins
            *(
                lambda t=tokens: store.extend_limits(
                    stopped.run_id, stopped.state_revision, self._change(stopped, tokens=t)
                )
                for tokens in (100, 200)
            )
        )
        won = [r for r in results if r is not None]
        assert len(won) == 1
        assert store.get_run(stopped.run_id).token_budget == won[0].token_budget
        assert [e.kind for e in store.events(stopped.run_id)].count("run.limits_extended") == 1

    @exercises(CONTROL, CLAIMS)
    def test_a_running_run_keeps_its_status_and_an_ended_run_is_left_alone(self) -> None:
        store = self.store()
        run, claim = self._limited(store, owner=None)
        assert claim is None
        pending = store.extend_limits(run.run_id, run.state_revision, self._change(run, model_calls=9))
        assert pending is not None
        assert (pending.status, pending.model_call_budget) == (RunStatus.PENDING, 9)
        assert store.events(run.run_id)[-1].detail["released"] is False
        taken = store.claim_next("worker-a", SHORT_LEASE_MS, [self.workflow])
        assert taken is not None
        store.finish_run(taken, RunStatus.COMPLETED, result=1)
        done = store.get_run(run.run_id)
        assert store.extend_limits(run.run_id, done.state_revision, self._change(done, tokens=99)) is None
        assert store.get_run(run.run_id).token_budget == 30
        with pytest.raises(RunNotFound):
            store.extend_limits(f"missing-{_uid()}", 1, self._change(done, tokens=99))

    def test_a_stopped_run_is_cancelled_at_once(self) -> None:
        store = self.store()
        stopped, _ = self._stopped(store)
        cancelled = store.request_cancel(stopped.run_id, "ops", "not needed")
        assert (cancelled.status, (cancelled.error or {}).get("type")) == (RunStatus.CANCELLED, "Cancelled")
