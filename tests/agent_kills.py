"""The kill trials of agent loops, shared by every SDK and framework (importable as
``agent_kills``): the fake model server the children talk to, one kill harness per workflow
and store, a kill "in flight" from the fake, and the assertions every trial makes.

Beside the kill test's own two assertions (the result of an uninterrupted run; each effect
applied once, counted by its owner), a trial asserts that every model request reached the fake
at most once — but the one a kill lost before its reply was recorded — and that no request
carried a tool call without its result.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from agent_flows import FAKE_MODEL_URL_ENV, PID_HEADER, SCRIPT, TICKET
from safepoint.testing import FakeModelServer, FakeRequest, KillHarness, OwnerService

TESTS = str(Path(__file__).parent)
# The SDKs each module's children import, imported once in a zygote that forks the reference
# run's process and each trial's first (``KillHarness(preload=...)``): seconds of CPU a child.
PRELOAD = {
    "agent_flows": ("anthropic", "openai"),
    "openai_agents_flows": ("agents", "openai"),
    "pydantic_ai_flows": ("pydantic_ai", "pydantic_ai.models.openai", "openai", "mcp"),
}
# Names a file ``tests/mcp_server.py`` takes once, SIGKILLing its client in the middle of a call.
MCP_KILL_FLAG_ENV = "MCP_TEST_KILL_FLAG"


@contextmanager
def fake_model_server() -> Iterator[FakeModelServer]:
    """The fake playing ``agent_flows.SCRIPT``, its URL in the environment the children inherit."""
    with FakeModelServer(SCRIPT) as server:
        previous = os.environ.get(FAKE_MODEL_URL_ENV)
        os.environ[FAKE_MODEL_URL_ENV] = server.url
        try:
            yield server
        finally:
            if previous is None:
                os.environ.pop(FAKE_MODEL_URL_ENV, None)
            else:
                os.environ[FAKE_MODEL_URL_ENV] = previous


def kill_in_flight(fake: FakeModelServer, turn: int) -> None:
    """SIGKILL the process whose request for ``turn`` the fake holds, once: the model is
    "generating" when its caller dies (each request names its process in a header)."""
    armed = [True]

    @fake.on_request
    def kill(request: FakeRequest) -> None:
        pid = request.headers.get(PID_HEADER)
        if armed[0] and request.turn == turn and pid is not None:
            armed[0] = False
            os.kill(int(pid), signal.SIGKILL)


class AgentKills:
    """Kill trials of the workflows of one module against one fake and one owner; one harness
    per workflow and store, so that each reference run is made once."""

    def __init__(self, module: str, fake: FakeModelServer, owner: OwnerService, applied: int = 3) -> None:
        self.module, self.fake, self.owner, self.applied = module, fake, owner, applied
        self._harnesses: dict[tuple[str, str], KillHarness] = {}

    def harness(
        self, request: pytest.FixtureRequest, workdir: Path, workflow: str, store: str
    ) -> KillHarness:
        if (workflow, store) not in self._harnesses:
            url = None  # SQLite: a fresh file per trial
            if store == "postgres":
                url = f"{request.getfixturevalue('pg_url')}?schema=kill_{uuid.uuid4().hex[:12]}"
            self._harnesses[workflow, store] = KillHarness(
                f"{self.module}:{workflow}",
                [TICKET],
                owner=self.owner,
                workdir=workdir,
                pythonpath=[TESTS],
                store_url=url,
                timeout=90,
                preload=PRELOAD[self.module],
            )
        return self._harnesses[workflow, store]

    def trial(
        self,
        request: pytest.FixtureRequest,
        workdir: Path,
        workflow: str,
        store: str,
        crash_at: str,
        again: int,
    ) -> None:
        """Kill one run at ``crash_at`` (a crash point, ``in-flight@<turn>``, or ``mcp-in-flight``:
        the MCP server kills its client once it has made the change), resume it, and assert
        everything a trial asserts; ``again``: the requests a resume may send twice."""
        harness = self.harness(request, workdir, workflow, store)
        reference, applied = harness.reference()
        assert reference["status"] == "completed", reference
        assert applied == self.applied
        before = len(self.fake.requests)
        if crash_at.startswith("in-flight@"):
            kill_in_flight(self.fake, turn=int(crash_at.partition("@")[2]))
            report = harness.trial()
        elif crash_at == "mcp-in-flight":
            flag = workdir / "kill-once"
            flag.write_text("")
            monkeypatch = request.getfixturevalue("monkeypatch")
            monkeypatch.setenv(MCP_KILL_FLAG_ENV, str(flag))  # the children, and their server, inherit it
            report = harness.trial()
            assert not flag.exists(), "the MCP server never held the call"
        else:
            report = harness.trial(crash_at=crash_at)
        assert report.killed, f"the crash point {crash_at} was never reached"
        report.check()
        sent = self.fake.requests[before:]
        repeated = sum(count - 1 for count in Counter(r.digest for r in sent).values())
        assert repeated <= again, [(r.turn, r.digest[:12]) for r in sent]
        assert len(sent) - repeated <= len(SCRIPT)  # each turn asked for once (but the one lost)
        assert self.fake.orphans == []
