"""Slices: a call that carries a run on for at most so long (``slice=``), then stops it cleanly.

A serverless function or a job runner cuts a process at a ceiling that has nothing to do with
the run's structure. Given ``slice=``, ``start``, ``resume`` (and their async forms) and a
worker's ``run`` measure the time spent since the call began on the monotonic clock
(``SliceClock``). Once it is spent, the run stops at its next step boundary: before a new step
starts — the place where a cancel or a deadline stops a run too (``RunCore.check_slice``) —
never inside an effect's dispatch (an operation that was prepared carries its whole protocol
through first), and inside a fan-out at each branch's next step. The run then writes its
pending pure steps, is released at once with a ``run.slice_ended`` event (``Store.end_slice``:
no lease left to expire, the run stays runnable), and the call returns ``Unfinished``.

Every call carries its run at least one new step further, however short its slice: a slice
spent by the replay alone would otherwise stop every call before anything new, forever. A
read's back-off that would outlast the slice ends the slice at once instead of being waited
out (the next call waits what is left of it).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ..errors import SliceEnded, UsageError
from ..storage.base import Store
from ..types import Claim, RunStatus, Unfinished
from . import host
from .flow import Flow, io

# What ``slice=`` takes: a ``timedelta``, or a number of seconds.
Slice = timedelta | float | int


def slice_seconds(given: Slice | None) -> float | None:
    """``slice=`` in seconds (None: no slice); a ``UsageError`` unless it is a positive,
    finite ``timedelta`` or number of seconds."""
    if given is None:
        return None
    if isinstance(given, timedelta):
        seconds = given.total_seconds()
    elif isinstance(given, (int, float)) and not isinstance(given, bool):
        seconds = float(given)
    else:
        raise UsageError(f"slice={given!r}: give a timedelta (timedelta(seconds=25)) or a number of seconds")
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"slice={given!r}: a slice is a positive, finite length of time")
    return seconds


class SliceClock:
    """The slice one call may spend on one run: ``seconds`` from ``began_at`` (monotonic).

    ``ends_before_step`` is asked before each new step; it also keeps the promise that the
    run moves at least one new step on in this call. Fan-out branches ask from several
    threads at once."""

    def __init__(
        self, seconds: float, *, began_at: float | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.seconds = seconds
        self._clock = clock = clock or host.current.monotonic
        self.began_at = clock() if began_at is None else began_at
        self._stepped = False  # a new step began in this call
        self._lock = threading.Lock()

    @classmethod
    def of(cls, given: Slice | None) -> SliceClock | None:
        """The clock of a call given ``slice=given``, started now (None: no slice)."""
        seconds = slice_seconds(given)
        return None if seconds is None else cls(seconds)

    def for_run(self) -> SliceClock:
        """The same slice (same start) for another run of the same call, which has made no
        step yet: a worker's slice, for each run it claims."""
        return SliceClock(self.seconds, began_at=self.began_at, clock=self._clock)

    def elapsed(self) -> float:
        return self._clock() - self.began_at

    def remaining(self) -> float:
        """Seconds left of the slice (0 once it is spent)."""
        return max(0.0, self.seconds - self.elapsed())

    def spent(self) -> bool:
        return self.elapsed() >= self.seconds

    def ends_before_step(self) -> bool:
        """Asked before a new step starts: True when the run must stop here — the slice is
        spent and this call has already moved the run on. Else the step may start."""
        with self._lock:
            if self._stepped and self.spent():
                return True
            self._stepped = True
            return False

    def outlasts(self, wait_s: float) -> bool:
        """A wait of ``wait_s`` inside a step (a retry's back-off) would outlast the slice."""
        with self._lock:
            return self._stepped and wait_s >= self.remaining()

    def ended(self, run_id: str, step_id: str | None) -> SliceEnded:
        """The signal that stops ``run_id`` before ``step_id``."""
        return SliceEnded(run_id, step_id, self.seconds, self.elapsed())


def end_slice(flush: Flow[None], claim: Claim, signal: SliceEnded) -> Flow[Unfinished]:
    """The run stopped at a step boundary because the call's slice was spent: write its pending
    pure steps (``flush``), release it with a ``run.slice_ended`` event in one commit, and say
    so to the caller."""
    yield from flush
    detail: dict[str, Any] = {
        "slice_ms": round(signal.slice_s * 1000),
        "elapsed_ms": round(signal.elapsed_s * 1000),
        "before_step": signal.step_id,
    }
    yield from io(Store.end_slice, claim, step_id=signal.step_id, detail=detail)
    before = f" before step {signal.step_id!r}" if signal.step_id is not None else ""
    return Unfinished(
        run_id=claim.run_id,
        status=RunStatus.RUNNING,
        reason=(
            f"its slice of {signal.slice_s:g}s was spent ({signal.elapsed_s:.2f}s since the call"
            f" began): it stopped{before} and was released; resume it to carry it on"
        ),
    )
