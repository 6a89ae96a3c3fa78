"""Replaying a recorded run against new code: what counts as the code asking what the run
recorded, what counts as a divergence, and what a real resume would do about it.

A replay runs the workflow's current code with every step answered from the record and
nothing carried out (``_engine.replay``). The engine already answers a step by its id; a
replay also watches the order in which the code asks, because a change that a resume would
carry on through without a word — a step added before recorded ones, steps swapped, a step
left out — is a change a developer wants to see before the deploy. So a replay is stricter
than a resume, and says for each difference what a resume would do: carry on, re-plan, or
block (and with which phase of the recovery record).

The order is watched per *lane*: the steps of one fan-out branch (their ids share the prefix
``group.branch/``) run beside their siblings in any interleaving, so only steps of the same
lane, or of a lane that contains the other, are held to the recorded order.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..types import EffectState, OperationRecord, RunStatus, StepKind, StepRecord
from .canonical import canonical


class Resume(StrEnum):
    """What resuming the run under this code would do."""

    CARRY_ON = "carry on"
    REPLAN = "replan"
    BLOCK = "block"
    FAIL = "fail"  # the workflow raises: the run would end failed
    STOP = "stop"  # the run stands stopped at a limit: raised, it carries on


class Reached(StrEnum):
    """Where a replay ended."""

    END = "end"  # the workflow ended as the run did (or would, had it gone on)
    NOW = "now"  # every recorded step answered: the code asks for what the run has not done yet
    DIVERGED = "diverged"  # the code asked for something the record does not answer


@dataclass(frozen=True, slots=True)
class Asked:
    """A step as the code asks for it, or as the run recorded it."""

    step_id: str
    kind: StepKind
    name: str
    input_hash: str | None = None
    operation_id: str | None = None
    payload_digest: str | None = None
    seq: int | None = None  # recorded steps: their place in the ledger

    def described(self) -> str:
        """``read 'lookup' (step 'lookup')``."""
        return f"{self.kind.value} {self.name!r} (step {self.step_id!r})"


def replayable(op: OperationRecord | None) -> bool:
    """Whether the record holds an operation's outcome (accepted, or rejected): a resume
    replays its receipt, or its rejection, without asking its owner — even with no step
    recorded for it (a rejection records none)."""
    return op is not None and op.state in (EffectState.ACCEPTED, EffectState.REJECTED)


def recorded_asked(step: StepRecord, operations: Mapping[str, OperationRecord]) -> Asked:
    """The recorded step as the ``Asked`` the code would have to ask to be answered by it."""
    op = operations.get(step.operation_id) if step.operation_id else None
    return Asked(
        step.step_id,
        step.kind,
        step.name,
        step.input_hash,
        step.operation_id,
        op.payload_ref if op is not None else None,
        step.seq,
    )


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first place where this code and the record part.

    ``kind``: ``changed`` (the step at this id was recorded with other inputs), ``mismatch``
    (recorded as another kind or name), ``added`` (a step the record does not hold, asked while
    recorded steps remain), ``order`` (a recorded step asked before one recorded earlier, which
    was not asked: swapped, or left out), ``unasked`` (recorded steps the code never asked),
    ``outcome`` (the workflow ended otherwise than the run did)."""

    kind: str
    step_id: str | None
    reason: str
    resume: Resume
    phase: str | None = None  # the recovery record's phase, where a resume would block
    asked: Asked | None = None
    recorded: Asked | None = None


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """How a recorded run replays under this code."""

    run_id: str
    recorded_as: str  # workflow@version that recorded the run
    replayed_as: str  # workflow@version of this code
    status: str  # the run's status as recorded
    reached: Reached
    replayed: int  # steps answered from the record
    recorded: int  # steps the record holds
    resume: Resume  # what resuming the run under this code would do
    why: str
    changes: tuple[str, ...] = ()  # what the compatibility check finds changed (see _rules.compat)
    divergence: Divergence | None = None
    next: Asked | None = None  # reached NOW: what the code asks for next
    result: Any = None  # reached END, or a live replay: what the workflow returned
    error: dict[str, Any] | None = None  # … or what it raised
    live: tuple[StepRecord, ...] = ()  # a live replay: the steps recorded after the cut
    # Another run of the run's family was read (a fork's source, an earlier run of its chain),
    # as it stands now, as a resume reads it: where the replay parts from the record there, the
    # family may have moved on since the run recorded it, not the code.
    family_read: bool = False

    @property
    def ok(self) -> bool:
        """The code asks what the run recorded, in its order, to its end or to where it is."""
        return self.divergence is None

    @property
    def fits(self) -> bool:
        """This code may carry the run on: it replays without a divergence, and the
        compatibility check finds nothing changed (which would block or re-plan it). A run that
        stands blocked or stopped for its own reasons fits all the same: ``resume`` says so."""
        return self.divergence is None and not self.changes


def lane(step_id: str) -> str:
    """The fan-out branch a step belongs to (``fetch.eu/`` of ``fetch.eu/price``); ``""`` outside."""
    head, slash, _ = step_id.rpartition("/")
    return head + slash


def related(one: str, other: str) -> bool:
    """Whether steps of these lanes are ordered: the same lane, or one inside the other."""
    return one.startswith(other) or other.startswith(one)


class Order:
    """The recorded steps not yet asked, per lane, in recorded order: which of them a step
    asked now jumps over, or leaves behind."""

    def __init__(self, steps: Iterable[StepRecord]) -> None:
        self._seqs: dict[str, list[int]] = {}
        self._step: dict[int, str] = {}
        for step in sorted(steps, key=lambda s: s.seq):
            self._seqs.setdefault(lane(step.step_id), []).append(step.seq)
            self._step[step.seq] = step.step_id
        self._asked: set[int] = set()
        self._first = dict.fromkeys(self._seqs, 0)  # per lane: index of its first step not asked

    def _lowest(self, lane_: str) -> int | None:
        seqs, at = self._seqs[lane_], self._first[lane_]
        while at < len(seqs) and seqs[at] in self._asked:
            at += 1
        self._first[lane_] = at
        return seqs[at] if at < len(seqs) else None

    def first_left(self, step_id: str, below: int | None = None) -> str | None:
        """The earliest recorded step not asked yet, of a lane ordered with ``step_id``'s (and
        recorded before seq ``below``, if given); None if there is none."""
        own, found = lane(step_id), None
        for other in self._seqs:
            if not related(own, other):
                continue
            seq = self._lowest(other)
            if seq is not None and (below is None or seq < below) and (found is None or seq < found):
                found = seq
        return None if found is None else self._step[found]

    def ask(self, seq: int) -> None:
        self._asked.add(seq)

    def left(self) -> list[str]:
        """Every recorded step not asked, in recorded order."""
        return [self._step[seq] for seq in sorted(self._step) if seq not in self._asked]

    def position(self, seq: int) -> int:
        """How many recorded steps come before ``seq``."""
        return bisect.bisect_left(sorted(self._step), seq)


def other_ending(
    status: RunStatus,
    result: Any,
    failure: dict[str, Any] | None,
    how: str,
    value: Any,
    error: dict[str, Any] | None,
) -> tuple[str, Resume] | None:
    """Whether the workflow ended (``how``: returned ``value``, raised ``error``, continued)
    otherwise than the run did (``status``, its ``result`` or ``failure``): why, and what a
    resume would do; None when it ended as the run did, or the run had not ended."""
    failed_with = (failure or {}).get("type")
    if how == "returned" and status is RunStatus.COMPLETED and canonical(value) != canonical(result):
        return "the workflow returns another result than the run recorded", Resume.CARRY_ON
    if how == "returned" and status is RunStatus.FAILED:
        return f"the workflow returns where the run failed ({failure})", Resume.CARRY_ON
    if how == "raised" and status is RunStatus.FAILED and error and failed_with != error["type"]:
        return f"the workflow raises {error['type']} where the run failed with {failed_with}", Resume.CARRY_ON
    if how == "raised" and status is RunStatus.COMPLETED:
        return f"the workflow raises {error and error['type']} where the run completed", Resume.FAIL
    if how == "continued" and status is RunStatus.COMPLETED:
        return "the workflow continues as new where the run completed", Resume.CARRY_ON
    return None


def on_resume(changes: Iterable[str], replans: bool, divergence: Divergence | None) -> tuple[Resume, str]:
    """What resuming the run under this code would do, and why: the compatibility check comes
    first (at the claim), then the first divergence the code meets."""
    changed = list(changes)
    if changed:
        if replans:
            return Resume.REPLAN, "the workflow changed (" + "; ".join(changed) + "): policy replan"
        return Resume.BLOCK, "the workflow changed (" + "; ".join(changed) + "): incompatible_workflow"
    if divergence is None:
        return Resume.CARRY_ON, "the code asks what the run recorded"
    return divergence.resume, divergence.reason
