"""The watch a replay installs on a run's core (``RunCore.replaying``; see ``replay``): each
step the record answers counted off in its lane, the first divergence kept with what a resume
would do about it, the frontier where the code asks for something new.

Kept apart from ``replay`` (which drives the engine) so that the core can name it without
importing the engine above it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol

from .._rules.effects import orphaned
from .._rules.kinds import KINDS
from .._rules.replay import Asked, Divergence, Order, Resume, lane, recorded_asked
from ..errors import ReplayMismatch, RunBlocked, StaleCheckpoint, UsageError
from ..types import OperationRecord, StepRecord


class Watched(Protocol):
    """What the watch reads and halts of the run's core."""

    halted: BaseException | None
    operations: dict[str, OperationRecord]
    unreached: set[str]
    open_branches: set[str]


class ReplayStop(BaseException):
    """The replay stops here (what it found is on the ``Replaying`` watch). A BaseException,
    so that agent code's ``except Exception`` cannot swallow it."""


class Replaying:
    """The watch a replay installs on the run's core (``RunCore.replaying``)."""

    def __init__(
        self,
        steps: Mapping[str, StepRecord],
        operations: Mapping[str, OperationRecord],
        *,
        replans: bool,
        live_from: str | None = None,
    ) -> None:
        self.recorded = dict(steps)
        self.operations = dict(operations)
        self.replans = replans
        self.order = Order(steps.values())
        self.lock = threading.Lock()
        self.answered_count = 0
        self.divergence: Divergence | None = None
        self.next: Asked | None = None  # the first new step the code asked for
        self.blocked: tuple[str, str] | None = None  # (phase, reason) of a block a resume would record
        self.stopped_at: str | None = None  # the store request the replay cannot answer
        self.live_from = live_from
        self.live = False  # past the cut of a live replay: the engine runs for real
        self.stubs: frozenset[str] = frozenset()  # a live replay: the effects it has stubs for
        self.refused: UsageError | None = None  # … and the first effect it reached without one
        self.family_read = False  # another run of the family was read, as it stands now
        self.family_readable = False  # replayed from a store: the family can be asked

    # -- what the engine tells the watch -------------------------------------------------------

    def answered(self, core: Watched, step: StepRecord) -> None:
        """The record answered ``step``: counted off, and held to the recorded order."""
        if self.live:
            return
        with self.lock:
            if step.step_id not in self.recorded or self.recorded[step.step_id].seq != step.seq:
                return  # recorded since the replay began (a live replay's own)
            # A step of what is done (an effect, a transaction step) may be recorded after steps
            # the code asks later — taken from the run's family once settled there, re-recorded
            # after a re-plan — so its place in the ledger says nothing of the code's order.
            late = KINDS[step.kind].kept_on_replan
            skipped = None if late else self.order.first_left(step.step_id, below=step.seq)
            self.order.ask(step.seq)
            self.answered_count += 1
        if skipped is not None:
            asked, before = self._asked(step), self._asked(self.recorded[skipped])
            self.diverge(
                core,
                Divergence(
                    "order",
                    step.step_id,
                    f"the code asks for {asked.described()} before {before.described()}, which"
                    " the run recorded first and the code has not asked: a step was left out, or"
                    " the order changed (a resume answers steps by their ids and carries on)",
                    Resume.CARRY_ON,
                    asked=asked,
                    recorded=before,
                ),
            )

    def diverged(
        self, core: Watched, stale: StaleCheckpoint, asked: Asked, *, replans: bool | None = None
    ) -> None:
        """The record holds another step at ``asked.step_id``: where a resume would block (or
        re-plan), the replay stops."""
        replans = self.replans if replans is None else replans
        mismatch = isinstance(stale, ReplayMismatch)
        phase = "replay_mismatch" if mismatch else "stale_checkpoint"
        recorded = self.recorded.get(asked.step_id)
        self.diverge(
            core,
            Divergence(
                "mismatch" if mismatch else "changed",
                asked.step_id,
                stale.message,
                Resume.REPLAN if replans else Resume.BLOCK,
                None if replans else phase,
                asked,
                self._asked(recorded) if recorded is not None else None,
            ),
        )

    def new(self, core: Watched, asked: Asked) -> None:
        """The code asks for a step the record does not answer: the frontier, or a step added."""
        if self.live:
            if KINDS[asked.kind].has_operation and asked.name not in self.stubs:
                refusal = UsageError(
                    f"the live replay reached effect {asked.name!r}, which effects= gives no stub for"
                    f" (step {asked.step_id!r}): nothing was sent; give effects={{"
                    f"{asked.name!r}: a function(payload, key) returning its receipt}}"
                )
                # Kept, and raised by the replay: agent code (an SDK's tool runner) may catch
                # it, and the run stops at its next step all the same.
                self.refused = self.refused or refusal
                core.halted = refusal
                raise refusal
            return
        if self.live_from is not None and asked.step_id == self.live_from:
            self.live = True  # the cut: from here the engine runs for real
            return
        with self.lock:
            expected = self.order.first_left(asked.step_id)
        orphan = self._orphan(core, asked)
        if expected is not None:
            before = self._asked(self.recorded[expected])
            resume, phase, why = Resume.CARRY_ON, None, "a resume would carry it out anew"
            if orphan is not None:
                resume, phase = Resume.BLOCK, "replay_mismatch"
                why = (
                    f"a resume would block: the ledger holds operation {orphan.operation_id!r}"
                    f" ({orphan.state.value}), which this code no longer reaches"
                )
            self.diverge(
                core,
                Divergence(
                    "added",
                    asked.step_id,
                    f"the code asks for {asked.described()}, which the run did not record, while"
                    f" the record's next step is {before.described()}: a step was added or"
                    f" renamed ({why})",
                    resume,
                    phase,
                    asked,
                    before,
                ),
            )
        if orphan is not None:  # every recorded step answered, but not this operation
            self.diverge(
                core,
                Divergence(
                    "added",
                    asked.step_id,
                    f"the code asks for {asked.described()}, which the run did not record, while"
                    f" the ledger holds operation {orphan.operation_id!r} (step {orphan.step_id!r},"
                    f" effect {orphan.effect!r}, {orphan.state.value}), which this code no longer"
                    " reaches: a step was renamed or moved (a resume would block)",
                    Resume.BLOCK,
                    "replay_mismatch",
                    asked,
                    Asked(
                        orphan.step_id,
                        asked.kind,
                        orphan.effect,
                        None,
                        orphan.operation_id,
                        orphan.payload_ref,
                    ),
                ),
            )
        if KINDS[asked.kind].batched:
            return  # a step a resume may compute again (pure): computing it is no I/O
        with self.lock:
            if self.next is None:
                self.next = asked
        raise ReplayStop  # this lane's frontier: its siblings go on to theirs

    def block(self, core: Watched, error: RunBlocked, phase: str) -> None:
        """A resume would block the run here (and record ``phase``)."""
        with self.lock:
            if self.blocked is None:
                self.blocked = (phase, error.message)
        stop = ReplayStop()
        core.halted = stop
        raise stop

    def unanswerable(self, request: str) -> ReplayStop:
        """The engine asked the store for what a replay does not answer (a write, above all)."""
        with self.lock:
            if self.stopped_at is None:
                self.stopped_at = request
        return ReplayStop()

    def diverge(self, core: Watched, divergence: Divergence) -> None:
        with self.lock:
            if self.divergence is None:
                self.divergence = divergence
        stop = ReplayStop()
        core.halted = stop  # every fan-out branch stops at its next step
        raise stop

    # -- helpers -----------------------------------------------------------------------------

    def _asked(self, step: StepRecord) -> Asked:
        return recorded_asked(step, self.operations)

    def _orphan(self, core: Watched, asked: Asked) -> OperationRecord | None:
        """The operation a resume would refuse to dispatch ``asked`` beside (as
        ``dispatch.refuse_beside_orphans`` does, by ``_rules.effects.orphaned``): one the code has
        not reached that may have happened (or, under ``refuse``, did); None for a step that
        prepares no new operation."""
        if not KINDS[asked.kind].has_operation or asked.operation_id in core.operations:
            return None
        found = orphaned(
            [core.operations[op_id] for op_id in sorted(core.unreached) if op_id in core.operations],
            core.open_branches,
            lane(asked.step_id),
            replans=self.replans,
        )
        return found[0] if found else None
