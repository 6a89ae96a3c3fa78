"""The OpenAI Agents SDK on the ledger, with the real ``openai-agents`` package over HTTP to
the fake model server: ``Runner.run`` / ``Runner.run_streamed`` on an agent made durable by
``spoa.durable`` with the model provider of ``spoa.run_config``. Model calls are model steps
replayed on a resume; function tools are steps keyed by the SDK's call id, by their declared
kind; ``needs_approval`` is safepoint's approval; a crash inside an effect is reconciled with
its owner, never sent twice and never refused."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

import safepoint as sp
from agent_flows import SCRIPT, TICKET, tools
from openai_agents_flows import agent as support
from safepoint.errors import BudgetExhausted, StaleCheckpoint, UsageError
from safepoint.integrations import openai_agents as spoa
from safepoint.integrations.tools import Tools
from safepoint.testing import FakeModelServer, OwnerService, SimulatedCrash, Turn, crash_at, owner_effect

set_tracing_disabled(True)  # traces would be exported over the network

KEY = "sk-test-fake"
ANSWER = "Refunded order A1 and told Ada and her manager."
ONCE = {"refunds": 1, "emails": 2, "duplicates": 0}  # one refund, two e-mails


def applied(owner: OwnerService) -> dict[str, int]:
    stats = owner.client.stats()
    counts = stats["by_resource"]
    return {
        "refunds": counts.get("refunds", 0),
        "emails": counts.get("tickets", 0),
        "duplicates": stats["duplicates"],
    }


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer(SCRIPT) as server:
        yield server


def config(fake: FakeModelServer, **options: Any) -> Any:
    return spoa.run_config(client=AsyncOpenAI(api_key=KEY, base_url=fake.openai_url), **options)


def ending(result: Any) -> dict[str, Any]:
    return {"text": result.final_output, "items": [item.type for item in result.new_items]}


def workflow(fake: FakeModelServer, name: str, agent: Agent[Any] = support, **options: Any) -> Any:
    @sp.workflow(name)
    async def run_agent(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        result = await Runner.run(agent, ticket, run_config=config(fake, **options))
        return ending(result)

    return run_agent


def test_a_run_is_model_steps_and_tool_steps_keyed_by_the_sdk_call_id(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    result = sp.start(file_store, workflow(fake, "agents-plain"), TICKET, run_id="r")
    assert result["text"] == ANSWER
    steps = file_store.load_ledger("r").steps
    last = fake.requests[-1].body["input"]  # the whole conversation, in order
    calls = [item["call_id"] for item in last if item.get("type") == "function_call"]
    assert list(steps) == [
        "model",
        f"tool.{calls[0]}",
        "model#2",
        *(f"tool.{c}" for c in calls[1:3]),  # the turn's two calls, in the model's order
        "model#3",
        f"tool.{calls[3]}",
        "model#4",
    ]
    assert steps["model"].name == "openai_agents.get_response"
    assert applied(owner_env) == ONCE
    assert len(fake.requests) == 4
    assert fake.orphans == []
    # the SDK's tool definitions are the registry's
    assert [t["name"] for t in fake.requests[0].body["tools"]] == ["get_order", "refund", "send_email"]


def test_a_resume_replays_the_model_and_the_tools_and_reconciles_the_effect(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    # the refund applied, its receipt lost
    with crash_at("effect.after_receiver_commit:tool@1"), pytest.raises(SimulatedCrash):
        sp.start(file_store, workflow(fake, "agents-crash"), TICKET, run_id="c", lease_ms=0)
    sent = len(fake.requests)
    assert sent == 2
    result = sp.resume(file_store, "c")
    assert result["text"] == ANSWER
    assert len(fake.requests) == sent + 2  # only the turns not yet answered were asked for
    assert fake.repeated() == []
    assert applied(owner_env) == ONCE  # reconciled: applied once
    assert fake.orphans == []


mailer = Tools()
mailer.add(
    "send_email",
    "effect",
    effect=owner_effect("notifications", name="agents-notices"),  # the owner cannot read these back
    description="Send an e-mail.",
    schema={"type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]},
)
NOTICE = [Turn.tool_calls(("send_email", {"to": "ada@example.com"})), Turn.text("Sent.")]


def test_an_effect_its_owner_cannot_be_asked_about_blocks_the_run_instead_of_a_resend(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    agent = spoa.durable(Agent(name="mailer", model="gpt-test"), mailer)
    with FakeModelServer(NOTICE) as fake:
        # the e-mail sent, its receipt lost
        with crash_at("effect.after_receiver_commit:tool"), pytest.raises(SimulatedCrash):
            sp.start(file_store, workflow(fake, "agents-blocked", agent), "mail Ada", run_id="b", lease_ms=0)
        with pytest.raises(sp.NeedsReconciliation):
            sp.resume(file_store, "b")
        assert len(fake.requests) == 1  # the model is never told an invented "unknown"
    assert owner_env.client.stats()["by_resource"]["notifications"] == 1


def test_a_stream_is_recorded_as_its_response_and_replayed_as_the_same_events(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    @sp.workflow("agents-streamed")
    async def streamed(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        result = Runner.run_streamed(support, ticket, run_config=config(fake))
        events = [e.data.type async for e in result.stream_events() if e.type == "raw_response_event"]
        return {**ending(result), "events": events}

    first = sp.start(file_store, streamed, TICKET, run_id="s1")
    assert first["events"][0] == "response.created"
    assert first["events"].count("response.completed") == 4
    assert file_store.load_ledger("s1").steps["model"].name == "openai_agents.stream_response"
    with crash_at("run.before_complete"), pytest.raises(SimulatedCrash):
        sp.start(file_store, streamed, TICKET, run_id="s2", lease_ms=0)
    sent = len(fake.requests)
    assert sp.resume(file_store, "s2") == first  # the same events, from the ledger
    assert len(fake.requests) == sent


def test_the_chat_completions_api(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    result = sp.start(file_store, workflow(fake, "agents-chat", api="chat"), TICKET, run_id="ch")
    assert result["text"] == ANSWER
    assert [r.api for r in fake.requests] == ["chat"] * 4
    assert applied(owner_env) == ONCE


def test_per_run_noise_does_not_move_the_fingerprint_but_the_request_does(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    settings: dict[str, Any] = {"metadata": {"trace": "one"}, "extra_args": {"prompt_cache_key": "k1"}}

    def agent() -> Agent[Any]:
        return support.clone(model_settings=ModelSettings(**settings))

    @sp.workflow("agents-noise")
    async def noisy(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        return ending(await Runner.run(agent(), ticket, run_config=config(fake)))

    with crash_at("step.after_record:model#2"), pytest.raises(SimulatedCrash):
        sp.start(file_store, noisy, TICKET, run_id="n", lease_ms=0)
    settings.update(metadata={"trace": "two"}, extra_args={"prompt_cache_key": "k2"}, timeout=30.0)
    sent = len(fake.requests)
    assert sp.resume(file_store, "n")["text"] == ANSWER
    assert len(fake.requests) == sent + 2  # model and model#2 replayed
    settings.update(temperature=0.5)  # what the model is asked: a different request
    with crash_at("step.after_record:model"), pytest.raises(SimulatedCrash):
        sp.start(file_store, noisy, TICKET, run_id="m", lease_ms=0)
    settings.update(temperature=0.9)
    with pytest.raises(StaleCheckpoint):
        sp.resume(file_store, "m")


def test_a_transient_failure_is_a_retried_attempt_of_one_step(
    fake: FakeModelServer, file_store: sp.Store, owner_env: OwnerService
) -> None:
    fake.fail(429, retry_after=0.01)
    result = sp.start(file_store, workflow(fake, "agents-429"), TICKET, run_id="t")
    assert result["text"] == ANSWER
    assert len(fake.requests) == 5  # the 429, then the four turns
    assert next(iter(file_store.load_ledger("t").steps)) == "model"


@pytest.mark.parametrize(
    ("budget", "limit", "raised"),
    [
        (sp.Budget(model_calls=2), "model_calls", {"model_calls": 10}),
        (sp.Budget(cost=0.5), "cost", {"cost": 5.0}),
    ],
    ids=["turns", "cost"],
)
def test_a_run_stops_at_its_budget_and_carries_on_once_it_is_raised(
    fake: FakeModelServer,
    file_store: sp.Store,
    owner_env: OwnerService,
    budget: sp.Budget,
    limit: str,
    raised: dict[str, Any],
) -> None:
    @sp.workflow(f"agents-budget-{limit}", budget=budget)
    async def budgeted(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
        result = await Runner.run(support, ticket, run_config=config(fake, price=lambda reply: 0.25))
        return ending(result)

    with pytest.raises(BudgetExhausted) as stopped:
        sp.start(file_store, budgeted, TICKET, run_id="r")
    assert stopped.value.kind == limit
    assert len(fake.requests) == 2  # the third request was never sent
    sp.extend_limits(file_store, "r", **raised, by="ops", reason="a longer conversation")
    assert sp.resume(file_store, "r")["text"] == ANSWER
    assert len(fake.requests) == 4
    assert fake.repeated() == []
    run = file_store.get_run("r")
    assert run.model_calls_spent == 4
    assert run.cost_spent == pytest.approx(1.0)
    assert run.tokens_spent > 0  # the usage each response reported


# -- existing @function_tools, declared by kind ------------------------------------------------

sent_emails: list[tuple[str, str]] = []
looked_up: list[str] = []


@function_tool
def lookup_order(order_id: str) -> str:
    """Look up an order by its id."""
    looked_up.append(order_id)
    if order_id != "A1":
        raise KeyError(order_id)
    return json.dumps({"order_id": order_id, "total_cents": 4200})


@function_tool(needs_approval=True)
def email_customer(to: str, subject: str) -> str:
    """E-mail the customer."""
    key = sp.current_effect_key()
    sent_emails.append((to, str(key)))
    return f"sent to {to}"


EMAIL_SCRIPT = [
    Turn.tool_calls(("lookup_order", {"order_id": "B2"})),
    Turn.tool_calls(("email_customer", {"to": "ada@example.com", "subject": "Refund"})),
    Turn.text("Done."),
]
KINDS: dict[str, Any] = {
    "lookup_order": "read",
    "email_customer": spoa.Declared("effect", key_fields=("to",)),
}


def test_existing_function_tools_run_in_their_steps_and_needs_approval_waits_for_safepoint_approve(
    file_store: sp.Store,
) -> None:
    sent_emails.clear()
    agent = spoa.durable(
        Agent(name="mail", model="gpt-test", tools=[lookup_order, email_customer]), kinds=KINDS
    )
    with FakeModelServer(EMAIL_SCRIPT) as fake:
        run_agent = workflow(fake, "agents-approval", agent)
        with pytest.raises(sp.AwaitingApproval) as waiting:
            sp.start(file_store, run_agent, "mail Ada", run_id="a")
        assert sent_emails == []
        assert len(fake.requests) == 2
        # the read's failure is an error result for the model, recorded: not the SDK's text
        output = next(i for i in fake.requests[1].body["input"] if i.get("type") == "function_call_output")
        assert output["output"] == "KeyError: 'B2'"
        sp.approve(file_store, "a", waiting.value.step_id, by="ana")
        assert sp.resume(file_store, "a")["text"] == "Done."
        assert sp.resume(file_store, "a")["text"] == "Done."  # a completed run: its result
    assert len(sent_emails) == 1
    assert sent_emails[0][1].startswith("sp_")
    assert looked_up.count("B2") == 1


def test_a_function_tool_without_a_declared_kind_is_refused() -> None:
    with pytest.raises(UsageError, match="lookup_order are not declared"):
        spoa.durable(Agent(name="x", tools=[lookup_order]))


def test_needs_approval_on_a_read_or_as_a_function_is_refused() -> None:
    with pytest.raises(UsageError, match="declare it an effect"):
        spoa.durable(Agent(name="x", tools=[email_customer]), kinds={"email_customer": "read"})

    async def rule(ctx: Any, args: dict[str, Any], call_id: str) -> bool:
        return True

    ruled = function_tool(lambda to: to, name_override="ruled", needs_approval=rule)
    with pytest.raises(UsageError, match="needs_approval is a function"):
        spoa.durable(Agent(name="x", tools=[ruled]), kinds={"ruled": "effect"})


def test_a_handoff_target_is_made_durable_and_a_resume_replays_through_the_handoff(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    billing = Agent(name="billing", instructions="Refund lost orders.", model="gpt-test")
    triage = spoa.durable(Agent(name="triage", model="gpt-test", handoffs=[billing]), tools)
    (made,) = triage.handoffs
    assert isinstance(made, Agent)
    assert [t.name for t in made.tools] == ["get_order", "refund", "send_email"]
    with FakeModelServer([Turn.tool_calls(("transfer_to_billing", {})), *SCRIPT]) as fake:
        with crash_at("effect.after_receiver_commit:tool@1"), pytest.raises(SimulatedCrash):
            sp.start(file_store, workflow(fake, "agents-handoff", triage), TICKET, run_id="h", lease_ms=0)
        assert sp.resume(file_store, "h")["text"] == ANSWER
        assert len(fake.requests) == 5
        assert fake.repeated() == []
        assert fake.orphans == []
    assert applied(owner_env) == ONCE


def test_an_agent_as_a_tool_is_refused_with_what_to_do_instead() -> None:
    billing = Agent(name="billing", model="gpt-test")
    with pytest.raises(UsageError, match="hand off to that agent"):
        spoa.durable(Agent(name="x", tools=[billing.as_tool("billing", "Ask billing.")]))


def test_outside_an_async_workflow_the_model_says_what_to_do(fake: FakeModelServer) -> None:
    with pytest.raises(UsageError, match="async def workflow"):
        Runner.run_sync(support, TICKET, run_config=config(fake))


@pytest.mark.parametrize("store_url", ["postgres"], indirect=True)
def test_on_postgres_a_crash_in_an_effect_resumes_with_one_refund(
    fake: FakeModelServer, store: sp.Store, owner_env: OwnerService
) -> None:
    with crash_at("effect.after_dispatching:tool"), pytest.raises(SimulatedCrash):
        sp.start(store, workflow(fake, "agents-pg"), TICKET, run_id="p", lease_ms=0)
    assert sp.resume(store, "p")["text"] == ANSWER
    assert applied(owner_env) == ONCE
    assert fake.orphans == []
    assert len(fake.requests) == 4


# -- the example and the page ------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # the example in a process of its own, as test_examples runs the others
def test_the_example_runs_and_does_everything_once() -> None:
    ran = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "openai_agents_support.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    first, *story = ran.stdout.splitlines()
    assert first.startswith("waiting for approval: refund:")
    assert story == [
        "approved by ana",
        "crashed: the e-mail went out, its receipt was never recorded",
        "answer: I refunded order A1 and e-mailed Ada.",
        "model requests per turn: {0: 1, 1: 1, 2: 1, 3: 1}, repeated: 0, orphaned tool calls: 0",
        "refunds applied: 1, e-mails sent: 1",
    ]


def test_the_page_says_how_many_lines_its_diff_changes() -> None:
    page = (ROOT / "docs" / "integrations" / "openai-agents.md").read_text()
    diff = page.partition("```diff\n")[2].partition("```")[0].splitlines()
    added = [line for line in diff if line.startswith("+")]
    removed = [line for line in diff if line.startswith("-")]
    assert (len(added), len(removed)) == (8, 5)
    assert "eight lines in, five out" in page


# -- 2. OpenAI Agents: the turnstile orders a turn's calls by when they reach it -----------------


def test_a_turns_tool_calls_run_in_the_models_order_whatever_the_hooks_take(
    file_store: sp.Store,
) -> None:
    from agents import Agent, RunHooks, Runner, set_tracing_disabled

    from safepoint.integrations import openai_agents as spoa
    from safepoint.integrations.tools import Tools

    set_tracing_disabled(True)
    applied: dict[str, dict[str, Any]] = {}
    sent: list[str] = []
    tools = Tools()

    def find(key: sp.EffectKey) -> Any:
        found = applied.get(str(key))
        return sp.Applied(found) if found else sp.NotApplied()

    @tools.effect(reconcile=find)
    def refund(order_id: str, key: sp.EffectKey) -> dict[str, Any]:
        """Refund an order."""
        sent.append(f"refund {order_id}")
        applied[str(key)] = {"refund": order_id}
        return applied[str(key)]

    @tools.effect(reconcile=find)
    def notify(to: str, key: sp.EffectKey) -> dict[str, Any]:
        """Tell someone."""
        sent.append(f"notify {to}")
        applied[str(key)] = {"notify": to}
        return applied[str(key)]

    slow: dict[str, float] = {}

    class Hooks(RunHooks[Any]):
        # e.g. an audit log written over the network before each tool runs
        async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
            await asyncio.sleep(slow.get(tool.name, 0.0))

    script = [
        Turn.tool_calls(("refund", {"order_id": "A1"}), ("notify", {"to": "ada"})),
        Turn.text("Done."),
    ]
    agent = spoa.durable(Agent(name="desk", model="gpt-test"), tools)
    with FakeModelServer(script) as fake:

        @sp.workflow("agents-order")
        async def flow(run: sp.AsyncRun) -> str:
            config = spoa.run_config(client=AsyncOpenAI(api_key=KEY, base_url=fake.openai_url))
            return (await Runner.run(agent, "go", run_config=config, hooks=Hooks())).final_output

        # the refund (the model's first call) applied, the process dies before its receipt (the
        # notice's audit log is slow, so it has not started: the SDK cancels it)
        slow["notify"] = 0.5
        with crash_at("effect.after_receiver_commit:tool"), pytest.raises(SimulatedCrash):
            sp.start(file_store, flow, run_id="o", lease_ms=0)
        assert sent == ["refund A1"]
        slow.clear()
        slow["refund"] = 0.2  # this time the audit log is slow for the refund
        result = sp.resume(file_store, "o")  # reconciles the refund first, then sends the notice
    assert result == "Done."
    assert sent == ["refund A1", "notify ada"]
