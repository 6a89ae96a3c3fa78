"""W0, the floor: raw single-row commits per second, with the driver and durability setting of
the system measured beside it; and the second floor of W5, raw HTTP creates per second against
the local effect owner.

Nothing durable can commit one step faster than one row in one transaction, so a system's
steps/s over the floor says how much of the database's speed it keeps.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import Any

from .common import Database, Sizes, postgres_settings, sqlite_settings

# The SQLite variants the systems run with (journal mode, synchronous): safepoint's default,
# every system at equal durability (and LangGraph's default), and DBOS's default.
SQLITE_FLOORS = {
    "wal_normal": ("WAL", "NORMAL"),
    "wal_full": ("WAL", "FULL"),
    "delete_full": ("DELETE", "FULL"),
}


def sqlite_floor(
    db: Database, commits: int, journal: str, synchronous: str, ran_with: dict[str, str] | None = None
) -> float:
    """Commits/s; ``ran_with`` gets the settings read back from the connection."""
    assert db.path is not None
    conn = sqlite3.connect(db.path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA journal_mode={journal}")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("CREATE TABLE floor (k INTEGER PRIMARY KEY, v TEXT)")
        if ran_with is not None:
            ran_with.update(sqlite_settings(conn))
        started = time.perf_counter()
        for index in range(commits):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO floor VALUES (?, ?)", (index, "x" * 16))
            conn.execute("COMMIT")
        return commits / (time.perf_counter() - started)
    finally:
        conn.close()


def postgres_floor(db: Database, commits: int, ran_with: dict[str, str] | None = None) -> float:
    """psycopg 3 (the driver of all three systems), one INSERT per transaction — a single
    statement in autocommit, one round trip — with ``synchronous_commit=on`` set explicitly (it
    is also the server's default)."""
    import psycopg

    with psycopg.connect(db.pg_url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        conn.execute("CREATE TABLE floor (k integer PRIMARY KEY, v text)")
        if ran_with is not None:
            ran_with.update(postgres_settings(conn))
        started = time.perf_counter()
        for index in range(commits):
            conn.execute("INSERT INTO floor VALUES (%s, %s)", (index, "x" * 16))
        return commits / (time.perf_counter() - started)


def http_floor(owner_url: str, calls: int) -> float:
    """Raw creates against the owner through one kept-alive connection, as W5's effect sends
    them."""
    from safepoint.testing.owner import OwnerClient

    client = OwnerClient(owner_url, keep_alive=True)
    started = time.perf_counter()
    for index in range(calls):
        client.create("tickets", {"floor": index}, idempotency_key=uuid.uuid4().hex)
    return calls / (time.perf_counter() - started)


def measure(backend: str, sizes: Sizes) -> dict[str, Any]:
    from .common import fresh_database

    out: dict[str, Any] = {}
    ran_with: dict[str, dict[str, str]] = {}  # each floor's settings, read back from its connection
    if backend == "sqlite":
        for name, (journal, synchronous) in SQLITE_FLOORS.items():
            with fresh_database("sqlite", f"floor_{name}") as db:
                ran_with[name] = {}
                out[name] = sqlite_floor(db, sizes.floor_commits, journal, synchronous, ran_with[name])
    else:
        with fresh_database("postgres", "floor") as db:
            ran_with["pg_on"] = {}
            out["pg_on"] = postgres_floor(db, sizes.floor_commits, ran_with["pg_on"])
    out["ran_with"] = ran_with
    return out
