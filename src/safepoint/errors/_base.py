"""The root of the tree, ``SafepointError``, and ``UsageError`` with its family: the caller asked
for something that cannot be done, and nothing was written.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from typing import Any


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
    """A person's resolution does not fit the run as it now stands; nothing was changed.

    When the effect's owner was asked before a "not applied" and refused it, ``owner_answer``
    is what it said (``"applied"``, ``"not_applied"`` past its memory of keys, ``"unknown"``)
    and, when it has the effect (``"applied"``), ``receipt`` is what it holds — as recorded,
    redacted — to resolve the run ``applied`` with. Both are None otherwise."""

    run_id: str
    reason: str
    owner_answer: str | None
    receipt: Any

    def __init__(
        self, run_id: str, reason: str, *, owner_answer: str | None = None, receipt: Any = None
    ) -> None:
        super().__init__(
            f"resolution of run {run_id!r} refused: {reason}; look at the run again with"
            f" `safepoint record {run_id}` and resolve what it says now",
            run_id=run_id,
            reason=reason,
            owner_answer=owner_answer,
            receipt=receipt,
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


class GateApproved(ApprovalRefused):
    """An approval of an effect whose gate has its approval: ``approval_id``, given by
    ``approved_by`` at ``approved_at``, still authorizes it — before the dispatch (a gate takes
    one approval: revoke it to approve anew) or after the effect went out under it
    (``went_out``: an approval now would authorize nothing; what happened is reconciled with its
    owner). The same person approving again gets their approval back instead. Nothing was
    written."""

    operation_id: str
    approval_id: str
    approved_by: str
    approved_at: int
    went_out: bool

    def __init__(
        self,
        run_id: str,
        step_id: str,
        reason: str,
        *,
        operation_id: str,
        approval_id: str,
        approved_by: str,
        approved_at: int,
        went_out: bool,
    ) -> None:
        super().__init__(run_id, step_id, reason)
        self.operation_id = operation_id
        self.approval_id = approval_id
        self.approved_by = approved_by
        self.approved_at = approved_at
        self.went_out = went_out


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


class WaitAnswered(MessageRefused):
    """An answer (``safepoint.answer``) to a wait that has had its answer: one was kept for it
    already (by ``answered_by`` at ``answered_at``), it took a message, or it timed out
    (``timed_out``, at ``answered_at``). Nothing was kept: a wait takes one answer. ``step_id``
    is the wait; ``waits_at`` the wait of this name the run is parked at now, if any — address
    the next wait explicitly to answer it, or ``send`` a message to queue for whichever wait of
    the name comes next."""

    step_id: str
    answered_by: str | None
    answered_at: int | None
    timed_out: bool
    waits_at: str | None

    def __init__(
        self,
        run_id: str,
        name: str,
        step_id: str,
        reason: str,
        *,
        answered_by: str | None = None,
        answered_at: int | None = None,
        timed_out: bool = False,
        waits_at: str | None = None,
    ) -> None:
        super().__init__(run_id, name, reason)
        self.step_id = step_id
        self.answered_by = answered_by
        self.answered_at = answered_at
        self.timed_out = timed_out
        self.waits_at = waits_at


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


class PruneRefused(UsageError):
    """A prune (``safepoint.prune``) asked for something it cannot do — a status that is not an
    ending a run is pruned at, a cut-off that is no time, a batch size below one; ``reason`` says
    which and what to give instead. Nothing was deleted."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"prune refused: {reason}", reason=reason)


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
    """An optional dependency of the store (or module, ``needed_by``) asked for is not
    installed (``pip install 'safepoint[extra]'``)."""

    extra: str
    module: str

    def __init__(self, extra: str, module: str, needed_by: str | None = None) -> None:
        super().__init__(
            f"{needed_by or f'the {extra} store'} needs the {module!r} package, which is not"
            f" installed: pip install 'safepoint[{extra}]'",
            extra=extra,
            module=module,
        )
