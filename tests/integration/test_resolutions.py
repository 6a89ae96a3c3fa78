"""A person settles a blocked run: mark applied (with the owner's receipt), mark not applied,
or abandon — checked against the state revision, recorded, and harmless to repeat."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import owner_answers
import safepoint as sp
from safepoint.errors import ResolutionRefused, SecretRefused, VerificationFailed
from safepoint.ops.cli import cli
from safepoint.testing import OwnerService, owner_effect
from safepoint.types import EventRecord, ResolutionAction, RunRecord, RunStatus

TESTS = str(Path(__file__).parents[1])


def _blocked_notify(store: sp.Store, owner: OwnerService, name: str) -> RunRecord:
    """A notification whose response was lost: no read path, so the run blocks."""
    effect = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow(name)
    def flow(run: sp.Run) -> Any:
        receipt = run.effect("notify", effect, payload={"to": "ops"})
        return {"sent": receipt["id"]}

    owner.client.set_faults(drop_after_commit=1)
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, flow, run_id="r")
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    return run


def test_mark_applied_carries_the_run_on_from_the_receipt(store_url: str, owner_env: OwnerService) -> None:
    store = sp.open_store(store_url)
    run = _blocked_notify(store, owner_env, "resolve-applied")
    revision = run.recovery_record["state_revision"]
    resolved = sp.resolve(
        store,
        "r",
        "applied",
        revision=revision,
        by="ana",
        receipt={"id": "nt_1"},
        evidence="seen in the provider's log",
    )
    assert (resolved.status, resolved.owner) == (RunStatus.RUNNING, None)
    # repeating the same decision is harmless
    assert (
        sp.resolve(
            store,
            "r",
            "applied",
            revision=revision,
            by="ana",
            receipt={"id": "nt_1"},
            evidence="seen in the provider's log",
        ).state_revision
        == resolved.state_revision
    )
    assert sp.resume(store, "r") == {"sent": "nt_1"}
    assert owner_env.client.stats()["applied"] == 1  # nothing was sent again
    event = [e for e in store.events("r") if e.kind == "run.resolved"]
    assert len(event) == 1
    assert (event[0].worker, event[0].detail["evidence"]) == ("ana", "seen in the provider's log")


def test_mark_not_applied_dispatches_again_under_the_same_key(memory_store: sp.Store) -> None:
    keys: list[str] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        keys.append(str(key))
        if len(keys) == 1:
            raise TimeoutError("no answer")
        return {"id": "tk_1"}

    effect = sp.Effect("ticket", execute=execute)

    @sp.workflow("resolve-not-applied")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", effect, payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    revision = memory_store.get_run("r").recovery_record["state_revision"]
    sp.resolve(memory_store, "r", ResolutionAction.NOT_APPLIED, revision=revision, by="bo")
    assert sp.resume(memory_store, "r") == {"id": "tk_1"}
    assert len(keys) == 2
    assert len(set(keys)) == 1  # never a fresh key


def test_abandon_ends_the_run_cancelled(memory_store: sp.Store, owner_env: OwnerService) -> None:
    run = _blocked_notify(memory_store, owner_env, "resolve-abandon")
    sp.resolve(
        memory_store, "r", "abandon", revision=run.state_revision, by="cy", evidence="customer withdrew"
    )
    ended = memory_store.get_run("r")
    assert ended.status is RunStatus.CANCELLED
    assert ended.error == {"type": "Abandoned", "message": "abandoned by cy: customer withdrew"}
    with pytest.raises(sp.RunCancelled):
        sp.resume(memory_store, "r")


def test_a_decision_on_a_stale_record_is_refused(memory_store: sp.Store, owner_env: OwnerService) -> None:
    run = _blocked_notify(memory_store, owner_env, "resolve-stale")
    with pytest.raises(ResolutionRefused, match="moved on"):
        sp.resolve(memory_store, "r", "abandon", revision=run.state_revision - 1, by="dee")
    with pytest.raises(sp.UsageError, match="receipt"):
        sp.resolve(memory_store, "r", "applied", revision=run.state_revision, by="dee")
    with pytest.raises(SecretRefused):
        sp.resolve(
            memory_store,
            "r",
            "applied",
            revision=run.state_revision,
            by="dee",
            receipt={"id": "nt_1", "api_key": "sk_live_0123456789abcdefXYZ"},
        )
    assert memory_store.get_run("r").status is RunStatus.BLOCKED  # nothing changed
    sp.resolve(memory_store, "r", "abandon", revision=run.state_revision, by="dee")
    with pytest.raises(ResolutionRefused, match="not blocked"):
        sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision + 1, by="eve")


def test_resolve_from_the_command_line(file_store: sp.Store, owner_env: OwnerService) -> None:
    run = _blocked_notify(file_store, owner_env, "resolve-cli")
    url = file_store.url
    runner = CliRunner()
    refused = runner.invoke(
        cli,
        ["--store", url, "resolve", "r", "--applied", "--revision", str(run.state_revision), "--by", "fay"],
    )
    assert refused.exit_code == 1
    assert "receipt" in refused.output
    done = runner.invoke(
        cli,
        [
            "--store",
            url,
            "resolve",
            "r",
            "--applied",
            "--receipt",
            '{"id": "nt_1"}',
            "--revision",
            str(run.state_revision),
            "--by",
            "fay",
            "--evidence",
            "provider log",
        ],
    )
    assert done.exit_code == 0, done.output
    # released: it is "running" in the ledger, but no process holds it until one claims it
    assert "now released (no worker holds it" in done.output
    assert "now running" not in done.output
    resolved = file_store.get_run("r")
    assert (resolved.status, resolved.owner) == (RunStatus.RUNNING, None)


def test_recovery_records_match_the_published_schema(memory_store: sp.Store, owner_env: OwnerService) -> None:
    import jsonschema

    from safepoint import record_schema

    run = _blocked_notify(memory_store, owner_env, "record-schema")
    schema = record_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(run.recovery_record, schema)
    with pytest.raises(jsonschema.ValidationError):  # the schema can say no
        jsonschema.validate({**run.recovery_record, "phase": "improvised"}, schema)


# -- a decision that cannot contradict itself, and asks the owner first ------------------------


@pytest.fixture
def blocked(memory_store: sp.Store, monkeypatch: pytest.MonkeyPatch) -> RunRecord:
    """Run "r" blocked on a ticket whose response was lost and whose owner could not say."""
    monkeypatch.delenv(owner_answers.ANSWER_ENV, raising=False)
    owner_answers.asked.clear()
    owner_answers.sent.clear()
    with pytest.raises(sp.NeedsReconciliation, match="index lags"):
        sp.start(memory_store, owner_answers.flow, run_id="r")
    owner_answers.asked.clear()
    return memory_store.get_run("r")


def resolved_events(store: sp.Store) -> list[EventRecord]:
    return [e for e in store.events("r") if e.kind == "run.resolved"]


@pytest.mark.parametrize(
    "action", [["applied", "not_applied"], "applied,not_applied", None, "maybe", {"not_applied"}]
)
def test_the_api_refuses_a_resolution_that_is_not_exactly_one_decision(
    memory_store: sp.Store, blocked: RunRecord, action: Any
) -> None:
    with pytest.raises(sp.UsageError, match="exactly one of 'applied', 'not_applied', 'abandon'"):
        sp.resolve(memory_store, "r", action, revision=blocked.state_revision, by="ana")
    assert memory_store.get_run("r") == blocked


@pytest.mark.parametrize(
    ("action", "extra"),
    [
        ("applied", {"receipt": {"id": "tk_1"}, "force": True}),
        ("abandon", {"force": True}),
        ("not_applied", {"force": "yes"}),
    ],
)
def test_force_only_goes_with_not_applied(
    memory_store: sp.Store, blocked: RunRecord, action: str, extra: dict[str, Any]
) -> None:
    with pytest.raises(sp.UsageError, match="force"):
        sp.resolve(memory_store, "r", action, revision=blocked.state_revision, by="ana", **extra)
    assert memory_store.get_run("r") == blocked
    assert owner_answers.asked == []


@pytest.mark.parametrize(
    "flags",
    [
        ["--applied", "--not-applied"],
        ["--not-applied", "--abandon"],
        ["--applied", "--abandon", "--receipt", "{}"],
        ["--applied", "--not-applied", "--abandon"],
    ],
)
def test_contradictory_flags_are_a_usage_error_and_change_nothing(
    file_store: sp.Store, owner_env: OwnerService, flags: list[str]
) -> None:
    run = _blocked_notify(file_store, owner_env, "resolve-contradiction")
    result = CliRunner().invoke(
        cli,
        [
            "--store",
            file_store.url,
            "resolve",
            "r",
            *flags,
            "--revision",
            str(run.state_revision),
            "--by",
            "ana",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "contradict each other" in result.stderr
    assert file_store.get_run("r") == run
    assert resolved_events(file_store) == []


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        ([], "say what happened"),
        (["--not-applied", "--receipt", '{"id": "nt_1"}'], "--receipt is the owner's object"),
        (["--applied", "--receipt", '{"id": "nt_1"}', "--force"], "--force only overrides"),
        (["--abandon", "--force"], "--force only overrides"),
    ],
)
def test_flags_that_do_not_fit_the_decision_are_a_usage_error(
    file_store: sp.Store, owner_env: OwnerService, flags: list[str], said: str
) -> None:
    run = _blocked_notify(file_store, owner_env, "resolve-misfit")
    result = CliRunner().invoke(
        cli,
        [
            "--store",
            file_store.url,
            "resolve",
            "r",
            *flags,
            "--revision",
            str(run.state_revision),
            "--by",
            "ana",
        ],
    )
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert file_store.get_run("r") == run


def test_not_applied_says_it_is_sent_again_under_the_same_key(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    run = _blocked_notify(file_store, owner_env, "resolve-says-key")
    key = file_store.load_ledger("r").operations["notify"].effect_key
    result = CliRunner().invoke(
        cli,
        [
            "--store",
            file_store.url,
            "resolve",
            "r",
            "--not-applied",
            "--revision",
            str(run.state_revision),
            "--by",
            "ana",
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"operation 'notify' will be sent again, under the same effect key {key}" in result.stdout
    assert "the owner was not asked: effect 'owner.notifications' has no reconcile function" in (
        result.stdout
    )


def test_an_owner_that_has_the_effect_refuses_not_applied(
    memory_store: sp.Store, blocked: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(owner_answers.ANSWER_ENV, "applied")
    for force in (False, True):  # the owner's "applied" is no doubt to override
        with pytest.raises(ResolutionRefused, match="the owner has it") as refused:
            sp.resolve(
                memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana", force=force
            )
        assert '{"id":"tk_9","title":"t"}' in refused.value.message
        assert """--applied --receipt '{"id":"tk_9","title":"t"}'""" in refused.value.message
    key = memory_store.load_ledger("r").operations["ticket"].effect_key
    assert owner_answers.asked == [key, key]
    assert memory_store.get_run("r") == blocked
    # what the owner has settles it, and nothing is sent again
    sp.resolve(
        memory_store,
        "r",
        "applied",
        revision=blocked.state_revision,
        by="ana",
        receipt={"id": "tk_9", "title": "t"},
    )
    assert sp.resume(memory_store, "r") == {"id": "tk_9", "title": "t"}
    assert len(owner_answers.sent) == 1


def test_a_refusal_carries_the_owners_receipt_and_answer_as_fields_to_mark_it_applied_by(
    memory_store: sp.Store, blocked: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program need not parse the message: ``receipt`` is what the owner holds (redacted as
    recorded), ``owner_answer`` what it said; a refusal the owner had no part in has neither."""
    monkeypatch.setenv(owner_answers.ANSWER_ENV, "applied")
    with pytest.raises(ResolutionRefused) as refused:
        sp.resolve(memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana")
    assert (refused.value.run_id, refused.value.owner_answer) == ("r", "applied")
    assert refused.value.receipt == {"id": "tk_9", "title": "t"}
    sp.resolve(
        memory_store, "r", "applied", revision=blocked.state_revision, by="ana", receipt=refused.value.receipt
    )
    assert sp.resume(memory_store, "r") == {"id": "tk_9", "title": "t"}
    monkeypatch.setenv(owner_answers.ANSWER_ENV, "unknown")
    with pytest.raises(ResolutionRefused, match="not blocked") as moved:
        sp.resolve(memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana")
    assert (moved.value.receipt, moved.value.owner_answer) == (None, None)


@pytest.mark.parametrize(
    ("answer", "doubt"),
    [
        ("unknown", "the owner could not say: the owner's index lags"),
        ("raise", "reconcile raised ConnectionError: the owner is down"),
    ],
)
def test_an_owner_that_cannot_say_refuses_not_applied_unless_forced(
    memory_store: sp.Store, blocked: RunRecord, monkeypatch: pytest.MonkeyPatch, answer: str, doubt: str
) -> None:
    monkeypatch.setenv(owner_answers.ANSWER_ENV, answer)
    with pytest.raises(ResolutionRefused, match="--force") as refused:
        sp.resolve(memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana")
    assert doubt in refused.value.message
    assert memory_store.get_run("r") == blocked
    sp.resolve(
        memory_store,
        "r",
        "not_applied",
        revision=blocked.state_revision,
        by="ana",
        force=True,
        evidence="the owner's support confirmed by phone",
    )
    [event] = resolved_events(memory_store)
    check = event.detail["owner_check"]
    assert (check["asked"], check["answer"], check["forced"]) == (True, "unknown", True)
    assert doubt in check["note"]
    assert sp.resume(memory_store, "r") == {"id": "tk_1"}
    assert len(set(owner_answers.sent)) == 1  # sent again under the same key


def test_an_owner_that_says_not_applied_lets_it_go_ahead_once(
    memory_store: sp.Store, blocked: RunRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(owner_answers.ANSWER_ENV, "not_applied")
    first = sp.resolve(memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana")
    again = sp.resolve(
        memory_store, "r", "not_applied", revision=blocked.state_revision, by="ana"
    )  # repeating it is harmless, and asks nobody again
    assert again.state_revision == first.state_revision
    assert len(owner_answers.asked) == 1
    [event] = resolved_events(memory_store)
    assert event.detail["owner_check"] == {
        "asked": True,
        "answer": "not_applied",
        "forced": False,
        "not_asked": None,
        "note": "the owner was asked and reports it not applied",
    }


def test_a_not_found_past_the_owners_retention_is_doubt(memory_store: sp.Store) -> None:
    sent: list[str] = []
    forgetful = sp.Effect(
        "resolve-test.forgetful",
        execute=lambda p, k: sent.append(str(k)) or (_ for _ in ()).throw(TimeoutError("lost")),
        reconcile=lambda key: sp.Unknown("not yet") if len(sent) < 2 else sp.NotApplied(),
        dedup_retention=timedelta(milliseconds=1),
    )

    @sp.workflow("resolve-forgetful")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", forgetful, payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    sent.append("now the owner answers NotApplied")
    run = memory_store.get_run("r")
    with pytest.raises(ResolutionRefused, match="past the owner's dedup retention"):
        sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana")
    sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana", force=True)


def test_effects_of_one_name_with_different_owners_are_not_guessed_between(memory_store: sp.Store) -> None:
    def lost(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("lost")

    first = sp.Effect("resolve-test.twin", execute=lost, reconcile=lambda key: sp.Unknown())
    second = sp.Effect("resolve-test.twin", execute=lost, reconcile=lambda key: sp.NotApplied())

    @sp.workflow("resolve-twins")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", first, payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    run = memory_store.get_run("r")
    with pytest.raises(ResolutionRefused, match="different reconcile functions"):
        sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana")
    sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana", force=True)
    [event] = resolved_events(memory_store)
    assert (event.detail["owner_check"]["not_asked"], event.detail["owner_check"]["forced"]) == (
        "ambiguous",
        True,
    )
    assert second.name == first.name


def test_an_effect_whose_code_is_not_imported_is_resolved_with_a_plain_warning(
    memory_store: sp.Store,
) -> None:
    def lost(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("lost")

    declared = {"effect": sp.Effect("resolve-test.gone", execute=lost, reconcile=lambda key: sp.Unknown())}

    @sp.workflow("resolve-gone")
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", declared["effect"], payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    declared.clear()  # as in a process that never imported the effect's module
    gc.collect()
    run = memory_store.get_run("r")
    with pytest.warns(
        UserWarning,
        match="the owner was not asked: effect 'resolve-test.gone' is not declared in this process",
    ):
        sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana")
    [event] = resolved_events(memory_store)
    assert event.detail["owner_check"]["not_asked"] == "not_imported"


def test_an_async_reconcile_is_asked_from_inside_an_event_loop_too(memory_store: sp.Store) -> None:
    answers = [sp.Unknown("not yet"), sp.NotApplied()]

    async def lost(payload: Any, key: sp.EffectKey) -> Any:
        raise TimeoutError("lost")

    async def ask(key: sp.EffectKey) -> Any:
        await asyncio.sleep(0)
        return answers.pop(0)

    effect = sp.Effect("resolve-test.async", execute=lost, reconcile=ask, dedup_retention=timedelta(hours=1))

    @sp.workflow("resolve-async")
    async def flow(run: sp.AsyncRun) -> Any:
        return await run.effect("ticket", effect, payload={"title": "t"})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    run = memory_store.get_run("r")

    async def operator() -> RunRecord:
        return sp.resolve(memory_store, "r", "not_applied", revision=run.state_revision, by="ana")

    assert asyncio.run(operator()).status is RunStatus.RUNNING
    assert answers == []
    [event] = resolved_events(memory_store)
    assert event.detail["owner_check"]["answer"] == "not_applied"


def resolve_process(
    url: str, revision: int, *extra: str, answer: str = "applied"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(
        {
            owner_answers.ANSWER_ENV: answer,
            "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, env.get("PYTHONPATH")])),
        }
    )
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "safepoint",
            "--store",
            url,
            "resolve",
            "r",
            "--not-applied",
            "--revision",
            str(revision),
            "--by",
            "ana",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_command_line_asks_the_owner_of_an_imported_effect(
    store: sp.Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(owner_answers.ANSWER_ENV, raising=False)
    owner_answers.sent.clear()
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, owner_answers.flow, run_id="r")
    revision = store.get_run("r").state_revision
    refused = resolve_process(store_url, revision, "--import", "owner_answers")
    assert refused.returncode == 1, refused.stderr
    assert "the owner has it" in refused.stderr
    assert """--applied --receipt '{"id":"tk_9","title":"t"}'""" in refused.stderr
    assert store.get_run("r").status is RunStatus.BLOCKED
    unknown = resolve_process(store_url, revision, "--import", "owner_answers", answer="unknown")
    assert unknown.returncode == 1
    assert "the owner could not say" in unknown.stderr
    assert "--force" in unknown.stderr
    # without the effect's code, nobody can ask its owner: said plainly, and recorded
    unasked = resolve_process(store_url, revision)
    assert unasked.returncode == 0, unasked.stderr
    key = store.load_ledger("r").operations["ticket"].effect_key
    assert f"will be sent again, under the same effect key {key}" in unasked.stdout
    assert (
        "the owner was not asked: effect 'owner-answers.ticket' is not declared in this"
        " process" in unasked.stdout
    )
    [event] = [e for e in store.events("r") if e.kind == "run.resolved"]
    assert event.detail["owner_check"]["not_asked"] == "not_imported"


def test_the_dashboard_asks_the_owner_of_an_imported_effect(
    store: sp.Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`safepoint dashboard --import MODULE` declares the effects as `resolve --import` does,
    so that a "not applied" from the board asks the owner first — and is refused when the
    owner has it."""
    import json
    import urllib.error
    import urllib.request

    monkeypatch.delenv(owner_answers.ANSWER_ENV, raising=False)
    owner_answers.sent.clear()
    with pytest.raises(sp.NeedsReconciliation):
        sp.start(store, owner_answers.flow, run_id="r")
    blocked = store.get_run("r")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    env.update(
        {
            owner_answers.ANSWER_ENV: "applied",
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [TESTS, env.get("PYTHONPATH")])),
        }
    )
    board = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "safepoint",
            "--store",
            store_url,
            "dashboard",
            "--port",
            "0",
            "--token",
            "t0ken-of-the-board",
            "--import",
            "owner_answers",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert board.stdout is not None
        line = board.stdout.readline()
        assert " on http://" in line, board.communicate(timeout=30)
        url = line.split(" on ", 1)[1].split()[0]
        request = urllib.request.Request(
            f"{url}/runs/r/resolve",
            method="POST",
            data=json.dumps(
                {"action": "not_applied", "revision": blocked.state_revision, "by": "ana"}
            ).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer t0ken-of-the-board"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert refused.value.code == 409
        assert "the owner has it" in refused.value.read().decode()
    finally:
        board.terminate()
        board.wait(timeout=30)
    assert store.get_run("r") == blocked
    assert owner_answers.sent == [store.load_ledger("r").operations["ticket"].effect_key]


def test_an_applied_operation_cannot_be_marked_not_applied(memory_store: sp.Store) -> None:
    sent: list[str] = []
    effect = sp.Effect(
        "charge", execute=lambda p, k: sent.append(str(k)) or {"id": "ch_1"}, verify=lambda receipt: False
    )

    @sp.workflow("verify-then-resolve")
    def flow(run: sp.Run) -> Any:
        return run.effect("charge", effect, payload={"amount": 5})

    with pytest.raises(VerificationFailed):
        sp.start(memory_store, flow, run_id="r")
    revision = memory_store.get_run("r").state_revision
    with pytest.raises(ResolutionRefused):
        sp.resolve(memory_store, "r", "not_applied", revision=revision, by="ana")
    with pytest.raises(sp.UsageError, match="receipt"):
        sp.resolve(memory_store, "r", "not_applied", revision=revision, by="ana", receipt={"id": "ch_1"})
    sp.resolve(memory_store, "r", "applied", revision=revision, by="ana", receipt={"id": "ch_1"})
    assert sp.resume(memory_store, "r") == {"id": "ch_1"}
    assert len(sent) == 1


def test_resolving_and_resuming_a_blocked_run_spends_no_resume_budget(memory_store: sp.Store) -> None:
    attempts: list[int] = []

    def execute(payload: Any, key: sp.EffectKey) -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise TimeoutError("no answer")
        return {"id": "tk_1"}

    effect = sp.Effect("ticket", execute=execute)

    @sp.workflow("budget-and-resolve", resume_budget=1)
    def flow(run: sp.Run) -> Any:
        return run.effect("ticket", effect, payload={})

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(memory_store, flow, run_id="r")
    with pytest.raises(sp.NeedsReconciliation):
        sp.resume(memory_store, "r")  # still blocked: a resume of a blocked run is no takeover
    revision = memory_store.get_run("r").state_revision
    sp.resolve(memory_store, "r", "not_applied", revision=revision, by="bo")
    assert sp.resume(memory_store, "r") == {"id": "tk_1"}
    assert memory_store.get_run("r").resume_count == 0


def test_the_error_a_block_raises_carries_the_record_as_stored(
    store_url: str, owner_env: OwnerService
) -> None:
    """The recovery record on the raised ``NeedsReconciliation`` names the state revision the block
    created, as the stored one does, so that a person can resolve straight from the error."""
    store = sp.open_store(store_url)
    effect = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow("resolve-from-the-error")
    def flow(run: sp.Run) -> Any:
        return run.effect("notify", effect, payload={"to": "ops"})["id"]

    owner_env.client.set_faults(drop_after_commit=1)
    with pytest.raises(sp.NeedsReconciliation) as blocked:
        sp.start(store, flow, run_id="r")
    stored = store.get_run("r").recovery_record
    assert blocked.value.record == stored
    assert isinstance(blocked.value.record["state_revision"], int)
    resolved = sp.resolve(
        store,
        "r",
        "applied",
        revision=blocked.value.record["state_revision"],
        by="ana",
        receipt={"id": "nt_1"},
        evidence="seen in the provider's log",
    )
    assert resolved.status is RunStatus.RUNNING


def test_an_async_block_raises_the_record_as_stored(store_url: str, owner_env: OwnerService) -> None:
    """The same through the async driver: an async store on PostgreSQL, the sync one on SQLite."""
    effect = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow("resolve-from-the-async-error")
    async def flow(run: sp.AsyncRun) -> Any:
        return (await run.effect("notify", effect, payload={"to": "ops"}))["id"]

    async def main() -> None:
        owner_env.client.set_faults(drop_after_commit=1)
        if store_url.startswith("postgresql"):
            store = await sp.open_async_store(store_url)
            with pytest.raises(sp.NeedsReconciliation) as blocked:
                await sp.start_async(store, flow, run_id="r")
            record = (await store.get_run("r")).recovery_record
            await store.close()
        else:
            sync_store = sp.open_store(store_url)
            with pytest.raises(sp.NeedsReconciliation) as blocked:
                await sp.start_async(sync_store, flow, run_id="r")
            record = sync_store.get_run("r").recovery_record
        assert blocked.value.record == record
        assert isinstance(record["state_revision"], int)

    asyncio.run(main())
