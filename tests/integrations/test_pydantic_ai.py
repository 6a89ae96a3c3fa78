"""Pydantic AI agents made durable by ``SafepointDurability``: the real ``pydantic-ai`` package,
its ``OpenAIChatModel`` / ``OpenAIResponsesModel`` over real HTTP to the loopback fake model
server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent, CallDeferred, DeferredToolRequests, ModelRetry
from pydantic_ai.durable_exec import CapabilityOperationId
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import safepoint as sp
from agent_flows import FAKE_MODEL_URL_ENV, SCRIPT, TICKET
from safepoint.errors import AwaitingApproval, UsageError
from safepoint.integrations import pydantic_ai as sppa
from safepoint.testing import FakeModelServer, OwnerService, Turn

TESTS = Path(__file__).parents[1]
ROOT = TESTS.parent


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeModelServer]:
    """The fake model server, its URL where ``pydantic_ai_flows`` (and children) look for it."""
    with FakeModelServer(SCRIPT) as server:
        monkeypatch.setenv(FAKE_MODEL_URL_ENV, server.url)
        yield server


def applied(owner: OwnerService, resource: str) -> int:
    return int(owner.client.stats()["by_resource"].get(resource, 0))


def chat_model(fake: FakeModelServer) -> OpenAIChatModel:
    client = AsyncOpenAI(api_key="sk-test-fake", base_url=fake.openai_url, max_retries=0)
    return OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client))


def test_every_model_request_and_tool_call_is_a_step_of_the_run(
    store: sp.Store, fake_env: FakeModelServer, owner_env: OwnerService
) -> None:
    from pydantic_ai_flows import support_chat

    result = sp.start(store, support_chat, TICKET, run_id="pyd-1")
    assert result == {"output": "Refunded order A1 and told Ada and her manager.", "messages": 8}
    steps = list(store.load_ledger("pyd-1").steps)
    assert [s for s in steps if s.startswith("model")] == ["model", "model#2", "model#3", "model#4"]
    assert len([s for s in steps if s.startswith("tool.call_")]) == 4  # one read, three effects
    assert applied(owner_env, "refunds") == 1
    assert applied(owner_env, "tickets") == 2
    assert len(fake_env.requests) == 4
    assert fake_env.orphans == []


CHILD = """
import json, sys
import safepoint as sp
from safepoint.testing import crash_at, SimulatedCrash
import pydantic_ai_flows as flows
from pydantic_ai_flows import support_chat
store = sp.open_store(sys.argv[1])
if sys.argv[2] == "start":
    try:
        with crash_at("run.before_complete"):
            sp.start(store, support_chat, sys.argv[3], run_id="pyd-x")
    except SimulatedCrash:
        print(json.dumps({"crashed": True}))
else:
    print(json.dumps({"result": sp.resume(store, "pyd-x")}))
"""


def _child(store_url: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT / "src")])}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, store_url, *args],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes importing Pydantic AI: the kill trials resume across processes too
def test_a_resume_in_a_new_process_replays_every_unit(
    tmp_path: Path, fake_env: FakeModelServer, owner_env: OwnerService
) -> None:
    # Pydantic AI's cache key holds timestamps and run ids: unprojected, no unit would match.
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert _child(url, "start", TICKET) == {"crashed": True}
    asked = len(fake_env.requests)
    assert asked == 4
    assert applied(owner_env, "refunds") == 1
    resumed = _child(url, "resume")
    assert resumed["result"]["output"] == "Refunded order A1 and told Ada and her manager."
    assert len(fake_env.requests) == asked  # every model request replayed from the ledger
    assert applied(owner_env, "refunds") == 1
    assert applied(owner_env, "tickets") == 2


def test_the_effect_key_reaches_the_tool_and_one_operation_is_made_once(file_store: sp.Store) -> None:
    script = [
        Turn.tool_calls(("refund", {"order_id": "B7", "amount_cents": 300})),
        Turn.tool_calls(("refund", {"order_id": "B7", "amount_cents": 300})),  # asked again: new call id
        Turn.text("Refunded."),
    ]
    keys: list[str] = []
    with FakeModelServer(script) as fake:
        agent = Agent(chat_model(fake), name="desk", capabilities=[sppa.SafepointDurability()])

        @agent.tool_plain(metadata=sppa.effect(key_fields=["order_id"]))
        def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
            keys.append(str(sp.current_effect_key()))
            return {"id": f"re_{len(keys)}"}

        @sp.workflow("pyd-refund")
        async def flow(run: sp.AsyncRun) -> str:
            return (await agent.run("refund B7")).output

        assert sp.start(file_store, flow, run_id="k-1") == "Refunded."
    assert len(keys) == 1
    assert keys[0].startswith("sp_")
    effects = [s for s in file_store.load_ledger("k-1").steps if s.startswith("tool.")]
    assert len(effects) == 1  # the second call named the same operation: no step of its own


def test_model_retry_and_call_deferred_are_recorded_values_not_retried(file_store: sp.Store) -> None:
    script = [
        Turn.tool_calls(("lookup", {"sku": "K-9"})),
        Turn.tool_calls(("lookup", {"sku": "K-10"})),
        Turn.tool_calls(("ship", {"sku": "K-10"})),
    ]
    asked: list[str] = []

    def lookup(sku: str) -> int:
        asked.append(sku)
        if sku == "K-9":
            raise ModelRetry("no such sku; try K-10")
        return 3

    def ship(sku: str) -> str:
        asked.append(f"ship {sku}")
        raise CallDeferred()

    with FakeModelServer(script) as fake:

        @sp.workflow("pyd-control")
        async def flow(run: sp.AsyncRun) -> list[str]:
            # Built in the workflow: each start or resume runs on an event loop of its own.
            agent = Agent(
                chat_model(fake),
                name="stock",
                output_type=[str, DeferredToolRequests],
                capabilities=[sppa.SafepointDurability()],
            )
            agent.tool_plain(lookup)
            agent.tool_plain(metadata=sppa.effect())(ship)
            output = (await agent.run("ship one K-9")).output
            assert isinstance(output, DeferredToolRequests)
            return [call.tool_name for call in output.calls]

        with sp.testing.crash_at("run.before_complete"), pytest.raises(sp.testing.SimulatedCrash):
            sp.start(file_store, flow, run_id="c-1", lease_ms=0)
        seen = len(fake.requests)
        assert sp.resume(file_store, "c-1") == ["ship"]
        assert len(fake.requests) == seen == 3  # replayed: no request asked again
    assert asked == ["K-9", "K-10", "ship K-10"]  # each tool ran once; the retry was a value


def test_an_effect_tool_with_approval_waits_for_a_person(file_store: sp.Store) -> None:
    script = [Turn.tool_calls(("wire", {"to": "acct-9", "cents": 5000})), Turn.text("Sent.")]
    wired: list[dict[str, Any]] = []

    def wire(to: str, cents: int) -> dict[str, Any]:
        wired.append({"to": to, "cents": cents})
        return {"wired": cents}

    with FakeModelServer(script) as fake:

        @sp.workflow("pyd-wire")
        async def flow(run: sp.AsyncRun) -> str:
            agent = Agent(chat_model(fake), name="bank", capabilities=[sppa.SafepointDurability()])
            agent.tool_plain(metadata=sppa.effect(approval=True))(wire)
            return (await agent.run("wire 50 to acct-9")).output

        with pytest.raises(AwaitingApproval) as waiting:
            sp.start(file_store, flow, run_id="w-1")
        assert wired == []
        sp.approve(file_store, "w-1", waiting.value.step_id, by="ana")
        assert sp.resume(file_store, "w-1") == "Sent."
    assert wired == [{"to": "acct-9", "cents": 5000}]


def test_tools_declared_by_name_and_an_unknown_operation_recorded_as_a_read(file_store: sp.Store) -> None:
    script = [Turn.tool_calls(("total", {"a": 2, "b": 3})), Turn.text("5")]
    ran: list[str] = []

    def total(a: int, b: int) -> int:
        ran.append("total")
        return a + b

    async def body() -> object:
        ran.append("unknown")
        return {"ok": True}

    with FakeModelServer(script) as fake:

        @sp.workflow("pyd-calc")
        async def flow(run: sp.AsyncRun) -> list[Any]:
            durability = sppa.SafepointDurability(tools={"total": sppa.pure()})
            agent = Agent(chat_model(fake), name="calc", capabilities=[durability])
            agent.tool_plain(total)
            output = (await agent.run("2+3")).output
            backend = sppa.SafepointOperationBackend("calc", default_model_id=None, tools={}, retry=None)
            other = await backend.execute(
                operation_id=CapabilityOperationId("audit", operation="note"),
                name="calc__capability__audit.note",
                body=body,
                cache_key=("note",),
                config={},
            )
            return [output, other]

        with sp.testing.crash_at("run.before_complete"), pytest.raises(sp.testing.SimulatedCrash):
            sp.start(file_store, flow, run_id="p-1", lease_ms=0)
        assert sp.resume(file_store, "p-1") == ["5", {"ok": True}]
    assert ran == ["total", "unknown"]  # both replayed from the ledger on the resume
    assert "pydantic_ai" in file_store.load_ledger("p-1").steps


def test_a_transient_model_failure_is_retried_within_one_step(file_store: sp.Store) -> None:
    with FakeModelServer([Turn.text("Hello!")]) as fake:
        fake.fail(503)
        agent = Agent(
            chat_model(fake),
            name="hi",
            capabilities=[sppa.SafepointDurability(retry=sp.Retry(attempts=3, backoff=0.01))],
        )

        @sp.workflow("pyd-hi")
        async def flow(run: sp.AsyncRun) -> str:
            return (await agent.run("Hi")).output

        assert sp.start(file_store, flow, run_id="h-1") == "Hello!"
        assert len(fake.requests) == 2
    assert [s for s in file_store.load_ledger("h-1").steps] == ["model"]


def test_outside_a_workflow_the_agent_runs_as_it_would_and_a_plain_workflow_is_refused(
    file_store: sp.Store,
) -> None:
    with FakeModelServer([Turn.text("Hello!")]) as fake:
        agent = Agent(chat_model(fake), name="hi", capabilities=[sppa.SafepointDurability()])
        assert agent.run_sync("Hi").output == "Hello!"

        @sp.workflow("pyd-sync")
        def flow(run: sp.Run) -> str:
            return agent.run_sync("Hi").output

        with pytest.raises(UsageError, match="async def workflow"):
            sp.start(file_store, flow, run_id="s-1")


def test_a_declaration_of_no_known_kind_is_refused() -> None:
    with pytest.raises(UsageError, match="none of 'pure', 'read', 'effect'"):
        sppa.SafepointDurability(tools={"x": {"kind": "write"}})
    with pytest.raises(UsageError, match="takes no max_age"):
        sppa.SafepointDurability(tools={"x": {"kind": "effect", "max_age": 3}})


@pytest.mark.slow  # the example in a process of its own, as test_examples runs the others
def test_the_example_runs_against_the_fake_server() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pydantic_ai_support.py")],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refunds at the desk: 1" in done.stdout
    assert "model requests after the crash: 0 asked again" in done.stdout


# -- an effect tool that raises ModelRetry did nothing: the corrected call runs ----------------


def test_an_effect_tool_that_asks_the_model_to_retry_applies_nothing_and_the_corrected_call_runs(
    file_store: sp.Store,
) -> None:
    from pydantic_ai import Agent, ModelRetry
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from safepoint.integrations import pydantic_ai as sppa

    refunded: list[tuple[str, int]] = []

    def refund(order_id: str, amount_cents: int) -> str:
        """Refund an order."""
        if amount_cents > 4200:
            raise ModelRetry("the order's total is 4200 cents; refund at most that")
        refunded.append((order_id, amount_cents))
        return "refunded"

    script = [
        Turn.tool_calls(("refund", {"order_id": "A1", "amount_cents": 9999})),
        Turn.tool_calls(("refund", {"order_id": "A1", "amount_cents": 4200})),
        Turn.text("Done."),
    ]
    with FakeModelServer(script) as fake:

        @sp.workflow("pyd-retry-effect")
        async def flow(run: sp.AsyncRun) -> str:
            client = AsyncOpenAI(api_key="sk-test-fake", base_url=fake.openai_url, max_retries=0)
            agent = Agent(
                OpenAIChatModel("gpt-test", provider=OpenAIProvider(openai_client=client)),
                name="desk",
                capabilities=[sppa.SafepointDurability()],
            )
            agent.tool_plain(metadata=sppa.effect(key_fields=["order_id"]))(refund)
            return (await agent.run("refund A1")).output

        with sp.testing.crash_at("run.before_complete"), pytest.raises(sp.testing.SimulatedCrash):
            sp.start(file_store, flow, run_id="r", lease_ms=0)
        assert sp.resume(file_store, "r") == "Done."  # replayed: the same path
        assert len(fake.requests) == 3
        told = [m for m in fake.requests[2].body["messages"] if m.get("role") == "tool"]
    # The ModelRetry meant "nothing was done, call again with other arguments": the corrected
    # call must run. Instead the first call's retry was recorded as the operation's receipt and
    # the corrected call is refused as "already asked for with other arguments".
    assert refunded == [("A1", 4200)], (refunded, told)
