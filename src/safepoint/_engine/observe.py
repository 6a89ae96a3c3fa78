"""The observer seam: what the engine tells a watching observer (tracing, metrics) as it carries
runs out — and nothing at all when none is installed.

One observer per process (``install``), as OpenTelemetry instrumentations are: every verb, the
worker, both drivers and both stores reach it, since they all carry runs through the same flows.
``started`` is asked once per run execution (each time a claim carries a run: ``start``,
``resume``, a worker, a successor after continue-as-new) and answers None when no observer is
installed; the run core keeps what it answered (``RunCore.watch``), and every hook in the step
and dispatch flows is one ``is not None`` test of it. So the seam costs one attribute read per
step unwatched, and it never does I/O: an observer is handed what happened, after it happened,
with its start and end on the wall clock (``time.time_ns``), and must not raise.

What an observer is handed names things and counts them — run id, fence, step id, kind,
operation id, outcome — and holds the step's result or the effect's payload only by reference,
for an observer that the user asked to record sizes (or values, redacted) to look at; the
OpenTelemetry binding (``safepoint.otel``) records neither by default, nor the message of an
error (which may quote the caller's data: a rejection's evidence, a step's error).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import (
    Cancelled,
    ContinueAsNew,
    DecryptionFailed,
    KeyUnavailable,
    LimitReached,
    LostOwnership,
    RunBlocked,
    RunCancelled,
    RunWaiting,
    SliceEnded,
    StoreError,
    StoreUnavailable,
)
from ..types import Claim, OperationRecord, RunRecord, StepKind, StepRecord, Unfinished
from .crashpoints import SimulatedCrash


@dataclass(frozen=True, slots=True)
class StepSeen:
    """One step call as the run reached it: replayed from the ledger, or executed (one attempt
    of its function). ``status``: completed, failed (recorded failed: raised as ``StepFailed``),
    retrying (an attempt that failed and is tried again), or how the call stopped the run
    (blocked, waiting, rejected, stopped, cancelled, interrupted)."""

    kind: StepKind
    step_id: str
    name: str
    attempt: int
    replayed: bool
    status: str
    start_ns: int
    end_ns: int
    error: BaseException | None = None
    result: Any = None  # by reference only: for an observer asked to record sizes or values


def replayed(step: StepRecord, status: str = "completed", error: BaseException | None = None) -> StepSeen:
    """What an observer is told of ``step``, replayed from the ledger (now, taking no time)."""
    now = time.time_ns()
    return StepSeen(
        step.kind, step.step_id, step.name, step.attempt, True, status, now, now, error, step.result
    )


def executed(
    base: StepRecord, started: int, status: str, error: BaseException | None, result: Any = None
) -> StepSeen:
    """What an observer is told of one call of ``base``'s function, started at ``started``."""
    return StepSeen(
        base.kind,
        base.step_id,
        base.name,
        base.attempt,
        False,
        status,
        started,
        time.time_ns(),
        error,
        result,
    )


@dataclass(frozen=True, slots=True)
class EffectSeen:
    """One call of an effect's owner for an operation: ``action`` ``dispatch`` (execute: outcome
    applied, rejected, unknown or not_sent) or ``reconcile`` (outcome reconciled: the owner has
    it; not_applied; unknown)."""

    action: str
    operation: OperationRecord
    step_id: str
    outcome: str
    start_ns: int
    end_ns: int
    error: BaseException | None = None
    payload: Any = None  # by reference only, as ``StepSeen.result``
    receipt: Any = None


class Execution(Protocol):
    """What an observer follows of one run execution: its steps, its effects' calls, its end."""

    def step(self, seen: StepSeen) -> None:
        """A step was replayed or executed (see ``StepSeen``)."""

    def effect(self, seen: EffectSeen) -> None:
        """An effect's owner was called for an operation (see ``EffectSeen``)."""

    def ended(self, status: str, error: BaseException | None, end_ns: int) -> None:
        """The execution ended (``status``: as ``call_status`` or ``returned_status`` say it);
        nothing more is reported for it."""


class Observer(Protocol):
    """What ``install`` takes: asked at the start of each run execution for its ``Execution``."""

    def started(self, run: RunRecord, claim: Claim, start_ns: int) -> Execution:
        """A claim began carrying ``run`` (``claim.fence`` is this execution's fence)."""


_installed: Observer | None = None


def install(observer: Observer | None) -> Observer | None:
    """Make ``observer`` the process's (None: none); return the one it replaces."""
    global _installed
    previous, _installed = _installed, observer
    return previous


def started(run: RunRecord, claim: Claim, start_ns: int) -> Execution | None:
    """The execution the installed observer follows for this claim of ``run``; None without one."""
    observer = _installed
    return None if observer is None else observer.started(run, claim, start_ns)


def returned_status(value: Any) -> str:
    """How a run execution ended that returned ``value`` (its result, or ``Unfinished``)."""
    return "unfinished" if isinstance(value, Unfinished) else "completed"


def call_status(error: BaseException, otherwise: str) -> str:
    """What ``error`` says of how a run (or a step call) stopped; ``otherwise`` for an error of
    its own (a step function that raised, say)."""
    for kinds, word in _STOPS:
        if isinstance(error, kinds):
            return word
    return otherwise


_STOPS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], str], ...] = (
    (RunBlocked, "blocked"),
    (RunWaiting, "waiting"),
    (LimitReached, "stopped"),
    ((RunCancelled, Cancelled), "cancelled"),
    (ContinueAsNew, "continued"),
    (LostOwnership, "lost"),
    (SimulatedCrash, "crashed"),
    (SliceEnded, "unfinished"),
    # a value this process has not the key for: the run is given back as it is, not blocked
    # (a process with the keyring carries it on), as from a database gone away
    ((StoreUnavailable, KeyUnavailable, DecryptionFailed), "interrupted"),
    (StoreError, "blocked"),  # a record that cannot be read, a write refused: the run blocks
    ((KeyboardInterrupt, SystemExit, asyncio.CancelledError), "released"),
)


def seen_replayed(
    watch: Execution | None, step: StepRecord, status: str = "completed", error: BaseException | None = None
) -> None:
    """Tell the observer (there is one) that ``step`` was replayed from the ledger."""
    assert watch is not None
    watch.step(replayed(step, status, error))


def seen_executed(
    watch: Execution | None,
    base: StepRecord,
    started: int,
    status: str,
    error: BaseException | None,
    result: Any = None,
) -> None:
    """Tell the observer (there is one) how one call of a step's function ended."""
    assert watch is not None
    watch.step(executed(base, started, status, error, result))
