"""The store conformance suite: the one definition of a correct ledger store.

``safepoint.storage.base.Store`` only names the operations; this suite says what they must do.
Every store — SQLite on a file, SQLite in memory, PostgreSQL, yours — runs the same tests, and a
store is correct when it passes them (the suite, not inheritance, defines a correct store).

Adopting it takes one subclass in a pytest test file::

    from safepoint.storage import Store, open_store
    from safepoint.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        def make_store(self) -> Store:
            return open_store(f"sqlite:///{self.tmp_path / 'ledger.db'}")

``make_store`` returns an open, migrated store. It is called several times in one test (the
concurrency tests give every thread its own store object) and may return the same database —
or even the same object — each time. ``self.tmp_path`` is pytest's per-test directory. Every
store it returns is passed to ``close_store`` when the test ends; override that when the
subclass shares one store object across tests.

The suite runs against a shared database too (one PostgreSQL database for all tests): every test
uses its own uuid-suffixed run ids and workflow names and never assumes the store is empty.
Time is real — a store's "now" may come from the database clock — so tests that need a lease to
expire use tiny leases and short sleeps; the whole suite takes a few seconds per store.

An asyncio store (``safepoint.storage.base.AsyncStore``) runs the same suite through
``SyncOverAsync``, which runs its coroutines on an event loop of its own::

    class TestMyAsyncStore(StoreConformance):
        def make_store(self) -> Store:
            return SyncOverAsync(lambda: MyAsyncStore.open(URL))

Requires pytest (a dev dependency of safepoint, not a runtime one). The asserts live in this
module, not in a test file, so for readable failures add to your ``conftest.py``::

    pytest.register_assert_rewrite("safepoint.testing.conformance")
"""

from __future__ import annotations

import abc
import contextlib
import functools
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .._canonical import canonical, digest, dumps
from ..errors import (
    ApprovalInvalid,
    ApprovalRefused,
    ArtifactMissing,
    Cancelled,
    DeadlineExceeded,
    HistoryLimitReached,
    HistoryWarning,
    LostOwnership,
    ResolutionRefused,
    RunConflict,
    RunNotFound,
    StoreError,
)
from ..storage.base import INLINE_LIMIT, NewRun, Replan, Store
from ..types import (
    JSON,
    ApprovalGate,
    ApprovalRequest,
    ApprovalRevocation,
    AttemptRecord,
    Claim,
    EffectState,
    EventRecord,
    Ledger,
    OperationRecord,
    Resolution,
    ResolutionAction,
    Retry,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
)
from .sync_over_async import SyncOverAsync

__all__ = ["StoreConformance", "SyncOverAsync"]

T = TypeVar("T")

LONG_LEASE_MS = 60_000   # a lease that outlives any test
# A store may estimate its database's clock between readings (the PostgreSQL stores do, to
# within half a round trip and a rounding): a time the server stamped is compared with
# readings of ``now()`` taken around it with this much slack.
CLOCK_SLACK_MS = 5


def stamped_between(low: int, stamped: int | None, high: int) -> bool:
    """``stamped`` (a time the store wrote) lies between two readings of its ``now()``."""
    return stamped is not None and low - CLOCK_SLACK_MS <= stamped <= high + CLOCK_SLACK_MS
SHORT_LEASE_MS = 40      # a lease that a test lets expire ...
EXPIRY_WAIT_S = 0.1      # ... by sleeping this long
LARGE = "é" + "x" * INLINE_LIMIT   # any value holding this is larger than INLINE_LIMIT


def _uid() -> str:
    return uuid.uuid4().hex[:12]


def expire() -> None:
    """Sleep past every SHORT_LEASE_MS lease granted so far."""
    time.sleep(EXPIRY_WAIT_S)


def make_step(run_id: str, step_id: str, seq: int, **fields: Any) -> StepRecord:
    fields.setdefault("kind", StepKind.PURE)
    fields.setdefault("name", f"fn.{step_id}")
    fields.setdefault("input_hash", f"hash-{step_id}")
    fields.setdefault("result", {"step": step_id})
    return StepRecord(run_id=run_id, step_id=step_id, seq=seq, **fields)


def make_operation(run_id: str, operation_id: str, payload: JSON = None) -> tuple[OperationRecord, bytes]:
    data = canonical(payload if payload is not None else {"op": operation_id, "amount": 5})
    op = OperationRecord(run_id=run_id, operation_id=operation_id, step_id=f"step.{operation_id}",
                         effect="ticket.create", state=EffectState.PREPARED,
                         payload_ref=digest(data), effect_key=f"key-{_uid()}")
    return op, data


def make_attempt(run_id: str, step_id: str, attempt: int, **fields: Any) -> AttemptRecord:
    fields.setdefault("kind", StepKind.READ)
    fields.setdefault("name", f"fn.{step_id}")
    fields.setdefault("input_hash", f"hash-{step_id}")
    fields.setdefault("error", {"type": "TimeoutError", "message": f"attempt {attempt}"})
    fields.setdefault("retry_at", 1_000 * attempt)
    return AttemptRecord(run_id=run_id, step_id=step_id, attempt=attempt, **fields)


def in_threads(*calls: Callable[[], T]) -> list[T]:
    """Run each call on its own thread, released together by a barrier; re-raise any error."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def body(index: int, call: Callable[[], T]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except BaseException as exc:  # LostOwnership included: the test must see it
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    if errors:
        raise errors[0]
    return results


class StoreConformance(abc.ABC):
    """Subclass in a test module and implement ``make_store``; pytest collects the tests."""

    tmp_path: Path
    workflow: str

    @abc.abstractmethod
    def make_store(self) -> Store:
        """An open, migrated store; may return the same database (or object) every time."""

    def close_store(self, store: Store) -> None:
        """Called once per distinct store object ``make_store`` returned, after each test."""
        store.close()

    @pytest.fixture(autouse=True)
    def _conformance_setup(self, tmp_path: Path) -> Iterator[None]:
        self.tmp_path = tmp_path
        self.workflow = f"conformance-{_uid()}"
        self._opened: list[Store] = []
        yield
        closed: set[int] = set()
        for store in reversed(self._opened):
            if id(store) not in closed:
                closed.add(id(store))
                self.close_store(store)

    # -- helpers -------------------------------------------------------------------------------

    def store(self) -> Store:
        store = self.make_store()
        self._opened.append(store)
        return store

    def new_run(self, store: Store, *, owner: str | None = "worker-a",
                lease_ms: int = LONG_LEASE_MS, inputs: JSON = None, workflow: str | None = None,
                run_id: str | None = None,
                history: tuple[int | None, int | None] = (None, None),
                ) -> tuple[RunRecord, Claim | None]:
        new = NewRun(run_id=run_id or f"run-{_uid()}", workflow=workflow or self.workflow,
                     workflow_version="v1", input_hash=f"inputs-{_uid()}",
                     inputs={"args": [1], "kwargs": {}} if inputs is None else inputs,
                     owner=owner, lease_ms=lease_ms, history_soft_limit=history[0],
                     history_hard_limit=history[1])
        return store.create_run(new)

    def successor(self, run_id: str, *, owner: str | None = "worker-a", n: int = 1,
                  **fields: Any) -> NewRun:
        """The NewRun that continues ``run_id`` (its id as the engine would choose it)."""
        fields.setdefault("inputs", {"args": [n], "kwargs": {}})
        return NewRun(run_id=f"{run_id}~{n}", workflow=self.workflow, workflow_version="v1",
                      input_hash=f"inputs-{_uid()}", owner=owner, lease_ms=LONG_LEASE_MS,
                      **fields)

    def start(self, store: Store, *, owner: str = "worker-a", lease_ms: int = LONG_LEASE_MS,
              **kw: Any) -> tuple[RunRecord, Claim]:
        run, claim = self.new_run(store, owner=owner, lease_ms=lease_ms, **kw)
        assert claim is not None
        return run, claim

    def submit(self, store: Store, **kw: Any) -> RunRecord:
        run, claim = self.new_run(store, owner=None, **kw)
        assert claim is None
        return run

    def take_over(self, store: Store, run_id: str, owner: str = "worker-b") -> Claim:
        """Claim a run whose short lease has expired, as another worker."""
        expire()
        claim = store.claim_run(run_id, store.get_run(run_id).state_revision, owner, LONG_LEASE_MS)
        assert claim is not None
        return claim

    @staticmethod
    def snapshot(store: Store, run_id: str) -> tuple[Ledger, list[EventRecord]]:
        return store.load_ledger(run_id), store.events(run_id)

    # -- creating and reading runs -------------------------------------------------------------

    def test_create_run_claimed_by_its_starter(self) -> None:
        store = self.store()
        t0 = store.now()
        run, claim = self.start(store, owner="worker-a", inputs={"case": "8472"})
        t1 = store.now()
        assert (run.status, run.owner, run.fence, run.resume_count) == (
            RunStatus.RUNNING, "worker-a", 1, 0)
        assert (run.workflow, run.workflow_version, run.inputs) == (self.workflow, "v1",
                                                                    {"case": "8472"})
        assert run.lease_expires_at is not None
        assert stamped_between(t0 + LONG_LEASE_MS, run.lease_expires_at, t1 + LONG_LEASE_MS)
        assert stamped_between(t0, run.created_at, t1)
        assert (run.result, run.error, run.recovery_record) == (None, None, None)
        assert claim == Claim(run.run_id, "worker-a", 1, run.state_revision,
                              run.lease_expires_at, LONG_LEASE_MS)
        assert store.get_run(run.run_id) == run
        [event] = store.events(run.run_id)
        assert (event.kind, event.fence, event.worker) == ("run.started", 1, "worker-a")

    def test_create_run_without_owner_is_pending(self) -> None:
        store = self.store()
        run, claim = self.new_run(store, owner=None)
        assert claim is None
        assert (run.status, run.owner, run.lease_expires_at, run.fence, run.resume_count) == (
            RunStatus.PENDING, None, None, 0, 0)
        assert store.get_run(run.run_id) == run

    def test_creating_an_existing_run_returns_it_unchanged_without_a_claim(self) -> None:
        store = self.store()
        for owner in ("worker-a", None):
            first, _ = self.new_run(store, owner=owner, inputs={"n": 1})
            before = self.snapshot(store, first.run_id)
            again, claim = self.new_run(store, owner="worker-b", inputs={"n": 2},
                                        workflow=f"{self.workflow}-other", run_id=first.run_id)
            assert claim is None
            assert again == first
            assert self.snapshot(store, first.run_id) == before

    def test_inputs_round_trip_and_large_inputs_are_artifacts(self) -> None:
        store = self.store()
        small = {"text": "naïve ✓", "n": [1, 2.5, None, True], "nested": {"k": {}}}
        run, _ = self.start(store, inputs=small)
        assert store.get_run(run.run_id).inputs == small
        large = {"doc": LARGE, "n": 1}
        run, _ = self.start(store, inputs=large)
        assert run.inputs == large
        assert store.load_ledger(run.run_id).run.inputs == large
        # A large value is stored once, as the artifact of its stored JSON text (UTF-8).
        text = dumps(large).encode()
        assert store.get_artifact(digest(text)) == text

    def test_unknown_run_is_run_not_found(self) -> None:
        store = self.store()
        missing = f"missing-{_uid()}"
        with pytest.raises(RunNotFound) as error:
            store.get_run(missing)
        assert error.value.run_id == missing  # type: ignore[attr-defined]
        with pytest.raises(RunNotFound):
            store.load_ledger(missing)

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

    # -- claiming ------------------------------------------------------------------------------

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
        assert (claim.owner, claim.fence, claim.lease_ms) == ("worker-b", old.fence + 1,
                                                              LONG_LEASE_MS)
        assert (now.status, now.owner, now.fence, now.resume_count) == (
            RunStatus.RUNNING, "worker-b", 2, 1)
        assert now.state_revision > moved.state_revision
        assert (claim.state_revision, claim.lease_expires_at) == (now.state_revision,
                                                                  now.lease_expires_at)
        assert stamped_between(t0 + LONG_LEASE_MS, claim.lease_expires_at, t1 + LONG_LEASE_MS)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.fence, event.worker) == ("run.claimed", 2, "worker-b")

    def test_a_live_lease_is_taken_only_from_a_named_dead_owner(self) -> None:
        store = self.store()
        run, _ = self.start(store, owner="worker-a")
        for dead_owner in (None, "worker-x"):
            assert store.claim_run(run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS,
                                   dead_owner=dead_owner) is None
        assert store.get_run(run.run_id) == run
        claim = store.claim_run(run.run_id, run.state_revision, "worker-b", LONG_LEASE_MS,
                                dead_owner="worker-a")
        assert claim is not None
        assert (claim.fence, store.get_run(run.run_id).owner) == (2, "worker-b")
        assert store.events(run.run_id)[-1].kind == "run.claimed"

    @pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED])
    def test_an_ended_run_cannot_be_claimed(self, status: RunStatus) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.finish_run(claim, status, result=1 if status is RunStatus.COMPLETED else None,
                         error={"type": "E", "message": "m"} if status is RunStatus.FAILED else None)
        ended = store.get_run(run.run_id)
        assert store.claim_run(run.run_id, ended.state_revision, "worker-b", LONG_LEASE_MS) is None
        assert store.claim_run(run.run_id, ended.state_revision, "worker-b", LONG_LEASE_MS,
                               dead_owner="worker-a") is None
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        assert store.get_run(run.run_id) == ended

    def test_concurrent_claimers_of_one_revision_have_exactly_one_winner(self) -> None:
        stores = [self.store(), self.store()]
        runs = [self.submit(stores[0]) for _ in range(10)]
        runs += [self.start(stores[0], lease_ms=SHORT_LEASE_MS)[0] for _ in range(10)]
        expire()
        for run in runs:
            claims = in_threads(*[
                (lambda s=s, w=f"worker-{i}", r=run: s.claim_run(r.run_id, r.state_revision, w,
                                                                 LONG_LEASE_MS))
                for i, s in enumerate(stores)])
            winners = [c for c in claims if c is not None]
            assert len(winners) == 1, f"{len(winners)} winners for {run.run_id}"
            now = stores[0].get_run(run.run_id)
            assert (now.owner, now.fence) == (winners[0].owner, run.fence + 1)

    def test_a_released_run_is_runnable_again(self) -> None:
        """A worker stopped on purpose releases its run: any worker may take it at once."""
        store = self.store()
        run, claim = self.start(store, lease_ms=LONG_LEASE_MS)
        store.release_run(claim)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert (taken.run_id, taken.fence) == (run.run_id, claim.fence + 1)

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
            store.finish_run(claim, status, recovery_record={"phase": "x"}
                             if status is RunStatus.BLOCKED else None)
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
            assert (run.status, run.owner, run.fence) == (RunStatus.RUNNING, "worker-b",
                                                          claim.fence)
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

    def test_resolving_applied_accepts_the_operation_and_releases_the_run(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        decision = Resolution(ResolutionAction.APPLIED, by="ana", operation_id=op_id,
                              receipt={"id": "tk_9"}, evidence="owner log")
        resolved = store.resolve(run.run_id, run.state_revision, decision)
        assert (resolved.status, resolved.owner, resolved.recovery_record) == (
            RunStatus.RUNNING, None, None)
        assert resolved.state_revision == run.state_revision + 1
        op = store.load_ledger(run.run_id).operations[op_id]
        assert (op.state, op.receipt) == (EffectState.ACCEPTED, {"id": "tk_9"})
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.worker, event.operation_id) == ("run.resolved", "ana", op_id)
        assert event.detail == decision.detail()
        again = store.resolve(run.run_id, run.state_revision, decision)  # harmless repeat
        assert again.state_revision == resolved.state_revision
        with pytest.raises(ResolutionRefused):  # another decision on the old revision
            store.resolve(run.run_id, run.state_revision,
                          replace(decision, action=ResolutionAction.NOT_APPLIED))
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id  # released: any worker may carry it on

    def test_resolving_not_applied_prepares_the_operation_afresh(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        store.resolve(run.run_id, run.state_revision,
                      Resolution(ResolutionAction.NOT_APPLIED, by="bo", operation_id=op_id))
        op = store.load_ledger(run.run_id).operations[op_id]
        assert (op.state, op.first_dispatched_at, op.dispatch_count) == (
            EffectState.PREPARED, None, 1)

    def test_abandoning_cancels_and_a_stale_or_wrong_decision_changes_nothing(self) -> None:
        store = self.store()
        run, op_id = self._blocked_mid_dispatch(store)
        with pytest.raises(ResolutionRefused):  # an operation that is not uncertain
            store.resolve(run.run_id, run.state_revision, Resolution(
                ResolutionAction.APPLIED, by="cy", operation_id="no-such-op", receipt={}))
        with pytest.raises(ResolutionRefused):  # a revision the run has left
            store.resolve(run.run_id, run.state_revision - 1,
                          Resolution(ResolutionAction.ABANDON, by="cy"))
        assert store.get_run(run.run_id).state_revision == run.state_revision
        assert store.load_ledger(run.run_id).operations[op_id].state is EffectState.DISPATCHING
        ended = store.resolve(run.run_id, run.state_revision,
                              Resolution(ResolutionAction.ABANDON, by="cy", evidence="withdrawn"))
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
            store.record_outcome(claim, f"no-such-op-{_uid()}", EffectState.ACCEPTED,
                                 step=make_step(run.run_id, "orphan", 9))
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

    def test_the_resume_budget_is_recorded_with_the_run(self) -> None:
        store = self.store()
        run, _ = store.create_run(NewRun(
            run_id=f"budget-{_uid()}", workflow=self.workflow, workflow_version="v1",
            input_hash="h", inputs={"args": [], "kwargs": {}}, owner=None, lease_ms=0,
            resume_budget=3))
        assert run.resume_budget == 3
        assert store.get_run(run.run_id).resume_budget == 3
        unlimited, _ = store.create_run(NewRun(
            run_id=f"budget-{_uid()}", workflow=self.workflow, workflow_version="v1",
            input_hash="h", inputs={"args": [], "kwargs": {}}, owner=None, lease_ms=0))
        assert unlimited.resume_budget is None

    def test_the_workflow_fingerprint_and_manifest_are_recorded_with_the_run(self) -> None:
        store = self.store()
        manifest = {"tools": {"lookup": "sha256:ab"}, "models": ["m-1"], "prompts": {}}
        run, _ = store.create_run(NewRun(
            run_id=f"fp-{_uid()}", workflow=self.workflow, workflow_version="v1",
            input_hash="h", inputs={"args": [], "kwargs": {}}, owner=None, lease_ms=0,
            workflow_fingerprint="sha256:f1", workflow_manifest=manifest))
        again = store.get_run(run.run_id)
        assert (again.workflow_fingerprint, again.workflow_manifest) == ("sha256:f1", manifest)
        older = self.submit(store)  # a run recorded without one
        assert (older.workflow_fingerprint, older.workflow_manifest) == (None, None)

    def test_replan_adopts_the_new_code_and_records_what_it_replaced(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        manifest = {"tools": {}, "models": ["m-2"], "prompts": {}}
        store.replan(old, Replan(reason="the workflow changed", workflow_version="v2",
                                 workflow_fingerprint="sha256:f2", workflow_manifest=manifest))
        now = store.get_run(run.run_id)
        assert (now.workflow_version, now.workflow_fingerprint, now.workflow_manifest) == (
            "v2", "sha256:f2", manifest)
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
        store.record_step(claim, make_step(run.run_id, "stale", 2, kind=StepKind.READ,
                                           result={"seen": 1}, observed_at=5))
        store.record_step(claim, make_step(run.run_id, "paid", 3, kind=StepKind.EFFECT,
                                           operation_id="op-1"))
        store.record_step(claim, make_step(run.run_id, "route", 4, kind=StepKind.DECISION,
                                           result="next", next_step_id="next"))
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
        assert store.load_ledger(run.run_id).operations[op.operation_id].payload_ref == digest(
            changed)

    def test_claim_next_by_version_leaves_other_versions_alone(self) -> None:
        """In a rolling deploy an old worker must not take (and then block) a newer run."""
        store = self.store()
        pending = self.submit(store)  # recorded as version v1
        assert store.claim_next("worker-old", LONG_LEASE_MS, [f"{self.workflow}@v0"]) is None
        got = store.claim_next("worker-new", LONG_LEASE_MS, [f"{self.workflow}@v1"])
        assert got is not None
        assert got.run_id == pending.run_id

    def test_concurrent_claim_next_never_hands_out_a_run_twice(self) -> None:
        stores = [self.store() for _ in range(4)]
        mine = {self.submit(stores[0]).run_id for _ in range(24)}

        def drain(store: Store, owner: str) -> list[str]:
            got = []
            while (claim := store.claim_next(owner, LONG_LEASE_MS, [self.workflow])) is not None:
                got.append(claim.run_id)
            return got

        taken = in_threads(*[(lambda s=s, w=f"worker-{i}": drain(s, w))
                             for i, s in enumerate(stores)])
        flat = [run_id for got in taken for run_id in got]
        assert len(flat) == len(set(flat)), "a run was claimed twice"
        assert set(flat) == mine
        assert {stores[0].get_run(r).fence for r in mine} == {1}

    # -- fencing -------------------------------------------------------------------------------

    def _stale_writes(self, store: Store, claim: Claim,
                      op_id: str) -> tuple[dict[str, Callable[[], Any]], list[str]]:
        """Every worker write, as ``claim`` would make it, and the artifacts they would store
        (unique to this call: a refused write stores none of them)."""
        run_id = claim.run_id
        new_op, payload = make_operation(run_id, f"op-{_uid()}")
        large = {"blob": LARGE, "stale": _uid()}
        return {
            "record_step (new)": lambda: store.record_step(claim, make_step(run_id, "s2", 2)),
            "record_step (re-record)": lambda: store.record_step(
                claim, make_step(run_id, "s1", 1, result="stale")),
            "record_attempt": lambda: store.record_attempt(claim, make_attempt(run_id, "s9", 1)),
            "prepare_effect": lambda: store.prepare_effect(claim, new_op, payload),
            "mark_dispatching": lambda: store.mark_dispatching(claim, op_id),
            "prepare_and_mark_dispatching": lambda: store.prepare_and_mark_dispatching(
                claim, new_op, payload),
            "record_outcome": lambda: store.record_outcome(
                claim, op_id, EffectState.ACCEPTED, receipt={"id": 1},
                step=make_step(run_id, "step.x", 3, kind=StepKind.EFFECT, operation_id=op_id)),
            "record_outcome (large result)": lambda: store.record_outcome(
                claim, op_id, EffectState.ACCEPTED, receipt=large,
                step=make_step(run_id, "step.x", 3, kind=StepKind.EFFECT, operation_id=op_id,
                               result=large)),
            "finish_run": lambda: store.finish_run(claim, RunStatus.COMPLETED, result="stale"),
            "renew_lease": lambda: store.renew_lease(claim),
            "continue_as_new": lambda: store.continue_as_new(
                claim, self.successor(run_id, n=99)),
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

    @pytest.mark.parametrize("status", [RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.BLOCKED])
    def test_an_ended_run_refuses_every_worker_write(self, status: RunStatus) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.finish_run(claim, status, recovery_record={"phase": "x"}
                         if status is RunStatus.BLOCKED else None)
        self._assert_stale_claim_writes_nothing(store, claim, op.operation_id)

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
        assert claim.fence == new.fence + 1

    # -- steps ---------------------------------------------------------------------------------

    def test_record_step_round_trips_every_field_in_seq_order(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        rid = run.run_id
        steps = [
            make_step(rid, "z.read", 1, kind=StepKind.READ, result=[{"row": 1}],
                      observed_at=store.now() - 5, attempt=3),
            make_step(rid, "y.model", 2, kind=StepKind.MODEL, result={"text": "hi ✓"},
                      model_id="model-1", prompt_hash="prompt-abc"),
            make_step(rid, "x.decide", 3, kind=StepKind.DECISION, result="x.next",
                      next_step_id="x.next"),
            make_step(rid, "w.effect", 4, kind=StepKind.EFFECT, result={"id": "T-1"},
                      operation_id="ticket:1"),
            make_step(rid, "v.value", 5, kind=StepKind.VALUE, result=1712000000123),
            make_step(rid, "u.pure", 6, result=None),
            make_step(rid, "t.failed", 7, status=StepStatus.FAILED, result=None,
                      error={"type": "KeyError", "message": "'x'"}),
            make_step(rid, "s.large", 8, result={"blob": LARGE}),
        ]
        t0 = store.now()
        for step in steps:
            store.record_step(claim, step)
        t1 = store.now()
        ledger = store.load_ledger(rid)
        assert list(ledger.steps) == [s.step_id for s in steps]
        for step in steps:
            loaded = ledger.steps[step.step_id]
            assert stamped_between(t0, loaded.recorded_at, t1)
            assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        text = dumps({"blob": LARGE}).encode()
        assert store.get_artifact(digest(text)) == text

    def test_record_steps_writes_a_batch_in_one_commit_with_every_field(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        rid = run.run_id
        steps = [
            make_step(rid, "a.pure", 1, result={"n": 1}),
            make_step(rid, "b.large", 2, result={"blob": LARGE}),
            make_step(rid, "c.model", 3, kind=StepKind.MODEL, result={"text": "hi"},
                      model_id="model-1", prompt_hash="p", tokens=12, cost=0.5),
        ]
        before = store.get_run(rid)
        store.record_steps(claim, steps)
        store.record_steps(claim, [])  # nothing to write: nothing written
        ledger = store.load_ledger(rid)
        assert list(ledger.steps) == ["a.pure", "b.large", "c.model"]
        for step in steps:
            loaded = ledger.steps[step.step_id]
            assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        assert ledger.run.step_count == before.step_count + 3
        assert ledger.run.state_revision == before.state_revision + 1  # one commit
        assert (ledger.run.tokens_spent, ledger.run.cost_spent) == (12, 0.5)
        # a step recorded again counts once in the history; a new one counts
        store.record_steps(claim, [replace(steps[0], result={"n": 2}),
                                   make_step(rid, "d.pure", 4)])
        again = store.load_ledger(rid)
        assert again.steps["a.pure"].result == {"n": 2}
        assert again.run.step_count == before.step_count + 4

    def test_record_steps_is_fenced_and_held_to_the_limits_like_record_step(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        claim = self.take_over(store, run.run_id)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(LostOwnership):
            store.record_steps(old, [make_step(run.run_id, "stale", 1)])
        assert self.snapshot(store, run.run_id) == before
        limited, capped = self.start(store, history=(None, 4))
        size = store.get_run(limited.run_id).history_size
        batch = [make_step(limited.run_id, f"s{i}", i) for i in range(1, 6 - size)]
        with pytest.raises(HistoryLimitReached):
            store.record_steps(capped, batch)
        assert store.load_ledger(limited.run_id).steps == {}
        store.request_cancel(run.run_id, "ops")
        with pytest.raises(Cancelled):
            store.record_steps(claim, [make_step(run.run_id, "late", 1)])

    def test_a_re_recorded_step_replaces_its_row_and_keeps_its_seq(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "read", 1, kind=StepKind.READ,
                                           observed_at=1, result="old"))
        store.record_step(claim, make_step(run.run_id, "after", 2))
        again = make_step(run.run_id, "read", 9, kind=StepKind.READ, input_hash="hash-2",
                          observed_at=2, attempt=2, result={"blob": LARGE})
        store.record_step(claim, again)
        ledger = store.load_ledger(run.run_id)
        loaded = ledger.steps["read"]
        assert loaded == replace(again, seq=1, fence=claim.fence, recorded_at=loaded.recorded_at)
        assert list(ledger.steps) == ["read", "after"]
        failed = replace(again, status=StepStatus.FAILED, result=None, error={"type": "E"},
                         next_step_id=None)
        store.record_step(claim, failed)
        loaded = store.load_ledger(run.run_id).steps["read"]
        assert loaded == replace(failed, seq=1, fence=claim.fence, recorded_at=loaded.recorded_at)

    def test_a_re_recorded_step_replaces_every_recorded_field(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s", 1, kind=StepKind.MODEL,
                                           model_id="model-1", prompt_hash="p-1"))
        again = make_step(run.run_id, "s", 1, kind=StepKind.DECISION, name="fn.other",
                          model_id="model-2", prompt_hash="p-2", next_step_id="n",
                          operation_id="op-2", result="n")
        store.record_step(claim, again)
        loaded = store.load_ledger(run.run_id).steps["s"]
        assert loaded == replace(again, fence=claim.fence, recorded_at=loaded.recorded_at)

    # -- effects -------------------------------------------------------------------------------

    def test_prepare_effect_stores_the_payload_and_a_prepared_operation(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"ticket:create:{_uid()}", {"to": "ana", "n": 1})
        t0 = store.now()
        store.prepare_effect(claim, op, payload)
        t1 = store.now()
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert stamped_between(t0, stored.prepared_at, t1)
        assert stored == replace(op, fence=claim.fence, prepared_at=stored.prepared_at,
                                 updated_at=stored.updated_at)
        assert (stored.state, stored.dispatch_count, stored.first_dispatched_at) == (
            EffectState.PREPARED, 0, None)
        assert store.get_artifact(op.payload_ref) == payload
        raw = b"\x00\xff not utf-8 \xfe"
        op2 = replace(op, operation_id=f"raw-{_uid()}", payload_ref=digest(raw))
        store.prepare_effect(claim, op2, raw)
        assert store.get_artifact(digest(raw)) == raw

    def test_prepare_effect_refuses_a_payload_that_does_not_match_its_digest(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, _ = make_operation(run.run_id, f"op-{_uid()}")
        before = self.snapshot(store, run.run_id)
        with pytest.raises((ValueError, StoreError)):
            store.prepare_effect(claim, op, b'{"other":"bytes"}')
        assert self.snapshot(store, run.run_id) == before

    def test_mark_dispatching_counts_dispatches_and_keeps_the_first_time(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        t0 = store.now()
        first = store.mark_dispatching(claim, op.operation_id)
        t1 = store.now()
        assert (first.state, first.dispatch_count, first.fence) == (
            EffectState.DISPATCHING, 1, claim.fence)
        assert first.first_dispatched_at is not None
        assert stamped_between(t0, first.first_dispatched_at, t1)
        assert store.load_ledger(run.run_id).operations[op.operation_id] == first
        # unknown → dispatching, prepared (NotSent) → dispatching, dispatching → dispatching
        for count, before in enumerate((EffectState.UNKNOWN, EffectState.PREPARED, None), 2):
            time.sleep(0.005)
            if before is not None:
                store.record_outcome(claim, op.operation_id, before, error={"type": "Timeout"})
            again = store.mark_dispatching(claim, op.operation_id)
            assert (again.state, again.dispatch_count) == (EffectState.DISPATCHING, count)
            assert again.first_dispatched_at == first.first_dispatched_at
            assert (again.effect_key, again.payload_ref) == (op.effect_key, op.payload_ref)
            assert store.load_ledger(run.run_id).operations[op.operation_id] == again

    @pytest.mark.parametrize("settled", [EffectState.ACCEPTED, EffectState.REJECTED,
                                         EffectState.APPLIED])
    def test_a_settled_operation_is_never_dispatched_again(self, settled: EffectState) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        evidence = {"status": 402, "reason": "card declined"}
        store.record_outcome(claim, op.operation_id, settled, receipt={"id": 1}, error=evidence)
        before = self.snapshot(store, run.run_id)
        stored = before[0].operations[op.operation_id]
        assert (stored.state, stored.receipt, stored.error) == (settled, {"id": 1}, evidence)
        with pytest.raises(StoreError):
            store.mark_dispatching(claim, op.operation_id)
        with pytest.raises(StoreError):
            store.mark_dispatching(claim, f"no-such-op-{_uid()}")
        assert self.snapshot(store, run.run_id) == before

    def test_prepare_and_mark_dispatching_leaves_what_the_two_writes_leave(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        apart, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, apart, payload)
        store.mark_dispatching(claim, apart.operation_id)
        before = store.get_run(run.run_id)
        op, data = make_operation(run.run_id, f"op-{_uid()}", {"to": "ana", "n": 2})
        t0 = store.now()
        got = store.prepare_and_mark_dispatching(claim, op, data)
        t1 = store.now()
        assert (got.state, got.dispatch_count, got.fence) == (
            EffectState.DISPATCHING, 1, claim.fence)
        assert got.first_dispatched_at is not None
        assert stamped_between(t0, got.prepared_at, t1)
        assert stamped_between(t0, got.first_dispatched_at, t1)
        assert got.prepared_at <= (got.first_dispatched_at or 0)  # both the server's clock
        assert (got.effect_key, got.payload_ref, got.step_id, got.effect) == (
            op.effect_key, op.payload_ref, op.step_id, op.effect)
        ledger, events = self.snapshot(store, run.run_id)
        assert ledger.operations[op.operation_id] == got
        assert store.get_artifact(op.payload_ref) == data
        assert [(e.kind, e.step_id, e.fence, e.worker, e.detail) for e in events
                if e.operation_id == op.operation_id] == [
            ("effect.prepared", op.step_id, claim.fence, "worker-a",
             {"effect": op.effect, "payload_ref": op.payload_ref}),
            ("effect.dispatching", op.step_id, claim.fence, "worker-a", {"dispatch": 1})]
        # the history and the revision move as the two writes move them
        assert ledger.run.event_count == len(events) == before.event_count + 2
        assert ledger.run.state_revision - before.state_revision == (
            before.state_revision - run.state_revision)
        # the operation goes on as any other: an outcome, or another dispatch
        store.record_outcome(claim, op.operation_id, EffectState.UNKNOWN,
                             error={"type": "Timeout"})
        again = store.mark_dispatching(claim, op.operation_id)
        assert (again.dispatch_count, again.first_dispatched_at) == (2,
                                                                     got.first_dispatched_at)

    def test_prepare_and_mark_dispatching_refuses_whole(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        before = self.snapshot(store, run.run_id)
        with pytest.raises((ValueError, StoreError)):  # bytes that do not match the digest
            store.prepare_and_mark_dispatching(claim, op, b'{"other":"bytes"}')
        with pytest.raises(ValueError, match="approval"):  # a gate stands between the two
            store.prepare_and_mark_dispatching(
                claim, replace(op, approval_required=True, target_digest=self.TARGET), payload)
        assert self.snapshot(store, run.run_id) == before
        store.prepare_effect(claim, op, payload)
        prepared = self.snapshot(store, run.run_id)
        with pytest.raises(StoreError):  # prepared already: it does not go on to dispatching
            store.prepare_and_mark_dispatching(claim, op, payload)
        assert self.snapshot(store, run.run_id) == prepared

    def test_prepare_and_mark_dispatching_is_held_to_the_history_limit_as_a_prepare(
            self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(None, 3))   # history 1: run.started
        store.record_step(claim, make_step(run.run_id, "s1", 1))              # 2
        # The prepare fits (3); its "dispatching" is never held to the limit: it goes in too.
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        assert store.prepare_and_mark_dispatching(claim, op, payload).dispatch_count == 1
        assert store.get_run(run.run_id).history_size == 4
        before = self.snapshot(store, run.run_id)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        with pytest.raises(HistoryLimitReached):
            store.prepare_and_mark_dispatching(claim, second, data)
        assert self.snapshot(store, run.run_id) == before

    def test_record_outcome_writes_the_operation_and_its_step_in_one_commit(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.APPLIED, receipt={"id": "T-9"})
        applied = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (applied.state, applied.receipt, applied.error) == (EffectState.APPLIED,
                                                                   {"id": "T-9"}, None)
        step = make_step(run.run_id, op.step_id, 1, kind=StepKind.EFFECT, name=op.effect,
                         result={"id": "T-9"}, operation_id=op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": "T-9"},
                             step=step)
        ledger = store.load_ledger(run.run_id)
        accepted = ledger.operations[op.operation_id]
        assert (accepted.state, accepted.receipt, accepted.dispatch_count) == (
            EffectState.ACCEPTED, {"id": "T-9"}, 1)
        loaded = ledger.steps[op.step_id]
        assert loaded == replace(step, fence=claim.fence, recorded_at=loaded.recorded_at)
        # atomic: an outcome for an operation that does not exist writes no step either
        before = self.snapshot(store, run.run_id)
        with pytest.raises(StoreError):
            store.record_outcome(claim, f"no-such-op-{_uid()}", EffectState.ACCEPTED,
                                 step=make_step(run.run_id, "orphan", 2))
        assert self.snapshot(store, run.run_id) == before

    def test_an_outcome_with_a_large_result_keeps_it_as_an_artifact(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_and_mark_dispatching(claim, op, payload)
        receipt = {"id": "T-1", "blob": LARGE, "op": op.operation_id}
        step = make_step(run.run_id, op.step_id, 1, kind=StepKind.EFFECT, name=op.effect,
                         result=receipt, operation_id=op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt=receipt,
                             step=step)
        ledger = store.load_ledger(run.run_id)
        assert ledger.operations[op.operation_id].receipt == receipt
        assert ledger.steps[op.step_id] == replace(step, fence=claim.fence,
                                                   recorded_at=ledger.steps[op.step_id].recorded_at)
        text = dumps(receipt).encode()
        assert store.get_artifact(digest(text)) == text

    def test_effect_transitions_are_events_with_fence_and_worker(self) -> None:
        store = self.store()
        run, old = self.start(store, owner="worker-a", lease_ms=SHORT_LEASE_MS)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(old, op, payload)
        store.mark_dispatching(old, op.operation_id)
        store.record_outcome(old, op.operation_id, EffectState.UNKNOWN, error={"type": "Timeout"})
        claim = self.take_over(store, run.run_id, owner="worker-b")
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        got = [(e.kind, e.operation_id, e.fence, e.worker) for e in store.events(run.run_id)
               if e.kind.startswith("effect.")]
        assert got == [("effect.prepared", op.operation_id, 1, "worker-a"),
                       ("effect.dispatching", op.operation_id, 1, "worker-a"),
                       ("effect.unknown", op.operation_id, 1, "worker-a"),
                       ("effect.dispatching", op.operation_id, 2, "worker-b"),
                       ("effect.accepted", op.operation_id, 2, "worker-b")]

    # -- ending a run --------------------------------------------------------------------------

    @pytest.mark.parametrize("result", [{"ticket": "T-1", "ok": True}, {"blob": LARGE}])
    def test_finish_run_completed_records_the_result(self, result: JSON) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.finish_run(claim, RunStatus.COMPLETED, result=result)
        done = store.get_run(run.run_id)
        assert (done.status, done.result, done.error, done.owner) == (
            RunStatus.COMPLETED, result, None, None)
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
            RunStatus.FAILED, error, None, None)
        assert store.events(run.run_id)[-1].kind == "run.failed"

    def test_finish_run_blocked_stamps_the_new_revision_into_the_recovery_record(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        record = {"schema_version": 1, "phase": "reconcile_effect", "state_revision": 0,
                  "operation_id": "op-1", "evidence_refs": []}
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record=record)
        blocked = store.get_run(run.run_id)
        assert (blocked.status, blocked.owner) == (RunStatus.BLOCKED, None)
        assert blocked.recovery_record == {**record, "state_revision": blocked.state_revision}
        assert blocked.state_revision > claim.state_revision
        assert store.events(run.run_id)[-1].kind == "run.blocked"

    def test_renew_lease_extends_the_lease_without_moving_the_revision(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=2_000)
        time.sleep(0.02)
        t0 = store.now()
        store.renew_lease(claim)
        renewed = store.get_run(run.run_id)
        assert (renewed.lease_expires_at or 0) >= t0 + 2_000 > (run.lease_expires_at or 0)
        assert renewed.state_revision == run.state_revision
        assert len(store.events(run.run_id)) == 1  # a heartbeat is not history

    # -- artifacts, clock, wake-ups, history ---------------------------------------------------

    def test_an_unknown_artifact_is_missing(self) -> None:
        store = self.store()
        unknown = digest(f"never stored {uuid.uuid4()}".encode())
        with pytest.raises(ArtifactMissing) as error:
            store.get_artifact(unknown)
        assert error.value.digest == unknown  # type: ignore[attr-defined]

    def test_now_is_epoch_milliseconds_and_does_not_go_back(self) -> None:
        store, other = self.store(), self.store()
        first = store.now()
        assert isinstance(first, int)
        assert abs(first - time.time() * 1000) < 60_000
        readings = [store.now() for _ in range(50)]
        assert readings == sorted(readings)
        assert readings[0] >= first
        time.sleep(0.02)
        assert store.now() >= first + 15
        assert abs(other.now() - store.now()) < 1_000
        assert store.schema_version() >= 1

    def test_wait_for_work_wakes_when_another_store_submits_a_run(self) -> None:
        waiter, submitter = self.store(), self.store()
        woke: list[float] = []

        def wait() -> None:
            waiter.wait_for_work(0.01)  # start listening; settle anything queued before
            started = time.monotonic()
            waiter.wait_for_work(5.0)
            woke.append(time.monotonic() - started)

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        self.submit(submitter)
        thread.join(timeout=10)
        assert woke, "wait_for_work did not return"
        assert woke[0] < 2.0, f"woke after {woke[0]:.2f}s, not on the new run"

    def test_wait_for_work_waits_out_its_timeout_when_nothing_happens(self) -> None:
        store = self.store()
        store.wait_for_work(0.05)  # settle anything queued before this test
        started = time.monotonic()
        store.wait_for_work(0.3)
        elapsed = time.monotonic() - started
        assert 0.25 <= elapsed < 1.5

    def test_events_are_append_only_ordered_and_counted(self) -> None:
        store = self.store()
        run, old = self.start(store, lease_ms=SHORT_LEASE_MS)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(old, op, payload)
        early = store.events(run.run_id)
        claim = self.take_over(store, run.run_id)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        store.finish_run(claim, RunStatus.COMPLETED, result=None)
        events = store.events(run.run_id)
        assert events[:len(early)] == early
        assert [e.kind for e in events] == ["run.started", "effect.prepared", "run.claimed",
                                            "effect.dispatching", "effect.accepted",
                                            "run.completed"]
        assert {e.run_id for e in events} == {run.run_id}
        ids = [e.event_id for e in events]
        assert ids == sorted(set(ids))
        times = [e.at for e in events]
        assert times == sorted(times)
        assert store.get_run(run.run_id).event_count == len(events)

    # -- limits that survive restarts ----------------------------------------------------------

    def _new_limited_run(self, store: Store, *, owner: str | None = "worker-a",
                         **limits: Any) -> tuple[RunRecord, Claim | None]:
        return store.create_run(NewRun(
            run_id=f"limits-{_uid()}", workflow=self.workflow, workflow_version="v1",
            input_hash="h", inputs={"args": [], "kwargs": {}}, owner=owner,
            lease_ms=LONG_LEASE_MS if owner else 0, **limits))

    def test_limits_are_recorded_with_the_run(self) -> None:
        store = self.store()
        policy = Retry(attempts=4, backoff=0.25, multiplier=3.0, max_backoff=9.0, jitter=0.5)
        run, _ = self._new_limited_run(store, owner=None, deadline_ms=60_000,
                                       token_budget=1_000, cost_budget=2.5,
                                       step_attempts=policy)
        for seen in (run, store.get_run(run.run_id), store.load_ledger(run.run_id).run):
            assert seen.deadline_at == seen.created_at + 60_000  # counted from its creation
            assert (seen.token_budget, seen.cost_budget) == (1_000, 2.5)
            assert (seen.tokens_spent, seen.cost_spent) == (0, 0.0)
            assert seen.step_attempts is not None
            assert seen.step_attempts.as_json() == policy.as_json()
        fixed, _ = self._new_limited_run(store, owner=None, deadline_at=1_234_567_890_123)
        assert fixed.deadline_at == 1_234_567_890_123
        plain, _ = self._new_limited_run(store, owner=None)
        assert (plain.deadline_at, plain.token_budget, plain.cost_budget,
                plain.step_attempts) == (None, None, None, None)

    def test_model_usage_adds_up_on_the_run_in_the_commit_of_its_step(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=SHORT_LEASE_MS)
        store.record_step(claim, make_step(run.run_id, "m1", 1, kind=StepKind.MODEL,
                                           tokens=120, cost=0.25))
        store.record_step(claim, make_step(run.run_id, "p1", 2))  # no usage: adds nothing
        store.record_step(claim, make_step(run.run_id, "m2", 3, kind=StepKind.MODEL,
                                           tokens=30, cost=None))
        ledger = store.load_ledger(run.run_id)
        assert (ledger.steps["m1"].tokens, ledger.steps["m1"].cost) == (120, 0.25)
        assert (ledger.steps["p1"].tokens, ledger.steps["p1"].cost) == (None, None)
        assert (ledger.steps["m2"].tokens, ledger.steps["m2"].cost) == (30, None)
        assert (ledger.run.tokens_spent, ledger.run.cost_spent) == (150, 0.25)
        taken = self.take_over(store, run.run_id)  # a takeover resets nothing
        assert store.get_run(run.run_id).tokens_spent == 150
        store.finish_run(taken, RunStatus.FAILED, error={"type": "BudgetExhausted"})
        assert store.get_run(run.run_id).tokens_spent == 150

    def test_failed_attempts_are_recorded_and_loaded_by_step_and_attempt(self) -> None:
        store = self.store()
        run, claim = self.start(store, lease_ms=SHORT_LEASE_MS)
        first = make_attempt(run.run_id, "quote", 1, retry_at=store.now() + 500)
        store.record_attempt(claim, first)
        store.record_attempt(claim, make_attempt(run.run_id, "quote", 2, kind=StepKind.MODEL))
        store.record_attempt(claim, make_attempt(run.run_id, "other", 1))
        attempts = store.load_ledger(run.run_id).attempts
        assert sorted(attempts) == ["other", "quote"]
        assert [a.attempt for a in attempts["quote"]] == [1, 2]
        loaded = attempts["quote"][0]
        assert (loaded.kind, loaded.name, loaded.input_hash, loaded.error, loaded.retry_at) == (
            first.kind, first.name, first.input_hash, first.error, first.retry_at)
        assert loaded.fence == claim.fence
        assert loaded.recorded_at > 0
        assert attempts["quote"][1].kind is StepKind.MODEL
        new = self.take_over(store, run.run_id)  # the count survives a takeover
        assert [a.attempt for a in store.load_ledger(run.run_id).attempts["quote"]] == [1, 2]
        store.request_cancel(run.run_id, "ops")
        with pytest.raises(Cancelled):  # another attempt is new work
            store.record_attempt(new, make_attempt(run.run_id, "quote", 3))
        assert len(store.load_ledger(run.run_id).attempts["quote"]) == 2

    def test_the_store_refuses_new_work_past_the_deadline(self) -> None:
        store = self.store()
        run, claim = self._new_limited_run(store, deadline_ms=300)
        assert claim is not None
        assert run.deadline_at is not None
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        in_flight, data = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, in_flight, data)
        store.mark_dispatching(claim, in_flight.operation_id)
        while store.now() < run.deadline_at:
            time.sleep(0.05)
        before = self.snapshot(store, run.run_id)
        second, more = make_operation(run.run_id, f"op-{_uid()}")
        refused: dict[str, Callable[[], Any]] = {
            "record_step": lambda: store.record_step(claim, make_step(run.run_id, "s2", 2)),
            "record_attempt": lambda: store.record_attempt(
                claim, make_attempt(run.run_id, "s2", 1)),
            "prepare_effect": lambda: store.prepare_effect(claim, second, more),
            "mark_dispatching": lambda: store.mark_dispatching(claim, op.operation_id),
            "prepare_and_mark_dispatching": lambda: store.prepare_and_mark_dispatching(
                claim, second, more),
        }
        for name, write in refused.items():
            with pytest.raises(DeadlineExceeded) as late:
                write()
            assert (late.value.run_id, late.value.deadline_at) == (run.run_id,
                                                                     run.deadline_at), name
            assert self.snapshot(store, run.run_id) == before, f"{name} wrote past the deadline"
        # what was in flight is still settled, and the run still ends
        store.record_outcome(claim, in_flight.operation_id, EffectState.ACCEPTED,
                             receipt={"id": 1})
        store.renew_lease(claim)
        store.finish_run(claim, RunStatus.FAILED, error={"type": "DeadlineExceeded"})
        ledger = store.load_ledger(run.run_id)
        assert ledger.run.status is RunStatus.FAILED
        assert ledger.operations[in_flight.operation_id].state is EffectState.ACCEPTED
        assert ledger.operations[op.operation_id].state is EffectState.PREPARED
        assert "s2" not in ledger.steps
        assert second.operation_id not in ledger.operations
        # a stale worker past the deadline is still told it lost the run, not the deadline
        with pytest.raises(LostOwnership):
            store.record_step(claim, make_step(run.run_id, "s3", 3))

    # -- approvals -----------------------------------------------------------------------------

    TARGET = "sha256:" + "7" * 64  # a target's state as the gate read it
    MOVED = "sha256:" + "8" * 64   # the same target, changed

    def _gated(self, store: Store, *, target: str | None = TARGET,
               **kw: Any) -> tuple[RunRecord, Claim, OperationRecord]:
        """A running run with a prepared operation that needs approval."""
        run, claim = self.start(store, **kw)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        op = replace(op, approval_required=True, target_digest=target)
        store.prepare_effect(claim, op, payload)
        return run, claim, op

    @staticmethod
    def _request(by: str = "ana", **fields: Any) -> ApprovalRequest:
        return ApprovalRequest(approval_id=f"ap-{_uid()}", by=by, **fields)

    def test_an_operation_that_needs_approval_is_prepared_as_such(self) -> None:
        store = self.store()
        run, _, op = self._gated(store)
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (stored.approval_required, stored.target_digest, stored.approval_id) == (
            True, self.TARGET, None)
        assert store.approvals(run.run_id) == []

    def test_the_gate_without_an_approval_makes_the_run_wait_released(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        gate = store.await_approval(claim, op.operation_id, self.MOVED)
        assert isinstance(gate, ApprovalGate)
        assert gate.approval is None
        waiting = store.get_run(run.run_id)
        assert (waiting.status, waiting.owner, waiting.lease_expires_at) == (
            RunStatus.WAITING, None, None)
        assert waiting.waiting_for == gate.waiting_for
        assert gate.waiting_for is not None
        assert {k: gate.waiting_for[k] for k in ("operation_id", "step_id", "payload_digest",
                                                 "target_digest", "invalidated")} == {
            "operation_id": op.operation_id, "step_id": op.step_id,
            "payload_digest": op.payload_ref, "target_digest": self.MOVED,
            "invalidated": False}
        # the gate records the target's state it read: what an approval will be bound to
        assert store.load_ledger(run.run_id).operations[op.operation_id].target_digest == (
            self.MOVED)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.operation_id, event.fence) == (
            "run.waiting", op.operation_id, claim.fence)
        assert waiting.event_count == len(store.events(run.run_id))
        with pytest.raises(LostOwnership):  # the worker let the run go
            store.record_step(claim, make_step(run.run_id, "after", 1))
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        assert run.run_id in {r.run_id for r in store.list_runs(RunStatus.WAITING, 50)}

    def test_approving_binds_to_the_recorded_digests_and_releases_the_waiting_run(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.MOVED)
        t0 = store.now()
        approval = store.approve(run.run_id, op.step_id,
                                 self._request(ttl_ms=60_000, evidence="ticket 12"))
        t1 = store.now()
        assert (approval.run_id, approval.operation_id, approval.step_id) == (
            run.run_id, op.operation_id, op.step_id)
        assert (approval.payload_digest, approval.target_digest, approval.approved_by,
                approval.evidence) == (op.payload_ref, self.MOVED, "ana", "ticket 12")
        assert stamped_between(t0, approval.approved_at, t1)
        assert approval.expires_at == approval.approved_at + 60_000
        assert store.approvals(run.run_id) == [approval]
        released = store.get_run(run.run_id)
        assert (released.status, released.waiting_for, released.owner) == (
            RunStatus.PENDING, None, None)
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.worker, event.detail["approval_id"],
                event.detail["released"]) == ("effect.approved", "ana", approval.approval_id,
                                              True)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        gate = store.await_approval(taken, op.operation_id, self.MOVED)
        assert gate == ApprovalGate(approval)
        assert store.get_run(run.run_id).status is RunStatus.RUNNING

    def test_an_approval_given_before_the_run_waits_is_found_by_the_gate(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        approval = store.approve(run.run_id, op.step_id, self._request())
        assert approval.target_digest == self.TARGET  # as read when it was prepared
        still = store.get_run(run.run_id)
        assert (still.status, still.owner) == (RunStatus.RUNNING, "worker-a")  # not released
        gate = store.await_approval(claim, op.operation_id, self.TARGET)
        assert gate.approval == approval
        assert store.get_run(run.run_id).status is RunStatus.RUNNING
        dispatching = store.mark_dispatching(claim, op.operation_id)
        assert (dispatching.state, dispatching.approval_id) == (EffectState.DISPATCHING,
                                                                approval.approval_id)

    def test_a_gate_racing_an_approval_never_loses_it(self) -> None:
        """Whichever commits first, the run either passes its gate or is released."""
        stores = [self.store(), self.store()]
        for _ in range(8):
            run, claim, op = self._gated(stores[0])
            gate_it = functools.partial(stores[0].await_approval, claim, op.operation_id,
                                        self.TARGET)
            approve_it = functools.partial(stores[1].approve, run.run_id, op.step_id,
                                           self._request())
            gate, _ = in_threads(gate_it, approve_it)
            now = stores[0].get_run(run.run_id)
            assert isinstance(gate, ApprovalGate)
            if gate.approval is None:
                assert now.status is RunStatus.PENDING, "an approval was lost to the gate"
            else:
                assert now.status is RunStatus.RUNNING

    def test_mark_dispatching_refuses_an_operation_no_approval_authorizes(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        before = self.snapshot(store, run.run_id)
        with pytest.raises(ApprovalInvalid) as refused:
            store.mark_dispatching(claim, op.operation_id)
        assert (refused.value.operation_id, refused.value.payload_digest) == (
            op.operation_id, op.payload_ref)
        assert self.snapshot(store, run.run_id) == before
        # an approval of another target's state does not authorize it either
        store.approve(run.run_id, op.step_id, self._request())
        other, other_claim, other_op = self._gated(store, target=self.MOVED)
        store.approve(other.run_id, other_op.step_id, self._request())
        gate = store.await_approval(other_claim, other_op.operation_id, self.TARGET)
        assert gate.approval is None  # the target changed since: the run waits
        # nor an expired one, on the store's clock
        late, late_claim, late_op = self._gated(store)
        store.approve(late.run_id, late_op.step_id, self._request(ttl_ms=SHORT_LEASE_MS))
        expire()
        before = self.snapshot(store, late.run_id)
        with pytest.raises(ApprovalInvalid, match="expired"):
            store.mark_dispatching(late_claim, late_op.operation_id)
        assert self.snapshot(store, late.run_id) == before
        # a valid one does, and is named on the operation
        ok = store.mark_dispatching(claim, op.operation_id)
        assert ok.state is EffectState.DISPATCHING
        [approval] = store.approvals(run.run_id)
        assert ok.approval_id == approval.approval_id
        assert store.load_ledger(run.run_id).operations[op.operation_id] == ok

    def test_approving_again_returns_the_same_approval(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        first = store.approve(run.run_id, op.step_id, self._request())
        released = self.snapshot(store, run.run_id)
        again = store.approve(run.run_id, op.step_id, self._request())
        assert again == first
        assert self.snapshot(store, run.run_id) == released
        other = store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert other.approval_id != first.approval_id
        assert [a.approved_by for a in store.approvals(run.run_id)] == ["ana", "bo"]

    def test_an_approval_that_does_not_fit_is_refused_and_changes_nothing(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        plain, data = make_operation(run.run_id, f"plain-{_uid()}")
        store.prepare_effect(claim, plain, data)
        before = self.snapshot(store, run.run_id)
        wrong_payload = "sha256:" + "0" * 64
        for step_id, request, why in [
                (f"step.never-{_uid()}", self._request(), "no prepared effect"),
                (plain.step_id, self._request(), "does not ask for approval"),
                (op.step_id, self._request(payload_digest=wrong_payload), "now carries"),
                (op.step_id, self._request(expires_at=store.now() - 1), "expire")]:
            with pytest.raises(ApprovalRefused, match=why):
                store.approve(run.run_id, step_id, request)
        assert self.snapshot(store, run.run_id) == before
        assert store.approvals(run.run_id) == []
        with pytest.raises(RunNotFound):
            store.approve(f"missing-{_uid()}", op.step_id, self._request())
        approval = store.approve(run.run_id, op.step_id,
                                 self._request(payload_digest=op.payload_ref))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        with pytest.raises(ApprovalRefused, match="already accepted"):
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        with pytest.raises(ApprovalRefused, match="completed"):
            store.approve(run.run_id, op.step_id, self._request(by="bo"))
        assert store.approvals(run.run_id) == [approval]

    def test_an_approval_of_an_operation_the_run_does_not_wait_for_releases_nothing(
            self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        second = replace(second, approval_required=True, target_digest=None)
        store.prepare_effect(claim, second, data)
        store.await_approval(claim, op.operation_id, self.TARGET)
        approval = store.approve(run.run_id, second.step_id, self._request())
        assert approval.target_digest is None
        assert store.get_run(run.run_id).status is RunStatus.WAITING

    def test_a_waiting_run_is_claimed_by_name_but_not_by_claim_next(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        waiting = store.get_run(run.run_id)
        assert store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow]) is None
        again = store.claim_run(run.run_id, waiting.state_revision, "worker-b", LONG_LEASE_MS)
        assert again is not None
        now = store.get_run(run.run_id)
        assert (now.status, now.owner, now.waiting_for, now.resume_count) == (
            RunStatus.RUNNING, "worker-b", None, 0)

    def test_reprepare_gives_a_never_dispatched_operation_a_new_payload(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.approve(run.run_id, op.step_id, self._request())
        data = canonical({"op": op.operation_id, "amount": 7})
        revised = replace(op, payload_ref=digest(data), target_digest=self.MOVED)
        store.reprepare_effect(claim, revised, data)
        stored = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (stored.payload_ref, stored.target_digest, stored.effect_key) == (
            revised.payload_ref, self.MOVED, op.effect_key)  # the key never changes
        assert store.get_artifact(revised.payload_ref) == data
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.detail["payload_ref"]) == ("effect.prepared",
                                                             revised.payload_ref)
        with pytest.raises(ApprovalInvalid, match="payload changed"):
            store.mark_dispatching(claim, op.operation_id)  # the approval was of the old one
        # an operation that may have been dispatched keeps its payload
        store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        before = self.snapshot(store, run.run_id)
        other = canonical({"other": revised.operation_id})
        with pytest.raises(StoreError, match="no longer prepared"):
            store.reprepare_effect(claim, replace(revised, payload_ref=digest(other)), other)
        assert self.snapshot(store, run.run_id) == before

    def test_cancelling_a_waiting_run_ends_it_unless_an_effect_is_uncertain(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        ended = store.request_cancel(run.run_id, "ops", "not needed")
        assert (ended.status, ended.waiting_for) == (RunStatus.CANCELLED, None)
        assert store.events(run.run_id)[-1].kind == "run.cancelled"
        # an effect dispatched once (its approval lapsed before a re-dispatch) is settled first
        run, claim, op = self._gated(store)
        store.approve(run.run_id, op.step_id, self._request(ttl_ms=SHORT_LEASE_MS))
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.UNKNOWN,
                             error={"type": "Timeout"})
        expire()
        assert store.await_approval(claim, op.operation_id, self.TARGET).approval is None
        marked = store.request_cancel(run.run_id, "ops")
        assert (marked.status, marked.cancel_requested_at is not None) == (RunStatus.PENDING,
                                                                           True)
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        with pytest.raises(Cancelled):  # it may settle the effect, but dispatch nothing
            store.mark_dispatching(taken, op.operation_id)

    # -- revoking approvals --------------------------------------------------------------------

    WITHDRAWN = ApprovalRevocation(by="carol", reason="the customer withdrew the request")

    def test_revoking_withdraws_every_approval_in_force_and_the_dispatch_is_refused(
            self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        ana = store.approve(run.run_id, op.step_id, self._request(ttl_ms=60_000))
        bo = store.approve(run.run_id, op.step_id, self._request(by="bo", evidence="OPS-1"))
        before = store.get_run(run.run_id)
        t0 = store.now()
        revoked = store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        t1 = store.now()
        assert [(a.approval_id, a.revoked_by, a.revoke_reason) for a in revoked] == [
            (ana.approval_id, "carol", self.WITHDRAWN.reason),
            (bo.approval_id, "carol", self.WITHDRAWN.reason)]
        assert all(stamped_between(t0, a.revoked_at, t1) for a in revoked)
        assert revoked == [replace(ana, revoked_at=revoked[0].revoked_at, revoked_by="carol",
                                   revoke_reason=self.WITHDRAWN.reason),
                           replace(bo, revoked_at=revoked[0].revoked_at, revoked_by="carol",
                                   revoke_reason=self.WITHDRAWN.reason)]
        assert store.approvals(run.run_id) == revoked  # read back with every field
        after = store.get_run(run.run_id)
        # the status stays: the gate decides whether the run waits
        assert (after.status, after.owner, after.fence) == (RunStatus.RUNNING, "worker-a",
                                                            claim.fence)
        assert after.state_revision > before.state_revision
        event = store.events(run.run_id)[-1]
        assert (event.kind, event.step_id, event.operation_id, event.worker, event.fence) == (
            "effect.approval_revoked", op.step_id, op.operation_id, "carol", None)
        assert event.detail == {"approval_ids": [ana.approval_id, bo.approval_id],
                                "approved_by": ["ana", "bo"],
                                "reason": self.WITHDRAWN.reason}
        assert after.event_count == len(store.events(run.run_id))
        # the dispatch is refused, naming the revocation, and writes nothing
        unchanged = self.snapshot(store, run.run_id)
        with pytest.raises(ApprovalInvalid, match="revoked by carol") as refused:
            store.mark_dispatching(claim, op.operation_id)
        assert self.WITHDRAWN.reason in refused.value.reason
        assert self.snapshot(store, run.run_id) == unchanged
        # the gate makes the run wait, naming the revocation
        gate = store.await_approval(claim, op.operation_id, self.TARGET)
        assert gate.approval is None
        assert gate.waiting_for is not None
        assert gate.waiting_for["invalidated"] is True
        assert "revoked by carol" in gate.waiting_for["reason"]
        # approved anew: a new approval, and the dispatch goes out under it
        again = store.approve(run.run_id, op.step_id, self._request())
        assert again.approval_id != ana.approval_id
        assert again.revoked_at is None
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        assert store.mark_dispatching(taken, op.operation_id).approval_id == again.approval_id

    def test_a_run_an_approval_released_meets_the_revocation_at_its_gate(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        store.await_approval(claim, op.operation_id, self.TARGET)
        store.approve(run.run_id, op.step_id, self._request())
        assert store.get_run(run.run_id).status is RunStatus.PENDING
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        assert store.get_run(run.run_id).status is RunStatus.PENDING  # left for the gate
        taken = store.claim_next("worker-b", LONG_LEASE_MS, [self.workflow])
        assert taken is not None
        assert taken.run_id == run.run_id
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(taken, op.operation_id)
        gate = store.await_approval(taken, op.operation_id, self.TARGET)
        assert gate.approval is None
        waiting = store.get_run(run.run_id)
        assert waiting.status is RunStatus.WAITING
        assert waiting.waiting_for is not None
        assert "revoked by carol" in waiting.waiting_for["reason"]
        op_now = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (op_now.state, op_now.dispatch_count) == (EffectState.PREPARED, 0)

    def test_a_revocation_that_does_not_fit_is_refused_and_changes_nothing(self) -> None:
        store = self.store()
        run, claim, op = self._gated(store)
        plain, data = make_operation(run.run_id, f"plain-{_uid()}")
        store.prepare_effect(claim, plain, data)

        def refused(step_id: str, why: str, run_id: str = run.run_id) -> None:
            before = self.snapshot(store, run_id), store.approvals(run_id)
            with pytest.raises(ApprovalRefused, match=why) as error:
                store.revoke_approval(run_id, step_id, self.WITHDRAWN)
            assert (error.value.revoking, error.value.step_id) == (True, step_id)
            assert (self.snapshot(store, run_id), store.approvals(run_id)) == before

        refused(f"step.never-{_uid()}", "no prepared effect")
        refused(plain.step_id, "no approval to revoke")
        refused(op.step_id, "no approval to revoke")
        with pytest.raises(RunNotFound):
            store.revoke_approval(f"missing-{_uid()}", op.step_id, self.WITHDRAWN)
        store.approve(run.run_id, op.step_id, self._request())
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        refused(op.step_id, "revoked already")
        # once its outcome is recorded: too late, the dispatch is in the past
        approval = store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        refused(op.step_id, r"too late: .* is accepted")
        store.finish_run(claim, RunStatus.COMPLETED, result=1)
        refused(op.step_id, "too late")
        assert store.approvals(run.run_id)[-1] == approval  # never revoked
        # a dispatch that provably never left (back to prepared): the next one may be withdrawn
        again, again_claim, again_op = self._gated(store)
        store.approve(again.run_id, again_op.step_id, self._request())
        store.mark_dispatching(again_claim, again_op.operation_id)
        store.record_outcome(again_claim, again_op.operation_id, EffectState.PREPARED,
                             error={"type": "NotSent", "message": "connection refused"})
        store.revoke_approval(again.run_id, again_op.step_id, self.WITHDRAWN)
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(again_claim, again_op.operation_id)
        # dispatched, its outcome unknown: what may have happened is reconciled, but the
        # dispatch a "not applied" would call for is withdrawn
        unsure, unsure_claim, unsure_op = self._gated(store)
        store.approve(unsure.run_id, unsure_op.step_id, self._request())
        store.mark_dispatching(unsure_claim, unsure_op.operation_id)
        store.revoke_approval(unsure.run_id, unsure_op.step_id, self.WITHDRAWN)
        store.record_outcome(unsure_claim, unsure_op.operation_id, EffectState.UNKNOWN,
                             error={"type": "TimeoutError", "message": "no answer"})
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(unsure_claim, unsure_op.operation_id)
        # a cancelled run dispatches nothing: there is nothing to take back
        ended, ended_claim, ended_op = self._gated(store)
        store.await_approval(ended_claim, ended_op.operation_id, self.TARGET)
        store.approve(ended.run_id, ended_op.step_id, self._request())  # released: pending
        assert store.request_cancel(ended.run_id, "ops").status is RunStatus.CANCELLED
        refused(ended_op.step_id, "cancelled", run_id=ended.run_id)

    def test_a_revocation_and_a_dispatch_whichever_commits_first_wins(self) -> None:
        store = self.store()
        # the dispatch first: it went out under the approval, which the revocation leaves as
        # the one that authorized it; only dispatches still to come are withdrawn
        run, claim, op = self._gated(store)
        approval = store.approve(run.run_id, op.step_id, self._request())
        store.mark_dispatching(claim, op.operation_id)
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        dispatched = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (dispatched.state, dispatched.approval_id) == (EffectState.DISPATCHING,
                                                              approval.approval_id)
        assert [a.approval_id for a in store.approvals(run.run_id)
                if a.revoked] == [approval.approval_id]
        # the revocation first: the dispatch is refused and nothing leaves
        run, claim, op = self._gated(store)
        store.approve(run.run_id, op.step_id, self._request())
        store.revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
        with pytest.raises(ApprovalInvalid, match="revoked"):
            store.mark_dispatching(claim, op.operation_id)
        prepared = store.load_ledger(run.run_id).operations[op.operation_id]
        assert (prepared.state, prepared.dispatch_count) == (EffectState.PREPARED, 0)

    def test_a_revocation_racing_a_dispatch_never_lets_both_win(self) -> None:
        """Run concurrently, on two store objects: a dispatch goes out only under an approval
        not yet revoked — it commits before the revocation, or it is refused."""
        stores = [self.store(), self.store()]
        for _ in range(8):
            run, claim, op = self._gated(stores[0])
            stores[0].approve(run.run_id, op.step_id, self._request())

            def dispatch(claim: Claim = claim, op: OperationRecord = op) -> str:
                try:
                    stores[0].mark_dispatching(claim, op.operation_id)
                except ApprovalInvalid:
                    return "refused"
                return "dispatched"

            def revoke(run: RunRecord = run, op: OperationRecord = op) -> str:
                try:
                    stores[1].revoke_approval(run.run_id, op.step_id, self.WITHDRAWN)
                except ApprovalRefused:
                    return "too late"
                return "revoked"

            outcome = tuple(in_threads(dispatch, revoke))
            assert outcome in {("dispatched", "revoked"), ("refused", "revoked")}, outcome
            now = stores[0].load_ledger(run.run_id).operations[op.operation_id]
            assert [a.revoked_at is not None
                    for a in stores[0].approvals(run.run_id)] == [True]
            kinds = [e.kind for e in stores[0].events(run.run_id)
                     if e.kind in ("effect.dispatching", "effect.approval_revoked")]
            if outcome[0] == "dispatched":
                assert (now.state, now.dispatch_count) == (EffectState.DISPATCHING, 1)
                assert kinds == ["effect.dispatching", "effect.approval_revoked"]
            else:
                assert (now.state, now.dispatch_count) == (EffectState.PREPARED, 0)
                assert kinds == ["effect.approval_revoked"]

    # -- bounded history and continue-as-new ---------------------------------------------------

    def test_the_history_counts_every_event_and_every_new_step(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        assert (run.event_count, run.step_count, run.history_size) == (1, 0, 1)
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        store.record_step(claim, make_step(run.run_id, "s1", 1, result="re-read"))  # replaces
        store.record_step(claim, make_step(run.run_id, "s2", 2))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        step = make_step(run.run_id, op.step_id, 3, kind=StepKind.EFFECT,
                         operation_id=op.operation_id)
        for _ in range(2):  # the second outcome is an event, its step row is replaced
            store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED,
                                 receipt={"id": 1}, step=step)
        ledger, events = self.snapshot(store, run.run_id)
        assert (ledger.run.event_count, ledger.run.step_count) == (len(events), len(ledger.steps))
        assert (len(events), len(ledger.steps)) == (5, 3)
        assert ledger.run.history_size == 8

    def test_history_limits_and_the_chain_are_recorded_with_the_run(self) -> None:
        store = self.store()
        run, _ = self.start(store, history=(100, 500))
        assert (run.history_soft_limit, run.history_hard_limit, run.history_warned_at) == (
            100, 500, None)
        assert (run.chain_id, run.chain_index, run.parent_run_id, run.successor_run_id) == (
            run.run_id, 0, None, None)
        assert store.get_run(run.run_id) == run
        unlimited = self.submit(store)
        assert (unlimited.history_soft_limit, unlimited.history_hard_limit) == (None, None)

    def test_the_hard_history_limit_refuses_new_work_in_the_fenced_write(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(None, 5))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)                       # history 2
        for seq in (1, 2, 3):
            store.record_step(claim, make_step(run.run_id, f"s{seq}", seq))  # 3, 4, 5
        before = self.snapshot(store, run.run_id)
        with pytest.raises(HistoryLimitReached) as refused:
            store.record_step(claim, make_step(run.run_id, "s4", 4))
        assert (refused.value.run_id, refused.value.size, refused.value.limit) == (
            run.run_id, 5, 5)
        second, data = make_operation(run.run_id, f"op-{_uid()}")
        with pytest.raises(HistoryLimitReached):
            store.prepare_effect(claim, second, data)
        assert self.snapshot(store, run.run_id) == before  # refused whole: not even the lease
        # A step recorded again adds nothing; what is in flight is sent and settled, and the
        # run ends, whatever the history.
        store.record_step(claim, make_step(run.run_id, "s3", 3, result="re-read"))
        store.mark_dispatching(claim, op.operation_id)
        step = make_step(run.run_id, op.step_id, 5, kind=StepKind.EFFECT,
                         operation_id=op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1},
                             step=step)
        store.finish_run(claim, RunStatus.BLOCKED, recovery_record={"phase": "history_limit"})
        ledger, events = self.snapshot(store, run.run_id)
        assert ledger.operations[op.operation_id].state is EffectState.ACCEPTED
        assert "s4" not in ledger.steps
        assert second.operation_id not in ledger.operations
        assert (ledger.run.status, ledger.run.history_size) == (RunStatus.BLOCKED, 9)
        assert ledger.run.history_size == len(events) + len(ledger.steps)

    def test_the_soft_history_limit_is_recorded_once_and_warns(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(3, 50))
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        assert store.get_run(run.run_id).history_warned_at is None
        with pytest.warns(HistoryWarning, match=run.run_id):
            store.record_step(claim, make_step(run.run_id, "s2", 2))  # history 3: the limit
        warned = store.get_run(run.run_id)
        assert warned.history_warned_at is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error", HistoryWarning)  # a second warning would raise
            store.record_step(claim, make_step(run.run_id, "s3", 3))
            op, payload = make_operation(run.run_id, f"op-{_uid()}")
            store.prepare_effect(claim, op, payload)
            store.mark_dispatching(claim, op.operation_id)
            store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        ledger, events = self.snapshot(store, run.run_id)
        [event] = [e for e in events if e.kind == "run.history_warning"]
        assert (event.fence, event.worker, event.detail) == (
            claim.fence, "worker-a", {"history": 4, "soft": 3, "hard": 50})
        assert ledger.run.history_warned_at == warned.history_warned_at
        assert ledger.run.event_count == len(events)

    def test_continue_as_new_ends_the_run_and_starts_its_successor_at_once(self) -> None:
        store = self.store()
        run, claim = self.start(store, history=(10, 20))
        store.record_step(claim, make_step(run.run_id, "s1", 1))
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        store.prepare_effect(claim, op, payload)
        store.mark_dispatching(claim, op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": 1})
        kept, _ = self.snapshot(store, run.run_id)
        successor = self.successor(run.run_id, inputs={"args": [{"carried": LARGE}],
                                                       "kwargs": {}},
                                   resume_budget=3, history_soft_limit=10,
                                   history_hard_limit=20)
        t0 = store.now()
        child, child_claim = store.continue_as_new(claim, successor)
        t1 = store.now()
        assert child_claim == Claim(successor.run_id, "worker-a", 1, child.state_revision,
                                    child.lease_expires_at or 0, LONG_LEASE_MS)
        assert stamped_between(t0 + LONG_LEASE_MS, child.lease_expires_at, t1 + LONG_LEASE_MS)
        assert (child.status, child.owner, child.fence, child.resume_count, child.inputs) == (
            RunStatus.RUNNING, "worker-a", 1, 0, successor.inputs)
        assert (child.parent_run_id, child.chain_id, child.chain_index, child.successor_run_id) == (
            run.run_id, run.run_id, 1, None)
        assert (child.resume_budget, child.history_soft_limit, child.history_hard_limit) == (
            3, 10, 20)
        ended = store.get_run(run.run_id)
        assert (ended.status, ended.successor_run_id, ended.owner, ended.lease_expires_at) == (
            RunStatus.CONTINUED, successor.run_id, None, None)
        assert ended.status.terminal
        # nothing of the parent's history is carried: the successor has its own, fresh
        ledger, events = self.snapshot(store, child.run_id)
        assert (ledger.steps, ledger.operations) == ({}, {})
        assert [(e.kind, e.fence, e.worker) for e in events] == [("run.started", 1, "worker-a")]
        assert (child.event_count, child.step_count) == (1, 0)
        parent, parent_events = self.snapshot(store, run.run_id)
        assert (parent.steps, parent.operations) == (kept.steps, kept.operations)
        assert (parent_events[-1].kind, parent_events[-1].detail) == (
            "run.continued", {"successor": successor.run_id})
        assert parent.run.event_count == len(parent_events)
        with pytest.raises(LostOwnership):  # the parent's worker moved on to the successor
            store.record_step(claim, make_step(run.run_id, "late", 9))
        assert store.claim_run(run.run_id, ended.state_revision, "worker-b",
                               LONG_LEASE_MS) is None
        # the chain goes on from the successor
        grandchild, _ = store.continue_as_new(child_claim, self.successor(run.run_id, n=2))
        assert (grandchild.parent_run_id, grandchild.chain_id, grandchild.chain_index) == (
            child.run_id, run.run_id, 2)
        assert store.get_run(child.run_id).successor_run_id == grandchild.run_id

    def test_continue_as_new_is_refused_once_a_cancel_is_asked(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.request_cancel(run.run_id, "ops")
        before = self.snapshot(store, run.run_id)
        with pytest.raises(Cancelled):
            store.continue_as_new(claim, self.successor(run.run_id))
        assert self.snapshot(store, run.run_id) == before
        with pytest.raises(RunNotFound):
            store.get_run(f"{run.run_id}~1")

    def test_a_successor_id_held_by_another_run_is_a_conflict_that_changes_nothing(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        other = self.submit(store, run_id=f"{run.run_id}~1")
        before = self.snapshot(store, run.run_id)
        with pytest.raises(RunConflict):
            store.continue_as_new(claim, self.successor(run.run_id))
        assert self.snapshot(store, run.run_id) == before
        assert store.get_run(other.run_id) == other

    def test_a_successor_finds_what_its_chain_settled_by_operation_id(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        settled = {}
        for state in (EffectState.ACCEPTED, EffectState.REJECTED, EffectState.PREPARED):
            op, payload = make_operation(run.run_id, f"op-{state.value}-{_uid()}")
            store.prepare_effect(claim, op, payload)
            if state is not EffectState.PREPARED:
                store.mark_dispatching(claim, op.operation_id)
                store.record_outcome(claim, op.operation_id, state, receipt={"id": 7},
                                     error={"status": 402} if state is EffectState.REJECTED
                                     else None)
            settled[state] = op.operation_id
        parent = store.load_ledger(run.run_id)
        child, child_claim = store.continue_as_new(claim, self.successor(run.run_id))
        assert child_claim is not None
        for state in (EffectState.ACCEPTED, EffectState.REJECTED):
            found = store.chain_operation(run.run_id, settled[state])
            assert found == parent.operations[settled[state]]
            assert (found.run_id, found.state) == (run.run_id, state)
        assert store.chain_operation(run.run_id, settled[EffectState.PREPARED]) is None
        assert store.chain_operation(run.run_id, f"no-such-op-{_uid()}") is None
        stranger, _ = self.start(store)  # another chain sees none of it
        assert store.chain_operation(stranger.run_id, settled[EffectState.ACCEPTED]) is None
        # what the successor settles is found under the chain too
        op, payload = make_operation(child.run_id, f"op-child-{_uid()}")
        store.prepare_effect(child_claim, op, payload)
        store.mark_dispatching(child_claim, op.operation_id)
        store.record_outcome(child_claim, op.operation_id, EffectState.ACCEPTED,
                             receipt={"id": 8})
        found = store.chain_operation(run.run_id, op.operation_id)
        assert found is not None
        assert (found.run_id, found.receipt) == (child.run_id, {"id": 8})

    def test_a_warning_the_store_records_is_always_issued_once(self) -> None:
        """Whichever worker write finds the history at its soft limit first — here the retry of
        an attempt — the warning it records is the one issued."""
        store = self.store()
        run, claim = self.start(store, history=(1, 50))  # run.started: at the soft limit
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store.record_attempt(claim, make_attempt(run.run_id, "s1", 1))
            store.record_step(claim, make_step(run.run_id, "s1", 1))
        issued = [w for w in caught if issubclass(w.category, HistoryWarning)]
        recorded = [e for e in store.events(run.run_id) if e.kind == "run.history_warning"]
        assert (len(recorded), len(issued)) == (1, 1)

    def test_a_re_plan_moves_abandoned_steps_from_the_step_count_to_the_events(self) -> None:
        """An abandoned step leaves the steps for the history's events: the history is what is
        stored, counted once."""
        store = self.store()
        run, claim = self.start(store)
        for seq in (1, 2, 3):
            store.record_step(claim, make_step(run.run_id, f"s{seq}", seq))
        store.replan(claim, Replan(reason="inputs moved", step_id="s2", through_seq=3))
        ledger, events = self.snapshot(store, run.run_id)
        assert sorted(ledger.steps) == ["s1"]
        assert (ledger.run.step_count, ledger.run.event_count) == (1, len(events))
        assert ledger.run.history_size == len(events) + len(ledger.steps)
        store.record_step(claim, make_step(run.run_id, "s2", 4))  # asked again: a new step
        assert store.get_run(run.run_id).step_count == 2

    def test_a_re_plan_keeps_the_steps_it_is_told_to_keep(self) -> None:
        """Inside a fan-out, a sibling branch's steps recorded after the stale step do not
        answer the changed question: the re-plan names them, and they stay."""
        store = self.store()
        run, claim = self.start(store)
        for seq, sid in enumerate(("fan.a/s", "fan.b/s", "fan.a/t", "fan.b/t", "join"), 1):
            store.record_step(claim, make_step(run.run_id, sid, seq))
        store.replan(claim, Replan(reason="inputs moved", step_id="fan.a/s", through_seq=5,
                                   keep=("fan.b/s", "fan.b/t")))
        ledger, events = self.snapshot(store, run.run_id)
        assert sorted(ledger.steps) == ["fan.b/s", "fan.b/t"]
        assert [e.step_id for e in events if e.kind == "step.abandoned"] == [
            "fan.a/s", "fan.a/t", "join"]
        assert (ledger.run.step_count, ledger.run.event_count) == (2, len(events))
