"""Statements about one run, for a ledger a distributed PostgreSQL shards by run (Citus,
``?distributed=citus``).

A fenced write on plain PostgreSQL is one statement: the fence (an UPDATE of the runs row) and
the rows it writes, as data-modifying CTEs reading the run's id from the fence's. Citus cannot
send such a statement whole to the run's shard: it plans each CTE apart, copies the
intermediate results to every worker node and commits on all of them in two phases. So for a
distributed ledger a statement may have a *routed* form (``sql/postgres/citus.sql``, under the
same name): several statements, each about one table and naming the run's id, carried out in
one transaction on the connection — the first the fence, whose row (or none) is what the
statement returns. Its columns are parameters of the statements after it (``%(now)s``: the
instant the fence wrote), which run only when the fence matched; when it did not, nothing was
written and the transaction ends there, as the one statement would have written nothing.

Each routed statement is one round trip more than the one statement (the fence's answer is
needed before the rest is sent, with the COMMIT, in one pipeline); every statement of it is
sent by Citus to the run's shard alone, committed there in one phase.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from ..plans import Queries, Row

__all__ = ["routed_statements", "run_routed", "run_routed_async"]

Routed = Mapping[str, tuple[str, ...]]  # a statement's text -> its routed form, the fence first


@cache
def routed_statements(queries: Queries) -> Routed:
    """The routed forms ``sql/postgres/citus.sql`` gives, by the text of the statement each
    stands for (``queries``: the dialect's, which must name each)."""
    text = resources.files("safepoint.storage").joinpath("sql", "postgres", "citus.sql").read_text("utf-8")
    routed: dict[str, tuple[str, ...]] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        parts = tuple(part.strip() for part in re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE))
        routed[queries.text[name.strip()]] = tuple(part for part in parts if part)
    return routed


def run_routed(cur: psycopg.Cursor[Any], parts: Sequence[str], params: Mapping[str, Any] | None) -> list[Row]:
    """Carry out a routed statement on ``cur``'s connection (see the module docstring): in a
    transaction of its own unless one is open; the fence's rows."""
    conn = cur.connection
    own = conn.info.transaction_status == TransactionStatus.IDLE
    with conn.pipeline():  # BEGIN and the fence: one round trip
        if own:
            cur.execute("BEGIN")
        cur.execute(parts[0], params)
        rows = cur.fetchall()
    if not rows:
        if own:
            cur.execute("ROLLBACK")
        return []
    given = {**(params or {}), **rows[0]}
    with conn.pipeline():
        for part in parts[1:]:
            cur.execute(part, given)
        if own:
            cur.execute("COMMIT")
    return rows


async def run_routed_async(
    cur: psycopg.AsyncCursor[Any], parts: Sequence[str], params: Mapping[str, Any] | None
) -> list[Row]:
    """``run_routed`` for an async cursor."""
    conn = cur.connection
    own = conn.info.transaction_status == TransactionStatus.IDLE
    async with conn.pipeline():
        if own:
            await cur.execute("BEGIN")
        await cur.execute(parts[0], params)
        rows: list[Row] = await cur.fetchall()
    if not rows:
        if own:
            await cur.execute("ROLLBACK")
        return []
    given = {**(params or {}), **rows[0]}
    async with conn.pipeline():
        for part in parts[1:]:
            await cur.execute(part, given)
        if own:
            await cur.execute("COMMIT")
    return rows
