"""A prune killed with SIGKILL in the middle of a batch: a real child process pruning hundreds
of finished runs, in small batches, on a real SQLite file and on PostgreSQL, killed at a random
instant once its first batch has committed. Afterwards every run is whole or entirely gone — no
step, event, operation or attempt of a deleted run left behind, no artifact nothing references —
and a second prune finishes the work."""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import pytest

import safepoint as sp

pytestmark = pytest.mark.kill

RUNS = 300
BATCH = 4

forgetful = sp.Effect(
    "prune-kill.send",
    execute=lambda payload, key: {"sent": payload["n"]},
    dedup_retention=timedelta(milliseconds=1),
)


def _big(n: int) -> str:
    return f"{n}:" + "x" * 20_000  # an artifact of its own per run


@sp.workflow("prune-kill", version="1")
def finished(run: sp.Run, n: int) -> dict[str, Any]:
    doubled = run.pure("double", lambda: n * 2)
    seen = run.read("read", lambda: {"n": n})
    big = run.pure("big", _big, n)
    sent = run.effect("send", forgetful, payload={"n": doubled}, operation_id="send")
    return {"seen": seen, "sent": sent, "size": len(big)}


# What a run leaves in each table, and the artifacts nothing references: checked in SQL.
_CHILD_TABLES = ("steps", "events", "operations", "attempts", "messages", "approvals")
_UNREFERENCED = """
SELECT count(*) FROM safepoint_artifacts a
WHERE NOT EXISTS (SELECT 1 FROM safepoint_runs WHERE inputs_ref = a.digest OR result_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_steps WHERE result_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_operations WHERE payload_ref = a.digest)
  AND NOT EXISTS (SELECT 1 FROM safepoint_messages WHERE payload_ref = a.digest)
"""


class Ledger:
    """Plain SQL on the store's tables, behind its back (SQLite file or PostgreSQL schema)."""

    def __init__(self, url: str) -> None:
        self.url = url
        parts = urlsplit(url)
        if parts.scheme == "sqlite":
            self.sqlite: sqlite3.Connection | None = sqlite3.connect(parts.path[1:])
        else:
            import psycopg

            schema = parse_qs(parts.query)["schema"][0]
            self.sqlite = None
            self.pg = psycopg.connect(urlunsplit(parts._replace(query="")), autocommit=True)
            self.pg.execute(f'SET search_path TO "{schema}"')

    def value(self, sql: str) -> Any:
        if self.sqlite is not None:
            return self.sqlite.execute(sql).fetchone()[0]
        row = self.pg.execute(sql).fetchone()
        assert row is not None
        return row[0]

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        if self.sqlite is not None:
            return self.sqlite.execute(sql).fetchall()
        return [tuple(row) for row in self.pg.execute(sql).fetchall()]

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()
        else:
            self.pg.close()

    def runs(self) -> int:
        return int(self.value("SELECT count(*) FROM safepoint_runs WHERE workflow = 'prune-kill'"))

    def orphans(self) -> dict[str, int]:
        return {
            table: int(
                self.value(
                    f"SELECT count(*) FROM safepoint_{table}"
                    " WHERE run_id NOT IN (SELECT run_id FROM safepoint_runs)"
                )
            )
            for table in _CHILD_TABLES
        }

    def unreferenced(self) -> int:
        return int(self.value(_UNREFERENCED))

    def whole(self) -> list[str]:
        """The runs left that are not whole (as sp.start left each: 4 steps, 1 operation, and
        as many events as the run counted)."""
        broken = self.rows(
            """
            SELECT r.run_id FROM safepoint_runs r
            WHERE r.workflow = 'prune-kill' AND r.status = 'completed' AND (
                (SELECT count(*) FROM safepoint_steps s WHERE s.run_id = r.run_id) <> 4
                OR r.step_count <> 4
                OR (SELECT count(*) FROM safepoint_operations o WHERE o.run_id = r.run_id) <> 1
                OR (SELECT count(*) FROM safepoint_events e WHERE e.run_id = r.run_id) <> r.event_count
                OR (r.result IS NULL AND r.result_ref IS NULL))
            """
        )
        return [str(row[0]) for row in broken]


@pytest.fixture
def ledger(store_url: str) -> Iterator[tuple[str, Ledger]]:
    store = sp.open_store(store_url)
    try:
        for n in range(RUNS):
            sp.start(store, finished, n, run_id=f"pk-{n:04d}")
        sp.submit(store, finished, -1, run_id="pk-pending")  # not finished: never touched
    finally:
        store.close()
    time.sleep(0.01)  # past the effect's retention, and every run before the cut-off
    opened = Ledger(store_url)
    yield store_url, opened
    opened.close()


_CHILD = """
import sys
from datetime import timedelta
import safepoint as sp
store = sp.open_store(sys.argv[1])
print("pruning", flush=True)
sp.prune(store, finished_before=timedelta(0), batch=int(sys.argv[2]), workflow="prune-kill")
print("done", flush=True)
"""


def test_a_prune_killed_mid_batch_leaves_every_run_whole_or_gone(ledger: tuple[str, Ledger]) -> None:
    url, db = ledger
    assert db.runs() == RUNS + 1
    assert db.orphans() == dict.fromkeys(_CHILD_TABLES, 0)
    assert db.unreferenced() == 0
    assert db.whole() == []

    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, str(BATCH)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "pruning", child.stderr.read() if child.stderr else ""
        deadline = time.monotonic() + 60
        while db.runs() == RUNS + 1:  # the first batch has not committed yet
            assert child.poll() is None, "the prune ended before it was killed"
            assert time.monotonic() < deadline, "the prune never committed a batch"
            time.sleep(0.001)
        time.sleep(random.uniform(0, 0.05))  # a random instant of a later batch
    finally:
        child.kill()  # SIGKILL
        child.wait(timeout=30)
    assert child.returncode == -9, child.stderr.read() if child.stderr else ""

    left = db.runs()
    assert 1 < left < RUNS + 1, f"killed with {left} runs left: not in the middle of the prune"
    assert db.whole() == []  # every run left is whole …
    assert db.orphans() == dict.fromkeys(_CHILD_TABLES, 0)  # … and nothing of a deleted one is
    assert db.unreferenced() == 0

    store = sp.open_store(url)
    try:
        done = sp.prune(store, finished_before=timedelta(0), batch=50, workflow="prune-kill")
        assert done.runs == left - 1
        assert done.kept == ()
        assert store.get_run("pk-pending").status is sp.types.RunStatus.PENDING
    finally:
        store.close()
    assert db.rows("SELECT run_id FROM safepoint_runs WHERE workflow = 'prune-kill'") == [("pk-pending",)]
    assert db.orphans() == dict.fromkeys(_CHILD_TABLES, 0)
    assert db.unreferenced() == 0
    assert db.value("SELECT count(*) FROM safepoint_artifacts") <= 1  # the pending run's inputs, at most
