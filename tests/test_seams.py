"""Cases a second reading of the merged features found where two of them meet: fan-out with
approvals and blocks, re-planning with step attempts, with cancels and deadlines, and with a
continue-as-new chain; and ledgers migrated from the oldest schema with runs in every status."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

import safepoint as sp
from safepoint._crashpoints import SimulatedCrash
from safepoint.testing.effects import owner_effect
from safepoint.testing.owner import OwnerService


@pytest.fixture
def store(store_url: str) -> Iterator[sp.Store]:
    """A fresh store of each kind (SQLite file, PostgreSQL), closed at the end."""
    opened = sp.open_store(store_url)
    yield opened
    opened.close()


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _stop_before_completion(store: sp.Store, wf: sp.Workflow, crash_at: Any, *args: Any,
                            run_id: str = "r") -> None:
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id=run_id, lease_ms=0)
    crash_at(None)


# -- fan-out: a branch that releases the run while another branch has an effect in flight ----------


def _slow_while_running(store: sp.Store, run_id: str, started: threading.Event,
                        execute: Callable[[Any, sp.EffectKey], Any]) -> Callable[..., Any]:
    """``execute``, called once the run was released by another branch (or half a second
    passed): a dispatch still in flight when its sibling makes the run wait or block."""
    def slow(payload: Any, key: sp.EffectKey) -> Any:
        started.set()
        until = time.monotonic() + 0.5
        while time.monotonic() < until and store.get_run(run_id).status is sp.RunStatus.RUNNING:
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
        store: sp.Store, owner_env: OwnerService) -> None:
    """The gate of branch a would release the run while branch b's charge is on the wire: b's
    receipt could then not be recorded, and a charge that happened would wait for a person."""
    started = threading.Event()
    charges = owner_effect("charges", reconcile=False)
    charge = replace(charges, execute=_slow_while_running(store, "r", started, charges.execute))
    refund = sp.Effect("refund", execute=lambda payload, key: {"id": "rf_1"},
                       target_state=_after(started, {"balance": 40}))

    @sp.workflow(_name("fan-approval"))
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {
            "a": lambda branch: branch.effect("refund", refund, payload={"amount": 1},
                                              approval=True),
            "b": lambda branch: branch.effect("charge", charge, payload={"amount": 2})})

    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, flow, run_id="r")
    ledger = store.load_ledger("r")
    assert ledger.run.status is sp.RunStatus.WAITING
    assert ledger.operations["fan.b/charge"].state is sp.EffectState.ACCEPTED
    sp.approve(store, "r", "fan.a/refund", by="ana")
    result = sp.resume(store, "r")
    assert result["a"] == {"id": "rf_1"}
    assert result["b"]["amount"] == 2
    assert owner_env.client.stats()["applied"] == 1  # the charge, once, never reconciled


def test_a_branch_that_blocks_lets_an_effect_in_flight_in_another_record_its_receipt(
        store: sp.Store, owner_env: OwnerService) -> None:
    started = threading.Event()
    charges = owner_effect("charges", reconcile=False)
    charge = replace(charges, execute=_slow_while_running(store, "r", started, charges.execute))
    lost = sp.Effect("mail", execute=_after(started, ConnectionError("no answer")))

    @sp.workflow(_name("fan-block"))
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {
            "a": lambda branch: branch.effect("mail", lost, payload={"to": "x"}),
            "b": lambda branch: branch.effect("charge", charge, payload={"amount": 2})})

    with pytest.raises(sp.NeedsReconciliation) as blocked:
        sp.start(store, flow, run_id="r")
    assert blocked.value.operation_id == "fan.a/mail"
    ledger = store.load_ledger("r")
    assert ledger.run.status is sp.RunStatus.BLOCKED
    assert ledger.operations["fan.b/charge"].state is sp.EffectState.ACCEPTED
    assert owner_env.client.stats()["applied"] == 1


def test_an_async_branch_waiting_for_approval_lets_an_effect_in_flight_record_its_receipt(
        memory_store: sp.Store) -> None:
    """The same in one event loop: the gate yields to the loop while the sibling's call ends."""
    started = asyncio.Event()
    sent: list[Any] = []

    async def charge(payload: Any, key: sp.EffectKey) -> Any:
        started.set()
        for _ in range(50):
            if memory_store.get_run("r").status is not sp.RunStatus.RUNNING:
                break
            await asyncio.sleep(0.01)
        sent.append(payload)
        return {"id": "ch_1"}

    async def balance(payload: Any) -> Any:
        await started.wait()
        return {"balance": 40}

    charges = sp.Effect("charge", execute=charge)
    refund = sp.Effect("refund", execute=lambda payload, key: {"id": "rf_1"},
                       target_state=balance)

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
    assert ledger.run.status is sp.RunStatus.WAITING
    assert ledger.operations["fan.b/charge"].state is sp.EffectState.ACCEPTED
    sp.approve(memory_store, "r", "fan.a/refund", by="ana")
    assert sp.resume(memory_store, "r") == {"a": {"id": "rf_1"}, "b": {"id": "ch_1"}}
    assert sent == [{"amount": 2}]


def test_a_branch_that_waits_is_reported_even_when_a_branch_before_it_lost_its_next_write(
        memory_store: sp.Store) -> None:
    """Branch a is in a step when branch b makes the run wait: a's record is refused (the run
    is no longer running). The caller learns that the run waits for approval, not that another
    worker took it over."""
    gated = threading.Event()
    refund = sp.Effect("refund", execute=lambda payload, key: {"id": "rf_1"})

    def slow_read() -> int:
        gated.wait(0.5)
        until = time.monotonic() + 2
        while time.monotonic() < until and \
                memory_store.get_run("r").status is sp.RunStatus.RUNNING:
            time.sleep(0.01)
        return 1

    def wait_for_approval(branch: sp.Run) -> Any:
        gated.set()
        return branch.effect("refund", refund, payload={"amount": 1}, approval=True)

    @sp.workflow(_name("fan-report"))
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {"a": lambda branch: branch.read("slow", slow_read),
                                    "b": wait_for_approval})

    with pytest.raises(sp.AwaitingApproval):
        sp.start(memory_store, flow, run_id="r")
    assert memory_store.get_run("r").status is sp.RunStatus.WAITING
