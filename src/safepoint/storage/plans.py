"""Plans: a store operation written once, as a generator of SQL statements, and carried out by
whichever connection the store has — SQLite or PostgreSQL, sync or async.

A plan is a generator that yields ``Stmt`` objects (a named query of the dialect's
``sql/<dialect>/queries.sql`` with its parameters) and is sent back each statement's rows; it
returns the operation's value. It performs no I/O, so it cannot block or await, and an executor
decides the transaction around it (``run_plan``, ``run_plan_async``: one statement at a time).
What a plan raises itself rolls that transaction back and passes unchanged; a driver's error is
the executor's to translate.

This is the storage layer's own mechanism, kept apart from the engine's flows
(``safepoint._engine.flow``) on purpose, though both are "a generator that yields requests and
two drivers": a flow yields calls *of store operations and of user code* — any of which may be
a coroutine, may time out, may sleep — and its drivers must tell those apart on every request;
a plan yields only *statements*, answered by rows, inside one transaction on one connection.
Sharing one driver would put the flow's dispatch on every statement of every write (a step is
one statement on PostgreSQL), and let a store plan yield what only the engine may do; storage
may not import the engine either. So: the same shape, two small mechanisms, each typed for
what it carries.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, TypeAlias, TypeVar

T = TypeVar("T")
Row: TypeAlias = Any  # a row as the driver returns it: columns by name (dict, sqlite3.Row)


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement a plan asks its executor to run; the executor sends back its rows
    (an empty list for a statement that returns none). ``text`` is the SQL itself (a driver's
    composed SQL on PostgreSQL, for identifiers)."""

    text: Any
    params: Mapping[str, Any] | None = None


# A plan yields statements, is sent each one's rows, and returns the operation's value.
Plan: TypeAlias = Generator[Stmt, list[Row], T]


def run_plan(execute: Callable[[Stmt], list[Row]], plan: Plan[T]) -> T:
    """Carry out ``plan``, each statement by ``execute`` (in whatever transaction the caller
    opened)."""
    try:
        stmt = next(plan)
        while True:
            stmt = plan.send(execute(stmt))
    except StopIteration as done:
        result: T = done.value
        return result


async def run_plan_async(execute: Callable[[Stmt], Awaitable[list[Row]]], plan: Plan[T]) -> T:
    """``run_plan`` for an async connection."""
    try:
        stmt = next(plan)
        while True:
            stmt = plan.send(await execute(stmt))
    except StopIteration as done:
        result: T = done.value
        return result


def load_queries(dialect: str) -> dict[str, str]:
    """Parse ``sql/<dialect>/queries.sql`` into {name: statement}."""
    text = resources.files(__package__).joinpath("sql", dialect, "queries.sql").read_text("utf-8")
    queries: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = block.partition("\n")
        lines = [line for line in body.splitlines() if not line.startswith("--")]
        queries[name.strip()] = "\n".join(lines).strip().rstrip(";")
    return queries


class Queries:
    """A dialect's named queries, as statements: ``q("get_run", run_id=…)``."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self.text = load_queries(dialect)

    def __call__(self, name: str, /, **params: Any) -> Stmt:
        return Stmt(self.text[name], params)
