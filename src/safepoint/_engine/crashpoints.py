"""Named crash points at every durability boundary, free when disarmed.

A kill test arms one point through the environment of the process it starts::

    SAFEPOINT_CRASH_AT=effect.after_dispatching          # the first time it is reached
    SAFEPOINT_CRASH_AT=effect.after_dispatching@3        # the third time
    SAFEPOINT_CRASH_AT=effect.after_dispatching:charge   # only at step ids starting "charge"

and the process kills itself with SIGKILL exactly there: no ``finally``, no ``atexit``, no
flush — the same as a machine losing the process. ``SAFEPOINT_CRASH_MODE=raise`` raises
``SimulatedCrash`` (a ``BaseException``) instead, for fast in-process unit tests;
``SAFEPOINT_CRASH_MODE=stop`` freezes the process with SIGSTOP (a zombie-to-be).

Disarmed, ``crashpoint`` is a single comparison with ``None``.
"""

from __future__ import annotations

import os
import signal

from ..errors import UsageError

# Every boundary, in protocol order. Tests iterate over this tuple, so a new point is tested
# as soon as it is listed here.
POINTS: tuple[str, ...] = (
    "run.after_start",  # the run row exists, nothing else
    "step.before_record",  # a step's function returned, its result not yet recorded
    "step.after_record",  # a step's result is recorded
    "effect.before_prepare",  # before intent: nothing about the effect is durable
    # payload, operation id and key durable; not dispatching (only where "prepared" is a commit
    # of its own, see _rules.effects.one_commit_to_dispatching)
    "effect.after_prepared",
    "effect.after_dispatching",  # "dispatch may have happened" durable; call not made
    "effect.after_receiver_commit",  # execute returned (the owner committed); outcome not stored
    "effect.after_outcome",  # receipt stored (applied), before verification
    "effect.after_accept",  # accepted and the step recorded
    # a transaction step's function returned, inside its transaction: nothing of it committed
    "transaction.before_commit",
    "transaction.after_commit",  # its writes and its step record committed, together
    "run.before_complete",  # the workflow returned; completion not recorded
    "run.before_continue",  # the workflow continued as new; nothing of it recorded
    "run.after_continue",  # continued, and its successor created; successor not run
)


class SimulatedCrash(BaseException):
    """Raised at an armed crash point when SAFEPOINT_CRASH_MODE=raise."""

    def __init__(self, point: str, step_id: str | None) -> None:
        super().__init__(f"simulated crash at {point} (step {step_id})")
        self.point = point
        self.step_id = step_id


# How an armed point stops the process: SIGKILL, SimulatedCrash, or SIGSTOP.
_MODES = ("kill", "raise", "stop")


class _Armed:
    __slots__ = ("hits", "mode", "nth", "point", "step_prefix")

    def __init__(self, spec: str, mode: str) -> None:
        point, _, nth = spec.partition("@")
        point, _, step_prefix = point.partition(":")
        if point not in POINTS:
            raise UsageError(
                f"unknown crash point {point!r}: name one of {', '.join(POINTS)}"
                " (optionally point:step-id-prefix, point@n)"
            )
        if nth and not (nth.isdigit() and int(nth) > 0):
            raise UsageError(f"crash point {spec!r}: after '@' comes the occurrence, 1 or more")
        if mode not in _MODES:
            raise UsageError(f"crash mode {mode!r}: one of {', '.join(_MODES)} (SAFEPOINT_CRASH_MODE)")
        self.point = point
        self.step_prefix = step_prefix
        self.nth = int(nth) if nth else 1
        self.mode = mode
        self.hits = 0


_armed: _Armed | None = None


def arm(spec: str | None, mode: str = "kill") -> None:
    """Arm one crash point (``None`` disarms). Normally done from the environment at import."""
    global _armed
    _armed = _Armed(spec, mode) if spec else None


def crashpoint(point: str, step_id: str | None = None) -> None:
    """Die here if this point is armed (and this is the chosen occurrence)."""
    if _armed is None:
        return
    _hit(_armed, point, step_id)


def _hit(armed: _Armed, point: str, step_id: str | None) -> None:
    if point != armed.point:
        return
    if armed.step_prefix and not (step_id or "").startswith(armed.step_prefix):
        return
    armed.hits += 1
    if armed.hits != armed.nth:
        return
    if armed.mode == "raise":
        raise SimulatedCrash(point, step_id)
    if armed.mode == "stop":
        # Freeze the whole process here (heartbeat included), as a long GC pause or a stopped
        # VM would: the zombie-worker tests resume it with SIGCONT after its lease expired.
        os.kill(os.getpid(), signal.SIGSTOP)
        return
    os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get("SAFEPOINT_CRASH_AT"), os.environ.get("SAFEPOINT_CRASH_MODE", "kill"))
