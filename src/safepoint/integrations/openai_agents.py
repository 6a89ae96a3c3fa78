"""The OpenAI Agents SDK on the ledger (``pip install 'safepoint[openai-agents]'``): an agent
run inside an ``async def`` workflow becomes durable with two changed lines.

    from agents import Agent, Runner
    from safepoint.integrations import openai_agents as spoa

    agent = spoa.durable(Agent(name="support", tools=[...]), tools)      # tools: a Tools registry
    result = await Runner.run(agent, ticket, run_config=spoa.run_config(client=AsyncOpenAI()))

- Each model call (``get_response``, and ``stream_response`` under ``Runner.run_streamed``) is a
  model step — ``model``, ``model#2``, … named ``openai_agents.get_response`` — over the SDK's
  own ``OpenAIResponsesModel`` (``api="chat"``: ``OpenAIChatCompletionsModel``) on an
  ``AsyncOpenAI`` with its retries off: the ledger retries transient failures (408, 409, 429,
  5xx, a connection lost) and a resume replays the recorded ``ModelResponse`` (its output items
  as the API's JSON, its usage, its response id) instead of asking again. The fingerprint covers
  the system instructions, the input items, the model settings (without metadata, store, headers,
  timeouts, retry settings and the SDK's generated prompt-cache key), the tools' and handoffs'
  schemas, the output schema, ``previous_response_id``, ``conversation_id`` and ``prompt``.
- Each function-tool call is the step ``tool.<tool_call_id>``, answered by ``Tools.call_async``
  by its declared kind — pure, read, or an effect dispatched at most once under its idempotency
  key and reconciled with its owner after a crash. The SDK's own refusal to resume a call that
  "already executed, but its output was not committed" never arises: the workflow is re-run
  from the top, and the ledger answers each call.
- ``needs_approval=True`` becomes safepoint's approval: the run waits (``AwaitingApproval``),
  ``safepoint.approve(store, run_id, step_id)`` releases it, bound to the payload's digest.
"""

from __future__ import annotations

try:
    import agents
except ImportError as exc:  # pragma: no cover - the extra is what provides it
    raise ImportError(
        "safepoint.integrations.openai_agents needs the openai-agents package:"
        " pip install 'safepoint[openai-agents]'"
    ) from exc

import dataclasses
from collections.abc import Callable
from typing import Any

import openai

import safepoint as sp
from safepoint.errors import UsageError

from ._openai_agents_model import Api, LedgerModel, LedgerModelProvider
from ._openai_agents_tools import Declared, durable

__all__ = ["Declared", "LedgerModel", "LedgerModelProvider", "durable", "run_config"]


def run_config(
    run: sp.AsyncRun | None = None,
    *,
    client: openai.AsyncOpenAI | None = None,
    api: Api = "responses",
    default_model: str = "gpt-4.1",
    retry: sp.Retry | int | None = None,
    price: Callable[[Any], float] | None = None,
    base: agents.RunConfig | None = None,
) -> agents.RunConfig:
    """A ``RunConfig`` whose model provider is a ``LedgerModelProvider``: every model call of
    ``Runner.run(..., run_config=...)`` is a model step of ``run`` (None: the run whose workflow
    is executing). ``client`` is the ``AsyncOpenAI`` to ask (default: one from the environment;
    its retries are turned off), ``api`` ``"responses"`` or ``"chat"``, ``retry`` the step's
    attempts, ``price(reply_json) -> cost`` counts toward ``sp.Budget(cost=...)``. ``base`` is a
    ``RunConfig`` of your own to carry on (its model provider replaced)."""
    if base is not None and not isinstance(base, agents.RunConfig):
        raise UsageError(f"base= is an agents.RunConfig, not {type(base).__name__}")
    provider = LedgerModelProvider(
        run, client=client, api=api, default_model=default_model, retry=retry, price=price
    )
    config = base or agents.RunConfig()
    # One function tool at a time, in the order the model asked for them: the SDK would start
    # them all at once, and the order in which they reach their steps would then follow the
    # latency of hooks and guardrails — on a resume, a call that was not dispatched could come
    # before one that was, and the ledger refuses that as another path (ReplayMismatch).
    execution = dataclasses.replace(
        config.tool_execution or agents.ToolExecutionConfig(), max_function_tool_concurrency=1
    )
    return dataclasses.replace(config, model_provider=provider, tool_execution=execution)
