"""Claude Agent SDK on the ledger: the loop runs in the Claude Code CLI, its effects in the run.

The SDK's agent loop runs in another process (the bundled CLI), so safepoint cannot record its
model calls one by one. It records what it can answer for instead:

- each ``query`` *segment* (one CLI call, until it ends or stops at a limit) is a model step
  ``claude.query``, recorded with its cost, so a replay of a finished query asks nothing and the
  run's ``sp.Budget`` counts what the CLI spent, across resumes;
- your tools are in-process SDK MCP tools whose handler answers through
  ``safepoint.integrations.tools`` (step ``tool.<tool_use id>``, the id the CLI sends with the
  call in its ``_meta``): an effect is dispatched once, and a resumed session gets the
  ledger's receipt;
- a PreToolUse hook records the intent in the ledger (step ``claude.intent``: which call id the
  CLI is about to run) and refuses every call once the run must stop (an uncertain effect, an
  approval to wait for) — also a call an earlier process left uncertain, which the resumed
  CLI's model names again with a new id: the recorded intent gives it its first id back;
- the session transcript is mirrored into the ledger (``LedgerSessionStore``), so another
  machine resumes the session; on that resume a call the CLI ran but never recorded (a budget
  stop between the tool and its result) is given its receipt from the ledger, where the CLI
  would tell the model "its outcome is unknown", and a call the hook let through that the
  transcript lost with a killed process is put back, with its receipt;
- ``max_turns`` and ``max_budget_usd``, counted per call by the CLI, are given what is left of
  the run's budget (``run.budget_left()``) on every resume, and the CLI's ``error_max_turns`` /
  ``error_max_budget_usd`` become the run's resumable stop (``BudgetExhausted``, status
  ``stopped``): raise the limit (``safepoint.extend_limits``) and the session carries on.

>>> result = await spc.query(run, "Refund order A1", tools=tools, base=ClaudeAgentOptions(...))
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Mapping
from typing import Any, cast

from claude_agent_sdk import ClaudeAgentOptions, HookMatcher, McpSdkServerConfig, ResultMessage
from claude_agent_sdk import query as sdk_query
from claude_agent_sdk.types import HookContext, HookInput, HookJSONOutput, SessionStore
from mcp.server import Server
from mcp.types import CallToolResult, ListToolsResult, Tool

import safepoint as sp
from safepoint.errors import UsageError
from safepoint.integrations._claude_agent_session import (
    LedgerSessionStore,
    call_intent,
    intent_digest,
    session_id_of,
    walk,
)
from safepoint.integrations.tools import ToolCall, Tools

__all__ = ["LedgerSessionStore", "Session", "options", "query", "session_id_of"]

# What the CLI is told when a segment resumes a session that stopped part-way.
CONTINUE = "Continue where you left off."
_LIMIT_STOPS = ("error_max_turns", "error_max_budget_usd")
# The key under which the CLI sends a call's tool_use id in the request's _meta.
_TOOL_USE_ID = "claudecode/toolUseId"


@dataclasses.dataclass
class Session:
    """The safepoint side of one CLI session: the run, its tools, the intents the PreToolUse
    hook saw (call ids by tool and arguments, for the handler that does not see its call id)
    and the signal that must end the workflow once the CLI has stopped."""

    run: sp.AsyncRun
    tools: Tools
    server: str
    store: LedgerSessionStore
    intents: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    first_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    halted: BaseException | None = None
    pending: set[asyncio.Future[dict[str, Any]]] = dataclasses.field(default_factory=set)
    # Every call the hook let through, in this process or an earlier one (``claude.intents``),
    # by its step's id; and the ids this process answered.
    allowed: dict[str, tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    answered: set[str] = dataclasses.field(default_factory=set)

    @property
    def prefix(self) -> str:
        """What the CLI puts before the name of one of our tools: ``mcp__<server>__``."""
        return f"mcp__{self.server}__"

    def tool_name(self, name: str) -> str:
        """The name the CLI gives one of our tools: ``mcp__<server>__<name>``."""
        return self.prefix + name

    def call_id(self, name: str, arguments: Mapping[str, Any], sent: str | None = None) -> str:
        """The id of this call's step. ``sent``: the tool_use id the CLI sent with the call
        (its ``_meta``), the call's own even when two calls of one turn are alike — given back
        its first id when the hook found the call an earlier process recorded under another.
        Without it (a CLI that sends none), the ids the hook saw for this tool and these
        arguments, in the order it saw them; without those either, an id made of the call's
        content, the same on every replay."""
        waiting = self.intents.get(call_intent(name, arguments), [])
        if sent is not None:
            first = self.first_ids.get(sent, sent)
            if first in waiting:
                waiting.remove(first)
            return first
        if waiting:
            return waiting.pop(0)
        digest = hashlib.sha256(call_intent(name, arguments).encode()).hexdigest()[:16]
        return f"content_{digest}"

    async def answer(
        self, name: str, arguments: dict[str, Any], *, call_id: str | None = None, sent: str | None = None
    ) -> dict[str, Any]:
        """Answer one call through the ledger (the SDK MCP handler, with the tool_use id the
        CLI ``sent``, or a resume giving a call the CLI ran but never recorded its result its
        ``call_id``). A signal that must end the workflow is kept for the driver, and the CLI
        is told the run stopped."""
        if self.halted is not None:
            return _error(f"the run stopped: {self.halted}")
        call = ToolCall(call_id or self.call_id(name, arguments, sent), name, arguments)
        # The CLI may end the query (a budget stop on the tool's turn) while the handler still
        # runs, and the SDK then cancels it: the call runs in a task of its own, which the
        # segment waits for (``settle``), so an effect is never left half-dispatched.
        task = asyncio.ensure_future(self._call(call))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)
        return await asyncio.shield(task)

    async def _call(self, call: ToolCall) -> dict[str, Any]:
        self.answered.add(call.call_id)
        try:
            outcome = await self.tools.call_async(self.run, call)
        except BaseException as signal:
            self.halted = signal
            return _error(f"the run stopped: {signal}")
        return {"content": [{"type": "text", "text": outcome.content}], "is_error": outcome.is_error}

    async def settle(self) -> None:
        """Wait for the calls still running (the CLI stopped without waiting for them)."""
        while self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)

    async def read_allowed(self) -> None:
        """Read the calls earlier processes let through (``claude.intents``, walked to its
        end, the end recorded as an empty occurrence, as the session transcript is)."""
        for found in await walk(self.run, "claude.intents", _Intent):
            if isinstance(found, dict):
                self.allowed[str(found["id"])] = (str(found["tool"]), dict(found["arguments"]))

    async def settle_allowed(self) -> None:
        """Answer every call the hook let through that this process has not answered. At a
        limit stop the CLI ran the tool (or a process killed inside it did) and may never ask
        for it again: a resumed CLI that restored the spent budget stops before asking the
        model anything, which would leave an effect dispatched and never settled."""
        for call_id, (tool, arguments) in list(self.allowed.items()):
            if call_id not in self.answered:
                await self.answer(tool, arguments, call_id=call_id)

    async def answer_orphan(self, name: str, arguments: dict[str, Any], *, call_id: str) -> dict[str, Any]:
        """Answer a call the transcript holds without its result, under the id its step has:
        its own, or the first id of the call an earlier process's hook gave it back."""
        first = self.first_ids.get(call_id)
        if first is None:
            first = str(await self.run.read(f"claude.alias.{call_id}", _Alias(call_id), secrets="redact"))
        return await self.answer(name, arguments, call_id=first)

    async def pre_tool_use(
        self, data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """PreToolUse: record the intent (step ``claude.intent``: which call the CLI is about
        to run) and refuse every call once the run must stop, so nothing new starts while an
        effect is uncertain.

        After a crash the resumed CLI may ask the model again for a turn whose transcript the
        ledger did not hold yet, and the model names the same call with a new id. The intent
        an earlier process recorded for it is then replayed: the call keeps its first id (its
        step ``tool.<first id>``), and is settled here, from the ledger, before the CLI runs
        it — replayed, reconciled with its owner, or, when the ledger holds it as uncertain,
        refused until a person settles it."""
        if self.halted is not None:
            return cast("HookJSONOutput", _deny(f"the run stopped and must be settled first: {self.halted}"))
        prefix = self.prefix
        fields = cast("dict[str, Any]", data)  # a TypedDict union: PreToolUse's has these keys
        name = str(fields.get("tool_name", ""))
        if not (tool_use_id and name.startswith(prefix)):
            return {}
        tool, arguments = name[len(prefix) :], dict(fields.get("tool_input") or {})
        intent = call_intent(tool, arguments)
        digest = intent_digest(intent)  # recorded: arguments may hold what no ledger keeps
        fresh = _Intent({"id": tool_use_id, "intent": digest})
        recorded = await self.run.read("claude.intent", fresh, secrets="redact")
        earlier = (
            not fresh.called and isinstance(recorded, dict) and recorded.get("intent") in (digest, intent)
        )
        call_id = str(recorded["id"]) if earlier and isinstance(recorded, dict) else tool_use_id
        self.intents.setdefault(call_intent(tool, arguments), []).append(call_id)
        self.first_ids[tool_use_id] = call_id
        if earlier:
            # The transcript will hold the call under its new id; a later process that finds it
            # there without its result (a stop between the tool and its result) must answer it
            # from the first id's step, not dispatch it again under the new one.
            await self.run.read(f"claude.alias.{tool_use_id}", _Alias(call_id), secrets="redact")
        if earlier:
            await self.answer(tool, arguments, call_id=call_id)  # the handler then replays it
            if self.halted is not None:
                return cast("HookJSONOutput", _deny(f"an earlier call is not settled: {self.halted}"))
        elif call_id not in self.allowed:
            self.allowed[call_id] = (tool, arguments)
            # the model chose the arguments: a credential among them is recorded redacted
            await self.run.read(
                "claude.intents",
                _Intent({"id": call_id, "tool": tool, "arguments": arguments}),
                secrets="redact",
            )
        return {}


class _Intent:
    """The function of one ``claude.intent`` step: it returns the intent, and says whether it
    was called (a recorded step replays without calling it: the intent is an earlier one)."""

    def __init__(self, value: dict[str, Any] | None) -> None:
        self.value = value
        self.called = False

    def __call__(self) -> dict[str, Any] | None:
        self.called = True
        return self.value


class _Alias:
    """The function of one ``claude.alias.<tool_use id>`` step: the id of the step that answers
    the call (its own, unless a hook gave it an earlier call's). One class for both writers,
    so the step's recorded name is the same whichever wrote it."""

    def __init__(self, first_id: str) -> None:
        self.first_id = first_id

    def __call__(self) -> str:
        return self.first_id


def options(
    run: sp.AsyncRun, base: ClaudeAgentOptions | None = None, *, tools: Tools, server: str = "tools"
) -> tuple[ClaudeAgentOptions, Session]:
    """``base`` with the run's tools as in-process MCP tools answered through the ledger, the
    PreToolUse hook, the ledger-backed session store and the session id the run fixes (the
    same on every resume), and the ``Session`` that holds the safepoint side. ``query`` calls
    it; call it yourself to drive ``claude_agent_sdk.query`` with your own loop."""
    if not isinstance(run, sp.AsyncRun):
        raise UsageError("the Claude Agent SDK runs in an async def workflow: pass its AsyncRun")
    if not isinstance(tools, Tools):
        raise UsageError(
            f"tools= is a safepoint.integrations.tools.Tools registry, not {type(tools).__name__}:"
            " declare each tool in one by its kind (@tools.read, @tools.effect, tools.add(...)),"
            " which the CLI is given as in-process MCP tools answered through the run's steps"
        )
    base = base or ClaudeAgentOptions()
    store = LedgerSessionStore(run)
    session = Session(run, tools, server, store)
    store.calls = session
    hooks = dict(base.hooks or {})
    hooks["PreToolUse"] = [HookMatcher(hooks=[session.pre_tool_use]), *hooks.get("PreToolUse", [])]
    made = dataclasses.replace(
        base,
        mcp_servers={**_servers(base), server: _sdk_server(session, tools)},
        allowed_tools=[*base.allowed_tools, *(session.tool_name(n) for n in tools.names())],
        hooks=hooks,
        # the Protocol's optional listing methods are left out (the SDK probes for them)
        session_store=cast("SessionStore", store),
        session_store_flush="eager",  # every frame in the ledger before the CLI goes on
    )
    return made, session


async def query(
    run: sp.AsyncRun,
    prompt: str,
    *,
    tools: Tools,
    base: ClaudeAgentOptions | None = None,
    server: str = "tools",
    model: str = "claude",
) -> dict[str, Any]:
    """Run ``prompt`` in the CLI as one durable query and return its result (``result``,
    ``num_turns``, ``total_cost_usd``, ``session_id``, ``subtype``).

    Each CLI call is a model step ``claude.query``: a replay of a finished query returns it
    without starting the CLI. A query cut off by a crash resumes its session from the ledger;
    one stopped at the CLI's turn or budget limit stops the run (``BudgetExhausted``) until
    the limit is raised, then resumes the session with what is left."""
    made, session = options(run, base, tools=tools, server=server)
    await session.read_allowed()
    asked = prompt
    while True:
        segment = await run.model(
            "claude.query",
            _segment(session, made, prompt),
            model=model,
            messages=[{"role": "user", "content": asked}],
            name="claude_agent.query",
            usage=_usage,
        )
        asked = CONTINUE  # what every later segment of the query asks
        session.store.cost_so_far = float(segment["total_cost_usd"])  # replayed or just made
        if segment["subtype"] in _LIMIT_STOPS:
            await session.settle_allowed()  # before the run stops: no effect left dispatching
        if session.halted is not None:
            raise session.halted
        for _ in range(int(segment["num_turns"] or 1) - 1):
            # The CLI's turns past the segment's own, each a model call of the run's budget
            # (``model_calls``: the run's max turns): recorded, so a resume counts them.
            await run.model("claude.turn", _turn, model=model, messages=[], name="claude_agent.turn")
        if segment["subtype"] == "success" or segment["subtype"] not in _LIMIT_STOPS:
            if segment.get("is_error"):
                raise UsageError(f"the Claude Code CLI ended with {segment['subtype']}: {segment['result']}")
            return dict(segment)
        # A limit stop: the next model step finds the run's budget spent and stops the run;
        # once a person raised it, the loop resumes the session with what is left.


def _segment(session: Session, made: ClaudeAgentOptions, prompt: str) -> Any:
    """The function of one ``claude.query`` step: one CLI call, from the session's start or
    resuming it, with what is left of the run's turns and cost as the CLI's limits."""

    async def segment(**request: Any) -> dict[str, Any]:
        run = session.run
        sid, resuming = await session.store.session()
        left = run.budget_left()
        before = session.store.cost_so_far
        call = dataclasses.replace(
            made,
            session_id=None if resuming else sid,
            resume=sid if resuming else None,
            max_turns=left.model_calls if left.model_calls is not None else made.max_turns,
            max_budget_usd=left.cost if left.cost is not None else made.max_budget_usd,
        )
        # A session already under way (a segment stopped, or cut off by a crash) is resumed
        # and told to go on; the prompt itself is in its transcript. A new one is given it.
        text = CONTINUE if resuming else prompt
        result: ResultMessage | None = None
        try:
            async for message in sdk_query(prompt=text, options=call):
                if isinstance(message, ResultMessage):
                    result = message
                elif getattr(message, "subtype", None) == "mirror_error":
                    await session.store.lost(sid)  # the ledger's transcript has a hole
        except Exception as failure:  # the SDK raises after an error result it yielded
            if result is None:
                raise
            del failure
        finally:
            await session.settle()
        if result is None:
            raise UsageError("the Claude Code CLI ended without a result message")
        total = float(result.total_cost_usd or 0.0)
        session.store.cost_so_far = total
        return {
            "subtype": result.subtype,
            "is_error": bool(result.is_error),
            "result": result.result,
            "num_turns": result.num_turns,
            "session_id": result.session_id,
            "total_cost_usd": total,
            "cost": max(total - before, 0.0),  # the CLI's cost is cumulative across resumes
        }

    return segment


def _turn(**request: Any) -> dict[str, Any]:
    """A turn the CLI made inside a segment: nothing to ask, only to count."""
    return {}


def _usage(segment: Any) -> dict[str, Any]:
    """A segment's spending, as the run's budget counts it: the cost it added."""
    return {"cost": float(segment.get("cost", 0.0))}


def _sdk_server(session: Session, tools: Tools) -> McpSdkServerConfig:
    """The in-process MCP server of the run's tools. Not ``create_sdk_mcp_server``: its
    handlers see only a call's arguments, and the CLI sends each call's tool_use id in the
    request's ``_meta`` (``claudecode/toolUseId``), which keeps two alike calls of one turn
    apart — matched by arguments alone, they could swap their steps (and so their receipts)."""
    listed = [
        Tool(name=d["name"], description=d["description"], input_schema=d["input_schema"])
        for d in tools.anthropic()
    ]

    async def on_list_tools(ctx: Any, params: Any) -> ListToolsResult:
        return ListToolsResult(tools=listed)

    async def on_call_tool(ctx: Any, params: Any) -> CallToolResult:
        sent = (params.meta or {}).get(_TOOL_USE_ID)
        if params.name not in tools.names():
            return CallToolResult.model_validate(_error(f"no tool {params.name!r}: it lists {tools.names()}"))
        answered = await session.answer(
            params.name, dict(params.arguments or {}), sent=sent if isinstance(sent, str) else None
        )
        return CallToolResult.model_validate(
            {"content": answered["content"], "isError": answered.get("is_error", False)}
        )

    made = Server(session.server, version="1.0.0", on_list_tools=on_list_tools, on_call_tool=on_call_tool)
    return McpSdkServerConfig(type="sdk", name=session.server, instance=made)


def _servers(base: ClaudeAgentOptions) -> dict[str, Any]:
    if isinstance(base.mcp_servers, Mapping):
        return dict(base.mcp_servers)
    raise UsageError("options: give mcp_servers as a dict (a config file path cannot be extended)")


def _error(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "is_error": True}


def _deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }
