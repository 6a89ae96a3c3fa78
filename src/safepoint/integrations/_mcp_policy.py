"""What a resume may do with each MCP tool: its declared kind, and how a result or a failure of
the call becomes a step's outcome. Nothing here talks to a server.

A tool is a ``read`` (recorded, replayed) or an ``effect`` (sent at most once per operation,
under an idempotency key). The server's annotations are only defaults: ``readOnlyHint`` makes a
read, anything else (``destructiveHint`` is true unless the server says otherwise) an effect
that blocks the run when its outcome is uncertain. ``idempotentHint`` counts only where the user
opts in: a server may claim what it does not do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.types import Retry

__all__ = [
    "IDEMPOTENCY_ARGUMENTS",
    "META_KEY",
    "McpToolError",
    "ToolPolicy",
    "effect",
    "idempotent",
    "read",
]

# Our name for the key in a request's ``_meta`` (reverse DNS: ``io.modelcontextprotocol/`` is
# the protocol's own prefix, and MCP itself has no idempotency key).
META_KEY = "dev.safepoint/idempotency-key"
# Arguments a tool's input schema may declare to take the key itself.
IDEMPOTENCY_ARGUMENTS = ("idempotency_key", "idempotencyKey")
# JSON-RPC errors that say the server refused the request before running the tool: nothing was
# applied (parse error, invalid request, method not found, invalid params).
REFUSED_CODES = frozenset({-32700, -32600, -32601, -32602})
# Long enough to stand for "forever": an idempotent tool may be sent again at any time.
_ALWAYS = timedelta(days=36500)


class McpToolError(Exception):
    """A tool answered with ``isError``: recorded as the step's failure (a read) or as what made
    the outcome uncertain (an effect declared with ``on_error="unknown"``)."""


@dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How one tool's calls are steps: a ``read`` (``max_age``, ``retry``) or an ``effect``
    (``reconcile``, ``key_fields``, ``approval``, ``dedup_retention``, ``max_dispatches``,
    ``on_error``). Made by ``read()``, ``effect()`` or ``idempotent()``."""

    kind: Literal["read", "effect"]
    max_age: timedelta | float | None = None
    retry: Retry | int | None = None
    reconcile: Callable[[sp.EffectKey], Any] | None = None
    key_fields: tuple[str, ...] = ()
    approval: bool = False
    dedup_retention: timedelta | None = None
    max_dispatches: int = 3
    on_error: Literal["rejected", "unknown"] = "rejected"

    def effect_of(self, name: str, execute: Callable[..., Any]) -> sp.Effect[Any]:
        """The ``sp.Effect`` named ``name`` whose dispatch is ``execute``. With a
        ``dedup_retention`` and no ``reconcile``, the server deduplicates by the key: after a
        crash the call is sent again under the same key, and the server answers it once."""
        reconcile = self.reconcile
        if reconcile is None and self.dedup_retention is not None:
            reconcile = _send_again
        return sp.Effect(
            name,
            execute=execute,
            reconcile=reconcile,
            dedup_retention=self.dedup_retention,
            max_dispatches=self.max_dispatches,
        )


def _send_again(key: sp.EffectKey) -> sp.NotApplied:
    # The server deduplicates by the key (or the tool is idempotent): sending again under the
    # same key cannot apply the change twice.
    return sp.NotApplied()


def read(*, max_age: timedelta | float | None = None, retry: Retry | int | None = None) -> ToolPolicy:
    """A read tool: recorded and replayed until ``max_age`` expires it; tried once unless
    ``retry`` says otherwise. A result with ``isError`` is its recorded failure."""
    return ToolPolicy("read", max_age=max_age, retry=retry)


def effect(
    *,
    reconcile: Callable[[sp.EffectKey], Any] | None = None,
    key_fields: tuple[str, ...] | list[str] | str = (),
    approval: bool = False,
    dedup_retention: timedelta | None = None,
    max_dispatches: int = 3,
    on_error: Literal["rejected", "unknown"] = "rejected",
) -> ToolPolicy:
    """An effect tool: sent at most once per operation, its key in the request's ``_meta``
    (``dev.safepoint/idempotency-key``) and in its idempotency-key argument if it declares one.

    ``reconcile(key)`` asks the server (or the system behind it) what became of a call whose
    answer was lost — a crash, a timeout, a dropped connection: ``sp.Applied(receipt)``,
    ``sp.NotApplied()``, ``sp.Unknown(reason)``; without it such a call blocks the run
    (``NeedsReconciliation``). ``dedup_retention``, without ``reconcile``: the server
    deduplicates by the key for that long, so a lost call is sent again under the same key.
    ``on_error``: a result with ``isError`` is the server's refusal (``"rejected"``, the
    default: recorded, an error outcome on every replay) or leaves the outcome uncertain
    (``"unknown"``: reconciled or blocked), for a tool whose errors may follow a partial change.
    """
    if on_error not in ("rejected", "unknown"):
        raise UsageError(f"on_error is 'rejected' or 'unknown', not {on_error!r}")
    fields = (key_fields,) if isinstance(key_fields, str) else tuple(key_fields)
    return ToolPolicy(
        "effect",
        reconcile=reconcile,
        key_fields=fields,
        approval=approval,
        dedup_retention=dedup_retention,
        max_dispatches=max_dispatches,
        on_error=on_error,
    )


def idempotent(**options: Any) -> ToolPolicy:
    """An effect whose repetition changes nothing more (the server's ``idempotentHint``, which
    only you can vouch for): a call whose answer was lost is sent again, under the same key.
    Takes ``effect()``'s options."""
    return replace(effect(**options), dedup_retention=options.get("dedup_retention") or _ALWAYS)


def policy_of(
    given: ToolPolicy | str | None, tool: Any, default: ToolPolicy | str, trust_idempotent: bool
) -> ToolPolicy:
    """The policy of a listed ``tool``: the user's, else ``default`` (``"annotations"``: read
    from the server's hints)."""
    chosen = given if given is not None else default
    if chosen != "annotations":
        return as_policy(chosen, getattr(tool, "name", "?"))
    hints = getattr(tool, "annotations", None)
    if hints is None:
        return hinted(None, None, trust_idempotent)
    return hinted(hints.read_only_hint, hints.idempotent_hint, trust_idempotent)


def hinted(read_only: bool | None, idempotent_hint: bool | None, trust_idempotent: bool) -> ToolPolicy:
    """The policy a tool's annotations give it: ``readOnlyHint`` a read; ``idempotentHint`` an
    idempotent effect only if the user trusts it; anything else an effect that blocks the run
    when its outcome is uncertain (``destructiveHint`` is true unless the server says not)."""
    if read_only is True:
        return read()
    if trust_idempotent and idempotent_hint is True:
        return idempotent()
    return effect()


def as_policy(given: ToolPolicy | str, name: str) -> ToolPolicy:
    """``given`` as a policy: one already, or the name of a kind."""
    if isinstance(given, ToolPolicy):
        return given
    if given == "read":
        return read()
    if given == "effect":
        return effect()
    if given == "idempotent":
        return idempotent()
    raise UsageError(
        f"tool {name!r}: a kind is 'read', 'effect', 'idempotent' or a policy from"
        f" safepoint.integrations.mcp.read()/effect()/idempotent(), not {given!r}"
    )


def key_arguments(input_schema: Mapping[str, Any] | None) -> list[str]:
    """The idempotency-key arguments a tool's input schema declares."""
    properties = (input_schema or {}).get("properties") or {}
    return [name for name in IDEMPOTENCY_ARGUMENTS if name in properties]


def without_key_arguments(input_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema a model is shown: the key arguments are ours to fill, not the model's."""
    schema = json.loads(json.dumps(dict(input_schema)))
    properties = schema.get("properties") or {}
    for name in IDEMPOTENCY_ARGUMENTS:
        properties.pop(name, None)
    if "required" in schema:
        schema["required"] = [r for r in schema["required"] if r not in IDEMPOTENCY_ARGUMENTS]
    return dict(schema)


def result_json(result: Any) -> dict[str, Any]:
    """A ``CallToolResult`` (or listing) as the protocol's JSON, wire names."""
    dumped: dict[str, Any] = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def as_result(recorded: Any) -> dict[str, Any]:
    """A recorded receipt in the shape of a ``CallToolResult``: one already, or what a
    ``reconcile`` answered (``sp.Applied(receipt)``), as its text and structured content."""
    if isinstance(recorded, dict) and isinstance(recorded.get("content"), list):
        return recorded
    text = recorded if isinstance(recorded, str) else json.dumps(recorded, ensure_ascii=False)
    shaped: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(recorded, dict):
        shaped["structuredContent"] = recorded
    return shaped


def text_of(result: Mapping[str, Any]) -> str:
    """What a model is told of a result: its text blocks, joined; the structured content or the
    blocks as JSON where there is no text."""
    content = result.get("content") or []
    texts = [block.get("text", "") for block in content if block.get("type") == "text"]
    if texts and len(texts) == len(content):
        return "\n".join(texts)
    shown = content or result.get("structuredContent")
    return json.dumps(shown, ensure_ascii=False, separators=(",", ":"))
