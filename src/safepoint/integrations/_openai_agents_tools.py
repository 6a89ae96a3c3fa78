"""An agent's function tools as steps of the run: each call the SDK makes goes through
``Tools.call_async`` as the step ``tool.<tool_call_id>``, by the kind the tool was declared —
from a ``Tools`` registry, or for an existing ``@function_tool`` by a declaration of its kind.

The SDK's own approval machinery (``needs_approval``: the run ends with interruptions, to be
serialized and approved in memory) is replaced by safepoint's: an effect declared with
``approval=True`` makes the run wait, ``safepoint.approve`` releases it, bound to the digest of
the call's payload; the SDK is never told to interrupt.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import Agent, FunctionTool, Model, Tool
from agents.tool import set_function_tool_failure_error_function
from agents.tool_context import ToolContext

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations.tools import ToolCall, ToolKind, Tools

from ._openai_agents_model import LedgerModel


@dataclass(frozen=True)
class Declared:
    """The kind of an existing ``@function_tool`` (``"pure"``, ``"read"`` or ``"effect"``) and
    the options ``Tools.add`` takes for it: ``max_age``/``retry`` for a read; ``key_fields``,
    ``reconcile``, ``approval``, ``dedup_retention``, ``max_dispatches``, ``verify``, … for an
    effect. An effect tool's code finds its idempotency key with ``safepoint.current_effect_key()``.

    >>> Declared("effect", key_fields=("order_id",))
    Declared(kind='effect', options={'key_fields': ('order_id',)})
    """

    kind: ToolKind
    options: dict[str, Any] = field(default_factory=dict)

    def __init__(self, kind: ToolKind, **options: Any) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", options)


# The SDK's context of the tool call being answered, for an existing function tool's own
# invoker: the step function receives only the recorded arguments.
_TOOL_CONTEXT: contextvars.ContextVar[ToolContext[Any]] = contextvars.ContextVar("openai_agents_tool")

# One turn's calls, answered one at a time: ``run_config`` has the SDK start them one at a time,
# in the model's order (a lock alone orders them by when they reach it, which hooks and
# guardrails with I/O make vary between a run and its resume); this keeps two of them from
# overlapping under a RunConfig of the user's own.
_TURNSTILES: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()


def _turnstile(run: sp.AsyncRun) -> asyncio.Lock:
    lock = _TURNSTILES.get(run)
    if lock is None:
        lock = _TURNSTILES[run] = asyncio.Lock()
    return lock


def _current_run(tool: str) -> sp.AsyncRun:
    found = sp.current_run()
    if not isinstance(found, sp.AsyncRun):
        raise UsageError(
            f"tool {tool!r} of a durable agent was called outside an async def workflow: run the"
            " agent with `await Runner.run(...)` inside one"
        )
    return found


def _invoker(registry: Tools, name: str) -> Any:
    """The ``on_invoke_tool`` of a durable tool: the call answered by the registry's step."""

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        run = _current_run(name)
        token = _TOOL_CONTEXT.set(context)
        call = ToolCall(context.tool_call_id, name, arguments or "{}")
        try:
            async with _turnstile(run):
                outcome = await registry.call_async(run, call)
        finally:
            _TOOL_CONTEXT.reset(token)
        return outcome.content  # an error outcome's text too: the model answers it

    return invoke


def _proxy(original: FunctionTool) -> Any:
    """The function a declared ``@function_tool`` runs as inside its step: the tool's own
    invoker, its failures raised (not turned into text by the SDK's error function) so that the
    step records them — an effect whose owner failed is then no receipt."""
    raising = copy.copy(original)
    set_function_tool_failure_error_function(raising, None)

    async def call(**arguments: Any) -> Any:
        return await raising.on_invoke_tool(_TOOL_CONTEXT.get(), json.dumps(arguments))

    call.__name__ = call.__qualname__ = original.name
    return call


def _approval(tool: FunctionTool, declared: Declared) -> dict[str, Any]:
    """``needs_approval=True`` as safepoint's approval; a rule the SDK evaluates per call has
    no equivalent that survives a restart, so it is refused with what to do instead."""
    needs = tool.needs_approval
    if needs is False:
        return declared.options
    if needs is True:
        if declared.kind != "effect":
            raise UsageError(
                f"tool {tool.name!r} needs approval: declare it an effect (Declared('effect', ...));"
                " safepoint approves effects before they go out"
            )
        return {**declared.options, "approval": True}
    raise UsageError(
        f"tool {tool.name!r}: needs_approval is a function the SDK evaluates in memory; declare"
        " the tool Declared('effect', approval=True) instead (the run waits for safepoint.approve)"
    )


def _durable_tool(
    registry: Tools, name: str, definition: Mapping[str, Any] | None, original: FunctionTool | None
) -> FunctionTool:
    """The function tool the SDK is given: the agent's own (a copy: its guardrails, namespace
    and enabling kept) or a new one, answered by the registry's step — with the registry's
    definition where it has one. The SDK neither asks for approval (safepoint does) nor times
    the call out (a timeout would cut an effect off mid-dispatch)."""
    invoke = _invoker(registry, name)
    if original is None:
        assert definition is not None
        return FunctionTool(
            name=name,
            description=definition.get("description", ""),
            params_json_schema=dict(definition["parameters"]),
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )
    made = copy.copy(original)
    made.on_invoke_tool = invoke
    made.needs_approval = False
    made.timeout_seconds = None
    if definition is not None:
        made.description = definition.get("description", "")
        made.params_json_schema = dict(definition["parameters"])
        made.strict_json_schema = False
    return made


@dataclass
class _Making:
    """What ``durable`` is making: the registries, and the agents already made (handoffs may
    form cycles)."""

    tools: Tools | None
    kinds: Mapping[str, ToolKind | Declared]
    made: dict[int, Agent[Any]] = field(default_factory=dict)

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        if id(agent) in self.made:
            return self.made[id(agent)]
        declared = Tools()
        given = {d["name"]: d for d in self.tools.openai_responses()} if self.tools is not None else {}
        tools: list[Tool] = []
        undeclared: list[str] = []
        for tool in agent.tools:
            if not isinstance(tool, FunctionTool):
                tools.append(tool)  # hosted tools run at the provider: the model step records them
            elif getattr(tool, "_is_agent_tool", False):  # the SDK marks agent.as_tool() so
                raise UsageError(
                    f"agent {agent.name!r}: tool {tool.name!r} is an agent run as a tool, whose"
                    " model calls and tools would be steps inside a step; hand off to that agent"
                    " instead (handoffs=[...]), which durable() makes durable too"
                )
            elif tool.name in given:
                if tool.needs_approval is not False:
                    raise UsageError(
                        f"tool {tool.name!r} is in the Tools registry and has needs_approval: declare"
                        " it there with approval=True and drop needs_approval"
                    )
                tools.append(_durable_tool(self.tools, tool.name, given.pop(tool.name), tool))  # type: ignore[arg-type]
            elif tool.name in self.kinds:
                kind = self.kinds[tool.name]
                how = kind if isinstance(kind, Declared) else Declared(kind)
                declared.add(
                    tool.name,
                    how.kind,
                    _proxy(tool),
                    schema=tool.params_json_schema,
                    description=tool.description,
                    **_approval(tool, how),
                )
                tools.append(_durable_tool(declared, tool.name, None, tool))
            else:
                undeclared.append(tool.name)
        if undeclared:
            raise UsageError(
                f"agent {agent.name!r}: tools {', '.join(undeclared)} are not declared; declare each"
                " in the Tools registry, or its kind in kinds= ('pure', 'read', 'effect' or"
                " spoa.Declared('effect', key_fields=..., reconcile=...))"
            )
        tools.extend(_durable_tool(self.tools, n, d, None) for n, d in given.items())  # type: ignore[arg-type]
        made = agent.clone(tools=tools)
        self.made[id(agent)] = made
        if isinstance(agent.model, Model) and not isinstance(agent.model, LedgerModel):
            made.model = LedgerModel(agent.model, name=str(getattr(agent.model, "model", "model")))
        # A handoff(...) object keeps the target it was given: make that target durable first.
        made.handoffs = [self.agent(h) if isinstance(h, Agent) else h for h in agent.handoffs]
        return made


def durable(
    agent: Agent[Any],
    tools: Tools | None = None,
    *,
    kinds: Mapping[str, ToolKind | Declared] | None = None,
) -> Agent[Any]:
    """A copy of ``agent`` whose function tools are steps of the run: each call is answered
    through ``Tools.call_async`` as the step ``tool.<tool_call_id>``, by its declared kind.

    ``tools`` (a ``Tools`` registry) supplies tools by name: one the agent already has is
    replaced by the registry's, and the registry's others are added. ``kinds`` declares the
    agent's existing ``@function_tool``s by name — ``"pure"``, ``"read"``, ``"effect"`` or a
    ``Declared("effect", key_fields=..., reconcile=...)`` — which then run as they are, inside
    their step. A function tool declared in neither is refused: a resume must know what it may do
    with each. ``needs_approval=True`` on an effect becomes ``approval=True`` (the run waits for
    ``safepoint.approve``; the SDK never interrupts). Agents among the handoffs are made durable
    the same way; an ``Agent(model=<Model>)`` gets its model wrapped as a ``LedgerModel``."""
    if not isinstance(agent, Agent):
        raise UsageError(f"durable() takes an agents.Agent, not {type(agent).__name__}")
    if tools is not None and not isinstance(tools, Tools):
        raise UsageError(f"tools= is a safepoint.integrations.tools.Tools, not {type(tools).__name__}")
    return _Making(tools, dict(kinds or {})).agent(agent)
