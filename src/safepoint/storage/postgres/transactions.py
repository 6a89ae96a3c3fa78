"""The PostgreSQL store's transaction steps: the plans both executors share, and the
connection the step's function gets, sync and async.

One transaction: ``BEGIN`` and the fence (``record_transaction``) in one round trip
(pipelined), then the function's statements, then the step record and ``COMMIT`` in one round
trip. The fence comes first and its row lock holds to the commit, so a stale worker's function
never commits and nothing of the run moves under the step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Literal

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow

from ..._rules.transactions import misused
from ...errors import HistoryWarning, TransientFailure, UsageError
from ...types import Claim, Params, StepRecord
from ..ledger import stored
from ..plans import Plan, Stmt
from ..transactions import FunctionFailed, StepConnection
from .connection import QUERIES, PostgresBase

BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
# SQLSTATE class 40, "transaction rollback" (serialization failure, deadlock): the database
# gave up on the transaction, not on the step — another attempt may well succeed.
_ROLLED_BACK_BY_SERVER = "40"


class PostgresTransactions(PostgresBase):
    """The plans of a transaction step (see the module docstring)."""

    def transaction_fence(self, claim: Claim, step: StepRecord) -> Plan[tuple[int, HistoryWarning | None]]:
        """The transaction's first statement: the fence, counting the step. Returns the
        database's now (the step's recorded_at) and the soft limit's warning, if due."""
        row = yield from self._fenced(claim, "record_transaction", limited=True, step_id=step.step_id)
        due = yield from self._history_warning(claim, row)
        return int(row["now"]), due

    def transaction_record(self, claim: Claim, step: StepRecord, now: int) -> list[Stmt]:
        """The statements that record the step (its large result as an artifact first), sent
        with the COMMIT."""
        result, result_ref, data = stored(step.result, self.inline_limit)
        stmts = []
        if result_ref is not None and data is not None:
            stmts.append(QUERIES("insert_artifact", digest=result_ref, size=len(data), content=data))
        params = self._step_params(step, result, result_ref)
        stmts.append(
            QUERIES("record_transaction_step", run_id=claim.run_id, fence=claim.fence, now=now, **params)
        )
        return stmts


def function_error(exc: BaseException) -> BaseException:
    """What the step's function raised, as the step's failure: a transaction the server rolled
    back (a serialization failure, a deadlock) is a ``TransientFailure``, tried again as the
    step's retry policy allows."""
    sqlstate = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.Error) and sqlstate and sqlstate.startswith(_ROLLED_BACK_BY_SERVER):
        failure = TransientFailure(f"the database rolled the transaction back ({sqlstate}): {exc}")
        failure.__cause__ = exc
        return failure
    return exc


class PostgresTransaction(StepConnection):
    """What a transaction step's function gets on PostgreSQL (``types.Transaction``):
    statements with ``%s`` or ``%(name)s`` placeholders; psycopg's cursor back, rows as dicts."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, step_id: str, conn: psycopg.Connection[DictRow]) -> None:
        super().__init__(step_id)
        self._conn = conn

    def execute(self, query: str, params: Params = None) -> psycopg.Cursor[DictRow]:
        """Run one statement in the step's transaction."""
        return self._conn.execute(self._checked(query), None if params is None else self.params_of(params))

    def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        with self._conn.cursor() as cur:
            cur.executemany(self._checked(query), [self.params_of(p) for p in params_seq])


class AsyncPostgresTransaction(StepConnection):
    """``PostgresTransaction`` on the async store (``types.AsyncTransaction``)."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, step_id: str, conn: psycopg.AsyncConnection[DictRow]) -> None:
        super().__init__(step_id)
        self._conn = conn

    async def execute(self, query: str, params: Params = None) -> psycopg.AsyncCursor[DictRow]:
        """Run one statement in the step's transaction."""
        return await self._conn.execute(
            self._checked(query), None if params is None else self.params_of(params)
        )

    async def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        async with self._conn.cursor() as cur:
            await cur.executemany(self._checked(query), [self.params_of(p) for p in params_seq])


def first_pipelined(conn: psycopg.Connection[Any]) -> Any:
    """An executor for ``run_plan`` that sends ``BEGIN`` with the plan's first statement, in
    one round trip."""
    begun = False

    def execute(stmt: Stmt) -> list[Any]:
        nonlocal begun
        if not begun:
            begun = True
            with conn.pipeline():
                conn.execute(BEGIN)
                cur = conn.execute(stmt.text, stmt.params)
        else:
            cur = conn.execute(stmt.text, stmt.params)
        return cur.fetchall() if cur.description is not None else []

    return execute


def first_pipelined_async(conn: psycopg.AsyncConnection[Any]) -> Any:
    """``first_pipelined`` on an async connection."""
    begun = False

    async def execute(stmt: Stmt) -> list[Any]:
        nonlocal begun
        if not begun:
            begun = True
            async with conn.pipeline():
                await conn.execute(BEGIN)
                cur = await conn.execute(stmt.text, stmt.params)
        else:
            cur = await conn.execute(stmt.text, stmt.params)
        rows: list[Any] = await cur.fetchall() if cur.description is not None else []
        return rows

    return execute


def ended_by_function(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], step_id: str) -> None:
    """After the function returned: its transaction must still be open and sound. A statement
    that failed, and that the function went on past (no ``ROLLBACK TO SAVEPOINT``), left it
    aborted; a statement holding a COMMIT ended it."""
    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return
    if status == TransactionStatus.INERROR:
        raise FunctionFailed(
            UsageError(
                f"transaction step {step_id!r}: a statement of its function failed and the"
                " function went on, leaving the transaction aborted; let the error propagate"
                " (or roll back to a savepoint of your own). Nothing of it was committed",
                step_id=step_id,
            )
        )
    raise FunctionFailed(misused(step_id, "ended the transaction with a statement"))


def failed_function(
    exc: BaseException, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]
) -> BaseException:
    """What to raise for an error inside the transaction: the function's own error as the
    step's failure, unless the connection broke under it (then the store's: the step is run
    again once the store is back, since nothing of it was committed)."""
    if isinstance(exc, FunctionFailed):
        if conn.broken and isinstance(exc.error, psycopg.Error):
            return exc.error
        exc.error = function_error(exc.error)
    return exc


def rollback(conn: psycopg.Connection[Any]) -> None:
    """Roll back whatever is left of the step's transaction (nothing when the connection is
    gone: the server rolled it back)."""
    if conn.closed or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    # broken: the pool discards it, and the server rolled the transaction back
    with contextlib.suppress(psycopg.Error):
        conn.execute(ROLLBACK)


async def rollback_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """``rollback`` on an async connection."""
    if conn.closed or conn.info.transaction_status == TransactionStatus.IDLE:
        return
    with contextlib.suppress(psycopg.Error):
        await conn.execute(ROLLBACK)
