"""The effect dispatch protocol (DESIGN §3), carried out for one effect step of a run.

``_rules.effects`` decides (pure functions over durable evidence); an ``EffectDispatch`` carries
the decisions out as a flow — prepare, the approval gate, "dispatching", the call, the outcome,
the verifier, reconciliation after a crash — yielding store requests and owner calls for the
run core's drivers, never doing I/O itself. One is bound to the run's core, the step's id and
the effect; its methods are the protocol's transitions. Reading order: ``effect_flow``, then
``EffectDispatch.carry_out``, then one method per transition in the order an effect goes
through them.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from .._rules.approvals import awaiting, may_reprepare
from .._rules.canonical import (
    canonical,
    checked_canonical,
    digest,
    input_hash,
    loads,
    require_json,
)
from .._rules.effects import (
    Action,
    Applied,
    Effect,
    EffectKey,
    Next,
    NotApplied,
    NotSent,
    Rejected,
    Unknown,
    after_reconcile,
    mint_effect_key,
    next_action,
    one_commit_to_dispatching,
    orphaned,
    retention_ms,
)
from .._rules.family import family_key
from .._rules.ids import check_id
from .._rules.records import revised
from .._rules.replay import Asked, replayable
from .._rules.secrets import error_evidence, redact_json, redact_text, refuse_secrets, storable_json
from ..errors import (
    ApprovalInvalid,
    ArtifactCorrupt,
    ArtifactMissing,
    ClaimedInFamily,
    DeadlineExceeded,
    EffectRejected,
    HistoryLimitReached,
    LostOwnership,
    NeedsReconciliation,
    NotJSON,
    ReplayMismatch,
    StaleCheckpoint,
    UsageError,
    VerificationFailed,
)
from ..storage.base import Store
from ..types import JSON, EffectState, OperationRecord, StepKind, StepRecord
from .core import RunCore
from .crashpoints import SimulatedCrash, crashpoint
from .current import keyed
from .family import resends
from .flow import Call, CallTimedOut, Flow, Sleep, io, is_async_callable
from .observe import EffectSeen, StepSeen, call_status
from .settled import SettledElsewhere

_NOT_SENT_BACKOFF_S = 0.05
# The gate and the dispatch are two commits: an approval can lapse between them (it expires),
# and then the gate is asked again — a bounded number of times.
_GATE_ATTEMPTS = 3


def effect_flow(
    core: RunCore,
    step_id: str,
    effect: Effect,
    payload: JSON,
    operation_id: str | None,
    approval: bool = False,
    prefix: str = "",
) -> Flow[Any]:
    """An effect step: replay, or walk the dispatch protocol from wherever the ledger stands.
    With ``approval``, no dispatch without a person's valid approval (see ``authorize``)."""
    core.check_halt()
    sid = core.occurrence(step_id, prefix)
    if not core.is_async:
        _refuse_async_callables(effect)
    dispatch = EffectDispatch(core, sid, effect)
    carried = dispatch.carry_out(payload, operation_id, approval, prefix)
    return (yield from (carried if core.watch is None else dispatch.watched(carried)))


class EffectDispatch(SettledElsewhere):
    """One effect step of a run carried through the dispatch protocol: the run's core, the
    step's id (its occurrence, ``sid``) and the effect, which every transition needs."""

    __slots__ = ("acted", "core", "effect", "family_key", "sid")

    def __init__(self, core: RunCore, sid: str, effect: Effect) -> None:
        self.core = core
        self.sid = sid
        self.effect = effect
        self.acted = False  # the owner was called (execute or reconcile) for this step here
        self.family_key: str | None = None  # what its operation is within the run's family

    def watched(self, carried: Flow[Any]) -> Flow[Any]:
        """``carried`` (the step's ``carry_out``), and the installed observer told how the step
        ended: replayed (the owner was not called) or executed."""
        watch, started = self.core.watch, time.time_ns()
        assert watch is not None
        status, error, receipt = "completed", None, None
        try:
            receipt = yield from carried
        except BaseException as exc:
            status = "rejected" if isinstance(exc, EffectRejected) else call_status(exc, otherwise="failed")
            error = exc
            raise
        finally:
            watch.step(
                StepSeen(
                    StepKind.EFFECT,
                    self.sid,
                    self.effect.name,
                    1,
                    not self.acted,
                    status,
                    started,
                    time.time_ns(),
                    error,
                    receipt,
                )
            )
        return receipt

    def seen(
        self,
        action: str,
        op: OperationRecord,
        outcome: str,
        started: int,
        error: BaseException | None = None,
        payload: JSON = None,
        receipt: JSON = None,
    ) -> None:
        """Tell the installed observer (if any) how a call of the effect's owner ended."""
        self.acted = True
        if self.core.watch is not None:
            seen = EffectSeen(action, op, self.sid, outcome, started, time.time_ns(), error, payload, receipt)
            self.core.watch.effect(seen)

    def carry_out(self, payload: JSON, operation_id: str | None, approval: bool, prefix: str) -> Flow[Any]:
        """Replay the step, or take its operation from where the ledger stands to accepted;
        return the receipt (as recorded)."""
        core, sid, effect = self.core, self.sid, self.effect
        payload_bytes = checked_canonical(payload, "payload", sid)
        refuse_secrets(payload, "the payload", sid)
        payload_ref = digest(payload_bytes)
        # Every dispatch, first or after a crash, sends the payload exactly as stored.
        payload = loads(payload_bytes)
        # An operation id given is checked as given: an empty one must not fall back to the
        # step's id while it names the operation across the run's chain.
        op_id = sid if operation_id is None else check_id(operation_id, "operation id")
        core.unreached.discard(op_id)
        hashed = input_hash({"effect": effect.name, "operation_id": op_id, "payload": payload_ref})
        asked = (
            Asked(sid, StepKind.EFFECT, effect.name, hashed, op_id, payload_ref) if core.replaying else None
        )
        recorded = yield from core.replay_lookup(
            sid, StepKind.EFFECT, effect.name, hashed, core.operations.get(op_id), asked
        )
        if recorded is not None:
            return recorded.result

        # An operation id the caller chose names the operation across the run's chain: one an
        # earlier run of the chain settled is never dispatched again (nor keyed afresh). A
        # step's own id, the default, names it within this run only. Nor does a fork send what
        # the runs it was forked from sent.
        chained = operation_id is not None
        resent = (yield from resends(core)).get(op_id)
        self.family_key = family_key(core.run, op_id, chosen=chained, resent_by=resent)
        settled = yield from self.settled_before(op_id, payload_ref, chained, hashed)
        if settled is not None:
            return settled.receipt
        if core.replaying is not None and asked is not None and not replayable(core.operations.get(op_id)):
            held = yield from self.held_for_replay()
            if held is not None:
                return (yield from self.held_in_family(op_id, payload_ref, hashed, held))
            core.replaying.new(core, asked)  # a replay: its outcome is nowhere recorded, new work
        if op_id not in core.operations and core.unreached:
            yield from self.refuse_beside_orphans(op_id, prefix)
        try:
            walked = self.walk(op_id, payload, payload_bytes, payload_ref, hashed, approval, chained)
            return (yield from walked)
        except ClaimedInFamily:
            # Another run of the family sent it first (a fork and its source carrying on in
            # either order): nothing was sent here, and nothing will be.
            return (yield from self.held_in_family(op_id, payload_ref, hashed))

    def walk(
        self,
        op_id: str,
        payload: JSON,
        payload_bytes: bytes,
        payload_ref: str,
        hashed: str,
        approval: bool,
        chained: bool,
    ) -> Flow[Any]:
        """Take the operation from where the ledger stands to accepted, and return the receipt."""
        core, sid, effect = self.core, self.sid, self.effect
        key_scope = (core.run.chain_id or core.run.run_id) if chained else core.run.run_id
        if op_id not in core.operations and one_commit_to_dispatching(effect, approval=approval):
            # Nothing stands between prepared and dispatching: one commit, then the call.
            op = yield from self.prepare_dispatching(op_id, payload_ref, payload_bytes, key_scope)
            step = self.accepted_step(op, hashed)  # recorded on acceptance
            op = yield from self.call_owner(op, payload, step)
        else:
            op, payload = yield from self.prepared(op_id, payload, payload_bytes, approval, key_scope)
            step = self.accepted_step(op, hashed)
        while True:
            decided = next_action(
                op.state, can_reconcile=effect.reconcile is not None, can_verify=effect.verify is not None
            )
            if decided.action is Action.DISPATCH and payload is None:
                yield from core.block(
                    _changed_payload(core.run.run_id, sid, op), phase="reconcile_effect", op=op
                )
            if decided.action is Action.DISPATCH:
                op = yield from self.dispatch(op, payload, step)
            elif decided.action is Action.RECONCILE:
                op = yield from self.reconcile(op, payload, step)
            elif decided.action is Action.VERIFY:
                op = yield from self.verify(op, step)
            elif decided.action is Action.ACCEPT:
                op = yield from self.record(op, EffectState.ACCEPTED, receipt=op.receipt, step=step)
            elif decided.action is Action.REPLAY:
                if core.replans and sid not in core.steps and not core.cancelling:
                    # kept from before a re-plan: the step now points at it, so later replays
                    # find it directly
                    yield from core.append_new(io(Store.record_step, core.claim, step), sid)
                    core.steps[sid] = step
                return op.receipt
            elif decided.action is Action.REPLAY_REJECTION:
                raise EffectRejected(core.run.run_id, sid, op_id, op.error)
            else:
                yield from core.block(
                    NeedsReconciliation(core.run.run_id, sid, op_id, _with_cause(decided, op)),
                    phase="reconcile_effect",
                    op=op,
                )

    def refuse_beside_orphans(self, op_id: str, prefix: str) -> Flow[None]:
        """Before a new operation is prepared: block the run (``replay_mismatch``) while it holds
        an operation that may have happened and that this code no longer reaches (see
        ``orphaned``) — under a fresh key, the same change would be made twice."""
        found = orphaned(
            [self.core.operations[op_id] for op_id in sorted(self.core.unreached)],
            self.core.open_branches,
            prefix,
            replans=self.core.replans,
        )
        if not found:
            return
        orphan = found[0]
        asked = {"step_id": self.sid, "effect": self.effect.name, "operation_id": op_id}
        yield from self.core.block(
            ReplayMismatch(
                self.core.run.run_id,
                self.sid,
                f"the ledger holds operation {orphan.operation_id!r} (step {orphan.step_id!r},"
                f" effect {orphan.effect!r}, {orphan.state.value}), which this code no longer"
                f" reaches, and the code asks for a new operation {op_id!r} (step {self.sid!r},"
                f" effect {self.effect.name!r}) instead; nothing new is dispatched beside it, under"
                " a fresh key — deploy the code that reaches it (the effect step's id, operation_id and"
                " place as recorded), or settle the run by hand",
            ),
            phase="replay_mismatch",
            op=orphan,
            evidence={"orphaned": [op.operation_id for op in found], "asked_instead": asked},
        )

    def accepted_step(self, op: OperationRecord, hashed: str) -> StepRecord:
        return StepRecord(
            run_id=self.core.run.run_id,
            step_id=self.sid,
            kind=StepKind.EFFECT,
            name=self.effect.name,
            input_hash=hashed,
            result=op.receipt,
            seq=self.core.next_seq(self.sid),
            operation_id=op.operation_id,
        )

    def new_operation(
        self,
        op_id: str,
        payload_ref: str,
        key_scope: str,
        *,
        approval: bool = False,
        target: str | None = None,
    ) -> OperationRecord:
        ledger_id = self.core.store.identity.ledger_id
        return OperationRecord(
            run_id=self.core.run.run_id,
            operation_id=op_id,
            step_id=self.sid,
            effect=self.effect.name,
            state=EffectState.PREPARED,
            payload_ref=payload_ref,
            effect_key=mint_effect_key(ledger_id, key_scope, op_id),  # minted once
            approval_required=approval,
            target_digest=target,
            dedup_retention_ms=retention_ms(self.effect.dedup_retention),
            family_key=self.family_key,
        )

    def prepare_dispatching(
        self, op_id: str, payload_ref: str, payload_bytes: bytes, key_scope: str
    ) -> Flow[OperationRecord]:
        """A new operation prepared and committed "dispatching" at once, no gate standing
        between (see ``one_commit_to_dispatching``): so there is no "prepared" to crash after.
        Enters the dispatch (``enter_dispatch``), for ``call_owner`` to leave."""
        if self.core.cancelling:
            raise self.core.cancelled()  # the store would refuse it too
        self.core.check_slice(self.sid)
        crashpoint("effect.before_prepare", self.sid)
        op = self.new_operation(op_id, payload_ref, key_scope)
        # Flushed before the dispatch is entered: a flush refused at the history limit blocks
        # the run, which first waits for every dispatch in flight — this one too, if entered.
        yield from self.core.flush()
        yield from self.core.enter_dispatch()
        try:
            op = yield from io(Store.prepare_and_mark_dispatching, self.core.claim, op, payload_bytes)
        except BaseException as exc:
            self.core.leave_dispatch()  # nothing was written: no dispatch in flight
            if isinstance(exc, HistoryLimitReached):
                yield from self.core.block_at_history_limit(exc, self.sid)
            raise
        return op

    def prepared(
        self, op_id: str, payload: JSON, payload_bytes: bytes, approval: bool, key_scope: str
    ) -> Flow[tuple[OperationRecord, JSON]]:
        """The operation, prepared now or as the ledger has it, and the payload it carries."""
        payload_ref = digest(payload_bytes)
        op = self.core.operations.get(op_id)
        if op is None:
            if self.core.cancelling:
                raise self.core.cancelled()
            self.core.check_slice(self.sid)
            crashpoint("effect.before_prepare", self.sid)
            # Read now too, so that an approval given before the run reaches its gate (it
            # crashed in between) is bound to the target's state it will find there.
            target = (yield from self.target_digest(payload)) if approval else None
            op = self.new_operation(op_id, payload_ref, key_scope, approval=approval, target=target)
            yield from self.core.flush()
            yield from self.core.append_new(
                io(Store.prepare_effect, self.core.claim, op, payload_bytes), self.sid
            )
            self.core.operations[op_id] = op
            crashpoint("effect.after_prepared", self.sid)
        else:
            if op.payload_ref != payload_ref and may_reprepare(op, replans=self.core.replans):
                op = yield from self.reprepare(op, payload, payload_bytes, payload_ref)
            op, payload = yield from self.prepared_payload(op, payload_ref)
        if approval and not op.approval_required:
            op = replace(op, approval_required=True)  # the gate records it in the store too
        return op, payload

    def reprepare(
        self, op: OperationRecord, payload: JSON, payload_bytes: bytes, payload_ref: str
    ) -> Flow[OperationRecord]:
        """The payload changed before it ever left — of an effect that waits for approval, or
        under ``replan``: it is prepared anew, under the same key (never sent), and must be
        approved anew where it needs approval."""
        if self.core.cancelling:
            raise self.core.cancelled()
        target = yield from self.target_digest(payload)
        op = replace(op, payload_ref=payload_ref, target_digest=target)
        yield from self.core.write(io(Store.reprepare_effect, self.core.claim, op, payload_bytes))
        self.core.operations[op.operation_id] = op
        return op

    def target_digest(self, payload: JSON) -> Flow[str | None]:
        """The digest of the effect's target's state as it reads now (None without one)."""
        if self.effect.target_state is None:
            return None
        state = yield Call(self.effect.target_state, (loads(canonical(payload)),))
        require_json(state, "target state", self.sid)
        return digest(canonical(state))

    def authorize(self, op: OperationRecord, payload: JSON) -> Flow[OperationRecord]:
        """The gate between prepared and dispatching: the store returns an approval of this
        payload on the target as it now reads — or, atomically, makes the run wait."""
        target = yield from self.target_digest(payload)
        yield from self.core.release_turn()  # the gate may release the run
        try:
            self.core.check_halt()  # a sibling branch stopped the run meanwhile: nothing new
            gate = yield from self.core.write(
                io(Store.await_approval, self.core.claim, op.operation_id, target)
            )
            if gate.approval is None:
                assert gate.waiting_for is not None  # a run made to wait says what for
                error = awaiting(self.core.run.run_id, gate.waiting_for)
                self.core.halted = error  # the run is released: this run object does no more
                raise error
        finally:
            self.core.end_turn()
        op = replace(op, approval_required=True, target_digest=target)
        self.core.operations[op.operation_id] = op
        self.core.approvals[op.operation_id] = gate.approval
        return op

    def mark_dispatching(self, op: OperationRecord, payload: JSON) -> Flow[OperationRecord]:
        """Commit "dispatching" — through the approval gate first when the effect needs one.
        The store checks the approval again in the dispatch's own transaction."""
        for attempt in range(1, _GATE_ATTEMPTS + 1):
            if op.approval_required:
                op = yield from self.authorize(op, payload)
            yield from self.core.enter_dispatch()  # left by call_owner with the outcome
            try:
                return (
                    yield from self.core.write(io(Store.mark_dispatching, self.core.claim, op.operation_id))
                )
            except BaseException as exc:
                self.core.leave_dispatch()
                if not isinstance(exc, ApprovalInvalid) or attempt == _GATE_ATTEMPTS:
                    raise
                # It lapsed between the gate and the dispatch (or the ledger asks for an
                # approval this code did not): ask the gate, which now makes the run wait.
                op = replace(op, approval_required=True)
        raise AssertionError("unreachable")

    def prepared_payload(self, op: OperationRecord, payload_ref: str) -> Flow[tuple[OperationRecord, JSON]]:
        """The operation and the payload it may be sent with: the payload as it was prepared (a
        replacement worker never regenerates it). Under ``replan`` a payload changed after it
        may have been sent is never sent again (None): its outcome is reconciled, a receipt is
        replayed, and a dispatch would block."""
        if op.effect != self.effect.name or (op.step_id != self.sid and not self.core.replans):
            yield from self.core.block(
                ReplayMismatch(
                    self.core.run.run_id,
                    self.sid,
                    f"operation {op.operation_id!r} was prepared by step"
                    f" {op.step_id!r} for effect {op.effect!r}",
                ),
                phase="replay_mismatch",
                op=op,
            )
        if op.payload_ref != payload_ref:
            if not self.core.replans:
                yield from self.core.block(
                    StaleCheckpoint(
                        self.core.run.run_id,
                        self.sid,
                        f"the payload of {op.operation_id!r} changed since it was"
                        " prepared; it is never resent under the old key",
                    ),
                    phase="stale_checkpoint",
                    op=op,
                    evidence={"new_payload_ref": payload_ref},
                )
            return op, None  # may have been sent (a never-sent one was prepared anew)
        try:
            stored = yield from io(Store.get_artifact, op.payload_ref)
        except (ArtifactMissing, ArtifactCorrupt) as exc:
            yield from self.core.block(
                NeedsReconciliation(self.core.run.run_id, self.sid, op.operation_id, exc.message),
                phase="unreadable_record",
                op=op,
                evidence=error_evidence(exc),
            )
        return op, loads(stored)

    def record(
        self,
        op: OperationRecord,
        state: EffectState,
        *,
        receipt: JSON = None,
        error: JSON = None,
        step: StepRecord | None = None,
        not_sent: bool = False,
    ) -> Flow[OperationRecord]:
        kept_receipt = receipt if receipt is not None else op.receipt
        if step is not None:
            step = revised(step, result=kept_receipt)
        yield from self.core.flush()
        yield from io(
            Store.record_outcome,
            self.core.claim,
            op.operation_id,
            state,
            receipt=receipt,
            error=error,
            step=step,
            not_sent=not_sent,
        )
        op = revised(op, state=state, receipt=kept_receipt, error=error)
        self.core.operations[op.operation_id] = op
        if step is not None:
            self.core.steps[step.step_id] = step
        return op

    def key(self, op: OperationRecord) -> EffectKey:
        return EffectKey(op.effect_key, op.operation_id, self.core.run.run_id, self.core.claim.fence)

    def dispatch(self, op: OperationRecord, payload: JSON, step: StepRecord) -> Flow[OperationRecord]:
        """prepared → dispatching → call → applied / accepted / rejected / unknown.

        From the moment "dispatching" is committed until an outcome is, every way out leaves
        the operation ``unknown`` (for reconciliation) — never failed, never forgotten.
        """
        if self.core.cancelling:
            raise self.core.cancelled()  # the store would refuse it too
        try:
            op = yield from self.mark_dispatching(op, payload)
        except DeadlineExceeded:
            if op.state is not EffectState.PREPARED:
                # Reconciled as never applied, and past the deadline nothing is sent again:
                # it stays prepared, not uncertain (as after a cancel).
                yield from self.record(op, EffectState.PREPARED)
            raise
        return (yield from self.call_owner(op, payload, step))

    def call_owner(self, op: OperationRecord, payload: JSON, step: StepRecord) -> Flow[OperationRecord]:
        """The call of a dispatch committed as "dispatching", and its recorded outcome; then
        the dispatch entered before that commit (``enter_dispatch``, by ``mark_dispatching``
        or ``prepare_dispatching``) is left."""
        try:
            return (yield from self.call_and_record(op, payload, step))
        finally:
            self.core.leave_dispatch()

    def call_and_record(self, op: OperationRecord, payload: JSON, step: StepRecord) -> Flow[OperationRecord]:
        self.core.operations[op.operation_id] = op
        crashpoint("effect.after_dispatching", self.sid)
        started = time.time_ns() if self.core.watch is not None else 0
        try:
            receipt = yield Call(keyed(self.core.owner_call(self.effect, "execute")), (payload, self.key(op)))
        except NotSent as exc:
            self.seen("dispatch", op, "not_sent", started, exc, payload)
            if op.dispatch_count > 1:
                # This attempt never left, but an earlier one may have: still uncertain.
                return (yield from self.record(op, EffectState.UNKNOWN, error=error_evidence(exc)))
            op = yield from self.record(op, EffectState.PREPARED, error=error_evidence(exc), not_sent=True)
            if op.dispatch_count >= self.effect.max_dispatches:
                raise
            yield Sleep(_NOT_SENT_BACKOFF_S * 2**op.dispatch_count)
            return op
        except Rejected as exc:
            self.seen("dispatch", op, "rejected", started, exc, payload)
            # Raised as recorded: a replay raises the rejection from the ledger, the same.
            evidence = redact_json(storable_json(exc.evidence))
            yield from self.record(op, EffectState.REJECTED, error=evidence)
            raise EffectRejected(self.core.run.run_id, self.sid, op.operation_id, evidence) from exc
        except Exception as exc:
            self.seen("dispatch", op, "unknown", started, exc, payload)
            # Timeout, dropped connection, a bad receipt: the outcome is unknown; reconcile.
            return (yield from self.record(op, EffectState.UNKNOWN, error=error_evidence(exc)))
        except BaseException as exc:
            self.seen("dispatch", op, "unknown", started, exc, payload)
            yield from self.interrupted(op, exc)
            raise
        try:
            require_json(receipt, "receipt", self.sid)
        except NotJSON as exc:
            self.seen("dispatch", op, "unknown", started, exc, payload)
            # The owner answered, so the effect most likely happened; but what execute returned
            # cannot be recorded. Uncertain, and said so at once (see _unusable_receipt).
            return (
                yield from self.record(
                    op, EffectState.UNKNOWN, error={**error_evidence(exc), "receipt_not_json": True}
                )
            )
        # A receipt is the owner's word that it happened: keep it, with any credential in it (a
        # client_secret, say) masked, rather than lose the outcome.
        receipt = redact_json(receipt)
        self.seen("dispatch", op, "applied", started, None, payload, receipt)
        crashpoint("effect.after_receiver_commit", self.sid)
        return (yield from self.applied(op, receipt, step))

    def interrupted(self, op: OperationRecord, exc: BaseException) -> Flow[None]:
        """Cancelled or interrupted mid-call: leave the evidence (the outcome is unknown, so
        the next worker reconciles it) and stop this run object; the interrupt goes on."""
        if isinstance(exc, (LostOwnership, SimulatedCrash)):
            self.core.halted = exc
            return  # this worker may not write anything more
        # Agent code that swallows the interrupt gets this from its next step; the run is then
        # released, not blocked: the next worker's reconcile may well settle it on its own.
        self.core.halted = NeedsReconciliation(
            self.core.run.run_id,
            self.sid,
            op.operation_id,
            f"the call was interrupted ({type(exc).__name__}); resume the run to reconcile it",
        )
        self.core.release_on_halt = True
        yield from self.record(op, EffectState.UNKNOWN, error=error_evidence(exc))

    def applied(self, op: OperationRecord, receipt: JSON, step: StepRecord) -> Flow[OperationRecord]:
        if self.effect.verify is None:  # nothing to verify: applied and accepted are one commit
            op = yield from self.record(op, EffectState.ACCEPTED, receipt=receipt, step=step)
            crashpoint("effect.after_outcome", self.sid)
            crashpoint("effect.after_accept", self.sid)
        else:
            op = yield from self.record(op, EffectState.APPLIED, receipt=receipt)
            crashpoint("effect.after_outcome", self.sid)
        return op

    def reconcile(self, op: OperationRecord, payload: JSON, step: StepRecord) -> Flow[OperationRecord]:
        assert self.effect.reconcile is not None
        started = time.time_ns() if self.core.watch is not None else 0
        raised = None
        try:
            answer = yield Call(self.core.owner_call(self.effect, "reconcile"), (self.key(op),))
        except Exception as exc:
            answer, raised = Unknown(f"reconcile raised {type(exc).__name__}: {exc}"), exc
        if isinstance(answer, Unknown):  # the owner's words go into the recovery record
            answer = Unknown(redact_text(str(answer.reason)))
        outcome = _RECONCILED.get(type(answer), "unknown")
        self.seen("reconcile", op, outcome, started, raised, payload, getattr(answer, "receipt", None))
        now = yield from io(Store.now)
        decided = after_reconcile(
            answer,
            now=now,
            first_dispatched_at=op.first_dispatched_at,
            dedup_retention=self.effect.dedup_retention,
            dispatch_count=op.dispatch_count,
            max_dispatches=self.effect.max_dispatches,
        )
        if decided.action is Action.RECORD_APPLIED:
            try:
                require_json(answer.receipt, "reconciled receipt", self.sid)
            except UsageError as exc:
                decided = Next(Action.BLOCK, f"the owner has it, but {exc.message}")
            else:
                return (yield from self.applied(op, redact_json(answer.receipt), step))
        if decided.action is Action.DISPATCH and (unusable := _unusable_receipt(op)) is not None:
            decided = Next(Action.BLOCK, unusable)
        if decided.action is Action.DISPATCH:
            if self.core.cancelling:
                # The owner says it never happened, and nothing new may start: it stays
                # prepared, never dispatched again, and the run ends cancelled.
                yield from self.record(op, EffectState.PREPARED)
                raise self.core.cancelled()
            if payload is None:
                yield from self.core.block(
                    _changed_payload(self.core.run.run_id, self.sid, op), phase="reconcile_effect", op=op
                )
            return (yield from self.dispatch(op, payload, step))
        yield from self.core.block(
            NeedsReconciliation(self.core.run.run_id, self.sid, op.operation_id, _with_cause(decided, op)),
            phase="reconcile_effect",
            op=op,
        )
        raise AssertionError("unreachable")

    def verify(self, op: OperationRecord, step: StepRecord) -> Flow[OperationRecord]:
        assert self.effect.verify is not None
        try:
            ok = yield Call(
                self.core.owner_call(self.effect, "verify"),
                (op.receipt,),
                timeout=self.effect.verify_timeout_s,
            )
            reason = "the verifier returned a false value"
        except CallTimedOut:
            ok, reason = False, (f"the verifier did not answer within {self.effect.verify_timeout_s:g}s")
        except Exception as exc:
            ok, reason = False, redact_text(f"the verifier raised {type(exc).__name__}: {exc}")
        if not ok:
            yield from self.core.block(
                VerificationFailed(self.core.run.run_id, self.sid, op.operation_id, reason),
                phase="verify_effect",
                op=op,
            )
        op = yield from self.record(op, EffectState.ACCEPTED, step=step)
        crashpoint("effect.after_accept", self.sid)
        return op


# What a reconcile's answer says, as the observer's outcome word.
_RECONCILED: dict[type, str] = {Applied: "reconciled", NotApplied: "not_applied", Unknown: "unknown"}


def _unusable_receipt(op: OperationRecord) -> str | None:
    """Why ``op`` must not be dispatched again although its owner may say it has nothing:
    execute returned (the owner answered, so the effect most likely happened), but with a
    receipt that cannot be recorded. Reconcile may still find it; a re-dispatch would only
    end the same way until the dispatches ran out, with the cause only in the record."""
    error = op.error if isinstance(op.error, dict) else {}
    if op.state is not EffectState.UNKNOWN or not error.get("receipt_not_json"):
        return None
    return (
        f"execute returned, but its receipt cannot be recorded ({error.get('message')});"
        " the owner answered, so the effect most likely happened and is not sent again —"
        " make execute return JSON (a dict of the owner's object, say), then resume the"
        " run (it asks the owner by key), or resolve it"
    )


def _with_cause(decided: Next, op: OperationRecord) -> str:
    """Why the run blocks, with what the last dispatch ended in — so the message says the
    cause, not only the record."""
    error = op.error if isinstance(op.error, dict) else {}
    if not error.get("message") or error.get("receipt_not_json"):
        return _unusable_receipt(op) or decided.reason
    return f"{decided.reason} (the last dispatch ended in {error.get('type')}: {error['message']})"


def _changed_payload(run_id: str, sid: str, op: OperationRecord) -> NeedsReconciliation:
    return NeedsReconciliation(
        run_id,
        sid,
        op.operation_id,
        "the re-planned workflow asks for another payload than the one that may already have"
        " been sent under this key, and the owner says it did not happen: it is never resent"
        " under the old key; settle it (resolve --not-applied prepares it anew) or abandon",
    )


def _refuse_async_callables(effect: Effect) -> None:
    """Before anything is prepared: an async function cannot be awaited by a plain workflow,
    and finding out during dispatch would look like an uncertain outcome."""
    for role in ("execute", "reconcile", "verify", "target_state"):
        fn = getattr(effect, role)
        if fn is not None and is_async_callable(fn):
            raise UsageError(
                f"effect {effect.name!r} has an async {role}; use it from an async def workflow (AsyncRun)"
            )
