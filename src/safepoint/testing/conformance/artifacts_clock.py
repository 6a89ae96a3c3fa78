"""Store conformance: artifacts, clock, wake-ups, history."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from ..._rules.canonical import digest
from ...errors import ArtifactMissing
from ...types import EffectState, RunStatus
from ._concerns import ACROSS_RUNS, CONCURRENCY, CONTROL, VALUES, exercises
from ._support import SHORT_LEASE_MS, ConformanceBase, _uid, make_operation, make_step


class ArtifactClockTests(ConformanceBase):
    """The conformance tests of artifacts, clock, wake-ups, history."""

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_unknown_artifact_is_missing(self) -> None:
        store = self.store()
        unknown = digest(f"never stored {uuid.uuid4()}".encode())
        with pytest.raises(ArtifactMissing) as error:
            store.get_artifact(unknown)
        assert error.value.digest == unknown

    @exercises(CONTROL)
    def test_now_is_epoch_milliseconds_and_does_not_go_back(self) -> None:
        store, other = self.store(), self.store()
        first = store.now()
        assert isinstance(first, int)
        assert abs(first - time.time() * 1000) < 60_000
        readings = [store.now() for _ in range(50)]
        assert readings == sorted(readings)
        assert readings[0] >= first
        time.sleep(0.02)
        assert store.now() >= first + 15
        assert abs(other.now() - store.now()) < 1_000
        assert store.schema_version() >= 1

    @exercises(CONCURRENCY, ACROSS_RUNS)
    def test_wait_for_work_wakes_when_another_store_submits_a_run(self) -> None:
        waiter, submitter = self.store(), self.store()
        woke: list[float] = []

        def wait() -> None:
            waiter.wait_for_work(0.01)  # start listening; settle anything queued before
            started = time.monotonic()
            waiter.wait_for_work(5.0)
            woke.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        self.submit(submitter)
        thread.join(timeout=10)
        assert woke, "wait_for_work did not return"
        assert woke[0] < 2.0, f"woke after {woke[0]:.2f}s, not on the new run"

    @exercises(CONCURRENCY, ACROSS_RUNS)
    def test_wait_for_work_waits_out_its_timeout_when_nothing_happens(self) -> None:
        store = self.store()
        store.wait_for_work(0.05)  # settle anything queued before this test
        started = time.monotonic()
        store.wait_for_work(0.3)
        elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 1.5

    @exercises(CONCURRENCY, ACROSS_RUNS)
    def test_wait_for_work_returns_once_told_to_stop(self) -> None:
        """A worker told to stop (SIGTERM, ``Worker.stop``) leaves its wait at once, not at the
        end of its rescan interval."""
        store, stop = self.store(), threading.Event()
        store.wait_for_work(0.05)  # settle anything queued before this test
        threading.Timer(0.2, stop.set).start()
        started = time.monotonic()
        store.wait_for_work(30.0, stop)
        assert time.monotonic() - started < 5.0, "the wait ran on after stop was set"
        started = time.monotonic()
        store.wait_for_work(30.0, stop)  # set before the wait: returns at once
        assert time.monotonic() - started < 2.0

    def test_events_are_append_only_ordered_and_counted(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(old, op, payload)
        early = store.events(run.run_id)
        claim = self.take_over(store, run.run_id)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        store.finish_run(claim, RunStatus.COMPLETED, result=None)
        events = store.events(run.run_id)
        assert events[: len(early)] == early
        assert [e.kind for e in events] == [
            "run.started",
            "effect.prepared",
            "run.claimed",
            "effect.dispatching",
            "effect.accepted",
            "run.completed",
        ]
        assert {e.run_id for e in events} == {run.run_id}
        ids = [e.event_id for e in events]
        assert ids == sorted(set(ids))
        times = [e.at for e in events]
        assert times == sorted(times)
        assert store.get_run(run.run_id).event_count == len(events)
