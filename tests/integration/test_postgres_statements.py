"""What the PostgreSQL store sends for its hot statements: prepared on the server once a
connection has run them a few times (``prepare_threshold``), or never — for a connection
pooler that cannot keep prepared statements between transactions."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

import pytest

try:
    import psycopg
    from psycopg import pq
except ImportError:  # the extra is not installed
    if os.environ.get("CI"):
        raise
    pytest.skip("psycopg is not installed: pip install 'safepoint[postgres]'", allow_module_level=True)

import safepoint as sp
from safepoint.errors import InvalidStoreURL
from safepoint.storage.base import NewRun
from safepoint.storage.postgres import PostgresStore, pool
from safepoint.storage.postgres_async import AsyncPostgresStore


@sp.workflow("pg-prepared-reads")
def _reads(run: sp.Run, n: int) -> int:
    return sum(run.read(f"read.{i}", lambda i=i: i) for i in range(n))


def _prepared_on_the_server(store: PostgresStore) -> list[str]:
    # The store's own pooled connection (one thread, one connection in use): prepared
    # statements belong to the session that prepared them.
    with store._pool.connection() as conn:
        rows = conn.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    return [row["statement"] for row in rows]


@pytest.mark.parametrize(
    ("query", "keyword", "prepared"),
    [
        ("", {}, True),  # the default: psycopg's, after 5 executions
        ("prepare_threshold=0", {}, True),
        ("prepare_threshold=none", {}, False),
        ("", {"prepare_threshold": None}, False),
    ],
)
def test_the_hot_statements_are_prepared_unless_told_not_to(
    pg_url: str, query: str, keyword: dict[str, None], prepared: bool
) -> None:
    store = PostgresStore(f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}&{query}", **keyword)
    try:
        assert sp.start(store, _reads, 12, run_id=f"r-{uuid.uuid4().hex[:10]}") == 66
        statements = _prepared_on_the_server(store)
    finally:
        store.close()
    # a read step's record (record_step) is the statement that inserts into safepoint_steps
    assert any("INSERT INTO safepoint_steps" in text for text in statements) is prepared
    if not prepared:
        assert statements == []


@pytest.mark.parametrize("value", ["-1", "often", ""])
def test_a_bad_prepare_threshold_is_an_invalid_store_url(pg_url: str, value: str) -> None:
    with pytest.raises(InvalidStoreURL) as invalid:
        PostgresStore(f"{pg_url}?prepare_threshold={value}")
    assert "prepare_threshold" in str(invalid.value)
    with pytest.raises(InvalidStoreURL):
        AsyncPostgresStore(f"{pg_url}?prepare_threshold={value}")


def test_a_negative_prepare_threshold_keyword_is_refused(pg_url: str) -> None:
    with pytest.raises(InvalidStoreURL):
        PostgresStore(pg_url, prepare_threshold=-1)


def test_the_async_store_prepares_nothing_when_told_not_to(pg_url: str) -> None:
    async def body() -> list[str]:
        store = await AsyncPostgresStore.open(
            f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}&prepare_threshold=none"
        )
        try:
            for _ in range(8):
                await store.schema_version()
            async with store._pool.connection() as conn:
                cur = await conn.execute("SELECT statement FROM pg_prepared_statements")
                return [row["statement"] for row in await cur.fetchall()]
        finally:
            await store.close()

    assert asyncio.run(body()) == []


# -- round trips after a rest ------------------------------------------------------------------


class _Traced:
    """The round trips of a store's one pooled connection: the server's ReadyForQuery
    messages, from libpq's protocol trace."""

    def __init__(self, store: PostgresStore, path: Path) -> None:
        self.path = path
        with store._pool.connection() as conn:  # one thread: the pool hands out this one
            self._conn = conn
        self._trace()

    def _trace(self) -> None:
        # libpq writes through a stdio stream of its own, closed (and flushed) by untrace
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._conn.pgconn.trace(fd)
        self._conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

    def count(self) -> int:
        self._conn.pgconn.untrace()
        self._trace()
        return self.path.read_text().count("\tReadyForQuery")


def test_after_a_rest_a_read_costs_one_round_trip_and_a_write_two(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rested connection is proved by a round trip before a write, which is never sent twice;
    a read goes without (it is read again if the connection turns out gone)."""
    monkeypatch.setattr(pool, "PROBE_AFTER_S", 0.05)
    store = PostgresStore(f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}", max_connections=1)
    try:
        run, claim = store.create_run(NewRun(f"r-{uuid.uuid4().hex[:10]}", "wf", "v1", "h", {}, "me", 60_000))
        assert claim is not None
        traced = _Traced(store, tmp_path / "trace")
        costs = []
        for operation in (
            lambda: store.get_run(run.run_id),
            lambda: store.renew_lease(claim),
            lambda: store.load_ledger(run.run_id),
        ):
            time.sleep(0.1)  # rested longer than PROBE_AFTER_S
            before = traced.count()
            operation()
            costs.append(traced.count() - before)
    finally:
        store.close()
    # get_run: the statement; renew_lease: the probe, then the statement; load_ledger: BEGIN,
    # the snapshot's reads (run, steps, operations, attempts, …), COMMIT — and no probe
    assert costs[:2] == [1, 2]
    assert costs[2] == _load_ledger_round_trips(pg_url)


def _load_ledger_round_trips(pg_url: str) -> int:
    """What ``load_ledger`` costs on a connection used moments ago (never probed)."""
    store = PostgresStore(f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}", max_connections=1)
    try:
        run, _ = store.create_run(NewRun(f"r-{uuid.uuid4().hex[:10]}", "wf", "v1", "h", {}, None, 0))
        with tempfile.TemporaryDirectory() as tmp:
            traced = _Traced(store, Path(tmp) / "trace")
            before = traced.count()
            store.load_ledger(run.run_id)
            return traced.count() - before
    finally:
        store.close()


def test_a_read_on_a_rested_connection_the_server_ended_is_read_again(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Unprobed, a read may find its connection gone (here: ended under it without the socket
    showing it yet); it is then read again on a checked connection, and answers."""
    monkeypatch.setattr(pool, "PROBE_AFTER_S", 0.05)
    store = PostgresStore(f"{pg_url}?schema=t_{uuid.uuid4().hex[:12]}", max_connections=2)
    try:
        run, _ = store.create_run(NewRun(f"r-{uuid.uuid4().hex[:10]}", "wf", "v1", "h", {}, None, 0))
        monkeypatch.setattr(pool, "unsolicited_input", lambda conn: False)  # blind to the FATAL
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'safepoint' AND datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
        time.sleep(0.1)
        with caplog.at_level("INFO", logger="safepoint.store"):
            assert store.get_run(run.run_id) == run
        assert "lost during a read; reading again" in caplog.text
    finally:
        store.close()
