"""The application table the transaction step tests write (``app_orders``), read and cleared
beside the store — through a connection of their own, never through it."""

from __future__ import annotations

import sqlite3
from typing import Any

TABLE = "CREATE TABLE IF NOT EXISTS app_orders (id TEXT NOT NULL)"


def q(tx: Any, query: str) -> str:
    """``query`` written with ``?`` placeholders, in the step connection's dialect."""
    return query if tx.dialect == "sqlite" else query.replace("?", "%s")


def orders(url: str) -> list[str]:
    """The table's rows, in order (none when it was never made)."""
    if url.startswith("sqlite:///"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            found = conn.execute("SELECT name FROM sqlite_master WHERE name = 'app_orders'").fetchone()
            return [r[0] for r in conn.execute("SELECT id FROM app_orders ORDER BY id")] if found else []
        finally:
            conn.close()
    import psycopg

    base, _, schema = url.partition("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        if conn.execute("SELECT to_regclass('app_orders') IS NOT NULL AS f").fetchone()[0] is False:
            return []
        return [r[0] for r in conn.execute("SELECT id FROM app_orders ORDER BY id")]


def delete_orders(url: str) -> None:
    """Remove every row, as a person undoing what a step left would."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DELETE FROM app_orders")
        return
    import psycopg

    base, _, schema = url.partition("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        conn.execute("DELETE FROM app_orders")
