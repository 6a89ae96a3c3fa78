"""A run's timeline as the console draws it: each step with its start, end and duration, and the
effect operation it dispatched; the run's chain (continue-as-new) and the forks made from it.

A step records when it was recorded (``recorded_at``), not when it began. Its start is derived,
from the ledger alone: an effect step began when its operation was prepared (``prepared_at``);
any other step when the step recorded before it ended — or, when the run was claimed again
after that (a resume, a takeover, a retry), at that claim, since nothing of the run ran in
between. The first step begins at the run's first claim (``run.started`` / ``run.claimed``).
``start_from`` says which of these a start is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import SafepointError
from ..storage.base import Store
from ..types import EventRecord, Ledger, OperationRecord, RunRecord, StepKind, StepRecord, StepStatus

__all__ = ["TimelineEntry", "chain_of", "forks_made", "timeline"]

_CLAIMS = frozenset({"run.started", "run.claimed"})
_CHAIN_LIMIT = 100  # links shown either way; a longer chain says where it goes on


@dataclass(frozen=True)
class TimelineEntry:
    """One step on the timeline: the step, when it began and ended (epoch ms, the store's clock)
    and how its start was found (``prepared``, ``previous step``, ``claim`` or ``run created``);
    an effect step's operation."""

    step: StepRecord
    start: int
    end: int
    start_from: str
    operation: OperationRecord | None
    in_flight: bool = False  # an effect whose step is not recorded: its outcome is unsettled

    @property
    def duration(self) -> int:
        return max(0, self.end - self.start)

    def json(self) -> dict[str, Any]:
        step = self.step
        op = self.operation
        return {
            "seq": step.seq,
            "step_id": step.step_id,
            "kind": step.kind.value,
            "name": step.name,
            "status": step.status.value,
            "attempt": step.attempt,
            "start": self.start,
            "end": self.end,
            "duration_ms": self.duration,
            "start_from": self.start_from,
            "in_flight": self.in_flight,
            "operation": None
            if op is None
            else {
                "operation_id": op.operation_id,
                "effect": op.effect,
                "state": op.state.value,
                "dispatch_count": op.dispatch_count,
                "prepared_at": op.prepared_at,
                "first_dispatched_at": op.first_dispatched_at,
                "effect_key": op.effect_key,
                "approval_id": op.approval_id,
            },
        }


def timeline(ledger: Ledger, events: list[EventRecord]) -> list[TimelineEntry]:
    """The run's steps in the order recorded, each with its derived start (module docstring)."""
    claims = sorted(event.at for event in events if event.kind in _CLAIMS)
    steps = sorted(ledger.steps.values(), key=lambda step: step.seq)
    entries: list[TimelineEntry] = []
    previous: int | None = None
    for step in steps:
        op = ledger.operations.get(step.operation_id) if step.operation_id else None
        end = step.recorded_at
        claimed = [at for at in claims if at <= end and (previous is None or at >= previous)]
        if op is not None and op.prepared_at and op.prepared_at <= end:
            start, source = op.prepared_at, "prepared"
        elif claimed:
            start, source = claimed[-1], "claim"
        elif previous is not None:
            start, source = previous, "previous step"
        else:
            start, source = ledger.run.created_at, "run created"
        entries.append(TimelineEntry(step, min(start, end), end, source, op))
        previous = end
    recorded = {step.operation_id for step in steps if step.operation_id}
    for op in sorted(ledger.operations.values(), key=lambda op: op.prepared_at):
        if op.operation_id in recorded:
            continue
        # Its step is recorded once the outcome is settled: until then the operation stands
        # for it, from its preparation to its last change.
        stand_in = StepRecord(
            run_id=op.run_id,
            step_id=op.step_id,
            kind=StepKind.EFFECT,
            name=op.effect,
            input_hash="",
            result=None,
            seq=(steps[-1].seq + 1) if steps else 1,
            status=StepStatus.FAILED if op.state.value in ("unknown", "rejected") else StepStatus.COMPLETED,
            operation_id=op.operation_id,
            recorded_at=op.updated_at,
        )
        entries.append(
            TimelineEntry(stand_in, op.prepared_at, max(op.prepared_at, op.updated_at), "prepared", op, True)
        )
    return entries


def chain_of(store: Store, run: RunRecord) -> list[RunRecord]:
    """The runs of ``run``'s continue-as-new chain, first to last (``run`` among them): followed
    through each run's parent and successor, at most ``_CHAIN_LIMIT`` either way."""
    before: list[RunRecord] = []
    at = run
    while at.parent_run_id and len(before) < _CHAIN_LIMIT:
        try:
            at = store.get_run(at.parent_run_id)
        except SafepointError:  # pruned, or unreadable: the chain is shown from here
            break
        before.append(at)
    after: list[RunRecord] = []
    at = run
    while at.successor_run_id and len(after) < _CHAIN_LIMIT:
        try:
            at = store.get_run(at.successor_run_id)
        except SafepointError:
            break
        after.append(at)
    return [*reversed(before), run, *after]


def forks_made(events: list[EventRecord]) -> list[dict[str, Any]]:
    """The forks made from a run (its ``run.fork_made`` events): which, from which step, who,
    why, and when."""
    made = []
    for event in events:
        if event.kind == "run.fork_made" and isinstance(event.detail, dict):
            made.append({**event.detail, "at": event.at})
    return made
