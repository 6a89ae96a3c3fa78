"""The PostgreSQL store's transaction steps: the plans both executors share, and the
connection the step's function gets, sync and async.

One transaction, one round trip more than the function's own statements: ``BEGIN``, the fence
(``record_transaction``, which also records the step as uncertain) and the function's first
statement go in one round trip (pipelined, ``Opening``), its other statements one each, and the
step record — with the check that the transaction is still the step's — goes with the
``COMMIT``. The fence runs first and its row lock holds to the commit, so a stale worker's
transaction commits nothing (the first statement, sent with it, is rolled back unseen:
``LostOwnership`` is raised in its place) and nothing of the run moves under the step. A
function that sends no statement costs one round trip: the step is recorded by the fenced
``record_steps`` alone.

Whether the function ended the transaction is told by the server's transaction id, not by
psycopg's transaction status alone: a function that commits and begins again leaves a
transaction in progress — another one. The id taken at the start is the one that wrote the
step's uncertain record (the row version's ``xmin``); the one after is
``txid_current_if_assigned()`` (PostgreSQL 10 and later, unlike ``pg_current_xact_id…``, 13),
which gives none for a transaction that has written nothing yet rather than assign one. Both are
read in the statements that run on the run's own row, so a database that shards by run id
compares them where the row is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow

from ..._rules.transactions import COMMITTED_UNDER_THE_STEP, uncertain_record
from ...errors import HistoryWarning, TransientFailure, UsageError
from ...types import Claim, Params, StepRecord
from ..plans import Plan, Stmt
from ..transactions import AlreadyRecorded, AsyncRows, FunctionFailed, Rows, StepConnection, uncertain
from .connection import QUERIES, PostgresBase, returns_rows

T = TypeVar("T")
BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
# SQLSTATE class 40, "transaction rollback" (serialization failure, deadlock): the database
# gave up on the transaction, not on the step — another attempt may well succeed.
_ROLLED_BACK_BY_SERVER = "40"
# What ``record_transaction_step``'s check raises when the transaction open is not the step's
# (division by zero: nothing else in that statement divides).
ENDED_UNDER_THE_STEP = "22012"
_ANOTHER = "after its function another transaction was open: the step's was ended under it"
_NONE = "after its function no transaction was open: it was committed or rolled back under the step"


class PostgresTransactions(PostgresBase):
    """The plans of a transaction step (see the module docstring)."""

    def transaction_fence(
        self, claim: Claim, step: StepRecord, family_key: str | None
    ) -> Plan[tuple[int, HistoryWarning | None]]:
        """The transaction's first statement: the fence, counting the step, taking its family's
        claim on it (``family_key``; ``ClaimedInFamily`` when another run of the family holds
        it) and recording it as uncertain (``AlreadyRecorded`` when it is recorded already).
        Returns the database's now (the step's recorded_at) and the soft limit's warning, if
        due."""
        uncertain = self._sealed(
            uncertain_record(step).error, "safepoint_steps", "error", claim.run_id, step.step_id
        )
        row = yield from self._fenced(
            claim,
            "record_transaction",
            limited=True,
            claims=family_key is not None,
            operation_id=step.step_id,
            family_key=family_key,
            step_id=step.step_id,
            seq=step.seq,
            name=step.name,
            input_hash=step.input_hash,
            attempt=step.attempt,
            uncertain=uncertain,
        )
        if not row["marked"]:
            raise AlreadyRecorded
        due = yield from self._history_warning(claim, row)
        return int(row["now"]), due

    def transaction_record(self, claim: Claim, step: StepRecord, now: int) -> list[Stmt]:
        """The statements that record the step (its large result as an artifact first) once
        they checked the transaction is still the step's, sent with the COMMIT."""
        result, result_ref, data = self._stored_result(claim.run_id, step)  # sealed, with a codec
        stmts = []
        if result_ref is not None and data is not None:
            stmts.append(
                QUERIES(
                    "insert_artifact", run_id=claim.run_id, digest=result_ref, size=len(data), content=data
                )
            )
        params = self._step_params(claim.run_id, step, result, result_ref)
        if self.distributed:
            # Citus: the check as a statement of its own, which it runs on the run's node, in
            # the transaction that wrote the record there; the record without a subquery
            stmts.append(QUERIES("record_transaction_step_open", run_id=claim.run_id, step_id=step.step_id))
            name = "record_transaction_step_routed"
        else:
            name = "record_transaction_step"
        stmts.append(QUERIES(name, run_id=claim.run_id, fence=claim.fence, now=now, **params))
        return stmts


def still_open(status: TransactionStatus, run_id: str, step_id: str) -> Plan[None]:
    """After a function that raised, or left the transaction not in progress: raise
    ``TransactionUncertain`` unless the transaction open is the step's. An aborted one is rolled
    back first, then the step's uncertain record looked for: there, the function committed it."""
    if status == TransactionStatus.IDLE:
        raise uncertain(run_id, step_id, _NONE)
    place = {"run_id": run_id, "step_id": step_id}
    if status == TransactionStatus.INERROR:
        yield Stmt(ROLLBACK, None)
        if (yield QUERIES("transaction_committed", **place)):
            raise uncertain(run_id, step_id, COMMITTED_UNDER_THE_STEP)
        return
    found = yield QUERIES("transaction_open", **place)
    if not (found and found[0]["open"]):
        raise uncertain(run_id, step_id, _ANOTHER)


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
    statements with ``%s`` or ``%(name)s`` placeholders; rows to read back, as dicts."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, step_id: str, conn: psycopg.Connection[DictRow], opening: Opening) -> None:
        super().__init__(step_id)
        self._conn = conn
        self._opening: Opening | None = opening

    def execute(self, query: str, params: Params = None) -> Rows:
        """Run one statement in the step's transaction."""
        checked, bound = self._checked(query), None if params is None else self.params_of(params)
        if self._opening is not None:
            opening, self._opening = self._opening, None
            return Rows(opening.open(checked, bound))
        return Rows(self._conn.execute(checked, bound))

    def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        checked = self._checked(query)
        self._opened()
        with self._conn.cursor() as cur:
            cur.executemany(checked, [self.params_of(p) for p in params_seq])

    def driver_connection(self) -> psycopg.Connection[DictRow]:
        """psycopg's connection itself (the step's transaction begun on it), for a library that
        needs one: its statements run in the step's transaction; a commit or rollback it makes
        ends it, and the run then blocks for a person (the step may have committed)."""
        self._check_bound()
        self._opened()
        return self._conn

    def _opened(self) -> None:
        if self._opening is not None:
            opening, self._opening = self._opening, None
            opening.open(None, None)


class AsyncPostgresTransaction(StepConnection):
    """``PostgresTransaction`` on the async store (``types.AsyncTransaction``)."""

    dialect: Literal["sqlite", "postgres"] = "postgres"

    def __init__(self, step_id: str, conn: psycopg.AsyncConnection[DictRow], opening: AsyncOpening) -> None:
        super().__init__(step_id)
        self._conn = conn
        self._opening: AsyncOpening | None = opening

    async def execute(self, query: str, params: Params = None) -> AsyncRows:
        """Run one statement in the step's transaction."""
        checked, bound = self._checked(query), None if params is None else self.params_of(params)
        if self._opening is not None:
            opening, self._opening = self._opening, None
            return AsyncRows(await opening.open(checked, bound))
        return AsyncRows(await self._conn.execute(checked, bound))

    async def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        checked = self._checked(query)
        await self._opened()
        async with self._conn.cursor() as cur:
            await cur.executemany(checked, [self.params_of(p) for p in params_seq])

    async def driver_connection(self) -> psycopg.AsyncConnection[DictRow]:
        """psycopg's async connection itself (see ``PostgresTransaction.driver_connection``)."""
        self._check_bound()
        await self._opened()
        return self._conn

    async def _opened(self) -> None:
        if self._opening is not None:
            opening, self._opening = self._opening, None
            await opening.open(None, None)


class StoreRefusal(BaseException):
    """The fence's refusal (or the store's failure, or a step recorded already) met while
    opening the transaction inside the function's first statement: carried out of the function
    as a ``BaseException`` (its ``except Exception`` cannot swallow it) and raised by the store
    as ``error`` itself — the store's answer, not the step's failure."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class _OpeningBase:
    """The transaction's opening, sent with the function's first statement (see the module
    docstring): the fence's outcome is kept here for the store."""

    def __init__(
        self, ledger: PostgresTransactions, claim: Claim, step: StepRecord, family_key: str | None
    ) -> None:
        self.ledger, self.claim, self.step, self.family_key = ledger, claim, step, family_key
        self.started = False
        self.now = 0
        self.due: HistoryWarning | None = None
        self.refused: StoreRefusal | None = None

    def _refuse(self, error: BaseException) -> StoreRefusal:
        self.refused = StoreRefusal(error)
        return self.refused


class Opening(_OpeningBase):
    """``BEGIN``, the fence, the marks and the function's first statement, in one round trip
    (sync)."""

    def __init__(
        self,
        ledger: PostgresTransactions,
        conn: psycopg.Connection[DictRow],
        claim: Claim,
        step: StepRecord,
        family_key: str | None,
    ) -> None:
        super().__init__(ledger, claim, step, family_key)
        self.conn = conn

    def open(self, query: str | None, params: Any) -> Any:
        """Send the opening (and ``query``, unless None); the cursor of ``query``."""
        self.started = True
        conn, plan = self.conn, self.ledger.transaction_fence(self.claim, self.step, self.family_key)
        stmt, failed, user, fence = next(plan), None, None, None
        try:
            with conn.pipeline():
                conn.execute(BEGIN)
                fence = conn.execute(stmt.text, stmt.params)
                if query is not None:
                    user = conn.execute(query, params)
        except psycopg.Error as exc:
            failed = exc
        try:
            if fence is None:  # not even sent: the connection failed
                raise failed or psycopg.OperationalError("the transaction could not be opened")
            rows = fence.fetchall()
        except psycopg.Error as exc:  # the opening itself failed: the store's error
            raise self._refuse(failed or exc) from None
        if not (rows and rows[0]["marked"]):  # refused, or recorded already
            rollback(conn)  # the first statement ran in vain: roll it back, then say why
            try:
                run_plan_from(plan, rows, lambda s: _rows(conn.execute(s.text, s.params)))
            except BaseException as exc:
                raise self._refuse(exc) from None
        if failed is not None:
            raise failed  # the function's own statement failed: the step's error
        try:
            self.now, self.due = run_plan_from(plan, rows, lambda s: _rows(conn.execute(s.text, s.params)))
        except BaseException as exc:
            raise self._refuse(exc) from None
        return user


class AsyncOpening(_OpeningBase):
    """``Opening`` on an async connection."""

    def __init__(
        self,
        ledger: PostgresTransactions,
        conn: psycopg.AsyncConnection[DictRow],
        claim: Claim,
        step: StepRecord,
        family_key: str | None,
    ) -> None:
        super().__init__(ledger, claim, step, family_key)
        self.conn = conn

    async def open(self, query: str | None, params: Any) -> Any:
        """Send the opening (and ``query``, unless None); the cursor of ``query``."""
        self.started = True
        conn, plan = self.conn, self.ledger.transaction_fence(self.claim, self.step, self.family_key)
        stmt, failed, user, fence = next(plan), None, None, None
        try:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                fence = await conn.execute(stmt.text, stmt.params)
                if query is not None:
                    user = await conn.execute(query, params)
        except psycopg.Error as exc:
            failed = exc
        try:
            if fence is None:
                raise failed or psycopg.OperationalError("the transaction could not be opened")
            rows = await fence.fetchall()
        except psycopg.Error as exc:
            raise self._refuse(failed or exc) from None
        if not (rows and rows[0]["marked"]):
            await rollback_async(conn)
            try:
                await run_plan_from_async(plan, rows, conn)
            except BaseException as exc:
                raise self._refuse(exc) from None
        if failed is not None:
            raise failed
        try:
            self.now, self.due = await run_plan_from_async(plan, rows, conn)
        except BaseException as exc:
            raise self._refuse(exc) from None
        return user


def _rows(cur: Any) -> list[Any]:
    return cur.fetchall() if returns_rows(cur) else []


def run_plan_from(plan: Plan[T], rows: list[Any], execute: Callable[[Stmt], list[Any]]) -> T:
    """Carry a started plan on, from the rows of the statement it yielded first."""
    try:
        stmt = plan.send(rows)
        while True:
            stmt = plan.send(execute(stmt))
    except StopIteration as done:
        result: T = done.value
        return result


async def run_plan_from_async(plan: Plan[T], rows: list[Any], conn: psycopg.AsyncConnection[Any]) -> T:
    """``run_plan_from`` on an async connection."""
    try:
        stmt = plan.send(rows)
        while True:
            cur = await conn.execute(stmt.text, stmt.params)
            stmt = plan.send(await cur.fetchall() if returns_rows(cur) else [])
    except StopIteration as done:
        result: T = done.value
        return result


def went_on_after_a_failure(step_id: str) -> FunctionFailed:
    """A function that returned with the step's transaction aborted (and still its own): a
    statement of it failed and it went on."""
    return FunctionFailed(
        UsageError(
            f"transaction step {step_id!r}: a statement of its function failed and the"
            " function went on, leaving the transaction aborted; let the error propagate"
            " (or roll back to a savepoint of your own). Nothing of it was committed",
            step_id=step_id,
        )
    )


def lost(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the connection broke under the step (a failover, ``pg_terminate_backend``)."""
    return conn.broken or conn.closed


def failed_function(
    exc: BaseException,
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
    claim: Claim,
    step_id: str,
) -> BaseException:
    """What to raise for an error inside the transaction: the function's own error as the
    step's failure — unless the connection broke under it (then the store's, a driver error:
    the step is tried again, since nothing of it committed, or its record committed, which the
    next attempt finds), or the check before the commit found the transaction ended under the
    step (``TransactionUncertain``)."""
    if isinstance(exc, FunctionFailed):
        if isinstance(exc.error, StoreRefusal):  # met in the opening: the store's own answer
            return exc.error.error
        if lost(conn):
            if isinstance(exc.error, psycopg.Error):
                return exc.error
            broken = psycopg.OperationalError(
                f"the connection was lost under the step's function ({exc.error!r})"
            )
            broken.__cause__ = exc.error
            return broken
        exc.error = function_error(exc.error)
        return exc
    if isinstance(exc, psycopg.Error) and getattr(exc, "sqlstate", None) == ENDED_UNDER_THE_STEP:
        return uncertain(claim.run_id, step_id, _ANOTHER)
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
