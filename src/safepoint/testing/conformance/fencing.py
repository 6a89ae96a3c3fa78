"""Store conformance: fencing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from ..._rules.canonical import digest, dumps
from ...errors import ArtifactMissing, LostOwnership, RunNotFound
from ...storage.base import Store
from ...types import Claim, EffectState, Resolution, ResolutionAction, RunStatus, StepKind
from ._concerns import ACROSS_RUNS, CONTROL, VALUES, exercises
from ._support import (
    LARGE,
    LONG_LEASE_MS,
    SHORT_LEASE_MS,
    ConformanceBase,
    _uid,
    make_attempt,
    make_operation,
    make_step,
)


class FenceTests(ConformanceBase):
    """The conformance tests of fencing."""

    def _stale_writes(
        self, store: Store, claim: Claim, op_id: str
    ) -> tuple[dict[str, Callable[[], Any]], list[str]]:
        """Every worker write, as ``claim`` would make it, and the artifacts they would store
        (unique to this call: a refused write stores none of them)."""
        run_id = claim.run_id
        new_op, payload = make_operation(run_id, f"op-{_uid()}")
        large = {"blob": LARGE, "stale": _uid()}
        return {
            "record_step (new)": lambda: store.record_step(claim, make_step(run_id, "s2", 2)),
            "record_step (re-record)": lambda: store.record_step(
                claim, make_step(run_id, "s1", 1, result="stale")
            ),
            "record_attempt": lambda: store.record_attempt(claim, make_attempt(run_id, "s9", 1)),
            "prepare_effect": lambda: store.prepare_effect(claim, new_op, payload),
            "mark_dispatching": lambda: store.mark_dispatching(claim, op_id),
            "prepare_and_mark_dispatching": lambda: store.prepare_and_mark_dispatching(
                claim, new_op, payload
            ),
            "record_outcome": lambda: store.record_outcome(
                claim,
                op_id,
                EffectState.ACCEPTED,
                receipt={"id": 1},
                step=make_step(run_id, "step.x", 3, kind=StepKind.EFFECT, operation_id=op_id),
            ),
            "record_outcome (large result)": lambda: store.record_outcome(
                claim,
                op_id,
                EffectState.ACCEPTED,
                receipt=large,
                step=make_step(run_id, "step.x", 3, kind=StepKind.EFFECT, operation_id=op_id, result=large),
            ),
            "finish_run": lambda: store.finish_run(claim, RunStatus.COMPLETED, result="stale"),
            "renew_lease": lambda: store.renew_lease(claim),
            "continue_as_new": lambda: store.continue_as_new(claim, self.successor(run_id, n=99)),
        }, [new_op.payload_ref, digest(dumps(large).encode())]

    def _assert_stale_claim_writes_nothing(self, store: Store, claim: Claim, op_id: str) -> None:
        before = self.snapshot(store, claim.run_id)
        writes, artifacts = self._stale_writes(store, claim, op_id)
        for name, write in writes.items():
            with pytest.raises(LostOwnership) as lost:
                write()
            assert (lost.value.run_id, lost.value.fence) == (claim.run_id, claim.fence), name
            assert self.snapshot(store, claim.run_id) == before, f"stale {name} wrote"
        with pytest.raises(RunNotFound):  # nor was a successor created
            store.get_run(f"{claim.run_id}~99")
        for ref in artifacts:  # nor a payload or a result as an artifact
            with pytest.raises(ArtifactMissing):
                store.get_artifact(ref)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_stale_claim_writes_nothing_after_a_takeover(self) -> None:
        assert not issubclass(LostOwnership, Exception)  # agent code cannot swallow it
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        store.record_step(old, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(old, op, payload)
        new = self.take_over(store, run.run_id)
        assert new.fence == old.fence + 1
        self._assert_stale_claim_writes_nothing(store, old, op.operation_id)
        store.record_step(new, make_step(run.run_id, "s2", 2))  # the new owner carries on
        assert store.load_ledger(run.run_id).steps["s2"].fence == new.fence

    @exercises(VALUES, ACROSS_RUNS)
    @pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BLOCKED])
    def test_an_ended_run_refuses_every_worker_write(self, status: RunStatus) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.finish_run(
            claim, status, recovery_record={"phase": "x"} if status is RunStatus.BLOCKED else None
        )
        self._assert_stale_claim_writes_nothing(store, claim, op.operation_id)

    @exercises(CONTROL)
    def test_release_run_gives_the_run_up_and_a_stale_release_does_nothing(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        new = self.take_over(store, run.run_id)
        before = self.snapshot(store, run.run_id)
        with contextlib.suppress(LostOwnership):
            store.release_run(old)  # may raise LostOwnership; must not write
        assert self.snapshot(store, run.run_id) == before
        store.release_run(new)
        released = store.get_run(run.run_id)
        assert (released.status, released.owner) == (RunStatus.RUNNING, None)
        claim = store.claim_run(run.run_id, released.state_revision, "worker-c", LONG_LEASE_MS)
        assert claim is not None  # no lease left to wait for
        assert claim.fence > new.fence

    @exercises(VALUES, CONTROL, ACROSS_RUNS)
    @pytest.mark.parametrize("let_go", ["release_run", "end_slice", "resolve"])
    def test_a_run_let_go_refuses_every_write_of_the_hand_that_held_it(self, let_go: str) -> None:
        """A worker gave the run back (``release_run``, ``end_slice``), or it blocked and a
        person released it (``resolve``): the run is running with no owner, and a write its last
        holder issued before letting go — a fan-out branch paused right before its statement —
        must not land when it arrives."""
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        if let_go == "release_run":
            store.release_run(claim)
        elif let_go == "end_slice":
            store.end_slice(claim, step_id="s2", detail={"slice_ms": 1, "elapsed_ms": 2, "before_step": "s2"})
        else:
            store.mark_dispatching(claim, op.operation_id)
            store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "reconcile_effect"})
            blocked = store.get_run(run.run_id)
            decision = Resolution(ResolutionAction.NOT_APPLIED, by="ana", operation_id=op.operation_id)
            store.resolve(run.run_id, blocked.state_revision, decision)
        released = store.get_run(run.run_id)
        assert (released.status, released.owner) == (RunStatus.RUNNING, None)
        assert released.fence > claim.fence
        self._assert_stale_claim_writes_nothing(store, claim, op.operation_id)
