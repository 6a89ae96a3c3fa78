"""What each conformance test exercises that a second set-up of a store may change, and the
rule that picks a set-up's tests from it.

A store that already runs the whole suite may be run again in another set-up: with a codec, with
another claim statement, on a database shared by every test, in memory. Such a set-up changes
some of what the store does and leaves the rest as the first set-up proved it; it declares what
it changes (``ConformanceBase.changes``) and runs the tests that exercise it. Each test declares
what it exercises with ``exercises``; a test that declares nothing exercises ``VALUES``, what
most tests do, so a new test runs under every codec until it says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# Writes what a run records and reads it back — inputs, results, errors, receipts, payloads,
# messages, events' details, recovery records, artifacts — or a statement that moves them
# (re-plan, retry, fork, prune): what a codec seals and opens.
VALUES = "values"
# Decides on the run's plain columns only — status, owner, fence, revision, lease, limits and
# what was spent, the clock — and reads back no value a codec seals. No second set-up of
# safepoint's stores changes it: the set-ups that run everything prove it.
CONTROL = "control"
# Claims a run through ``claim_next``, the claim of any runnable run: what another claim
# statement changes (PostgreSQL's ``?claim=per_run``), and what other runs in the same
# database could steal.
CLAIMS = "claims"
# Reads across runs — lists, queries, prune, the artifacts runs share by digest, a wait for any
# run's work: what a database shared with other tests' runs changes.
ACROSS_RUNS = "across_runs"
# Two things at once on one database — threads racing, a waiter woken by another store's
# commit: what a store's own locking changes (SQLite in memory takes turns on one lock).
CONCURRENCY = "concurrency"

CONCERNS = frozenset({VALUES, CONTROL, CLAIMS, ACROSS_RUNS, CONCURRENCY})
UNDECLARED = frozenset({VALUES})  # what a test that declares nothing exercises
_ATTRIBUTE = "conformance_concerns"


def exercises(*concerns: str) -> Callable[[F], F]:
    """Declare what a conformance test exercises (names of ``CONCERNS``), for the set-ups that
    run only some tests: ``@exercises(VALUES, CLAIMS)``."""
    chosen = _checked(concerns, "exercises")

    def declare(test: F) -> F:
        setattr(test, _ATTRIBUTE, chosen)
        return test

    return declare


def concerns_of(test: Callable[..., Any]) -> frozenset[str]:
    """What ``test`` declared it exercises (``UNDECLARED`` when it declared nothing)."""
    declared: frozenset[str] = getattr(test, _ATTRIBUTE, UNDECLARED)
    return declared


def leave_out_unchanged(cls: type, changes: Iterable[str]) -> None:
    """Hide from pytest every test of ``cls`` that exercises none of ``changes``: the set-up
    leaves what they test as the set-ups that run everything proved it."""
    changed = _checked(tuple(changes), f"{cls.__name__}.changes")
    for name in [name for name in dir(cls) if name.startswith("test_")]:
        test = getattr(cls, name)
        if callable(test) and not concerns_of(test) & changed:
            setattr(cls, name, None)  # pytest collects only callables


def _checked(concerns: tuple[str, ...], where: str) -> frozenset[str]:
    unknown = sorted(set(concerns) - CONCERNS)
    if unknown or not concerns:
        raise ValueError(f"{where}: name concerns of {sorted(CONCERNS)}, not {unknown or 'none'}")
    return frozenset(concerns)
