"""An MCP server for the tests, over stdio (``python tests/mcp_server.py``) or streamable HTTP
on loopback (``python tests/mcp_server.py http``: it prints the port it listens on): a CRM whose tickets
and e-mails are created at the local effect owner (``$SAFEPOINT_OWNER_URL``), deduplicated there
by the idempotency key each request carries in ``_meta``; so the owner counts what was applied,
across every process that ever called the server.

Tools: ``get_order`` (read-only), ``create_ticket`` (declares an ``idempotency_key`` argument),
``find_ticket`` (read-only: a ticket by key, for a client's reconcile), ``send_email`` (no key
argument: the key travels in ``_meta`` only) and ``slow_ticket`` (answers after
``$MCP_TEST_DELAY`` seconds, for timeouts). E-mails are filed as tickets: the owner can look
those up. With ``$MCP_TEST_KILL_FLAG`` naming a file, the first ``create_ticket`` or
``send_email`` to take it SIGKILLs the client after the change is made, before it answers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

from safepoint.testing import owner_client

META_KEY = "dev.safepoint/idempotency-key"
KILL_FLAG_ENV = "MCP_TEST_KILL_FLAG"
ORDERS = {"A1": {"order_id": "A1", "customer": "ada@example.com", "total_cents": 4200}}

server = MCPServer("crm")


def _key(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    key = meta.get(META_KEY)
    if not isinstance(key, str):
        raise ValueError("no idempotency key in _meta")
    return key


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def get_order(order_id: str) -> str:
    """Look up an order by its id."""
    return json.dumps(ORDERS[order_id])


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_ticket(key: str) -> str:
    """The ticket created under an idempotency key, or "null"."""
    return json.dumps(owner_client().find_by_key("tickets", key))


def _kill_the_client_once() -> None:
    # A kill test's "in flight" trial: the ticket is made, and the client dies before it hears
    # so. The flag file is taken by whoever removes it first: one kill per trial.
    flag = os.environ.get(KILL_FLAG_ENV)
    if flag:
        try:
            os.remove(flag)
        except FileNotFoundError:
            return
        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(5)  # the answer never leaves: stdin closes and the server ends


@server.tool()
def create_ticket(subject: str, ctx: Context, idempotency_key: str = "") -> str:
    """Open a support ticket."""
    key = _key(ctx)
    if idempotency_key != key:
        raise ValueError("the key argument and the _meta key differ")
    created = owner_client().create("tickets", {"subject": subject}, idempotency_key=key)
    _kill_the_client_once()
    return json.dumps(created)


@server.tool()
def send_email(to: str, subject: str, ctx: Context, body: str = "") -> str:
    """Send an e-mail."""
    payload = {"to": to, "subject": subject, "body": body} if body else {"to": to, "subject": subject}
    created = owner_client().create("tickets", payload, idempotency_key=_key(ctx))
    _kill_the_client_once()
    return json.dumps(created)


@server.tool()
def slow_ticket(subject: str, ctx: Context) -> str:
    """Open a ticket, slowly: the ticket exists before the answer is sent."""
    created: dict[str, Any] = owner_client().create(
        "tickets", {"subject": subject}, idempotency_key=_key(ctx)
    )
    time.sleep(float(os.environ.get("MCP_TEST_DELAY", "0")))
    return json.dumps(created)


@server.tool()
def ticket_then_exit(subject: str, ctx: Context) -> str:
    """Open a ticket, then die before answering: the transport drops after the change."""
    owner_client().create("tickets", {"subject": subject}, idempotency_key=_key(ctx))
    os._exit(1)


def serve_http() -> None:
    """Serve streamable HTTP on 127.0.0.1, on a port the system picks: the first line printed
    is ``PORT <n>``, once the socket listens."""
    import socket

    import anyio
    import uvicorn

    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.bind(("127.0.0.1", 0))
    listening.listen(64)
    print(f"PORT {listening.getsockname()[1]}", flush=True)
    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve, [listening])


if __name__ == "__main__":
    if sys.argv[1:] == ["http"]:
        serve_http()
    else:
        server.run("stdio")
