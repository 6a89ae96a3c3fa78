"""Agent loops on the real Anthropic and OpenAI SDKs, killed with SIGKILL at every boundary of a
turn: while a model request is in flight, after it came back but before its reply was recorded,
after it was recorded,
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

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_kills import AgentKills, fake_model_server
from safepoint.testing import OwnerService

pytestmark = pytest.mark.kill

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
    ("in-flight@2", 1),  # SIGKILLed by the model server while it holds the second request: sent again
]
# A few boundaries for the other variants: the full matrix runs on the first two.
SHORT = [BOUNDARIES[0], BOUNDARIES[3], BOUNDARIES[5], BOUNDARIES[8]]

VARIANTS = [
    ("support_anthropic", "sqlite", BOUNDARIES),
    ("support_openai_responses", "sqlite", BOUNDARIES),
    ("support_anthropic", "postgres", SHORT),
    ("support_openai_responses", "postgres", SHORT),
    ("support_openai_chat", "sqlite", SHORT),
    ("support_anthropic_async", "sqlite", SHORT),
]
TRIALS = [
    pytest.param(workflow, store, spec, again, id=f"{workflow}-{store}-{spec}")
    for workflow, store, specs in VARIANTS
    for spec, again in specs
]


@pytest.fixture(scope="module")
def kills() -> Iterator[AgentKills]:
    with fake_model_server() as fake, OwnerService() as owner:
        yield AgentKills("agent_flows", fake, owner)


@pytest.mark.parametrize(("workflow", "store", "crash_at", "again"), TRIALS)
def test_an_agent_loop_killed_at_a_turn_boundary(
    request: pytest.FixtureRequest,
    kills: AgentKills,
    tmp_path: Path,
    workflow: str,
    store: str,
    crash_at: str,
    again: int,
) -> None:
    kills.trial(request, tmp_path, workflow, store, crash_at, again)
