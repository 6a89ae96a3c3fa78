"""Store conformance: ending a run."""

from __future__ import annotations

import time

import pytest

from ...types import JSON, RunStatus
from ._concerns import ACROSS_RUNS, CONTROL, VALUES, exercises
from ._support import CLOCK_SLACK_MS, LARGE, ConformanceBase, make_step


class EndingTests(ConformanceBase):
    """The conformance tests of ending a run."""

    @exercises(VALUES, ACROSS_RUNS)
    @pytest.mark.parametrize("result", [{"ticket": "T-1", "ok": True}, {"blob": LARGE}])
    def test_finish_run_completed_records_the_result(self, result: JSON) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.finish_run(claim, RunStatus.COMPLETED, result=result)
        done = store.get_run(run.run_id)
        assert (done.status, done.result, done.error, done.owner) == (RunStatus.COMPLETED, result, None, None)
        assert done.state_revision > claim.state_revision
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.fence, event.worker) == ("run.completed", 1, "worker-a")

    def test_finish_run_failed_records_the_error(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        error = {"type": "ValueError", "message": "bad case id ✗"}
        store.finish_run(claim, RunStatus.FAILED, error=error)
        failed = store.get_run(run.run_id)
        assert (failed.status, failed.error, failed.result, failed.owner) == (
            RunStatus.FAILED,
            error,
            None,
            None,
        )
        assert store.events(run.run_id)[-1].kind == "run.failed"

    def test_finish_run_blocked_stamps_the_new_revision_into_the_recovery_record(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        record = {
            "schema_version": 1,
            "phase": "reconcile_effect",
            "state_revision": 0,
            "operation_id": "op-1",
            "evidence_refs": [],
        }
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)
        blocked = store.get_run(run.run_id)
        assert (blocked.status, blocked.owner) == (RunStatus.BLOCKED, None)
        assert blocked.recovery_record == {**record, "state_revision": blocked.state_revision}
        assert blocked.state_revision > claim.state_revision
        assert store.events(run.run_id)[-1].kind == "run.blocked"

    @exercises(CONTROL)
    def test_renew_lease_extends_the_lease_without_moving_the_revision(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=2_000)
        time.sleep(0.02)
        t0 = store.now()
        store.renew_lease(claim)
        renewed = store.get_run(run.run_id)
        # the lease is stamped on the database's clock, t0 read from the store's estimate of it
        assert (renewed.lease_expires_at or 0) >= t0 - CLOCK_SLACK_MS + 2_000
        assert (renewed.lease_expires_at or 0) > (run.lease_expires_at or 0)
        assert renewed.state_revision == run.state_revision
        assert run.heartbeat_at is None  # the claim is not a heartbeat
        assert (renewed.heartbeat_at or 0) >= t0 - CLOCK_SLACK_MS  # the console shows it
        assert len(store.events(run.run_id)) == 1  # a heartbeat is not history
