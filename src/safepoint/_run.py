"""``Run`` and ``AsyncRun``: the step methods a workflow calls, and replay.

Every step method is written once, as a generator (a "flow") that holds all the logic and never
performs I/O itself: it yields ``Io`` requests (a store call) and ``Call`` requests (user code:
a step function, an effect's execute / reconcile / verify). Two small drivers carry requests
out — ``drive`` for plain ``def`` workflows, ``adrive`` for ``async def`` ones (see ``_flow``).
So the sync and async shells cannot drift apart.

Replay: the workflow function runs again from its start on every resume; each step call first
looks in the ledger (loaded in one batch at claim time) and returns the recorded result without
calling anything when the step's kind, name and input hash match.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid as uuidlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from ._approvals import awaiting, may_reprepare
from ._canonical import (
    JSON,
    canonical,
    canonical_if_json,
    checked_canonical,
    digest,
    input_hash,
    loads,
    require_json,
    sha256_hex,
)
from ._crashpoints import SimulatedCrash, crashpoint
from ._effects import (
    Action,
    Effect,
    EffectKey,
    Next,
    NotSent,
    Rejected,
    Unknown,
    after_reconcile,
    mint_effect_key,
    next_action,
    one_commit_to_dispatching,
)
from ._flow import Call, CallTimedOut, Flow, Io, Sleep, adrive, callable_name, drive
from ._flow import is_async_callable as _is_async_callable
from ._history import successor_inputs
from ._limits import (
    UsageFn,
    after_failure,
    as_retry,
    checked_usage,
    next_attempt,
    past_deadline,
    reported_tokens,
    round_start_for,
    spent_budget,
    step_policy,
)
from ._recovery import build_record
from ._secrets import hashed_form, redact, redact_json, refuse_secrets
from ._transcript import Transcript
from .errors import (
    ApprovalInvalid,
    ArtifactCorrupt,
    ArtifactMissing,
    BudgetExhausted,
    Cancelled,
    ContinueAsNew,
    DeadlineExceeded,
    EffectRejected,
    HistoryLimitReached,
    InvalidDecision,
    InvalidStepId,
    LimitReached,
    LostOwnership,
    NeedsReconciliation,
    ReplayMismatch,
    RunBlocked,
    StaleCheckpoint,
    StepFailed,
    UsageError,
    VerificationFailed,
)
from .storage.base import Replan
from .types import (
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

if TYPE_CHECKING:
    from .storage.base import AsyncStore, Store

# Parameters of a model call that vary between identical requests and must not move its hash.
_UNHASHED_MODEL_PARAMS = frozenset({"request_id", "timeout", "extra_headers", "stream_options"})
_NOT_SENT_BACKOFF_S = 0.05
PURE_BATCH = 64  # pure steps written in one commit when nothing else is written sooner
_SETTLED = (EffectState.ACCEPTED, EffectState.REJECTED)
# The gate and the dispatch are two commits: an approval can lapse between them (it expires),
# and then the gate is asked again — a bounded number of times.
_GATE_ATTEMPTS = 3
# How often a fan-out branch looks again while a sibling holds the run (see RunCore.release_turn).
_TURN_POLL_S = 0.005


def _error_evidence(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}


class RunCore:
    """The state one worker holds while it executes a run it has claimed."""

    def __init__(self, store: Store | AsyncStore, claim: Claim, run: RunRecord,
                 steps: dict[str, StepRecord], operations: dict[str, OperationRecord], *,
                 is_async: bool, replans: bool = False,
                 attempts: dict[str, list[AttemptRecord]] | None = None,
                 default_retry: Retry | None = None) -> None:
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

    # -- shared pieces -------------------------------------------------------------------------

    def occurrence(self, step_id: str, prefix: str = "") -> str:
        """The id of this call: ``step_id`` the first time, ``step_id#2`` the second, …; inside
        a fan-out branch, prefixed by the branch (``fan.eu/step_id``). Each branch counts its
        own ids, so the ids do not depend on how the branches interleave."""
        if not isinstance(step_id, str) or not step_id or "#" in step_id or "\x00" in step_id:
            raise InvalidStepId(step_id)
        scoped = prefix + step_id
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

    def cancelled(self) -> Cancelled:
        """The stop signal, kept: agent code that swallows it still cannot carry on."""
        signal = Cancelled(self.run.run_id)
        self.halted = signal
        return signal

    def check_halt(self) -> None:
        if self.halted is not None:
            raise self.halted

    def release_turn(self) -> Flow:
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

    def enter_dispatch(self) -> Flow:
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

    def flush(self) -> Flow:
        """Write the pure steps still pending, in one commit (see ``_record_result``)."""
        batch = self.take_pending()
        if batch:
            yield from self.append_new(Io("record_steps", (self.claim, batch)),
                                       batch[0].step_id)

    def write(self, request: Io) -> Flow:
        """A write of the run: the pure steps before it first, so the ledger keeps its order."""
        yield from self.flush()
        return (yield request)

    def append_new(self, request: Io, sid: str) -> Flow:
        """A write that records something new (a step, a prepared effect). At the run's hard
        history limit the store refuses it: the run blocks, to be continued as new."""
        try:
            return (yield request)
        except HistoryLimitReached as limit:
            yield from self.block_at_history_limit(limit, sid)
            raise

    def block_at_history_limit(self, limit: HistoryLimitReached, sid: str) -> Flow:
        """Block the run: the store refused new work at its hard history limit."""
        yield from self.block(limit, phase="history_limit", step_id=sid,
                              evidence={"history": limit.size, "hard_limit": limit.limit})

    def uncertain_operations(self) -> list[OperationRecord]:
        """Operations whose outcome is not settled: the run may neither fail nor complete."""
        return [op for op in self.operations.values()
                if op.state in (EffectState.DISPATCHING, EffectState.UNKNOWN,
                                EffectState.APPLIED)]

    def may_reread(self, recorded: StepRecord) -> bool:
        """An expired observation is refreshed only while nothing was built on it: it is the
        last recorded step and no effect is open. Once later steps used it, it is history
        (re-reading would make every later step answer another question)."""
        return recorded.seq == self.seq_at_load and not self.open_at_load

    def record_block(self, error: RunBlocked, *, phase: str, step_id: str | None = None,
                     op: OperationRecord | None = None,
                     evidence: dict[str, Any] | None = None) -> Flow:
        """Record the block with its recovery record and halt this run object."""
        authorization = None
        if op is not None and op.approval_id is not None:  # the record names what authorized it
            authorization = self.approvals.get(op.operation_id)
            if authorization is None or authorization.approval_id != op.approval_id:
                given = yield Io("approvals", (self.run.run_id,))
                authorization = next((a for a in given if a.approval_id == op.approval_id),
                                     None)
        record = build_record(self.run, phase=phase, reason=error.message, step_id=step_id,
                              op=op, evidence=evidence, authorization=authorization)
        yield from self.release_turn()
        try:
            yield from self.write(
                Io("finish_run", (self.claim, RunStatus.BLOCKED), {"recovery_record": record}))
            error.record = record
            self.halted = error
        finally:
            self.end_turn()

    def block(self, error: RunBlocked, *, phase: str, step_id: str | None = None,
              op: OperationRecord | None = None, evidence: dict[str, Any] | None = None) -> Flow:
        """``record_block``, then raise ``error``."""
        yield from self.record_block(error, phase=phase, step_id=step_id, op=op,
                                     evidence=evidence)
        raise error

    def check_replay(self, sid: str, kind: StepKind, name: str, hashed: str) -> StepRecord | None:
        """The recorded step at ``sid`` if it answers this very call; raise if it answers another."""
        recorded = self.steps.get(sid)
        if recorded is None:
            return None
        if recorded.kind is not kind or recorded.name != name:
            raise ReplayMismatch(
                self.run.run_id, sid,
                f"recorded as {recorded.kind.value} {recorded.name!r}, now called as"
                f" {kind.value} {name!r}")
        if recorded.input_hash != hashed:
            raise StaleCheckpoint(self.run.run_id, sid,
                                  f"input hash {recorded.input_hash[:12]}… became {hashed[:12]}…")
        return recorded

    def replay_lookup(self, sid: str, kind: StepKind, name: str, hashed: str,
                      op: OperationRecord | None = None) -> Flow:
        """The recorded step that answers this call, or None. A recorded step that answers
        another question blocks the run (``refuse``) or is abandoned with the stale tail after
        it (``replan``)."""
        try:
            return self.check_replay(sid, kind, name, hashed)
        except StaleCheckpoint as stale:
            if not self.replans:
                phase = ("replay_mismatch" if isinstance(stale, ReplayMismatch)
                         else "stale_checkpoint")
                yield from self.block(stale, phase=phase, step_id=sid, op=op)
            yield from self.abandon_tail(sid, stale)
            return None

    def abandon_tail(self, sid: str, stale: StaleCheckpoint) -> Flow:
        """Re-plan from the step at ``sid``: it, and every observation and decision recorded
        after it, answered other questions than the ones now asked. They move into the history
        (``step.abandoned`` events) and are asked again as the workflow reaches them; effect
        steps after it and every operation stay, so nothing done is done twice."""
        if self.cancelling:
            raise self.cancelled()  # re-planning is new work
        # Only what was recorded before this worker took over can be stale: a step this
        # execution recorded (with a later seq) already answers the new question. Inside a
        # fan-out, a sibling branch's steps never asked about this one: they stay.
        start, through = self.steps[sid].seq, self.seq_at_load
        siblings = tuple(prefix for branches in list(self.fanouts)
                         if any(sid.startswith(branch) for branch in branches)
                         for prefix in branches if not sid.startswith(prefix))
        stale_tail = [key for key, step in list(self.steps.items())
                      if start <= step.seq <= through
                      and (step.kind is not StepKind.EFFECT or key == sid)]
        keep = tuple(key for key in stale_tail if key.startswith(siblings))
        yield from self.flush()
        yield Io("replan", (self.claim, Replan(reason=stale.message, step_id=sid,
                                               through_seq=through, keep=keep)))
        for key in stale_tail:
            if key not in keep:
                self.steps.pop(key, None)  # a sibling's re-plan may have dropped it already

    # -- flows ---------------------------------------------------------------------------------

    def step_flow(self, kind: StepKind, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, hashed_inputs: JSON, name: str | None = None,
                  max_age: timedelta | None = None, model_id: str | None = None,
                  prompt_hash: str | None = None, retry: Retry | None = None,
                  usage: UsageFn | None = None, prefix: str = "") -> Flow:
        """Pure, read, model, decision and value steps: replay if recorded, else call and record."""
        self.check_halt()
        sid = self.occurrence(step_id, prefix)
        name = name or callable_name(fn)
        if not self.is_async and _is_async_callable(fn):
            raise UsageError(f"step {sid!r} calls {name}, which is async: call it from an async"
                             " def workflow (AsyncRun), or pass a plain function", step_id=sid)
        hashed = _input_hash(hashed_inputs, sid)
        recorded = yield from self.replay_lookup(sid, kind, name, hashed)
        round_start = 0  # the attempts recorded before this round of calls
        if recorded is not None:
            if recorded.status is StepStatus.FAILED:
                error = recorded.error or {}
                raise StepFailed(self.run.run_id, sid, str(error.get("type")),
                                 str(error.get("message")), int(error.get("attempts", 1)))
            if max_age is None or recorded.observed_at is None or not self.may_reread(recorded):
                return recorded.result
            now = yield Io("now")
            if now - recorded.observed_at <= max_age.total_seconds() * 1000:
                return recorded.result
            round_start = recorded.attempt  # the observation expired: read again
        if self.cancelling:
            raise self.cancelled()  # before calling anything new
        base = StepRecord(run_id=self.run.run_id, step_id=sid, kind=kind, name=name,
                          input_hash=hashed, result=None, seq=self.next_seq(sid),
                          model_id=model_id, prompt_hash=prompt_hash)
        return (yield from self._call_step(base, fn, args, kwargs, round_start,
                                           step_policy(kind, retry, self.default_retry), usage))

    def _call_step(self, base: StepRecord, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], round_start: int, policy: Retry,
                   usage: UsageFn | None) -> Flow:
        """Call a step's function — again after a failed attempt, as ``policy`` allows, each
        failure recorded before its back-off — and record the result or the failure."""
        sid, kind = base.step_id, base.kind
        tried = self.attempts.get(sid, [])
        round_start = round_start_for(round_start, tried, base.input_hash)
        attempt, pending = next_attempt(round_start, tried)
        while True:
            if base.attempt != attempt:
                base = replace(base, attempt=attempt)
            if pending is not None:
                if attempt - round_start > policy.attempts:
                    # The code now allows fewer attempts than were made: no further call.
                    yield from self._fail_step(base, pending.error, attempt - 1 - round_start,
                                               None)
                yield from self._wait_for_retry(pending)
            now = None
            if kind is StepKind.READ or (self.run.deadline_at is not None
                                         and kind in (StepKind.MODEL, StepKind.DECISION)):
                now = yield Io("now")
                if past_deadline(self.run, now):
                    raise self.limit_reached(DeadlineExceeded(
                        self.run.run_id, self.run.deadline_at or 0, sid))
            if kind is StepKind.MODEL:
                spent = spent_budget(self.run)
                if spent is not None:
                    which, limit, amount = spent
                    raise self.limit_reached(BudgetExhausted(self.run.run_id, limit,
                                                             kind=which, spent=amount))
            if kind is StepKind.READ:
                base = replace(base, observed_at=now)
            try:
                value = yield Call(fn, args, kwargs)
            except UsageError:
                raise  # a mistake in how the step is called, not an outcome to record
            except Exception as exc:
                now = yield Io("now")
                decided = after_failure(policy, exc, failed_in_round=attempt - round_start,
                                        now=now, deadline_at=self.run.deadline_at,
                                        seed=f"{self.run.run_id}/{sid}/{attempt}")
                if decided.retry_at is None:
                    # Recorded, so that a resume takes the path this run took: the same
                    # StepFailed is raised again instead of asking again.
                    yield from self._fail_step(base, _error_evidence(exc),
                                               attempt - round_start, decided.why, exc)
                    raise  # unreachable: _fail_step raises
                pending = AttemptRecord(
                    run_id=self.run.run_id, step_id=sid, attempt=attempt, kind=kind,
                    name=base.name, input_hash=base.input_hash, error=_error_evidence(exc),
                    retry_at=decided.retry_at)
                # Durable before the wait: a restart continues the count and waits the rest.
                yield from self.write(Io("record_attempt", (self.claim, pending)))
                self.attempts.setdefault(sid, []).append(pending)
                attempt += 1
                continue
            return (yield from self._record_result(base, value, usage))

    def _wait_for_retry(self, pending: AttemptRecord) -> Flow:
        """Wait out what remains of a failed attempt's back-off (on the store's clock); a
        cancel asked for meanwhile stops the run before the next attempt."""
        now = yield Io("now")
        if pending.retry_at <= now:
            return
        yield Sleep((pending.retry_at - now) / 1000)
        fresh = yield Io("get_run", (self.run.run_id,))
        if fresh.fence != self.claim.fence or fresh.status is not RunStatus.RUNNING:
            self.halted = LostOwnership(self.run.run_id, self.claim.fence)
            raise self.halted
        if fresh.cancel_requested_at is not None:
            self.cancelling = True
            raise self.cancelled()

    def _fail_step(self, base: StepRecord, error: dict[str, str], attempts: int,
                   why: str | None, cause: BaseException | None = None) -> Flow:
        """Record the step failed (its last error, how many attempts, why no more) and raise
        ``StepFailed``; a resume raises the same from the ledger."""
        evidence: dict[str, Any] = dict(error)
        if attempts > 1:
            evidence["attempts"] = attempts
        if why:
            evidence["gave_up"] = why
        failed = replace(base, status=StepStatus.FAILED, error=evidence)
        yield from self.flush()
        yield from self.append_new(Io("record_step", (self.claim, failed)), base.step_id)
        self.steps[base.step_id] = failed
        raise StepFailed(self.run.run_id, base.step_id, error["type"], error["message"],
                         attempts) from cause

    def _record_result(self, base: StepRecord, value: Any, usage: UsageFn | None) -> Flow:
        sid = base.step_id
        require_json(value, "result", sid)
        refuse_secrets(value, "the result", sid)
        tokens = cost = None
        if base.kind is StepKind.MODEL:
            if usage is not None:
                try:
                    reported = yield Call(usage, (value,))
                except Exception as exc:
                    raise UsageError(f"the usage= function of step {sid!r} raised"
                                     f" {type(exc).__name__}: {redact(str(exc))}",
                                     step_id=sid) from exc
                tokens, cost = checked_usage(reported, sid)
            if tokens is None:
                tokens = reported_tokens(value)
        next_step_id = _next_step_id(sid, value) if base.kind is StepKind.DECISION else None
        step = replace(base, result=value, next_step_id=next_step_id, tokens=tokens, cost=cost)
        crashpoint("step.before_record", sid)
        if step.kind is StepKind.PURE:
            with self.seq_lock:
                self.pending.append(step)
                full = len(self.pending) >= PURE_BATCH
            self.steps[sid] = step
            if full:
                yield from self.flush()
        else:
            batch = self.take_pending()
            request = (Io("record_steps", (self.claim, [*batch, step])) if batch
                       else Io("record_step", (self.claim, step)))
            yield from self.append_new(request, sid)
            self.steps[sid] = step
        if tokens or cost:  # the store added the same to the run's totals, in that commit
            with self.seq_lock:  # fan-out branches on threads add theirs at the same time
                self.run = replace(self.run, tokens_spent=self.run.tokens_spent + (tokens or 0),
                                   cost_spent=self.run.cost_spent + (cost or 0.0))
        crashpoint("step.after_record", sid)
        return value

    def effect_flow(self, step_id: str, effect: Effect, payload: JSON,
                    operation_id: str | None, approval: bool = False,
                    prefix: str = "") -> Flow:
        """An effect step: replay, or walk the dispatch protocol from wherever the ledger stands.
        With ``approval``, no dispatch without a person's valid approval (see ``_authorize``)."""
        self.check_halt()
        sid = self.occurrence(step_id, prefix)
        if not self.is_async:
            _refuse_async_callables(effect)
        payload_bytes = checked_canonical(payload, "payload", sid)
        refuse_secrets(payload, "the payload", sid)
        payload_ref = digest(payload_bytes)
        # Every dispatch, first or after a crash, sends the payload exactly as stored.
        payload = loads(payload_bytes)
        op_id = operation_id or sid
        if not isinstance(op_id, str) or "\x00" in op_id:
            raise UsageError(f"invalid operation id {op_id!r}: a string without NUL",
                             step_id=sid)
        hashed = input_hash({"effect": effect.name, "operation_id": op_id,
                             "payload": payload_ref})
        recorded = yield from self.replay_lookup(sid, StepKind.EFFECT, effect.name, hashed,
                                                 self.operations.get(op_id))
        if recorded is not None:
            return recorded.result

        # An operation id the caller chose names the operation across the run's chain: one an
        # earlier run of the chain settled is never dispatched again (nor keyed afresh). A step's
        # own id, the default, names it within this run only.
        chained = operation_id is not None
        if op_id not in self.operations and chained and self.run.parent_run_id is not None:
            settled = yield from self._settled_in_chain(sid, effect, op_id, payload_ref)
            if settled is not None:
                return settled.receipt
        key_scope = (self.run.chain_id or self.run.run_id) if chained else self.run.run_id
        if op_id not in self.operations and one_commit_to_dispatching(effect, approval=approval):
            # Nothing stands between prepared and dispatching: one commit, then the call.
            op = yield from self._prepare_dispatching(sid, effect, op_id, payload_ref,
                                                      payload_bytes, key_scope)
            step = self._accepted_step(sid, effect, op, hashed)  # recorded on acceptance
            op = yield from self._call_owner(sid, effect, op, payload, step)
        else:
            op, payload = yield from self._prepared(sid, effect, op_id, payload, payload_bytes,
                                                    approval, key_scope)
            step = self._accepted_step(sid, effect, op, hashed)
        while True:
            decided = next_action(op.state, can_reconcile=effect.reconcile is not None,
                                  can_verify=effect.verify is not None)
            if decided.action is Action.DISPATCH and payload is None:
                yield from self.block(_changed_payload(self.run.run_id, sid, op),
                                      phase="reconcile_effect", op=op)
            if decided.action is Action.DISPATCH:
                op = yield from self._dispatch(sid, effect, op, payload, step)
            elif decided.action is Action.RECONCILE:
                op = yield from self._reconcile(sid, effect, op, payload, step)
            elif decided.action is Action.VERIFY:
                op = yield from self._verify(sid, effect, op, step)
            elif decided.action is Action.ACCEPT:
                op = yield from self._record(op, EffectState.ACCEPTED, receipt=op.receipt,
                                             step=step)
            elif decided.action is Action.REPLAY:
                if self.replans and sid not in self.steps and not self.cancelling:
                    # kept from before a re-plan: the step now points at it, so later replays
                    # find it directly
                    yield from self.append_new(Io("record_step", (self.claim, step)), sid)
                    self.steps[sid] = step
                return op.receipt
            elif decided.action is Action.REPLAY_REJECTION:
                raise EffectRejected(self.run.run_id, sid, op_id, op.error)
            else:
                yield from self.block(
                    NeedsReconciliation(self.run.run_id, sid, op_id, decided.reason),
                    phase="reconcile_effect", op=op)

    def _accepted_step(self, sid: str, effect: Effect, op: OperationRecord,
                       hashed: str) -> StepRecord:
        return StepRecord(run_id=self.run.run_id, step_id=sid, kind=StepKind.EFFECT,
                          name=effect.name, input_hash=hashed, result=op.receipt,
                          seq=self.next_seq(sid), operation_id=op.operation_id)

    def _new_operation(self, sid: str, effect: Effect, op_id: str, payload_ref: str,
                       key_scope: str, *, approval: bool = False,
                       target: str | None = None) -> OperationRecord:
        return OperationRecord(
            run_id=self.run.run_id, operation_id=op_id, step_id=sid, effect=effect.name,
            state=EffectState.PREPARED, payload_ref=payload_ref,
            effect_key=mint_effect_key(key_scope, op_id),  # minted here, once
            approval_required=approval, target_digest=target)

    def _prepare_dispatching(self, sid: str, effect: Effect, op_id: str, payload_ref: str,
                             payload_bytes: bytes, key_scope: str) -> Flow:
        """A new operation prepared and committed "dispatching" at once, no gate standing
        between (see ``one_commit_to_dispatching``): so there is no "prepared" to crash after.
        Enters the dispatch (``enter_dispatch``), for ``_call_owner`` to leave."""
        if self.cancelling:
            raise self.cancelled()  # the store would refuse it too
        crashpoint("effect.before_prepare", sid)
        op = self._new_operation(sid, effect, op_id, payload_ref, key_scope)
        # Flushed before the dispatch is entered: a flush refused at the history limit blocks
        # the run, which first waits for every dispatch in flight — this one too, if entered.
        yield from self.flush()
        yield from self.enter_dispatch()
        try:
            op = yield Io("prepare_and_mark_dispatching", (self.claim, op, payload_bytes))
        except BaseException as exc:
            self.leave_dispatch()  # nothing was written: no dispatch in flight
            if isinstance(exc, HistoryLimitReached):
                yield from self.block_at_history_limit(exc, sid)
            raise
        return op

    def _prepared(self, sid: str, effect: Effect, op_id: str, payload: JSON,
                  payload_bytes: bytes, approval: bool, key_scope: str) -> Flow:
        """The operation, prepared now or as the ledger has it, and the payload it carries."""
        payload_ref = digest(payload_bytes)
        op = self.operations.get(op_id)
        if op is None:
            if self.cancelling:
                raise self.cancelled()
            crashpoint("effect.before_prepare", sid)
            # Read now too, so that an approval given before the run reaches its gate (it
            # crashed in between) is bound to the target's state it will find there.
            target = (yield from self._target_digest(sid, effect, payload)) if approval else None
            op = self._new_operation(sid, effect, op_id, payload_ref, key_scope,
                                     approval=approval, target=target)
            yield from self.flush()
            yield from self.append_new(Io("prepare_effect", (self.claim, op, payload_bytes)),
                                       sid)
            self.operations[op_id] = op
            crashpoint("effect.after_prepared", sid)
        else:
            if op.payload_ref != payload_ref and may_reprepare(op, replans=self.replans):
                op = yield from self._reprepare(sid, effect, op, payload, payload_bytes,
                                                payload_ref)
            op, payload = yield from self._prepared_payload(sid, effect, op, payload_ref)
        if approval and not op.approval_required:
            op = replace(op, approval_required=True)  # the gate records it in the store too
        return op, payload

    def _reprepare(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON,
                   payload_bytes: bytes, payload_ref: str) -> Flow:
        """The payload changed before it ever left — of an effect that waits for approval, or
        under ``replan``: it is prepared anew, under the same key (never sent), and must be
        approved anew where it needs approval."""
        if self.cancelling:
            raise self.cancelled()
        target = yield from self._target_digest(sid, effect, payload)
        op = replace(op, payload_ref=payload_ref, target_digest=target)
        yield from self.write(Io("reprepare_effect", (self.claim, op, payload_bytes)))
        self.operations[op.operation_id] = op
        return op

    def _target_digest(self, sid: str, effect: Effect, payload: JSON) -> Flow:
        """The digest of the effect's target's state as it reads now (None without one)."""
        if effect.target_state is None:
            return None
        state = yield Call(effect.target_state, (loads(canonical(payload)),))
        require_json(state, "target state", sid)
        return digest(canonical(state))

    def _authorize(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON) -> Flow:
        """The gate between prepared and dispatching: the store returns an approval of this
        payload on the target as it now reads — or, atomically, makes the run wait."""
        target = yield from self._target_digest(sid, effect, payload)
        yield from self.release_turn()  # the gate may release the run
        try:
            self.check_halt()  # a sibling branch stopped the run meanwhile: nothing new
            gate = yield from self.write(
                Io("await_approval", (self.claim, op.operation_id, target)))
            if gate.approval is None:
                error = awaiting(self.run.run_id, gate.waiting_for)
                self.halted = error  # the run is released: this run object does nothing more
                raise error
        finally:
            self.end_turn()
        op = replace(op, approval_required=True, target_digest=target)
        self.operations[op.operation_id] = op
        self.approvals[op.operation_id] = gate.approval
        return op

    def _mark_dispatching(self, sid: str, effect: Effect, op: OperationRecord,
                          payload: JSON) -> Flow:
        """Commit "dispatching" — through the approval gate first when the effect needs one.
        The store checks the approval again in the dispatch's own transaction."""
        for attempt in range(1, _GATE_ATTEMPTS + 1):
            if op.approval_required:
                op = yield from self._authorize(sid, effect, op, payload)
            yield from self.enter_dispatch()  # left by _call_owner once the outcome is recorded
            try:
                return (yield from self.write(
                    Io("mark_dispatching", (self.claim, op.operation_id))))
            except BaseException as exc:
                self.leave_dispatch()
                if not isinstance(exc, ApprovalInvalid) or attempt == _GATE_ATTEMPTS:
                    raise
                # It lapsed between the gate and the dispatch (or the ledger asks for an
                # approval this code did not): ask the gate, which now makes the run wait.
                op = replace(op, approval_required=True)
        raise AssertionError("unreachable")

    def _settled_in_chain(self, sid: str, effect: Effect, op_id: str,
                          payload_ref: str) -> Flow:
        """The operation as an earlier run of this chain accepted it, or None — looked up in
        place, never copied; one it rejected raises that rejection again. It stands for this
        run too, but only for the same effect and the very same payload: a changed payload is
        never sent under its key — it blocks, or under ``replan`` (as within one run) what
        happened is replayed."""
        settled: OperationRecord | None = yield Io("chain_operation",
                                                   (self.run.chain_id, op_id))
        if settled is None:
            return None
        if settled.effect != effect.name:
            yield from self.block(
                ReplayMismatch(self.run.run_id, sid,
                               f"operation {op_id!r} was settled by run {settled.run_id!r} of"
                               f" this chain for effect {settled.effect!r}"),
                phase="replay_mismatch", op=settled)
        if settled.payload_ref != payload_ref and not self.replans:
            yield from self.block(
                StaleCheckpoint(self.run.run_id, sid,
                                f"the payload of {op_id!r} changed since run"
                                f" {settled.run_id!r} of this chain settled it; it is never"
                                " sent again under its key"),
                phase="stale_checkpoint", op=settled,
                evidence={"new_payload_ref": payload_ref, "settled_by": settled.run_id})
        if settled.state is EffectState.REJECTED:
            raise EffectRejected(self.run.run_id, sid, op_id, settled.error)
        return settled

    def _prepared_payload(self, sid: str, effect: Effect, op: OperationRecord,
                          payload_ref: str) -> Flow:
        """The operation and the payload it may be sent with: the payload as it was prepared (a
        replacement worker never regenerates it). Under ``replan`` a payload changed after it
        may have been sent is never sent again (None): its outcome is reconciled, a receipt is
        replayed, and a dispatch would block."""
        if op.effect != effect.name or (op.step_id != sid and not self.replans):
            yield from self.block(
                ReplayMismatch(self.run.run_id, sid,
                               f"operation {op.operation_id!r} was prepared by step"
                               f" {op.step_id!r} for effect {op.effect!r}"),
                phase="replay_mismatch", op=op)
        if op.payload_ref != payload_ref:
            if not self.replans:
                yield from self.block(
                    StaleCheckpoint(self.run.run_id, sid,
                                    f"the payload of {op.operation_id!r} changed since it was"
                                    " prepared; it is never resent under the old key"),
                    phase="stale_checkpoint", op=op, evidence={"new_payload_ref": payload_ref})
            return op, None  # may have been sent (a never-sent one was prepared anew)
        try:
            stored = yield Io("get_artifact", (op.payload_ref,))
        except (ArtifactMissing, ArtifactCorrupt) as exc:
            yield from self.block(
                NeedsReconciliation(self.run.run_id, sid, op.operation_id, exc.message),
                phase="unreadable_record", op=op, evidence=_error_evidence(exc))
        return op, loads(stored)

    def _record(self, op: OperationRecord, state: EffectState, *, receipt: JSON = None,
                error: JSON = None, step: StepRecord | None = None) -> Flow:
        kept_receipt = receipt if receipt is not None else op.receipt
        if step is not None:
            step = replace(step, result=kept_receipt)
        yield from self.flush()
        yield Io("record_outcome", (self.claim, op.operation_id, state),
                 {"receipt": receipt, "error": error, "step": step})
        op = replace(op, state=state, receipt=kept_receipt, error=error)
        self.operations[op.operation_id] = op
        if step is not None:
            self.steps[step.step_id] = step
        return op

    def _key(self, op: OperationRecord) -> EffectKey:
        return EffectKey(op.effect_key, op.operation_id, self.run.run_id, self.claim.fence)

    def _dispatch(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON,
                  step: StepRecord) -> Flow:
        """prepared → dispatching → call → applied / accepted / rejected / unknown.

        From the moment "dispatching" is committed until an outcome is, every way out leaves
        the operation ``unknown`` (for reconciliation) — never failed, never forgotten.
        """
        if self.cancelling:
            raise self.cancelled()  # the store would refuse it too
        try:
            op = yield from self._mark_dispatching(sid, effect, op, payload)
        except DeadlineExceeded:
            if op.state is not EffectState.PREPARED:
                # Reconciled as never applied, and past the deadline nothing is sent again:
                # it stays prepared, not uncertain (as after a cancel).
                yield from self._record(op, EffectState.PREPARED)
            raise
        return (yield from self._call_owner(sid, effect, op, payload, step))

    def _call_owner(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON,
                    step: StepRecord) -> Flow:
        """The call of a dispatch committed as "dispatching", and its recorded outcome; then
        the dispatch entered before that commit (``enter_dispatch``, by ``_mark_dispatching``
        or ``_prepare_dispatching``) is left."""
        try:
            return (yield from self._call_and_record(sid, effect, op, payload, step))
        finally:
            self.leave_dispatch()

    def _call_and_record(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON,
                         step: StepRecord) -> Flow:
        self.operations[op.operation_id] = op
        crashpoint("effect.after_dispatching", sid)
        try:
            receipt = yield Call(effect.execute, (payload, self._key(op)))
            require_json(receipt, "receipt", sid)
            # A receipt is the owner's word that it happened: keep it, with any credential in
            # it (a client_secret, say) masked, rather than lose the outcome.
            receipt = redact_json(receipt)
        except NotSent as exc:
            if op.dispatch_count > 1:
                # This attempt never left, but an earlier one may have: still uncertain.
                return (yield from self._record(op, EffectState.UNKNOWN,
                                                error=_error_evidence(exc)))
            op = yield from self._record(op, EffectState.PREPARED, error=_error_evidence(exc))
            if op.dispatch_count >= effect.max_dispatches:
                raise
            yield Sleep(_NOT_SENT_BACKOFF_S * 2 ** op.dispatch_count)
            return op
        except Rejected as exc:
            yield from self._record(op, EffectState.REJECTED, error=redact_json(exc.evidence))
            raise EffectRejected(self.run.run_id, sid, op.operation_id, exc.evidence) from exc
        except Exception as exc:
            # Timeout, dropped connection, a bad receipt: the outcome is unknown; reconcile.
            return (yield from self._record(op, EffectState.UNKNOWN, error=_error_evidence(exc)))
        except BaseException as exc:
            yield from self._interrupted(sid, op, exc)
            raise
        crashpoint("effect.after_receiver_commit", sid)
        return (yield from self._applied(sid, effect, op, receipt, step))

    def _interrupted(self, sid: str, op: OperationRecord, exc: BaseException) -> Flow:
        """Cancelled or interrupted mid-call: leave the evidence (the outcome is unknown, so
        the next worker reconciles it) and stop this run object; the interrupt goes on."""
        if isinstance(exc, (LostOwnership, SimulatedCrash)):
            self.halted = exc
            return  # this worker may not write anything more
        # Agent code that swallows the interrupt gets this from its next step; the run is then
        # released, not blocked: the next worker's reconcile may well settle it on its own.
        self.halted = NeedsReconciliation(
            self.run.run_id, sid, op.operation_id,
            f"the call was interrupted ({type(exc).__name__}); resume the run to reconcile it")
        self.release_on_halt = True
        yield from self._record(op, EffectState.UNKNOWN, error=_error_evidence(exc))

    def _applied(self, sid: str, effect: Effect, op: OperationRecord, receipt: JSON,
                 step: StepRecord) -> Flow:
        if effect.verify is None:  # nothing to verify: applied and accepted are one commit
            op = yield from self._record(op, EffectState.ACCEPTED, receipt=receipt, step=step)
            crashpoint("effect.after_outcome", sid)
            crashpoint("effect.after_accept", sid)
        else:
            op = yield from self._record(op, EffectState.APPLIED, receipt=receipt)
            crashpoint("effect.after_outcome", sid)
        return op

    def _reconcile(self, sid: str, effect: Effect, op: OperationRecord, payload: JSON,
                   step: StepRecord) -> Flow:
        assert effect.reconcile is not None
        try:
            answer = yield Call(effect.reconcile, (self._key(op),))
        except Exception as exc:
            answer = Unknown(f"reconcile raised {type(exc).__name__}: {exc}")
        now = yield Io("now")
        decided = after_reconcile(answer, now=now, first_dispatched_at=op.first_dispatched_at,
                                  dedup_retention=effect.dedup_retention,
                                  dispatch_count=op.dispatch_count,
                                  max_dispatches=effect.max_dispatches)
        if decided.action is Action.RECORD_APPLIED:
            try:
                require_json(answer.receipt, "reconciled receipt", sid)
            except UsageError as exc:
                decided = Next(Action.BLOCK, f"the owner has it, but {exc.message}")
            else:
                return (yield from self._applied(sid, effect, op, redact_json(answer.receipt),
                                                 step))
        if decided.action is Action.DISPATCH:
            if self.cancelling:
                # The owner says it never happened, and nothing new may start: it stays
                # prepared, never dispatched again, and the run ends cancelled.
                yield from self._record(op, EffectState.PREPARED)
                raise self.cancelled()
            if payload is None:
                yield from self.block(_changed_payload(self.run.run_id, sid, op),
                                      phase="reconcile_effect", op=op)
            return (yield from self._dispatch(sid, effect, op, payload, step))
        yield from self.block(NeedsReconciliation(self.run.run_id, sid, op.operation_id,
                                                  decided.reason),
                              phase="reconcile_effect", op=op)
        raise AssertionError("unreachable")

    def _verify(self, sid: str, effect: Effect, op: OperationRecord, step: StepRecord) -> Flow:
        assert effect.verify is not None
        try:
            ok = yield Call(effect.verify, (op.receipt,), timeout=effect.verify_timeout_s)
            reason = "the verifier returned a false value"
        except CallTimedOut:
            ok, reason = False, (f"the verifier did not answer within"
                                 f" {effect.verify_timeout_s:g}s")
        except Exception as exc:
            ok, reason = False, f"the verifier raised {type(exc).__name__}: {exc}"
        if not ok:
            yield from self.block(
                VerificationFailed(self.run.run_id, sid, op.operation_id, reason),
                phase="verify_effect", op=op)
        op = yield from self._record(op, EffectState.ACCEPTED, step=step)
        crashpoint("effect.after_accept", sid)
        return op


def _changed_payload(run_id: str, sid: str, op: OperationRecord) -> NeedsReconciliation:
    return NeedsReconciliation(
        run_id, sid, op.operation_id,
        "the re-planned workflow asks for another payload than the one that may already have"
        " been sent under this key, and the owner says it did not happen: it is never resent"
        " under the old key; settle it (resolve --not-applied prepares it anew) or abandon")


def _refuse_async_callables(effect: Effect) -> None:
    """Before anything is prepared: an async function cannot be awaited by a plain workflow,
    and finding out during dispatch would look like an uncertain outcome."""
    for role in ("execute", "reconcile", "verify", "target_state"):
        if _is_async_callable(getattr(effect, role)):
            raise UsageError(f"effect {effect.name!r} has an async {role}; use it from an"
                             " async def workflow (AsyncRun)", effect=effect.name)


def _next_step_id(sid: str, value: JSON) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("next_step_id"), str):
        return str(value["next_step_id"])
    raise InvalidDecision(sid, f"a {type(value).__name__}")


def _model_inputs(model: str, messages: JSON, tools: JSON,
                  params: dict[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """(hashed inputs, prompt hash, call kwargs) of a model step."""
    hashed_params = {k: v for k, v in params.items() if k not in _UNHASHED_MODEL_PARAMS}
    call = {"model": model, "messages": messages, **params}
    if tools is not None:
        call["tools"] = tools
    hashed = {"model": model, "messages": messages, "tools": tools, "params": hashed_params}
    if isinstance(messages, Transcript):
        prompt = messages.reference()
    else:
        require_json(messages, "messages", allow_tuples=True)
        prompt = messages
    return hashed, input_hash({"messages": prompt}), call


def _input_hash(inputs: Any, sid: str) -> str:
    """sha256 of a step's inputs as their hash covers them (``hashed_form``: Secrets masked,
    Transcripts by reference). Most inputs hold neither, and are encoded as they are in one
    walk; only the others are copied into their hashed form first."""
    encoded = canonical_if_json(inputs, allow_tuples=True)
    if encoded is None:
        encoded = checked_canonical(hashed_form(inputs), "inputs", sid, allow_tuples=True)
    return sha256_hex(encoded)


def _listing_messages(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called with its ``messages`` transcript as a plain list."""
    if _is_async_callable(fn):
        async def listing_async(*, messages: Transcript, **kwargs: Any) -> Any:
            return await fn(messages=list(messages), **kwargs)
        return listing_async

    def listing(*, messages: Transcript, **kwargs: Any) -> Any:
        return fn(messages=list(messages), **kwargs)
    return listing


def _as_max_age(max_age: timedelta | float | None) -> timedelta | None:
    if max_age is None or isinstance(max_age, timedelta):
        return max_age
    return timedelta(seconds=max_age)


_VALUES: dict[str, Callable[[], JSON]] = {
    "now": lambda: datetime.now(UTC).isoformat(),
    "random": lambda: int.from_bytes(os.urandom(7)) / 2**56,
    "uuid": lambda: str(uuidlib.uuid4()),
}

# Branches run on threads in a plain workflow: enough for I/O-bound steps, bounded so that a
# fan-out over a long list does not open a connection per item.
_DEFAULT_PARALLEL_THREADS = 8


def _branches(group: str, branches: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    """(name, function) of each branch: a mapping name → function, or a list (named 0, 1, …)."""
    if isinstance(branches, Mapping):
        named = [(name, fn) for name, fn in branches.items()]
    elif isinstance(branches, Sequence) and not isinstance(branches, str):
        named = [(str(index), fn) for index, fn in enumerate(branches)]
    else:
        raise UsageError(f"fan-out {group!r} takes a mapping name → function or a list of"
                         " functions, each called with the branch's run")
    for name, fn in named:
        if not isinstance(name, str) or not name or any(c in name for c in "/#\x00"):
            raise UsageError(f"branch name {name!r} of {group!r}: a non-empty string without"
                             " '/', '#' or NUL (it becomes part of every step id in the branch)")
        if not callable(fn):
            raise UsageError(f"branch {name!r} of {group!r} is not callable")
    return named


def _outcome(named: list[tuple[str, Any]], results: list[Any],
             errors: list[BaseException | None], as_mapping: bool) -> Any:
    """The branches' results in their order — or the first branch's error, in branch order, so
    which error a fan-out raises does not depend on timing."""
    for error in errors:
        if error is not None:
            raise error
    if as_mapping:
        return {name: result for (name, _), result in zip(named, results, strict=True)}
    return results


class _RunBase:
    def __init__(self, core: RunCore, prefix: str = "") -> None:
        self._core = core
        self._prefix = prefix  # inside a fan-out branch: "group.branch/"

    @property
    def run_id(self) -> str:
        return self._core.run.run_id

    @property
    def fence(self) -> int:
        """This worker's fence token for the run (grows with every takeover)."""
        return self._core.claim.fence

    def _sync(self, flow: Flow) -> Any:
        return drive(self._core.store, flow, self._core)

    async def _async(self, flow: Flow) -> Any:
        return await adrive(self._core.store, flow, self._core)

    # The flows of each step method, shared by Run and AsyncRun.

    def _step(self, kind: StepKind, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...],
              kwargs: dict[str, Any], **options: Any) -> Flow:
        options.setdefault("hashed_inputs", [args, kwargs])
        return self._core.step_flow(kind, step_id, fn, args, kwargs, prefix=self._prefix,
                                    **options)

    def _model(self, step_id: str, fn: Callable[..., Any], model: str, messages: JSON,
               tools: JSON, params: dict[str, Any], retry: Retry | int | None,
               usage: UsageFn | None) -> Flow:
        hashed, prompt_hash, call = _model_inputs(model, messages, tools, params)
        name = callable_name(fn)
        if isinstance(messages, Transcript):
            fn = _listing_messages(fn)  # model SDKs want a list; built only if it is called
        return self._step(StepKind.MODEL, step_id, fn, (), call, hashed_inputs=hashed,
                          name=name, model_id=model, prompt_hash=prompt_hash,
                          retry=as_retry(retry, "retry"), usage=usage)

    def _effect(self, step_id: str, effect: Effect, payload: JSON, operation_id: str | None,
                approval: bool) -> Flow:
        return self._core.effect_flow(step_id, effect, payload, operation_id, approval,
                                      self._prefix)

    def _value(self, kind: str, step_id: str) -> Flow:
        return self._step(StepKind.VALUE, step_id, _VALUES[kind], (), {}, hashed_inputs={},
                          name=kind)

    def _group(self, step_id: str, branches: Any) -> tuple[list[tuple[str, Any]], list[str]]:
        """The branches of a fan-out and the step-id prefix of each: ``group.name/``."""
        self._core.check_halt()
        group = self._core.occurrence(step_id, self._prefix)
        named = _branches(group, branches)
        if len({name for name, _ in named}) != len(named):
            raise UsageError(f"fan-out {group!r} names a branch twice")
        prefixes = [f"{group}.{name}/" for name, _ in named]
        self._core.fanouts.append(prefixes)
        return named, prefixes


class Run(_RunBase):
    """What a plain ``def`` workflow receives. Every method records or replays one step.

    >>> @workflow("greet")
    ... def greet(run: Run, name: str) -> str:
    ...     return run.pure("format", lambda n: f"hello {n}", name)
    """

    def pure(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A deterministic computation; recorded so a resume need not recompute it."""
        return self._sync(self._step(StepKind.PURE, step_id, fn, args, kwargs))

    def read(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
             max_age: timedelta | float | None = None, retry: Retry | int | None = None,
             **kwargs: Any) -> Any:
        """An observation of the world; replayed until ``max_age`` says it expired.

        ``retry`` (a ``Retry``, or a number of attempts) overrides the run's ``step_attempts``:
        a failed attempt is recorded, then tried again after its back-off."""
        return self._sync(self._step(StepKind.READ, step_id, fn, args, kwargs,
                                     max_age=_as_max_age(max_age),
                                     retry=as_retry(retry, "retry")))

    def model(self, step_id: str, fn: Callable[..., Any], /, *, model: str, messages: JSON,
              tools: JSON = None, retry: Retry | int | None = None,
              usage: UsageFn | None = None, **params: Any) -> Any:
        """A model call, ``fn(model=, messages=, tools=, **params)``; replayed, never re-generated.

        The tokens it used are recorded (read from a ``usage`` field of the response, or from
        ``usage(response) -> {"tokens": int, "cost": float}``) and count against the run's
        budget. ``retry`` as for ``read``."""
        return self._sync(self._model(step_id, fn, model, messages, tools, params, retry, usage))

    def decide(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The planner's choice: ``fn`` returns the next step id (or a dict with
        ``next_step_id``); the choice is replayed, never asked again."""
        return self._sync(self._step(StepKind.DECISION, step_id, fn, args, kwargs))

    def effect(self, step_id: str, effect: Effect, /, *, payload: JSON,
               operation_id: str | None = None, approval: bool = False) -> Any:
        """A change in another system, dispatched at most once; returns the owner's receipt.

        With ``approval=True`` it is prepared, then dispatched only under a person's approval
        of this very payload (and target state, see ``Effect.target_state``): without one the
        run waits (``AwaitingApproval``) until ``safepoint.approve`` releases it."""
        return self._sync(self._effect(step_id, effect, payload, operation_id, approval))

    def now(self, step_id: str = "now") -> datetime:
        """The current time, recorded: a resume sees the same instant."""
        return datetime.fromisoformat(self._sync(self._value("now", step_id)))

    def random(self, step_id: str = "random") -> float:
        """A random float in [0, 1), recorded."""
        return float(self._sync(self._value("random", step_id)))

    def uuid(self, step_id: str = "uuid") -> str:
        """A random UUID string, recorded."""
        return str(self._sync(self._value("uuid", step_id)))

    def parallel(self, step_id: str, branches: Mapping[str, Callable[[Run], Any]]
                 | Sequence[Callable[[Run], Any]], /, *,
                 max_threads: int = _DEFAULT_PARALLEL_THREADS) -> Any:
        """Fan out: call each branch with a run of its own, at once, and return their results
        (a dict for a mapping of branches, a list for a list).

        Every step id in a branch is prefixed with the branch (``fetch.eu/price``), so the ids
        are stable however the branches interleave. After a crash the finished branches replay
        from the ledger and only the unfinished ones do anything; each branch's effects are
        recovered operation by operation. The first error, in branch order, is raised once
        every branch has stopped.

        >>> prices = run.parallel("fetch", {r: lambda b, r=r: b.read("price", get, r)
        ...                                 for r in ("eu", "us")})
        """
        named, prefixes = self._group(step_id, branches)
        if max_threads < 1:
            raise UsageError("max_threads must be 1 or more")
        results: list[Any] = [None] * len(named)
        errors: list[BaseException | None] = [None] * len(named)
        with ThreadPoolExecutor(max_workers=min(max_threads, len(named) or 1),
                                thread_name_prefix=f"safepoint-{step_id}") as pool:
            futures = [pool.submit(fn, Run(self._core, prefix))
                       for (_, fn), prefix in zip(named, prefixes, strict=True)]
            for index, future in enumerate(futures):
                errors[index] = future.exception()  # waits; BaseExceptions included
                if errors[index] is None:
                    results[index] = future.result()
        return _outcome(named, results, errors, isinstance(branches, Mapping))

    def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """End this run and carry on in a successor called with ``args`` and ``kwargs`` (after
        its ``run``): same workflow and version, a fresh history, the same chain. Keeps a long
        run under its history limit; call it at a deterministic point (every N iterations).

        The state must be JSON (and never a credential). Effects settled in this run or any run
        before it in the chain are found by their ``operation_id`` — never dispatched again —
        when that id was given explicitly. The run blocks instead while an effect of it is
        uncertain, and ends cancelled if a cancel was asked for. ``start`` and ``resume`` of
        the first run's id return the result of the chain's last run.

        >>> if step % 1000 == 999:
        ...     run.continue_as_new(step + 1, totals)
        """
        raise self._core.continue_as_new(args, kwargs)


class AsyncRun(_RunBase):
    """What an ``async def`` workflow receives: the methods of ``Run``, awaited."""

    async def pure(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
                   **kwargs: Any) -> Any:
        return await self._async(self._step(StepKind.PURE, step_id, fn, args, kwargs))

    async def read(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
                   max_age: timedelta | float | None = None, retry: Retry | int | None = None,
                   **kwargs: Any) -> Any:
        return await self._async(self._step(StepKind.READ, step_id, fn, args, kwargs,
                                            max_age=_as_max_age(max_age),
                                            retry=as_retry(retry, "retry")))

    async def model(self, step_id: str, fn: Callable[..., Any], /, *, model: str,
                    messages: JSON, tools: JSON = None, retry: Retry | int | None = None,
                    usage: UsageFn | None = None, **params: Any) -> Any:
        return await self._async(self._model(step_id, fn, model, messages, tools, params,
                                             retry, usage))

    async def decide(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
                     **kwargs: Any) -> Any:
        return await self._async(self._step(StepKind.DECISION, step_id, fn, args, kwargs))

    async def effect(self, step_id: str, effect: Effect, /, *, payload: JSON,
                     operation_id: str | None = None, approval: bool = False) -> Any:
        return await self._async(self._effect(step_id, effect, payload, operation_id,
                                              approval))

    # Recording a value is a ledger write, which an async store can only do awaited.
    async def now(self, step_id: str = "now") -> datetime:
        return datetime.fromisoformat(await self._async(self._value("now", step_id)))

    async def random(self, step_id: str = "random") -> float:
        return float(await self._async(self._value("random", step_id)))

    async def uuid(self, step_id: str = "uuid") -> str:
        return str(await self._async(self._value("uuid", step_id)))

    async def gather(self, step_id: str, branches: Mapping[str, Callable[[AsyncRun], Any]]
                     | Sequence[Callable[[AsyncRun], Any]], /) -> Any:
        """``Run.parallel`` for async workflows: each branch is a coroutine function called
        with a run of its own, all awaited together on this event loop."""
        named, prefixes = self._group(step_id, branches)
        settled = await asyncio.gather(
            *(fn(AsyncRun(self._core, prefix))
              for (_, fn), prefix in zip(named, prefixes, strict=True)),
            return_exceptions=True)
        errors = [r if isinstance(r, BaseException) else None for r in settled]
        return _outcome(named, list(settled), errors, isinstance(branches, Mapping))

    async def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """``Run.continue_as_new``, awaited: ``await run.continue_as_new(step + 1, totals)``."""
        raise self._core.continue_as_new(args, kwargs)
