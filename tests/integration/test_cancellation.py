"""Cancellation: a cancelled run starts nothing new, settles what is in flight, and is never
resumed into activity."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner

import safepoint as sp
from safepoint.ops.cli import cli
from safepoint.testing import SimulatedCrash
from safepoint.types import EffectState, RunStatus


def test_a_pending_run_is_cancelled_at_once(store_url: str) -> None:
    store = sp.open_store(store_url)

    @sp.workflow("cancel-pending")
    def flow(run: sp.Run) -> int:
        return 1

    sp.submit(store, flow, run_id="r")
    run = sp.cancel(store, "r", by="ops", reason="duplicate request")
    assert run.status is RunStatus.CANCELLED
    assert (
        sp.Worker(store, workflows=["cancel-pending"]).run(until_idle=True, handle_signals=False).claimed == 0
    )
    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r")
    event = store.events("r")[-1]
    assert (event.kind, event.worker, event.detail["reason"]) == ("run.cancelled", "ops", "duplicate request")


def test_a_running_run_stops_before_its_next_dispatch(store_url: str) -> None:
    store = sp.open_store(store_url)
    sent: list[Any] = []
    effect = sp.Effect("refund", execute=lambda payload, key: sent.append(payload) or {"ok": 1})

    def operator_cancels() -> str:
        sp.cancel(store, "r", by="ops")  # arrives while the worker is busy in this step
        return "drafted"

    @sp.workflow("cancel-running")
    def flow(run: sp.Run) -> Any:
        run.read("draft", operator_cancels)
        return run.effect("refund", effect, payload={"amount": 5})

    with pytest.raises(sp.RunCancelled):
        sp.start(store, flow, run_id="r")
    assert sent == []
    run = store.get_run("r")
    assert (run.status, run.error["type"]) == (RunStatus.CANCELLED, "Cancelled")
    assert "draft" not in store.load_ledger("r").steps  # nothing new was recorded either
    with pytest.raises(sp.RunCancelled):
        sp.resume(store, "r")


@pytest.mark.parametrize(
    ("answer", "state"),
    [
        (sp.Applied({"id": "re_1"}), EffectState.ACCEPTED),
        (sp.NotApplied(), EffectState.PREPARED),
    ],
)
def test_an_effect_in_flight_is_settled_before_the_run_ends(
    memory_store: sp.Store, crash_at: Any, answer: Any, state: EffectState
) -> None:
    calls: list[str] = []
    effect = sp.Effect(
        "refund",
        execute=lambda payload, key: calls.append("execute") or {},
        reconcile=lambda key: calls.append("reconcile") or answer,
        dedup_retention=timedelta(hours=1),
    )

    @sp.workflow(f"cancel-in-flight-{state.value}")
    def flow(run: sp.Run) -> Any:
        run.effect("refund", effect, payload={"amount": 5})
        return run.pure("after", lambda: "more")

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert sp.cancel(memory_store, "r", by="ops").status is RunStatus.RUNNING  # marked
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")
    assert calls == ["reconcile"]  # settled through its owner, never dispatched again
    ledger = memory_store.load_ledger("r")
    assert ledger.operations["refund"].state is state
    assert ledger.run.status is RunStatus.CANCELLED
    assert "after" not in ledger.steps


def test_cancel_from_the_command_line(file_store: sp.Store) -> None:
    @sp.workflow("cancel-cli")
    def flow(run: sp.Run) -> int:
        return 1

    sp.submit(file_store, flow, run_id="r")
    result = CliRunner().invoke(cli, ["--store", file_store.url, "cancel", "r", "--by", "ops"])
    assert result.exit_code == 0, result.output
    assert "now cancelled" in result.output
    assert file_store.get_run("r").status is RunStatus.CANCELLED


def test_cancelling_a_blocked_run_never_forgets_its_uncertain_effect(memory_store: sp.Store) -> None:
    effect = sp.Effect(
        "refund",
        execute=lambda p, k: (_ for _ in ()).throw(TimeoutError()),
        reconcile=lambda key: sp.Unknown("index down"),
        dedup_retention=timedelta(hours=1),
    )

    @sp.workflow("blocked-then-cancelled")
    def flow(run: sp.Run) -> Any:
        return run.effect("refund", effect, payload={"amount": 5})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    marked = sp.cancel(memory_store, "r", by="ops")
    assert marked.status is RunStatus.BLOCKED  # a person settles the effect first
    assert marked.cancel_requested_at is not None
    assert memory_store.load_ledger("r").operations["refund"].state is EffectState.UNKNOWN
    sp.resolve(
        memory_store,
        "r",
        "abandon",
        revision=marked.state_revision,
        by="ops",
        evidence="refund confirmed absent at the provider",
    )
    assert memory_store.get_run("r").status is RunStatus.CANCELLED


def test_a_swallowed_cancel_cannot_complete_the_run(memory_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("swallows-cancel")
    def flow(run: sp.Run) -> str:
        run.pure("first", lambda: 1)
        try:  # noqa: SIM105 - written as careless agent code is
            run.pure("second", lambda: 2)
        except BaseException:
            pass
        return "done"

    crash_at("step.after_record:first")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    sp.cancel(memory_store, "r", by="ops")
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")
    assert memory_store.get_run("r").status is RunStatus.CANCELLED
