"""Limits that survive restarts: step attempts with back-off, model token and cost budgets, and
a deadline. Each is recorded with the run, so no restart — in-process or a real SIGKILL —
resets a spent limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint._engine.host import Host, hosted_by
from safepoint._rules import limits as _limits
from safepoint.errors import BudgetExhausted, DeadlineExceeded, RunNotFound, StepAttemptsExhausted
from safepoint.ops.cli import cli
from safepoint.storage.sqlite import SqliteStore
from safepoint.testing import SimulatedCrash, run_child, spawn_child
from safepoint.types import AttemptRecord, EffectState, Ledger, RunRecord, RunStatus, StepKind, StepStatus

TESTS = str(Path(__file__).parents[1])
T0 = 1_700_000_000_000


class Calls:
    """A step function that fails its first ``fail`` calls, and counts every call."""

    def __init__(self, fail: int = 0, error: type[Exception] = TimeoutError, value: Any = "ok") -> None:
        self.fail, self.error, self.value, self.count = fail, error, value, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.count += 1
        if self.count <= self.fail:
            raise self.error(f"call {self.count} failed")
        return self.value


@pytest.fixture
def clocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SimpleNamespace]:
    """A SQLite store on a clock the test moves, and back-off sleeps that move it (recorded,
    never really slept); ``crash_in_sleep`` makes the next sleep a crash."""
    state = SimpleNamespace(now=T0, slept=[], crash_in_sleep=False)
    state.store = SqliteStore(tmp_path / "ledger.db", clock=lambda: state.now)

    def sleep(seconds: float) -> None:
        state.slept.append(seconds)
        if state.crash_in_sleep:
            state.crash_in_sleep = False
            raise SimulatedCrash("test.in_backoff", None)
        state.now += math.ceil(seconds * 1000)

    class Clocked(Host):
        def sleep(self, seconds: float) -> None:
            sleep(seconds)

    with hosted_by(Clocked()):
        yield state
    state.store.close()


# -- attempts --------------------------------------------------------------------------------


def test_a_read_that_fails_once_succeeds_on_its_second_attempt_after_its_backoff(store_url: str) -> None:
    store = sp.open_store(store_url)
    called_at: list[int] = []

    def quote() -> float:
        called_at.append(store.now())
        if len(called_at) == 1:
            raise TimeoutError("the quote service timed out")
        return 1.0842

    @sp.workflow("retry-read")
    def flow(run: sp.Run) -> float:
        return float(run.read("quote", quote, retry=sp.Retry(attempts=3, backoff=0.2)))

    assert sp.start(store, flow, run_id="r") == 1.0842
    ledger = store.load_ledger("r")
    [failed] = ledger.attempts["quote"]
    assert (failed.attempt, failed.kind, failed.error["type"]) == (1, StepKind.READ, "TimeoutError")
    # the back-off from the failure: retry_at is on the store's estimate of the database clock,
    # recorded_at on the server's own, which may differ by half a round trip
    assert 150 <= failed.retry_at - failed.recorded_at <= 250
    assert called_at[1] >= failed.retry_at  # the back-off was waited out
    step = ledger.steps["quote"]
    assert (step.status, step.attempt, step.result) == (StepStatus.COMPLETED, 2, 1.0842)
    assert step.observed_at is not None
    assert step.observed_at >= failed.retry_at  # observed on the attempt that answered


def test_exhausted_attempts_stop_the_run_and_a_raised_limit_continues_the_count(
    memory_store: sp.Store,
) -> None:
    read = Calls(fail=4)

    @sp.workflow("retry-exhausted")
    def flow(run: sp.Run) -> dict[str, Any]:
        try:
            return {"value": run.read("quote", read, retry=sp.Retry(attempts=3, backoff=0))}
        except sp.StepFailed as failed:  # not raised: the attempts are a limit, not an outcome
            return {"attempts": failed.attempts}

    with pytest.raises(StepAttemptsExhausted) as stopped:
        sp.start(memory_store, flow, run_id="r")
    assert (stopped.value.step_id, stopped.value.attempts, stopped.value.allowed) == ("quote", 3, 3)
    assert read.count == 3
    ledger = memory_store.load_ledger("r")
    assert ledger.run.status is RunStatus.STOPPED
    assert "quote" not in ledger.steps  # the failure is not the step's recorded outcome
    assert [a.attempt for a in ledger.attempts["quote"]] == [1, 2, 3]
    record = ledger.run.recovery_record
    assert record is not None
    assert (record["phase"], record["limit"], record["allowed"], record["spent"], record["step_id"]) == (
        "limit_reached",
        "step_attempts",
        3,
        3,
        "quote",
    )
    assert record["evidence"]["last_error"] == {"type": "TimeoutError", "message": "call 3 failed"}
    assert stopped.value.record == record
    with pytest.raises(StepAttemptsExhausted):  # a resume changes nothing while it stands
        sp.resume(memory_store, "r")
    assert memory_store.get_run("r").state_revision == ledger.run.state_revision
    assert read.count == 3
    sp.extend_limits(memory_store, "r", step_attempts=5, by="ops")
    assert sp.resume(memory_store, "r") == {"value": "ok"}
    assert read.count == 5  # attempts 4 and 5: the count went on, nothing was asked twice
    step = memory_store.load_ledger("r").steps["quote"]
    assert (step.status, step.attempt) == (StepStatus.COMPLETED, 5)


def test_only_the_named_errors_are_tried_again_and_pure_steps_never(memory_store: sp.Store) -> None:
    wrong = Calls(fail=1, error=ValueError)
    pure = Calls(fail=1)

    @sp.workflow("retry-only-named", step_attempts=5)
    def flow(run: sp.Run) -> list[str]:
        outcomes = []
        for step_id, fn, kind in (("read", wrong, "read"), ("pure", pure, "pure")):
            try:
                if kind == "read":
                    run.read(step_id, fn, retry=sp.Retry(attempts=5, backoff=0, retry_on=(TimeoutError,)))
                else:
                    run.pure(step_id, fn)
            except sp.StepFailed as failed:
                outcomes.append(f"{step_id}: {failed.error_type} x{failed.attempts}")
        return outcomes

    assert sp.start(memory_store, flow, run_id="r") == ["read: ValueError x1", "pure: TimeoutError x1"]
    assert (wrong.count, pure.count) == (1, 1)
    assert memory_store.load_ledger("r").attempts == {}


def test_the_workflow_default_attempts_are_recorded_with_the_run(memory_store: sp.Store) -> None:
    read, model, once = Calls(fail=2), Calls(fail=1, value={"text": "hi"}), Calls(fail=1)

    @sp.workflow("retry-default", step_attempts=sp.Retry(attempts=3, backoff=0))
    def flow(run: sp.Run) -> list[Any]:
        out = [
            run.read("read", read),
            run.model("model", model, model="m-1", messages=[{"role": "user", "content": "q"}]),
        ]
        try:
            run.read("once", once, retry=1)  # its own retry= wins over the run's default
        except sp.StepFailed as failed:
            out.append(failed.attempts)
        return out

    assert sp.start(memory_store, flow, run_id="r") == ["ok", {"text": "hi"}, 1]
    assert (read.count, model.count, once.count) == (3, 2, 1)
    run = memory_store.get_run("r")
    assert run.step_attempts is not None
    assert run.step_attempts.as_json() == sp.Retry(attempts=3, backoff=0).as_json()
    assert memory_store.load_ledger("r").steps["model"].attempt == 2


def test_an_expired_observation_read_again_gets_attempts_of_its_own(clocked: Any, crash_at: Any) -> None:
    read = Calls()

    @sp.workflow("retry-reread")
    def flow(run: sp.Run) -> Any:
        return run.read("quote", read, max_age=timedelta(seconds=60), retry=sp.Retry(attempts=2, backoff=1))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    clocked.now += 61_000  # the observation expired: read again, and that fails once
    read.fail, read.count, read.value = 1, 0, "fresh"
    assert sp.resume(clocked.store, "r") == "fresh"
    ledger = clocked.store.load_ledger("r")
    assert [a.attempt for a in ledger.attempts["quote"]] == [2]  # counted on from the first read
    assert ledger.steps["quote"].attempt == 3
    assert clocked.slept == [1.0]


def test_a_restart_in_the_backoff_waits_only_what_remains(clocked: Any) -> None:
    read = Calls(fail=1)

    @sp.workflow("retry-restart")
    def flow(run: sp.Run) -> Any:
        return run.read("quote", read, retry=sp.Retry(attempts=3, backoff=5))

    clocked.crash_in_sleep = True
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0)
    [failed] = clocked.store.load_ledger("r").attempts["quote"]
    assert failed.retry_at == T0 + 5_000
    clocked.now += 2_000  # the worker came back two seconds later
    assert sp.resume(clocked.store, "r") == "ok"
    assert clocked.slept == [5.0, 3.0]  # the rest of the back-off, not all of it again
    assert read.count == 2
    assert clocked.store.load_ledger("r").steps["quote"].attempt == 2


def test_code_that_now_allows_fewer_attempts_makes_no_further_call(clocked: Any) -> None:
    read = Calls(fail=99)
    allowed = {"attempts": 3}

    @sp.workflow("retry-fewer")
    def flow(run: sp.Run) -> Any:
        try:
            return run.read("quote", read, retry=sp.Retry(attempts=allowed["attempts"], backoff=1))
        except sp.StepFailed as failed:
            return failed.attempts

    clocked.crash_in_sleep = True
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0)
    allowed["attempts"] = 1
    assert sp.resume(clocked.store, "r") == 1
    assert read.count == 1
    step = clocked.store.load_ledger("r").steps["quote"]
    assert (step.status, step.error["message"]) == (StepStatus.FAILED, "call 1 failed")


def test_a_cancel_during_the_backoff_stops_before_the_next_attempt(file_store: sp.Store) -> None:
    read = Calls(fail=99)

    def first_attempt() -> Any:
        if read.count == 0:
            threading.Timer(0.1, sp.cancel, (file_store, "r"), {"by": "ops"}).start()
        return read()

    @sp.workflow("retry-cancelled")
    def flow(run: sp.Run) -> Any:
        return run.read("quote", first_attempt, retry=sp.Retry(attempts=5, backoff=0.4))

    with pytest.raises(sp.RunCancelled):
        sp.start(file_store, flow, run_id="r")
    assert read.count == 1
    assert file_store.get_run("r").status is RunStatus.CANCELLED


def test_a_backoff_that_would_outlast_the_deadline_stops_the_run_at_once(memory_store: sp.Store) -> None:
    read = Calls(fail=99)

    @sp.workflow("retry-no-time", deadline=timedelta(seconds=5))
    def flow(run: sp.Run) -> Any:
        try:
            return run.read("quote", read, retry=sp.Retry(attempts=5, backoff=60))
        except sp.StepFailed as failed:
            return failed.attempts

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as late:
        sp.start(memory_store, flow, run_id="r")
    assert time.monotonic() - started < 2
    ledger = memory_store.load_ledger("r")
    [tried] = ledger.attempts["quote"]
    assert late.value.retry_at == tried.retry_at
    assert "quote" not in ledger.steps
    assert ledger.run.status is RunStatus.STOPPED
    record = ledger.run.recovery_record
    assert record is not None
    assert (record["limit"], record["allowed"], record["step_id"]) == (
        "deadline",
        ledger.run.deadline_at,
        "quote",
    )


@pytest.mark.parametrize(
    ("fail_first", "attempts", "outcome", "calls"),
    [
        (99, 2, {"status": "stopped", "error": "StepAttemptsExhausted"}, 2),
        (1, 3, {"status": "completed", "result": {"value": {"quote": 1.0842, "call": 2}}}, 2),
    ],
    ids=["exhausted", "succeeds"],
)
def test_the_attempt_count_survives_a_sigkill_and_is_not_reset(
    store_url: str, tmp_path: Path, fail_first: int, attempts: int, outcome: Any, calls: int
) -> None:
    """A real process fails its first attempt and is SIGKILLed in the back-off; a fresh
    process continues the count from the ledger and waits out the rest of the back-off."""
    calls_path = tmp_path / "calls.jsonl"
    args = [str(calls_path), fail_first, attempts]
    child = spawn_child(
        "limit_flows:flaky_read", store_url=store_url, run_id="r", args=args, pythonpath=[TESTS]
    )
    store = sp.open_store(store_url)
    try:
        give_up = time.monotonic() + 30
        tried: list[AttemptRecord] = []
        while not tried:
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < give_up, "the first attempt was never recorded"
            with contextlib.suppress(RunNotFound):
                tried = store.load_ledger("r").attempts.get("read.quote", [])
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.communicate()
        assert child.returncode == -signal.SIGKILL
        resumed = run_child(
            "limit_flows:flaky_read",
            store_url=store_url,
            run_id="r",
            args=args,
            resume=True,
            pythonpath=[TESTS],
        )
        assert resumed.outcome is not None, resumed.stderr
        assert {k: resumed.outcome[k] for k in outcome} == outcome, resumed.stderr
        made = [json.loads(line) for line in calls_path.read_text().splitlines()]
        assert len(made) == calls  # a reset count would have called once more
        assert made[0]["pid"] != made[1]["pid"]
        assert made[1]["at_ms"] >= tried[0].retry_at - 20  # the rest of the back-off was kept
        ledger = store.load_ledger("r")
        if outcome["status"] == "stopped":  # both attempts failed: the run stopped before a third
            assert "read.quote" not in ledger.steps
            assert [a.attempt for a in ledger.attempts["read.quote"]] == [1, 2]
            assert ledger.run.status is RunStatus.STOPPED
        else:
            assert ledger.steps["read.quote"].attempt == 2
            assert [a.attempt for a in ledger.attempts["read.quote"]] == [1]
    finally:
        if child.poll() is None:
            child.kill()
        store.close()


def test_an_async_workflow_retries_too(memory_store: sp.Store) -> None:
    read = Calls(fail=2)

    async def fetch() -> Any:
        await asyncio.sleep(0)
        return read()

    @sp.workflow("retry-async", step_attempts=3)
    async def flow(run: sp.AsyncRun) -> Any:
        return await run.read("quote", fetch, retry=sp.Retry(attempts=3, backoff=0.01))

    assert sp.start(memory_store, flow, run_id="r") == "ok"
    assert read.count == 3
    assert memory_store.load_ledger("r").steps["quote"].attempt == 3


def test_retries_and_budgets_on_the_async_postgresql_store(pg_url: str) -> None:
    import uuid

    read, calls = Calls(fail=1), []

    async def model(**kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return anthropic_shaped(**kwargs)

    @sp.workflow("limits-async-pg", budget=sp.Budget(tokens=20))
    async def flow(run: sp.AsyncRun) -> Any:
        await run.read("quote", read, retry=sp.Retry(attempts=2, backoff=0.05))
        for turn in range(3):
            await run.model(f"turn.{turn}", model, model="m-1", messages=[])
        return "never"

    async def main() -> Ledger:
        store = await sp.open_async_store(f"{pg_url}?schema=l_{uuid.uuid4().hex[:12]}")
        try:
            with pytest.raises(BudgetExhausted):
                await sp.start_async(store, flow, run_id="r")
            return await store.load_ledger("r")
        finally:
            await store.close()

    ledger = asyncio.run(main())
    assert (read.count, len(calls)) == (2, 2)  # 17 tokens, then 34: the third call never made
    assert [a.attempt for a in ledger.attempts["quote"]] == [1]
    assert (ledger.run.status, ledger.run.tokens_spent, ledger.run.model_calls_spent) == (
        RunStatus.STOPPED,
        34,
        2,
    )


# -- budgets ---------------------------------------------------------------------------------


def anthropic_shaped(*, model: str, messages: Any) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": "ok"}],
        "model": model,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }


def test_a_spent_token_budget_stops_the_next_model_call_and_survives_a_resume(
    store_url: str, crash_at: Any
) -> None:
    calls: list[int] = []

    def model(**kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return anthropic_shaped(**kwargs)

    @sp.workflow("budget-tokens", budget=sp.Budget(tokens=30))
    def flow(run: sp.Run) -> Any:
        for turn in range(5):
            run.model(f"turn.{turn}", model, model="m-1", messages=[{"role": "user", "content": str(turn)}])
        return "never"

    store = sp.open_store(store_url)
    crash_at("step.after_record:turn.1")  # two calls spent 34 tokens, then the worker died
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert store.get_run("r").tokens_spent == 34
    fresh = sp.open_store(store_url)  # a restart: a new process would see the same
    with pytest.raises(BudgetExhausted) as exhausted:
        sp.resume(fresh, "r")
    assert len(calls) == 2  # replayed, and the third call was never made
    assert (exhausted.value.kind, exhausted.value.limit, exhausted.value.spent) == ("tokens", 30, 34)
    assert isinstance(exhausted.value, sp.LimitReached)
    run = fresh.get_run("r")
    assert (run.status, run.error["type"]) == (RunStatus.STOPPED, "BudgetExhausted")
    assert (run.token_budget, run.tokens_spent) == (30, 34)
    assert fresh.load_ledger("r").steps["turn.1"].tokens == 17
    assert "turn.2" not in fresh.load_ledger("r").steps
    assert run.recovery_record is not None
    assert {k: run.recovery_record[k] for k in ("phase", "limit", "allowed", "spent", "step_id")} == {
        "phase": "limit_reached",
        "limit": "tokens",
        "allowed": 30,
        "spent": 34,
        "step_id": "turn.2",
    }
    with pytest.raises(BudgetExhausted) as again:  # a resume raises it again, and changes nothing
        sp.resume(fresh, "r")
    assert again.value.record == run.recovery_record
    assert fresh.get_run("r").state_revision == run.state_revision
    fresh.close()
    store.close()


def test_a_cost_budget_fed_by_a_usage_function_stops_the_next_call(memory_store: sp.Store) -> None:
    calls: list[int] = []

    def openai_shaped(*, model: str, messages: Any) -> dict[str, Any]:
        calls.append(1)
        return {
            "choices": [{"message": {"content": "ok"}}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 100},
        }

    def priced(response: dict[str, Any]) -> dict[str, float]:
        return {"cost": response["usage"]["total_tokens"] * 0.004}

    @sp.workflow("budget-cost", budget=sp.Budget(tokens=10_000, cost=100.0))
    def flow(run: sp.Run) -> Any:
        spent = 0
        try:
            for turn in range(10):
                run.model(
                    f"turn.{turn}",
                    openai_shaped,
                    model="m-1",
                    usage=priced,
                    messages=[{"role": "user", "content": str(turn)}],
                )
                spent += 1
        except BudgetExhausted:
            return f"swallowed after {spent}"  # agent code cannot carry on past a limit
        return "never"

    # start's budget overrides the workflow's cost, and keeps its token limit
    with pytest.raises(BudgetExhausted) as exhausted:
        sp.start(memory_store, flow, run_id="r", budget=sp.Budget(cost=1.0))
    assert len(calls) == 3  # 0.4, 0.8, 1.2: the fourth call found the budget spent
    assert exhausted.value.kind == "cost"
    run = memory_store.get_run("r")
    assert (run.token_budget, run.cost_budget, run.tokens_spent) == (10_000, 1.0, 300)
    assert run.cost_spent == pytest.approx(1.2)
    assert run.status is RunStatus.STOPPED
    step = memory_store.load_ledger("r").steps["turn.0"]
    assert (step.tokens, step.cost) == (100, pytest.approx(0.4))


def test_a_usage_function_that_returns_nonsense_is_a_usage_error(memory_store: sp.Store) -> None:
    @sp.workflow("budget-bad-usage")
    def flow(run: sp.Run) -> Any:
        return run.model("m", anthropic_shaped, model="m-1", messages=[], usage=lambda r: 5)

    with pytest.raises(sp.UsageError, match="usage= function"):
        sp.start(memory_store, flow, run_id="r")
    assert "m" not in memory_store.load_ledger("r").steps


@pytest.mark.parametrize(
    ("response", "tokens"),
    [
        ({"usage": {"input_tokens": 12, "output_tokens": 5}}, 17),
        (
            {
                "usage": {
                    "input_tokens": 3,
                    "output_tokens": 5,
                    "cache_read_input_tokens": 100,
                    "cache_creation_input_tokens": 7,
                }
            },
            115,
        ),
        ({"usage": {"prompt_tokens": 90, "completion_tokens": 10}}, 100),
        ({"usage": {"prompt_tokens": 90, "completion_tokens": 10, "total_tokens": 101}}, 101),
        ({"usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 9}}, 9),
        ({"usage": {"output_tokens": 5}}, 5),
        ({"usage": {"input_tokens": "12"}}, None),
        ({"usage": None}, None),
        ({"text": "no usage"}, None),
        ("plain text", None),
    ],
)
def test_tokens_are_read_from_well_known_response_shapes(response: Any, tokens: int | None) -> None:
    assert _limits.reported_tokens(response) == tokens


# -- the deadline ----------------------------------------------------------------------------


def test_a_deadline_passing_during_a_step_stops_the_run_before_anything_new(store_url: str) -> None:
    store = sp.open_store(store_url)
    sent: list[Any] = []
    refund = sp.Effect("refund", execute=lambda payload, key: sent.append(payload) or {"ok": 1})

    @sp.workflow("deadline-during", deadline=timedelta(milliseconds=400))
    def flow(run: sp.Run) -> Any:
        run.read("fast", lambda: "fast")
        run.read("slow", lambda: time.sleep(0.6) or "slow")  # the deadline passes in here
        return run.effect("refund", refund, payload={"amount": 5})

    with pytest.raises(DeadlineExceeded) as late:
        sp.start(store, flow, run_id="r")
    ledger = store.load_ledger("r")
    assert late.value.deadline_at == ledger.run.deadline_at == ledger.run.created_at + 400
    assert sent == []
    assert ledger.operations == {}
    assert sorted(ledger.steps) == ["fast"]  # the late answer was refused, not recorded
    assert (ledger.run.status, ledger.run.error["type"]) == (RunStatus.STOPPED, "DeadlineExceeded")
    assert ledger.run.recovery_record is not None
    assert (ledger.run.recovery_record["limit"], ledger.run.recovery_record["allowed"]) == (
        "deadline",
        ledger.run.deadline_at,
    )
    with pytest.raises(DeadlineExceeded):
        sp.resume(store, "r")


def test_no_model_call_is_made_after_the_deadline(clocked: Any) -> None:
    model = Calls(value={"text": "late"})

    @sp.workflow("deadline-model")
    def flow(run: sp.Run) -> Any:
        run.read("read", lambda: "x")
        clocked.now += 61_000  # a minute passes in the agent's own code, between two steps
        return run.model("model", model, model="m-1", messages=[])

    with pytest.raises(DeadlineExceeded):
        sp.start(clocked.store, flow, run_id="r", deadline=timedelta(minutes=1))
    assert model.count == 0
    assert clocked.store.get_run("r").status is RunStatus.STOPPED
    assert "read" in clocked.store.load_ledger("r").steps


def test_a_deadline_passed_while_the_run_was_down_stops_it_at_takeover(clocked: Any, crash_at: Any) -> None:
    read, later = Calls(value="seen"), Calls()

    @sp.workflow("deadline-down")
    def flow(run: sp.Run) -> Any:
        run.read("read", read)
        return run.pure("later", later)

    crash_at("step.after_record:read")
    with pytest.raises(SimulatedCrash):
        sp.start(
            clocked.store,
            flow,
            run_id="r",
            lease_ms=0,
            deadline=datetime.fromtimestamp((T0 + 10_000) / 1000, UTC),
        )
    crash_at(None)
    assert clocked.store.get_run("r").deadline_at == T0 + 10_000
    clocked.now += 10_000
    with pytest.raises(DeadlineExceeded):
        sp.resume(clocked.store, "r")
    assert (read.count, later.count) == (1, 0)
    run = clocked.store.get_run("r")
    assert run.status is RunStatus.STOPPED
    assert run.recovery_record is not None
    assert (run.recovery_record["limit"], run.recovery_record["spent"], run.recovery_record["step_id"]) == (
        "deadline",
        T0 + 10_000,
        None,  # found passed at the takeover, before any step
    )


def test_a_submitted_run_past_its_deadline_is_stopped_by_the_worker(store_url: str) -> None:
    store = sp.open_store(store_url)
    ran: list[int] = []

    @sp.workflow("deadline-submitted")
    def flow(run: sp.Run) -> int:
        return int(run.pure("p", lambda: ran.append(1) or 1))

    sp.submit(store, flow, run_id="r", deadline=datetime.now(UTC) - timedelta(seconds=1))
    stats = sp.Worker(store, workflows=["deadline-submitted"]).run(until_idle=True, handle_signals=False)
    assert stats.claimed == 1
    assert ran == []
    run = store.get_run("r")
    assert (run.status, run.error["type"]) == (RunStatus.STOPPED, "DeadlineExceeded")


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (sp.Applied({"id": "re_1"}), EffectState.ACCEPTED),
        (sp.NotApplied(), EffectState.PREPARED),
    ],
)
def test_past_the_deadline_an_effect_in_flight_is_settled_then_the_run_stops(
    clocked: Any, crash_at: Any, answer: Any, state: EffectState
) -> None:
    calls: list[str] = []
    refund = sp.Effect(
        "refund",
        execute=lambda payload, key: calls.append("execute") or {},
        reconcile=lambda key: calls.append("reconcile") or answer,
        dedup_retention=timedelta(hours=1),
    )

    @sp.workflow(f"deadline-in-flight-{state.value}")
    def flow(run: sp.Run) -> Any:
        run.effect("refund", refund, payload={"amount": 5})
        return run.read("after", lambda: "more")

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0, deadline=timedelta(seconds=5))
    crash_at(None)
    clocked.now += 6_000
    with pytest.raises(DeadlineExceeded):
        sp.resume(clocked.store, "r")
    assert calls == ["reconcile"]  # settled through its owner, never sent again
    ledger = clocked.store.load_ledger("r")
    assert ledger.operations["refund"].state is state
    assert ledger.run.status is RunStatus.STOPPED
    assert "after" not in ledger.steps


def test_past_the_deadline_an_effect_that_cannot_be_settled_blocks_the_run(
    clocked: Any, crash_at: Any
) -> None:
    import jsonschema

    from safepoint import record_schema

    notify = sp.Effect("notify", execute=lambda payload, key: {"sent": True})

    @sp.workflow("deadline-uncertain", budget=sp.Budget(tokens=500))
    def flow(run: sp.Run) -> Any:
        return run.effect("notify", notify, payload={"to": "ops"})

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0, deadline=timedelta(seconds=5))
    crash_at(None)
    clocked.now += 6_000
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(clocked.store, "r")
    run = clocked.store.get_run("r")
    assert run.status is RunStatus.BLOCKED  # an uncertain effect is never forgotten
    record = run.recovery_record
    assert record is not None
    assert record["phase"] == "reconcile_effect"
    assert record["limits_ref"] == {
        "resume_count": 1,
        "resume_budget": 20,
        "deadline_at": T0 + 5_000,
        "token_budget": 500,
        "tokens_spent": 0,
        "cost_budget": None,
        "cost_spent": 0.0,
        "model_call_budget": None,
        "model_calls_spent": 0,
        "step_attempts": None,
        "step_attempt_limit": None,
    }
    assert (record["limit"], record["allowed"], record["spent"]) == (None, None, None)
    jsonschema.validate(record, record_schema())


def test_limits_are_refused_when_they_make_no_sense() -> None:
    for bad in (
        lambda: sp.Retry(attempts=0),
        lambda: sp.Retry(backoff=-1),
        lambda: sp.Retry(multiplier=0.5),
        lambda: sp.Retry(jitter=2),
        lambda: sp.Retry(retry_on=(KeyboardInterrupt,)),
        lambda: sp.Retry(max_backoff=math.inf),
        lambda: sp.Budget(tokens=-1),
        lambda: sp.Budget(cost=math.nan),
        lambda: sp.workflow("bad", step_attempts="3"),  # type: ignore[arg-type]
        lambda: sp.workflow("bad", deadline=timedelta(0)),
        lambda: _limits.deadline_of(datetime(2030, 1, 1)),
    ):  # no time zone
        with pytest.raises(sp.UsageError):
            bad()
    assert sp.Retry(retry_on=TimeoutError).retry_on == (TimeoutError,)


# -- the decisions, without I/O --------------------------------------------------------------


def test_backoff_grows_by_its_multiplier_up_to_its_cap() -> None:
    policy = sp.Retry(attempts=10, backoff=0.5, multiplier=2, max_backoff=3)
    assert [_limits.backoff_ms(policy, n, "s") for n in range(1, 6)] == [500, 1000, 2000, 3000, 3000]


def test_jitter_is_the_same_for_every_worker_and_within_its_fraction() -> None:
    policy = sp.Retry(backoff=10, jitter=0.5)
    waits = [_limits.backoff_ms(policy, 1, f"run/step/{n}") for n in range(50)]
    assert waits == [_limits.backoff_ms(policy, 1, f"run/step/{n}") for n in range(50)]
    assert all(5_000 <= wait <= 10_000 for wait in waits)
    assert len(set(waits)) > 40


def test_after_a_failure_the_policy_decides_when_or_why_not() -> None:
    policy = sp.Retry(attempts=3, backoff=1, retry_on=(TimeoutError,))

    def decide(exc: Exception, failed: int, deadline: int | None = None) -> Any:
        return _limits.after_failure(
            policy, exc, failed_in_round=failed, now=1_000, deadline_at=deadline, seed="s"
        )

    assert decide(TimeoutError(), 1) == _limits.AfterFailure(2_000)
    assert decide(TimeoutError(), 2) == _limits.AfterFailure(3_000)
    # attempts used up: a limit the run stops at (the next attempt would be due at 5_000)
    assert decide(TimeoutError(), 3) == _limits.AfterFailure(5_000, None, "step_attempts")
    assert decide(ValueError(), 1) == _limits.AfterFailure(None, "not retryable")
    assert decide(TimeoutError(), 1, deadline=2_000) == _limits.AfterFailure(
        2_000, "no time is left before the run's deadline", "deadline"
    )
    assert decide(TimeoutError(), 1, deadline=2_001) == _limits.AfterFailure(2_000)
    once = sp.Retry(attempts=1)  # a step tried once fails: no limit stands in its way
    assert _limits.after_failure(
        once, TimeoutError(), failed_in_round=1, now=0, deadline_at=None, seed="s"
    ) == _limits.AfterFailure(None)


def test_the_next_attempt_counts_on_from_the_ledger() -> None:
    def tried(*numbers: int) -> list[AttemptRecord]:
        return [AttemptRecord("r", "s", n, StepKind.READ, "f", "h", {}, 0) for n in numbers]

    assert _limits.next_attempt(0, []) == (1, None)
    assert _limits.next_attempt(0, tried(1, 2)) == (3, tried(2)[0])
    assert _limits.next_attempt(2, tried(1)) == (3, None)  # an earlier round's failure
    assert _limits.next_attempt(2, tried(1, 3)) == (4, tried(3)[0])


def test_a_runs_default_attempts_keep_their_recorded_numbers_and_the_codes_errors() -> None:
    recorded = sp.Retry(attempts=4, backoff=2)
    in_code = sp.Retry(attempts=9, backoff=0, retry_on=(TimeoutError,))
    chosen = _limits.run_default(recorded, in_code)
    assert chosen is not None
    assert (chosen.attempts, chosen.backoff, chosen.retry_on) == (4, 2, (TimeoutError,))
    assert _limits.run_default(None, in_code) is None  # a run recorded without one has none
    assert _limits.step_policy(StepKind.PURE, in_code, recorded) == _limits.ONCE
    assert _limits.step_policy(StepKind.READ, None, recorded) is recorded
    assert _limits.step_policy(StepKind.MODEL, in_code, recorded) is in_code


def test_a_budget_is_spent_once_what_was_spent_reaches_it() -> None:
    base = RunRecord(
        "r", "w", "1", RunStatus.RUNNING, "h", None, 1, None, None, 1, 0, 0, None, None, None, 0, 0
    )
    from dataclasses import replace

    assert _limits.spent_budget(base) is None
    assert _limits.spent_budget(replace(base, token_budget=10, tokens_spent=9)) is None
    assert _limits.spent_budget(replace(base, token_budget=10, tokens_spent=10)) == ("tokens", 10, 10)
    assert _limits.spent_budget(replace(base, cost_budget=1.0, cost_spent=1.5)) == ("cost", 1.0, 1.5)
    assert _limits.merged_budget(sp.Budget(tokens=5, cost=1), sp.Budget(cost=2)) == sp.Budget(
        tokens=5, cost=2
    )


def test_the_errors_of_limits_keep_what_callers_read() -> None:
    resumes = BudgetExhausted("r", 2, 3)
    assert (resumes.budget, resumes.resumes, resumes.kind, resumes.limit, resumes.spent) == (
        2,
        3,
        "resumes",
        2,
        3,
    )
    tokens = BudgetExhausted("r", 30, kind="tokens", spent=34)
    assert "spent 34 tokens of its tokens budget of 30" in tokens.message
    late = DeadlineExceeded("r", T0, step_id="s")
    assert "2023-11-14T22:13:20.000Z" in late.message
    assert isinstance(late, sp.LimitReached)
    assert isinstance(resumes, sp.LimitReached)


# -- seeing the limits -----------------------------------------------------------------------


def test_show_gives_the_runs_limits_and_a_step_waiting_for_its_next_attempt(clocked: Any) -> None:
    read = Calls(fail=1)

    @sp.workflow("limits-shown", budget=sp.Budget(tokens=1_000, cost=2.5), step_attempts=4)
    def flow(run: sp.Run) -> Any:
        run.model("model", anthropic_shaped, model="m-1", messages=[])
        return run.read("quote", read, retry=sp.Retry(attempts=3, backoff=5))

    clocked.crash_in_sleep = True
    with pytest.raises(SimulatedCrash):
        sp.start(clocked.store, flow, run_id="r", lease_ms=0, deadline=timedelta(hours=1))
    url = clocked.store.url
    out = CliRunner().invoke(cli, ["--store", url, "show", "r"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "tokens 17 of 1000 spent" in text
    assert "cost 0 of 2.5 spent" in text
    assert "step attempts 4" in text
    assert "deadline" in text
    assert "⟳ attempt 1 failed (TimeoutError: call 1 failed); next at" in text


# -- transient failures -----------------------------------------------------------------------


def test_a_transient_failure_waits_what_the_server_asked_when_that_is_longer(clocked: Any) -> None:
    from safepoint.errors import TransientFailure

    calls = {"n": 0}

    def rate_limited() -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            raise TransientFailure("429 from the model API", retry_after=7.5)
        if calls["n"] == 2:
            raise TransientFailure("503 from the model API", retry_after=0.1)  # shorter: back-off wins
        return "answer"

    @sp.workflow("transient-wait")
    def flow(run: sp.Run) -> Any:
        return run.read(
            "quote", rate_limited, retry=sp.Retry(attempts=4, backoff=1, retry_on=TransientFailure)
        )

    assert sp.start(clocked.store, flow, run_id="r") == "answer"
    assert clocked.slept == [7.5, 2.0]
    first, second = clocked.store.load_ledger("r").attempts["quote"]
    assert first.retry_at - first.recorded_at == 7_500
    assert first.error["type"] == "TransientFailure"
    assert second.retry_at - second.recorded_at == 2_000


def test_a_transient_failure_whose_attempts_ran_out_stops_the_run_resumably(clocked: Any) -> None:
    from safepoint.errors import TransientFailure

    outage = {"over": False}

    def model_call() -> str:
        if not outage["over"]:
            raise TransientFailure("529 overloaded", retry_after=1)
        return "reply"

    @sp.workflow("transient-outage")
    def flow(run: sp.Run) -> Any:
        return run.read("reply", model_call, retry=sp.Retry(attempts=2, backoff=0, retry_on=TransientFailure))

    with pytest.raises(StepAttemptsExhausted):
        sp.start(clocked.store, flow, run_id="r")
    assert clocked.store.get_run("r").status is RunStatus.STOPPED  # stopped, not failed
    outage["over"] = True
    sp.extend_limits(clocked.store, "r", step_attempts=4, by="ops", reason="the outage is over")
    assert sp.resume(clocked.store, "r") == "reply"


def test_an_unusable_retry_after_is_ignored_not_fatal() -> None:
    from safepoint.errors import TransientFailure

    assert TransientFailure("x", retry_after=-1).retry_after is None
    assert TransientFailure("x", retry_after=True).retry_after is None  # type: ignore[arg-type]
    assert TransientFailure("x", retry_after=3).retry_after == 3


def test_a_transient_failure_is_retried_whatever_retry_on_names(clocked: Any) -> None:
    from safepoint.errors import TransientFailure

    calls = Calls(fail=1, error=TransientFailure)

    @sp.workflow("transient-any")
    def flow(run: sp.Run) -> Any:
        return run.read("quote", calls, retry=sp.Retry(attempts=2, backoff=0, retry_on=TimeoutError))

    assert sp.start(clocked.store, flow, run_id="r") == "ok"
    assert calls.count == 2
