"""A Pydantic AI agent whose tools come from a real MCP server (``pydantic_ai.mcp.MCPToolset``),
made durable by ``SafepointDurability``: in process (the SDK's ``MCPServer`` object, FastMCP's
memory transport) and over stdio (``tests/mcp_server.py`` as a subprocess), the model at the
loopback fake model server. The listing is a recorded read, each call a step of its tool's kind,
the effect key in ``_meta`` and in the tool's key argument, crashes after the server committed."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
from fastmcp.client.transports import StdioTransport
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import safepoint as sp
from mcp_flows import SERVER, Crm
from safepoint.integrations import mcp as spm
from safepoint.integrations import pydantic_ai as sppa
from safepoint.testing import FakeModelServer, OwnerService, SimulatedCrash, Turn
from safepoint.testing import crash_at as crashing
from safepoint.types import StepKind

# Each test starts MCP servers as processes of their own: the slow tier.
pytestmark = pytest.mark.slow

SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("create_ticket", {"subject": "Order A1 never arrived"})),
    Turn.text("Opened a ticket for order A1."),
]


def chat_model(fake: FakeModelServer) -> OpenAIChatModel:
    client = AsyncOpenAI(api_key="sk-test-fake", base_url=fake.openai_url, max_retries=0)
    return OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))


def desk_agent(fake: FakeModelServer, toolset: Any, **durability: Any) -> Agent[None, str]:
    """The agent whose tools are ``toolset``'s (an ``MCPToolset``)."""
    return Agent(
        chat_model(fake),
        name="desk",
        toolsets=[toolset],
        capabilities=[sppa.SafepointDurability(**durability)],
    )


def agent_flow(fake: FakeModelServer, toolset: Callable[[], Any], **durability: Any) -> sp.Workflow[Any, Any]:
    """A workflow that runs the agent; the agent, its HTTP client and its MCP client are made in
    each execution, as they belong to its event loop."""

    async def desk(run: sp.AsyncRun) -> str:
        agent = desk_agent(fake, toolset(), **durability)
        return (await agent.run("Order A1 never arrived.")).output

    return sp.workflow(f"pyd-mcp-{id(desk)}")(desk)


def tools_shown(request: Any) -> dict[str, Any]:
    """The tools a chat request offered the model, by name: their parameter schemas."""
    return {t["function"]["name"]: t["function"]["parameters"] for t in request.body.get("tools", [])}


def test_the_listing_is_a_read_and_the_effect_key_reaches_the_server_in_meta_and_its_argument(
    file_store: sp.Store,
) -> None:
    crm = Crm()
    with FakeModelServer(SCRIPT) as fake:
        flow = agent_flow(fake, lambda: MCPToolset(crm.server, id="crm"))
        assert sp.start(file_store, flow, run_id="pm-1") == "Opened a ticket for order A1."
        shown = tools_shown(fake.requests[0])
    ledger = file_store.load_ledger("pm-1")
    steps = ledger.steps
    assert next(iter(steps)) == "tools.crm"
    assert steps["tools.crm"].kind is StepKind.READ  # the tool list is an input to the next request
    tools = [s for s in steps.values() if s.step_id.startswith("tool.call_")]
    # Undeclared: the kinds come from the server's annotations (readOnlyHint → read, else effect).
    assert [(s.kind, s.name) for s in tools] == [
        (StepKind.READ, "desk__mcp_server__crm.call_tool"),
        (StepKind.EFFECT, "mcp.crm.create_ticket"),
    ]
    [meta] = crm.metas
    key = meta[spm.META_KEY]
    assert key.startswith("sp_")
    assert crm.key_arguments == [key]  # the schema's idempotency-key argument carries it too
    assert list(crm.tickets) == [key]
    # The model is not shown the key argument: the call fills it.
    assert set(shown["create_ticket"]["properties"]) == {"subject"}
    assert set(shown["get_order"]["properties"]) == {"order_id"}


def test_a_crash_after_the_server_committed_is_reconciled_and_the_model_is_not_asked_again(
    file_store: sp.Store,
) -> None:
    crm = Crm()
    ticket = sppa.effect(reconcile=crm.find)["safepoint"]
    with FakeModelServer(SCRIPT) as fake:
        flow = agent_flow(fake, lambda: MCPToolset(crm.server, id="crm"), tools={"create_ticket": ticket})
        with crashing("effect.after_receiver_commit:tool"), pytest.raises(SimulatedCrash):
            sp.start(file_store, flow, run_id="pm-2", lease_ms=0)
        asked = len(fake.requests)
        assert asked == 2
        assert len(crm.tickets) == 1
        assert sp.resume(file_store, "pm-2") == "Opened a ticket for order A1."
        assert len(fake.requests) == asked + 1  # only the request the crash came before
        assert fake.orphans == []
    assert crm.calls["create_ticket"] == 1  # reconciled: not sent again
    assert crm.calls["get_order"] == 1  # the read replayed
    assert len(crm.tickets) == 1


def test_an_undeclared_effect_whose_outcome_a_crash_cut_off_blocks_the_run(file_store: sp.Store) -> None:
    crm = Crm()
    with FakeModelServer(SCRIPT) as fake:
        flow = agent_flow(fake, lambda: MCPToolset(crm.server, id="crm"))
        with crashing("effect.after_receiver_commit:tool"), pytest.raises(SimulatedCrash):
            sp.start(file_store, flow, run_id="pm-3", lease_ms=0)
        with pytest.raises(sp.NeedsReconciliation):
            sp.resume(file_store, "pm-3")
    assert crm.calls["create_ticket"] == 1  # never sent blind


def test_a_timeout_leaves_the_outcome_unknown_not_a_retry_by_the_model(file_store: sp.Store) -> None:
    crm = Crm()
    crm.delay = 2.0
    with FakeModelServer(SCRIPT) as fake:
        flow = agent_flow(fake, lambda: MCPToolset(crm.server, id="crm", read_timeout=0.3))
        with pytest.raises(sp.NeedsReconciliation):
            sp.start(file_store, flow, run_id="pm-4", lease_ms=0)
        assert len(fake.requests) == 2  # the model was not told to try again
    assert crm.calls["create_ticket"] == 1
    assert len(crm.tickets) == 1


def test_outside_a_workflow_the_toolset_runs_as_it_would_without_the_capability() -> None:
    crm = Crm()
    with FakeModelServer(SCRIPT) as fake:
        agent = desk_agent(fake, MCPToolset(crm.server, id="crm"))
        assert agent.run_sync("Order A1 never arrived.").output == "Opened a ticket for order A1."
    assert crm.metas[0].get(spm.META_KEY) is None  # no effect, no key
    assert crm.key_arguments == [""]


def test_a_users_process_tool_call_still_runs_and_sees_the_key(file_store: sp.Store) -> None:
    crm = Crm()
    seen: list[Any] = []

    async def hook(ctx: Any, call_tool: Callable[..., Any], name: str, args: dict[str, Any]) -> Any:
        seen.append((name, dict(args)))
        return await call_tool(name, args, metadata={"trace": "t-1"})

    with FakeModelServer(SCRIPT) as fake:
        flow = agent_flow(fake, lambda: MCPToolset(crm.server, id="crm", process_tool_call=hook))
        sp.start(file_store, flow, run_id="pm-5")
    key = crm.metas[0][spm.META_KEY]
    assert crm.metas[0]["trace"] == "t-1"  # theirs and ours, merged
    assert seen == [
        ("get_order", {"order_id": "A1"}),
        ("create_ticket", {"subject": "Order A1 never arrived", "idempotency_key": key}),
    ]


# -- over stdio -----------------------------------------------------------------------------------

STDIO_SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(
        ("create_ticket", {"subject": "Order A1 never arrived"}),
        ("send_email", {"to": "ada@example.com", "subject": "Your ticket"}),
    ),
    Turn.text("Opened a ticket and told Ada."),
]


def stdio_toolset() -> MCPToolset[Any]:
    """``tests/mcp_server.py`` as a subprocess; it files tickets and e-mails at the local owner,
    deduplicated there by the key in ``_meta``."""
    return MCPToolset(StdioTransport(command=sys.executable, args=[SERVER], env=dict(os.environ)), id="crm")


def find_ticket(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    from safepoint.testing import owner_client

    found = owner_client().find_by_key("tickets", str(key))
    return sp.Applied(json.dumps(found)) if found is not None else sp.NotApplied()


@pytest.mark.parametrize(
    "crash", ["effect.after_receiver_commit:tool", "effect.after_receiver_commit:tool@2"]
)
def test_over_stdio_a_crash_after_the_server_committed_applies_each_effect_once(
    store: sp.Store, owner_env: OwnerService, crash: str
) -> None:
    declared = {
        "create_ticket": sppa.effect(reconcile=find_ticket)["safepoint"],
        "send_email": sppa.effect(reconcile=find_ticket)["safepoint"],
    }
    with FakeModelServer(STDIO_SCRIPT) as fake:
        flow = agent_flow(fake, stdio_toolset, tools=declared)
        with crashing(crash), pytest.raises(SimulatedCrash):
            sp.start(store, flow, run_id="ps-1", lease_ms=0)
        asked = len(fake.requests)
        assert asked == 2
        assert sp.resume(store, "ps-1") == "Opened a ticket and told Ada."
        assert len(fake.requests) == asked + 1  # the model requests before the crash replayed
        assert fake.orphans == []
    stats = owner_env.client.stats()
    assert stats["applied"] == 2
    assert stats["duplicates"] == 0
    steps = store.load_ledger("ps-1").steps
    assert [s.name for s in steps.values() if s.kind is StepKind.EFFECT] == [
        "mcp.crm.create_ticket",
        "mcp.crm.send_email",
    ]


def test_only_an_answer_that_did_nothing_goes_back_to_the_model_as_a_retry() -> None:
    from fastmcp.exceptions import ToolError
    from mcp import MCPError
    from pydantic_ai import ModelRetry

    from safepoint.integrations._pydantic_ai_mcp import _lost

    def retry(cause: BaseException | None) -> ModelRetry:
        try:
            raise ModelRetry("try again") from cause
        except ModelRetry as exc:
            return exc

    timeout = MCPError(-32001, "Request timed out")
    assert _lost(retry(None)) is None  # the tool's own isError result
    assert _lost(retry(ToolError("no such order"))) is None
    assert _lost(retry(MCPError(-32602, "Invalid params"))) is None  # refused before the tool ran
    assert _lost(retry(timeout)) is timeout  # the outcome is unknown
    assert _lost(retry(ExceptionGroup("session", [timeout]))) is timeout
    assert _lost(ValueError("not a retry")) is None
