"""Cases a second reading of the merged features found where two of them meet: fan-out with
approvals and blocks, re-planning with step attempts, with cancels and deadlines, and with a
continue-as-new chain; and existing ledgers, with runs in every status, opened and migrated."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import DeadlineExceeded
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunStatus


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _stop_before_completion(
    store: sp.Store, wf: sp.Workflow, crash_at: Any, *args: Any, run_id: str = "r"
) -> None:
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id=run_id, lease_ms=0)
    crash_at(None)


# -- fan-out: a branch that releases the run while another branch has an effect in flight ----------


def _slow_while_running(
    store: sp.Store, run_id: str, started: threading.Event, execute: Callable[[Any, sp.EffectKey], Any]
) -> Callable[..., Any]:
    """``execute``, called once the run was released by another branch (or half a second
    passed): a dispatch still in flight when its sibling makes the run wait or block."""

    def slow(payload: Any, key: sp.EffectKey) -> Any:
        started.set()
        until = time.monotonic() + 0.5
        while time.monotonic() < until and store.get_run(run_id).status is RunStatus.RUNNING:
            time.sleep(0.01)
        return execute(payload, key)

    return slow


def _after(started: threading.Event, answer: Any) -> Callable[..., Any]:
    def wait_then(*_: Any) -> Any:
        assert started.wait(10)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return wait_then


def test_a_branch_waiting_for_approval_lets_an_effect_in_flight_in_another_record_its_receipt(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """The gate of branch a would release the run while branch b's charge is on the wire: b's
    receipt could then not be recorded, and a charge that happened would wait for a person."""
    started = threading.Event()
    charges = owner_effect("charges", reconcile=False)
    charge = replace(charges, execute=_slow_while_running(store, "r", started, charges.execute))
    refund = sp.Effect(
        "refund", execute=lambda payload, key: {"id": "rf_1"}, target_state=_after(started, {"balance": 40})
    )

    @sp.workflow(_name("fan-approval"))
    def flow(run: sp.Run) -> Any:
        return run.parallel(
            "fan",
            {
                "a": lambda branch: branch.effect("refund", refund, payload={"amount": 1}, approval=True),
                "b": lambda branch: branch.effect("charge", charge, payload={"amount": 2}),
            },
        )

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    ledger = store.load_ledger("r")
    assert ledger.run.status is RunStatus.WAITING
    assert ledger.operations["fan.b/charge"].state is EffectState.ACCEPTED
    sp.approve(store, "r", "fan.a/refund", by="ana")
    result = sp.resume(store, "r")
    assert result["a"] == {"id": "rf_1"}
    assert result["b"]["amount"] == 2
    assert owner_env.client.stats()["applied"] == 1  # the charge, once, never reconciled


def test_a_branch_that_blocks_lets_an_effect_in_flight_in_another_record_its_receipt(
    store: sp.Store, owner_env: OwnerService
) -> None:
    started = threading.Event()
    charges = owner_effect("charges", reconcile=False)
    charge = replace(charges, execute=_slow_while_running(store, "r", started, charges.execute))
    lost = sp.Effect("mail", execute=_after(started, ConnectionError("no answer")))

    @sp.workflow(_name("fan-block"))
    def flow(run: sp.Run) -> Any:
        return run.parallel(
            "fan",
            {
                "a": lambda branch: branch.effect("mail", lost, payload={"to": "x"}),
                "b": lambda branch: branch.effect("charge", charge, payload={"amount": 2}),
            },
        )

    with pytest.raises(sp.NeedsReconciliation) as blocked:
        sp.start(store, flow, run_id="r")
    assert blocked.value.operation_id == "fan.a/mail"
    ledger = store.load_ledger("r")
    assert ledger.run.status is RunStatus.BLOCKED
    assert ledger.operations["fan.b/charge"].state is EffectState.ACCEPTED
    assert owner_env.client.stats()["applied"] == 1


def test_an_async_branch_waiting_for_approval_lets_an_effect_in_flight_record_its_receipt(
    memory_store: sp.Store,
) -> None:
    """The same in one event loop: the gate yields to the loop while the sibling's call ends."""
    started = asyncio.Event()
    sent: list[Any] = []

    async def charge(payload: Any, key: sp.EffectKey) -> Any:
        started.set()
        for _ in range(50):
            if memory_store.get_run("r").status is not RunStatus.RUNNING:
                break
            await asyncio.sleep(0.01)
        sent.append(payload)
        return {"id": "ch_1"}

    async def balance(payload: Any) -> Any:
        await started.wait()
        return {"balance": 40}

    charges = sp.Effect("charge", execute=charge)
    refund = sp.Effect("refund", execute=lambda payload, key: {"id": "rf_1"}, target_state=balance)

    @sp.workflow(_name("gather-approval"))
    async def flow(run: sp.AsyncRun) -> Any:
        async def a(branch: sp.AsyncRun) -> Any:
            return await branch.effect("refund", refund, payload={"amount": 1}, approval=True)

        async def b(branch: sp.AsyncRun) -> Any:
            return await branch.effect("charge", charges, payload={"amount": 2})

        return await run.gather("fan", {"a": a, "b": b})

    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    ledger = memory_store.load_ledger("r")
    assert ledger.run.status is RunStatus.WAITING
    assert ledger.operations["fan.b/charge"].state is EffectState.ACCEPTED
    sp.approve(memory_store, "r", "fan.a/refund", by="ana")
    assert sp.resume(memory_store, "r") == {"a": {"id": "rf_1"}, "b": {"id": "ch_1"}}
    assert sent == [{"amount": 2}]


def test_a_branch_that_waits_is_reported_even_when_a_branch_before_it_lost_its_next_write(
    memory_store: sp.Store,
) -> None:
    """Branch a is in a step when branch b makes the run wait: a's record is refused (the run
    is no longer running). The caller learns that the run waits for approval, not that another
    worker took it over."""
    gated = threading.Event()
    refund = sp.Effect("refund", execute=lambda payload, key: {"id": "rf_1"})

    def slow_read() -> int:
        gated.wait(0.5)
        until = time.monotonic() + 2
        while time.monotonic() < until and memory_store.get_run("r").status is RunStatus.RUNNING:
            time.sleep(0.01)
        return 1

    def wait_for_approval(branch: sp.Run) -> Any:
        gated.set()
        return branch.effect("refund", refund, payload={"amount": 1}, approval=True)

    @sp.workflow(_name("fan-report"))
    def flow(run: sp.Run) -> Any:
        return run.parallel(
            "fan", {"a": lambda branch: branch.read("slow", slow_read), "b": wait_for_approval}
        )

    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    assert memory_store.get_run("r").status is RunStatus.WAITING


def test_what_parallel_model_steps_spent_is_counted_whole_when_the_run_continues(
    memory_store: sp.Store,
) -> None:
    """Branches on threads add their tokens to the run object at once: none may be lost, or the
    successor starts with more budget than the chain has left."""

    def model(**_: Any) -> dict[str, Any]:
        return {"usage": {"total_tokens": 1}}

    @sp.workflow(_name("fan-budget"), budget=sp.Budget(tokens=100_000))
    def flow(run: sp.Run, round_: int) -> int:
        if round_ == 0:
            run.parallel(
                "fan",
                [
                    lambda branch, i=i: [
                        branch.model(f"m{j}", model, model="m", messages=[i, j]) for j in range(60)
                    ]
                    for i in range(8)
                ],
            )
            run.continue_as_new(1)
        return round_

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads change hands as often as they can
    try:
        for attempt in range(4):
            sp.start(memory_store, flow, 0, run_id=f"r{attempt}")
            first, successor = memory_store.get_run(f"r{attempt}"), memory_store.get_run(f"r{attempt}~1")
            assert first.tokens_spent == 480
            assert successor.token_budget == 100_000 - 480
    finally:
        sys.setswitchinterval(switching)


# -- re-planning meets attempts, cancels, deadlines and chains ----------------------------------------


def test_a_re_planned_step_gets_all_its_attempts_again(memory_store: sp.Store, crash_at: Any) -> None:
    """The old question's failed attempts are its history: the new question is asked with the
    attempts its policy gives it."""
    calls: list[str] = []

    def flaky(question: str) -> dict[str, str]:
        calls.append(question)
        if len(calls) % 2 == 1:
            raise ConnectionError("flaky")
        return {"answer": question}

    def plan(question: str) -> Callable[[sp.Run], Any]:
        def body(run: sp.Run) -> Any:
            return run.read("fetch", flaky, question, retry=sp.Retry(attempts=2, backoff=0))

        return body

    name = _name("replan-attempts")
    _stop_before_completion(memory_store, sp.workflow(name, version="1")(plan("a")), crash_at)
    assert calls == ["a", "a"]
    sp.workflow(name, version="2", compatibility="replan")(plan("b"))
    assert sp.resume(memory_store, "r") == {"answer": "b"}
    assert calls == ["a", "a", "b", "b"]
    attempts = memory_store.load_ledger("r").attempts["fetch"]
    assert [(a.attempt, a.input_hash == attempts[0].input_hash) for a in attempts] == [
        (1, True),
        (2, False),
    ]  # numbered on after the old question's failures
    assert memory_store.load_ledger("r").steps["fetch"].attempt == 3


def test_a_re_plan_in_one_branch_keeps_what_its_sibling_branches_recorded(
    memory_store: sp.Store, crash_at: Any
) -> None:
    """Branches are independent: a stale step of branch a abandons a's tail and what follows
    the fan-out, never a sibling's steps recorded in between — b's unchanged question is not
    asked (its model not called) again."""
    calls: list[str] = []

    def model(**kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs["messages"][0])
        return {"text": kwargs["messages"][0]}

    def plan(question: str) -> Callable[[sp.Run], Any]:
        def body(run: sp.Run) -> Any:
            answers = run.parallel(
                "fan",
                {
                    "a": lambda branch: branch.model("m", model, model="x", messages=[question]),
                    "b": lambda branch: branch.model("m", model, model="x", messages=["same"]),
                },
                max_threads=1,
            )
            summary = run.pure("join", lambda a, b: f"{a['text']}+{b['text']}", answers["a"], answers["b"])
            return {**answers, "summary": summary}

        return body

    name = _name("fan-replan")
    _stop_before_completion(memory_store, sp.workflow(name, version="1")(plan("old")), crash_at)
    assert calls == ["old", "same"]
    sp.workflow(name, version="2", compatibility="replan")(plan("new"))
    result = sp.resume(memory_store, "r")
    assert result["summary"] == "new+same"
    assert calls == ["old", "same", "new"]  # b's answer replayed, never re-generated
    abandoned = [e.step_id for e in memory_store.events("r") if e.kind == "step.abandoned"]
    assert abandoned == ["fan.a/m", "join"]


def test_a_cancelled_run_whose_code_changed_ends_cancelled_under_replan(
    store: sp.Store, crash_at: Any
) -> None:
    """Re-planning is new work, refused once a cancel is asked for: the run must end cancelled,
    not stay running with the refusal raised at every resume."""
    name = _name("replan-cancel")

    @sp.workflow(name, version="1")
    def v1(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 1))

    _stop_before_completion(store, v1, crash_at)
    sp.cancel(store, "r", by="ana", reason="not needed")

    @sp.workflow(name, version="2", compatibility="replan")
    def v2(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 2))

    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r", lease_ms=0)
    run = store.get_run("r")
    assert (run.status, run.owner, run.workflow_version) == (RunStatus.CANCELLED, None, "1")
    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r")


def test_a_run_past_its_deadline_whose_code_changed_stops_under_replan(
    store: sp.Store, crash_at: Any
) -> None:
    name = _name("replan-deadline")
    deadline = datetime.now(UTC) + timedelta(milliseconds=300)

    @sp.workflow(name, version="1")
    def v1(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 1))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, v1, run_id="r", lease_ms=0, deadline=deadline)
    crash_at(None)
    time.sleep(0.4)

    @sp.workflow(name, version="2", compatibility="replan")
    def v2(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 2))

    with pytest.raises(DeadlineExceeded):
        sp.resume(store, "r", lease_ms=0)
    run = store.get_run("r")
    assert (run.status, run.owner) == (RunStatus.STOPPED, None)
    assert run.error is not None
    assert run.error["type"] == "DeadlineExceeded"


def test_a_continue_as_new_refused_past_the_deadline_stops_the_run(store: sp.Store) -> None:
    """The store refuses the continue (a successor would outlive the chain's deadline): the run
    stops, released — not left running, held by a worker that went away."""

    @sp.workflow(_name("late-continue"), deadline=timedelta(milliseconds=300))
    def flow(run: sp.Run, round_: int) -> int:
        run.pure("p", lambda: 1)
        if round_ == 0:
            time.sleep(0.4)  # past the deadline, with nothing new started meanwhile
            run.continue_as_new(1)
        return round_

    with pytest.raises(DeadlineExceeded):
        sp.start(store, flow, 0, run_id="r")
    run = store.get_run("r")
    assert (run.status, run.owner, run.successor_run_id) == (RunStatus.STOPPED, None, None)
    assert run.error is not None
    assert run.error["type"] == "DeadlineExceeded"


def test_a_successor_under_replan_replays_what_its_chain_settled_for_another_payload(
    memory_store: sp.Store,
) -> None:
    """Under ``replan`` a settled operation whose payload the new plan computes differently
    returns its receipt (it is never sent again) — in a successor as within one run."""
    sent: list[Any] = []
    effect = sp.Effect("charge", execute=lambda payload, key: sent.append(payload) or {"id": 1})

    @sp.workflow(_name("chain-replan"), compatibility="replan")
    def flow(run: sp.Run, amount: int) -> Any:
        receipt = run.effect("charge", effect, payload={"amount": amount}, operation_id="charge:1")
        if amount == 5:
            run.continue_as_new(7)  # the same operation id, now with another payload
        return receipt

    assert sp.start(memory_store, flow, 5, run_id="r") == {"id": 1}
    assert sent == [{"amount": 5}]
    assert memory_store.get_run("r~1").status is RunStatus.COMPLETED
