"""Slices: a call given ``slice=`` carries the run on for that long, stops at the next step
boundary (never inside an effect's dispatch), releases the run at once and returns
``Unfinished`` — and a run carried over many slices ends as it would in one go, each effect once.

Effects go to the local effect owner over loopback HTTP; what it counts is the truth about how
often each was applied."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import RunNotFound
from safepoint.testing import OwnerService, owner_effect
from safepoint.types import EffectState, RunStatus

LONG_LEASE_MS = 60_000  # a lease nothing waits out: a run not released would be RunOwned
SLICE_S = 0.05


def _rid() -> str:
    return f"slice-{uuid.uuid4().hex[:12]}"


def _add(i: int, total: int) -> int:
    time.sleep(0.002)  # a step that takes a little time, so the slices end mid-run
    return total + i


def _slow(effect: sp.Effect, seconds: float, *, is_async: bool) -> sp.Effect:
    """``effect`` whose dispatch takes ``seconds`` longer than the owner's answer."""
    base = effect.execute
    if is_async:

        async def slow_async(payload: Any, key: sp.EffectKey) -> Any:
            await asyncio.sleep(seconds)
            return await asyncio.to_thread(base, payload, key)

        return replace(effect, execute=slow_async)

    def slow(payload: Any, key: sp.EffectKey) -> Any:
        time.sleep(seconds)
        return base(payload, key)

    return replace(effect, execute=slow)


def _tickets_flow(is_async: bool) -> sp.Workflow:
    """Cheap steps with a ticket after every 60th of them (``slice_flows``)."""
    import slice_flows

    return slice_flows.long_run_async if is_async else slice_flows.long_run


STEPS, EVERY = 240, 60  # 4 tickets


def _carry_over_slices(store: sp.Store, run_id: str, first: Any, slice_s: float) -> tuple[Any, int]:
    """Resume the run slice after slice until it ends: its result and how many slices it took.
    After each slice the run is released: nobody holds it, and the next resume — under a lease
    of a minute — claims it at once instead of meeting RunOwned."""
    outcome, slices = first, 1
    while isinstance(outcome, sp.Unfinished):
        assert outcome.run_id == run_id
        assert outcome.status is RunStatus.RUNNING
        run = store.get_run(run_id)
        assert (run.status, run.owner, run.lease_expires_at) == (RunStatus.RUNNING, None, None)
        assert store.events(run_id)[-1].kind == "run.slice_ended"
        began = time.monotonic()
        outcome = sp.resume(store, run_id, lease_ms=LONG_LEASE_MS, slice=slice_s)
        assert time.monotonic() - began < 5.0  # it claimed at once: no lease to wait out
        slices += 1
        assert slices < 500, "the run makes no progress from slice to slice"
    return outcome, slices


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async-def"])
def test_a_run_carried_over_many_short_slices_ends_as_in_one_go_with_each_effect_once(
    store: sp.Store, owner_env: OwnerService, is_async: bool
) -> None:
    flow = _tickets_flow(is_async)
    whole = sp.start(store, flow, STEPS, EVERY, run_id=_rid())
    reference_applied = owner_env.client.stats()["applied"]
    owner_env.client.reset()

    run_id = _rid()
    first = sp.start(store, flow, STEPS, EVERY, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=SLICE_S)
    assert isinstance(first, sp.Unfinished)  # the run takes several slices
    result, slices = _carry_over_slices(store, run_id, first, SLICE_S)

    assert result == whole
    assert slices >= 3
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (reference_applied, 0) == (4, 0)
    kinds = [e.kind for e in store.events(run_id)]
    assert kinds.count("run.slice_ended") == slices - 1
    assert kinds.count("effect.dispatching") == 4  # each effect dispatched once, not only applied once
    assert store.get_run(run_id).status is RunStatus.COMPLETED


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async-def"])
def test_a_slice_never_ends_inside_a_dispatch(
    store: sp.Store, owner_env: OwnerService, is_async: bool
) -> None:
    effect = _slow(owner_effect("tickets"), 0.4, is_async=is_async)
    if is_async:

        @sp.workflow("slices-slow-effect-async")
        async def flow(run: sp.AsyncRun) -> str:
            await run.pure("before", _add, 1, 0)
            receipt = await run.effect("ticket", effect, payload={"n": 1})
            await run.pure("after", _add, 2, 0)
            return str(receipt["id"])
    else:

        @sp.workflow("slices-slow-effect")
        def flow(run: sp.Run) -> str:  # type: ignore[misc]
            run.pure("before", _add, 1, 0)
            receipt = run.effect("ticket", effect, payload={"n": 1})
            run.pure("after", _add, 2, 0)
            return str(receipt["id"])

    run_id = _rid()
    began = time.monotonic()
    ended = sp.start(store, flow, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=0.15)
    assert isinstance(ended, sp.Unfinished)
    assert time.monotonic() - began >= 0.4  # the dispatch outlived the slice, and was waited for
    ledger = store.load_ledger(run_id)
    (op,) = ledger.operations.values()
    assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 1)  # its protocol went through
    assert "ticket" in ledger.steps
    assert "after" not in ledger.steps  # the slice ended at the boundary after it
    kinds = [(e.kind, e.step_id) for e in store.events(run_id)]
    assert kinds.index(("effect.accepted", "ticket")) < kinds.index(("run.slice_ended", "after"))
    assert ledger.run.owner is None
    assert sp.resume(store, run_id, lease_ms=LONG_LEASE_MS) == "tk_1"
    assert owner_env.client.stats()["applied"] == 1


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async-def"])
def test_a_fan_out_stops_at_each_branchs_next_step_then_releases(
    store: sp.Store, owner_env: OwnerService, is_async: bool
) -> None:
    effect = _slow(owner_effect("tickets"), 0.3, is_async=is_async)
    steps = 150
    if is_async:

        async def slow_async(branch: sp.AsyncRun) -> str:
            receipt = await branch.effect("ticket", effect, payload={"branch": "slow"})
            await branch.pure("after", _add, 1, 0)
            return str(receipt["id"])

        async def add_async(i: int, total: int) -> int:
            await asyncio.sleep(0.002)  # lets the other branch's dispatch go on meanwhile
            return total + i

        async def quick_async(branch: sp.AsyncRun) -> int:
            total = 0
            for i in range(steps):
                total = await branch.pure(f"add.{i}", add_async, i, total)
            return total

        @sp.workflow("slices-fan-out-async")
        async def flow(run: sp.AsyncRun) -> dict[str, Any]:
            return await run.gather("fan", {"slow": slow_async, "quick": quick_async})
    else:

        def slow(branch: sp.Run) -> str:
            receipt = branch.effect("ticket", effect, payload={"branch": "slow"})
            branch.pure("after", _add, 1, 0)
            return str(receipt["id"])

        def quick(branch: sp.Run) -> int:
            total = 0
            for i in range(steps):
                total = branch.pure(f"add.{i}", _add, i, total)
            return total

        @sp.workflow("slices-fan-out")
        def flow(run: sp.Run) -> dict[str, Any]:  # type: ignore[misc]
            return run.parallel("fan", {"slow": slow, "quick": quick})

    run_id = _rid()
    first = sp.start(store, flow, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=0.1)
    assert isinstance(first, sp.Unfinished)
    ledger = store.load_ledger(run_id)
    (op,) = ledger.operations.values()
    assert op.state is EffectState.ACCEPTED  # the branch in its dispatch finished it first
    assert "fan.slow/after" not in ledger.steps  # ... and stopped at its next step
    quick_steps = [sid for sid in ledger.steps if sid.startswith("fan.quick/")]
    assert len(quick_steps) < steps  # the other branch stopped at its own next step
    events = [(e.kind, e.step_id) for e in store.events(run_id)]
    assert events.index(("effect.accepted", "fan.slow/ticket")) < [k for k, _ in events].index(
        "run.slice_ended"
    )  # released only once every branch had stopped
    result, _ = _carry_over_slices(store, run_id, first, 0.1)
    assert result == {"slow": "tk_1", "quick": sum(range(steps))}
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)


def test_agent_code_that_swallows_the_end_of_the_slice_cannot_carry_on(store: sp.Store) -> None:
    @sp.workflow("slices-swallowed")
    def flow(run: sp.Run) -> int:
        total = 0
        for i in range(100):
            try:
                total = run.pure(f"add.{i}", _add, i, total)
            except BaseException:  # agent code that catches everything
                total = -1
        return total

    run_id = _rid()
    first = sp.start(store, flow, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=0.02)
    assert isinstance(first, sp.Unfinished)  # not the -1 the code tried to return
    assert store.get_run(run_id).status is RunStatus.RUNNING
    result, _ = _carry_over_slices(store, run_id, first, 0.02)
    assert result == sum(range(100))


def test_a_back_off_longer_than_what_is_left_of_the_slice_ends_the_slice_at_once(store: sp.Store) -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise TimeoutError("the service is slow to start")
        return "up"

    @sp.workflow("slices-back-off")
    def flow(run: sp.Run) -> str:
        run.pure("before", _add, 1, 0)
        return str(run.read("status", flaky, retry=sp.Retry(attempts=2, backoff=0.6)))

    run_id = _rid()
    began = time.monotonic()
    outcome: Any = sp.start(store, flow, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=0.2)
    while isinstance(outcome, sp.Unfinished):
        assert store.get_run(run_id).owner is None
        call_began = time.monotonic()
        outcome = sp.resume(store, run_id, lease_ms=LONG_LEASE_MS, slice=0.2)
        assert time.monotonic() - call_began < 0.45  # no call waits past its slice (and a step)
        time.sleep(0.05)
    assert outcome == "up"
    assert len(calls) == 2
    assert calls[1] - calls[0] >= 0.55  # the back-off was kept, across the slices
    assert time.monotonic() - began >= 0.55
    assert next(e.step_id for e in store.events(run_id) if e.kind == "run.slice_ended") == "status"


def test_a_run_continued_as_new_is_carried_on_in_slices_through_its_successor(store: sp.Store) -> None:
    @sp.workflow("slices-chain")
    def flow(run: sp.Run, part: int, total: int) -> int:
        for i in range(40):
            total = run.pure(f"add.{i}", _add, i, total)
        if part < 3:
            run.continue_as_new(part + 1, total)
        return total

    run_id = _rid()
    outcome: Any = sp.start(store, flow, 1, 0, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=SLICE_S)
    stopped = set()
    while isinstance(outcome, sp.Unfinished):
        stopped.add(outcome.run_id)
        assert store.get_run(outcome.run_id).owner is None
        outcome = sp.resume(store, run_id, lease_ms=LONG_LEASE_MS, slice=SLICE_S)  # the chain's first id
    assert outcome == 3 * sum(range(40))
    assert len(stopped) >= 2  # the slices ended in more than one run of the chain


def test_a_worker_given_a_slice_stops_claiming_and_releases_the_run_it_carried(store: sp.Store) -> None:
    @sp.workflow("slices-worker")
    def flow(run: sp.Run) -> int:
        total = 0
        for i in range(150):
            total = run.pure(f"add.{i}", _add, i, total)
        return total

    first, second = sp.submit(store, flow, run_id=_rid()), sp.submit(store, flow, run_id=_rid())
    worker = sp.Worker(store, workflows=["slices-worker"], lease_ms=LONG_LEASE_MS)
    began = time.monotonic()
    stats = worker.run(handle_signals=False, slice=timedelta(seconds=0.1))
    assert time.monotonic() - began < 2.0  # it returned once the slice was spent
    assert (stats.claimed, stats.unfinished, stats.completed) == (1, 1, 0)
    # Either run may be the one claimed (both were submitted in the same instant): the one it
    # carried was released — no owner, no lease — and the other never claimed.
    ended = [rid for rid in (first, second) if store.events(rid)[-1].kind == "run.slice_ended"]
    assert len(ended) == 1
    carried = store.get_run(ended[0])
    assert (carried.status, carried.owner, carried.lease_expires_at) == (RunStatus.RUNNING, None, None)
    other = second if ended[0] == first else first
    assert store.get_run(other).status is RunStatus.PENDING  # never claimed after the slice
    # The next worker takes both at once: nothing to wait out.
    done = sp.Worker(store, workflows=["slices-worker"]).run(until_idle=True, handle_signals=False)
    assert (done.completed, done.unfinished) == (2, 0)
    assert sp.resume(store, first) == sp.resume(store, second) == sum(range(150))


def test_an_idle_worker_given_a_slice_returns_when_it_is_spent(store: sp.Store) -> None:
    @sp.workflow("slices-idle")
    def flow(run: sp.Run) -> int:
        return 1

    began = time.monotonic()
    stats = sp.Worker(store, workflows=["slices-idle"], rescan=5.0).run(handle_signals=False, slice=0.2)
    assert 0.2 <= time.monotonic() - began < 2.0  # not the 5 s rescan
    assert (stats.claimed, stats.unfinished) == (0, 0)


@pytest.mark.parametrize("given", [0, -1, timedelta(0), float("nan"), float("inf"), "25s", True])
def test_a_slice_that_is_not_a_positive_length_of_time_is_refused_before_anything_is_written(
    store: sp.Store, given: Any
) -> None:
    @sp.workflow("slices-refused")
    def flow(run: sp.Run) -> int:
        return 1

    run_id = _rid()
    with pytest.raises(sp.UsageError, match="slice="):
        sp.start(store, flow, run_id=run_id, slice=given)
    with pytest.raises(sp.UsageError, match="slice="):
        sp.resume(store, run_id, slice=given)
    with pytest.raises(sp.UsageError, match="slice="):
        sp.Worker(store, workflows=["slices-refused"]).run(handle_signals=False, slice=given)
    with pytest.raises(RunNotFound):
        store.get_run(run_id)  # nothing was started


def test_the_async_store_carries_a_run_on_in_slices(pg_url: str, owner_env: OwnerService) -> None:
    flow = _tickets_flow(is_async=True)

    async def main() -> tuple[Any, int, list[str]]:
        store = await sp.open_async_store(f"{pg_url}?schema=s_{uuid.uuid4().hex[:12]}")
        try:
            run_id = _rid()
            outcome = await sp.start_async(
                store, flow, STEPS, EVERY, run_id=run_id, lease_ms=LONG_LEASE_MS, slice=SLICE_S
            )
            slices = 1
            while isinstance(outcome, sp.Unfinished):
                run = await store.get_run(run_id)
                assert (run.owner, run.lease_expires_at) == (None, None)
                outcome = await sp.resume_async(store, run_id, lease_ms=LONG_LEASE_MS, slice=SLICE_S)
                slices += 1
            return outcome, slices, [e.kind for e in await store.events(run_id)]
        finally:
            await store.close()

    result, slices, kinds = asyncio.run(main())
    assert result == {"total": sum(range(STEPS)), "tickets": ["tk_1", "tk_2", "tk_3", "tk_4"]}
    assert slices >= 3
    assert kinds.count("run.slice_ended") == slices - 1
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (4, 0)
