"""Support agents on the real OpenAI Agents SDK, for the kill tests (importable as
``openai_agents_flows``).

The conversation, the tools and the owner's effects are ``agent_flows``'s: the model looks the
order up (a read), refunds it and e-mails the customer in one turn (two effects, which the SDK
starts concurrently), e-mails the manager, then answers. Here it runs through
``Runner.run`` / ``Runner.run_streamed`` with an agent made durable by ``spoa.durable`` and the
ledger's model provider from ``spoa.run_config``.

Step ids: the model steps are ``model``, ``model#2``, …; each tool call is ``tool.<call id>``.
"""

from __future__ import annotations

import os
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from openai import AsyncOpenAI

import safepoint as sp
from agent_flows import FAKE_MODEL_URL_ENV, PID_HEADER, SYSTEM, TICKET, tools
from safepoint.integrations import openai_agents as spoa

__all__ = ["TICKET", "support_agents", "support_agents_chat", "support_agents_streamed"]

set_tracing_disabled(True)  # traces would be exported over the network

agent = spoa.durable(Agent(name="support", instructions=SYSTEM, model="gpt-test"), tools)


def _client() -> AsyncOpenAI:
    # Each request names the process that sent it, so that a kill test can SIGKILL that process
    # from the fake server while its request is in flight (a header: never hashed).
    return AsyncOpenAI(
        api_key="sk-test-not-real",
        base_url=os.environ[FAKE_MODEL_URL_ENV] + "/v1",
        default_headers={PID_HEADER: str(os.getpid())},
    )


def _ending(result: Any) -> dict[str, Any]:
    return {
        "text": result.final_output,
        "responses": len(result.raw_responses),
        "items": [item.type for item in result.new_items],
    }


@sp.workflow("support-agents", version="1")
async def support_agents(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    result = await Runner.run(agent, ticket, run_config=spoa.run_config(client=_client()))
    return _ending(result)


@sp.workflow("support-agents-chat", version="1")
async def support_agents_chat(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    result = await Runner.run(agent, ticket, run_config=spoa.run_config(client=_client(), api="chat"))
    return _ending(result)


@sp.workflow("support-agents-streamed", version="1")
async def support_agents_streamed(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    result = Runner.run_streamed(agent, ticket, run_config=spoa.run_config(client=_client()))
    events = [event.type async for event in result.stream_events()]
    return {**_ending(result), "events": len(events)}
