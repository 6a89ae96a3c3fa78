"""Pydantic AI on the ledger: a durability capability whose every model request, tool call and
MCP call is a step of the run.

::

    from safepoint.integrations import pydantic_ai as sppa

    agent = Agent(model, name="support", capabilities=[sppa.SafepointDurability()])

    @agent.tool_plain(metadata=sppa.effect(key_fields=["order_id"], reconcile=find_refund))
    def refund(order_id: str, amount_cents: int) -> dict:
        return desk.refund(order_id, amount_cents, idempotency_key=str(sp.current_effect_key()))

    @sp.workflow("support")
    async def support(run: sp.AsyncRun, question: str) -> str:
        return (await agent.run(question)).output

Inside an ``async def`` workflow the capability finds the run (``safepoint.current_run()``) and
runs each durable unit Pydantic AI hands it as a step:

- a model request is a model step ``model`` (``model#2``, …), named after Pydantic AI's operation
  (``support__model.request``), fingerprinted over the messages, settings and tools without
  per-run noise (timestamps, run ids, provider response ids, usage), so that a resume in a new
  process replays it instead of asking the model again;
- a tool call is the step ``tool.<tool_call_id>``, of the kind its metadata declares
  (``sppa.pure()``, ``sppa.read(...)``, ``sppa.effect(...)``; a read when it says nothing). An
  effect is dispatched at most once per operation; its tool reads the idempotency key with
  ``safepoint.current_effect_key()``; after a crash it is reconciled with its owner, never sent
  blind;
- an MCP server's tools (a ``pydantic_ai.mcp.MCPToolset`` with an ``id``): the listing is the
  read ``tools.<id>``, replayed so that the model is shown the tools it was shown; a call is the
  step ``tool.<tool_call_id>`` of the kind declared in ``SafepointDurability(tools={...})``, else
  of the kind the server's annotations give (``readOnlyHint`` a read, anything else an effect
  that blocks on an uncertain outcome). An effect's key reaches the server in the request's
  ``_meta`` (``dev.safepoint/idempotency-key``) and, when the tool's schema declares
  ``idempotency_key`` or ``idempotencyKey``, as that argument, which the model is not shown; a
  timeout or a dropped connection leaves the outcome unknown, never a retry by the model;
- tool discovery of other toolsets and anything else are recorded reads, replayed on a resume.

What a tool signals to the agent (``ModelRetry``, ``ApprovalRequired``, ``CallDeferred``) is
recorded as the call's value — replayed, not retried. Outside a workflow the agent runs as it
would without the capability.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, ClassVar

import safepoint as sp
from safepoint.errors import EffectRejected, TransientFailure, UsageError

from ._common import model_retry
from ._pydantic_ai_keys import call_identity, key_digest, model_identity, unit_identity
from ._pydantic_ai_mcp import McpTool, give_key_hook, hinted_kind, listed, schema_shown, sending
from .tools import Tools

try:
    from pydantic_ai import exceptions as pai_errors
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        CallableOperationBackend,
        DurabilityEngineSpec,
        DurableOperationId,
        JournalOperationNamer,
        ModelRequestId,
        RoleBasedOperationConfig,
        ToolsetCallToolId,
        ToolsetGetToolsId,
        ToolsetValidateToolArgumentsId,
    )
except ImportError as exc:  # pragma: no cover - the extra is what provides it
    raise ImportError(
        "safepoint.integrations.pydantic_ai needs Pydantic AI: pip install 'safepoint[pydantic-ai]'"
    ) from exc

__all__ = ["SafepointDurability", "SafepointOperationBackend", "effect", "pure", "read"]

# The metadata key a tool declares its kind under: Pydantic AI hands it to the engine as the
# tool's config (``DurabilityEngineSpec.tool_config_key``).
METADATA_KEY = "safepoint"

_KINDS = ("pure", "read", "effect")
_EFFECT_OPTIONS = frozenset(
    {"key_fields", "approval", "reconcile", "dedup_retention", "max_dispatches", "verify", "verify_timeout"}
)
_READ_OPTIONS = frozenset({"max_age", "retry"})

# What a tool call's recorded value is when the tool signalled instead of returning (Pydantic
# AI's ``CallToolResult`` variants other than a return): nothing was done.
_SIGNALS = frozenset(
    {"model_retry", "tool_failed", "approval_required", "call_deferred", "validation_error", "run_cancelled"}
)

# The model's failures another attempt may cure: the SDK's own retries are off, the step retries.
_TRANSIENT = (
    pai_errors.ModelRateLimitError,
    pai_errors.ModelUnavailableError,
    pai_errors.ModelServerError,
    pai_errors.ModelConnectionError,
    pai_errors.ModelRequestTimeout,
)


# -- declaring a tool's kind --------------------------------------------------------------------


def pure() -> dict[str, Any]:
    """Tool metadata for a pure tool: its result follows from its arguments, so a resume takes
    it from the ledger and never runs it again. ``@agent.tool_plain(metadata=sppa.pure())``."""
    return {METADATA_KEY: {"kind": "pure"}}


def read(*, max_age: timedelta | float | None = None, retry: sp.Retry | int | None = None) -> dict[str, Any]:
    """Tool metadata for a read tool (what an undeclared tool is): an observation, replayed on
    a resume until ``max_age`` expires it; tried once unless ``retry`` says otherwise."""
    return {METADATA_KEY: {"kind": "read", "max_age": max_age, "retry": retry}}


def effect(
    *,
    key_fields: Iterable[str] = (),
    reconcile: Callable[[sp.EffectKey], Any] | None = None,
    approval: bool = False,
    dedup_retention: timedelta | None = None,
    max_dispatches: int = 3,
) -> dict[str, Any]:
    """Tool metadata for an effect tool: a change in another system, dispatched at most once
    per operation. The tool reads the operation's idempotency key with
    ``safepoint.current_effect_key()`` and sends ``str(key)`` to the owner. ``key_fields`` name
    the arguments that make two calls one operation (else the call id does); ``reconcile(key)``
    asks the owner after a crash and answers with what the tool returned
    (``sp.Applied(value)``, ``sp.NotApplied()``, ``sp.Unknown(why)``) — without it an uncertain
    outcome blocks the run; ``approval=True`` waits for ``safepoint.approve`` first."""
    fields = [key_fields] if isinstance(key_fields, str) else list(key_fields)
    return {
        METADATA_KEY: {
            "kind": "effect",
            "key_fields": fields,
            "reconcile": reconcile,
            "approval": approval,
            "dedup_retention": dedup_retention,
            "max_dispatches": max_dispatches,
        }
    }


def _declaration(tool_name: str, declared: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool's declaration checked: its kind and the options that kind takes."""
    found = dict(declared or {})
    kind = found.pop("kind", "read")
    if kind not in _KINDS:
        raise UsageError(f"tool {tool_name!r}: safepoint kind {kind!r} is none of 'pure', 'read', 'effect'")
    allowed = {"pure": frozenset(), "read": _READ_OPTIONS, "effect": _EFFECT_OPTIONS}[kind]
    unknown = sorted(set(found) - allowed)
    if unknown:
        raise UsageError(
            f"tool {tool_name!r} ({kind}) takes no {', '.join(unknown)}; it takes:"
            f" {', '.join(sorted(allowed)) or 'no options'} (declare it with sppa.{kind}(...))"
        )
    return {"kind": kind, **found}


# -- the backend: each durable unit a step ------------------------------------------------------


class SafepointOperationBackend(CallableOperationBackend[dict[str, Any]]):
    """Runs each durable unit Pydantic AI hands it as a step of the current run: model requests
    as model steps, tool calls by their declared kind, the rest as recorded reads."""

    def __init__(
        self,
        agent_name: str,
        *,
        default_model_id: str | None,
        tools: Mapping[str, Mapping[str, Any]],
        retry: sp.Retry | int | None,
    ) -> None:
        def tool_config(operation_id: DurableOperationId, tool: Any, tool_name: str) -> dict[str, Any]:
            metadata = getattr(getattr(tool, "tool_def", None), "metadata", None) or {}
            declared = metadata.get(METADATA_KEY, tools.get(tool_name))
            if declared is None and _is_mcp(operation_id):  # the server's annotations, as defaults
                declared = {"kind": hinted_kind(metadata)}
            return _declaration(tool_name, declared) if tool_name else {}

        super().__init__(
            namer=JournalOperationNamer(agent_name, default_model_id=default_model_id or "default"),
            config=RoleBasedOperationConfig(
                model={}, event={}, capability={}, tool={}, resolve_tool=tool_config
            ),
        )
        self._tools = tools
        self._retry = model_retry(retry)
        # Per run object (one execution of the workflow): the effect operations its calls made,
        # by operation id, with their arguments and results — rebuilt as a resume replays them.
        self._made: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, object]]] = (
            weakref.WeakKeyDictionary()
        )
        # Per run object: how many calls of each operation the tool answered with a signal.
        self._refused: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
        # Per run object: the MCP tools its recorded listings hold, by toolset id and name.
        self._mcp: weakref.WeakKeyDictionary[Any, dict[tuple[str, str], McpTool]] = (
            weakref.WeakKeyDictionary()
        )

    def shown(self, run: Any, tool_def: Any) -> Any:
        """``tool_def`` as the model is shown it in ``run``: an MCP effect tool's schema without
        its idempotency-key arguments, which the call fills with the operation's key."""
        # By name: what the model is shown is not marked with the toolset it came from. A
        # toolset that renames its tools (``prefixed``) keeps the key arguments in view; the
        # call still fills them.
        if not any(
            name == tool_def.name and t.key_arguments for (_, name), t in self._mcp.get(run, {}).items()
        ):
            return tool_def
        metadata = tool_def.metadata or {}
        declared = metadata.get(METADATA_KEY, self._tools.get(tool_def.name))
        kind = declared.get("kind") if isinstance(declared, Mapping) else hinted_kind(metadata)
        if kind != "effect":
            return tool_def
        return dataclasses.replace(
            tool_def, parameters_json_schema=schema_shown(tool_def.parameters_json_schema)
        )

    async def execute(
        self,
        *,
        operation_id: DurableOperationId,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: dict[str, Any],
    ) -> object:
        """Run ``body`` as one step of the current run, chosen by the operation."""
        run = _current_run()
        match operation_id:
            case ModelRequestId():
                return await self._model(run, name, body, cache_key)
            case ToolsetCallToolId(toolset_kind="mcp", toolset_id=toolset_id):
                return await self._tool(run, name, body, cache_key, config, mcp_toolset=toolset_id)
            case ToolsetCallToolId():
                return await self._tool(run, name, body, cache_key, config)
            case ToolsetValidateToolArgumentsId():
                identity = call_identity(cache_key)
                sid = f"validate.{identity['tool_call_id'] or identity['name']}"
                return await run.pure(sid, _unit(body, name), identity)
            case ToolsetGetToolsId(toolset_kind=toolset_kind, toolset_id=toolset_id):
                listing = await run.read(
                    f"tools.{toolset_id}", _unit(body, name), unit_identity(cache_key), secrets="redact"
                )
                if toolset_kind == "mcp":  # read back on a replay too: the tools' key arguments
                    self._mcp.setdefault(run, {}).update(
                        ((toolset_id, name), tool) for name, tool in listed(listing, toolset_id).items()
                    )
                return listing
            case _:  # the union grows in minor releases: record what is not known yet
                return await run.read(
                    "pydantic_ai", _unit(body, name), unit_identity(cache_key), secrets="redact"
                )

    async def _model(
        self,
        run: sp.AsyncRun,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
    ) -> object:
        identity = model_identity(cache_key)

        async def request(**_: Any) -> object:
            try:
                return await body()
            except _TRANSIENT as exc:
                raise TransientFailure(f"the model request failed ({type(exc).__name__}): {exc}") from exc

        parameters = identity["parameters"]
        return await run.model(
            "model",
            request,
            model=str(identity["model_id"] or name),
            messages=identity["messages"],
            tools=parameters.get("function_tools") if isinstance(parameters, dict) else None,
            settings=identity["settings"],
            parameters=parameters,
            retry=self._retry,
            usage=_tokens,
            name=name,
        )

    async def _tool(
        self,
        run: sp.AsyncRun,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: Any,
        *,
        mcp_toolset: str | None = None,
    ) -> object:
        identity = call_identity(cache_key)
        tool_name = str(identity["name"])
        declared = config if isinstance(config, dict) and "kind" in config else None
        if declared is None:
            declared = _declaration(tool_name, self._tools.get(tool_name, {"kind": "read"}))
        sid = f"tool.{identity['tool_call_id'] or tool_name}"
        kind = declared["kind"]
        if kind == "pure":
            return await run.pure(sid, _unit(body, name), identity)
        if kind == "read":
            retry = declared.get("retry")
            return await run.read(
                sid,
                _unit(body, name),
                identity,
                max_age=declared.get("max_age"),
                retry=1 if retry is None else retry,
                secrets="redact",
            )
        key_fields = list(declared.get("key_fields") or ())
        arguments = identity["arguments"] if isinstance(identity["arguments"], dict) else {}
        missing = [field for field in key_fields if field not in arguments]
        if missing:
            raise UsageError(f"tool {tool_name!r}: key_fields {missing!r} are not among its arguments")
        # An MCP tool's operations are the server's: named after it, as safepoint.integrations.mcp
        # names them, so that two servers' tools of one name are two owners.
        owner_name = tool_name if mcp_toolset is None else f"mcp.{mcp_toolset}.{tool_name}"
        keyed: tuple[str, ...] = ()
        if mcp_toolset is not None:
            listed_tool = self._mcp.get(run, {}).get((mcp_toolset, tool_name))
            keyed = listed_tool.key_arguments if listed_tool is not None else ()
        operation_id = key_digest(owner_name, arguments, key_fields) if key_fields else None
        made = self._made.setdefault(run, {})
        if operation_id in made:
            return _again(tool_name, key_fields, arguments, *made[operation_id])
        # Each call the tool answered with a signal (it made no change) leaves the operation to
        # the next call: under an operation id of its own, counted in the order the calls come
        # (the same on every replay).
        refused = self._refused.setdefault(run, {})
        tries = refused.get(operation_id, 0) if operation_id is not None else 0
        attempt_id = f"{operation_id}~{tries + 1}" if operation_id is not None and tries else operation_id
        try:
            result = await _effect(
                run, sid, owner_name, body, arguments, attempt_id, declared, mcp=mcp_toolset, keyed=keyed
            )
        except EffectRejected as rejected:
            signal = rejected.evidence
            if isinstance(signal, dict) and signal.get("kind") in _SIGNALS:
                if operation_id is not None:
                    refused[operation_id] = tries + 1
                return signal
            raise
        if operation_id is not None:
            made[operation_id] = (arguments, result)
        return result


async def _effect(
    run: sp.AsyncRun,
    sid: str,
    tool_name: str,
    body: Callable[[], Awaitable[object]],
    arguments: dict[str, Any],
    operation_id: str | None,
    declared: Mapping[str, Any],
    *,
    mcp: str | None = None,
    keyed: tuple[str, ...] = (),
) -> object:
    """An effect tool's call: ``body`` runs as the effect's execute, with the operation's key
    as ``safepoint.current_effect_key()`` — and, for an MCP tool, in the request's ``_meta`` and
    its ``keyed`` arguments; a reconcile's receipt (the tool's value) is recorded in the shape
    Pydantic AI reads back."""

    async def execute(payload: Any, key: sp.EffectKey) -> object:
        if mcp is None:
            result = await body()
        else:
            with sending(str(key), keyed):
                result = await body()
        if isinstance(result, dict) and result.get("kind") in _SIGNALS:
            # ModelRetry, ToolFailed, ApprovalRequired, CallDeferred, …: the tool said it made
            # no change. Not a receipt: the operation stays unmade, for a corrected call.
            raise sp.Rejected(result)
        return result

    reconcile = declared.get("reconcile")
    options = {
        k: v
        for k, v in declared.items()
        if k in ("dedup_retention", "max_dispatches", "verify", "verify_timeout") and v is not None
    }
    owner = sp.Effect(
        tool_name,
        execute=execute,
        reconcile=_as_tool_return(reconcile) if reconcile is not None else None,
        **options,
    )
    return await run.effect(
        sid,
        owner,
        payload={"name": tool_name, "arguments": arguments},
        operation_id=operation_id,
        approval=bool(declared.get("approval", False)),
    )


def _again(tool_name: str, key_fields: list[str], arguments: Any, first: Any, result: object) -> object:
    """A second call for an operation this run already made (the same key fields, another call
    id): the first call's result — the operation is made once — or, asked with other arguments,
    a failure the model is told of (as an owner refuses a key reused with other parameters)."""
    if arguments == first:
        return result
    why = (
        f"tool {tool_name!r}: this operation (the same {', '.join(key_fields)}) was already asked for"
        " with other arguments in this run; it is made once, as first asked, and not again"
    )
    return {"kind": "tool_failed", "message": why}


def _as_tool_return(reconcile: Callable[[sp.EffectKey], Any]) -> Callable[[sp.EffectKey], Any]:
    """``reconcile`` whose ``Applied`` receipt — what the tool would have returned — is wrapped
    as the tool result Pydantic AI decodes (its ``tool_return`` record)."""

    def reconciled(key: sp.EffectKey) -> Any:
        answer = reconcile(key)
        if isinstance(answer, sp.Applied):
            return sp.Applied({"kind": "tool_return", "result": answer.receipt})
        return answer

    return reconciled


def _is_mcp(operation_id: DurableOperationId) -> bool:
    return isinstance(operation_id, ToolsetCallToolId) and operation_id.toolset_kind == "mcp"


def _unit(body: Callable[[], Awaitable[object]], name: str) -> Callable[[Any], Awaitable[object]]:
    """A step function that runs ``body``; its argument is the unit's identity, which the step
    records and compares on replay. Named after Pydantic AI's operation, which a replay checks."""

    async def unit(identity: Any) -> object:
        return await body()

    unit.__name__ = unit.__qualname__ = name
    return unit


def _tokens(reply: Any) -> dict[str, Any]:
    """A recorded ``ModelResponse``'s tokens, for the run's budget."""
    usage = reply.get("usage") if isinstance(reply, dict) else None
    if not isinstance(usage, dict):
        return {}
    tokens = sum(v for k, v in usage.items() if k in ("input_tokens", "output_tokens") and isinstance(v, int))
    return {"tokens": tokens}


def _current_run() -> sp.AsyncRun:
    run = sp.current_run()
    if not isinstance(run, sp.AsyncRun):
        raise UsageError(
            "a Pydantic AI agent with SafepointDurability runs in an async def workflow (AsyncRun):"
            " `await agent.run(...)` there; agent.run_sync inside a plain def workflow is not durable"
        )
    return run


# -- the capability -------------------------------------------------------------------------------


def _not_declarations(tools: object) -> str:
    """Why ``SafepointDurability(tools=...)`` refuses what is not a mapping of declarations."""
    if isinstance(tools, Tools):
        named = ", ".join(f"{name!r}: ..." for name in tools.names()) or "'refund': ..."
        return (
            "SafepointDurability(tools=) declares the kind of the agent's own tools by name, not a"
            " Tools registry: the agent calls its own functions, never the registry's. Give each"
            " tool of the agent its kind in its metadata (@agent.tool_plain(metadata=sppa.effect(...)))"
            f" or declare it here by name: tools={{{named}}}, each sppa.pure(), sppa.read(...) or"
            " sppa.effect(...)"
        )
    return (
        "SafepointDurability(tools=) is a mapping of tool names to declarations"
        f" ({{'refund': sppa.effect(...)}}), not {type(tools).__name__}"
    )


class SafepointDurability(BaseDurabilityCapability[Any]):
    """Makes an agent durable on safepoint's ledger: ``Agent(..., capabilities=[
    SafepointDurability()])``. Inside an ``async def`` workflow every model request, tool call
    and MCP call of ``agent.run`` is a step of the run; a resume replays them from the ledger.

    ``tools`` declares tools by name where their metadata cannot (``{"refund": sppa.effect(
    key_fields=["order_id"])["safepoint"]}``), e.g. an MCP server's; a tool's own metadata wins.
    ``retry``: the attempts of each model request (an int, or a ``safepoint.Retry``; turn the
    provider SDK's retries off). ``name``: the agent's name in the operations' names (defaults
    to the agent's ``name``)."""

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="safepoint",
        durable_unit_noun="step",
        durable_container_noun="workflow",
        codec=JSON_CODEC,
        journal_discovery=True,
        # Tool steps are keyed by call id, but discovery and validation are counted per
        # occurrence: their order must be the same on every replay.
        sequential_tools_in_durable_context=True,
        tool_config_key=METADATA_KEY,
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
    )

    def __init__(
        self,
        *,
        tools: Mapping[str, Mapping[str, Any]] | None = None,
        retry: sp.Retry | int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        if tools is not None and not isinstance(tools, Mapping):
            raise UsageError(_not_declarations(tools))
        declared = dict(tools or {})
        for tool_name, declaration in declared.items():
            if not isinstance(declaration, Mapping):
                raise UsageError(
                    f"tools[{tool_name!r}] is a declaration such as sppa.effect(...)['safepoint'],"
                    f" not {type(declaration).__name__}"
                )
            declared[tool_name] = _declaration(tool_name, declaration.get(METADATA_KEY, declaration))
        self._declared = declared
        self._retry = retry
        self._backend: SafepointOperationBackend | None = None

    def for_agent(self, agent: Any) -> Any:
        """The capability bound to ``agent``; each of its MCP toolsets is given the hook that
        sends an effect call's idempotency key (around its own ``process_tool_call``)."""
        mcp_module = sys.modules.get("pydantic_ai.mcp")  # imported if, and only if, it is in use
        if mcp_module is not None:

            def keyed(toolset: Any) -> None:
                if isinstance(toolset, mcp_module.MCPToolset):
                    give_key_hook(toolset)

            for toolset in agent.toolsets:
                toolset.apply(keyed)
        return super().for_agent(agent)

    async def prepare_tools(self, ctx: Any, tool_defs: list[Any]) -> list[Any]:
        """The tool definitions the model is shown: an MCP effect tool's idempotency-key
        arguments left out, since the call fills them with the operation's key."""
        backend = self._backend
        if backend is None or not self.in_durable_context:
            return tool_defs
        return [backend.shown(sp.current_run(), tool_def) for tool_def in tool_defs]

    @property
    def in_durable_context(self) -> bool:
        """Whether a workflow is executing here: inside one, the agent's units are steps."""
        try:
            sp.current_run()
        except UsageError:
            return False
        return True

    def get_durable_operation_backend(self) -> SafepointOperationBackend:
        """The backend that runs the agent's units as steps (one per bound agent)."""
        if self._backend is None or self._backend_for != self.name:
            self._backend = SafepointOperationBackend(
                self.name,
                default_model_id=self.default_model_id,
                tools=self._declared,
                retry=self._retry,
            )
            self._backend_for = self.name
        return self._backend

    _backend_for: str = ""
