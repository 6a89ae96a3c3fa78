"""Workflows and plain-SDK runs for the Claude Agent SDK tests, run as a child process inside a
network namespace with only loopback (``unshare -n``): the Claude Code CLI, the fake model
server and the ledger all live there. Prints one JSON line: what the test asserts on.

``kill``: the kill trials of ``support_kill`` (importable as ``claude_agent_flows:support_kill``),
driven from inside the namespace, so that the killed workflow processes, their CLIs, the fake
model server and the effect owner all reach each other on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, create_sdk_mcp_server, query, tool

import safepoint as sp
from safepoint.integrations import claude_agent as spc
from safepoint.integrations.tools import Tools
from safepoint.testing import (
    FakeModelServer,
    FakeRequest,
    KillHarness,
    OwnerService,
    Turn,
    owner_effect,
    run_child,
)

SCRIPT = [
    Turn.tool_calls(("mcp__tools__create_ticket", {"title": "Refund A1"})),
    Turn.text("Ticket created."),
    Turn.text("Ticket created."),
    Turn.text("Ticket created."),
    Turn.text("Ticket created."),
]
UNKNOWN = "outcome is unknown"


def cli_env(url: str, config: str) -> dict[str, str]:
    """The CLI's environment: the fake API, a fake key, its own config dir, no other traffic."""
    return {
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-ant-test-fake",
        "CLAUDE_CONFIG_DIR": config,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
    }


def this_machine(work: Path, url: str) -> ClaudeAgentOptions:
    """The CLI's options for runs on one machine: the fake at ``url``, one config directory
    under ``work`` for every process (its session files stay)."""
    config = work / "claude-config"
    config.mkdir(exist_ok=True)
    return ClaudeAgentOptions(env=cli_env(url, str(config)), cwd=str(config))


class Desk:
    """The tickets' owner: one line per ticket in a file, deduplicated by idempotency key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def tickets(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def create(self, title: str, key: str | None) -> dict[str, Any]:
        for ticket in self.tickets():
            if key is not None and ticket["key"] == key:
                return ticket
        ticket = {"id": f"T-{len(self.tickets()) + 1}", "title": title, "key": key}
        with self.path.open("a") as f:
            f.write(json.dumps(ticket) + "\n")
        return ticket


def plain(work: Path) -> dict[str, Any]:
    """The plain SDK: a budget stop on the tool's turn, then a resume of the same session."""
    desk = Desk(work / "tickets.jsonl")

    @tool("create_ticket", "Create a support ticket.", {"title": str})
    async def create_ticket(args: dict[str, Any]) -> dict[str, Any]:
        ticket = desk.create(args["title"], None)
        return {"content": [{"type": "text", "text": json.dumps(ticket)}]}

    async def main() -> dict[str, Any]:
        with FakeModelServer(SCRIPT) as fake:
            config = str(work / "plain-config")  # under the test's own directory: removed with it
            os.makedirs(config, exist_ok=True)
            base = ClaudeAgentOptions(
                mcp_servers={"tools": create_sdk_mcp_server("tools", tools=[create_ticket])},
                allowed_tools=["mcp__tools__create_ticket"],
                env=cli_env(fake.url, config),
                cwd=config,
            )
            subtypes = []
            session = None
            for budget in (0.01, 1.0):  # stopped on the tool's turn, then resumed
                options = ClaudeAgentOptions(**{**base.__dict__, "resume": session, "max_budget_usd": budget})
                try:
                    async for message in query(
                        prompt="continue" if session else "Refund A1", options=options
                    ):
                        if isinstance(message, ResultMessage):
                            subtypes.append(message.subtype)
                            session = message.session_id
                except Exception:  # the SDK raises after an error result it yielded
                    pass
            bodies = [json.dumps(r.body) for r in fake.requests]
        return {
            "subtypes": subtypes,
            "tickets": len(desk.tickets()),
            "unknown": [UNKNOWN in b for b in bodies],
        }

    return asyncio.run(main())


def make_tools(desk: Desk) -> Tools:
    tools = Tools()

    @tools.effect(key_fields=("title",))
    def create_ticket(title: str, key: sp.EffectKey) -> dict[str, Any]:
        """Create a support ticket."""
        return desk.create(title, str(key))

    return tools


def durable(work: Path, step: str) -> dict[str, Any]:
    """With safepoint: ``start`` stops at the budget; ``resume`` raises it and carries on.
    ``turns-start`` / ``turns-resume``: the same with the run's turns (``model_calls``).
    ``lost-start`` / ``lost-resume``: as ``turns-``, but the first process's ledger refuses
    every batch of the session's transcript (the SDK reports a ``mirror_error``)."""
    desk = Desk(work / "tickets.jsonl")
    tools = make_tools(desk)
    store = sp.open_store(f"sqlite:///{work / 'ledger.db'}")
    turns = step.startswith(("turns-", "lost-"))
    if step == "lost-start":

        async def refused(self: spc.LedgerSessionStore, key: Any, entries: Any) -> None:
            raise sp.StoreError("the ledger is out of reach")

        spc.LedgerSessionStore.append = refused  # type: ignore[method-assign]
    budget = sp.Budget(model_calls=1) if turns else sp.Budget(cost=0.01)

    @sp.workflow("support-claude", budget=budget)
    async def support(run: sp.AsyncRun) -> dict[str, Any]:
        return await spc.query(run, "Refund A1", tools=tools, base=this_machine(work, fake_url))

    async def main() -> dict[str, Any]:
        nonlocal fake_url
        with FakeModelServer(SCRIPT) as fake:
            fake_url = fake.url
            out: dict[str, Any] = {}
            try:
                if step.endswith("start"):
                    out["result"] = await sp.start_async(store, support, run_id="claude-1")
                else:
                    more = {"model_calls": 5} if turns else {"cost": 1.0}
                    await sp.extend_limits_async(store, "claude-1", **more, by="test")
                    out["result"] = await sp.resume_async(store, "claude-1")
            except sp.LimitReached as stop:
                out["stopped"] = type(stop).__name__
            bodies = [json.dumps(r.body) for r in fake.requests]
            out["requests"] = len(bodies)
            out["unknown"] = [UNKNOWN in b for b in bodies]
            out["receipt"] = ['\\"T-1\\"' in b or '"T-1"' in b for b in bodies]
        out["status"] = store.get_run("claude-1").status.value
        ledger = store.load_ledger("claude-1")
        out["steps"] = [s for s in ledger.steps if not s.startswith("claude.session.")]
        out["sessions"] = [ledger.steps[s].result for s in out["steps"] if s.startswith("claude.sessions")]
        out["tickets"] = len(desk.tickets())
        return out

    fake_url = ""
    return asyncio.run(main())


TWINS = [  # one turn with two alike calls: two notes, each its own step and receipt
    Turn.tool_calls(
        ("mcp__tools__add_note", {"text": "call back"}), ("mcp__tools__add_note", {"text": "call back"})
    ),
    Turn.text("Two notes added."),
]


def twins(work: Path) -> dict[str, Any]:
    """Two alike calls in one turn: each step's receipt is the one the CLI gave its call."""
    notes: list[str] = []
    tools = Tools()

    @tools.effect()
    def add_note(text: str, key: sp.EffectKey) -> dict[str, Any]:
        """Add a note to the customer's file."""
        notes.append(str(key))
        return {"note": f"N-{len(notes)}"}

    store = sp.open_store(f"sqlite:///{work / 'ledger.db'}")

    @sp.workflow("claude-twins")
    async def flow(run: sp.AsyncRun) -> dict[str, Any]:
        return await spc.query(run, "Add two notes", tools=tools, base=this_machine(work, fake_url))

    async def main() -> dict[str, Any]:
        nonlocal fake_url
        with FakeModelServer(TWINS) as fake:
            fake_url = fake.url
            result = await sp.start_async(store, flow, run_id="twins-1")
            last = fake.requests[-1].body
        told = {  # what the CLI told the model each call answered
            block["tool_use_id"]: json.loads(block["content"][0]["text"])
            for message in last["messages"]
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if block.get("type") == "tool_result"
        }
        ledger = store.load_ledger("twins-1")
        recorded = {
            sid.removeprefix("tool."): ledger.steps[sid].result
            for sid in ledger.steps
            if sid.startswith("tool.")
        }
        return {"result": result["result"], "notes": len(notes), "told": told, "recorded": recorded}

    fake_url = ""
    return asyncio.run(main())


FAKE_MODEL_URL_ENV = "SAFEPOINT_FAKE_MODEL_URL"
# Each request names the workflow process whose CLI sent it (the CLI's ANTHROPIC_CUSTOM_HEADERS),
# so the fake can SIGKILL that process while it holds the request.
PID_HEADER = "x-kill-test-pid"
TICKET = "Refund A1"
kill_tools = Tools()
kill_tools.add(
    "create_ticket",
    "effect",
    effect=owner_effect("tickets", name="tickets"),
    key_fields=("title",),
    description="Create a support ticket.",
    schema={"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
)


async def _support(run: sp.AsyncRun, ticket: str) -> dict[str, Any]:
    """One query whose turn creates a ticket at the effect owner. Each process gets a CLI config
    directory of its own: a resume on "another machine", without the CLI's session files."""
    config = tempfile.mkdtemp(prefix="claude-config-")
    env = {
        **cli_env(os.environ[FAKE_MODEL_URL_ENV], config),
        "ANTHROPIC_CUSTOM_HEADERS": f"{PID_HEADER}: {os.getpid()}",
    }
    result = await spc.query(run, ticket, tools=kill_tools, base=ClaudeAgentOptions(env=env, cwd=os.getcwd()))
    return {"answer": result["result"]}


# A "lost:" trial's killed process loses, with the kill, every transcript batch after the
# prompt's (the CLI's batch with the tool's call had not reached the ledger): the resumed CLI
# finds the prompt unanswered. Only the process with an armed crash point loses them.
LOST = "lost:"
LOSE_ENV = "SAFEPOINT_TEST_LOSE_TRANSCRIPT"


def _lose_after_the_prompt() -> None:
    """The timing of a run whose prompt's batch reached the ledger before its tool ran: the
    hook waits for the first batch (the CLI goes on writing meanwhile), and of every batch only
    the entries before the model's first reply are recorded."""
    append, hook = spc.LedgerSessionStore.append, spc.Session.pre_tool_use
    replied = [False]  # from the model's first reply on, the entries die with the process
    arrived = asyncio.Event()

    async def append_until_a_reply(self: Any, key: Any, entries: list[dict[str, Any]]) -> None:
        kept = []
        for entry in entries:
            replied[0] = replied[0] or entry.get("type") == "assistant"
            if not replied[0]:
                kept.append(entry)
        if kept:
            await append(self, key, kept)
        arrived.set()

    async def after_the_first_batch(self: Any, *args: Any) -> Any:
        await asyncio.wait_for(arrived.wait(), 30)
        return await hook(self, *args)

    spc.LedgerSessionStore.append = append_until_a_reply  # type: ignore[method-assign]
    spc.Session.pre_tool_use = after_the_first_batch  # type: ignore[method-assign]


if os.environ.get(LOSE_ENV) and os.environ.get("SAFEPOINT_CRASH_AT"):
    _lose_after_the_prompt()

support_kill = sp.workflow("support-claude-kill")(_support)
# The same query on a budget its first turn spends: the CLI runs the ticket's tool and stops
# (error_max_budget_usd) before recording its result; the run stops until the budget is raised.
support_budget_kill = sp.workflow("support-claude-budget-kill", budget=sp.Budget(cost=0.01))(_support)
BUDGET = "budget:"  # a kill spec's prefix: a trial of support_budget_kill


def kill_trials(work: Path, store_url: str | None, specs: list[str]) -> dict[str, Any]:
    """SIGKILL ``support_kill`` at each of ``specs`` (a crash point, or ``in-flight@<turn>``:
    killed by the fake while it holds that turn's request), resume it, and report; a spec
    ``budget:<spec>`` kills ``support_budget_kill`` so, and raises its budget once it stopped."""
    out: dict[str, Any] = {"trials": []}
    with FakeModelServer(SCRIPT) as fake, OwnerService() as owner:
        os.environ[FAKE_MODEL_URL_ENV] = fake.url
        harness = KillHarness(
            "claude_agent_flows:support_kill",
            [TICKET],
            owner=owner,
            workdir=work,
            pythonpath=[str(Path(__file__).parent)],
            store_url=store_url,
            timeout=90,
            preload=("claude_agent_sdk",),  # imported once, in the zygote that forks the first processes
        )
        budget = BudgetTrials(owner, work, store_url)
        out["reference"], out["applied"] = harness.reference()
        for spec in specs:
            if spec.startswith(BUDGET):
                budget.reference()  # made once, before the trial's requests are counted
            before = len(fake.requests)
            crash = spec.removeprefix(BUDGET)
            if crash.startswith(LOST):
                crash = crash.removeprefix(LOST)
                os.environ[LOSE_ENV] = "1"
            armed = None
            if crash.startswith("in-flight@"):
                armed = _kill_in_flight(fake, int(crash.partition("@")[2]))
                crash = None
            trial: dict[str, Any] = {"spec": spec}
            if spec.startswith(BUDGET):
                trial.update(budget.trial(crash))
            else:
                report = harness.trial(crash_at=crash)
                trial.update(killed=report.killed, problem=_problem(report))
            os.environ.pop(LOSE_ENV, None)
            if armed is not None:  # killed by the fake (in whichever of the run's processes)
                trial["killed"] = not armed[0]
                armed[0] = False  # never sent that turn: no later trial may meet the kill
            sent = fake.requests[before:]
            bodies = [json.dumps(r.body) for r in sent]
            trial.update(
                sent=len(sent),
                # The CLI's requests differ from process to process outside the conversation
                # (its system prompt): a request asked again is its messages asked again.
                repeated=sum(
                    n - 1
                    for n in Counter(
                        json.dumps(r.body.get("messages"), sort_keys=True) for r in sent
                    ).values()
                ),
                turns=[r.turn for r in sent],
                unknown=sum(UNKNOWN in b for b in bodies),
                receipt=[TICKET_ID in b for b in bodies],  # which requests showed the model the receipt
            )
            out["trials"].append(trial)
        out["budget_reference"] = budget.reference() if any(s.startswith(BUDGET) for s in specs) else None
        out["orphans"] = len(fake.orphans)
    return out


TICKET_ID = "tk_1"  # the owner's id of the run's ticket (the owner is reset before each run)


def _problem(report: Any) -> str | None:
    try:
        report.check()
    except AssertionError as failed:
        return str(failed)
    return None


class BudgetTrials:
    """Kill trials of ``support_budget_kill``, which ``KillHarness`` cannot drive: a run that
    stopped at its budget is resumed only after a person raised it (``extend_limits``)."""

    def __init__(self, owner: OwnerService, work: Path, store_url: str | None) -> None:
        self.owner, self.work, self.store_url = owner, work, store_url
        self._reference: dict[str, Any] | None = None

    def _store(self) -> str:
        return self.store_url or f"sqlite:///{self.work / f'budget-{uuid.uuid4().hex[:12]}.db'}"

    def _child(self, store: str, run_id: str, **options: Any) -> Any:
        return run_child(
            "claude_agent_flows:support_budget_kill",
            store_url=store,
            run_id=run_id,
            args=[TICKET],
            owner_url=self.owner.url,
            pythonpath=[str(Path(__file__).parent)],
            timeout=90,
            **options,
        )

    def _run(self, crash_at: str | None) -> dict[str, Any]:
        """Start a run (killed at ``crash_at``), resume it in new processes until it stops or
        ends, raise its budget once it stopped, and resume it to its end."""
        self.owner.client.reset()
        store, run_id = self._store(), f"budget-{uuid.uuid4().hex[:12]}"
        ended = self._child(store, run_id, crash_at=crash_at)
        killed, stops, outcomes = ended.killed, 0, [ended.outcome]
        for _ in range(5):
            outcome = outcomes[-1]
            if outcome is not None and outcome["status"] != "stopped":
                break
            if outcome is not None:  # stopped at the budget: a person raises it
                stops += 1
                opened = sp.open_store(store)
                sp.extend_limits(opened, run_id, cost=1.0, by="kill-test")
                opened.close()
            outcomes.append(self._child(store, run_id, resume=True).outcome)
        stats = self.owner.client.stats()
        return {
            "killed": killed,
            "stops": stops,
            "final": outcomes[-1],
            "applied": int(stats["applied"]),
            "duplicates": int(stats["duplicates"]),
        }

    def reference(self) -> dict[str, Any]:
        """The uninterrupted run: stopped at the budget, raised, resumed to its end (once)."""
        if self._reference is None:
            self._reference = self._run(None)
        return self._reference

    def trial(self, crash_at: str | None) -> dict[str, Any]:
        reference = self.reference()
        got = self._run(crash_at)
        problem = None
        if got["final"] != reference["final"] or (got["applied"], got["duplicates"]) != (1, 0):
            problem = f"final {got['final']} (reference {reference['final']}), applied {got['applied']}"
        return {"killed": got["killed"], "problem": problem, "stops": got["stops"]}


def _kill_in_flight(fake: FakeModelServer, turn: int) -> list[bool]:
    """Arm a kill of the process whose request for ``turn`` the fake holds next; the flag
    (true until it fired) disarms it."""
    armed = [True]

    @fake.on_request
    def kill(request: FakeRequest) -> None:
        pid = request.headers.get(PID_HEADER)
        if armed[0] and request.turn == turn and pid is not None:
            armed[0] = False
            os.kill(int(pid), signal.SIGKILL)

    return armed


if __name__ == "__main__":
    kind, work = sys.argv[1], Path(sys.argv[2])
    os.chdir(work)
    if kind == "kill":  # kill <work> <store url or "sqlite"> <spec>...
        url = None if sys.argv[3] == "sqlite" else sys.argv[3]
        print(json.dumps(kill_trials(work, url, sys.argv[4:])))
        sys.exit(0)
    answer = plain(work) if kind == "plain" else twins(work) if kind == "twins" else durable(work, kind)
    print(json.dumps(answer))
