"""What every store's transaction step shares: the connection a step's function is handed
(``StepConnection``, one subclass per driver), and how the function's own failure is told
apart from the store's.

A store's ``record_transaction`` opens one transaction, checks the claim's fence first (so a
stale worker's function never commits anything), calls the function with a ``StepConnection``
bound to that transaction, records the step with the function's value and commits once. The
connection refuses what would end the transaction under the step (``_rules.transactions``) and
is unbound once the step ends, so a reference the function kept cannot write outside it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal

from .._rules.transactions import misused, transaction_control
from ..errors import UsageError
from ..types import JSON, Params

__all__ = ["FunctionFailed", "StepConnection", "call_function", "call_function_async", "plain_value"]


class FunctionFailed(Exception):
    """What the step's function raised, carried past the store's translation of driver
    errors: an ``IntegrityError`` of the user's own INSERT is the step's failure, not the
    store's. The store raises ``error`` itself once the transaction rolled back."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


class StepConnection:
    """The base of the connection a transaction step's function gets (``types.Transaction``)."""

    dialect: Literal["sqlite", "postgres"]

    def __init__(self, step_id: str) -> None:
        self.step_id = step_id
        self.misuse: str | None = None  # what the function did to the transaction, if anything
        self._bound = True

    def _checked(self, query: str) -> str:
        """``query``, unless it would end the step's transaction (or the step is over)."""
        if not self._bound:
            raise UsageError(
                f"transaction step {self.step_id!r} is over: its connection cannot be used"
                " after the function returned (keep no reference to it)",
                step_id=self.step_id,
            )
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

    def _misused(self, what: str) -> UsageError:
        self.misuse = what
        return misused(self.step_id, what)

    def refusal(self) -> UsageError | None:
        """The error for what the function did to the transaction (it may have swallowed it)."""
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
    or ``FunctionFailed`` carrying what it raised (or the misuse it swallowed)."""
    try:
        value = plain_value(body(tx), tx.step_id)
    except BaseException as exc:
        raise FunctionFailed(exc) from exc
    finally:
        tx.unbind()
    return _unless_misused(tx, value)


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
    return _unless_misused(tx, value)


def _unless_misused(tx: StepConnection, value: Any) -> JSON:
    refused = tx.refusal()
    if refused is not None:  # refused, and swallowed by the function
        raise FunctionFailed(refused)
    result: JSON = value
    return result
