"""A support workflow on an MCP server over stdio (``tests/mcp_server.py``), for the kill tests
and the stdio tests (importable as ``mcp_flows``).

The workflow lists the server's tools, reads an order, opens a ticket (reconciled through the
server's ``find_ticket``) and sends an e-mail (the server deduplicates by the key, so a lost
call is sent again under it). Step ids: ``mcp.crm.list_tools``, ``mcp.crm.get_order``,
``mcp.crm.create_ticket``, ``mcp.crm.send_email``: ``effect.after_dispatching:mcp.crm.create``
aims a kill.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import mcp

import safepoint as sp
from safepoint.integrations import mcp as spm

SERVER = str(Path(__file__).with_name("mcp_server.py"))
TICKET = "Order A1 never arrived"


def server_params() -> mcp.StdioServerParameters:
    """The stdio server, started with this process's environment (the owner's URL in it)."""
    return mcp.StdioServerParameters(command=sys.executable, args=[SERVER], env=dict(os.environ))


async def find_ticket(key: sp.EffectKey) -> sp.Applied | sp.NotApplied:
    """A reconcile that asks the server itself, over a connection of its own, for the ticket
    made under the key."""
    async with mcp.Client(server_params()) as client:
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
        mcp.Client(server_params()),
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
