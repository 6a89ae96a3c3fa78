"""What every store's transaction step shares: the connection a step's function is handed
(``StepConnection``, one subclass per driver), the rows its statements return, and how the
function's own failure is told apart from the store's.

A store's ``record_transaction`` opens one transaction, checks the claim's fence first (so a
stale worker's function never commits anything), records the step as uncertain in it (see
``_rules.transactions``), calls the function with a ``StepConnection`` bound to that
transaction, checks that the transaction is still the one it opened, records the step with the
function's value and commits once.

The function gets no more of the driver than its statements need: ``execute`` and
``executemany``, and rows to read back (``Rows``: no way from them to the connection, whose
``commit`` would end the step's transaction). A library that needs a DB-API connection of its
own (an ORM session, a dataframe's ``to_sql``) asks for it by name, ``driver_connection()`` —
what it does then is the function's, and a commit it makes is found after the function
(``TransactionUncertain``), not prevented. The connection refuses statements that would end the
transaction (the first line, ``_rules.transactions``) and is unbound once the step ends, so a
reference the function kept cannot write outside it.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from .._rules.transactions import misused, transaction_control
from ..errors import TransactionUncertain, UsageError
from ..types import JSON, Params

__all__ = [
    "AlreadyRecorded",
    "AsyncRows",
    "FunctionFailed",
    "Rows",
    "StepConnection",
    "call_function",
    "call_function_async",
    "plain_value",
]


class FunctionFailed(Exception):
    """What the step's function raised, carried past the store's translation of driver
    errors: an ``IntegrityError`` of the user's own INSERT is the step's failure, not the
    store's. The store raises ``error`` itself once the transaction rolled back."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class AlreadyRecorded(Exception):
    """The step is recorded already — by an earlier attempt of this worker whose commit it never
    heard back about, or as uncertain: the store returns that record instead of calling the
    function again."""


class Rows:
    """What a statement of a transaction step returns: its rows (``fetchone``, ``fetchall``,
    ``fetchmany``, iteration; by column name on both stores), ``rowcount``, ``description``
    and ``lastrowid`` (SQLite) — the driver's cursor without its way to the connection."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor

    def fetchone(self) -> Any:
        """The next row, or None."""
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        """Every row left."""
        rows: list[Any] = self._cursor.fetchall()
        return rows

    def fetchmany(self, size: int = 100) -> list[Any]:
        """Up to ``size`` of the rows left."""
        rows: list[Any] = self._cursor.fetchmany(size)
        return rows

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    @property
    def rowcount(self) -> int:
        """The rows the statement changed (or -1 when the driver cannot say)."""
        count: int = self._cursor.rowcount
        return count

    @property
    def description(self) -> Any:
        """The columns of the rows (None for a statement that returns none)."""
        return self._cursor.description

    @property
    def lastrowid(self) -> Any:
        """SQLite: the rowid of the row an INSERT made last (None on PostgreSQL)."""
        return getattr(self._cursor, "lastrowid", None)


class AsyncRows(Rows):
    """``Rows`` on an async store: ``await rows.fetchone()``, ``async for row in rows``."""

    __slots__ = ()

    async def fetchone(self) -> Any:
        """The next row, or None."""
        return await self._cursor.fetchone()

    async def fetchall(self) -> list[Any]:  # type: ignore[override]
        """Every row left."""
        rows: list[Any] = await self._cursor.fetchall()
        return rows

    async def fetchmany(self, size: int = 100) -> list[Any]:  # type: ignore[override]
        """Up to ``size`` of the rows left."""
        rows: list[Any] = await self._cursor.fetchmany(size)
        return rows

    def __iter__(self) -> Iterator[Any]:
        raise TypeError("the rows of an async store's statement are read with `async for`")

    def __aiter__(self) -> AsyncIterator[Any]:
        iterator: AsyncIterator[Any] = self._cursor.__aiter__()
        return iterator


class StepConnection:
    """The base of the connection a transaction step's function gets (``types.Transaction``)."""

    dialect: Literal["sqlite", "postgres"]

    def __init__(self, step_id: str) -> None:
        self.step_id = step_id
        self.misuse: str | None = None  # what the function did to the transaction, if anything
        self._bound = True

    def _checked(self, query: str) -> str:
        """``query``, unless it would end the step's transaction (or the step is over)."""
        self._check_bound()
        if not isinstance(query, str):
            raise UsageError(
                f"transaction step {self.step_id!r}: execute takes the statement as a str,"
                f" got {type(query).__name__}",
                step_id=self.step_id,
            )
        word = transaction_control(query)
        if word is not None:
            raise self._misused(f"sent {word}")
        return query

    def _check_bound(self) -> None:
        if not self._bound:
            raise UsageError(
                f"transaction step {self.step_id!r} is over: its connection cannot be used"
                " after the function returned (keep no reference to it)",
                step_id=self.step_id,
            )

    def _misused(self, what: str) -> UsageError:
        self.misuse = what
        return misused(self.step_id, what)

    def refusal(self) -> UsageError | None:
        """The error for what the function did to the transaction (it may have swallowed it).
        Raised only once the store found the step's transaction still the one open."""
        return None if self.misuse is None else misused(self.step_id, self.misuse)

    def unbind(self) -> None:
        self._bound = False

    def commit(self) -> None:
        """Refused: the step's transaction commits with the step record."""
        raise self._misused("called commit()")

    def rollback(self) -> None:
        """Refused: raise from the function to roll the step's transaction back."""
        raise self._misused("called rollback()")

    def close(self) -> None:
        """Refused: the connection is the store's."""
        raise self._misused("called close()")

    @staticmethod
    def params_of(params: Params) -> Sequence[Any] | dict[str, Any]:
        return () if params is None else params if isinstance(params, Sequence) else dict(params)


def uncertain(run_id: str, step_id: str, how: str) -> TransactionUncertain:
    """The error of a step whose transaction its function ended: it may have committed."""
    return TransactionUncertain(run_id, step_id, how)


def plain_value(value: Any, step_id: str) -> JSON:
    """The function's value on a sync store: an awaitable is a mistake (an ``async def``
    function handed to a store that cannot await it)."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()  # never awaited: closed so that Python does not warn
        raise UsageError(
            f"transaction step {step_id!r}: its function returned an awaitable; this store"
            " runs the step's transaction synchronously — pass a plain def function (an"
            " async function needs AsyncPostgresStore)",
            step_id=step_id,
        )
    result: JSON = value
    return result


def call_function(body: Callable[[Any], Any], tx: StepConnection) -> JSON:
    """Call the step's function with its connection, inside the store's transaction: its value,
    or ``FunctionFailed`` carrying what it raised. The store then checks that the transaction
    is still the one it opened, and only then for a misuse the function swallowed
    (``refusal``)."""
    try:
        return plain_value(body(tx), tx.step_id)
    except BaseException as exc:
        raise FunctionFailed(exc) from exc
    finally:
        tx.unbind()


async def call_function_async(body: Callable[[Any], Any], tx: StepConnection) -> JSON:
    """``call_function`` on an async store: the function's value awaited when it is awaitable."""
    try:
        value = body(tx)
        if inspect.isawaitable(value):
            value = await value
    except BaseException as exc:
        raise FunctionFailed(exc) from exc
    finally:
        tx.unbind()
    result: JSON = value
    return result
