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
        │   │   └── GateApproved        the gate has its approval in force, or its effect went out
        │   ├── LimitsRefused           a change of limits that does not fit the run (moved, below spent)
        │   ├── ForkRefused             a fork that cannot be made from that run and step
        │   ├── MessageRefused          a message the run cannot take (it ended; a message id reused)
        │   │   └── WaitAnswered        an answer to a wait that was answered (or timed out) already
        │   ├── RetryRefused            a retry that does not fit the run (not failed, moved, …)
        │   ├── PruneRefused            a prune asked for what it cannot do (a status, a cut-off)
        │   ├── RunFileInvalid          a run file (safepoint export's document) that cannot be read
        │   ├── InvalidStoreURL
        │   └── MissingExtra            an optional dependency is not installed
        ├── RunOwned                    another live worker holds the run's lease
        ├── ClaimedInFamily             another run of the family holds the operation (the engine answers it)
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
        ├── TransientFailure            a step's attempt failed in a way another may not (429, 5xx)
        ├── StoreError                  the ledger itself is unusable
        │   ├── StoreUnavailable        the database cannot be reached (yet): retry later
        │   ├── SchemaTooNew            the database was migrated by a newer safepoint
        │   ├── MigrationMismatch       an applied migration differs from the shipped one
        │   ├── CorruptRecord           a ledger row cannot be read
        │   ├── ArtifactMissing
        │   ├── ArtifactCorrupt         an artifact's bytes no longer match their digest
        │   ├── KeyUnavailable          a value is encrypted with a key the keyring lacks
        │   └── DecryptionFailed        a value does not decrypt with the key it names
        └── RunBlocked                  the run stopped visibly and carries a recovery record
            ├── NeedsReconciliation     an effect's outcome is uncertain and cannot be settled
            ├── VerificationFailed      an applied effect failed its verifier
            ├── StaleCheckpoint         a recorded step answers another question (input hash moved)
            │   └── ReplayMismatch      the step at this id has another kind or name
            ├── TransactionUncertain    a transaction step's function ended its transaction under it
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

# isort: off
# The order the API reference lists them in, family by family as the tree draws them: its
# members_order "source" orders re-exported names by the line that imports them.
from ._base import (
    SafepointError,
    UsageError,
    RunNotFound,
    RunConflict,
    WorkflowNotFound,
    NotJSON,
    SecretRefused,
    InvalidDecision,
    InvalidStepId,
    ResolutionRefused,
    ApprovalRefused,
    GateApproved,
    MessageRefused,
    WaitAnswered,
    LimitsRefused,
    ForkRefused,
    PruneRefused,
    RetryRefused,
    RunFileInvalid,
    InvalidStoreURL,
    MissingExtra,
)
from ._runs import (
    RunOwned,
    ClaimedInFamily,
    RunFailed,
    LimitReached,
    BudgetExhausted,
    DeadlineExceeded,
    StepAttemptsExhausted,
    RunCancelled,
    StepFailed,
    EffectRejected,
    RunWaiting,
    AwaitingApproval,
    ApprovalInvalid,
    AwaitingMessage,
    Sleeping,
    WaitTimedOut,
    TransientFailure,
)
from ._store import (
    StoreError,
    StoreUnavailable,
    SchemaTooNew,
    MigrationMismatch,
    CorruptRecord,
    ArtifactMissing,
    ArtifactCorrupt,
    KeyUnavailable,
    DecryptionFailed,
)
from ._blocked import (
    RunBlocked,
    NeedsReconciliation,
    VerificationFailed,
    StaleCheckpoint,
    ReplayMismatch,
    TransactionUncertain,
    IncompatibleWorkflow,
    SentBySource,
    HistoryLimitReached,
)
from ._signals import (
    HistoryWarning,
    LostOwnership,
    Cancelled,
    ContinueAsNew,
    SliceEnded,
)
# isort: on

__all__ = [
    "ApprovalInvalid",
    "ApprovalRefused",
    "ArtifactCorrupt",
    "ArtifactMissing",
    "AwaitingApproval",
    "AwaitingMessage",
    "BudgetExhausted",
    "Cancelled",
    "ClaimedInFamily",
    "ContinueAsNew",
    "CorruptRecord",
    "DeadlineExceeded",
    "DecryptionFailed",
    "EffectRejected",
    "ForkRefused",
    "GateApproved",
    "HistoryLimitReached",
    "HistoryWarning",
    "IncompatibleWorkflow",
    "InvalidDecision",
    "InvalidStepId",
    "InvalidStoreURL",
    "KeyUnavailable",
    "LimitReached",
    "LimitsRefused",
    "LostOwnership",
    "MessageRefused",
    "MigrationMismatch",
    "MissingExtra",
    "NeedsReconciliation",
    "NotJSON",
    "PruneRefused",
    "ReplayMismatch",
    "ResolutionRefused",
    "RetryRefused",
    "RunBlocked",
    "RunCancelled",
    "RunConflict",
    "RunFailed",
    "RunFileInvalid",
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
    "TransactionUncertain",
    "TransientFailure",
    "UsageError",
    "VerificationFailed",
    "WaitAnswered",
    "WaitTimedOut",
    "WorkflowNotFound",
]

# Each class is defined in a private module of this package and belongs to it: its module is
# safepoint.errors, the one name it is imported, pickled, documented and printed by.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
