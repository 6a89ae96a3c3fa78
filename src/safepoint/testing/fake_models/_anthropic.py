"""Anthropic's Messages API (``POST /v1/messages``): a ``Message`` as JSON, or as the events
``message_start``, ``content_block_start/delta/stop``, ``message_delta``, ``message_stop`` that
``anthropic.lib.streaming`` accumulates into the same message."""

from __future__ import annotations

import json
from typing import Any

from ._script import ANTHROPIC, Turn
from ._wire import (
    JSON,
    Ids,
    Refused,
    ScriptProblem,
    WireApi,
    assistant_messages,
    blocks,
    input_tokens,
    missing_field,
    output_tokens,
    pieces,
    sse,
    words,
)

# A reason named in another API's words, in Anthropic's; any other passes as it is.
_STOPS = {
    "length": "max_tokens",
    "incomplete": "max_tokens",
    "incomplete:max_output_tokens": "max_tokens",
    "content_filter": "refusal",
    "incomplete:content_filter": "refusal",
    "stop": "end_turn",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ERROR_MESSAGES = {
    429: "This request would exceed your organization's rate limit. Please try again later.",
    529: "Overloaded",
}


class AnthropicMessages(WireApi):
    """The Messages API: turn = assistant messages in ``messages``; every ``tool_use`` must be
    answered by a ``tool_result`` in the very next (user) message, and every ``tool_result``
    must answer a ``tool_use`` of the message before."""

    name = ANTHROPIC
    path = "/v1/messages"
    request_id_header = "request-id"

    def turn_of(self, body: JSON) -> int:
        return assistant_messages(body)

    def check(self, body: JSON) -> None:
        missing = missing_field(body, ("max_tokens", "messages", "model"))
        if missing:
            raise Refused(f"{missing}: Field required")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise Refused("messages: Input should be a valid list")
        for i, message in enumerate(messages):
            asked = _tool_use_ids(message)
            if asked:
                after = messages[i + 1] if i + 1 < len(messages) else None
                answered = set(_tool_result_ids(after)) if _role(after) == "user" else set()
                unanswered = [x for x in asked if x not in answered]
                if unanswered:
                    raise Refused(
                        f"messages.{i + 1}: `tool_use` ids were found without `tool_result` blocks"
                        f" immediately after: {', '.join(unanswered)}. Each `tool_use` block must have"
                        " a corresponding `tool_result` block in the next message.",
                        orphan=True,
                    )
            before = messages[i - 1] if i > 0 else None
            for j, result_id in enumerate(_tool_result_ids(message)):
                if result_id not in _tool_use_ids(before):
                    raise Refused(
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in `tool_result`"
                        f" blocks: {result_id}. Each `tool_result` block must have a corresponding"
                        " `tool_use` block in the previous message.",
                        orphan=True,
                    )

    def render(self, body: JSON, turn: Turn, ids: Ids) -> JSON:
        content: list[JSON] = []
        if turn.content or (not turn.calls and turn.stop_reason is None):
            content.append({"type": "text", "text": turn.content})
        for index, (name, arguments) in enumerate(turn.calls):
            content.append(
                {
                    "type": "tool_use",
                    "id": "toolu_01" + ids.base62(f"tool.{index}", 22),
                    "name": name,
                    "input": _tool_input(name, arguments),
                }
            )
        stop_reason = "tool_use" if turn.calls else _STOPS.get(turn.stop_reason or "", turn.stop_reason)
        stop_sequences = body.get("stop_sequences") or [None]
        return {
            "id": "msg_01" + ids.base62("message", 22),
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": stop_reason or "end_turn",
            "stop_sequence": stop_sequences[0] if stop_reason == "stop_sequence" else None,
            "stop_details": (
                {"type": "refusal", "category": None, "explanation": None}
                if stop_reason == "refusal"
                else None
            ),
            "usage": {
                "input_tokens": input_tokens(body),
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
                "output_tokens": output_tokens(turn),
                "service_tier": "standard",
            },
        }

    def frames(self, body: JSON, reply: JSON) -> list[bytes]:
        usage = reply["usage"]
        start = {
            **reply,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "stop_details": None,
            "usage": {**usage, "output_tokens": 1},
        }
        out = [
            sse({"type": "message_start", "message": start}, "message_start"),
            sse({"type": "ping"}, "ping"),
        ]
        for index, block in enumerate(reply["content"]):
            out.extend(_block_frames(index, block))
        delta_usage = {k: usage[k] for k in ("input_tokens", "cache_creation_input_tokens")}
        delta_usage.update(cache_read_input_tokens=0, output_tokens=usage["output_tokens"])
        delta = {k: reply[k] for k in ("stop_reason", "stop_sequence", "stop_details")}
        out.append(sse({"type": "message_delta", "delta": delta, "usage": delta_usage}, "message_delta"))
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return out

    def error(self, status: int, message: str | None, *, request_id: str, param: str | None = None) -> JSON:
        kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        if message is None:
            message = _ERROR_MESSAGES.get(
                status, "Internal server error" if status >= 500 else "Invalid request"
            )
        return {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}


def _block_frames(index: int, block: JSON) -> list[bytes]:
    if block["type"] == "text":
        started: JSON = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in words(block["text"])]
    else:
        started = {**block, "input": {}}
        text = json.dumps(block["input"], ensure_ascii=False, separators=(",", ":"))
        # the API's first input delta is empty, then the JSON in pieces
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in ["", *pieces(text)]]
    return [
        sse({"type": "content_block_start", "index": index, "content_block": started}, "content_block_start"),
        *(
            sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta")
            for d in deltas
        ),
        sse({"type": "content_block_stop", "index": index}, "content_block_stop"),
    ]


def _tool_input(name: str, arguments: str) -> JSON:
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ScriptProblem(
            f"the input of tool {name!r} must be a JSON object for Anthropic, not {arguments!r}"
        )
    return value


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else None


def _tool_use_ids(message: Any) -> list[str]:
    if _role(message) != "assistant":
        return []
    return [str(b.get("id")) for b in blocks(message) if b.get("type") == "tool_use"]


def _tool_result_ids(message: Any) -> list[str]:
    return [str(b.get("tool_use_id")) for b in blocks(message) if b.get("type") == "tool_result"]
