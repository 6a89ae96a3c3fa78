"""The MCP support workflow (``mcp_flows.support_mcp``: a stdio server as a subprocess of the
workflow's process) SIGKILLed at each boundary of its calls: after a read was recorded, with an
effect's intent durable and the call not made, after the server committed (the answer lost:
the ticket reconciled through the server, the e-mail sent again under its key and answered
once), with the call in flight at the server (which kills its client after committing), and
before the run completes. Each trial resumes in fresh processes and asserts the result of an
uninterrupted run and each effect applied once, counted by the owner behind the server."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_flows import TICKET
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


@pytest.fixture(scope="module")
def mcp_owner() -> Iterator[OwnerService]:
    with OwnerService() as service:
        yield service


_harnesses: dict[str, KillHarness] = {}


def _harness(request: pytest.FixtureRequest, owner: OwnerService, workdir: Path, store: str) -> KillHarness:
    if store not in _harnesses:
        url = None  # SQLite: a fresh file per trial
        if store == "postgres":
            url = f"{request.getfixturevalue('pg_url')}?schema=mcp_{uuid.uuid4().hex[:12]}"
        _harnesses[store] = KillHarness(
            "mcp_flows:support_mcp",
            [TICKET],
            owner=owner,
            workdir=workdir,
            pythonpath=[TESTS],
            store_url=url,
            timeout=90,
        )
    return _harnesses[store]


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
