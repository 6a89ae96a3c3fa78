"""Sending a run a message: ``send`` and ``send_async``, the verbs that deliver what a
``run.wait_for`` waits for (the wait's flow is ``waits``'; the decisions ``_rules.waits``')."""

from __future__ import annotations

from typing import TYPE_CHECKING

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

    The message is kept whether the run waits yet or not: a wait takes the oldest message of its
    name not yet taken, so a message sent early is not lost and a second one of the same name
    waits for the next wait. A run waiting for a message of this name becomes runnable at once
    (workers are woken; or ``resume`` it). ``message_id`` (a webhook's delivery id, say) makes a
    re-delivery harmless: the message kept under that id is returned, nothing is added — and the
    id sent with another name or payload is ``MessageRefused``. A payload holding a credential
    is refused (``SecretRefused``), one that is not JSON is ``NotJSON``; a run that ended
    (completed, failed, cancelled) refuses it (``MessageRefused``); ``RunNotFound`` for no such
    run. A run that continued as new passes the message on to the run that carries its chain
    on. ``by`` (who sent it) is recorded with it.

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
