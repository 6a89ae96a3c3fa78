"""Damage a ledger on purpose: overwrite one stored column behind the store's back, as a bad
restore, a hand edit, a newer safepoint's value or a failing disk would.

What the store does with the row afterwards is what the tests of an unreadable record look at:
``get_run`` and ``load_ledger`` raise ``CorruptRecord``, listings show the run as an
``UnreadableRun``, and the first worker that claims it blocks it (``unreadable_record``) while
every other run goes on::

    from safepoint.testing.tamper import overwrite

    overwrite(store, "safepoint_runs", "inputs", "{not json", run_id="r-1")

The value is stored as it is (an unknown status, say: no CHECK lists a column's values):
text, ``bytes`` (stored as text that need not be UTF-8 — SQLite only: a PostgreSQL database
refuses such text), a number, or None. Works on safepoint's own stores (SQLite, in a file or in
memory; PostgreSQL, sync or async through ``SyncOverAsync``); ``UsageError`` for any other.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from ..errors import UsageError

__all__ = ["overwrite"]

_NAME = re.compile(r"safepoint_[a-z_]+|[a-z_]+")


def overwrite(
    store: Any, table: str, column: str, value: str | bytes | float | None, **where: str | int
) -> int:
    """Set ``column`` of the rows of ``table`` that match ``where`` (column=value, all of them)
    to ``value``, bypassing the store; return how many rows changed."""
    for name in (table, column, *where):
        if not _NAME.fullmatch(name):
            raise UsageError(f"not a column or table of the ledger: {name!r}")
    if not where:
        raise UsageError("say which rows: overwrite(store, table, column, value, run_id=...)")
    inner = getattr(store, "store", store)  # SyncOverAsync wraps the async store
    ledger = getattr(inner, "_ledger", None)
    if ledger is not None and hasattr(ledger, "conninfo"):
        return _overwrite_postgres(ledger, table, column, value, where)
    target = getattr(inner, "_target", None)
    if isinstance(target, str):
        return _overwrite_sqlite(target, bool(getattr(inner, "_uri", False)), table, column, value, where)
    raise UsageError(f"overwrite knows safepoint's own stores only, not {type(store).__name__}")


def _overwrite_sqlite(
    target: str, uri: bool, table: str, column: str, value: Any, where: dict[str, Any]
) -> int:
    conn = sqlite3.connect(target, uri=uri, timeout=30, isolation_level=None)
    try:
        slot = "CAST(? AS TEXT)" if isinstance(value, bytes) else "?"
        condition = " AND ".join(f"{name} = ?" for name in where)
        return conn.execute(
            f"UPDATE {table} SET {column} = {slot} WHERE {condition}", (value, *where.values())
        ).rowcount
    finally:
        conn.close()


def _overwrite_postgres(ledger: Any, table: str, column: str, value: Any, where: dict[str, Any]) -> int:
    import psycopg
    from psycopg import sql

    if isinstance(value, bytes):
        raise UsageError("a PostgreSQL database holds only valid text: give a str")
    with psycopg.connect(ledger.conninfo) as conn:
        if ledger.schema:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(ledger.schema)))
        condition = sql.SQL(" AND ").join(sql.SQL("{} = %s").format(sql.Identifier(name)) for name in where)
        return conn.execute(
            sql.SQL("UPDATE {} SET {} = %s WHERE {}").format(
                sql.Identifier(table), sql.Identifier(column), condition
            ),
            (value, *where.values()),
        ).rowcount
