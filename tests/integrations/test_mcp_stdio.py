"""safepoint.integrations.mcp over stdio: the CRM of ``tests/mcp_server.py`` started as a
subprocess (``mcp.Client(StdioServerParameters)``),
its effects applied at the local owner, on SQLite and PostgreSQL."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any

import mcp
import pytest

import safepoint as sp
from mcp_flows import TICKET, server_params, support_mcp
from safepoint.integrations import mcp as spm
from safepoint.testing import OwnerService, SimulatedCrash
from safepoint.testing import crash_at as crashing

# Each test starts MCP servers as processes of their own: the slow tier.
pytestmark = [pytest.mark.anyio, pytest.mark.slow]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# As in test_mcp_http.py: an HTTP client an earlier test of the worker left in a reference cycle,
# finalized while this test's loop runs, closes its streams on this loop and fails the test with
# "Event loop is closed" (seen twice in three runs of the PostgreSQL files on two workers).
@pytest.fixture(autouse=True)
def _collected_before() -> None:
    """What earlier tests left in reference cycles, collected before this test's loop runs."""
    gc.collect()


@pytest.fixture(autouse=True)
async def _collected_after() -> AsyncIterator[None]:
    """This test's own cycles collected while its loop still runs, so they close on it."""
    yield
    gc.collect()


@pytest.mark.parametrize("crash", ["mcp.crm.create_ticket", "mcp.crm.send_email"])
async def test_a_crash_after_the_server_committed_applies_each_effect_once(
    store: sp.Store, owner_env: OwnerService, crash: str
) -> None:
    with crashing(f"effect.after_receiver_commit:{crash}"), pytest.raises(SimulatedCrash):
        await sp.start_async(store, support_mcp, TICKET, run_id="s1", lease_ms=0)
    result = await sp.resume_async(store, "s1")
    assert result["ticket"] == "tk_1"
    assert result["email"] == "tk_2"
    stats = owner_env.client.stats()
    assert stats["applied"] == 2  # reconciled (the ticket), or sent again under its key (the e-mail)


@sp.workflow("mcp-dropped")
async def dropped(run: sp.AsyncRun) -> Any:
    async with spm.connect(run, mcp.Client(server_params()), server_id="crm") as crm:
        return (await crm.call_tool("ticket_then_exit", {"subject": "lost"})).is_error


async def test_a_dropped_transport_leaves_the_outcome_unknown_and_the_run_blocked(
    store: sp.Store, owner_env: OwnerService
) -> None:
    with pytest.raises(sp.NeedsReconciliation, match="Connection closed"):
        await sp.start_async(store, dropped, run_id="d1", lease_ms=0)
    assert owner_env.client.stats()["applied"] == 1  # applied once, never sent again
    with pytest.raises(sp.NeedsReconciliation):  # a resume does not send it again either
        await sp.resume_async(store, "d1")
    assert owner_env.client.stats()["applied"] == 1


@sp.workflow("mcp-session")
async def over_a_session(run: sp.AsyncRun) -> list[Any]:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async with stdio_client(server_params()) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        crm = spm.wrap(run, session, server_id="crm")
        order = await crm.call_tool("get_order", {"order_id": "A1"})
        ticket = await crm.call_tool("create_ticket", {"subject": "by session"})
        return [order.content[0].text, ticket.content[0].text]  # type: ignore[union-attr]


async def test_a_client_session_is_wrapped_as_a_client_is(store: sp.Store, owner_env: OwnerService) -> None:
    order, ticket = await sp.start_async(store, over_a_session, run_id="cs1")
    assert '"A1"' in order
    assert '"tk_1"' in ticket
    assert await sp.resume_async(store, "cs1") == [order, ticket]  # replayed from the ledger
    assert owner_env.client.stats()["applied"] == 1
    assert list(store.load_ledger("cs1").steps) == [
        "mcp.crm.list_tools",
        "mcp.crm.get_order",
        "mcp.crm.create_ticket",
    ]
