"""The simulator on PostgreSQL: the server's own statements decide leases and fences, on the
virtual clock, and a schedule tells the same story it tells on SQLite."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from safepoint.testing.simulation import Config, explore, replay
from safepoint.testing.simulation.runner import close_ledgers


@pytest.fixture
def on_postgres(pg_url: str) -> Iterator[Config]:
    yield Config(postgres=pg_url)
    close_ledgers()


def test_fresh_schedules_on_postgres_break_no_invariant(on_postgres: Config) -> None:
    report = explore(on_postgres, schedules=60)
    report.check()


@pytest.mark.parametrize("seed", [7, 1206, 20261206])
def test_a_schedule_tells_the_same_story_on_postgres_as_on_sqlite(on_postgres: Config, seed: int) -> None:
    """Both dialects implement one protocol: under one schedule, the same claims, refusals,
    outcomes and endings, event for event — and the same ledger twice on PostgreSQL."""
    on_pg, again, on_sqlite = (
        replay(on_postgres, seed=seed),
        replay(on_postgres, seed=seed),
        replay(seed=seed),
    )
    assert [str(e) for e in on_pg.events] == [str(e) for e in on_sqlite.events]
    assert on_pg.ledger == again.ledger
    assert not on_pg.violations
