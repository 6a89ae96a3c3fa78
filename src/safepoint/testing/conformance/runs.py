"""Store conformance: creating and reading runs."""

from __future__ import annotations

import time

import pytest

from ..._rules.canonical import digest, dumps
from ...errors import RunNotFound
from ...types import JSON, Claim, LedgerIdentity, RunStatus
from ._concerns import ACROSS_RUNS, CONTROL, VALUES, exercises
from ._support import CLOCK_SLACK_MS, LARGE, LONG_LEASE_MS, ConformanceBase, _uid, stamped_between


class RunTests(ConformanceBase):
    """The conformance tests of creating and reading runs."""

    def test_create_run_claimed_by_its_starter(self) -> None:
        store = self.store()
        t0 = store.now()
        run, claim = self.start(store, owner="worker-a", inputs={"case": "8472"})
        t1 = store.now()
        assert (run.status, run.owner, run.fence, run.resume_count) == (RunStatus.RUNNING, "worker-a", 1, 0)
        assert (run.workflow, run.workflow_version, run.inputs) == (self.workflow, "v1", {"case": "8472"})
        assert run.lease_expires_at is not None
        assert stamped_between(t0 + LONG_LEASE_MS, run.lease_expires_at, t1 + LONG_LEASE_MS)
        assert stamped_between(t0, run.created_at, t1)
        assert (run.result, run.error, run.recovery_record) == (None, None, None)
        assert claim == Claim(
            run.run_id, "worker-a", 1, run.state_revision, run.lease_expires_at, LONG_LEASE_MS
        )
        assert store.get_run(run.run_id) == run
        [event] = store.events(run.run_id)
        assert (event.kind, event.fence, event.worker) == ("run.started", 1, "worker-a")

    def test_create_run_without_owner_is_pending(self) -> None:
        store = self.store()
        run, claim = self.new_run(store, owner=None)
        assert claim is None
        assert (run.status, run.owner, run.lease_expires_at, run.fence, run.resume_count) == (
            RunStatus.PENDING,
            None,
            None,
            0,
            0,
        )
        assert store.get_run(run.run_id) == run

    def test_creating_an_existing_run_returns_it_unchanged_without_a_claim(self) -> None:
        store = self.store()
        for owner in ("worker-a", None):
            first, _ = self.new_run(store, owner=owner, inputs={"n": 1})
            before = self.snapshot(store, first.run_id)
            again, claim = self.new_run(
                store,
                owner="worker-b",
                inputs={"n": 2},
                workflow=f"{self.workflow}-other",
                run_id=first.run_id,
            )
            assert claim is None
            assert again == first
            assert self.snapshot(store, first.run_id) == before

    @exercises(VALUES, ACROSS_RUNS)
    def test_inputs_round_trip_and_large_inputs_are_artifacts(self) -> None:
        store = self.store()
        small = {"text": "naïve ✓", "n": [1, 2.5, None, True], "nested": {"k": {}}}
        run, _ = self.start(store, inputs=small)
        assert store.get_run(run.run_id).inputs == small
        large: JSON = {"doc": LARGE, "n": 1}
        run, _ = self.start(store, inputs=large)
        assert run.inputs == large
        assert store.load_ledger(run.run_id).run.inputs == large
        # A large value is stored once, as the artifact of its stored JSON text (UTF-8).
        text = dumps(large).encode()
        assert store.get_artifact(digest(text)) == text

    @exercises(CONTROL)
    def test_unknown_run_is_run_not_found(self) -> None:
        store = self.store()
        missing = f"missing-{_uid()}"
        with pytest.raises(RunNotFound) as error:
            store.get_run(missing)
        assert error.value.run_id == missing
        with pytest.raises(RunNotFound):
            store.load_ledger(missing)

    @exercises(VALUES, ACROSS_RUNS)
    def test_list_runs_filters_by_status_newest_first_within_limit(self) -> None:
        store = self.store()
        _, claim = self.start(store)
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        running, _ = self.start(store)
        older = self.submit(store)
        time.sleep(0.005)
        newer = self.submit(store)
        pending = store.list_runs(RunStatus.PENDING, limit=50)
        assert {r.status for r in pending} == {RunStatus.PENDING}
        ids = [r.run_id for r in pending]
        assert ids.index(newer.run_id) < ids.index(older.run_id)  # most recently changed first
        assert claim.run_id in {r.run_id for r in store.list_runs(RunStatus.COMPLETED, 50)}
        assert running.run_id in {r.run_id for r in store.list_runs(RunStatus.RUNNING, 50)}
        assert running.run_id not in ids
        assert len(store.list_runs(limit=2)) == 2
        assert len(store.list_runs(RunStatus.PENDING, limit=1)) == 1

    @exercises(CONTROL)
    def test_the_ledger_has_one_identity(self) -> None:
        """Every store of one database names the same ledger: an id minted once when its
        schema was created, part of every effect key minted in it."""
        first, second = self.store(), self.store()
        assert isinstance(first.identity, LedgerIdentity)
        assert first.identity == second.identity
        assert isinstance(first.identity.ledger_id, str)
        assert len(first.identity.ledger_id) >= 16
        assert first.identity.keyed_since <= first.now() + CLOCK_SLACK_MS  # stamped by the database
