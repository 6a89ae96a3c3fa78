"""Store conformance: the end of a slice (``end_slice``) — the run released at once, with its
event, by the holder of its fence only."""

from __future__ import annotations

import pytest

from ...errors import LostOwnership
from ...types import RunStatus
from ._concerns import CLAIMS, CONTROL, exercises
from ._support import LONG_LEASE_MS, SHORT_LEASE_MS, ConformanceBase, make_step

_DETAIL = {"slice_ms": 25_000, "elapsed_ms": 25_013, "before_step": "s2"}


class SliceTests(ConformanceBase):
    """The conformance tests of ending a slice."""

    def test_end_slice_releases_the_run_at_once_and_records_why(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=LONG_LEASE_MS)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        before = store.get_run(run.run_id)
        store.end_slice(claim, step_id="s2", detail=_DETAIL)
        released = store.get_run(run.run_id)
        assert (released.status, released.owner, released.lease_expires_at) == (RunStatus.RUNNING, None, None)
        assert released.state_revision > before.state_revision
        assert released.event_count == before.event_count + 1  # the history counts the event
        assert released.fence > claim.fence  # released: the hand that held it writes nothing more
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.step_id, event.fence, event.worker, event.detail) == (
            "run.slice_ended",
            "s2",
            claim.fence,
            "worker-a",
            _DETAIL,
        )
        assert "s1" in store.load_ledger(run.run_id).steps  # what was recorded stays
        # Nothing to wait out: a lease of a minute was granted, and another worker claims now.
        again = store.claim_run(run.run_id, released.state_revision, "worker-b", LONG_LEASE_MS)
        assert again is not None
        assert again.fence > claim.fence

    @exercises(CONTROL, CLAIMS)
    def test_a_run_released_at_a_slice_end_is_the_next_claim_of_any_worker(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=LONG_LEASE_MS)
        store.end_slice(claim, step_id=None, detail={"slice_ms": 1, "elapsed_ms": 2, "before_step": None})
        assert store.events(run.run_id)[-1].step_id is None
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert (taken.run_id, taken.owner) == (run.run_id, "worker-b")

    @exercises(CONTROL)
    def test_a_stale_end_slice_raises_and_writes_nothing(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        new = self.take_over(store, run.run_id)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(LostOwnership):
            store.end_slice(old, step_id="s1", detail=_DETAIL)
        assert self.snapshot(store, run.run_id) == before
        assert store.get_run(run.run_id).owner == new.owner

    @exercises(CONTROL)
    def test_end_slice_ends_a_slice_even_once_a_cancel_is_asked_for(self) -> None:
        # Releasing starts nothing new: a cancel does not refuse it, and the next worker that
        # claims the run ends it cancelled.
        store = self.store()
        run, claim = self.start(store, lease_ms=LONG_LEASE_MS)
        store.request_cancel(run.run_id, "ops")
        store.end_slice(claim, step_id="s1", detail=_DETAIL)
        released = store.get_run(run.run_id)
        assert (released.status, released.owner) == (RunStatus.RUNNING, None)
        assert released.cancel_requested_at is not None
