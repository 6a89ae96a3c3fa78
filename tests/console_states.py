"""A ledger holding runs in every state an operator meets, built through the public API only:
what the console's browser tests drive and its screenshots show.

``build_states(store)`` makes one run of each kind in ``STATES`` and returns their run ids by
state. Nothing here talks to a network: the effects are in-process owners, and the crashes are
the in-process crash points (``safepoint.testing.crash_at``), which leave a run exactly as a
killed worker would.
"""

from __future__ import annotations

import contextlib
import time
from datetime import timedelta
from typing import Any

import safepoint as sp
from safepoint.testing import SimulatedCrash, crash_at

STATES = (
    "completed",
    "failed",
    "blocked",
    "approval",
    "stopped",
    "message",
    "timer",
    "live",
    "dead",
    "cancelled",
    "chain",
    "fork",
)


def _receipt(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
    return {"id": f"ok_{key.operation_id}", "payload": payload}


def _unsure(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
    raise TimeoutError("the carrier's API timed out after the request was sent")


def _cannot_tell(key: sp.EffectKey) -> sp.Unknown:
    return sp.Unknown("the carrier's tracking API has no record yet and cannot say")


emails = sp.Effect("email", execute=_receipt, reconcile=lambda key: sp.NotApplied())
refunds = sp.Effect("refund", execute=_receipt, reconcile=lambda key: sp.NotApplied())
shipments = sp.Effect("shipment", execute=_unsure, reconcile=_cannot_tell)


def _answer(**kwargs: Any) -> dict[str, Any]:
    return {
        "text": "the customer asks for a refund of order 1042",
        "usage": {"input_tokens": 120, "output_tokens": 40},
    }


@sp.workflow("support-ticket")
def support_ticket(run: sp.Run, ticket: str) -> dict[str, Any]:
    summary = run.model("summarize", _answer, model="m-small", messages=[{"role": "user", "content": ticket}])
    run.pure("classify", lambda: {"intent": "refund", "confidence": 0.93})
    sent = run.effect("reply", emails, payload={"to": "ana@example.com", "body": summary["text"]})
    return {"replied": sent["id"]}


@sp.workflow("refund-order")
def refund_order(run: sp.Run, order: str, amount: int) -> dict[str, Any]:
    run.read("order", lambda: {"order": order, "paid": amount, "currency": "EUR"})
    return run.effect(
        "refund", refunds, payload={"order": order, "amount": amount, "currency": "EUR"}, approval=True
    )


@sp.workflow("ship-order")
def ship_order(run: sp.Run, order: str) -> Any:
    run.read("address", lambda: {"street": "Calle Mayor 1", "city": "Madrid"})
    return run.effect(
        "ship", shipments, payload={"order": order, "carrier": "fastship"}, operation_id=f"ship:{order}"
    )


@sp.workflow("triage", budget=sp.Budget(tokens=300))
def triage(run: sp.Run) -> int:
    for turn in range(3):
        run.model(f"turn.{turn}", _answer, model="m-large", messages=[])
    return 3


@sp.workflow("await-manager")
def await_manager(run: sp.Run) -> Any:
    run.pure("draft", lambda: {"draft": "refund 40 EUR"})
    return {"said": run.wait_for("manager.answer", timeout=3600)}


@sp.workflow("nightly-report")
def nightly_report(run: sp.Run) -> str:
    run.pure("collect", lambda: {"rows": 1200})
    run.sleep(timedelta(hours=6), step_id="wait-for-night")
    return "sent"


def _fails(order: str) -> dict[str, Any]:
    raise ValueError(f"order {order} has no invoice address")


@sp.workflow("invoice")
def invoice(run: sp.Run, order: str) -> Any:
    run.read("customer", lambda: {"name": "Ana", "vat": "ES-B123"})
    return run.decide("invoice", _fails, order)


@sp.workflow("crawl")
def crawl(run: sp.Run, page: int) -> Any:
    run.pure(f"fetch-{page}", lambda: {"page": page, "links": 12})
    if page < 3:
        run.continue_as_new(page + 1)
    return {"pages": page}


def _crash(spec: str, call: Any) -> None:
    with crash_at(spec), contextlib.suppress(SimulatedCrash):
        call()


def build_states(store: sp.Store) -> dict[str, str]:
    """One run of each state in ``STATES`` (ids by state); ``chain`` names the chain's first run
    and ``fork`` the fork (its source is ``completed``)."""
    ids: dict[str, str] = {}
    ids["completed"] = "ticket-1042"
    sp.start(store, support_ticket, "Where is my refund for order 1042?", run_id=ids["completed"])
    ids["failed"] = "invoice-2031"
    with contextlib.suppress(sp.StepFailed):
        sp.start(store, invoice, "2031", run_id=ids["failed"])
    ids["blocked"] = "ship-order-77"
    with contextlib.suppress(sp.RunBlocked):
        sp.start(store, ship_order, "77", run_id=ids["blocked"])
    ids["approval"] = "refund-order-1042"
    with contextlib.suppress(sp.AwaitingApproval):
        sp.start(store, refund_order, "1042", 40, run_id=ids["approval"])
    ids["stopped"] = "triage-9"
    with contextlib.suppress(sp.LimitReached):
        sp.start(store, triage, run_id=ids["stopped"])
    ids["message"] = "await-manager-5"
    with contextlib.suppress(sp.RunWaiting):
        sp.start(store, await_manager, run_id=ids["message"])
    ids["timer"] = "nightly-report-12"
    with contextlib.suppress(sp.RunWaiting):
        sp.start(store, nightly_report, run_id=ids["timer"])
    ids["live"] = "ticket-1043"
    _crash("run.after_start", lambda: sp.start(store, support_ticket, "A second ticket", run_id=ids["live"]))
    ids["dead"] = "ticket-1044"
    _crash(
        "run.after_start",
        lambda: sp.start(store, support_ticket, "A third ticket", run_id=ids["dead"], lease_ms=1),
    )
    ids["cancelled"] = "ticket-1045"
    sp.submit(store, support_ticket, "Never mind", run_id=ids["cancelled"])
    sp.cancel(store, ids["cancelled"], by="ana", reason="the customer withdrew it")
    ids["chain"] = "crawl-site"
    sp.start(store, crawl, 1, run_id=ids["chain"])
    made = sp.fork(store, ids["completed"], from_step="reply", by="ana", reason="reply again, in Spanish")
    ids["fork"] = made.run_id
    time.sleep(0.005)  # the dead run's 1 ms lease is over
    return ids
