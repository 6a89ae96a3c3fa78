"""The operator's fork: a new run that starts with a copy of another run's ledger up to a step
and carries on from there (``fork``, ``fork_async``). What a person typed is checked here; the
fork itself is one store operation (``Store.fork_run``), and what the fork's effects do with
what its source sent is decided by ``_rules.fork`` as the fork runs (``_engine.dispatch``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._rules.fork import fork_run_id
from .._rules.ids import check_id, check_run_id, check_who, check_words
from .._rules.secrets import refuse_secrets
from ..errors import ForkRefused, UsageError
from ..storage.base import ForkRun, Store
from ..types import RunRecord
from . import host
from .flow import Flow, adrive, drive, io, require_store
from .workflow import Workflow, workflow_of

if TYPE_CHECKING:
    from ..storage.base import AsyncStore


def fork(
    store: Store,
    run_id: str,
    /,
    *,
    from_step: str,
    new_run_id: str | None = None,
    workflow: Workflow | None = None,
    resend: Iterable[str] = (),
    by: str,
    reason: str | None = None,
) -> RunRecord:
    """Fork ``run_id`` from its step ``from_step``: make a new run and return it, pending.

    The fork has the run's workflow, inputs and limits, and its ledger starts with copies of the
    steps the run recorded before ``from_step`` (and their settled effects); from there it
    executes anew — ``from_step`` and everything after it — once a worker takes it or it is
    resumed (``resume(store, fork.run_id)``). It is recorded under the run's code, or with
    ``workflow=`` (the same workflow as this process has it) under that code's version and
    fingerprint, so that a worker with the new code carries it on.

    Effects: an operation the run sent (accepted, with its receipt) is not sent again by the
    fork — its effect step, asking for the same operation id with the same payload, gets that
    receipt; a rejection stands too. With another payload the fork blocks (``SentBySource``)
    unless ``resend`` names the operation: then the fork sends it as its own operation, under
    its own key (minted from the ledger, the fork's run id and the operation id: never the
    run's). The same holds through a fork of a fork.

    ``new_run_id`` names the fork (``RunConflict`` when it exists); without it one is minted
    from the run's id. ``by`` and ``reason`` are recorded in a ``run.forked`` event on the fork
    and a ``run.fork_made`` event on the run. ``ForkRefused`` (nothing written) when the run
    is held by a live worker, ``from_step`` is not a step it recorded (the refusal lists them),
    an effect before ``from_step`` is not settled, or ``resend`` names no operation of the run.

    >>> retake = fork(store, "case-8472", from_step="draft", by="ana",
    ...               reason="the model answered in the wrong language")  # doctest: +SKIP
    >>> resume(store, retake.run_id)  # doctest: +SKIP
    """
    require_store(store, "fork")
    request, name = _request(run_id, from_step, new_run_id, workflow, resend, by, reason)
    forked: RunRecord = drive(store, _fork_flow(request, name))
    return forked


async def fork_async(
    store: Store | AsyncStore,
    run_id: str,
    /,
    *,
    from_step: str,
    new_run_id: str | None = None,
    workflow: Workflow | None = None,
    resend: Iterable[str] = (),
    by: str,
    reason: str | None = None,
) -> RunRecord:
    """``fork`` from async code."""
    require_store(store, "fork_async")
    request, name = _request(run_id, from_step, new_run_id, workflow, resend, by, reason)
    forked: RunRecord = await adrive(store, _fork_flow(request, name))
    return forked


def current_code(store: Store, run_id: str) -> Workflow:
    """The workflow of ``run_id`` as this process has it imported: what a fork "on the current
    code" is recorded under (``fork(..., workflow=current_code(store, run_id))``, the CLI's
    ``--current-code``); ``WorkflowNotFound`` when its module is not imported."""
    return workflow_of(store.get_run(check_run_id(run_id)))


def _request(
    run_id: str,
    from_step: str,
    new_run_id: str | None,
    workflow: Workflow | None,
    resend: Iterable[str],
    by: str,
    reason: str | None,
) -> tuple[ForkRun, str | None]:
    """The fork as asked for, checked (and the workflow name ``workflow=`` must match)."""
    check_run_id(run_id)
    check_id(from_step, "step id")  # as recorded: a fan-out's or occurrence's id included
    if new_run_id is not None:
        check_run_id(new_run_id)
    if workflow is not None and not isinstance(workflow, Workflow):
        raise UsageError(
            "workflow= is the workflow as this process has it (the function decorated with"
            f" @safepoint.workflow), to record the fork under its code; got {type(workflow).__name__}"
        )
    if isinstance(resend, str) or not isinstance(resend, Iterable):
        raise UsageError(
            f"resend is a list of operation ids, not {resend!r}: resend=[{resend!r}]"
            if isinstance(resend, str)
            else f"resend is a list of operation ids, not {type(resend).__name__}"
        )
    names = tuple(check_id(name, "operation id") for name in resend)
    check_who(by, "forks the run")
    check_words(reason, "the fork's reason")
    refuse_secrets([by, reason], "the fork")
    request = ForkRun(
        source_run_id=run_id,
        from_step=from_step,
        run_id=new_run_id if new_run_id is not None else fork_run_id(run_id, host.current.token()[:8]),
        by=by,
        reason=reason,
        resend=names,
        current_code=workflow is not None,
        workflow_version=workflow.version if workflow is not None else None,
        workflow_fingerprint=workflow.fingerprint if workflow is not None else None,
        workflow_manifest=workflow.manifest if workflow is not None else None,
    )
    return request, workflow.name if workflow is not None else None


def _fork_flow(request: ForkRun, workflow_name: str | None) -> Flow[RunRecord]:
    if workflow_name is not None:
        source = yield from io(Store.get_run, request.source_run_id)
        if source.workflow != workflow_name:
            raise ForkRefused(
                source.run_id,
                f"it is a run of workflow {source.workflow!r}, and workflow= is"
                f" {workflow_name!r}: a fork carries its run's workflow on — pass that"
                " workflow's code (or none, to keep the run's)",
            )
    return (yield from io(Store.fork_run, request))
