"""What identifies a Pydantic AI durable unit, as JSON a step can record and compare.

Pydantic AI hands an engine the raw objects of each call as its ``cache_key``: the messages, the
model settings, the request parameters, the whole ``RunContext``. Hashed as they are, they differ
on every run — timestamps, run and conversation ids, the provider's response ids, usage — so a
resume in a new process would never match what the first process recorded. These functions keep
what makes two calls the same call (the conversation's content, the tools offered, the settings,
the tool's name, arguments and ``tool_call_id``) and drop the rest. I/O-free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import to_jsonable_python

__all__ = ["NOISE", "call_identity", "jsonable", "key_digest", "model_identity", "projected", "unit_identity"]

# Fields minted per run or per reply that say nothing about what was asked: a resume in another
# process sees other values for each of them.
NOISE = frozenset(
    {"timestamp", "run_id", "conversation_id", "provider_response_id", "usage", "provider_details"}
)


def jsonable(value: Any) -> Any:
    """``value`` as JSON: dataclasses and pydantic models by their fields (pydantic's own
    serializer), what has no JSON form by its type's name — an identity must never depend on an
    object's address."""
    return to_jsonable_python(value, fallback=lambda v: f"<{type(v).__qualname__}>")


def projected(value: Any) -> Any:
    """A JSON value without the ``NOISE`` fields, at any depth."""
    if isinstance(value, dict):
        return {k: projected(v) for k, v in value.items() if k not in NOISE}
    if isinstance(value, list):
        return [projected(item) for item in value]
    return value


def model_identity(cache_key: Sequence[Any]) -> dict[str, Any]:
    """What identifies a model request, from its ``cache_key`` ``(model_id, messages,
    model_settings, model_request_parameters, run_context)``: the messages, the settings and the
    request parameters (tools, output schema), without per-run noise. The run context adds
    nothing the messages do not already hold."""
    model_id, messages, settings, parameters = (list(cache_key) + [None] * 4)[:4]
    return {
        "model_id": model_id,
        "messages": projected(jsonable(messages)),
        "settings": projected(jsonable(settings)),
        "parameters": projected(jsonable(parameters)),
    }


def call_identity(cache_key: Sequence[Any]) -> dict[str, Any]:
    """What identifies a tool call, from its ``cache_key`` ``(name, tool_args, ctx, tool)``: the
    tool's name and arguments, the model's ``tool_call_id`` and the schema the tool was offered
    with (so a changed tool is recognised on replay). The tool's metadata is left out: it holds
    safepoint's own declaration, functions included."""
    name, arguments, ctx, tool = (list(cache_key) + [None] * 4)[:4]
    tool_def = getattr(tool, "tool_def", tool)  # a dynamic toolset's key holds the definition
    schema = getattr(tool_def, "parameters_json_schema", None)
    return {
        "name": name,
        "arguments": projected(jsonable(arguments)),
        "tool_call_id": getattr(ctx, "tool_call_id", None),
        "schema": jsonable(schema),
    }


def unit_identity(cache_key: Sequence[Any]) -> list[Any]:
    """What identifies any other unit (tool discovery, an event, a capability's operation):
    its key's JSON without noise, a run context reduced to its step and retry count."""
    return [projected(jsonable(_context_or_value(item))) for item in cache_key]


def _context_or_value(item: Any) -> Any:
    if dataclasses.is_dataclass(item) and hasattr(item, "run_step") and hasattr(item, "deps"):
        # A RunContext: its model, deps and tracer are live objects, its usage noise.
        return {"run_step": item.run_step, "retry": getattr(item, "retry", None)}
    return item


def key_digest(tool: str, arguments: Mapping[str, Any], key_fields: Sequence[str]) -> str:
    """The operation an effect call names with ``key_fields``: the tool and a digest of those
    arguments — the same for two calls asking for the same change, whatever their call ids."""
    named = {field: arguments.get(field) for field in key_fields}
    text = json.dumps(jsonable(named), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return f"{tool}:{hashlib.sha256(text.encode()).hexdigest()[:24]}"
