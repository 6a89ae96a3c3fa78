"""Once an effect may have been dispatched, no way out of the call forgets it.

Each test is a way an uncertain outcome could slip through: a bad receipt, an interrupted call,
agent code that retries, a connection refused after an earlier attempt may have landed, a step
outliving its lease, a step id that collides with an occurrence counter.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import InvalidStepId
from safepoint.storage import SqliteStore
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunStatus, StepStatus

HOUR = dt.timedelta(hours=1)


def test_a_bad_receipt_is_reconciled_not_failed(memory_store: sp.Store) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        return {"id": "ch_1", "created": dt.datetime.now()}  # an SDK object slipped through

    effect = sp.Effect(
        "charge", execute=execute, dedup_retention=HOUR, reconcile=lambda key: sp.Applied({"id": "ch_1"})
    )

    @sp.workflow("bad-receipt")
    def flow(run: sp.Run) -> Any:
        for _ in range(3):
            try:
                return run.effect("charge", effect, payload={"amount": 5})
            except Exception:  # agent code that retries on anything
                continue
        return "gave up"

    assert sp.start(memory_store, flow, run_id="r") == {"id": "ch_1"}
    assert len(keys) == 1
    op = memory_store.load_ledger("r").operations["charge"]
    assert op.state is EffectState.ACCEPTED
    assert op.dispatch_count == 1


@pytest.mark.parametrize("receipt", [{"at": dt.date(2026, 1, 1)}, {"note": "\ud800"}])
def test_a_bad_receipt_without_reconcile_blocks(memory_store: sp.Store, receipt: Any) -> None:
    effect = sp.Effect("charge", execute=lambda payload, key: receipt)

    @sp.workflow("bad-receipt-block")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={"amount": 5})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    run = memory_store.get_run("r")
    assert run.status is RunStatus.BLOCKED  # never "failed": the charge may exist
    assert memory_store.load_ledger("r").operations["charge"].state is EffectState.UNKNOWN
    assert run.recovery_record["evidence"]["last_error"]["type"] == "NotJSON"


def test_an_interrupted_async_call_blocks_and_a_retry_cannot_mint_a_key(memory_store: sp.Store) -> None:
    keys: list[str] = []

    async def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        await asyncio.sleep(0.2 if len(keys) == 1 else 0)
        return {"id": len(keys)}

    effect = sp.Effect("charge", execute=execute)

    @sp.workflow("timeout-retry")
    async def flow(run: sp.AsyncRun) -> Any:
        try:
            return await asyncio.wait_for(run.effect("charge", effect, payload={"a": 1}), 0.05)
        except TimeoutError:
            return await run.effect("charge", effect, payload={"a": 1})  # the agent retries

    with pytest.raises(sp.NeedsReconciliation, match="interrupted"):
        sp.start(memory_store, flow, run_id="r")  # the retry is refused, no new key minted
    assert len(keys) == 1
    ledger = memory_store.load_ledger("r")
    assert [op.state for op in ledger.operations.values()] == [EffectState.UNKNOWN]
    # released, not blocked: the next worker reconciles (here: no reconcile, so it blocks)
    assert (ledger.run.status, ledger.run.owner) == (RunStatus.RUNNING, None)
    with pytest.raises(sp.NeedsReconciliation, match="no reconcile"):
        sp.resume(memory_store, "r")
    assert len(keys) == 1
    assert memory_store.get_run("r").status is RunStatus.BLOCKED


def test_a_cancelled_async_run_is_released_not_failed(memory_store: sp.Store) -> None:
    """asyncio.timeout around a whole run (or Ctrl-C under asyncio.run) cancels the task: the
    cancellation goes on, and the run is given back for the next worker — never FAILED."""
    started = asyncio.Event()

    async def slow() -> int:
        started.set()
        await asyncio.sleep(5)
        return 1

    @sp.workflow("cancelled-async")
    async def flow(run: sp.AsyncRun) -> Any:
        return await run.read("slow", slow)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await sp.start_async(memory_store, flow, run_id="r")

    asyncio.run(main())
    assert started.is_set()
    run = memory_store.get_run("r")
    assert (run.status, run.owner, run.error) == (RunStatus.RUNNING, None, None)


def test_not_sent_after_an_uncertain_attempt_stays_uncertain(tmp_path: Path) -> None:
    """Attempt 1 timed out (it may have landed), attempt 2 was refused: the operation must not
    look "never dispatched", or a resume days later would send it past the dedup window."""
    clock = {"now": 1_700_000_000_000}
    store = SqliteStore(tmp_path / "l.db", clock=lambda: clock["now"])
    calls: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        calls.append(str(key))
        if len(calls) == 1:
            raise TimeoutError("read timed out")
        raise sp.NotSent("connection refused")

    effect = sp.Effect(
        "charge",
        execute=execute,
        reconcile=lambda key: sp.NotApplied(),
        dedup_retention=HOUR,
        max_dispatches=2,
    )

    @sp.workflow("notsent-after-unknown")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={"amount": 5})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, flow, run_id="r")
    op = store.load_ledger("r").operations["charge"]
    assert (op.state, op.dispatch_count) == (EffectState.UNKNOWN, 2)
    clock["now"] += 48 * 3600 * 1000
    with pytest.raises(sp.NeedsReconciliation, match="dedup retention"):
        sp.resume(store, "r")
    assert len(calls) == 2


def test_a_long_step_keeps_its_lease(tmp_path: Path) -> None:
    """A model call longer than the lease: the heartbeat keeps the run, so a second starter
    waits and attaches instead of taking over and generating again."""
    store = sp.open_store(f"sqlite:///{tmp_path / 'l.db'}")
    generations: list[str] = []

    def llm(*, model: str, messages: Any) -> Any:
        generations.append(threading.current_thread().name)
        time.sleep(1.2)
        return {"text": "once"}

    @sp.workflow("slow-model")
    def flow(run: sp.Run) -> Any:
        return run.model("draft", llm, model="m", messages=[{"role": "user", "content": "hi"}])

    results: dict[str, Any] = {}

    def go(name: str) -> None:
        try:
            results[name] = sp.start(store, flow, run_id="r", lease_ms=400)
        except BaseException as exc:
            results[name] = exc

    first = threading.Thread(target=go, args=("A",), name="A")
    first.start()
    time.sleep(0.1)
    second = threading.Thread(target=go, args=("B",), name="B")
    second.start()
    first.join()
    second.join()
    assert generations == ["A"]
    assert results == {"A": {"text": "once"}, "B": {"text": "once"}}
    assert store.get_run("r").fence == 1


def test_step_ids_cannot_collide_with_occurrences(memory_store: sp.Store) -> None:
    @sp.workflow("hash-id")
    def flow(run: sp.Run) -> Any:
        return run.pure("mail#2", lambda: 1)

    with pytest.raises(InvalidStepId):
        sp.start(memory_store, flow, run_id="r")


def test_an_observation_already_used_is_not_read_again(tmp_path: Path, crash_at: Any) -> None:
    clock = {"now": 1_700_000_000_000}
    store = SqliteStore(tmp_path / "l.db", clock=lambda: clock["now"])
    price = {"value": 100}
    effect = sp.Effect("order", execute=lambda payload, key: {"order": "o1", **payload})

    @sp.workflow("quote-then-order")
    def flow(run: sp.Run) -> Any:
        quote = run.read("quote", lambda: price["value"], max_age=dt.timedelta(minutes=10))
        return run.effect("order", effect, payload={"price": quote})

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    clock["now"] += 3_600_000
    price["value"] = 101
    assert sp.resume(store, "r") == {"order": "o1", "price": 100}


def test_a_failed_step_is_replayed_as_the_same_failure(memory_store: sp.Store, crash_at: Any) -> None:
    calls: list[str] = []

    def llm(*, model: str, messages: Any) -> Any:
        calls.append(model)
        if len(calls) == 1:
            raise RuntimeError("429 rate limited")
        return {"text": f"{model} answer"}

    effect = sp.Effect("reply", execute=lambda payload, key: {"sent": payload["text"]})
    seen: list[str] = []

    @sp.workflow("fallback-model")
    def flow(run: sp.Run) -> Any:
        try:
            reply = run.model("draft", llm, model="big", messages=[])
        except sp.StepFailed as failed:
            seen.append(failed.error_type)
            reply = run.model("fallback", llm, model="small", messages=[])
        return run.effect("send", effect, payload=reply)

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert sp.resume(memory_store, "r") == {"sent": "small answer"}
    assert calls == ["big", "small"]
    assert seen == ["RuntimeError", "RuntimeError"]  # the first run and the replay alike
    draft = memory_store.load_ledger("r").steps["draft"]
    assert draft.status is StepStatus.FAILED
    assert draft.error == {"type": "RuntimeError", "message": "429 rate limited"}


def test_an_async_effect_in_a_plain_workflow_prepares_nothing(memory_store: sp.Store) -> None:
    async def execute(payload: Any, key: sp.EffectKey) -> Any:
        return {}

    effect = sp.Effect("async-only", execute=execute)

    @sp.workflow("mixed-effect")
    def flow(run: sp.Run) -> Any:
        return run.effect("fx", effect, payload={})

    with pytest.raises(sp.UsageError, match="async execute"):
        sp.start(memory_store, flow, run_id="r")
    assert memory_store.load_ledger("r").operations == {}


def test_the_stored_payload_is_what_every_dispatch_sends(
    tmp_path: Path, crash_at: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10.0 canonicalises to 10: the first dispatch and a re-dispatch after a crash send the
    same bytes, so the owner sees one request under one key, not a conflicting second one."""
    with OwnerService(index_lag=5.0) as owner:
        monkeypatch.setenv("SAFEPOINT_OWNER_URL", owner.url)
        charges = owner_effect("charges")
        store = sp.open_store(f"sqlite:///{tmp_path / 'l.db'}")

        @sp.workflow("float-payload")
        def flow(run: sp.Run) -> Any:
            return run.effect("charge", charges, payload={"amount": 10.0, "currency": "eur"})

        crash_at("effect.after_receiver_commit")
        with pytest.raises(SimulatedCrash):
            sp.start(store, flow, run_id="r", lease_ms=0)
        crash_at(None)
        receipt = sp.resume(store, "r")  # the lagging index says "not applied": same key again
        assert receipt["id"] == "ch_1"
        stats = owner.client.stats()
        assert (stats["applied"], stats["duplicates"]) == (1, 0)
        op = store.load_ledger("r").operations["charge"]
        assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 2)
