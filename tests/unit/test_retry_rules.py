"""The retry's decisions, without a store: which runs may be retried, which failed step is
taken up, what ``resend`` may name, and the key a re-sent operation gets."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from safepoint import types
from safepoint._rules.effects import attempt_key, key_is_minted, mint_effect_key, next_attempt_key
from safepoint._rules.retry import failed_step, plan_retry, retriable_steps, retry_refusal
from safepoint._rules.transactions import uncertain_record
from safepoint.errors import RetryRefused
from safepoint.types import (
    AttemptRecord,
    EffectState,
    Ledger,
    LedgerIdentity,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
)

IDENTITY = LedgerIdentity("ledger-1", 0)


def _run(status: RunStatus = RunStatus.FAILED, **fields: Any) -> RunRecord:
    base: dict[str, Any] = {
        "run_id": "r",
        "workflow": "wf",
        "workflow_version": "1",
        "status": status,
        "input_hash": "h",
        "inputs": {"args": [], "kwargs": {}},
        "state_revision": 7,
        "owner": None,
        "lease_expires_at": None,
        "fence": 1,
        "resume_count": 0,
        "event_count": 1,
        "result": None,
        "error": None,
        "recovery_record": None,
        "created_at": 0,
        "updated_at": 0,
    }
    base.update(fields)
    return RunRecord(**base)


def _step(sid: str, seq: int, *, failed: bool = False) -> StepRecord:
    return StepRecord(
        run_id="r",
        step_id=sid,
        kind=StepKind.READ,
        name=f"fn.{sid}",
        input_hash=f"h-{sid}",
        result=None if failed else {"ok": sid},
        seq=seq,
        status=StepStatus.FAILED if failed else StepStatus.COMPLETED,
        error={"type": "TimeoutError", "message": "late"} if failed else None,
    )


def _op(
    op_id: str, state: EffectState, *, key_attempt: int = 1, step_id: str | None = None
) -> OperationRecord:
    minted = mint_effect_key(IDENTITY.ledger_id, "r", op_id)
    return OperationRecord(
        run_id="r",
        operation_id=op_id,
        step_id=step_id or f"step.{op_id}",
        effect="e",
        state=state,
        payload_ref="sha256:" + "0" * 64,
        effect_key=attempt_key(minted, key_attempt),
        key_attempt=key_attempt,
    )


def _ledger(
    run: RunRecord,
    steps: tuple[StepRecord, ...] | list[StepRecord] = (),
    ops: list[OperationRecord] | None = None,
    **attempts: Any,
) -> Ledger:
    return Ledger(
        run,
        {s.step_id: s for s in steps},
        {o.operation_id: o for o in ops or []},
        {sid: list(tried) for sid, tried in attempts.items()},
    )


def _plan(ledger: Ledger, **given: Any) -> Any:
    given.setdefault("step", None)
    given.setdefault("resend", ())
    given.setdefault("expected_revision", ledger.run.state_revision)
    return plan_retry(ledger, IDENTITY, by="ana", reason=None, **given)


# -- keys ---------------------------------------------------------------------------------------------


def test_a_later_attempt_is_keyed_by_a_key_derived_from_the_minted_one_and_nothing_else() -> None:
    run = _run()
    first = _op("op", EffectState.REJECTED)
    assert key_is_minted(first, run, IDENTITY)
    second_key = next_attempt_key(first, run, IDENTITY)
    assert second_key == attempt_key(first.effect_key, 2) != first.effect_key
    second = replace(first, key_attempt=2, effect_key=second_key)
    assert key_is_minted(second, run, IDENTITY)
    # the derived key only at its own attempt; the minted key no longer once it is attempt 2
    assert not key_is_minted(replace(second, key_attempt=3), run, IDENTITY)
    assert not key_is_minted(replace(second, key_attempt=1), run, IDENTITY)
    assert not key_is_minted(replace(first, key_attempt=2), run, IDENTITY)
    assert not key_is_minted(replace(second, key_attempt=0), run, IDENTITY)
    assert next_attempt_key(second, run, IDENTITY) == attempt_key(first.effect_key, 3)
    # derived keys belong to their ledger, like the minted ones
    assert not key_is_minted(second, run, LedgerIdentity("ledger-2", 0))


def test_no_key_is_derived_from_an_altered_key() -> None:
    altered = replace(_op("op", EffectState.REJECTED), effect_key="sp_hand_edited")
    assert next_attempt_key(altered, _run(), IDENTITY) is None
    with pytest.raises(RetryRefused, match="not the key minted"):
        _plan(_ledger(_run(), ops=[altered]), resend=["op"])


# -- which runs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (RunStatus.COMPLETED, "completed"),
        (RunStatus.PENDING, "it is pending"),
        (RunStatus.RUNNING, "it is running"),
        (RunStatus.BLOCKED, "blocked"),
        (RunStatus.WAITING, "waiting"),
        (RunStatus.CANCELLED, "cancelled"),
    ],
)
def test_only_a_failed_run_is_retried(status: RunStatus, says: str) -> None:
    assert says in (retry_refusal(_run(status), 7) or "")
    assert retry_refusal(_run(), 7) is None
    assert "moved since revision 6" in (retry_refusal(_run(), 6) or "")
    assert "cancel was asked" in (retry_refusal(_run(cancel_requested_at=5), 7) or "")


def test_a_stopped_run_is_retried_only_when_its_stop_was_at_a_failed_step() -> None:
    at_step = {"phase": "limit_reached", "limit": "step_attempts", "step_id": "quote"}
    assert retry_refusal(_run(RunStatus.STOPPED, recovery_record=at_step), 7) is None
    spent = {"phase": "limit_reached", "limit": "tokens", "step_id": "draft"}
    assert "raise the limit instead" in (
        retry_refusal(_run(RunStatus.STOPPED, recovery_record=spent), 7) or ""
    )
    tried = [AttemptRecord("r", "quote", n, StepKind.READ, "fn", "h", {"type": "E"}, 0) for n in (1, 2)]
    ledger = _ledger(_run(RunStatus.STOPPED, recovery_record=at_step), [_step("a", 1)], quote=tried)
    assert retriable_steps(ledger) == ["quote"]
    planned = _plan(ledger)
    assert (planned.step_id, planned.moved) == ("quote", ("quote",))


# -- which step ---------------------------------------------------------------------------------------


def test_the_failed_step_taken_up_is_the_one_whose_failure_is_the_runs_error() -> None:
    steps = [_step("a", 1, failed=True), _step("b", 2), _step("c", 3, failed=True)]
    named = _run(error={"type": "StepFailed", "message": "…", "step_id": "a"})
    assert failed_step(_ledger(named, steps)) == "a"
    # recorded before runs said where they failed: the step the message names
    older = _run(error={"type": "StepFailed", "message": "step 'c' of run 'r' raised TimeoutError: late"})
    assert failed_step(_ledger(older, steps)) == "c"
    # the workflow raised an error of its own: no step
    own = _run(error={"type": "ValueError", "message": "step 'c' of run 'r' raised …"})
    assert failed_step(_ledger(own, steps)) is None
    planned = _plan(_ledger(own, steps))
    assert (planned.step_id, planned.moved, planned.resend) == (None, (), ())
    # named explicitly: any failed step, and only a failed one
    assert _plan(_ledger(own, steps), step="c").moved == ("c",)
    with pytest.raises(RetryRefused, match="step 'b' did not fail; the failed steps of the run: 'a', 'c'"):
        _plan(_ledger(own, steps), step="b")


# -- what resend may name -----------------------------------------------------------------------------


def test_resend_names_rejected_operations_by_operation_or_step_id() -> None:
    ops = [
        _op("charge", EffectState.REJECTED, step_id="pay"),
        _op("ticket", EffectState.ACCEPTED),
        _op("mail", EffectState.UNKNOWN),
        _op("refund", EffectState.PREPARED),
    ]
    ledger = _ledger(_run(error={"type": "EffectRejected", "message": "…", "step_id": "pay"}), ops=ops)
    for name in ("charge", "pay"):
        planned = _plan(ledger, resend=[name, "charge"])  # named twice: sent once
        key = attempt_key(ops[0].effect_key, 2)
        assert planned.resend == (types.Resend("charge", "pay", 2, key),)
    for name, says in [
        ("ticket", "was accepted: what happened is never sent again"),
        ("mail", "is unknown: its outcome is uncertain"),
        ("refund", "it was never rejected"),
        ("nope", "names no operation of the run"),
    ]:
        with pytest.raises(RetryRefused, match=says) as refused:
            _plan(ledger, resend=[name])
        assert "what resend can name (the operations its owner rejected): 'charge' (step 'pay')" in str(
            refused.value
        )
    with pytest.raises(RetryRefused, match="this run holds none"):
        _plan(_ledger(_run(), ops=[ops[1]]), resend=["ticket"])


def test_a_resent_effect_step_with_a_failed_record_runs_again_too() -> None:
    ops = [_op("charge", EffectState.REJECTED, step_id="pay")]
    steps = [_step("pay", 1, failed=True), _step("x", 2, failed=True)]
    run = _run(error={"type": "StepFailed", "message": "…", "step_id": "x"})
    planned = _plan(_ledger(run, steps, ops), resend=["charge"])
    assert (planned.step_id, planned.moved) == ("x", ("x", "pay"))


def test_a_transaction_step_that_may_have_committed_is_never_taken_up() -> None:
    """A transaction step recorded as uncertain (its function ended its transaction) may have
    written its rows: a retry neither takes it up as the failed step nor lets one name it."""
    uncertain = uncertain_record(replace(_step("order", 1), kind=StepKind.TRANSACTION))
    ledger = _ledger(
        _run(error={"type": "StepFailed", "message": "…", "step_id": "late"}),
        [uncertain, _step("late", 2, failed=True)],
    )
    assert retriable_steps(ledger) == ["late"]
    assert _plan(ledger).moved == ("late",)
    with pytest.raises(RetryRefused, match="may have committed"):
        _plan(ledger, step="order")
