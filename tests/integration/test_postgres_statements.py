"""What the PostgreSQL store sends for its hot statements: prepared on the server once a
connection has run them a few times (``prepare_threshold``), or never — for a connection
pooler that cannot keep prepared statements between transactions."""

from __future__ import annotations

import asyncio
import uuid

import pytest

pytest.importorskip("psycopg", reason="psycopg is not installed: pip install 'safepoint[postgres]'")

import safepoint as sp
from safepoint.errors import InvalidStoreURL
from safepoint.storage.postgres import PostgresStore
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
    assert any("record_steps" in text or "jsonb_to_recordset" in text for text in statements) is prepared
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
