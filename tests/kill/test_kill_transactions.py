"""Transaction steps under SIGKILL: a run of 50 transaction steps, each inserting one row into
an application table of the ledger's own database, killed again and again in real processes —
at the crash points around the commit and at random instants — then resumed to the end. Every
row is there exactly once: the writes and the step record commit together or not at all."""

from __future__ import annotations

import random
import sqlite3
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from safepoint.testing.kill import run_child

pytestmark = pytest.mark.kill

TESTS = str(Path(__file__).parents[1])
LINES = 50
PAUSE = 0.004  # inside each transaction: a kill from outside often lands mid-transaction


def _rows_sqlite(url: str, run_id: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return list(conn.execute("SELECT step_id, line FROM app_order_lines WHERE run_id = ?", (run_id,)))
    finally:
        conn.close()


def _rows_postgres(url: str, run_id: str) -> list[tuple[Any, ...]]:
    import psycopg

    base, _, schema = url.partition("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        return list(conn.execute("SELECT step_id, line FROM app_order_lines WHERE run_id = %s", (run_id,)))


def _store(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> tuple[str, Callable[[str, str], list[tuple[Any, ...]]]]:
    """A fresh store of that kind (a SQLite file, a PostgreSQL schema), and how to read its
    application rows."""
    if store == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}", _rows_sqlite
    return f"{request.getfixturevalue('pg_url')}?schema=kill_tx_{uuid.uuid4().hex[:12]}", _rows_postgres


def _kill_until_done(url: str, run_id: str, rng: random.Random) -> tuple[dict[str, Any], int]:
    """Start the run, kill it (six times at a crash point's random occurrence, which always
    lands, then from outside at random instants, which land when the work is not done yet),
    resume, again, until it ends: (its outcome, how many kills)."""
    kills, outcome, resume = 0, None, False
    for attempt in range(40):
        options: dict[str, Any] = {}
        if attempt < 6:  # at a crash point's random occurrence: lands while work is left (6 x 6 < LINES)
            point = rng.choice(["transaction.before_commit", "transaction.after_commit"])
            options["crash_at"] = f"{point}@{rng.randint(1, 6)}"
        elif attempt < 12:  # from outside, at a random instant: mid-transaction when it lands in time
            options["kill_after"] = rng.uniform(0.3, 0.9)
        ended = run_child(
            "flows:order_lines",
            store_url=url,
            run_id=run_id,
            args=[LINES, PAUSE],
            resume=resume,
            pythonpath=[TESTS],
            **options,
        )
        if ended.killed:
            kills += 1
        if ended.outcome is not None and ended.outcome.get("error") == "RunNotFound":
            resume = False  # killed before the run row was committed: start it again
            continue
        resume = True
        if ended.outcome is not None:
            outcome = ended.outcome
            break
        assert ended.killed, f"the child ended without an outcome: {ended.stderr[-3000:]}"
    assert outcome is not None, "the run never finished"
    return outcome, kills


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_each_row_is_written_exactly_once_across_many_kills(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    url, rows = _store(request, tmp_path, store)
    run_id = f"orders-{uuid.uuid4().hex[:8]}"
    outcome, kills = _kill_until_done(url, run_id, random.Random(f"{store}-8472"))
    assert kills >= 6, f"only {kills} kills landed: the test did not interrupt the work"
    assert outcome["status"] == "completed", outcome
    # each step saw the rows before it and its own: never a row twice, never one missing
    assert outcome["result"] == list(range(1, LINES + 1))
    written = rows(url, run_id)
    assert len(written) == LINES
    assert sorted(written) == sorted((f"line.{index}", index) for index in range(LINES))


@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_kill_after_the_function_committed_on_its_own_writes_no_second_row(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    """The step's function hands its connection to a helper that commits, and the process is
    SIGKILLed right after, before the step is recorded: the row is committed without its step.
    A resume in a fresh process must not run the step again — the run blocks for a person."""
    url, rows = _store(request, tmp_path, store)
    run_id = f"own-commit-{uuid.uuid4().hex[:8]}"
    killed = run_child(
        "flows:self_committed_line",
        store_url=url,
        run_id=run_id,
        crash_at="transaction.before_commit",
        pythonpath=[TESTS],
    )
    assert killed.killed, f"the kill did not land: {killed.outcome} {killed.stderr[-2000:]}"
    assert rows(url, run_id) == [("line.0", 0)]  # the helper's commit, and no step record
    for _ in range(2):  # resumed, in a fresh process each time: never run again
        resumed = run_child(
            "flows:self_committed_line", store_url=url, run_id=run_id, resume=True, pythonpath=[TESTS]
        )
        assert resumed.outcome is not None, resumed.stderr[-3000:]
        assert resumed.outcome["status"] == "blocked", resumed.outcome
        assert resumed.outcome["record"]["phase"] == "transaction_uncertain"
        assert rows(url, run_id) == [("line.0", 0)]
