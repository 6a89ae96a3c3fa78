"""Fan-out: ``Run.parallel`` and ``AsyncRun.gather``.

Branches run at once with step ids of their own; after a crash only the unfinished branches do
anything, and a partial batch of effects is recovered operation by operation — here in real
processes killed with SIGKILL, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.testing import KillHarness, OwnerService, SimulatedCrash
from safepoint.types import RunStatus, StepStatus

TESTS = str(Path(__file__).parents[1])


def test_branches_run_at_once_with_step_ids_of_their_own(file_store: sp.Store) -> None:
    meeting = threading.Barrier(3, timeout=5)  # passes only if all three branches run at once

    def branch(name: str) -> Any:
        def body(b: sp.Run) -> str:
            b.read("arrive", meeting.wait)
            first = b.pure("step", lambda: f"{name}-1")
            second = b.pure("step", lambda: f"{name}-2")  # its own occurrence counter
            return f"{first}+{second}"

        return body

    @sp.workflow("fan-ids")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {name: branch(name) for name in ("a", "b", "c")})

    assert sp.start(file_store, flow, run_id="r") == {"a": "a-1+a-2", "b": "b-1+b-2", "c": "c-1+c-2"}
    steps = file_store.load_ledger("r").steps
    assert {"fan.a/arrive", "fan.a/step", "fan.a/step#2", "fan.c/step#2"} <= set(steps)
    assert len(steps) == 9
    assert len({step.seq for step in steps.values()}) == 9  # no two steps share a place


def test_a_list_of_branches_returns_a_list_and_a_second_fan_out_gets_its_own_ids(
    memory_store: sp.Store,
) -> None:
    @sp.workflow("fan-list")
    def flow(run: sp.Run) -> Any:
        first = run.parallel("fan", [lambda b, i=i: b.pure("sq", lambda: i * i) for i in range(3)])
        second = run.parallel("fan", [lambda b: b.pure("sq", lambda: 7)])
        return [first, second]

    assert sp.start(memory_store, flow, run_id="r") == [[0, 1, 4], [7]]
    assert {"fan.0/sq", "fan.2/sq", "fan#2.0/sq"} <= set(memory_store.load_ledger("r").steps)


def test_after_a_crash_only_the_unfinished_branches_call_anything(
    file_store: sp.Store, crash_at: Any
) -> None:
    calls: Counter[str] = Counter()

    def branch(name: str) -> Any:
        def body(b: sp.Run) -> str:
            first = b.read("first", lambda: calls.update([f"{name}.first"]) or name)
            return str(b.read("second", lambda: calls.update([f"{name}.second"]) or first))

        return body

    @sp.workflow("fan-crash")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {name: branch(name) for name in ("a", "b", "c")})

    crash_at("step.after_record:fan.b/first")  # the process dies while b is half done
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert calls == {"a.first": 1, "a.second": 1, "b.first": 1, "c.first": 1, "c.second": 1}
    assert sp.resume(file_store, "r") == {"a": "a", "b": "b", "c": "c"}
    # a and c replayed; b replayed its first step and went on with its second
    assert calls == {"a.first": 1, "a.second": 1, "b.first": 1, "b.second": 1, "c.first": 1, "c.second": 1}


def test_the_first_error_in_branch_order_is_raised_after_every_branch_stopped(memory_store: sp.Store) -> None:
    finished: list[str] = []

    def fail(message: str) -> Any:
        def body(b: sp.Run) -> Any:
            return b.read("fail", _raise, message)

        return body

    def slow(b: sp.Run) -> Any:
        threading.Event().wait(0.2)
        finished.append(b.pure("done", lambda: "slow"))
        return "slow"

    @sp.workflow("fan-errors")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {"x": slow, "y": fail("first"), "z": fail("second")})

    with pytest.raises(sp.StepFailed, match="first") as failed:
        sp.start(memory_store, flow, run_id="r")
    assert failed.value.step_id == "fan.y/fail"
    assert memory_store.get_run("r").status is RunStatus.FAILED
    assert finished == ["slow"]  # the slow branch was not abandoned half way
    assert memory_store.load_ledger("r").steps["fan.z/fail"].status is StepStatus.FAILED


def _raise(message: str) -> Any:
    raise ValueError(message)


@pytest.mark.parametrize(
    "branches", [{"a/b": lambda b: 1}, {"": lambda b: 1}, {"a#2": lambda b: 1}, {"a": 1}, "ab", 5]
)
def test_branches_that_would_make_ambiguous_ids_are_refused(memory_store: sp.Store, branches: Any) -> None:
    @sp.workflow("fan-bad")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", branches)

    with pytest.raises(sp.UsageError):
        sp.start(memory_store, flow, run_id=f"r-{uuid.uuid4().hex[:6]}")


def test_async_gather_runs_branches_together_and_replays_them(file_store: sp.Store, crash_at: Any) -> None:
    calls: Counter[str] = Counter()

    def branch(name: str, partner: str) -> Any:
        async def body(b: sp.AsyncRun) -> str:
            events[name].set()
            await asyncio.wait_for(events[partner].wait(), 5)  # both must be running at once

            async def fetch() -> str:
                calls.update([name])
                return name.upper()

            return str(await b.read("fetch", fetch))

        return body

    events: dict[str, asyncio.Event] = {}

    @sp.workflow("gather")
    async def flow(run: sp.AsyncRun) -> Any:
        events.update(a=asyncio.Event(), b=asyncio.Event())
        return await run.gather("fan", {"a": branch("a", "b"), "b": branch("b", "a")})

    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    assert sp.resume(file_store, "r") == {"a": "A", "b": "B"}
    assert calls == {"a": 1, "b": 1}


@pytest.fixture(scope="module")
def kill_owner() -> Any:
    with OwnerService() as service:
        yield service


@pytest.mark.kill
@pytest.mark.parametrize("workflow", ["flows:fan_out", "flows:fan_out_async"])
@pytest.mark.parametrize(
    "crash_at",
    ["effect.after_dispatching:fan.us/", "effect.after_receiver_commit:fan.ap/", "step.after_record:fan.eu/"],
)
def test_a_partial_batch_of_effects_is_recovered_operation_by_operation(
    kill_owner: OwnerService, tmp_path: Path, workflow: str, crash_at: str
) -> None:
    """SIGKILL inside one branch while the others are anywhere: the resumed run books each
    region exactly once."""
    harness = KillHarness(workflow, ["order-7"], owner=kill_owner, workdir=tmp_path, pythonpath=[TESTS])
    report = harness.trial(crash_at=crash_at)
    assert report.killed
    report.check()
    assert report.applied == 3


@pytest.mark.kill
def test_a_partial_batch_on_postgres_is_recovered_operation_by_operation(
    kill_owner: OwnerService, tmp_path: Path, pg_url: str
) -> None:
    harness = KillHarness(
        "flows:fan_out",
        ["order-7"],
        owner=kill_owner,
        workdir=tmp_path,
        pythonpath=[TESTS],
        store_url=f"{pg_url}?schema=fan_{uuid.uuid4().hex[:12]}",
    )
    for spec in ("effect.after_dispatching:fan.us/", "effect.after_receiver_commit:fan.eu/"):
        report = harness.trial(crash_at=spec)
        assert report.killed
        report.check()
