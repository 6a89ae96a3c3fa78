"""One call of a transaction step's function, inside the store's transaction (the step's
flow is ``transactions``; ``RunCore.call_step`` makes the attempts)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .._rules.canonical import require_json
from .._rules.secrets import refuse_secrets
from ..storage.base import Store
from ..types import Claim, StepRecord
from .crashpoints import crashpoint
from .current import transacting
from .flow import Flow, io, is_async_callable

R = TypeVar("R")


class _Core(Protocol):
    """What an attempt needs of the run core (``RunCore``)."""

    claim: Claim
    steps: dict[str, StepRecord]

    def flush(self) -> Flow[None]: ...

    def append_new(self, request: Flow[R], sid: str) -> Flow[R]: ...


class TransactionAttempt:
    """One call of a transaction step's function, in the store's transaction: tells the
    function's own failure (the step's) from the store's (the run's)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.failed: BaseException | None = None  # what the function raised, if it did

    def raised(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the function's failure (as raised, or as the store translated it:
        a transaction the database rolled back is a ``TransientFailure`` caused by it)."""
        return self.failed is not None and (exc is self.failed or exc.__cause__ is self.failed)

    def body(self, sid: str) -> Callable[[Any], Any]:
        """What the store calls with the step's connection: the function, its result checked
        (JSON, no credential) inside the transaction, so a refused result commits nothing."""

        def checked(value: Any) -> Any:
            require_json(value, "result", sid)
            refuse_secrets(value, "the result", sid)
            crashpoint("transaction.before_commit", sid)
            return value

        if is_async_callable(self.fn):

            async def body_async(tx: Any) -> Any:
                with transacting(sid):
                    try:
                        value = await self.fn(tx, *self.args, **self.kwargs)
                    except BaseException as exc:
                        self.failed = exc
                        raise
                return checked(value)

            return body_async

        async def awaited(pending: Any) -> Any:
            with transacting(sid):
                try:
                    value = await pending
                except BaseException as exc:
                    self.failed = exc
                    raise
            return checked(value)

        def body(tx: Any) -> Any:
            with transacting(sid):
                try:
                    value = self.fn(tx, *self.args, **self.kwargs)
                except BaseException as exc:
                    self.failed = exc
                    raise
            if inspect.isawaitable(value):  # a plain function that returned a coroutine
                return awaited(value)  # an async store awaits it; a sync one refuses it
            return checked(value)

        return body

    def run(self, core: _Core, base: StepRecord) -> Flow[Any]:
        """The store's transaction: the function's writes and ``base`` recorded with its value."""
        sid = base.step_id
        yield from core.flush()
        step = yield from core.append_new(io(Store.record_transaction, core.claim, base, self.body(sid)), sid)
        core.steps[sid] = step
        crashpoint("transaction.after_commit", sid)
        return step.result
