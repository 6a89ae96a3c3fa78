"""Store conformance: claiming."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from ..._rules.canonical import canonical, digest
from ...errors import Cancelled, LostOwnership, ResolutionRefused, StoreError
from ...storage.base import NewRun, Replan, Store
from ...types import Claim, EffectState, Resolution, ResolutionAction, RunRecord, RunStatus, StepKind
from ._concerns import ACROSS_RUNS, CLAIMS, CONCURRENCY, CONTROL, VALUES, exercises
from ._support import (
    LONG_LEASE_MS,
    SHORT_LEASE_MS,
    ConformanceBase,
    _uid,
    expire,
    in_threads,
    make_operation,
    make_step,
    stamped_between,
)


class ClaimTests(ConformanceBase):
    """The conformance tests of claiming."""

    @exercises(CONTROL)
    def test_claim_run_is_a_compare_and_set_on_the_revision(self) -> None:
        store = self.store()
        run = self.submit(store)
        for stale in (run.state_revision - 1, run.state_revision + 1):
            assert store.claim_run(run.run_id, stale, "worker-b", LONG_LEASE_MS) is None
        assert store.get_run(run.run_id) == run
        claim = store.claim_run(run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS)
        assert claim is not None
        assert (claim.fence, claim.owner) == (1, "worker-b")
        assert store.claim_run(run.run_id, run.state_revision, "worker-c", LONG_LEASE_MS) is None

    @exercises(CONTROL)
    def test_an_expired_lease_is_taken_over_with_a_new_fence(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        store.record_step(old, make_step(run.run_id, "s1", 1))  # a write moves the revision
        moved = store.get_run(run.run_id)
        expire()
        assert store.claim_run(run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS) is None
        t0 = store.now()
        claim = store.claim_run(run.run_id, moved.state_revision, "worker-b", LONG_LEASE_MS)
        t1 = store.now()
        assert claim is not None
        now = store.get_run(run.run_id)
        assert (claim.owner, claim.fence, claim.lease_ms) == ("worker-b", old.fence + 1, LONG_LEASE_MS)
        assert (now.status, now.owner, now.fence, now.resume_count) == (RunStatus.RUNNING, "worker-b", 2, 1)
        assert now.state_revision > moved.state_revision
        assert (claim.state_revision, claim.lease_expires_at) == (now.state_revision, now.lease_expires_at)
        assert stamped_between(t0 + LONG_LEASE_MS, claim.lease_expires_at, t1 + LONG_LEASE_MS)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.fence, event.worker) == ("run.claimed", 2, "worker-b")

    @exercises(CONTROL)
    def test_a_live_lease_is_taken_only_from_a_named_dead_owner(self) -> None:
        store = self.store()
        run, _ = self.start(store, owner="worker-a")
        for dead_owner in (None, "worker-x"):
            assert (
                store.claim_run(
                    run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS, dead_owner=dead_owner
                )
                is None
            )
        assert store.get_run(run.run_id) == run
        claim = store.claim_run(
            run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS, dead_owner="worker-a"
        )
        assert claim is not None
        assert (claim.fence, store.get_run(run.run_id).owner) == (2, "worker-b")
        assert store.events(run.run_id)[-1].kind == "run.claimed"

    @exercises(CONTROL, CLAIMS)
    @pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
    def test_an_ended_run_cannot_be_claimed(self, status: RunStatus) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.finish_run(
            claim,
            status,
            result=1 if status is RunStatus.COMPLETED else None,
            error={"type": "E", "message": "m"} if status is RunStatus.FAILED else None,
        )
        ended = store.get_run(run.run_id)
        assert store.claim_run(run.run_id, ended.state_revision, "worker-b", LONG_LEASE_MS) is None
        assert (
            store.claim_run(
                run.run_id, ended.state_revision, "worker-b", LONG_LEASE_MS, dead_owner="worker-a"
            )
            is None
        )
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        assert store.get_run(run.run_id) == ended

    @exercises(CONTROL, CONCURRENCY)
    def test_concurrent_claimers_of_one_revision_have_exactly_one_winner(self) -> None:
        stores = [self.store(), self.store()]
        runs = [self.submit(stores[0]) for _ in range(10)]
        runs += [self.start(stores[0], lease_ms=SHORT_LEASE_MS)[0] for _ in range(10)]
        expire()
        for run in runs:
            claims = in_threads(
                *[
                    (
                        lambda s=s, w=f"worker-{i}", r=run: s.claim_run(
                            r.run_id, r.state_revision, w, LONG_LEASE_MS
                        )
                    )
                    for i, s in enumerate(stores)
                ]
            )
            winners = [c for c in claims if c is not None]
            assert len(winners) == 1, f"{len(winners)} winners for {run.run_id}"
            now = stores[0].get_run(run.run_id)
            assert (now.owner, now.fence) == (winners[0].owner, run.fence + 1)

    @exercises(CONTROL, CLAIMS)
    def test_a_released_run_is_runnable_again(self) -> None:
        """A worker stopped on purpose releases its run: any worker may take it at once."""
        store = self.store()
        run, claim = self.start(store, lease_ms=LONG_LEASE_MS)
        store.release_run(claim)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        assert taken.fence > claim.fence

    @exercises(CONTROL, CLAIMS)
    def test_claim_next_takes_runnable_runs_of_its_workflows_oldest_first(self) -> None:
        store = self.store()
        other = f"{self.workflow}-other"

        def pause() -> None:
            time.sleep(0.005)  # distinct creation times, even on a millisecond clock

        # run ids sort against creation order, so an id order would be caught
        abandoned, _ = self.start(store, lease_ms=SHORT_LEASE_MS, run_id=f"z-{_uid()}")
        pause()
        pending = self.submit(store, run_id=f"y-{_uid()}")
        pause()
        live, _ = self.start(store)
        ended: list[str] = []
        for status in (RunStatus.BLOCKED, RunStatus.COMPLETED, RunStatus.FAILED):
            _, claim = self.start(store)
            store.finish_run(
                claim, status, recovery_record={"phase": "x"} if status is RunStatus.BLOCKED else None
            )
            ended.append(claim.run_id)
        pause()
        newest = self.submit(store, run_id=f"a-{_uid()}")
        elsewhere = self.submit(store, workflow=other)
        expire()
        assert store.claim_next("worker-b", LONG_LEASE_MS, []) is None
        taken: list[Claim] = []
        while (got := store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])) is not None:
            taken.append(got)
            assert len(taken) <= 3, "claim_next handed out a run it must not"
        assert [c.run_id for c in taken] == [abandoned.run_id, pending.run_id, newest.run_id]
        assert [c.fence for c in taken] == [2, 1, 1]
        for claim in taken:
            run = store.get_run(claim.run_id)
            assert (run.status, run.owner, run.fence) == (RunStatus.RUNNING, "worker-b", claim.fence)
            assert (claim.owner, claim.state_revision) == ("worker-b", run.state_revision)
            assert store.events(claim.run_id)[-1].kind == "run.claimed"
        # resume_count counts takeovers only: a pending run's first claim is not a resume
        assert [store.get_run(c.run_id).resume_count for c in taken] == [1, 0, 0]
        assert store.get_run(live.run_id).owner == "worker-a"
        assert [store.get_run(r).owner for r in ended] == [None, None, None]
        assert store.get_run(elsewhere.run_id).status is RunStatus.PENDING
        got = store.claim_next("worker-c", LONG_LEASE_MS, [other, self.workflow])
        assert got is not None
        assert got.run_id == elsewhere.run_id

    def _blocked_mid_dispatch(self, store: Store) -> tuple[RunRecord, str]:
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "reconcile_effect"})
        return store.get_run(run.run_id), op.operation_id

    @exercises(VALUES, CLAIMS)
    def test_resolving_applied_accepts_the_operation_and_releases_the_run(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        decision = Resolution(
            ResolutionAction.APPLIED,
            by="ana",
            operation_id=op_id,
            receipt={"id": "tk_9"},
            evidence="owner log",
        )
        resolved = store.resolve(run.run_id, run.state_revision, decision)
        assert (resolved.status, resolved.owner, resolved.recovery_record) == (RunStatus.RUNNING, None, None)
        assert resolved.state_revision == run.state_revision + 1
        op = store.load_ledger(run.run_id).operations[op_id]
        assert (op.state, op.receipt) == (EffectState.ACCEPTED, {"id": "tk_9"})
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.worker, event.operation_id) == ("run.resolved", "ana", op_id)
        assert event.detail == decision.detail()
        again = store.resolve(run.run_id, run.state_revision, decision)  # harmless repeat
        assert again.state_revision == resolved.state_revision
        with pytest.raises(ResolutionRefused):  # another decision on the old revision
            store.resolve(
                run.run_id, run.state_revision, replace(decision, action=ResolutionAction.NOT_APPLIED)
            )
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id  # released: any worker may carry it on

    def test_resolving_not_applied_prepares_the_operation_afresh(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        store.resolve(
            run.run_id,
            run.state_revision,
            Resolution(ResolutionAction.NOT_APPLIED, by="bo", operation_id=op_id),
        )
        op = store.load_ledger(run.run_id).operations[op_id]
        assert (op.state, op.first_dispatched_at, op.dispatch_count) == (EffectState.PREPARED, None, 1)

    def test_abandoning_cancels_and_a_stale_or_wrong_decision_changes_nothing(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        with pytest.raises(ResolutionRefused):  # an operation that is not uncertain
            store.resolve(
                run.run_id,
                run.state_revision,
                Resolution(ResolutionAction.APPLIED, by="cy", operation_id="no-such-op", receipt={}),
            )
        with pytest.raises(ResolutionRefused):  # a revision the run has left
            store.resolve(run.run_id, run.state_revision - 1, Resolution(ResolutionAction.ABANDON, by="cy"))
        assert store.get_run(run.run_id).state_revision == run.state_revision
        assert store.load_ledger(run.run_id).operations[op_id].state is EffectState.DISPATCHING
        ended = store.resolve(
            run.run_id,
            run.state_revision,
            Resolution(ResolutionAction.ABANDON, by="cy", evidence="withdrawn"),
        )
        assert ended.status is RunStatus.CANCELLED
        assert ended.error == {"type": "Abandoned", "message": "abandoned by cy: withdrawn"}

    def test_a_cancel_request_stops_new_work_but_not_the_settling_of_old(self) -> None:
        store = self.store()
        pending = self.submit(store)
        assert store.request_cancel(pending.run_id, "ops").status is RunStatus.CANCELLED
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        marked = store.request_cancel(run.run_id, "ops", "withdrawn")
        assert (marked.status, marked.owner) == (RunStatus.RUNNING, "worker-a")
        assert marked.cancel_requested_at is not None
        assert store.events(run.run_id)[-1].kind == "run.cancel_requested"
        with pytest.raises(Cancelled):
            store.record_step(claim, make_step(run.run_id, "new", 1))
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        refused = self.snapshot(store, run.run_id)
        with pytest.raises(Cancelled):
            store.prepare_effect(claim, second, data)
        with pytest.raises(Cancelled):
            store.prepare_and_mark_dispatching(claim, second, data)
        with pytest.raises(Cancelled):  # the cancel is what refuses a dispatch, whatever the op
            store.mark_dispatching(claim, f"no-such-op-{_uid()}")
        with pytest.raises(StoreError):  # settling is not new work: a wrong op is the error
            store.record_outcome(
                claim, f"no-such-op-{_uid()}", EffectState.ACCEPTED, step=make_step(run.run_id, "orphan", 9)
            )
        assert self.snapshot(store, run.run_id) == refused
        # what was in flight may still be settled, and the run ended
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        store.finish_run(claim, RunStatus.CANCELLED, error={"type": "Cancelled"})
        ended = store.get_run(run.run_id)
        assert ended.status is RunStatus.CANCELLED
        assert store.request_cancel(run.run_id, "ops").state_revision == ended.state_revision
        ledger = store.load_ledger(run.run_id)
        assert ledger.operations[op.operation_id].state is EffectState.ACCEPTED
        assert "new" not in ledger.steps
        assert second.operation_id not in ledger.operations

    @exercises(CONTROL)
    def test_the_resume_budget_is_recorded_with_the_run(self) -> None:
        store = self.store()
        run, _ = store.create_run(
            NewRun(
                run_id=f"budget-{_uid()}",
                workflow=self.workflow,
                workflow_version="v1",
                input_hash="h",
                inputs={"args": [], "kwargs": {}},
                owner=None,
                lease_ms=0,
                resume_budget=3,
            )
        )
        assert run.resume_budget == 3
        assert store.get_run(run.run_id).resume_budget == 3
        unlimited, _ = store.create_run(
            NewRun(
                run_id=f"budget-{_uid()}",
                workflow=self.workflow,
                workflow_version="v1",
                input_hash="h",
                inputs={"args": [], "kwargs": {}},
                owner=None,
                lease_ms=0,
            )
        )
        assert unlimited.resume_budget is None

    @exercises(CONTROL)
    def test_the_workflow_fingerprint_and_manifest_are_recorded_with_the_run(self) -> None:
        store = self.store()
        manifest = {"tools": {"lookup": "sha256:ab"}, "models": ["m-1"], "prompts": {}}
        run, _ = store.create_run(
            NewRun(
                run_id=f"fp-{_uid()}",
                workflow=self.workflow,
                workflow_version="v1",
                input_hash="h",
                inputs={"args": [], "kwargs": {}},
                owner=None,
                lease_ms=0,
                workflow_fingerprint="sha256:f1",
                workflow_manifest=manifest,
            )
        )
        again = store.get_run(run.run_id)
        assert (again.workflow_fingerprint, again.workflow_manifest) == ("sha256:f1", manifest)
        older = self.submit(store)  # a run recorded without one
        assert (older.workflow_fingerprint, older.workflow_manifest) == (None, None)

    def test_replan_adopts_the_new_code_and_records_what_it_replaced(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        manifest = {"tools": {}, "models": ["m-2"], "prompts": {}}
        store.replan(
            old,
            Replan(
                reason="the workflow changed",
                workflow_version="v2",
                workflow_fingerprint="sha256:f2",
                workflow_manifest=manifest,
            ),
        )
        now = store.get_run(run.run_id)
        assert (now.workflow_version, now.workflow_fingerprint, now.workflow_manifest) == (
            "v2",
            "sha256:f2",
            manifest,
        )
        assert now.state_revision > run.state_revision
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.fence, event.worker) == ("run.replanned", old.fence, "worker-a")
        assert event.detail["workflow_version"] == "v2"
        assert now.event_count == len(store.events(run.run_id))
        self.take_over(store, run.run_id)
        with pytest.raises(LostOwnership):  # a stale worker cannot re-plan
            store.replan(old, Replan(reason="stale", workflow_version="v3"))
        assert store.get_run(run.run_id).workflow_version == "v2"

    def test_replan_moves_the_stale_tail_into_the_history_and_keeps_effects(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "kept", 1))
        store.record_step(
            claim, make_step(run.run_id, "stale", 2, kind=StepKind.READ, result={"seen": 1}, observed_at=5)
        )
        store.record_step(claim, make_step(run.run_id, "paid", 3, kind=StepKind.EFFECT, operation_id="op-1"))
        store.record_step(
            claim,
            make_step(run.run_id, "route", 4, kind=StepKind.DECISION, result="next", next_step_id="next"),
        )
        store.record_step(claim, make_step(run.run_id, "fresh", 5))
        store.replan(claim, Replan(reason="inputs moved", step_id="stale", through_seq=4))
        ledger = store.load_ledger(run.run_id)
        assert sorted(ledger.steps) == ["fresh", "kept", "paid"]
        abandoned = [e for e in store.events(run.run_id) if e.kind == "step.abandoned"]
        assert [e.step_id for e in abandoned] == ["stale", "route"]
        assert (abandoned[0].detail["result"], abandoned[0].detail["seq"]) == ({"seen": 1}, 2)
        assert (abandoned[1].detail["kind"], abandoned[1].detail["result"]) == ("decision", "next")
        assert abandoned[1].detail["reason"] == "inputs moved"
        kinds = [e.kind for e in store.events(run.run_id)]
        assert kinds[-3:] == ["run.replanned", "step.abandoned", "step.abandoned"]
        assert store.get_run(run.run_id).event_count == len(store.events(run.run_id))

    @exercises(VALUES, ACROSS_RUNS)
    def test_an_operation_never_sent_is_prepared_anew_and_one_maybe_sent_never(self) -> None:
        """A re-plan's changed payload: the same key with a new payload while nothing left."""
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        changed = canonical({"op": op.operation_id, "amount": 6})
        store.reprepare_effect(claim, replace(op, payload_ref=digest(changed)), changed)
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (stored.payload_ref, stored.effect_key) == (digest(changed), op.effect_key)
        assert store.get_artifact(stored.payload_ref) == changed
        with pytest.raises(ValueError, match="does not match"):
            store.reprepare_effect(claim, replace(op, payload_ref=digest(payload)), changed)
        store.mark_dispatching(claim, op.operation_id)
        with pytest.raises(StoreError, match="no longer prepared"):
            store.reprepare_effect(claim, op, payload)
        assert store.load_ledger(run.run_id).operations[op.operation_id].payload_ref == digest(changed)

    @exercises(CONTROL, CLAIMS)
    def test_claim_next_by_version_leaves_other_versions_alone(self) -> None:
        """In a rolling deploy an old worker must not take (and then block) a newer run."""
        store = self.store()
        pending = self.submit(store)  # recorded as version v1
        assert store.claim_next("worker-old", LONG_LEASE_MS, [f"{self.workflow}@v0"]) is None
        got = store.claim_next("worker-new", LONG_LEASE_MS, [f"{self.workflow}@v1"])
        assert got is not None
        assert got.run_id == pending.run_id

    @exercises(CONTROL, CLAIMS, CONCURRENCY)
    def test_concurrent_claim_next_never_hands_out_a_run_twice(self) -> None:
        stores = [self.store() for _ in range(4)]
        mine = {self.submit(stores[0]).run_id for _ in range(24)}

        def drain(store: Store, owner: str) -> list[str]:
            got = []
            while (claim := store.claim_next(owner, LONG_LEASE_MS, [self.workflow])) is not None:
                got.append(claim.run_id)
            return got

        taken = in_threads(*[(lambda s=s, w=f"worker-{i}": drain(s, w)) for i, s in enumerate(stores)])
        flat = [run_id for got in taken for run_id in got]
        assert len(flat) == len(set(flat)), "a run was claimed twice"
        assert set(flat) == mine
        assert {stores[0].get_run(r).fence for r in mine} == {1}
