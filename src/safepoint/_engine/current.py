"""``current_run()``: the run whose workflow function is executing here.

Integrations and the user's own helpers deep in an agent loop need the run to record a step,
and threading it through every call is noise. So the run's lifecycle sets a context variable
around the workflow function, and each fan-out branch sets its own branch's run (a branch runs
on a thread of the pool, or in a task of its own, which do not see the caller's value as theirs).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from ..errors import UsageError

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
