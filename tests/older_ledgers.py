"""Ledgers as an earlier release left them, for the tests of what a migration does to rows
already there: a ledger made at the first ``migrations`` migrations, and the rows of a ledger of
the last schema copied into it — every column the older schema has.

Opening the older ledger afterwards applies the later migrations to those rows, as an upgrade
does."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import safepoint as sp
import safepoint.storage.migrations
from safepoint.storage.migrations import Migration, load_migrations


def older_url(store_url: str, tmp_path: Path, name: str) -> str:
    """A ledger of its own beside ``store_url``'s (a file, or a schema of the same database)."""
    if store_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / f'{name}.db'}"
    return store_url.replace("?schema=", f"?schema={name}_")


def make_older_ledger(url: str, migrations: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make an empty ledger at ``url`` with only the first ``migrations`` migrations applied."""

    def older(dialect: str) -> list[Migration]:
        return load_migrations(dialect)[:migrations]

    with monkeypatch.context() as patched:
        patched.setattr(safepoint.storage.migrations, "load_migrations", older)
        store = sp.open_store(url)
        try:
            assert store.schema_version() == migrations
        finally:
            store.close()


def copy_ledger(source_url: str, target_url: str, tables: tuple[str, ...]) -> None:
    """Copy ``tables`` of the ledger at ``source_url`` (the last schema) into the older ledger
    at ``target_url``: every column the older schema has, the identity row included — a ledger
    as that release would have written it."""
    if source_url.startswith("sqlite"):
        conn = sqlite3.connect(target_url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("ATTACH DATABASE ? AS source", (source_url.removeprefix("sqlite:///"),))
        conn.execute("BEGIN")
        conn.execute("DELETE FROM safepoint_ledger")
        for table in tables:
            columns = ", ".join(row[1] for row in conn.execute(f"PRAGMA main.table_info({table})"))
            conn.execute(f"INSERT INTO main.{table} ({columns}) SELECT {columns} FROM source.{table}")
        conn.execute("COMMIT")
        conn.close()
        return
    import psycopg
    from psycopg import sql

    base, _, source_schema = source_url.partition("?schema=")
    target_schema = target_url.partition("?schema=")[2]
    with psycopg.connect(base, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.SQL("DELETE FROM {}.safepoint_ledger").format(sql.Identifier(target_schema)))
        for table in tables:
            names = [  # an identity column (event_id) is numbered by the target itself
                row[0]
                for row in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s"
                    " AND table_name = %s AND is_identity = 'NO' ORDER BY ordinal_position",
                    (target_schema, table),
                )
            ]
            columns = sql.SQL(", ").join(map(sql.Identifier, names))
            conn.execute(
                sql.SQL("INSERT INTO {}.{} ({}) SELECT {} FROM {}.{}").format(
                    sql.Identifier(target_schema),
                    sql.Identifier(table),
                    columns,
                    columns,
                    sql.Identifier(source_schema),
                    sql.Identifier(table),
                )
            )
