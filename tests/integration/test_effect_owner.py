"""Effects against the real effect owner over HTTP: faults that make outcomes uncertain."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected, VerificationFailed
from safepoint.testing import OwnerService, SimulatedCrash, owner_effect
from safepoint.types import EffectState, RunStatus


def _charge_flow(name: str, effect: sp.Effect) -> sp.Workflow:
    @sp.workflow(name)
    def flow(run: sp.Run, amount: int) -> str:
        return str(run.effect("charge", effect, payload={"amount": amount})["id"])

    return flow


def test_dropped_response_is_reconciled_not_repeated(file_store: sp.Store, owner_env: OwnerService) -> None:
    owner_env.client.set_faults(drop_after_commit=1)
    flow = _charge_flow("drop", owner_effect("charges"))
    assert sp.start(file_store, flow, 500, run_id="r") == "ch_1"
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    op = file_store.load_ledger("r").operations["charge"]
    assert op.state is EffectState.ACCEPTED
    assert op.dispatch_count == 1  # reconciled by lookup, never sent again


def test_lagging_index_redispatches_under_the_same_key(file_store: sp.Store, owner_env: OwnerService) -> None:
    """Lookup says "not applied" (the index lags); inside the owner's retention the same key
    is sent again and the owner answers with the saved response: still one charge."""
    owner_env.client.set_faults(drop_after_commit=1, index_lag=5.0)
    flow = _charge_flow("lag", owner_effect("charges"))
    assert sp.start(file_store, flow, 700, run_id="r") == "ch_1"
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)
    op = file_store.load_ledger("r").operations["charge"]
    assert op.dispatch_count == 2
    events = [e.kind for e in file_store.events("r")]
    assert events.count("effect.dispatching") == 2
    assert "effect.unknown" in events


def test_past_dedup_retention_blocks_instead_of_redispatching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner forgot the key (Stripe prunes after 24 h): a re-send would charge twice."""
    with OwnerService(key_retention=0.3, index_lag=30.0) as owner:
        monkeypatch.setenv("SAFEPOINT_OWNER_URL", owner.url)
        owner.client.set_faults(drop_after_commit=1)
        effect = owner_effect("charges", dedup_retention=timedelta(seconds=0.3))
        flow = _charge_flow("retention", effect)
        store = sp.open_store(f"sqlite:///{tmp_path / 'l.db'}")
        slow = sp.Effect(
            effect.name,
            execute=effect.execute,
            reconcile=lambda key: (time.sleep(0.4), effect.reconcile(key))[1],
            dedup_retention=effect.dedup_retention,
        )
        with pytest.raises(sp.NeedsReconciliation) as blocked:
            sp.start(store, _charge_flow("retention2", slow), 900, run_id="r")
        assert "dedup retention" in blocked.value.message
        assert blocked.value.record["phase"] == "reconcile_effect"
        assert blocked.value.record["effect_status"] == "unknown"
        stats = owner.client.stats()
        assert (stats["applied"], stats["duplicates"]) == (1, 0)
        assert store.get_run("r").status is RunStatus.BLOCKED
        del flow


def test_no_read_path_blocks(file_store: sp.Store, owner_env: OwnerService) -> None:
    owner_env.client.set_faults(drop_after_commit=1)
    effect = owner_effect("notifications", reconcile=False, dedup_retention=None)

    @sp.workflow("notify-once")
    def flow(run: sp.Run) -> str:
        return str(run.effect("notify", effect, payload={"to": "ops"})["id"])

    with pytest.raises(sp.NeedsReconciliation):
        sp.start(file_store, flow, run_id="r")
    with pytest.raises(sp.NeedsReconciliation):  # a resume re-establishes the block
        sp.resume(file_store, "r")
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (1, 0)


def test_rejection_is_recorded_and_replayed(
    file_store: sp.Store, owner_env: OwnerService, crash_at: object
) -> None:
    rejecting = sp.Effect("declining", execute=_reject_always)
    seen: list[str] = []

    @sp.workflow("reject")
    def flow(run: sp.Run) -> str:
        try:
            run.effect("pay", rejecting, payload={"amount": 1})
        except EffectRejected as exc:
            seen.append(exc.operation_id)
            return "rejected"
        return "applied"

    crash_at("run.before_complete")  # type: ignore[operator]
    with pytest.raises(SimulatedCrash):
        sp.start(file_store, flow, run_id="r", lease_ms=0)
    crash_at(None)  # type: ignore[operator]
    assert sp.resume(file_store, "r") == "rejected"
    assert seen == ["pay", "pay"]
    op = file_store.load_ledger("r").operations["pay"]
    assert op.state is EffectState.REJECTED
    assert op.error == {"status": 402, "reason": "card_declined"}
    assert op.dispatch_count == 1  # the second rejection came from the ledger, not the owner


def _reject_always(payload: object, key: sp.EffectKey) -> object:
    raise sp.Rejected({"status": 402, "reason": "card_declined"})


def test_not_sent_is_retried_then_applied(file_store: sp.Store, owner_env: OwnerService) -> None:
    owner_env.client.set_faults(fail_before_commit=2)
    flow = _charge_flow("notsent", owner_effect("charges"))
    assert sp.start(file_store, flow, 42, run_id="r") == "ch_1"
    op = file_store.load_ledger("r").operations["charge"]
    assert op.dispatch_count == 3
    assert owner_env.client.stats()["applied"] == 1


def test_verifier_failure_blocks_and_never_redispatches(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    base = owner_effect("tickets")
    effect = sp.Effect(
        "tickets",
        execute=base.execute,
        reconcile=base.reconcile,
        verify=lambda receipt: False,
        dedup_retention=timedelta(hours=1),
    )

    @sp.workflow("verify-fails")
    def flow(run: sp.Run) -> str:
        return str(run.effect("ticket", effect, payload={"title": "t"})["id"])

    with pytest.raises(VerificationFailed) as blocked:
        sp.start(file_store, flow, run_id="r")
    assert blocked.value.record["phase"] == "verify_effect"
    with pytest.raises(VerificationFailed):
        sp.resume(file_store, "r")
    assert owner_env.client.stats()["applied"] == 1
    assert file_store.load_ledger("r").operations["ticket"].state is EffectState.APPLIED


# -- what an effect costs in commits ------------------------------------------------------------


class _CountedWrites:
    """A store that notes each worker write: one commit each, by the store contract (every
    method that takes a claim is one atomic operation). The lease heartbeat is left out: it
    renews on a timer, not per effect."""

    WRITES = frozenset(
        {
            "record_step",
            "record_steps",
            "record_attempt",
            "prepare_effect",
            "mark_dispatching",
            "prepare_and_mark_dispatching",
            "record_outcome",
            "await_approval",
            "reprepare_effect",
            "finish_run",
            "release_run",
        }
    )

    def __init__(self, store: sp.Store) -> None:
        self.store = store
        self.writes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.store, name)
        if name not in self.WRITES:
            return found

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.writes.append(name)
            return found(*args, **kwargs)

        return counted


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _tickets_flow(name: str, effect: sp.Effect, count: int) -> sp.Workflow:
    @sp.workflow(name)
    def flow(run: sp.Run) -> list[str]:
        return [str(run.effect(f"fx.{index}", effect, payload={"i": index})["id"]) for index in range(count)]

    return flow


def _effect_events(store: sp.Store, run_id: str) -> list[tuple[str, str | None]]:
    return [(e.kind, e.step_id) for e in store.events(run_id) if e.kind.startswith("effect.")]


@pytest.mark.parametrize("is_async", [False, True], ids=["def", "async-def"])
def test_an_effect_its_owner_can_reconcile_costs_two_commits(
    file_store: sp.Store, owner_env: OwnerService, is_async: bool
) -> None:
    """No gate between "prepared" and "dispatching", and a crash between them is recovered by
    asking the owner: they are one commit, the outcome the other. The history reads as it
    would with three."""
    effect = owner_effect("tickets")  # reconcile and dedup_retention, no approval
    counted = _CountedWrites(file_store)
    if is_async:

        @sp.workflow("two-commits-async")
        async def flow(run: sp.AsyncRun) -> list[str]:
            return [
                str((await run.effect(f"fx.{index}", effect, payload={"i": index}))["id"])
                for index in range(3)
            ]
    else:
        flow = _tickets_flow("two-commits", effect, 3)
    assert sp.start(counted, flow, run_id="r") == ["tk_1", "tk_2", "tk_3"]  # type: ignore[arg-type]
    assert counted.writes == ["prepare_and_mark_dispatching", "record_outcome"] * 3 + ["finish_run"]
    assert _effect_events(file_store, "r") == [
        (kind, f"fx.{index}")
        for index in range(3)
        for kind in ("effect.prepared", "effect.dispatching", "effect.accepted")
    ]
    for op in file_store.load_ledger("r").operations.values():
        assert (op.state, op.dispatch_count) == (EffectState.ACCEPTED, 1)
    assert owner_env.client.stats()["applied"] == 3


@pytest.mark.parametrize(
    "effect",
    [
        owner_effect("tickets", reconcile=False),
        owner_effect("tickets", dedup_retention=None),
        replace(owner_effect("tickets"), max_dispatches=1),
    ],
    ids=["no-reconcile", "no-dedup-retention", "one-dispatch-only"],
)
def test_an_effect_recovery_could_not_reconcile_alone_commits_prepared_apart(
    file_store: sp.Store, owner_env: OwnerService, effect: sp.Effect
) -> None:
    """A crash between one commit and the call would leave "dispatching", which this effect
    cannot settle without a person; "prepared" alone lets recovery dispatch."""
    counted = _CountedWrites(file_store)
    sp.start(counted, _tickets_flow(f"three-commits-{_uid()}", effect, 2), run_id="r")  # type: ignore[arg-type]
    assert counted.writes == ["prepare_effect", "mark_dispatching", "record_outcome"] * 2 + ["finish_run"]
    assert owner_env.client.stats()["applied"] == 2


def test_an_effect_that_needs_approval_commits_prepared_before_its_gate(
    file_store: sp.Store, owner_env: OwnerService
) -> None:
    effect = owner_effect("refunds")  # reconcilable, but a gate stands in between

    @sp.workflow("approved-apart")
    def flow(run: sp.Run) -> str:
        return str(run.effect("refund", effect, payload={"amount": 40}, approval=True)["id"])

    counted = _CountedWrites(file_store)
    with pytest.raises(sp.AwaitingApproval):
        sp.start(counted, flow, run_id="r")  # type: ignore[arg-type]
    assert counted.writes == ["prepare_effect", "await_approval"]
    sp.approve(file_store, "r", "refund", by="ana")
    assert sp.resume(counted, "r") == "re_1"  # type: ignore[arg-type]
    assert counted.writes[2:] == ["await_approval", "mark_dispatching", "record_outcome", "finish_run"]
    assert owner_env.client.stats()["applied"] == 1
