"""Public enums and frozen records: the ledger's vocabulary as Python values."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

JSON = Any


class Durability(StrEnum):
    """What a committed step survives. Stated, never implied."""

    PROCESS_CRASH = "process_crash"  # default: survives the process dying (SQLite WAL, NORMAL)
    POWER_LOSS = "power_loss"        # also survives the machine losing power (fsync every commit)


class RunStatus(StrEnum):
    PENDING = "pending"        # created, not yet claimed by a worker
    RUNNING = "running"        # owned (or last owned) by a worker that is making progress
    COMPLETED = "completed"    # the workflow returned; the result is recorded
    FAILED = "failed"          # the workflow raised; the error is recorded
    BLOCKED = "blocked"        # stopped visibly for a person; see the recovery record
    CANCELLED = "cancelled"
    CONTINUED = "continued"    # continued as new: its successor (successor_run_id) carries on

    @property
    def terminal(self) -> bool:
        """This run will never run again (a continued run's chain goes on in its successor)."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED,
                        RunStatus.CONTINUED)


class StepKind(StrEnum):
    PURE = "pure"              # recomputable; recorded as an optimisation
    READ = "read"              # an observation; replayed until max_age says it expired
    MODEL = "model"            # a model response; replayed, never re-generated
    DECISION = "decision"      # the planner's choice of the next step; replayed
    EFFECT = "effect"          # a change in another system; replayed or reconciled
    VALUE = "value"            # a recorded now(), random() or uuid()


class StepStatus(StrEnum):
    COMPLETED = "completed"    # the step returned; its result is recorded
    FAILED = "failed"          # the step raised; its error is recorded and raised on replay


class EffectState(StrEnum):
    PREPARED = "prepared"          # payload, operation id and effect key are durable
    DISPATCHING = "dispatching"    # "dispatch may have happened"
    APPLIED = "applied"            # the owner's receipt is recorded
    REJECTED = "rejected"          # the owner refused; it did not happen
    UNKNOWN = "unknown"            # the call failed without proof either way
    ACCEPTED = "accepted"          # verified (or no verifier); the run moves on


@dataclass(frozen=True, slots=True)
class RunRecord:
    run_id: str
    workflow: str
    workflow_version: str
    status: RunStatus
    input_hash: str
    inputs: JSON
    state_revision: int
    owner: str | None
    lease_expires_at: int | None
    fence: int
    resume_count: int
    event_count: int
    result: JSON
    error: dict[str, Any] | None
    recovery_record: dict[str, Any] | None
    created_at: int
    updated_at: int
    resume_budget: int | None = None  # takeovers allowed before the run fails loudly
    cancel_requested_at: int | None = None  # asked to stop: settle what is in flight, no more
    step_count: int = 0                     # steps recorded; with event_count, the history
    history_soft_limit: int | None = None   # history that records one run.history_warning
    history_hard_limit: int | None = None   # history past which nothing new is recorded
    history_warned_at: int | None = None    # when the soft limit was crossed
    chain_id: str | None = None             # the first run of its continue-as-new chain
    chain_index: int = 0                    # its place in the chain (0: the first run)
    parent_run_id: str | None = None        # the run it continues
    successor_run_id: str | None = None     # the run that continues it (status continued)

    @property
    def history_size(self) -> int:
        """What the history limits count: the run's events and its recorded steps."""
        return self.event_count + self.step_count


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
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise ValueError(f"HistoryLimit.{name} is a count of events and steps: an int"
                                 f" of 1 or more, or None for no limit (got {value!r})")
        if self.soft is not None and self.hard is not None and self.soft > self.hard:
            raise ValueError(f"HistoryLimit.soft ({self.soft}) must not exceed hard"
                             f" ({self.hard}): the warning comes first")


@dataclass(frozen=True, slots=True)
class StepRecord:
    run_id: str
    step_id: str
    kind: StepKind
    name: str
    input_hash: str
    result: JSON
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


@dataclass(frozen=True, slots=True)
class OperationRecord:
    run_id: str
    operation_id: str
    step_id: str
    effect: str
    state: EffectState
    payload_ref: str
    effect_key: str
    dispatch_count: int = 0
    first_dispatched_at: int | None = None
    receipt: JSON = None
    error: JSON = None
    fence: int = 0
    prepared_at: int = 0
    updated_at: int = 0


@dataclass(frozen=True, slots=True)
class EventRecord:
    event_id: int
    run_id: str
    at: int
    kind: str
    step_id: str | None
    operation_id: str | None
    fence: int | None
    worker: str | None
    detail: JSON


class ResolutionAction(StrEnum):
    APPLIED = "applied"          # the operation happened: its receipt is the evidence
    NOT_APPLIED = "not_applied"  # it did not: dispatch it again, under the same key
    ABANDON = "abandon"          # give the run up: it ends cancelled


@dataclass(frozen=True, slots=True)
class Resolution:
    """A person's decision about a blocked run, recorded as evidence in its history."""

    action: ResolutionAction
    by: str
    operation_id: str | None = None
    receipt: JSON = None          # ``applied``: what the owner holds
    evidence: str | None = None   # a link, a ticket, a sentence: why this is known

    def detail(self) -> dict[str, Any]:
        return {"action": self.action.value, "operation_id": self.operation_id,
                "by": self.by, "receipt": self.receipt, "evidence": self.evidence}


@dataclass(frozen=True, slots=True)
class Ledger:
    """Everything recorded for one run, loaded in one batch when a worker takes it over."""

    run: RunRecord
    steps: dict[str, StepRecord] = field(default_factory=dict)
    operations: dict[str, OperationRecord] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Claim:
    """Proof that this worker owns a run: the fence every later write must name."""

    run_id: str
    owner: str
    fence: int
    state_revision: int
    lease_expires_at: int
    lease_ms: int
