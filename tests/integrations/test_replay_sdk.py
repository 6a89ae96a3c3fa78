"""Offline replay (``safepoint.testing.replay``) of runs recorded through the agent-SDK
integrations — Anthropic's and OpenAI's tool loops (Chat Completions and Responses), the OpenAI
Agents SDK and Pydantic AI — with the real SDK packages over HTTP to the fake model server and
the refund applied by the local effect owner (a real process), on SQLite and PostgreSQL.

One conversation is recorded per SDK: the model looks the order up (a read tool), refunds it
(an effect tool), then answers — three model calls, two tool calls. Replayed unchanged, it
reaches the run's end with no request to the model, no lookup, no refund and nothing written.
A system prompt edited, or the read tool renamed, is reported at the first model call: both
change the question the model was asked there. A live replay from the second model call (an
eval) asks the model again from there — and only from there — with the refund sent to the stub
given in ``effects=``, never to its owner."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import pytest
from agents import Agent, Runner, set_tracing_disabled
from openai import AsyncOpenAI, OpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import safepoint as sp
from safepoint.integrations import anthropic as spa
from safepoint.integrations import openai as spo
from safepoint.integrations import openai_agents as spoa
from safepoint.integrations import pydantic_ai as sppa
from safepoint.integrations.tools import Tools
from safepoint.testing import (
    FakeModelServer,
    FakeRequest,
    OwnerService,
    ReplayReport,
    Turn,
    owner_client,
    owner_effect,
    replay,
)
from safepoint.types import StepKind

set_tracing_disabled(True)  # the Agents SDK would export its traces over the network

KEY = "sk-test-fake"
SYSTEM = "You are a support agent. Refund orders that did not arrive."
EDITED = SYSTEM + " Answer in one sentence."
TICKET = "Order A1 never arrived; please refund it."
ORDER = {"order_id": "A1", "customer": "ada@example.com", "total_cents": 4200}
ANSWER = "Refunded order A1."

# The conversation as recorded: a lookup, a refund, an answer.
RECORDED = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("refund", {"order_id": "A1", "amount_cents": 4200})),
    Turn.text(ANSWER),
]
# The eval's model answers otherwise from its second call on (a new model, a new prompt).
HALF = {"order_id": "A1", "amount_cents": 2100}
EVAL = [RECORDED[0], Turn.tool_calls(("refund", HALF)), Turn.text("Refunded half of order A1.")]

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
    "required": ["order_id", "amount_cents"],
}
REFUNDS = owner_effect("refunds", name="replay-refunds")

looked_up: list[str] = []


def get_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id."""
    looked_up.append(order_id)
    return ORDER


class Script:
    """The fake model server's script, which a test may change between the recording and a
    live replay: the server, and the URL the workflow's client was given, stay the same."""

    def __init__(self) -> None:
        self.turns = list(RECORDED)

    def __call__(self, request: FakeRequest) -> Turn:
        return self.turns[request.turn]


# -- the agents, one per SDK ------------------------------------------------------------------


@dataclass(frozen=True)
class Code:
    """What a build of the workflow varies: the system prompt, the read tool's name (as the
    model sees it), whether the workflow declares its tools and prompt (its manifest), and its
    compatibility policy."""

    system: str = SYSTEM
    read_name: str = "get_order"
    declared: bool = True
    compatibility: str = "refuse"


def shop_tools(code: Code) -> Tools:
    tools = Tools()
    tools.add(code.read_name, "read", get_order)
    tools.add(
        "refund",
        "effect",
        effect=REFUNDS,
        key_fields=("order_id",),
        description="Refund an order to the customer.",
        schema=REFUND_SCHEMA,
    )
    return tools


def options(code: Code, model: str, tools: Any) -> dict[str, Any]:
    """``@sp.workflow``'s options for ``code``: its manifest declared, or not."""
    found: dict[str, Any] = {"compatibility": code.compatibility}
    if code.declared:
        found.update(tools=tools, models=[model], prompts={"system": code.system})
    return found


def ending(text: str | None) -> dict[str, Any]:
    return {"text": text}


def anthropic_agent(name: str, fake: FakeModelServer, code: Code) -> sp.Workflow:
    tools = shop_tools(code)
    client = anthropic.Anthropic(api_key=KEY, base_url=fake.url, max_retries=0)

    @sp.workflow(name, **options(code, "claude-test", tools.anthropic()))
    def agent(run: sp.Run, ticket: str) -> dict[str, Any]:
        messages = [{"role": "user", "content": ticket}]
        result = spa.tool_loop(
            run,
            client,
            model="claude-test",
            system=code.system,
            messages=messages,
            tools=tools,
            max_tokens=512,
        )
        return ending(result.text)

    return agent


def openai_agent(api: str) -> Callable[[str, FakeModelServer, Code], sp.Workflow]:
    """The OpenAI tool loop of ``api``: ``"chat"`` (Chat Completions) or ``"responses"``."""

    def build(name: str, fake: FakeModelServer, code: Code) -> sp.Workflow:
        tools = shop_tools(code)
        client = OpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)
        schemas = tools.openai_chat() if api == "chat" else tools.openai_responses()

        @sp.workflow(name, **options(code, "gpt-test", schemas))
        def agent(run: sp.Run, ticket: str) -> dict[str, Any]:
            if api == "chat":
                messages = [{"role": "system", "content": code.system}, {"role": "user", "content": ticket}]
                return ending(
                    spo.tool_loop(run, client, model="gpt-test", messages=messages, tools=tools).text
                )
            result = spo.responses_tool_loop(
                run, client, model="gpt-test", instructions=code.system, input=ticket, tools=tools
            )
            return ending(result.text)

        return agent

    return build


def agents_agent(name: str, fake: FakeModelServer, code: Code) -> sp.Workflow:
    tools = shop_tools(code)
    support = spoa.durable(Agent(name="support", instructions=code.system, model="gpt-test"), tools)

    @sp.workflow(name, **options(code, "gpt-test", tools.openai_responses()))
    async def agent(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        # a client per event loop: its connections belong to the loop that opened them
        client = AsyncOpenAI(api_key=KEY, base_url=fake.openai_url)
        result = await Runner.run(support, ticket, run_config=spoa.run_config(client=client))
        return ending(result.final_output)

    return agent


def pydantic_agent(name: str, fake: FakeModelServer, code: Code) -> sp.Workflow:
    def refund(order_id: str, amount_cents: int) -> Any:
        """Refund an order to the customer."""
        payload = {"order_id": order_id, "amount_cents": amount_cents}
        return owner_client().create("refunds", payload, idempotency_key=str(sp.current_effect_key()))

    # Pydantic AI's tools are its own: the manifest names them with the schemas the model is shown.
    shown = {code.read_name: {"description": get_order.__doc__}, "refund": REFUND_SCHEMA}

    @sp.workflow(name, **options(code, "gpt-test", shown))
    async def agent(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        client = AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0)
        model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))
        support = PydanticAgent(
            model, name="support", instructions=code.system, capabilities=[sppa.SafepointDurability()]
        )
        support.tool_plain(name=code.read_name)(get_order)
        support.tool_plain(metadata=sppa.effect(key_fields=["order_id"]))(refund)
        return ending((await support.run(ticket)).output)

    return agent


@dataclass(frozen=True)
class Sdk:
    build: Callable[[str, FakeModelServer, Code], sp.Workflow]
    effect: str  # the refund's effect name: what effects= stubs it under
    payload: Callable[[dict[str, Any]], Any]  # the refund's payload, as its effect is sent it


def arguments(value: dict[str, Any]) -> Any:
    return value


def named_call(value: dict[str, Any]) -> Any:
    return {"name": "refund", "arguments": value}


SDKS = {
    "anthropic": Sdk(anthropic_agent, "replay-refunds", arguments),
    "openai-chat": Sdk(openai_agent("chat"), "replay-refunds", arguments),
    "openai-responses": Sdk(openai_agent("responses"), "replay-refunds", arguments),
    "openai-agents": Sdk(agents_agent, "replay-refunds", arguments),
    "pydantic-ai": Sdk(pydantic_agent, "refund", named_call),
}


# -- recording, and what a replay must leave alone ----------------------------------------------


@dataclass
class Recorded:
    sdk: Sdk
    name: str
    run_id: str
    fake: FakeModelServer
    script: Script

    def build(self, code: Code) -> sp.Workflow:
        """This code deployed under the recorded workflow's name, as a new process would."""
        sp.testing.forget_workflows(self.name)
        return self.sdk.build(self.name, self.fake, code)


def refunds(owner: OwnerService) -> int:
    return int(owner.client.stats()["by_resource"].get("refunds", 0))


def record(
    store: sp.Store, sdk: Sdk, fake: FakeModelServer, script: Script, owner: OwnerService, code: Code
) -> Recorded:
    """One run of the support agent under ``code``, recorded as the SDK ran it: three model
    calls, a lookup and a refund at the owner."""
    name = f"replayed-{uuid.uuid4().hex[:8]}"
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    looked_up.clear()
    assert sp.start(store, sdk.build(name, fake, code), TICKET, run_id=run_id) == {"text": ANSWER}
    steps = ledger_steps(store, run_id)
    assert [s.kind for s in steps] == [
        StepKind.MODEL,
        StepKind.READ,
        StepKind.MODEL,
        StepKind.EFFECT,
        StepKind.MODEL,
    ], [(s.step_id, s.kind) for s in steps]
    assert len(fake.requests) == 3
    assert fake.orphans == []
    assert looked_up == ["A1"]
    assert refunds(owner) == 1
    return Recorded(sdk, name, run_id, fake, script)


def ledger_steps(store: sp.Store, run_id: str) -> list[Any]:
    return sorted(store.load_ledger(run_id).steps.values(), key=lambda s: s.seq)


def model_steps(store: sp.Store, run_id: str) -> list[str]:
    return [s.step_id for s in ledger_steps(store, run_id) if s.kind is StepKind.MODEL]


def untouched(store: sp.Store, owner: OwnerService, recorded: Recorded) -> Callable[..., None]:
    """A check that, since this moment, the fake model server got ``asked`` requests, the read
    tool ran ``read`` times (a live replay runs reads after its cut for real), the owner applied
    nothing and the store is as it was."""
    requests, applied, lookups = len(recorded.fake.requests), refunds(owner), list(looked_up)
    ledger, events = store.load_ledger(recorded.run_id), len(store.events(recorded.run_id))

    def check(asked: int = 0, read: int = 0) -> None:
        assert len(recorded.fake.requests) == requests + asked, "the replay asked the model"
        assert looked_up == lookups + ["A1"] * read, "the replay ran the read tool"
        assert refunds(owner) == applied, "an effect reached its owner"
        assert store.load_ledger(recorded.run_id) == ledger
        assert len(store.events(recorded.run_id)) == events

    return check


def evaluating(
    store: sp.Store, owner: OwnerService, recorded: Recorded, model_call: int
) -> tuple[str, Callable[..., None]]:
    """An eval's start: the step id of the recorded run's ``model_call``-th model call (0 the
    first) to cut a live replay at, the model answering as ``EVAL`` says from now on, and the
    check that the replay left the rest alone (``untouched``)."""
    cut = model_steps(store, recorded.run_id)[model_call]
    recorded.script.turns = list(EVAL)
    return cut, untouched(store, owner, recorded)


def refused(payload: Any, key: sp.EffectKey) -> Any:
    """A stub the replay must not reach."""
    raise AssertionError("the stub was called")


@pytest.fixture(params=list(SDKS))
def sdk(request: pytest.FixtureRequest) -> Sdk:
    return SDKS[request.param]


@pytest.fixture
def recording(store: sp.Store, sdk: Sdk, owner_env: OwnerService) -> Any:
    """Records a run under the code given, with the fake model server up for the whole test."""
    script = Script()
    with FakeModelServer(script) as fake:
        yield lambda code: record(store, sdk, fake, script, owner_env, code)
        assert fake.orphans == []


@pytest.fixture
def recorded(recording: Callable[[Code], Recorded]) -> Recorded:
    """A run recorded by the workflow that declares its tools, model and prompt."""
    return recording(Code())


# -- replayed unchanged -------------------------------------------------------------------------


def test_an_unchanged_agent_replays_to_the_end_asking_and_sending_nothing(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    check = untouched(store, owner_env, recorded)
    report = replay(store, recorded.run_id)  # the workflow registered under the run's name
    check()
    assert report.ok, report
    assert report.reached.value == "end"
    assert report.resume.value == "carry on", report.why
    assert report.changes == ()
    assert report.replayed == report.recorded == 5
    assert report.result == {"text": ANSWER}


# -- a prompt edited, a tool renamed ------------------------------------------------------------


def diverged_at_first_model_call(store: sp.Store, recorded: Recorded, report: ReplayReport) -> None:
    first = model_steps(store, recorded.run_id)[0]
    assert not report.ok
    assert report.reached.value == "diverged"
    divergence = report.divergence
    assert divergence is not None
    assert (divergence.kind, divergence.step_id) == ("changed", first), divergence
    assert divergence.asked is not None
    assert divergence.recorded is not None
    assert divergence.asked.kind is divergence.recorded.kind is StepKind.MODEL
    assert divergence.asked.input_hash != divergence.recorded.input_hash
    assert report.replayed == 0  # nothing before it was answered


def test_an_edited_system_prompt_is_reported_at_the_first_model_call(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    edited = recorded.build(Code(system=EDITED))
    check = untouched(store, owner_env, recorded)
    report = replay(store, recorded.run_id, edited)
    check()
    diverged_at_first_model_call(store, recorded, report)
    # The workflow declares its prompt: the claim of a resume already refuses the run.
    assert report.changes == ("prompt 'system' changed",)
    assert report.resume.value == "block"
    assert "incompatible_workflow" in report.why
    assert report.divergence is not None
    assert (report.divergence.resume.value, report.divergence.phase) == ("block", "stale_checkpoint")


def test_an_edited_prompt_undeclared_under_replan_is_reported_at_the_first_model_call(
    store: sp.Store, owner_env: OwnerService, recording: Callable[[Code], Recorded]
) -> None:
    # No integration puts the prompt in the workflow's manifest by itself: undeclared, the edit
    # is found at the model step only, where a replan policy re-plans from.
    recorded = recording(Code(declared=False, compatibility="replan"))
    edited = recorded.build(Code(system=EDITED, declared=False, compatibility="replan"))
    check = untouched(store, owner_env, recorded)
    report = replay(store, recorded.run_id, edited)
    check()
    diverged_at_first_model_call(store, recorded, report)
    assert report.changes == ()
    assert report.resume.value == "replan", report.why
    assert report.divergence is not None
    assert (report.divergence.resume.value, report.divergence.phase) == ("replan", None)


def test_a_renamed_tool_is_reported_at_the_first_model_call_that_offered_it(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    # The model chose ``get_order`` from the tools its first request offered it: each model step
    # is fingerprinted over the tools it is offered, so the rename changes the first question
    # asked, and that is where the code and the record part. The tool step that followed is
    # never reached — its recorded answer is to a call of a tool this code no longer has (had the
    # replay gone on, the loop would have answered "unknown tool" without a step at all).
    renamed = recorded.build(Code(read_name="lookup_order"))
    check = untouched(store, owner_env, recorded)
    report = replay(store, recorded.run_id, renamed)
    check()
    diverged_at_first_model_call(store, recorded, report)
    assert report.changes == ("tool 'get_order' was removed", "tool 'lookup_order' was added")
    assert report.resume.value == "block"


# -- an eval: a live replay from the second model call ------------------------------------------


def test_a_live_replay_asks_the_model_from_the_cut_and_sends_effects_to_the_stub_only(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    recorded_steps = ledger_steps(store, recorded.run_id)
    cut, check = evaluating(store, owner_env, recorded, 1)
    sent: list[tuple[Any, str]] = []

    def stub(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
        sent.append((payload, str(key)))
        return {"id": "re_stub", "status": "stubbed"}

    asked_before = len(recorded.fake.requests)
    report = replay(store, recorded.run_id, live_from=cut, effects={recorded.sdk.effect: stub})
    check(asked=2)
    after_cut = recorded.fake.requests[asked_before:]
    # exactly the second and third model calls were asked: the first came from the record
    assert [r.turn for r in after_cut] == [1, 2]
    assert report.ok, report
    assert report.reached.value == "end"
    assert report.result == {"text": "Refunded half of order A1."}
    assert [(s.kind, s.step_id == cut) for s in report.live] == [
        (StepKind.MODEL, True),
        (StepKind.EFFECT, False),
        (StepKind.MODEL, False),
    ]
    # the steps before the cut were answered from the record, not recorded again
    assert report.replayed == 2
    assert all(s.step_id not in {r.step_id for r in recorded_steps[:2]} for s in report.live)
    [(payload, key)] = sent
    assert payload == recorded.sdk.payload(HALF)
    assert key  # the scratch ledger minted its own key


def test_a_prompt_edited_before_the_cut_is_reported_not_asked(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    # The system prompt is part of every model call: the recorded first answer was to the old
    # prompt, so a cut after it diverges there, and nothing goes live.
    edited = recorded.build(Code(system=EDITED))
    cut, check = evaluating(store, owner_env, recorded, 1)
    report = replay(store, recorded.run_id, edited, live_from=cut, effects={recorded.sdk.effect: refused})
    check()
    diverged_at_first_model_call(store, recorded, report)
    assert report.live == ()


def test_an_edited_prompt_is_evaluated_live_from_the_first_model_call(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    edited = recorded.build(Code(system=EDITED))
    first, check = evaluating(store, owner_env, recorded, 0)
    sent: list[Any] = []
    asked_before = len(recorded.fake.requests)
    report = replay(
        store,
        recorded.run_id,
        edited,
        live_from=first,
        effects={recorded.sdk.effect: lambda payload, key: sent.append(payload) or {"id": "re_stub"}},
    )
    check(asked=3, read=1)  # all of it live: the lookup too
    asked = recorded.fake.requests[asked_before:]
    assert [r.turn for r in asked] == [0, 1, 2]
    assert all(EDITED in json.dumps(r.body) for r in asked)  # the new prompt was asked
    assert report.result == {"text": "Refunded half of order A1."}
    assert [s.kind for s in report.live] == [
        StepKind.MODEL,
        StepKind.READ,
        StepKind.MODEL,
        StepKind.EFFECT,
        StepKind.MODEL,
    ]
    assert sent == [recorded.sdk.payload(HALF)]
    # a declared manifest: what a resume of the recorded run would do is still to refuse it
    assert report.changes == ("prompt 'system' changed",)


def test_a_live_replay_without_a_stub_for_the_effect_tool_says_so_and_sends_nothing(
    store: sp.Store, owner_env: OwnerService, recorded: Recorded
) -> None:
    cut, check = evaluating(store, owner_env, recorded, 1)
    with pytest.raises(sp.UsageError, match=f"effect '{recorded.sdk.effect}', which effects= gives no stub"):
        replay(store, recorded.run_id, live_from=cut)
    check(asked=1)  # the second model call, which asked for the refund
