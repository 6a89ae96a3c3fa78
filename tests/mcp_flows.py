"""A support workflow on an MCP server (``tests/mcp_server.py``) over stdio, or over streamable
HTTP when ``$MCP_TEST_URL`` names the server (``http_server()`` starts one), for the kill tests
and the stdio and HTTP tests (importable as ``mcp_flows``).

The workflow lists the server's tools, reads an order, opens a ticket (reconciled through the
server's ``find_ticket``) and sends an e-mail (the server deduplicates by the key, so a lost
call is sent again under it). Step ids: ``mcp.crm.list_tools``, ``mcp.crm.get_order``,
``mcp.crm.create_ticket``, ``mcp.crm.send_email``: ``effect.after_dispatching:mcp.crm.create``
aims a kill.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp

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
