"""Sending a run a message: ``send`` and ``send_async`` (a mailbox message, queued by name) and
``answer`` and ``answer_async`` (an answer to one wait, kept once), the verbs that deliver what
a ``run.wait_for`` waits for (the wait's flow is ``waits``'; the decisions ``_rules.waits``' and
``_rules.answers``')."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._rules.answers import answered_wait
from .._rules.ids import check_run_id
from .._rules.waits import check_message
from ..storage.base import Store
from ..types import JSON, MessageRecord
from .flow import Flow, adrive, drive, io, require_store
from .lifecycle import chain_head

if TYPE_CHECKING:
    from ..storage.base import AsyncStore


def send(
    store: Store,
    run_id: str,
    name: str,
    payload: JSON,
    /,
    *,
    message_id: str | None = None,
    by: str | None = None,
) -> MessageRecord:
    """Send the run ``run_id`` a message: ``payload`` (JSON: a person's answer, a webhook's
    body) under ``name``, which its workflow waits for with ``run.wait_for(name)``. Returns the
    message as kept.

    A mailbox message: it is kept whether the run waits yet or not, and queues — a wait takes
    the oldest message of its name not yet taken, so a message sent early is not lost and a
    second one of the same name waits for the next wait (a chat: every line is read, in order).
    To answer the one question a run is parked at, so that a second answer to it is refused
    rather than kept for the next wait, use ``answer``. A run waiting for a message of this name
    becomes runnable at once (workers are woken; or ``resume`` it). ``message_id`` (a webhook's
    delivery id, say) makes a re-delivery harmless: the message kept under that id is returned,
    nothing is added — and the id sent with another name or payload is ``MessageRefused``. A
    payload holding a credential is refused (``SecretRefused``), one that is not JSON is
    ``NotJSON``; a run that ended (completed, failed, cancelled) refuses it
    (``MessageRefused``); ``RunNotFound`` for no such run. A run that continued as new passes
    the message on to the run that carries its chain on. ``by`` (who sent it) is recorded with
    it.

    At most once: per delivery — one message per ``message_id`` in the run, decided in the
    transaction that keeps it. A message sent twice without an id is two messages.

    >>> send(store, "refund-8472", "manager.answer", {"approved": True}, by="ana")  # doctest: +SKIP
    """
    require_store(store, "send")
    check_message(check_run_id(run_id), name, payload, message_id, by)
    message: MessageRecord = drive(store, _send_flow(run_id, name, payload, message_id, by))
    return message


async def send_async(
    store: Store | AsyncStore,
    run_id: str,
    name: str,
    payload: JSON,
    /,
    *,
    message_id: str | None = None,
    by: str | None = None,
) -> MessageRecord:
    """``send`` from async code."""
    require_store(store, "send_async")
    check_message(check_run_id(run_id), name, payload, message_id, by)
    message: MessageRecord = await adrive(store, _send_flow(run_id, name, payload, message_id, by))
    return message


def _send_flow(
    run_id: str, name: str, payload: JSON, message_id: str | None, by: str | None
) -> Flow[MessageRecord]:
    run = yield from chain_head((yield from io(Store.get_run, run_id)))
    return (yield from io(Store.send_message, run.run_id, name, payload, message_id, by))


def answer(
    store: Store,
    run_id: str,
    name: str,
    payload: JSON,
    /,
    *,
    wait: str | None = None,
    message_id: str | None = None,
    by: str | None = None,
) -> MessageRecord:
    """Answer one wait of the run ``run_id``: ``payload`` for its ``run.wait_for(name)`` at the
    wait step ``wait`` — its step id, as ``AwaitingMessage.step_id``, ``waiting_for["step_id"]``
    and ``safepoint show`` name it (default: ``name``, the id of the first wait of that name; the
    next is ``name#2``, …). Returns the answer as kept.

    That wait takes the answer, before any message of its name queued with ``send``, and no
    other wait does. A run parked at that wait becomes runnable at once; an answer to a wait the
    run has not reached yet is kept for it (address the next wait explicitly to answer ahead).

    At most once: a wait takes one answer. An answer to a wait that has one kept already, took a
    message, or timed out is refused — ``WaitAnswered``, naming the wait, who answered it and
    when, and the wait the run is parked at now — and nothing is kept, so two people answering
    the one question, or a webhook retried without its delivery id, release the wait once. The
    store decides it under the run's row lock, in the transaction that keeps the answer, and
    keeps one answer per wait by a unique index besides: k senders at the same instant keep
    one. ``message_id`` makes a re-delivery return the answer kept under it (the same answer to
    the same wait; else ``MessageRefused``). A step that is no wait for messages ``name``, a run
    that ended, and a payload that is not JSON or holds a credential are refused as ``send``
    refuses them; a run that continued as new passes the answer on to the run that carries its
    chain on.

    >>> answer(store, "refund-8472", "manager.answer", {"approved": True}, by="ana")  # doctest: +SKIP
    >>> answer(store, "loop-7", "approve", True, wait="approve#3", by="ana")  # doctest: +SKIP
    """
    require_store(store, "answer")
    check_message(check_run_id(run_id), name, payload, message_id, by)
    kept: MessageRecord = drive(
        store, _answer_flow(run_id, answered_wait(name, wait), name, payload, message_id, by)
    )
    return kept


async def answer_async(
    store: Store | AsyncStore,
    run_id: str,
    name: str,
    payload: JSON,
    /,
    *,
    wait: str | None = None,
    message_id: str | None = None,
    by: str | None = None,
) -> MessageRecord:
    """``answer`` from async code."""
    require_store(store, "answer_async")
    check_message(check_run_id(run_id), name, payload, message_id, by)
    flow = _answer_flow(run_id, answered_wait(name, wait), name, payload, message_id, by)
    kept: MessageRecord = await adrive(store, flow)
    return kept


def _answer_flow(
    run_id: str, wait: str, name: str, payload: JSON, message_id: str | None, by: str | None
) -> Flow[MessageRecord]:
    run = yield from chain_head((yield from io(Store.get_run, run_id)))
    return (yield from io(Store.answer_wait, run.run_id, wait, name, payload, message_id, by))
