"""The errors a run's own course raises: another worker holds it, it failed, it reached a limit,
it was cancelled, a step failed, an effect was rejected, it waits, or a wait timed out.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, field
from typing import Any

from .._rules.moments import instant, when
from ._base import SafepointError, error


@error
class RunOwned(SafepointError):
    """A live worker holds the run's lease; ``lease_expires_at`` says until when (epoch ms)."""

    run_id: str
    owner: str
    lease_expires_at: int

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} is held by worker {self.owner!r}, whose lease runs until"
            f" {when(self.lease_expires_at)}; a live worker is carrying it on — wait for it (or"
            " stop that worker) and resume after the lease"
        )


@error
class ClaimedInFamily(SafepointError):
    """A run went to send an operation that another run of its family — its source, a fork, a
    successor — already holds and may have sent (``holder_run_id``'s ``holder_operation_id``):
    the store refused the dispatch and wrote nothing. The engine answers it from the holder's
    outcome, or blocks the run (``SentBySource``); a store raises it, a caller never sees it."""

    run_id: str
    operation_id: str
    holder_run_id: str
    holder_operation_id: str

    def _message(self) -> str:
        return (
            f"operation {self.operation_id!r} of run {self.run_id!r} is held by run"
            f" {self.holder_run_id!r} of its family (its operation {self.holder_operation_id!r}),"
            " which may have sent it: not sent again"
        )


@error
class RunFailed(SafepointError):
    """The run ended failed; resuming it raises this again from the ledger, and
    ``safepoint.retry`` carries it on once the cause is fixed."""

    run_id: str
    error_type: str
    error_message: str

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} failed with {self.error_type}: {self.error_message}; the failure"
            " is recorded and resuming replays it; once its cause is fixed, retry the run"
            f" (`safepoint retry {self.run_id} --by <you>`, or safepoint.retry): what it did is"
            " kept and not done again, where a new run id would do it all again"
        )


class LimitReached(SafepointError):
    """The run reached one of its limits: a budget (tokens, cost, model calls), its deadline,
    a step's attempts or its resume budget. The limit is recorded with the run, so no restart
    lifts it: the run *stops* (status ``stopped``, resumable, never failed) until a person
    raises the limit (``safepoint.extend_limits``, ``safepoint limits RUN``); a worker then
    carries it on. A run one of whose effects is still uncertain blocks instead, for a person
    to settle the effect first. ``record`` is the stopped run's recovery record (phase
    ``limit_reached``: which ``limit``, ``allowed``, ``spent``, ``step_id``) once the stop is
    recorded — a resume of the stopped run raises the same error with it."""

    run_id: str
    record: dict[str, Any] | None = None

    def __init__(self, message: str, *, run_id: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.record = record


def _raise_hint(run_id: str, option: str) -> str:
    return (
        f"raise it to carry the run on: safepoint limits {run_id} {option} …"
        " (or safepoint.extend_limits), and a worker (or a resume) continues it"
    )


@error
class BudgetExhausted(LimitReached):
    """A run spent one of its budgets: ``kind`` says which (``resumes``: taken over more often
    than its resume budget allows — something kills its workers each time; ``tokens`` or
    ``cost``: its model calls spent what it may spend; ``model_calls``: it made as many model
    calls — turns — as it may). ``limit`` (also ``budget``) and ``spent`` say how far;
    ``resumes`` is the resume count for the resume budget; ``step_id`` the step it stopped
    before (None at a takeover)."""

    run_id: str
    budget: float
    resumes: int | None = None
    _: KW_ONLY
    kind: str = "resumes"
    spent: float | None = None  # of the resume budget: the resumes, when not given
    step_id: str | None = None
    limit: float = field(init=False)  # the budget, under the name every limit has

    def __post_init__(self) -> None:
        self.limit = self.budget
        if self.kind == "resumes" and self.spent is None:
            self.spent = self.resumes
        super().__post_init__()

    def _message(self) -> str:
        if self.kind == "resumes":
            return (
                f"run {self.run_id!r} was resumed {self.resumes} times, past its resume budget"
                f" of {self.budget}; it is stopped rather than retried forever — find what stops"
                f" its workers (see `safepoint show {self.run_id}`), then "
                + _raise_hint(self.run_id, "--resume-budget")
            )
        what = "model calls" if self.kind == "model_calls" else self.kind
        option = "--model-calls" if self.kind == "model_calls" else f"--{self.kind}"
        where = f" before step {self.step_id!r}" if self.step_id else ""
        return (
            f"run {self.run_id!r} spent {self.spent:g} {what} of its {what} budget of"
            f" {self.budget:g}; it is stopped{where} and no further model call is made — "
            + _raise_hint(self.run_id, option)
        )


@error
class DeadlineExceeded(LimitReached):
    """The run's deadline passed (``deadline_at``, epoch ms on the store's clock): no new step
    and no new dispatch is started. Steps already recorded still replay, and an effect in
    flight is still settled."""

    run_id: str
    deadline_at: int
    step_id: str | None = None
    _: KW_ONLY
    retry_at: int | None = None  # when a step's next attempt would have come, past the deadline

    def _message(self) -> str:
        moment = instant(self.deadline_at, millis=True)
        if self.retry_at is not None:  # a step's next attempt would come too late
            what = (
                f"the next attempt of step {self.step_id!r} of run {self.run_id!r} would come at"
                f" {instant(self.retry_at, millis=True)}, past its deadline ({moment})"
            )
        else:
            where = f" at step {self.step_id!r}" if self.step_id else ""
            what = f"run {self.run_id!r} passed its deadline ({moment}){where}"
        return f"{what}; nothing new is started after a deadline, and the run is stopped — " + _raise_hint(
            self.run_id, "--deadline"
        )


@error
class StepAttemptsExhausted(LimitReached):
    """A read or model step whose ``Retry`` allows more than one attempt used them all on an
    error it retries: the run stops before trying it again (the failure is not recorded as the
    step's outcome), so that a person who raises the attempts (``step_attempts``) lets the
    attempts go on from the count recorded. ``attempts`` were made, ``allowed`` were allowed;
    ``error_type`` and ``error_message`` are the last attempt's error."""

    run_id: str
    step_id: str
    attempts: int
    allowed: int
    error_type: str
    error_message: str

    def _message(self) -> str:
        return (
            f"step {self.step_id!r} of run {self.run_id!r} failed all {self.attempts} of its"
            f" {self.allowed} attempts (last: {self.error_type}: {self.error_message}); the run"
            " is stopped before it — " + _raise_hint(self.run_id, "--step-attempts")
        )


@error
class RunCancelled(SafepointError):
    """The run was cancelled (or abandoned): it ends here, and no resume revives it."""

    run_id: str
    reason: str

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} was cancelled ({self.reason}); a cancelled run is never"
            " resumed into activity — start a new run"
        )


@error
class StepFailed(SafepointError):
    """A step's function raised. The failure is recorded, so a resume raises it again here
    instead of asking again: the run takes the same path it took the first time.

    On the first run ``__cause__`` is the original exception; on replay only ``error_type`` and
    ``error_message`` remain. Branch on those, not on the original class.
    """

    run_id: str
    step_id: str
    error_type: str
    error_message: str
    attempts: int = 1

    def _message(self) -> str:
        tries = f" (the last of {self.attempts} attempts)" if self.attempts > 1 else ""
        return (
            f"step {self.step_id!r} of run {self.run_id!r} raised {self.error_type}:"
            f" {self.error_message}{tries}"
        )


@error
class EffectRejected(SafepointError):
    """The effect owner refused the operation; it did not happen and will not be retried."""

    run_id: str
    step_id: str
    operation_id: str
    evidence: Any

    def _message(self) -> str:
        return (
            f"effect {self.operation_id!r} (step {self.step_id!r}) was rejected by its owner: {self.evidence}"
        )


class RunWaiting(SafepointError):
    """The run waits (status ``waiting``, released by its worker): for a person's approval
    (``AwaitingApproval``), a message (``AwaitingMessage``) or its timer (``Sleeping``). An
    expected pause, not a failure; any worker carries the run on once it may go on."""

    run_id: str
    step_id: str


@error
class AwaitingApproval(RunWaiting):
    """The run waits (status ``waiting``) for a person to approve an effect before it is
    dispatched: an expected pause, not a failure. ``payload_digest`` and ``target_digest`` are
    what an approval must be bound to; ``reason`` says why no approval authorizes it yet."""

    run_id: str
    step_id: str
    operation_id: str
    payload_digest: str
    target_digest: str | None
    reason: str

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} waits for approval of effect {self.operation_id!r} (step"
            f" {self.step_id!r}, payload {self.payload_digest}): {self.reason}; see what it"
            f" would send with `safepoint show {self.run_id}`, approve it with `safepoint"
            f" approve {self.run_id} {self.step_id} --by NAME`, then resume it (or let a worker"
            " take it)"
        )


class ApprovalInvalid(AwaitingApproval):
    """An approval was given, but it no longer authorizes the dispatch: the payload or the
    target's state changed since, it expired, or it was revoked. Nothing was dispatched; the run
    waits again."""


@error
class AwaitingMessage(RunWaiting):
    """The run waits (status ``waiting``) for a message named ``name`` at its wait step
    ``step_id`` (``run.wait_for``): ``safepoint.send`` (or ``safepoint send``) delivers one and
    makes the run runnable again. ``timeout_at`` (epoch ms, the store's clock; None: none) is
    when the wait gives up — recorded when it first started, so no restart moves it; a worker
    takes the run then and the wait raises ``WaitTimedOut``."""

    run_id: str
    step_id: str
    name: str
    timeout_at: int | None = None

    def _message(self) -> str:
        until = "" if self.timeout_at is None else f" until {instant(self.timeout_at, millis=True)}"
        return (
            f"run {self.run_id!r} waits for message {self.name!r} (step {self.step_id!r}){until};"
            f" send it with `safepoint send {self.run_id} {self.name} --payload '<json>'` (or"
            " safepoint.send), then a worker carries the run on (or resume it)"
        )


@error
class Sleeping(RunWaiting):
    """The run sleeps (status ``waiting``) at its sleep step ``step_id`` (``run.sleep``) until
    ``until`` (epoch ms, the store's clock, recorded when the sleep first started: no restart
    shortens or restarts it). A worker takes it once it is due."""

    run_id: str
    step_id: str
    until: int

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} sleeps (step {self.step_id!r}) until"
            f" {instant(self.until, millis=True)}; a worker carries it on once it is due"
            " (`safepoint worker`), or resume it then"
        )


@error
class WaitTimedOut(SafepointError):
    """A wait (``run.wait_for(name, timeout=…)``) reached its timeout with no message: the wait
    step is recorded failed, so a resume raises this again here instead of waiting again. Catch
    it in the workflow to go on without the message; a message sent after the timeout is kept
    for the next wait of that name."""

    run_id: str
    step_id: str
    name: str
    timeout_at: int

    def _message(self) -> str:
        return (
            f"wait {self.step_id!r} of run {self.run_id!r} for message {self.name!r} timed out at"
            f" {instant(self.timeout_at, millis=True)} with no message; the timeout is recorded"
            " and replayed — catch WaitTimedOut in the workflow to go on without it"
        )


class TransientFailure(SafepointError):
    """Raised by a read or model step's function (or an integration on its behalf): this attempt
    failed in a way another attempt may not — a rate limit, an overloaded or unreachable server,
    a stream cut mid-body. With ``Retry(retry_on=(TransientFailure,))`` the attempt is recorded
    and the step tried again after its back-off, or after ``retry_after`` seconds when the
    server said how long to wait (whichever is longer). Raise it ``from`` the original error, so
    that the first run still has the cause.

    >>> raise TransientFailure("model API answered 429", retry_after=2.0) from exc
    """

    retry_after: float | None

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        if retry_after is not None and (
            isinstance(retry_after, bool) or not isinstance(retry_after, int | float) or retry_after < 0
        ):
            retry_after = None  # a server's bad header is no reason to lose the failure itself
        super().__init__(message)
        self.retry_after = retry_after
