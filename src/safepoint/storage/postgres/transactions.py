"""The PostgreSQL store's transaction steps: the plans both executors share, and the
connection the step's function gets, sync and async.

One transaction, one round trip more than the function's own statements: ``BEGIN``, the fence
(``record_transaction``), the step recorded as uncertain (``mark_transaction_step``), the
transaction's id (``transaction_begun``) and the function's first statement go in one round
trip (pipelined, ``Opening``), its other statements one each, and the check that the
transaction is still the one begun (``transaction_still_open``) and the step record go with the
``COMMIT``. The fence runs first and its row lock holds to the commit, so a stale worker's
transaction commits nothing (the first statement, sent with it, is rolled back unseen:
``LostOwnership`` is raised in its place) and nothing of the run moves under the step. A
function that sends no statement costs one round trip: the step is recorded by the fenced
``record_steps`` alone.

The transaction's id, not psycopg's transaction status alone, says whether the function ended
the transaction: a function that commits and then begins again leaves a transaction in progress
— another one. ``txid_current()`` is used (not ``pg_current_xact_id()``, PostgreSQL 13+) since it
is there on every version the store runs on; the fence has written, so the transaction has its
id already and asking for it assigns nothing.
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
# What ``transaction_still_open`` raises when the transaction open is not the step's.
ENDED_UNDER_THE_STEP = "25SP1"
_ANOTHER = "after its function another transaction was open: the step's was ended under it"
_NONE = "after its function no transaction was open: it was committed or rolled back under the step"


class PostgresTransactions(PostgresBase):
    """The plans of a transaction step (see the module docstring)."""

    def transaction_fence(self, claim: Claim, step: StepRecord) -> Plan[tuple[int, HistoryWarning | None]]:
        """The transaction's first statement: the fence, counting the step. Returns the
        database's now (the step's recorded_at) and the soft limit's warning, if due."""
        row = yield from self._fenced(claim, "record_transaction", limited=True, step_id=step.step_id)
        due = yield from self._history_warning(claim, row)
        return int(row["now"]), due

    def transaction_marks(self, claim: Claim, step: StepRecord) -> list[Stmt]:
        """The statements sent with the fence: the step recorded as uncertain, and the
        transaction's id kept for the check before the commit."""
        params = self._step_params(claim.run_id, uncertain_record(step), None, None)
        return [
            QUERIES("mark_transaction_step", run_id=claim.run_id, fence=claim.fence, **params),
            QUERIES("transaction_begun"),
        ]

    def transaction_record(self, claim: Claim, step: StepRecord, now: int) -> list[Stmt]:
        """The statements that check the transaction is still the step's and record the step
        (its large result as an artifact first), sent with the COMMIT."""
        result, result_ref, data = self._stored_result(claim.run_id, step)  # sealed, with a codec
        stmts = [QUERIES("transaction_still_open")]
        if result_ref is not None and data is not None:
            stmts.append(
                QUERIES(
                    "insert_artifact", run_id=claim.run_id, digest=result_ref, size=len(data), content=data
                )
            )
        params = self._step_params(claim.run_id, step, result, result_ref)
        stmts.append(
            QUERIES("record_transaction_step", run_id=claim.run_id, fence=claim.fence, now=now, **params)
        )
        return stmts


def still_open(status: TransactionStatus, xact: str, run_id: str, step_id: str) -> Plan[None]:
    """After a function that raised, or left the transaction not in progress: raise
    ``TransactionUncertain`` unless the transaction open is the step's (``xact``). An aborted
    one is rolled back first, then the step's transaction asked after: committed, it was ended
    under the step; rolled back, nothing of it committed."""
    if status == TransactionStatus.IDLE:
        raise uncertain(run_id, step_id, _NONE)
    if status == TransactionStatus.INERROR:
        yield Stmt(ROLLBACK, None)
        fate = yield QUERIES("transaction_fate", xact=xact)
        if fate and fate[0]["fate"] == "committed":
            raise uncertain(run_id, step_id, COMMITTED_UNDER_THE_STEP)
        return
    found = yield QUERIES("transaction_open")
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

    def __init__(self, ledger: PostgresTransactions, claim: Claim, step: StepRecord) -> None:
        self.ledger, self.claim, self.step = ledger, claim, step
        self.started = False
        self.now = 0
        self.xact = ""  # the step's transaction's id (txid_current), once begun
        self.due: HistoryWarning | None = None
        self.refused: StoreRefusal | None = None

    def _refuse(self, error: BaseException) -> StoreRefusal:
        self.refused = StoreRefusal(error)
        return self.refused

    def _marked(self, marked: list[Any], begun: list[Any]) -> bool:
        """Keep the transaction's id; whether the step was marked (not recorded already)."""
        if begun:
            self.xact = str(begun[0]["xact"])
        return bool(marked)


class Opening(_OpeningBase):
    """``BEGIN``, the fence, the marks and the function's first statement, in one round trip
    (sync)."""

    def __init__(
        self, ledger: PostgresTransactions, conn: psycopg.Connection[DictRow], claim: Claim, step: StepRecord
    ) -> None:
        super().__init__(ledger, claim, step)
        self.conn = conn

    def open(self, query: str | None, params: Any) -> Any:
        """Send the opening (and ``query``, unless None); the cursor of ``query``."""
        self.started = True
        conn, plan = self.conn, self.ledger.transaction_fence(self.claim, self.step)
        stmt, failed, user, sent = next(plan), None, None, []
        try:
            with conn.pipeline():
                conn.execute(BEGIN)
                for each in [stmt, *self.ledger.transaction_marks(self.claim, self.step)]:
                    sent.append(conn.execute(each.text, each.params))
                if query is not None:
                    user = conn.execute(query, params)
        except psycopg.Error as exc:
            failed = exc
        try:
            if len(sent) < 3:  # not even sent: the connection failed
                raise failed or psycopg.OperationalError("the transaction could not be opened")
            rows, marked, begun = (cur.fetchall() for cur in sent)
        except psycopg.Error as exc:  # the opening itself failed: the store's error
            raise self._refuse(failed or exc) from None
        if not rows or not self._marked(marked, begun):  # refused, or recorded already
            rollback(conn)  # the first statement ran in vain: roll it back, then say why
            try:
                if not rows:
                    run_plan_from(plan, rows, lambda s: _rows(conn.execute(s.text, s.params)))
                raise AlreadyRecorded
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
    ) -> None:
        super().__init__(ledger, claim, step)
        self.conn = conn

    async def open(self, query: str | None, params: Any) -> Any:
        """Send the opening (and ``query``, unless None); the cursor of ``query``."""
        self.started = True
        conn, plan = self.conn, self.ledger.transaction_fence(self.claim, self.step)
        stmt, failed, user, sent = next(plan), None, None, []
        try:
            async with conn.pipeline():
                await conn.execute(BEGIN)
                for each in [stmt, *self.ledger.transaction_marks(self.claim, self.step)]:
                    sent.append(await conn.execute(each.text, each.params))
                if query is not None:
                    user = await conn.execute(query, params)
        except psycopg.Error as exc:
            failed = exc
        try:
            if len(sent) < 3:
                raise failed or psycopg.OperationalError("the transaction could not be opened")
            rows, marked, begun = [await cur.fetchall() for cur in sent]
        except psycopg.Error as exc:
            raise self._refuse(failed or exc) from None
        if not rows or not self._marked(marked, begun):
            await rollback_async(conn)
            try:
                if not rows:
                    await run_plan_from_async(plan, rows, conn)
                raise AlreadyRecorded
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
