"""Store operations that only run their plan, declared in one line each.

Most of ``PostgresStore``'s and ``AsyncPostgresStore``'s operations do nothing but run the plan
``PostgresLedger`` has for them (``ledger``), on the store's executor: ``_read`` for a read (run
again on a fresh connection when the server ended the session under it), ``_run`` for a write,
atomic or not, then ``warn`` of the history warning the plan returns, for the writes that can
cross the history's soft limit. Each such operation is one line of its store's class::

    get_run = reading(PostgresLedger.get_run)
    record_step = writing(PostgresLedger.record_step, atomic=False, warns=True)

(``async_reading``, ``async_writing`` in ``AsyncPostgresStore``). The declaration takes the
parameters of the plan method (``ParamSpec``), so mypy checks every call of the operation, and
the store's conformance to ``Store`` / ``AsyncStore``, as it did the methods written out.

``warns=True``: the plan returns the warning (``HistoryWarning | None``; the operation returns
``None``) or a pair ``(value, warning)`` (the operation returns ``value``).

At run time each is a plain function (``async def`` for the async store), bound as any method
is, with the plan's signature (``__wrapped__``: ``inspect.signature`` shows the plan's
parameters) and ``warn`` called from its own frame, the one the method's was, so the warning's
``stacklevel`` still names the store's caller. For mypy it is an ``Operation``: a descriptor
whose ``__get__`` gives ``Callable[P, T]`` (``Callable[P, Coroutine[..., T]]``), ``P`` the
plan's parameters after the ledger.

An operation that does more than run one plan (the clock, a transaction with the user's body,
``mark_dispatching``'s second plan, ``prune_runs``'s dry run, waiting for work), or whose
plan takes more than the operation (``finish_run``'s ``detail``, ``reseal_page``'s options),
stays a method.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial, update_wrapper
from typing import Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, cast, overload

from ..._rules.history import warn
from ...errors import HistoryWarning
from ..plans import Plan
from .ledger import PostgresLedger

__all__ = ["AsyncOperation", "Operation", "async_reading", "async_writing", "reading", "writing"]

P = ParamSpec("P")
T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
# A plan of the ledger: ``PostgresLedger.get_run``, or a function that takes the ledger first.
PlanMethod = Callable[..., Plan[Any]]


class Operation(Protocol[P, T_co]):
    """A sync store's operation, as mypy sees it: ``store.op(*P) -> T``."""

    @overload
    def __get__(self, store: None, owner: type, /) -> Callable[Concatenate[Any, P], T_co]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None, /) -> Callable[P, T_co]: ...


class AsyncOperation(Protocol[P, T_co]):
    """An async store's operation, as mypy sees it: ``await store.op(*P) -> T``."""

    @overload
    def __get__(
        self, store: None, owner: type, /
    ) -> Callable[Concatenate[Any, P], Coroutine[Any, Any, T_co]]: ...
    @overload
    def __get__(
        self, store: object, owner: type | None = None, /
    ) -> Callable[P, Coroutine[Any, Any, T_co]]: ...


def _declared(operation: Callable[..., Any], plan: PlanMethod) -> Any:
    """``operation`` named, documented and signed as ``plan`` (whose first parameter, the
    ledger, stands for the store's ``self``)."""
    update_wrapper(operation, plan, assigned=("__name__", "__doc__"))
    return operation


def reading(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]], *, atomic: bool = False
) -> Operation[P, T]:
    """A read: ``store._read`` (read again on a lost connection); ``atomic=True``: several
    statements that must see one snapshot."""

    def read(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        return store._read(partial(plan, store._ledger, *args, **kwargs), atomic=atomic)

    return cast(Operation[P, T], _declared(read, plan))


@overload
def writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[HistoryWarning | None]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> Operation[P, None]: ...
@overload
def writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[tuple[T, HistoryWarning | None]]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> Operation[P, T]: ...
@overload
def writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]],
    *,
    atomic: bool = True,
    warns: Literal[False] = False,
) -> Operation[P, T]: ...
def writing(plan: PlanMethod, *, atomic: bool = True, warns: bool = False) -> Any:
    """A write: ``store._run``, in one transaction unless ``atomic=False`` (every statement of
    the plan stands on its own); ``warns``: the history warning the plan returns is warned."""

    def write(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        return store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)

    def write_and_warn(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        done = store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)
        if isinstance(done, tuple):  # (value, warning)
            value, due = done
            warn(due)
            return value
        warn(done)
        return None

    return _declared(write_and_warn if warns else write, plan)


def async_reading(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]], *, atomic: bool = False
) -> AsyncOperation[P, T]:
    """``reading`` for ``AsyncPostgresStore``."""

    async def read(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await store._read(partial(plan, store._ledger, *args, **kwargs), atomic=atomic)

    return cast(AsyncOperation[P, T], _declared(read, plan))


@overload
def async_writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[HistoryWarning | None]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> AsyncOperation[P, None]: ...
@overload
def async_writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[tuple[T, HistoryWarning | None]]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> AsyncOperation[P, T]: ...
@overload
def async_writing(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]],
    *,
    atomic: bool = True,
    warns: Literal[False] = False,
) -> AsyncOperation[P, T]: ...
def async_writing(plan: PlanMethod, *, atomic: bool = True, warns: bool = False) -> Any:
    """``writing`` for ``AsyncPostgresStore``."""

    async def write(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)

    async def write_and_warn(store: Any, /, *args: Any, **kwargs: Any) -> Any:
        done = await store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)
        if isinstance(done, tuple):  # (value, warning)
            value, due = done
            warn(due)
            return value
        warn(done)
        return None

    return _declared(write_and_warn if warns else write, plan)
