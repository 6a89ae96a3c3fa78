"""The store contract: what any ledger backend must do, and the helpers every backend shares.

A store is correct when it passes the conformance suite in ``safepoint.testing.conformance``;
this protocol only names the operations. Each method is one atomic operation; every method that
takes a ``Claim`` is a worker write and must check the claim's fence *in the same transaction as
the write*, raising ``LostOwnership`` when the fence is stale or the run is no longer running.

Worker writes also count the run's history (``RunRecord.event_count`` and ``step_count``: every
event appended, every step row added) in that transaction. Past the run's soft limit the write
that crossed it appends one ``run.history_warning`` event and issues ``HistoryWarning`` once it
committed; a write that starts something new (``record_step`` of a new step,
``prepare_effect``, ``prepare_and_mark_dispatching``) and would take the history past the hard
limit is refused whole with ``HistoryLimitReached`` — in the same check as the fence.

Every record a store returns is read column by column (``_rows``): a stored value that cannot be
read is a ``CorruptRecord`` naming its table, row and columns, and a listing shows such a run as
an ``UnreadableRun`` instead of failing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from .._rules.canonical import digest as content_digest
from .._rules.canonical import dumps
from ..errors import UsageError
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
    Retry,
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
from .prune import PruneBatch, PruneRequest

if TYPE_CHECKING:
    # Named in annotations only: asyncio costs a program that uses no AsyncStore ~15 ms to import.
    import asyncio
    import threading

__all__ = [
    "INLINE_LIMIT",
    "AsyncStore",
    "ForkRun",
    "NewRun",
    "Replan",
    "Store",
    "cannot_store",
    "check_payload",
    "refuse_gated",
    "retry_json",
    "unstorable",
]

# JSON values larger than this are stored as artifacts and referenced by digest, so that hot
# rows stay small and repeated content is stored once.
INLINE_LIMIT = 16 * 1024


@dataclass(frozen=True, slots=True)
class NewRun:
    run_id: str
    workflow: str
    workflow_version: str
    input_hash: str
    inputs: JSON
    owner: str | None  # None: enqueue the run (pending) for any worker to claim
    lease_ms: int
    resume_budget: int | None = None  # takeovers allowed before BudgetExhausted; None: no limit
    deadline_at: int | None = None  # epoch ms; or, when None,
    deadline_ms: int | None = None  # ms after the run's creation on the store's clock
    token_budget: int | None = None
    cost_budget: float | None = None
    model_call_budget: int | None = None  # model steps (turns) the run may make
    step_attempt_limit: int | None = None  # a raised attempt limit a successor carries on
    step_attempts: Retry | None = None
    history_soft_limit: int | None = None  # see HistoryLimit; None: no limit
    history_hard_limit: int | None = None
    workflow_fingerprint: str | None = None
    workflow_manifest: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ForkRun:
    """A fork as the store makes it (``Store.fork_run``): a new pending run ``run_id`` of
    ``source_run_id``'s workflow and inputs, holding copies of the source's steps recorded
    before ``from_step`` (and their operations), recorded under the source's code — or, with
    ``current_code``, under this ``workflow_version`` / fingerprint / manifest. ``resend`` names
    the operations the fork sends under its own key although its source sent them."""

    source_run_id: str
    from_step: str
    run_id: str
    by: str
    reason: str | None = None
    resend: tuple[str, ...] = ()
    current_code: bool = False
    workflow_version: str | None = None
    workflow_fingerprint: str | None = None
    workflow_manifest: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Replan:
    """One re-planning step of a run under the ``replan`` policy, committed with one event.

    Either or both: continue under this code's version and fingerprint; abandon the stale tail
    of recorded steps — the step at ``step_id`` and every pure, read, model, decision or value
    step recorded after it, up to ``through_seq`` (each moves into the history as a
    ``step.abandoned`` event; effect steps, the steps named in ``keep`` — a fan-out sibling
    branch's — and every operation stay). (A never-sent operation whose payload changed is
    prepared anew by ``reprepare_effect``.)
    """

    reason: str
    workflow_version: str | None = None
    workflow_fingerprint: str | None = None
    workflow_manifest: dict[str, Any] | None = None
    step_id: str | None = None  # abandon from this step's seq on …
    through_seq: int | None = None  # … to this seq (what was recorded before the re-plan)
    keep: tuple[str, ...] = ()  # step ids in that range that stay

    def detail(self) -> dict[str, Any]:
        return {
            key: value
            for key, value in (
                ("reason", self.reason),
                ("workflow_version", self.workflow_version),
                ("workflow_fingerprint", self.workflow_fingerprint),
                ("abandoned_from", self.step_id),
            )
            if value is not None
        }


# How often a wait for work that cannot be woken by its stop event looks whether it was set
# (``Store.wait_for_work``): PostgreSQL's listening socket, an async store driven from a thread.
STOP_POLL_S = 0.1


class Store(Protocol):
    """The ledger store's operations, each one atomic (see the module docstring); open one with
    ``safepoint.open_store``. The conformance suite says what each must do."""

    url: str

    @property
    def identity(self) -> LedgerIdentity:
        """The ledger's id, minted once when its schema was created (migration 1), read on
        open: part of every effect key minted in it, so that two ledgers never share a key."""
        ...

    def now(self) -> int:
        """The store's clock, epoch milliseconds: the one "now" of leases and observations."""
        ...

    def close(self) -> None: ...

    def schema_version(self) -> int:
        """The highest migration applied to this store."""
        ...

    # runs
    def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        """Insert the run — claimed by its starter when ``new.owner`` is set, else pending — or
        return the existing run. The claim is returned only for a run this call created."""
        ...

    def get_run(self, run_id: str) -> RunRecord:
        """The run; ``CorruptRecord`` (or ``ArtifactMissing`` / ``ArtifactCorrupt``) when its row
        cannot be read (see ``UnreadableRun``)."""
        ...

    def find_run(self, run_id: str) -> RunRecord | UnreadableRun:
        """The run as a listing shows it: its record, or — its row unreadable — an
        ``UnreadableRun`` saying what could not be read; ``RunNotFound`` when there is none."""
        ...

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord | UnreadableRun]:
        """Most recently changed first, optionally of one status. A row that cannot be read is
        listed as an ``UnreadableRun``: one bad row never fails the listing."""
        ...

    def query_runs(self, query: RunQuery) -> RunPage:
        """One page of the runs ``query`` asks for (newest created first, keyset-paged), with
        how many runs match it in all and of each status: filtered and counted by the
        database, never by reading every run. A row that cannot be read is listed as an
        ``UnreadableRun``."""
        ...

    def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Claim | None:
        """Compare-and-set ownership; None when another worker got there first."""
        ...

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        """Claim one runnable run of these workflows — pending, released, or running with an
        expired lease — oldest first, skipping runs another worker is claiming right now.
        ``workflows`` names ``"name"`` (any version) or ``"name@version"`` (that version only:
        a worker takes only runs its code can continue). The claim reads nothing of the row but
        plain columns (id, status, revision, fence, lease), so a run whose other columns cannot
        be read is claimed like any other — for its worker to block it, by ``finish_run``,
        which needs nothing more — and a run whose status is unknown is never claimed."""
        ...

    def wait_for_work(
        self, timeout: float, stop: threading.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        """Block up to ``timeout`` seconds, returning early once the store may have new work
        (news) — and no later than the next waiting run falls due (``wake_at``: a sleep ends, a
        wait times out) — or once ``stop`` is set (a worker told to stop leaves at once, not at
        the end of its rescan interval). News heard sooner than ``quiet`` seconds into the wait
        returns at ``quiet``, not before: a worker whose wake-ups keep bringing nothing asks
        less often; a run falling due is never held back by it. True when news ended the wait."""
        ...

    def load_ledger(self, run_id: str) -> Ledger:
        """The run with all its steps and operations, in one batch."""
        ...

    def events(self, run_id: str) -> list[EventRecord]: ...

    # worker writes, each conditioned on the claim's fence
    def renew_lease(self, claim: Claim) -> None:
        """The heartbeat: extend the lease; ``LostOwnership`` once the fence is stale."""
        ...

    def record_step(self, claim: Claim, step: StepRecord) -> None:
        """Record (or re-record) a step; its ``tokens`` and ``cost`` are added to the run's
        spent totals in the same commit. A new step is held to the hard history limit."""
        ...

    def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None:
        """``record_step`` for several steps in one commit (pure steps written lazily, with the
        next step of the run): one fence, the history limit counted for the new ones."""
        ...

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None:
        """Record a failed attempt of a step that will be tried again (new work: refused once
        a cancel is asked for or the deadline passed)."""
        ...

    def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], JSON], family_key: str | None = None
    ) -> StepRecord:
        """A transaction step: in ONE transaction of the ledger's own database, fence first
        (new work, the step counted and held to the hard history limit, as ``record_step``),
        the run family's claim on the step taken (``family_key``, as ``mark_dispatching`` takes
        an operation's: ``ClaimedInFamily``, nothing written and ``body`` never called, when
        another run of the family holds it), then ``body(tx)`` — ``tx`` the connection bound to
        that transaction (``types.Transaction``) — then ``step`` recorded with body's value as
        its result, and one commit. Returns the step as recorded. When ``body`` raises, or ends
        the transaction itself (``UsageError``), the transaction rolls back whole and what it
        raised passes unchanged. A stale fence raises ``LostOwnership`` and commits nothing:
        before ``body`` is called, or — a store that sends the fence with body's first statement,
        to save a round trip (PostgreSQL) — from that statement, rolled back unseen."""
        ...

    def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        """Prepared intent: payload artifact, operation id and effect key, in one commit; filed
        under the run's chain (see ``chain_operation``); held to the hard history limit."""
        ...

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        """Commit "dispatch may have happened"; returns the operation as it now stands. An
        operation that needs approval is dispatched only under an approval that authorizes it
        (checked in the same transaction, on the store's clock; its id is kept as the
        operation's ``approval_id``); ``ApprovalInvalid`` otherwise, and nothing is written.
        Never held to the history limit: the operation was prepared already."""
        ...

    def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> OperationRecord:
        """``prepare_effect`` then ``mark_dispatching`` of a new operation, in one commit, for
        an effect with no gate between the two (see ``_rules.effects.one_commit_to_dispatching``):
        the same rows, both events (``effect.prepared``, ``effect.dispatching``), the same
        refusals — held to the hard history limit as the prepare is — and all or nothing.
        Returns the operation as it now stands (dispatching, dispatch count 1). An operation
        that needs approval has a gate there: refused with ``ValueError``, nothing written."""
        ...

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
        """Record an outcome; with ``step`` (acceptance) the effect's step row in the same commit.
        Never held to the history limit: what happened is always recorded. The run keeps its
        family's claim on the operation whatever the outcome — a request it sent may still
        arrive, and only its own key lets the owner absorb that — but for ``not_sent`` (back
        to prepared because the dispatch provably never left): the claim goes back, for any
        member of the family to take."""
        ...

    def finish_run(
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

    def release_run(self, claim: Claim) -> None: ...

    def replan(self, claim: Claim, change: Replan) -> None:
        """Commit one re-planning step (see ``Replan``) with its ``run.replanned`` event."""
        ...

    def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]:
        """End the claimed run as ``continued``, pointing at ``successor``, and create the
        successor — claimed by ``successor.owner``, in the run's chain (``chain_id``, the next
        ``chain_index``, ``parent_run_id``) — in one atomic operation. Fenced like a new step:
        ``LostOwnership`` when stale, ``Cancelled`` once a cancel is asked for; never refused by
        the history limit. A successor id held by another run raises ``RunConflict`` and
        changes nothing. (No successor can exist without its parent ended continued: a continue
        retried after a crash finds either both done or neither.)"""
        ...

    def chain_operation(self, chain_id: str, operation_id: str) -> OperationRecord | None:
        """The operation ``operation_id`` as an earlier run of chain ``chain_id`` settled it
        (accepted or rejected), or None: how a successor finds the chain's effect ledger
        without a copy of it. One indexed lookup."""
        ...

    def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord:
        """Ask a run to stop: a pending or blocked run ends cancelled at once; a running one is
        marked, and from then on every write that starts something new (``record_step``,
        ``record_attempt``, ``prepare_effect``, ``mark_dispatching``,
        ``prepare_and_mark_dispatching``) raises ``Cancelled`` while outcomes and the ending
        may still be recorded. A waiting run ends cancelled at once — unless an effect of it is
        uncertain: then it becomes pending, for a worker to settle that effect (it starts
        nothing new). An ended run is left as it is. Past a run's ``deadline_at`` the same
        writes raise ``DeadlineExceeded``."""
        ...

    # approvals (see safepoint._rules.approvals)
    def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        """Replace the payload (and target digest) of an operation that needs approval and was
        never dispatched (prepared, dispatch count 0): its key never left, and no approval of
        the old payload authorizes the new one. ``StoreError`` for any other operation."""
        ...

    def await_approval(self, claim: Claim, operation_id: str, target_digest: str | None) -> ApprovalGate:
        """The approval gate, in one atomic step: mark the operation as needing approval and
        record ``target_digest`` as its target's state; then return the newest approval that
        authorizes it (same payload and target digests, not expired on the store's clock) — or,
        with none, make the run ``waiting`` (owner released, ``waiting_for`` recorded, a
        ``run.waiting`` event) and return no approval."""
        ...

    def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord:
        """Record a person's approval of the effect step ``step_id`` prepared, bound to its
        payload digest and recorded target digest (see ``_rules.approvals.plan_approval``), with an
        ``effect.approved`` event; a run waiting for that effect becomes pending. Serialised
        with ``await_approval`` on the run, so an approval is never lost to a run about to wait.
        ``ApprovalRefused`` when it does not fit the run."""
        ...

    def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> list[ApprovalRecord]:
        """Revoke, in one atomic step, every approval still in force of the effect step
        ``step_id`` prepared, stamped with the store's clock and ``revocation``'s who and why,
        with an ``effect.approval_revoked`` event; return them as revoked. The run's status
        stays as it is (see ``_rules.approvals.plan_revocation``). Serialised with
        ``mark_dispatching`` (and ``await_approval``) on the run, so whichever commits first
        wins: a dispatch under the approval makes the revocation too late, a revocation makes
        the dispatch refused. ``ApprovalRefused`` (nothing written) when there is nothing to
        revoke: no prepared effect, no approval in force, or the effect was dispatched."""
        ...

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        """Every approval given in the run, in the order they were given, revoked ones
        included (with when, by whom and why)."""
        ...

    # a person's decision about a blocked run
    def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> RunRecord:
        """Settle a blocked run in one atomic step, compare-and-set on ``expected_revision``:
        ``applied`` accepts the operation with the receipt and releases the run, ``not_applied``
        puts it back to prepared and releases the run, ``abandon`` cancels the run; a
        ``run.resolved`` event records who decided and why. The same resolution repeated is a
        no-op; anything that no longer fits raises ``ResolutionRefused``."""
        ...

    # artifacts
    def get_artifact(self, digest: str) -> bytes:
        """The bytes under ``digest``, verified; ArtifactMissing / ArtifactCorrupt otherwise."""
        ...

    # carrying a stopped run on: limits

    def stop_run(
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

    def extend_limits(self, run_id: str, expected_revision: int, change: LimitChange) -> RunRecord | None:
        """Give a run the limits ``change.new`` and append a ``run.limits_extended`` event (who,
        why, the old and new limits), compare-and-set on ``expected_revision``, in one
        transaction; return the run as it now stands. What the run spent stays as it is. A
        stopped run becomes pending — its error and recovery record cleared, idle workers woken
        as for a new run; any other run keeps its status (a running run's worker reads the new
        limits before it stops at one). None when the revision moved or the run has ended:
        nothing is changed. ``RunNotFound`` when there is no such run."""
        ...

    # carrying a stopped run on: retry
    def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> RunRecord:
        """Retry a failed run in one atomic step, compare-and-set on ``expected_revision``
        (see ``safepoint.storage.retry``): each step ``retry.moved`` names moves into the
        history — its failed record and failed attempts as one ``step.retried`` event — each
        operation in ``retry.resend`` (rejected, at the attempt before the one named) becomes
        that attempt, prepared under its derived key with its outcome and dispatch count
        cleared, and the run becomes pending (error and recovery record cleared; workers are
        woken) with a ``run.retried`` event. A run that is not failed (or stopped at a step's
        attempts), has moved, or no longer holds what ``retry`` names raises ``RetryRefused``
        and changes nothing. Returns the run as it now stands."""
        ...

    # carrying a stopped run on: fork
    def fork_run(self, fork: ForkRun) -> RunRecord:
        """Make a fork (see ``ForkRun``) in one atomic step and return it, pending: its own chain,
        ``forked_from`` naming the source and step, the source's steps recorded before
        ``from_step`` (by seq) copied with the operations of the copied effect steps, as they
        are, and what those steps spent counted as spent; a ``run.forked`` event on the fork
        and a ``run.fork_made`` event on the source (who, why). ``ForkRefused`` (nothing
        written) when the source runs under a live lease, ``from_step`` is not a step it
        recorded, the prefix holds an operation not settled, or ``resend`` names no operation
        of the source's tail; ``RunConflict`` when ``run_id`` exists."""
        ...

    def family_operation(self, run_id: str, family_key: str) -> OperationRecord | None:
        """The operation another run of ``run_id``'s family (its source, a fork, a successor, …)
        holds the claim on under ``family_key`` (``OperationRecord.family_key``), as that run
        holds it — or None. The claim is taken in the transaction that marks an operation
        dispatching (``mark_dispatching``, ``prepare_and_mark_dispatching``), which raises
        ``ClaimedInFamily`` and writes nothing when another run holds it and may have sent it;
        ``resolve`` (not applied) gives it back."""
        ...

    # retention
    def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        """One batch of a prune, in one atomic step (see ``safepoint.storage.prune``): the next
        finished chains ``prune`` asks for, each read again under its runs' locks and deleted
        whole — its runs with their steps, events, attempts, approvals, messages and operations,
        then the artifacts nothing else references — unless ``_rules.retention.chain_kept``
        keeps it (a run of it not finished, a fork of it, an operation whose owner may still
        remember its key and no ``force``). A dry run deletes nothing and reports exactly what
        would have gone. Returns what the batch deleted, what it kept and why, and the cursor
        the next batch starts from."""
        ...

    # carrying a stopped run on: waits (messages, sleeps)
    def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> MessageRecord:
        """Keep a message for the run, in one atomic step (see ``_rules.waits``): refused
        (``NotJSON``, ``SecretRefused``) when its payload is no JSON or holds a credential,
        ``RunNotFound`` for no such run, ``MessageRefused`` for a run that ended; a
        ``message_id`` kept already returns that message (the same message delivered twice) —
        or is ``MessageRefused`` when it names another. A run waiting for a message of this
        name becomes pending in the same transaction (workers are woken), which takes the
        run's row as ``await_message`` does: a message is never lost to a run about to wait.
        A ``message.sent`` event records it."""
        ...

    def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> MessageRecord:
        """Keep an answer to the wait step ``wait`` (messages ``name``), as ``send_message``
        keeps a message, and refused as it refuses one — but addressed to that wait: it takes
        it before anything queued by name, and only it. A wait takes one answer
        (``_rules.answers``): ``WaitAnswered`` when one is kept for it already, it took a
        message or it timed out; ``MessageRefused`` when the step is no wait for messages
        ``name``. The run parked at exactly that wait becomes pending. Decided under the run's
        row, as ``send_message``: k answers at once keep one."""
        ...

    def messages(self, run_id: str) -> list[MessageRecord]:
        """Every message sent to the run, oldest first, taken ones included (by which step)."""
        ...

    def await_message(self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None) -> WaitGate:
        """A wait's gate, in one atomic step under the claim's fence (new work: refused once a
        cancel is asked for or past the deadline; not held to the history limit): the oldest
        message ``name`` not yet taken — sent before the wait's timeout instant — is marked
        taken by ``step`` (its id), and ``step`` is recorded with its payload as result and a
        ``message.received`` event. With none: past the timeout instant (recorded when the
        wait first waited; else ``timeout_ms`` from now) ``step`` is recorded failed
        (``_rules.waits.timed_out_evidence``, a ``wait.timed_out`` event); before it, the run
        becomes ``waiting`` (released, ``waiting_for`` and ``wake_at`` recorded, a
        ``run.waiting`` event), a first wait with a timeout recording its instant as the
        step's attempt."""
        ...

    def await_timer(self, claim: Claim, step: StepRecord, duration_ms: int) -> WaitGate:
        """A sleep's gate, in one atomic step under the claim's fence (as ``await_message``):
        ``step`` recorded at its first run with its due instant (``duration_ms`` from now, on
        the store's clock) as result, never again; not yet due, the run becomes ``waiting``
        until then (``wake_at``; a ``run.waiting`` event). Returns the step as recorded."""
        ...

    # carrying a run on in slices

    def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> None:
        """Release the claimed run at the end of a slice: no owner and no lease, its status as
        it is (``running``: the next claim takes it at once), and a ``run.slice_ended`` event
        (``step_id``: the step it stopped before; ``detail``) — in one transaction, fenced:
        ``LostOwnership`` when the claim's fence is stale (nothing is written then). Wakes a
        waiting worker, as a release does."""
        ...


class AsyncStore(Protocol):
    """``Store`` for asyncio: each operation with the same meaning (see ``Store``), as a
    coroutine — and one more, ``renew_lease_blocking``. Open one with ``open_async_store``
    (``safepoint.storage.open_async``); close it with ``await store.close()``. The conformance
    suite runs against an async store through ``safepoint.testing.conformance.SyncOverAsync``.
    """

    url: str

    @property
    def identity(self) -> LedgerIdentity: ...
    async def now(self) -> int: ...
    async def close(self) -> None: ...
    def renew_lease_blocking(self, claim: Claim) -> None:
        """The heartbeat's renewal, from a thread, without the event loop (a loop stuck in a
        blocking call must not let a live worker's lease lapse). ``LostOwnership`` when stale."""
        ...

    async def schema_version(self) -> int: ...

    # runs
    async def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]: ...
    async def get_run(self, run_id: str) -> RunRecord: ...
    async def find_run(self, run_id: str) -> RunRecord | UnreadableRun: ...
    async def list_runs(
        self, status: RunStatus | None = None, limit: int = 100
    ) -> list[RunRecord | UnreadableRun]: ...
    async def query_runs(self, query: RunQuery) -> RunPage: ...
    async def claim_run(
        self, run_id: str, expected_revision: int, owner: str, lease_ms: int, dead_owner: str | None = None
    ) -> Claim | None: ...
    async def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None: ...
    async def wait_for_work(
        self, timeout: float, stop: asyncio.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        """``Store.wait_for_work``, never blocking the event loop."""
        ...

    async def load_ledger(self, run_id: str) -> Ledger: ...
    async def events(self, run_id: str) -> list[EventRecord]: ...

    # worker writes, each conditioned on the claim's fence
    async def renew_lease(self, claim: Claim) -> None: ...
    async def record_step(self, claim: Claim, step: StepRecord) -> None: ...
    async def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None: ...
    async def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None: ...
    async def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], Any], family_key: str | None = None
    ) -> StepRecord:
        """See ``Store.record_transaction``; ``body`` may be a coroutine function
        (``types.AsyncTransaction``), awaited inside the transaction."""
        ...

    async def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None: ...
    async def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord: ...
    async def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> OperationRecord: ...
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
    ) -> None: ...
    async def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None: ...
    async def release_run(self, claim: Claim) -> None: ...
    async def replan(self, claim: Claim, change: Replan) -> None: ...
    async def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]: ...
    async def chain_operation(self, chain_id: str, operation_id: str) -> OperationRecord | None: ...
    async def resolve(self, run_id: str, expected_revision: int, resolution: Resolution) -> RunRecord: ...
    async def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord: ...

    # approvals
    async def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None: ...
    async def await_approval(
        self, claim: Claim, operation_id: str, target_digest: str | None
    ) -> ApprovalGate: ...
    async def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord: ...
    async def revoke_approval(
        self, run_id: str, step_id: str, revocation: ApprovalRevocation
    ) -> list[ApprovalRecord]: ...
    async def approvals(self, run_id: str) -> list[ApprovalRecord]: ...

    # artifacts
    async def get_artifact(self, digest: str) -> bytes: ...
    async def stop_run(
        self, claim: Claim, seen: RunLimits, *, error: dict[str, Any], recovery_record: dict[str, Any]
    ) -> bool: ...
    async def extend_limits(
        self, run_id: str, expected_revision: int, change: LimitChange
    ) -> RunRecord | None: ...

    # carrying a stopped run on: retry
    async def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> RunRecord: ...

    # carrying a stopped run on: fork
    async def fork_run(self, fork: ForkRun) -> RunRecord: ...
    async def family_operation(self, run_id: str, family_key: str) -> OperationRecord | None: ...

    # retention
    async def prune_runs(self, prune: PruneRequest) -> PruneBatch: ...

    # carrying a stopped run on: waits (messages, sleeps)
    async def send_message(
        self, run_id: str, name: str, payload: JSON, message_id: str | None = None, by: str | None = None
    ) -> MessageRecord: ...
    async def answer_wait(
        self,
        run_id: str,
        wait: str,
        name: str,
        payload: JSON,
        message_id: str | None = None,
        by: str | None = None,
    ) -> MessageRecord: ...
    async def messages(self, run_id: str) -> list[MessageRecord]: ...
    async def await_message(
        self, claim: Claim, step: StepRecord, name: str, timeout_ms: int | None
    ) -> WaitGate: ...
    async def await_timer(self, claim: Claim, step: StepRecord, duration_ms: int) -> WaitGate: ...
    async def end_slice(self, claim: Claim, *, step_id: str | None, detail: dict[str, Any]) -> None: ...


def unstorable(exc: BaseException) -> UsageError | None:
    """The answer, the same on every store, to a value the database cannot hold at all — text
    with a lone surrogate, or NUL, which a driver refuses before anything is sent: no record
    can have such an id, so it is the caller's mistake (``UsageError``), not the store's."""
    nul = type(exc).__name__ == "DataError" and "NUL" in str(exc)
    if isinstance(exc, UnicodeEncodeError) or nul:
        return cannot_store(str(exc))
    return None


def cannot_store(detail: str) -> UsageError:
    return UsageError(
        f"a value given to the store cannot be stored ({detail}): ids and text are"
        " stored as UTF-8, without lone surrogates or NUL — check the id"
    )


def check_payload(op: OperationRecord, payload: bytes) -> None:
    """``ValueError`` unless ``payload`` is the bytes ``op.payload_ref`` names: checked before
    anything is written or sent, whoever holds the fence — a caller's mistake, never a state of
    the run, so every store says so the same way."""
    if content_digest(payload) != op.payload_ref:
        raise ValueError(f"payload digest {op.payload_ref} does not match its bytes")


def refuse_gated(op: OperationRecord) -> None:
    """``prepare_and_mark_dispatching`` makes one commit of what an approval gate would stand
    between: an operation that needs approval is refused before anything is written."""
    if op.approval_required:
        raise ValueError(
            f"operation {op.operation_id!r} needs approval: it is prepared, then"
            " dispatched through the gate, never both in one commit"
        )


def retry_json(policy: Retry | None) -> str | None:
    """A run's default step attempts as stored (JSON text), or None."""
    return None if policy is None else dumps(policy.as_json())
