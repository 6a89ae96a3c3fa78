"""``RunCore``: what one worker holds while it executes a claimed run, and the step flow.

The core is the run as this worker knows it — the ledger loaded at claim time, the steps and
operations recorded since, the pure steps not yet written, the fence it writes under — and the
ledger writes every step goes through (``write``, ``append_new``, ``flush``, ``block``). On top
of them, the flow of pure, read, model, decision and value steps (``step_flow``): replay if the
ledger answers this very call, else call the step's function and record what it returned. The
flow of an effect step, the dispatch protocol, is ``dispatch``'s; the methods a workflow calls
are ``run``'s.

Replay: the workflow function runs again from its start on every resume; each step call first
looks in the ledger (loaded in one batch at claim time) and returns the recorded result without
calling anything when the step's kind, name and input hash match.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

from .._rules.canonical import require_json
from .._rules.compat import stale_tail
from .._rules.history import successor_inputs
from .._rules.ids import check_step_id
from .._rules.kinds import KINDS
from .._rules.limits import (
    UsageFn,
    after_failure,
    attempts_allowed,
    checked_usage,
    limit_before_step,
    limits_of,
    next_attempt,
    reported_tokens,
    round_start_for,
    step_policy,
    with_limits,
)
from .._rules.records import revised
from .._rules.recovery import build_record
from .._rules.replay import Asked
from .._rules.secrets import error_evidence, redact_json, redact_text, refuse_secrets
from .._rules.transactions import reconnecting
from ..errors import (
    Cancelled,
    ContinueAsNew,
    DeadlineExceeded,
    HistoryLimitReached,
    LimitReached,
    LostOwnership,
    ReplayMismatch,
    RunBlocked,
    StaleCheckpoint,
    StepAttemptsExhausted,
    StepFailed,
    StoreError,
    UsageError,
)
from ..storage.base import Replan, Store
from ..types import (
    JSON,
    ApprovalRecord,
    AttemptRecord,
    Claim,
    EffectState,
    OperationRecord,
    Retry,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
)
from . import host
from .crashpoints import crashpoint
from .current import refuse_inside_transaction
from .flow import Call, Flow, R, Sleep, callable_name, io, is_async_callable
from .observe import Execution, call_status, seen_executed, seen_replayed
from .records import input_hash as _input_hash
from .records import next_step_id as _next_step_id
from .slices import SliceClock
from .transaction_attempt import TransactionAttempt, attempt_policy, lost

if TYPE_CHECKING:
    from ..storage.base import AsyncStore
    from .replaying import Replaying

PURE_BATCH = 64  # pure steps written in one commit when nothing else is written sooner
_SETTLED = (EffectState.ACCEPTED, EffectState.REJECTED)
# How often a fan-out branch looks again while a sibling holds the run (see RunCore.release_turn).
_TURN_POLL_S = 0.005


class RunCore:
    """The state one worker holds while it executes a run it has claimed."""

    def __init__(
        self,
        store: Store | AsyncStore,
        claim: Claim,
        run: RunRecord,
        steps: dict[str, StepRecord],
        operations: dict[str, OperationRecord],
        *,
        is_async: bool,
        replans: bool = False,
        attempts: dict[str, list[AttemptRecord]] | None = None,
        default_retry: Retry | None = None,
    ) -> None:
        self.store = store
        self.is_async = is_async
        self.replans = replans  # compatibility policy "replan": stale steps are asked again
        self.claim = claim
        self.run = run
        self.steps = steps
        self.operations = operations
        self.occurrences: dict[str, int] = {}
        self.last_seq = max((step.seq for step in steps.values()), default=0)
        self.seq_lock = threading.Lock()
        # Pure steps recorded but not yet written: they go in one commit with the next step, or
        # in a batch of their own, or before any other write. A crash loses at most these, and a
        # pure step lost is simply computed again.
        self.pending: list[StepRecord] = []
        # Where the ledger stood when this worker took over: an observation recorded last,
        # with no effect left open after it, may still be refreshed (see ``may_reread``).
        self.seq_at_load = self.last_seq
        self.open_at_load = any(op.state not in _SETTLED for op in operations.values())
        self.halted: BaseException | None = None
        self.release_on_halt = False  # halted by an interrupt: give the run back, don't block
        # Asked to stop: replay and settle what is in flight, start nothing new.
        self.cancelling = run.cancel_requested_at is not None
        # Failed attempts of read and model steps (the count goes on after a restart), and the
        # attempts a read or model step gets when it names none.
        self.attempts = {sid: list(tried) for sid, tried in (attempts or {}).items()}
        self.default_retry = default_retry if default_retry is not None else run.step_attempts
        self.approvals: dict[str, ApprovalRecord] = {}  # operation id → what authorized it
        # Fan-out: dispatches between "dispatching" and their recorded outcome, and branches
        # about to release the run (a block, a wait for approval). See ``release_turn``.
        self.in_flight = 0
        self.releasing = 0
        # The step-id prefixes of each fan-out's branches, as reached: a re-plan in one branch
        # leaves what its sibling branches recorded alone.
        self.fanouts: list[list[str]] = []
        # The operations recorded before this worker took over that the code has not asked
        # for yet (in deterministic code, none by the time it asks for a new one), and the
        # prefixes of the fan-out branches still running: what ``_rules.effects.orphaned`` needs.
        self.unreached: set[str] = set(operations)
        self.open_branches: set[str] = set()
        # The slice of time the call that carries the run on may spend (``slices``): once it
        # is spent, no new step starts.
        self.slice_clock: SliceClock | None = None
        # What the installed observer follows of this execution (``observe``); None, the usual
        # case, costs each step one test of it.
        self.watch: Execution | None = None
        # The operations the run's fork was told to send again (``resend``), by whom; once read.
        self.resent: dict[str, str] | None = None
        self.replaying: Replaying | None = None  # a replay's watch (``replay``)
        self.owners: Callable[[Any, str], Callable[..., Any]] | None = None  # a live replay's stubs

    # -- shared pieces -------------------------------------------------------------------------

    def occurrence(self, step_id: str, prefix: str = "") -> str:
        """The id of this call: ``step_id`` the first time, ``step_id#2`` the second, …; inside
        a fan-out branch, prefixed by the branch (``fan.eu/step_id``). Each branch counts its
        own ids, so the ids do not depend on how the branches interleave."""
        if isinstance(step_id, str) and prefix + step_id in self.steps:
            # a replayed step: its id passed check_step_id when it was recorded
            scoped = prefix + step_id
        else:
            scoped = prefix + check_step_id(step_id)
        refuse_inside_transaction(scoped)
        count = self.occurrences.get(scoped, 0) + 1
        self.occurrences[scoped] = count
        return scoped if count == 1 else f"{scoped}#{count}"

    def next_seq(self, sid: str) -> int:
        """The ledger order of a newly recorded step (a re-recorded step keeps its place)."""
        if sid in self.steps:
            return self.steps[sid].seq
        with self.seq_lock:  # fan-out branches record from several threads
            self.last_seq += 1
            return self.last_seq

    def owner_call(self, effect: Any, what: str) -> Callable[..., Any]:
        """Who carries out ``effect``'s ``what`` (execute, reconcile, verify) for this run."""
        return (self.owners or host.current.owner_call)(effect, what)

    def cancelled(self) -> Cancelled:
        """The stop signal, kept: agent code that swallows it still cannot carry on."""
        signal = Cancelled(self.run.run_id)
        self.halted = signal
        return signal

    def close(self) -> None:
        """The workflow function returned (or the run stopped here): a step called through
        this run object later — from a thread, a callback or an object that outlived the
        function — is told so, instead of failing as a stale worker's write."""
        self.halted = UsageError(
            f"run {self.run.run_id!r} is over for this run object (its workflow function"
            " returned, or the run stopped): no step can be recorded through it any more —"
            " call steps only inside the workflow function, not from a thread, callback or"
            " object that outlives it",
            run_id=self.run.run_id,
        )

    def check_halt(self) -> None:
        if self.halted is not None:
            raise self.halted

    def release_turn(self) -> Flow[None]:
        """Before a write that may release the run (a block, the approval gate): no fan-out
        branch starts a dispatch from now on, and those in flight record their outcome first.
        Once the run is released, no outcome can be recorded: a receipt in hand would be lost,
        and an effect that happened would wait for reconciliation. End with ``end_turn``.
        (Never called between a branch's own "dispatching" and its outcome.)"""
        with self.seq_lock:
            self.releasing += 1
        while self.in_flight:
            yield Sleep(_TURN_POLL_S)

    def end_turn(self) -> None:
        with self.seq_lock:
            self.releasing -= 1

    def enter_dispatch(self) -> Flow[None]:
        """Count a dispatch in flight (``leave_dispatch`` when its outcome is recorded); while
        a sibling branch is releasing the run, wait — and start nothing if it halted it."""
        while True:
            with self.seq_lock:
                if not self.releasing:
                    self.in_flight += 1
                    return
            yield Sleep(_TURN_POLL_S)
            self.check_halt()

    def leave_dispatch(self) -> None:
        with self.seq_lock:
            self.in_flight -= 1

    def check_slice(self, sid: str) -> None:
        """Before a new step (or a new operation) starts: once the call's slice is spent, the
        run stops here — kept, like a cancel, so that every fan-out branch stops at its next
        step and agent code swallowing it cannot carry on; the run is then released
        (``slices.end_slice``)."""
        if self.slice_clock is not None and self.slice_clock.ends_before_step():
            self.halted = self.slice_clock.ended(self.run.run_id, sid)
            raise self.halted

    def limit_reached(self, error: LimitReached) -> LimitReached:
        """A limit of the run was reached: kept, like a cancel, so that agent code swallowing
        it cannot carry on; the run is then ended (failed, or blocked) by ``_execute_flow``."""
        self.halted = error
        return error

    def continue_as_new(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ContinueAsNew:
        """The signal that ends this run and starts its successor with ``args``/``kwargs``,
        kept: agent code that swallows it cannot carry on. A run asked to stop cannot escape
        the request by continuing: it gets the stop signal instead."""
        self.check_halt()
        if self.cancelling:
            raise self.cancelled()
        signal = ContinueAsNew(self.run.run_id, successor_inputs(args, kwargs))
        self.halted = signal
        return signal

    def take_pending(self) -> list[StepRecord]:
        with self.seq_lock:
            batch, self.pending = self.pending, []
        return batch

    def flush(self) -> Flow[None]:
        """Write the pure steps still pending, in one commit (see ``_record_result``)."""
        batch = self.take_pending()
        if batch:
            yield from self.append_new(io(Store.record_steps, self.claim, batch), batch[0].step_id)

    def write(self, request: Flow[R]) -> Flow[R]:
        """A write of the run (``io(Store…)``, not started yet): the pure steps before it
        first, so the ledger keeps its order."""
        yield from self.flush()
        return (yield from request)

    def append_new(self, request: Flow[R], sid: str) -> Flow[R]:
        """A write that records something new (a step, a prepared effect). At the run's hard
        history limit the store refuses it: the run blocks, to be continued as new."""
        try:
            return (yield from request)
        except HistoryLimitReached as limit:
            yield from self.block_at_history_limit(limit, sid)
            raise

    def block_at_history_limit(self, limit: HistoryLimitReached, sid: str) -> Flow[None]:
        """Block the run: the store refused new work at its hard history limit."""
        yield from self.block(
            limit,
            phase="history_limit",
            step_id=sid,
            evidence={"history": limit.size, "hard_limit": limit.limit},
        )

    def uncertain_operations(self) -> list[OperationRecord]:
        """Operations whose outcome is not settled: the run may neither fail nor complete."""
        open_ = (EffectState.DISPATCHING, EffectState.UNKNOWN, EffectState.APPLIED)
        return [op for op in self.operations.values() if op.state in open_]

    def may_reread(self, recorded: StepRecord) -> bool:
        """An expired observation is refreshed only while nothing was built on it: it is the
        last recorded step and no effect is open. Once later steps used it, it is history
        (re-reading would make every later step answer another question); in a replay, never."""
        return recorded.seq == self.seq_at_load and not self.open_at_load and self.replaying is None

    def record_block(
        self,
        error: RunBlocked,
        *,
        phase: str,
        step_id: str | None = None,
        op: OperationRecord | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Flow[None]:
        """Record the block with its recovery record and halt this run object."""
        if self.replaying is not None:
            self.replaying.block(self, error, phase)
        authorization = None
        if op is not None and op.approval_id is not None:  # the record names what authorized it
            authorization = self.approvals.get(op.operation_id)
            if authorization is None or authorization.approval_id != op.approval_id:
                given = yield from io(Store.approvals, self.run.run_id)
                authorization = next((a for a in given if a.approval_id == op.approval_id), None)
        record = build_record(
            self.run,
            phase=phase,
            reason=error.message,
            step_id=step_id,
            op=op,
            evidence=evidence,
            authorization=authorization,
        )
        yield from self.release_turn()
        try:
            error.record = yield from self.write(finish_blocked(self.claim, record))
            self.halted = error
        finally:
            self.end_turn()

    def block(
        self,
        error: RunBlocked,
        *,
        phase: str,
        step_id: str | None = None,
        op: OperationRecord | None = None,
        evidence: dict[str, Any] | None = None,
    ) -> Flow[NoReturn]:
        """``record_block``, then raise ``error``."""
        yield from self.record_block(error, phase=phase, step_id=step_id, op=op, evidence=evidence)
        raise error

    @staticmethod
    def input_hash(inputs: Any, sid: str) -> str:
        """sha256 of a step's inputs as their hash covers them (see ``_input_hash``)."""
        return _input_hash(inputs, sid)

    def check_replay(self, sid: str, kind: StepKind, name: str, hashed: str) -> StepRecord | None:
        """The recorded step at ``sid`` if it answers this very call; raise if it answers another."""
        recorded = self.steps.get(sid)
        if recorded is None:
            return None
        if recorded.kind is not kind or recorded.name != name:
            raise ReplayMismatch(
                self.run.run_id,
                sid,
                f"recorded as {recorded.kind.value} {recorded.name!r}, now called as {kind.value} {name!r}",
            )
        if recorded.input_hash != hashed:
            raise StaleCheckpoint(
                self.run.run_id, sid, f"input hash {recorded.input_hash[:12]}… became {hashed[:12]}…"
            )
        if self.replaying is not None:
            self.replaying.answered(self, recorded)
        return recorded

    def replay_lookup(
        self,
        sid: str,
        kind: StepKind,
        name: str,
        hashed: str,
        op: OperationRecord | None = None,
        asked: Asked | None = None,
    ) -> Flow[StepRecord | None]:
        """The recorded step that answers this call, or None. A recorded step that answers
        another question blocks the run (``refuse``) or is abandoned with the stale tail after
        it (``replan``)."""
        try:
            return self.check_replay(sid, kind, name, hashed)
        except StaleCheckpoint as stale:
            if self.replaying is not None:
                self.replaying.diverged(self, stale, asked or Asked(sid, kind, name, hashed))
            if not self.replans:
                phase = "replay_mismatch" if isinstance(stale, ReplayMismatch) else "stale_checkpoint"
                yield from self.block(stale, phase=phase, step_id=sid, op=op)
            yield from self.abandon_tail(sid, stale)
            return None

    def abandon_tail(self, sid: str, stale: StaleCheckpoint) -> Flow[None]:
        """Re-plan from the step at ``sid``: it, and every observation and decision recorded
        after it, answered other questions than the ones now asked. They move into the history
        (``step.abandoned`` events) and are asked again as the workflow reaches them; effect
        and transaction steps after it and every operation stay (``_rules.compat.stale_tail``)."""
        if self.cancelling:
            raise self.cancelled()  # re-planning is new work
        through = self.seq_at_load
        tail, keep = stale_tail(self.steps, sid, through, list(self.fanouts))
        yield from self.flush()
        yield from io(
            Store.replan,
            self.claim,
            Replan(reason=stale.message, step_id=sid, through_seq=through, keep=keep),
        )
        for key in tail:
            if key not in keep:
                self.steps.pop(key, None)  # a sibling's re-plan may have dropped it already

    # -- flows ---------------------------------------------------------------------------------

    def step_flow(
        self,
        kind: StepKind,
        step_id: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        hashed_inputs: JSON,
        name: str | None = None,
        max_age: timedelta | None = None,
        model_id: str | None = None,
        prompt_hash: str | None = None,
        retry: Retry | None = None,
        usage: UsageFn | None = None,
        prefix: str = "",
        redact: bool = False,
    ) -> Flow[Any]:
        """Pure, read, model, decision and value steps: replay if recorded, else call and record.
        With ``redact``, a credential in the result is recorded (and returned) as its marked
        digest instead of refusing the result: for what the world said, not what the caller chose."""
        self.check_halt()
        sid = self.occurrence(step_id, prefix)
        name = name or callable_name(fn)
        if not self.is_async and is_async_callable(fn):
            raise UsageError(
                f"step {sid!r} calls {name}, which is async: call it from an async"
                " def workflow (AsyncRun), or pass a plain function",
                step_id=sid,
            )
        hashed = self.input_hash(hashed_inputs, sid)
        try:  # asked first without a flow of its own: on replay, every step comes here
            recorded = self.check_replay(sid, kind, name, hashed)
        except StaleCheckpoint:
            recorded = yield from self.replay_lookup(sid, kind, name, hashed)
        round_start = 0  # the attempts recorded before this round of calls
        if recorded is not None:
            if recorded.status is StepStatus.FAILED:
                self.raise_recorded_failure(recorded)
            if max_age is None or recorded.observed_at is None or not self.may_reread(recorded):
                if self.watch is not None:
                    seen_replayed(self.watch, recorded)
                return recorded.result
            now = yield from io(Store.now)
            if now - recorded.observed_at <= max_age.total_seconds() * 1000:
                if self.watch is not None:
                    seen_replayed(self.watch, recorded)
                return recorded.result
            round_start = recorded.attempt  # the observation expired: read again
        if self.replaying is not None:
            self.replaying.new(self, Asked(sid, kind, name, hashed))
        if self.cancelling:
            raise self.cancelled()  # before calling anything new
        self.check_slice(sid)
        base = StepRecord(
            run_id=self.run.run_id,
            step_id=sid,
            kind=kind,
            name=name,
            input_hash=hashed,
            result=None,
            seq=self.next_seq(sid),
            model_id=model_id,
            prompt_hash=prompt_hash,
        )
        return (
            yield from self.call_step(
                base,
                fn,
                args,
                kwargs,
                round_start,
                step_policy(kind, retry, self.default_retry),
                usage,
                redact,
            )
        )

    def call_step(
        self,
        base: StepRecord,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        round_start: int,
        policy: Retry,
        usage: UsageFn | None,
        redact: bool = False,
    ) -> Flow[Any]:
        """Call a step's function — again after a failed attempt, as ``policy`` allows, each
        failure recorded before its back-off — and record the result or the failure. A limit
        in the way (the deadline, a budget, the step's attempts) stops the run before the call:
        ``LimitReached``, once the run's limits, read again, still say so."""
        sid, kind, does = base.step_id, base.kind, KINDS[base.kind]
        tried = self.attempts.get(sid, [])
        round_start = round_start_for(round_start, tried, base.input_hash)
        attempt, pending = next_attempt(round_start, tried)
        while True:
            if base.attempt != attempt:
                base = replace(base, attempt=attempt)
            if pending is not None:
                under = attempt_policy(policy, kind, pending.error)  # a lost connection's, or its own
                if under.attempts <= 1 and attempt - round_start > 1:
                    # The code now tries it once, and it was tried: no further call.
                    yield from self._fail_step(base, pending.error, attempt - 1 - round_start, None)
                yield from self._stop_at(
                    partial(self._before_retry, under, sid, attempt - 1 - round_start, pending)
                )
                yield from self._wait_for_retry(pending)
            clocked = does.observed or (self.run.deadline_at is not None and does.before_deadline)
            now = (yield from io(Store.now)) if clocked else None
            if does.model_call or (now is not None and self.run.deadline_at is not None):
                # only a model call has budgets, only a deadline is read off the clock
                yield from self._stop_at(partial(self._before_call, kind, sid, now))
            if does.observed:
                base = revised(base, observed_at=now)
            started = time.time_ns() if self.watch is not None else 0
            # a transaction step's call is the store's transaction, which records it too
            transaction = TransactionAttempt(fn, args, kwargs) if does.commits_with_record else None
            try:
                if transaction is None:
                    value = yield Call(fn, args, kwargs)
                else:
                    value = yield from transaction.run(self, base)
            except UsageError:
                raise  # a mistake in how the step is called, not an outcome to record
            except Exception as exc:
                if transaction is not None and not transaction.raised(exc):
                    raise  # the store's failure (or its refusal), not the step's
                now = yield from io(Store.now)
                decided = after_failure(
                    attempts_allowed(
                        reconnecting(policy) if lost(transaction) else policy, self.run.step_attempt_limit
                    ),
                    exc,
                    failed_in_round=attempt - round_start,
                    now=now,
                    deadline_at=self.run.deadline_at,
                    seed=f"{self.run.run_id}/{sid}/{attempt}",
                )
                if self.watch is not None:
                    seen_executed(
                        self.watch, base, started, "retrying" if decided.retry_at else "failed", exc
                    )
                if decided.retry_at is None:
                    # Recorded, so that a resume takes the path this run took: the same
                    # StepFailed is raised again instead of asking again.
                    yield from self._fail_step(
                        base, error_evidence(exc), attempt - round_start, decided.why, exc
                    )
                    raise  # unreachable: _fail_step raises
                # Another attempt is due at retry_at — or a limit (its attempts, the deadline)
                # stands before it: then the run stops there, and a person who raises the
                # limit lets the attempts go on from this count.
                pending = AttemptRecord(
                    run_id=self.run.run_id,
                    step_id=sid,
                    attempt=attempt,
                    kind=kind,
                    name=base.name,
                    input_hash=base.input_hash,
                    error=error_evidence(exc),
                    retry_at=decided.retry_at,
                )
                # Durable before the wait: a restart continues the count and waits the rest.
                yield from self.write(io(Store.record_attempt, self.claim, pending))
                self.attempts.setdefault(sid, []).append(pending)
                attempt += 1
                continue
            if transaction is not None:  # recorded in the transaction
                if self.watch is not None:
                    seen_executed(self.watch, base, started, "completed", None, value)
                return value
            if self.watch is None:
                return (yield from self._record_result(base, value, usage, redact))
            return (yield from self._watched_record(base, started, value, usage, redact))

    def _watched_record(
        self, base: StepRecord, started: int, value: Any, usage: UsageFn | None, redact: bool
    ) -> Flow[Any]:
        """``_record_result``, and the installed observer told how the step's call ended."""
        try:
            value = yield from self._record_result(base, value, usage, redact)
        except BaseException as exc:
            seen_executed(self.watch, base, started, call_status(exc, otherwise="failed"), exc)
            raise
        seen_executed(self.watch, base, started, "completed", None, value)
        return value

    def raise_recorded_failure(self, recorded: StepRecord) -> NoReturn:
        """A step recorded failed raises its ``StepFailed`` again: the run takes the path it
        took the first time."""
        error = recorded.error or {}
        failed = StepFailed(
            self.run.run_id,
            recorded.step_id,
            str(error.get("type")),
            str(error.get("message")),
            int(error.get("attempts", 1)),
        )
        if self.watch is not None:
            seen_replayed(self.watch, recorded, "failed", failed)
        raise failed

    def _stop_at(self, reached: Callable[[], LimitReached | None]) -> Flow[None]:
        """Go on unless a limit stands before the next call (``reached()``): then read the
        run's limits again — a person may have raised them since this worker read them — and
        stop the run if it still stands."""
        if reached() is None:
            return
        yield from self.reread_limits()
        still = reached()
        if still is not None:
            raise self.limit_reached(still)

    def _before_retry(
        self, policy: Retry, sid: str, made: int, pending: AttemptRecord
    ) -> LimitReached | None:
        """The limit before another attempt of a step that failed ``made`` attempts of this
        round (the last, ``pending``, due again at its ``retry_at``): its attempts, or the
        deadline that attempt would come after."""
        allowed = attempts_allowed(policy, self.run.step_attempt_limit).attempts
        if made >= allowed:
            error = pending.error
            return StepAttemptsExhausted(
                self.run.run_id, sid, made, allowed, str(error.get("type")), str(error.get("message"))
            )
        if self.run.deadline_at is not None and pending.retry_at >= self.run.deadline_at:
            return DeadlineExceeded(self.run.run_id, self.run.deadline_at, sid, retry_at=pending.retry_at)
        return None

    def _before_call(self, kind: StepKind, sid: str, now: int | None) -> LimitReached | None:
        return limit_before_step(self.run, kind, sid, now)

    def reread_limits(self) -> Flow[None]:
        """Take the run's limits as they now stand in the store (``extend_limits`` changes them
        while the run runs); what it spent stays as this worker counts it."""
        fresh = yield from io(Store.get_run, self.run.run_id)
        if fresh.fence != self.claim.fence or fresh.status is not RunStatus.RUNNING:
            self.halted = LostOwnership(self.run.run_id, self.claim.fence)
            raise self.halted
        with self.seq_lock:
            self.run = with_limits(self.run, limits_of(fresh))

    def _wait_for_retry(self, pending: AttemptRecord) -> Flow[None]:
        """Wait out what remains of a failed attempt's back-off (on the store's clock); a
        cancel asked for meanwhile stops the run before the next attempt."""
        now = yield from io(Store.now)
        if pending.retry_at <= now:
            return
        if self.slice_clock is not None and self.slice_clock.outlasts((pending.retry_at - now) / 1000):
            # the failed attempt is recorded: the next call waits out the rest
            self.halted = self.slice_clock.ended(self.run.run_id, pending.step_id)
            raise self.halted
        yield Sleep((pending.retry_at - now) / 1000)
        fresh = yield from io(Store.get_run, self.run.run_id)
        if fresh.fence != self.claim.fence or fresh.status is not RunStatus.RUNNING:
            self.halted = LostOwnership(self.run.run_id, self.claim.fence)
            raise self.halted
        if fresh.cancel_requested_at is not None:
            self.cancelling = True
            raise self.cancelled()

    def _fail_step(
        self,
        base: StepRecord,
        error: dict[str, str],
        attempts: int,
        why: str | None,
        cause: BaseException | None = None,
    ) -> Flow[NoReturn]:
        """Record the step failed (its last error, how many attempts, why no more) and raise
        ``StepFailed``; a resume raises the same from the ledger."""
        evidence: dict[str, Any] = dict(error)
        if attempts > 1:
            evidence["attempts"] = attempts
        if why:
            evidence["gave_up"] = why
        failed = replace(base, status=StepStatus.FAILED, error=evidence)
        yield from self.flush()
        yield from self.append_new(io(Store.record_step, self.claim, failed), base.step_id)
        self.steps[base.step_id] = failed
        if KINDS[failed.kind].model_call:  # a model call made, as the store counted it
            self._spent(None, None)
        raise StepFailed(self.run.run_id, base.step_id, error["type"], error["message"], attempts) from cause

    def _spent(self, tokens: int | None, cost: float | None) -> None:
        """A model step was recorded: what it spent (one model call, its tokens and cost) is
        the run's, as the store added it in that commit."""
        with self.seq_lock:  # fan-out branches on threads add theirs at the same time
            self.run = replace(
                self.run,
                tokens_spent=self.run.tokens_spent + (tokens or 0),
                cost_spent=self.run.cost_spent + (cost or 0.0),
                model_calls_spent=self.run.model_calls_spent + 1,
            )

    def _record_result(self, base: StepRecord, value: Any, usage: UsageFn | None, redact: bool) -> Flow[Any]:
        sid = base.step_id
        does = KINDS[base.kind]
        require_json(value, "result", sid)
        if redact:
            # what is recorded is what the workflow sees, now and on replay; a model's
            # encrypted reasoning and thinking signatures go back to it as they came
            value = redact_json(value, keep_opaque=does.model_call)
        else:
            refuse_secrets(value, "the result", sid)
        tokens = cost = None
        if does.model_call:
            if usage is not None:
                try:
                    reported = yield Call(usage, (value,))
                except Exception as exc:
                    raise UsageError(
                        f"the usage= function of step {sid!r} raised"
                        f" {type(exc).__name__}: {redact_text(str(exc))}",
                        step_id=sid,
                    ) from exc
                tokens, cost = checked_usage(reported, sid)
            if tokens is None:
                tokens = reported_tokens(value)
        next_step_id = _next_step_id(sid, value) if does.picks_next else None
        step = revised(base, result=value, next_step_id=next_step_id, tokens=tokens, cost=cost)
        crashpoint("step.before_record", sid)
        if does.batched:
            with self.seq_lock:
                self.pending.append(step)
                full = len(self.pending) >= PURE_BATCH
            self.steps[sid] = step
            if full:
                yield from self.flush()
        else:
            batch = self.take_pending()
            request = (
                io(Store.record_steps, self.claim, [*batch, step])
                if batch
                else io(Store.record_step, self.claim, step)
            )
            yield from self.append_new(request, sid)
            self.steps[sid] = step
        if does.model_call:  # the store added the same to the run's totals, in that commit
            self._spent(tokens, cost)
        crashpoint("step.after_record", sid)
        return value


def finish_blocked(claim: Claim, record: dict[str, Any]) -> Flow[dict[str, Any]]:
    """Block the claimed run with its recovery record, and return the record as the store keeps
    it: with the ``state_revision`` the block created (the store fills it in, in the statement
    that blocks), which a person's resolution must name. The error raised to the caller carries
    this one, so that resolving from it works; the record as built when it cannot be read back."""
    yield from io(Store.finish_run, claim, RunStatus.BLOCKED, recovery_record=record)
    try:
        stored = yield from io(Store.get_run, claim.run_id)
    except StoreError:
        return record
    return stored.recovery_record if stored.recovery_record is not None else record
