"""A support workflow on an MCP server (``tests/mcp_server.py``) over stdio, or over streamable
HTTP when ``$MCP_TEST_URL`` names the server (``http_server()`` starts one), for the kill tests
and the stdio and HTTP tests (importable as ``mcp_flows``).

The workflow lists the server's tools, reads an order, opens a ticket (reconciled through the
server's ``find_ticket``) and sends an e-mail (the server deduplicates by the key, so a lost
call is sent again under it). Step ids: ``mcp.crm.list_tools``, ``mcp.crm.get_order``,
``mcp.crm.create_ticket``, ``mcp.crm.send_email``: ``effect.after_dispatching:mcp.crm.create``
aims a kill.

``Crm`` is a server of the same shape in process (``mcp.server.mcpserver.MCPServer``), for the
tests that count what it was asked.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import anyio
import mcp
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

import safepoint as sp
from safepoint.integrations import mcp as spm

SERVER = str(Path(__file__).with_name("mcp_server.py"))
TICKET = "Order A1 never arrived"


HTTP_URL_ENV = "MCP_TEST_URL"  # the streamable HTTP server's URL, for the workflows over HTTP


def server_params() -> mcp.StdioServerParameters:
    """The stdio server, started with this process's environment (the owner's URL in it)."""
    return mcp.StdioServerParameters(command=sys.executable, args=[SERVER], env=dict(os.environ))


def server() -> mcp.StdioServerParameters | str:
    """Where the workflows' server is: the HTTP server's URL when one is given, else stdio."""
    return os.environ.get(HTTP_URL_ENV) or server_params()


@contextmanager
def http_server(**env: str) -> Iterator[str]:
    """The CRM serving streamable HTTP on 127.0.0.1 (a port of the system's choosing), in a
    process of its own with this process's environment and ``env``; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, SERVER, "http"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"the MCP server did not start (it printed {line!r})")
        url = f"http://127.0.0.1:{int(line.split()[1])}/mcp"
        deadline = time.monotonic() + 20
        while True:  # the port is bound before the app is up: wait until it answers
            try:
                with socket.create_connection(("127.0.0.1", int(line.split()[1])), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.kill()
        process.wait(timeout=10)


async def find_ticket(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    """A reconcile that asks the server itself, over a connection of its own, for the ticket
    made under the key."""
    async with mcp.Client(server()) as client:
        result = await client.call_tool("find_ticket", {"key": str(key)})
    found = first_json(result)
    return sp.Applied(found) if found is not None else sp.NotApplied()


def first_json(result: Any) -> Any:
    """The JSON a tool answered (its first text block), from a result or a reconciled receipt."""
    return json.loads(result.content[0].text)


@sp.workflow("mcp-support", version="1")
async def support_mcp(run: sp.AsyncRun, subject: str) -> dict[str, Any]:
    async with spm.connect(
        run,
        mcp.Client(server()),
        server_id="crm",
        kinds={
            "create_ticket": spm.effect(reconcile=find_ticket, dedup_retention=timedelta(hours=23)),
            "send_email": spm.effect(dedup_retention=timedelta(hours=23)),
        },
    ) as crm:
        listing = await crm.list_tools()
        order = first_json(await crm.call_tool("get_order", {"order_id": "A1"}))
        ticket = first_json(await crm.call_tool("create_ticket", {"subject": subject}))
        email = first_json(
            await crm.call_tool("send_email", {"to": order["customer"], "subject": f"Ticket {ticket['id']}"})
        )
        return {"tools": sorted(t.name for t in listing.tools), "ticket": ticket["id"], "email": email["id"]}


class Crm:
    """A real MCP server whose tickets are deduplicated by the key in ``_meta``, counting what
    it is asked and what it applied."""

    def __init__(self) -> None:
        self.tickets: dict[str, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()
        self.metas: list[dict[str, Any]] = []
        self.key_arguments: list[str] = []
        self.delay = 0.0
        server = self.server = MCPServer("crm")

        @server.tool(annotations=ToolAnnotations(read_only_hint=True))
        def get_order(order_id: str) -> str:
            """Look up an order."""
            self.calls["get_order"] += 1
            if order_id == "missing":
                raise ValueError("no such order")
            return json.dumps({"order_id": order_id, "total_cents": 4200})

        @server.tool()
        async def create_ticket(subject: str, ctx: Context, idempotency_key: str = "") -> str:
            """Open a ticket."""
            self.calls["create_ticket"] += 1
            meta = dict(ctx.request_context.meta or {})
            self.metas.append(meta)
            self.key_arguments.append(idempotency_key)
            key = meta[spm.META_KEY]
            made = self.tickets.setdefault(key, {"id": f"T-{len(self.tickets) + 1}", "subject": subject})
            await anyio.sleep(self.delay)  # the ticket exists before the answer leaves
            return json.dumps(made)

        @server.tool(annotations=ToolAnnotations(destructive_hint=True))
        def close_account(account: str) -> str:
            """Close an account."""
            self.calls["close_account"] += 1
            raise ValueError("accounts with open orders cannot be closed")

        @server.tool(annotations=ToolAnnotations(idempotent_hint=True))
        def set_status(order_id: str, status: str) -> str:
            """Set an order's status."""
            self.calls["set_status"] += 1
            return status

    def find(self, key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
        found = self.tickets.get(str(key))
        return sp.Applied(found) if found else sp.NotApplied()
