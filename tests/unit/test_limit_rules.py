"""The decisions about stopping at a limit and raising it, without I/O (``_rules.limits``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint._rules import limits as _limits
from safepoint._rules.recovery import build_record, record_schema
from safepoint.errors import (
    BudgetExhausted,
    DeadlineExceeded,
    LimitsRefused,
    StepAttemptsExhausted,
)
from safepoint.types import RunLimits, RunRecord, RunStatus, StepKind

NOW = 1_800_000_000_000


def a_run(**fields: Any) -> RunRecord:
    base = RunRecord(
        "r", "w", "1", RunStatus.RUNNING, "h", None, 7, None, None, 1, 0, 0, None, None, None, 0, 0
    )
    return replace(base, **fields)


def stopped_at(error: Any, **fields: Any) -> RunRecord:
    """A run stopped by ``error``, with the recovery record the engine records."""
    run = a_run(status=RunStatus.STOPPED, **fields)
    record = build_record(run, phase="limit_reached", reason=error.message, stop=_limits.stop_of(error, NOW))
    return replace(run, recovery_record={**record, "state_revision": run.state_revision})


def test_a_turn_budget_is_spent_once_as_many_model_calls_were_made() -> None:
    assert _limits.spent_budget(a_run(model_call_budget=3, model_calls_spent=2)) is None
    assert _limits.spent_budget(a_run(model_call_budget=3, model_calls_spent=3)) == ("model_calls", 3, 3)
    reached = _limits.limit_before_step(a_run(model_call_budget=0), StepKind.MODEL, "turn.0", None)
    assert isinstance(reached, BudgetExhausted)
    assert (reached.kind, reached.step_id) == ("model_calls", "turn.0")
    assert _limits.limit_before_step(a_run(model_call_budget=0), StepKind.READ, "read", NOW) is None
    late = _limits.limit_before_step(a_run(deadline_at=NOW), StepKind.READ, "read", NOW)
    assert isinstance(late, DeadlineExceeded)
    assert sp.Budget(model_calls=5).model_calls == 5
    with pytest.raises(sp.UsageError):
        sp.Budget(model_calls=-1)
    assert _limits.merged_budget(sp.Budget(model_calls=4), sp.Budget(tokens=9)) == sp.Budget(
        tokens=9, model_calls=4
    )


def test_raised_attempts_apply_to_every_step_that_is_tried_again_and_never_lower_one() -> None:
    three, once = sp.Retry(attempts=3, backoff=0), sp.Retry(attempts=1)
    assert _limits.attempts_allowed(three, None) is three
    assert _limits.attempts_allowed(three, 5).attempts == 5
    assert _limits.attempts_allowed(three, 2) is three
    assert _limits.attempts_allowed(once, 5) is once  # a step tried once fails; raising is no help


@pytest.mark.parametrize(
    ("error", "stop"),
    [
        (
            BudgetExhausted("r", 30, kind="tokens", spent=34, step_id="turn.2"),
            _limits.Stop("tokens", 30, 34, "turn.2"),
        ),
        (
            BudgetExhausted("r", 2, kind="model_calls", spent=2, step_id="turn.2"),
            _limits.Stop("model_calls", 2, 2, "turn.2"),
        ),
        (BudgetExhausted("r", 1.0, kind="cost", spent=1.2, step_id="t"), _limits.Stop("cost", 1.0, 1.2, "t")),
        (BudgetExhausted("r", 2, 3), _limits.Stop("resume_budget", 2, 3, None)),
        (DeadlineExceeded("r", NOW - 5, "s"), _limits.Stop("deadline", NOW - 5, NOW, "s")),
        (
            StepAttemptsExhausted("r", "q", 3, 3, "TimeoutError", "slow"),
            _limits.Stop("step_attempts", 3, 3, "q"),
        ),
    ],
)
def test_a_stop_is_recorded_and_read_back_as_the_error_it_stopped_with(
    error: Any, stop: _limits.Stop
) -> None:
    assert _limits.stop_of(error, NOW) == stop
    run = stopped_at(error)
    record = run.recovery_record
    assert record is not None
    assert (record["phase"], record["limit"], record["allowed"], record["spent"], record["step_id"]) == (
        "limit_reached",
        stop.limit,
        stop.allowed,
        stop.spent,
        stop.step_id,
    )
    import jsonschema

    jsonschema.validate(record, record_schema())
    again = _limits.stop_error(run)
    assert type(again) is type(error)
    assert again.record == record
    assert _limits.recorded_stop(run) == stop
    option = _limits.OPTIONS[stop.limit]
    assert any(option in action for action in record["next_actions"])  # the command that raises it


def test_a_stop_record_this_version_cannot_read_still_says_it_is_a_limit() -> None:
    run = a_run(status=RunStatus.STOPPED, recovery_record={"phase": "limit_reached", "limit": "tokens"})
    error = _limits.stop_error(run)
    assert isinstance(error, sp.LimitReached)
    assert "safepoint limits r" in error.message


def test_what_may_be_asked_is_checked_before_anything_is_read() -> None:
    asked = _limits.asked_limits(tokens=5, cost=2, deadline=timedelta(minutes=30))
    assert (asked.tokens, asked.cost, asked.deadline) == (5, 2.0, timedelta(minutes=30))
    for bad in (
        {},
        {"tokens": True},
        {"tokens": -1},
        {"model_calls": 2.0},
        {"cost": -0.5},
        {"cost": float("inf")},
        {"step_attempts": 0},
        {"resume_budget": "3"},
        {"deadline": timedelta(seconds=-1)},
        {"deadline": datetime(2030, 1, 1)},
        {"deadline": 1_800_000_000_000},
    ):
        with pytest.raises(sp.UsageError):
            _limits.asked_limits(**bad)


def test_the_new_limits_raise_or_set_what_was_asked_and_keep_the_rest() -> None:
    run = a_run(token_budget=30, tokens_spent=34, cost_budget=1.0, resume_budget=20, deadline_at=NOW + 5)
    change = _limits.planned_change(
        run,
        _limits.asked_limits(tokens=100, deadline=timedelta(minutes=1), step_attempts=4),
        now=NOW,
        by="ana",
        reason="why",
    )
    assert change.old == RunLimits(tokens=30, cost=1.0, deadline=NOW + 5, resume_budget=20)
    assert change.new == RunLimits(
        tokens=100, cost=1.0, deadline=NOW + 60_000, step_attempts=4, resume_budget=20
    )
    moment = datetime(2030, 1, 1, tzinfo=UTC)
    at = _limits.planned_change(run, _limits.asked_limits(deadline=moment), now=NOW, by="ana", reason=None)
    assert at.new.deadline == int(moment.timestamp() * 1000)
    detail = _limits.limits_extended_detail(change, RunStatus.STOPPED)
    assert detail == {
        "by": "ana",
        "reason": "why",
        "old": change.old.as_json(),
        "new": change.new.as_json(),
        "released": True,
    }


@pytest.mark.parametrize(
    ("run", "asked", "said"),
    [
        (a_run(tokens_spent=34), {"tokens": 33}, "below what was spent"),
        (a_run(cost_spent=1.5), {"cost": 1.0}, "below what was spent"),
        (a_run(model_calls_spent=3), {"model_calls": 2}, "below what was spent"),
        (a_run(resume_count=4), {"resume_budget": 3}, "below what was spent"),
        (a_run(), {"deadline": datetime(2001, 1, 1, tzinfo=UTC)}, "passed already"),
        (a_run(status=RunStatus.COMPLETED), {"tokens": 10}, "has ended"),
        (a_run(status=RunStatus.CONTINUED, successor_run_id="r~1"), {"tokens": 10}, "'r~1'"),
        (
            stopped_at(BudgetExhausted("r", 30, kind="tokens", spent=34), token_budget=30, tokens_spent=34),
            {"tokens": 34},
            "would stop there again",
        ),
        (
            stopped_at(StepAttemptsExhausted("r", "q", 3, 3, "E", "m")),
            {"step_attempts": 3},
            "would stop there again",
        ),
        (
            stopped_at(DeadlineExceeded("r", NOW - 1), deadline_at=NOW - 1),
            {"tokens": 10},
            "would stop there again",
        ),
    ],
)
def test_what_does_not_fit_the_run_is_refused(run: RunRecord, asked: dict[str, Any], said: str) -> None:
    with pytest.raises(LimitsRefused, match=said):
        _limits.planned_change(run, _limits.asked_limits(**asked), now=NOW, by="ana", reason=None)


def test_a_stale_revision_is_refused_with_both_revisions() -> None:
    with pytest.raises(LimitsRefused) as refused:
        _limits.planned_change(
            a_run(), _limits.asked_limits(tokens=10), now=NOW, by="ana", reason=None, expected_revision=6
        )
    assert (refused.value.state_revision, refused.value.expected_revision) == (7, 6)


def test_a_successor_carries_raised_limits_and_what_is_left_of_the_turns() -> None:
    run = a_run(
        token_budget=100,
        tokens_spent=40,
        model_call_budget=10,
        model_calls_spent=4,
        step_attempt_limit=6,
        resume_budget=50,
        deadline_at=NOW,
    )
    assert _limits.carried_limits(run) == {
        "deadline_at": NOW,
        "token_budget": 60,
        "cost_budget": None,
        "model_call_budget": 6,
        "step_attempt_limit": 6,
        "resume_budget": 50,
    }


def test_a_stop_reads_as_a_person_says_it() -> None:
    assert _limits.stop_words({"limit": "tokens", "allowed": 30, "spent": 34, "step_id": "t"}) == (
        "tokens: 34 spent of 30, before step 't'"
    )
    assert _limits.stop_words({"limit": "resume_budget", "allowed": 2, "spent": 3}) == (
        "resume budget: resumed 3 times, 2 allowed, at a takeover"
    )
    assert "2027-01-15" in _limits.stop_words({"limit": "deadline", "allowed": NOW, "spent": NOW})
    assert _limits.stop_words({"limit": "tokens", "allowed": "x", "spent": None}) == (
        "tokens: None spent of x, at a takeover"
    )
