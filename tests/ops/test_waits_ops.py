"""Waits through the command line: `safepoint send` and `safepoint answer`, a second release of
a wait refused (exit code 5), and what `show`, `runs`, `record` and `resume` say about a run
waiting for a message or sleeping (the dashboard's forms are tested with the dashboard, in
test_dashboard)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import safepoint as sp
from safepoint.ops.cli import cli
from safepoint.types import RunStatus

_PLAIN_ENV: dict[str, str | None] = {"FORCE_COLOR": None, "TTY_COMPATIBLE": None, "SAFEPOINT_URL": None}


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(
        cli, ["--store", url, *args], env={**_PLAIN_ENV, "COLUMNS": "200"}, catch_exceptions=False
    )


@sp.workflow("ops-waits-answer")
def answer(run: sp.Run) -> Any:
    return {"said": run.wait_for("manager.answer", timeout=3600)}


@sp.workflow("ops-waits-approve")
def refund(run: sp.Run) -> Any:
    return run.effect(
        "refund",
        sp.Effect("ops.refund", execute=lambda payload, key: {"id": "re_1"}),
        payload={"n": 1},
        approval=True,
    )


@sp.workflow("ops-waits-sleep")
def nap(run: sp.Run) -> str:
    run.sleep(3600)
    return "rested"


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


def _waiting(url: str, run_id: str = "w") -> sp.Store:
    store = sp.open_store(url)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, answer, run_id=run_id)
    return store


def test_send_delivers_a_message_and_show_tells_what_the_run_waits_for(url: str) -> None:
    store = _waiting(url)
    shown = invoke(url, "show", "w").stdout
    assert "waiting for a message" in shown
    assert "waits for message 'manager.answer'" in shown
    assert "times out" in shown
    assert "safepoint answer w manager.answer --wait manager.answer --payload" in shown
    listed = invoke(url, "runs").stdout
    assert "message 'manager.answer', times out" in listed
    record = invoke(url, "record", "w")
    assert record.exit_code == 1
    assert "it waits for message 'manager.answer'" in record.stderr
    resumed = invoke(url, "resume", "w")
    assert resumed.exit_code == 4  # waiting, as for an approval
    assert "waits for message 'manager.answer'" in resumed.stderr
    sent = invoke(
        url, "send", "w", "manager.answer", "--payload", '{"ok": true}', "--by", "ana", "--message-id", "m-1"
    )
    assert sent.exit_code == 0, sent.output
    assert "it is runnable" in sent.stdout
    assert store.get_run("w").status is RunStatus.PENDING
    again = invoke(url, "send", "w", "manager.answer", "--payload", '{"ok": true}', "--message-id", "m-1")
    assert again.exit_code == 0  # a re-delivery: the same message, kept once
    assert len(store.messages("w")) == 1
    assert sp.resume(store, "w") == {"said": {"ok": True}}
    shown = invoke(url, "show", "w").stdout
    assert "messages" in shown
    assert "taken by step manager.answer" in shown
    document = json.loads(invoke(url, "show", "w", "--json").stdout)
    assert [(m["name"], m["taken_by"], m["payload"]) for m in document["messages"]] == [
        ("manager.answer", "manager.answer", {"ok": True})
    ]


def test_send_refuses_what_is_not_json_or_holds_a_credential_or_goes_to_an_ended_run(url: str) -> None:
    store = _waiting(url)
    bad = invoke(url, "send", "w", "manager.answer", "--payload", "{not json")
    assert bad.exit_code == 2
    assert "not JSON" in bad.output
    secret = invoke(
        url, "send", "w", "manager.answer", "--payload", '{"k": "sk_live_a1B2c3D4e5F6g7H8i9J0k1L2"}'
    )
    assert secret.exit_code == 1
    assert "looks like a credential" in secret.stderr
    assert "sk_live" not in secret.stderr
    assert store.messages("w") == []
    sp.cancel(store, "w", by="ana")
    ended = invoke(url, "send", "w", "manager.answer", "--payload", "1")
    assert ended.exit_code == 1
    assert "has ended (cancelled)" in ended.stderr
    missing = invoke(url, "send", "nope", "manager.answer", "--payload", "1")
    assert missing.exit_code == 1
    assert "no run 'nope'" in missing.stderr


def test_show_and_runs_tell_a_sleeping_run(url: str) -> None:
    store = sp.open_store(url)
    with pytest.raises(sp.errors.Sleeping):
        sp.start(store, nap, run_id="z")
    shown = invoke(url, "show", "z").stdout
    assert "sleeping" in shown
    assert "step sleep sleeps until" in shown
    assert "sleep until" in invoke(url, "runs").stdout
    resumed = invoke(url, "resume", "z")
    assert resumed.exit_code == 4
    assert "sleeps (step 'sleep') until" in resumed.stderr
    store.request_cancel("z", "tests")  # not left due in an hour for anything else to see


def test_answer_answers_the_parked_wait_once_and_a_second_answer_exits_5_naming_it(url: str) -> None:
    store = _waiting(url)
    shown = invoke(url, "show", "w").stdout
    assert "safepoint answer w manager.answer --wait manager.answer --payload" in shown
    first = invoke(url, "answer", "w", "manager.answer", "--payload", '{"ok": true}', "--by", "ana")
    assert first.exit_code == 0, first.output
    assert "answers wait manager.answer" in first.stdout
    assert "it is runnable" in first.stdout
    second = invoke(url, "answer", "w", "manager.answer", "--payload", '{"ok": false}', "--by", "bo")
    assert second.exit_code == 5, second.output
    assert "wait 'manager.answer' was answered already by ana" in second.stderr
    assert "nothing was kept" in second.stderr
    assert [m.payload for m in store.messages("w")] == [{"ok": True}]
    assert sp.resume(store, "w") == {"said": {"ok": True}}
    late = invoke(url, "answer", "w", "manager.answer", "--payload", "1")
    assert late.exit_code == 1  # the run has ended: refused as a message to it is
    assert "has ended" in late.stderr


def test_a_second_approval_of_a_gate_exits_5_naming_the_one_in_force(url: str) -> None:
    store = sp.open_store(url)
    with pytest.raises(sp.AwaitingApproval):
        sp.start(store, refund, run_id="g")
    first = invoke(url, "approve", "g", "refund", "--by", "ana")
    assert first.exit_code == 0, first.output
    second = invoke(url, "approve", "g", "refund", "--by", "bo")
    assert second.exit_code == 5, second.output
    assert "approved already, by ana" in second.stderr
    assert "safepoint revoke g refund" in second.stderr
    assert [a.approved_by for a in store.approvals("g")] == ["ana"]
