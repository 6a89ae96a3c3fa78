"""What every conformance test shares: the constants, the record factories, and the base class
that opens the stores a test uses and closes them after it."""

from __future__ import annotations

import abc
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from ..._rules.canonical import canonical, digest
from ...errors import UsageError
from ...storage.base import INLINE_LIMIT, NewRun, Store
from ...types import (
    JSON,
    ApprovalRequest,
    AttemptRecord,
    Claim,
    EffectState,
    EventRecord,
    Ledger,
    OperationRecord,
    RunRecord,
    StepKind,
    StepRecord,
)
from ..tamper import overwrite
from ._concerns import leave_out_unchanged

T = TypeVar("T")

LONG_LEASE_MS = 60_000  # a lease that outlives any test
SHORT_LEASE_MS = 40  # a lease that a test lets expire ...
EXPIRY_WAIT_S = 0.1  # ... by sleeping this long
LARGE = "é" + "x" * INLINE_LIMIT  # any value holding this is larger than INLINE_LIMIT
# A store may estimate its database's clock between readings (the PostgreSQL stores do, to
# within half a round trip and a rounding): a time the server stamped is compared with
# readings of ``now()`` taken around it with this much slack.
CLOCK_SLACK_MS = 5


def stamped_between(low: int, stamped: int | None, high: int) -> bool:
    """``stamped`` (a time the store wrote) lies between two readings of its ``now()``."""
    return stamped is not None and low - CLOCK_SLACK_MS <= stamped <= high + CLOCK_SLACK_MS


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
    op = OperationRecord(
        run_id=run_id,
        operation_id=operation_id,
        step_id=f"step.{operation_id}",
        effect="ticket.create",
        state=EffectState.PREPARED,
        payload_ref=digest(data),
        effect_key=f"key-{_uid()}",
    )
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


def at_once(*calls: Callable[[], T]) -> list[T | Exception]:
    """Run each call on its own thread, released together by a barrier: what each returned, or
    the error it raised (the refusals are what a race test counts)."""
    barrier = threading.Barrier(len(calls))
    results: list[T | Exception] = [RuntimeError("not run")] * len(calls)

    def body(index: int, call: Callable[[], T]) -> None:
        barrier.wait(timeout=10)
        try:
            results[index] = call()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=body, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return results


class ConformanceBase(abc.ABC):
    """The store a test runs against and the helpers every topic's tests use."""

    tmp_path: Path
    workflow: str
    # What this set-up changes of a store that runs the whole suite elsewhere (names of
    # ``CONCERNS``): only the tests that exercise one of them run. None, the default, runs
    # every test — what a store of its own must pass.
    changes: ClassVar[frozenset[str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.changes is not None:
            leave_out_unchanged(cls, cls.changes)

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
        self._repairs: list[Callable[[], object]] = []
        yield
        for repair in reversed(self._repairs):
            repair()
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

    def new_run(
        self,
        store: Store,
        *,
        owner: str | None = "worker-a",
        lease_ms: int = LONG_LEASE_MS,
        inputs: JSON = None,
        workflow: str | None = None,
        run_id: str | None = None,
        history: tuple[int | None, int | None] = (None, None),
        **limits: Any,
    ) -> tuple[RunRecord, Claim | None]:
        """A new run (claimed by ``owner``, or pending), with ``limits`` (``NewRun``'s budgets,
        deadline, attempts)."""
        new = NewRun(
            run_id=run_id or f"run-{_uid()}",
            workflow=workflow or self.workflow,
            workflow_version="v1",
            input_hash=f"inputs-{_uid()}",
            inputs={"args": [1], "kwargs": {}} if inputs is None else inputs,
            owner=owner,
            lease_ms=lease_ms,
            history_soft_limit=history[0],
            history_hard_limit=history[1],
            **limits,
        )
        return store.create_run(new)

    def successor(self, run_id: str, *, owner: str | None = "worker-a", n: int = 1, **fields: Any) -> NewRun:
        """The NewRun that continues ``run_id`` (its id as the engine would choose it)."""
        fields.setdefault("inputs", {"args": [n], "kwargs": {}})
        return NewRun(
            run_id=f"{run_id}~{n}",
            workflow=self.workflow,
            workflow_version="v1",
            input_hash=f"inputs-{_uid()}",
            owner=owner,
            lease_ms=LONG_LEASE_MS,
            **fields,
        )

    def start(
        self, store: Store, *, owner: str = "worker-a", lease_ms: int = LONG_LEASE_MS, **kw: Any
    ) -> tuple[RunRecord, Claim]:
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

    def damage(
        self,
        store: Store,
        table: str,
        column: str,
        value: str | None,
        *,
        repair: str | int | None,
        **where: str | int,
    ) -> None:
        """Overwrite one stored column behind the store's back, as a bad restore or a failing
        disk would, and put ``repair`` there once the test ends (the suite may share its
        database between tests, whose listings must stay readable). safepoint's own stores are
        damaged with ``safepoint.testing.tamper``; for a store of your own, override this —
        otherwise the tests that need it are skipped."""
        try:
            changed = overwrite(store, table, column, value, **where)
        except UsageError as exc:
            pytest.skip(f"{exc.message}: override ConformanceBase.damage for this store")
        assert changed == 1, f"no row of {table} where {where}"
        self._repairs.append(lambda: overwrite(store, table, column, repair, **where))

    @staticmethod
    def accepted(
        store: Store, claim: Claim, step_id: str, seq: int, *, retention_ms: int | None = None, **payload: int
    ) -> OperationRecord:
        """An operation of the claimed run sent and accepted at effect step ``step_id``, recorded
        with its effect's dedup retention."""
        op, data = make_operation(claim.run_id, f"op-{step_id}-{_uid()}", payload or None)
        op = replace(op, step_id=step_id, dedup_retention_ms=retention_ms)
        store.prepare_effect(claim, op, data)
        store.mark_dispatching(claim, op.operation_id)
        step = make_step(claim.run_id, step_id, seq, kind=StepKind.EFFECT, operation_id=op.operation_id)
        store.record_outcome(claim, op.operation_id, EffectState.ACCEPTED, receipt={"id": step_id}, step=step)
        return store.load_ledger(claim.run_id).operations[op.operation_id]

    @staticmethod
    def snapshot(store: Store, run_id: str) -> tuple[Ledger, list[EventRecord]]:
        return store.load_ledger(run_id), store.events(run_id)

    # The approval helpers, shared by the effects, approvals and revocation tests.

    TARGET = "sha256:" + "7" * 64  # a target's state as the gate read it
    MOVED = "sha256:" + "8" * 64  # the same target, changed

    def _gated(
        self, store: Store, *, target: str | None = TARGET, **kw: Any
    ) -> tuple[RunRecord, Claim, OperationRecord]:
        """A running run with a prepared operation that needs approval."""
        run, claim = self.start(store, **kw)
        op, payload = make_operation(run.run_id, f"op-{_uid()}")
        op = replace(op, approval_required=True, target_digest=target)
        store.prepare_effect(claim, op, payload)
        return run, claim, op

    @staticmethod
    def _request(by: str = "ana", **fields: Any) -> ApprovalRequest:
        return ApprovalRequest(approval_id=f"ap-{_uid()}", by=by, **fields)
