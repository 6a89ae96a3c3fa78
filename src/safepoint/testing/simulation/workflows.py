"""The simulation's own workflows: between them, every kind of step and every way a run goes on.

- ``sim.order`` — eleven steps: a read, a model step, a decision, a pure step, an effect under
  a chosen operation id (reconciled), a recorded value, a transaction step, a wait for a message
  (with a timeout), a durable sleep, and an effect keyed by its step, with no reconcile,
  approved first when asked;
- ``sim.fanout`` — two branches at once, each an effect;
- ``sim.chain`` — an effect per generation, then ``continue_as_new`` twice;
- ``sim.agent`` — a tool loop against a scripted model that checks, on every request, that each
  tool call it made was answered; a read tool and two effect tools, under a token budget.

Every effect names its *business operation* in its payload (``"business"``): what the owner
counts, the same in a run and its forks, different between two instances.
"""

from __future__ import annotations

from typing import Any

from ... import Budget, Effect, Run, workflow
from ...errors import WaitTimedOut
from ...integrations.tools import ToolCall, Tools
from .world import world

BOOKINGS_TABLE = (
    "CREATE TABLE sim_bookings (business TEXT NOT NULL, run_id TEXT NOT NULL)"  # a transaction's rows
)


def _outside(*args: Any) -> Any:
    raise RuntimeError(
        "the simulation's effects are carried out by its model of the owner: run these workflows"
        " inside safepoint.testing.simulate"
    )


# In a simulation every effect is carried out by the model of its owner (``SimOwner.call``):
# these declare only each effect's name and whether it can be reconciled.
CHARGE = Effect("sim.charge", execute=_outside, reconcile=_outside)
EMAIL = Effect("sim.email", execute=_outside)  # no reconcile: an uncertain send blocks for a person
SHIP = Effect("sim.ship", execute=_outside, reconcile=_outside)
TICK = Effect("sim.tick", execute=_outside, reconcile=_outside)
REFUND = Effect("sim.refund", execute=_outside, reconcile=_outside)
NOTIFY = Effect("sim.notify", execute=_outside)

TOKENS_PER_TURN = 100


def _stock(n: int) -> int:
    return 3 + n % 5


def _plan(*, model: str, messages: Any, tools: Any = None) -> dict[str, Any]:
    return {"text": f"ship order {len(messages)}", "usage": {"total_tokens": TOKENS_PER_TURN}}


def _route(n: int) -> str:
    return "express" if n % 2 else "ground"


def _book(tx: Any, business: str, run_id: str) -> int:
    mark = "?" if tx.dialect == "sqlite" else "%s"
    tx.execute(f"INSERT INTO sim_bookings (business, run_id) VALUES ({mark}, {mark})", (business, run_id))
    return 1


@workflow("sim.order")
def order(run: Run, n: int, approve: bool = False, wait: bool = True) -> dict[str, Any]:
    stock = run.read("stock", _stock, n)
    plan = run.model("plan", _plan, model="sim-1", messages=[{"role": "user", "content": f"order {n}"}])
    route = run.decide("route", _route, n)
    total = run.pure("total", lambda s: 100 * s, stock)
    charge = run.effect(
        "charge", CHARGE, payload={"business": f"charge:{n}", "total": total}, operation_id=f"charge-{n}"
    )
    reference = run.uuid("reference")  # a recorded value: the same on every replay
    run.transaction("book", _book, f"book:{n}", run.run_id)
    confirmed = None
    if wait:
        try:
            confirmed = run.wait_for("confirm", timeout=3.0)
        except WaitTimedOut:
            confirmed = "timed out"
    run.sleep(0.5, step_id="cool")
    email = run.effect("email", EMAIL, payload={"business": f"email:{n}", "route": route}, approval=approve)
    return {
        "charge": charge["id"],
        "email": email["id"],
        "plan": plan["text"],
        "confirmed": confirmed,
        "reference": reference,
    }


@workflow("sim.fanout")
def fanout(run: Run, n: int) -> list[Any]:
    def leg(index: int) -> Any:
        def body(branch: Run) -> Any:
            branch.read("quote", _stock, n + index)
            return branch.effect("ship", SHIP, payload={"business": f"ship:{n}:{index}"})["id"]

        return body

    return run.parallel("legs", [leg(0), leg(1)])


@workflow("sim.chain")
def chain(run: Run, n: int, generation: int = 0) -> int:
    run.effect(
        "tick", TICK, payload={"business": f"tick:{n}:{generation}"}, operation_id=f"tick-{generation}"
    )
    run.effect("tock", SHIP, payload={"business": f"tock:{n}:{generation}"})
    if generation < 2:
        run.continue_as_new(n, generation + 1)
    return generation


TOOLS = Tools()
_SCHEMA = {"type": "object", "properties": {"business": {"type": "string"}}, "required": ["business"]}
TOOLS.add("lookup", "read", lambda business: {"order": business, "paid": True}, schema=_SCHEMA)
TOOLS.add("refund", "effect", effect=REFUND, schema=_SCHEMA)
TOOLS.add("notify", "effect", effect=NOTIFY, schema=_SCHEMA)


def _script(n: int, turn: int) -> list[dict[str, Any]]:
    """What the scripted model answers on its ``turn``-th request of instance ``n``."""
    if turn == 0:
        return [
            {"type": "tool_use", "id": f"c{n}a", "name": "lookup", "input": {"business": f"order:{n}"}},
            {"type": "tool_use", "id": f"c{n}b", "name": "refund", "input": {"business": f"refund:{n}"}},
        ]
    if turn == 1:
        return [{"type": "tool_use", "id": f"c{n}c", "name": "notify", "input": {"business": f"notify:{n}"}}]
    return [{"type": "text", "text": f"refunded order {n}"}]


def _model(n: int) -> Any:
    def ask(*, model: str, messages: list[dict[str, Any]], tools: Any = None) -> dict[str, Any]:
        asked = {
            b["id"]
            for m in messages
            if m["role"] == "assistant"
            for b in m["content"]
            if b["type"] == "tool_use"
        }
        answered = {
            b["tool_use_id"]
            for m in messages
            if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"]
            if b["type"] == "tool_result"
        }
        if asked - answered:
            world().unanswered.append(f"agent {n}: tool calls {sorted(asked - answered)} sent unanswered")
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return {"content": _script(n, turn), "usage": {"total_tokens": TOKENS_PER_TURN}}

    return ask


@workflow("sim.agent", budget=Budget(tokens=150))
def agent(run: Run, n: int) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"refund order {n}"}]
    for turn in range(5):
        reply = run.model(
            f"turn.{turn}", _model(n), model="sim-agent", messages=messages, tools=TOOLS.anthropic()
        )
        messages.append({"role": "assistant", "content": reply["content"]})
        calls = [
            ToolCall(b["id"], b["name"], b["input"]) for b in reply["content"] if b["type"] == "tool_use"
        ]
        if not calls:
            return str(reply["content"][0]["text"])
        outcomes = TOOLS.call_all(run, calls)
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": o.call_id,
                        "content": o.content,
                        "is_error": o.is_error,
                    }
                    for o in outcomes
                ],
            }
        )
    return "out of turns"


CATALOG = ("sim.order", "sim.fanout", "sim.chain", "sim.agent")
