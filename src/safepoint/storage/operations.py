"""Store operations that only run their plan: declared once, in one line, for every store.

Most operations of a store do nothing but run the plan the storage layer has for them — a
shared one (``ledger.LedgerReads``, ``forks``, ``resealing`` …: every store's) or a dialect's
(``postgres.ledger.PostgresLedger``: both PostgreSQL stores') — on the store's executor:
``_read`` for a read (run again on a fresh connection when the server ended the session under
it), ``_run`` for a write, atomic or not, then ``warn`` of the history warning the plan returns,
for the writes that can cross the history's soft limit. Each such operation is one line of a
class of operations, which every store that runs those plans inherits::

    class LedgerOperations:
        get_run = reading(LedgerReads.get_run)
        fork_run = writing(forks.fork_run)
    class PostgresOperations(LedgerOperations):
        record_step = writing(PostgresLedger.record_step, atomic=False, warns=True)

A store is a ``PlanRunner``: a sync one (``SqliteStore``, ``PostgresStore``) or an async one
(``AsyncPostgresStore``, ``asynchronous = True``), with ``_ledger`` (what the plans take first),
``_run(plan, atomic=…)`` and ``_read(make_plan, atomic=…)``. When its class is made, every
operation it inherits becomes a plain method of it (``def``, or ``async def`` for an async
store) with the plan's name, documentation and signature (``__wrapped__``), and ``warn`` called
from that method's own frame, so a warning's ``stacklevel`` names the store's caller.

For mypy an operation is an ``Operation[P, T]``: a descriptor whose ``__get__`` gives
``Callable[P, T]`` on a sync store and ``Callable[P, Coroutine[..., T]]`` on an async one, ``P``
the plan's parameters after the ledger — so mypy checks every call of the operation, and each
store's conformance to ``Store`` / ``AsyncStore``, as it did methods written out.

``warns=True``: the plan returns the warning (``HistoryWarning | None``; the operation returns
``None``) or a pair ``(value, warning)`` (the operation returns ``value``).

An operation that does more than run one plan (the clock, a transaction with the user's body,
``mark_dispatching``'s second plan, ``prune_runs``'s dry run, waiting for work), or whose plan
takes more than the operation, stays a method of its store.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from functools import cached_property, partial, update_wrapper
from typing import Any, ClassVar, Concatenate, Generic, Literal, ParamSpec, Protocol, TypeVar, overload
from weakref import WeakKeyDictionary

from .._rules.history import warn
from ..errors import HistoryWarning
from .plans import Plan

__all__ = ["AsyncPlanRunner", "Operation", "PlanRunner", "reading", "writing"]

P = ParamSpec("P")
T = TypeVar("T")
PlanFunction = Callable[..., Plan[Any]]  # a plan that takes the store's ledger first


class _Sync(Protocol):
    asynchronous: ClassVar[Literal[False]]


class _Async(Protocol):
    asynchronous: ClassVar[Literal[True]]


class Operation(Generic[P, T]):
    """One store operation: run ``plan`` (given the store's ledger first) on the store's
    executor. Becomes a plain method of each store class that inherits it (``PlanRunner``)."""

    def __init__(self, plan: PlanFunction, *, write: bool, atomic: bool, warns: bool) -> None:
        self.plan, self.write, self.atomic, self.warns = plan, write, atomic, warns

    @overload
    def __get__(self, store: None, owner: type, /) -> Callable[Concatenate[Any, P], Any]: ...
    @overload
    def __get__(self, store: _Async, owner: type | None = None, /) -> Callable[P, Coroutine[Any, Any, T]]: ...
    @overload
    def __get__(self, store: _Sync, owner: type | None = None, /) -> Callable[P, T]: ...
    def __get__(self, store: Any, owner: type | None = None, /) -> Any:
        # only reached on a class that is not a PlanRunner (the classes of operations)
        return self

    def method(self, asynchronous: bool) -> Callable[..., Any]:
        """The operation as a plain method of a sync or an async store."""
        plan, atomic = self.plan, self.atomic
        if not self.write:
            if asynchronous:

                async def read_async(store: Any, /, *args: Any, **kwargs: Any) -> Any:
                    return await store._read(partial(plan, store._ledger, *args, **kwargs), atomic=atomic)

                return self._declared(read_async)

            def read(store: Any, /, *args: Any, **kwargs: Any) -> Any:
                return store._read(partial(plan, store._ledger, *args, **kwargs), atomic=atomic)

            return self._declared(read)
        if asynchronous:

            async def write_async(store: Any, /, *args: Any, **kwargs: Any) -> Any:
                return await store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)

            async def write_and_warn_async(store: Any, /, *args: Any, **kwargs: Any) -> Any:
                done = await store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)
                value, due = done if isinstance(done, tuple) else (None, done)
                warn(due)  # from this frame, as the sync store's
                return value

            return self._declared(write_and_warn_async if self.warns else write_async)

        def write(store: Any, /, *args: Any, **kwargs: Any) -> Any:
            return store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)

        def write_and_warn(store: Any, /, *args: Any, **kwargs: Any) -> Any:
            done = store._run(plan(store._ledger, *args, **kwargs), atomic=atomic)
            value, due = done if isinstance(done, tuple) else (None, done)
            warn(due)  # from this frame: the warning names the store's caller
            return value

        return self._declared(write_and_warn if self.warns else write)

    def _declared(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` named, documented and signed as the plan (whose first parameter, the
        ledger, stands for the store's ``self``), and known as this operation's."""
        update_wrapper(method, self.plan, assigned=("__name__", "__doc__"))
        method.__signature__ = self.signature  # type: ignore[attr-defined]
        _MADE[method] = self
        return method

    @cached_property
    def signature(self) -> inspect.Signature:
        """The plan's parameters, its first — the ledger — named as the store's ``self``."""
        signature = inspect.signature(self.plan)
        ledger, *rest = signature.parameters.values()
        return signature.replace(parameters=[ledger.replace(name="self"), *rest])


# The methods made of operations, and the operation each was made of: a class below a store
# gets its own, while a method written out (even one wrapping a made one, which copies its
# attributes) stays as written.
_MADE: WeakKeyDictionary[Callable[..., Any], Operation[Any, Any]] = WeakKeyDictionary()


class _Runner:
    """A store that runs plans: every ``Operation`` its class inherits becomes its method."""

    asynchronous: ClassVar[bool]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = {
            name for klass in cls.__mro__ for name, v in vars(klass).items() if isinstance(v, Operation)
        }
        for name in declared:
            # what the class would have under that name: an operation (or one made a method of
            # a store class above) becomes this class's; a method written out stays
            found = next(vars(klass)[name] for klass in cls.__mro__ if name in vars(klass))
            operation = found if isinstance(found, Operation) else _MADE.get(found)
            if operation is not None:
                setattr(cls, name, operation.method(cls.asynchronous))


class PlanRunner(_Runner):
    """A sync store that runs plans (``SqliteStore``, ``PostgresStore``)."""

    asynchronous: ClassVar[Literal[False]] = False


class AsyncPlanRunner(_Runner):
    """An async store that runs plans (``AsyncPostgresStore``)."""

    asynchronous: ClassVar[Literal[True]] = True


def reading(plan: Callable[Concatenate[Any, P], Plan[T]], *, atomic: bool = False) -> Operation[P, T]:
    """A read: ``store._read`` (read again on a lost connection); ``atomic=True``: several
    statements that must see one snapshot."""
    return Operation(plan, write=False, atomic=atomic, warns=False)


@overload
def writing(
    plan: Callable[Concatenate[Any, P], Plan[HistoryWarning | None]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> Operation[P, None]: ...
@overload
def writing(
    plan: Callable[Concatenate[Any, P], Plan[tuple[T, HistoryWarning | None]]],
    *,
    atomic: bool = True,
    warns: Literal[True],
) -> Operation[P, T]: ...
@overload
def writing(
    plan: Callable[Concatenate[Any, P], Plan[T]],
    *,
    atomic: bool = True,
    warns: Literal[False] = False,
) -> Operation[P, T]: ...
def writing(plan: PlanFunction, *, atomic: bool = True, warns: bool = False) -> Operation[Any, Any]:
    """A write: ``store._run``, in one transaction unless ``atomic=False`` (every statement of
    the plan stands on its own); ``warns``: the history warning the plan returns is warned."""
    return Operation(plan, write=True, atomic=atomic, warns=warns)
