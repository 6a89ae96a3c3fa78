"""safepoint: a ledger for agent runs — resume after any crash without repeating side effects.

The top level holds what a workflow's code uses every day: the verbs, the types a step is
written with, and the errors worth catching. The rest of the public surface has a home of its
own, each module's ``__all__`` saying exactly what it holds:

- ``safepoint.errors`` — every error safepoint raises (the tree is in its docstring);
- ``safepoint.types`` — the ledger's records and enums (``RunRecord``, ``RunStatus``, ...);
- ``safepoint.storage`` — the stores and ``open_store``;
- ``safepoint.testing`` — crash points, the kill harness and the effect owner, to prove your
  own workflows survive a crash.

Everything in a module whose name starts with an underscore is private.
"""

from ._engine.current import current_effect_key, current_run
from ._engine.fork import fork, fork_async
from ._engine.limits import extend_limits, extend_limits_async
from ._engine.messages import answer, answer_async, send, send_async
from ._engine.operator import approve, approve_async, resolve, revoke_approval, revoke_approval_async
from ._engine.prune import prune, prune_async
from ._engine.retry import retry, retry_async
from ._engine.run import AsyncRun, Run
from ._engine.verbs import (
    cancel,
    cancel_async,
    resume,
    resume_async,
    start,
    start_async,
    submit,
    submit_async,
)
from ._engine.worker import Worker
from ._engine.workflow import Workflow, workflow
from ._rules.effects import Applied, Effect, EffectKey, NotApplied, NotSent, Rejected, Unknown
from ._rules.recovery import record_schema
from ._rules.secrets import Secret
from ._rules.transcript import Transcript, reads_messages_only
from .errors import (
    AwaitingApproval,
    AwaitingMessage,
    LimitReached,
    LostOwnership,
    NeedsReconciliation,
    RunBlocked,
    RunCancelled,
    RunFailed,
    RunWaiting,
    SafepointError,
    StepFailed,
    StoreError,
    StoreUnavailable,
    UsageError,
    WaitTimedOut,
)
from .storage import open_store
from .storage.base import AsyncStore, Store
from .storage.open_async import open_async_store
from .types import Budget, HistoryLimit, Retry, Unfinished

__version__ = "0.1.0"

__all__ = [
    "Applied",
    "AsyncRun",
    "AsyncStore",
    "AwaitingApproval",
    "AwaitingMessage",
    "Budget",
    "Effect",
    "EffectKey",
    "HistoryLimit",
    "LimitReached",
    "LostOwnership",
    "NeedsReconciliation",
    "NotApplied",
    "NotSent",
    "Rejected",
    "Retry",
    "Run",
    "RunBlocked",
    "RunCancelled",
    "RunFailed",
    "RunWaiting",
    "SafepointError",
    "Secret",
    "StepFailed",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Transcript",
    "Unfinished",
    "Unknown",
    "UsageError",
    "WaitTimedOut",
    "Worker",
    "Workflow",
    "answer",
    "answer_async",
    "approve",
    "approve_async",
    "cancel",
    "cancel_async",
    "current_effect_key",
    "current_run",
    "extend_limits",
    "extend_limits_async",
    "fork",
    "fork_async",
    "open_async_store",
    "open_store",
    "prune",
    "prune_async",
    "reads_messages_only",
    "record_schema",
    "resolve",
    "resume",
    "resume_async",
    "retry",
    "retry_async",
    "revoke_approval",
    "revoke_approval_async",
    "send",
    "send_async",
    "start",
    "start_async",
    "submit",
    "submit_async",
    "workflow",
]
