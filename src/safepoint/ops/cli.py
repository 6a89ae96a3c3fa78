"""The ``safepoint`` command: list runs, read a run's ledger, resume it, settle it.

Every command opens the store named by ``--store`` (before or after the command; default
``$SAFEPOINT_URL``, else ``safepoint.db`` in the working directory). Commands about runs that
exist never create a ledger: a store URL naming an SQLite file that is not there is an error,
and no file is left behind. An error safepoint raises on purpose is printed as one line,
``error: <message>``, with exit code 1 — its message already says what to do, so a traceback
would only bury it; a command that contradicts itself is a usage error, exit code 2. ``resume``
exits 3 when the run is blocked and 4 when it waits for an approval, so a script can tell "a
person must decide" from "something is broken"; ``resume`` and ``worker`` exit 75 when their
``--slice`` was spent with a run unfinished (released: call again to carry it on); ``replay``
and ``check-deploy`` exit 6 when a run diverges from the code imported now or would not carry
on under it.

What is printed is data from the ledger, never instructions to the terminal: ``render`` escapes
every value (see ``shown``) and prints times as UTC instants beside how long ago they were.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import click

from .. import __version__
from .._engine.verbs import resume as resume_run
from .._engine.worker import Worker
from .._rules.waits import APPROVAL, waiting_kind
from ..errors import RunBlocked, RunWaiting
from ..types import RunRecord, RunStatus, Unfinished, UnreadableRun
from . import (
    carry_commands,
    keys_commands,
    operator_commands,
    replay_commands,
    retention_commands,
    run_file_commands,
)
from .admission import DEFAULT_PORT
from .cli_support import (
    EXIT_BLOCKED,
    EXIT_UNFINISHED,
    EXIT_WAITING,
    SafepointGroup,
    StoreURL,
    fail,
    import_modules,
    now_ms,
    one_store_url,
    open_cli_store,
    run_argument,
    slice_option,
    stdout_console,
    store_option,
)
from .render import (
    as_json,
    error_text,
    print_run,
    print_table,
    run_document,
    runs_table,
    shown,
    waiting_summary,
)


@click.group(cls=SafepointGroup)
@click.option(
    "--store",
    "store_url",
    envvar="SAFEPOINT_URL",
    show_envvar=True,
    type=StoreURL(),
    multiple=True,
    help="The ledger: sqlite:///file.db or a file path (also accepted after the"
    " command).  [default: safepoint.db in the working directory]",
)
@click.version_option(__version__, prog_name="safepoint")
@click.pass_context
def cli(ctx: click.Context, store_url: tuple[str, ...]) -> None:
    """safepoint: a ledger for agent runs; resume after any crash without repeating effects."""
    ctx.obj = one_store_url(store_url, ctx)


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
    changed, and for a blocked run the phase of its recovery record (for a waiting run: what
    it waits for — the step whose approval, the message, the end of its sleep; for a continued
    run: its successor). A running run whose
    worker's lease expired says "lease expired" (any worker takes it over); one that nobody
    holds — released after a resolution — says "released".
    """
    store = open_cli_store(ctx)
    found = store.list_runs(RunStatus(status) if status else None, limit)
    console = stdout_console()
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
    who holds it and until when; a waiting one, what it waits for (the payload to approve, the
    message and its timeout, the end of its sleep). The messages sent to the run are listed,
    each with the wait step that took it.
    """
    store = open_cli_store(ctx)
    if as_document:
        click.echo(as_json(run_document(store, run_id)))
        return
    print_run(stdout_console(), store, run_id)


@cli.command()
@run_argument
@store_option
@click.pass_context
def record(ctx: click.Context, run_id: str) -> None:
    """Print the recovery record of a blocked run (or of one stopped at a limit) as JSON.

    Exit code 1 (with a note on stderr) when RUN is neither.
    """
    run = open_cli_store(ctx).find_run(run_id)
    if isinstance(run, UnreadableRun) and run.recovery_record is None:
        fail(ctx, f"run {run_id!r} cannot be read: {run.reason}")
    if isinstance(run, RunRecord) and run.status is RunStatus.WAITING:
        waits = (
            f"approval of step {(run.waiting_for or {}).get('step_id')!r}"
            if waiting_kind(run.waiting_for) == APPROVAL
            else waiting_summary(run.waiting_for, now_ms(ctx))
        )
        fail(ctx, f"run {run_id!r} is not blocked: it waits for {waits}; see `safepoint show {run_id}`")
    if run.status not in (RunStatus.BLOCKED, RunStatus.STOPPED) or run.recovery_record is None:
        status = run.status.value if run.status else "unreadable"
        fail(
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
@slice_option
@store_option
@click.pass_context
def resume(ctx: click.Context, run_id: str, modules: tuple[str, ...], slice_length: timedelta | None) -> None:
    """Resume a run from its ledger; print its result as JSON.

    Exit code 0 when the run completed, 3 when it is blocked and needs a person
    (see `safepoint record RUN`), 4 when it waits — for a person's approval of an effect, a
    message (`safepoint send`) or its timer (see `safepoint show RUN`) — 75 when --slice was
    spent before the run ended (it stopped at a step boundary and was released: resume it
    again, at once, to carry it on; nothing is printed on stdout), 1 on any other error.
    """
    import_modules(modules)
    store = open_cli_store(ctx)
    try:
        result = resume_run(store, run_id, slice=slice_length)
    except RunBlocked as exc:
        click.echo(shown(f"run {run_id!r} is blocked: {error_text(exc, now_ms(ctx))}"), err=True)
        click.echo(shown(f"see `safepoint record {run_id}`"), err=True)
        ctx.exit(EXIT_BLOCKED)
    except RunWaiting as exc:
        click.echo(error_text(exc, now_ms(ctx)), err=True)
        ctx.exit(EXIT_WAITING)
    if isinstance(result, Unfinished):
        click.echo(shown(f"run {result.run_id!r} is not finished: {result.reason}"), err=True)
        ctx.exit(EXIT_UNFINISHED)
    click.echo(as_json(result))


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
@slice_option
@store_option
@click.pass_context
def worker(
    ctx: click.Context,
    modules: tuple[str, ...],
    concurrency: int,
    lease: float,
    until_idle: bool,
    slice_length: timedelta | None,
) -> None:
    """Claim and execute runnable runs until stopped.

    Runnable: submitted runs, and runs whose worker's lease expired (it died). Start one per
    machine against one store; SIGTERM drains (finishes the runs in progress, claims no more).
    With --slice, it also stops once that much time is spent: it claims no more, stops the runs
    in progress at their next step boundary and releases them at once, then exits — 75 when it
    left a run unfinished (another call carries it on at once), 0 otherwise.
    """
    import_modules(modules)
    handler = logging.StreamHandler()
    handler.setFormatter(_ShownFormatter("%(asctime)s %(name)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    store = open_cli_store(ctx, create=True)
    found = Worker(store, concurrency=concurrency, lease_ms=int(lease * 1000))
    click.echo(shown(f"worker {found.owner} on {store.url}, concurrency {concurrency}"), err=True)
    stats = found.run(until_idle=until_idle, slice=slice_length)
    click.echo(
        f"worker stopped: claimed {stats.claimed}, completed {stats.completed},"
        f" blocked {stats.blocked}, waiting {stats.waiting}, stopped {stats.stopped},"
        f" failed {stats.failed}, lost {stats.lost}, unfinished {stats.unfinished}",
        err=True,
    )
    if stats.unfinished:
        ctx.exit(EXIT_UNFINISHED)


class _ShownFormatter(logging.Formatter):
    """The worker's log lines name runs and quote their errors: data, printed as such (a
    traceback keeps its lines)."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(shown(line) for line in super().format(record).split("\n"))


# -- the ledger itself ---------------------------------------------------------------------------


@cli.command()
@store_option
@click.option(
    "--distribute",
    type=click.Choice(["citus"]),
    default=None,
    help="Distribute the PostgreSQL ledger's tables by run (Citus, on its coordinator); the"
    " store URL of every worker and tool then names it too: ?distributed=citus.",
)
@click.pass_context
def migrate(ctx: click.Context, distribute: str | None) -> None:
    """Create or migrate the store and print its schema version.

    Opening a store applies any pending numbered migration, so this is also what every other
    command does first; run it on its own before a deploy to migrate ahead of the workers.
    """
    store = open_cli_store(ctx, create=True, distributed=distribute)  # migrated (and distributed)
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
    """Serve the console: the runs (counts, filters, pages), each run's timeline, an inbox of
    what needs a person (/inbox) and the workers (/workers), with forms to resolve, approve,
    raise limits, retry, cancel, send and fork (each needs the token, as does the JSON API
    under /api/, described at /api/openapi.json). Loopback only; Ctrl-C stops it."""
    from .dashboard import Dashboard  # the console extra: MissingExtra without it

    import_modules(modules)
    board = Dashboard(open_cli_store(ctx, create=True), host=host, port=port, token=token)
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
    ctx.exit(run_demo(workdir=workdir, keep=keep, console=stdout_console(markup=True)))


# -- the commands of other modules -----------------------------------------------------------------

for _command in (
    *operator_commands.COMMANDS,
    *carry_commands.COMMANDS,
    *retention_commands.COMMANDS,
    *keys_commands.COMMANDS,
    *run_file_commands.COMMANDS,
    *replay_commands.COMMANDS,
):
    cli.add_command(_command)


def main() -> None:
    """Entry point of the `safepoint` console script."""
    cli(prog_name="safepoint")
