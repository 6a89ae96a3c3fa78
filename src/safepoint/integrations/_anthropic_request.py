"""What an Anthropic Messages request is to the ledger, with no I/O: the fingerprint a model
step is hashed by, the arguments the SDK is called with, the failures worth another attempt,
and the SDK objects rebuilt from a recorded reply.

The fingerprint is what identifies the question asked of the model. A replay compares it with
the recorded one: a changed prompt, tool or schema is a different question
(``StaleCheckpoint``), while a changed timeout, header, billing tag or cache breakpoint is the
same question asked another way, and replays. The lists are in ``HASHED`` and ``UNHASHED``; a
parameter in neither (a newer SDK's) is hashed, so that what safepoint does not know about can
only make a replay refuse, never answer a different question.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx2
from anthropic.types import Message, ParsedMessage
from anthropic.types.beta import BetaMessage
from anthropic.types.beta.parsed_beta_message import ParsedBetaMessage  # not re-exported by the package

import safepoint as sp
from safepoint.errors import TransientFailure, UsageError
from safepoint.integrations._common import to_json, transient

# Parameters that say what is asked, and so move the step's hash.
HASHED = (
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "max_tokens",
    "stop_sequences",
    "thinking",
    "output_config",
    "output_format",  # as the JSON schema of its type
    "temperature",
    "top_p",
    "top_k",
    "container",
    "betas",
    "context_management",
    "mcp_servers",
    "compaction",
    "fallbacks",
    "thread",  # only with server_state=True
)

# Parameters that say how, or for whom, it is asked: transport, billing, routing, caching.
UNHASHED = frozenset(
    {
        "stream",
        "timeout",
        "extra_headers",
        "extra_query",
        "extra_body",
        "metadata",
        "service_tier",
        "speed",
        "inference_geo",
        "user_profile_id",
        "workspace_id",
        "diagnostics",
        "cache_control",
        "billing_policy",
        "fallback_credit_token",
    }
)

# Sampling parameters anthropic 2.15 no longer takes as arguments: sent in the body, hashed.
SAMPLING = ("temperature", "top_p", "top_k")

# The error types of a stream's ``error`` event that another attempt may get past. The event
# comes after a 200, so the status says nothing; the type does.
_TRANSIENT_STREAM_ERRORS = frozenset({"overloaded_error", "api_error", "rate_limit_error", "timeout_error"})


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """What ``run.model`` hashes: the model, the messages (a ``Transcript`` by its reference),
    the tools' JSON and every other hashed parameter."""

    model: str
    messages: Any
    tools: Any
    params: dict[str, Any]


def fingerprint(request: Mapping[str, Any]) -> Fingerprint:
    """The fingerprint of a ``messages.create`` / ``parse`` / ``stream`` call's arguments.

    ``cache_control`` is left out wherever it is placed — the parameter, a system block, a
    tool, a message's content block — as moving a cache breakpoint changes the bill, not the
    answer (messages given as a ``Transcript`` are hashed by its chain, items as appended)."""
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise UsageError(f"model={model!r}: the model's id, a non-empty string")
    messages = request.get("messages")
    if messages is None:
        raise UsageError(
            "messages= is required: the conversation, a list of messages or a safepoint.Transcript"
        )
    if not isinstance(messages, sp.Transcript):
        messages = [_without_cache_control(m) for m in to_json(list(messages))]
    tools = request.get("tools")
    tools = None if tools is None else [_without_cache_control(t, top=True) for t in tools_json(tools)]
    params: dict[str, Any] = {}
    for key, value in request.items():
        if key in ("model", "messages", "tools") or key in UNHASHED or _omitted(value):
            continue
        if key == "output_format":
            params[key] = output_schema(value)
        elif key == "system":
            params[key] = (
                value if isinstance(value, str) else [_without_cache_control(b) for b in to_json(value)]
            )
        else:
            params[key] = to_json(value)
    extra_body = request.get("extra_body")
    if isinstance(extra_body, Mapping):
        for key in SAMPLING:
            if key in extra_body:
                params[key] = to_json(extra_body[key])
    return Fingerprint(model, messages, tools, params)


def sdk_arguments(request: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments to call the SDK with: as given, a ``Tools`` registry as its definitions,
    and the sampling parameters the SDK no longer takes moved into ``extra_body``."""
    arguments = {k: v for k, v in request.items() if k not in SAMPLING}
    tools = arguments.get("tools")
    if tools is not None and _is_registry(tools):
        arguments["tools"] = tools.anthropic()
    sampling = {k: request[k] for k in SAMPLING if k in request}
    if sampling:
        arguments["extra_body"] = {**sampling, **(request.get("extra_body") or {})}
    return arguments


def refuse_server_state(request: Mapping[str, Any], server_state: bool, method: str) -> None:
    """Refuse a request that asks the server to hold the conversation (``thread=``): after a
    crash the ledger would replay replies whose context lives elsewhere, and a resume could not
    rebuild it. ``server_state=True`` accepts that dependency."""
    thread = request.get("thread")
    if server_state or thread is None or thread is False or _omitted(thread):
        return  # thread=False: the full history every turn, as the ledger replays it
    raise UsageError(
        f"{method}(thread=...) keeps the conversation on Anthropic's servers, where a resumed run"
        " cannot replay it: send the whole conversation every turn (thread=False, or no thread;"
        " a safepoint.Transcript keeps that cheap to hash), or bind the client with"
        " server_state=True to accept the server's thread as a dependency of the run"
    )


def tools_json(tools: Any) -> list[Any]:
    """Tool definitions as JSON: a ``Tools`` registry's, the SDK's tool objects' ``to_dict()``,
    dicts as given."""
    if _is_registry(tools):
        return list(tools.anthropic())
    if isinstance(tools, str | bytes | Mapping):
        raise UsageError("tools= is a list of tool definitions (or a safepoint.integrations.tools.Tools)")
    found = []
    for tool in tools:
        to_dict = getattr(tool, "to_dict", None)
        # the SDK's function tools (beta_tool) are not pydantic models: their to_dict is the param
        found.append(to_json(to_dict() if callable(to_dict) and not hasattr(tool, "model_fields") else tool))
    return found


def output_schema(output_format: Any) -> Any:
    """``output_format`` (a type) as its JSON schema: what the model is asked to fill."""
    if output_format is None:
        return None
    from pydantic import TypeAdapter  # comes with the SDK

    try:
        return TypeAdapter(output_format).json_schema()
    except Exception as exc:  # the SDK raises TypeError for the same type
        raise UsageError(
            f"output_format={output_format!r}: a type pydantic can describe as a JSON schema ({exc})"
        ) from exc


def _is_registry(tools: Any) -> bool:
    return callable(getattr(tools, "anthropic", None)) and callable(getattr(tools, "call_all", None))


def _omitted(value: Any) -> bool:
    return type(value).__name__ in ("NotGiven", "Omit")


def _without_cache_control(value: Any, *, top: bool = False) -> Any:
    """A message, block or tool without its ``cache_control`` keys — on the blocks of a
    message's content and of a tool result's content, never inside a tool's input schema or a
    tool call's input."""
    if not isinstance(value, dict):
        return value
    found = {k: v for k, v in value.items() if k != "cache_control"}
    if top:
        return found
    content = found.get("content")
    if isinstance(content, list):
        found["content"] = [_without_cache_control(block) for block in content]
    return found


# -- failures -----------------------------------------------------------------------------------


def transient_failure(exc: BaseException) -> TransientFailure | None:
    """The ``TransientFailure`` an SDK failure is (another attempt may succeed), or ``None``:
    408/409/429/5xx/529 or ``x-should-retry: true``, a connection or timeout error, a body cut
    mid-way (``httpx2.TransportError``), an ``overloaded_error`` event in a stream."""
    if isinstance(exc, anthropic.APIStatusError) and exc.status_code < 400:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error") if isinstance(body.get("error"), dict) else body
        if isinstance(error, dict) and error.get("type") in _TRANSIENT_STREAM_ERRORS:
            return TransientFailure(f"Anthropic's stream ended with {error.get('type')}: {exc}")
    return transient(
        exc,
        "Anthropic",
        status_errors=(anthropic.APIStatusError,),
        connection_errors=(anthropic.APIConnectionError, httpx2.TransportError),
    )


# -- replies ------------------------------------------------------------------------------------


def reply_json(message: Any) -> dict[str, Any]:
    """A reply as the API's JSON: what the step records (``to_dict``, unknown blocks kept;
    quiet about a block type this SDK does not know, which it keeps as given)."""
    recorded: dict[str, Any] = message.to_dict(mode="json", warnings=False)
    return recorded


def rebuild(recorded: dict[str, Any], *, beta: bool, parsed: bool, output_format: Any = None) -> Any:
    """The SDK object of a recorded reply — leniently (``construct``), so a content block of a
    type this SDK does not know survives — with each text block's ``parsed_output`` filled in
    again for ``parse`` and ``stream`` (a replay answers the same type as the first run)."""
    if not parsed:
        return (BetaMessage if beta else Message).construct(**recorded)
    message = (ParsedBetaMessage if beta else ParsedMessage).construct(**recorded)
    if output_format is not None and not _omitted(output_format):
        from pydantic import TypeAdapter

        adapter: Any = TypeAdapter(output_format)
        for block in message.content:
            if block.type == "text" and isinstance(getattr(block, "text", None), str):
                block.parsed_output = adapter.validate_json(block.text)
    return message


def text_of(message: Any) -> str:
    """The text blocks of a reply, joined."""
    return "".join(
        b.text for b in message.content if b.type == "text" and isinstance(getattr(b, "text", None), str)
    )


def usage_tokens(reply: Any) -> int | None:
    """The tokens a recorded reply used, as Anthropic counts them (input, output and cache)."""
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if not isinstance(usage, dict):
        return None
    fields = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    return sum(v for f in fields if isinstance(v := usage.get(f), int) and not isinstance(v, bool))
