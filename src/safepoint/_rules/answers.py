"""Answers: a message addressed to one wait of a run, taken by that wait alone and kept once
for it — the decisions, as small I/O-free functions (the wait's own are ``waits``').

A run asks a question with ``run.wait_for(name)``: the wait step parks the run until a message
of that name comes. What comes is one of two things, and only the sender knows which:

- a **mailbox message** (``safepoint.send``): a message *to the run*, that queues — the next
  wait of its name takes the oldest one not yet taken, whenever it comes. A chat is this: a
  person sends two lines while the agent is busy, and the next two turns read them in order.
  At most once means once per delivery: a ``message_id`` kept once per run.
- an **answer** (``safepoint.answer``): a message *to one wait* — the question that is parked,
  named by its step id (``AwaitingMessage.step_id``, ``waiting_for["step_id"]``; the first wait
  of a name has the name as its id, the next ``name#2``, …). That wait takes it, before anything
  queued by name, and no other wait does. A wait takes one answer: an answer to a wait that has
  one kept already, took a message, or timed out, is refused (``WaitAnswered``, naming the wait,
  who answered it and when) and nothing is kept — two people answering the one question, or a
  webhook retried without its delivery id, release it once. An answer to a wait the run has not
  reached yet is kept for it: the sender addresses the next wait explicitly.

The store reads what these functions decide on under the run's row lock (PostgreSQL) or in its
one writing transaction (SQLite), in the transaction that keeps the answer, and a unique index
keeps one answer per wait besides: k senders at the same instant keep one answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import MessageRefused, WaitAnswered
from ..types import MessageRecord, RunRecord, RunStatus, StepKind, StepStatus
from .ids import check_id
from .moments import instant
from .waits import MESSAGE, wait_step_name, waiting_kind

_OCCURRENCE = re.compile(r"^(?P<base>.*)#(?P<n>[0-9]+)$")


def answered_wait(name: str, wait: str | None) -> str:
    """The wait an answer is addressed to, checked: ``wait`` as given, else the first wait of
    messages ``name`` (its step id is the name itself)."""
    return check_id(name if wait is None else wait, "wait (the wait step's id)")


def next_wait(wait: str) -> str:
    """The step id of the next wait after ``wait`` with the same id as the workflow wrote it
    (``answer`` → ``answer#2`` → ``answer#3``)."""
    found = _OCCURRENCE.match(wait)
    if found is None:
        return f"{wait}#2"
    return f"{found['base']}#{int(found['n']) + 1}"


@dataclass(frozen=True, slots=True)
class WaitRead:
    """What the store read of the wait an answer is addressed to: its step as recorded (kind,
    name, status; None: not recorded), the message that answered it (the answer kept for it,
    or the message it took), and the timeout instant recorded when it first waited."""

    kind: StepKind | None = None
    step_name: str | None = None
    status: StepStatus | None = None
    answered: MessageRecord | None = None
    timeout_at: int | None = None


def refused_answer(run: RunRecord, wait: str, name: str, read: WaitRead, now: int) -> MessageRefused | None:
    """Why an answer ``name`` to the wait ``wait`` of ``run`` is not kept (None: it is), as the
    store read them under the run's lock at ``now`` (the run's own endings are ``waits.
    refused_send``'s): a step that is no wait for messages ``name``, or a wait that has had its
    answer — one kept for it, a message it took, or its timeout (``WaitAnswered``)."""
    waiting = _parked(run)
    if read.kind is not None and (read.kind is not StepKind.WAIT or read.step_name != wait_step_name(name)):
        return MessageRefused(run.run_id, name, _not_this_wait(wait, name, read))
    if waiting is not None and waiting.get("step_id") == wait and waiting.get("name") != name:
        return MessageRefused(
            run.run_id,
            name,
            f"wait {wait!r} waits for messages {waiting.get('name')!r}, not {name!r}:"
            " answer it under that name",
        )
    waits_at = str(waiting["step_id"]) if waiting is not None and waiting.get("name") == name else None
    if read.answered is not None or (read.kind is not None and read.status is not StepStatus.FAILED):
        by = read.answered.sent_by if read.answered is not None else None
        at = read.answered.sent_at if read.answered is not None else None
        which = f" (message #{read.answered.seq})" if read.answered is not None else ""
        return WaitAnswered(
            run.run_id,
            name,
            f"wait {wait!r} was answered already{f' by {by}' if by else ''}"
            f"{f' at {instant(at)}' if at is not None else ''}{which}: a wait takes one answer,"
            " and nothing was kept" + _what_next(wait, name, waits_at),
            step_id=wait,
            answered_by=by,
            answered_at=at,
            waits_at=waits_at,
        )
    # a wait step is recorded failed only when it timed out; one that waited with a timeout
    # takes no message sent at or after that instant
    timeout_at = read.timeout_at
    if read.status is StepStatus.FAILED or (timeout_at is not None and now >= timeout_at):
        when = f" at {instant(timeout_at)}" if timeout_at is not None else ""
        return WaitAnswered(
            run.run_id,
            name,
            f"wait {wait!r} timed out{when}: nothing reads an answer to it now, and nothing was kept"
            + _what_next(wait, name, waits_at),
            step_id=wait,
            answered_at=timeout_at,
            timed_out=True,
            waits_at=waits_at,
        )
    return None


def answer_wakes(run: RunRecord, wait: str) -> bool:
    """Whether an answer to ``wait`` releases the run: it is parked at exactly that wait."""
    waiting = _parked(run)
    return waiting is not None and waiting.get("step_id") == wait


def _parked(run: RunRecord) -> dict[str, Any] | None:
    """What the run is parked at, when it waits for a message now (None: it does not)."""
    if run.status is RunStatus.WAITING and waiting_kind(run.waiting_for) == MESSAGE:
        return run.waiting_for
    return None


def _what_next(wait: str, name: str, waits_at: str | None) -> str:
    """What a refused sender may do instead: answer the wait parked now (or the next one),
    or queue a mailbox message."""
    then = waits_at if waits_at is not None and waits_at != wait else next_wait(wait)
    parked = f" (the run waits at {then!r} now)" if then == waits_at else ""
    return (
        f". To answer the next wait of {name!r}{parked}, address it: wait={then!r}; to queue a message"
        f" for whichever wait of {name!r} comes next, send it (safepoint send)"
    )


def _not_this_wait(wait: str, name: str, read: WaitRead) -> str:
    if read.kind is not StepKind.WAIT or not (read.step_name or "").startswith("message:"):
        what = "a sleep" if read.kind is StepKind.WAIT else f"a {read.kind.value if read.kind else '?'} step"
        return (
            f"step {wait!r} is {what}, not a wait for messages: address the wait step the run"
            " waits at (`safepoint show` names it)"
        )
    waits_for = (read.step_name or "").removeprefix("message:")
    return f"wait {wait!r} waits for messages {waits_for!r}, not {name!r}: answer it under that name"
