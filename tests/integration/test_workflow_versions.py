"""Compatibility: a run recorded by other code is refused, or re-planned with its effects kept.

A "deploy" here is re-registering a workflow under the same name with another version,
fingerprint or compatibility policy, then resuming a run the old code left behind (it stopped
at a crash point, lease 0). Every test runs on a SQLite file and on PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import pytest

import safepoint as sp
from safepoint._engine.workflow import registered_versions
from safepoint._rules.compat import changes, fingerprint, manifest_of
from safepoint.errors import IncompatibleWorkflow
from safepoint.testing import OwnerService, SimulatedCrash, forget_workflows, owner_effect
from safepoint.types import EventRecord, RunStatus

TOOLS_V1 = [{"name": "lookup", "input_schema": {"type": "object"}}]
TOOLS_V2 = [{"name": "lookup", "input_schema": {"type": "object", "required": ["id"]}}]


def _stop_before_completion(
    store: sp.Store, wf: sp.Workflow, crash_at: Any, point: str = "run.before_complete", *args: Any
) -> None:
    crash_at(point)
    with pytest.raises(SimulatedCrash):
        sp.start(store, wf, *args, run_id="r", lease_ms=0)
    crash_at(None)


def _events(store: sp.Store, kind: str) -> list[EventRecord]:
    return [event for event in store.events("r") if event.kind == kind]


# -- the fingerprint ------------------------------------------------------------------------------


def test_a_manifest_keeps_digests_of_tools_and_prompts_never_their_text() -> None:
    manifest = manifest_of(
        tools=[
            {"type": "function", "function": {"name": "search", "parameters": {}}},
            {"name": "lookup", "input_schema": {}},
        ],
        models=["m-2", "m-1", "m-2"],
        prompts={"system": "You are a careful agent."},
    )
    assert sorted(manifest["tools"]) == ["lookup", "search"]
    assert manifest["models"] == ["m-1", "m-2"]
    assert "careful" not in str(manifest)
    assert manifest["prompts"]["system"].startswith("sha256:")
    reordered = manifest_of(
        tools=[
            {"name": "lookup", "input_schema": {}},
            {"type": "function", "function": {"name": "search", "parameters": {}}},
        ],
        models=["m-1", "m-2"],
        prompts={"system": "You are a careful agent."},
    )
    assert fingerprint(reordered) == fingerprint(manifest)  # order does not matter
    assert fingerprint(manifest_of(models=["m-1"])) != fingerprint(manifest)


@pytest.mark.parametrize("tools", [[{"input_schema": {}}], "lookup", [{"name": "a"}, {"name": "a"}]])
def test_tools_without_names_or_named_twice_are_refused(tools: Any) -> None:
    with pytest.raises(sp.UsageError, match="tool"):
        manifest_of(tools=tools)


def test_changes_say_which_tool_model_and_prompt_moved() -> None:
    before = manifest_of(tools=TOOLS_V1, models=["m-1"], prompts={"system": "a", "old": "x"})
    after = manifest_of(tools=TOOLS_V2, models=["m-2"], prompts={"system": "b", "new": "y"})
    found = changes("1", before, fingerprint(before), "1", after, fingerprint(after))
    assert found == [
        "tool 'lookup' changed",
        "prompt 'old' was removed",
        "prompt 'new' was added",
        "prompt 'system' changed",
        "model 'm-1' is no longer used",
        "model 'm-2' is now used",
    ]
    assert changes("1", before, fingerprint(before), "1", before, fingerprint(before)) == []
    # a run recorded before fingerprints existed is compared by version only
    assert changes("1", None, None, "1", after, fingerprint(after)) == []
    assert changes("1", None, None, "2", after, fingerprint(after)) == ["version '1' became '2'"]


def test_an_unknown_policy_is_a_usage_error() -> None:
    with pytest.raises(sp.UsageError, match="refuse' or 'replan"):
        sp.workflow("bad-policy", compatibility="maybe")


# -- refuse (the default) -------------------------------------------------------------------------


def test_a_changed_tool_schema_blocks_the_run_and_says_what_changed(store: sp.Store, crash_at: Any) -> None:
    forget_workflows("agent")

    @sp.workflow("agent", version="3", tools=TOOLS_V1, models=["m-1"])
    def old(run: sp.Run) -> int:
        return int(run.pure("one", lambda: 1))

    _stop_before_completion(store, old, crash_at)
    assert store.get_run("r").workflow_fingerprint == old.fingerprint
    forget_workflows("agent")  # the new code, deployed under the same version: a new process

    @sp.workflow("agent", version="3", tools=TOOLS_V2, models=["m-1"])
    def new(run: sp.Run) -> int:
        return int(run.pure("one", lambda: 1))

    with pytest.raises(IncompatibleWorkflow) as refused:
        sp.resume(store, "r")
    assert refused.value.changes == ["tool 'lookup' changed"]
    assert "compatibility='replan'" in refused.value.message
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    assert run.recovery_record is not None
    assert run.recovery_record["phase"] == "incompatible_workflow"
    assert run.recovery_record["evidence"]["changes"] == ["tool 'lookup' changed"]
    assert store.load_ledger("r").steps["one"].result == 1  # nothing recorded is lost


def test_a_changed_workflow_version_blocks_the_run(store: sp.Store, crash_at: Any) -> None:
    @sp.workflow("agent", version="1")
    def old(run: sp.Run) -> int:
        return int(run.pure("one", lambda: 1))

    _stop_before_completion(store, old, crash_at)

    @sp.workflow("agent", version="2")
    def new(run: sp.Run) -> int:
        return int(run.pure("one", lambda: 1))

    with pytest.raises(IncompatibleWorkflow, match="version '1' became '2'"):
        sp.resume(store, "r")
    assert store.get_run("r").recovery_record["phase"] == "incompatible_workflow"


# -- replan ---------------------------------------------------------------------------------------


def test_replan_abandons_the_stale_tail_and_keeps_the_effect_ledger(
    store: sp.Store, crash_at: Any, owner_env: OwnerService
) -> None:
    """v1 read a case, drafted, decided and refunded, then died before the ticket. v2 reads the
    case another way: every observation and decision from there on is asked again (the old
    ones are kept in the history), and the refund — same operation id, a payload the new plan
    computes differently — returns its receipt instead of being sent again."""
    refunds = owner_effect("refunds")
    tickets = owner_effect("tickets")

    def plan(run: sp.Run, fields: list[str], amount: int) -> dict[str, Any]:
        first = run.pure("greeting", lambda: "hello")
        case = run.read("case", lambda f: {k: k.upper() for k in f}, fields)
        route = run.decide("route", lambda c: "refund" if c else "close", case)
        refund = run.effect("refund", refunds, payload={"amount": amount}, operation_id="refund:case-1")
        ticket = run.effect("ticket", tickets, payload={"route": route}, operation_id="ticket:case-1")
        return {"first": first, "case": case, "refund": refund["id"], "ticket": ticket["id"]}

    @sp.workflow("agent", version="1")
    def v1(run: sp.Run) -> dict[str, Any]:
        return plan(run, ["id"], 10)

    _stop_before_completion(store, v1, crash_at, "effect.before_prepare:ticket")
    assert owner_env.client.stats()["applied"] == 1

    @sp.workflow("agent", version="2", compatibility="replan")
    def v2(run: sp.Run) -> dict[str, Any]:
        return plan(run, ["id", "email"], 12)

    result = sp.resume(store, "r")
    assert result["case"] == {"id": "ID", "email": "EMAIL"}
    assert owner_env.client.stats()["applied"] == 2  # the ticket; the refund was not resent
    assert owner_env.client.stats()["duplicates"] == 0
    ledger = store.load_ledger("r")
    assert ledger.run.workflow_version == "2"
    assert ledger.run.workflow_fingerprint == v2.fingerprint
    assert ledger.operations["refund:case-1"].dispatch_count == 1
    assert ledger.steps["refund"].result["id"] == result["refund"]
    abandoned = _events(store, "step.abandoned")
    # the stale observations and decision, and the refund's step (its operation is kept)
    assert [event.step_id for event in abandoned] == ["case", "route", "refund"]
    assert abandoned[0].detail["result"] == {"id": "ID"}  # what was observed is kept
    assert ledger.steps["greeting"].result == "hello"  # before the stale step: still replayed
    replans = _events(store, "run.replanned")
    assert "version '1' became '2'" in replans[0].detail["reason"]
    assert [event.detail.get("abandoned_from") for event in replans[1:]] == ["case", "refund"]


def _charge_then_redeploy(
    store: sp.Store, crash_at: Any, point: str, charges: sp.Effect | None = None
) -> None:
    """v1 charges 10 and stops at ``point``; v2 (``replan``) would charge 11 under the same
    operation id."""
    charges = charges or owner_effect("charges")

    @sp.workflow("agent", version="1")
    def v1(run: sp.Run) -> Any:
        return run.effect("charge", charges, payload={"amount": 10}, operation_id="charge:1")

    _stop_before_completion(store, v1, crash_at, point)

    @sp.workflow("agent", version="2", compatibility="replan")
    def v2(run: sp.Run) -> Any:
        return run.effect("charge", charges, payload={"amount": 11}, operation_id="charge:1")


def test_replan_prepares_a_never_sent_effect_anew_with_its_changed_payload(
    store: sp.Store, crash_at: Any, owner_env: OwnerService
) -> None:
    """Stopped at "prepared": an effect without reconcile, as one its owner can reconcile is
    prepared and dispatching in one commit, never stopping at "prepared" alone."""
    _charge_then_redeploy(store, crash_at, "effect.after_prepared", owner_effect("charges", reconcile=False))
    before = store.load_ledger("r").operations["charge:1"]
    receipt = sp.resume(store, "r")
    assert receipt["amount"] == 11
    after = store.load_ledger("r").operations["charge:1"]
    assert after.effect_key == before.effect_key  # the owner never saw the key: it is kept
    assert after.payload_ref != before.payload_ref
    assert owner_env.client.stats()["applied"] == 1
    revised = [e for e in _events(store, "effect.prepared") if e.detail.get("revised")]
    assert [e.operation_id for e in revised] == ["charge:1"]


def test_replan_never_resends_a_changed_payload_that_may_have_been_sent(
    store: sp.Store, crash_at: Any, owner_env: OwnerService
) -> None:
    """Dispatching, then a crash: the owner says it never arrived, but the new plan asks for
    another payload. Resending it under the old key is what a Stripe-like owner refuses (or
    worse); the run blocks for a person instead, and nothing is sent."""
    _charge_then_redeploy(store, crash_at, "effect.after_dispatching")
    with pytest.raises(sp.NeedsReconciliation, match="never resent under the old key"):
        sp.resume(store, "r")
    assert owner_env.client.stats()["applied"] == 0
    assert store.get_run("r").status is RunStatus.BLOCKED


def test_replan_replays_the_receipt_of_a_changed_payload_the_owner_applied(
    store: sp.Store, crash_at: Any, owner_env: OwnerService
) -> None:
    _charge_then_redeploy(store, crash_at, "effect.after_receiver_commit")
    receipt = sp.resume(store, "r")
    assert receipt["amount"] == 10  # what happened, found by its key; nothing new was sent
    assert owner_env.client.stats()["applied"] == 1


def test_replan_under_the_same_version_replaces_a_stale_step(store: sp.Store, crash_at: Any) -> None:
    factor = {"value": 2}

    @sp.workflow("agent", compatibility="replan")
    def flow(run: sp.Run) -> list[int]:
        scaled = run.pure("scale", lambda x: x * 10, factor["value"])
        return [scaled, run.pure("plus", lambda x: x + 1, scaled)]

    _stop_before_completion(store, flow, crash_at)
    factor["value"] = 3
    assert sp.resume(store, "r") == [30, 31]
    assert [e.step_id for e in _events(store, "step.abandoned")] == ["scale", "plus"]
    assert store.get_run("r").workflow_version == "1"


def test_a_worker_of_a_replan_workflow_claims_runs_of_any_version() -> None:
    @sp.workflow("strict-one", version="4")
    def strict(run: sp.Run) -> None: ...

    @sp.workflow("flexible-one", version="4", compatibility="replan")
    def flexible(run: sp.Run) -> None: ...

    versions = registered_versions()
    assert "strict-one@4" in versions
    assert "flexible-one" in versions
