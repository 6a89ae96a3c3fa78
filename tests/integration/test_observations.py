"""What the world says is recorded as it was said — but for credentials, which are recorded as
their marked digest: a model reply or an observation that quotes an API key does not kill the
run, and the workflow sees the same redacted value on the first run and on every replay. Also
``current_run()``, which lets helpers deep in an agent loop record steps without being handed
the run."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import ReplayMismatch, SecretRefused, UsageError
from safepoint.testing import SimulatedCrash, crash_at

KEY = "sk-ant-api03-" + "Zx9" * 30  # shaped like an Anthropic key


def _ledger_bytes(store: sp.Store) -> bytes:
    path = Path(store.url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_a_model_reply_quoting_a_key_is_recorded_redacted_and_seen_so_on_replay(file_store: sp.Store) -> None:
    seen: list[Any] = []
    calls = {"n": 0}

    def llm(**request: Any) -> dict[str, Any]:
        calls["n"] += 1
        return {"content": [{"type": "text", "text": f"Your key {KEY} was leaked."}], "usage": {}}

    @sp.workflow("quoting-model")
    def flow(run: sp.Run) -> Any:
        reply = run.model("answer", llm, model="m", messages=[{"role": "user", "content": "hi"}])
        seen.append(reply)
        # the next request is built from what the workflow saw: the same on replay
        run.pure("next", len, reply["content"][0]["text"])
        return "done"

    with crash_at("run.before_complete"), pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    assert sp.resume(file_store, "r") == "done"
    assert calls["n"] == 1
    first, replayed = seen
    assert first == replayed
    text = first["content"][0]["text"]
    assert KEY not in text
    assert "sp_redacted:sha256:" in text
    assert text.startswith("Your key ")
    assert KEY.encode() not in _ledger_bytes(file_store)


def test_a_model_step_can_still_refuse_a_credential(memory_store: sp.Store) -> None:
    @sp.workflow("refusing-model")
    def flow(run: sp.Run) -> Any:
        return run.model("answer", lambda **_: {"text": KEY}, model="m", messages=[], secrets="refuse")

    with pytest.raises(SecretRefused):
        sp.start(memory_store, flow, run_id="r")


def test_a_read_opts_into_redaction_and_refuses_by_default(file_store: sp.Store) -> None:
    inbox = {"subject": "rotate", "body": f"the new key is {KEY}"}

    @sp.workflow("redacting-read")
    def flow(run: sp.Run) -> Any:
        return run.read("inbox", lambda: dict(inbox), secrets="redact")

    mail = sp.start(file_store, flow, run_id="r")
    assert KEY not in mail["body"]
    assert "sp_redacted:sha256:" in mail["body"]
    assert sp.resume(file_store, "r") == mail

    @sp.workflow("refusing-read")
    def strict(run: sp.Run) -> Any:
        return run.read("inbox", lambda: dict(inbox))

    with pytest.raises(SecretRefused):
        sp.start(file_store, strict, run_id="r2")


def test_an_unknown_secrets_policy_is_a_usage_error(memory_store: sp.Store) -> None:
    @sp.workflow("bad-policy")
    def flow(run: sp.Run) -> Any:
        return run.read("x", lambda: 1, secrets="ignore")  # type: ignore[arg-type]

    with pytest.raises(UsageError, match="redact"):
        sp.start(memory_store, flow, run_id="r")


def test_a_model_step_records_the_name_it_is_given_and_a_replay_checks_it(memory_store: sp.Store) -> None:
    name = {"value": "anthropic.messages.create"}

    @sp.workflow("named-model")
    def flow(run: sp.Run) -> Any:
        return run.model("m", lambda **_: {"ok": 1}, model="m", messages=[], name=name["value"])

    with crash_at("run.before_complete"), pytest.raises(SimulatedCrash):
        sp.start(memory_store, flow, run_id="r", lease_ms=0)
    assert memory_store.load_ledger("r").steps["m"].name == "anthropic.messages.create"
    name["value"] = "openai.chat.completions.create"
    with pytest.raises(ReplayMismatch):
        sp.resume(memory_store, "r")


# -- current_run ------------------------------------------------------------------------------


def test_current_run_is_the_workflow_run_and_each_branch_run(memory_store: sp.Store) -> None:
    def helper(step_id: str) -> str:
        run = sp.current_run()
        return str(run.pure(step_id, lambda: f"{run.run_id}:{threading.current_thread().name != ''}"))

    @sp.workflow("current-sync")
    def flow(run: sp.Run) -> Any:
        assert sp.current_run() is run
        branches = run.parallel("fan", {"a": lambda b: (sp.current_run() is b, helper("x"))})
        return [helper("top"), branches["a"][0], sp.current_run() is run]

    assert sp.start(memory_store, flow, run_id="r") == ["r:True", True, True]
    assert set(memory_store.load_ledger("r").steps) == {"top", "fan.a/x"}


def test_current_run_in_async_workflows_and_gathered_branches(memory_store: sp.Store) -> None:
    @sp.workflow("current-async")
    async def flow(run: sp.AsyncRun) -> Any:
        async def branch(b: sp.AsyncRun) -> bool:
            await asyncio.sleep(0)
            return sp.current_run() is b

        same = await run.gather("fan", [branch, branch])
        return [sp.current_run() is run, *same]

    assert asyncio.run(sp.start_async(memory_store, flow, run_id="r")) == [True, True, True]


def test_current_run_outside_a_workflow_says_so(memory_store: sp.Store) -> None:
    with pytest.raises(UsageError, match="outside a workflow"):
        sp.current_run()

    @sp.workflow("current-after")
    def flow(run: sp.Run) -> Any:
        return 1

    sp.start(memory_store, flow, run_id="r")
    with pytest.raises(UsageError, match="outside a workflow"):
        sp.current_run()  # the workflow returned: no run is current any more


# -- current_effect_key -----------------------------------------------------------------------


def test_code_an_effect_runs_finds_its_key_without_being_handed_it(memory_store: sp.Store) -> None:
    sent: list[str] = []

    def create_ticket(title: str) -> dict[str, Any]:  # a framework's tool: arguments only
        sent.append(str(sp.current_effect_key()))
        return {"id": "T-1", "title": title}

    tickets = sp.Effect("tickets", execute=lambda payload, key: create_ticket(payload["title"]))

    @sp.workflow("effect-key-sync")
    def flow(run: sp.Run) -> Any:
        receipt = run.effect("ticket", tickets, payload={"title": "refund"})
        return [receipt["id"], str(run.effect("again", tickets, payload={"title": "other"})["id"])]

    sp.start(memory_store, flow, run_id="r")
    # each call saw its own operation's key, in the order they ran (operations are listed by
    # preparation time, which two effects of one millisecond share)
    keys = {op.step_id: op.effect_key for op in memory_store.load_ledger("r").operations.values()}
    assert sent == [keys["ticket"], keys["again"]]
    assert len(set(sent)) == 2
    with pytest.raises(UsageError, match="outside an effect"):
        sp.current_effect_key()


def test_an_async_effect_finds_its_key_while_its_coroutine_runs(memory_store: sp.Store) -> None:
    sent: list[str] = []

    async def execute(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
        await asyncio.sleep(0)
        sent.append(str(sp.current_effect_key()))
        return {"id": "T-1"}

    @sp.workflow("effect-key-async")
    async def flow(run: sp.AsyncRun) -> Any:
        return await run.effect("ticket", sp.Effect("tickets-async", execute=execute), payload={})

    asyncio.run(sp.start_async(memory_store, flow, run_id="r"))
    [op] = memory_store.load_ledger("r").operations.values()
    assert sent == [op.effect_key]
