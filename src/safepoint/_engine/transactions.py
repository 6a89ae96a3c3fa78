"""Transaction steps: writes to the ledger's own database, committed with their step record.

When the tables an effect writes live in the same database as the ledger (the application's
own PostgreSQL, or the SQLite file), no dispatch protocol is needed to make it exactly once:
the writes and the step record commit together, or neither does. ``transaction_flow`` is the
step: replay the recorded result if there is one (the function is not called), else hand the
function to the store's ``record_transaction`` — one transaction that checks the fence first,
runs the function's statements, records the step with the function's JSON result and commits
once. A crash before that commit leaves nothing of it (the step runs again on resume); after
it, the step is recorded and replays.

A function that raises rolls its transaction back; the failure is then recorded (or another
attempt made) as for a read step (``RunCore._call_step``), since nothing of the failed attempt
is left. A recorded transaction step whose inputs changed blocks the run under either
compatibility policy: its writes are committed, so it can never be asked again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._rules.canonical import require_json
from .._rules.limits import step_policy
from .._rules.secrets import refuse_secrets
from ..errors import ReplayMismatch, StaleCheckpoint, StepFailed, UsageError
from ..storage.base import Store
from ..types import Retry, StepKind, StepRecord, StepStatus
from .crashpoints import crashpoint
from .current import transacting
from .flow import Flow, callable_name, io, is_async_callable

if TYPE_CHECKING:
    from .core import RunCore


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

        def body(tx: Any) -> Any:
            with transacting(sid):
                try:
                    value = self.fn(tx, *self.args, **self.kwargs)
                except BaseException as exc:
                    self.failed = exc
                    raise
            return checked(value)

        return body

    def run(self, core: RunCore, base: StepRecord) -> Flow[Any]:
        """The store's transaction: the function's writes and ``base`` recorded with its value."""
        sid = base.step_id
        yield from core.flush()
        step = yield from core.append_new(io(Store.record_transaction, core.claim, base, self.body(sid)), sid)
        core.steps[sid] = step
        crashpoint("transaction.after_commit", sid)
        return step.result


def transaction_flow(
    core: RunCore,
    step_id: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    hashed_inputs: Any,
    retry: Retry | None = None,
    prefix: str = "",
) -> Flow[Any]:
    """A transaction step: replay if recorded, else run it in the store's transaction."""
    core.check_halt()
    sid = core.occurrence(step_id, prefix)
    name = callable_name(fn)
    if not core.is_async and is_async_callable(fn):
        raise UsageError(
            f"transaction step {sid!r} calls {name}, which is async: call it from an async def"
            " workflow (AsyncRun) on AsyncPostgresStore, or pass a plain function",
            step_id=sid,
        )
    hashed = core.input_hash(hashed_inputs, sid)
    try:
        recorded = core.check_replay(sid, StepKind.TRANSACTION, name, hashed)
    except StaleCheckpoint as stale:
        # Never re-planned: its writes are committed, and asking again would write them twice.
        phase = "replay_mismatch" if isinstance(stale, ReplayMismatch) else "stale_checkpoint"
        yield from core.block(stale, phase=phase, step_id=sid)
    if recorded is not None:
        if recorded.status is StepStatus.FAILED:
            error = recorded.error or {}
            failed = StepFailed(
                core.run.run_id,
                sid,
                str(error.get("type")),
                str(error.get("message")),
                int(error.get("attempts", 1)),
            )
            if core.watch is not None:
                core.seen_replayed(recorded, "failed", failed)
            raise failed
        if core.watch is not None:
            core.seen_replayed(recorded)
        return recorded.result
    if core.cancelling:
        raise core.cancelled()  # before calling anything new
    core.check_slice(sid)
    base = StepRecord(
        run_id=core.run.run_id,
        step_id=sid,
        kind=StepKind.TRANSACTION,
        name=name,
        input_hash=hashed,
        result=None,
        seq=core.next_seq(sid),
    )
    policy = step_policy(StepKind.TRANSACTION, retry, core.default_retry)
    return (yield from core.call_step(base, fn, args, kwargs, 0, policy, None))
