"""The Claude Agent SDK on the ledger, with the real Claude Code CLI against the loopback fake.

The CLI, the fake model server and the ledger run in a child process inside a network namespace
with only loopback (``unshare -n``, as root, ``ip link set lo up``): the CLI can reach nothing
but the fake. Each CLI run takes seconds, so these tests make four."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import pytest

import safepoint as sp
from safepoint.integrations import claude_agent as spc
from safepoint.integrations.tools import Tools
from safepoint.testing import SimulatedCrash

# Each test drives the Claude Code CLI, a process of its own (seconds each): the slow tier.
pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]


def _loopback_only_namespace() -> str | None:
    """Why a network namespace with only loopback cannot be made here (None: it can)."""
    try:
        made = subprocess.run(
            ["unshare", "-n", "true"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not usable here ({exc})"
    return None if made.returncode == 0 else f"unshare -n failed: {made.stderr.strip()} (it needs root)"


_NO_NAMESPACE = _loopback_only_namespace()
if _NO_NAMESPACE is not None:  # the CLI must reach nothing but the fake: never run it on the network
    if os.environ.get("CI"):
        raise RuntimeError(f"{_NO_NAMESPACE}; CI is set, so this is a failure, not a skip")
    print(f"\nskipping the Claude Code CLI tests: {_NO_NAMESPACE}")
    pytest.skip(_NO_NAMESPACE, allow_module_level=True)


def in_loopback_namespace(kind: str, work: Path) -> dict[str, Any]:
    """Run ``claude_agent_flows.py kind work`` inside ``unshare -n`` and return its JSON line."""
    command = (
        f'ip link set lo up && exec "{sys.executable}" "{TESTS / "claude_agent_flows.py"}" {kind} "{work}"'
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c", command],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_plain_sdk_runs_the_tool_at_a_budget_stop_and_its_resume_calls_the_outcome_unknown(
    tmp_path: Path,
) -> None:
    seen = in_loopback_namespace("plain", tmp_path)
    assert seen["subtypes"] == ["error_max_budget_usd", "success"]
    assert seen["tickets"] == 1  # the tool ran before the stop...
    assert seen["unknown"] == [False, True]  # ...and the resumed session is told it is unknown


def test_with_safepoint_the_budget_stop_is_a_resumable_stop_and_the_resume_sees_the_receipt(
    tmp_path: Path,
) -> None:
    first = in_loopback_namespace("start", tmp_path)
    assert first["stopped"] == "BudgetExhausted"
    assert first["status"] == "stopped"
    assert first["tickets"] == 1
    assert first["requests"] == 1

    then = in_loopback_namespace("resume", tmp_path)  # a new process: limit raised, resumed
    assert then["status"] == "completed"
    assert then["result"]["result"] == "Ticket created."
    assert then["tickets"] == 1  # applied once
    assert then["unknown"] == [False]
    assert then["receipt"] == [True]
    assert then["result"]["total_cost_usd"] > then["result"]["cost"] > 0  # cumulative vs this segment


def test_the_session_store_records_entries_once_by_uuid_and_gives_a_lost_result_from_the_ledger(
    file_store: sp.Store,
) -> None:
    tools = Tools()
    made: list[str] = []

    @tools.effect(key_fields=("title",))
    def create_ticket(title: str, key: sp.EffectKey) -> dict[str, str]:
        """Create a support ticket."""
        made.append(str(key))
        return {"id": "T-1"}

    key = {"project_key": "p", "session_id": "s-1"}
    use = {
        "uuid": "a-1",
        "type": "assistant",
        "sessionId": "s-1",
        "message": {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "mcp__tools__create_ticket",
                    "input": {"title": "x"},
                }
            ],
        },
    }

    @sp.workflow("claude-store")
    async def flow(run: sp.AsyncRun) -> Any:
        _, session = spc.options(run, tools=tools)
        await session.answer("create_ticket", {"title": "x"}, call_id="toolu_1")  # the CLI ran it
        await session.store.append(key, [{"uuid": "u-1", "type": "user"}, use])
        await session.store.append(key, [use])  # a retried batch: recorded once
        return await session.store.load(key)

    entries = asyncio.run(sp.start_async(file_store, flow, run_id="c-1"))
    assert [e["uuid"] for e in entries][:2] == ["u-1", "a-1"]
    result = entries[2]["message"]["content"][0]
    assert result["tool_use_id"] == "toolu_1"
    assert result["content"][0]["text"] == '{"id":"T-1"}'
    assert entries[2]["parentUuid"] == "a-1"
    assert len(made) == 1
    steps = list(file_store.load_ledger("c-1").steps)
    assert steps.count("tool.toolu_1") == 1
    assert sum(s.startswith("claude.session.") for s in steps) == 2  # the end marker and one batch


def test_what_the_cli_writes_into_its_transcript_is_recorded_redacted_never_refused(
    file_store: sp.Store, crash_at: Any
) -> None:
    """The CLI decides what its entries hold (a release began writing ``"credential": "key"``):
    a batch holding a credential's name or a key itself is recorded with it redacted, the
    same on the first run and on every resume, and the rest of the entry as it was. So are
    the arguments the model chose for a call (``claude.intents``)."""
    key = {"project_key": "p", "session_id": "s-1"}
    leaked = "sk-ant-api03-" + "x7Kq2" * 16
    entry = {
        "uuid": "u-1",
        "type": "user",
        "credential": "key",  # the kind of credential the CLI's request used
        "apiKey": leaked,
        "message": {"role": "user", "content": [{"type": "text", "text": f"my key is {leaked}"}]},
    }
    hook_input: Any = {"tool_name": "mcp__tools__lookup", "tool_input": {"password": "hunter2-x"}}
    tools = Tools()

    @tools.read()
    def lookup(password: str) -> str:
        """Look a customer up."""
        return "found"

    @sp.workflow("claude-redacted")
    async def flow(run: sp.AsyncRun) -> Any:
        _, session = spc.options(run, tools=tools)
        await session.read_allowed()
        await session.store.append(key, [entry])
        assert await session.pre_tool_use(hook_input, "toolu_1", cast(Any, None)) == {}
        loaded = await session.store.load(key)
        await run.read("after", lambda: None)  # a crash here: the resume replays both
        return {"loaded": loaded[0], "allowed": {k: list(v) for k, v in session.allowed.items()}}

    crash_at("step.before_record:after")
    with pytest.raises(SimulatedCrash):
        asyncio.run(sp.start_async(file_store, flow, run_id="r-1", lease_ms=0))
    crash_at(None)
    first = file_store.load_ledger("r-1")
    resumed = asyncio.run(sp.resume_async(file_store, "r-1"))
    recorded = resumed["loaded"]
    assert (recorded["uuid"], recorded["type"]) == ("u-1", "user")
    assert recorded["credential"].startswith("sp_redacted:sha256:")
    assert recorded["apiKey"].startswith("sp_redacted:sha256:")
    text = recorded["message"]["content"][0]["text"]
    assert text.startswith("my key is sp_redacted:sha256:")
    assert leaked not in text
    (tool, arguments) = resumed["allowed"]["toolu_1"]
    assert tool == "lookup"
    assert arguments["password"].startswith("sp_redacted:sha256:")
    assert "hunter2" not in json.dumps([s.result for s in first.steps.values()])


def test_a_call_the_transcript_lost_is_put_back_after_its_last_entry_with_its_receipt(
    file_store: sp.Store,
) -> None:
    from safepoint.testing import SimulatedCrash, crash_at

    tools = Tools()
    made: list[str] = []

    def reconcile(key: sp.EffectKey) -> sp.NotApplied:
        return sp.NotApplied()  # the crash came before the call reached the desk

    @tools.effect(key_fields=("title",), reconcile=reconcile, dedup_retention=timedelta(days=1))
    def create_ticket(title: str, key: sp.EffectKey) -> dict[str, str]:
        """Create a support ticket."""
        made.append(str(key))
        return {"id": "T-1"}

    key = {"project_key": "p", "session_id": "s-1"}
    prompt = {"uuid": "u-1", "type": "user", "sessionId": "s-1", "cwd": "/a"}
    prompt["message"] = {"content": "Refund"}
    hook_input: Any = {"tool_name": "mcp__tools__create_ticket", "tool_input": {"title": "x"}}
    first_process = True

    @sp.workflow("claude-lost")
    async def flow(run: sp.AsyncRun) -> Any:
        _, session = spc.options(run, tools=tools)
        await session.read_allowed()
        # Only the prompt's batch reached the ledger before the hook let the call through.
        await session.store.append(key, [prompt])
        if first_process:  # killed inside the call
            assert await session.pre_tool_use(hook_input, "toolu_1", cast(Any, None)) == {}
            await session.answer("create_ticket", {"title": "x"}, sent="toolu_1")
            if session.halted is not None:  # as spc.query does once the CLI is done
                raise session.halted
        return await session.store.load(key)  # the resumed CLI's transcript

    with crash_at("effect.after_dispatching:tool"), pytest.raises(SimulatedCrash):
        asyncio.run(sp.start_async(file_store, flow, run_id="l-1", lease_ms=0))
    assert made == []
    first_process = False
    entries = asyncio.run(sp.resume_async(file_store, "l-1"))
    assert [e["type"] for e in entries] == ["user", "assistant", "user"]
    call, result = entries[1], entries[2]
    assert call["parentUuid"] == "u-1"
    assert result["parentUuid"] == call["uuid"]
    assert call["sessionId"] == "s-1"
    assert call["cwd"] == "/a"
    assert call["message"]["content"] == [
        {"type": "tool_use", "id": "toolu_1", "name": "mcp__tools__create_ticket", "input": {"title": "x"}}
    ]
    answer = result["message"]["content"][0]
    assert answer["tool_use_id"] == "toolu_1"
    assert answer["content"][0]["text"] == '{"id":"T-1"}'
    assert len(made) == 1  # settled once: reconciled, then dispatched under its key
    assert file_store.load_ledger("l-1").steps["tool.toolu_1"].result == {"id": "T-1"}


def test_a_session_whose_transcript_never_reached_the_ledger_is_started_anew_and_sends_nothing_twice(
    tmp_path: Path,
) -> None:
    """Every batch of the first session's transcript fails to reach the ledger: its CLI keeps
    its transcript on disk, so a resume under the same session id would die "already in use".
    The resume starts a new session instead, and the call the model makes again keeps its
    first id: its receipt comes from the ledger, and the ticket is made once."""
    first = in_loopback_namespace("lost-start", tmp_path)
    assert (first["stopped"], first["tickets"]) == ("BudgetExhausted", 1)
    started = [e["start"] for e in first["sessions"] if e and "start" in e]
    assert len(started) == 1
    assert {"lost": started[0]} in first["sessions"]  # the SDK said a flush failed

    then = in_loopback_namespace("lost-resume", tmp_path)
    assert then["status"] == "completed"
    assert then["result"]["result"] == "Ticket created."
    assert then["tickets"] == 1
    assert then["receipt"][-1] is True  # the model was given the ledger's receipt
    again = [e["start"] for e in then["sessions"] if e and "start" in e]
    assert len(again) == 2
    assert again[0] == started[0] != again[1]


def test_a_call_asked_again_under_a_new_id_is_not_lost() -> None:
    from safepoint.integrations._claude_agent_session import lost_calls

    allowed = {"toolu_1": ("create_ticket", {"title": "x"}), "toolu_2": ("add_note", {"text": "y"})}
    asked_again = {"type": "tool_use", "id": "toolu_9", "input": {"title": "x"}}
    assert lost_calls(allowed, [("create_ticket", asked_again)]) == [("toolu_2", "add_note", {"text": "y"})]
    held = {"type": "tool_use", "id": "toolu_2", "input": {"text": "y"}}
    assert lost_calls(allowed, [("add_note", held), ("create_ticket", asked_again)]) == []
    assert lost_calls(allowed, []) == [
        ("toolu_1", "create_ticket", {"title": "x"}),
        ("toolu_2", "add_note", {"text": "y"}),
    ]


def test_the_clis_turn_limit_is_the_runs_resumable_stop_and_extend_limits_carries_it_on(
    tmp_path: Path,
) -> None:
    first = in_loopback_namespace("turns-start", tmp_path)  # Budget(model_calls=1): max_turns=1
    assert first["stopped"] == "BudgetExhausted"
    assert first["status"] == "stopped"
    assert first["tickets"] == 1  # the CLI ran the tool on its one turn, then stopped
    assert [s.rsplit(".", 1)[0] if s.startswith("tool.") else s for s in first["steps"]] == [
        "claude.intents",  # the end of the calls earlier processes let through: none
        "claude.query",
        "claude.sessions",  # the end of the sessions started before: none
        "claude.sessions#2",  # ...and the one this CLI call starts
        "claude.intent",  # the PreToolUse hook's record of the call
        "claude.intents#2",  # ...and of a call it let through
        "tool",
    ]

    then = in_loopback_namespace("turns-resume", tmp_path)  # extend_limits(model_calls=5), resumed
    assert then["status"] == "completed"
    assert then["result"]["result"] == "Ticket created."
    assert then["tickets"] == 1
    assert then["receipt"] == [True]  # the resumed session got the tool's receipt from the ledger
    assert then["unknown"] == [False]
    # one more CLI call, resuming the session: the session log's walk ends, no new session starts
    assert then["steps"][-2:] == ["claude.query#2", "claude.sessions#3"]


def test_the_example_runs_in_one_command_and_creates_the_ticket_once() -> None:
    example = TESTS.parent / "examples" / "claude_agent_support.py"
    ran = subprocess.run(  # as a reader runs it: it puts itself in a loopback-only namespace
        [sys.executable, str(example)], capture_output=True, text=True, timeout=120, check=False
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
    lines = ran.stdout.splitlines()
    assert lines[0] == "stopped: BudgetExhausted (the CLI spent the run's budget on the ticket's turn)"
    assert "run status: stopped, tickets so far: 1" in lines
    assert "answer: I opened ticket T-1 for the refund of order A1." in lines
    assert (
        "the resumed session saw the ticket's receipt: True, was told its outcome is unknown: False" in lines
    )
    assert "model requests: 2, repeated: 0, orphaned tool calls: 0" in lines
    assert lines[-1] == "tickets created: 1"


def test_the_pre_tool_use_hook_refuses_a_call_an_earlier_process_left_uncertain(file_store: sp.Store) -> None:
    from safepoint.testing import SimulatedCrash, crash_at

    tools = Tools()
    made: list[str] = []

    @tools.effect(key_fields=("title",), reconcile=lambda key: sp.Unknown("the desk cannot say"))
    def create_ticket(title: str, key: sp.EffectKey) -> dict[str, str]:
        """Create a support ticket."""
        made.append(str(key))
        return {"id": "T-1"}

    hook_input: Any = {"hook_event_name": "PreToolUse", "tool_name": "mcp__tools__create_ticket"}
    hook_input["tool_input"] = {"title": "x"}
    seen: list[Any] = []
    model_named = ["toolu_1"]  # the tool_use id the model gives the call, in this process

    @sp.workflow("claude-hook")
    async def flow(run: sp.AsyncRun) -> Any:
        _, session = spc.options(run, tools=tools)
        seen.append(await session.pre_tool_use(hook_input, model_named[0], cast(Any, None)))
        # The CLI runs what the hook allowed: the handler, for the call as the hook saw it.
        answered = await session.answer("create_ticket", {"title": "x"})
        if session.halted is not None:  # as spc.query does once the CLI is done
            raise session.halted
        return answered

    with crash_at("effect.after_dispatching:tool"), pytest.raises(SimulatedCrash):
        asyncio.run(sp.start_async(file_store, flow, run_id="h-1", lease_ms=0))  # dispatched, then lost
    assert seen == [{}]  # the first process's hook let the call through
    assert len(made) == 0  # the crash came after the intent was durable, before the call

    # A new process: the resumed CLI asked the model again, which names the call with a new id.
    model_named[0] = "toolu_2"
    with pytest.raises(sp.NeedsReconciliation):
        asyncio.run(sp.resume_async(file_store, "h-1"))
    denied = seen[1]["hookSpecificOutput"]
    assert denied["permissionDecision"] == "deny"
    assert "create_ticket" in denied["permissionDecisionReason"]  # names the uncertain operation
    assert made == []  # never dispatched again
    steps = list(file_store.load_ledger("h-1").steps)
    assert "tool.toolu_1" not in steps or steps.count("tool.toolu_1") == 1
    assert not any(s.startswith("tool.toolu_2") for s in steps)
    assert file_store.get_run("h-1").status.value == "blocked"


def test_two_alike_calls_of_one_turn_each_get_their_own_step_and_receipt(tmp_path: Path) -> None:
    seen = in_loopback_namespace("twins", tmp_path)
    assert seen["result"] == "Two notes added."
    assert seen["notes"] == 2
    assert len(seen["told"]) == 2
    assert seen["told"] == seen["recorded"]  # each call id: the receipt its own step holds
    assert sorted(r["note"] for r in seen["told"].values()) == ["N-1", "N-2"]


def test_a_call_is_paired_with_its_step_by_the_id_the_cli_sent_not_by_its_arguments(
    file_store: sp.Store,
) -> None:
    tools = Tools()
    made: list[str] = []

    @tools.effect()
    def add_note(text: str, key: sp.EffectKey) -> dict[str, str]:
        """Add a note."""
        made.append(str(key))
        return {"note": f"N-{len(made)}"}

    hook_input: Any = {"hook_event_name": "PreToolUse", "tool_name": "mcp__tools__add_note"}
    hook_input["tool_input"] = {"text": "x"}

    @sp.workflow("claude-pairs")
    async def flow(run: sp.AsyncRun) -> Any:
        _, session = spc.options(run, tools=tools)
        for seen in ("toolu_A", "toolu_B"):  # the hook sees A, then B
            assert await session.pre_tool_use(hook_input, seen, cast(Any, None)) == {}
        # ...and the CLI runs B's handler first: B's step gets the first note.
        first = await session.answer("add_note", {"text": "x"}, sent="toolu_B")
        second = await session.answer("add_note", {"text": "x"}, sent="toolu_A")
        return [first["content"][0]["text"], second["content"][0]["text"]]

    assert asyncio.run(sp.start_async(file_store, flow, run_id="p-1")) == ['{"note":"N-1"}', '{"note":"N-2"}']
    steps = file_store.load_ledger("p-1").steps
    assert steps["tool.toolu_B"].result == {"note": "N-1"}
    assert steps["tool.toolu_A"].result == {"note": "N-2"}


def test_the_pages_diff_says_how_many_lines_it_changes() -> None:
    page = (TESTS.parent / "docs" / "integrations" / "claude-agent.md").read_text()
    diff = page.split("```diff\n", 1)[1].split("\n```", 1)[0].splitlines()
    added = sum(line.startswith("+") for line in diff)
    removed = sum(line.startswith("-") for line in diff)
    assert f"{added + removed} changed lines ({added} added, {removed} removed)" in page
    assert (added, removed) == (12, 8)
