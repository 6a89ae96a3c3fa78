"""Flows: logic written once, as generators, and the two drivers that carry it out.

Everything safepoint decides — replaying a step, walking an effect through its protocol,
claiming and executing a run — is a generator ("a flow") that never performs I/O itself. It
yields requests: ``Io`` (a call on the store), ``Call`` (user code: a step function, an effect's
execute / reconcile / verify, the workflow itself) and ``Sleep``. Two drivers carry them out:

- ``drive``: plain calls, for ``def`` workflows and sync stores;
- ``adrive``: in an event loop, awaiting whatever comes back awaitable — user coroutines and
  the methods of an async store alike.

So sync and async can never drift apart: there is one body of logic and two small loops.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import Cancelled, DeadlineExceeded, LostOwnership, StoreError, UsageError


@dataclass(frozen=True, slots=True)
class Io:
    """A store call requested by a flow."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Call:
    """A call of user code requested by a flow; its result may be awaitable in async runs."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Flow = Generator[Io | Call | Sleep, Any, Any]


class Haltable(Protocol):
    """What a driver stops when the ledger cannot be written (a run being executed)."""

    halted: BaseException | None


def callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def _advance(flow: Flow, send: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Resume a flow with the last request's result (or error): (finished, request or value)."""
    try:
        return False, (flow.throw(error) if error is not None else flow.send(send))
    except StopIteration as stop:
        return True, stop.value


def _failed(request: Io | Call | Sleep, exc: BaseException, halt: Haltable | None) -> BaseException:
    """A ledger write that failed (the database went away), or a fence found stale, stops the
    run here: agent code that catches everything must not carry on with a step the ledger never
    heard of. The run stays as the store last saw it, for this or another worker to resume.
    A store that refuses new work (a cancel asked for, the deadline passed) stops it too."""
    if halt is not None and (isinstance(exc, (LostOwnership, Cancelled, DeadlineExceeded))
                             or (isinstance(request, Io) and isinstance(exc, StoreError))):
        halt.halted = exc  # a stale worker, too, must not run one more step function
    return exc


def drive(store: Any, flow: Flow, halt: Haltable | None = None) -> Any:
    """Carry out a flow's requests synchronously."""
    send: Any = None
    error: BaseException | None = None
    while True:
        finished, request = _advance(flow, send, error)
        if finished:
            return request
        send, error = None, None
        try:  # any error is handed to the flow, which decides what it means
            if isinstance(request, Io):
                send = getattr(store, request.method)(*request.args, **request.kwargs)
                if inspect.isawaitable(send):
                    _discard(send)
                    raise UsageError("this store is async: use it from async code"
                                     " (start_async / resume_async, async def workflows)")
            elif isinstance(request, Call):
                send = request.fn(*request.args, **request.kwargs)
                if inspect.isawaitable(send):
                    _discard(send)
                    raise UsageError(f"{callable_name(request.fn)} returned an awaitable: call"
                                     " it from an async def workflow (AsyncRun)")
            else:
                time.sleep(request.seconds)
        except BaseException as exc:
            error = _failed(request, exc, halt)


async def adrive(store: Any, flow: Flow, halt: Haltable | None = None) -> Any:
    """Carry out a flow's requests in an event loop, awaiting what comes back awaitable."""
    send: Any = None
    error: BaseException | None = None
    while True:
        finished, request = _advance(flow, send, error)
        if finished:
            return request
        send, error = None, None
        try:
            if isinstance(request, Io):
                send = getattr(store, request.method)(*request.args, **request.kwargs)
            elif isinstance(request, Call):
                send = request.fn(*request.args, **request.kwargs)
            else:
                send = asyncio.sleep(request.seconds)
            if inspect.isawaitable(send):
                send = await send
        except BaseException as exc:
            error = _failed(request, exc, halt)


def _discard(awaitable: Any) -> None:
    if inspect.iscoroutine(awaitable):
        awaitable.close()  # never awaited: close it so Python does not warn
