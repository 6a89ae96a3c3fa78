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
attempt made) as for a read step (``RunCore.call_step``), since nothing of the failed attempt
is left — and so is a connection lost under it, which is always tried again
(``_rules.transactions.reconnecting``). A function that ended the step's transaction itself
leaves the step recorded as uncertain: the run blocks, now and on every resume, until a person
resolves it (``block_uncertain``). A recorded transaction step whose inputs changed blocks the
run under either compatibility policy: its writes are committed, so it can never be asked
again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._rules.limits import step_policy
from .._rules.replay import Asked
from .._rules.transactions import is_uncertain
from ..errors import ReplayMismatch, StaleCheckpoint, UsageError
from ..types import Retry, StepKind, StepRecord, StepStatus
from .flow import Flow, callable_name, is_async_callable
from .observe import seen_replayed
from .transaction_attempt import block_uncertain

if TYPE_CHECKING:
    from .core import RunCore


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
        if core.replaying is not None:
            core.replaying.diverged(
                core, stale, Asked(sid, StepKind.TRANSACTION, name, hashed), replans=False
            )
        phase = "replay_mismatch" if isinstance(stale, ReplayMismatch) else "stale_checkpoint"
        yield from core.block(stale, phase=phase, step_id=sid)
    if recorded is not None:
        if is_uncertain(recorded):  # its transaction committed without it: a person decides
            yield from block_uncertain(core, recorded, str((recorded.error or {}).get("message")))
        if recorded.status is StepStatus.FAILED:
            core.raise_recorded_failure(recorded)
        if core.watch is not None:
            seen_replayed(core.watch, recorded)
        return recorded.result
    if core.replaying is not None:
        core.replaying.new(core, Asked(sid, StepKind.TRANSACTION, name, hashed))
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
