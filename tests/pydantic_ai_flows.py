"""A support agent on Pydantic AI made durable by ``SafepointDurability``, for the kill tests
(importable as ``pydantic_ai_flows``).

The conversation is ``agent_flows.SCRIPT`` at the fake model server: the model looks the order up
(a read), refunds it and e-mails the customer in one turn (two effects), e-mails the manager,
then answers. The effects go to the local effect owner (``$SAFEPOINT_OWNER_URL``), which counts
what it applied; the tools send it ``safepoint.current_effect_key()`` as the idempotency key.

``support_mcp_chat`` is the same agent with its e-mails sent by an MCP server over stdio
(``tests/mcp_server.py``'s ``send_email``, through ``pydantic_ai.mcp.MCPToolset``): the server files
them at the owner under the key it finds in ``_meta``.

Step ids: ``model``, ``model#2``, … for the model requests; ``tool.<tool_call_id>`` per call;
``tools.crm`` for the MCP server's tool list.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models import Model
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

import safepoint as sp
from agent_flows import FAKE_MODEL_URL_ENV, ORDERS, PID_HEADER, SYSTEM
from mcp_flows import SERVER
from safepoint.integrations import pydantic_ai as sppa
from safepoint.testing import owner_client

# The owner keeps idempotency keys a day: its "not applied" can be trusted within that.
DEDUP = timedelta(hours=23)


def _found(resource: str, key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    found = owner_client().find_by_key(resource, str(key))
    return sp.Applied(found) if found is not None else sp.NotApplied()


def find_refund(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    return _found("refunds", key)


def find_email(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    return _found("tickets", key)


REFUND = sppa.effect(key_fields=["order_id"], reconcile=find_refund, dedup_retention=DEDUP)
EMAIL = sppa.effect(key_fields=["to", "subject"], reconcile=find_email, dedup_retention=DEDUP)


def support_agent(model: Model, *, mcp: bool = False) -> Agent[None, str]:
    """The support agent on ``model``, durable: its tools declared by kind in their metadata —
    with ``mcp``, its e-mails sent by the MCP server, declared by name to the capability."""
    if mcp:
        # imported here: the MCP client is 2 s of imports, paid by every process of every
        # kill trial otherwise, MCP or not
        from fastmcp.client.transports import StdioTransport
        from pydantic_ai.mcp import MCPToolset

        crm = MCPToolset(
            StdioTransport(command=sys.executable, args=[SERVER], env=dict(os.environ)), id="crm"
        )
        agent = Agent(
            model,
            name="support",
            instructions=SYSTEM,
            toolsets=[crm.filtered(lambda ctx, tool: tool.name == "send_email")],
            capabilities=[sppa.SafepointDurability(tools={"send_email": EMAIL["safepoint"]})],
        )
    else:
        agent = Agent(model, name="support", instructions=SYSTEM, capabilities=[sppa.SafepointDurability()])

    @agent.tool_plain
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up an order by its id."""
        return ORDERS[order_id]

    @agent.tool_plain(metadata=REFUND)
    def refund(order_id: str, amount_cents: int) -> Any:
        """Refund an order to the customer."""
        payload = {"order_id": order_id, "amount_cents": amount_cents}
        return owner_client().create("refunds", payload, idempotency_key=str(sp.current_effect_key()))

    if not mcp:

        @agent.tool_plain(metadata=EMAIL)
        def send_email(to: str, subject: str, body: str) -> Any:
            """Send an e-mail."""
            payload = {"to": to, "subject": subject, "body": body}
            return owner_client().create("tickets", payload, idempotency_key=str(sp.current_effect_key()))

    return agent


def _client() -> AsyncOpenAI:
    # The SDK's retries are off: the model step retries. The header names this process, so that
    # a kill test can SIGKILL it while the fake holds its request.
    return AsyncOpenAI(
        api_key="sk-test-not-real",
        base_url=os.environ[FAKE_MODEL_URL_ENV] + "/v1",
        max_retries=0,
        default_headers={PID_HEADER: str(os.getpid())},
    )


def _ending(result: Any) -> dict[str, Any]:
    return {"output": result.output, "messages": len(result.all_messages())}


@sp.workflow("support-pydantic-ai-chat", version="1")
async def support_chat(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    agent = support_agent(OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=_client())))
    return _ending(await agent.run(ticket))


@sp.workflow("support-pydantic-ai-responses", version="1")
async def support_responses(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    agent = support_agent(OpenAIResponsesModel("gpt-test", provider=OpenAIProvider(openai_client=_client())))
    return _ending(await agent.run(ticket))


@sp.workflow("support-pydantic-ai-mcp", version="1")
async def support_mcp_chat(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    model = OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=_client()))
    return _ending(await support_agent(model, mcp=True).run(ticket))
