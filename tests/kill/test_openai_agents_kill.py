"""An OpenAI Agents SDK run (``Runner.run`` / ``Runner.run_streamed`` on a durable agent)
killed with SIGKILL at the boundaries of a turn: while a model request is in flight, after its
reply came back but before it was recorded, after it was recorded, between the two effects of
one turn (which the SDK starts concurrently), inside an effect's dispatch and before the run
completes — on SQLite and PostgreSQL.

Each trial resumes the killed run in fresh processes and asserts, beside the kill test's own two
assertions (the result of an uninterrupted run; each effect applied once, counted by its
owner): every model request reached the fake model server at most once, but the one a kill lost
before it was recorded; no request carried a tool call without its result. The SDK's own
refusal to resume a call "already executed, but its output was not committed" never arises:
the workflow is re-run and the ledger answers each call.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_flows import FAKE_MODEL_URL_ENV, PID_HEADER, SCRIPT, TICKET
from safepoint.testing import FakeModelServer, FakeRequest, KillHarness, OwnerService

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])

# (workflow, store, crash spec, requests a resume may send again). Eight trials in all.
TRIALS = [
    ("support_agents", "sqlite", "step.before_record:model#2", 1),  # the reply lost: asked again
    ("support_agents", "sqlite", "effect.after_accept:tool@1", 0),  # between the turn's two effects
    ("support_agents", "sqlite", "effect.after_receiver_commit:tool", 0),  # the receipt lost
    ("support_agents", "sqlite", "in-flight@2", 1),  # killed while the model "generates"
    ("support_agents", "postgres", "step.after_record:model#2", 0),  # recorded: never asked again
    ("support_agents", "postgres", "effect.after_dispatching:tool", 0),  # intent durable, not sent
    ("support_agents_streamed", "sqlite", "effect.after_receiver_commit:tool@2", 0),
    ("support_agents_chat", "sqlite", "run.before_complete", 0),
]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer(SCRIPT) as server:
        previous = os.environ.get(FAKE_MODEL_URL_ENV)
        os.environ[FAKE_MODEL_URL_ENV] = server.url  # the children inherit it
        try:
            yield server
        finally:
            if previous is None:
                os.environ.pop(FAKE_MODEL_URL_ENV, None)
            else:
                os.environ[FAKE_MODEL_URL_ENV] = previous


@pytest.fixture(scope="module")
def agents_owner() -> Iterator[OwnerService]:
    with OwnerService() as service:
        yield service


_harnesses: dict[tuple[str, str], KillHarness] = {}


def _harness(
    request: pytest.FixtureRequest, owner: OwnerService, workdir: Path, workflow: str, store: str
) -> KillHarness:
    """One harness per workflow and store (its reference run is made once)."""
    if (workflow, store) not in _harnesses:
        url = None  # SQLite: a fresh file per trial
        if store == "postgres":
            url = f"{request.getfixturevalue('pg_url')}?schema=oa_{uuid.uuid4().hex[:12]}"
        _harnesses[workflow, store] = KillHarness(
            f"openai_agents_flows:{workflow}",
            [TICKET],
            owner=owner,
            workdir=workdir,
            pythonpath=[TESTS],
            store_url=url,
            timeout=90,
        )
    return _harnesses[workflow, store]


def kill_in_flight(fake: FakeModelServer, turn: int) -> None:
    """SIGKILL the process whose request for ``turn`` the fake holds, once."""
    armed = [True]

    @fake.on_request
    def kill(request: FakeRequest) -> None:
        pid = request.headers.get(PID_HEADER)
        if armed[0] and request.turn == turn and pid is not None:
            armed[0] = False
            os.kill(int(pid), signal.SIGKILL)


@pytest.mark.parametrize(
    ("workflow", "store", "crash_at", "again"),
    [pytest.param(*trial, id=f"{trial[0]}-{trial[1]}-{trial[2]}") for trial in TRIALS],
)
def test_an_agents_sdk_run_killed_at_a_turn_boundary(
    request: pytest.FixtureRequest,
    fake: FakeModelServer,
    agents_owner: OwnerService,
    tmp_path: Path,
    workflow: str,
    store: str,
    crash_at: str,
    again: int,
) -> None:
    harness = _harness(request, agents_owner, tmp_path, workflow, store)
    reference, applied = harness.reference()
    assert reference["status"] == "completed", reference
    assert applied == 3  # one refund, two e-mails
    before = len(fake.requests)
    if crash_at.startswith("in-flight@"):
        kill_in_flight(fake, turn=int(crash_at.partition("@")[2]))
        report = harness.trial()
    else:
        report = harness.trial(crash_at=crash_at)
    assert report.killed, f"the crash point {crash_at} was never reached"
    report.check()
    sent = fake.requests[before:]
    repeated = sum(count - 1 for count in Counter(r.digest for r in sent).values())
    assert repeated <= again, [(r.turn, r.digest[:12]) for r in sent]
    assert len(sent) - repeated <= len(SCRIPT)  # each turn asked for once (but the one lost)
    assert fake.orphans == []
