"""A ``Tools`` registry, given to every binding that takes tools, the way the docs show it: the
bound Anthropic and OpenAI clients take it as ``tools=`` in each call (sent as the API's
definitions, hashed as those, so passing the definitions or the registry is the same step), over
HTTP to the fake model server on loopback; a binding where a registry means nothing refuses it
at once with a ``UsageError`` that says what to pass, before anything is asked or recorded.

The tool loops, ``openai_agents.durable(agent, tools)``, ``claude_agent.query(tools=)`` and an
MCP server's ``tools()`` take the registry too: their own tests drive them with one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import openai
import pytest

import safepoint as sp
from agent_flows import ORDERS, get_order, tools
from safepoint.errors import UsageError
from safepoint.integrations import anthropic as spa
from safepoint.integrations import openai as spo
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn
from safepoint.types import RunStatus

KEY = "sk-test-fake"
MODEL = "model-test"
ASK = [{"role": "user", "content": "Where is order A1?"}]
LOOK_UP = Turn.tool_calls(("get_order", {"order_id": "A1"}))
ANSWER = Turn.text("Order A1 has shipped.")
NAMES = ["get_order", "refund", "send_email"]  # the support agent's tools: a read, two effects


def _script(request: Any) -> Turn:
    """Every conversation that has not asked yet asks for the order; one that has gets the answer."""
    return ANSWER if request.turn else LOOK_UP


def crashed_then_resumed(store: sp.Store, wf: sp.Workflow, crash_at: Any, run_id: str, *args: Any) -> Any:
    """Run ``wf`` to its end, lose the process before the run completes, resume it: every step
    replays from the ledger (the workflow function runs again from the top)."""
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id=run_id, lease_ms=0)
    crash_at(None)
    return sp.resume(store, run_id)


def _tool_steps(store: sp.Store, run_id: str) -> int:
    return sum(step_id.startswith("tool.") for step_id in store.load_ledger(run_id).steps)


def _hashes(store: sp.Store, run_id: str) -> dict[str, str]:
    return {step_id: step.input_hash for step_id, step in store.load_ledger(run_id).steps.items()}


# -- the bound Anthropic client ------------------------------------------------------------------


def _claude_calls(run: sp.Run, url: str, given: Any) -> list[str]:
    """Every kind of Messages call of the bound client, each with ``tools=given``."""
    claude = spa.bind(run, anthropic.Anthropic(api_key=KEY, base_url=url))
    reply = claude.messages.create(model=MODEL, max_tokens=64, messages=ASK, tools=given)
    answered = spa.tool_results(run, reply, tools)
    assert answered is not None
    conversation = [*ASK, spa.assistant_turn(reply), answered]
    with claude.messages.stream(model=MODEL, max_tokens=64, messages=conversation, tools=given) as stream:
        streamed = stream.get_final_text()
    beta = claude.beta.messages.create(model=MODEL, max_tokens=64, messages=conversation, tools=given)
    return [reply.stop_reason or "", streamed, beta.content[0].text]  # type: ignore[union-attr]


@sp.workflow("registry-anthropic")
def claude_with_registry(run: sp.Run, url: str) -> list[str]:
    return _claude_calls(run, url, tools)


@sp.workflow("registry-anthropic-definitions")
def claude_with_definitions(run: sp.Run, url: str) -> list[str]:
    return _claude_calls(run, url, tools.anthropic())


def test_the_bound_anthropic_client_takes_the_registry_in_each_call(
    file_store: sp.Store, crash_at: Any
) -> None:
    with FakeModelServer(_script) as fake:
        said = crashed_then_resumed(file_store, claude_with_registry, crash_at, "r", fake.url)
        assert said == ["tool_use", "Order A1 has shipped.", "Order A1 has shipped."]
        assert len(fake.requests) == 3  # the resume asked nothing
        assert [r.body["tools"] for r in fake.requests] == [tools.anthropic()] * 3
        assert _tool_steps(file_store, "r") == 1  # the call went through its step once
        sp.start(file_store, claude_with_definitions, fake.url, run_id="d")
    assert _hashes(file_store, "r") == _hashes(file_store, "d")  # the registry hashes as its definitions


# -- the bound OpenAI client ---------------------------------------------------------------------


def _definitions(api: str) -> list[dict[str, Any]]:
    return tools.openai_chat() if api == "chat" else tools.openai_responses()


def _gpt_calls(run: sp.Run, url: str, api: str, given: Any) -> list[str]:
    """``create``, ``create(stream=True)`` and ``stream`` of the bound client, each with
    ``tools=given``, the first's tool call answered through the registry."""
    gpt = spo.bind(run, openai.OpenAI(api_key=KEY, base_url=url, max_retries=0))
    if api == "chat":
        completion = gpt.chat.completions.create(model=MODEL, messages=ASK, tools=given)
        conversation = [*ASK, spo.chat_turn(completion), *spo.chat_tool_results(run, completion, tools)]
        chunks = list(
            gpt.chat.completions.create(model=MODEL, messages=conversation, tools=given, stream=True)
        )
        with gpt.chat.completions.stream(model=MODEL, messages=conversation, tools=given) as stream:
            final = stream.get_final_completion().choices[0].message.content or ""
        return [completion.choices[0].finish_reason, str(len(chunks) > 1), final]
    response = gpt.responses.create(model=MODEL, input=ASK, tools=given)
    items = [*ASK, *spo.response_items(response), *spo.response_tool_results(run, response, tools)]
    events = list(gpt.responses.create(model=MODEL, input=items, tools=given, stream=True))
    with gpt.responses.stream(model=MODEL, input=items, tools=given) as stream:
        final = stream.get_final_response().output_text
    return [response.output[0].type, str(len(events) > 1), final]


@sp.workflow("registry-openai")
def gpt_with_registry(run: sp.Run, url: str, api: str) -> list[str]:
    return _gpt_calls(run, url, api, tools)


@sp.workflow("registry-openai-definitions")
def gpt_with_definitions(run: sp.Run, url: str, api: str) -> list[str]:
    return _gpt_calls(run, url, api, _definitions(api))


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_bound_openai_client_takes_the_registry_in_each_call(
    file_store: sp.Store, crash_at: Any, api: str
) -> None:
    with FakeModelServer(_script) as fake:
        said = crashed_then_resumed(file_store, gpt_with_registry, crash_at, "r", fake.openai_url, api)
        first = "tool_calls" if api == "chat" else "function_call"
        assert said == [first, "True", "Order A1 has shipped."]
        assert len(fake.requests) == 3  # the resume asked nothing
        assert [r.body["tools"] for r in fake.requests] == [_definitions(api)] * 3
        assert _tool_steps(file_store, "r") == 1
        sp.start(file_store, gpt_with_definitions, fake.openai_url, api, run_id="d")
    assert _hashes(file_store, "r") == _hashes(file_store, "d")


@pytest.mark.parametrize("api", ["chat", "responses"])
def test_the_bound_async_openai_client_takes_the_registry(file_store: sp.Store, api: str) -> None:
    with FakeModelServer(_script) as fake:

        @sp.workflow(f"registry-openai-async-{api}")
        async def agent(run: sp.AsyncRun) -> str:
            gpt = spo.bind(run, openai.AsyncOpenAI(api_key=KEY, base_url=fake.openai_url, max_retries=0))
            if api == "chat":
                completion = await gpt.chat.completions.create(model=MODEL, messages=ASK, tools=tools)
                answered = await spo.chat_tool_results_async(run, completion, tools)
                return str(answered[0]["content"])
            response = await gpt.responses.create(model=MODEL, input=ASK, tools=tools)
            outputs = await spo.response_tool_results_async(run, response, tools)
            return str(outputs[0]["output"])

        said = sp.start(file_store, agent, run_id="a")  # an async def workflow, on its own loop
        assert json.loads(said) == ORDERS["A1"]  # the registry's tool answered the call
        assert [r.body["tools"] for r in fake.requests] == [_definitions(api)]


# -- bindings where a registry has no meaning: refused at once ----------------------------------


def _refused_before_anything(store: sp.Store, make: Callable[[], Any], says: str) -> None:
    """``make`` (a binding given the registry), called first thing in a workflow, raises a
    UsageError saying ``says``: the run records no step, and no request left."""
    with FakeModelServer(_script) as fake:

        @sp.workflow("registry-refused")
        async def agent(run: sp.AsyncRun) -> None:
            make()

        with pytest.raises(UsageError, match=says):
            sp.start(store, agent, run_id="refused")
        assert fake.requests == []
    assert store.load_ledger("refused").steps == {}
    assert store.get_run("refused").status is RunStatus.FAILED


def test_pydantic_ais_capability_refuses_a_registry_and_says_to_declare_kinds_by_name(
    file_store: sp.Store,
) -> None:
    from safepoint.integrations import pydantic_ai as sppa

    says = r"tools=\{'get_order': \.\.\., 'refund': \.\.\., 'send_email': \.\.\.\}, each sppa\.pure\(\)"
    _refused_before_anything(file_store, lambda: sppa.SafepointDurability(tools=tools), says)
    with pytest.raises(UsageError, match="not a Tools registry"):
        sppa.SafepointDurability(tools=tools)


def test_mcps_wrap_refuses_a_registry_as_kinds_and_says_what_kinds_are(file_store: sp.Store) -> None:
    from safepoint.integrations import mcp as spm

    class Client:
        async def call_tool(self, *args: Any) -> None: ...
        async def list_tools(self, *args: Any) -> None: ...

    _refused_before_anything(
        file_store, lambda: spm.wrap(None, Client(), server_id="crm", kinds=tools), r"kinds=\{'get_order'"
    )


def test_the_claude_agent_takes_the_registry_and_refuses_anything_else_saying_so(
    file_store: sp.Store,
) -> None:
    from safepoint.integrations import claude_agent as spc

    made: list[Any] = []

    @sp.workflow("registry-claude-agent")
    async def agent(run: sp.AsyncRun) -> None:
        made.append(spc.options(run, tools=tools)[0].allowed_tools)
        spc.options(run, tools=[get_order])  # type: ignore[arg-type]

    with pytest.raises(UsageError, match=r"a safepoint\.integrations\.tools\.Tools registry, not list"):
        sp.start(file_store, agent, run_id="c")
    assert made == [[f"mcp__tools__{name}" for name in NAMES]]
    assert file_store.load_ledger("c").steps == {}
