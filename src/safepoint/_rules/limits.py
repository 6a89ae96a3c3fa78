"""Limits that survive restarts: step attempts with back-off, model token, cost and model-call
(turn) budgets, a deadline and the resume budget — the decisions, as small I/O-free functions.

Every limit is recorded with the run (the attempts made, the tokens, cost and model calls
spent, the deadline as an instant on the store's clock), so a restart continues from what the
ledger says and never resets a spent budget. A run that reaches one *stops* (status
``stopped``, with a recovery record of phase ``limit_reached``: which limit, allowed, spent,
the step it stopped before) until a person raises it (``extend_limits``): what such a change
may be is decided here too (``asked_limits``, ``planned_change``). The flows in
``_engine.core``, ``_engine.lifecycle`` and ``_engine.limits`` ask these functions what to do;
the stores refuse new work past the deadline on their own.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import (
    BudgetExhausted,
    DeadlineExceeded,
    LimitReached,
    LimitsRefused,
    StepAttemptsExhausted,
    TransientFailure,
    UsageError,
)
from ..types import JSON, AttemptRecord, Budget, LimitChange, Retry, RunLimits, RunRecord, RunStatus, StepKind
from .kinds import KINDS
from .moments import instant

ONCE = Retry(attempts=1)


# -- attempts ------------------------------------------------------------------------------------


def as_retry(value: Retry | int | None, what: str) -> Retry | None:
    """``Retry`` from what a caller wrote: a ``Retry``, a number of attempts, or ``None``."""
    if value is None or isinstance(value, Retry):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return Retry(attempts=value)
    raise UsageError(f"{what}={value!r}: pass safepoint.Retry(...) or a number of attempts")


def step_policy(kind: StepKind, given: Retry | None, run_default: Retry | None) -> Retry:
    """The attempts a step of ``kind`` gets: its own ``retry=``, else the run's default."""
    if not KINDS[kind].retried:
        return ONCE
    return given or run_default or ONCE


def run_default(recorded: Retry | None, in_code: Retry | None) -> Retry | None:
    """The run's default policy: the numbers recorded with the run (a deploy does not move
    them), with the exception types of the code (a class cannot be recorded)."""
    if recorded is None:
        return None
    if in_code is None:
        return recorded
    return Retry.from_json(recorded.as_json(), in_code.retry_on)


def round_start_for(round_start: int, failed: list[AttemptRecord], input_hash: str) -> int:
    """Where a round of attempts of a step asked with ``input_hash`` starts: ``round_start`` —
    or after the last attempt made for other inputs. Those asked another question (a re-plan
    abandoned it): their failures are its history, not this question's."""
    return max([round_start, *(tried.attempt for tried in failed if tried.input_hash != input_hash)])


def next_attempt(round_start: int, failed: list[AttemptRecord]) -> tuple[int, AttemptRecord | None]:
    """(the number of the next attempt, the failed attempt of this round it follows, if any).

    Attempts count every call of the step's function; a round starts at ``round_start`` (0 for
    a new step, the recorded attempt for a re-read of an expired observation)."""
    last = failed[-1] if failed else None
    if last is None or last.attempt <= round_start:
        return round_start + 1, None
    return last.attempt + 1, last


def backoff_ms(policy: Retry, failed_in_round: int, seed: str) -> int:
    """How long to wait after the ``failed_in_round``-th failed attempt of a round, in ms.

    The jitter comes from ``seed`` (run, step and attempt), not from a random source: two
    workers, or a worker before and after a crash, compute the same wait."""
    delay = min(policy.backoff * policy.multiplier ** (failed_in_round - 1), policy.max_backoff)
    if policy.jitter:
        fraction = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:7]) / 2**56
        delay *= 1 - policy.jitter * fraction
    return max(0, math.ceil(delay * 1000))


@dataclass(frozen=True, slots=True)
class AfterFailure:
    """What follows a failed attempt: another one at ``retry_at``, or none (``why``) — or a
    limit (``stop``: ``step_attempts`` or ``deadline``) that the next attempt, due at
    ``retry_at``, is past: the run stops there, and goes on once a person raises it."""

    retry_at: int | None
    why: str | None = None
    stop: str | None = None


def after_failure(
    policy: Retry, exc: BaseException, *, failed_in_round: int, now: int, deadline_at: int | None, seed: str
) -> AfterFailure:
    """Try again, and when — or give up, and why — or stop at a limit."""
    if not isinstance(exc, policy.retry_on) and not isinstance(exc, TransientFailure):
        return AfterFailure(None, "not retryable" if policy.attempts > 1 else None)
    if failed_in_round >= policy.attempts and policy.attempts <= 1:
        return AfterFailure(None, None)  # a step that is tried once fails; only retries are a limit
    retry_at = now + max(backoff_ms(policy, failed_in_round, seed), _asked_wait_ms(exc))
    if failed_in_round >= policy.attempts:
        return AfterFailure(retry_at, None, STEP_ATTEMPTS)
    if deadline_at is not None and retry_at >= deadline_at:
        return AfterFailure(retry_at, "no time is left before the run's deadline", DEADLINE)
    return AfterFailure(retry_at)


def _asked_wait_ms(exc: BaseException) -> int:
    """How long the failure itself asked to wait (a server's ``retry-after``), in ms."""
    if isinstance(exc, TransientFailure) and exc.retry_after is not None:
        return math.ceil(exc.retry_after * 1000)
    return 0


def attempts_allowed(policy: Retry, raised: int | None) -> Retry:
    """A step's attempts with the limit a person raised every retried step to
    (``RunRecord.step_attempt_limit``): only a step that is tried again at all (more than one
    attempt) gets them, and never fewer than its own."""
    if raised is None or policy.attempts <= 1 or raised <= policy.attempts:
        return policy
    return replace(policy, attempts=raised)


# -- model usage and budgets ---------------------------------------------------------------------


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reported_tokens(result: JSON) -> int | None:
    """The tokens a model response reports in a well-known shape, else ``None``.

    ``usage.total_tokens`` when given (OpenAI); else ``input_tokens + output_tokens`` plus the
    cache tokens (Anthropic, whose input tokens leave the cached ones out); else
    ``prompt_tokens + completion_tokens`` (OpenAI chat completions)."""
    usage = result.get("usage") if isinstance(result, dict) else None
    if not isinstance(usage, dict):
        return None
    total = _count(usage.get("total_tokens"))
    if total is not None:
        return total
    for parts in (
        ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"),
        ("prompt_tokens", "completion_tokens"),
    ):
        counts = [_count(usage.get(part)) for part in parts]
        if counts[0] is not None or counts[1] is not None:
            return sum(count or 0 for count in counts)
    return None


def checked_usage(value: Any, step_id: str) -> tuple[int | None, float | None]:
    """(tokens, cost) from what a ``usage=`` function returned."""
    if not isinstance(value, dict) or not set(value) <= {"tokens", "cost"}:
        raise UsageError(
            f"the usage= function of step {step_id!r} returned {value!r}; return"
            " a dict with 'tokens' (an int) and/or 'cost' (a number)",
            step_id=step_id,
        )
    tokens, cost = value.get("tokens"), value.get("cost")
    if tokens is not None and _count(tokens) is None:
        raise UsageError(
            f"usage of step {step_id!r}: tokens={tokens!r} is not an int of 0 or more", step_id=step_id
        )
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0
    ):
        raise UsageError(
            f"usage of step {step_id!r}: cost={cost!r} is not a finite number of 0 or more", step_id=step_id
        )
    return tokens, None if cost is None else float(cost)


UsageFn = Callable[[Any], dict[str, Any]]


def spent_budget(run: RunRecord) -> tuple[str, float, float] | None:
    """(which budget, its limit, what was spent) when a budget is spent, else ``None``."""
    if run.token_budget is not None and run.tokens_spent >= run.token_budget:
        return TOKENS, run.token_budget, run.tokens_spent
    if run.cost_budget is not None and run.cost_spent >= run.cost_budget:
        return COST, run.cost_budget, run.cost_spent
    if run.model_call_budget is not None and run.model_calls_spent >= run.model_call_budget:
        return MODEL_CALLS, run.model_call_budget, run.model_calls_spent
    return None


def merged_budget(in_code: Budget | None, given: Budget | None) -> Budget:
    """The budget of a new run: what ``start`` was given, field by field over the workflow's."""
    base, over = in_code or Budget(), given or Budget()
    if not isinstance(over, Budget):
        raise UsageError(f"budget={given!r}: pass safepoint.Budget(tokens=..., cost=..., model_calls=...)")
    return Budget(
        tokens=over.tokens if over.tokens is not None else base.tokens,
        cost=over.cost if over.cost is not None else base.cost,
        model_calls=over.model_calls if over.model_calls is not None else base.model_calls,
    )


# -- the deadline --------------------------------------------------------------------------------


def deadline_of(value: timedelta | datetime | None) -> tuple[int | None, int | None]:
    """(absolute deadline in epoch ms, or a span in ms counted from the run's creation on the
    store's clock) from a ``datetime`` or a ``timedelta``."""
    if value is None:
        return None, None
    if isinstance(value, timedelta):
        if value <= timedelta(0):
            raise UsageError(f"deadline={value!r}: a span after the run's creation must be positive")
        return None, math.ceil(value.total_seconds() * 1000)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise UsageError(
                f"deadline={value!r} has no time zone; pass an aware datetime"
                " (e.g. datetime.now(UTC) + timedelta(hours=1)) or a timedelta"
            )
        return math.floor(value.astimezone(UTC).timestamp() * 1000), None
    raise UsageError(f"deadline={value!r}: pass a timedelta (from the run's creation) or an aware datetime")


def past_deadline(run: RunRecord, now: int) -> bool:
    return run.deadline_at is not None and now >= run.deadline_at


def limits_ref(run: RunRecord) -> dict[str, Any]:
    """The run's limits and what it spent, for its recovery record (``limits_ref``)."""
    return {
        "resume_count": run.resume_count,
        "resume_budget": run.resume_budget,
        "deadline_at": run.deadline_at,
        "token_budget": run.token_budget,
        "tokens_spent": run.tokens_spent,
        "cost_budget": run.cost_budget,
        "cost_spent": run.cost_spent,
        "model_call_budget": run.model_call_budget,
        "model_calls_spent": run.model_calls_spent,
        "step_attempts": run.step_attempts.attempts if run.step_attempts else None,
        "step_attempt_limit": run.step_attempt_limit,
    }


def carried_limits(run: RunRecord) -> dict[str, Any]:
    """The limits a run's successor (continue as new) starts with: the same deadline, what is
    left of the token, cost and model-call budgets, the raised step attempts and the run's
    resume budget — continuing is never a way around a limit, and a limit a person raised
    stays raised for the rest of the chain."""

    def left(budget: float | None, spent: float) -> float | None:
        return None if budget is None else max(budget - spent, 0)

    tokens = left(run.token_budget, run.tokens_spent)
    calls = left(run.model_call_budget, run.model_calls_spent)
    return {
        "deadline_at": run.deadline_at,
        "token_budget": None if tokens is None else int(tokens),
        "cost_budget": left(run.cost_budget, run.cost_spent),
        "model_call_budget": None if calls is None else int(calls),
        "step_attempt_limit": run.step_attempt_limit,
        "resume_budget": run.resume_budget,
    }


# -- stopping at a limit ---------------------------------------------------------------------------

# The limits a run stops at, by the names its recovery record and ``extend_limits`` use.
TOKENS = "tokens"
COST = "cost"
MODEL_CALLS = "model_calls"
DEADLINE = "deadline"
STEP_ATTEMPTS = "step_attempts"
RESUME_BUDGET = "resume_budget"
LIMITS = (TOKENS, COST, MODEL_CALLS, DEADLINE, STEP_ATTEMPTS, RESUME_BUDGET)

# The command-line option that raises each.
OPTIONS = {name: "--" + name.replace("_", "-") for name in LIMITS}


def limits_of(run: RunRecord) -> RunLimits:
    """A run's limits, as ``extend_limits`` changes them."""
    return RunLimits(
        tokens=run.token_budget,
        cost=run.cost_budget,
        model_calls=run.model_call_budget,
        deadline=run.deadline_at,
        step_attempts=run.step_attempt_limit,
        resume_budget=run.resume_budget,
    )


def recorded_limits(row: Mapping[str, Any]) -> RunLimits:
    """The limits in a runs row (its columns by name), as a store reads them to tell whether
    they moved since a worker read them (``Store.stop_run``)."""
    return RunLimits(
        tokens=row["token_budget"],
        cost=None if row["cost_budget"] is None else float(row["cost_budget"]),
        model_calls=row["model_call_budget"],
        deadline=row["deadline_at"],
        step_attempts=row["step_attempt_limit"],
        resume_budget=row["resume_budget"],
    )


def with_limits(run: RunRecord, limits: RunLimits) -> RunRecord:
    """``run`` holding ``limits`` (read again from the store): what it spent stays its own."""
    return replace(
        run,
        token_budget=limits.tokens,
        cost_budget=limits.cost,
        model_call_budget=limits.model_calls,
        deadline_at=limits.deadline,
        step_attempt_limit=limits.step_attempts,
        resume_budget=limits.resume_budget,
    )


def limit_before_step(run: RunRecord, kind: StepKind, step_id: str, now: int | None) -> LimitReached | None:
    """The limit a new call of a step of ``kind`` would go past (``now``: the store's clock,
    when read), else None: the deadline for a read, model or decision step; a budget for a
    model step."""
    if now is not None and past_deadline(run, now):
        return DeadlineExceeded(run.run_id, run.deadline_at or 0, step_id)
    if KINDS[kind].model_call:
        spent = spent_budget(run)
        if spent is not None:
            which, limit, amount = spent
            return BudgetExhausted(run.run_id, limit, kind=which, spent=amount, step_id=step_id)
    return None


@dataclass(frozen=True, slots=True)
class Stop:
    """Where a run stopped at a limit: which (``limit``), what it allows (``allowed``: the
    budget, the deadline instant, the attempts), what was spent (the amount, the instant it
    stopped at, the attempts made) and the step it stopped before (None at a takeover)."""

    limit: str
    allowed: float | None
    spent: float | None
    step_id: str | None


def stop_of(error: LimitReached, now: int) -> Stop:
    """The stop ``error`` says the run reached (``now``: the store's clock)."""
    if isinstance(error, StepAttemptsExhausted):
        return Stop(STEP_ATTEMPTS, error.allowed, error.attempts, error.step_id)
    if isinstance(error, DeadlineExceeded):
        return Stop(DEADLINE, error.deadline_at, now, error.step_id)
    if isinstance(error, BudgetExhausted):
        if error.kind == "resumes":
            return Stop(RESUME_BUDGET, error.budget, error.resumes, None)
        return Stop(error.kind, error.budget, error.spent, error.step_id)
    return Stop("?", None, None, getattr(error, "step_id", None))


def stop_error(run: RunRecord) -> LimitReached:
    """The error a stopped run ended with, from its recovery record: what a resume raises while
    the limit stays where it was (the record attached)."""
    record: dict[str, Any] = run.recovery_record or {}
    limit, step_id = record.get("limit"), record.get("step_id")
    allowed: Any = record.get("allowed")
    spent: Any = record.get("spent")
    error: LimitReached
    try:
        if limit == RESUME_BUDGET:
            error = BudgetExhausted(run.run_id, allowed, int(spent))
        elif limit in (TOKENS, COST, MODEL_CALLS):
            error = BudgetExhausted(run.run_id, allowed, kind=limit, spent=spent, step_id=step_id)
        elif limit == DEADLINE:
            error = DeadlineExceeded(run.run_id, int(allowed), step_id)
        elif limit == STEP_ATTEMPTS:
            last = (record.get("evidence") or {}).get("last_error") or {}
            error = StepAttemptsExhausted(
                run.run_id,
                str(step_id),
                int(spent),
                int(allowed),
                str(last.get("type", "error")),
                str(last.get("message", "")),
            )
        else:
            raise TypeError(limit)
    except (TypeError, ValueError):  # a record this version cannot read back: say what is known
        error = LimitReached(
            f"run {run.run_id!r} is stopped at a limit ({limit or 'unknown'}); see `safepoint"
            f" show {run.run_id}`, and raise it with `safepoint limits {run.run_id} …`",
            run_id=run.run_id,
        )
    error.record = run.recovery_record
    return error


def stop_holds(stop: Stop, run: RunRecord, limits: RunLimits, now: int) -> bool:
    """Whether ``run``, stopped at ``stop``, would stop there again under ``limits``."""
    if stop.limit == TOKENS:
        return limits.tokens is not None and run.tokens_spent >= limits.tokens
    if stop.limit == COST:
        return limits.cost is not None and run.cost_spent >= limits.cost
    if stop.limit == MODEL_CALLS:
        return limits.model_calls is not None and run.model_calls_spent >= limits.model_calls
    if stop.limit == DEADLINE:
        return limits.deadline is not None and now >= limits.deadline
    if stop.limit == RESUME_BUDGET:
        return limits.resume_budget is not None and run.resume_count > limits.resume_budget
    if stop.limit == STEP_ATTEMPTS:
        return limits.step_attempts is None or limits.step_attempts <= (stop.spent or 0)
    return False


def stop_words(record: Mapping[str, Any]) -> str:
    """A stopped run's limit as a person reads it (the CLI, the dashboard):
    ``tokens: 34 spent of 30, before step 'turn.2'``."""
    limit, step = record.get("limit"), record.get("step_id")
    allowed: Any = record.get("allowed")
    spent: Any = record.get("spent")
    try:
        if limit == DEADLINE:
            what = f"deadline: {instant(int(allowed), millis=True)} passed (stopped {instant(int(spent))})"
        elif limit == STEP_ATTEMPTS:
            what = f"step attempts: all {spent:g} of {allowed:g} made"
        elif limit == RESUME_BUDGET:
            what = f"resume budget: resumed {spent:g} times, {allowed:g} allowed"
        else:
            what = f"{str(limit).replace('_', ' ')}: {spent:g} spent of {allowed:g}"
    except (TypeError, ValueError):  # a record this version cannot read: say what it holds
        what = f"{limit}: {spent} spent of {allowed}"
    return what + (f", before step {step!r}" if step else ", at a takeover")


def recorded_stop(run: RunRecord) -> Stop | None:
    """The stop a stopped run's recovery record names, or None."""
    record = run.recovery_record or {}
    if run.status is not RunStatus.STOPPED or record.get("phase") != "limit_reached":
        return None
    return Stop(str(record.get("limit")), record.get("allowed"), record.get("spent"), record.get("step_id"))


# -- raising a limit ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AskedLimits:
    """The limits a person asked for (``extend_limits``), checked for their types: each None
    (left as it is) or the new value; the deadline as given (a span from now, or an instant)."""

    tokens: int | None = None
    cost: float | None = None
    model_calls: int | None = None
    deadline: timedelta | datetime | None = None
    step_attempts: int | None = None
    resume_budget: int | None = None


def _whole(name: str, value: Any, least: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise UsageError(f"{name}={value!r}: a whole number of {least} or more")
    return value


def asked_limits(
    *,
    tokens: Any = None,
    cost: Any = None,
    model_calls: Any = None,
    deadline: Any = None,
    step_attempts: Any = None,
    resume_budget: Any = None,
) -> AskedLimits:
    """What ``extend_limits`` was asked, checked before anything is read: at least one limit,
    each of its type."""
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0
    ):
        raise UsageError(f"cost={cost!r}: a finite number of 0 or more")
    if deadline is not None:
        if isinstance(deadline, timedelta):
            if deadline <= timedelta(0):
                raise UsageError(f"deadline={deadline!r}: a span from now must be positive")
        elif isinstance(deadline, datetime):
            if deadline.tzinfo is None:
                raise UsageError(
                    f"deadline={deadline!r} has no time zone; pass an aware datetime"
                    " (e.g. datetime.now(UTC) + timedelta(hours=1)) or a timedelta from now"
                )
        else:
            raise UsageError(f"deadline={deadline!r}: pass a timedelta (from now) or an aware datetime")
    asked = AskedLimits(
        tokens=_whole("tokens", tokens, 0),
        cost=None if cost is None else float(cost),
        model_calls=_whole("model_calls", model_calls, 0),
        deadline=deadline,
        step_attempts=_whole("step_attempts", step_attempts, 1),
        resume_budget=_whole("resume_budget", resume_budget, 0),
    )
    if asked == AskedLimits():
        raise UsageError(
            "name a limit to raise: tokens=, cost=, model_calls=, deadline=, step_attempts= or resume_budget="
        )
    return asked


def _instant(deadline: timedelta | datetime, now: int) -> int:
    if isinstance(deadline, timedelta):
        return now + math.ceil(deadline.total_seconds() * 1000)
    return math.floor(deadline.astimezone(UTC).timestamp() * 1000)


def planned_change(
    run: RunRecord,
    asked: AskedLimits,
    *,
    now: int,
    by: str,
    reason: str | None,
    expected_revision: int | None = None,
) -> LimitChange:
    """The change of ``run``'s limits ``asked`` makes (``now``: the store's clock), or
    ``LimitsRefused``: the run has ended or moved on from ``expected_revision``, a limit would
    be lowered below what was spent, or a stopped run would stay stopped at its limit."""

    def refused(reason: str) -> LimitsRefused:
        return LimitsRefused(
            run.run_id, reason, state_revision=run.state_revision, expected_revision=expected_revision
        )

    if run.status.terminal:
        ended = (
            f"it continued as new: its chain goes on in run {run.successor_run_id!r},"
            " change that run's limits"
            if run.status is RunStatus.CONTINUED
            else "it has ended: nothing of it runs again"
        )
        raise refused(f"the run is {run.status.value}; {ended}")
    if expected_revision is not None and run.state_revision != expected_revision:
        raise refused(
            f"the run moved on: it is at revision {run.state_revision}, the limits were"
            f" asked for at revision {expected_revision} — look at it again (safepoint show)"
        )
    old = limits_of(run)
    deadline = None if asked.deadline is None else _instant(asked.deadline, now)
    new = RunLimits(
        tokens=old.tokens if asked.tokens is None else asked.tokens,
        cost=old.cost if asked.cost is None else asked.cost,
        model_calls=old.model_calls if asked.model_calls is None else asked.model_calls,
        deadline=old.deadline if deadline is None else deadline,
        step_attempts=old.step_attempts if asked.step_attempts is None else asked.step_attempts,
        resume_budget=old.resume_budget if asked.resume_budget is None else asked.resume_budget,
    )
    below = [
        f"{name}={value:g}: the run spent {spent:g} already"
        for name, value, spent in (
            (TOKENS, asked.tokens, run.tokens_spent),
            (COST, asked.cost, run.cost_spent),
            (MODEL_CALLS, asked.model_calls, run.model_calls_spent),
            (RESUME_BUDGET, asked.resume_budget, run.resume_count),
        )
        if value is not None and value < spent
    ]
    if deadline is not None and deadline <= now:
        below.append("deadline: that moment has passed already")
    if below:
        raise refused("a limit cannot be lowered below what was spent (" + "; ".join(below) + ")")
    stop = recorded_stop(run)
    if stop is not None and stop_holds(stop, run, new, now):
        spent = "now" if stop.limit == DEADLINE else f"{stop.spent:g}"
        raise refused(
            f"the run stopped at its {stop.limit} limit ({spent} spent of {stop.allowed}) and would"
            f" stop there again: raise {stop.limit} past what was spent"
            f" ({OPTIONS[stop.limit]} on the command line)"
        )
    return LimitChange(old=old, new=new, by=by, reason=reason)


def limits_extended_detail(change: LimitChange, status: RunStatus) -> dict[str, Any]:
    """The ``run.limits_extended`` event's detail: who, why, the old and new limits — and
    whether the change carried a stopped run on (``released``: it became pending)."""
    return {**change.detail(), "released": status is RunStatus.STOPPED}
