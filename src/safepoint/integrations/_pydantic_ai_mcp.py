"""Pydantic AI's MCP toolsets on the ledger: the kind an undeclared MCP tool's calls are, the
schema its model is shown, and how an effect's idempotency key reaches the server.

Pydantic AI's durable unit for an MCP call sends the model's arguments and nothing else; the one
place a request-level ``_meta`` can be added is the toolset's ``process_tool_call`` hook (its
``call_tool(name, args, metadata=...)``). So ``SafepointDurability`` gives each ``MCPToolset`` of
its agent a hook — around the user's own, if there is one — that, while an effect's call is being
sent, puts the key in ``_meta`` under ``dev.safepoint/idempotency-key`` and in the tool's
idempotency-key argument when its schema declares one. Any other call passes through unchanged.

The kinds follow ``safepoint.integrations.mcp``'s policy (``_mcp_policy``): a declaration wins; else
the server's ``readOnlyHint`` makes a read, anything else an effect that blocks on uncertainty.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from safepoint.integrations._mcp_policy import (
    META_KEY,
    REFUSED_CODES,
    hinted,
    key_arguments,
    without_key_arguments,
)

__all__ = ["McpTool", "give_key_hook", "hinted_kind", "listed", "schema_shown", "sending"]

# Marks a hook this module made, so that an MCPToolset shared by two agents is wrapped once.
_MARK = "__safepoint_sends_keys__"


@dataclass(frozen=True, slots=True)
class McpTool:
    """An MCP tool as its server listed it: the toolset it came from and the idempotency-key
    arguments its input schema declares (the schema the model is shown leaves them out)."""

    toolset_id: str
    key_arguments: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Sending:
    key: str
    arguments: tuple[str, ...]


# The effect call being sent in this context: its key and the arguments that take it.
_SENDING: ContextVar[_Sending | None] = ContextVar("safepoint_pydantic_ai_mcp_sending", default=None)


@contextmanager
def sending(key: str, arguments: tuple[str, ...]) -> Iterator[None]:
    """While the block runs, an MCP call made in this context carries ``key``."""
    token = _SENDING.set(_Sending(key, arguments))
    try:
        yield
    finally:
        _SENDING.reset(token)


def hinted_kind(metadata: Mapping[str, Any] | None) -> str:
    """The kind an undeclared MCP tool's calls are, from the annotations Pydantic AI keeps in the
    tool definition's metadata (wire names: ``readOnlyHint``, ``idempotentHint``)."""
    hints = (metadata or {}).get("annotations") or {}
    return hinted(hints.get("readOnlyHint"), hints.get("idempotentHint"), trust_idempotent=False).kind


def listed(tool_defs: Any, toolset_id: str) -> dict[str, McpTool]:
    """The tools of a recorded MCP listing (name → tool definition, as JSON or objects)."""
    found: dict[str, McpTool] = {}
    for name, tool_def in dict(tool_defs or {}).items():
        schema = (
            tool_def.get("parameters_json_schema")
            if isinstance(tool_def, dict)
            else getattr(tool_def, "parameters_json_schema", None)
        )
        found[str(name)] = McpTool(toolset_id, tuple(key_arguments(schema)))
    return found


def schema_shown(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a model is shown for an effect tool: the key arguments are ours to fill."""
    return without_key_arguments(schema)


ProcessToolCall = Callable[[Any, Any, str, dict[str, Any]], Awaitable[Any]]


def give_key_hook(toolset: Any) -> None:
    """Give ``toolset`` (an ``MCPToolset``) a ``process_tool_call`` that sends the key of the
    effect call being sent, around the hook it has. Calling it again changes nothing."""
    user_hook: ProcessToolCall | None = toolset.process_tool_call
    if getattr(user_hook, _MARK, False):
        return

    async def process_tool_call(ctx: Any, call_tool: Any, name: str, args: dict[str, Any]) -> Any:
        current = _SENDING.get()
        if current is None:
            return await (
                call_tool(name, args) if user_hook is None else user_hook(ctx, call_tool, name, args)
            )
        args = {**args, **dict.fromkeys(current.arguments, current.key)}

        async def keyed(name: str, args: dict[str, Any], *, metadata: dict[str, Any] | None = None) -> Any:
            try:
                return await call_tool(name, args, metadata={**(metadata or {}), META_KEY: current.key})
            except Exception as exc:
                lost = _lost(exc)
                if lost is None:
                    raise
                raise lost from exc

        return await (keyed(name, args) if user_hook is None else user_hook(ctx, keyed, name, args))

    setattr(process_tool_call, _MARK, True)
    toolset.process_tool_call = process_tool_call


def _lost(exc: BaseException) -> BaseException | None:
    """What made an effect call's outcome unknown, where Pydantic AI would tell the model to try
    again: its MCPToolset turns every protocol error — a timeout, a closed connection — into a
    ``ModelRetry``, and a retry would send the change a second time under a new key. A tool's own
    error result (no protocol error behind it) and a request the server refused before running
    the tool (parse error, invalid request or params, no such method) did nothing: those stay
    the model's to retry."""
    from pydantic_ai.exceptions import ModelRetry, ToolFailed

    if not isinstance(exc, ModelRetry | ToolFailed) or exc.__cause__ is None:
        return None
    cause: BaseException = exc.__cause__
    while isinstance(cause, BaseExceptionGroup) and cause.exceptions:
        cause = cause.exceptions[0]
    if type(cause).__name__ == "ToolError":  # the tool answered with an error: nothing was done
        return None
    code = getattr(cause, "code", None)
    if code is None:
        error = getattr(cause, "error", None)  # the SDK's McpError keeps its ErrorData there
        code = getattr(error, "code", None)
    if code in REFUSED_CODES:
        return None
    return cause
