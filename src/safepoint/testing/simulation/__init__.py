"""Deterministic simulation: many runs, workers and people interleaved, crashed and checked.

Every store request and every call to an effect owner is a boundary where a simulated process
may wait its turn, die, see its request fail or its answer lost, or sleep past its lease; people
fork, retry, resolve, approve, send, cancel and prune in between; a virtual clock makes leases
expire and timers fall due. Each schedule is one tape of choices, so a seed replays it exactly
and a failure shrinks to a short story. The parts: ``scheduler`` (tasks, the clock, the tape),
``world`` (the store behind a boundary, the model of the owner), ``workflows`` (the simulation's
own, with every kind of step), ``people``, ``invariants``, ``runner`` (one schedule) and
``explore`` (many, and shrinking).

>>> report = simulate(checkout, arguments=lambda name, n: (f"order-{n}",), seconds=30)  # doctest: +SKIP
>>> report.check()                                                                    # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from ..._engine.workflow import Workflow
from .explore import Report, decode, encode, explore, replay, shrink
from .runner import Config, Schedule, run_schedule
from .scheduler import Faults, ProcessDied, Tape
from .world import OwnerModel, SimOwner, Violation

__all__ = [
    "Config",
    "Faults",
    "OwnerModel",
    "ProcessDied",
    "Report",
    "Schedule",
    "SimOwner",
    "Violation",
    "decode",
    "encode",
    "explore",
    "replay",
    "run_schedule",
    "shrink",
    "simulate",
]


def simulate(
    *workflows: Workflow,
    arguments: Callable[[str, int], Sequence[Any]] | None = None,
    runs: int = 3,
    seconds: float | None = 10.0,
    schedules: int | None = None,
    seed: int | None = None,
    owner: OwnerModel | None = None,
    setup_sql: Sequence[str] = (),
    expected_failures: Collection[str] | None = None,
    faults: Faults | None = None,
    people: bool = True,
) -> Report:
    """Explore schedules of your own workflows, and return what was found.

    Each schedule starts ``runs`` runs of ``workflows`` (run ``n`` of workflow ``name`` called
    with ``arguments(name, n)``; no arguments by default) and shakes them for a few virtual
    seconds: worker processes die between any two store requests, requests fail or lose their
    answers, workers pause past their leases, the clock jumps, and a person forks, retries,
    resolves, approves, sends and prunes. Every effect is carried out against a model of its
    owner (``owner``: what counts as one business operation, how long keys are remembered, how
    often it rejects or answers late) instead of its own ``execute``; reads, model calls and pure
    steps run your functions, so point them at fakes. ``setup_sql`` creates the tables your
    transaction steps write. ``expected_failures`` names the errors a run of yours may fail
    with; any other is reported.

    Runs for ``seconds`` (or ``schedules`` schedules) from ``seed`` (a fresh one by default),
    stopping at the first schedule that breaks an invariant, shrunk to a short one:
    ``report.check()`` raises ``AssertionError`` with its seed and story.
    """
    if not workflows:
        raise ValueError("simulate needs at least one workflow")
    given = arguments

    def args_of(name: str, n: int, tape: Tape) -> tuple[Any, ...]:
        return tuple(given(name, n)) if given is not None else ()

    config = Config(
        runs=runs,
        workflows=tuple(wf.name for wf in workflows),
        arguments=args_of,
        owner=owner or OwnerModel(),
        setup_sql=tuple(setup_sql),
        expected_failures=expected_failures,
        faults=faults or Faults(),
        person_every_ms=600 if people else 0,
    )
    return explore(config, seconds=seconds if schedules is None else None, schedules=schedules, seed=seed)
