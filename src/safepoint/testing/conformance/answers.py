"""Store conformance: answers — a message addressed to one wait (``answer_wait``), kept once for
it and taken by it alone, beside the messages that queue by name (``send_message``).

A wait takes one answer: a second answer to it — or one after it took a message or timed out —
is refused (``WaitAnswered``) and writes nothing; k answers at the same instant keep one."""

from __future__ import annotations

import functools
import time

import pytest

from ...errors import MessageRefused, RunNotFound, WaitAnswered
from ...types import MessageRecord, RunStatus, StepStatus
from ._concerns import CONCURRENCY, VALUES, exercises
from ._support import _uid, at_once, make_step
from .waits import WaitHelpers


class AnswerTests(WaitHelpers):
    """The conformance tests of answers to one wait."""

    def test_an_answer_to_the_parked_wait_is_kept_once_and_releases_the_run(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        kept = store.answer_wait(run.run_id, "wait.answer", "answer", {"ok": True}, by="ana")
        assert (kept.name, kept.for_wait, kept.sent_by) == ("answer", "wait.answer", "ana")
        assert kept.taken_by is None
        assert store.messages(run.run_id) == [kept]
        released = store.get_run(run.run_id)
        assert (released.status, released.waiting_for) == (RunStatus.PENDING, None)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.detail["woke"]) == ("message.sent", True)
        assert event.detail["for_wait"] == "wait.answer"
        before = self.snapshot(store, run.run_id)
        with pytest.raises(WaitAnswered) as second:
            store.answer_wait(run.run_id, "wait.answer", "answer", {"ok": False}, by="bo")
        refused = second.value
        assert (refused.run_id, refused.name, refused.step_id) == (run.run_id, "answer", "wait.answer")
        assert (refused.answered_by, refused.answered_at, refused.timed_out) == ("ana", kept.sent_at, False)
        assert self.snapshot(store, run.run_id) == before  # nothing written
        taken = self._resumed(store, run.run_id)
        gate = store.await_message(taken, self._wait_step(run.run_id), "answer", None)
        assert gate.step is not None
        assert gate.step.result == {"ok": True}
        with pytest.raises(WaitAnswered):  # taken: still once
            store.answer_wait(run.run_id, "wait.answer", "answer", {"ok": False}, by="bo")
        self._counted(store, run.run_id)

    def test_an_answer_is_taken_by_its_wait_alone_and_before_what_queued(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        queued = store.send_message(run.run_id, "vote", "queued")
        ahead = store.answer_wait(run.run_id, "vote#2", "vote", "for the second")
        assert store.get_run(run.run_id).status is RunStatus.RUNNING  # no wait of it parked
        one = store.await_message(claim, self._wait_step(run.run_id, "vote", 1, "vote"), "vote", None)
        two = store.await_message(claim, self._wait_step(run.run_id, "vote#2", 2, "vote"), "vote", None)
        assert (one.step and one.step.result, two.step and two.step.result) == ("queued", "for the second")
        assert [(m.seq, m.taken_by) for m in store.messages(run.run_id)] == [
            (queued.seq, "vote"),
            (ahead.seq, "vote#2"),
        ]
        # an answer to a wait is that wait's, though a message of its name queued before it
        run, claim = self.start(store)
        queued = store.send_message(run.run_id, "vote", "queued")
        answered = store.answer_wait(run.run_id, "vote", "vote", "answered")
        one = store.await_message(claim, self._wait_step(run.run_id, "vote", 1, "vote"), "vote", None)
        two = store.await_message(claim, self._wait_step(run.run_id, "vote#2", 2, "vote"), "vote", None)
        assert (one.step and one.step.result, two.step and two.step.result) == ("answered", "queued")
        assert [(m.seq, m.taken_by) for m in store.messages(run.run_id)] == [
            (queued.seq, "vote#2"),
            (answered.seq, "vote"),
        ]

    def test_an_answer_to_a_wait_that_took_a_message_or_timed_out_is_refused(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        mailbox = store.send_message(run.run_id, "answer", "from the mailbox", by="ana")
        store.await_message(claim, self._wait_step(run.run_id), "answer", None)
        with pytest.raises(WaitAnswered) as took:
            store.answer_wait(run.run_id, "wait.answer", "answer", "late")
        assert (took.value.answered_by, took.value.answered_at, took.value.timed_out) == (
            "ana",
            mailbox.sent_at,
            False,
        )
        # parked past its timeout instant, and then recorded failed: refused either way
        run, claim = self.start(store)
        gate = store.await_message(claim, self._wait_step(run.run_id), "answer", 100)
        assert gate.waiting_for is not None
        timeout_at = gate.waiting_for["timeout_at"]
        time.sleep(max(0.0, (timeout_at - store.now()) / 1000) + 0.05)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(WaitAnswered) as parked:
            store.answer_wait(run.run_id, "wait.answer", "answer", "too late")
        assert (parked.value.timed_out, parked.value.answered_at) == (True, timeout_at)
        assert self.snapshot(store, run.run_id) == before
        taken = self._resumed(store, run.run_id)
        ended = store.await_message(taken, self._wait_step(run.run_id), "answer", 100)
        assert ended.step is not None
        assert ended.step.status is StepStatus.FAILED
        with pytest.raises(WaitAnswered) as recorded:
            store.answer_wait(run.run_id, "wait.answer", "answer", "too late")
        assert recorded.value.timed_out
        assert store.messages(run.run_id) == []

    def test_an_answer_names_a_wait_for_messages_of_its_name(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        with pytest.raises(MessageRefused, match="not a wait"):
            store.answer_wait(run.run_id, "s1", "answer", "yes")
        store.await_message(claim, self._wait_step(run.run_id, seq=2), "answer", None)
        with pytest.raises(MessageRefused, match="'answer'") as other:
            store.answer_wait(run.run_id, "wait.answer", "other", "yes")
        assert not isinstance(other.value, WaitAnswered)
        assert store.messages(run.run_id) == []
        assert store.get_run(run.run_id).status is RunStatus.WAITING
        self._end(store, run.run_id)

    def test_an_answers_message_id_is_kept_once_and_an_ended_run_takes_none(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        kept = store.answer_wait(run.run_id, "hook", "hook", {"delivery": 7}, message_id="d-7")
        events = len(store.events(run.run_id))
        assert store.answer_wait(run.run_id, "hook", "hook", {"delivery": 7}, message_id="d-7") == kept
        assert len(store.events(run.run_id)) == events
        with pytest.raises(MessageRefused, match="d-7"):  # the id, for another wait
            store.answer_wait(run.run_id, "hook#2", "hook", {"delivery": 7}, message_id="d-7")
        with pytest.raises(WaitAnswered):  # a re-delivery without its id: refused, not kept
            store.answer_wait(run.run_id, "hook", "hook", {"delivery": 7})
        store.finish_run(claim, RunStatus.COMPLETED)
        assert store.answer_wait(run.run_id, "hook", "hook", {"delivery": 7}, message_id="d-7") == kept
        with pytest.raises(MessageRefused, match="ended"):
            store.answer_wait(run.run_id, "other", "other", 1)
        with pytest.raises(RunNotFound):
            store.answer_wait(f"missing-{_uid()}", "hook", "hook", 1)

    @exercises(VALUES, CONCURRENCY)
    def test_k_answers_at_the_same_instant_keep_one(self) -> None:
        """k senders, each on a store object of its own, answer the parked wait at once: one
        answer is kept and releases the run; every other is refused, naming it."""
        stores = [self.store() for _ in range(5)]
        for trial in range(4):
            run, claim = self.start(stores[0])
            stores[0].await_message(claim, self._wait_step(run.run_id), "answer", None)
            results = at_once(
                *(
                    functools.partial(own.answer_wait, run.run_id, "wait.answer", "answer", n, by=f"p{n}")
                    for n, own in enumerate(stores)
                )
            )
            kept = [r for r in results if isinstance(r, MessageRecord)]
            refused = [r for r in results if isinstance(r, WaitAnswered)]
            assert (len(kept), len(refused)) == (1, len(stores) - 1), (trial, results)
            assert {r.answered_by for r in refused} == {kept[0].sent_by}
            assert stores[0].messages(run.run_id) == kept
            woke = [e.detail["woke"] for e in stores[0].events(run.run_id) if e.kind == "message.sent"]
            assert woke == [True]
            self._counted(stores[0], run.run_id)

    @exercises(VALUES, CONCURRENCY)
    def test_an_answer_racing_its_wait_is_taken_or_wakes_the_run(self) -> None:
        """Either order of an answer and the wait's gate at once: the wait takes the answer, or
        the answer finds the run parked at it and makes it pending — never a run parked with
        its answer kept beside it."""
        sender, waiter = self.store(), self.store()
        for trial in range(20):
            run, claim = self.start(waiter)
            step = self._wait_step(run.run_id)
            results = at_once(
                functools.partial(sender.answer_wait, run.run_id, "wait.answer", "answer", trial),
                functools.partial(waiter.await_message, claim, step, "answer", None),
            )
            assert not [r for r in results if isinstance(r, Exception)], results
            self._taken_or_woke(waiter, run.run_id, trial)
