"""The PostgreSQL store's effects: an operation walking the dispatch protocol, one fenced
statement a step (the approval gate, when it needs one, in one transaction), and a payload
prepared anew before it was ever sent."""

from __future__ import annotations

from dataclasses import replace

from ..._rules.approvals import authorizing, refused_dispatch
from ..._rules.canonical import dumps
from ...errors import HistoryWarning, StoreError
from ...types import JSON, Claim, EffectState, OperationRecord, StepRecord
from .._rows import operation_record
from ..base import check_payload, refuse_gated
from ..plans import Plan
from .connection import QUERIES as _q
from .connection import Dispatched, PostgresBase, _Unfit, not_dispatchable


class PostgresEffects(PostgresBase):
    """The PostgreSQL store's effects: an operation walking the dispatch protocol, one fenced."""

    def prepare_effect(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> Plan[HistoryWarning | None]:
        _, due = yield from self._prepare(claim, op, payload, dispatching=False)
        return due

    def prepare_and_mark_dispatching(
        self, claim: Claim, op: OperationRecord, payload: bytes
    ) -> Plan[Dispatched]:
        """Both in one statement: the operation is inserted "dispatching", with both events."""
        refuse_gated(op)
        return (yield from self._prepare(claim, op, payload, dispatching=True))

    def _prepare(
        self, claim: Claim, op: OperationRecord, payload: bytes, *, dispatching: bool
    ) -> Plan[Dispatched]:
        check_payload(op, payload)  # before anything is sent
        row = yield from self._fenced(
            claim,
            "prepare_effect",
            limited=True,
            claims=dispatching,
            operation_id=op.operation_id,
            step_id=op.step_id,
            effect=op.effect,
            payload_ref=op.payload_ref,
            payload=self._content(op.payload_ref, payload),
            size=len(payload),
            effect_key=op.effect_key,
            dedup_retention_ms=op.dedup_retention_ms,
            approval_required=op.approval_required,
            target_digest=op.target_digest if op.approval_required else None,
            dispatching=dispatching,
            detail=dumps({"effect": op.effect, "payload_ref": op.payload_ref}),
            dispatching_detail=dumps({"dispatch": 1}) if dispatching else None,
            family_key=op.family_key,
        )
        prepared = operation_record(row, self.codec)
        return prepared, (yield from self._history_warning(claim, row))

    def mark_dispatching(self, claim: Claim, operation_id: str) -> Plan[Dispatched | None]:
        """One statement for an operation that needs no approval. None for one that does,
        having written nothing: the store runs ``mark_dispatching_gated`` instead."""
        try:
            row = yield from self._fenced(
                claim,
                "mark_dispatching",
                needs_operation=True,
                claims=True,
                operation_id=operation_id,
                gate=False,
                family_key=None,
            )
        except _Unfit as unfit:
            if unfit.gated:
                return None
            raise not_dispatchable(claim, operation_id) from None
        op = operation_record(row, self.codec)
        return op, (yield from self._history_warning(claim, row))

    def mark_dispatching_gated(self, claim: Claim, operation_id: str) -> Plan[Dispatched]:
        """``mark_dispatching`` through the approval gate, run atomically: the statement takes
        the runs row lock (an approval being given queues behind it, or committed before), the
        approvals are read, and the one that authorizes the dispatch is kept on the operation
        — or the refusal rolls it all back."""
        try:
            row = yield from self._fenced(
                claim,
                "mark_dispatching",
                needs_operation=True,
                claims=True,
                operation_id=operation_id,
                gate=True,
                family_key=None,
            )
        except _Unfit:
            raise not_dispatchable(claim, operation_id) from None
        op = operation_record(row, self.codec)
        if op.approval_required:  # the gate, at the dispatch's own instant: or all rolls back
            approvals = yield from self.approvals_of(claim.run_id, operation_id)
            approval = authorizing(
                approvals, payload_digest=op.payload_ref, target_digest=op.target_digest, now=op.updated_at
            )
            if approval is None:
                raise refused_dispatch(op, approvals, op.updated_at)
            yield _q(
                "mark_dispatching_approved",
                run_id=claim.run_id,
                operation_id=operation_id,
                approval_id=approval.approval_id,
            )
            op = replace(op, approval_id=approval.approval_id)
        return op, (yield from self._history_warning(claim, row))

    def record_outcome(
        self,
        claim: Claim,
        operation_id: str,
        state: EffectState,
        *,
        receipt: JSON = None,
        error: JSON = None,
        step: StepRecord | None = None,
        not_sent: bool = False,
    ) -> Plan[HistoryWarning | None]:
        result, result_ref, content = (
            (None, None, None) if step is None else self._stored_result(claim.run_id, step)
        )
        kind = f"effect.{state.value}"
        event = yield from self._event_params(None if error is None else {"error": error}, claim.run_id, kind)
        try:
            row = yield from self._fenced(
                claim,
                "record_outcome",
                new_work=False,
                needs_operation=True,
                **self._step_params(claim.run_id, step, result, result_ref),
                result_content=content,
                result_size=None if content is None else len(content),
                operation_id=operation_id,
                state=state.value,
                not_sent=not_sent,
                receipt=self._sealed(receipt, "safepoint_operations", "receipt", claim.run_id, operation_id),
                error=self._sealed(error, "safepoint_operations", "error", claim.run_id, operation_id),
                event_kind=kind,
                **event,
            )
        except _Unfit:
            raise StoreError(
                f"no operation {operation_id!r} in run {claim.run_id!r}",
                run_id=claim.run_id,
                operation_id=operation_id,
            ) from None
        return (yield from self._history_warning(claim, row))

    def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> Plan[None]:
        check_payload(op, payload)
        yield from self._put_artifact(claim.run_id, op.payload_ref, payload)
        row = yield from self._fenced(
            claim,
            "reprepare_effect",
            operation_id=op.operation_id,
            step_id=op.step_id,
            payload_ref=op.payload_ref,
            target_digest=op.target_digest,
            detail=dumps({"effect": op.effect, "payload_ref": op.payload_ref, "revised": True}),
        )
        if row["operation_id"] is None:
            raise StoreError(
                f"operation {op.operation_id!r} is no longer prepared: its payload"
                " cannot change (it may have been sent)",
                run_id=claim.run_id,
                operation_id=op.operation_id,
            )
