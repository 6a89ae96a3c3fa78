"""OpenAI's Chat Completions API (``POST /v1/chat/completions``): a ``chat.completion`` as JSON,
or ``chat.completion.chunk`` events ending in ``data: [DONE]`` that
``openai.lib.streaming.chat`` accumulates into the same completion."""

from __future__ import annotations

from ._script import CHAT, Turn
from ._wire import (
    JSON,
    Ids,
    Refused,
    ScriptProblem,
    WireApi,
    assistant_messages,
    input_tokens,
    missing_field,
    output_tokens,
    pieces,
    sse,
    words,
)

# A reason named in another API's words, in this one's; any other passes as it is.
_STOPS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "incomplete": "length",
    "incomplete:max_output_tokens": "length",
    "refusal": "content_filter",
    "incomplete:content_filter": "content_filter",
}
ANTHROPIC_ONLY = frozenset({"pause_turn", "compaction"})


def finish_reason(turn: Turn, api: str) -> str:
    """The ``finish_reason`` (or Responses ending) ``turn`` has in the OpenAI API ``api``."""
    if turn.calls:
        return "tool_calls"
    reason = turn.stop_reason or "stop"
    if reason in ANTHROPIC_ONLY:
        raise ScriptProblem(f"Turn.stop({reason!r}) is Anthropic's alone: the {api} API has no such ending")
    return _STOPS.get(reason, reason)


def openai_error(status: int, message: str | None, param: str | None) -> JSON:
    """OpenAI's error body: ``{"error": {message, type, param, code}}``."""
    if status == 429:
        kind, code = "requests", "rate_limit_exceeded"
        default = "Rate limit reached for requests. Please try again in 1s."
    elif status >= 500:
        kind, code = "server_error", None
        default = (
            "The server had an error while processing your request. Sorry about that!"
            if status == 500
            else "The engine is currently overloaded, please try again later."
        )
    else:
        kind, code, default = "invalid_request_error", None, "Invalid request."
    return {"error": {"message": message or default, "type": kind, "param": param, "code": code}}


class ChatCompletions(WireApi):
    """Chat Completions: turn = assistant messages in ``messages``; an assistant message's
    ``tool_calls`` must be answered by the ``tool`` messages right after it, each naming its
    ``tool_call_id``."""

    name = CHAT
    path = "/v1/chat/completions"
    request_id_header = "x-request-id"

    def turn_of(self, body: JSON) -> int:
        return assistant_messages(body)

    def check(self, body: JSON) -> None:
        missing = missing_field(body, ("messages", "model"))
        if missing:
            raise Refused(f"Missing required parameter: '{missing}'.", param=missing)
        messages = body["messages"]
        if not isinstance(messages, list):
            raise Refused("Invalid type for 'messages': expected an array.", param="messages")
        asked: list[str] = []  # the calls of the last assistant message, until its tool messages end
        asker = 0
        for i, message in enumerate(messages):
            role = message.get("role") if isinstance(message, dict) else None
            if role == "tool":
                if message.get("tool_call_id") not in asked:
                    raise Refused(
                        "Invalid parameter: messages with role 'tool' must be a response to a"
                        " preceeding message with 'tool_calls'.",
                        orphan=True,
                        param=f"messages.[{i}].role",
                    )
                asked.remove(message["tool_call_id"])
                continue
            if asked:
                raise _unanswered(asked, asker)
            if role == "assistant":
                asked = [str(c.get("id")) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
                asker = i
        if asked:
            raise _unanswered(asked, asker)

    def render(self, body: JSON, turn: Turn, ids: Ids) -> JSON:
        message: JSON = {
            "role": "assistant",
            "content": turn.content if turn.content or not turn.calls else None,
            "refusal": None,
            "annotations": [],
        }
        if turn.calls:
            message["tool_calls"] = [
                {
                    "id": "call_" + ids.base62(f"tool.{index}", 24),
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for index, (name, arguments) in enumerate(turn.calls)
            ]
        prompt, completion = input_tokens(body), output_tokens(turn)
        return {
            "id": "chatcmpl-" + ids.base62("completion", 29),
            "object": "chat.completion",
            "created": ids.created,
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": finish_reason(turn, "chat"),
                }
            ],
            "usage": {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0,
                    "audio_tokens": 0,
                    "accepted_prediction_tokens": 0,
                    "rejected_prediction_tokens": 0,
                },
            },
            "service_tier": "default",
            "system_fingerprint": "fp_" + ids.hex("fingerprint", 10),
        }

    def frames(self, body: JSON, reply: JSON) -> list[bytes]:
        # usage comes in a last chunk of its own, and only when asked for, as the API does
        options = body.get("stream_options")
        with_usage = isinstance(options, dict) and options.get("include_usage") is True
        head = {k: reply[k] for k in ("id", "created", "model", "service_tier", "system_fingerprint")}
        head["object"] = "chat.completion.chunk"
        if with_usage:
            head["usage"] = None
        choice, message = reply["choices"][0], reply["choices"][0]["message"]

        def chunk(delta: JSON, finish: str | None = None) -> bytes:
            return sse(
                {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            )

        out = [
            chunk(
                {
                    "role": "assistant",
                    "content": "" if message["content"] is not None else None,
                    "refusal": None,
                }
            )
        ]
        out.extend(chunk({"content": piece}) for piece in words(message["content"] or ""))
        for index, call in enumerate(message.get("tool_calls", [])):
            function = call["function"]
            named = {"name": function["name"], "arguments": ""}
            out.append(
                chunk(
                    {
                        "tool_calls": [
                            {"index": index, "id": call["id"], "type": "function", "function": named}
                        ]
                    }
                )
            )
            out.extend(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                for piece in pieces(function["arguments"])
            )
        out.append(chunk({}, choice["finish_reason"]))
        if with_usage:
            out.append(sse({**head, "choices": [], "usage": reply["usage"]}))
        out.append(sse("[DONE]"))
        return out

    def error(self, status: int, message: str | None, *, request_id: str, param: str | None = None) -> JSON:
        return openai_error(status, message, param)

    def request_id(self, ids: Ids) -> str:
        return "req_" + ids.hex("request", 32)


def _unanswered(asked: list[str], index: int) -> Refused:
    return Refused(
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each"
        f" 'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(asked)}",
        orphan=True,
        param=f"messages.[{index}].role",
    )
