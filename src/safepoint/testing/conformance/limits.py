"""Store conformance: limits that survive restarts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from ...errors import Cancelled, DeadlineExceeded, LostOwnership
from ...storage.base import NewRun, Store
from ...types import Claim, EffectState, Retry, RunRecord, RunStatus, StepKind
from ._concerns import CONTROL, exercises
from ._support import (
    LONG_LEASE_MS,
    SHORT_LEASE_MS,
    ConformanceBase,
    _uid,
    make_attempt,
    make_operation,
    make_step,
)


class LimitTests(ConformanceBase):
    """The conformance tests of limits that survive restarts."""

    def _new_limited_run(
        self, store: Store, *, owner: str | None = "worker-a", **limits: Any
    ) -> tuple[RunRecord, Claim | None]:
        return store.create_run(
            NewRun(
                run_id=f"limits-{_uid()}",
                workflow=self.workflow,
                workflow_version="v1",
                input_hash="h",
                inputs={"args": [], "kwargs": {}},
                owner=owner,
                lease_ms=LONG_LEASE_MS if owner else 0,
                **limits,
            )
        )

    @exercises(CONTROL)
    def test_limits_are_recorded_with_the_run(self) -> None:
        store = self.store()
        policy = Retry(attempts=4, backoff=0.25, multiplier=3.0, max_backoff=9.0, jitter=0.5)
        run, _ = self._new_limited_run(
            store, owner=None, deadline_ms=60_000, token_budget=1_000, cost_budget=2.5, step_attempts=policy
        )
        for seen in (run, store.get_run(run.run_id), store.load_ledger(run.run_id).run):
            assert seen.deadline_at == seen.created_at + 60_000  # counted from its creation
            assert (seen.token_budget, seen.cost_budget) == (1_000, 2.5)
            assert (seen.tokens_spent, seen.cost_spent) == (0, 0.0)
            assert seen.step_attempts is not None
            assert seen.step_attempts.as_json() == policy.as_json()
        fixed, _ = self._new_limited_run(store, owner=None, deadline_at=1_234_567_890_123)
        assert fixed.deadline_at == 1_234_567_890_123
        plain, _ = self._new_limited_run(store, owner=None)
        assert (plain.deadline_at, plain.token_budget, plain.cost_budget, plain.step_attempts) == (
            None,
            None,
            None,
            None,
        )

    @exercises(CONTROL)
    def test_model_usage_adds_up_on_the_run_in_the_commit_of_its_step(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=SHORT_LEASE_MS)
        store.record_step(claim, make_step(run.run_id, "m1", 1, kind=StepKind.MODEL, tokens=120, cost=0.25))
        store.record_step(claim, make_step(run.run_id, "p1", 2))  # no usage: adds nothing
        store.record_step(claim, make_step(run.run_id, "m2", 3, kind=StepKind.MODEL, tokens=30, cost=None))
        ledger = store.load_ledger(run.run_id)
        assert (ledger.steps["m1"].tokens, ledger.steps["m1"].cost) == (120, 0.25)
        assert (ledger.steps["p1"].tokens, ledger.steps["p1"].cost) == (None, None)
        assert (ledger.steps["m2"].tokens, ledger.steps["m2"].cost) == (30, None)
        assert (ledger.run.tokens_spent, ledger.run.cost_spent) == (150, 0.25)
        taken = self.take_over(store, run.run_id)  # a takeover resets nothing
        assert store.get_run(run.run_id).tokens_spent == 150
        store.finish_run(taken, RunStatus.FAILED, error={"type": "BudgetExhausted"})
        assert store.get_run(run.run_id).tokens_spent == 150

    def test_failed_attempts_are_recorded_and_loaded_by_step_and_attempt(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=SHORT_LEASE_MS)
        first = make_attempt(run.run_id, "quote", 1, retry_at=store.now() + 500)
        store.record_attempt(claim, first)
        store.record_attempt(claim, make_attempt(run.run_id, "quote", 2, kind=StepKind.MODEL))
        store.record_attempt(claim, make_attempt(run.run_id, "other", 1))
        attempts = store.load_ledger(run.run_id).attempts
        assert sorted(attempts) == ["other", "quote"]
        assert [a.attempt for a in attempts["quote"]] == [1, 2]
        loaded = attempts["quote"][0]
        assert (loaded.kind, loaded.name, loaded.input_hash, loaded.error, loaded.retry_at) == (
            first.kind,
            first.name,
            first.input_hash,
            first.error,
            first.retry_at,
        )
        assert loaded.fence == claim.fence
        assert loaded.recorded_at > 0
        assert attempts["quote"][1].kind is StepKind.MODEL
        new = self.take_over(store, run.run_id)  # the count survives a takeover
        assert [a.attempt for a in store.load_ledger(run.run_id).attempts["quote"]] == [1, 2]
        store.request_cancel(run.run_id, "ops")
        with pytest.raises(Cancelled):  # another attempt is new work
            store.record_attempt(new, make_attempt(run.run_id, "quote", 3))
        assert len(store.load_ledger(run.run_id).attempts["quote"]) == 2

    @exercises(CONTROL)
    def test_the_store_refuses_new_work_past_the_deadline(self) -> None:
        store = self.store()
        run, claim = self._new_limited_run(store, deadline_ms=300)
        assert claim is not None
        assert run.deadline_at is not None
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        in_flight, data = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, in_flight, data)
        store.mark_dispatching(claim, in_flight.operation_id)
        while store.now() < run.deadline_at:
            time.sleep(0.05)
        before = self.snapshot(store, run.run_id)
        second, more = make_operation(run.run_id, f"op-{_uid()}")
        refused: dict[str, Callable[[], Any]] = {
            "record_step": lambda: store.record_step(claim, make_step(run.run_id, "s2", 2)),
            "record_attempt": lambda: store.record_attempt(claim, make_attempt(run.run_id, "s2", 1)),
            "prepare_effect": lambda: store.prepare_effect(claim, second, more),
            "mark_dispatching": lambda: store.mark_dispatching(claim, op.operation_id),
            "prepare_and_mark_dispatching": lambda: store.prepare_and_mark_dispatching(claim, second, more),
        }
        for name, write in refused.items():
            with pytest.raises(DeadlineExceeded) as late:
                write()
            assert (late.value.run_id, late.value.deadline_at) == (run.run_id, run.deadline_at), name
            assert self.snapshot(store, run.run_id) == before, f"{name} wrote past the deadline"
        # what was in flight is still settled, and the run still ends
        store.record_outcome(claim, in_flight.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        store.renew_lease(claim)
        store.finish_run(claim, RunStatus.FAILED, error={"type": "DeadlineExceeded"})
        ledger = store.load_ledger(run.run_id)
        assert ledger.run.status is RunStatus.FAILED
        assert ledger.operations[in_flight.operation_id].state is EffectState.ACCEPTED
        assert ledger.operations[op.operation_id].state is EffectState.PREPARED
        assert "s2" not in ledger.steps
        assert second.operation_id not in ledger.operations
        # a stale worker past the deadline is still told it lost the run, not the deadline
        with pytest.raises(LostOwnership):
            store.record_step(claim, make_step(run.run_id, "s3", 3))
