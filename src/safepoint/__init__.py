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

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from ._engine.current import current_effect_key as current_effect_key
    from ._engine.current import current_run as current_run
    from ._engine.exported import export_run as export_run
    from ._engine.exported import export_run_async as export_run_async
    from ._engine.fork import fork as fork
    from ._engine.fork import fork_async as fork_async
    from ._engine.limits import extend_limits as extend_limits
    from ._engine.limits import extend_limits_async as extend_limits_async
    from ._engine.messages import answer as answer
    from ._engine.messages import answer_async as answer_async
    from ._engine.messages import send as send
    from ._engine.messages import send_async as send_async
    from ._engine.operator import approve as approve
    from ._engine.operator import approve_async as approve_async
    from ._engine.operator import resolve as resolve
    from ._engine.operator import revoke_approval as revoke_approval
    from ._engine.operator import revoke_approval_async as revoke_approval_async
    from ._engine.prune import prune as prune
    from ._engine.prune import prune_async as prune_async
    from ._engine.retry import retry as retry
    from ._engine.retry import retry_async as retry_async
    from ._engine.run import AsyncRun as AsyncRun
    from ._engine.run import Run as Run
    from ._engine.verbs import cancel as cancel
    from ._engine.verbs import cancel_async as cancel_async
    from ._engine.verbs import resume as resume
    from ._engine.verbs import resume_async as resume_async
    from ._engine.verbs import start as start
    from ._engine.verbs import start_async as start_async
    from ._engine.verbs import submit as submit
    from ._engine.verbs import submit_async as submit_async
    from ._engine.worker import Worker as Worker
    from ._engine.workflow import Workflow as Workflow
    from ._engine.workflow import workflow as workflow
    from ._rules.effects import Applied as Applied
    from ._rules.effects import Effect as Effect
    from ._rules.effects import EffectKey as EffectKey
    from ._rules.effects import NotApplied as NotApplied
    from ._rules.effects import NotSent as NotSent
    from ._rules.effects import Rejected as Rejected
    from ._rules.effects import Unknown as Unknown
    from ._rules.recovery import record_schema as record_schema
    from ._rules.secrets import Secret as Secret
    from ._rules.transcript import Transcript as Transcript
    from ._rules.transcript import reads_messages_only as reads_messages_only
    from .errors import AwaitingApproval as AwaitingApproval
    from .errors import AwaitingMessage as AwaitingMessage
    from .errors import LimitReached as LimitReached
    from .errors import LostOwnership as LostOwnership
    from .errors import NeedsReconciliation as NeedsReconciliation
    from .errors import RunBlocked as RunBlocked
    from .errors import RunCancelled as RunCancelled
    from .errors import RunFailed as RunFailed
    from .errors import RunWaiting as RunWaiting
    from .errors import SafepointError as SafepointError
    from .errors import StepFailed as StepFailed
    from .errors import StoreError as StoreError
    from .errors import StoreUnavailable as StoreUnavailable
    from .errors import UsageError as UsageError
    from .errors import WaitTimedOut as WaitTimedOut
    from .storage import open_store as open_store
    from .storage.base import AsyncStore as AsyncStore
    from .storage.base import Store as Store
    from .storage.open_async import open_async_store as open_async_store
    from .types import Budget as Budget
    from .types import HistoryLimit as HistoryLimit
    from .types import Retry as Retry
    from .types import Unfinished as Unfinished

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
    "export_run",
    "export_run_async",
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

# Each name is imported when first asked for, from the module that defines it: `import safepoint`
# is paid by every command and every worker start, and importing the engine, the stores and the
# rules up front cost a few hundred milliseconds a program may never need (a CLI's --help, a
# flows module that only registers workflows, a child process of the kill harness).
_LOADED_LATER = {
    "current_effect_key": "._engine.current",
    "current_run": "._engine.current",
    "export_run": "._engine.exported",
    "export_run_async": "._engine.exported",
    "fork": "._engine.fork",
    "fork_async": "._engine.fork",
    "extend_limits": "._engine.limits",
    "extend_limits_async": "._engine.limits",
    "answer": "._engine.messages",
    "answer_async": "._engine.messages",
    "send": "._engine.messages",
    "send_async": "._engine.messages",
    "approve": "._engine.operator",
    "approve_async": "._engine.operator",
    "resolve": "._engine.operator",
    "revoke_approval": "._engine.operator",
    "revoke_approval_async": "._engine.operator",
    "prune": "._engine.prune",
    "prune_async": "._engine.prune",
    "retry": "._engine.retry",
    "retry_async": "._engine.retry",
    "AsyncRun": "._engine.run",
    "Run": "._engine.run",
    "cancel": "._engine.verbs",
    "cancel_async": "._engine.verbs",
    "resume": "._engine.verbs",
    "resume_async": "._engine.verbs",
    "start": "._engine.verbs",
    "start_async": "._engine.verbs",
    "submit": "._engine.verbs",
    "submit_async": "._engine.verbs",
    "Worker": "._engine.worker",
    "Workflow": "._engine.workflow",
    "workflow": "._engine.workflow",
    "Applied": "._rules.effects",
    "Effect": "._rules.effects",
    "EffectKey": "._rules.effects",
    "NotApplied": "._rules.effects",
    "NotSent": "._rules.effects",
    "Rejected": "._rules.effects",
    "Unknown": "._rules.effects",
    "record_schema": "._rules.recovery",
    "Secret": "._rules.secrets",
    "Transcript": "._rules.transcript",
    "reads_messages_only": "._rules.transcript",
    "AwaitingApproval": ".errors",
    "AwaitingMessage": ".errors",
    "LimitReached": ".errors",
    "LostOwnership": ".errors",
    "NeedsReconciliation": ".errors",
    "RunBlocked": ".errors",
    "RunCancelled": ".errors",
    "RunFailed": ".errors",
    "RunWaiting": ".errors",
    "SafepointError": ".errors",
    "StepFailed": ".errors",
    "StoreError": ".errors",
    "StoreUnavailable": ".errors",
    "UsageError": ".errors",
    "WaitTimedOut": ".errors",
    "open_store": ".storage",
    "AsyncStore": ".storage.base",
    "Store": ".storage.base",
    "open_async_store": ".storage.open_async",
    "Budget": ".types",
    "HistoryLimit": ".types",
    "Retry": ".types",
    "Unfinished": ".types",
}


# The public modules this package imported when it imported everything: still there as its
# attributes after a plain `import safepoint` (`safepoint.errors.RunNotFound`).
_SUBMODULES = frozenset({"errors", "types", "storage"})


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # which binds it here too
    if name not in _LOADED_LATER:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LOADED_LATER[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *_SUBMODULES})
