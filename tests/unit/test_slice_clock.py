"""The slice clock: what ``slice=`` accepts, when a slice ends, and the promise that every call
moves its run at least one new step on."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint._engine.slices import SliceClock, slice_seconds
from safepoint.errors import SliceEnded
from safepoint.types import RunStatus


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(timedelta(seconds=25), 25.0), (25, 25.0), (0.5, 0.5), (timedelta(milliseconds=1), 0.001), (None, None)],
)
def test_a_slice_is_a_timedelta_or_seconds(given: Any, seconds: float | None) -> None:
    assert slice_seconds(given) == seconds


@pytest.mark.parametrize(
    "given", [0, -1, 0.0, timedelta(0), timedelta(seconds=-3), float("nan"), float("inf"), True, "25s", [25]]
)
def test_anything_but_a_positive_finite_length_of_time_is_refused(given: Any) -> None:
    with pytest.raises(sp.UsageError, match=r"slice="):
        slice_seconds(given)


def test_a_slice_ends_before_a_step_once_spent_but_never_before_the_first_new_step() -> None:
    clock = FakeClock()
    cut = SliceClock(1.0, clock=clock)
    clock.now += 5.0  # spent before any new step began (a long replay, say)
    assert not cut.ends_before_step()  # the first new step still starts: the run moves on
    assert cut.ends_before_step()  # ... and the slice ends before the next


def test_a_slice_lets_steps_start_until_it_is_spent() -> None:
    clock = FakeClock()
    cut = SliceClock(1.0, clock=clock)
    assert not cut.ends_before_step()
    clock.now += 0.999
    assert not cut.ends_before_step()
    assert cut.remaining() == pytest.approx(0.001)
    clock.now += 0.001
    assert cut.spent()
    assert cut.ends_before_step()
    assert cut.remaining() == 0.0


def test_each_run_of_a_workers_slice_keeps_the_slice_start_and_gets_its_own_first_step() -> None:
    clock = FakeClock()
    worker_slice = SliceClock(1.0, clock=clock)
    first = worker_slice.for_run()
    assert not first.ends_before_step()
    clock.now += 2.0
    assert first.ends_before_step()
    second = worker_slice.for_run()  # claimed just as the slice ran out
    assert second.spent()
    assert not second.ends_before_step()  # it still moves one step on
    assert second.ends_before_step()


def test_a_wait_that_outlasts_the_slice_ends_it_only_after_a_new_step_began() -> None:
    clock = FakeClock()
    cut = SliceClock(1.0, clock=clock)
    assert not cut.outlasts(5.0)  # nothing began yet: the call moves on, whatever the wait
    cut.ends_before_step()
    assert not cut.outlasts(0.5)
    assert cut.outlasts(1.0)


def test_the_signal_says_where_and_after_how_long() -> None:
    clock = FakeClock()
    cut = SliceClock(25.0, clock=clock)
    clock.now += 25.5
    signal = cut.ended("r-1", "fetch.3")
    assert not isinstance(signal, Exception)  # a BaseException: agent code cannot swallow it
    assert (signal.run_id, signal.step_id, signal.slice_s, signal.elapsed_s) == ("r-1", "fetch.3", 25.0, 25.5)
    assert "before step 'fetch.3'" in str(signal)


def test_unfinished_is_truthy_and_frozen() -> None:
    unfinished = sp.Unfinished(run_id="r", status=RunStatus.RUNNING, reason="its slice was spent")
    assert unfinished  # a workflow's own result may be falsy: test by type, not by truth
    with pytest.raises(AttributeError):
        unfinished.run_id = "other"  # type: ignore[misc]


def test_a_slice_too_short_for_any_step_still_moves_the_run_one_step_per_call(memory_store: sp.Store) -> None:
    @sp.workflow("slices-unit-one-step")
    def flow(run: sp.Run) -> int:
        total = 0
        for i in range(10):
            total = run.pure(f"add.{i}", lambda i, t: (time.sleep(0.002), t + i)[1], i, total)
        return total

    outcome: Any = sp.start(memory_store, flow, run_id="r", slice=0.001)
    calls = 1
    while isinstance(outcome, sp.Unfinished):
        assert len(memory_store.load_ledger("r").steps) == calls  # one new step per call
        outcome = sp.resume(memory_store, "r", slice=timedelta(milliseconds=1))
        calls += 1
    assert (outcome, calls) == (sum(range(10)), 10)


def test_the_slice_signal_never_reaches_the_caller(memory_store: sp.Store) -> None:
    @sp.workflow("slices-unit-signal")
    def flow(run: sp.Run) -> int:
        run.pure("one", lambda: time.sleep(0.01))
        run.pure("two", lambda: 2)
        return 3

    try:
        outcome = sp.start(memory_store, flow, run_id="r", slice=0.001)
    except SliceEnded:  # pragma: no cover - the failure this test is for
        pytest.fail("SliceEnded reached the caller")
    assert isinstance(outcome, sp.Unfinished)
    assert outcome.run_id == "r"
    assert "before step 'two'" in outcome.reason
