"""Replay: recorded steps come back from the ledger, and a changed question is refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import (
    BudgetExhausted,
    InvalidDecision,
    NotJSON,
    ReplayMismatch,
    RunConflict,
    RunNotFound,
    RunOwned,
    StaleCheckpoint,
)
from safepoint.testing import SimulatedCrash
from safepoint.types import RunStatus


class Counter:
    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, name: str, value: Any = None) -> Any:
        self.calls[name] = self.calls.get(name, 0) + 1
        return value if value is not None else name


def _crash_then_resume(store: sp.Store, flow: sp.Workflow, crash_at: Any, point: str, *args: Any) -> Any:
    crash_at(point)
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, *args, run_id="r", lease_ms=0)
    crash_at(None)
    return sp.resume(store, "r")


def test_every_step_kind_replays_without_calling(memory_store: sp.Store, crash_at: Any) -> None:
    count = Counter()
    executed: list[str] = []
    effect = sp.Effect("e", execute=lambda p, k: executed.append(str(k)) or {"ok": p})

    @sp.workflow("kinds")
    def flow(run: sp.Run, x: int) -> dict[str, Any]:
        return {
            "pure": run.pure("p", lambda v: count("pure", v + 1), x),
            "read": run.read("r", lambda: count("read")),
            "model": run.model(
                "m",
                lambda **kw: count("model", {"text": "hi"}),
                model="m-1",
                messages=[{"role": "user", "content": "q"}],
            ),
            "decision": run.decide("d", lambda: count("decision", "next.step")),
            "now": run.now().isoformat(),
            "random": run.random(),
            "uuid": run.uuid(),
            "effect": run.effect("fx", effect, payload={"v": x}),
        }

    first_calls: dict[str, int] = {}
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, 1, run_id="r", lease_ms=0)
    first_calls.update(count.calls)
    crash_at(None)
    result = sp.resume(memory_store, "r")
    assert count.calls == first_calls == {"pure": 1, "read": 1, "model": 1, "decision": 1}
    assert len(executed) == 1
    steps = memory_store.load_ledger("r").steps
    assert steps["d"].next_step_id == "next.step"
    assert steps["m"].model_id == "m-1"
    assert steps["m"].prompt_hash
    assert result["effect"] == {"ok": {"v": 1}}
    assert set(result) == {"pure", "read", "model", "decision", "now", "random", "uuid", "effect"}


def test_recorded_values_are_stable_across_resumes(memory_store: sp.Store, crash_at: Any) -> None:
    seen: list[tuple[str, float, str]] = []

    @sp.workflow("values")
    def flow(run: sp.Run) -> list[Any]:
        seen.append((run.now().isoformat(), run.random(), run.uuid()))
        return list(seen[-1])

    result = _crash_then_resume(memory_store, flow, crash_at, "run.before_complete")
    assert seen[0] == seen[1]
    assert result == list(seen[0])


def test_repeated_step_ids_get_occurrence_counters(memory_store: sp.Store) -> None:
    @sp.workflow("loop")
    def flow(run: sp.Run) -> list[int]:
        return [run.pure("square", lambda i: i * i, i) for i in range(3)]

    assert sp.start(memory_store, flow, run_id="r") == [0, 1, 4]
    assert list(memory_store.load_ledger("r").steps) == ["square", "square#2", "square#3"]


def test_changed_inputs_raise_stale_checkpoint_and_block(memory_store: sp.Store, crash_at: Any) -> None:
    factor = {"value": 2}

    @sp.workflow("stale")
    def flow(run: sp.Run) -> int:
        return int(run.pure("scale", lambda x: x * 10, factor["value"]))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    factor["value"] = 3  # the code now asks another question at the same step id
    with pytest.raises(StaleCheckpoint) as stale:
        sp.resume(memory_store, "r")
    assert stale.value.step_id == "scale"
    run = memory_store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record is not None
    assert run.recovery_record["phase"] == "stale_checkpoint"
    assert run.recovery_record["state_revision"] == run.state_revision
    assert memory_store.load_ledger("r").steps["scale"].result == 20  # nothing lost


def test_another_kind_at_the_same_id_is_a_replay_mismatch(memory_store: sp.Store, crash_at: Any) -> None:
    use_read = {"value": False}

    @sp.workflow("mismatch")
    def flow(run: sp.Run) -> Any:
        if use_read["value"]:
            return run.read("step", lambda: 1)
        return run.pure("step", lambda: 1)

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    use_read["value"] = True
    with pytest.raises(ReplayMismatch):
        sp.resume(memory_store, "r")


def test_read_is_read_again_only_after_max_age(tmp_path: Any, crash_at: Any) -> None:
    clock = {"now": 1_000_000}
    store = sp.storage.SqliteStore(tmp_path / "l.db", clock=lambda: clock["now"])
    reads: list[int] = []

    @sp.workflow("fresh")
    def flow(run: sp.Run) -> int:
        return int(run.read("quote", lambda: reads.append(1) or len(reads), max_age=timedelta(seconds=60)))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    clock["now"] += 30_000
    crash_at("run.before_complete")  # re-arm: a crash point fires once
    with pytest.raises(SimulatedCrash):
        sp.resume(store, "r")
    assert len(reads) == 1  # still fresh: replayed
    clock["now"] += 31_000
    crash_at(None)
    assert sp.resume(store, "r") == 2  # expired: observed again
    step = store.load_ledger("r").steps["quote"]
    assert (step.attempt, step.observed_at) == (2, clock["now"])


def test_decision_must_name_the_next_step(memory_store: sp.Store) -> None:
    @sp.workflow("bad-decision")
    def flow(run: sp.Run) -> Any:
        return run.decide("route", lambda: 42)

    with pytest.raises(InvalidDecision):
        sp.start(memory_store, flow, run_id="r")
    assert memory_store.get_run("r").status is RunStatus.FAILED


def test_decision_may_carry_details(memory_store: sp.Store) -> None:
    @sp.workflow("rich-decision")
    def flow(run: sp.Run) -> Any:
        return run.decide("route", lambda: {"next_step_id": "refund", "why": "damaged"})

    assert sp.start(memory_store, flow, run_id="r")["why"] == "damaged"
    assert memory_store.load_ledger("r").steps["route"].next_step_id == "refund"


def test_non_json_result_names_the_step_and_type(memory_store: sp.Store) -> None:
    @sp.workflow("not-json")
    def flow(run: sp.Run) -> Any:
        return run.pure("parse", lambda: {"items": [1, {2, 3}]})

    with pytest.raises(NotJSON) as error:
        sp.start(memory_store, flow, run_id="r")
    assert error.value.step_id == "parse"
    assert error.value.path == "$.items[1]"
    assert error.value.type_name == "set"
    assert memory_store.get_run("r").error["type"] == "NotJSON"


def test_a_swallowed_block_cannot_complete_the_run(memory_store: sp.Store) -> None:
    effect = sp.Effect("no-reconcile", execute=lambda p, k: 1 / 0)

    @sp.workflow("swallow")
    def flow(run: sp.Run) -> str:
        try:  # noqa: SIM105 - written the way careless agent code is
            run.effect("fx", effect, payload={})
        except Exception:
            pass  # agent code that catches everything
        run.pure("after", lambda: "more work")
        return "done"

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    run = memory_store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert "after" not in memory_store.load_ledger("r").steps


def test_start_with_the_same_run_id_attaches(memory_store: sp.Store) -> None:
    calls = Counter()

    @sp.workflow("attach")
    def flow(run: sp.Run, x: int) -> int:
        return int(run.pure("p", lambda: calls("p", x * 2)))

    assert sp.start(memory_store, flow, 4, run_id="r") == 8
    assert sp.start(memory_store, flow, 4, run_id="r") == 8
    assert calls.calls == {"p": 1}
    with pytest.raises(RunConflict):
        sp.start(memory_store, flow, 5, run_id="r")

    @sp.workflow("attach-other")
    def other(run: sp.Run, x: int) -> int:
        return x

    with pytest.raises(RunConflict):
        sp.start(memory_store, other, 4, run_id="r")
    assert memory_store.get_run("r").result == 8


def test_failed_run_replays_its_failure(memory_store: sp.Store) -> None:
    @sp.workflow("fails")
    def flow(run: sp.Run) -> None:
        raise ValueError("bad ticket")

    with pytest.raises(sp.RunFailed) as failed:
        sp.start(memory_store, flow, run_id="r")
    assert isinstance(failed.value.__cause__, ValueError)
    with pytest.raises(sp.RunFailed) as again:
        sp.resume(memory_store, "r")
    assert again.value.error_type == "ValueError"


def test_unknown_run_and_unregistered_workflow(memory_store: sp.Store) -> None:
    with pytest.raises(RunNotFound):
        sp.resume(memory_store, "nope")


def test_a_stale_fence_cannot_write(memory_store: sp.Store) -> None:
    """A worker whose run was taken over gets LostOwnership, which `except Exception` misses."""
    store = memory_store
    taken: list[bool] = []

    @sp.workflow("zombie")
    def flow(run: sp.Run) -> str:
        run.pure("one", lambda: 1)
        if not taken:
            current = store.get_run(run.run_id)
            claim = store.claim_run(run.run_id, current.state_revision, "other:1:x", 30_000)
            taken.append(claim is not None)
        try:
            run.pure("two", lambda: 2)
        except Exception:  # agent code cannot swallow it
            return "swallowed"
        return "wrote"

    with pytest.raises(sp.LostOwnership):
        sp.start(store, flow, run_id="r", lease_ms=0)
    assert taken == [True]
    assert "two" not in store.load_ledger("r").steps
    assert store.get_run("r").fence == 2


def test_live_owner_is_not_displaced(memory_store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("busy")
    def flow(run: sp.Run) -> int:
        return 1

    crash_at("run.after_start")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r")  # default lease: held by this live process
    crash_at(None)
    with pytest.raises(RunOwned):
        sp.resume(memory_store, "r")


def test_async_workflow(memory_store: sp.Store) -> None:
    async def fetch(x: int) -> int:
        await asyncio.sleep(0)
        return x + 1

    async def execute(payload: Any, key: sp.EffectKey) -> Any:
        await asyncio.sleep(0)
        return {"key": str(key)}

    effect = sp.Effect("async-fx", execute=execute)

    @sp.workflow("async")
    async def flow(run: sp.AsyncRun, x: int) -> dict[str, Any]:
        value = await run.read("fetch", fetch, x)
        receipt = await run.effect("fx", effect, payload={"v": value})
        return {"value": value, "receipt": receipt, "at": (await run.now()).isoformat()}

    result = sp.start(memory_store, flow, 1, run_id="r")
    assert result["value"] == 2
    assert result["receipt"]["key"].startswith("sp_")


def test_async_function_in_sync_workflow_is_a_clear_error(memory_store: sp.Store) -> None:
    async def fetch() -> int:
        return 1

    @sp.workflow("mixed")
    def flow(run: sp.Run) -> Any:
        return run.read("fetch", fetch)

    with pytest.raises(sp.UsageError, match="async"):
        sp.start(memory_store, flow, run_id="r")
    assert memory_store.load_ledger("r").steps == {}


def test_effect_key_is_minted_once(memory_store: sp.Store, crash_at: Any) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        raise ConnectionResetError("dropped")

    effect = sp.Effect(
        "fx",
        execute=execute,
        reconcile=lambda key: sp.NotApplied(),
        dedup_retention=timedelta(hours=1),
        max_dispatches=3,
    )

    @sp.workflow("keys")
    def flow(run: sp.Run) -> Any:
        return run.effect("fx", effect, payload={"a": 1})

    with pytest.raises(sp.NeedsReconciliation, match="dispatched 3 times"):
        sp.start(memory_store, flow, run_id="r")
    assert len(keys) == 3
    assert len(set(keys)) == 1
    op = memory_store.load_ledger("r").operations["fx"]
    assert op.effect_key == keys[0]


def test_start_async_runs_on_the_callers_loop(memory_store: sp.Store, crash_at: Any) -> None:
    """An async workflow started with start_async shares the caller's event loop, so it can use
    what the caller made there (a session, a queue); a resume does the same."""

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        seen: list[bool] = []

        async def fetch() -> int:
            seen.append(asyncio.get_running_loop() is loop)
            return 7

        @sp.workflow("same-loop")
        async def flow(run: sp.AsyncRun) -> int:
            value = int(await run.read("fetch", fetch))
            await run.now()
            return value

        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            await sp.start_async(memory_store, flow, run_id="r", lease_ms=0)
        crash_at(None)
        result = await sp.resume_async(memory_store, "r")
        assert await sp.submit_async(memory_store, flow, run_id="q") == "q"
        return result, seen

    result, seen = asyncio.run(main())
    assert result == 7
    assert seen == [True]  # read once, on the caller's loop; replayed on resume


def test_a_plain_workflow_from_async_code_runs_in_a_thread(memory_store: sp.Store) -> None:
    @sp.workflow("plain-from-async")
    def flow(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 5))

    assert asyncio.run(sp.start_async(memory_store, flow, run_id="r")) == 5


def test_the_resume_budget_stops_a_run_loudly(memory_store: sp.Store, crash_at: Any) -> None:
    """A run whose worker dies every time is not re-claimed forever."""

    @sp.workflow("always-dies", resume_budget=2)
    def flow(run: sp.Run) -> int:
        return int(run.pure("p", lambda: 1))

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    for _ in range(2):  # two takeovers are within the budget
        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.resume(memory_store, "r", lease_ms=0)
    crash_at(None)
    with pytest.raises(BudgetExhausted) as exhausted:
        sp.resume(memory_store, "r")
    assert (exhausted.value.budget, exhausted.value.resumes) == (2, 3)
    run = memory_store.get_run("r")
    assert (run.status, run.resume_budget) == (RunStatus.STOPPED, 2)  # resumable once raised
    assert run.error["type"] == "BudgetExhausted"


def test_a_spent_budget_with_an_uncertain_effect_blocks(memory_store: sp.Store, crash_at: Any) -> None:
    effect = sp.Effect("fx", execute=lambda payload, key: {"ok": True})

    @sp.workflow("dies-mid-effect", resume_budget=0)
    def flow(run: sp.Run) -> Any:
        return run.effect("fx", effect, payload={})

    crash_at("effect.after_dispatching")
    with pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    with pytest.raises(sp.NeedsReconciliation, match="resume budget"):
        sp.resume(memory_store, "r")
    assert memory_store.get_run("r").status is RunStatus.BLOCKED


def test_pure_steps_are_written_in_batches_and_computed_again_when_a_crash_loses_them(
    file_store: sp.Store, crash_at: Any
) -> None:
    """Pure steps are recomputable: they are written lazily — with the next step the run
    records, or PURE_BATCH at a time — so a long computation costs a commit per batch, not per
    step. A crash loses at most the batch in progress, and a resume computes it again."""
    from safepoint._engine.core import PURE_BATCH

    calls: list[int] = []

    def square(i: int) -> int:
        calls.append(i)
        return i * i

    @sp.workflow("pure-batches")
    def flow(run: sp.Run, count: int) -> int:
        total = sum(run.pure("sq", square, i) for i in range(count))
        return int(run.read("total", lambda t: t, total))

    count = PURE_BATCH + 10
    crash_at(f"step.after_record:sq#{count}")  # the last pure step, before the read
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, count, run_id="r", lease_ms=0)
    crash_at(None)
    written = file_store.load_ledger("r").steps
    assert len(written) == PURE_BATCH  # one batch written, the 10 after it only in memory
    assert file_store.get_run("r").step_count == PURE_BATCH
    calls.clear()
    assert sp.resume(file_store, "r") == sum(i * i for i in range(count))
    assert calls == list(range(PURE_BATCH, count))  # only what the crash lost
    ledger = file_store.load_ledger("r")
    assert len(ledger.steps) == count + 1
    # the pending pure steps went in the commit of the read that followed them
    events = [e.kind for e in file_store.events("r")]
    assert events.count("run.completed") == 1
    assert ledger.steps["total"].seq == count + 1
