"""Store conformance: rows that cannot be read.

A stored value this safepoint cannot read — JSON that does not parse or is not the shape its
field holds, a status, kind or state it does not know — makes the row a ``CorruptRecord`` naming
its table and the column, is kept as it is, and never fails a listing: ``list_runs`` and
``find_run`` show the run as an ``UnreadableRun``. The claim needs nothing of such a row but
plain columns, so a worker can claim the run and block it by ``finish_run``; a run whose status
is unknown is never claimed. Nothing else changes such a run: a person's cancel or resolution
raises the ``CorruptRecord`` and writes nothing, and a prune keeps the chain it is in. Each test
damages the rows with ``ConformanceBase.damage`` (and repairs them after), with values every
store can hold.
"""

from __future__ import annotations

from typing import Any

import pytest

from ..._rules.canonical import dumps
from ..._rules.retention import PRUNABLE
from ...errors import CorruptRecord, RunNotFound
from ...storage.prune import PruneRequest
from ...types import Resolution, ResolutionAction, RunRecord, RunStatus, UnreadableRun
from ._concerns import ACROSS_RUNS, CLAIMS, VALUES, exercises
from ._support import LONG_LEASE_MS, ConformanceBase, make_attempt, make_operation, make_step

INPUTS = dumps({"args": [1], "kwargs": {}})  # what new_run stores: the repair

# (column of safepoint_runs, a value it cannot be read as, the value that repairs it)
RUN_COLUMNS = [
    ("inputs", "{not json", INPUTS),
    ("workflow_manifest", "[1, 2]", None),
    ("step_attempts", '{"attempts": "many"}', None),
    ("error", '"an error"', None),
    ("recovery_record", "{", None),
    ("result", "{not json", None),
]
# (table, column, a value it cannot be read as, the value that repairs it)
LEDGER_COLUMNS = [
    ("safepoint_steps", "result", "{not json", dumps({"step": "s1"})),
    ("safepoint_steps", "kind", "teleported", "pure"),
    ("safepoint_steps", "status", "maybe", "completed"),
    ("safepoint_steps", "error", "[1]", None),
    ("safepoint_operations", "state", "teleported", "prepared"),
    ("safepoint_operations", "receipt", "{", None),
    ("safepoint_attempts", "kind", "nope", "read"),
    ("safepoint_attempts", "error", "[1]", dumps({"type": "TimeoutError", "message": "attempt 1"})),
]


class UnreadableTests(ConformanceBase):
    """The conformance tests of rows that cannot be read."""

    @pytest.mark.parametrize(("column", "value", "repair"), RUN_COLUMNS, ids=[c for c, _, _ in RUN_COLUMNS])
    def test_a_run_row_that_cannot_be_read_is_a_corrupt_record_naming_the_column(
        self, column: str, value: str, repair: Any
    ) -> None:
        store = self.store()
        run = self.submit(store)
        self.damage(store, "safepoint_runs", column, value, repair=repair, run_id=run.run_id)
        for read in (store.get_run, store.load_ledger):
            with pytest.raises(CorruptRecord) as corrupt:
                read(run.run_id)
            assert corrupt.value.table == "safepoint_runs"
            assert run.run_id in corrupt.value.key
            assert column in corrupt.value.reason
        found = store.find_run(run.run_id)
        assert isinstance(found, UnreadableRun)
        assert (found.run_id, found.columns) == (run.run_id, (column,))
        with pytest.raises(CorruptRecord):  # kept as it is: still unreadable
            store.get_run(run.run_id)

    @pytest.mark.parametrize(
        ("table", "column", "value", "repair"),
        LEDGER_COLUMNS,
        ids=[f"{t.removeprefix('safepoint_')}.{c}" for t, c, _, _ in LEDGER_COLUMNS],
    )
    def test_a_ledger_row_that_cannot_be_read_is_a_corrupt_record_naming_the_column(
        self, table: str, column: str, value: str, repair: Any
    ) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.record_attempt(claim, make_attempt(run.run_id, "look", 1))
        op, payload = make_operation(run.run_id, "op-1")
        store.prepare_effect(claim, op, payload)
        self.damage(store, table, column, value, repair=repair, run_id=run.run_id)
        with pytest.raises(CorruptRecord) as corrupt:
            store.load_ledger(run.run_id)
        assert corrupt.value.table == table
        assert column in corrupt.value.reason
        assert isinstance(store.get_run(run.run_id), RunRecord)  # the run's own row is fine

    def test_an_event_that_cannot_be_read_is_a_corrupt_record(self) -> None:
        store = self.store()
        run = self.submit(store)
        [event] = store.events(run.run_id)
        self.damage(store, "safepoint_events", "detail", "{", repair=None, event_id=event.event_id)
        with pytest.raises(CorruptRecord) as corrupt:
            store.events(run.run_id)
        assert corrupt.value.table == "safepoint_events"
        assert "detail" in corrupt.value.reason

    @exercises(VALUES, ACROSS_RUNS)
    def test_listings_show_an_unreadable_run_with_what_can_be_read(self) -> None:
        store = self.store()
        bad = self.submit(store)
        good = self.submit(store)
        self.damage(store, "safepoint_runs", "inputs", "{not json", repair=INPUTS, run_id=bad.run_id)
        listed = {run.run_id: run for run in store.list_runs(limit=100)}
        assert listed[good.run_id] == store.get_run(good.run_id)
        unreadable = listed[bad.run_id]
        assert unreadable == store.find_run(bad.run_id)
        assert isinstance(unreadable, UnreadableRun)
        assert (
            unreadable.workflow,
            unreadable.workflow_version,
            unreadable.status,
            unreadable.state_revision,
            unreadable.fence,
            unreadable.owner,
            unreadable.created_at,
            unreadable.columns,
        ) == (
            self.workflow,
            "v1",
            RunStatus.PENDING,
            bad.state_revision,
            0,
            None,
            bad.created_at,
            ("inputs",),
        )
        assert "inputs" in unreadable.reason
        assert "{not json" in unreadable.reason
        pending = {run.run_id for run in store.list_runs(RunStatus.PENDING, 100)}
        assert {bad.run_id, good.run_id} <= pending
        with pytest.raises(RunNotFound):
            store.find_run(f"{bad.run_id}-missing")

    @exercises(VALUES, CLAIMS)
    def test_an_unreadable_run_is_claimed_once_and_blocked_without_reading_it(self) -> None:
        store = self.store()
        bad = self.submit(store)
        self.damage(store, "safepoint_runs", "workflow_manifest", "[1]", repair=None, run_id=bad.run_id)
        claim = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert claim is not None
        assert claim.run_id == bad.run_id
        record = {
            "schema_version": 1,
            "phase": "unreadable_record",
            "reason": "manifest",
            "state_revision": None,
            "evidence_refs": [],
        }
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        blocked = store.find_run(bad.run_id)
        assert isinstance(blocked, UnreadableRun)
        assert blocked.status is RunStatus.BLOCKED
        assert blocked.recovery_record is not None
        assert blocked.recovery_record["phase"] == "unreadable_record"
        assert blocked.columns == ("workflow_manifest",)

    @exercises(VALUES, CLAIMS, ACROSS_RUNS)
    def test_a_run_whose_status_is_unknown_is_listed_and_never_claimed(self) -> None:
        store = self.store()
        bad = self.submit(store)
        self.damage(store, "safepoint_runs", "status", "teleported", repair="pending", run_id=bad.run_id)
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        with pytest.raises(CorruptRecord, match="status"):
            store.get_run(bad.run_id)
        found = store.find_run(bad.run_id)
        assert isinstance(found, UnreadableRun)
        assert (found.status, found.columns) == (None, ("status",))
        assert "teleported" in found.reason
        assert bad.run_id in {run.run_id for run in store.list_runs(limit=100)}

    def test_a_person_cannot_cancel_or_resolve_a_run_nobody_can_read(self) -> None:
        store = self.store()
        pending = self.submit(store)
        _, claim = self.start(store)
        store.finish_run(
            claim,
            RunStatus.BLOCKED,
            recovery_record={"schema_version": 1, "phase": "unreadable_record", "state_revision": None},
        )
        blocked = store.get_run(claim.run_id)
        for run in (pending, blocked):
            self.damage(store, "safepoint_runs", "inputs", "{not json", repair=INPUTS, run_id=run.run_id)
        with pytest.raises(CorruptRecord):
            store.request_cancel(pending.run_id, by="ana")
        with pytest.raises(CorruptRecord):
            store.resolve(
                blocked.run_id, blocked.state_revision, Resolution(ResolutionAction.ABANDON, by="ana")
            )
        for run in (pending, blocked):
            found = store.find_run(run.run_id)
            assert (found.status, found.state_revision) == (run.status, run.state_revision)

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_prune_keeps_a_chain_with_a_run_whose_status_is_unknown(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        child, child_claim = store.continue_as_new(claim, self.successor(run.run_id))
        assert child_claim is not None
        store.finish_run(child_claim, RunStatus.COMPLETED)
        self.damage(store, "safepoint_runs", "status", "teleported", repair="continued", run_id=run.run_id)
        prune = PruneRequest(statuses=PRUNABLE, before=store.now() + 1_000, workflow=self.workflow)
        batch = store.prune_runs(prune)
        assert batch.runs == ()
        [kept] = batch.kept
        assert kept.run_id == child.run_id
        assert run.run_id in kept.reason
        assert "teleported" in kept.reason
        assert isinstance(store.find_run(run.run_id), UnreadableRun)
        assert store.get_run(child.run_id).status is RunStatus.COMPLETED
