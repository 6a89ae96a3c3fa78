"""The Anthropic tool loop: model turns and tool calls as steps, with the real anthropic SDK
over HTTP to the fake model server, effects applied by the local effect owner (a real process),
on real SQLite files and PostgreSQL — a crash anywhere, then a resume, sends no request twice,
applies each effect once and never shows the model a tool call without its result.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import anthropic
import pytest

import safepoint as sp
from safepoint.integrations import anthropic as spa
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, FakeRequest, OwnerService, SimulatedCrash, Turn, owner_client
from safepoint.types import StepKind

MODEL = "claude-sonnet-4-5"
ASK = [{"role": "user", "content": "Refund order A1, and tell me where B2 is."}]

# The model looks A1 up, then refunds it and looks B2 up in one turn (two parallel tool_use
# blocks), then answers.
SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(
        ("refund", {"order_id": "A1", "amount_cents": 500}),
        ("get_order", {"order_id": "B2"}),
        text="Refunding A1 and looking B2 up.",
    ),
    Turn.text("Refunded 5.00 on A1; B2 is in Lyon."),
]


class Shop:
    """A read tool and an effect tool at the owner, counting what their functions did."""

    def __init__(self) -> None:
        self.looked_up: list[str] = []
        self.refunded: list[str] = []
        self.tools = Tools()

        @self.tools.read
        def get_order(order_id: str) -> dict[str, Any]:
            """Look an order up by its id."""
            self.looked_up.append(order_id)
            return {"id": order_id, "total_cents": 1200, "city": "Lyon"}

        def find_refund(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
            found = owner_client().find_by_key("refunds", str(key))
            return sp.Applied(found) if found is not None else sp.NotApplied()

        @self.tools.effect(
            key_fields=("order_id",), reconcile=find_refund, dedup_retention=timedelta(hours=23)
        )
        def refund(order_id: str, amount_cents: int, key: sp.EffectKey) -> dict[str, Any]:
            """Refund part of an order."""
            self.refunded.append(order_id)
            return owner_client().create(
                "refunds", {"order_id": order_id, "amount_cents": amount_cents}, idempotency_key=str(key)
            )


def applied(owner: OwnerService) -> int:
    return int(owner.client.stats()["by_resource"].get("refunds", 0))


def client_of(fake: FakeModelServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-test-fake", base_url=fake.url)


def summary(result: spa.LoopResult[Any]) -> dict[str, Any]:
    return {
        "stop": result.stop,
        "turns": result.turns,
        "text": result.text,
        "transcript": list(result.transcript),
    }


def shop_agent(name: str, fake: FakeModelServer, shop: Shop, **options: Any) -> sp.Workflow:
    client = client_of(fake)

    @sp.workflow(name)
    def agent(run: sp.Run) -> dict[str, Any]:
        result = spa.tool_loop(
            run, client, model=MODEL, messages=ASK, tools=shop.tools, max_tokens=512, **options
        )
        return summary(result)

    return agent


def test_a_loop_with_a_read_an_effect_and_parallel_calls_resumes_without_asking_again(
    store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    shop = Shop()
    with FakeModelServer(SCRIPT) as fake:
        agent = shop_agent("anthropic-loop", fake, shop, system="You are a shop assistant.")
        crash_at("run.before_complete")
        with pytest.raises(SimulatedCrash):
            sp.start(store, agent, run_id="r", lease_ms=0)
        crash_at(None)
        done = sp.resume(store, "r")
        assert fake.requests_per_turn() == {0: 1, 1: 1, 2: 1}  # the resume asked nothing
        assert fake.orphans == []
        tools_sent = [r.body["tools"] for r in fake.requests]
    assert done["stop"] == "end_turn"
    assert done["turns"] == 3
    assert done["text"] == "Refunded 5.00 on A1; B2 is in Lyon."
    roles = [m["role"] for m in done["transcript"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    parallel = done["transcript"][4]["content"]
    assert [r["type"] for r in parallel] == ["tool_result", "tool_result"]  # both calls, one user turn
    asked = [b for b in done["transcript"][3]["content"] if b["type"] == "tool_use"]
    assert [r["tool_use_id"] for r in parallel] == [b["id"] for b in asked]
    assert json.loads(parallel[1]["content"]) == {"id": "B2", "total_cents": 1200, "city": "Lyon"}
    assert tools_sent == [shop.tools.anthropic()] * 3
    assert shop.looked_up == ["A1", "B2"]
    assert shop.refunded == ["A1"]
    assert applied(owner_env) == 1
    steps = store.load_ledger("r").steps
    kinds = [(sid.split(".")[0].split("#")[0], s.kind) for sid, s in steps.items()]
    assert kinds == [
        ("model", StepKind.MODEL),
        ("tool", StepKind.READ),
        ("model", StepKind.MODEL),
        ("tool", StepKind.EFFECT),
        ("tool", StepKind.READ),
        ("model", StepKind.MODEL),
    ]


@pytest.mark.parametrize(
    "point",
    [
        "effect.after_accept",  # between the two tool calls of one turn: the refund done, B2 not looked up
        "effect.after_dispatching",  # inside the refund's dispatch, before the owner got it
        "effect.after_receiver_commit",  # inside the refund's dispatch, the owner committed it
        "step.after_record:model#2",  # the turn with two calls recorded, neither call made
    ],
)
def test_a_crash_anywhere_in_a_turn_sends_no_request_twice_and_refunds_once(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any, point: str
) -> None:
    shop = Shop()
    with FakeModelServer(SCRIPT) as fake:
        agent = shop_agent("anthropic-loop-crash", fake, shop)
        crash_at(point)
        with pytest.raises(SimulatedCrash):
            sp.start(file_store, agent, run_id="r", lease_ms=0)
        crash_at(None)
        assert len(fake.requests) == 2  # turns 0 and 1 asked; the crash came before turn 2
        done = sp.resume(file_store, "r")
        assert fake.repeated() == []
        assert fake.requests_per_turn() == {0: 1, 1: 1, 2: 1}
        assert fake.orphans == []
    assert done["stop"] == "end_turn"
    assert applied(owner_env) == 1
    assert shop.looked_up == ["A1", "B2"]


def test_pause_turn_is_sent_back_as_it_is_with_no_tool_step(file_store: sp.Store) -> None:
    shop = Shop()
    with FakeModelServer([Turn.stop("pause_turn", text="Still searching…"), Turn.text("Found it.")]) as fake:
        done = sp.start(file_store, shop_agent("anthropic-pause", fake, shop), run_id="r")
        second = fake.requests[1].body["messages"]
    assert (done["stop"], done["turns"], done["text"]) == ("end_turn", 2, "Found it.")
    assert second[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Still searching…"}]}
    assert [s.kind for s in file_store.load_ledger("r").steps.values()] == [StepKind.MODEL, StepKind.MODEL]


@pytest.mark.parametrize(
    "reason", ["max_tokens", "refusal", "model_context_window_exceeded", "brand_new_reason"]
)
def test_the_loop_stops_on_any_other_stop_reason_and_says_which(file_store: sp.Store, reason: str) -> None:
    shop = Shop()
    with FakeModelServer([Turn.stop(reason, text="Partial answer")]) as fake:
        done = sp.start(file_store, shop_agent("anthropic-stop", fake, shop), run_id="r")
        assert len(fake.requests) == 1
    assert (done["stop"], done["turns"], done["text"]) == (reason, 1, "Partial answer")


def test_the_tool_use_of_a_reply_cut_short_is_answered_without_running(file_store: sp.Store) -> None:
    """A reply that hit max_tokens in the middle of a tool_use: the call is not run (its input
    may be cut), but answered, so the transcript the loop returns is valid to carry on."""
    shop = Shop()
    cut = Turn(content="", calls=(("get_order", '{"order_id": "O1"}'),), stop_reason="max_tokens")
    with FakeModelServer([cut, Turn.text("Found it.")]) as fake:
        client = client_of(fake)

        @sp.workflow("anthropic-cut-tool-use")
        def agent(run: sp.Run) -> list[Any]:
            first = spa.tool_loop(run, client, model=MODEL, messages=ASK, tools=shop.tools)
            answered = first.transcript[-1]
            again = spa.tool_loop(run, client, model=MODEL, messages=first.transcript, tools=shop.tools)
            return [first.stop, answered, again.text]

        stop, answered, text = sp.start(file_store, agent, run_id="r")
        assert fake.orphans == []
    assert stop == "max_tokens"
    [result] = answered["content"]
    assert result["is_error"] is True
    assert "not run" in result["content"]
    assert text == "Found it."
    assert shop.looked_up == []


def test_max_turns_answers_the_last_calls_and_the_transcript_carries_on(file_store: sp.Store) -> None:
    shop = Shop()

    def script(request: FakeRequest) -> Turn:
        if request.turn < 3:
            return Turn.tool_calls(("get_order", {"order_id": f"O{request.turn}"}))
        return Turn.text("All looked up.")

    with FakeModelServer(script) as fake:
        client = client_of(fake)

        @sp.workflow("anthropic-max-turns")
        def agent(run: sp.Run) -> list[Any]:
            messages = sp.Transcript(ASK)
            first = spa.tool_loop(run, client, model=MODEL, messages=messages, tools=shop.tools, max_turns=2)
            assert first.transcript is messages  # carried on in place
            again = spa.tool_loop(run, client, model=MODEL, messages=messages, tools=shop.tools, max_turns=5)
            return [first.stop, first.turns, messages[4]["role"], again.stop, again.turns, len(messages)]

        assert sp.start(file_store, agent, run_id="r") == ["max_turns", 2, "user", "end_turn", 2, 8]
        assert fake.orphans == []
    assert shop.looked_up == ["O0", "O1", "O2"]


def test_without_tools_a_tool_call_ends_the_loop(file_store: sp.Store) -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = client_of(fake)

        @sp.workflow("anthropic-no-tools")
        def agent(run: sp.Run) -> list[Any]:
            done = spa.tool_loop(run, client, model=MODEL, messages=ASK)
            return [done.stop, done.turns, [b.type for b in done.final.content]]

        assert sp.start(file_store, agent, run_id="r") == ["tool_use", 1, ["tool_use"]]
        assert "tools" not in fake.requests[0].body


def test_a_price_puts_each_turns_cost_in_the_ledger(file_store: sp.Store, owner_env: OwnerService) -> None:
    shop = Shop()
    with FakeModelServer(SCRIPT) as fake:

        def price(reply: dict[str, Any]) -> float:
            return reply["usage"]["output_tokens"] * 0.001

        agent = shop_agent("anthropic-price", fake, shop, price=price)
        sp.start(file_store, agent, run_id="r")
    models = [s for s in file_store.load_ledger("r").steps.values() if s.kind is StepKind.MODEL]
    assert all(s.cost == pytest.approx(s.result["usage"]["output_tokens"] * 0.001) for s in models)
    assert file_store.get_run("r").cost_spent == pytest.approx(sum(s.cost or 0 for s in models))


def test_the_async_loop_resumes_without_asking_again(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any
) -> None:
    shop = Shop()
    with FakeModelServer(SCRIPT) as fake:

        @sp.workflow("anthropic-async-loop")
        async def agent(run: sp.AsyncRun) -> dict[str, Any]:
            # a client per event loop: its connections belong to the loop that opened them
            client = anthropic.AsyncAnthropic(api_key="sk-test-fake", base_url=fake.url)
            claude = spa.bind(run, client, step_id="claude")
            return summary(
                await spa.tool_loop_async(run, claude, model=MODEL, messages=ASK, tools=shop.tools)
            )

        crash_at("effect.after_receiver_commit")
        with pytest.raises(SimulatedCrash):
            asyncio.run(sp.start_async(file_store, agent, run_id="r", lease_ms=0))
        crash_at(None)
        done = asyncio.run(sp.resume_async(file_store, "r"))
        assert fake.repeated() == []
        assert fake.orphans == []
    assert (done["stop"], done["turns"]) == ("end_turn", 3)
    assert applied(owner_env) == 1
    assert [sid for sid in file_store.load_ledger("r").steps if not sid.startswith("tool.")] == [
        "claude",
        "claude#2",
        "claude#3",
    ]


def test_the_loop_takes_what_it_needs_and_says_what_was_wrong(file_store: sp.Store) -> None:
    with FakeModelServer(SCRIPT) as fake:
        client = client_of(fake)
        asynchronous = anthropic.AsyncAnthropic(api_key="sk-test-fake", base_url=fake.url)

        @sp.workflow("anthropic-loop-usage")
        def agent(run: sp.Run, case: str) -> None:
            if case == "async client":
                spa.tool_loop(run, asynchronous, model=MODEL, messages=ASK)
            elif case == "turns":
                spa.tool_loop(run, client, model=MODEL, messages=ASK, max_turns=0)
            elif case == "tools":
                spa.tool_loop(run, client, model=MODEL, messages=ASK, tools=[{"name": "x"}])
            elif case == "stream":
                spa.tool_loop(run, client, model=MODEL, messages=ASK, stream=True)
            else:
                spa.tool_loop(run, spa.bind(run, client), model=MODEL, messages=ASK, retry=3)

        for case, message in [
            ("async client", "tool_loop_async"),
            ("turns", "max_turns=0"),
            ("tools", "Tools"),
            ("stream", "no stream="),
            ("bound", "already bound"),
        ]:
            with pytest.raises(sp.UsageError, match=message):
                sp.start(file_store, agent, case, run_id=f"r-{case.replace(' ', '-')}")
        assert fake.requests == []
