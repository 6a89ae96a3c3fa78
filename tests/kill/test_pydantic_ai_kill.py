"""A Pydantic AI agent made durable by ``SafepointDurability``, killed with SIGKILL at the
boundaries of a turn: a model reply lost before it was recorded, one recorded, between the two
effects of one turn, inside an effect's dispatch (intent written; the owner committed, the
receipt lost) and while the fake model server holds a request. ``support_mcp_chat`` sends its
e-mails through an MCP server over stdio: killed with its listing recorded, with an MCP call's
intent written, after the server committed, and by the server itself in the middle of the call
(``mcp-in-flight``: the e-mail filed, the answer never sent).

Each trial resumes the killed run in fresh processes — so every unit's identity must match
across processes — and asserts, beside the kill test's own (the result of an uninterrupted run,
each effect applied once at the owner): every model request reached the fake at most once but
the one a kill lost, and no request carried a tool call without its result.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_kills import AgentKills, fake_model_server
from safepoint.testing import OwnerService

pytestmark = pytest.mark.kill

# (workflow, store, crash spec, requests a resume may send again): fourteen trials in all. In
# support_mcp_chat the effects are the refund (a function tool), then the two e-mails (MCP calls):
# "tool@2" and "tool@3" aim at the MCP calls.
TRIALS = [
    ("support_chat", "sqlite", "step.before_record:model#2", 1),  # the reply lost: asked again, once
    ("support_chat", "sqlite", "step.after_record:model#2", 0),  # recorded: replayed, not asked
    ("support_chat", "sqlite", "effect.after_dispatching:tool", 0),  # intent durable, call not made
    ("support_chat", "sqlite", "effect.after_receiver_commit:tool", 0),  # owner committed, receipt lost
    ("support_chat", "sqlite", "in-flight@2", 1),  # killed while the fake holds the second request
    ("support_chat", "postgres", "effect.after_receiver_commit:tool@2", 0),
    ("support_chat", "postgres", "step.after_record:model#3", 0),
    ("support_responses", "sqlite", "effect.after_accept:tool@1", 0),  # between a turn's two effects
    ("support_mcp_chat", "sqlite", "step.after_record:tools.crm", 0),  # the MCP listing recorded
    ("support_mcp_chat", "sqlite", "effect.after_dispatching:tool@2", 0),  # intent durable, not sent
    ("support_mcp_chat", "sqlite", "effect.after_receiver_commit:tool@2", 0),  # server committed
    ("support_mcp_chat", "sqlite", "mcp-in-flight", 0),  # killed by the server inside the call
    ("support_mcp_chat", "postgres", "mcp-in-flight", 0),
    ("support_mcp_chat", "postgres", "effect.after_receiver_commit:tool@3", 0),
]


@pytest.fixture(scope="module")
def kills() -> Iterator[AgentKills]:
    with fake_model_server() as fake, OwnerService() as owner:
        yield AgentKills("pydantic_ai_flows", fake, owner)


@pytest.mark.parametrize(
    ("workflow", "store", "crash_at", "again"),
    [pytest.param(*trial, id=f"{trial[0]}-{trial[1]}-{trial[2]}") for trial in TRIALS],
)
def test_a_pydantic_ai_agent_killed_at_a_turn_boundary(
    request: pytest.FixtureRequest,
    kills: AgentKills,
    tmp_path: Path,
    workflow: str,
    store: str,
    crash_at: str,
    again: int,
) -> None:
    kills.trial(request, tmp_path, workflow, store, crash_at, again)
