"""One call of a transaction step's function, inside the store's transaction (the step's
flow is ``transactions``; ``RunCore.call_step`` makes the attempts), and what the ledger
does when the store cannot vouch for it: a transaction its function ended blocks the run
(``block_uncertain``), a lost connection is a failed attempt of the step (tried again), and a
step the store finds recorded already is taken as recorded."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NoReturn, Protocol, TypeVar

from .._rules.canonical import require_json
from .._rules.family import transaction_key
from .._rules.kinds import KINDS
from .._rules.recovery import UNCERTAIN_PHASE
from .._rules.secrets import refuse_secrets
from .._rules.transactions import is_lost_connection, is_uncertain, reconnecting, uncertain_record
from ..errors import ClaimedInFamily, RunBlocked, StoreUnavailable, TransactionUncertain
from ..storage.base import Store
from ..types import Claim, Retry, RunRecord, StepKind, StepRecord, StepStatus
from .crashpoints import crashpoint
from .current import transacting
from .family import held_transaction, resends
from .flow import Flow, io, is_async_callable

R = TypeVar("R")


class _Core(Protocol):
    """What an attempt needs of the run core (``RunCore``)."""

    claim: Claim
    run: RunRecord
    steps: dict[str, StepRecord]
    halted: BaseException | None
    resent: dict[str, str] | None

    def flush(self) -> Flow[None]: ...

    def write(self, request: Flow[R]) -> Flow[R]: ...

    def append_new(self, request: Flow[R], sid: str) -> Flow[R]: ...

    def block(self, error: RunBlocked, *, phase: str, step_id: str | None = None) -> Flow[NoReturn]: ...

    def raise_recorded_failure(self, recorded: StepRecord) -> NoReturn: ...


def attempt_policy(policy: Retry, kind: StepKind, error: dict[str, Any] | None) -> Retry:
    """The attempts a step tried again after a failed attempt (its ``error``) gets: a
    transaction step whose connection was lost gets ``reconnecting``'s, any other its own."""
    return reconnecting(policy) if KINDS[kind].commits_with_record and is_lost_connection(error) else policy


def lost(attempt: TransactionAttempt | None) -> bool:
    """Whether ``attempt`` (a transaction step's, if any) failed because its connection was lost."""
    return attempt is not None and attempt.lost


def block_uncertain(core: _Core, step: StepRecord, how: str) -> Flow[NoReturn]:
    """Block the run on a transaction step that may have committed without its record: the
    step is recorded as uncertain first (unless it is already: its transaction committed with
    that record), so that every resume blocks on it again until a person resolves it."""
    if not is_uncertain(core.steps.get(step.step_id) or step):
        step = uncertain_record(step, how)
        yield from core.write(io(Store.record_step, core.claim, step))
    core.steps[step.step_id] = step
    error = TransactionUncertain(core.run.run_id, step.step_id, how)
    yield from core.block(error, phase=UNCERTAIN_PHASE, step_id=step.step_id)
    raise error  # unreachable: block raises it


class TransactionAttempt:
    """One call of a transaction step's function, in the store's transaction: tells the
    function's own failure (the step's) from the store's (the run's)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.failed: BaseException | None = None  # what the function raised, if it did
        self.called = False  # the store called the function: its transaction was begun
        self.lost = False  # the connection was lost once it was: a failed attempt, tried again

    def raised(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the attempt's failure: what the function raised (as raised, or as
        the store translated it: a transaction the database rolled back is a
        ``TransientFailure`` caused by it), or the lost connection it ran on."""
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
                self.called = True
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
            self.called = True
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
        key = transaction_key(core.run, sid, resent_by=(yield from resends(core)).get(sid))
        try:
            step = yield from core.append_new(
                io(Store.record_transaction, core.claim, base, self.body(sid), key), sid
            )
        except ClaimedInFamily as held:  # another run of the family committed it (or may have)
            return (yield from held_transaction(core, base, held))
        except TransactionUncertain as ended:
            yield from block_uncertain(core, base, ended.how)
        except StoreUnavailable as exc:
            if not self.called:
                raise  # the store was out of reach before anything began: the run waits for it
            # The connection broke under the step's transaction: the server rolled it back (or
            # it committed with the step record, which the next attempt finds recorded). Not a
            # write the ledger lost track of, then: this run object may go on, and try again.
            if core.halted is exc:
                core.halted = None
            self.lost, self.failed = True, exc
            raise
        core.steps[sid] = step
        if step.status is StepStatus.FAILED:  # recorded already, by an attempt of this worker
            if is_uncertain(step):
                yield from block_uncertain(core, step, str((step.error or {}).get("message")))
            core.raise_recorded_failure(step)
        crashpoint("transaction.after_commit", sid)
        return step.result
