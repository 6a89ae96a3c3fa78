"""A tool-use conversation with Claude on the ledger: the turns to append (the assistant's, the
tool results), and the loop that alternates them until the model stops.

Each model call is a model step (replayed on a resume), each tool call a step of its own
(``tool.<tool_use id>``: an effect is dispatched at most once). Every ``tool_use`` of a turn is
answered before the next model call — after a crash too, as the steps replay or settle — so the
model is never sent a tool call without its result.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, cast

from anthropic.resources import AsyncMessages
from anthropic.types import Message

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations._anthropic_client import AsyncBoundAnthropic, BoundAnthropic, bind
from safepoint.integrations._anthropic_request import reply_json, text_of
from safepoint.integrations._common import LoopResult, as_transcript, check_turns, not_run, without_none
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


def _ended(message: Any, transcript: sp.Transcript, stop: str | None, turns: int) -> LoopResult[Message]:
    reason = stop if stop is not None else message.stop_reason
    return LoopResult(
        final=message,
        transcript=transcript,
        stop=reason if isinstance(reason, str) else "unknown",
        turns=turns,
        text=text_of(message),
    )


# The loop, written once for both drivers: it yields what it needs — ("model", None): the next
# reply; ("tools", reply): the user turn answering the reply's tool calls — and is sent it.
Conversation = Generator[tuple[str, Any], Any, LoopResult[Message]]


def _conversation(transcript: sp.Transcript, tools: Tools | None, max_turns: int) -> Conversation:
    turns = 0
    while True:
        reply = yield ("model", None)
        turns += 1
        transcript.append(assistant_turn(reply))
        then = _next(reply, tools)
        if then is None:
            unanswered = tool_calls(reply)  # a reply cut short (max_tokens) mid tool_use: answered,
            if unanswered:  # not run, so the transcript is valid to carry on
                transcript.append(_results_turn(not_run(unanswered, str(reply.stop_reason))))
            return _ended(reply, transcript, None, turns)
        if then == "tools":
            answered = yield ("tools", reply)
            if answered is not None:
                transcript.append(answered)
        if turns >= max_turns:
            return _ended(reply, transcript, "max_turns", turns)


def _loop_inputs(
    messages: Any, tools: Tools | None, max_turns: int, what: str, params: dict[str, Any]
) -> tuple[sp.Transcript, dict[str, Any], Conversation]:
    check_turns(max_turns)
    if "stream" in params:
        raise UsageError(
            f"{what} reads each reply whole: it takes no stream= (each turn is recorded either way)"
        )
    transcript = as_transcript(messages, f"{what}(messages=...)")
    return transcript, _definitions(tools), _conversation(transcript, tools, max_turns)


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
    transcript, definitions, conversation = _loop_inputs(messages, tools, max_turns, "tool_loop", params)
    need, reply = next(conversation)  # the first thing it needs: a reply
    while True:
        if need == "model":
            answer: Any = bound.messages.create(
                model=model, max_tokens=max_tokens, messages=transcript, **definitions, **params
            )
        else:
            answer = tool_results(run, reply, cast(Tools, tools))
        try:
            need, reply = conversation.send(answer)
        except StopIteration as ended:
            return cast(LoopResult[Message], ended.value)


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
    transcript, definitions, conversation = _loop_inputs(
        messages, tools, max_turns, "tool_loop_async", params
    )
    need, reply = next(conversation)  # the first thing it needs: a reply
    while True:
        if need == "model":
            answer: Any = await bound.messages.create(
                model=model, max_tokens=max_tokens, messages=transcript, **definitions, **params
            )
        else:
            answer = await tool_results_async(run, reply, cast(Tools, tools))
        try:
            need, reply = conversation.send(answer)
        except StopIteration as ended:
            return cast(LoopResult[Message], ended.value)
