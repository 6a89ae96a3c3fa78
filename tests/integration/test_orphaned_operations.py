"""An operation that may have happened is never orphaned by a code change.

When the code that resumes a run no longer reaches an operation the ledger holds as in flight
(its effect step renamed, its ``operation_id`` changed, the step moved), it must not prepare the
same change anew under a fresh key: the owner would apply it twice. Such a run blocks
(``replay_mismatch``) naming the orphaned operation and what the code asked instead — under
``refuse`` and ``replan`` alike. Real stores, the owner over real HTTP on loopback.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import ReplayMismatch
from safepoint.testing import OwnerService, SimulatedCrash, forget_workflows, owner_effect
from safepoint.types import RunStatus

refunds = owner_effect("refunds")

# How the code changed between the crash and the resume: (step id, operation id) before → after.
CHANGES = {
    "step-renamed": (("refund", None), ("refund.v2", None)),
    "operation-id-changed": (("refund", "refund:1"), ("refund", "refund:1:v2")),
    "moved-and-renamed": (("refund", "refund:1"), ("pay.refund", "refund:one")),
}


def _deploy(
    name: str, step_id: str, operation_id: str | None, compatibility: str, version: str
) -> sp.Workflow:
    forget_workflows(name)  # a new process with the new code

    @sp.workflow(name, version=version, compatibility=compatibility)
    def flow(run: sp.Run) -> Any:
        run.pure("plan", lambda: "refund 40")
        return run.effect(step_id, refunds, payload={"account": "a", "amount": 40}, operation_id=operation_id)

    return flow


def _applied(owner: OwnerService) -> int:
    return int(owner.client.stats()["applied"])


@pytest.mark.parametrize("crash", ["effect.after_dispatching", "effect.after_receiver_commit"])
@pytest.mark.parametrize("compatibility", ["refuse", "replan"])
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_changed_effect_step_blocks_instead_of_dispatching_anew(
    store: sp.Store,
    owner_env: OwnerService,
    crash_at: Callable[[str | None], None],
    change: str,
    compatibility: str,
    crash: str,
) -> None:
    (old_step, old_op), (new_step, new_op) = CHANGES[change]
    crash_at(crash)
    with pytest.raises(SimulatedCrash):
        sp.start(store, _deploy("orphan", old_step, old_op, compatibility, "1"), run_id="r", lease_ms=0)
    crash_at(None)
    before = _applied(owner_env)  # 0 or 1: the owner may have it
    orphan = old_op or old_step

    _deploy("orphan", new_step, new_op, compatibility, "1" if compatibility == "refuse" else "2")
    with pytest.raises(ReplayMismatch) as blocked:
        sp.resume(store, "r")
    assert orphan in blocked.value.message
    assert (new_op or new_step) in blocked.value.message
    # It says what happened: no step was recorded for other inputs, and no policy but the
    # workflow's own is named.
    assert "recorded for other inputs" not in blocked.value.message
    assert "'refuse' policy" not in blocked.value.message
    run = store.get_run("r")
    assert run.status is RunStatus.BLOCKED
    record = run.recovery_record
    assert record is not None
    assert (record["phase"], record["operation_id"]) == ("replay_mismatch", orphan)
    assert record["evidence"]["asked_instead"]["operation_id"] == (new_op or new_step)
    assert set(store.load_ledger("r").operations) == {orphan}  # nothing new prepared
    assert _applied(owner_env) == before  # and nothing sent
    with pytest.raises(ReplayMismatch):  # a resume under the same code blocks again
        sp.resume(store, "r")
    assert _applied(owner_env) == before
    assert owner_env.client.stats()["duplicates"] == 0


def test_an_accepted_effect_the_code_no_longer_reaches_blocks_under_refuse(
    store: sp.Store, owner_env: OwnerService, crash_at: Callable[[str | None], None]
) -> None:
    """Under ``refuse`` an applied and accepted operation counts too: the same code, renamed,
    would make the change again under another key. (Under ``replan`` the kept effect ledger is
    what a new plan knowingly diverges from: see the next test.)"""
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, _deploy("orphan-accepted", "refund", None, "refuse", "1"), run_id="r", lease_ms=0)
    crash_at(None)
    assert _applied(owner_env) == 1
    _deploy("orphan-accepted", "refund.renamed", None, "refuse", "1")
    with pytest.raises(ReplayMismatch, match="no longer"):
        sp.resume(store, "r")
    assert _applied(owner_env) == 1


def test_a_replanned_run_may_leave_an_accepted_effect_behind(
    store: sp.Store, owner_env: OwnerService, crash_at: Callable[[str | None], None]
) -> None:
    crash_at("run.before_complete")
    with pytest.raises(SimulatedCrash):
        sp.start(store, _deploy("orphan-replan", "refund", None, "replan", "1"), run_id="r", lease_ms=0)
    crash_at(None)
    _deploy("orphan-replan", "refund.other", "refund:other", "replan", "2")
    assert sp.resume(store, "r")["amount"] == 40
    assert _applied(owner_env) == 2  # a different operation, which the new plan asks for


def test_a_sibling_branch_may_still_reach_its_operation(
    store: sp.Store, owner_env: OwnerService, crash_at: Callable[[str | None], None]
) -> None:
    """In a fan-out, a branch asking for a new operation while its sibling's in-flight one is
    not reached yet is no orphan: the sibling reaches it (and reconciles it) in its turn. The
    code deployed for the resume adds an effect to branch a (a compatible change), and branch
    b holds back (outside any step) so that a asks for it while b's uncertain one is still
    unreached."""
    forget_workflows("orphan-fanout")
    resumed = threading.Event()

    def branch_a(b: sp.Run) -> int:
        total = int(b.effect("one", refunds, payload={"account": "a", "amount": 1})["amount"])
        if resumed.is_set():
            total += int(b.effect("two", refunds, payload={"account": "a", "amount": 2})["amount"])
        return total

    def branch_b(b: sp.Run) -> int:
        if resumed.is_set():
            time.sleep(0.5)
        return int(b.effect("refund", refunds, payload={"account": "b", "amount": 4})["amount"])

    @sp.workflow("orphan-fanout")
    def flow(run: sp.Run) -> Any:
        return run.parallel("fan", {"a": branch_a, "b": branch_b})

    crash_at("effect.after_receiver_commit:fan.b/")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    resumed.set()
    assert sp.resume(store, "r") == {"a": 3, "b": 4}
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (3, 0)
