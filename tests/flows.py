"""Workflows the tests run in child processes (importable as ``flows``).

Step ids are prefixed by their kind so a crash point can target one kind:
``step.after_record:model`` kills right after the model step is recorded.
"""

from __future__ import annotations

import inspect
import os
import time
from typing import Any

import safepoint as sp
from safepoint.testing import owner_effect

charges = owner_effect("charges")
tickets = owner_effect("tickets", verify=True)
notifications = owner_effect("notifications", reconcile=False, dedup_retention=None)


def fetch_case(case_id: str) -> dict[str, Any]:
    return {"case": case_id, "customer": "cus_42", "amount": 1250}


def scripted_model(*, model: str, messages: list[dict[str, str]], temperature: float = 0) -> Any:
    return {
        "text": f"refund case {messages[-1]['content']}",
        "model": model,
        "usage": {"input_tokens": 12, "output_tokens": 5},
    }


def doubled(case: dict[str, Any]) -> int:
    return int(case["amount"]) * 2


def sql(tx: Any, query: str) -> str:
    """``query`` written with ``?`` placeholders, in the step connection's dialect."""
    return query if tx.dialect == "sqlite" else query.replace("?", "%s")


def case_rows(tx: Any, case_id: str) -> Any:
    """A transaction step: one row for this run in an application table of the ledger's own
    database; the rows the run has there — 1, unless a write were repeated. (On an async store's
    connection it returns the coroutine that does it, which the store awaits.)"""
    run_id = sp.current_run().run_id
    statements = [
        ("CREATE TABLE IF NOT EXISTS app_cases (run_id TEXT NOT NULL, case_id TEXT NOT NULL)", ()),
        (sql(tx, "INSERT INTO app_cases (run_id, case_id) VALUES (?, ?)"), (run_id, case_id)),
        (sql(tx, "SELECT count(*) AS n FROM app_cases WHERE run_id = ?"), (run_id,)),
    ]
    if tx.dialect == "postgres":  # CREATE TABLE IF NOT EXISTS races with itself on PostgreSQL
        statements.insert(0, ("SELECT pg_advisory_xact_lock(8472)", ()))
    if inspect.iscoroutinefunction(tx.execute):

        async def run_async() -> int:
            for query, params in statements[:-1]:
                await tx.execute(query, params)
            cur = await tx.execute(*statements[-1])
            return int((await cur.fetchone())["n"])

        return run_async()
    for query, params in statements[:-1]:
        tx.execute(query, params)
    return int(tx.execute(*statements[-1]).fetchone()["n"])


def route(draft: dict[str, Any]) -> str:
    return "refund" if "refund" in draft["text"] else "reply"


@sp.workflow("every-kind", version="1")
def every_kind(run: sp.Run, case_id: str) -> dict[str, Any]:
    case = run.read("read.case", fetch_case, case_id)
    draft = run.model(
        "model.draft",
        scripted_model,
        model="scripted-1",
        messages=[{"role": "user", "content": case_id}],
        temperature=0,
    )
    amount = run.pure("pure.amount", doubled, case)
    rows = run.transaction("transaction.case", case_rows, case_id)
    chosen = run.decide("decision.route", route, draft)
    stamp = run.now("value.now")
    nonce = run.uuid("value.uuid")
    charge = run.effect(
        "effect.charge",
        charges,
        operation_id=f"charge:{case_id}",
        payload={"amount": amount, "customer": case["customer"], "nonce": nonce},
    )
    ticket = run.effect("effect.ticket", tickets, payload={"charge": charge["id"], "at": stamp.isoformat()})
    return {"charge": charge["id"], "ticket": ticket["id"], "route": chosen, "amount": amount, "rows": rows}


@sp.workflow("every-kind-async", version="1")
async def every_kind_async(run: sp.AsyncRun, case_id: str) -> dict[str, Any]:
    case = await run.read("read.case", fetch_case, case_id)
    draft = await run.model(
        "model.draft",
        scripted_model,
        model="scripted-1",
        messages=[{"role": "user", "content": case_id}],
        temperature=0,
    )
    amount = await run.pure("pure.amount", doubled, case)
    rows = await run.transaction("transaction.case", case_rows, case_id)
    chosen = await run.decide("decision.route", route, draft)
    stamp = await run.now("value.now")
    nonce = await run.uuid("value.uuid")
    charge = await run.effect(
        "effect.charge",
        charges,
        operation_id=f"charge:{case_id}",
        payload={"amount": amount, "customer": case["customer"], "nonce": nonce},
    )
    ticket = await run.effect(
        "effect.ticket", tickets, payload={"charge": charge["id"], "at": stamp.isoformat()}
    )
    return {"charge": charge["id"], "ticket": ticket["id"], "route": chosen, "amount": amount, "rows": rows}


@sp.workflow("lines", version="1")
def lines(run: sp.Run, count: int) -> list[str]:
    """The same step id in a loop: occurrences effect.line, effect.line#2, …"""
    ids = []
    for index in range(count):
        receipt = run.effect("effect.line", charges, payload={"line": index})
        ids.append(receipt["id"])
    return ids


kept_charges = owner_effect("charges", name="owner.charges.kept", keep_alive=True)


@sp.workflow("kept-lines", version="1")
def kept_lines(run: sp.Run, count: int) -> list[str]:
    """``lines`` through a connection kept alive between effects."""
    return [run.effect("effect.line", kept_charges, payload={"line": index})["id"] for index in range(count)]


@sp.workflow("notify", version="1")
def notify(run: sp.Run, who: str) -> str:
    """An effect whose owner has no read path: an uncertain dispatch can only block."""
    receipt = run.effect("effect.notify", notifications, payload={"to": who})
    return str(receipt["id"])


@sp.workflow("notify-async", version="1")
async def notify_async(run: sp.AsyncRun, who: str) -> str:
    """``notify``, awaited."""
    receipt = await run.effect("effect.notify", notifications, payload={"to": who})
    return str(receipt["id"])


@sp.workflow("many-steps", version="1")
def many_steps(run: sp.Run, count: int) -> int:
    total = 0
    for index in range(count):
        total = run.pure("add", lambda a, b: a + b, total, index)
    return total


fenced_charges = owner_effect("charges", fenced=True)


def slow_draft(*, model: str, messages: list[dict[str, str]]) -> Any:
    return {"text": "drafted", "model": model}


@sp.workflow("fenced", version="1")
def fenced(run: sp.Run, case_id: str) -> dict[str, Any]:
    """A step, then a fenced effect: the owner refuses a dispatch under a superseded fence."""
    draft = run.model(
        "model.draft", slow_draft, model="scripted-1", messages=[{"role": "user", "content": case_id}]
    )
    charge = run.effect(
        "effect.charge",
        fenced_charges,
        operation_id=f"charge:{case_id}",
        payload={"case": case_id, "amount": 100},
    )
    return {"draft": draft["text"], "charge": charge["id"]}


REGIONS = ("eu", "us", "ap")


def quote(region: str) -> dict[str, Any]:
    return {"region": region, "price": 100 + len(region)}


@sp.workflow("fan-out", version="1")
def fan_out(run: sp.Run, order: str) -> dict[str, Any]:
    """Three branches at once, each a read then an effect: a partial batch after a crash."""

    def branch(region: str) -> Any:
        def body(b: sp.Run) -> str:
            price = b.read("read.quote", quote, region)
            receipt = b.effect(
                "effect.book",
                charges,
                payload={"order": order, **price},
                operation_id=f"book:{order}:{region}",
            )
            return str(receipt["id"])

        return body

    booked = run.parallel("fan", {region: branch(region) for region in REGIONS})
    return {"booked": sorted(booked.values())}


@sp.workflow("fan-out-async", version="1")
async def fan_out_async(run: sp.AsyncRun, order: str) -> dict[str, Any]:
    def branch(region: str) -> Any:
        async def body(b: sp.AsyncRun) -> str:
            price = await b.read("read.quote", quote, region)
            receipt = await b.effect(
                "effect.book",
                charges,
                payload={"order": order, **price},
                operation_id=f"book:{order}:{region}",
            )
            return str(receipt["id"])

        return body

    booked = await run.gather("fan", {region: branch(region) for region in REGIONS})
    return {"booked": sorted(booked.values())}


@sp.workflow("chain", version="1", history_limit=(40, 80))
def chain(run: sp.Run, start: int, count: int, every: int, ids: list[str]) -> list[str]:
    """A loop of effects that continues as new every ``every`` lines, carrying what it did."""
    for index in range(start, count):
        receipt = run.effect("effect.line", charges, payload={"line": index}, operation_id=f"line:{index}")
        ids = [*ids, receipt["id"]]
        if (index + 1) % every == 0 and index + 1 < count:
            run.continue_as_new(index + 1, count, every, ids)
    return ids


def conversation_model(*, model: str, messages: list[dict[str, str]]) -> dict[str, str]:
    """A scripted model that answers from the whole conversation it is given (a list)."""
    assert isinstance(messages, list), "run.model passes a transcript as a plain list"
    return {"role": "assistant", "content": f"turn {len(messages)}: {messages[-1]['content']}"}


def tool_note(messages: sp.Transcript, turn: int) -> str:
    return f"{turn}/{len(messages)}/{messages[-1]['content'][:12]}"


@sp.workflow("transcript-loop", version="1")
def transcript_loop(run: sp.Run, case_id: str) -> dict[str, Any]:
    """An agent loop whose conversation is a Transcript: each model call and each tool step is
    given the whole conversation; every second turn files a ticket bound to its digest."""
    messages = sp.Transcript([{"role": "user", "content": case_id}])
    tickets_filed = []
    for turn in range(6):
        messages.append(run.model("model.turn", conversation_model, model="scripted-1", messages=messages))
        messages.append({"role": "tool", "content": run.pure("pure.note", tool_note, messages, turn)})
        if turn % 2 == 1:
            receipt = run.effect(
                "effect.ticket", charges, payload={"turn": turn, "conversation": messages.digest}
            )
            tickets_filed.append(receipt["id"])
    return {
        "length": len(messages),
        "digest": messages.digest,
        "tickets": tickets_filed,
        "last": messages[-1]["content"],
    }


RETRY_RACE_DIR = "SAFEPOINT_RETRY_RACE_DIR"  # where the race's lookups are counted, and allowed


def race_lookup(run_id: str) -> dict[str, Any]:
    """Counts each call (a line per call, appended by every process alike) and fails until the
    test has put a file named after the run in the directory: the service is back."""
    folder = os.environ[RETRY_RACE_DIR]
    with open(os.path.join(folder, "calls"), "a", encoding="utf-8") as calls:
        calls.write(run_id + "\n")
    if not os.path.exists(os.path.join(folder, run_id)):
        raise ConnectionRefusedError(f"the lookup service is down for {run_id}")
    return {"run": run_id}


@sp.workflow("retry-race", version="1")
def retry_race(run: sp.Run, run_id: str) -> dict[str, Any]:
    """A ticket, then a lookup that fails until its service is back: retried, the run finishes
    with the ticket sent once and the lookup asked once more."""
    ticket = run.effect("effect.ticket", charges, payload={"run": run_id}, operation_id=f"ticket:{run_id}")
    found = run.read("read.lookup", race_lookup, run_id)
    return {"ticket": ticket["id"], "found": found["run"]}


def order_row(tx: Any, index: int, pause: float) -> int:
    """A transaction step: the order line ``index`` of this run, inserted into an application
    table of the ledger's own database; returns the run's rows there so far."""
    if tx.dialect == "postgres":
        tx.execute("SELECT pg_advisory_xact_lock(8473)")
    tx.execute(
        "CREATE TABLE IF NOT EXISTS app_order_lines"
        " (run_id TEXT NOT NULL, step_id TEXT NOT NULL, line INTEGER NOT NULL)"
    )
    run_id = sp.current_run().run_id
    tx.execute(
        sql(tx, "INSERT INTO app_order_lines (run_id, step_id, line) VALUES (?, ?, ?)"),
        (run_id, f"line.{index}", index),
    )
    if pause:
        time.sleep(pause)  # widens the window a kill from outside lands in
    row = tx.execute(
        sql(tx, "SELECT count(*) AS n FROM app_order_lines WHERE run_id = ?"), (run_id,)
    ).fetchone()
    return int(row["n"])


@sp.workflow("order-lines", version="1")
def order_lines(run: sp.Run, count: int, pause: float = 0.0) -> list[int]:
    """``count`` transaction steps, each inserting one row: the run's rows after each."""
    return [run.transaction(f"line.{index}", order_row, index, pause) for index in range(count)]


def committed_row(tx: Any, index: int) -> int:
    """A transaction step whose function hands the driver's connection to a helper that
    commits on its own (as an ORM session or a dataframe's ``to_sql`` does): the row is
    committed before safepoint records the step."""
    tx.execute(
        "CREATE TABLE IF NOT EXISTS app_order_lines"
        " (run_id TEXT NOT NULL, step_id TEXT NOT NULL, line INTEGER NOT NULL)"
    )
    conn = tx.driver_connection()
    conn.execute(
        sql(tx, "INSERT INTO app_order_lines (run_id, step_id, line) VALUES (?, ?, ?)"),
        (sp.current_run().run_id, f"line.{index}", index),
    )
    conn.commit()
    return index


@sp.workflow("self-committed-line", version="1")
def self_committed_line(run: sp.Run) -> int:
    """One transaction step whose function commits on its own (``committed_row``)."""
    return run.transaction("line.0", committed_row, 0)
