"""The commands that carry a stopped run on: raise its limits, retry it, fork it, send it a
message (``limits``, ``retry``, ``fork``, ``send``).

``cli`` registers every command in ``COMMANDS`` on its group, so a new command is written here
and added to the tuple; neither ``cli`` nor the other command modules change. Build a command
with ``@click.command()`` and the shared plumbing of ``cli_support`` (``store_option``,
``run_argument``, ``open_cli_store``, ``fail``, ``import_modules``, ``stdout_console``); never
import ``cli`` (it imports this module).
"""

from __future__ import annotations

import json

import click

from .._engine.messages import send as send_message
from ..types import RunStatus
from .cli_support import open_cli_store, run_argument, store_option
from .render import message_line, shown, waiting_summary


@click.command()
@run_argument
@click.argument("name")
@click.option(
    "--payload",
    metavar="JSON",
    required=True,
    help="The message: a JSON value (a person's answer, a webhook's body).",
)
@click.option(
    "--message-id",
    metavar="ID",
    help="The sender's id for it: sent again under this id, it is the same message (kept once).",
)
@click.option("--by", help="Who sends it (recorded).")
@store_option
@click.pass_context
def send(
    ctx: click.Context, run_id: str, name: str, payload: str, message_id: str | None, by: str | None
) -> None:
    """Send RUN a message NAME, for the run.wait_for(NAME) of its workflow.

    The message is kept whether the run waits yet or not: a wait takes the oldest message of
    its name not yet taken, so a second one waits for the next wait. A run waiting for it
    becomes runnable at once: a worker takes it, or resume it. A payload that is not JSON, or
    holds a credential, is refused; so is a message to a run that has ended. A run that
    continued as new passes the message on to the run that carries its chain on.
    """
    try:
        parsed = json.loads(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    store = open_cli_store(ctx)
    message = send_message(store, run_id, name, parsed, message_id=message_id, by=by)
    run, now = store.get_run(message.run_id), store.now()
    chain = f" (its chain goes on in {message.run_id!r})" if message.run_id != run_id else ""
    if run.status is RunStatus.WAITING:
        state = f"it still waits, for {waiting_summary(run.waiting_for, now)}"
    elif run.status is RunStatus.PENDING:
        state = "it is runnable: a worker takes it, or resume it"
    else:
        state = f"it is {run.status.value}; a wait of it takes the message when it gets there"
    click.echo(shown(f"sent to run {run_id!r}{chain}: {message_line(message, now)}"))
    click.echo(shown(state))


COMMANDS: tuple[click.Command, ...] = (send,)
