"""A run that reaches a limit stops — resumably, never failed — and carries on once a person
raises the limit (``extend_limits``): from where it stopped, with each effect sent once and no
model call made twice. On every store."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import safepoint as sp
from safepoint import record_schema
from safepoint.errors import (
    BudgetExhausted,
    DeadlineExceeded,
    LimitsRefused,
    StepAttemptsExhausted,
)
from safepoint.testing import OwnerService, SimulatedCrash, forget_workflows
from safepoint.types import RunRecord, RunStatus

TESTS = str(Path(__file__).parents[1])


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the model of ``limit_flows`` appends each call to."""
    import limit_flows

    path = tmp_path / "model-calls.jsonl"
    monkeypatch.setenv(limit_flows.CALLS_ENV, str(path))
    return path


def asked(calls: Path) -> list[str]:
    return [json.loads(line)["asked"] for line in calls.read_text().splitlines()] if calls.exists() else []


def stop_fields(run: RunRecord) -> dict[str, Any]:
    record = run.recovery_record or {}
    return {k: record.get(k) for k in ("phase", "limit", "allowed", "spent", "step_id")}


def model(**kwargs: Any) -> dict[str, Any]:
    return {"text": "ok", "model": kwargs["model"], "usage": {"input_tokens": 12, "output_tokens": 5}}


# -- stop, raise, carry on -----------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["tokens", "model_calls"])
def test_a_budget_stop_raised_and_resumed_sends_each_effect_once_and_repeats_no_model_call(
    store_url: str, owner_env: OwnerService, calls: Path, limit: str
) -> None:
    """Five turns of a model call and an effect; the run stops after the third model call —
    at its turn limit (3), or at a token budget of 51 (17 a call) — before the fourth. Raised,
    it goes on from there."""
    import limit_flows

    store = sp.open_store(store_url)
    budget = sp.Budget(tokens=51, model_calls=10) if limit == "tokens" else None
    with pytest.raises(BudgetExhausted) as stopped:
        sp.start(store, limit_flows.turns, "t", 5, run_id="r", budget=budget)
    assert stopped.value.kind == limit
    run = store.get_run("r")
    assert run.status is RunStatus.STOPPED
    assert (run.tokens_spent, run.model_calls_spent) == (51, 3)
    allowed = 51 if limit == "tokens" else 3
    spent = 51 if limit == "tokens" else 3
    assert stop_fields(run) == {
        "phase": "limit_reached",
        "limit": limit,
        "allowed": allowed,
        "spent": spent,
        "step_id": "turn.3",
    }
    assert stopped.value.record == run.recovery_record
    jsonschema.validate(run.recovery_record, record_schema())
    assert asked(calls) == ["t/0", "t/1", "t/2"]
    assert owner_env.client.stats()["applied"] == 3
    extended = sp.extend_limits(store, "r", **{limit: 200 if limit == "tokens" else 10}, by="ana")
    assert extended.status is RunStatus.PENDING
    result = sp.resume(store, "r")
    assert len(result["notes"]) == 5
    assert asked(calls) == [f"t/{n}" for n in range(5)]  # no model call made twice
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (5, 0)  # each effect once
    done = store.get_run("r")
    assert (done.status, done.model_calls_spent, done.tokens_spent) == (RunStatus.COMPLETED, 5, 85)
    store.close()


def test_a_turn_limit_is_a_budget_of_model_calls(memory_store: sp.Store) -> None:
    made: list[int] = []

    @sp.workflow("turn-limit", budget=sp.Budget(model_calls=2))
    def flow(run: sp.Run) -> int:
        for turn in range(4):
            run.model(f"turn.{turn}", lambda **kw: made.append(1) or {"text": "ok"}, model="m", messages=[])
        return len(made)

    with pytest.raises(BudgetExhausted) as stopped:
        sp.start(memory_store, flow, run_id="r")
    assert (stopped.value.kind, stopped.value.limit, stopped.value.spent) == ("model_calls", 2, 2)
    assert "--model-calls" in stopped.value.message
    run = memory_store.get_run("r")
    assert (run.model_call_budget, run.model_calls_spent) == (2, 2)
    assert stop_fields(run)["limit"] == "model_calls"
    sp.extend_limits(memory_store, "r", model_calls=3, by="ops")
    with pytest.raises(BudgetExhausted):  # one more turn, then stopped again at the new limit
        sp.resume(memory_store, "r")
    assert len(made) == 3
    assert stop_fields(memory_store.get_run("r"))["allowed"] == 3
    sp.extend_limits(memory_store, "r", model_calls=4, by="ops")
    assert sp.resume(memory_store, "r") == 4


def test_a_cost_stop_is_stopped_with_its_record(store_url: str) -> None:
    store = sp.open_store(store_url)

    @sp.workflow("cost-stop", budget=sp.Budget(cost=1.0))
    def flow(run: sp.Run) -> str:
        for turn in range(5):
            run.model(f"turn.{turn}", model, model="m-1", messages=[], usage=lambda r: {"cost": 0.4})
        return "done"

    with pytest.raises(BudgetExhausted) as stopped:
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert run.status is RunStatus.STOPPED
    fields = stop_fields(run)
    assert (fields["limit"], fields["allowed"], fields["step_id"]) == ("cost", 1.0, "turn.3")
    assert fields["spent"] == pytest.approx(1.2)
    assert stopped.value.kind == "cost"
    sp.extend_limits(store, "r", cost=2.5, by="ops", reason="the case is worth it")
    assert sp.resume(store, "r") == "done"
    assert store.get_run("r").cost_spent == pytest.approx(2.0)
    store.close()


def test_a_deadline_stop_is_raised_and_carried_on(store_url: str) -> None:
    store = sp.open_store(store_url)
    reads: list[str] = []

    @sp.workflow("deadline-stop", deadline=timedelta(milliseconds=300))
    def flow(run: sp.Run) -> list[str]:
        run.read("slow", lambda: time.sleep(0.4) or reads.append("slow") or "slow")
        run.read("after", lambda: reads.append("after") or "after")
        return reads

    with pytest.raises(DeadlineExceeded):
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert run.status is RunStatus.STOPPED
    fields = stop_fields(run)
    assert (fields["limit"], fields["allowed"], fields["step_id"]) == ("deadline", run.deadline_at, None)
    assert fields["spent"] >= run.deadline_at  # the moment it stopped
    with pytest.raises(DeadlineExceeded):
        sp.resume(store, "r")
    later = datetime.now(UTC) + timedelta(minutes=5)
    extended = sp.extend_limits(store, "r", deadline=later, by="ops")
    assert extended.deadline_at == int(later.timestamp() * 1000)
    assert sp.resume(store, "r") == ["slow", "slow", "after"]  # the refused late answer is read again
    store.close()


def test_a_step_attempts_stop_goes_on_from_the_count_recorded(store_url: str) -> None:
    store = sp.open_store(store_url)
    tried: list[int] = []

    def flaky() -> str:
        tried.append(1)
        if len(tried) < 4:
            raise ConnectionRefusedError("the quote service is down")
        return "quote"

    @sp.workflow("attempts-stop")
    def flow(run: sp.Run) -> str:
        return str(run.read("quote", flaky, retry=sp.Retry(attempts=2, backoff=0)))

    with pytest.raises(StepAttemptsExhausted) as stopped:
        sp.start(store, flow, run_id="r")
    assert (stopped.value.attempts, stopped.value.allowed) == (2, 2)
    run = store.get_run("r")
    assert stop_fields(run) == {
        "phase": "limit_reached",
        "limit": "step_attempts",
        "allowed": 2,
        "spent": 2,
        "step_id": "quote",
    }
    with pytest.raises(LimitsRefused, match="would stop there again"):  # 2 attempts were made
        sp.extend_limits(store, "r", step_attempts=2, by="ops")
    sp.extend_limits(store, "r", step_attempts=3, by="ops")
    with pytest.raises(StepAttemptsExhausted):  # the third failed too
        sp.resume(store, "r")
    assert len(tried) == 3
    assert stop_fields(store.get_run("r"))["spent"] == 3
    extended = sp.extend_limits(store, "r", step_attempts=4, by="ops")
    assert extended.step_attempt_limit == 4
    assert sp.resume(store, "r") == "quote"
    assert len(tried) == 4  # each attempt once
    assert [a.attempt for a in store.load_ledger("r").attempts["quote"]] == [1, 2, 3]
    store.close()


def test_a_resume_budget_stop_is_raised_and_carried_on(memory_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("dies-often", resume_budget=1)
    def flow(run: sp.Run) -> str:
        run.pure("p", lambda: 1)
        return "survived"

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):  # one takeover is within the budget
        sp.resume(memory_store, "r", lease_ms=0)
    crash_at(None)
    with pytest.raises(BudgetExhausted) as stopped:
        sp.resume(memory_store, "r")
    assert stopped.value.kind == "resumes"
    run = memory_store.get_run("r")
    assert run.status is RunStatus.STOPPED
    assert stop_fields(run) == {
        "phase": "limit_reached",
        "limit": "resume_budget",
        "allowed": 1,
        "spent": 2,
        "step_id": None,
    }
    with pytest.raises(LimitsRefused, match="below what was spent"):
        sp.extend_limits(memory_store, "r", resume_budget=1, by="ops")
    sp.extend_limits(memory_store, "r", resume_budget=2, by="ops")
    assert sp.resume(memory_store, "r") == "survived"
    assert memory_store.get_run("r").resume_count == 2  # carrying it on is not a takeover


# -- what is refused ------------------------------------------------------------------------------


def _stopped_at_tokens(store: sp.Store, run_id: str = "r") -> RunRecord:
    @sp.workflow(f"tokens-{uuid.uuid4().hex[:8]}", budget=sp.Budget(tokens=30))
    def flow(run: sp.Run) -> str:
        for turn in range(4):
            run.model(f"turn.{turn}", model, model="m-1", messages=[])
        return "done"

    with pytest.raises(BudgetExhausted):
        sp.start(store, flow, run_id=run_id)
    return store.get_run(run_id)


def test_a_change_at_a_stale_revision_is_refused_and_changes_nothing(store: sp.Store) -> None:
    run = _stopped_at_tokens(store)
    with pytest.raises(LimitsRefused) as refused:
        sp.extend_limits(store, "r", tokens=500, by="ana", expected_revision=run.state_revision - 1)
    assert (refused.value.state_revision, refused.value.expected_revision) == (
        run.state_revision,
        run.state_revision - 1,
    )
    assert "moved on" in refused.value.message
    assert store.get_run("r") == run
    extended = sp.extend_limits(store, "r", tokens=500, by="ana", expected_revision=run.state_revision)
    assert (extended.status, extended.token_budget) == (RunStatus.PENDING, 500)
    with pytest.raises(LimitsRefused):  # the same revision twice: the run moved with the first
        sp.extend_limits(store, "r", tokens=600, by="bo", expected_revision=run.state_revision)
    assert store.get_run("r").token_budget == 500


def test_lowering_a_limit_below_what_was_spent_is_refused(store: sp.Store) -> None:
    run = _stopped_at_tokens(store)
    assert run.tokens_spent == 34
    for asked in ({"tokens": 33}, {"model_calls": 1}, {"deadline": datetime(2001, 1, 1, tzinfo=UTC)}):
        with pytest.raises(LimitsRefused, match="below what was spent"):
            sp.extend_limits(store, "r", **asked, by="ops")  # type: ignore[arg-type]
    with pytest.raises(LimitsRefused, match="would stop there again"):  # not below, not above
        sp.extend_limits(store, "r", tokens=34, by="ops")
    assert store.get_run("r") == run
    assert [e for e in store.events("r") if e.kind == "run.limits_extended"] == []


@pytest.mark.parametrize(
    "asked",
    [
        {},
        {"tokens": -1},
        {"tokens": 1.5},
        {"cost": float("nan")},
        {"step_attempts": 0},
        {"deadline": timedelta(0)},
        {"deadline": datetime(2030, 1, 1)},  # no time zone
        {"deadline": "tomorrow"},
        {"tokens": 5, "expected_revision": "3"},
    ],
)
def test_a_change_that_makes_no_sense_is_a_usage_error(memory_store: sp.Store, asked: dict[str, Any]) -> None:
    _stopped_at_tokens(memory_store)
    with pytest.raises(sp.UsageError):
        sp.extend_limits(memory_store, "r", **asked, by="ops")
    with pytest.raises(sp.UsageError):
        sp.extend_limits(memory_store, "r", tokens=100, by="")  # who changes them is recorded


def test_an_ended_run_keeps_its_limits(memory_store: sp.Store) -> None:
    @sp.workflow("ended")
    def flow(run: sp.Run) -> int:
        return 1

    sp.start(memory_store, flow, run_id="r")
    with pytest.raises(LimitsRefused, match="completed"):
        sp.extend_limits(memory_store, "r", tokens=10, by="ops")


# -- what is recorded -----------------------------------------------------------------------------


def test_the_change_is_in_the_history_and_what_was_spent_stays(store: sp.Store) -> None:
    run = _stopped_at_tokens(store)
    sp.extend_limits(store, "r", tokens=100, model_calls=9, by="ana", reason="a long case")
    [event] = [e for e in store.events("r") if e.kind == "run.limits_extended"]
    assert event.worker == "ana"
    assert event.detail == {
        "by": "ana",
        "reason": "a long case",
        "old": {
            "tokens": 30,
            "cost": None,
            "model_calls": None,
            "deadline": None,
            "step_attempts": None,
            "resume_budget": 20,
        },
        "new": {
            "tokens": 100,
            "cost": None,
            "model_calls": 9,
            "deadline": None,
            "step_attempts": None,
            "resume_budget": 20,
        },
        "released": True,
    }
    after = store.get_run("r")
    assert (after.tokens_spent, after.model_calls_spent) == (run.tokens_spent, run.model_calls_spent)
    assert (after.recovery_record, after.error) == (None, None)


def test_a_stopped_run_resumed_without_its_code_still_says_its_limit(memory_store: sp.Store) -> None:
    run = _stopped_at_tokens(memory_store)
    forget_workflows(run.workflow)  # a process that never imported the workflow
    with pytest.raises(BudgetExhausted):
        sp.resume(memory_store, "r")


def test_a_stopped_run_can_be_cancelled(memory_store: sp.Store) -> None:
    _stopped_at_tokens(memory_store)
    assert sp.cancel(memory_store, "r", by="ops").status is RunStatus.CANCELLED
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")


# -- raised while the run runs ------------------------------------------------------------------


def test_a_raise_made_while_the_run_runs_takes_effect_before_it_would_stop(store_url: str) -> None:
    store, person = sp.open_store(store_url), sp.open_store(store_url)
    made: list[int] = []

    @sp.workflow("raised-while-running", budget=sp.Budget(model_calls=2))
    def flow(run: sp.Run) -> int:
        for turn in range(4):
            run.model(f"turn.{turn}", lambda **kw: made.append(1) or {"text": "ok"}, model="m", messages=[])
            if turn == 0:  # someone raises the limit while the run is running
                assert sp.extend_limits(person, "r", model_calls=4, by="ops").status is RunStatus.RUNNING
        return len(made)

    assert sp.start(store, flow, run_id="r") == 4
    kinds = [e.kind for e in store.events("r")]
    assert "run.stopped" not in kinds
    assert kinds.count("run.limits_extended") == 1
    store.close()
    person.close()


def test_a_raise_at_the_moment_the_run_stops_wins(store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The person's change commits between the worker's last read of the limits and its
    stop: the store refuses the stop, and the worker carries the run on."""
    store, person = sp.open_store(store_url), sp.open_store(store_url)
    made: list[int] = []
    stop_run = store.stop_run

    def raised_first(*args: Any, **kwargs: Any) -> bool:
        sp.extend_limits(person, "r", model_calls=3, by="ops")
        answer = stop_run(*args, **kwargs)
        assert answer is False  # the limits moved: nothing stopped
        monkeypatch.setattr(store, "stop_run", stop_run)
        return answer

    monkeypatch.setattr(store, "stop_run", raised_first)

    @sp.workflow("raised-while-stopping", budget=sp.Budget(model_calls=1))
    def flow(run: sp.Run) -> int:
        for turn in range(3):
            run.model(f"turn.{turn}", lambda **kw: made.append(1) or {"text": "ok"}, model="m", messages=[])
        return len(made)

    assert sp.start(store, flow, run_id="r") == 3
    assert len(made) == 3  # each model call once, across the refused stop and the carry-on
    run = store.get_run("r")
    assert (run.status, run.model_call_budget) == (RunStatus.COMPLETED, 3)
    kinds = [e.kind for e in store.events("r")]
    assert "run.stopped" not in kinds
    store.close()
    person.close()


# -- chains, workers, async -------------------------------------------------------------------


def test_a_continue_as_new_chain_carries_a_raised_limit(store_url: str) -> None:
    store = sp.open_store(store_url)
    made: list[str] = []

    def answer(**kwargs: Any) -> dict[str, Any]:
        made.append(kwargs["messages"][0]["content"])
        return model(**kwargs)

    @sp.workflow("chain-limits", budget=sp.Budget(model_calls=2, tokens=1_000))
    def flow(run: sp.Run, round_: int) -> Any:
        for turn in range(2):
            run.model(f"turn.{turn}", answer, model="m", messages=[{"content": f"{round_}.{turn}"}])
        if round_ < 2:
            run.continue_as_new(round_ + 1)
        return made

    with pytest.raises(BudgetExhausted):  # the first round spent the chain's two turns
        sp.start(store, flow, 0, run_id="c")
    head = store.get_run("c~1")
    assert (head.status, head.model_call_budget) == (RunStatus.STOPPED, 0)  # what was left
    sp.extend_limits(store, "c", model_calls=4, step_attempts=3, by="ops")  # the chain's head
    assert (store.get_run("c~1").model_call_budget, store.get_run("c").model_call_budget) == (4, 2)
    assert sp.resume(store, "c") == ["0.0", "0.1", "1.0", "1.1", "2.0", "2.1"]
    last = store.get_run("c~2")
    # what the raised limit left after the second round, and the raised attempts, carried on
    assert (last.model_call_budget, last.step_attempt_limit, last.status) == (2, 3, RunStatus.COMPLETED)
    assert last.token_budget == 1_000 - 4 * 17
    store.close()


def test_a_worker_carries_a_raised_run_on(store_url: str, calls: Path, owner_env: OwnerService) -> None:
    import limit_flows

    store = sp.open_store(store_url)
    sp.submit(store, limit_flows.turns, "w", 4, run_id="w")
    worker = sp.Worker(store, workflows=["limits-turns"])
    stats = worker.run(until_idle=True, handle_signals=False)
    assert (stats.claimed, stats.stopped, stats.failed) == (1, 1, 0)
    assert store.get_run("w").status is RunStatus.STOPPED
    assert (
        sp.Worker(store, workflows=["limits-turns"]).run(until_idle=True, handle_signals=False).claimed == 0
    )
    sp.extend_limits(store, "w", model_calls=4, by="ops")
    again = sp.Worker(store, workflows=["limits-turns"]).run(until_idle=True, handle_signals=False)
    assert (again.claimed, again.completed) == (1, 1)
    assert asked(calls) == [f"w/{n}" for n in range(4)]
    assert owner_env.client.stats()["applied"] == 4
    store.close()


def test_extend_limits_async_on_the_async_postgresql_store(pg_url: str) -> None:
    made: list[int] = []

    async def answer(**kwargs: Any) -> dict[str, Any]:
        made.append(1)
        return model(**kwargs)

    @sp.workflow("limits-async", budget=sp.Budget(model_calls=1))
    async def flow(run: sp.AsyncRun) -> int:
        for turn in range(3):
            await run.model(f"turn.{turn}", answer, model="m-1", messages=[])
        return len(made)

    async def main() -> tuple[RunRecord, Any]:
        store = await sp.open_async_store(f"{pg_url}?schema=l_{uuid.uuid4().hex[:12]}")
        try:
            with pytest.raises(BudgetExhausted):
                await sp.start_async(store, flow, run_id="r")
            extended = await sp.extend_limits_async(store, "r", model_calls=3, by="ops")
            return extended, await sp.resume_async(store, "r")
        finally:
            await store.close()

    extended, result = asyncio.run(main())
    assert (extended.status, extended.model_call_budget) == (RunStatus.PENDING, 3)
    assert result == 3
    assert len(made) == 3
