"""``SyncOverAsync``: an asyncio store presented as a sync ``Store``, so that the one
conformance suite (``safepoint.testing.conformance``, which re-exports this class) runs
unchanged against async stores too."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from ..storage.base import STOP_POLL_S, AsyncStore, ForkRun, NewRun, Replan
from ..storage.prune import PruneBatch, PruneRequest
from ..types import (
    JSON,
    ApprovalGate,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalRevocation,
    AttemptRecord,
    Claim,
    EffectState,
    EventRecord,
    Ledger,
    LedgerIdentity,
    LimitChange,
    MessageRecord,
    OperationRecord,
    Resolution,
    RunLimits,
    RunPage,
    RunQuery,
    RunRecord,
    RunRetry,
    RunStatus,
    StepRecord,
    UnreadableRun,
    WaitGate,
)

__all__ = ["SyncOverAsync"]

T = TypeVar("T")


class SyncOverAsync:
    """An ``AsyncStore`` presented as a sync ``Store``: each call runs the store's coroutine on a
    private event loop in a background thread and blocks until it is done.

    Calls from several threads at once run as concurrent tasks on that one loop — which is how
    an async store is used — so the suite's concurrency tests exercise the async store's own
    concurrency. ``store_factory`` returns the awaitable that opens the store (it is awaited on
    the private loop, where the store's pool must live)::

        store = SyncOverAsync(lambda: AsyncPostgresStore.open(url))
    """

    def __init__(self, store_factory: Callable[[], Awaitable[AsyncStore]]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="safepoint-sync-over-async"
        )
        self._thread.start()

        async def open_() -> AsyncStore:
            return await store_factory()

        try:
            self.store = self._call(open_())
        except BaseException:
            self._stop()
            raise
        self.url = self.store.url
        self.identity: LedgerIdentity = self.store.identity

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def close(self) -> None:
        try:
            self._call(self.store.close())
        finally:
            self._stop()

    def now(self) -> int:
        return self._call(self.store.now())

    def schema_version(self) -> int:
        return self._call(self.store.schema_version())

    def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        return self._call(self.store.create_run(new))

    def get_run(self, run_id: str) -> RunRecord:
        return self._call(self.store.get_run(run_id))

    def find_run(self, run_id: str) -> RunRecord | UnreadableRun:
        return self._call(self.store.find_run(run_id))

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord | UnreadableRun]:
        return self._call(self.store.list_runs(status, limit))

    def query_runs(self, query: RunQuery) -> RunPage:
        return self._call(self.store.query_runs(query))

    def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Claim | None:
        return self._call(self.store.claim_run(run_id, expected_revision, owner, lease_ms, dead_owner))

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        return self._call(self.store.claim_next(owner, lease_ms, workflows))

    def wait_for_work(self, timeout: float, stop: threading.Event | None = None) -> None:
        # the async store's wait knows no threading.Event: wait in slices, looking between them;
        # a slice that ended before its time was woken by news
        deadline = time.monotonic() + timeout
        while not (stop is not None and stop.is_set()):
            began, left = time.monotonic(), deadline - time.monotonic()
            if left <= 0:
                return
            piece = left if stop is None else min(left, STOP_POLL_S)
            self._call(self.store.wait_for_work(piece))
            if time.monotonic() - began < piece * 0.9:
                return

    def load_ledger(self, run_id: str) -> Ledger:
        return self._call(self.store.load_ledger(run_id))

    def events(self, run_id: str) -> list[EventRecord]:
        return self._call(self.store.events(run_id))

    def renew_lease(self, claim: Claim) -> None:
        self._call(self.store.renew_lease(claim))

    def record_step(self, claim: Claim, step: StepRecord) -> None:
        self._call(self.store.record_step(claim, step))

    def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None:
        self._call(self.store.record_steps(claim, steps))

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None:
        self._call(self.store.record_attempt(claim, attempt))

    def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], Any], family_key: str | None = None
    ) -> StepRecord:
        """``body`` runs on the store's loop: a coroutine function there, for an async store."""
        return self._call(self.store.record_transaction(claim, step, body, family_key))

    def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        self._call(self.store.prepare_effect(claim, op, payload))

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        return self._call(self.store.mark_dispatching(claim, operation_id))

    def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> OperationRecord:
        return self._call(self.store.prepare_and_mark_dispatching(claim, op, payload))

    def record_outcome(
        self,
        claim: Claim,
        operation_id: str,
        state: EffectState,
        *,
        receipt: JSON = None,
        error: JSON = None,
        step: StepRecord | None = None,
        not_sent: bool = False,
    ) -> None:
        self._call(
            self.store.record_outcome(
                claim, operation_id, state, receipt=receipt, error=error, step=step, not_sent=not_sent
            )
        )

    def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None:
        self._call(
            self.store.finish_run(claim, status, result=result, error=error, recovery_record=recovery_record)
        )

    def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> RunRecord:
        return self._call(self.store.resolve(run_id, expected_revision, resolution))

    def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord:
        return self._call(self.store.request_cancel(run_id, by, reason))

    def replan(self, claim: Claim, change: Replan) -> None:
        self._call(self.store.replan(claim, change))

    def release_run(self, claim: Claim) -> None:
        self._call(self.store.release_run(claim))

    def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> None:
        self._call(self.store.end_slice(claim, step_id=step_id, detail=detail))

    def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        self._call(self.store.reprepare_effect(claim, op, payload))

    def await_approval(self, claim: Claim, operation_id: str, target_digest: str | None) -> ApprovalGate:
        return self._call(self.store.await_approval(claim, operation_id, target_digest))

    def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord:
        return self._call(self.store.approve(run_id, step_id, request))

    def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> list[ApprovalRecord]:
        return self._call(self.store.revoke_approval(run_id, step_id, revocation))

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        return self._call(self.store.approvals(run_id))

    def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]:
        return self._call(self.store.continue_as_new(claim, successor))

    def chain_operation(self, chain_id: str, operation_id: str) -> OperationRecord | None:
        return self._call(self.store.chain_operation(chain_id, operation_id))

    def fork_run(self, fork: ForkRun) -> RunRecord:
        return self._call(self.store.fork_run(fork))

    def family_operation(self, run_id: str, family_key: str) -> OperationRecord | None:
        return self._call(self.store.family_operation(run_id, family_key))

    def get_artifact(self, digest: str) -> bytes:
        return self._call(self.store.get_artifact(digest))

    # carrying a stopped run on: limits

    def stop_run(
        self, claim: Claim, seen: RunLimits, *, error: dict[str, Any], recovery_record: dict[str, Any]
    ) -> bool:
        return self._call(self.store.stop_run(claim, seen, error=error, recovery_record=recovery_record))

    def extend_limits(self, run_id: str, expected_revision: int, change: LimitChange) -> RunRecord | None:
        return self._call(self.store.extend_limits(run_id, expected_revision, change))

    # carrying a stopped run on: waits (messages, sleeps)

    def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> MessageRecord:
        return self._call(self.store.send_message(run_id, name, payload, message_id, by))

    def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> MessageRecord:
        return self._call(self.store.answer_wait(run_id, wait, name, payload, message_id, by))

    def messages(self, run_id: str) -> list[MessageRecord]:
        return self._call(self.store.messages(run_id))

    def await_message(self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None) -> WaitGate:
        return self._call(self.store.await_message(claim, step, name, timeout_ms))

    def await_timer(self, claim: Claim, step: StepRecord, duration_ms: int) -> WaitGate:
        return self._call(self.store.await_timer(claim, step, duration_ms))

    def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> RunRecord:
        return self._call(self.store.retry_run(run_id, expected_revision, retry))

    def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        return self._call(self.store.prune_runs(prune))
