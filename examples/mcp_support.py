"""A support agent whose tools come from an MCP server, made durable by safepoint — runnable with
no key and no network: the model is the fake model server, scripted turn by turn, and the MCP
server runs in this process (the SDK's in-memory transport).

    python examples/mcp_support.py

The agent looks the order up (``get_order``: the server marks it read-only, so it is a read)
and opens a ticket (``create_ticket``: an effect, reconciled through the server's own
``find_ticket``). The demo crashes the run at the worst moment — the server made the ticket,
the ledger never heard back — and resumes it as a new worker would: the tool list and the read
are replayed, the ticket is found by its idempotency key, and nothing is made twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import anthropic
import mcp
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

import safepoint as sp
from safepoint.integrations import anthropic as spa
from safepoint.integrations import mcp as spm
from safepoint.testing import FakeModelServer, SimulatedCrash, Turn, crash_at

# -- the MCP server (yours would run elsewhere) ----------------------------------------------

crm = MCPServer("crm")
TICKETS: dict[str, dict[str, str]] = {}  # by idempotency key: the server deduplicates by it
ASKED = {"get_order": 0, "create_ticket": 0}


@crm.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    ASKED["get_order"] += 1
    return json.dumps({"order_id": order_id, "customer": "ada@example.com", "shipped": False})


@crm.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_ticket(key: str) -> str:
    """The ticket opened under an idempotency key, or null."""
    return json.dumps(TICKETS.get(key))


@crm.tool()
def create_ticket(subject: str, ctx: Context) -> str:
    """Open a support ticket."""
    ASKED["create_ticket"] += 1
    key = (ctx.request_context.meta or {})[spm.META_KEY]
    return json.dumps(TICKETS.setdefault(key, {"id": f"T-{len(TICKETS) + 1}", "subject": subject}))


# -- the agent --------------------------------------------------------------------------------


async def find(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    """Ask the server what became of a ticket whose answer was lost."""
    async with mcp.Client(crm) as client:
        found = json.loads((await client.call_tool("find_ticket", {"key": str(key)})).content[0].text)
    return sp.Applied(found) if found else sp.NotApplied()


@sp.workflow("support-mcp", version="1")
async def support(run: sp.AsyncRun, ticket: str) -> str:
    kinds = {"create_ticket": spm.effect(reconcile=find, dedup_retention=timedelta(hours=23))}
    async with spm.connect(run, mcp.Client(crm), server_id="crm", kinds=kinds) as server:
        result = await spa.tool_loop_async(
            run,
            anthropic.AsyncAnthropic(),  # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment
            model="claude-sonnet-4-5",
            messages=[{"role": "user", "content": ticket}],
            tools=await server.tools(),
            max_turns=10,
        )
    return result.text


SCRIPT = [
    Turn.tool_calls(("get_order", {"order_id": "A1"})),
    Turn.tool_calls(("create_ticket", {"subject": "Order A1 never arrived"})),
    Turn.text("I opened ticket T-1 for order A1."),
]


async def main() -> int:
    store = sp.open_store(f"sqlite:///{Path(tempfile.mkdtemp(prefix='safepoint-example-')) / 'ledger.db'}")
    with FakeModelServer(SCRIPT) as fake:
        os.environ.update(ANTHROPIC_BASE_URL=fake.url, ANTHROPIC_API_KEY="sk-test-not-real")
        with crash_at("effect.after_receiver_commit"):
            try:
                await sp.start_async(store, support, "Order A1 never arrived.", run_id="ticket-1", lease_ms=0)
            except SimulatedCrash:
                print("crashed: the server opened the ticket, its answer was never recorded")
        answer = await sp.resume_async(store, "ticket-1")  # a new worker: replays, reconciles, finishes
        print(f"answer: {answer}")
        print(
            f"model requests per turn: {fake.requests_per_turn()}, repeated: {len(fake.repeated())},"
            f" orphaned tool calls: {len(fake.orphans)}"
        )
        print(f"orders looked up: {ASKED['get_order']}, tickets opened: {len(TICKETS)}")
        ok = len(TICKETS) == 1 and ASKED["get_order"] == 1 and not fake.repeated() and not fake.orphans
    store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
