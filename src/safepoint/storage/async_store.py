"""The store contract for asyncio: ``AsyncStore``, the operations of ``storage.base.Store`` with
the same meaning, as coroutines (``open_async_store``; the async PostgreSQL store implements it).
Kept apart from ``Store`` so that neither protocol is read through the other's length, and so
that a program that uses no async store never imports asyncio.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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
from .base import ForkRun, NewRun, Replan
from .prune import PruneBatch, PruneRequest

if TYPE_CHECKING:
    # Named in annotations only: asyncio costs a program that uses no AsyncStore ~15 ms to import.
    import asyncio

__all__ = ["AsyncStore"]


class AsyncStore(Protocol):
    """``Store`` for asyncio: the same operations, with the same meaning, as coroutines.

    The conformance suite runs against an async store through
    ``safepoint.testing.conformance.SyncOverAsync``. Open one with ``open_async_store``
    (``safepoint.storage.open_async``); close it with ``await store.close()``.
    """

    url: str

    @property
    def identity(self) -> LedgerIdentity:
        """As for ``Store``: read when the store was opened."""
        ...

    async def now(self) -> int:
        """The store's clock, epoch milliseconds: the one "now" of leases and observations."""
        ...

    async def close(self) -> None: ...

    def renew_lease_blocking(self, claim: Claim) -> None:
        """The heartbeat's renewal, from a thread, without the event loop (a loop stuck in a
        blocking call must not let a live worker's lease lapse). ``LostOwnership`` when stale."""
        ...

    async def schema_version(self) -> int:
        """The highest migration applied to this store."""
        ...

    # runs
    async def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        """See ``Store.create_run``."""
        ...

    async def get_run(self, run_id: str) -> RunRecord:
        """See ``Store.get_run``."""
        ...

    async def find_run(self, run_id: str) -> RunRecord | UnreadableRun:
        """See ``Store.find_run``."""
        ...

    async def list_runs(
        self, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord | UnreadableRun]:
        """See ``Store.list_runs``."""
        ...

    async def query_runs(self, query: RunQuery) -> RunPage:
        """``Store.query_runs``."""
        ...

    async def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Claim | None:
        """Compare-and-set ownership; None when another worker got there first."""
        ...

    async def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        """See ``Store.claim_next``."""
        ...

    async def wait_for_work(self, timeout: float, stop: asyncio.Event | None = None) -> None:
        """Wait up to ``timeout`` seconds, returning early once the store may have new work or
        ``stop`` is set; never blocks the event loop."""
        ...

    async def load_ledger(self, run_id: str) -> Ledger:
        """The run with all its steps and operations, in one batch."""
        ...

    async def events(self, run_id: str) -> list[EventRecord]: ...

    # worker writes, each conditioned on the claim's fence
    async def renew_lease(self, claim: Claim) -> None:
        """The heartbeat: extend the lease; ``LostOwnership`` once the fence is stale."""
        ...

    async def record_step(self, claim: Claim, step: StepRecord) -> None:
        """See ``Store.record_step``."""
        ...

    async def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None: ...

    async def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None:
        """See ``Store.record_attempt``."""
        ...

    async def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], Any], family_key: str | None = None
    ) -> StepRecord:
        """See ``Store.record_transaction``; ``body`` may be a coroutine function
        (``types.AsyncTransaction``), awaited inside the transaction."""
        ...

    async def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        """Prepared intent: payload artifact, operation id and effect key, in one commit."""
        ...

    async def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        """Commit "dispatch may have happened"; returns the operation as it now stands."""
        ...

    async def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> OperationRecord:
        """See ``Store.prepare_and_mark_dispatching``."""
        ...

    async def record_outcome(
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
        """Record an outcome; with ``step`` (acceptance) the effect's step row in the same commit."""
        ...

    async def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None:
        """Complete, fail or block the run and release ownership."""
        ...

    async def release_run(self, claim: Claim) -> None: ...

    async def replan(self, claim: Claim, change: Replan) -> None: ...

    async def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]:
        """See ``Store.continue_as_new``."""
        ...

    async def chain_operation(self, chain_id: str, operation_id: str) -> OperationRecord | None:
        """See ``Store.chain_operation``."""
        ...

    async def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> RunRecord:
        """See ``Store.resolve``."""
        ...

    async def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord:
        """See ``Store.request_cancel``."""
        ...

    # approvals
    async def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        """See ``Store.reprepare_effect``."""
        ...

    async def await_approval(
        self, claim: Claim, operation_id: str, target_digest: str | None
    ) -> ApprovalGate:
        """See ``Store.await_approval``."""
        ...

    async def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord:
        """See ``Store.approve``."""
        ...

    async def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> list[ApprovalRecord]:
        """See ``Store.revoke_approval``."""
        ...

    async def approvals(self, run_id: str) -> list[ApprovalRecord]:
        """See ``Store.approvals``."""
        ...

    # artifacts
    async def get_artifact(self, digest: str) -> bytes:
        """The bytes under ``digest``, verified; ArtifactMissing / ArtifactCorrupt otherwise."""
        ...

    # carrying a stopped run on: limits

    async def stop_run(
        self, claim: Claim, seen: RunLimits, *, error: dict[str, Any], recovery_record: dict[str, Any]
    ) -> bool:
        """End the claimed run ``stopped`` at a limit — released, with ``error`` and its
        recovery record (phase ``limit_reached``; its ``state_revision`` filled in as
        ``finish_run`` does) and a ``run.stopped`` event — unless its limits are no longer
        ``seen``, the limits its worker last read: a person changed them since
        (``extend_limits``). Then nothing is written and the answer is False: the worker reads
        the run again, and carries it on if the limit was raised. Fenced: ``LostOwnership``
        when stale. A stopped run is never claimed (``claim_run``, ``claim_next``)."""
        ...

    async def extend_limits(
        self, run_id: str, expected_revision: int, change: LimitChange
    ) -> RunRecord | None:
        """Give a run the limits ``change.new`` and append a ``run.limits_extended`` event (who,
        why, the old and new limits), compare-and-set on ``expected_revision``, in one
        transaction; return the run as it now stands. What the run spent stays as it is. A
        stopped run becomes pending — its error and recovery record cleared, idle workers woken
        as for a new run; any other run keeps its status (a running run's worker reads the new
        limits before it stops at one). None when the revision moved or the run has ended:
        nothing is changed. ``RunNotFound`` when there is no such run."""
        ...

    # carrying a stopped run on: retry
    async def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> RunRecord:
        """See ``Store.retry_run``."""
        ...

    # carrying a stopped run on: fork
    async def fork_run(self, fork: ForkRun) -> RunRecord:
        """See ``Store.fork_run``."""
        ...

    async def family_operation(self, run_id: str, family_key: str) -> OperationRecord | None:
        """See ``Store.family_operation``."""
        ...

    # retention
    async def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        """See ``Store.prune_runs``."""
        ...

    # carrying a stopped run on: waits (messages, sleeps)
    async def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> MessageRecord:
        """See ``Store.send_message``."""
        ...

    async def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> MessageRecord:
        """See ``Store.answer_wait``."""
        ...

    async def messages(self, run_id: str) -> list[MessageRecord]:
        """See ``Store.messages``."""
        ...

    async def await_message(
        self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None
    ) -> WaitGate:
        """See ``Store.await_message``."""
        ...

    async def await_timer(self, claim: Claim, step: StepRecord, duration_ms: int) -> WaitGate:
        """See ``Store.await_timer``."""
        ...

    # carrying a run on in slices

    async def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> None:
        """See ``Store.end_slice``."""
        ...


# -- decisions every store makes the same way (I/O-free) ----------------------------------------
