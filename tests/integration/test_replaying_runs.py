"""Replaying recorded runs against changed code, offline, on every store: an unchanged
workflow replays to the run's end (or to where it is), a changed one is reported at the step
where it parts from the record — with what a resume would do there — and nothing is carried
out: no step function called, no effect sent, nothing written."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

import safepoint as sp
from safepoint.testing import OwnerService, owner_effect
from safepoint.testing.replay import check_deploy, replay
from safepoint.types import StepKind

Calls = dict[str, int]


def _name() -> str:
    return f"replayed-{uuid.uuid4().hex[:8]}"


def _counting(calls: Calls, name: str, value: Any) -> Callable[..., Any]:
    def step(*args: Any) -> Any:
        calls[name] = calls.get(name, 0) + 1
        return value

    step.__qualname__ = name
    return step


def _order_flow(name: str, calls: Calls, *, variant: str = "as recorded", version: str = "1") -> sp.Workflow:
    """A read, a model-like decision, an effect, a pure step, a value, then a wait — changed
    as ``variant`` says."""
    tickets = owner_effect("tickets")
    lookup = _counting(calls, "lookup", {"sku": "A", "stock": 3})
    plan = _counting(calls, "plan", {"next_step_id": "ship"})
    audit = _counting(calls, "audit", "ok")

    @sp.workflow(name, version=version)
    def order(run: sp.Run, order_id: str) -> dict[str, Any]:
        if variant == "added":
            run.read("audit", audit, order_id)
        if variant == "swapped":
            decided = run.decide("plan", plan, order_id)
            found = run.read("lookup", lookup, order_id)
        else:
            found = run.read("lookup", lookup, order_id)
            asked = order_id if variant != "prompt edited" else order_id + " (be brief)"
            decided = (
                run.decide("plan", plan, asked) if variant != "renamed" else run.decide("plan", audit, asked)
            )
        total = run.pure("total", lambda f: f["stock"] * 2, found)
        if variant != "left out":
            run.effect("ship", tickets, payload={"order": order_id, "total": total})
        stamp = run.uuid("stamp")
        word = run.wait_for("confirm")
        return {"decided": decided, "total": total, "stamp": stamp, "word": word}

    return order


def _recorded(store: sp.Store, owner: OwnerService, name: str, calls: Calls) -> str:
    """One run of the workflow as recorded: waiting for "confirm", then confirmed."""
    flow = _order_flow(name, calls)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, flow, "o-1", run_id=run_id)
    sp.send(store, run_id, "confirm", {"by": "ana"}, by="ana")
    sp.resume(store, run_id)
    return run_id


def _untouched(store: sp.Store, owner: OwnerService, run_id: str, calls: Calls) -> Callable[[], None]:
    """A check that nothing was carried out or written since this moment."""
    applied = owner.client.stats()["applied"]
    before, events = dict(calls), len(store.events(run_id))
    ledger = store.load_ledger(run_id)

    def check() -> None:
        assert calls == before, "a step function was called during the replay"
        assert owner.client.stats()["applied"] == applied, "an effect reached its owner"
        assert len(store.events(run_id)) == events
        assert store.load_ledger(run_id) == ledger

    return check


def test_an_unchanged_workflow_replays_to_the_end_and_carries_out_nothing(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    untouched = _untouched(store, owner_env, run_id, calls)
    report = replay(store, run_id)
    untouched()
    assert report.ok, report
    assert report.reached.value == "end"
    assert report.resume.value == "carry on"
    assert report.replayed == report.recorded == len(store.load_ledger(run_id).steps)
    assert report.result == store.get_run(run_id).result


def test_a_run_still_waiting_replays_to_where_it_is(store: sp.Store, owner_env: OwnerService) -> None:
    calls: Calls = {}
    flow = _order_flow(_name(), calls)
    with pytest.raises(sp.AwaitingMessage):
        sp.start(store, flow, "o-2", run_id="waiting")
    untouched = _untouched(store, owner_env, "waiting", calls)
    report = replay(store, "waiting", flow)
    untouched()
    assert report.ok, report
    assert report.reached.value == "now"
    assert report.next is not None
    assert report.next.kind is StepKind.WAIT
    assert report.next.step_id == "confirm"


@pytest.mark.parametrize(
    ("variant", "kind", "step_id", "resume"),
    [
        ("prompt edited", "changed", "plan", "block"),
        ("renamed", "mismatch", "plan", "block"),
        ("swapped", "order", "plan", "carry on"),
        ("added", "added", "audit", "carry on"),
        ("left out", "order", "stamp", "carry on"),
    ],
)
def test_a_changed_workflow_is_reported_at_the_step_where_it_parts(
    store: sp.Store, owner_env: OwnerService, variant: str, kind: str, step_id: str, resume: str
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    sp.testing.forget_workflows(name)
    changed = _order_flow(name, calls, variant=variant)
    untouched = _untouched(store, owner_env, run_id, calls)
    report = replay(store, run_id, changed)
    untouched()
    assert not report.ok
    assert report.reached.value == "diverged"
    assert report.divergence is not None
    assert (report.divergence.kind, report.divergence.step_id) == (kind, step_id), report.divergence
    assert report.resume.value == resume, report.why


def test_a_version_bump_is_reported_with_the_rule_a_resume_applies(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    run_id = _recorded(store, owner_env, name, calls)
    sp.testing.forget_workflows(name)
    report = replay(store, run_id, _order_flow(name, calls, version="2"))
    assert report.ok  # the same steps, in the same order
    assert report.changes == ("version '1' became '2'",)
    assert report.resume.value == "block"
    assert "incompatible_workflow" in report.why


def test_check_deploy_says_what_a_deploy_does_to_every_run_it_takes_over(
    store: sp.Store, owner_env: OwnerService
) -> None:
    calls: Calls = {}
    name = _name()
    flow = _order_flow(name, calls)
    for i in range(3):
        with pytest.raises(sp.AwaitingMessage):
            sp.start(store, flow, f"o-{i}", run_id=f"deploy-{i}")
    assert check_deploy(store, workflows=[name]).ok
    sp.testing.forget_workflows(name)
    _order_flow(name, calls, variant="prompt edited")
    check = check_deploy(store, workflows=[name])
    assert not check.ok
    assert [r.resume.value for r in check.reports] == ["block"] * 3
    assert check.summary() == "3 runs, 3 block, 3 diverged"
