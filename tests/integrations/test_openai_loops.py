"""The OpenAI tool loops, on the real ``openai`` package over HTTP to the fake model server: a
read tool, two effects asked for in one turn (to the local effect owner, which counts what it
applied), the ways a loop stops, and crashes between the two calls of a turn and inside an
effect's dispatch — after which a resume sends no request twice, applies each effect once and
never sends a tool call without its result. End to end on SQLite files and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations import openai as spo
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, OwnerService, SimulatedCrash, Turn, owner_effect

KEY = "sk-test-fake"
SYSTEM = "You are a support agent. Refund orders that did not arrive."
TICKET = "Order A1 never arrived; please refund it."
ORDERS = {"A1": {"order_id": "A1", "customer": "ada@example.com", "total_cents": 4200}}
SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(
        ("refund", {"order_id": "A1", "amount_cents": 4200}),
        ("send_email", {"to": "ada@example.com", "subject": "Your refund", "body": "Refunded 42.00."}),
    ),
    Turn.text("Refunded order A1 and told Ada."),
]
APIS = ["chat", "responses"]

tools = Tools()
looked_up: list[str] = []


@tools.read
def get_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    looked_up.append(order_id)
    return ORDERS[order_id]


def _object(**properties: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": kind} for name, kind in properties.items()},
        "required": list(properties),
    }


tools.add(
    "refund",
    "effect",
    effect=owner_effect("refunds", name="openai-loop-refunds"),
    key_fields=("order_id",),
    description="Refund an order to the customer.",
    schema=_object(order_id="string", amount_cents="integer"),
)
tools.add(
    "send_email",
    "effect",
    effect=owner_effect("notifications", name="openai-loop-emails"),
    key_fields=("to", "subject"),
    description="Send an e-mail.",
    schema=_object(to="string", subject="string", body="string"),
)


def summary(result: Any) -> dict[str, Any]:
    return {"text": result.text, "stop": result.stop, "turns": result.turns, "items": len(result.transcript)}


def loop(api: str, run: sp.Run, url: str, **options: Any) -> Any:
    client = OpenAI(api_key=KEY, base_url=url, max_retries=0)
    if api == "chat":
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TICKET}]
        return spo.tool_loop(run, client, model="gpt-test", messages=messages, tools=tools, **options)
    return spo.responses_tool_loop(
        run, client, model="gpt-test", instructions=SYSTEM, input=TICKET, tools=tools, **options
    )


@sp.workflow("openai-loop-chat")
def chat_agent(run: sp.Run, url: str) -> dict[str, Any]:
    return summary(loop("chat", run, url, price=lambda reply: 0.25))


@sp.workflow("openai-loop-responses")
def responses_agent(run: sp.Run, url: str) -> dict[str, Any]:
    return summary(loop("responses", run, url, price=lambda reply: 0.25))


AGENTS = {"chat": chat_agent, "responses": responses_agent}
# each loop: 3 turns; chat: system + user + 3 assistant + 3 tool messages; Responses: the user's
# message, 1 + 2 function calls, 3 outputs, the final message
EXPECTED = {
    "chat": {"text": "Refunded order A1 and told Ada.", "stop": "stop", "turns": 3, "items": 8},
    "responses": {"text": "Refunded order A1 and told Ada.", "stop": "completed", "turns": 3, "items": 8},
}


def applied(owner: OwnerService) -> dict[str, int]:
    stats = owner.client.stats()
    counts = stats["by_resource"]
    return {
        "refunds": counts["refunds"],
        "emails": counts["notifications"],
        "duplicates": stats["duplicates"],
    }


ONCE = {"refunds": 1, "emails": 1, "duplicates": 0}


def first_run_stopped_at(store: sp.Store, wf: sp.Workflow, url: str, crash_at: Any, point: str) -> None:
    crash_at(point)
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, url, run_id="r", lease_ms=0)
    crash_at(None)


# -- end to end ----------------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_a_loop_runs_its_tools_and_a_resume_replays_it_all(
    store: sp.Store, owner_env: OwnerService, crash_at: Any, api: str
) -> None:
    with FakeModelServer(SCRIPT) as fake:
        first_run_stopped_at(store, AGENTS[api], fake.openai_url, crash_at, "run.before_complete")
        assert len(fake.requests) == 3
        assert sp.resume(store, "r") == EXPECTED[api]
        assert len(fake.requests) == 3  # the resume sent none
        assert fake.orphans == []
        second = fake.requests[1].body
    assert applied(owner_env) == ONCE
    run = store.get_run("r")
    assert (run.model_calls_spent, run.cost_spent) == (3, 0.75)
    ledger = store.load_ledger("r")
    assert [sid for sid in ledger.steps if sid.startswith("model")] == ["model", "model#2", "model#3"]
    assert len([sid for sid in ledger.steps if sid.startswith("tool.")]) == 3
    # the parallel calls of the second turn are answered in the model's order, each by its id
    calls = [s.step_id.removeprefix("tool.") for s in ledger.steps.values() if s.step_id.startswith("tool.")]
    answered = _answered_ids(api, fake.requests[2].body)
    assert answered == calls
    assert _answered_ids(api, second) == calls[:1]


def _answered_ids(api: str, body: Any) -> list[str]:
    if api == "chat":
        return [m["tool_call_id"] for m in body["messages"] if m["role"] == "tool"]
    return [item["call_id"] for item in body["input"] if item.get("type") == "function_call_output"]


@sp.workflow("openai-loop-chat-async")
async def chat_agent_async(run: sp.AsyncRun, url: str) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TICKET}]
    result = await spo.tool_loop_async(run, client, model="gpt-test", messages=messages, tools=tools)
    return summary(result)


@sp.workflow("openai-loop-responses-async")
async def responses_agent_async(run: sp.AsyncRun, url: str) -> dict[str, Any]:
    client = AsyncOpenAI(api_key=KEY, base_url=url, max_retries=0)
    result = await spo.responses_tool_loop_async(
        None, client, model="gpt-test", instructions=SYSTEM, input=TICKET, tools=tools
    )
    return summary(result)


@pytest.mark.parametrize("api", APIS)
def test_an_async_loop_runs_its_tools_and_a_resume_replays_it_all(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any, api: str
) -> None:
    agent = chat_agent_async if api == "chat" else responses_agent_async
    with FakeModelServer(SCRIPT) as fake:
        first_run_stopped_at(file_store, agent, fake.openai_url, crash_at, "run.before_complete")
        assert sp.resume(file_store, "r") == EXPECTED[api]
        assert (len(fake.requests), fake.orphans) == (3, [])
    assert applied(owner_env) == ONCE


# -- crashes in the middle of a turn ---------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    "point",
    [
        "effect.after_accept:tool@1",  # between the two tool calls of the second turn
        "effect.after_dispatching:tool",  # inside the refund's dispatch: intent durable, not sent
        "effect.after_receiver_commit:tool",  # the owner committed the refund, its receipt lost
    ],
)
def test_a_crash_mid_turn_sends_no_request_twice_and_applies_each_effect_once(
    file_store: sp.Store, owner_env: OwnerService, crash_at: Any, api: str, point: str
) -> None:
    with FakeModelServer(SCRIPT) as fake:
        first_run_stopped_at(file_store, AGENTS[api], fake.openai_url, crash_at, point)
        assert len(fake.requests) == 2  # stopped in the second turn's tool calls
        assert sp.resume(file_store, "r") == EXPECTED[api]
        assert len(fake.requests) == 3
        assert fake.repeated() == []
        assert fake.orphans == []
    assert applied(owner_env) == ONCE


# -- how a loop stops ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api", "ending", "stop"),
    [
        ("chat", Turn.stop("length", text="The order"), "length"),
        ("chat", Turn.stop("content_filter"), "content_filter"),
        ("responses", Turn.stop("max_tokens", text="The order"), "incomplete:max_output_tokens"),
        ("responses", Turn.stop("content_filter"), "incomplete:content_filter"),
    ],
)
def test_a_reply_cut_short_stops_the_loop_with_its_reason(
    file_store: sp.Store, api: str, ending: Turn, stop: str
) -> None:
    script = [Turn.tool_calls(("get_order", {"order_id": "A1"})), ending]
    with FakeModelServer(script) as fake:

        @sp.workflow(f"openai-cut-short-{api}-{stop}")
        def agent(run: sp.Run, url: str) -> dict[str, Any]:
            return summary(loop(api, run, url))

        result = sp.start(file_store, agent, fake.openai_url, run_id="r")
        assert len(fake.requests) == 2
    assert (result["stop"], result["turns"]) == (stop, 2)
    assert result["text"] == ending.content


@pytest.mark.parametrize(("api", "reason"), [("chat", "length"), ("responses", "max_tokens")])
def test_the_calls_of_a_reply_cut_short_get_results_without_running(
    file_store: sp.Store, api: str, reason: str
) -> None:
    """A reply that hit its token limit in the middle of asking for a tool: the call is not
    run (its arguments may be cut), but answered, so the transcript can be carried on."""
    cut = Turn(content="", calls=(("get_order", '{"order_id": "A1"}'),), stop_reason=reason)
    with FakeModelServer([cut, Turn.text("Looked it up.")]) as fake:

        @sp.workflow(f"openai-cut-calls-{api}")
        def agent(run: sp.Run, url: str) -> list[Any]:
            first = loop(api, run, url)
            answered = first.transcript[-1]  # the carried-on loop appends to the same transcript
            carried = None
            if api == "chat":
                client = OpenAI(api_key=KEY, base_url=url, max_retries=0)
                carried = spo.tool_loop(run, client, model="gpt-test", messages=first.transcript, tools=tools)
            return [first.stop, answered, carried.text if carried else None]

        looked_up.clear()
        stop, last, carried = sp.start(file_store, agent, fake.openai_url, run_id="r")
        assert fake.orphans == []
    assert stop in ("length", "incomplete:max_output_tokens")
    assert looked_up == []  # not run
    assert "not run" in (last.get("content") or last.get("output"))
    if api == "chat":
        assert carried == "Looked it up."  # the transcript was valid to send on


@pytest.mark.parametrize("api", APIS)
def test_max_turns_answers_the_last_calls_and_stops(file_store: sp.Store, api: str) -> None:
    again = Turn.tool_calls(("get_order", {"order_id": "A1"}))
    with FakeModelServer(lambda request: again) as fake:

        @sp.workflow(f"openai-max-turns-{api}")
        def agent(run: sp.Run, url: str) -> list[Any]:
            result = loop(api, run, url, max_turns=3)
            return [result.stop, result.turns, result.transcript[-1]]

        stop, turns, last = sp.start(file_store, agent, fake.openai_url, run_id="r")
        assert len(fake.requests) == 3
    assert (stop, turns) == ("max_turns", 3)
    assert last.get("role") == "tool" or last.get("type") == "function_call_output"  # answered


@pytest.mark.parametrize("api", APIS)
def test_arguments_the_model_garbled_are_answered_as_an_error(file_store: sp.Store, api: str) -> None:
    script = [Turn.tool_calls(("get_order", '{"order_id": "A1"')), Turn.text("Sorry.")]
    with FakeModelServer(script) as fake:

        @sp.workflow(f"openai-garbled-{api}")
        def agent(run: sp.Run, url: str) -> str:
            return str(loop(api, run, url).text)

        assert sp.start(file_store, agent, fake.openai_url, run_id="r") == "Sorry."
        answer = fake.requests[1].body
        assert fake.orphans == []
    sent = answer["messages"][-1]["content"] if api == "chat" else answer["input"][-1]["output"]
    assert "JSON" in sent
    assert [sid for sid in file_store.load_ledger("r").steps if sid.startswith("tool.")] == []


def test_a_transcript_given_is_carried_on_in_place(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hello.")]) as fake:
        kept: list[Any] = []

        @sp.workflow("openai-transcript-in-place")
        def agent(run: sp.Run, url: str) -> int:
            messages = sp.Transcript([{"role": "user", "content": "Hi"}])
            client = OpenAI(api_key=KEY, base_url=url, max_retries=0)
            result = spo.tool_loop(run, client, model="gpt-test", messages=messages)
            kept.append(result.transcript is messages)
            return len(messages)

        assert sp.start(file_store, agent, fake.openai_url, run_id="r") == 2
        assert "tools" not in fake.requests[0].body  # no registry, no tools sent
    assert kept == [True]


def test_a_loop_refuses_what_it_sets_itself() -> None:
    client = OpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1")
    with pytest.raises(UsageError) as refused:
        spo.tool_loop(None, client, model="m", messages=[], stream=True)
    assert "stream=" in refused.value.message
    with pytest.raises(UsageError) as not_a_registry:
        spo.responses_tool_loop(None, client, model="m", input="hi", tools=[{"type": "function"}])  # type: ignore[arg-type]
    assert "Tools registry" in not_a_registry.value.message
    with pytest.raises(UsageError):
        spo.tool_loop(None, client, model="m", messages=[], max_turns=0)
    with pytest.raises(UsageError) as twin:
        spo.tool_loop(
            None, AsyncOpenAI(api_key=KEY, base_url="http://127.0.0.1:9/v1"), model="m", messages=[]
        )  # type: ignore[arg-type]
    assert "_async twin" in twin.value.message
