"""Store conformance: a failed run retried by a person (``Store.retry_run``)."""

from __future__ import annotations

from typing import Any

import pytest

from ...errors import RetryRefused
from ...types import (
    Claim,
    EffectState,
    Resend,
    RunRecord,
    RunRetry,
    RunStatus,
    StepKind,
    StepStatus,
)
from ._concerns import CLAIMS, CONCURRENCY, VALUES, exercises
from ._support import ConformanceBase, _uid, in_threads, make_attempt, make_operation, make_step

_FAILURE = {"type": "TimeoutError", "message": "the read timed out"}


class RetryTests(ConformanceBase):
    """The conformance tests of retrying a failed run."""

    def _failed(
        self, store: Any, *, status: RunStatus = RunStatus.FAILED, **ending: Any
    ) -> tuple[RunRecord, Claim]:
        """A run that recorded a step, then failed at step ``s2`` after one failed attempt."""
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.record_attempt(claim, make_attempt(run.run_id, "s2", 1, error=_FAILURE))
        failed = make_step(
            run.run_id,
            "s2",
            2,
            kind=StepKind.READ,
            status=StepStatus.FAILED,
            error=_FAILURE,
            result=None,
            attempt=2,
        )
        store.record_step(claim, failed)
        ending.setdefault("error", {"type": "StepFailed", "message": "…", "step_id": "s2"})
        store.finish_run(claim, status, **ending)
        return store.get_run(run.run_id), claim

    def _history_is_counted(self, store: Any, run_id: str) -> None:
        ledger, events = self.snapshot(store, run_id)
        assert (ledger.run.event_count, ledger.run.step_count) == (len(events), len(ledger.steps))

    @exercises(VALUES, CLAIMS)
    def test_a_retry_moves_the_failed_step_into_the_history_and_makes_the_run_pending(self) -> None:
        store = self.store()
        run, _ = self._failed(store)
        retried = store.retry_run(
            run.run_id,
            run.state_revision,
            RunRetry(by="ana", reason="the service is back", step_id="s2", moved=("s2",)),
        )
        assert retried == store.get_run(run.run_id)
        assert (retried.status, retried.error, retried.recovery_record) == (RunStatus.PENDING, None, None)
        assert (retried.owner, retried.lease_expires_at) == (None, None)
        assert retried.state_revision == run.state_revision + 1
        ledger, events = self.snapshot(store, run.run_id)
        assert list(ledger.steps) == ["s1"]
        assert ledger.attempts == {}  # the step's attempts start again
        moved, asked = events[-2:]
        assert (moved.kind, moved.step_id, moved.worker) == ("step.retried", "s2", "ana")
        assert (moved.detail["status"], moved.detail["error"], moved.detail["attempt"]) == (
            "failed",
            _FAILURE,
            2,
        )
        assert [tried["attempt"] for tried in moved.detail["attempts"]] == [1]
        assert moved.detail["attempts"][0]["error"] == _FAILURE
        assert (asked.kind, asked.step_id, asked.worker) == ("run.retried", "s2", "ana")
        assert asked.detail == {
            "by": "ana",
            "reason": "the service is back",
            "step_id": "s2",
            "moved": ["s2"],
            "resent": [],
        }
        self._history_is_counted(store, run.run_id)
        claim = store.claim_next("worker-c", 60_000, [self.workflow])  # any worker takes it
        assert claim is not None
        assert claim.run_id == run.run_id

    def test_a_retry_with_no_step_moved_keeps_every_step(self) -> None:
        store = self.store()
        run, _ = self._failed(store, error={"type": "KeyError", "message": "'quantity'"})
        before = store.load_ledger(run.run_id)
        store.retry_run(run.run_id, run.state_revision, RunRetry(by="ana"))
        after = store.load_ledger(run.run_id)
        assert (after.steps, after.attempts) == (before.steps, before.attempts)
        assert after.run.status is RunStatus.PENDING
        assert [e.kind for e in store.events(run.run_id)][-1] == "run.retried"
        self._history_is_counted(store, run.run_id)

    def test_a_rejected_operation_is_sent_again_as_its_next_attempt(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_and_mark_dispatching(claim, op, payload)
        refusal: dict[str, Any] = {"status": 402, "reason": "card_declined"}
        store.record_outcome(claim, op.operation_id, EffectState.REJECTED, error=refusal)
        store.finish_run(claim, RunStatus.FAILED, error={"type": "EffectRejected", "message": "…"})
        first = store.load_ledger(run.run_id).operations[op.operation_id]
        again = Resend(op.operation_id, op.step_id, 2, f"key-2-{_uid()}")
        failed = store.get_run(run.run_id)
        store.retry_run(run.run_id, failed.state_revision, RunRetry(by="ana", resend=(again,)))
        sent = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (sent.state, sent.key_attempt, sent.effect_key) == (EffectState.PREPARED, 2, again.effect_key)
        assert (sent.dispatch_count, sent.first_dispatched_at, sent.receipt, sent.error) == (
            0,
            None,
            None,
            None,
        )
        assert (sent.payload_ref, sent.step_id) == (first.payload_ref, first.step_id)
        (recorded,) = store.events(run.run_id)[-1].detail["resent"]
        assert recorded == {
            "operation_id": op.operation_id,
            "step_id": op.step_id,
            "key_attempt": 2,
            "effect_key": again.effect_key,
            "previous": {
                "state": "rejected",
                "key_attempt": 1,
                "effect_key": first.effect_key,
                "error": refusal,
                "dispatch_count": 1,
                "first_dispatched_at": first.first_dispatched_at,
            },
        }
        # the new attempt is dispatched like any prepared operation
        taken = store.claim_run(run.run_id, store.get_run(run.run_id).state_revision, "worker-b", 60_000)
        assert taken is not None
        dispatched = store.mark_dispatching(taken, op.operation_id)
        assert (dispatched.state, dispatched.dispatch_count) == (EffectState.DISPATCHING, 1)
        self._history_is_counted(store, run.run_id)

    def test_a_retry_that_no_longer_fits_is_refused_whole(self) -> None:
        store = self.store()
        run, _ = self._failed(store)
        before = self.snapshot(store, run.run_id)
        moving = RunRetry(by="ana", step_id="s2", moved=("s2",))
        with pytest.raises(RetryRefused, match="moved since revision"):
            store.retry_run(run.run_id, run.state_revision - 1, moving)
        # a step with nothing failed to move; an operation that was not rejected: nothing moves
        with pytest.raises(RetryRefused, match="no failed record"):
            store.retry_run(run.run_id, run.state_revision, RunRetry(by="ana", moved=("s2", "s1")))
        unknown = Resend(f"op-{_uid()}", "step", 2, "key-2")
        with pytest.raises(RetryRefused, match="no longer the rejected attempt 1"):
            store.retry_run(
                run.run_id, run.state_revision, RunRetry(by="ana", moved=("s2",), resend=(unknown,))
            )
        assert self.snapshot(store, run.run_id) == before
        store.retry_run(run.run_id, run.state_revision, moving)
        with pytest.raises(RetryRefused, match="it is pending"):  # the same retry again
            store.retry_run(run.run_id, run.state_revision, moving)

    def test_only_a_failed_run_is_retried(self) -> None:
        store = self.store()
        running, claim = self.start(store)
        with pytest.raises(RetryRefused, match="it is running"):
            store.retry_run(running.run_id, running.state_revision, RunRetry(by="ana"))
        store.finish_run(claim, RunStatus.COMPLETED, result={"ok": True})
        done = store.get_run(running.run_id)
        with pytest.raises(RetryRefused, match="completed"):
            store.retry_run(done.run_id, done.state_revision, RunRetry(by="ana"))
        blocked, _ = self._failed(store, status=RunStatus.BLOCKED, error=None, recovery_record={"phase": "x"})
        with pytest.raises(RetryRefused, match="blocked"):
            store.retry_run(blocked.run_id, blocked.state_revision, RunRetry(by="ana"))
        assert store.get_run(blocked.run_id) == blocked

    def test_a_stopped_run_is_retried_only_at_a_step_that_used_its_attempts(self) -> None:
        store = self.store()
        at_step = {"phase": "limit_reached", "limit": "step_attempts", "step_id": "s2"}
        stopped, _ = self._failed(store, status=RunStatus.STOPPED, error=None, recovery_record=at_step)
        store.retry_run(
            stopped.run_id, stopped.state_revision, RunRetry(by="ana", step_id="s2", moved=("s2",))
        )
        retried = store.load_ledger(stopped.run_id)
        assert (retried.run.status, retried.run.recovery_record, retried.attempts) == (
            RunStatus.PENDING,
            None,
            {},
        )
        spent = {"phase": "limit_reached", "limit": "tokens", "step_id": "s2"}
        other, _ = self._failed(store, status=RunStatus.STOPPED, error=None, recovery_record=spent)
        with pytest.raises(RetryRefused, match="raise the limit instead"):
            store.retry_run(other.run_id, other.state_revision, RunRetry(by="ana"))

    @exercises(VALUES, CONCURRENCY)
    def test_two_retries_from_one_revision_one_of_them_wins(self) -> None:
        run, _ = self._failed(self.store())
        retry = RunRetry(by="ana", step_id="s2", moved=("s2",))

        def attempt(store: Any) -> str:
            try:
                store.retry_run(run.run_id, run.state_revision, retry)
            except RetryRefused:
                return "refused"
            return "retried"

        first, second = self.store(), self.store()
        outcomes = in_threads(lambda: attempt(first), lambda: attempt(second))
        assert sorted(outcomes) == ["refused", "retried"]
        events = first.events(run.run_id)
        assert [e.kind for e in events].count("run.retried") == 1
        assert [e.kind for e in events].count("step.retried") == 1
        self._history_is_counted(first, run.run_id)
