"""``RunBlocked`` and its family: the run stopped visibly and carries a recovery record.

Private: import these from ``safepoint.errors``, which sets their ``__module__`` to it.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ._base import SafepointError, error


class RunBlocked(SafepointError):
    """The run stopped visibly; ``record`` is its recovery record (a JSON-ready dict)."""

    run_id: str
    record: dict[str, Any] | None = None

    def __init__(self, message: str, *, run_id: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.record = record


@error
class NeedsReconciliation(RunBlocked):
    """An effect may have happened and could not be settled: the run blocks for a person."""

    run_id: str
    step_id: str
    operation_id: str
    reason: str
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"effect {self.operation_id!r} (step {self.step_id!r}) may have happened and could not"
            f" be settled: {self.reason}; check the effect owner, then resolve the run"
            f" (see `safepoint record {self.run_id}`)"
        )


@error
class VerificationFailed(RunBlocked):
    """An applied effect was not accepted by its verifier: the run blocks, nothing is sent again."""

    run_id: str
    step_id: str
    operation_id: str
    reason: str
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"effect {self.operation_id!r} (step {self.step_id!r}) was applied but its verifier did"
            f" not accept it: {self.reason}; it will not be dispatched again — inspect it and"
            " resolve the run by hand"
        )


@error
class StaleCheckpoint(RunBlocked):
    """A recorded step answers another question than the one now asked (its input hash moved)."""

    run_id: str
    step_id: str
    reason: str
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"step {self.step_id!r} was recorded for other inputs ({self.reason}); the stored"
            " answer is to another question — the run is blocked under the 'refuse' policy:"
            " revert the change, or start a new run"
        )


@error
class TransactionUncertain(RunBlocked):
    """A transaction step's function ended the ledger's transaction under the step — a commit
    or rollback of its own, or of a library it handed the driver's connection to — so its
    writes may have committed without the step record. It is never run again blindly: the run
    blocks until a person looks at the database and resolves the step applied (with the value
    the step returns) or not applied (it runs again). ``how`` says what was found."""

    run_id: str
    step_id: str
    how: str
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"transaction step {self.step_id!r} may have committed without its record: {self.how}."
            " Its function must not end the step's transaction (safepoint commits it with the"
            " step); look for the step's writes in the database, then resolve the run --applied"
            " --receipt '<the value the step returns>' if they are there, or --not-applied if"
            f" none is (see `safepoint record {self.run_id}`)"
        )


class ReplayMismatch(StaleCheckpoint):
    """The code path changed under the run: the step recorded at this id has another kind or
    name, or the code no longer reaches an operation the ledger holds and asks for another.
    Raised under either compatibility policy: no answer of the ledger fits this path."""

    def _message(self) -> str:
        return (
            f"step {self.step_id!r} is not on the path the ledger recorded ({self.reason}); the"
            " run is blocked rather than replay or send anything along another path: deploy the"
            " code that recorded it, or settle the run by hand (see"
            f" `safepoint record {self.run_id}`)"
        )


@error
class IncompatibleWorkflow(RunBlocked):
    """The run was recorded by another workflow version or fingerprint than this process has;
    ``changes`` says what differs."""

    run_id: str
    recorded: str
    current: str
    record: dict[str, Any] | None = None
    changes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.changes = list(self.changes or [f"{self.recorded} became {self.current}"])
        super().__post_init__()

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} was recorded by other code than this process has"
            f" ({self.recorded} → {self.current}: {'; '.join(self.changes)}); deploy the recorded"
            " code to finish it, register the workflow with compatibility='replan' to carry it"
            " on under this code, or start a new run"
        )


@error
class SentBySource(RunBlocked):
    """An effect step asks for an operation that another run of its family (the run it was
    forked from, a fork of it, a successor) sent — with another payload, or with an outcome not
    settled there. A family sends an operation once: the run blocks instead, until the holder
    settles it or the operator names it in a fork's ``resend``. ``source_run_id`` is the run
    that holds it."""

    run_id: str
    step_id: str
    operation_id: str
    source_run_id: str
    reason: str
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"effect {self.operation_id!r} (step {self.step_id!r}) of run {self.run_id!r} is not"
            f" sent: {self.reason}; a run and its forks and successors send an operation once,"
            f" unless the operator names it — fork {self.source_run_id!r} again with"
            f" resend=[{self.operation_id!r}] (CLI: --resend {self.operation_id}) to send it"
            " under the fork's own key"
        )


@error
class HistoryLimitReached(RunBlocked):
    """The run's history — its events and recorded steps — reached its hard limit: the store
    records nothing new for it (no step, no effect). Outcomes of effects already in flight and
    the run's ending are still recorded. Continue long runs as new before this point."""

    run_id: str
    size: int | None
    limit: int | None
    record: dict[str, Any] | None = None

    def _message(self) -> str:
        return (
            f"run {self.run_id!r} reached its hard history limit ({self.size} of {self.limit}"
            " events and steps): nothing new is recorded for it — have the workflow call"
            " run.continue_as_new(state) before the limit (every N iterations, say), then"
            f" resume it (see `safepoint record {self.run_id}`)"
        )
