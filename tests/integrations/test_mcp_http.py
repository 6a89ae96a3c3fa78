"""safepoint.integrations.mcp over streamable HTTP: the CRM of ``tests/mcp_server.py`` serving
HTTP on 127.0.0.1 in a process of its own (``mcp.Client(url)``), its effects applied at the
local owner, on SQLite and PostgreSQL; and a call the server applies but answers too late."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import mcp
import pytest

import safepoint as sp
from mcp_flows import HTTP_URL_ENV, TICKET, find_ticket, first_json, http_server, server, support_mcp
from safepoint.integrations import mcp as spm
from safepoint.testing import OwnerService, SimulatedCrash
from safepoint.testing import crash_at as crashing

# Each test talks to an MCP server in a process of its own: the slow tier (test_mcp.py runs the
# same client in-process in the fast tier).
pytestmark = [pytest.mark.anyio, pytest.mark.slow]

DELAY = 3.0  # how late the server answers slow_ticket: past the calls' timeout


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def _collected_before() -> None:
    """What earlier tests left in reference cycles (an HTTP client's streams, bound to an event
    loop that has closed since) collected before this test's loop runs: finalized while it ran,
    it would close them on this loop, and fail this test with "Event loop is closed"."""
    gc.collect()


@pytest.fixture(autouse=True)
async def _collected_after() -> AsyncIterator[None]:
    """This test's own cycles collected while its loop still runs, so they close on it."""
    yield
    gc.collect()


@pytest.fixture(scope="module")
def http_owner() -> Iterator[OwnerService]:
    with OwnerService() as service:
        yield service


@pytest.fixture(scope="module")
def crm_url(http_owner: OwnerService) -> Iterator[str]:
    """One HTTP server for the module, its tickets at the module's owner."""
    with http_server(SAFEPOINT_OWNER_URL=http_owner.url, MCP_TEST_DELAY=str(DELAY)) as url:
        yield url


@pytest.fixture
def owner(http_owner: OwnerService, crm_url: str, monkeypatch: pytest.MonkeyPatch) -> OwnerService:
    http_owner.client.reset()
    monkeypatch.setenv(HTTP_URL_ENV, crm_url)  # the workflows of mcp_flows go over HTTP
    monkeypatch.setenv("SAFEPOINT_OWNER_URL", http_owner.url)
    return http_owner


async def test_the_support_workflow_runs_over_http_and_replays_from_the_ledger(
    store: sp.Store, owner: OwnerService
) -> None:
    result = await sp.start_async(store, support_mcp, TICKET, run_id="h1")
    assert result == {
        "tools": [
            "create_ticket",
            "find_ticket",
            "get_order",
            "send_email",
            "slow_ticket",
            "ticket_then_exit",
        ],
        "ticket": "tk_1",
        "email": "tk_2",
    }
    assert await sp.resume_async(store, "h1") == result  # replayed: nothing sent again
    assert owner.client.stats()["applied"] == 2
    assert owner.client.stats()["duplicates"] == 0


@pytest.mark.parametrize("crash", ["mcp.crm.create_ticket", "mcp.crm.send_email"])
async def test_a_crash_after_the_server_committed_over_http_applies_each_effect_once(
    store: sp.Store, owner: OwnerService, crash: str
) -> None:
    with crashing(f"effect.after_receiver_commit:{crash}"), pytest.raises(SimulatedCrash):
        await sp.start_async(store, support_mcp, TICKET, run_id="h2", lease_ms=0)
    result = await sp.resume_async(store, "h2")
    assert (result["ticket"], result["email"]) == ("tk_1", "tk_2")
    assert owner.client.stats()["applied"] == 2  # the ticket reconciled, the e-mail deduplicated


def slow(reconciled: bool) -> Any:
    kinds = {"slow_ticket": spm.effect(reconcile=find_ticket) if reconciled else spm.effect()}

    @sp.workflow(f"mcp-http-slow-{reconciled}")
    async def late(run: sp.AsyncRun) -> Any:
        async with spm.connect(run, mcp.Client(server()), server_id="crm", kinds=kinds) as crm:
            answer = await crm.call_tool("slow_ticket", {"subject": "late"}, read_timeout_seconds=0.5)
            return first_json(answer)

    return late


async def test_a_late_answer_over_http_is_an_unknown_outcome_the_run_blocks_on_never_a_resend(
    store: sp.Store, owner: OwnerService
) -> None:
    late = slow(reconciled=False)
    with pytest.raises(sp.NeedsReconciliation, match="'tools/call' timed out"):
        await sp.start_async(store, late, run_id="t1", lease_ms=0)
    assert owner.client.stats()["applied"] == 1  # the server applied it; its answer came too late
    with pytest.raises(sp.NeedsReconciliation):  # a resume sends nothing: no fresh key, no resend
        await sp.resume_async(store, "t1")
    stats = owner.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    assert store.get_run("t1").status.value == "blocked"


async def test_a_late_answer_over_http_is_reconciled_with_the_server(
    store: sp.Store, owner: OwnerService
) -> None:
    late = slow(reconciled=True)
    ticket = await sp.start_async(store, late, run_id="t2", lease_ms=0)
    assert ticket["id"] == "tk_1"  # found at the server under the call's key
    stats = owner.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    assert await sp.resume_async(store, "t2") == ticket
