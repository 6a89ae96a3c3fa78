"""Store operations that only run their plan, declared in one line each.

Most of ``PostgresStore``'s and ``AsyncPostgresStore``'s operations do nothing but run the plan
``PostgresLedger`` has for them (``ledger``), on the store's executor: ``_read`` for a read (run
again on a fresh connection when the server ended the session under it), ``_run`` for a write,
atomic or not, then ``warn`` of the history warning the plan returns, for the writes that can
cross the history's soft limit. Each such operation is one line of its store's class::

    get_run = reading(PostgresLedger.get_run)
    record_step = writing(PostgresLedger.record_step, atomic=False, warns=True)

(``async_reading``, ``async_writing`` in ``AsyncPostgresStore``). The descriptor takes the
parameters of the plan method (``ParamSpec``), so mypy checks every call of the operation, and
the store's conformance to ``Store`` / ``AsyncStore``, as it did the methods written out.

``warns=True``: the plan returns the warning (``HistoryWarning | None``; the operation returns
``None``) or a pair ``(value, warning)`` (the operation returns ``value``). ``warn`` is called
from the descriptor's own frame, the one the method's was, so its ``stacklevel`` still names the
store's caller.

An operation that does more than run one plan (the clock, a transaction with the user's body,
``mark_dispatching``'s second plan, ``prune_runs``'s dry run, waiting for work) stays a method.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from functools import partial
from types import MethodType
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload

from ..._rules.history import warn
from ...errors import HistoryWarning
from ..plans import Plan
from .ledger import PostgresLedger

__all__ = ["AsyncOperation", "Operation", "async_reading", "async_writing", "reading", "writing"]

P = ParamSpec("P")
T = TypeVar("T")
# A plan of the ledger: ``PostgresLedger.get_run``, or a function that takes the ledger first.
PlanMethod = Callable[..., Plan[Any]]


class _Declared(Generic[P, T]):
    """What both descriptors hold: the plan method and how its plan is run."""

    __slots__ = ("atomic", "name", "plan", "read", "warns")

    def __init__(self, plan: PlanMethod, *, read: bool, atomic: bool, warns: bool) -> None:
        self.plan, self.read, self.atomic, self.warns = plan, read, atomic, warns
        self.name: str = getattr(plan, "__name__", "operation")

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        kind = "read" if self.read else "write"
        return f"<{type(self).__name__} {self.name}: {kind}, atomic={self.atomic}, warns={self.warns}>"


class Operation(_Declared[P, T]):
    """A sync store's operation (``reading``, ``writing``): ``store.op(...)`` runs the plan."""

    __slots__ = ()

    @overload
    def __get__(self, store: None, owner: type) -> Operation[P, T]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[P, T]: ...
    def __get__(self, store: object, owner: type | None = None) -> Any:
        return self if store is None else MethodType(self, store)

    def __call__(self, store: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.read:
            return store._read(partial(self.plan, store._ledger, *args, **kwargs), atomic=self.atomic)
        done = store._run(self.plan(store._ledger, *args, **kwargs), atomic=self.atomic)
        if not self.warns:
            return done
        if isinstance(done, tuple):  # (value, warning)
            value, due = done
            warn(due)
            return value
        warn(done)
        return None


class AsyncOperation(_Declared[P, T]):
    """An async store's operation (``async_reading``, ``async_writing``): ``await store.op(...)``
    runs the plan."""

    __slots__ = ()

    @overload
    def __get__(self, store: None, owner: type) -> AsyncOperation[P, T]: ...
    @overload
    def __get__(self, store: object, owner: type | None = None) -> Callable[P, Coroutine[Any, Any, T]]: ...
    def __get__(self, store: object, owner: type | None = None) -> Any:
        return self if store is None else MethodType(self, store)

    async def __call__(self, store: Any, /, *args: Any, **kwargs: Any) -> Any:
        if self.read:
            return await store._read(partial(self.plan, store._ledger, *args, **kwargs), atomic=self.atomic)
        done = await store._run(self.plan(store._ledger, *args, **kwargs), atomic=self.atomic)
        if not self.warns:
            return done
        if isinstance(done, tuple):  # (value, warning)
            value, due = done
            warn(due)
            return value
        warn(done)
        return None


# -- the declarations ----------------------------------------------------------------------------


def reading(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]], *, atomic: bool = False
) -> Operation[P, T]:
    """A read: ``store._read`` (read again on a lost connection); ``atomic=True``: several
    statements that must see one snapshot."""
    return Operation(plan, read=True, atomic=atomic, warns=False)


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
def writing(plan: PlanMethod, *, atomic: bool = True, warns: bool = False) -> Operation[Any, Any]:
    """A write: ``store._run``, in one transaction unless ``atomic=False`` (every statement of
    the plan stands on its own); ``warns``: the history warning the plan returns is warned."""
    return Operation(plan, read=False, atomic=atomic, warns=warns)


def async_reading(
    plan: Callable[Concatenate[PostgresLedger, P], Plan[T]], *, atomic: bool = False
) -> AsyncOperation[P, T]:
    """``reading`` for ``AsyncPostgresStore``."""
    return AsyncOperation(plan, read=True, atomic=atomic, warns=False)


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
def async_writing(plan: PlanMethod, *, atomic: bool = True, warns: bool = False) -> AsyncOperation[Any, Any]:
    """``writing`` for ``AsyncPostgresStore``."""
    return AsyncOperation(plan, read=False, atomic=atomic, warns=warns)
