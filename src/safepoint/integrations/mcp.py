"""MCP servers on the ledger: a client whose tool list is a recorded read and whose tool calls
are steps of the kind each tool is declared.

>>> from safepoint.integrations import mcp as spm
>>> async with mcp.Client(server) as client:
...     crm = spm.wrap(run, client, server_id="crm", kinds={"create_ticket": spm.effect(reconcile=find)})
...     listing = await crm.list_tools()
...     result = await crm.call_tool("create_ticket", {"subject": "Refund"})

``wrap(run, client_or_session, server_id=...)`` takes an ``mcp.Client`` or an
``mcp.ClientSession`` and gives an object with the same ``list_tools`` and ``call_tool`` (async,
in an ``async def`` workflow):

- ``list_tools()`` is a read step (``mcp.<server_id>.list_tools``): the list is an input to the
  next model call, so a resume replays the list the model was shown. All pages are read.
- ``call_tool(name, arguments)`` is a step of the tool's kind (``mcp.<server_id>.<name>``, or
  ``tool.<call_id>`` given the model's ``call_id=``): a ``read`` is recorded and replayed; an
  ``effect`` is sent at most once per operation, its idempotency key in the request's ``_meta``
  under ``dev.safepoint/idempotency-key`` and — when the tool's input schema declares
  ``idempotency_key`` or ``idempotencyKey`` — as that argument too.

Kinds: ``kinds={name: spm.read() | spm.effect(...) | spm.idempotent() | "read" | "effect"}``
overrides; the rest follow ``default`` — ``"annotations"`` (the default) reads the server's hints
(``readOnlyHint`` → read; anything else, ``destructiveHint`` being true by default, → an effect
that blocks when its outcome is uncertain; ``idempotentHint`` only with
``trust_idempotent_hint=True``). A hint is the server's claim: declare the tools that matter.

Outcomes: a timeout (``read_timeout_seconds`` spent) or a dropped transport leaves an effect's
outcome unknown — reconciled with ``reconcile`` or the run blocks (``NeedsReconciliation``),
never a failure that invites a resend. A result with ``isError`` is a read's recorded failure,
and an effect's rejection (the server answered: recorded, the same result on every replay)
unless the tool says ``on_error="unknown"``. ``call_tool`` returns the ``CallToolResult`` rebuilt
from the record, ``isError`` ones included, on the first run as on a replay.

For the SDK loops: ``await crm.tools()`` is a ``safepoint.integrations.tools.Tools`` of the
server's tools (their schemas without the key arguments), to pass as the ``tools=`` of
``safepoint.integrations.anthropic.tool_loop_async`` or the OpenAI loops.
"""

from __future__ import annotations

try:
    import mcp as _sdk
except ImportError as exc:  # pragma: no cover - the extra is the way in
    raise ImportError("safepoint.integrations.mcp needs the MCP SDK: pip install 'safepoint[mcp]'") from exc

import hashlib
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import mcp_types

import safepoint as sp
from safepoint.errors import EffectRejected, StepFailed, UsageError
from safepoint.integrations._mcp_policy import (
    IDEMPOTENCY_ARGUMENTS,
    META_KEY,
    REFUSED_CODES,
    McpToolError,
    ToolPolicy,
    as_result,
    effect,
    idempotent,
    key_arguments,
    policy_of,
    read,
    result_json,
    text_of,
    without_key_arguments,
)
from safepoint.integrations._mcp_rounds import (
    MAX_ROUNDS,
    answer_inputs,
    input_required,
    next_round,
    session_of,
)
from safepoint.integrations.tools import Tools

__all__ = [
    "IDEMPOTENCY_ARGUMENTS",
    "META_KEY",
    "DurableMcp",
    "McpToolError",
    "ToolPolicy",
    "connect",
    "effect",
    "idempotent",
    "read",
    "wrap",
]

# Pages of a tool listing read before giving up on a server whose cursor never ends.
_MAX_PAGES = 100


def wrap(
    run: sp.AsyncRun | None,
    client: Any,
    *,
    server_id: str,
    kinds: Mapping[str, ToolPolicy | str] | None = None,
    default: ToolPolicy | str = "annotations",
    trust_idempotent_hint: bool = False,
    read_timeout_seconds: float | None = None,
) -> DurableMcp:
    """An MCP client (``mcp.Client`` or ``mcp.ClientSession``, already entered) whose calls
    are steps of ``run`` (``None``: the run whose workflow is executing). ``server_id`` names
    the server in step ids and effect names: keep it stable across deploys. ``kinds`` declares
    tools by name; ``default`` the others (``"annotations"``, ``"effect"``, ``"read"``, or a
    policy). ``read_timeout_seconds``: each call's default timeout."""
    if not isinstance(server_id, str) or not server_id or any(c in server_id for c in " #@:/"):
        raise UsageError(f"server_id {server_id!r}: a short name without spaces, '#', '@', ':' or '/'")
    if not (callable(getattr(client, "call_tool", None)) and callable(getattr(client, "list_tools", None))):
        raise UsageError(f"wrap takes an mcp.Client or mcp.ClientSession, not {type(client).__name__}")
    if kinds is not None and not isinstance(kinds, Mapping):
        raise UsageError(_not_kinds(kinds))
    return DurableMcp(
        run, client, server_id, dict(kinds or {}), default, trust_idempotent_hint, read_timeout_seconds
    )


def _not_kinds(kinds: object) -> str:
    """Why ``wrap(kinds=...)`` refuses what is not a mapping of the server's tools to kinds."""
    if isinstance(kinds, Tools):
        named = ", ".join(f"{name!r}: ..." for name in kinds.names()) or "'create_ticket': ..."
        return (
            "kinds= declares the kind of the server's tools by name, not a Tools registry (whose"
            f" tools are answered by your own functions): kinds={{{named}}}, each spm.read(),"
            " spm.effect(...), spm.idempotent(), 'read' or 'effect'. The Tools registry of the"
            " server's tools, for a model loop's tools=, is what await crm.tools() gives"
        )
    return (
        "kinds= is a mapping of the server's tool names to kinds"
        f" ({{'create_ticket': spm.effect(...)}}), not {type(kinds).__name__}"
    )


@asynccontextmanager
async def connect(
    run: sp.AsyncRun | None, client: Any, *, server_id: str, **options: Any
) -> AsyncIterator[DurableMcp]:
    """``async with connect(run, mcp.Client(server), server_id="crm") as crm:`` — enter the
    client and ``wrap`` it (``options`` are ``wrap``'s). The client's task group wraps whatever
    leaves its block in an ``ExceptionGroup``; this gives back the one exception instead, so
    that a run that blocks, waits for an approval or reaches a limit stops as that, not as a
    failure of the run."""
    try:
        async with client as entered:
            yield wrap(run, entered, server_id=server_id, **options)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) != 1:
            raise
        raise leaves[0] from None


def _leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return found


class DurableMcp:
    """An MCP client on the ledger (made by ``wrap``): ``list_tools``, ``call_tool``,
    ``policy`` and ``tools``."""

    def __init__(
        self,
        run: sp.AsyncRun | None,
        client: Any,
        server_id: str,
        kinds: dict[str, ToolPolicy | str],
        default: ToolPolicy | str,
        trust_idempotent_hint: bool,
        read_timeout_seconds: float | None,
    ) -> None:
        self._run = run
        self._client = client
        self.server_id = server_id
        self._kinds = kinds
        self._default = default
        self._trust_idempotent = trust_idempotent_hint
        self._timeout = read_timeout_seconds
        self._listing: dict[str, mcp_types.Tool] | None = None
        # One per tool, receipt shape (the whole result, or the text a model is told) and timeout.
        self._effects: dict[tuple[str, bool, float | None], sp.Effect[Any]] = {}

    @property
    def client(self) -> Any:
        """The wrapped client, for what is not a step (prompts, resources)."""
        return self._client

    def _current(self) -> sp.AsyncRun:
        found = sp.current_run() if self._run is None else self._run
        if not isinstance(found, sp.AsyncRun):
            raise UsageError("an MCP client is async: wrap it in an async def workflow (an AsyncRun)")
        return found

    # -- the tool list ------------------------------------------------------------------------

    async def list_tools(self) -> mcp_types.ListToolsResult:
        """Every tool the server lists (all pages), as a read step: replayed on a resume, so the
        model is shown the list it was shown before."""
        recorded = await self._current().read(
            f"mcp.{self.server_id}.list_tools", self._fetch_listing, secrets="redact"
        )
        listing = mcp_types.ListToolsResult.model_validate(recorded)
        self._listing = {tool.name: tool for tool in listing.tools}
        unknown = sorted(set(self._kinds) - set(self._listing))
        if unknown:
            raise UsageError(
                f"kinds= names {', '.join(unknown)}, which server {self.server_id!r} does not list;"
                f" it lists: {', '.join(self._listing) or 'no tools'}"
            )
        return listing

    async def _fetch_listing(self) -> dict[str, Any]:
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            if isinstance(self._client, _sdk.Client):
                page = await self._client.list_tools(cursor=cursor)
            else:
                page = await self._client.list_tools(params=mcp_types.PaginatedRequestParams(cursor=cursor))
            tools.extend(result_json(tool) for tool in page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return {"tools": tools}
        raise McpToolError(f"server {self.server_id!r} listed more than {_MAX_PAGES} pages of tools")

    async def _tool(self, name: str) -> mcp_types.Tool:
        if self._listing is None:
            await self.list_tools()
        assert self._listing is not None
        tool = self._listing.get(name)
        if tool is None:
            raise UsageError(
                f"server {self.server_id!r} lists no tool {name!r}; it lists: {', '.join(self._listing)}"
            )
        return tool

    async def policy(self, name: str) -> ToolPolicy:
        """The kind ``name``'s calls run as: the user's, else the default's."""
        tool = await self._tool(name)
        return policy_of(self._kinds.get(name), tool, self._default, self._trust_idempotent)

    # -- a call -------------------------------------------------------------------------------

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        call_id: str | None = None,
        read_timeout_seconds: float | None = None,
    ) -> mcp_types.CallToolResult:
        """Call ``name`` as a step of its kind (``tool.<call_id>`` given the model's call id,
        else ``mcp.<server_id>.<name>``) and return its ``CallToolResult`` from the record."""
        tool = await self._tool(name)
        policy = policy_of(self._kinds.get(name), tool, self._default, self._trust_idempotent)
        args = dict(arguments or {})
        sid = f"tool.{call_id}" if call_id else f"mcp.{self.server_id}.{name}"
        timeout = read_timeout_seconds if read_timeout_seconds is not None else self._timeout
        run = self._current()
        # Round 1 is the call; while the server answers "input required", each later round
        # (step ``<sid>.round.<n>``) carries the recorded answers to its input requests (step
        # ``<sid>.input.<n>``) and the server's request_state: a resume continues the request.
        recorded = await self._round(run, sid, tool, policy, timeout, args, operation_id=None)
        for n in range(2, MAX_ROUNDS + 2):
            if not input_required(recorded):
                return _rebuilt(recorded)
            responses = await run.read(f"{sid}.input.{n}", _Inputs(self._client, recorded), secrets="redact")
            payload = next_round(args, recorded, responses)
            recorded = await self._round(run, f"{sid}.round.{n}", tool, policy, timeout, payload)
        raise McpToolError(f"tool {name!r} asked for input more than {MAX_ROUNDS} times")

    async def _round(
        self,
        run: sp.AsyncRun,
        sid: str,
        tool: mcp_types.Tool,
        policy: ToolPolicy,
        timeout: float | None,
        payload: dict[str, Any],
        *,
        operation_id: str | None = "",
    ) -> dict[str, Any]:
        """One round of a call as a step of the tool's kind: the call itself (its payload the
        arguments), or a later round (its payload ``next_round``'s), the step naming it."""
        first = operation_id is None
        if policy.kind == "read":
            retry = policy.retry if policy.retry is not None else 1

            async def observe(recorded: dict[str, Any]) -> dict[str, Any]:
                return result_json(await self._send_read(tool.name, recorded, timeout, later=not first))

            try:
                return await run.read(
                    sid, observe, payload, max_age=policy.max_age, retry=retry, secrets="redact"
                )
            except StepFailed as failed:
                if failed.error_type != McpToolError.__name__:
                    raise
                return _error_result(failed.error_message or "")
        effect_ = self._effect(tool, policy, timeout, as_text=False, later=not first)
        try:
            receipt = await run.effect(
                sid,
                effect_,
                payload=payload,
                operation_id=_operation_id(tool.name, policy, payload) if first else None,
                approval=bool(policy.approval) if first else False,
            )
        except EffectRejected as rejected:  # recorded: the same result on every replay
            return _refusal(rejected.evidence)
        return receipt if input_required(receipt) else as_result(receipt)

    async def _send(
        self, name: str, payload: dict[str, Any], timeout: float | None, key: str | None, *, later: bool
    ) -> Any:
        """One round on the client's session: the call (``payload``: its arguments), or a
        ``later`` round (``payload``: ``next_round``'s). "Input required" is returned as such."""
        meta = {META_KEY: key} if key is not None else None
        return await session_of(self._client).call_tool(
            name,
            payload["arguments"] if later else payload,
            read_timeout_seconds=timeout,
            meta=meta,
            input_responses=payload["inputResponses"] if later else None,
            request_state=payload["requestState"] if later else None,
            allow_input_required=True,
        )

    async def _send_read(
        self, name: str, payload: dict[str, Any], timeout: float | None, *, later: bool = False
    ) -> Any:
        result = await self._send(name, payload, timeout, None, later=later)
        if isinstance(result, mcp_types.CallToolResult) and result.is_error:
            raise McpToolError(text_of(result_json(result)))
        return result

    def _effect(
        self,
        tool: mcp_types.Tool,
        policy: ToolPolicy,
        timeout: float | None,
        *,
        as_text: bool,
        later: bool = False,
    ) -> sp.Effect[Any]:
        """The ``sp.Effect`` of an effect tool (one per tool, shape of receipt and timeout; a
        ``later`` round of a call the server asked input for is an effect of its own)."""
        effect_name = f"mcp.{self.server_id}.{tool.name}" + (".round" if later else "")
        made = self._effects.get((effect_name, as_text, timeout))
        if made is not None:
            return made
        keyed = key_arguments(tool.input_schema)

        async def execute(payload: Any, key: sp.EffectKey) -> Any:
            sent = dict(payload)
            arguments = sent
            if later:  # the arguments within the round's payload
                arguments = sent["arguments"] = dict(sent["arguments"])
            for argument in keyed:  # the tool takes the key itself: the same one
                arguments[argument] = str(key)
            try:
                result = await self._send(tool.name, sent, timeout, str(key), later=later)
            except _sdk.MCPError as exc:
                if exc.code in REFUSED_CODES:  # refused before the tool ran
                    raise sp.Rejected({"code": exc.code, "message": exc.message}) from exc
                raise  # a timeout, a closed connection, a server error: the outcome is unknown
            recorded = result_json(result)
            if isinstance(result, mcp_types.InputRequiredResult):
                if as_text:  # a model's tool loop has no person to ask: the call ends here
                    raise sp.Rejected(f"tool {tool.name!r} asks for input; call it with DurableMcp.call_tool")
                return recorded  # the round's answer: the request goes on in the next round
            if result.is_error:
                if policy.on_error == "unknown":
                    raise McpToolError(text_of(recorded))
                raise sp.Rejected(text_of(recorded) if as_text else recorded)
            return text_of(recorded) if as_text else recorded

        made = policy.effect_of(effect_name, execute)
        self._effects[effect_name, as_text, timeout] = made
        return made

    # -- for the SDK loops --------------------------------------------------------------------

    async def tools(self) -> Tools:
        """The server's tools as a ``Tools`` for the SDK loops: each answers the model's call
        through the step ``tool.<call_id>`` of its kind, and tells the model the result's text."""
        listing = await self.list_tools()
        tools = Tools()
        for tool in listing.tools:
            policy = policy_of(self._kinds.get(tool.name), tool, self._default, self._trust_idempotent)
            schema = without_key_arguments(tool.input_schema)
            description = tool.description or ""
            if policy.kind == "read":
                tools.add(
                    tool.name,
                    "read",
                    self._reader(tool.name),
                    schema=schema,
                    description=description,
                    max_age=policy.max_age,
                    retry=policy.retry,
                )
            else:
                tools.add(
                    tool.name,
                    "effect",
                    effect=self._effect(tool, policy, self._timeout, as_text=True),
                    schema=schema,
                    description=description,
                    key_fields=policy.key_fields,
                    approval=policy.approval,
                )
        return tools

    def _reader(self, name: str) -> Any:
        async def observe(**arguments: Any) -> str:
            result = await self._send_read(name, arguments, self._timeout)
            if isinstance(result, mcp_types.InputRequiredResult):  # no person to ask in a model's loop
                raise McpToolError(f"tool {name!r} asks for input; call it with DurableMcp.call_tool")
            return text_of(result_json(result))

        return observe


class _Inputs:
    """The function of one ``<sid>.input.<n>`` step: the client's answers to a round's input
    requests (recorded, so a resume never asks its person again)."""

    def __init__(self, client: Any, recorded: dict[str, Any]) -> None:
        self.client, self.recorded = client, recorded

    async def __call__(self) -> dict[str, Any] | None:
        return await answer_inputs(self.client, self.recorded)


def _operation_id(name: str, policy: ToolPolicy, arguments: Mapping[str, Any]) -> str | None:
    """With ``key_fields``, the operation named by the tool and those arguments (two calls that
    agree on them are one change); without, the step names it."""
    if not policy.key_fields:
        return None
    named = {field: arguments.get(field) for field in policy.key_fields}
    text = json.dumps(named, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return f"{name}:{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def _refusal(evidence: Any) -> dict[str, Any]:
    """The ``isError`` result an effect's recorded rejection stands for: the server's own
    result, or the text of a JSON-RPC refusal."""
    if isinstance(evidence, dict) and isinstance(evidence.get("content"), list):
        return evidence
    return _error_result(evidence if isinstance(evidence, str) else text_of(as_result(evidence)))


def _error_result(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": True}


def _rebuilt(recorded: dict[str, Any]) -> mcp_types.CallToolResult:
    """The ``CallToolResult`` a record holds: the workflow gets it from the ledger, on the first
    run as on a replay."""
    return mcp_types.CallToolResult.model_validate(recorded)
