"""Waits for the outside world: the flows of ``run.wait_for`` and ``run.sleep`` (the verb that
delivers a message, ``send``, is ``messages``').

A wait step replays like any step: recorded, it returns the payload it received (or raises its
recorded ``WaitTimedOut``) without asking anything. Not recorded yet, it asks the store's gate
(``Store.await_message``), which in one transaction either records the step with the oldest
message of its name not yet taken — or makes the run ``waiting``, released, and this run object
halts with ``AwaitingMessage``: the caller of ``start`` / ``resume`` gets it, and whoever sends
the message makes the run runnable again. A sleep (``Store.await_timer``) records its due
instant at its first run, so a restart neither shortens nor restarts it; replaying a sleep that
is due writes nothing. The decisions are ``_rules.waits``'.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from .._rules.canonical import input_hash
from .._rules.replay import Asked
from .._rules.waits import (
    SLEEP_INPUTS,
    SLEEP_STEP,
    as_ms,
    message_name,
    received,
    sleep_until,
    wait_inputs,
    wait_step_name,
    waiting_error,
)
from ..errors import UsageError
from ..storage.base import Store
from ..types import StepKind, StepRecord, StepStatus, WaitGate
from .core import RunCore
from .crashpoints import crashpoint
from .flow import Flow, io
from .observe import call_status, seen_executed, seen_replayed


def wait_flow(
    core: RunCore, step_id: str | None, name: str, timeout: timedelta | float | None, prefix: str
) -> Flow[Any]:
    """``run.wait_for(name, timeout=…)``: the payload of the message received, recorded."""
    core.check_halt()
    name = message_name(name)
    timeout_ms = as_ms(timeout, "timeout")
    sid = core.occurrence(name if step_id is None else step_id, prefix)
    step_name, hashed = wait_step_name(name), input_hash(wait_inputs(name))
    recorded = yield from core.replay_lookup(sid, StepKind.WAIT, step_name, hashed)
    if recorded is not None:
        if core.watch is not None:
            seen_replayed(
                core.watch, recorded, "failed" if recorded.status is StepStatus.FAILED else "completed"
            )
        return received(core.run.run_id, recorded, name)
    if core.replaying is not None:
        core.replaying.new(core, Asked(sid, StepKind.WAIT, step_name, hashed))
    if core.cancelling:
        raise core.cancelled()  # waiting is new work
    base = StepRecord(core.run.run_id, sid, StepKind.WAIT, step_name, hashed, None, seq=core.next_seq(sid))
    crashpoint("step.before_record", sid)
    gate = yield from _gate(core, io(Store.await_message, core.claim, base, name, timeout_ms), base)
    assert gate.step is not None  # a gate that does not make the run wait records the step
    crashpoint("step.after_record", sid)
    return received(core.run.run_id, gate.step, name)


def sleep_flow(core: RunCore, step_id: str | None, duration: timedelta | float, prefix: str) -> Flow[None]:
    """``run.sleep(duration)``: returns once the due instant recorded at its first run passed."""
    core.check_halt()
    duration_ms = as_ms(duration, "duration")
    if duration_ms is None:
        raise UsageError("run.sleep needs a duration: a timedelta, or a number of seconds")
    sid = core.occurrence(SLEEP_STEP if step_id is None else step_id, prefix)
    hashed = input_hash(SLEEP_INPUTS)
    recorded = yield from core.replay_lookup(sid, StepKind.WAIT, SLEEP_STEP, hashed)
    if recorded is not None:
        if (yield from io(Store.now)) >= sleep_until(recorded.result):
            if core.watch is not None:
                seen_replayed(core.watch, recorded)
            return  # due: nothing to write
        if core.replaying is not None:  # not due at the run's own clock: where the run is
            core.replaying.new(core, Asked(sid, StepKind.WAIT, SLEEP_STEP, hashed))
        yield from _gate(core, io(Store.await_timer, core.claim, recorded, duration_ms), recorded)
        return  # due after all, on the store's own reading of its clock
    if core.replaying is not None:
        core.replaying.new(core, Asked(sid, StepKind.WAIT, SLEEP_STEP, hashed))
    if core.cancelling:
        raise core.cancelled()  # a sleep not started yet is new work
    base = StepRecord(core.run.run_id, sid, StepKind.WAIT, SLEEP_STEP, hashed, None, seq=core.next_seq(sid))
    crashpoint("step.before_record", sid)
    yield from _gate(core, io(Store.await_timer, core.claim, base, duration_ms), base)
    crashpoint("step.after_record", sid)


def _gate(core: RunCore, request: Flow[WaitGate], step: StepRecord) -> Flow[WaitGate]:
    """``_ask_gate``; an installed observer is told how the wait step's gate answered."""
    if core.watch is None:
        return (yield from _ask_gate(core, request, step.step_id))
    started = time.time_ns()
    try:
        gate = yield from _ask_gate(core, request, step.step_id)
    except BaseException as exc:
        seen_executed(core.watch, step, started, call_status(exc, otherwise="failed"), exc)
        raise
    seen_executed(
        core.watch, step, started, "completed", None, gate.step.result if gate.step is not None else None
    )
    return gate


def _ask_gate(core: RunCore, request: Flow[WaitGate], sid: str) -> Flow[WaitGate]:
    """Ask a wait's gate, which may release the run: no fan-out branch starts a dispatch
    meanwhile (``release_turn``). A run made to wait halts this run object with the error its
    caller gets."""
    yield from core.release_turn()
    try:
        core.check_halt()  # a sibling branch stopped the run meanwhile: nothing new
        gate = yield from core.write(request)
        if gate.step is not None:
            core.steps[sid] = gate.step
        if gate.waiting_for is not None:
            error = waiting_error(core.run.run_id, gate.waiting_for)
            core.halted = error  # the run is released: this run object does no more
            raise error
    finally:
        core.end_turn()
    return gate
