"""Flows: logic written once, as generators, and the two drivers that carry it out.

Everything safepoint decides — replaying a step, walking an effect through its protocol,
claiming and executing a run — is a generator ("a flow") that never performs I/O itself. It
yields requests: ``Io`` (a call on the store), ``Call`` (user code: a step function, an effect's
execute / reconcile / verify, the workflow itself) and ``Sleep``. Two drivers carry them out:

- ``drive``: plain calls, for ``def`` workflows and sync stores;
- ``adrive``: in an event loop, awaiting whatever comes back awaitable — user coroutines and
  the methods of an async store alike.

So sync and async can never drift apart: there is one body of logic and two small loops.

A flow asks the store by naming the store method itself: ``run = yield from io(Store.get_run,
run_id)``. The type checker checks the arguments against ``Store.get_run`` and types ``run``
as what it returns; ``adrive`` calls (and awaits) the async store's method of the same name, which
the store protocols keep to the same signature.

A ``Call`` may carry a ``timeout``: user code that has not returned by then is abandoned and the
flow gets ``CallTimedOut``. Plain code then runs on a daemon thread of its own (Python cannot
stop a thread, so it is left to finish or hang without holding anything up, process exit
included); a coroutine is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from types import FunctionType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from ..errors import Cancelled, DeadlineExceeded, LostOwnership, StoreError, UsageError
from . import host

if TYPE_CHECKING:
    from ..storage.base import Store

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Io:
    """A store call requested by a flow: the ``Store`` method and its arguments. Made by ``io``,
    which checks them against the method's signature."""

    method: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Call:
    """A call of user code requested by a flow; its result may be awaitable in async runs.
    With ``timeout`` (seconds), code still running by then is abandoned: ``CallTimedOut``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    timeout: float | None = None


class CallTimedOut(TimeoutError):
    """User code did not return within the time its flow gave it; it was abandoned."""


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Request = Io | Call | Sleep
# A flow that ends with a value of type R. What a driver sends back for each request is the
# request's result (``io`` types its own).
Flow = Generator[Request, Any, R]


def io(method: Callable[Concatenate[Store, P], R], /, *args: P.args, **kwargs: P.kwargs) -> Flow[R]:
    """Ask the store to call ``method`` — a ``Store`` method, named as such (``Store.get_run``)
    — with these arguments, and return what it returned: ``yield from io(Store.get_run, id)``.
    An async store's method of the same name is called instead, and awaited, by ``adrive``."""
    result: R = yield Io(method, args, kwargs)
    return result


class Haltable(Protocol):
    """What a driver stops when the ledger cannot be written (a run being executed)."""

    halted: BaseException | None


# What every store answers (sync or async): enough to tell a store from a mistake.
_STORE_METHODS = ("create_run", "get_run", "load_ledger", "claim_run")


def require_store(store: object, verb: str) -> None:
    """``UsageError`` unless ``store`` is a store: the first argument of every verb
    (``safepoint.start(store, wf, …)``). Said before anything else is checked, so that a
    forgotten or misplaced store is named as such (a workflow passed there, say)."""
    if all(callable(getattr(store, name, None)) for name in _STORE_METHODS):
        return
    given = type(store).__name__
    if hasattr(store, "fn") and hasattr(store, "version"):
        given = f"the workflow {getattr(store, 'name', '?')!r}"
    raise UsageError(
        f"safepoint.{verb} takes the store first, and got {given} there:"
        f" call safepoint.{verb}(store, …) with store = safepoint.open_store()"
        " (or open_async_store(…) in async code)",
    )


def callable_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__qualname__


def is_async_callable(fn: object) -> bool:
    """An ``async def`` function, or an object with an async ``__call__``."""
    if isinstance(fn, FunctionType):  # the usual case, asked on every step: answered once
        return _is_async_function(fn)
    call = type(fn).__call__ if callable(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


@functools.lru_cache(maxsize=4096)
def _is_async_function(fn: FunctionType) -> bool:
    return inspect.iscoroutinefunction(fn)


def _timed_out(request: Call) -> CallTimedOut:
    return CallTimedOut(f"{callable_name(request.fn)} did not return within {request.timeout:g}s")


def _on_daemon_thread(request: Call, done: Callable[[Any, BaseException | None], None]) -> None:
    """Run a call on a daemon thread of its own and hand its outcome to ``done`` (from that
    thread). A call that hangs keeps only its own thread, and never holds up process exit."""

    def body() -> None:
        try:
            value = request.fn(*request.args, **request.kwargs)
        except BaseException as exc:
            done(None, exc)
        else:
            done(value, None)

    threading.Thread(target=body, name=f"safepoint-call-{callable_name(request.fn)}", daemon=True).start()


def _call_timed(request: Call) -> Any:
    """A call with a timeout, from sync code."""
    outcome: list[tuple[Any, BaseException | None]] = []
    finished = threading.Event()

    def done(value: Any, error: BaseException | None) -> None:
        outcome.append((value, error))
        finished.set()

    _on_daemon_thread(request, done)
    assert request.timeout is not None
    if not finished.wait(request.timeout):
        raise _timed_out(request)
    value, error = outcome[0]
    if error is not None:
        raise error
    return value


async def _acall_timed(request: Call) -> Any:
    """A call with a timeout, in an event loop: a coroutine is cancelled at the timeout; plain
    code runs on a daemon thread, so that it can neither block the loop nor outlive the wait."""
    assert request.timeout is not None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + request.timeout
    if is_async_callable(request.fn):
        pending = request.fn(*request.args, **request.kwargs)
    else:
        future: asyncio.Future[Any] = loop.create_future()

        def settle(value: Any, error: BaseException | None) -> None:
            if future.done():  # abandoned at the timeout
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(value)

        def done(value: Any, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be closed by now
                loop.call_soon_threadsafe(settle, value, error)

        _on_daemon_thread(request, done)
        pending = future
    try:
        async with asyncio.timeout_at(deadline) as scope:
            value = await pending
            if inspect.isawaitable(value):  # plain code that returned a coroutine
                value = await value
            return value
    except TimeoutError:
        if scope.expired():
            raise _timed_out(request) from None
        raise  # the call's own TimeoutError


def _advance(flow: Flow[Any], send: Any, error: BaseException | None) -> tuple[bool, Any]:
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
    if (
        halt is not None
        and halt.halted is None
        and (
            isinstance(exc, (LostOwnership, Cancelled, DeadlineExceeded))
            or (isinstance(request, Io) and isinstance(exc, StoreError))
        )
    ):
        # A stale worker, too, must not run one more step function. A halt already set stays:
        # a fan-out branch refused because its sibling blocked the run, or made it wait, must
        # not turn that ending into another.
        halt.halted = exc
    return exc


# What a store method or a step function returns most often, and never awaitable: answered
# without ``inspect.isawaitable``'s checks (an abstract base class's among them) on every request.
_PLAIN = frozenset({type(None), bool, int, float, str, bytes, list, dict, tuple})


def drive(store: Any, flow: Flow[R], halt: Haltable | None = None) -> R:
    """Carry out a flow's requests synchronously."""
    try:  # many flows (a replayed step) end without a request: started here, with no call
        request = flow.send(None)
    except StopIteration as stop:
        result: R = stop.value
        return result
    while True:
        send, error = None, None
        try:  # any error is handed to the flow, which decides what it means
            if isinstance(request, Io):
                send = getattr(store, request.method.__name__)(*request.args, **request.kwargs)
                if type(send) not in _PLAIN and inspect.isawaitable(send):
                    _discard(send)
                    raise UsageError(
                        "this store is async: use it from async code"
                        " (start_async / resume_async, async def workflows)"
                    )
            elif isinstance(request, Call):
                send = (
                    request.fn(*request.args, **request.kwargs)
                    if request.timeout is None or not host.current.threads
                    else _call_timed(request)
                )
                if type(send) not in _PLAIN and inspect.isawaitable(send):
                    _discard(send)
                    raise UsageError(
                        f"{callable_name(request.fn)} returned an awaitable: call"
                        " it from an async def workflow (AsyncRun)"
                    )
            else:
                host.current.sleep(request.seconds)
        except BaseException as exc:
            error = _failed(request, exc, halt)
        finished, request = _advance(flow, send, error)
        if finished:
            result = request
            return result


async def adrive(store: Any, flow: Flow[R], halt: Haltable | None = None) -> R:
    """Carry out a flow's requests in an event loop, awaiting what comes back awaitable."""
    send: Any = None
    error: BaseException | None = None
    while True:
        finished, request = _advance(flow, send, error)
        if finished:
            result: R = request
            return result
        send, error = None, None
        try:
            if isinstance(request, Io):
                send = getattr(store, request.method.__name__)(*request.args, **request.kwargs)
            elif isinstance(request, Call):
                send = (
                    request.fn(*request.args, **request.kwargs)
                    if request.timeout is None
                    else _acall_timed(request)
                )
            else:
                send = asyncio.sleep(request.seconds)
            if inspect.isawaitable(send):
                send = await send
        except BaseException as exc:
            error = _failed(request, exc, halt)


def _discard(awaitable: Any) -> None:
    if inspect.iscoroutine(awaitable):
        awaitable.close()  # never awaited: close it so Python does not warn
