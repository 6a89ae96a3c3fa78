"""The decisions of waits (``_rules.waits``, ``_rules.answers``), with no store: what a wait's
gate does with the message it finds or the time, what a sleep records, what a send may do, and
which answers a wait takes (one)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from safepoint._rules.answers import WaitRead, answer_wakes, answered_wait, next_wait, refused_answer
from safepoint._rules.waits import (
    as_ms,
    plan_sleep,
    plan_wait,
    redelivered,
    refused_send,
    timeout_instant,
    waiting_error,
    waiting_kind,
    wake_at,
    wakes,
)
from safepoint.errors import AwaitingMessage, MessageRefused, Sleeping, UsageError, WaitAnswered
from safepoint.types import MessageRecord, RunRecord, RunStatus, StepKind, StepRecord, StepStatus

STEP = StepRecord(
    run_id="r", step_id="answer", kind=StepKind.WAIT, name="message:answer", input_hash="h", result=None
)
MESSAGE = MessageRecord(seq=7, run_id="r", name="answer", payload={"ok": True}, sent_at=900, message_id="d-1")


def test_a_wait_takes_the_message_it_found_and_records_it() -> None:
    plan = plan_wait(STEP, 3, "answer", 1_000, None, first=True, oldest=MESSAGE)
    assert plan.record
    assert plan.started is None
    assert plan.gate.waiting_for is None
    assert plan.gate.step is not None
    assert (plan.gate.step.result, plan.gate.step.fence, plan.gate.step.recorded_at) == (
        {"ok": True},
        3,
        1_000,
    )
    assert plan.gate.message is not None
    assert (plan.gate.message.taken_by, plan.gate.message.taken_at) == ("answer", 1_000)
    assert plan.event is not None
    assert plan.event[0] == "message.received"


def test_a_wait_with_none_waits_and_records_its_timeout_only_the_first_time() -> None:
    first = plan_wait(STEP, 3, "answer", 1_000, 5_000, first=True, oldest=None)
    assert not first.record
    assert first.gate.step is None
    assert first.gate.waiting_for == {
        "kind": "message",
        "name": "answer",
        "step_id": "answer",
        "timeout_at": 5_000,
        "since": 1_000,
    }
    assert first.started is not None
    assert first.started.retry_at == 5_000
    again = plan_wait(STEP, 4, "answer", 2_000, 5_000, first=False, oldest=None)
    assert again.started is None
    assert again.gate.waiting_for is not None
    no_timeout = plan_wait(STEP, 3, "answer", 1_000, None, first=True, oldest=None)
    assert no_timeout.started is None  # nothing to keep: it never times out


def test_past_its_timeout_a_wait_is_recorded_failed() -> None:
    plan = plan_wait(STEP, 3, "answer", 5_000, 5_000, first=False, oldest=None)
    assert plan.record
    assert plan.gate.step is not None
    assert plan.gate.step.status is StepStatus.FAILED
    assert plan.gate.step.error is not None
    assert (plan.gate.step.error["type"], plan.gate.step.error["timeout_at"]) == ("WaitTimedOut", 5_000)


def test_the_timeout_instant_is_the_one_recorded_whatever_the_code_says_now() -> None:
    assert timeout_instant(5_000, 9_000, 60_000) == 5_000
    assert timeout_instant(None, 9_000, 60_000) == 69_000
    assert timeout_instant(None, 9_000, None) is None


def test_a_sleep_is_recorded_once_and_waits_until_it_is_due() -> None:
    sleep = StepRecord(
        run_id="r", step_id="sleep", kind=StepKind.WAIT, name="sleep", input_hash="h", result=None
    )
    new = plan_sleep(sleep, 1, 1_000, None, 500)
    assert new.record
    assert new.gate.step is not None
    assert new.gate.step.result["until"] == 1_500
    assert new.gate.waiting_for is not None
    assert wake_at(new.gate.waiting_for) == 1_500
    early = plan_sleep(sleep, 2, 1_200, {"until": 1_500}, 60_000)  # another duration: the same instant
    assert not early.record
    assert early.gate.waiting_for is not None
    assert early.gate.waiting_for["until"] == 1_500
    due = plan_sleep(sleep, 2, 1_500, {"until": 1_500}, 500)
    assert due.gate.waiting_for is None
    assert not due.record


def test_durations_are_timedeltas_or_seconds_and_never_negative() -> None:
    assert as_ms(timedelta(minutes=1), "timeout") == 60_000
    assert as_ms(0.0015, "timeout") == 2  # rounded up: never shorter than asked
    assert as_ms(None, "timeout") is None
    for wrong in (-1, float("nan"), float("inf"), True, "2d"):
        with pytest.raises(UsageError):
            as_ms(wrong, "timeout")  # type: ignore[arg-type]


def test_a_message_wakes_only_a_run_waiting_for_its_name() -> None:
    waiting = {"kind": "message", "name": "answer", "step_id": "answer"}
    assert wakes(RunStatus.WAITING, waiting, "answer")
    assert not wakes(RunStatus.WAITING, waiting, "other")
    assert not wakes(RunStatus.RUNNING, waiting, "answer")
    assert not wakes(RunStatus.WAITING, {"kind": "sleep", "step_id": "s", "until": 1}, "answer")
    assert not wakes(RunStatus.WAITING, {"operation_id": "op", "step_id": "answer"}, "answer")


def test_a_waiting_for_without_a_kind_is_an_approval() -> None:
    assert waiting_kind({"operation_id": "op", "step_id": "s"}) == "approval"
    assert waiting_kind(None) is None
    assert isinstance(waiting_error("r", {"kind": "message", "name": "a", "step_id": "a"}), AwaitingMessage)
    assert isinstance(waiting_error("r", {"kind": "sleep", "step_id": "s", "until": 5}), Sleeping)


def test_a_run_that_ended_refuses_messages_and_a_message_id_names_one_message() -> None:
    for ended in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED):
        assert isinstance(refused_send("r", "answer", ended), MessageRefused)
    for going_on in (
        RunStatus.PENDING,
        RunStatus.RUNNING,
        RunStatus.WAITING,
        RunStatus.BLOCKED,
        RunStatus.STOPPED,
    ):
        assert refused_send("r", "answer", going_on) is None
    assert redelivered(MESSAGE, "answer", {"ok": True}) is MESSAGE
    with pytest.raises(MessageRefused):
        redelivered(MESSAGE, "answer", {"ok": False})
    with pytest.raises(MessageRefused):
        redelivered(MESSAGE, "other", {"ok": True})


# -- answers: one wait, one answer (``_rules.answers``) ----------------------------------------


def _run(status: RunStatus = RunStatus.WAITING, **waiting: object) -> RunRecord:
    waiting_for = {"kind": "message", "name": "answer", "step_id": "answer", "timeout_at": None, **waiting}
    return RunRecord(
        run_id="r",
        workflow="wf",
        workflow_version="1",
        status=status,
        input_hash="h",
        inputs=None,
        state_revision=1,
        owner=None,
        lease_expires_at=None,
        fence=1,
        resume_count=0,
        event_count=1,
        result=None,
        error=None,
        recovery_record=None,
        created_at=0,
        updated_at=0,
        waiting_for=waiting_for if status is RunStatus.WAITING else None,
    )


def test_the_wait_an_answer_is_for_is_named_or_the_first_of_its_name() -> None:
    assert answered_wait("answer", None) == "answer"
    assert answered_wait("answer", "answer#3") == "answer#3"
    assert [next_wait(w) for w in ("answer", "answer#2", "fan.eu/ask#9")] == [
        "answer#2",
        "answer#3",
        "fan.eu/ask#10",
    ]
    with pytest.raises(UsageError):
        answered_wait("answer", "")


def test_an_answer_to_the_parked_wait_or_one_not_reached_is_kept_and_wakes_only_that_wait() -> None:
    parked = _run()
    assert refused_answer(parked, "answer", "answer", WaitRead(), 1_000) is None
    assert answer_wakes(parked, "answer")
    assert refused_answer(parked, "answer#2", "answer", WaitRead(), 1_000) is None  # ahead: kept
    assert not answer_wakes(parked, "answer#2")
    assert not answer_wakes(_run(RunStatus.PENDING), "answer")


def test_a_wait_that_has_its_answer_refuses_another_naming_who_and_what_to_do() -> None:
    kept = replace(MESSAGE, sent_by="ana", for_wait="answer")
    refused = refused_answer(_run(RunStatus.PENDING), "answer", "answer", WaitRead(answered=kept), 1_000)
    assert isinstance(refused, WaitAnswered)
    assert (refused.step_id, refused.answered_by, refused.answered_at, refused.timed_out) == (
        "answer",
        "ana",
        900,
        False,
    )
    assert "wait='answer#2'" in refused.message
    # the run parked at the next wait of the name now: that one is named
    took = WaitRead(StepKind.WAIT, "message:answer", StepStatus.COMPLETED, kept)
    refused = refused_answer(_run(step_id="answer#4"), "answer", "answer", took, 1_000)
    assert isinstance(refused, WaitAnswered)
    assert refused.waits_at == "answer#4"
    assert "(the run waits at 'answer#4' now), address it: wait='answer#4'" in refused.message


def test_a_wait_past_its_timeout_refuses_an_answer() -> None:
    parked = _run(timeout_at=1_000)
    assert refused_answer(parked, "answer", "answer", WaitRead(timeout_at=1_000), 999) is None
    late = refused_answer(parked, "answer", "answer", WaitRead(timeout_at=1_000), 1_000)
    assert isinstance(late, WaitAnswered)
    assert (late.timed_out, late.answered_at) == (True, 1_000)
    failed = WaitRead(StepKind.WAIT, "message:answer", StepStatus.FAILED, timeout_at=1_000)
    recorded = refused_answer(_run(RunStatus.RUNNING), "answer", "answer", failed, 5)
    assert isinstance(recorded, WaitAnswered)
    assert recorded.timed_out


def test_an_answer_names_a_wait_for_messages_of_its_name() -> None:
    not_a_wait = refused_answer(_run(RunStatus.RUNNING), "s1", "answer", WaitRead(StepKind.READ, "fetch"), 5)
    assert type(not_a_wait) is MessageRefused
    assert "is a read step, not a wait" in not_a_wait.reason
    sleep = refused_answer(_run(RunStatus.RUNNING), "sleep", "answer", WaitRead(StepKind.WAIT, "sleep"), 5)
    assert sleep is not None
    assert "is a sleep" in sleep.reason
    other = refused_answer(_run(), "answer", "other", WaitRead(), 5)
    assert type(other) is MessageRefused
    assert "waits for messages 'answer', not 'other'" in other.reason


def test_a_redelivered_answer_is_the_one_kept_only_for_the_same_wait() -> None:
    kept = replace(MESSAGE, for_wait="answer")
    assert redelivered(kept, "answer", {"ok": True}, "answer") == kept
    assert redelivered(kept, "answer", {"ok": True}) == kept  # a send of the same delivery
    with pytest.raises(MessageRefused, match="names another message"):
        redelivered(kept, "answer", {"ok": True}, "answer#2")
