"""Waits for the outside world: a message sent to a run (``run.wait_for``, ``safepoint.send``)
and a durable timer (``run.sleep``) — the decisions, as small I/O-free functions.

A wait is a step of kind ``wait``. It takes the answer addressed to it (``safepoint.answer``;
``answers`` decides what is kept) — else the oldest message of its name not yet taken that is
addressed to no other wait (``safepoint.send``: the mailbox) — and records it as its result;
with none, the run becomes ``waiting`` — released, taken by no worker — until a message of that
name is sent (the send makes it pending, in its own transaction) or its timeout falls due
(``wake_at``: workers take waiting runs that are due). The timeout instant is reckoned on the
store's clock when the wait first has to wait, and recorded then (as the wait
step's attempt, whose ``retry_at`` is the instant), so no restart shortens or restarts it; past
it the step is recorded failed and raises ``WaitTimedOut``, on every replay too. A message sent
at or after that instant is kept, for the next wait of the name.

A sleep records its step at its first run, with the instant it is due as its result; until
then the run waits, due at that instant. Replaying a sleep that is due costs nothing.

The stores make these decisions inside the transaction that holds the run (``send_message``,
``await_message``, ``await_timer``), so a message sent while a worker is about to wait is
either found by the wait or finds the run waiting — never neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from ..errors import AwaitingMessage, MessageRefused, RunWaiting, Sleeping, UsageError, WaitTimedOut
from ..types import JSON, AttemptRecord, MessageRecord, RunStatus, StepRecord, StepStatus, WaitGate
from .canonical import dumps, loads, require_json
from .ids import check_id, check_who
from .moments import instant
from .secrets import refuse_secrets

# What a waiting run waits for (``RunRecord.waiting_for["kind"]``). Approvals recorded before
# kinds existed have none: a missing kind is an approval.
APPROVAL, MESSAGE, SLEEP = "approval", "message", "sleep"

SLEEP_STEP = "sleep"  # the recorded name of a sleep step
# The inputs a wait's hash covers: the message name (a sleep: nothing). Its timeout or duration
# is recorded when it first runs, so a deploy that changes them moves no recorded wait.
SLEEP_INPUTS: dict[str, Any] = {"sleep": True}


def waiting_kind(waiting_for: dict[str, Any] | None) -> str | None:
    """What a waiting run waits for: ``approval``, ``message`` or ``sleep`` (None: nothing)."""
    if waiting_for is None:
        return None
    return str(waiting_for.get("kind") or APPROVAL)


# -- what a workflow and a sender write ------------------------------------------------------


def message_name(name: object) -> str:
    """A message name as a wait and a sender give it: an id (it is typed into commands)."""
    return check_id(name, "message name")


def wait_step_name(name: str) -> str:
    """The recorded name of the wait step for messages named ``name``."""
    return f"message:{name}"


def wait_inputs(name: str) -> dict[str, Any]:
    return {"message": name}


def as_ms(value: timedelta | float | None, what: str) -> int | None:
    """A timeout or duration as written (a ``timedelta``, or seconds) in milliseconds."""
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise UsageError(f"{what}={value!r}: a timedelta, or a number of seconds, of 0 or more")
    return math.ceil(seconds * 1000)


def check_message(run_id: str, name: str, payload: JSON, message_id: str | None, by: str | None) -> None:
    """What a sender gives, checked before anything is looked up or recorded: ids that are
    ids, a payload that is JSON and holds no credential."""
    message_name(name)
    if message_id is not None:
        check_id(message_id, "message id")
    if by is not None:
        check_who(by, "sends the message")
    require_json(payload, f"the payload of message {name!r}")
    refuse_secrets(payload, f"the payload of message {name!r} to run {run_id!r}")


# -- sending -----------------------------------------------------------------------------------


def refused_send(run_id: str, name: str, status: RunStatus) -> MessageRefused | None:
    """Why a message cannot be kept for a run as it stands (None: it can). A run that ended
    would never receive it; every other run keeps it, waiting or not (a blocked or stopped run
    receives it once it goes on)."""
    if status is RunStatus.CONTINUED:
        return MessageRefused(
            run_id, name, "the run continued as new: send it to the run that carries its chain on"
        )
    if status.terminal:
        return MessageRefused(
            run_id, name, f"the run has ended ({status.value}): no wait of it would ever receive it"
        )
    return None


def redelivered(existing: MessageRecord, name: str, payload: JSON, wait: str | None = None) -> MessageRecord:
    """A message id sent again: the same message delivered twice is the one kept (returned) —
    as an answer (``wait``), the same answer to the same wait; the id naming another message is
    refused (``MessageRefused``), nothing written."""
    if (
        existing.name == name
        and existing.payload == loads_json(payload)
        and wait in (None, existing.for_wait)
    ):
        return existing
    raise MessageRefused(
        existing.run_id,
        name,
        f"message id {existing.message_id!r} names another message of this run already"
        f" (sent as {existing.name!r} at {instant(existing.sent_at)}): a message id is"
        " kept once per run — give this message an id of its own",
    )


def loads_json(payload: JSON) -> Any:
    """The payload as it reads back from the ledger (plain dicts and lists)."""
    return loads(dumps(payload))


def wakes(status: RunStatus, waiting_for: dict[str, Any] | None, name: str) -> bool:
    """Whether a message named ``name`` releases the run: it waits for exactly that."""
    return (
        status is RunStatus.WAITING
        and waiting_kind(waiting_for) == MESSAGE
        and waiting_for is not None
        and waiting_for.get("name") == name
    )


def sent_detail(message: MessageRecord, woke: bool) -> dict[str, Any]:
    """The ``message.sent`` event's detail (the payload is the message's own: not repeated); an
    answer's names the wait it is for."""
    detail = {
        "name": message.name,
        "seq": message.seq,
        "message_id": message.message_id,
        "by": message.sent_by,
        "woke": woke,
    }
    if message.for_wait is not None:
        detail["for_wait"] = message.for_wait
    return detail


def received_detail(message: MessageRecord) -> dict[str, Any]:
    """The ``message.received`` event's detail: which message the wait step took."""
    return {
        "name": message.name,
        "seq": message.seq,
        "message_id": message.message_id,
        "sent_by": message.sent_by,
    }


# -- a wait's gate ------------------------------------------------------------------------------


def timeout_instant(recorded: int | None, now: int, timeout_ms: int | None) -> int | None:
    """When the wait times out: the instant recorded when it first waited — else, for a wait
    that has not waited yet, ``timeout_ms`` from ``now`` (None: it never times out)."""
    if recorded is not None:
        return recorded
    return None if timeout_ms is None else now + timeout_ms


def message_waiting(name: str, step_id: str, timeout_at: int | None, now: int) -> dict[str, Any]:
    """What a run waiting for a message waits for (``RunRecord.waiting_for``)."""
    return {"kind": MESSAGE, "name": name, "step_id": step_id, "timeout_at": timeout_at, "since": now}


def sleep_waiting(step_id: str, until: int, now: int) -> dict[str, Any]:
    """What a sleeping run waits for: its timer, due ``until``."""
    return {"kind": SLEEP, "step_id": step_id, "until": until, "since": now}


def wake_at(waiting_for: dict[str, Any]) -> int | None:
    """When a waiting run is due (a worker takes it then): its sleep's end, its wait's timeout."""
    at = waiting_for.get("until") if waiting_kind(waiting_for) == SLEEP else waiting_for.get("timeout_at")
    return None if at is None else int(at)


def waiting_evidence(name: str) -> dict[str, str]:
    """The error of the attempt row that records a wait's timeout instant (its ``retry_at``)."""
    return {
        "type": "AwaitingMessage",
        "message": f"no message {name!r} had been sent; the wait times out at this attempt's retry_at",
    }


def timed_out_evidence(name: str, timeout_at: int) -> dict[str, Any]:
    """The error a timed-out wait step records (raised again, as ``WaitTimedOut``, on replay)."""
    return {
        "type": "WaitTimedOut",
        "message": f"no message {name!r} before {instant(timeout_at, millis=True)}",
        "name": name,
        "timeout_at": timeout_at,
    }


@dataclass(frozen=True, slots=True)
class GatePlan:
    """What a wait's gate writes, the same on every store, and what it returns (``gate``):
    the step it records now (``record``: new — with its ``event``, for a wait), the message
    that step takes, and — when the run waits — its waiting, with, for a first wait with a
    timeout, the attempt that records the timeout instant (``started``)."""

    gate: WaitGate
    record: bool = False
    event: tuple[str, dict[str, Any]] | None = None  # kind and detail
    started: AttemptRecord | None = None


def plan_wait(
    step: StepRecord,
    fence: int,
    name: str,
    now: int,
    timeout_at: int | None,
    *,
    first: bool,
    oldest: MessageRecord | None,
) -> GatePlan:
    """Decide a wait's gate: take ``oldest`` (the answer addressed to this wait, else the oldest
    message of ``name`` not taken and addressed to no other wait, sent before ``timeout_at``) —
    else, past ``timeout_at``, record the step failed — else wait, and record the timeout
    instant if this is the wait's ``first`` time."""
    if oldest is not None:
        recorded = replace(step, result=oldest.payload, fence=fence, recorded_at=now)
        taken = replace(oldest, taken_by=step.step_id, taken_at=now)
        return GatePlan(
            WaitGate(step=recorded, message=taken), True, ("message.received", received_detail(oldest))
        )
    if timeout_at is not None and now >= timeout_at:
        evidence = timed_out_evidence(name, timeout_at)
        recorded = replace(step, status=StepStatus.FAILED, error=evidence, fence=fence, recorded_at=now)
        return GatePlan(
            WaitGate(step=recorded), True, ("wait.timed_out", {"name": name, "timeout_at": timeout_at})
        )
    started = None
    if first and timeout_at is not None:
        started = AttemptRecord(
            run_id=step.run_id,
            step_id=step.step_id,
            attempt=1,
            kind=step.kind,
            name=step.name,
            input_hash=step.input_hash,
            error=waiting_evidence(name),
            retry_at=timeout_at,
            fence=fence,
            recorded_at=now,
        )
    return GatePlan(
        WaitGate(waiting_for=message_waiting(name, step.step_id, timeout_at, now)), started=started
    )


def plan_sleep(step: StepRecord, fence: int, now: int, recorded: Any, duration_ms: int) -> GatePlan:
    """Decide a sleep's gate: its step as recorded (``recorded``: its stored result; None: not
    yet, and it is recorded now, due ``duration_ms`` from ``now``), and, not yet due, the run's
    waiting until then."""
    if recorded is None:
        result: Any = sleep_result(now + duration_ms, duration_ms)
        step = replace(step, result=result, fence=fence, recorded_at=now)
        new = True
    else:
        step, new = replace(step, result=recorded), False
    until = sleep_until(step.result)
    waiting = sleep_waiting(step.step_id, until, now) if now < until else None
    return GatePlan(WaitGate(step=step, waiting_for=waiting), new)


def sleep_result(until: int, duration_ms: int) -> dict[str, int]:
    """What a sleep step records at its first run: when it is due."""
    return {"until": until, "duration_ms": duration_ms}


def sleep_until(result: Any) -> int:
    """The due instant a recorded sleep step holds."""
    return int(result["until"])


# -- what the workflow sees ---------------------------------------------------------------------


def waiting_error(run_id: str, waiting_for: dict[str, Any]) -> RunWaiting:
    """The error a run that now waits for a message or its timer raises to its caller."""
    step_id = str(waiting_for.get("step_id"))
    if waiting_kind(waiting_for) == SLEEP:
        return Sleeping(run_id, step_id, int(waiting_for["until"]))
    timeout = waiting_for.get("timeout_at")
    return AwaitingMessage(
        run_id, step_id, str(waiting_for.get("name")), None if timeout is None else int(timeout)
    )


def received(run_id: str, step: StepRecord, name: str) -> Any:
    """A recorded wait step's answer: the payload it received — or, recorded failed, the
    timeout raised again (``WaitTimedOut``), so a resume takes the path the run took."""
    if step.error is not None:
        raise WaitTimedOut(run_id, step.step_id, name, int(step.error.get("timeout_at") or 0))
    return step.result
