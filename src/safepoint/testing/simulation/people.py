"""The people and clients of a simulation: everything a person can do to a run, at any moment.

A person acts through the public verbs only, racing the workers: fork (from any recorded step,
with or without ``resend``), retry, ``extend_limits``, resolve (truthfully: they look at the
owner first, as a person at a console would), send, approve, revoke, cancel and prune. A client
starts or resumes a run in a process of its own, which can die like a worker's. What the verbs
refuse (a run that moved on, a step not found) is what a person meets too: part of the schedule,
not a failure of it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ... import (
    answer,
    approve,
    cancel,
    extend_limits,
    fork,
    prune,
    resolve,
    resume,
    retry,
    revoke_approval,
    send,
    start,
)
from ...errors import SafepointError
from .scheduler import Process, ProcessDied
from .world import World

BY = "sim-person"


def _runs(w: World, *statuses: str) -> list[tuple[str, str, int, str | None, str | None, str | None]]:
    marks = ",".join("?" * len(statuses))
    where = f"WHERE status IN ({marks})" if statuses else ""
    return [
        tuple(row)
        for row in w.connection.execute(
            "SELECT run_id, status, state_revision, recovery_record, waiting_for, workflow"
            f" FROM safepoint_runs {where} ORDER BY created_at, run_id",
            statuses,
        )
    ]


def _pick(w: World, items: list[Any]) -> Any:
    return items[w.scheduler.tape.draw(len(items))] if items else None


def _fork(w: World) -> str | None:
    run = _pick(w, _runs(w))
    if run is None:
        return None
    steps = [
        r[0]
        for r in w.connection.execute(
            "SELECT step_id FROM safepoint_steps WHERE run_id = ? ORDER BY seq", (run[0],)
        )
    ]
    step = _pick(w, steps)
    if step is None:
        return None
    resend: list[str] = []
    if w.scheduler.tape.chance(250):
        ops = [
            r[0]
            for r in w.connection.execute(
                "SELECT operation_id FROM safepoint_operations WHERE run_id = ?", (run[0],)
            )
        ]
        named = _pick(w, ops)
        if named is not None:
            resend = [named]
    made = fork(w.store, run[0], from_step=step, resend=resend, by=BY)
    w.resends.extend((w.family_of(run[0]), named) for named in resend)  # granted: the fork exists
    return f"fork {run[0]} from {step}{' resend ' + resend[0] if resend else ''} → {made.run_id}"


def _retry(w: World) -> str | None:
    run = _pick(w, _runs(w, "failed"))
    if run is None:
        return None
    resend = [
        r[0]
        for r in w.connection.execute(
            "SELECT operation_id FROM safepoint_operations WHERE run_id = ? AND state = 'rejected'", (run[0],)
        )
    ]
    retry(w.store, run[0], by=BY, resend=resend)
    w.resends.extend((w.family_of(run[0]), op) for op in resend)  # granted: the retry took
    return f"retry {run[0]}{' resend ' + ','.join(resend) if resend else ''}"


def _extend(w: World) -> str | None:
    run = _pick(w, _runs(w, "stopped"))
    if run is None:
        return None
    extend_limits(w.store, run[0], tokens=1000, deadline=timedelta(minutes=10), by=BY)
    return f"extend_limits {run[0]}"


def _resolve(w: World) -> str | None:
    run = _pick(w, _runs(w, "blocked"))
    if run is None or run[3] is None:
        return None
    record = json.loads(run[3])
    key = record.get("effect_key")
    known = w.owner.by_key.get(key) if key else None
    if w.scheduler.tape.chance(100):
        resolve(w.store, run[0], "abandon", revision=run[2], by=BY, force=True)
        return f"resolve {run[0]} abandon"
    if known is not None:
        resolve(
            w.store,
            run[0],
            "applied",
            revision=run[2],
            by=BY,
            receipt=known.receipt,
            evidence="owner dashboard",
        )
        return f"resolve {run[0]} applied"
    resolve(w.store, run[0], "not_applied", revision=run[2], by=BY, evidence="owner dashboard")
    return f"resolve {run[0]} not_applied"


def _send(w: World) -> str | None:
    """Answer a run waiting for a message (or, now and then, one that is not waiting yet)."""
    waiting = [r for r in _runs(w, "waiting") if r[4] and json.loads(r[4]).get("kind") == "message"]
    run = _pick(w, waiting)
    if run is not None:
        name = json.loads(run[4])["name"]
    else:
        run, name = _pick(w, [r for r in _runs(w) if r[5] == "sim.order"]), "confirm"
    if run is None:
        return None
    send(w.store, run[0], name, {"ok": True}, by=BY)
    return f"send {name} to {run[0]}"


def _approval(w: World) -> str | None:
    waiting = [
        r for r in _runs(w, "waiting") if r[4] and json.loads(r[4]).get("kind", "approval") == "approval"
    ]
    run = _pick(w, waiting)
    if run is None:
        return None
    step = json.loads(run[4])["step_id"]
    if w.scheduler.tape.chance(150):
        revoke_approval(w.store, run[0], step, by=BY, reason="changed my mind")
        return f"revoke {run[0]} {step}"
    if w.scheduler.tape.chance(300):  # an approval that lapses, on the store's (virtual) clock
        seconds = 1 + w.scheduler.tape.draw(3)
        approve(w.store, run[0], step, by=BY, expires=timedelta(seconds=seconds))
        return f"approve {run[0]} {step} for {seconds}s"
    approve(w.store, run[0], step, by=BY)
    return f"approve {run[0]} {step}"


def _cancel(w: World) -> str | None:
    run = _pick(w, _runs(w))
    if run is None or not w.scheduler.tape.chance(300):
        return None
    cancel(w.store, run[0], by=BY, reason="simulated")
    return f"cancel {run[0]}"


def _answer(w: World) -> str | None:
    """Answer the wait a run is parked at (``sp.answer``: once; a second answer is refused)."""
    waiting = [r for r in _runs(w, "waiting") if r[4] and json.loads(r[4]).get("kind") == "message"]
    run = _pick(w, waiting)
    if run is None:
        return None
    parked = json.loads(run[4])
    answer(w.store, run[0], parked["name"], {"ok": True}, wait=parked["step_id"], by=BY)
    return f"answer {parked['name']} of {run[0]}"


def _resume(w: World) -> str | None:
    """Resume a run in a client process of its own, racing the workers, now and then for a
    slice of time only."""
    run = _pick(w, _runs(w, "pending", "running", "waiting", "blocked", "stopped"))
    if run is None:
        return None
    slice_s = (1 + w.scheduler.tape.draw(20)) / 100 if w.scheduler.tape.chance(500) else None
    w.clients += 1
    name = f"client-r{w.clients}"
    w.scheduler.spawn(name, client(w, run[0], None, slice_s), process=Process(name))
    return f"resume {run[0]} in {name}" + (f" for {slice_s:g}s" if slice_s else "")


def _prune(w: World) -> str | None:
    done = prune(w.store, finished_before=timedelta(0), statuses=["completed", "cancelled", "failed"])
    return f"prune took {done.runs} runs"


ACTIONS: tuple[Callable[[World], str | None], ...] = (
    _fork,
    _retry,
    _extend,
    _resolve,
    _send,
    _approval,
    _resolve,
    _approval,
    _cancel,
    _prune,
    _answer,
    _resume,
)


def person(w: World, every_ms: int) -> Callable[[], None]:
    """A person at the console, acting every so often while the schedule is in its chaos."""

    def body() -> None:
        tape = w.scheduler.tape
        while w.scheduler.chaos:
            w.scheduler.sleep((every_ms // 2 + tape.draw(every_ms)) / 1000)
            if not w.scheduler.chaos:
                return
            action = ACTIONS[tape.draw(len(ACTIONS))]
            try:
                said = action(w)
            except SafepointError as exc:
                said = f"{action.__name__[1:]} refused: {type(exc).__name__}"
            if said:
                w.scheduler.note(said)

    return body


def client(
    w: World,
    run_id: str,
    starting: tuple[Any, tuple[Any, ...]] | None,
    slice_s: float | None = None,
) -> Callable[[], None]:
    """A client process: starts a run here (``starting``: the workflow and its arguments) or
    resumes one, carrying it on in this process until it ends or stops — or, with ``slice_s``,
    for that long only (then it stops at a step boundary and is released)."""

    def body() -> None:
        try:
            if starting is not None:
                wf, args = starting
                start(w.store, wf, *args, run_id=run_id, lease_ms=w.lease_ms, attach_timeout=5.0)
            else:
                resume(w.store, run_id, lease_ms=w.lease_ms, slice=slice_s)
            w.scheduler.note(f"{'start' if starting else 'resume'} {run_id}: returned")
        except ProcessDied:
            raise
        except BaseException as exc:  # how the run stopped here (LostOwnership is a signal)
            w.scheduler.note(f"{'start' if starting else 'resume'} {run_id}: {type(exc).__name__}")

    return body
