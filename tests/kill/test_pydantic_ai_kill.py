"""A Pydantic AI agent made durable by ``SafepointDurability``, killed with SIGKILL at the
boundaries of a turn: a model reply lost before it was recorded, one recorded, between the two
effects of one turn, inside an effect's dispatch (intent written; the owner committed, the
receipt lost) and while the fake model server holds a request.

Each trial resumes the killed run in fresh processes — so every unit's identity must match
across processes — and asserts, beside the kill test's own (the result of an uninterrupted run,
each effect applied once at the owner): every model request reached the fake at most once but
the one a kill lost, and no request carried a tool call without its result.
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

# (workflow, store, crash spec, requests a resume may send again): eight trials in all.
TRIALS = [
    ("support_chat", "sqlite", "step.before_record:model#2", 1),  # the reply lost: asked again, once
    ("support_chat", "sqlite", "step.after_record:model#2", 0),  # recorded: replayed, not asked
    ("support_chat", "sqlite", "effect.after_dispatching:tool", 0),  # intent durable, call not made
    ("support_chat", "sqlite", "effect.after_receiver_commit:tool", 0),  # owner committed, receipt lost
    ("support_chat", "sqlite", "in-flight@2", 1),  # killed while the fake holds the second request
    ("support_chat", "postgres", "effect.after_receiver_commit:tool@2", 0),
    ("support_chat", "postgres", "step.after_record:model#3", 0),
    ("support_responses", "sqlite", "effect.after_accept:tool@1", 0),  # between a turn's two effects
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
def agent_owner() -> Iterator[OwnerService]:
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
            url = f"{request.getfixturevalue('pg_url')}?schema=pyd_{uuid.uuid4().hex[:12]}"
        _harnesses[workflow, store] = KillHarness(
            f"pydantic_ai_flows:{workflow}",
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
def test_a_pydantic_ai_agent_killed_at_a_turn_boundary(
    request: pytest.FixtureRequest,
    fake: FakeModelServer,
    agent_owner: OwnerService,
    tmp_path: Path,
    workflow: str,
    store: str,
    crash_at: str,
    again: int,
) -> None:
    harness = _harness(request, agent_owner, tmp_path, workflow, store)
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
