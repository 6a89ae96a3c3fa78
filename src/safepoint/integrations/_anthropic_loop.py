"""A tool-use conversation with Claude on the ledger: the turns to append (the assistant's, the
tool results), and the loop that alternates them until the model stops.

Each model call is a model step (replayed on a resume), each tool call a step of its own
(``tool.<tool_use id>``: an effect is dispatched at most once). Every ``tool_use`` of a turn is
answered before the next model call — after a crash too, as the steps replay or settle — so the
model is never sent a tool call without its result.
"""

from __future__ import annotations

from typing import Any

from anthropic.resources import AsyncMessages
from anthropic.types import Message

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations._anthropic_client import AsyncBoundAnthropic, BoundAnthropic, bind
from safepoint.integrations._anthropic_request import reply_json, text_of
from safepoint.integrations._common import (
    LoopApi,
    LoopResult,
    as_transcript,
    check_turns,
    run_loop,
    run_loop_async,
    without_none,
)
from safepoint.integrations.tools import ToolCall, ToolOutcome, Tools

# Stop reasons after which the loop asks the model again: it called tools (answered first),
# or paused a long turn (sent back as is, to let it continue).
_TOOL_USE = "tool_use"
_PAUSE = "pause_turn"


def assistant_turn(message: Any) -> dict[str, Any]:
    """The reply as the assistant message to append to the conversation: its content blocks as
    the API's JSON, without the ``null`` fields an input must omit."""
    content = _content(message)
    return {"role": "assistant", "content": without_none(content)}


def _content(message: Any) -> list[Any]:
    recorded = message if isinstance(message, dict) else reply_json(message)
    content = recorded.get("content")
    if not isinstance(content, list):
        raise UsageError("a reply of the Messages API has a content list; this one has none")
    return content


def tool_calls(message: Any) -> list[ToolCall]:
    """The reply's ``tool_use`` blocks, in order, as tool calls (the server's own tools — web
    search, code execution — are answered by the server, not here)."""
    return [
        ToolCall(block["id"], block["name"], block.get("input") or {})
        for block in _content(message)
        if isinstance(block, dict) and block.get("type") == "tool_use"
    ]


def _results_turn(outcomes: list[ToolOutcome]) -> dict[str, Any]:
    content = []
    for outcome in outcomes:
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": outcome.call_id,
            "content": outcome.content,
        }
        if outcome.is_error:
            result["is_error"] = True
        content.append(result)
    return {"role": "user", "content": content}


def tool_results(run: sp.Run | None, message: Any, tools: Tools) -> dict[str, Any] | None:
    """The user turn answering every ``tool_use`` of ``message``, each through its step in the
    order the model gave them; ``None`` when it called no tool. ``run=None``: the current run."""
    calls = tool_calls(message)
    if not calls:
        return None
    return _results_turn(tools.call_all(run, calls))


async def tool_results_async(run: sp.AsyncRun | None, message: Any, tools: Tools) -> dict[str, Any] | None:
    """``tool_results`` in an ``async def`` workflow."""
    calls = tool_calls(message)
    if not calls:
        return None
    return _results_turn(await tools.call_all_async(run, calls))


def _bound(
    run: Any, client: Any, retry: Any, price: Any, step_id: str, *, is_async: bool
) -> BoundAnthropic | AsyncBoundAnthropic:
    """The loop's client: bound here, or as given when already bound (then with its own
    attempts, price and step id)."""
    if isinstance(client, BoundAnthropic | AsyncBoundAnthropic):
        if retry is not None or price is not None:
            raise UsageError("the client is already bound: give retry= and price= to bind(), not to the loop")
        client_is_async = isinstance(client, AsyncBoundAnthropic)
    else:
        client_is_async = isinstance(getattr(client, "messages", None), AsyncMessages)
    if client_is_async is not is_async:
        raise UsageError(
            "tool_loop_async takes an AsyncAnthropic client, in an async def workflow"
            if is_async
            else "tool_loop takes an Anthropic client, in a plain def workflow"
            " (an AsyncAnthropic client: tool_loop_async)"
        )
    if isinstance(client, BoundAnthropic | AsyncBoundAnthropic):
        return client
    bound: BoundAnthropic | AsyncBoundAnthropic = bind(run, client, retry=retry, price=price, step_id=step_id)
    return bound


def _definitions(tools: Tools | None) -> dict[str, Any]:
    if tools is None:
        return {}
    if not isinstance(tools, Tools):
        raise UsageError(
            "tools= is a safepoint.integrations.tools.Tools: the tools the model may call, declared"
        )
    return {"tools": tools.anthropic()}


def _next(message: Any, tools: Tools | None) -> str | None:
    """What the loop does after this reply: ``"tools"``, ``"again"``, or ``None`` to stop."""
    reason = message.stop_reason
    if reason == _TOOL_USE and tools is not None:
        return "tools"
    if reason == _PAUSE:
        return "again"
    return None  # end_turn, stop_sequence, max_tokens, refusal, model_context_window_exceeded, …


def _api(tools: Tools | None) -> LoopApi:
    """The Messages API's side of the loop (a reply paused is sent back as is, its calls left
    for the turn that goes on)."""

    def stop(message: Any, calls: list[ToolCall]) -> str | None:
        reason = message.stop_reason
        return None if _next(message, tools) else reason if isinstance(reason, str) else "unknown"

    return LoopApi(
        key="messages",
        turn=lambda message: [assistant_turn(message)],
        calls=lambda message: [] if message.stop_reason == _PAUSE else tool_calls(message),
        stop=stop,
        results=lambda outcomes: [_results_turn(outcomes)],
        text=text_of,
    )


def _loop_inputs(
    messages: Any, tools: Tools | None, max_turns: int, what: str, params: dict[str, Any]
) -> tuple[dict[str, Any], LoopApi]:
    check_turns(max_turns)
    if "stream" in params:
        raise UsageError(
            f"{what} reads each reply whole: it takes no stream= (each turn is recorded either way)"
        )
    transcript = as_transcript(messages, f"{what}(messages=...)")
    return {**_definitions(tools), **params, "messages": transcript}, _api(tools)


def tool_loop(
    run: sp.Run | None,
    client: Any,
    *,
    model: str,
    messages: Any,
    tools: Tools | None = None,
    max_turns: int = 20,
    max_tokens: int = 4096,
    price: Any = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[Message]:
    """Talk with the model until it stops: each turn a ``messages.create`` step, each tool call
    it makes a step of its own, their results sent back in one user turn.

    ``messages`` is the conversation so far (a list, copied into a ``Transcript``, or a
    ``Transcript``, appended to in place). The loop ends on the model's stop reason
    (``end_turn``, ``stop_sequence``, ``max_tokens``, ``refusal``, …, as ``stop``), or after
    ``max_turns`` model calls (``stop="max_turns"``, the last turn's tool calls answered, so the
    transcript is valid to carry on). ``pause_turn`` is sent back as is, for the model to go on.
    ``params`` go to every ``create`` (``system=``, ``tool_choice=``, ``thinking=``, …);
    ``price``, ``retry`` and ``step_id`` as for ``bind``."""
    bound = _bound(run, client, retry, price, step_id, is_async=False)
    assert isinstance(bound, BoundAnthropic)
    params |= {"model": model, "max_tokens": max_tokens}
    request, api = _loop_inputs(messages, tools, max_turns, "tool_loop", params)
    return run_loop(api, request, max_turns, bound.messages.create, run, tools or Tools())


async def tool_loop_async(
    run: sp.AsyncRun | None,
    client: Any,
    *,
    model: str,
    messages: Any,
    tools: Tools | None = None,
    max_turns: int = 20,
    max_tokens: int = 4096,
    price: Any = None,
    retry: sp.Retry | int | None = None,
    step_id: str = "model",
    **params: Any,
) -> LoopResult[Message]:
    """``tool_loop`` with an ``AsyncAnthropic`` client, in an ``async def`` workflow."""
    bound = _bound(run, client, retry, price, step_id, is_async=True)
    assert isinstance(bound, AsyncBoundAnthropic)
    params |= {"model": model, "max_tokens": max_tokens}
    request, api = _loop_inputs(messages, tools, max_turns, "tool_loop_async", params)
    return await run_loop_async(api, request, max_turns, bound.messages.create, run, tools or Tools())
