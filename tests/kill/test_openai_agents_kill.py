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

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_kills import AgentKills, fake_model_server
from safepoint.testing import OwnerService

pytestmark = pytest.mark.kill

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
def kills() -> Iterator[AgentKills]:
    with fake_model_server() as fake, OwnerService() as owner:
        yield AgentKills("openai_agents_flows", fake, owner)


@pytest.mark.parametrize(
    ("workflow", "store", "crash_at", "again"),
    [pytest.param(*trial, id=f"{trial[0]}-{trial[1]}-{trial[2]}") for trial in TRIALS],
)
def test_an_agents_sdk_run_killed_at_a_turn_boundary(
    request: pytest.FixtureRequest,
    kills: AgentKills,
    tmp_path: Path,
    workflow: str,
    store: str,
    crash_at: str,
    again: int,
) -> None:
    kills.trial(request, tmp_path, workflow, store, crash_at, again)
