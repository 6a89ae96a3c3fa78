"""Public enums and frozen records: the ledger's vocabulary as Python values.

What a run's code meets (``RunStatus``, ``RunRecord``, ``Resolution``, ...) and what a store
implements its protocol with (``Claim``, ``Ledger``, ``ApprovalRequest``, ...). ``JSON`` is the
type of every value the ledger records — a step's result, a run's input, an effect's payload —
a value ``json`` writes and reads back equal; ``Recorded`` is what a record's field holds when it
is read back (JSON of plain dicts and lists, typed ``Any`` so that the reader says what shape it
expects). ``Params`` is what a statement of a transaction step is bound with
(``Transaction``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeAlias

from .errors import UsageError

__all__ = [
    "JSON",
    "ApprovalGate",
    "ApprovalRecord",
    "ApprovalRequest",
    "ApprovalRevocation",
    "AsyncTransaction",
    "AttemptRecord",
    "Budget",
    "Claim",
    "Compatibility",
    "Durability",
    "EffectState",
    "EventRecord",
    "HistoryLimit",
    "Ledger",
    "LedgerIdentity",
    "LimitChange",
    "MessageRecord",
    "OperationRecord",
    "Params",
    "Recorded",
    "Resend",
    "Resolution",
    "ResolutionAction",
    "Retry",
    "RunLimits",
    "RunPage",
    "RunQuery",
    "RunRecord",
    "RunRetry",
    "RunStatus",
    "StepKind",
    "StepRecord",
    "StepStatus",
    "Transaction",
    "Unfinished",
    "UnreadableRun",
    "WaitGate",
]

# A JSON value, wherever one is passed in (a payload, messages, a receipt, a result to record):
# read-only containers, so that a ``dict[str, int]`` or a list of dicts is one too (``dict`` and
# ``list`` are invariant). What a record holds, read back from the ledger, is JSON of plain dicts
# and lists; those fields are typed ``Any`` (``Recorded``), so that code reading a record says
# what shape it expects instead of narrowing a union at every step.
JSON: TypeAlias = Mapping[str, "JSON"] | Sequence["JSON"] | str | int | float | bool | None
Recorded: TypeAlias = Any


class Durability(StrEnum):
    """What a committed step survives. Stated, never implied."""

    PROCESS_CRASH = "process_crash"  # default: survives the process dying (SQLite WAL, NORMAL)
    POWER_LOSS = "power_loss"  # also survives the machine losing power (fsync every commit)


class Compatibility(StrEnum):
    """What a worker does with a run recorded by other code (another version or fingerprint),
    or whose recorded step answers another question than the one now asked."""

    REFUSE = "refuse"  # block with the recovery record; a person deploys the old code or gives up
    REPLAN = "replan"  # abandon the stale tail of observations and decisions, keep the effects


class RunStatus(StrEnum):
    """Where a run stands: pending, running, waiting, blocked, or one of its endings."""

    PENDING = "pending"  # created, not yet claimed by a worker
    RUNNING = "running"  # owned (or last owned) by a worker that is making progress
    COMPLETED = "completed"  # the workflow returned; the result is recorded
    FAILED = "failed"  # the workflow raised; the error is recorded
    BLOCKED = "blocked"  # stopped visibly for a person; see the recovery record
    CANCELLED = "cancelled"
    WAITING = "waiting"  # paused for an approval, a message or a timer; see ``waiting_for``
    CONTINUED = "continued"  # continued as new: its successor (successor_run_id) carries on
    STOPPED = "stopped"  # reached a limit; resumable once a person raises it (extend_limits)

    @property
    def terminal(self) -> bool:
        """This run will never run again (a continued run's chain goes on in its successor)."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.CONTINUED)


class StepKind(StrEnum):
    """What a recorded step is, which decides how it replays: pure, read, model, decision, effect,
    value, wait, transaction."""

    PURE = "pure"  # recomputable; recorded as an optimisation
    READ = "read"  # an observation; replayed until max_age says it expired
    MODEL = "model"  # a model response; replayed, never re-generated
    DECISION = "decision"  # the planner's choice of the next step; replayed
    EFFECT = "effect"  # a change in another system; replayed or reconciled
    VALUE = "value"  # a recorded now(), random() or uuid()
    WAIT = "wait"  # a wait for the outside world: the message received, or the timer that ran
    # writes to the ledger's own database, committed with the step record; replayed, never re-run
    TRANSACTION = "transaction"


class StepStatus(StrEnum):
    """How a recorded step ended: completed, or failed (its error is raised again on replay)."""

    COMPLETED = "completed"  # the step returned; its result is recorded
    FAILED = "failed"  # the step raised; its error is recorded and raised on replay


class EffectState(StrEnum):
    """Where one effect operation stands in the dispatch protocol (see DESIGN §3)."""

    PREPARED = "prepared"  # payload, operation id and effect key are durable
    DISPATCHING = "dispatching"  # "dispatch may have happened"
    APPLIED = "applied"  # the owner's receipt is recorded
    REJECTED = "rejected"  # the owner refused; it did not happen
    UNKNOWN = "unknown"  # the call failed without proof either way
    ACCEPTED = "accepted"  # verified (or no verifier); the run moves on


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the ledger holds it: identity, workflow, status, ownership, limits, outcome."""

    run_id: str
    workflow: str
    workflow_version: str
    status: RunStatus
    input_hash: str
    inputs: Recorded
    state_revision: int
    owner: str | None
    lease_expires_at: int | None
    fence: int
    resume_count: int
    event_count: int
    result: Recorded
    error: dict[str, Any] | None
    recovery_record: dict[str, Any] | None
    created_at: int
    updated_at: int
    resume_budget: int | None = None  # takeovers allowed before the run fails loudly
    cancel_requested_at: int | None = None  # asked to stop: settle what is in flight, no more
    workflow_fingerprint: str | None = None  # tool schemas, model ids, prompt hashes (None: older)
    workflow_manifest: dict[str, Any] | None = None  # those parts as digests, to say what changed
    deadline_at: int | None = None  # epoch ms (store clock): nothing new is started after it
    token_budget: int | None = None  # model tokens the run may spend (None: no limit)
    cost_budget: float | None = None  # model cost the run may spend, in your unit
    tokens_spent: int = 0  # recorded by model steps; never reset by a restart
    cost_spent: float = 0.0
    step_attempts: Retry | None = None  # the run's default attempts for read and model steps
    # A waiting run: what for, by "kind" (a missing kind is "approval"): an effect to be
    # approved (operation_id, step_id, effect, payload_digest, target_digest, reason,
    # invalidated, since); a "message" (name, step_id, timeout_at, since); a "sleep" (step_id,
    # until, since).
    waiting_for: dict[str, Any] | None = None
    step_count: int = 0  # steps recorded; with event_count, the history
    history_soft_limit: int | None = None  # history that records one run.history_warning
    history_hard_limit: int | None = None  # history past which nothing new is recorded
    history_warned_at: int | None = None  # when the soft limit was crossed
    chain_id: str | None = None  # the first run of its continue-as-new chain
    chain_index: int = 0  # its place in the chain (0: the first run)
    parent_run_id: str | None = None  # the run it continues
    successor_run_id: str | None = None  # the run that continues it (status continued)
    model_call_budget: int | None = None  # model steps (turns) the run may make (None: no limit)
    model_calls_spent: int = 0  # model steps made; never reset by a restart
    step_attempt_limit: int | None = None  # a person raised every step's attempts to this
    wake_at: int | None = None  # a waiting run is due then (its sleep ends, its wait times out)
    forked_from: dict[str, Any] | None = None  # a fork: {"run_id", "step_id"} it started from
    heartbeat_at: int | None = None  # its worker's last lease renewal (None: none since the claim)
    # its family (the run its forks and successors grew from) and its place there: a chain's
    # generation, a fork standing where its source stands (see ``_rules.family``)
    family_id: str | None = None
    family_generation: int = 0

    @property
    def history_size(self) -> int:
        """What the history limits count: the run's events and its recorded steps."""
        return self.event_count + self.step_count


@dataclass(frozen=True, slots=True)
class UnreadableRun:
    """A run whose stored row this safepoint cannot read, as a listing shows it (``list_runs``,
    ``find_run``, ``safepoint runs``, the dashboard) instead of failing: what could not be read,
    and every column that could.

    A column is unreadable when its JSON does not parse or is not the shape its field holds,
    its value is one this version does not know (a status, say), it is NULL where a value is
    required, a time is not an integer, its text is not UTF-8, or its artifact is missing or
    altered. The row is kept as it is. ``get_run`` and ``load_ledger`` raise ``CorruptRecord``
    (or ``ArtifactMissing`` / ``ArtifactCorrupt``) for it; the first worker that claims it
    blocks it (recovery record phase ``unreadable_record``) and goes on with other runs. A run
    whose status is unreadable is never claimed: it stays as it is, listed.
    """

    run_id: str
    reason: str  # what could not be read, column by column
    columns: tuple[str, ...]  # the columns that could not be read
    workflow: str | None = None  # None: unreadable, as every field below
    workflow_version: str | None = None
    status: RunStatus | None = None
    state_revision: int | None = None
    owner: str | None = None
    fence: int | None = None
    resume_count: int | None = None
    created_at: int | None = None
    updated_at: int | None = None
    recovery_record: dict[str, Any] | None = None  # a blocked run's, when it can be read


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Which runs a listing asks for (``Store.query_runs``): every field given narrows it.

    ``search`` matches anywhere in the run id, ignoring ASCII case. Time bounds are epoch ms on
    the store's clock: ``*_from`` inclusive, ``*_to`` exclusive. The runs come newest created
    first (then by run id, descending), ``limit`` at a time; ``after`` is the ``next_after`` of
    the page before: the keyset ``(created_at, run_id)`` of its last run, so a run created
    while a person pages through never shifts a page or shows twice.
    """

    status: RunStatus | None = None
    workflow: str | None = None
    workflow_version: str | None = None
    search: str | None = None
    created_from: int | None = None
    created_to: int | None = None
    updated_from: int | None = None
    updated_to: int | None = None
    limit: int = 50
    after: tuple[int, str] | None = None


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of a ``RunQuery``: its runs, how many runs match the whole query (``total``),
    how many of each status match it but for its status (``counts``: every status, zeros
    included) and the keyset to pass as ``after`` for the next page (None: this is the last)."""

    runs: list[RunRecord | UnreadableRun]
    total: int
    counts: dict[RunStatus, int]
    next_after: tuple[int, str] | None


@dataclass(frozen=True, slots=True)
class Unfinished:
    """What ``start``, ``resume`` (and their async forms) return instead of the workflow's
    result when the ``slice=`` they were given was spent before the run ended.

    The run stopped at a step boundary — never inside an effect's dispatch — with its pure
    steps written, and was released at once: ``status`` is how it stands now (``running`` with
    no owner), so the next ``resume`` (or any worker) claims it without waiting for a lease to
    expire and carries it on. ``reason`` says when and before which step it stopped; the run's
    history records it as a ``run.slice_ended`` event. ``run_id`` is the run that stopped: the
    one given, or the run that continues its chain (``continue_as_new``) — resuming either id
    carries the chain on.

    An ``Unfinished`` is truthy, like any object: a workflow's own result may be falsy (``None``,
    ``0``, ``{}``), so test for it by type, not by truth::

        outcome = sp.resume(store, run_id, slice=timedelta(seconds=25))
        if isinstance(outcome, sp.Unfinished):
            schedule_again(outcome.run_id)  # the next invocation carries it on at once
    """

    run_id: str
    status: RunStatus
    reason: str


@dataclass(frozen=True, slots=True)
class HistoryLimit:
    """How long one run's history (its events and steps) may grow.

    Past ``soft`` the run records one ``run.history_warning`` event and Python warns
    (``HistoryWarning``): time to ``continue_as_new``. Past ``hard`` the store records nothing
    new for the run — no new step, no new effect — and the run blocks; outcomes of effects
    already in flight and the run's ending are always recorded. ``None`` turns a limit off.

    >>> HistoryLimit(soft=2_000, hard=10_000)
    HistoryLimit(soft=2000, hard=10000)
    """

    soft: int | None = 10_000
    hard: int | None = 50_000

    def __post_init__(self) -> None:
        for name in ("soft", "hard"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise UsageError(
                    f"HistoryLimit.{name} is a count of events and steps: an int"
                    f" of 1 or more, or None for no limit (got {value!r})"
                )
        if self.soft is not None and self.hard is not None and self.soft > self.hard:
            raise UsageError(
                f"HistoryLimit.soft ({self.soft}) must not exceed hard ({self.hard}): the warning comes first"
            )


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One recorded step of a run: its id, kind, input hash and result (or error)."""

    run_id: str
    step_id: str
    kind: StepKind
    name: str
    input_hash: str
    result: Recorded
    seq: int = 0
    status: StepStatus = StepStatus.COMPLETED
    error: dict[str, Any] | None = None
    next_step_id: str | None = None
    attempt: int = 1
    model_id: str | None = None
    prompt_hash: str | None = None
    observed_at: int | None = None
    operation_id: str | None = None
    fence: int = 0
    recorded_at: int = 0
    tokens: int | None = None  # model steps: the usage the call reported
    cost: float | None = None


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """A failed attempt of a read or model step that will be tried again: recorded before the
    back-off, so that a restart neither forgets the attempts made nor the wait still due."""

    run_id: str
    step_id: str
    attempt: int  # counts every call of the step's function, re-reads included
    kind: StepKind
    name: str
    input_hash: str
    error: dict[str, Any]  # the failure's type and message
    retry_at: int  # epoch ms (store clock): the next attempt starts no earlier
    fence: int = 0
    recorded_at: int = 0


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One effect operation: its key, payload digest, state in the dispatch protocol and outcome."""

    run_id: str
    operation_id: str
    step_id: str
    effect: str
    state: EffectState
    payload_ref: str
    effect_key: str
    dispatch_count: int = 0
    first_dispatched_at: int | None = None
    receipt: Recorded = None
    error: Recorded = None
    fence: int = 0
    prepared_at: int = 0
    updated_at: int = 0
    approval_required: bool = False  # dispatched only under a valid approval (see ``approve``)
    target_digest: str | None = None  # digest of the target's state as last read at the gate
    approval_id: str | None = None  # the approval that authorized the latest dispatch
    key_attempt: int = 1  # the attempt its effect_key was minted for (a re-sent rejection: 2, …)
    # how long the effect's owner remembers a key, as the effect declared it (None: none declared)
    dedup_retention_ms: int | None = None
    family_key: str | None = None  # what it is within its run's family (see ``_rules.family``)


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One entry of a run's append-only history: what happened, when, by which worker under which
    fence."""

    event_id: int
    run_id: str
    at: int
    kind: str
    step_id: str | None
    operation_id: str | None
    fence: int | None
    worker: str | None
    detail: Recorded


class ResolutionAction(StrEnum):
    """What a person decided about a blocked run's operation."""

    APPLIED = "applied"  # the operation happened: its receipt is the evidence
    NOT_APPLIED = "not_applied"  # it did not: dispatch it again, under the same key
    ABANDON = "abandon"  # give the run up: it ends cancelled


@dataclass(frozen=True, slots=True)
class Resolution:
    """A person's decision about a blocked run, recorded as evidence in its history."""

    action: ResolutionAction
    by: str
    operation_id: str | None = None
    receipt: JSON = None  # ``applied``: what the owner holds (a transaction step: its value)
    evidence: str | None = None  # a link, a ticket, a sentence: why this is known
    # ``not_applied``: whether the effect's owner was asked first, what it said, and whether
    # the person overrode its doubt (``force``)
    owner_check: dict[str, Any] | None = None
    step_id: str | None = None  # a transaction step that may have committed, in place of an op

    def detail(self) -> dict[str, Any]:
        detail = {
            "action": self.action.value,
            "operation_id": self.operation_id,
            "by": self.by,
            "receipt": self.receipt,
            "evidence": self.evidence,
        }
        if self.owner_check is not None:
            detail["owner_check"] = self.owner_check
        if self.step_id is not None:
            detail["step_id"] = self.step_id
        return detail


@dataclass(frozen=True, slots=True)
class ApprovalRecord:
    """A person's approval of one prepared effect, bound to what they approved: the payload's
    digest and the digest of the target's state (None for an effect that reads no target
    state). It authorizes a dispatch while both still match, it has not expired (on the
    store's clock) and nobody revoked it (``revoke_approval``)."""

    approval_id: str
    run_id: str
    operation_id: str
    step_id: str
    payload_digest: str
    target_digest: str | None
    approved_by: str
    approved_at: int
    expires_at: int | None = None  # epoch ms; None: does not expire
    evidence: str | None = None
    revoked_at: int | None = None  # epoch ms (store clock); None: not revoked
    revoked_by: str | None = None
    revoke_reason: str | None = None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None

    def authorizes(self, payload_digest: str, target_digest: str | None, now: int) -> bool:
        """Whether this approval still authorizes a dispatch of that payload on that target."""
        return (
            not self.revoked
            and self.payload_digest == payload_digest
            and self.target_digest == target_digest
            and (self.expires_at is None or now < self.expires_at)
        )


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """A person's approval as asked for (``approve``); the store binds it to the operation."""

    approval_id: str  # minted by the caller, kept only if a new approval is recorded
    by: str
    evidence: str | None = None
    ttl_ms: int | None = None  # expires this long after it is given, on the store's clock
    expires_at: int | None = None  # or at this instant (epoch ms); neither: does not expire
    payload_digest: str | None = None  # only if the operation still carries this payload


@dataclass(frozen=True, slots=True)
class ApprovalRevocation:
    """A person withdrawing the approvals of one effect while its outcome is open
    (``revoke_approval``); the store stamps the time on its own clock."""

    by: str
    reason: str


@dataclass(frozen=True, slots=True)
class ApprovalGate:
    """The approval gate's answer (``Store.await_approval``): the approval that authorizes the
    dispatch, or None — and then the run now waits, for what ``waiting_for`` says."""

    approval: ApprovalRecord | None
    waiting_for: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """A message sent to a run from outside: a JSON payload under a name its workflow waits for
    (``run.wait_for(name)``). Kept from the moment it is sent, whether the run waits yet or not.
    A mailbox message (``safepoint.send``; ``for_wait`` None) queues: a wait takes the oldest of
    its name not yet taken. An answer (``safepoint.answer``) is addressed to one wait
    (``for_wait``, its step id), which takes it before anything queued, and only it. Either is
    recorded as the wait step's result (``taken_by``, the wait step's id)."""

    seq: int  # the order messages were sent in (store-wide)
    run_id: str
    name: str
    payload: Recorded
    sent_at: int  # epoch ms, the store's clock
    message_id: str | None = None  # the sender's id for it: a re-delivery is the same message
    sent_by: str | None = None
    taken_by: str | None = None  # the wait step that received it; None: not taken yet
    taken_at: int | None = None
    for_wait: str | None = None  # an answer: the wait step it is addressed to; None: queued by name


@dataclass(frozen=True, slots=True)
class WaitGate:
    """A wait step's answer (``Store.await_message``, ``Store.await_timer``): the wait step as
    the store recorded it — the message received, the timeout reached (failed), or the sleep's
    due instant — and, when the run now waits (released, status ``waiting``), what for."""

    step: StepRecord | None = None
    waiting_for: dict[str, Any] | None = None
    message: MessageRecord | None = None  # the message the step received, marked taken


@dataclass(frozen=True, slots=True)
class Resend:
    """An operation its owner rejected, sent again by a retry as its next attempt: under
    ``effect_key``, the key derived for attempt ``key_attempt`` from the key minted for it."""

    operation_id: str
    step_id: str
    key_attempt: int
    effect_key: str


@dataclass(frozen=True, slots=True)
class RunRetry:
    """A person's retry of a failed run (``safepoint.retry``), as the store carries it out:
    the failed step chosen (``step_id``; None when the workflow itself raised), the steps
    whose failed record and failed attempts move into the history (``moved``), and the
    rejected operations sent again (``resend``)."""

    by: str
    reason: str | None = None
    step_id: str | None = None
    moved: tuple[str, ...] = ()
    resend: tuple[Resend, ...] = ()


@dataclass(frozen=True, slots=True)
class Ledger:
    """Everything recorded for one run, loaded in one batch when a worker takes it over."""

    run: RunRecord
    steps: dict[str, StepRecord] = field(default_factory=dict)
    operations: dict[str, OperationRecord] = field(default_factory=dict)
    # failed attempts by step id, oldest first (kept after the step succeeds: its history)
    attempts: dict[str, list[AttemptRecord]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LedgerIdentity:
    """Who a ledger is: ``ledger_id``, minted once when its schema was created, and
    ``keyed_since`` (epoch ms, the store's clock): when it was minted, the moment from which
    every effect key minted in the ledger includes that id — its whole life, since the first
    migration creates it."""

    ledger_id: str
    keyed_since: int


@dataclass(frozen=True, slots=True)
class Claim:
    """Proof that this worker owns a run: the fence every later write must name."""

    run_id: str
    owner: str
    fence: int
    state_revision: int
    lease_expires_at: int
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a read or model step is attempted, and how long to wait between attempts.

    ``attempts`` counts every call (3: the first and two retries). The wait after the n-th
    failed attempt is ``backoff * multiplier ** (n - 1)`` seconds, at most ``max_backoff``,
    shortened by up to ``jitter`` (a fraction, 0 to 1) — an amount derived from the run and
    step ids, so it is the same on every worker. Only exceptions of the ``retry_on`` types are
    tried again; any other failure is recorded at once. Every failed attempt is recorded before
    the wait, so a restart continues the count (it is never reset) and waits out what remains.

    >>> run.read("quote", fetch_quote, "EURUSD", retry=Retry(attempts=5, backoff=1.0))
    """

    attempts: int = 3
    backoff: float = 0.5
    multiplier: float = 2.0
    max_backoff: float = 30.0
    jitter: float = 0.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int) or self.attempts < 1:
            raise UsageError(
                f"Retry(attempts={self.attempts!r}): attempts counts every call,"
                " the first included: an int of 1 or more"
            )
        for name in ("backoff", "multiplier", "max_backoff", "jitter"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise UsageError(
                    f"Retry({name}={value!r}): a finite number of 0 or more"
                    " (seconds for backoff and max_backoff)"
                )
        if self.multiplier < 1:
            raise UsageError(f"Retry(multiplier={self.multiplier!r}): 1 or more (1 waits the same each time)")
        if self.jitter > 1:
            raise UsageError(f"Retry(jitter={self.jitter!r}): a fraction from 0 to 1")
        retry_on = self.retry_on
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
            object.__setattr__(self, "retry_on", retry_on)
        if (
            not isinstance(retry_on, tuple)
            or not retry_on
            or not all(isinstance(t, type) and issubclass(t, Exception) for t in retry_on)
        ):
            raise UsageError(
                f"Retry(retry_on={self.retry_on!r}): exception classes derived"
                " from Exception, e.g. (TimeoutError, ConnectionError)"
            )

    def as_json(self) -> dict[str, Any]:
        """The numbers of the policy, as recorded with a run (``retry_on`` is code: not kept)."""
        return {
            "attempts": self.attempts,
            "backoff": self.backoff,
            "multiplier": self.multiplier,
            "max_backoff": self.max_backoff,
            "jitter": self.jitter,
        }

    @classmethod
    def from_json(
        cls, value: dict[str, Any], retry_on: tuple[type[BaseException], ...] = (Exception,)
    ) -> Retry:
        return cls(
            attempts=int(value["attempts"]),
            backoff=float(value["backoff"]),
            multiplier=float(value["multiplier"]),
            max_backoff=float(value["max_backoff"]),
            jitter=float(value.get("jitter", 0.0)),
            retry_on=retry_on,
        )


@dataclass(frozen=True, slots=True)
class Budget:
    """What a run may spend on model calls: ``tokens`` (as the calls report them), ``cost`` (in
    whatever unit your ``usage=`` function reports) and ``model_calls`` (the model steps — turns —
    it may make: the agent SDKs' "max turns", made durable). ``None`` is no limit.

    Spending is recorded with each model step, so a restart never resets it. Before each new
    model call the run checks what it has spent; once a limit is reached the run stops
    (``BudgetExhausted``; status ``stopped``) — a call already running is never cut short, so
    one call may overshoot. Raise the limit (``extend_limits``) and the run carries on.

    >>> @workflow("triage", budget=Budget(tokens=200_000, cost=2.50, model_calls=40))
    """

    tokens: int | None = None
    cost: float | None = None
    model_calls: int | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "model_calls"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise UsageError(f"Budget({name}={value!r}): an int of 0 or more, or None")
        if self.cost is not None and (
            isinstance(self.cost, bool)
            or not isinstance(self.cost, (int, float))
            or not math.isfinite(self.cost)
            or self.cost < 0
        ):
            raise UsageError(f"Budget(cost={self.cost!r}): a finite number of 0 or more, or None")


@dataclass(frozen=True, slots=True)
class RunLimits:
    """A run's limits as the ledger records them (``None``: no limit): its token, cost and
    model-call budgets, its deadline (epoch ms on the store's clock), the attempts a person
    raised every retried step to (``step_attempts``), and its resume budget."""

    tokens: int | None = None
    cost: float | None = None
    model_calls: int | None = None
    deadline: int | None = None
    step_attempts: int | None = None
    resume_budget: int | None = None

    def as_json(self) -> dict[str, Any]:
        """The limits by the names ``extend_limits`` takes, as recorded in its event."""
        return {
            "tokens": self.tokens,
            "cost": self.cost,
            "model_calls": self.model_calls,
            "deadline": self.deadline,
            "step_attempts": self.step_attempts,
            "resume_budget": self.resume_budget,
        }


@dataclass(frozen=True, slots=True)
class LimitChange:
    """A person's change of a run's limits (``extend_limits``), as a store applies it: the
    limits the run had (``old``) and has from now on (``new``), who changed them and why. What
    the run spent is never part of it: a change never resets a spent amount."""

    old: RunLimits
    new: RunLimits
    by: str
    reason: str | None = None

    def detail(self) -> dict[str, Any]:
        """The ``run.limits_extended`` event's detail."""
        return {"by": self.by, "reason": self.reason, "old": self.old.as_json(), "new": self.new.as_json()}


# What a statement of a transaction step is bound with: ``(value, …)`` or ``{"name": value}``.
Params: TypeAlias = Sequence[Any] | Mapping[str, Any] | None


class Transaction(Protocol):
    """What a transaction step's function gets (``Run.transaction``): the ledger's own database
    connection, inside the transaction that also fences the run and records the step.

    ``execute`` runs one statement with the driver's placeholders (SQLite: ``?`` or
    ``:name``; PostgreSQL: ``%s`` or ``%(name)s``; ``dialect`` says which) and returns its rows
    to read (``fetchone``, ``fetchall``, ``rowcount`` …; by column name), not the driver's
    cursor. The transaction is the step's: ``commit``, ``rollback`` and ``close`` — or a
    statement that begins or ends a transaction — raise ``UsageError`` and roll it back; one
    ended all the same (through ``driver_connection()``) blocks the run: it may have committed."""

    dialect: Literal["sqlite", "postgres"]

    def execute(self, query: str, params: Params = None) -> Any:
        """Run one statement in the step's transaction; its rows to read."""
        ...

    def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        ...

    def driver_connection(self) -> Any:
        """The driver's own connection, in the step's transaction, for a library that needs one."""
        ...


class AsyncTransaction(Protocol):
    """``Transaction`` on an async store (``AsyncRun.transaction`` on ``AsyncPostgresStore``):
    ``await tx.execute(…)`` returns rows to read with ``await rows.fetchone()``."""

    dialect: Literal["sqlite", "postgres"]

    async def execute(self, query: str, params: Params = None) -> Any:
        """Run one statement in the step's transaction; its rows to read, awaited."""
        ...

    async def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        ...

    async def driver_connection(self) -> Any:
        """psycopg's async connection, in the step's transaction (see ``Transaction``)."""
        ...
