"""Mutants: the store with one at-most-once mechanism reverted, to prove the simulator finds what
each one prevents (and that a kept regression seed still reaches it).

    .venv/bin/python tests/simulation/mutants.py find <mutant> [seconds]   # explore from fresh seeds
    .venv/bin/python tests/simulation/mutants.py check <mutant> <seed>     # the seed breaks it still

Each mutant patches the SQLite store (its SQL text or one method), or one step of the engine, in
this process only, for the length of a ``with`` block.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from safepoint.storage.sqlite import SqliteStore
from safepoint.storage.sqlite import connection as sqlite_connection
from safepoint.storage.sqlite.steps import SqliteSteps
from safepoint.types import ResolutionAction


@contextmanager
def _claims(skip: Callable[[str | None], bool]) -> Iterator[None]:
    """The family's claim is not taken for the keys ``skip`` names."""
    claim = SqliteSteps._claim_in_family

    def mutated(conn: Any, run_id: str, operation_id: str, key: str | None) -> None:
        if not skip(key):
            claim(conn, run_id, operation_id, key)

    SqliteSteps._claim_in_family = staticmethod(mutated)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        SqliteSteps._claim_in_family = staticmethod(claim)  # type: ignore[method-assign,assignment]


@contextmanager
def _sql(name: str, old: str, new: str) -> Iterator[None]:
    """The named query with ``old`` replaced by ``new``."""
    statement = sqlite_connection.SQL[name]
    assert old in statement, f"the mutant no longer applies to {name}: {old!r} is gone"
    sqlite_connection.SQL[name] = statement.replace(old, new)
    try:
        yield
    finally:
        sqlite_connection.SQL[name] = statement


@contextmanager
def _release_on_not_applied() -> Iterator[None]:
    """A person's "not applied" gives the family's claim back (as before the simulator found a
    request still on its way could then be sent again under another key)."""
    resolve = SqliteStore.resolve

    def mutated(self: SqliteStore, run_id: str, revision: int, resolution: Any) -> Any:
        done = resolve(self, run_id, revision, resolution)
        if resolution.action is ResolutionAction.NOT_APPLIED:
            self._conn().execute(
                sqlite_connection.SQL["family_release"],
                {"run_id": run_id, "operation_id": resolution.operation_id or ""},
            )
        return done

    SqliteStore.resolve = mutated  # type: ignore[method-assign]
    try:
        yield
    finally:
        SqliteStore.resolve = resolve  # type: ignore[method-assign]


@contextmanager
def _fence_kept_on_release() -> Iterator[None]:
    """A release leaves the fence where it was (as before the simulator found a stale write
    landing on a released run)."""
    with (
        _sql("resolve", "fence = fence + 1,", ""),
        _sql("release_run", "fence = fence + 1,", ""),
        _sql("end_slice", "fence = fence + 1,", ""),
    ):
        yield


@contextmanager
def _replay_asks_no_holder() -> Iterator[None]:
    """A replay that reaches an operation its record holds no outcome of declares it new
    work without asking the family who holds it (as before the simulator found the first run
    of a family, which had taken a fork's rejection and recorded nothing of it, replaying as if
    a step had been added)."""
    from safepoint._engine.settled import SettledElsewhere

    held = SettledElsewhere.held_for_replay

    def mutated(self: Any) -> Any:
        return None
        yield  # a flow that reads nothing

    SettledElsewhere.held_for_replay = mutated  # type: ignore[method-assign]
    try:
        yield
    finally:
        SettledElsewhere.held_for_replay = held  # type: ignore[method-assign]


MUTANTS: dict[str, Callable[[], AbstractContextManager[None]]] = {
    # issue "Every effect once where features meet", item 1: a family's claim on an operation
    "effect-claims": lambda: _claims(lambda key: key is not None and not key.startswith("transaction ")),
    # item 2: a family's claim on a transaction step
    "transaction-claims": lambda: _claims(lambda key: key is not None and key.startswith("transaction ")),
    # item 3: a successor stands in its chain's family
    "chain-family": lambda: _sql(
        "continue_as_new", "COALESCE(family_id, run_id) AS family_id", "run_id AS family_id"
    ),
    # found by the simulator: the sender keeps the claim unless its dispatch provably never left
    "release-on-not-applied": _release_on_not_applied,
    # found by the simulator: every release moves the fence on
    "fence-on-release": _fence_kept_on_release,
    # found by the simulator: a replay asks the family who holds an operation it has no outcome of
    "replay-asks-no-holder": _replay_asks_no_holder,
}


def main(argv: list[str]) -> int:
    from safepoint.testing.simulation import Config, explore, replay

    verb, mutant = argv[0], argv[1]
    with MUTANTS[mutant]():
        if verb == "check":
            done = replay(seed=int(argv[2]))
            print(f"mutant={mutant} seed={argv[2]} rules={sorted({v.rule for v in done.violations})}")
            return 0 if done.violations else 1
        began = time.perf_counter()
        report = explore(Config(), seconds=float(argv[2]) if len(argv) > 2 else 600.0, shrink_seconds=30)
    took = report.seconds if report.failure else time.perf_counter() - began
    found = report.failure
    print(
        f"mutant={mutant} found={found is not None} seconds={took:.1f} schedules={report.schedules}"
        f" first_seed={report.first_seed}"
        + (f" seed={found.seed} rules={sorted({v.rule for v in found.violations})}" if found else "")
    )
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
