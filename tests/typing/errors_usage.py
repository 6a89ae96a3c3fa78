"""Checked by mypy from the user's side (tests/unit/test_packaging.py): the structured fields of the
errors users catch are typed attributes, and the public verbs are typed."""

from __future__ import annotations

import safepoint as sp
from safepoint.errors import ArtifactMissing, CorruptRecord, RunOwned, SecretRefused, StaleCheckpoint


def fields(store: sp.Store, wf: sp.Workflow) -> list[object]:
    seen: list[object] = []
    try:
        sp.resume(store, "r")
    except sp.NeedsReconciliation as blocked:
        step: str = blocked.step_id
        operation: str = blocked.operation_id
        record: dict[str, object] | None = blocked.record
        seen += [blocked.run_id, step, operation, record, blocked.reason]
    except StaleCheckpoint as stale:
        seen += [stale.run_id, stale.step_id, stale.reason]
    except RunOwned as owned:
        expires: int = owned.lease_expires_at
        seen += [owned.run_id, owned.owner, expires]
    except sp.RunFailed as failed:
        seen += [failed.run_id, failed.error_type, failed.error_message]
    except sp.LimitReached as stopped:  # the run is stopped: raise the limit to carry it on
        stop: dict[str, object] | None = stopped.record
        seen += [stopped.run_id, stop]
        run: sp.types.RunRecord = sp.extend_limits(store, stopped.run_id, model_calls=40, by="ana")
        seen += [run.model_call_budget, run.model_calls_spent]
    except sp.StepFailed as step_failed:
        attempts: int = step_failed.attempts
        seen += [step_failed.step_id, step_failed.error_type, attempts]
    except SecretRefused as refused:
        seen += [refused.what, refused.path, refused.why]
    except CorruptRecord as corrupt:
        seen += [corrupt.table, corrupt.key, corrupt.reason]
    except ArtifactMissing as missing:
        seen += [missing.digest]
    except sp.SafepointError as error:
        message: str = error.message
        seen += [message]
    except sp.LostOwnership as lost:
        fence: int = lost.fence
        seen += [lost.run_id, fence]
    identity: sp.types.LedgerIdentity = store.identity
    seen += [identity.ledger_id, wf.name]
    return seen


def raised(run_id: str) -> list[BaseException]:
    """An error is built from its typed fields: a field misnamed, missing or of another type is
    mypy's error, where ``**fields`` once let it through (the ignores fail as unused if not)."""
    return [
        RunOwned(run_id, "worker-1", 1_767_225_600_000),
        sp.NeedsReconciliation(run_id, "s", "op", "the owner did not answer", record={"phase": "x"}),
        RunOwned(run_id, "worker-1", lease_expires=0),  # type: ignore[call-arg]
        CorruptRecord("safepoint_steps", "r/s"),  # type: ignore[call-arg]
        ArtifactMissing(digest=3),  # type: ignore[arg-type]
        sp.UsageError("say who approves", step="s"),  # type: ignore[call-arg]
    ]
