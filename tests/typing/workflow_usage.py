"""Checked by mypy --strict from the user's side (``make lint``; tests/unit/test_typed_usage.py):
a support agent's workflow, plain and async, written as a user writes one. Each step returns
its function's type (a ``read`` of ``fetch_case`` is a ``Case``, an effect returns its execute's
receipt), payloads and messages are JSON as the user builds it (``dict[str, int]`` included),
and the lines marked ``# type: ignore[<code>]`` are mistakes mypy must keep catching: strict
mode warns about an ignore that has nothing left to ignore, so a regression fails the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import safepoint as sp
from safepoint.types import JSON, AsyncTransaction, Transaction

Case = dict[str, str]


# -- what the agent calls ------------------------------------------------------------------------


def fetch_case(case_id: str) -> Case:
    return {"id": case_id, "customer": "c-17", "text": "my invoice is wrong"}


async def fetch_case_async(case_id: str) -> Case:
    return fetch_case(case_id)


def word_count(text: str, *, minimum: int = 0) -> int:
    return max(minimum, len(text.split()))


def draft_reply(
    *, model: str, messages: JSON, tools: JSON = None, temperature: float = 0.0
) -> dict[str, Any]:
    return {"model": model, "content": "We are on it.", "usage": {"total_tokens": 12}}


async def draft_reply_async(*, model: str, messages: JSON, tools: JSON = None) -> dict[str, Any]:
    return draft_reply(model=model, messages=messages, tools=tools)


def choose_route(reply: Mapping[str, Any]) -> str:
    return "billing" if "invoice" in str(reply.get("content")) else "general"


def price_of(region: str) -> float:
    return {"eu": 9.0, "us": 10.0}[region]


def create_ticket(payload: dict[str, Any], key: sp.EffectKey) -> dict[str, str]:
    return {"id": f"T-{key}", "title": str(payload.get("title"))}


def find_ticket(key: sp.EffectKey) -> sp.Applied | sp.NotApplied | sp.Unknown:
    return sp.NotApplied()


async def create_ticket_async(payload: dict[str, Any], key: sp.EffectKey) -> dict[str, str]:
    return create_ticket(payload, key)


tickets = sp.Effect(
    "typing.ticket.create", execute=create_ticket, reconcile=find_ticket, dedup_retention=timedelta(hours=23)
)
async_tickets = sp.Effect("typing.ticket.create.async", execute=create_ticket_async)


# -- a plain workflow ----------------------------------------------------------------------------


@sp.workflow("typing.support-follow-up", version="v3")
def follow_up(run: sp.Run, case_id: str) -> dict[str, str]:
    case = run.read("case.fetch", fetch_case, case_id, max_age=timedelta(minutes=10))
    text: str = case["text"]
    words: int = run.pure("count", word_count, text, minimum=1)
    reply = run.model(
        "draft", draft_reply, model="m-1", messages=[{"role": "user", "content": text}], temperature=0.2
    )
    route: str = run.decide("route", choose_route, reply)
    counts: dict[str, int] = {"words": words, "priority": 2}
    payload: JSON = {"title": text, "route": route, "counts": counts}
    receipt = run.effect("ticket.create", tickets, payload=payload, operation_id=f"ticket:create:{case_id}")
    ticket: str = receipt["id"]
    plain = run.effect("ticket.note", tickets, payload=counts)  # a dict[str, int] is JSON
    prices = run.parallel(
        "prices",
        {
            "eu": lambda branch: branch.read("price", price_of, "eu"),
            "us": lambda branch: branch.read("price", price_of, "us"),
        },
    )
    cheapest: float = min(prices.values())
    listed = run.parallel("listed", [lambda branch: branch.pure("n", word_count, text)])
    first: int = listed[0]
    when: datetime = run.now()
    return {
        "ticket": ticket,
        "note": plain["id"],
        "at": when.isoformat(),
        "cheapest": str(cheapest),
        "first": str(first),
    }


def plain_mistakes(run: sp.Run, text: str) -> None:
    run.pure("count", word_count, 3)  # type: ignore[arg-type]
    run.pure("count", word_count, text, minimun=1)  # type: ignore[call-arg]
    run.decide("route", choose_route)  # type: ignore[call-arg]
    wrong: int = run.decide("route", choose_route, {})  # type: ignore[assignment]
    receipt = run.effect("ticket.create", tickets, payload={"title": text})
    not_a_number: int = receipt["id"]  # type: ignore[assignment]
    run.effect("ticket.create", tickets, payload={"at": datetime.now()})  # type: ignore[dict-item]
    run.effect("ticket.create", tickets, payload=text.split)  # type: ignore[arg-type]
    run.model("draft", draft_reply, model="m-1", messages={1, 2})  # type: ignore[arg-type]
    prices = run.parallel("prices", {"eu": lambda branch: branch.read("price", price_of, "eu")})
    as_list: list[float] = prices  # type: ignore[assignment]
    del wrong, not_a_number, as_list


# -- an async workflow ---------------------------------------------------------------------------


@sp.workflow("typing.support-follow-up-async", version="v1")
async def follow_up_async(run: sp.AsyncRun, case_id: str) -> dict[str, str]:
    case = await run.read("case.fetch", fetch_case_async, case_id)  # async def: awaited
    text: str = case["text"]
    words: int = await run.pure("count", word_count, text)  # a plain function in an async run
    reply = await run.model(
        "draft", draft_reply_async, model="m-1", messages=[{"role": "user", "content": text}]
    )
    route: str = await run.decide("route", choose_route, reply)
    receipt = await run.effect(
        "ticket.create", async_tickets, payload={"title": text, "route": route, "words": words}
    )
    ticket: str = receipt["id"]
    synced = await run.effect("ticket.sync", tickets, payload={"title": text})
    prices = await run.gather("prices", {"eu": lambda branch: branch.read("p", fetch_case_async, "eu")})
    customer: str = prices["eu"]["customer"]
    when: datetime = await run.now()
    return {"ticket": ticket, "synced": synced["id"], "customer": customer, "at": when.isoformat()}


async def async_mistakes(run: sp.AsyncRun, text: str) -> None:
    await run.pure("count", word_count, 3)  # type: ignore[call-overload]
    case: int = await run.read("case.fetch", fetch_case_async, text)  # type: ignore[arg-type]
    receipt = await run.effect("ticket.create", async_tickets, payload={"title": text})
    number: int = receipt["id"]  # type: ignore[assignment]
    del case, number


@sp.workflow("typing.waits", version="v1")
def waits(run: sp.Run) -> object:
    answer = run.wait_for("manager.answer", timeout=timedelta(days=2))
    run.sleep(30, step_id="pause")
    run.wait_for("manager.answer", timeout="2d")  # type: ignore[arg-type]
    return answer


@sp.workflow("typing.waits-async", version="v1")
async def waits_async(run: sp.AsyncRun) -> object:
    try:
        answer = await run.wait_for("manager.answer", timeout=60.0)
    except sp.WaitTimedOut as timed_out:
        at: int = timed_out.timeout_at
        return at
    await run.sleep(timedelta(hours=1))
    return answer


def sent(store: sp.Store) -> str | None:
    message = sp.send(store, "refund-8472", "manager.answer", {"approved": True}, message_id="d-1", by="ana")
    sp.send(store, "refund-8472", "manager.answer", {1, 2})  # type: ignore[arg-type]
    return message.taken_by


def answered(store: sp.Store) -> str | None:
    try:
        kept = sp.answer(store, "refund-8472", "manager.answer", {"ok": True}, wait="manager.answer#2")
    except sp.errors.WaitAnswered as refused:
        first: str | None = refused.answered_by
        parked: str | None = refused.waits_at
        return first or parked
    return kept.for_wait


def carried_out(store: sp.Store) -> object:
    return sp.start(store, follow_up, "case-8472", run_id="case-8472-follow-up")


def forked(store: sp.Store) -> str:
    fork: sp.types.RunRecord = sp.fork(
        store, "case-8472-follow-up", from_step="draft", workflow=follow_up, resend=["ticket.sync"], by="ana"
    )
    sp.fork(store, "case-8472-follow-up", from_step="draft")  # type: ignore[call-arg]
    return fork.run_id


async def forked_async(store: sp.AsyncStore) -> str:
    fork = await sp.fork_async(store, "case-8472-follow-up", from_step="draft", by="ana", reason="retry")
    return fork.run_id


def carried_in_slices(store: sp.Store) -> str | None:
    outcome = sp.resume(store, "case-8472-follow-up", slice=timedelta(seconds=25))
    if isinstance(outcome, sp.Unfinished):
        status: sp.types.RunStatus = outcome.status
        return f"{outcome.run_id} {status.value}: {outcome.reason}"
    stats = sp.Worker(store).run(slice=25.0, handle_signals=False)
    unfinished: int = stats.unfinished
    sp.resume(store, "r", slice="25s")  # type: ignore[arg-type]
    return None if unfinished else "done"


# -- transaction steps: the ledger's own database ---------------------------------------------


def record_order(tx: Transaction, case_id: str, total: int) -> dict[str, int]:
    tx.execute("INSERT INTO orders (case_id, total) VALUES (?, ?)", (case_id, total))
    return {"orders": int(tx.execute("SELECT count(*) AS n FROM orders").fetchone()["n"])}


async def record_order_async(tx: AsyncTransaction, case_id: str) -> int:
    cur = await tx.execute("INSERT INTO orders (case_id) VALUES (%(case)s)", {"case": case_id})
    return int(cur.rowcount)


@sp.workflow("typing.transactions", version="v1")
def transactions(run: sp.Run, case_id: str) -> int:
    placed: dict[str, int] = run.transaction("order", record_order, case_id, 42, retry=3)
    return placed["orders"]


@sp.workflow("typing.transactions-async", version="v1")
async def transactions_async(run: sp.AsyncRun, case_id: str) -> int:
    rows: int = await run.transaction("order", record_order_async, case_id)
    return rows
