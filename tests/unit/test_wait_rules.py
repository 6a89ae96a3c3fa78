"""The decisions of waits (``_rules.waits``), with no store: what a wait's gate does with the
message it finds or the time, what a sleep records, and what a send may do."""

from __future__ import annotations

from datetime import timedelta

import pytest

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
from safepoint.errors import AwaitingMessage, MessageRefused, Sleeping, UsageError
from safepoint.types import MessageRecord, RunStatus, StepKind, StepRecord, StepStatus

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
