"""``current_run()``: the run whose workflow function is executing here; ``current_effect_key()``:
the key of the effect whose ``execute`` is running.

Integrations and the user's own helpers deep in an agent loop need the run to record a step,
and threading it through every call is noise. So the run's lifecycle sets a context variable
around the workflow function, and each fan-out branch sets its own branch's run (a branch runs
on a thread of the pool, or in a task of its own, which do not see the caller's value as theirs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..errors import UsageError
from .flow import is_async_callable

_CURRENT: ContextVar[Any] = ContextVar("safepoint.current_run", default=None)


def current_run() -> Any:
    """The ``Run`` (or ``AsyncRun``) of the workflow function executing in this context — inside
    a fan-out branch, the branch's run. Outside a workflow function it raises ``UsageError``.

    >>> def lookup(order_id: str) -> dict:   # a helper that need not be given the run
    ...     return safepoint.current_run().read("order", fetch_order, order_id)
    """
    run = _CURRENT.get()
    if run is None:
        raise UsageError(
            "current_run() was called outside a workflow function: call it from the workflow"
            " (or code it calls, in its thread or task), or pass the run explicitly"
        )
    return run


@contextmanager
def running(run: Any) -> Iterator[None]:
    """``run`` is the current run inside the block."""
    previous = _CURRENT.get()
    _CURRENT.set(run)
    try:
        yield
    finally:
        _CURRENT.set(previous)  # not reset(): a flow may end in another context than it began


_EFFECT_KEY: ContextVar[Any] = ContextVar("safepoint.current_effect_key", default=None)


def current_effect_key() -> Any:
    """The ``EffectKey`` of the effect whose ``execute`` is running in this context: for code an
    effect calls that was not written to take the key — a framework's tool function, a client
    deep in a helper — so that it can still send ``str(key)`` to the owner as the idempotency
    key. Outside an effect's ``execute`` it raises ``UsageError``.

    >>> def create_ticket(title: str) -> dict:       # a tool a framework calls with its arguments
    ...     key = safepoint.current_effect_key()
    ...     return tracker.create(title, idempotency_key=str(key))
    """
    key = _EFFECT_KEY.get()
    if key is None:
        raise UsageError(
            "current_effect_key() was called outside an effect's execute: call it from code that"
            " an effect's execute runs (its thread or task), where the key is the operation's"
        )
    return key


def keyed(execute: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """``execute(payload, key)`` with ``key`` as the current effect key while it runs (an async
    execute: while its coroutine runs, not only while it is made)."""
    if is_async_callable(execute):

        async def run_async(payload: Any, key: Any) -> Any:
            token = _EFFECT_KEY.set(key)
            try:
                return await execute(payload, key)
            finally:
                _EFFECT_KEY.reset(token)

        return run_async

    def run(payload: Any, key: Any) -> Any:
        token = _EFFECT_KEY.set(key)
        try:
            return execute(payload, key)
        finally:
            _EFFECT_KEY.reset(token)

    return run


_TRANSACTION: ContextVar[str | None] = ContextVar("safepoint.transaction_step", default=None)


@contextmanager
def transacting(step_id: str) -> Iterator[None]:
    """The function of transaction step ``step_id`` is running inside the block."""
    token = _TRANSACTION.set(step_id)
    try:
        yield
    finally:
        _TRANSACTION.reset(token)


def refuse_inside_transaction(step_id: str) -> None:
    """``UsageError`` for a step started inside a transaction step's function: its write would
    wait for the transaction holding the run (or run inside it), and replay could not tell the
    two apart."""
    inside = _TRANSACTION.get()
    if inside is not None:
        raise UsageError(
            f"step {step_id!r} was called inside the function of transaction step {inside!r}:"
            " a transaction step's function only runs statements on the connection it is"
            " given — call other steps before or after it",
            step_id=step_id,
        )
