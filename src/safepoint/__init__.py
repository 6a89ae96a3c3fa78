"""safepoint: a ledger for agent runs — resume after any crash without repeating side effects.

The public surface is exactly ``__all__``; everything in a module whose name starts with an
underscore is private.
"""

from ._effects import Applied, Effect, EffectKey, NotApplied, NotSent, Rejected, Unknown
from ._run import AsyncRun, Run
from ._workflow import Workflow, resume, resume_async, start, start_async, workflow
from .errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    EffectRejected,
    IncompatibleWorkflow,
    InvalidDecision,
    InvalidStoreURL,
    LostOwnership,
    MigrationMismatch,
    NeedsReconciliation,
    NotJSON,
    ReplayMismatch,
    RunBlocked,
    RunConflict,
    RunFailed,
    RunNotFound,
    RunOwned,
    SafepointError,
    SchemaTooNew,
    StaleCheckpoint,
    StoreError,
    UsageError,
    VerificationFailed,
    WorkflowNotFound,
)
from .storage import open_store
from .storage.base import Store
from .types import (
    Durability,
    EffectState,
    EventRecord,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
)

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "ArtifactCorrupt",
    "ArtifactMissing",
    "AsyncRun",
    "CorruptRecord",
    "Durability",
    "Effect",
    "EffectKey",
    "EffectRejected",
    "EffectState",
    "EventRecord",
    "IncompatibleWorkflow",
    "InvalidDecision",
    "InvalidStoreURL",
    "LostOwnership",
    "MigrationMismatch",
    "NeedsReconciliation",
    "NotApplied",
    "NotJSON",
    "NotSent",
    "OperationRecord",
    "Rejected",
    "ReplayMismatch",
    "Run",
    "RunBlocked",
    "RunConflict",
    "RunFailed",
    "RunNotFound",
    "RunOwned",
    "RunRecord",
    "RunStatus",
    "SafepointError",
    "SchemaTooNew",
    "StaleCheckpoint",
    "StepKind",
    "StepRecord",
    "Store",
    "StoreError",
    "Unknown",
    "UsageError",
    "VerificationFailed",
    "Workflow",
    "WorkflowNotFound",
    "open_store",
    "resume",
    "resume_async",
    "start",
    "start_async",
    "workflow",
]
