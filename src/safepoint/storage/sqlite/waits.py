"""The SQLite store's waits: messages sent to a run, and the gates of its wait and sleep steps —
each one ``BEGIN IMMEDIATE`` transaction, so a send and a worker about to wait are serialised
(the decisions are in ``safepoint._rules.waits``)."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

from ..._rules.answers import WaitRead, answer_wakes, answered_wait, refused_answer
from ..._rules.canonical import dumps, input_hash
from ..._rules.history import warn
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
from ..._rules.waking import WorkWait
from ...errors import HistoryWarning
from ...types import JSON, AttemptRecord, Claim, MessageRecord, StepRecord, WaitGate
from .._rows import stored_json, wait_read
from ..ledger import message_seq
from .connection import SQL
from .runs import SqliteRuns

# How often an idle SQLite wait looks at PRAGMA data_version: a commit anywhere is news.
_WAKE_POLL_S = 0.005


class SqliteWaits(SqliteRuns):
    """Messages, and the gates of wait and sleep steps."""

    def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> MessageRecord:
        check_message(run_id, name, payload, message_id, by)
        return self._keep(run_id, name, payload, message_id, by, None)

    def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> MessageRecord:
        check_message(run_id, name, payload, message_id, by)
        return self._keep(run_id, name, payload, message_id, by, answered_wait(name, wait))

    def _keep(
        self, run_id: str, name: str, payload: JSON, message_id: str | None, by: str | None, wait: str | None
    ) -> MessageRecord:
        """Keep a message — queued by name, or (``wait``) an answer to that wait — in one BEGIN
        IMMEDIATE transaction, serialised with ``await_message`` and every other sender."""
        now = self.now()
        with self._write() as conn:
            run = self._within(conn, self._ledger.locked_run(run_id))
            if message_id is not None:
                kept = conn.execute(
                    SQL["send_message_existing"], {"run_id": run_id, "message_id": message_id}
                ).fetchone()
                if kept is not None:
                    return redelivered(self._message(conn, kept), name, payload, wait)
            refused = refused_send(run_id, name, run.status)
            if refused is None and wait is not None:
                refused = refused_answer(run, wait, name, self._wait_read(conn, run_id, wait, name), now)
            if refused is not None:
                raise refused
            seq = self._within(conn, message_seq(self._ledger))
            text, ref = self._put_value(
                conn, payload, now, "safepoint_messages", "payload", run_id, name, seq
            )
            row = conn.execute(
                SQL["send_message"],
                {
                    "seq": seq,
                    "run_id": run_id,
                    "name": name,
                    "message_id": message_id,
                    "payload": text,
                    "payload_ref": ref,
                    "sent_by": by,
                    "now": now,
                    "for_wait": wait,
                },
            ).fetchone()
            message = self._message(conn, row)
            woke = wakes(run.status, run.waiting_for, name) if wait is None else answer_wakes(run, wait)
            conn.execute(SQL["send_message_wake"], {"run_id": run_id, "wake": woke, "now": now})
            self._event(conn, run_id, now, "message.sent", worker=by, detail=sent_detail(message, woke))
        return message

    def _wait_read(self, conn: sqlite3.Connection, run_id: str, wait: str, name: str) -> WaitRead:
        """What an answer to ``wait`` is decided on (``_rules.answers.refused_answer``)."""
        keys = {"run_id": run_id, "step_id": wait}
        step = conn.execute(SQL["answer_wait_step"], keys).fetchone()
        answered = conn.execute(SQL["answer_wait_answered"], keys).fetchone()
        started = conn.execute(
            SQL["await_message_timeout"], {**keys, "input_hash": input_hash(wait_inputs(name))}
        ).fetchone()
        message = None if answered is None else self._message(conn, answered)
        return wait_read(step, message, None if started is None else started["retry_at"])

    def _message(self, conn: sqlite3.Connection, row: sqlite3.Row) -> MessageRecord:
        return self._within(conn, self._ledger.message(row))

    def await_message(self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None) -> WaitGate:
        now = self.now()
        keys = {"run_id": claim.run_id, "step_id": step.step_id}
        with self._write() as conn:  # BEGIN IMMEDIATE: serialised with send_message
            # Reads first: the whole ledger is this transaction's, so the fence checked below
            # (which counts what the write adds) cannot be overtaken by anyone.
            started = conn.execute(
                SQL["await_message_timeout"], {**keys, "input_hash": step.input_hash}
            ).fetchone()
            timeout_at = timeout_instant(started["retry_at"] if started else None, now, timeout_ms)
            row = conn.execute(
                SQL["await_message_oldest"],
                {"run_id": claim.run_id, "name": name, "step_id": step.step_id, "timeout_at": timeout_at},
            ).fetchone()
            oldest = None if row is None else self._message(conn, row)
            plan = plan_wait(step, claim.fence, name, now, timeout_at, first=started is None, oldest=oldest)
            stored = (None, None) if row is None else (row["payload"], row["payload_ref"])
            if self.codec is not None and oldest is not None and stored[0] is not None:
                # sealed for the message's row: sealed again for the step's
                stored = (self._sealed(oldest.payload, "safepoint_steps", "result", *keys.values()), None)
            due = self._carry_out(conn, claim, plan, now, stored)
        warn(due)
        return plan.gate

    def await_timer(self, claim: Claim, step: StepRecord, duration_ms: int) -> WaitGate:
        now = self.now()
        with self._write() as conn:
            found = conn.execute(
                SQL["await_timer_step"], {"run_id": claim.run_id, "step_id": step.step_id}
            ).fetchone()
            key = f"{claim.run_id}/{step.step_id}"
            sealed = None if self.codec is None else (self.codec, "result", (claim.run_id, step.step_id))
            recorded = None if found is None else stored_json(found["result"], "safepoint_steps", key, sealed)
            plan = plan_sleep(step, claim.fence, now, recorded, duration_ms)
            assert plan.gate.step is not None
            result = self._sealed(
                plan.gate.step.result, "safepoint_steps", "result", claim.run_id, step.step_id
            )
            due = self._carry_out(conn, claim, plan, now, (result, None))
        warn(due)
        return plan.gate

    def _carry_out(
        self,
        conn: sqlite3.Connection,
        claim: Claim,
        plan: GatePlan,
        now: int,
        stored: tuple[str | None, str | None],
    ) -> HistoryWarning | None:
        """Write what a gate decided (``stored``: the recorded step's result as text or
        artifact reference), after the fence, which counts it."""
        gate, step = plan.gate, plan.gate.step
        new = step if plan.record else None
        due = self._fence_check(conn, claim, now, events=int(plan.event is not None), step=new, new_work=True)
        if gate.message is not None:
            conn.execute(
                SQL["await_message_take"],
                {"seq": gate.message.seq, "step_id": gate.message.taken_by, "now": now},
            )
        if new is not None:
            self._wait_step(conn, new, *stored)
        if new is not None and plan.event is not None:
            kind, detail = plan.event
            self._event(
                conn,
                claim.run_id,
                now,
                kind,
                step_id=new.step_id,
                fence=claim.fence,
                worker=claim.owner,
                detail=detail,
            )
        if plan.started is not None:
            self._record_start(conn, plan.started)
        if gate.waiting_for is not None:
            self._wait_until_woken(conn, claim, gate.waiting_for, now)
        return due

    @staticmethod
    def _record_start(conn: sqlite3.Connection, started: AttemptRecord) -> None:
        conn.execute(
            SQL["await_message_started"],
            {
                "run_id": started.run_id,
                "step_id": started.step_id,
                "name": started.name,
                "input_hash": started.input_hash,
                "error": dumps(started.error),
                "retry_at": started.retry_at,
                "fence": started.fence,
                "now": started.recorded_at,
            },
        )

    def _wait_step(
        self, conn: sqlite3.Connection, step: StepRecord, result: str | None, ref: str | None
    ) -> None:
        conn.execute(
            SQL["wait_step"],
            {
                "run_id": step.run_id,
                "step_id": step.step_id,
                "seq": step.seq,
                "name": step.name,
                "input_hash": step.input_hash,
                "status": step.status.value,
                "result": result,
                "result_ref": ref,
                "error": self._sealed(step.error, "safepoint_steps", "error", step.run_id, step.step_id),
                "fence": step.fence,
                "now": step.recorded_at,
            },
        )

    def _wait_until_woken(
        self, conn: sqlite3.Connection, claim: Claim, waiting: dict[str, Any], now: int
    ) -> None:
        conn.execute(
            SQL["wait_until_woken"],
            {
                "run_id": claim.run_id,
                "fence": claim.fence,
                "waiting_for": dumps(waiting),
                "wake_at": wake_at(waiting),
                "now": now,
            },
        )
        self._event(
            conn,
            claim.run_id,
            now,
            "run.waiting",
            step_id=str(waiting["step_id"]),
            fence=claim.fence,
            worker=claim.owner,
            detail=waiting,
            clear=True,  # a message's name, a timer's instant: nothing of the caller's
        )

    def wait_for_work(
        self, timeout: float, stop: threading.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        """SQLite has no notifications, but ``PRAGMA data_version`` changes whenever another
        connection commits: a cheap in-memory check, polled often, wakes workers promptly; no
        commit announces a waiting run falling due, so the wait ends then at the latest."""
        conn = self._conn()
        seen = conn.execute("PRAGMA data_version").fetchone()[0]
        due_in = self._due_in()  # then the clock: the wait never ends before the due time
        wait = WorkWait.begin(time.monotonic(), timeout, quiet, due_in)
        while True:
            now = time.monotonic()
            if wait.rereading(now):
                due_in = self._due_in()
                wait.due_read(time.monotonic(), due_in)
            if now >= wait.end():
                return wait.heard
            piece = min(wait.next_look() - now, _WAKE_POLL_S)
            if stop is None:
                time.sleep(piece)
            elif stop.wait(piece):
                return wait.heard
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            if version != seen:
                seen = version
                wait.news(time.monotonic())

    def _due_in(self) -> float | None:
        """Seconds until the next waiting run falls due (None: none waits for a time)."""
        now = self.now()
        try:
            row = self._conn().execute(SQL["wait_for_work_due"], {"now": now}).fetchone()
        except sqlite3.Error:  # never raises: the caller's next claim reports a broken store
            return None
        return None if row is None or row["wake_at"] is None else (int(row["wake_at"]) - now) / 1000
