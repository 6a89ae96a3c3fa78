"""Agent loops on the real Anthropic and OpenAI SDKs, killed with SIGKILL at every boundary of a
turn: after a model request came back but before its reply was recorded, after it was recorded,
after a read tool, between the two effects of one turn, inside an effect's dispatch (intent
written, the owner committed, the receipt stored) and before the run completes.

Each trial resumes the killed run in fresh processes and asserts, beside the kill test's two
assertions (the result of an uninterrupted run; each effect applied once, counted by the owner):

- every model request reached the fake model server at most once — only the one whose reply a
  kill lost before it was recorded may be sent again;
- no request ever carried a tool call without its result (the fake answers such a request 400,
  as the APIs do, and lists it in ``orphans``).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_flows import FAKE_MODEL_URL_ENV, SCRIPT, TICKET
from safepoint.testing import FakeModelServer, KillHarness, OwnerService

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])

# (crash spec, requests a resume may send again). Model steps are model, model#2, …; tool steps
# tool.<call id>. The loop's second turn asks for a refund and an e-mail at once.
BOUNDARIES = [
    ("step.before_record:model#2", 1),  # the reply came back, the kill lost it: asked again, once
    ("step.after_record:model#2", 0),  # the reply recorded: replayed, never asked again
    ("step.after_record:tool", 0),  # the read tool's observation recorded, the next request not sent
    ("effect.after_accept:tool@1", 0),  # between the two effects of one turn
    ("effect.after_dispatching:tool", 0),  # intent durable, the call not made
    ("effect.after_receiver_commit:tool", 0),  # the owner committed, the receipt lost
    ("effect.after_outcome:tool@2", 0),  # the receipt stored, the step not accepted
    ("run.before_complete", 0),
]
# A few boundaries for the other variants: the full matrix runs on the first two.
SHORT = [BOUNDARIES[0], BOUNDARIES[3], BOUNDARIES[5], BOUNDARIES[7]]

VARIANTS = [
    ("agent_flows:support_anthropic", "sqlite", BOUNDARIES),
    ("agent_flows:support_openai_responses", "sqlite", BOUNDARIES),
    ("agent_flows:support_anthropic", "postgres", SHORT),
    ("agent_flows:support_openai_responses", "postgres", SHORT),
    ("agent_flows:support_openai_chat", "sqlite", SHORT),
    ("agent_flows:support_anthropic_async", "sqlite", SHORT),
]
TRIALS = [
    pytest.param(workflow, store, spec, again, id=f"{workflow.split(':')[1]}-{store}-{spec}")
    for workflow, store, specs in VARIANTS
    for spec, again in specs
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
            url = f"{request.getfixturevalue('pg_url')}?schema=agent_{uuid.uuid4().hex[:12]}"
        _harnesses[workflow, store] = KillHarness(
            workflow, [TICKET], owner=owner, workdir=workdir, pythonpath=[TESTS], store_url=url, timeout=90
        )
    return _harnesses[workflow, store]


@pytest.mark.parametrize(("workflow", "store", "crash_at", "again"), TRIALS)
def test_an_agent_loop_killed_at_a_turn_boundary(
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
    report = harness.trial(crash_at=crash_at)
    assert report.killed, f"the crash point {crash_at} was never reached"
    report.check()
    sent = fake.requests[before:]
    repeated = sum(count - 1 for count in Counter(r.digest for r in sent).values())
    assert repeated <= again, [(r.turn, r.digest[:12]) for r in sent]
    assert len(sent) - repeated <= len(SCRIPT)  # each turn asked for once (but the one lost)
    assert fake.orphans == []
