"""A second reading of offline replay (issue 29): for each change and each kind of run, the
replay's report is held to what a real ``resume`` of the run under the same code then does,
and a replay is held to carrying nothing out."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.testing import ReplayReport, replay

Calls = dict[str, int]


def _name() -> str:
    return f"review-{uuid.uuid4().hex[:8]}"


def _counting(calls: Calls, name: str, value: Any = None, *, fail: int = 0) -> Callable[..., Any]:
    def step(*args: Any, **kwargs: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        if calls[name] <= fail:
            raise RuntimeError(f"{name} failed")
        return value

    step.__qualname__ = name
    return step


def _effect(sent: list[str], name: str, *, raises: bool = False) -> sp.Effect:
    def execute(payload: Any, key: Any) -> Any:
        sent.append(name)
        if raises:
            raise RuntimeError("connection reset")
        return {"id": name}

    return sp.Effect(name, execute=execute)


def _frozen(store: sp.Store, run_id: str) -> Callable[[], None]:
    """A check that the run's ledger is as it was at this moment."""
    before = (store.get_run(run_id), store.load_ledger(run_id), len(store.events(run_id)))

    def check() -> None:
        assert (store.get_run(run_id), store.load_ledger(run_id), len(store.events(run_id))) == before

    return check


def _resumed(store: sp.Store, run_id: str) -> str:
    """What a real resume did: the run's status after it."""
    with contextlib.suppress(sp.SafepointError, sp.RunWaiting):
        sp.resume(store, run_id)
    return store.get_run(run_id).status.value


def _verdict(report: ReplayReport) -> str:
    return report.resume.value


# -- an effect added (or renamed) beside an operation the code no longer reaches -------------


def _shipping(name: str, sent: list[str], variant: str, compatibility: str) -> sp.Workflow:
    tickets, notes = _effect(sent, "tickets"), _effect(sent, "notes")

    @sp.workflow(name, compatibility=compatibility)
    def ship(run: sp.Run, order: str) -> Any:
        if variant == "effect added":
            run.effect("note", notes, payload={"o": order})
        run.effect("ship2" if variant == "effect renamed" else "ship", tickets, payload={"o": order})
        return run.wait_for("confirm")

    return ship


@pytest.mark.parametrize("variant", ["effect added", "effect renamed"])
@pytest.mark.parametrize(("compatibility", "real"), [("refuse", "blocked"), ("replan", "completed")])
def test_an_effect_asked_beside_an_accepted_operation_is_reported_as_a_resume_treats_it(
    store: sp.Store, variant: str, compatibility: str, real: str
) -> None:
    """Under ``refuse`` a resume refuses a new operation beside an accepted one the code no
    longer reaches (``_rules.effects.orphaned``); the replay said "carry on" (it counted only
    unsettled operations)."""
    sent: list[str] = []
    name = _name()
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, _shipping(name, sent, "", compatibility), "o-1", run_id="shipped")
    sp.testing.forget_workflows(name)
    changed = _shipping(name, sent, variant, compatibility)
    frozen = _frozen(store, "shipped")
    report = replay(store, "shipped", changed)
    frozen()
    assert sent == ["tickets"]
    assert report.divergence is not None
    assert report.divergence.kind == "added"
    sp.send(store, "shipped", "confirm", {"ok": True}, by="ana")
    assert _resumed(store, "shipped") == real
    assert _verdict(report) == {"blocked": "block", "completed": "carry on"}[real], report.why
    if real == "blocked":
        assert report.divergence.phase == "replay_mismatch"
        assert (store.get_run("shipped").recovery_record or {})["phase"] == "replay_mismatch"


@pytest.mark.parametrize("compatibility", ["refuse", "replan"])
def test_an_effect_step_renamed_while_its_operation_is_open_is_a_divergence_a_resume_blocks_at(
    store: sp.Store, compatibility: str
) -> None:
    """The operation in doubt has no step recorded, so every recorded step is answered and the
    renamed effect stood at the frontier: the replay said "reached now, carry on" (ok), and the
    resume blocked (replay_mismatch)."""
    sent: list[str] = []
    name = _name()
    pay = _effect(sent, "pay", raises=True)

    def flow(step_id: str) -> sp.Workflow:
        @sp.workflow(name, compatibility=compatibility)
        def paying(run: sp.Run, order: str) -> Any:
            return run.effect(step_id, pay, payload={"o": order})

        return paying

    with pytest.raises(sp.RunBlocked):
        sp.start(store, flow("pay"), "o-1", run_id="in-doubt")
    sp.testing.forget_workflows(name)
    renamed = flow("pay2")
    frozen = _frozen(store, "in-doubt")
    report = replay(store, "in-doubt", renamed)
    frozen()
    assert sent == ["pay"]
    assert not report.ok
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.step_id, report.divergence.phase) == (
        "added",
        "pay2",
        "replay_mismatch",
    )
    assert report.divergence.recorded is not None
    assert report.divergence.recorded.operation_id == "pay"
    assert _verdict(report) == "block"
    assert _resumed(store, "in-doubt") == "blocked"
    assert (store.get_run("in-doubt").recovery_record or {})["phase"] == "replay_mismatch"
    assert sent == ["pay"]


# -- runs the code would carry on through but whose state stops them -------------------------


def test_a_run_blocked_on_an_operation_in_doubt_is_not_reported_as_carrying_on(store: sp.Store) -> None:
    sent: list[str] = []
    name = _name()
    pay = _effect(sent, "pay", raises=True)

    @sp.workflow(name)
    def paying(run: sp.Run, order: str) -> Any:
        return run.effect("pay", pay, payload={"o": order})

    with pytest.raises(sp.RunBlocked):
        sp.start(store, paying, "o-1", run_id="doubt")
    report = replay(store, "doubt")
    assert report.ok  # the code is the run's own
    assert _resumed(store, "doubt") == "blocked"
    assert _verdict(report) == "block", report.why


def _stopped_by_attempts(store: sp.Store, calls: Calls) -> str:
    name = _name()

    @sp.workflow(name)
    def flaky(run: sp.Run, x: str) -> Any:
        return run.read("flaky", _counting(calls, "flaky", 1, fail=99), x, retry=2)

    with pytest.raises(sp.LimitReached):
        sp.start(store, flaky, "x", run_id="stopped")
    return "stopped"


def _past_its_deadline(store: sp.Store, calls: Calls) -> str:
    name = _name()

    @sp.workflow(name)
    def late(run: sp.Run, x: str) -> Any:
        run.read("a", _counting(calls, "a", 1), x)
        run.wait_for("go")
        return run.read("b", _counting(calls, "b", 2), x)

    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, late, "x", run_id="late", deadline=timedelta(milliseconds=300))
    time.sleep(0.4)
    sp.send(store, "late", "go", 1, by="ana")
    return "late"


@pytest.mark.parametrize("recorded", [_stopped_by_attempts, _past_its_deadline])
def test_a_run_a_limit_stops_is_not_reported_as_carrying_on(
    store: sp.Store, recorded: Callable[[sp.Store, Calls], str]
) -> None:
    calls: Calls = {}
    run_id = recorded(store, calls)
    before = dict(calls)
    report = replay(store, run_id)
    assert calls == before
    assert _resumed(store, run_id) == "stopped"
    assert _verdict(report) != "carry on", report.why


# -- a replay carries nothing out, and an unchanged run replays ok, for every kind of run ------


def _kinds(calls: Calls, sent: list[str]) -> dict[str, Callable[[sp.Run, str], Any]]:
    def max_age(run: sp.Run, x: str) -> Any:
        value = run.read("observed", _counting(calls, "observed", 1), x, max_age=0.001)
        run.wait_for("go")
        return value

    def approval(run: sp.Run, x: str) -> Any:
        run.read("a", _counting(calls, "a", 1), x)
        return run.effect("pay", _effect(sent, "approved"), payload={"x": x}, approval=True)

    def sleeping(run: sp.Run, x: str) -> Any:
        run.read("a", _counting(calls, "a", 1), x)
        run.sleep(3600)

    def timed_out(run: sp.Run, x: str) -> Any:
        run.read("a", _counting(calls, "a", 1), x)
        try:
            return run.wait_for("never", timeout=0.05)
        except sp.WaitTimedOut:
            run.wait_for("go")
            return "timed out"

    def fanned(run: sp.Run, x: str) -> Any:
        def branch(k: int) -> Callable[[sp.Run], Any]:
            def go(r: sp.Run) -> Any:
                return [r.read(step, _counting(calls, f"{step}{k}", k), k) for step in ("a", "b", "c")]

            return go

        out = run.parallel("fan", {str(k): branch(k) for k in range(5)}, max_threads=2)
        run.wait_for("go")
        return out

    def transaction(run: sp.Run, x: str) -> Any:
        def write(tx: Any, value: int) -> int:
            calls["tx"] = calls.get("tx", 0) + 1
            return value

        value = run.transaction("t", write, 3)
        run.wait_for("go")
        return value

    def caught(run: sp.Run, x: str) -> Any:
        with contextlib.suppress(sp.StepFailed):
            run.read("bad", _counting(calls, "bad", 1, fail=99), x, retry=1)
        run.wait_for("go")
        return 2

    def continued(run: sp.Run, x: str) -> Any:
        n = run.read("n", _counting(calls, "n", 1), x)
        if x == "x":
            run.continue_as_new("y")
        run.wait_for("go")
        return n

    return {
        "max_age": max_age,
        "approval": approval,
        "sleeping": sleeping,
        "timed_out": timed_out,
        "fanned": fanned,
        "transaction": transaction,
        "caught": caught,
        "continued": continued,
    }


@pytest.mark.parametrize(
    "kind",
    ["max_age", "approval", "sleeping", "timed_out", "fanned", "transaction", "caught", "continued"],
)
def test_an_unchanged_run_of_each_kind_replays_ok_and_carries_nothing_out(store: sp.Store, kind: str) -> None:
    calls: Calls = {}
    sent: list[str] = []
    name = _name()
    wf = sp.workflow(name)(_kinds(calls, sent)[kind])
    with pytest.raises(sp.RunWaiting):
        sp.start(store, wf, "x", run_id="k")
    if kind == "timed_out":
        time.sleep(0.1)
        with pytest.raises(sp.RunWaiting):
            sp.resume(store, "k")
    run_ids = ["k", "k~1"] if kind == "continued" else ["k"]
    for run_id in run_ids:
        before, owned = dict(calls), list(sent)
        frozen = _frozen(store, run_id)
        report = replay(store, run_id)
        frozen()
        assert calls == before, "a replay called a step function"
        assert sent == owned, "a replay called an owner"
        assert report.ok, report.divergence
        assert report.resume.value == "carry on", report.why


# -- other defects --------------------------------------------------------------------------


def test_a_live_replay_of_a_run_past_its_deadline_runs_the_rest(store: sp.Store) -> None:
    calls: Calls = {}
    name = _name()

    @sp.workflow(name)
    def summed(run: sp.Run, x: str) -> int:
        return int(run.read("a", _counting(calls, "a", 1), x) + run.read("b", _counting(calls, "b", 2), x))

    assert sp.start(store, summed, "x", run_id="old", deadline=timedelta(milliseconds=200)) == 3
    time.sleep(0.3)
    report = replay(store, "old", summed, live_from="b")
    assert report.error is None, report.error
    assert report.result == 3


def test_a_run_failed_by_a_usage_error_of_its_code_replays_to_its_failure(store: sp.Store) -> None:
    calls: Calls = {}
    name = _name()

    @sp.workflow(name)
    def misused(run: sp.Run, x: str) -> Any:
        run.read("a", _counting(calls, "a", 1), x)
        raise sp.UsageError("the agent code misused a tool")

    with pytest.raises(sp.UsageError):
        sp.start(store, misused, "x", run_id="misused")
    assert store.get_run("misused").status.value == "failed"
    report = replay(store, "misused")
    assert report.ok, report.divergence
    assert report.error is not None
    assert report.error["type"] == "UsageError"
