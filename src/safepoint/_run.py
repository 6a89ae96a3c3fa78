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

import inspect
import os
import uuid as uuidlib
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from ._canonical import JSON, canonical, digest, input_hash, loads, require_json
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
)
from ._flow import Call, Flow, Io, Sleep, adrive, callable_name, drive
from ._history import successor_inputs
from ._recovery import build_record
from ._secrets import mask_secrets, redact, redact_json, refuse_secrets
from .errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    Cancelled,
    ContinueAsNew,
    EffectRejected,
    HistoryLimitReached,
    InvalidDecision,
    InvalidStepId,
    LostOwnership,
    NeedsReconciliation,
    ReplayMismatch,
    RunBlocked,
    StaleCheckpoint,
    StepFailed,
    UsageError,
    VerificationFailed,
)
from .types import (
    Claim,
    EffectState,
    OperationRecord,
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
_SETTLED = (EffectState.ACCEPTED, EffectState.REJECTED)


def _error_evidence(exc: BaseException) -> dict[str, str]:
    return {"type": type(exc).__name__, "message": redact(str(exc))[:2000]}


class RunCore:
    """The state one worker holds while it executes a run it has claimed."""

    def __init__(self, store: Store | AsyncStore, claim: Claim, run: RunRecord,
                 steps: dict[str, StepRecord], operations: dict[str, OperationRecord], *,
                 is_async: bool) -> None:
        self.store = store
        self.is_async = is_async
        self.claim = claim
        self.run = run
        self.steps = steps
        self.operations = operations
        self.occurrences: dict[str, int] = {}
        self.last_seq = max((step.seq for step in steps.values()), default=0)
        # Where the ledger stood when this worker took over: an observation recorded last,
        # with no effect left open after it, may still be refreshed (see ``may_reread``).
        self.seq_at_load = self.last_seq
        self.open_at_load = any(op.state not in _SETTLED for op in operations.values())
        self.halted: BaseException | None = None
        self.release_on_halt = False  # halted by an interrupt: give the run back, don't block
        # Asked to stop: replay and settle what is in flight, start nothing new.
        self.cancelling = run.cancel_requested_at is not None

    # -- shared pieces -------------------------------------------------------------------------

    def occurrence(self, step_id: str) -> str:
        """The id of this call: ``step_id`` the first time, ``step_id#2`` the second, …"""
        if not isinstance(step_id, str) or not step_id or "#" in step_id or "\x00" in step_id:
            raise InvalidStepId(step_id)
        count = self.occurrences.get(step_id, 0) + 1
        self.occurrences[step_id] = count
        return step_id if count == 1 else f"{step_id}#{count}"

    def next_seq(self, sid: str) -> int:
        """The ledger order of a newly recorded step (a re-recorded step keeps its place)."""
        if sid in self.steps:
            return self.steps[sid].seq
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

    def append_new(self, request: Io, sid: str) -> Flow:
        """A write that records something new (a step, a prepared effect). At the run's hard
        history limit the store refuses it: the run blocks, to be continued as new."""
        try:
            return (yield request)
        except HistoryLimitReached as limit:
            yield from self.block(limit, phase="history_limit", step_id=sid,
                                  evidence={"history": limit.size, "hard_limit": limit.limit})
            raise

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
        record = build_record(self.run, phase=phase, reason=error.message, step_id=step_id,
                              op=op, evidence=evidence)
        yield Io("finish_run", (self.claim, RunStatus.BLOCKED), {"recovery_record": record})
        error.record = record
        self.halted = error

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

    # -- flows ---------------------------------------------------------------------------------

    def step_flow(self, kind: StepKind, step_id: str, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, hashed_inputs: JSON, name: str | None = None,
                  max_age: timedelta | None = None, model_id: str | None = None,
                  prompt_hash: str | None = None) -> Flow:
        """Pure, read, model, decision and value steps: replay if recorded, else call and record."""
        self.check_halt()
        sid = self.occurrence(step_id)
        name = name or callable_name(fn)
        if not self.is_async and _is_async_callable(fn):
            raise UsageError(f"step {sid!r} calls {name}, which is async: call it from an async"
                             " def workflow (AsyncRun), or pass a plain function", step_id=sid)
        hashed_inputs = mask_secrets(hashed_inputs)  # a Secret is passed on, never hashed
        require_json(hashed_inputs, "inputs", sid, allow_tuples=True)
        hashed = input_hash(hashed_inputs)
        try:
            recorded = self.check_replay(sid, kind, name, hashed)
        except StaleCheckpoint as stale:
            phase = "replay_mismatch" if isinstance(stale, ReplayMismatch) else "stale_checkpoint"
            yield from self.block(stale, phase=phase, step_id=sid)
            raise  # unreachable: block raises
        attempt = 1
        observed_at = None
        if recorded is not None:
            if recorded.status is StepStatus.FAILED:
                error = recorded.error or {}
                raise StepFailed(self.run.run_id, sid, str(error.get("type")),
                                 str(error.get("message")))
            if max_age is None or recorded.observed_at is None or not self.may_reread(recorded):
                return recorded.result
            now = yield Io("now")
            if now - recorded.observed_at <= max_age.total_seconds() * 1000:
                return recorded.result
            attempt = recorded.attempt + 1  # the observation expired: read again
        if self.cancelling:
            raise self.cancelled()  # before calling anything new
        if kind is StepKind.READ:
            observed_at = yield Io("now")
        base = StepRecord(run_id=self.run.run_id, step_id=sid, kind=kind, name=name,
                          input_hash=hashed, result=None, seq=self.next_seq(sid),
                          attempt=attempt, model_id=model_id, prompt_hash=prompt_hash,
                          observed_at=observed_at)
        try:
            value = yield Call(fn, args, kwargs)
        except UsageError:
            raise  # a mistake in how the step is called, not an outcome to record
        except Exception as exc:
            # Recorded, so that a resume takes the path this run took: the same StepFailed
            # is raised again instead of asking again.
            failed = replace(base, status=StepStatus.FAILED, error=_error_evidence(exc))
            yield from self.append_new(Io("record_step", (self.claim, failed)), sid)
            self.steps[sid] = failed
            raise StepFailed(self.run.run_id, sid, type(exc).__name__,
                             failed.error["message"]) from exc  # type: ignore[index]
        require_json(value, "result", sid)
        refuse_secrets(value, "the result", sid)
        next_step_id = _next_step_id(sid, value) if kind is StepKind.DECISION else None
        step = replace(base, result=value, next_step_id=next_step_id)
        crashpoint("step.before_record", sid)
        yield from self.append_new(Io("record_step", (self.claim, step)), sid)
        self.steps[sid] = step
        crashpoint("step.after_record", sid)
        return value

    def effect_flow(self, step_id: str, effect: Effect, payload: JSON,
                    operation_id: str | None) -> Flow:
        """An effect step: replay, or walk the dispatch protocol from wherever the ledger stands."""
        self.check_halt()
        sid = self.occurrence(step_id)
        if not self.is_async:
            _refuse_async_callables(effect)
        require_json(payload, "payload", sid)
        refuse_secrets(payload, "the payload", sid)
        payload_bytes = canonical(payload)
        payload_ref = digest(payload_bytes)
        # Every dispatch, first or after a crash, sends the payload exactly as stored.
        payload = loads(payload_bytes)
        op_id = operation_id or sid
        if not isinstance(op_id, str) or "\x00" in op_id:
            raise UsageError(f"invalid operation id {op_id!r}: a string without NUL",
                             step_id=sid)
        hashed = input_hash({"effect": effect.name, "operation_id": op_id,
                             "payload": payload_ref})
        try:
            recorded = self.check_replay(sid, StepKind.EFFECT, effect.name, hashed)
        except StaleCheckpoint as stale:
            phase = "replay_mismatch" if isinstance(stale, ReplayMismatch) else "stale_checkpoint"
            yield from self.block(stale, phase=phase, step_id=sid,
                                  op=self.operations.get(op_id))
            raise
        if recorded is not None:
            return recorded.result

        op = self.operations.get(op_id)
        # An operation id the caller chose names the operation across the run's chain: one an
        # earlier run of the chain settled is never dispatched again (nor keyed afresh). A step's
        # own id, the default, names it within this run only.
        chained = operation_id is not None
        if op is None and chained and self.run.parent_run_id is not None:
            settled = yield from self._settled_in_chain(sid, effect, op_id, payload_ref)
            if settled is not None:
                return settled.receipt
        if op is None:
            key_scope = (self.run.chain_id or self.run.run_id) if chained else self.run.run_id
            op = yield from self._prepare(sid, effect, op_id, payload_bytes, key_scope)
        else:
            payload = yield from self._prepared_payload(sid, effect, op, payload_ref)

        step = self._accepted_step(sid, effect, op, hashed)  # recorded on acceptance
        while True:
            decided = next_action(op.state, can_reconcile=effect.reconcile is not None,
                                  can_verify=effect.verify is not None)
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

    def _prepare(self, sid: str, effect: Effect, op_id: str, payload_bytes: bytes,
                 key_scope: str) -> Flow:
        """Prepared intent: payload, operation id and its key — minted here, once — durable."""
        if self.cancelling:
            raise self.cancelled()
        crashpoint("effect.before_prepare", sid)
        op = OperationRecord(
            run_id=self.run.run_id, operation_id=op_id, step_id=sid, effect=effect.name,
            state=EffectState.PREPARED, payload_ref=digest(payload_bytes),
            effect_key=mint_effect_key(key_scope, op_id))
        yield from self.append_new(Io("prepare_effect", (self.claim, op, payload_bytes)), sid)
        self.operations[op_id] = op
        crashpoint("effect.after_prepared", sid)
        return op

    def _settled_in_chain(self, sid: str, effect: Effect, op_id: str,
                          payload_ref: str) -> Flow:
        """The operation as an earlier run of this chain accepted it, or None — looked up in
        place, never copied; one it rejected raises that rejection again. It stands for this
        run too, but only for the same effect and the very same payload: a changed payload is
        never sent under its key."""
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
        if settled.payload_ref != payload_ref:
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
        """The payload as it was prepared: a replacement worker never regenerates it."""
        if op.effect != effect.name or op.step_id != sid:
            yield from self.block(
                ReplayMismatch(self.run.run_id, sid,
                               f"operation {op.operation_id!r} was prepared by step"
                               f" {op.step_id!r} for effect {op.effect!r}"),
                phase="replay_mismatch", op=op)
        if op.payload_ref != payload_ref:
            yield from self.block(
                StaleCheckpoint(self.run.run_id, sid,
                                f"the payload of {op.operation_id!r} changed since it was"
                                " prepared; it is never resent under the old key"),
                phase="stale_checkpoint", op=op, evidence={"new_payload_ref": payload_ref})
        try:
            stored = yield Io("get_artifact", (op.payload_ref,))
        except (ArtifactMissing, ArtifactCorrupt) as exc:
            yield from self.block(
                NeedsReconciliation(self.run.run_id, sid, op.operation_id, exc.message),
                phase="unreadable_record", op=op, evidence=_error_evidence(exc))
        return loads(stored)

    def _record(self, op: OperationRecord, state: EffectState, *, receipt: JSON = None,
                error: JSON = None, step: StepRecord | None = None) -> Flow:
        kept_receipt = receipt if receipt is not None else op.receipt
        if step is not None:
            step = replace(step, result=kept_receipt)
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
        op = yield Io("mark_dispatching", (self.claim, op.operation_id))
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
            return (yield from self._dispatch(sid, effect, op, payload, step))
        yield from self.block(NeedsReconciliation(self.run.run_id, sid, op.operation_id,
                                                  decided.reason),
                              phase="reconcile_effect", op=op)
        raise AssertionError("unreachable")

    def _verify(self, sid: str, effect: Effect, op: OperationRecord, step: StepRecord) -> Flow:
        assert effect.verify is not None
        try:
            ok = yield Call(effect.verify, (op.receipt,))
            reason = "the verifier returned a false value"
        except Exception as exc:
            ok, reason = False, f"the verifier raised {type(exc).__name__}: {exc}"
        if not ok:
            yield from self.block(
                VerificationFailed(self.run.run_id, sid, op.operation_id, reason),
                phase="verify_effect", op=op)
        op = yield from self._record(op, EffectState.ACCEPTED, step=step)
        crashpoint("effect.after_accept", sid)
        return op


def _is_async_callable(fn: object) -> bool:
    call = type(fn).__call__ if callable(fn) else None  # an object with an async __call__
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _refuse_async_callables(effect: Effect) -> None:
    """Before anything is prepared: an async function cannot be awaited by a plain workflow,
    and finding out during dispatch would look like an uncertain outcome."""
    for role in ("execute", "reconcile", "verify"):
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
    require_json(messages, "messages", allow_tuples=True)
    return hashed, input_hash({"messages": messages}), call


def _as_max_age(max_age: timedelta | float | None) -> timedelta | None:
    if max_age is None or isinstance(max_age, timedelta):
        return max_age
    return timedelta(seconds=max_age)


def _value_flows(core: RunCore) -> dict[str, Callable[[str], Flow]]:
    def value(kind: str, make: Callable[[], JSON]) -> Callable[[str], Flow]:
        return lambda step_id: core.step_flow(StepKind.VALUE, step_id, make, (), {},
                                              hashed_inputs={}, name=kind)
    return {
        "now": value("now", lambda: datetime.now(UTC).isoformat()),
        "random": value("random", lambda: int.from_bytes(os.urandom(7)) / 2**56),
        "uuid": value("uuid", lambda: str(uuidlib.uuid4())),
    }


class _RunBase:
    def __init__(self, core: RunCore) -> None:
        self._core = core
        self._values = _value_flows(core)

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


class Run(_RunBase):
    """What a plain ``def`` workflow receives. Every method records or replays one step.

    >>> @workflow("greet")
    ... def greet(run: Run, name: str) -> str:
    ...     return run.pure("format", lambda n: f"hello {n}", name)
    """

    def pure(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """A deterministic computation; recorded so a resume need not recompute it."""
        return self._sync(self._core.step_flow(
            StepKind.PURE, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs]))

    def read(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
             max_age: timedelta | float | None = None, **kwargs: Any) -> Any:
        """An observation of the world; replayed until ``max_age`` says it expired."""
        return self._sync(self._core.step_flow(
            StepKind.READ, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs],
            max_age=_as_max_age(max_age)))

    def model(self, step_id: str, fn: Callable[..., Any], /, *, model: str, messages: JSON,
              tools: JSON = None, **params: Any) -> Any:
        """A model call, ``fn(model=, messages=, tools=, **params)``; replayed, never re-generated."""
        hashed, prompt_hash, call = _model_inputs(model, messages, tools, params)
        return self._sync(self._core.step_flow(
            StepKind.MODEL, step_id, fn, (), call, hashed_inputs=hashed, model_id=model,
            prompt_hash=prompt_hash))

    def decide(self, step_id: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """The planner's choice: ``fn`` returns the next step id (or a dict with
        ``next_step_id``); the choice is replayed, never asked again."""
        return self._sync(self._core.step_flow(
            StepKind.DECISION, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs]))

    def effect(self, step_id: str, effect: Effect, /, *, payload: JSON,
               operation_id: str | None = None) -> Any:
        """A change in another system, dispatched at most once; returns the owner's receipt."""
        return self._sync(self._core.effect_flow(step_id, effect, payload, operation_id))

    def now(self, step_id: str = "now") -> datetime:
        """The current time, recorded: a resume sees the same instant."""
        return datetime.fromisoformat(self._sync(self._values["now"](step_id)))

    def random(self, step_id: str = "random") -> float:
        """A random float in [0, 1), recorded."""
        return float(self._sync(self._values["random"](step_id)))

    def uuid(self, step_id: str = "uuid") -> str:
        """A random UUID string, recorded."""
        return str(self._sync(self._values["uuid"](step_id)))

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
        return await self._async(self._core.step_flow(
            StepKind.PURE, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs]))

    async def read(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
                   max_age: timedelta | float | None = None, **kwargs: Any) -> Any:
        return await self._async(self._core.step_flow(
            StepKind.READ, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs],
            max_age=_as_max_age(max_age)))

    async def model(self, step_id: str, fn: Callable[..., Any], /, *, model: str,
                    messages: JSON, tools: JSON = None, **params: Any) -> Any:
        hashed, prompt_hash, call = _model_inputs(model, messages, tools, params)
        return await self._async(self._core.step_flow(
            StepKind.MODEL, step_id, fn, (), call, hashed_inputs=hashed, model_id=model,
            prompt_hash=prompt_hash))

    async def decide(self, step_id: str, fn: Callable[..., Any], /, *args: Any,
                     **kwargs: Any) -> Any:
        return await self._async(self._core.step_flow(
            StepKind.DECISION, step_id, fn, args, kwargs, hashed_inputs=[args, kwargs]))

    async def effect(self, step_id: str, effect: Effect, /, *, payload: JSON,
                     operation_id: str | None = None) -> Any:
        return await self._async(self._core.effect_flow(step_id, effect, payload, operation_id))

    # Recording a value is a ledger write, which an async store can only do awaited.
    async def now(self, step_id: str = "now") -> datetime:
        return datetime.fromisoformat(await self._async(self._values["now"](step_id)))

    async def random(self, step_id: str = "random") -> float:
        return float(await self._async(self._values["random"](step_id)))

    async def uuid(self, step_id: str = "uuid") -> str:
        return str(await self._async(self._values["uuid"](step_id)))

    async def continue_as_new(self, *args: Any, **kwargs: Any) -> NoReturn:
        """``Run.continue_as_new``, awaited: ``await run.continue_as_new(step + 1, totals)``."""
        raise self._core.continue_as_new(args, kwargs)
