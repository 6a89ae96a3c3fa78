"""The MCP support workflow (``mcp_flows.support_mcp``: a stdio server as a subprocess of the
workflow's process) SIGKILLed at each boundary of its calls: after a read was recorded, with an
effect's intent durable and the call not made, after the server committed (the answer lost:
the ticket reconciled through the server, the e-mail sent again under its key and answered
once), with the call in flight at the server (which kills its client after committing), and
before the run completes. Over streamable HTTP (the server a process of its own on loopback,
which outlives the killed client): with the ticket's intent durable and the call not made, and
after the server committed. Each trial resumes in fresh processes and asserts the result of an
uninterrupted run and each effect applied once, counted by the owner behind the server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_flows import HTTP_URL_ENV, TICKET, http_server
from safepoint.testing import KillHarness, OwnerService

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])
KILL_FLAG_ENV = "MCP_TEST_KILL_FLAG"  # read by tests/mcp_server.py

TRIALS = [
    ("sqlite", "step.after_record:mcp.crm.get_order"),
    ("sqlite", "effect.after_dispatching:mcp.crm.create_ticket"),
    ("sqlite", "effect.after_receiver_commit:mcp.crm.create_ticket"),
    ("sqlite", "effect.after_receiver_commit:mcp.crm.send_email"),
    ("sqlite", "in-flight"),
    ("sqlite", "run.before_complete"),
    ("postgres", "effect.after_receiver_commit:mcp.crm.create_ticket"),
    ("postgres", "in-flight"),
]
# Over streamable HTTP: (store, crash point).
HTTP_TRIALS = [
    ("sqlite", "effect.after_receiver_commit:mcp.crm.create_ticket"),
    ("sqlite", "effect.after_dispatching:mcp.crm.send_email"),
    ("postgres", "effect.after_dispatching:mcp.crm.create_ticket"),
    ("postgres", "effect.after_receiver_commit:mcp.crm.send_email"),
]


@pytest.fixture(scope="module")
def mcp_owner() -> Iterator[OwnerService]:
    with OwnerService() as service:
        yield service


_harnesses: dict[tuple[str, str], KillHarness] = {}


def _harness(
    request: pytest.FixtureRequest, owner: OwnerService, workdir: Path, store: str, transport: str = "stdio"
) -> KillHarness:
    if (store, transport) not in _harnesses:
        url = None  # SQLite: a fresh file per trial
        if store == "postgres":
            url = f"{request.getfixturevalue('pg_url')}?schema=mcp_{uuid.uuid4().hex[:12]}"
        _harnesses[store, transport] = KillHarness(
            "mcp_flows:support_mcp",
            [TICKET],
            owner=owner,
            workdir=workdir,
            pythonpath=[TESTS],
            store_url=url,
            timeout=90,
            preload=("mcp",),  # imported once, in the zygote that forks the first processes
        )
    return _harnesses[store, transport]


@pytest.mark.parametrize(("store", "crash_at"), TRIALS, ids=[f"{s}-{c}" for s, c in TRIALS])
def test_an_mcp_workflow_killed_at_a_call_boundary(
    request: pytest.FixtureRequest,
    mcp_owner: OwnerService,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    crash_at: str,
) -> None:
    harness = _harness(request, mcp_owner, tmp_path, store)
    reference, applied = harness.reference()
    assert reference["status"] == "completed", reference
    assert applied == 2  # one ticket, one e-mail
    if crash_at == "in-flight":
        flag = tmp_path / "kill-once"
        flag.write_text("")
        monkeypatch.setenv(KILL_FLAG_ENV, str(flag))  # the children, and their server, inherit it
        report = harness.trial()
        assert not flag.exists(), "the server never held the call"
    else:
        report = harness.trial(crash_at=crash_at)
    assert report.killed, f"the crash point {crash_at} was never reached"
    report.check()
    assert os.environ.get(KILL_FLAG_ENV) in (None, str(tmp_path / "kill-once"))


@pytest.fixture(scope="module")
def crm_url(mcp_owner: OwnerService) -> Iterator[str]:
    """The CRM over streamable HTTP, its tickets at the module's owner."""
    with http_server(SAFEPOINT_OWNER_URL=mcp_owner.url) as url:
        yield url


@pytest.mark.parametrize(("store", "crash_at"), HTTP_TRIALS, ids=[f"http-{s}-{c}" for s, c in HTTP_TRIALS])
def test_an_mcp_workflow_over_http_killed_at_a_call_boundary(
    request: pytest.FixtureRequest,
    mcp_owner: OwnerService,
    crm_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    store: str,
    crash_at: str,
) -> None:
    monkeypatch.setenv(HTTP_URL_ENV, crm_url)  # the children connect to the server over HTTP
    harness = _harness(request, mcp_owner, tmp_path, store, "http")
    reference, applied = harness.reference()
    assert reference["status"] == "completed", reference
    assert applied == 2
    report = harness.trial(crash_at=crash_at)
    assert report.killed, f"the crash point {crash_at} was never reached"
    report.check()
