"""Every exception safepoint raises, in one place: ``__all__`` lists each one, and ``safepoint``
itself re-exports the few a workflow's code usually catches (``RunBlocked``, ``RunFailed``, ...).

Errors name a condition, not a failure ("StaleCheckpoint", not "StaleCheckpointError"), carry
structured fields (``run_id``, ``step_id``, ``operation_id``, ``fence``) instead of data to parse
out of a message, and say what to do in their message.

The tree::

    Exception
    └── SafepointError                  anything safepoint raises on purpose
        ├── UsageError                  the caller asked for something impossible; nothing was written
        │   ├── RunNotFound
        │   ├── RunConflict             a run id reused with other inputs or another workflow
        │   ├── WorkflowNotFound        the run's workflow is not imported in this process
        │   ├── NotJSON                 a step result, input or payload is not a JSON value
        │   ├── SecretRefused           a value to be recorded looks like a credential
        │   ├── InvalidDecision         a decide() step returned no next step id
        │   ├── InvalidStepId
        │   ├── ResolutionRefused       a resolution that does not fit the run as it now stands
        │   ├── ApprovalRefused         an approval (or its revocation) that does not fit the run
        │   ├── LimitsRefused           a change of limits that does not fit the run (moved, below spent)
        │   ├── ForkRefused             a fork that cannot be made from that run and step
        │   ├── MessageRefused          a message the run cannot take (it ended; a message id reused)
        │   ├── RetryRefused            a retry that does not fit the run (not failed, moved, …)
        │   ├── InvalidStoreURL
        │   └── MissingExtra            an optional dependency is not installed
        ├── RunOwned                    another live worker holds the run's lease
        ├── RunFailed                   the run ended with an error; resuming replays that ending
        ├── LimitReached                the run reached a limit of its own; it is stopped, resumably
        │   ├── BudgetExhausted         resumes, model tokens, model cost or model calls ran out
        │   ├── DeadlineExceeded        the run's deadline passed: nothing new is started
        │   └── StepAttemptsExhausted   a step used every attempt its Retry allows
        ├── RunCancelled                the run was cancelled; it never runs again
        ├── StepFailed                  a step's function raised; recorded, and raised again on replay
        ├── EffectRejected              the effect owner refused the operation (a definite "no")
        ├── RunWaiting                  the run waits (status waiting, released): a pause, not a fault
        │   ├── AwaitingApproval        for a person to approve an effect
        │   │   └── ApprovalInvalid     an approval was given but no longer authorizes the dispatch
        │   ├── AwaitingMessage         for a message (run.wait_for; safepoint.send delivers it)
        │   └── Sleeping                for its timer (run.sleep) to fall due
        ├── WaitTimedOut                a wait's timeout passed with no message; recorded, replayed
        ├── StoreError                  the ledger itself is unusable
        │   ├── StoreUnavailable        the database cannot be reached (yet): retry later
        │   ├── SchemaTooNew            the database was migrated by a newer safepoint
        │   ├── MigrationMismatch       an applied migration differs from the shipped one
        │   ├── CorruptRecord           a ledger row cannot be read
        │   ├── ArtifactMissing
        │   └── ArtifactCorrupt         an artifact's bytes no longer match their digest
        └── RunBlocked                  the run stopped visibly and carries a recovery record
            ├── NeedsReconciliation     an effect's outcome is uncertain and cannot be settled
            ├── VerificationFailed      an applied effect failed its verifier
            ├── StaleCheckpoint         a recorded step answers another question (input hash moved)
            │   └── ReplayMismatch      the step at this id has another kind or name
            ├── IncompatibleWorkflow    the run was recorded by another version or fingerprint
            ├── SentBySource            a fork's effect that the run it was forked from sent
            └── HistoryLimitReached     the run's history reached its hard limit: nothing new is recorded

    BaseException
    ├── LostOwnership                   this worker's fence is stale: it must stop at once
    ├── Cancelled                       the run was asked to stop: start nothing new
    ├── ContinueAsNew                   run.continue_as_new(...): end the run, start its successor
    └── SliceEnded                      the call's slice (``slice=``) was spent: stop, release the run

    Warning
    └── UserWarning
        └── HistoryWarning              a run's history crossed its soft limit: continue it as new

``LostOwnership``, ``Cancelled`` and ``ContinueAsNew`` derive from ``BaseException`` so that
``except Exception`` in agent code cannot swallow them. ``RunWaiting`` (``AwaitingApproval``,
``AwaitingMessage``, ``Sleeping``) is not a ``RunBlocked``: nothing went wrong and there is no
recovery record; the run is paused (status ``waiting``, released) until a person approves, a
message comes or its timer falls due, and any worker carries it on after that. Like a block, it
halts the run object: agent code that swallows it gets it again from its next step. The
``RunBlocked`` family is ordinary: once a run blocks, the run object refuses every further step
and the run cannot complete, so swallowing the exception gains nothing.
"""

from __future__ import annotations

from typing import Any

from ._rules.moments import instant, when

__all__ = [
    "ApprovalInvalid",
    "ApprovalRefused",
    "ArtifactCorrupt",
    "ArtifactMissing",
    "AwaitingApproval",
    "AwaitingMessage",
    "BudgetExhausted",
    "Cancelled",
    "ContinueAsNew",
    "CorruptRecord",
    "DeadlineExceeded",
    "EffectRejected",
    "ForkRefused",
    "HistoryLimitReached",
    "HistoryWarning",
    "IncompatibleWorkflow",
    "InvalidDecision",
    "InvalidStepId",
    "InvalidStoreURL",
    "LimitReached",
    "LimitsRefused",
    "LostOwnership",
    "MessageRefused",
    "MigrationMismatch",
    "MissingExtra",
    "NeedsReconciliation",
    "NotJSON",
    "ReplayMismatch",
    "ResolutionRefused",
    "RetryRefused",
    "RunBlocked",
    "RunCancelled",
    "RunConflict",
    "RunFailed",
    "RunNotFound",
    "RunOwned",
    "RunWaiting",
    "SafepointError",
    "SchemaTooNew",
    "SecretRefused",
    "SentBySource",
    "Sleeping",
    "SliceEnded",
    "StaleCheckpoint",
    "StepAttemptsExhausted",
    "StepFailed",
    "StoreError",
    "StoreUnavailable",
    "UsageError",
    "VerificationFailed",
    "WaitTimedOut",
    "WorkflowNotFound",
]


class SafepointError(Exception):
    """Base class of every error safepoint raises on purpose."""

    message: str

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for name, value in fields.items():
            setattr(self, name, value)


class UsageError(SafepointError):
    """The caller asked for something that cannot be done; nothing was written."""

    run_id: str | None = None
    step_id: str | None = None


class RunNotFound(UsageError):
    """No run has this id in this store (or the store URL points elsewhere)."""

    run_id: str

    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"no run {run_id!r} in this store; list runs with `safepoint runs`"
            " or check the store URL (SAFEPOINT_URL)",
            run_id=run_id,
        )


class RunConflict(UsageError):
    """A run id already names a run of another workflow or with other inputs: one id, one piece of
    work."""

    run_id: str
    reason: str

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(
            f"run {run_id!r} already exists {reason}; a run id names one piece of work:"
            " choose another run id, or resume the existing run",
            run_id=run_id,
            reason=reason,
        )


class WorkflowNotFound(UsageError):
    """The run's workflow is not registered in this process: import the module that defines it."""

    workflow: str
    run_id: str | None

    def __init__(self, name: str, run_id: str | None = None) -> None:
        super().__init__(
            f"workflow {name!r} is not registered in this process; import the module that"
            " defines it (CLI: --import your.module) before resuming",
            workflow=name,
            run_id=run_id,
        )


class NotJSON(UsageError):
    """A value to be recorded (inputs, a result, a payload, a receipt) is not JSON; ``path`` says
    where."""

    what: str
    path: str
    type_name: str
    step_id: str | None

    def __init__(self, what: str, path: str, type_name: str, step_id: str | None = None) -> None:
        where = f" of step {step_id!r}" if step_id else ""
        super().__init__(
            f"{what}{where} is not a JSON value: {path} is a {type_name}; return dicts with"
            " string keys, lists, strings, finite numbers, booleans or None"
            " (for example convert with .model_dump() or .isoformat())",
            what=what,
            path=path,
            type_name=type_name,
            step_id=step_id,
        )


class SecretRefused(UsageError):
    """A value the caller chose looks like a credential and was not recorded; ``path`` says where."""

    what: str
    path: str
    why: str
    step_id: str | None

    def __init__(self, what: str, path: str, why: str, step_id: str | None = None) -> None:
        where = f" of step {step_id!r}" if step_id else ""
        super().__init__(
            f"{what}{where} was not recorded: {path} looks like a credential ({why});"
            " credentials never enter the ledger — pass them to steps as safepoint.Secret(...),"
            " or let the effect obtain them at dispatch through its own path",
            what=what,
            path=path,
            why=why,
            step_id=step_id,
        )


class InvalidDecision(UsageError):
    """A ``decide`` step returned no next step id."""

    step_id: str

    def __init__(self, step_id: str, got: str) -> None:
        super().__init__(
            f"decision step {step_id!r} returned {got}; a decision returns the next step id"
            " (a string) or a dict with a string 'next_step_id'",
            step_id=step_id,
        )


class InvalidStepId(UsageError):
    """A step id that cannot be one (blank, not a string, NUL, a lone surrogate, ``#``, too long)."""

    step_id: object  # type: ignore[assignment]  # what was given, which is no step id
    reason: str

    def __init__(self, step_id: object, reason: str = "it is no step id") -> None:
        super().__init__(
            f"invalid step id {step_id!r}: {reason}; a step id is a non-empty string of at most"
            " 1000 characters, storable as UTF-8, without NUL or '#' (safepoint appends '#2',"
            " '#3' to repeated ids), e.g. 'plan.3.fetch_invoice'",
            step_id=step_id,
            reason=reason,
        )


class ResolutionRefused(UsageError):
    """A person's resolution does not fit the run as it now stands; nothing was changed."""

    run_id: str
    reason: str

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(
            f"resolution of run {run_id!r} refused: {reason}; look at the run again with"
            f" `safepoint record {run_id}` and resolve what it says now",
            run_id=run_id,
            reason=reason,
        )


class ApprovalRefused(UsageError):
    """An approval — or, with ``revoking``, the revocation of one — that does not fit the run
    as it now stands. Nothing was written."""

    run_id: str
    step_id: str
    reason: str
    revoking: bool

    def __init__(self, run_id: str, step_id: str, reason: str, *, revoking: bool = False) -> None:
        what = "revoking the approval" if revoking else "approval"
        super().__init__(
            f"{what} of step {step_id!r} of run {run_id!r} refused: {reason}",
            run_id=run_id,
            step_id=step_id,
            reason=reason,
            revoking=revoking,
        )


class MessageRefused(UsageError):
    """A message ``safepoint.send`` cannot deliver; nothing was written. ``reason`` says why: the
    run has ended (a message to it would never be received), or the sender's ``message_id`` was
    used already for another message (another name or payload) in this run."""

    run_id: str
    name: str
    reason: str

    def __init__(self, run_id: str, name: str, reason: str) -> None:
        super().__init__(
            f"message {name!r} to run {run_id!r} refused: {reason}",
            run_id=run_id,
            name=name,
            reason=reason,
        )


class LimitsRefused(UsageError):
    """A change of a run's limits (``extend_limits``) that does not fit the run as it now
    stands: the run moved on from the revision it was asked at (``state_revision`` is where it
    now is, ``expected_revision`` what was given), a limit would be lowered below what the run
    already spent, or the run has ended. Nothing was changed."""

    run_id: str
    reason: str
    state_revision: int | None
    expected_revision: int | None

    def __init__(
        self,
        run_id: str,
        reason: str,
        *,
        state_revision: int | None = None,
        expected_revision: int | None = None,
    ) -> None:
        super().__init__(
            f"the limits of run {run_id!r} were not changed: {reason}",
            run_id=run_id,
            reason=reason,
            state_revision=state_revision,
            expected_revision=expected_revision,
        )


class ForkRefused(UsageError):
    """A fork that cannot be made as asked (``safepoint.fork``); nothing was written. ``reason``
    says why; ``choices`` lists what could be asked instead (the steps a fork can start from,
    the operations ``resend`` can name), ``operation_id`` names the operation in the way."""

    run_id: str
    reason: str
    choices: tuple[str, ...]
    operation_id: str | None

    def __init__(
        self, run_id: str, reason: str, *, choices: tuple[str, ...] = (), operation_id: str | None = None
    ) -> None:
        super().__init__(
            f"cannot fork run {run_id!r}: {reason}",
            run_id=run_id,
            reason=reason,
            choices=tuple(choices),
            operation_id=operation_id,
        )


class RetryRefused(UsageError):
    """A retry (``safepoint.retry``) that does not fit the run as it now stands — it is not
    failed, it moved since the revision given, or ``step`` / ``resend`` name something it
    cannot retry or send again; ``reason`` says which, and what can be named. Nothing was
    changed."""

    run_id: str
    reason: str

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(
            f"retry of run {run_id!r} refused: {reason}",
            run_id=run_id,
            reason=reason,
        )


class InvalidStoreURL(UsageError):
    """A store URL that names no store safepoint can open."""

    url: str

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(
            f"cannot open store {url!r}: {reason}; use sqlite:///path/to/file.db, a plain"
            " file path, postgresql://user@host/db[?schema=name], or memory: for tests",
            url=url,
        )


class MissingExtra(UsageError):
    """An optional dependency of the store asked for is not installed (``pip install
    'safepoint[extra]'``)."""

    extra: str
    module: str

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"the {extra} store needs the {module!r} package, which is not installed:"
            f" pip install 'safepoint[{extra}]'",
            extra=extra,
            module=module,
        )


class RunOwned(SafepointError):
    """A live worker holds the run's lease; ``lease_expires_at`` says until when (epoch ms)."""

    run_id: str
    owner: str
    lease_expires_at: int

    def __init__(self, run_id: str, owner: str, lease_expires_at: int) -> None:
        super().__init__(
            f"run {run_id!r} is held by worker {owner!r}, whose lease runs until"
            f" {when(lease_expires_at)}; a live worker is carrying it on — wait for it (or stop"
            " that worker) and resume after the lease",
            run_id=run_id,
            owner=owner,
            lease_expires_at=lease_expires_at,
        )


class RunFailed(SafepointError):
    """The run ended failed; resuming it raises this again from the ledger, and
    ``safepoint.retry`` carries it on once the cause is fixed."""

    run_id: str
    error_type: str
    error_message: str

    def __init__(self, run_id: str, error_type: str, error_message: str) -> None:
        super().__init__(
            f"run {run_id!r} failed with {error_type}: {error_message}; the failure is recorded"
            " and resuming replays it; once its cause is fixed, retry the run (`safepoint retry"
            f" {run_id} --by <you>`, or safepoint.retry): what it did is kept and not done"
            " again, where a new run id would do it all again",
            run_id=run_id,
            error_type=error_type,
            error_message=error_message,
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


def _raise_hint(run_id: str, option: str) -> str:
    return (
        f"raise it to carry the run on: safepoint limits {run_id} {option} …"
        " (or safepoint.extend_limits), and a worker (or a resume) continues it"
    )


class BudgetExhausted(LimitReached):
    """A run spent one of its budgets: ``kind`` says which (``resumes``: taken over more often
    than its resume budget allows — something kills its workers each time; ``tokens`` or
    ``cost``: its model calls spent what it may spend; ``model_calls``: it made as many model
    calls — turns — as it may). ``limit`` (also ``budget``) and ``spent`` say how far;
    ``resumes`` is the resume count for the resume budget; ``step_id`` the step it stopped
    before (None at a takeover)."""

    kind: str
    budget: float
    limit: float
    spent: float
    resumes: int | None
    step_id: str | None

    def __init__(
        self,
        run_id: str,
        budget: float,
        resumes: int | None = None,
        *,
        kind: str = "resumes",
        spent: float | None = None,
        step_id: str | None = None,
    ) -> None:
        if kind == "resumes":
            spent = resumes if spent is None else spent
            message = (
                f"run {run_id!r} was resumed {resumes} times, past its resume budget of"
                f" {budget}; it is stopped rather than retried forever — find what stops"
                f" its workers (see `safepoint show {run_id}`), then "
                + _raise_hint(run_id, "--resume-budget")
            )
        else:
            what = "model calls" if kind == "model_calls" else kind
            option = "--model-calls" if kind == "model_calls" else f"--{kind}"
            where = f" before step {step_id!r}" if step_id else ""
            message = (
                f"run {run_id!r} spent {spent:g} {what} of its {what} budget of"
                f" {budget:g}; it is stopped{where} and no further model call is made — "
                + _raise_hint(run_id, option)
            )
        super().__init__(
            message,
            run_id=run_id,
            budget=budget,
            resumes=resumes,
            kind=kind,
            limit=budget,
            spent=spent,
            step_id=step_id,
        )


class DeadlineExceeded(LimitReached):
    """The run's deadline passed (``deadline_at``, epoch ms on the store's clock): no new step
    and no new dispatch is started. Steps already recorded still replay, and an effect in
    flight is still settled."""

    deadline_at: int
    step_id: str | None
    retry_at: int | None

    def __init__(
        self, run_id: str, deadline_at: int, step_id: str | None = None, *, retry_at: int | None = None
    ) -> None:
        moment = instant(deadline_at, millis=True)
        if retry_at is not None:  # a step's next attempt would come too late
            what = (
                f"the next attempt of step {step_id!r} of run {run_id!r} would come at"
                f" {instant(retry_at, millis=True)}, past its deadline ({moment})"
            )
        else:
            where = f" at step {step_id!r}" if step_id else ""
            what = f"run {run_id!r} passed its deadline ({moment}){where}"
        super().__init__(
            f"{what}; nothing new is started after a deadline, and the run is stopped — "
            + _raise_hint(run_id, "--deadline"),
            run_id=run_id,
            deadline_at=deadline_at,
            step_id=step_id,
            retry_at=retry_at,
        )


class StepAttemptsExhausted(LimitReached):
    """A read or model step whose ``Retry`` allows more than one attempt used them all on an
    error it retries: the run stops before trying it again (the failure is not recorded as the
    step's outcome), so that a person who raises the attempts (``step_attempts``) lets the
    attempts go on from the count recorded. ``attempts`` were made, ``allowed`` were allowed;
    ``error_type`` and ``error_message`` are the last attempt's error."""

    step_id: str
    attempts: int
    allowed: int
    error_type: str
    error_message: str

    def __init__(
        self, run_id: str, step_id: str, attempts: int, allowed: int, error_type: str, error_message: str
    ) -> None:
        super().__init__(
            f"step {step_id!r} of run {run_id!r} failed all {attempts} of its {allowed} attempts"
            f" (last: {error_type}: {error_message}); the run is stopped before it — "
            + _raise_hint(run_id, "--step-attempts"),
            run_id=run_id,
            step_id=step_id,
            attempts=attempts,
            allowed=allowed,
            error_type=error_type,
            error_message=error_message,
        )


class RunCancelled(SafepointError):
    """The run was cancelled (or abandoned): it ends here, and no resume revives it."""

    run_id: str
    reason: str

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(
            f"run {run_id!r} was cancelled ({reason}); a cancelled run is never"
            " resumed into activity — start a new run",
            run_id=run_id,
            reason=reason,
        )


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
    attempts: int

    def __init__(
        self, run_id: str, step_id: str, error_type: str, error_message: str, attempts: int = 1
    ) -> None:
        tries = f" (the last of {attempts} attempts)" if attempts > 1 else ""
        super().__init__(
            f"step {step_id!r} of run {run_id!r} raised {error_type}: {error_message}{tries}",
            run_id=run_id,
            step_id=step_id,
            error_type=error_type,
            error_message=error_message,
            attempts=attempts,
        )


class EffectRejected(SafepointError):
    """The effect owner refused the operation; it did not happen and will not be retried."""

    run_id: str
    step_id: str
    operation_id: str
    evidence: Any

    def __init__(self, run_id: str, step_id: str, operation_id: str, evidence: Any) -> None:
        super().__init__(
            f"effect {operation_id!r} (step {step_id!r}) was rejected by its owner: {evidence}",
            run_id=run_id,
            step_id=step_id,
            operation_id=operation_id,
            evidence=evidence,
        )


class RunWaiting(SafepointError):
    """The run waits (status ``waiting``, released by its worker): for a person's approval
    (``AwaitingApproval``), a message (``AwaitingMessage``) or its timer (``Sleeping``). An
    expected pause, not a failure; any worker carries the run on once it may go on."""

    run_id: str
    step_id: str


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

    def __init__(
        self,
        run_id: str,
        step_id: str,
        operation_id: str,
        payload_digest: str,
        target_digest: str | None,
        reason: str,
    ) -> None:
        super().__init__(
            f"run {run_id!r} waits for approval of effect {operation_id!r} (step {step_id!r},"
            f" payload {payload_digest}): {reason}; see what it would send with"
            f" `safepoint show {run_id}`, approve it with `safepoint approve {run_id}"
            f" {step_id} --by NAME`, then resume it (or let a worker take it)",
            run_id=run_id,
            step_id=step_id,
            operation_id=operation_id,
            payload_digest=payload_digest,
            target_digest=target_digest,
            reason=reason,
        )


class ApprovalInvalid(AwaitingApproval):
    """An approval was given, but it no longer authorizes the dispatch: the payload or the
    target's state changed since, it expired, or it was revoked. Nothing was dispatched; the run
    waits again."""


class AwaitingMessage(RunWaiting):
    """The run waits (status ``waiting``) for a message named ``name`` at its wait step
    ``step_id`` (``run.wait_for``): ``safepoint.send`` (or ``safepoint send``) delivers one and
    makes the run runnable again. ``timeout_at`` (epoch ms, the store's clock; None: none) is
    when the wait gives up — recorded when it first started, so no restart moves it; a worker
    takes the run then and the wait raises ``WaitTimedOut``."""

    name: str
    timeout_at: int | None

    def __init__(self, run_id: str, step_id: str, name: str, timeout_at: int | None = None) -> None:
        until = "" if timeout_at is None else f" until {instant(timeout_at, millis=True)}"
        super().__init__(
            f"run {run_id!r} waits for message {name!r} (step {step_id!r}){until}; send it with"
            f" `safepoint send {run_id} {name} --payload '<json>'` (or safepoint.send), then a"
            " worker carries the run on (or resume it)",
            run_id=run_id,
            step_id=step_id,
            name=name,
            timeout_at=timeout_at,
        )


class Sleeping(RunWaiting):
    """The run sleeps (status ``waiting``) at its sleep step ``step_id`` (``run.sleep``) until
    ``until`` (epoch ms, the store's clock, recorded when the sleep first started: no restart
    shortens or restarts it). A worker takes it once it is due."""

    until: int

    def __init__(self, run_id: str, step_id: str, until: int) -> None:
        super().__init__(
            f"run {run_id!r} sleeps (step {step_id!r}) until {instant(until, millis=True)};"
            " a worker carries it on once it is due (`safepoint worker`), or resume it then",
            run_id=run_id,
            step_id=step_id,
            until=until,
        )


class WaitTimedOut(SafepointError):
    """A wait (``run.wait_for(name, timeout=…)``) reached its timeout with no message: the wait
    step is recorded failed, so a resume raises this again here instead of waiting again. Catch
    it in the workflow to go on without the message; a message sent after the timeout is kept
    for the next wait of that name."""

    run_id: str
    step_id: str
    name: str
    timeout_at: int

    def __init__(self, run_id: str, step_id: str, name: str, timeout_at: int) -> None:
        super().__init__(
            f"wait {step_id!r} of run {run_id!r} for message {name!r} timed out at"
            f" {instant(timeout_at, millis=True)} with no message; the timeout is recorded and"
            " replayed — catch WaitTimedOut in the workflow to go on without it",
            run_id=run_id,
            step_id=step_id,
            name=name,
            timeout_at=timeout_at,
        )


class StoreError(SafepointError):
    """The ledger cannot be used as it is. Nothing recorded has been changed."""

    url: str | None = None
    path: str | None = None


class StoreUnavailable(StoreError):
    """The database could not be reached, or the connection broke during the operation — a
    write then may or may not have landed, which the ledger tells once the database answers.
    Never sent again behind the caller's back. Workers wait and retry from the ledger."""


class SchemaTooNew(StoreError):
    """The store was migrated by a newer safepoint than this one; nothing was changed."""

    found: int
    known: int

    def __init__(self, found: int, known: int) -> None:
        super().__init__(
            f"the store's schema is at version {found} but this safepoint knows only up to"
            f" {known}; upgrade safepoint (the data is untouched)",
            found=found,
            known=known,
        )


class MigrationMismatch(StoreError):
    """A migration recorded in the store differs from the one this safepoint ships; the message
    says what to do (``fix``). Nothing was changed."""

    version: int
    fix: str

    def __init__(self, version: int, fix: str | None = None) -> None:
        fix = fix or "the store was migrated by a different build — use that build"
        super().__init__(
            f"migration {version} recorded in the store differs from the one shipped with this"
            f" safepoint; {fix}",
            version=version,
            fix=fix,
        )


class CorruptRecord(StoreError):
    """A ledger row cannot be read (``table``, ``key``, ``reason``); the row is kept as it is."""

    table: str
    key: str
    reason: str

    def __init__(self, table: str, key: str, reason: str) -> None:
        super().__init__(
            f"unreadable ledger row in {table} ({key}): {reason}; the row is kept as it is and"
            " its run blocks (phase unreadable_record) while every other run goes on — repair"
            " the row or restore it from a backup, then resume the run",
            table=table,
            key=key,
            reason=reason,
        )


class ArtifactMissing(StoreError):
    """An artifact the ledger refers to is not in the store."""

    digest: str

    def __init__(self, digest: str) -> None:
        super().__init__(
            f"artifact {digest} is missing from the store; restore it from a backup",
            digest=digest,
        )


class ArtifactCorrupt(StoreError):
    """An artifact's bytes no longer match their digest."""

    digest: str
    actual: str

    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(
            f"artifact {digest} does not match its digest (its bytes hash to {actual}); it was"
            " altered after it was written — restore it from a backup",
            digest=digest,
            actual=actual,
        )


class RunBlocked(SafepointError):
    """The run stopped visibly; ``record`` is its recovery record (a JSON-ready dict)."""

    run_id: str
    record: dict[str, Any] | None

    def __init__(
        self, message: str, *, run_id: str, record: dict[str, Any] | None = None, **fields: Any
    ) -> None:
        super().__init__(message, run_id=run_id, record=record, **fields)


class NeedsReconciliation(RunBlocked):
    """An effect may have happened and could not be settled: the run blocks for a person."""

    step_id: str
    operation_id: str
    reason: str

    def __init__(
        self, run_id: str, step_id: str, operation_id: str, reason: str, record: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            f"effect {operation_id!r} (step {step_id!r}) may have happened and could not be"
            f" settled: {reason}; check the effect owner, then resolve the run"
            f" (see `safepoint record {run_id}`)",
            run_id=run_id,
            step_id=step_id,
            operation_id=operation_id,
            reason=reason,
            record=record,
        )


class VerificationFailed(RunBlocked):
    """An applied effect was not accepted by its verifier: the run blocks, nothing is sent again."""

    step_id: str
    operation_id: str
    reason: str

    def __init__(
        self, run_id: str, step_id: str, operation_id: str, reason: str, record: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            f"effect {operation_id!r} (step {step_id!r}) was applied but its verifier did not"
            f" accept it: {reason}; it will not be dispatched again — inspect it and resolve"
            " the run by hand",
            run_id=run_id,
            step_id=step_id,
            operation_id=operation_id,
            reason=reason,
            record=record,
        )


class StaleCheckpoint(RunBlocked):
    """A recorded step answers another question than the one now asked (its input hash moved)."""

    step_id: str
    reason: str

    def __init__(self, run_id: str, step_id: str, reason: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(
            f"step {step_id!r} was recorded for other inputs ({reason}); the stored answer is to"
            " another question — the run is blocked under the 'refuse' policy: revert the"
            " change, or start a new run",
            run_id=run_id,
            step_id=step_id,
            reason=reason,
            record=record,
        )


class ReplayMismatch(StaleCheckpoint):
    """The code path changed under the run: the step recorded at this id has another kind or
    name, or the code no longer reaches an operation the ledger holds and asks for another.
    Raised under either compatibility policy: no answer of the ledger fits this path."""

    def __init__(self, run_id: str, step_id: str, reason: str, record: dict[str, Any] | None = None) -> None:
        RunBlocked.__init__(
            self,
            f"step {step_id!r} is not on the path the ledger recorded ({reason}); the run is"
            " blocked rather than replay or send anything along another path: deploy the code"
            " that recorded it, or settle the run by hand (see"
            f" `safepoint record {run_id}`)",
            run_id=run_id,
            step_id=step_id,
            reason=reason,
            record=record,
        )


class IncompatibleWorkflow(RunBlocked):
    """The run was recorded by another workflow version or fingerprint than this process has."""

    recorded: str
    current: str
    changes: list[str]

    def __init__(
        self,
        run_id: str,
        recorded: str,
        current: str,
        record: dict[str, Any] | None = None,
        changes: list[str] | None = None,
    ) -> None:
        changes = list(changes or [f"{recorded} became {current}"])
        super().__init__(
            f"run {run_id!r} was recorded by other code than this process has ({recorded} →"
            f" {current}: {'; '.join(changes)}); deploy the recorded code to finish it, register"
            " the workflow with compatibility='replan' to carry it on under this code, or start"
            " a new run",
            run_id=run_id,
            recorded=recorded,
            current=current,
            changes=changes,
            record=record,
        )


class SentBySource(RunBlocked):
    """An effect step of a fork asks for an operation that the run it was forked from (or that
    run's own source) sent — with another payload, or with an outcome not settled there. A fork
    never sends such an operation again under a key of its own unless the operator named it in
    ``resend``: the run blocks instead. ``source_run_id`` is the run that holds it."""

    step_id: str
    operation_id: str
    source_run_id: str
    reason: str

    def __init__(
        self,
        run_id: str,
        step_id: str,
        operation_id: str,
        source_run_id: str,
        reason: str,
        record: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(
            f"effect {operation_id!r} (step {step_id!r}) of fork {run_id!r} is not sent: {reason};"
            " a fork never sends again what the run it was forked from sent, unless the operator"
            f" names it — fork {source_run_id!r} again with resend=[{operation_id!r}] (CLI:"
            f" --resend {operation_id}) to send it under the fork's own key",
            run_id=run_id,
            step_id=step_id,
            operation_id=operation_id,
            source_run_id=source_run_id,
            reason=reason,
            record=record,
        )


class HistoryLimitReached(RunBlocked):
    """The run's history — its events and recorded steps — reached its hard limit: the store
    records nothing new for it (no step, no effect). Outcomes of effects already in flight and
    the run's ending are still recorded. Continue long runs as new before this point."""

    size: int | None
    limit: int | None

    def __init__(
        self, run_id: str, size: int | None, limit: int | None, record: dict[str, Any] | None = None
    ) -> None:
        super().__init__(
            f"run {run_id!r} reached its hard history limit ({size} of {limit} events and"
            " steps): nothing new is recorded for it — have the workflow call"
            " run.continue_as_new(state) before the limit (every N iterations, say), then"
            f" resume it (see `safepoint record {run_id}`)",
            run_id=run_id,
            size=size,
            limit=limit,
            record=record,
        )


class HistoryWarning(UserWarning):
    """A run's history crossed its soft limit (``HistoryLimit.soft``): it should continue as new
    before it reaches the hard limit, where it would stop. Recorded once per run as a
    ``run.history_warning`` event too."""


class LostOwnership(BaseException):
    """This worker's fence token is stale: another worker owns the run. Stop at once.

    Derived from ``BaseException`` so that agent code's ``except Exception`` cannot swallow it.
    """

    run_id: str
    fence: int

    def __init__(self, run_id: str, fence: int) -> None:
        super().__init__(
            f"worker lost ownership of run {run_id!r} (its fence {fence} is stale); another"
            " worker took the run over — this worker must stop without writing or dispatching"
        )
        self.run_id = run_id
        self.fence = fence


class Cancelled(BaseException):
    """The run was asked to stop: this worker may settle what is in flight but starts nothing
    new. A ``BaseException``, so that agent code's ``except Exception`` cannot swallow it."""

    run_id: str

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} was asked to stop; nothing new is started")
        self.run_id = run_id


class ContinueAsNew(BaseException):
    """Raised by ``run.continue_as_new(...)``: the run ends (status ``continued``) and its
    successor starts with ``inputs`` as its arguments. A ``BaseException``, so that agent code's
    ``except Exception`` cannot swallow it; there is nothing to catch — let it pass."""

    run_id: str
    inputs: dict[str, Any]

    def __init__(self, run_id: str, inputs: dict[str, Any]) -> None:
        super().__init__(f"run {run_id!r} continues as new; its successor carries on")
        self.run_id = run_id
        self.inputs = inputs


class SliceEnded(BaseException):
    """The slice of time the call was given (``resume(..., slice=...)``, ``start``, a worker's
    ``run``) was spent: the run stops at this step boundary — before ``step_id``, which did not
    start — and is released at once, for the next call to carry on. The call returns
    ``safepoint.types.Unfinished``; this signal never reaches its caller. A ``BaseException``,
    so that agent code's ``except Exception`` cannot swallow it; there is nothing to catch."""

    run_id: str
    step_id: str | None
    slice_s: float
    elapsed_s: float

    def __init__(self, run_id: str, step_id: str | None, slice_s: float, elapsed_s: float) -> None:
        before = f" before step {step_id!r}" if step_id is not None else ""
        super().__init__(
            f"run {run_id!r}: the slice of {slice_s:g}s was spent ({elapsed_s:.2f}s since the"
            f" call began); it stops{before} and is released for the next call to carry on"
        )
        self.run_id = run_id
        self.step_id = step_id
        self.slice_s = slice_s
        self.elapsed_s = elapsed_s
