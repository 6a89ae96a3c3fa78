"""Schedules on PostgreSQL: a database per schedule, cloned from a template, on the virtual clock.

The PostgreSQL store reads "now" from the database (``safepoint_now_ms()``, inside the very
statements that take leases and fence writes). In a simulation that function reads a one-row
table instead, which the simulation moves before each request: leases expire, sleeps fall due
and approvals lapse on virtual time, decided by the server's own statements as in production.

A process's schedules share one database, migrated once and emptied between schedules; its
round trips make a schedule some fifty times slower than in SQLite's memory, which is why
PostgreSQL schedules are for short explorations (``Config.postgres``), and the long ones run
on SQLite.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

try:
    import psycopg
except ImportError as missing:  # pragma: no cover - the extra names what to install
    raise ImportError("schedules on PostgreSQL need psycopg: pip install 'safepoint[postgres]'") from missing

from ...storage.postgres import PostgresStore

_VIRTUAL_NOW = """
CREATE TABLE sim_clock (now_ms BIGINT NOT NULL);
INSERT INTO sim_clock VALUES (0);
CREATE OR REPLACE FUNCTION safepoint_now_ms() RETURNS BIGINT
    LANGUAGE sql STABLE AS 'SELECT now_ms FROM sim_clock';
"""


def _named(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


class Connection:
    """The simulation's own view of a schedule's PostgreSQL database (autocommit), taking the
    SQLite-style ``?`` placeholders its invariants and people are written with."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if not params:  # no placeholders to read: a "%" stays a "%" (LIKE)
            return self._conn.execute(sql)
        return self._conn.execute(sql.replace("?", "%s"), tuple(params))

    def set_now(self, now_ms: int) -> None:
        self._conn.execute("UPDATE sim_clock SET now_ms = %s", (now_ms,))

    def close(self) -> None:
        self._conn.close()

    @property
    def closed(self) -> bool:
        return bool(self._conn.closed)


class _VirtualClock:
    """The store's own estimate of the database clock (``PostgresStore.now``), on virtual time."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._read = clock

    def due(self) -> bool:
        return False

    def now(self) -> int:
        return self._read()


# What an emptied ledger keeps: its migrations, its identity, and the virtual clock.
_KEPT = ("safepoint_schema_version", "safepoint_ledger", "sim_clock")


class Ledgers:
    """One database per process on a PostgreSQL server, migrated once, emptied between
    schedules (its sequences restarted too: a schedule starts from the same ledger whatever ran
    before), dropped at ``close``."""

    def __init__(self, server: str, setup_sql: Sequence[str]) -> None:
        self.server = server
        self.database = f"safepoint_sim_{os.getpid()}"
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.database}"')
            # Every commit waits for its WAL flush otherwise: the server never crashes in a
            # simulation (processes do, above it), so its durability is not what is shaken here.
            admin.execute(f'ALTER DATABASE "{self.database}" SET synchronous_commit = off')
        self.url = _named(server, self.database)
        self.store = PostgresStore(self.url, max_connections=2)  # migrates
        self.connection = Connection(self.url)
        self.connection.execute("UPDATE safepoint_ledger SET ledger_id = 'simulated', keyed_since = 0")
        self.connection.execute(_VIRTUAL_NOW)
        for statement in setup_sql:
            self.connection.execute(statement)
        self.store.close()
        self.store = PostgresStore(self.url, max_connections=2)  # with the identity just set
        atexit.register(self.close)  # the database goes with the process
        tables = self.connection.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' ORDER BY table_name"
        ).fetchall()
        sequences = self.connection.execute(  # identity columns' too
            "SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema()"
        ).fetchall()
        # DELETE, not TRUNCATE: a few rows each, and TRUNCATE's new files cost a quarter second;
        # foreign keys are not checked meanwhile (replica role), every table being emptied.
        self._empty = ";".join(
            [
                "SET session_replication_role = replica",
                *(f'DELETE FROM "{row[0]}"' for row in tables if row[0] not in _KEPT),
                *(f"SELECT setval('\"{row[0]}\"', 1, false)" for row in sequences),
                "SET session_replication_role = DEFAULT",
            ]
        )

    def schedule(self, clock: Callable[[], int]) -> Iterator[tuple[PostgresStore, Connection]]:
        """The ledger for one schedule, empty, on ``clock`` (a generator: emptied again when it
        is closed)."""
        self.connection.execute(self._empty)
        self.connection.set_now(0)
        self.store._clock = _VirtualClock(clock)  # type: ignore[assignment]
        try:
            yield self.store, self.connection
        finally:
            self.connection.execute(self._empty)

    def close(self) -> None:
        if self.connection.closed:
            return
        self.connection.close()
        self.store.close()
        atexit.unregister(self.close)
        with psycopg.connect(self.server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def ledger_dump(connection: Connection) -> str:
    """Every row of every ledger table, in a stable order (as ``world.ledger_dump`` for SQLite)."""
    tables = [
        row[0]
        for row in connection.execute(
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_name LIKE 'safepoint%' ORDER BY table_name"
        )
    ]
    lines: list[str] = []
    for table in tables:
        lines.append(f"-- {table}")
        lines.extend(sorted(repr(tuple(row)) for row in connection.execute(f'SELECT * FROM "{table}"')))
    return "\n".join(lines)
