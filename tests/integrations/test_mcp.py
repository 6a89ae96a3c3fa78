"""safepoint.integrations.mcp against a real MCP server in process (``mcp.Client(MCPServer)``,
the SDK's memory transport): the tool list a recorded read, each call a step of its tool's
kind, the effect key in ``_meta`` and in the tool's key argument, crashes after the server
committed, timeouts, ``isError`` results, and the server's tools in an Anthropic tool loop."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import mcp
import pytest
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import (
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    InputRequiredResult,
)

import safepoint as sp
from mcp_flows import Crm
from safepoint.errors import UsageError
from safepoint.integrations import mcp as spm
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn
from safepoint.testing import crash_at as crashing

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def crm() -> Crm:
    return Crm()


def text(result: Any) -> str:
    return str(result.content[0].text)


def workflow(crm: Crm, body: Any, **wrap: Any) -> sp.Workflow[Any, Any]:
    """An async workflow that wraps an in-process client of ``crm`` and awaits ``body(client)``."""

    async def run_it(run: sp.AsyncRun) -> Any:
        async with spm.connect(run, mcp.Client(crm.server), server_id="crm", **wrap) as client:
            return await body(client)

    return sp.workflow(f"mcp-{id(body)}")(run_it)


async def test_the_effect_key_reaches_the_server_in_meta_and_as_the_key_argument(
    file_store: sp.Store, crm: Crm
) -> None:
    async def body(c: spm.DurableMcp) -> str:
        return text(await c.call_tool("create_ticket", {"subject": "Refund"}))

    assert (
        json.loads(await sp.start_async(file_store, workflow(crm, body), run_id="m1", lease_ms=0))["id"]
        == "T-1"
    )
    [meta] = crm.metas
    key = meta[spm.META_KEY]
    assert key.startswith("sp_")
    assert crm.key_arguments == [key]
    assert list(crm.tickets) == [key]
    assert list(file_store.load_ledger("m1").steps) == ["mcp.crm.list_tools", "mcp.crm.create_ticket"]


async def test_kinds_come_from_annotations_unless_declared(file_store: sp.Store, crm: Crm) -> None:
    async def body(c: spm.DurableMcp) -> list[str]:
        return [
            (await c.policy(n)).kind for n in ("get_order", "create_ticket", "close_account", "set_status")
        ]

    assert await sp.start_async(file_store, workflow(crm, body), run_id="k1", lease_ms=0) == [
        "read",
        "effect",
        "effect",
        "effect",
    ]
    trusting = workflow(crm, body, trust_idempotent_hint=True, kinds={"get_order": "effect"})
    assert await sp.start_async(file_store, trusting, run_id="k2", lease_ms=0) == [
        "effect",
        "effect",
        "effect",
        "effect",
    ]

    async def idempotent(c: spm.DurableMcp) -> Any:
        return (await c.policy("set_status")).dedup_retention is not None

    assert await sp.start_async(
        file_store, workflow(crm, idempotent, trust_idempotent_hint=True), run_id="k3", lease_ms=0
    )
    every = workflow(crm, body, default="effect")
    assert await sp.start_async(file_store, every, run_id="k4", lease_ms=0) == ["effect"] * 4
    with pytest.raises(UsageError, match="names nope, which server 'crm' does not list"):
        await sp.start_async(file_store, workflow(crm, body, kinds={"nope": "read"}), run_id="k5", lease_ms=0)


async def test_a_read_and_the_tool_list_are_replayed_after_a_crash(file_store: sp.Store, crm: Crm) -> None:
    async def body(c: spm.DurableMcp) -> list[Any]:
        listing = await c.list_tools()
        order = await c.call_tool("get_order", {"order_id": "A1"})
        ticket = await c.call_tool("create_ticket", {"subject": "late"})
        return [len(listing.tools), text(order), text(ticket)]

    wf = workflow(crm, body, kinds={"create_ticket": spm.effect(reconcile=crm.find)})
    with crashing("step.after_record:mcp.crm.get_order"), pytest.raises(SimulatedCrash):
        await sp.start_async(file_store, wf, run_id="r1", lease_ms=0)

    @crm.server.tool()
    def added_later() -> str:
        """A tool the first run was never shown."""
        return "new"

    count, order, ticket = await sp.resume_async(file_store, "r1")
    assert count == 4  # the recorded list: the tool added since is not in it
    assert json.loads(order)["order_id"] == "A1"
    assert crm.calls["get_order"] == 1
    assert json.loads(ticket)["id"] == "T-1"


@pytest.mark.parametrize(
    ("policy", "outcome"),
    [
        (None, "blocks"),  # no way to ask: the run blocks, nothing is sent again
        ("reconcile", "T-1"),  # the server's record says it was applied
        ("dedup", "T-1"),  # the server deduplicates by the key: sent again under it, answered once
    ],
)
async def test_a_crash_after_the_server_committed(
    file_store: sp.Store, crm: Crm, policy: str | None, outcome: str
) -> None:
    declared = {
        None: spm.effect(),
        "reconcile": spm.effect(reconcile=crm.find),
        "dedup": spm.effect(dedup_retention=timedelta(hours=1)),
    }[policy]

    async def body(c: spm.DurableMcp) -> str:
        return str(json.loads(text(await c.call_tool("create_ticket", {"subject": "x"})))["id"])

    wf = workflow(crm, body, kinds={"create_ticket": declared})
    with crashing("effect.after_receiver_commit"), pytest.raises(SimulatedCrash):
        await sp.start_async(file_store, wf, run_id=f"c-{policy}", lease_ms=0)
    assert len(crm.tickets) == 1
    if outcome == "blocks":
        with pytest.raises(sp.NeedsReconciliation, match=r"mcp\.crm\.create_ticket"):
            await sp.resume_async(file_store, f"c-{policy}")
        assert crm.calls["create_ticket"] == 1
    else:
        assert await sp.resume_async(file_store, f"c-{policy}") == outcome
    assert len(crm.tickets) == 1
    if policy == "dedup":  # the same key both times
        assert crm.calls["create_ticket"] == 2
        assert len({m[spm.META_KEY] for m in crm.metas}) == 1


@pytest.mark.parametrize("reconcile", [False, True])
async def test_a_timeout_is_an_unknown_outcome_never_a_failure(
    file_store: sp.Store, crm: Crm, reconcile: bool
) -> None:
    crm.delay = 2.0
    declared = spm.effect(reconcile=crm.find) if reconcile else "effect"

    async def body(c: spm.DurableMcp) -> str:
        return text(await c.call_tool("create_ticket", {"subject": "x"}, read_timeout_seconds=0.2))

    wf = workflow(crm, body, kinds={"create_ticket": declared})
    if reconcile:
        assert json.loads(await sp.start_async(file_store, wf, run_id="t1", lease_ms=0))["id"] == "T-1"
    else:
        with pytest.raises(sp.NeedsReconciliation, match="Timed out"):
            await sp.start_async(file_store, wf, run_id="t1", lease_ms=0)
    assert crm.calls["create_ticket"] == 1
    assert len(crm.tickets) == 1


async def test_is_error_results_are_recorded_and_replayed(file_store: sp.Store, crm: Crm) -> None:
    async def body(c: spm.DurableMcp) -> list[Any]:
        missing = await c.call_tool("get_order", {"order_id": "missing"})
        refused = await c.call_tool("close_account", {"account": "ada"})
        return [missing.is_error, text(missing), refused.is_error, text(refused)]

    wf = workflow(crm, body)
    with crashing("run.before_complete"), pytest.raises(SimulatedCrash):
        await sp.start_async(file_store, wf, run_id="e1", lease_ms=0)
    first = await sp.resume_async(file_store, "e1")
    assert first[0] is True
    assert first[2] is True
    assert "close_account" in first[3]
    assert crm.calls["get_order"] == 1
    assert crm.calls["close_account"] == 1


async def test_an_error_that_may_hide_a_change_blocks(file_store: sp.Store, crm: Crm) -> None:
    async def body(c: spm.DurableMcp) -> Any:
        return await c.call_tool("close_account", {"account": "ada"})

    wf = workflow(crm, body, kinds={"close_account": spm.effect(on_error="unknown")})
    with pytest.raises(sp.NeedsReconciliation, match="McpToolError"):
        await sp.start_async(file_store, wf, run_id="u1", lease_ms=0)


async def test_the_servers_tools_in_an_anthropic_tool_loop(file_store: sp.Store, crm: Crm) -> None:
    import anthropic

    from safepoint.integrations import anthropic as spa

    script = [
        Turn.tool_calls(("get_order", {"order_id": "A1"})),
        Turn.tool_calls(("create_ticket", {"subject": "A1 late"})),
        Turn.text("Opened T-1."),
    ]
    with FakeModelServer(script) as fake:

        async def body(c: spm.DurableMcp) -> list[Any]:
            tools = await c.tools()
            client = anthropic.AsyncAnthropic(api_key="sk-test-not-real", base_url=fake.url)
            result = await spa.tool_loop_async(
                None, client, model="claude-test", messages=[{"role": "user", "content": "A1?"}], tools=tools
            )
            return [result.text, tools.anthropic()]

        wf = workflow(crm, body, kinds={"create_ticket": spm.effect(reconcile=crm.find)})
        with crashing("effect.after_receiver_commit"), pytest.raises(SimulatedCrash):
            await sp.start_async(file_store, wf, run_id="l1", lease_ms=0)
        answer, definitions = await sp.resume_async(file_store, "l1")
    assert answer == "Opened T-1."
    assert len(crm.tickets) == 1
    assert crm.calls["create_ticket"] == 1
    ticket = next(d for d in definitions if d["name"] == "create_ticket")
    assert "idempotency_key" not in ticket["input_schema"]["properties"]  # ours to fill, not the model's
    steps = list(file_store.load_ledger("l1").steps)
    assert sum(s.startswith("tool.") for s in steps) == 2
    assert "mcp.crm.list_tools" in steps
    assert fake.orphans == []


async def test_misuse_is_told_what_to_do(file_store: sp.Store, crm: Crm) -> None:
    with pytest.raises(UsageError, match=r"mcp\.Client or mcp\.ClientSession"):
        spm.wrap(None, object(), server_id="crm")
    with pytest.raises(UsageError, match="server_id"):
        spm.wrap(None, crm, server_id="a b")

    async def body(c: spm.DurableMcp) -> Any:
        return await c.call_tool("nope", {})

    with pytest.raises(UsageError, match="lists no tool 'nope'"):
        await sp.start_async(file_store, workflow(crm, body), run_id="x1", lease_ms=0)

    async def read(c: spm.DurableMcp) -> Any:
        return await c.call_tool("get_order", {"order_id": "A1"})

    with pytest.raises(UsageError, match="a kind is"):
        await sp.start_async(file_store, workflow(crm, read, kinds={"get_order": "write"}), run_id="x2")


async def test_the_servers_tools_in_an_openai_responses_loop(file_store: sp.Store, crm: Crm) -> None:
    import openai

    from safepoint.integrations import openai as spo

    script = [
        Turn.tool_calls(("create_ticket", {"subject": "A1 late"}), ("get_order", {"order_id": "A1"})),
        Turn.text("Opened T-1."),
    ]
    with FakeModelServer(script) as fake:

        async def body(c: spm.DurableMcp) -> str:
            client = openai.AsyncOpenAI(api_key="sk-test-not-real", base_url=fake.url + "/v1")
            result = await spo.responses_tool_loop_async(
                None,
                client,
                model="gpt-test",
                input=[{"role": "user", "content": "A1?"}],
                tools=await c.tools(),
            )
            return result.text

        wf = workflow(crm, body)  # create_ticket: an effect by default, that blocks when uncertain
        with crashing("step.after_record:tool"), pytest.raises(SimulatedCrash):
            await sp.start_async(file_store, wf, run_id="o1", lease_ms=0)
        assert await sp.resume_async(file_store, "o1") == "Opened T-1."
    assert crm.calls["create_ticket"] == 1
    assert crm.calls["get_order"] == 1
    assert fake.repeated() == []
    assert fake.orphans == []


class Refunds:
    """A server whose refund asks its person to confirm first (an ``InputRequiredResult``: a
    multi-round-trip request) and is applied on the round that carries the answer."""

    def __init__(self) -> None:
        self.first_rounds = 0  # requests that started the refund (no request_state)
        self.applied: dict[str, str] = {}
        self.asked = 0  # how often the client's person was asked
        server = self.server = MCPServer("refunds")

        @server.tool()
        async def refund(order_id: str, ctx: Context) -> str | InputRequiredResult:
            """Refund an order, once its customer confirmed."""
            if ctx.request_state is None:
                self.first_rounds += 1
                confirm = ElicitRequestFormParams(
                    message=f"Refund order {order_id}?",
                    requested_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}},
                )
                return InputRequiredResult(
                    input_requests={"confirm": ElicitRequest(params=confirm)},
                    request_state=f"asked:{order_id}",
                )
            answer = (ctx.input_responses or {})["confirm"]
            assert ctx.request_state == f"asked:{order_id}"
            key = dict(ctx.request_context.meta or {})[spm.META_KEY]
            if isinstance(answer, ElicitResult) and answer.action == "accept":
                made = self.applied.setdefault(key, f"R-{len(self.applied) + 1}")
                return json.dumps({"refund": made})
            return json.dumps({"refund": None})

    async def confirm(self, context: Any, params: Any) -> ElicitResult:
        self.asked += 1
        return ElicitResult(action="accept", content={"ok": True})


@pytest.mark.parametrize(
    "crash",
    [
        "effect.after_accept:mcp.refunds.refund",  # the server's "input required" recorded
        "step.after_record:mcp.refunds.refund.input",  # the person's answer recorded
        "effect.after_receiver_commit:mcp.refunds.refund.round",  # applied, the answer lost: resent
    ],
)
async def test_a_call_the_server_answers_input_required_continues_the_same_request_after_a_crash(
    file_store: sp.Store, crash: str
) -> None:
    refunds = Refunds()

    @sp.workflow("mcp-refund")
    async def flow(run: sp.AsyncRun) -> Any:
        client = mcp.Client(refunds.server, elicitation_callback=refunds.confirm)
        kinds = {"refund": spm.effect(dedup_retention=timedelta(hours=23))}  # the server dedups by key
        async with spm.connect(run, client, server_id="refunds", kinds=kinds) as crm:
            return text(await crm.call_tool("refund", {"order_id": "A1"}))

    with crashing(crash), pytest.raises(SimulatedCrash):
        await sp.start_async(file_store, flow, run_id="r1", lease_ms=0)
    assert json.loads(await sp.resume_async(file_store, "r1")) == {"refund": "R-1"}
    assert refunds.first_rounds == 1  # continued with the recorded request_state, never started over
    assert refunds.asked == 1  # the person's answer was recorded: never asked again
    assert len(refunds.applied) == 1
    steps = list(file_store.load_ledger("r1").steps)
    assert steps[-3:] == ["mcp.refunds.refund", "mcp.refunds.refund.input.2", "mcp.refunds.refund.round.2"]
