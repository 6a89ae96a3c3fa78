"""Limits that survive restarts: step attempts with back-off, model token and cost budgets, and
a deadline — the decisions, as small I/O-free functions.

Every limit is recorded with the run (the attempts made, the tokens and cost spent, the
deadline as an instant on the store's clock), so a restart continues from what the ledger
says and never resets a spent budget. The flows in ``_engine.core`` and ``_engine.lifecycle`` ask these
functions what to do; the stores refuse new work past the deadline on their own.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import UsageError
from ..types import JSON, AttemptRecord, Budget, Retry, RunRecord, StepKind

# Only observations and model calls are tried again: a pure step would fail the same way, a
# decision is the planner's (recorded once), and an effect has its own protocol.
RETRYABLE_KINDS = frozenset({StepKind.READ, StepKind.MODEL})
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
    if kind not in RETRYABLE_KINDS:
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
    """What follows a failed attempt: another one at ``retry_at``, or none (``why``)."""

    retry_at: int | None
    why: str | None = None


def after_failure(
    policy: Retry, exc: BaseException, *, failed_in_round: int, now: int, deadline_at: int | None, seed: str
) -> AfterFailure:
    """Try again, and when — or give up, and why."""
    if not isinstance(exc, policy.retry_on):
        return AfterFailure(None, "not retryable" if policy.attempts > 1 else None)
    if failed_in_round >= policy.attempts:
        return AfterFailure(None, None)
    retry_at = now + backoff_ms(policy, failed_in_round, seed)
    if deadline_at is not None and retry_at >= deadline_at:
        return AfterFailure(None, "no time is left before the run's deadline")
    return AfterFailure(retry_at)


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
        return "tokens", run.token_budget, run.tokens_spent
    if run.cost_budget is not None and run.cost_spent >= run.cost_budget:
        return "cost", run.cost_budget, run.cost_spent
    return None


def merged_budget(in_code: Budget | None, given: Budget | None) -> Budget:
    """The budget of a new run: what ``start`` was given, field by field over the workflow's."""
    base, over = in_code or Budget(), given or Budget()
    if not isinstance(over, Budget):
        raise UsageError(f"budget={given!r}: pass safepoint.Budget(tokens=..., cost=...)")
    return Budget(
        tokens=over.tokens if over.tokens is not None else base.tokens,
        cost=over.cost if over.cost is not None else base.cost,
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
        "step_attempts": run.step_attempts.attempts if run.step_attempts else None,
    }


def carried_limits(run: RunRecord) -> dict[str, Any]:
    """The limits a run's successor (continue as new) starts with: the same deadline, and what
    is left of the token and cost budgets — continuing is never a way around a limit."""

    def left(budget: float | None, spent: float) -> float | None:
        return None if budget is None else max(budget - spent, 0)

    tokens = left(run.token_budget, run.tokens_spent)
    return {
        "deadline_at": run.deadline_at,
        "token_budget": None if tokens is None else int(tokens),
        "cost_budget": left(run.cost_budget, run.cost_spent),
    }
