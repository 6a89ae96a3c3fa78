"""The ``safepoint`` command: list runs, read a run's ledger, resume it, settle it.

Every command opens the store named by ``--store`` (before or after the command; default
``$SAFEPOINT_URL``, else ``safepoint.db`` in the working directory). Commands about runs that
exist never create a ledger: a store URL naming an SQLite file that is not there is an error,
and no file is left behind. An error safepoint raises on purpose is printed as one line,
``error: <message>``, with exit code 1 — its message already says what to do, so a traceback
would only bury it; a command that contradicts itself is a usage error, exit code 2. ``resume``
exits 3 when the run is blocked and 4 when it waits for an approval, so a script can tell "a
person must decide" from "something is broken".

What is printed is data from the ledger, never instructions to the terminal: ``render`` escapes
every value (see ``shown``) and prints times as UTC instants beside how long ago they were.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from click.core import ParameterSource
from rich.console import Console

from .. import __version__
from .._engine.flow import drive
from .._engine.lifecycle import chain_head
from .._engine.operator import approve as approve_step
from .._engine.operator import revoke_approval as revoke_step
from .._engine.operator import settle
from .._engine.verbs import cancel as cancel_run
from .._engine.verbs import resume as resume_run
from .._engine.worker import Worker
from .._rules.approvals import approvable, revocable
from .._rules.ids import check_run_id
from .._rules.moments import when
from .._rules.presence import HELD, ownership
from ..errors import (
    ApprovalRefused,
    AwaitingApproval,
    LostOwnership,
    RunBlocked,
    SafepointError,
)
from ..storage import open_store
from ..storage.base import Store
from ..types import ResolutionAction, RunRecord, RunStatus, UnreadableRun
from .dashboard import DEFAULT_PORT, Dashboard
from .render import (
    as_json,
    error_text,
    print_run,
    print_table,
    run_document,
    runs_table,
    shown,
)

EXIT_ERROR = 1
EXIT_BLOCKED = 3
EXIT_WAITING = 4

# -- the group, its store and its errors ----------------------------------------------------------

_STORE_URL = "safepoint.store_url"  # ctx.meta: the --store given after the command
_OPENED = "safepoint.store"  # ctx.meta: the store the command opened

F = TypeVar("F", bound=Callable[..., Any])


class _SafepointGroup(click.Group):
    """Prints safepoint's own errors as one safe line on stderr instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SafepointError as exc:
            _fail(ctx, error_text(exc, _now(ctx)))
        except LostOwnership as exc:  # a BaseException: another worker took the run over
            _fail(ctx, str(exc))


def _fail(ctx: click.Context, message: str) -> NoReturn:
    click.echo(f"error: {shown(message)}", err=True)
    ctx.exit(EXIT_ERROR)


def _now(ctx: click.Context) -> int:
    """The store's clock (leases are on it), or this machine's when no store answers."""
    store = ctx.meta.get(_OPENED)
    if store is not None:
        try:
            return int(store.now())
        except Exception:  # the error being reported may be that the store is unusable
            pass
    return time.time_ns() // 1_000_000


class _StoreURL(click.types.StringParamType):
    """A store URL; ``$SAFEPOINT_URL`` is one URL, never split (a path may hold spaces)."""

    name = "url"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [rv]


def _one_store_url(given: tuple[str, ...], ctx: click.Context) -> str | None:
    """The one ledger ``--store`` names, however often it is given; a usage error when it
    names two."""
    named = list(dict.fromkeys(given))
    if len(named) > 1:
        raise click.UsageError(
            f"--store names {len(named)} ledgers ({', '.join(map(repr, named))}): name one", ctx=ctx
        )
    return named[0] if named else None


def _take_store_url(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> None:
    """``--store`` after the command: the same option as before it, naming the same ledger."""
    if not values:
        return
    root = ctx.find_root()
    before: tuple[str, ...] = ()
    if root.get_parameter_source("store_url") is ParameterSource.COMMANDLINE:
        before = tuple(root.params.get("store_url") or ())
    ctx.meta[_STORE_URL] = _one_store_url(before + tuple(values), ctx)


def store_option(command: F) -> F:
    """``--store URL`` on a command, so that it may follow the command's name too."""
    return click.option(
        "--store",
        type=_StoreURL(),
        multiple=True,
        expose_value=False,
        callback=_take_store_url,
        help="The ledger (as before the command).",
    )(command)


def run_argument(command: F) -> F:
    """The RUN argument of a command, checked as every verb checks a run id — before a store
    is opened (an argument that is not UTF-8 arrives holding a lone surrogate, which no ledger
    can hold)."""
    return click.argument("run_id", metavar="RUN", callback=lambda ctx, param, value: check_run_id(value))(
        command
    )


def _store(ctx: click.Context, *, create: bool = False) -> Store:
    """The store named by --store, opened (and so migrated) once, closed when the command ends.

    Only the commands that set a ledger up (``migrate``, ``worker``, ``dashboard``) create one
    (``create``): every other one looks at runs that exist, and a missing ledger is an error
    that leaves no file behind."""
    url = ctx.meta.get(_STORE_URL) or ctx.find_root().obj
    store = open_store(url, create=create)
    ctx.meta[_OPENED] = store
    ctx.find_root().call_on_close(store.close)  # open while the error handler reads its clock
    return store


def _stdout(*, markup: bool = False) -> Console:
    # Built per command, not at import: the stream may be swapped (tests, redirection). Markup
    # and emoji codes are off: what is printed is the ledger's data, never read as markup.
    return Console(highlight=False, markup=markup, emoji=False)


@click.group(cls=_SafepointGroup)
@click.option(
    "--store",
    "store_url",
    envvar="SAFEPOINT_URL",
    show_envvar=True,
    type=_StoreURL(),
    multiple=True,
    help="The ledger: sqlite:///file.db or a file path (also accepted after the"
    " command).  [default: safepoint.db in the working directory]",
)
@click.version_option(__version__, prog_name="safepoint")
@click.pass_context
def cli(ctx: click.Context, store_url: tuple[str, ...]) -> None:
    """safepoint: a ledger for agent runs; resume after any crash without repeating effects."""
    ctx.obj = _one_store_url(store_url, ctx)


# -- looking at runs -----------------------------------------------------------------------------


@cli.command()
@click.option("--status", type=click.Choice([s.value for s in RunStatus]), help="Only runs with this status.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="At most this many runs, most recently changed first.",
)
@store_option
@click.pass_context
def runs(ctx: click.Context, status: str | None, limit: int) -> None:
    """List runs, most recently changed first.

    Columns: run id, workflow@version, status, owner, resume count, fence, when it last
    changed, and for a blocked run the phase of its recovery record (for a waiting run: the
    step whose approval it waits for; for a continued run: its successor). A running run whose
    worker's lease expired says "lease expired" (any worker takes it over); one that nobody
    holds — released after a resolution — says "released".
    """
    store = _store(ctx)
    found = store.list_runs(RunStatus(status) if status else None, limit)
    console = _stdout()
    if not found:
        click.echo(shown(f"no {status + ' ' if status else ''}runs in {store.url}"))
        return
    print_table(console, runs_table(found, store.now()))


@cli.command()
@run_argument
@click.option(
    "--json",
    "as_document",
    is_flag=True,
    help="Print everything the ledger holds about the run as one JSON document, whole (times in epoch ms).",
)
@store_option
@click.pass_context
def show(ctx: click.Context, run_id: str, as_document: bool) -> None:
    """Show a run's header, step timeline and events.

    Steps are listed in the order they were recorded; effect steps carry their operation id,
    effect state and effect key (the idempotency key to look up at the effect's owner).
    A blocked run shows its recovery record's reason and next actions first; a running one,
    who holds it and until when.
    """
    store = _store(ctx)
    if as_document:
        click.echo(as_json(run_document(store, run_id)))
        return
    print_run(_stdout(), store, run_id)


@cli.command()
@run_argument
@store_option
@click.pass_context
def record(ctx: click.Context, run_id: str) -> None:
    """Print a blocked run's recovery record as JSON.

    Exit code 1 (with a note on stderr) when RUN is not blocked.
    """
    run = _store(ctx).find_run(run_id)
    if isinstance(run, UnreadableRun) and run.recovery_record is None:
        _fail(ctx, f"run {run_id!r} cannot be read: {run.reason}")
    if isinstance(run, RunRecord) and run.status is RunStatus.WAITING:
        _fail(
            ctx,
            f"run {run_id!r} is not blocked: it waits for approval of step"
            f" {(run.waiting_for or {}).get('step_id')!r}; see `safepoint show {run_id}`",
        )
    if run.status is not RunStatus.BLOCKED or run.recovery_record is None:
        status = run.status.value if run.status else "unreadable"
        _fail(
            ctx, f"run {run_id!r} is not blocked (status: {status}); only a blocked run has a recovery record"
        )
    click.echo(as_json(run.recovery_record))


# -- carrying runs on ----------------------------------------------------------------------------


@cli.command()
@run_argument
@click.option(
    "--import",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first so its @workflow registrations exist (repeatable).",
)
@store_option
@click.pass_context
def resume(ctx: click.Context, run_id: str, modules: tuple[str, ...]) -> None:
    """Resume a run from its ledger; print its result as JSON.

    Exit code 0 when the run completed, 3 when it is blocked and needs a person
    (see `safepoint record RUN`), 4 when it waits for a person's approval of an effect
    (see `safepoint show RUN`), 1 on any other error.
    """
    _import_modules(modules)
    store = _store(ctx)
    try:
        result = resume_run(store, run_id)
    except RunBlocked as exc:
        click.echo(shown(f"run {run_id!r} is blocked: {error_text(exc, _now(ctx))}"), err=True)
        click.echo(shown(f"see `safepoint record {run_id}`"), err=True)
        ctx.exit(EXIT_BLOCKED)
    except AwaitingApproval as exc:
        click.echo(error_text(exc, _now(ctx)), err=True)
        ctx.exit(EXIT_WAITING)
    click.echo(as_json(result))


def _import_modules(modules: tuple[str, ...]) -> None:
    if not modules:
        return
    # A console script does not put the working directory on sys.path (`python -m` does), yet
    # workflows usually live in the project the person is standing in.
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            # Only the named module being absent is a usage error; a missing import *inside*
            # the user's module is their bug, and its traceback is the useful answer.
            if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
                raise
            raise click.BadParameter(
                f"no module named {name!r} (run from the project directory or set PYTHONPATH)",
                param_hint="--import",
            ) from exc


@cli.command()
@click.option(
    "--import",
    "modules",
    multiple=True,
    required=True,
    metavar="MODULE",
    help="Import MODULE so its @workflow registrations exist (repeatable).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Runs executed at once by this process.",
)
@click.option(
    "--lease",
    type=click.FloatRange(min=1),
    default=30.0,
    show_default=True,
    help="Seconds a claim holds without a heartbeat before others may take over.",
)
@click.option("--until-idle", is_flag=True, help="Exit once nothing is runnable.")
@store_option
@click.pass_context
def worker(
    ctx: click.Context, modules: tuple[str, ...], concurrency: int, lease: float, until_idle: bool
) -> None:
    """Claim and execute runnable runs until stopped.

    Runnable: submitted runs, and runs whose worker's lease expired (it died). Start one per
    machine against one store; SIGTERM drains (finishes the runs in progress, claims no more).
    """
    _import_modules(modules)
    handler = logging.StreamHandler()
    handler.setFormatter(_ShownFormatter("%(asctime)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    store = _store(ctx, create=True)
    found = Worker(store, concurrency=concurrency, lease_ms=int(lease * 1000))
    click.echo(shown(f"worker {found.owner} on {store.url}, concurrency {concurrency}"), err=True)
    stats = found.run(until_idle=until_idle)
    click.echo(
        f"worker stopped: claimed {stats.claimed}, completed {stats.completed},"
        f" blocked {stats.blocked}, waiting {stats.waiting}, failed {stats.failed},"
        f" lost {stats.lost}",
        err=True,
    )


class _ShownFormatter(logging.Formatter):
    """The worker's log lines name runs and quote their errors: data, printed as such (a
    traceback keeps its lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(shown(line) for line in super().format(record).split("\n"))


# -- a person's decisions ------------------------------------------------------------------------

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


@cli.command()
@run_argument
@click.option("--applied", is_flag=True, help="The operation happened: give its receipt with --receipt.")
@click.option(
    "--not-applied",
    is_flag=True,
    help="It did not happen: send it again, under the same key (its owner is asked"
    " first when the effect's code is imported: --import).",
)
@click.option("--abandon", is_flag=True, help="Give the run up (cancelled).")
@click.option(
    "--revision", type=int, required=True, help="The state_revision of the recovery record you decided on."
)
@click.option("--by", required=True, help="Who decides (recorded).")
@click.option("--receipt", metavar="JSON", help="With --applied: the object the owner holds.")
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
        parsed = json.loads(receipt) if receipt is not None else None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--receipt") from None
    _import_modules(modules)
    settled = settle(
        _store(ctx),
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


_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_expiry(text: str) -> timedelta | datetime:
    """``--expires``: a duration (``90s``, ``15m``, ``2h``, ``1d``, ``1h30m``) or an ISO 8601
    instant with its time zone (``2030-01-31T17:00:00+01:00``)."""
    parts = _DURATION.findall(text)
    if parts and "".join(f"{n}{u}" for n, u in parts) == text:
        return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise click.BadParameter(
            f"{text!r} is neither a duration (90s, 15m, 2h, 1d, 1h30m)"
            " nor an ISO 8601 instant with a time zone",
            param_hint="--expires",
        )
    return moment


@cli.command()
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
    store = _store(ctx)
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
        _fail(ctx, f"{error_text(exc, _now(ctx))}; {_choices(head, steps, 'approved')}")
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


@cli.command()
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
    store = _store(ctx)
    try:
        revoked = revoke_step(store, run_id, step_id, by=by, reason=reason)
    except ApprovalRefused as exc:
        head = _carried_on(store, run_id)
        steps = revocable(head, store.load_ledger(head.run_id).operations, store.approvals(head.run_id))
        if step_id in steps:
            raise
        _fail(ctx, f"{error_text(exc, _now(ctx))}; {_choices(head, steps, 'revoked')}")
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


@cli.command()
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
    store = _store(ctx)
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


# -- the ledger itself ---------------------------------------------------------------------------


@cli.command()
@store_option
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or migrate the store and print its schema version.

    Opening a store applies any pending numbered migration, so this is also what every other
    command does first; run it on its own before a deploy to migrate ahead of the workers.
    """
    store = _store(ctx, create=True)  # opening a store migrates it
    version = store.schema_version()
    click.echo(shown(f"schema version {version} ({store.url})"))


@cli.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="A loopback address: the dashboard never listens on another.",
)
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="0: any free port.",
)
@click.option(
    "--token",
    envvar="SAFEPOINT_DASHBOARD_TOKEN",
    show_envvar=True,
    help="The token every action and the JSON API need.  [default: a new random one, printed]",
)
@click.option(
    "--import",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE so that a resolution 'not applied' asks the effect's owner"
    " first, as `resolve --import` does (repeatable).",
)
@store_option
@click.pass_context
def dashboard(ctx: click.Context, host: str, port: int, token: str | None, modules: tuple[str, ...]) -> None:
    """Serve the dashboard: runs, ledgers and recovery records in a browser, with forms to
    cancel, resolve, approve and revoke (each needs the token, as does the JSON API under
    /api/). Loopback only; Ctrl-C stops it."""
    _import_modules(modules)
    board = Dashboard(_store(ctx, create=True), host=host, port=port, token=token)
    click.echo(
        shown(f"safepoint dashboard on {board.url}  (actions and /api/ need the token: {board.token})")
    )
    try:
        board.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()


@cli.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the demo's ledger here (default: a temporary directory).",
)
@click.option("--keep", is_flag=True, help="Keep the temporary directory and print its path.")
@click.pass_context
def demo(ctx: click.Context, workdir: Path | None, keep: bool) -> None:
    """Kill an agent mid-refund, resume it, count the effects.

    Starts a local effect owner, runs a scripted agent over three tickets in a child process,
    SIGKILLs it just after the owner committed a refund (before the ledger heard back), resumes
    it in a fresh process and prints the ledger and the owner's count of effects and duplicates.
    """
    from .demo import run_demo

    # The demo's own lines use markup; the ledger it prints goes through the same renderers.
    ctx.exit(run_demo(workdir=workdir, keep=keep, console=_stdout(markup=True)))


def main() -> None:
    """Entry point of the `safepoint` console script."""
    cli(prog_name="safepoint")
