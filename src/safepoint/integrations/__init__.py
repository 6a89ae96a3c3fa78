"""Agent SDKs on the ledger: one module per SDK, each behind its own extra, each built on the
public API only (``safepoint``, ``safepoint.errors``, ``safepoint.types``).

- ``safepoint.integrations.tools`` — tools declared ``pure``, ``read`` or ``effect`` from plain
  functions, their definitions for each SDK, and each tool call run through its step;
- ``safepoint.integrations.anthropic`` (``safepoint[anthropic]``) — a client bound to a run whose
  ``messages.create`` / ``parse`` / ``stream`` are model steps, and a ready tool loop;
- ``safepoint.integrations.openai`` (``safepoint[openai]``) — the same for Chat Completions and
  Responses;
- ``safepoint.integrations.openai_agents`` (``safepoint[openai-agents]``) — the OpenAI Agents
  SDK: a model provider whose calls are model steps, and agents whose function tools are steps;
- ``safepoint.integrations.pydantic_ai`` (``safepoint[pydantic-ai]``) — a durability capability
  that makes every model request, tool call and MCP call of a Pydantic AI agent a step;
- ``safepoint.integrations.mcp`` (``safepoint[mcp]``) — an MCP client whose tool list is a read
  and whose tool calls are steps of each tool's kind, the effect key in ``_meta``;
- ``safepoint.integrations.claude_agent`` (``safepoint[claude-agent]``) — a Claude Agent SDK
  query as a step, its tools answered through the ledger, its session transcript in the ledger.
"""
