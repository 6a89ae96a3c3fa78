"""The PostgreSQL store's waits: messages sent to a run, and the gates of its wait and sleep
steps. A send and a gate each take the run's row lock first, in a statement of its own, and
look at messages and the run's status only in later statements (READ COMMITTED: each statement
reads its own snapshot), so whichever commits second sees the first (the decisions are in
``safepoint._rules.waits``)."""

from __future__ import annotations

from typing import Any

from ..._rules.answers import WaitRead, answer_wakes, answered_wait, refused_answer
from ..._rules.canonical import dumps, input_hash
from ..._rules.waits import (
    GatePlan,
    check_message,
    plan_sleep,
    plan_wait,
    redelivered,
    refused_send,
    sent_detail,
    timeout_instant,
    wait_inputs,
    wake_at,
    wakes,
)
from ...errors import HistoryWarning
from ...types import JSON, Claim, MessageRecord, StepRecord, WaitGate
from .._rows import stored_json, wait_read
from ..ledger import message_seq
from ..plans import Plan
from .connection import QUERIES as _q
from .connection import PostgresBase


class PostgresWaits(PostgresBase):
    """The PostgreSQL store's messages, and the gates of wait and sleep steps."""

    def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> Plan[MessageRecord]:
        check_message(run_id, name, payload, message_id, by)
        return (yield from self._keep(run_id, name, payload, message_id, by, None))

    def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> Plan[MessageRecord]:
        check_message(run_id, name, payload, message_id, by)
        return (yield from self._keep(run_id, name, payload, message_id, by, answered_wait(name, wait)))

    def _keep(
        self, run_id: str, name: str, payload: JSON, message_id: str | None, by: str | None, wait: str | None
    ) -> Plan[MessageRecord]:
        """Keep a message — queued by name, or (``wait``) an answer to that wait."""
        # The row lock first, in a statement of its own: a gate or another sender holding it has
        # committed (its run waits, took what was there, or keeps its answer) by the time the
        # statements below read.
        run = yield from self.locked_run(run_id)
        if message_id is not None:
            kept = yield _q("send_message_existing", run_id=run_id, message_id=message_id)
            if kept:
                return redelivered((yield from self.message(kept[0])), name, payload, wait)
        refused, now = refused_send(run_id, name, run.status), None
        if refused is None and wait is not None:
            read = yield from self._wait_read(run_id, wait, name)
            now = yield from self.now()
            refused = refused_answer(run, wait, name, read, now)
        if refused is not None:
            raise refused
        seq = yield from message_seq(self)
        text, ref = yield from self._put_value(payload, "safepoint_messages", "payload", run_id, name, seq)
        rows = yield _q(
            "send_message",
            seq=seq,
            run_id=run_id,
            name=name,
            message_id=message_id,
            payload=text,
            payload_ref=ref,
            sent_by=by,
            for_wait=wait,
            now=now,
        )
        message = yield from self.message(rows[0])
        woke = wakes(run.status, run.waiting_for, name) if wait is None else answer_wakes(run, wait)
        yield _q(
            "send_message_wake", run_id=run_id, wake=woke, by=by, detail=dumps(sent_detail(message, woke))
        )
        if woke:  # claimable again: wake a waiting worker
            yield from self.wake_workers(run.workflow)
        return message

    def _wait_read(self, run_id: str, wait: str, name: str) -> Plan[WaitRead]:
        """What an answer to ``wait`` is decided on (``_rules.answers.refused_answer``)."""
        step = yield _q("answer_wait_step", run_id=run_id, step_id=wait)
        answered = yield _q("answer_wait_answered", run_id=run_id, step_id=wait)
        started = yield _q(
            "await_message_timeout", run_id=run_id, step_id=wait, input_hash=input_hash(wait_inputs(name))
        )
        message = (yield from self.message(answered[0])) if answered else None
        return wait_read(step[0] if step else None, message, started[0]["retry_at"] if started else None)

    def await_message(
        self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None
    ) -> Plan[tuple[WaitGate, HistoryWarning | None]]:
        owned = yield from self._fenced(claim, "wait_fence")  # the row lock, before any look
        now = int(owned["now"])
        started = yield _q(
            "await_message_timeout", run_id=claim.run_id, step_id=step.step_id, input_hash=step.input_hash
        )
        timeout_at = timeout_instant(started[0]["retry_at"] if started else None, now, timeout_ms)
        rows = yield _q(
            "await_message_oldest",
            run_id=claim.run_id,
            name=name,
            step_id=step.step_id,
            timeout_at=timeout_at,
        )
        oldest = (yield from self.message(rows[0])) if rows else None
        plan = plan_wait(step, claim.fence, name, now, timeout_at, first=not started, oldest=oldest)
        stored = (rows[0]["payload"], rows[0]["payload_ref"]) if rows else (None, None)
        if self.codec is not None and oldest is not None and stored[0] is not None:
            # sealed for the message's row: sealed again for the step's
            stored = (
                self._sealed(oldest.payload, "safepoint_steps", "result", claim.run_id, step.step_id),
                None,
            )
        due = yield from self._carry_out(claim, plan, now, stored)
        return plan.gate, due

    def await_timer(
        self, claim: Claim, step: StepRecord, duration_ms: int
    ) -> Plan[tuple[WaitGate, HistoryWarning | None]]:
        owned = yield from self._fenced(claim, "wait_fence")
        now = int(owned["now"])
        found = yield _q("await_timer_step", run_id=claim.run_id, step_id=step.step_id)
        key = f"{claim.run_id}/{step.step_id}"
        sealed = None if self.codec is None else (self.codec, "result", (claim.run_id, step.step_id))
        recorded = stored_json(found[0]["result"], "safepoint_steps", key, sealed) if found else None
        plan = plan_sleep(step, claim.fence, now, recorded, duration_ms)
        assert plan.gate.step is not None
        result = self._sealed(plan.gate.step.result, "safepoint_steps", "result", claim.run_id, step.step_id)
        due = yield from self._carry_out(claim, plan, now, (result, None))
        return plan.gate, due

    def _carry_out(
        self, claim: Claim, plan: GatePlan, now: int, stored: tuple[str | None, str | None]
    ) -> Plan[HistoryWarning | None]:
        """Write what a gate decided (``stored``: the recorded step's result as text or
        artifact reference), under the row lock ``wait_fence`` took; the history it adds is
        counted, with the soft limit's warning when it falls due."""
        gate, due = plan.gate, None
        if gate.message is not None:
            yield _q(
                "await_message_take",
                run_id=claim.run_id,
                seq=gate.message.seq,
                step_id=gate.message.taken_by,
                now=now,
            )
        if plan.record and gate.step is not None:
            yield from self._wait_step(gate.step, *stored)
            if plan.event is not None:
                kind, detail = plan.event
                yield _q(
                    "wait_event",
                    run_id=claim.run_id,
                    now=now,
                    kind=kind,
                    step_id=gate.step.step_id,
                    fence=claim.fence,
                    worker=claim.owner,
                    detail=dumps(detail),
                )
            events = int(plan.event is not None)
            counted = yield _q("wait_count", run_id=claim.run_id, fence=claim.fence, events=events, steps=1)
            due = yield from self._history_warning(claim, counted[0])
        if plan.started is not None:
            started = plan.started
            yield _q(
                "await_message_started",
                run_id=started.run_id,
                step_id=started.step_id,
                name=started.name,
                input_hash=started.input_hash,
                error=dumps(started.error),
                retry_at=started.retry_at,
                fence=started.fence,
                now=started.recorded_at,
            )
        if gate.waiting_for is not None:
            yield from self._wait_until_woken(claim, gate.waiting_for)
        return due

    def _wait_step(self, step: StepRecord, result: str | None, ref: str | None) -> Plan[None]:
        yield _q(
            "wait_step",
            run_id=step.run_id,
            step_id=step.step_id,
            seq=step.seq,
            name=step.name,
            input_hash=step.input_hash,
            status=step.status.value,
            result=result,
            result_ref=ref,
            error=self._sealed(step.error, "safepoint_steps", "error", step.run_id, step.step_id),
            fence=step.fence,
            now=step.recorded_at,
        )

    def _wait_until_woken(self, claim: Claim, waiting: dict[str, Any]) -> Plan[None]:
        due = wake_at(waiting)
        row = yield from self._fenced(
            claim,
            "wait_until_woken",
            new_work=False,
            waiting_for=dumps(waiting),
            wake_at=due,
            step_id=str(waiting["step_id"]),
        )
        if due is not None:  # idle workers wait no longer than until it is due: tell them
            yield from self.wake_workers(row["workflow"])

    @staticmethod
    def wait_for_work_due() -> Plan[float | None]:
        """Seconds until the next waiting run falls due (None: none is due at a time)."""
        rows = yield _q("wait_for_work_due")
        due = rows[0]["due_ms"] if rows else None
        return None if due is None else int(due) / 1000
