"""Store conformance: waits — messages sent to a run (``send_message``, ``messages``) and the
gates of wait and sleep steps (``await_message``, ``await_timer``), waiting runs falling due.

A test that leaves a run waiting with a due time ends it (``_end``): the suite may share its
database, and a due time to come shortens every other test's ``wait_for_work``."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable

import pytest

from ..._rules.canonical import input_hash
from ...errors import (
    Cancelled,
    LostOwnership,
    MessageRefused,
    NotJSON,
    RunNotFound,
    SecretRefused,
)
from ...storage.base import Store
from ...types import Claim, RunStatus, StepKind, StepRecord, StepStatus, WaitGate
from ._concerns import ACROSS_RUNS, CLAIMS, CONCURRENCY, VALUES, exercises
from ._support import LARGE, LONG_LEASE_MS, ConformanceBase, _uid, in_threads, make_step, stamped_between

# A wait's timeout, or a sleep, that a test resumes before it falls due: long enough for the
# steps before that to finish on a loaded machine (300 ms did not, with the suite's three test
# processes on two cores: the run was due by the resume, and rightly not put to wait again).
DUE_IN_MS = 1500


class WaitHelpers(ConformanceBase):
    """What the tests of waits and of answers share: wait and sleep steps, a released run
    claimed by name, a run ended, its history counted."""

    @staticmethod
    def _wait_step(
        run_id: str, step_id: str = "wait.answer", seq: int = 1, name: str = "answer"
    ) -> StepRecord:
        return StepRecord(
            run_id=run_id,
            step_id=step_id,
            kind=StepKind.WAIT,
            name=f"message:{name}",
            input_hash=input_hash({"message": name}),
            result=None,
            seq=seq,
        )

    @staticmethod
    def _sleep_step(run_id: str, step_id: str = "sleep", seq: int = 1) -> StepRecord:
        return StepRecord(
            run_id=run_id,
            step_id=step_id,
            kind=StepKind.WAIT,
            name="sleep",
            input_hash="h-sleep",
            result=None,
            seq=seq,
        )

    def _resumed(self, store: Store, run_id: str, owner: str = "worker-b") -> Claim:
        """Claim a released (waiting or pending) run by name, as a resume does."""
        claim = store.claim_run(run_id, store.get_run(run_id).state_revision, owner, LONG_LEASE_MS)
        assert claim is not None
        return claim

    def _end(self, store: Store, run_id: str) -> None:
        store.request_cancel(run_id, "conformance", "the test is over")

    def _taken_or_woke(self, store: Store, run_id: str, trial: int) -> None:
        """After a message raced the gate of wait ``wait.answer``: the wait took it (the run
        goes on) or the message found the run waiting and made it pending — never a run
        waiting with its message kept beside it."""
        now = store.get_run(run_id)
        [message] = store.messages(run_id)
        if message.taken_by is None:
            assert now.status is RunStatus.PENDING, (trial, now.status)
        else:
            assert (now.status, message.taken_by) == (RunStatus.RUNNING, "wait.answer")

    def _counted(self, store: Store, run_id: str) -> None:
        ledger = store.load_ledger(run_id)
        assert ledger.run.event_count == len(store.events(run_id))
        assert ledger.run.step_count == len(ledger.steps)


class WaitTests(WaitHelpers):
    """The conformance tests of waits."""

    # -- messages -------------------------------------------------------------------------------

    def test_a_message_sent_before_the_wait_is_taken_by_it(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        t0 = store.now()
        sent = store.send_message(run.run_id, "answer", {"approved": True}, message_id="m-1", by="ana")
        t1 = store.now()
        assert (sent.run_id, sent.name, sent.payload, sent.message_id, sent.sent_by) == (
            run.run_id,
            "answer",
            {"approved": True},
            "m-1",
            "ana",
        )
        assert (sent.taken_by, sent.taken_at) == (None, None)
        assert stamped_between(t0, sent.sent_at, t1)
        assert store.get_run(run.run_id).status is RunStatus.RUNNING  # a running run stays so
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        assert isinstance(gate, WaitGate)
        assert gate.waiting_for is None
        assert gate.step is not None
        assert (gate.step.status, gate.step.result, gate.step.kind) == (
            StepStatus.COMPLETED,
            {"approved": True},
            StepKind.WAIT,
        )
        assert gate.message is not None
        assert gate.message.seq == sent.seq
        recorded = store.load_ledger(run.run_id).steps["wait.answer"]
        assert (recorded.result, recorded.status, recorded.fence) == (
            {"approved": True},
            StepStatus.COMPLETED,
            1,
        )
        [kept] = store.messages(run.run_id)
        assert (kept.seq, kept.taken_by) == (sent.seq, "wait.answer")
        assert kept.taken_at is not None
        kinds = [e.kind for e in store.events(run.run_id)]
        assert kinds[-2:] == ["message.sent", "message.received"]
        self._counted(store, run.run_id)

    @exercises(VALUES, CLAIMS)
    def test_a_wait_with_no_message_makes_the_run_wait_released(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        assert gate.step is None
        assert gate.waiting_for is not None
        assert {k: gate.waiting_for[k] for k in ("kind", "name", "step_id", "timeout_at")} == {
            "kind": "message",
            "name": "answer",
            "step_id": "wait.answer",
            "timeout_at": None,
        }
        waiting = store.get_run(run.run_id)
        assert (waiting.status, waiting.owner, waiting.lease_expires_at, waiting.wake_at) == (
            RunStatus.WAITING,
            None,
            None,
            None,
        )
        assert waiting.waiting_for == gate.waiting_for
        assert "wait.answer" not in store.load_ledger(run.run_id).steps
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.step_id, event.fence) == ("run.waiting", "wait.answer", claim.fence)
        with pytest.raises(LostOwnership):  # the worker let the run go
            store.record_step(claim, make_step(run.run_id, "after", 2))
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None  # never due
        self._counted(store, run.run_id)

    @exercises(VALUES, CLAIMS)
    def test_a_message_to_a_run_waiting_for_it_makes_the_run_pending(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        sent = store.send_message(run.run_id, "answer", "yes")
        released = store.get_run(run.run_id)
        assert (released.status, released.waiting_for, released.wake_at) == (RunStatus.PENDING, None, None)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.detail["seq"], event.detail["woke"]) == ("message.sent", sent.seq, True)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        gate = store.await_message(taken, self._wait_step(run.run_id), "answer", None)
        assert gate.step is not None
        assert gate.step.result == "yes"
        assert gate.step.fence == taken.fence
        self._counted(store, run.run_id)

    def test_a_message_of_another_name_is_kept_and_wakes_nothing(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        other = store.send_message(run.run_id, "other", 1)
        still = store.get_run(run.run_id)
        assert (still.status, still.waiting_for is not None) == (RunStatus.WAITING, True)
        assert store.events(run.run_id)[-1].detail["woke"] is False
        assert store.messages(run.run_id) == [other]

    def test_messages_queue_oldest_first_each_wait_takes_its_own(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        first = store.send_message(run.run_id, "vote", "first")
        second = store.send_message(run.run_id, "vote", "second")
        assert second.seq > first.seq
        one = store.await_message(claim, self._wait_step(run.run_id, "vote", 1, "vote"), "vote", None)
        two = store.await_message(claim, self._wait_step(run.run_id, "vote#2", 2, "vote"), "vote", None)
        assert (one.step and one.step.result, two.step and two.step.result) == ("first", "second")
        three = store.await_message(claim, self._wait_step(run.run_id, "vote#3", 3, "vote"), "vote", None)
        assert three.waiting_for is not None  # both are taken: the third waits
        assert [(m.payload, m.taken_by) for m in store.messages(run.run_id)] == [
            ("first", "vote"),
            ("second", "vote#2"),
        ]

    def test_a_message_id_is_kept_once_per_run(self) -> None:
        store = self.store()
        run, _ = self.start(store)
        sent = store.send_message(run.run_id, "hook", {"delivery": 7}, message_id="d-7")
        events = len(store.events(run.run_id))
        again = store.send_message(run.run_id, "hook", {"delivery": 7}, message_id="d-7")
        assert again == sent
        assert store.messages(run.run_id) == [sent]
        assert len(store.events(run.run_id)) == events  # nothing added
        with pytest.raises(MessageRefused) as refused:
            store.send_message(run.run_id, "hook", {"delivery": 8}, message_id="d-7")
        assert "d-7" in refused.value.reason
        with pytest.raises(MessageRefused):
            store.send_message(run.run_id, "other", {"delivery": 7}, message_id="d-7")
        assert store.messages(run.run_id) == [sent]
        # another run may use the same id: ids are kept per run
        other, _ = self.start(store)
        assert (
            store.send_message(other.run_id, "hook", {"delivery": 7}, message_id="d-7").run_id == other.run_id
        )
        self._counted(store, run.run_id)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_large_payload_is_kept_whole_and_received_whole(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        payload = {"body": LARGE}
        assert store.send_message(run.run_id, "answer", payload).payload == payload
        assert store.messages(run.run_id)[0].payload == payload
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        assert gate.step is not None
        assert gate.step.result == payload
        assert store.load_ledger(run.run_id).steps["wait.answer"].result == payload

    def test_a_message_is_refused_for_an_ended_run_or_none_and_for_what_it_holds(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        with pytest.raises(SecretRefused):
            store.send_message(run.run_id, "answer", {"token": "sk_live_" + "a1B2c3D4e5F6g7H8i9J0k1L2"})
        with pytest.raises(NotJSON):
            store.send_message(run.run_id, "answer", {"when": object()})  # type: ignore[dict-item]
        assert store.messages(run.run_id) == []
        with pytest.raises(RunNotFound):
            store.send_message(f"no-such-run-{_uid()}", "answer", 1)
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        with pytest.raises(MessageRefused) as refused:
            store.send_message(run.run_id, "answer", 1)
        assert "completed" in refused.value.reason
        assert store.messages(run.run_id) == []

    def test_a_waiting_run_cancelled_takes_no_message(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        assert store.request_cancel(run.run_id, "ana").status is RunStatus.CANCELLED
        with pytest.raises(MessageRefused):
            store.send_message(run.run_id, "answer", 1)

    # -- the gate, fenced -------------------------------------------------------------------------

    def test_the_gates_are_fenced_and_refused_once_a_cancel_is_asked_for(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        stale = self._resumed_after_release(store, run.run_id, claim)
        with pytest.raises(LostOwnership):
            store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        with pytest.raises(LostOwnership):
            store.await_timer(claim, self._sleep_step(run.run_id), 1_000)
        store.request_cancel(run.run_id, "ana")
        with pytest.raises(Cancelled):
            store.await_message(stale, self._wait_step(run.run_id), "answer", None)
        with pytest.raises(Cancelled):
            store.await_timer(stale, self._sleep_step(run.run_id), 1_000)
        assert store.load_ledger(run.run_id).steps == {}

    def _resumed_after_release(self, store: Store, run_id: str, claim: Claim) -> Claim:
        store.release_run(claim)
        return self._resumed(store, run_id)

    # -- timeouts ---------------------------------------------------------------------------------

    @exercises(VALUES, CLAIMS)
    def test_a_wait_times_out_at_the_instant_recorded_when_it_first_waited(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        t0 = store.now()
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", DUE_IN_MS)
        t1 = store.now()
        assert gate.waiting_for is not None
        timeout_at = gate.waiting_for["timeout_at"]
        assert stamped_between(t0 + DUE_IN_MS, timeout_at, t1 + DUE_IN_MS)
        waiting = store.get_run(run.run_id)
        assert (waiting.status, waiting.wake_at) == (RunStatus.WAITING, timeout_at)
        [attempt] = store.load_ledger(run.run_id).attempts["wait.answer"]
        assert (attempt.kind, attempt.retry_at) == (StepKind.WAIT, timeout_at)
        # a resume before it is due waits again, for the rest: the instant does not move, even
        # when the code now asks for a longer timeout
        again = store.await_message(
            self._resumed(store, run.run_id), self._wait_step(run.run_id), "answer", 60_000
        )
        assert again.waiting_for is not None
        assert again.waiting_for["timeout_at"] == timeout_at
        assert store.get_run(run.run_id).wake_at == timeout_at
        assert store.claim_next("worker-c", LONG_LEASE_MS, [self.workflow]) is None  # not yet due
        time.sleep(max(0.0, (timeout_at - store.now()) / 1000) + 0.05)
        due = store.claim_next("worker-c", LONG_LEASE_MS, [self.workflow])
        assert due is not None
        assert due.run_id == run.run_id
        taken = store.get_run(run.run_id)
        assert (taken.status, taken.waiting_for, taken.wake_at) == (RunStatus.RUNNING, None, None)
        ended = store.await_message(due, self._wait_step(run.run_id), "answer", 60_000)
        assert ended.waiting_for is None
        assert ended.step is not None
        assert (ended.step.status, ended.step.error and ended.step.error["timeout_at"]) == (
            StepStatus.FAILED,
            timeout_at,
        )
        assert ended.step.error is not None
        assert ended.step.error["type"] == "WaitTimedOut"
        recorded = store.load_ledger(run.run_id).steps["wait.answer"]
        assert (recorded.status, recorded.error) == (StepStatus.FAILED, ended.step.error)
        assert store.events(run.run_id)[-1].kind == "wait.timed_out"
        self._counted(store, run.run_id)

    def test_a_message_sent_after_the_timeout_is_kept_for_the_next_wait(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", 100)
        assert gate.waiting_for is not None
        time.sleep(max(0.0, (gate.waiting_for["timeout_at"] - store.now()) / 1000) + 0.05)
        late = store.send_message(run.run_id, "answer", "late")  # the run is due: it wakes
        assert store.get_run(run.run_id).status is RunStatus.PENDING
        taken = self._resumed(store, run.run_id)
        ended = store.await_message(taken, self._wait_step(run.run_id), "answer", 100)
        assert ended.step is not None
        assert ended.step.status is StepStatus.FAILED
        nxt = store.await_message(taken, self._wait_step(run.run_id, "answer#2", 2), "answer", None)
        assert nxt.step is not None
        assert nxt.step.result == "late"
        assert store.messages(run.run_id)[0].seq == late.seq

    # -- sleeps -----------------------------------------------------------------------------------

    @exercises(VALUES, CLAIMS)
    def test_a_sleep_records_its_due_instant_once(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        t0 = store.now()
        gate = store.await_timer(claim, self._sleep_step(run.run_id), DUE_IN_MS)
        t1 = store.now()
        assert gate.step is not None
        assert gate.waiting_for is not None
        until = gate.step.result["until"]
        assert stamped_between(t0 + DUE_IN_MS, until, t1 + DUE_IN_MS)
        assert (gate.waiting_for["kind"], gate.waiting_for["until"], gate.waiting_for["step_id"]) == (
            "sleep",
            until,
            "sleep",
        )
        sleeping = store.get_run(run.run_id)
        assert (sleeping.status, sleeping.wake_at, sleeping.owner) == (RunStatus.WAITING, until, None)
        assert store.load_ledger(run.run_id).steps["sleep"].result["until"] == until
        # resumed early, with another duration in the code: it waits again until the same instant
        again = store.await_timer(self._resumed(store, run.run_id), self._sleep_step(run.run_id), 60_000)
        assert again.step is not None
        assert again.step.result["until"] == until
        assert store.get_run(run.run_id).wake_at == until
        assert store.claim_next("worker-c", LONG_LEASE_MS, [self.workflow]) is None
        time.sleep(max(0.0, (until - store.now()) / 1000) + 0.05)
        due = store.claim_next("worker-c", LONG_LEASE_MS, [self.workflow])
        assert due is not None
        assert due.run_id == run.run_id
        done = store.await_timer(due, self._sleep_step(run.run_id), 60_000)
        assert done.waiting_for is None
        assert done.step is not None
        assert done.step.result["until"] == until
        assert store.get_run(run.run_id).status is RunStatus.RUNNING
        self._counted(store, run.run_id)

    def test_a_sleep_of_nothing_is_recorded_and_due_at_once(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        gate = store.await_timer(claim, self._sleep_step(run.run_id), 0)
        assert gate.waiting_for is None
        assert gate.step is not None
        assert store.get_run(run.run_id).status is RunStatus.RUNNING
        self._counted(store, run.run_id)

    @exercises(CONCURRENCY, ACROSS_RUNS)
    def test_wait_for_work_wakes_when_a_waiting_run_falls_due(self) -> None:
        store, waiter = self.store(), self.store()
        run, claim = self.start(store)
        gate = store.await_timer(claim, self._sleep_step(run.run_id), 400)
        assert gate.waiting_for is not None
        try:
            waiter.wait_for_work(0.01)  # start listening; settle anything queued before
            started = time.monotonic()
            waiter.wait_for_work(10.0)
            woke = time.monotonic() - started
            assert woke < 3.0, f"woke after {woke:.2f}s, not when the run fell due"
        finally:
            self._end(store, run.run_id)

    @exercises(CONCURRENCY, ACROSS_RUNS, CLAIMS)
    def test_a_wait_that_ended_for_a_due_run_is_followed_by_a_claim_that_takes_it(self) -> None:
        """A wait ends for a run falling due no sooner than the instant it falls due: a claim a
        hair early would find nothing, and the next wait, looking only forward, would sleep out
        the whole rescan interval while the run stood due."""
        store, waiter = self.store(), self.store()
        for trial in range(5):
            run, claim = self.start(store)
            gate = store.await_timer(claim, self._sleep_step(run.run_id), 150 + 37 * trial)
            assert gate.waiting_for is not None
            try:
                waiter.wait_for_work(0.01)  # start listening; settle the news of that run
                started = time.monotonic()
                waiter.wait_for_work(10.0)
                woke = time.monotonic() - started
                taken = waiter.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
                assert woke < 3.0, f"woke after {woke:.2f}s, not when the run fell due"
                assert taken is not None, f"trial {trial}: the wait ended before the run was due"
                assert taken.run_id == run.run_id
            finally:
                self._end(store, run.run_id)

    @exercises(CONCURRENCY, ACROSS_RUNS)
    def test_news_heard_before_quiet_returns_at_quiet_a_due_run_at_once(self) -> None:
        """A worker whose wake-ups kept bringing nothing waits with ``quiet``: news heard sooner
        returns then, not before — yet a waiting run falling due inside ``quiet`` is never held
        back by it (a pause after the wait once held it back by up to the rescan interval)."""
        store, waiter, submitter = self.store(), self.store(), self.store()
        waiter.wait_for_work(0.01)  # start listening; settle anything queued before
        threading.Timer(0.1, lambda: self.submit(submitter)).start()
        started = time.monotonic()
        heard = waiter.wait_for_work(10.0, quiet=0.8)
        waited = time.monotonic() - started
        assert heard, "the new run was news"
        assert 0.7 <= waited < 5.0, f"returned after {waited:.2f}s, not at quiet (0.8s)"

        run, claim = self.start(store)
        gate = store.await_timer(claim, self._sleep_step(run.run_id), 400)
        assert gate.waiting_for is not None
        try:
            waiter.wait_for_work(0.01)  # settle the news of that run
            threading.Timer(0.1, lambda: self.submit(submitter)).start()  # news inside quiet
            started = time.monotonic()
            waiter.wait_for_work(20.0, quiet=15.0)
            woke = time.monotonic() - started
            assert woke < 5.0, f"woke after {woke:.2f}s: quiet held back a run falling due"
        finally:
            self._end(store, run.run_id)

    # -- a send racing a gate ---------------------------------------------------------------------

    @exercises(VALUES, CONCURRENCY)
    def test_a_message_racing_a_wait_is_taken_or_wakes_the_run(self) -> None:
        """Either order of a send and a gate at once: the wait takes the message, or the send
        finds the run waiting and makes it pending — never a run waiting with its message
        kept beside it."""
        sender, waiter = self.store(), self.store()
        for trial in range(20):
            run, claim = self.start(waiter)
            step = self._wait_step(run.run_id)
            calls: list[Callable[[], object]] = [
                functools.partial(sender.send_message, run.run_id, "answer", trial),
                functools.partial(waiter.await_message, claim, step, "answer", None),
            ]
            in_threads(*calls)
            self._taken_or_woke(waiter, run.run_id, trial)
