"""Exploring: schedule after schedule from fresh seeds, and a failure shrunk to a short story.

``explore`` runs schedules for a budget of time (or a number of them), each from its own seed,
and stops at the first that breaks an invariant. ``shrink`` then looks for a smaller tape that
still breaks the same rule — cutting the tape short, dropping runs of choices, making choices
plainer — so that what a person reads is the few events that matter, not thousands. A seed
replays its schedule exactly (``SIM_SEED=… make simulate``); a shrunk tape does too
(``replay(tape=…)``), and both are what a regression test keeps.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from .runner import Config, Schedule, run_schedule
from .world import Violation


@dataclass
class Report:
    """What an exploration did: how much it ran, and the first failure it found (shrunk)."""

    first_seed: int
    config: Config | None = None  # what the schedules held (None: the default Config)
    schedules: int = 0
    requests: int = 0
    steps: int = 0
    seconds: float = 0.0
    failure: Schedule | None = None  # as found
    shrunk: Schedule | None = None  # the same rule broken by a shorter schedule
    seeds: list[int] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return 0 if self.failure is None else len(self.failure.violations)

    def line(self) -> str:
        """The one line a long run ends with."""
        seed = self.failure.seed if self.failure is not None else self.first_seed
        return f"schedules={self.schedules} requests={self.requests} violations={self.violations} seed={seed}"

    def check(self) -> None:
        """Raise ``AssertionError`` with the failure's seed and story, if there was one."""
        if self.failure is not None:
            raise AssertionError(self.explain())

    def explain(self) -> str:
        """What a person needs to see and replay a failure."""
        if self.failure is None:
            return self.line()
        shown = self.shrunk or self.failure
        lines = [
            f"simulation: {self.violations} violation(s) in the schedule of seed {self.failure.seed}:",
            *(f"  - {v}" for v in self.failure.violations),
            (
                f"replay it: SIM_SEED={self.failure.seed} make simulate"
                if self.config is None or self.config == Config()
                else f"replay it: replay(config, seed={self.failure.seed}), or simulate(…,"
                f" seed={self.failure.seed}, schedules=1) with the same arguments"
            ),
        ]
        if self.shrunk is not None:
            lines += [
                f"shrunk to {len(self.shrunk.tape)} choices ({len(self.shrunk.events)} events); it breaks:",
                *(f"  - {v}" for v in self.shrunk.violations),
                f"its tape: {encode(self.shrunk.tape)}",
            ]
        lines += ["what happened:", shown.story()]
        return "\n".join(lines)


def encode(tape: Sequence[int]) -> str:
    """A tape as text (for a regression file): its choices, comma-separated."""
    return ",".join(map(str, tape))


def decode(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def fresh_seed() -> int:
    return int.from_bytes(os.urandom(4))


def explore(
    config: Config | None = None,
    *,
    seconds: float | None = None,
    schedules: int | None = None,
    seed: int | None = None,
    shrink_seconds: float = 30.0,
) -> Report:
    """Run schedules from consecutive seeds (from ``seed``, or a fresh one) until ``seconds``
    pass or ``schedules`` ran; stop at the first failure and shrink it."""
    config = config or Config()
    if seconds is None and schedules is None:
        seconds = 10.0
    first = fresh_seed() if seed is None else seed
    report = Report(first, config)
    began = time.perf_counter()
    while True:
        if schedules is not None and report.schedules >= schedules:
            break
        if seconds is not None and time.perf_counter() - began >= seconds:
            break
        current = first + report.schedules
        again = report.schedules % RECHECK_EVERY == 0
        done = run_schedule(config, seed=current, keep_ledger=again)
        if again:
            _same_again(config, done)
        report.schedules += 1
        report.requests += done.requests
        report.steps += done.steps
        if done.violations:
            report.failure = done
            report.seconds = time.perf_counter() - began
            report.shrunk = shrink(config, done, seconds=shrink_seconds)
            return report
    report.seconds = time.perf_counter() - began
    return report


# Every so many schedules, one is run twice: the same seed must give the same ledger, byte for byte.
RECHECK_EVERY = 25


def _same_again(config: Config, done: Schedule) -> None:
    again = run_schedule(config, seed=done.seed, keep_ledger=True)
    if again.ledger != done.ledger or [str(e) for e in again.events] != [str(e) for e in done.events]:
        diverged = next(
            (f"{a} | {b}" for a, b in zip(done.events, again.events, strict=False) if str(a) != str(b)),
            "the ledgers differ",
        )
        done.violations.append(
            Violation("deterministic", f"seed {done.seed} ran twice, differently: {diverged}")
        )


def shrink(config: Config, failing: Schedule, *, seconds: float = 30.0) -> Schedule:
    """A schedule with a shorter (or plainer) tape that breaks one of the rules ``failing``
    broke; ``failing`` itself if none is found in ``seconds``."""
    rules = {v.rule for v in failing.violations}
    best = failing
    deadline = time.perf_counter() + seconds

    def fails(tape: list[int]) -> Schedule | None:
        done = run_schedule(config, tape=tape)
        return done if {v.rule for v in done.violations} & rules else None

    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        tape = best.tape
        # Cut the tape short: past its end every choice is the plain one.
        for keep in (len(tape) // 8, len(tape) // 4, len(tape) // 2, 3 * len(tape) // 4):
            if 0 < keep < len(tape) and (found := fails(tape[:keep])) is not None:
                best, improved = found, True
                break
        if improved:
            continue
        # Drop runs of choices, longest first.
        size = max(1, len(tape) // 4)
        while size >= 1 and not improved and time.perf_counter() < deadline:
            for start in range(0, len(tape) - size + 1, size):
                candidate = tape[:start] + tape[start + size :]
                if (found := fails(candidate)) is not None and len(found.tape) <= len(candidate):
                    best, improved = found, True
                    break
                if time.perf_counter() >= deadline:
                    break
            size //= 2
        if improved:
            continue
        # Make choices plainer: zero, then halve.
        for index, value in enumerate(tape):
            if time.perf_counter() >= deadline:
                break
            for plainer in (0, value // 2):
                if plainer < value:
                    candidate = [*tape[:index], plainer, *tape[index + 1 :]]
                    if (found := fails(candidate)) is not None:
                        best, improved = found, True
                        break
            if improved:
                break
    return best


def replay(config: Config | None = None, *, seed: int | None = None, tape: Sequence[int] = ()) -> Schedule:
    """Run one schedule again, from its seed or its tape, keeping its ledger."""
    return run_schedule(config or Config(), seed=seed, tape=tape, keep_ledger=True)
