"""A person's decisions about a run, as commands: ``resolve`` a blocked run, ``approve`` an
effect a waiting run prepared, ``revoke`` an approval while its effect's outcome is open, and
``cancel`` a run for good.

They go through the same operator verbs as the API and the dashboard (``settle``, ``approve``,
``revoke_approval``, ``cancel``), so they are checked and recorded in the same way. ``cli``
registers every command in ``COMMANDS`` on its group: a new one is added here, to the tuple.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from .._engine.flow import drive
from .._engine.lifecycle import chain_head
from .._engine.operator import approve as approve_step
from .._engine.operator import revoke_approval as revoke_step
from .._engine.operator import settle
from .._engine.verbs import cancel as cancel_run
from .._rules.approvals import approvable, revocable
from .._rules.canonical import decode_json
from .._rules.moments import when
from .._rules.presence import HELD, ownership
from ..errors import ApprovalRefused
from ..storage.base import Store
from ..types import ResolutionAction, RunRecord, RunStatus
from .cli_support import (
    fail,
    import_modules,
    now_ms,
    open_cli_store,
    parse_when,
    run_argument,
    store_option,
)
from .render import error_text, shown

_RESOLUTIONS = {
    "applied": ResolutionAction.APPLIED,
    "not_applied": ResolutionAction.NOT_APPLIED,
    "abandon": ResolutionAction.ABANDON,
}


def one_resolution(chosen: dict[str, bool], *, receipt: bool, force: bool) -> ResolutionAction:
    """The one decision the flags say; a usage error when they say none, or contradict each
    other (two decisions, a receipt that is not for --applied, --force that is not for
    --not-applied)."""
    said = [name for name, given in chosen.items() if given]
    flags = ", ".join("--" + name.replace("_", "-") for name in said)
    if not said:
        raise click.UsageError("say what happened: one of --applied, --not-applied or --abandon")
    if len(said) > 1:
        raise click.UsageError(
            f"{flags} contradict each other: say exactly one of --applied, --not-applied or --abandon"
        )
    action = _RESOLUTIONS[said[0]]
    if receipt and action is not ResolutionAction.APPLIED:
        raise click.UsageError(f"--receipt is the owner's object for --applied, not for {flags}")
    if force and action is not ResolutionAction.NOT_APPLIED:
        raise click.UsageError(f"--force only overrides the owner's doubt about --not-applied, not {flags}")
    return action


@click.command()
@run_argument
@click.option(
    "--applied",
    is_flag=True,
    help="The operation happened (a transaction step: its writes are there): give its receipt"
    " with --receipt.",
)
@click.option(
    "--not-applied",
    is_flag=True,
    help="It did not happen: send it again, under the same key (its owner is asked"
    " first when the effect's code is imported: --import); a transaction step runs again.",
)
@click.option("--abandon", is_flag=True, help="Give the run up (cancelled).")
@click.option(
    "--revision", type=int, required=True, help="The state_revision of the recovery record you decided on."
)
@click.option("--by", required=True, help="Who decides (recorded).")
@click.option(
    "--receipt",
    metavar="JSON",
    help="With --applied: the object the owner holds (a transaction step: the value it returns).",
)
@click.option("--evidence", help="Why this is known: a link, a ticket, a sentence (recorded).")
@click.option(
    "--operation",
    "operation_id",
    metavar="OP",
    help="The operation (default: the one the recovery record names).",
)
@click.option(
    "--import",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first, so that the effect's owner can be asked (repeatable).",
)
@click.option(
    "--force",
    is_flag=True,
    help="With --not-applied: send it again even though its owner could not say (recorded).",
)
@store_option
@click.pass_context
def resolve(
    ctx: click.Context,
    run_id: str,
    applied: bool,
    not_applied: bool,
    abandon: bool,
    revision: int,
    by: str,
    receipt: str | None,
    evidence: str | None,
    operation_id: str | None,
    modules: tuple[str, ...],
    force: bool,
) -> None:
    """Settle a blocked run: exactly one of --applied, --not-applied or --abandon.

    The decision is checked against --revision (a run that moved since is refused), recorded in
    the run's history with --by and --evidence, and harmless to repeat. --not-applied sends the
    effect again under the same effect key: with --import of the code that declares the effect,
    its owner is asked first (reconcile), and the decision is refused if the owner has it — or
    cannot say, unless --force. An applied or not-applied run is released: resume it, or let a
    worker take it.
    """
    action = one_resolution(
        {"applied": applied, "not_applied": not_applied, "abandon": abandon},
        receipt=receipt is not None,
        force=force,
    )
    try:
        parsed = decode_json(receipt) if receipt is not None else None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--receipt") from None
    import_modules(modules)
    settled = settle(
        open_cli_store(ctx),
        run_id,
        action,
        revision=revision,
        by=by,
        operation_id=operation_id,
        receipt=parsed,
        evidence=evidence,
        force=force,
    )
    run, decision = settled.run, settled.decision
    click.echo(
        shown(
            f"run {run_id!r} resolved ({action.value}): now {_plain_status(run)},"
            f" revision {run.state_revision}"
        )
    )
    if action is ResolutionAction.NOT_APPLIED:
        click.echo(
            shown(
                f"operation {decision.operation_id!r} will be sent again, under the"
                f" same effect key {settled.effect_key}, when the run is carried on"
                " (safepoint resume, or a worker)"
            )
        )
        check = decision.owner_check or {}
        click.echo(shown(str(check.get("note", "the owner was not asked"))))


def _plain_status(run: RunRecord) -> str:
    """A resolved run's status as it stands: released, not running, until a worker takes it."""
    if run.status is RunStatus.RUNNING and run.owner is None:
        return "released (no worker holds it: resume it, or a worker takes it)"
    return run.status.value


def parse_expiry(text: str) -> timedelta | datetime:
    """``--expires``: a duration (``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``) or an ISO 8601
    instant with its time zone (``2030-01-31T17:00:00+01:00``)."""
    return parse_when(text, "--expires")


@click.command()
@run_argument
@click.argument("step_id", metavar="STEP")
@click.option("--by", required=True, help="Who approves (recorded).")
@click.option(
    "--expires",
    metavar="WHEN",
    help="How long the approval holds (90s, 15m, 2h, 1d) or until when (ISO 8601"
    " with a time zone).  [default: no expiry]",
)
@click.option("--evidence", help="Why: a ticket, a link, a sentence (recorded).")
@click.option(
    "--payload-digest",
    metavar="DIGEST",
    help="Approve only if the effect still carries this payload (as `safepoint show RUN` prints it).",
)
@store_option
@click.pass_context
def approve(
    ctx: click.Context,
    run_id: str,
    step_id: str,
    by: str,
    expires: str | None,
    evidence: str | None,
    payload_digest: str | None,
) -> None:
    """Approve the effect STEP of RUN prepared, so that it may be dispatched.

    The approval is bound to the payload it carries and to the state its target was seen in
    when the run started waiting; a change of either, or the expiry, withdraws it. A run
    waiting for it becomes runnable again: a worker takes it, or resume it.
    """
    store = open_cli_store(ctx)
    try:
        approval = approve_step(
            store,
            run_id,
            step_id,
            by=by,
            evidence=evidence,
            expires=parse_expiry(expires) if expires else None,
            payload_digest=payload_digest,
        )
    except ApprovalRefused as exc:
        head = _carried_on(store, run_id)
        steps = approvable(head, store.load_ledger(head.run_id).operations)
        if step_id in steps:
            raise
        fail(ctx, f"{error_text(exc, now_ms(ctx))}; {_choices(head, steps, 'approved')}")
    now = store.now()
    expiry = "no expiry" if approval.expires_at is None else f"until {when(approval.expires_at, now)}"
    click.echo(
        shown(
            f"approved {approval.operation_id!r} (step {approval.step_id!r}) of run"
            f" {run_id!r} by {approval.approved_by}, {expiry}: payload"
            f" {approval.payload_digest}; run now"
            f" {store.get_run(approval.run_id).status.value}"
        )
    )


def _carried_on(store: Store, run_id: str) -> RunRecord:
    """The run that carries ``run_id``'s chain on (approvals and revocations go there)."""
    found: RunRecord = drive(store, chain_head(store.get_run(run_id)))
    return found


def _choices(run: RunRecord, steps: list[str], verb: str) -> str:
    """Which steps of ``run`` can be approved (or have an approval revoked) instead."""
    if not steps:
        return f"no step of run {run.run_id!r} can be {verb} now (status {run.status.value})"
    waiting = (run.waiting_for or {}).get("step_id") if run.status is RunStatus.WAITING else None
    named = ", ".join(repr(step) + (" (the run waits for it)" if step == waiting else "") for step in steps)
    return f"the steps of run {run.run_id!r} that can be {verb}: {named}"


@click.command()
@run_argument
@click.argument("step_id", metavar="STEP")
@click.option("--by", required=True, help="Who revokes (recorded).")
@click.option("--reason", required=True, help="Why (recorded, shown with the run).")
@store_option
@click.pass_context
def revoke(ctx: click.Context, run_id: str, step_id: str, by: str, reason: str) -> None:
    """Take back the approval of the effect STEP of RUN prepared, while its outcome is open.

    Every approval of it still in force is revoked: the run dispatches the effect no more (a
    dispatch already made is reconciled, never recalled), and waits again at its gate until
    someone approves it anew. Refused once the effect's outcome is recorded.
    """
    store = open_cli_store(ctx)
    try:
        revoked = revoke_step(store, run_id, step_id, by=by, reason=reason)
    except ApprovalRefused as exc:
        head = _carried_on(store, run_id)
        steps = revocable(head, store.load_ledger(head.run_id).operations, store.approvals(head.run_id))
        if step_id in steps:
            raise
        fail(ctx, f"{error_text(exc, now_ms(ctx))}; {_choices(head, steps, 'revoked')}")
    of = revoked[0]
    given = ", ".join(a.approved_by for a in revoked)
    click.echo(
        shown(
            f"revoked {len(revoked)} approval(s) of {of.operation_id!r} (step"
            f" {of.step_id!r}) of run {run_id!r}, given by {given}; it is not"
            " dispatched unless approved anew (run now"
            f" {store.get_run(of.run_id).status.value})"
        )
    )


@click.command()
@run_argument
@click.option("--by", required=True, help="Who cancels (recorded).")
@click.option("--reason", help="Why (recorded).")
@store_option
@click.pass_context
def cancel(ctx: click.Context, run_id: str, by: str, reason: str | None) -> None:
    """Cancel a run, for good.

    A pending, waiting or blocked run ends at once; a running one stops before its next step or
    dispatch (an effect in flight is settled first). No resume revives a cancelled run. A run
    that continued as new passes the request on to the run that carries its chain on.
    """
    store = open_cli_store(ctx)
    run = cancel_run(store, run_id, by=by, reason=reason)
    state = f"now {run.status.value}"
    if run.status is RunStatus.RUNNING:
        state = (
            "cancel requested: its worker stops before its next step or dispatch"
            if ownership(run, store.now()).state == HELD
            else "cancel requested: no worker holds it now; the next to take it (a worker, or"
            " a resume) settles what is in flight and ends it"
        )
    chain = f" (its chain goes on in {run.run_id!r})" if run.run_id != run_id else ""
    click.echo(shown(f"run {run_id!r}{chain}: {state}"))


COMMANDS: tuple[click.Command, ...] = (resolve, approve, revoke, cancel)
