"""OpenAI's Responses API (``POST /v1/responses``): a ``response`` as JSON, or typed events
(``response.created`` … ``response.completed``, each with its ``sequence_number``) that
``openai.lib.streaming.responses`` accumulates into the same response."""

from __future__ import annotations

import threading
from typing import Any

from ._openai_chat import ANTHROPIC_ONLY, openai_error
from ._script import RESPONSES, Turn
from ._wire import (
    JSON,
    Ids,
    Refused,
    ScriptProblem,
    WireApi,
    input_tokens,
    output_tokens,
    pieces,
    sse,
    words,
)

_COMPLETED = frozenset({"completed", "stop", "end_turn", "stop_sequence"})
_OUT_OF_TOKENS = frozenset({"incomplete", "max_tokens", "length", "model_context_window_exceeded"})
_FILTERED = frozenset({"refusal", "content_filter"})


class Responses(WireApi):
    """The Responses API: turn = groups of output items (assistant messages, function calls,
    reasoning…) in ``input``, plus the turns of the ``previous_response_id`` chain; every
    ``function_call`` must be answered by a ``function_call_output`` with its ``call_id``, and
    every output must answer a call.

    The one piece of state the fake keeps: the responses it stored (``store`` not false), so a
    ``previous_response_id`` names a turn and the calls it left open, as the real API's does.
    """

    name = RESPONSES
    path = "/v1/responses"
    request_id_header = "x-request-id"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: dict[str, tuple[int, tuple[str, ...]]] = {}  # id -> (turn, call ids)

    def forget(self) -> None:
        """Forget the stored responses (``previous_response_id`` no longer finds them)."""
        with self._lock:
            self._stored.clear()

    def _previous(self, body: JSON) -> tuple[int, tuple[str, ...]] | None:
        previous = body.get("previous_response_id")
        with self._lock:
            return self._stored.get(previous) if isinstance(previous, str) else None

    def turn_of(self, body: JSON) -> int:
        previous = self._previous(body)
        turns = previous[0] + 1 if previous else 0
        in_output = False
        for item in _items(body):
            output = _is_output(item)
            turns += output and not in_output
            in_output = output
        return turns

    def check(self, body: JSON) -> None:
        if "model" not in body:
            raise Refused("Missing required parameter: 'model'.", param="model")
        previous_id = body.get("previous_response_id")
        previous = self._previous(body)
        if previous_id is not None and previous is None:
            raise Refused(
                f"Previous response with id '{previous_id}' not found.", param="previous_response_id"
            )
        asked = list(previous[1]) if previous else []
        answered: set[str] = set()
        for item in _items(body):
            if item.get("type") == "function_call":
                asked.append(str(item.get("call_id")))
            elif item.get("type") == "function_call_output":
                call_id = str(item.get("call_id"))
                if call_id not in asked:
                    raise Refused(
                        f"No tool call found for function call output with call_id {call_id}.",
                        orphan=True,
                        param="input",
                    )
                answered.add(call_id)
        for call_id in asked:
            if call_id not in answered:
                raise Refused(
                    f"No tool output found for function call {call_id}.", orphan=True, param="input"
                )

    def render(self, body: JSON, turn: Turn, ids: Ids) -> JSON:
        status, reason = _ending(turn)
        output: list[JSON] = []
        if turn.content or (not turn.calls and turn.stop_reason is None):
            output.append(
                {
                    "id": "msg_" + ids.hex("message", 48),
                    "type": "message",
                    "status": status,
                    "content": [
                        {"type": "output_text", "annotations": [], "logprobs": [], "text": turn.content}
                    ],
                    "role": "assistant",
                }
            )
        for index, (name, arguments) in enumerate(turn.calls):
            output.append(
                {
                    "id": "fc_" + ids.hex(f"item.{index}", 48),
                    "type": "function_call",
                    "status": "completed",
                    "arguments": arguments,
                    "call_id": "call_" + ids.base62(f"tool.{index}", 24),
                    "name": name,
                    "async": False,
                }
            )
        prompt, completion = input_tokens(body), output_tokens(turn)
        reply = {
            "id": "resp_" + ids.hex("response", 48),
            "object": "response",
            "created_at": ids.created,
            "completed_at": ids.created if status == "completed" else None,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": body.get("max_tool_calls"),
            "model": body.get("model"),
            "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_logprobs": body.get("top_logprobs", 0),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            },
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }
        if body.get("store", True) is not False:
            calls = tuple(item["call_id"] for item in output if item["type"] == "function_call")
            answered_turn = self.turn_of(body)
            with self._lock:
                self._stored[reply["id"]] = (answered_turn, calls)
        return reply

    def frames(self, body: JSON, reply: JSON) -> list[bytes]:
        out: list[bytes] = []

        def event(kind: str, **fields: Any) -> None:
            out.append(sse({"type": kind, "sequence_number": len(out), **fields}, kind))

        started = {**reply, "status": "in_progress", "output": [], "usage": None}
        started.update(completed_at=None, incomplete_details=None)
        event("response.created", response=started)
        event("response.in_progress", response=started)
        for index, item in enumerate(reply["output"]):
            where = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                )
                part = item["content"][0]
                event("response.content_part.added", **where, content_index=0, part={**part, "text": ""})
                for piece in words(part["text"]):
                    event("response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[])
                event("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=[])
                event("response.content_part.done", **where, content_index=0, part=part)
            else:
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "arguments": ""},
                )
                for piece in pieces(item["arguments"]):
                    event("response.function_call_arguments.delta", **where, delta=piece)
                event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            event("response.output_item.done", output_index=index, item=item)
        event(
            "response.completed" if reply["status"] == "completed" else "response.incomplete", response=reply
        )
        return out

    def error(self, status: int, message: str | None, *, request_id: str, param: str | None = None) -> JSON:
        return openai_error(status, message, param)

    def request_id(self, ids: Ids) -> str:
        return "req_" + ids.hex("request", 32)


def _ending(turn: Turn) -> tuple[str, str | None]:
    """The response's ``status`` and ``incomplete_details.reason`` for ``turn``."""
    reason = turn.stop_reason
    if turn.calls or reason is None or reason in _COMPLETED:
        return "completed", None
    if reason.startswith("incomplete:"):
        return "incomplete", reason.partition(":")[2]
    if reason in _OUT_OF_TOKENS:
        return "incomplete", "max_output_tokens"
    if reason in _FILTERED:
        return "incomplete", "content_filter"
    if reason in ANTHROPIC_ONLY:
        raise ScriptProblem(
            f"Turn.stop({reason!r}) is Anthropic's alone: the Responses API has no such ending"
        )
    raise ScriptProblem(
        f"Turn.stop({reason!r}) has no form in the Responses API: use 'incomplete:<reason>',"
        " 'max_tokens' or 'content_filter'"
    )


def _items(body: JSON) -> list[JSON]:
    items = body.get("input")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _is_output(item: JSON) -> bool:
    """Whether an input item is one a model produced (a turn's output sent back as input)."""
    kind = item.get("type", "message")
    if kind == "message":
        return item.get("role") == "assistant"
    return not kind.endswith("_output")
