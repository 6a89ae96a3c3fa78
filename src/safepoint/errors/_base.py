"""The root of the tree, ``SafepointError``, the ``@error`` declaration every error with fields
uses, and ``UsageError`` with its family: the caller asked for something that cannot be done, and
nothing was written.

An error is declared once: ``@error`` makes a dataclass of it, so its annotations are its fields
— the constructor's parameters, in the order written, and typed attributes mypy checks at every
construction and every access — and its ``_message`` builds the message from them::

    @error
    class RunNotFound(UsageError):
        run_id: str

        def _message(self) -> str:
            return f"no run {self.run_id!r} in this store; ..."

A family that callers raise with a message of their own (``UsageError("...", step_id=...)``,
``StoreError``, ``RunBlocked``, ``LimitReached``) keeps a plain ``__init__`` instead: it is no
dataclass, so its members do not inherit its optional fields as constructor parameters, and the
defaults it declares (``run_id = None``) are what a member that lacks the field answers.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import KW_ONLY
from typing import Any, TypeVar, dataclass_transform

_Error = TypeVar("_Error")


@dataclass_transform(eq_default=False, field_specifiers=(dataclasses.field,))
def error(cls: type[_Error]) -> type[_Error]:
    """Declare an error: its annotations become its fields (see the module's docstring)."""
    for name in inspect.get_annotations(cls):
        # A field written without a default has none, as mypy reads it, even where a family
        # above gives the attribute one (``UsageError.run_id = None``): dataclasses would take
        # that inherited value as the field's default.
        if name not in cls.__dict__ and hasattr(cls, name):
            setattr(cls, name, dataclasses.field())
    # eq=False: an error equals itself only, and stays hashable; repr=False: the exception's
    # own repr, which shows the message.
    return dataclasses.dataclass(cls, eq=False, repr=False)


def _rebuild(cls: type[Declared], state: dict[str, Any]) -> Declared:
    """Unpickle an error from its fields and message, without calling its constructor."""
    made = cls.__new__(cls)
    made.__dict__.update(state)
    made.args = (made.message,)
    return made


class Declared:
    """What every error shares, ``SafepointError`` and the ``BaseException`` signals alike: a
    ``message``, built once its fields are set, and pickling by those fields (errors cross
    process boundaries; the exception's own pickling would call the constructor with the
    message as its only argument)."""

    message: str
    args: tuple[Any, ...]

    def _message(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} declares no _message")

    def __post_init__(self) -> None:
        # The dataclass's __init__ sets the fields and calls this; the exception's args (what
        # its str() and repr() show) are the message, as when a message is given.
        self.message = self._message()
        self.args = (self.message,)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), dict(self.__dict__)))


class SafepointError(Declared, Exception):
    """Base class of every error safepoint raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(SafepointError):
    """The caller asked for something that cannot be done; nothing was written."""

    run_id: str | None = None
    step_id: str | None = None

    def __init__(self, message: str, *, run_id: str | None = None, step_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.step_id = step_id


@error
class RunNotFound(UsageError):
    """No run has this id in this store (or the store URL points elsewhere)."""

    run_id: str

    def _message(self) -> str:
        return (
            f"no run {self.run_id!r} in this store; list runs with `safepoint runs`"
            " or check the store URL (SAFEPOINT_URL)"
        )


@error
class RunConflict(UsageError):
    """A run id already names a run of another workflow or with other inputs: one id, one piece of
    work."""

    run_id: str
    reason: str

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} already exists {self.reason}; a run id names one piece of work:"
            " choose another run id, or resume the existing run"
        )


@error
class WorkflowNotFound(UsageError):
    """The run's workflow is not registered in this process: import the module that defines it."""

    workflow: str
    run_id: str | None = None

    def _message(self) -> str:
        return (
            f"workflow {self.workflow!r} is not registered in this process; import the module that"
            " defines it (CLI: --import your.module) before resuming"
        )


@error
class NotJSON(UsageError):
    """A value to be recorded (inputs, a result, a payload, a receipt) is not JSON; ``path`` says
    where."""

    what: str
    path: str
    type_name: str
    step_id: str | None = None

    def _message(self) -> str:
        where = f" of step {self.step_id!r}" if self.step_id else ""
        return (
            f"{self.what}{where} is not a JSON value: {self.path} is a {self.type_name}; return"
            " dicts with string keys, lists, strings, finite numbers, booleans or None"
            " (for example convert with .model_dump() or .isoformat())"
        )


@error
class SecretRefused(UsageError):
    """A value the caller chose looks like a credential and was not recorded; ``path`` says where."""

    what: str
    path: str
    why: str
    step_id: str | None = None

    def _message(self) -> str:
        where = f" of step {self.step_id!r}" if self.step_id else ""
        return (
            f"{self.what}{where} was not recorded: {self.path} looks like a credential ({self.why});"
            " credentials never enter the ledger — pass them to steps as safepoint.Secret(...),"
            " or let the effect obtain them at dispatch through its own path"
        )


@error
class InvalidDecision(UsageError):
    """A ``decide`` step returned no next step id (``got`` says what it returned)."""

    step_id: str
    got: str

    def _message(self) -> str:
        return (
            f"decision step {self.step_id!r} returned {self.got}; a decision returns the next step"
            " id (a string) or a dict with a string 'next_step_id'"
        )


@error
class InvalidStepId(UsageError):
    """A step id that cannot be one (blank, not a string, NUL, a lone surrogate, ``#``, too long)."""

    step_id: object  # type: ignore[assignment]  # what was given, which is no step id
    reason: str = "it is no step id"

    def _message(self) -> str:
        return (
            f"invalid step id {self.step_id!r}: {self.reason}; a step id is a non-empty string of"
            " at most 1000 characters, storable as UTF-8, without NUL or '#' (safepoint appends"
            " '#2', '#3' to repeated ids), e.g. 'plan.3.fetch_invoice'"
        )


@error
class ResolutionRefused(UsageError):
    """A person's resolution does not fit the run as it now stands; nothing was changed.

    When the effect's owner was asked before a "not applied" and refused it, ``owner_answer``
    is what it said (``"applied"``, ``"not_applied"`` past its memory of keys, ``"unknown"``)
    and, when it has the effect (``"applied"``), ``receipt`` is what it holds — as recorded,
    redacted — to resolve the run ``applied`` with. Both are None otherwise."""

    run_id: str
    reason: str
    _: KW_ONLY
    owner_answer: str | None = None
    receipt: Any = None

    def _message(self) -> str:
        return (
            f"resolution of run {self.run_id!r} refused: {self.reason}; look at the run again"
            f" with `safepoint record {self.run_id}` and resolve what it says now"
        )


@error
class ApprovalRefused(UsageError):
    """An approval — or, with ``revoking``, the revocation of one — that does not fit the run
    as it now stands. Nothing was written."""

    run_id: str
    step_id: str
    reason: str
    _: KW_ONLY
    revoking: bool = False

    def _message(self) -> str:
        what = "revoking the approval" if self.revoking else "approval"
        return f"{what} of step {self.step_id!r} of run {self.run_id!r} refused: {self.reason}"


@error
class GateApproved(ApprovalRefused):
    """An approval of an effect whose gate has its approval: ``approval_id``, given by
    ``approved_by`` at ``approved_at``, still authorizes it — before the dispatch (a gate takes
    one approval: revoke it to approve anew) or after the effect went out under it
    (``went_out``: an approval now would authorize nothing; what happened is reconciled with its
    owner). The same person approving again gets their approval back instead. Nothing was
    written."""

    _: KW_ONLY
    operation_id: str
    approval_id: str
    approved_by: str
    approved_at: int
    went_out: bool


@error
class MessageRefused(UsageError):
    """A message ``safepoint.send`` cannot deliver; nothing was written. ``reason`` says why: the
    run has ended (a message to it would never be received), or the sender's ``message_id`` was
    used already for another message (another name or payload) in this run."""

    run_id: str
    name: str
    reason: str

    def _message(self) -> str:
        return f"message {self.name!r} to run {self.run_id!r} refused: {self.reason}"


@error
class WaitAnswered(MessageRefused):
    """An answer (``safepoint.answer``) to a wait that has had its answer: one was kept for it
    already (by ``answered_by`` at ``answered_at``), it took a message, or it timed out
    (``timed_out``, at ``answered_at``). Nothing was kept: a wait takes one answer. ``step_id``
    is the wait; ``waits_at`` the wait of this name the run is parked at now, if any — address
    the next wait explicitly to answer it, or ``send`` a message to queue for whichever wait of
    the name comes next."""

    # Keyword-only: the fields MessageRefused declares come first, so the wait's step_id cannot
    # stand between its name and its reason as it did before the errors were declared once.
    _: KW_ONLY
    step_id: str
    answered_by: str | None = None
    answered_at: int | None = None
    timed_out: bool = False
    waits_at: str | None = None


@error
class LimitsRefused(UsageError):
    """A change of a run's limits (``extend_limits``) that does not fit the run as it now
    stands: the run moved on from the revision it was asked at (``state_revision`` is where it
    now is, ``expected_revision`` what was given), a limit would be lowered below what the run
    already spent, or the run has ended. Nothing was changed."""

    run_id: str
    reason: str
    _: KW_ONLY
    state_revision: int | None = None
    expected_revision: int | None = None

    def _message(self) -> str:
        return f"the limits of run {self.run_id!r} were not changed: {self.reason}"


@error
class ForkRefused(UsageError):
    """A fork that cannot be made as asked (``safepoint.fork``); nothing was written. ``reason``
    says why; ``choices`` lists what could be asked instead (the steps a fork can start from,
    the operations ``resend`` can name), ``operation_id`` names the operation in the way."""

    run_id: str
    reason: str
    _: KW_ONLY
    choices: tuple[str, ...] = ()
    operation_id: str | None = None

    def __post_init__(self) -> None:
        self.choices = tuple(self.choices)  # a list given is kept as the tuple the field says
        super().__post_init__()

    def _message(self) -> str:
        return f"cannot fork run {self.run_id!r}: {self.reason}"


@error
class RetryRefused(UsageError):
    """A retry (``safepoint.retry``) that does not fit the run as it now stands — it is not
    failed, it moved since the revision given, or ``step`` / ``resend`` name something it
    cannot retry or send again; ``reason`` says which, and what can be named. Nothing was
    changed."""

    run_id: str
    reason: str

    def _message(self) -> str:
        return f"retry of run {self.run_id!r} refused: {self.reason}"


@error
class PruneRefused(UsageError):
    """A prune (``safepoint.prune``) asked for something it cannot do — a status that is not an
    ending a run is pruned at, a cut-off that is no time, a batch size below one; ``reason`` says
    which and what to give instead. Nothing was deleted."""

    reason: str

    def _message(self) -> str:
        return f"prune refused: {self.reason}"


@error
class RunFileInvalid(UsageError):
    """A run file (the document ``safepoint export`` writes) that cannot be read: ``path`` says
    where in it (``steps[3].kind``; ``$`` is the document itself), ``reason`` what is wrong and
    ``remedy`` what to do — for a document of a newer version than this safepoint reads, to
    upgrade safepoint. Nothing was read, and the document is left as it was given."""

    path: str
    reason: str
    remedy: str = "export the run again (`safepoint export RUN`), or correct the file there"

    def _message(self) -> str:
        return f"run file refused at {self.path}: {self.reason}; {self.remedy}"


@error
class InvalidStoreURL(UsageError):
    """A store URL that names no store safepoint can open; ``reason`` says why."""

    url: str
    reason: str

    def _message(self) -> str:
        return (
            f"cannot open store {self.url!r}: {self.reason}; use sqlite:///path/to/file.db, a"
            " plain file path, postgresql://user@host/db[?schema=name], or memory: for tests"
        )


@error
class MissingExtra(UsageError):
    """An optional dependency of the store (or module, ``needed_by``) asked for is not
    installed (``pip install 'safepoint[extra]'``)."""

    extra: str
    module: str
    needed_by: str | None = None

    def _message(self) -> str:
        return (
            f"{self.needed_by or f'the {self.extra} store'} needs the {self.module!r} package,"
            f" which is not installed: pip install 'safepoint[{self.extra}]'"
        )
