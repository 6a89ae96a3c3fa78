"""The commands that carry a stopped run on: raise its limits, retry it, fork it, send it a
message (``limits``, ``retry``, ``fork``, ``send``).

``cli`` registers every command in ``COMMANDS`` on its group, so a new command is written here
and added to the tuple; neither ``cli`` nor the other command modules change. Build a command
with ``@click.command()`` and the shared plumbing of ``cli_support`` (``store_option``,
``run_argument``, ``open_cli_store``, ``fail``, ``import_modules``, ``stdout_console``); never
import ``cli`` (it imports this module).
"""

from __future__ import annotations

import click

from .._engine.fork import current_code as current_workflow
from .._engine.fork import fork as fork_run
from .cli_support import import_modules, open_cli_store, run_argument, store_option
from .render import shown


@click.command()
@run_argument
@click.option(
    "--from-step",
    "from_step",
    required=True,
    metavar="STEP",
    help="The step the fork starts from: it and every step after it run again"
    " (`safepoint show RUN` lists the steps).",
)
@click.option(
    "--run-id", "new_run_id", metavar="NEW", help="The fork's run id.  [default: minted from RUN's]"
)
@click.option(
    "--import",
    "modules",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE first (repeatable): the code --current-code records the fork under.",
)
@click.option(
    "--current-code",
    is_flag=True,
    help="Record the fork under RUN's workflow as the imported code has it (its version and"
    " fingerprint), so that a worker of that code carries it on.  [default: RUN's own code]",
)
@click.option(
    "--resend",
    multiple=True,
    metavar="OP",
    help="An operation RUN sent that the fork sends again, as its own, under its own key (repeatable).",
)
@click.option("--by", required=True, help="Who forks the run (recorded).")
@click.option("--reason", help="Why (recorded).")
@store_option
@click.pass_context
def fork(
    ctx: click.Context,
    run_id: str,
    from_step: str,
    new_run_id: str | None,
    modules: tuple[str, ...],
    current_code: bool,
    resend: tuple[str, ...],
    by: str,
    reason: str | None,
) -> None:
    """Fork RUN from its step --from-step: a new run whose ledger starts with copies of RUN's
    steps before it, and which executes from there once a worker takes it (or `safepoint
    resume` it).

    An effect RUN sent is not sent again by the fork: its effect step takes RUN's receipt (the
    same operation id, the same payload). One the fork asks for with another payload blocks
    it, unless --resend names it: the fork then sends it as its own operation, under its own
    key, which no key of RUN's can be. The fork is recorded under RUN's code, or with
    --current-code under the code --import brings in.
    """
    import_modules(modules)
    store = open_cli_store(ctx)
    if current_code and not modules:
        raise click.UsageError(
            "--current-code records the fork under the code you deploy: name its module with --import"
        )
    made = fork_run(
        store,
        run_id,
        from_step=from_step,
        new_run_id=new_run_id,
        workflow=current_workflow(store, run_id) if current_code else None,
        resend=resend,
        by=by,
        reason=reason,
    )
    click.echo(
        shown(
            f"run {run_id!r} forked from step {from_step!r}: {made.run_id} (pending),"
            f" {made.step_count} steps copied, under {made.workflow}@{made.workflow_version}"
        )
    )
    if resend:
        click.echo(shown(f"sent again by the fork, under its own key: {', '.join(resend)}"))
    click.echo(shown(f"a worker carries it on; or: safepoint resume {made.run_id}"))


COMMANDS: tuple[click.Command, ...] = (fork,)
