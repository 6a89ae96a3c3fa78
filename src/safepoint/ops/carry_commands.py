"""The commands that carry a stopped run on: raise its limits, retry it, fork it, send it a
message (``limits``; ``retry``, ``fork``, ``send`` — to be added).

``cli`` registers every command in ``COMMANDS`` on its group, so a new command is written here
and added to the tuple; neither ``cli`` nor the other command modules change. Build a command
with ``@click.command()`` and the shared plumbing of ``cli_support`` (``store_option``,
``run_argument``, ``open_cli_store``, ``fail``, ``import_modules``, ``stdout_console``); never
import ``cli`` (it imports this module).
"""

from __future__ import annotations

import shlex

import click

from .._engine.limits import extend_limits
from .._rules.moments import when
from ..types import RunRecord, RunStatus
from .cli_support import open_cli_store, parse_when, run_argument, store_option
from .render import shown


@click.command()
@run_argument
@click.option("--tokens", type=int, metavar="N", help="The model tokens the run may spend.")
@click.option("--cost", type=float, metavar="X", help="The model cost it may spend (your usage= unit).")
@click.option("--model-calls", type=int, metavar="N", help="The model calls (turns) it may make.")
@click.option(
    "--deadline",
    metavar="WHEN",
    help="From now (+30m, 2h, 1d) or until when (ISO 8601 with a time zone).",
)
@click.option(
    "--step-attempts", type=int, metavar="N", help="The attempts every retried read and model step gets."
)
@click.option("--resume-budget", type=int, metavar="N", help="The takeovers the run may have.")
@click.option("--by", required=True, help="Who changes the limits (recorded).")
@click.option("--reason", help="Why (recorded).")
@click.option(
    "--revision",
    type=int,
    help="The state revision you looked at (safepoint show): refused if the run moved since.",
)
@store_option
@click.pass_context
def limits(
    ctx: click.Context,
    run_id: str,
    tokens: int | None,
    cost: float | None,
    model_calls: int | None,
    deadline: str | None,
    step_attempts: int | None,
    resume_budget: int | None,
    by: str,
    reason: str | None,
    revision: int | None,
) -> None:
    """Raise (or set) the limits of RUN; a run stopped at one carries on.

    Name the limits to change; the others stay. What the run spent is never reset, and a limit
    is never lowered below it. The change is recorded in the run's history (--by, --reason,
    the old and new limits). A stopped run becomes pending: a worker takes it, or resume it; a
    running run's worker reads the new limits before it would stop.
    """
    store = open_cli_store(ctx)
    run = extend_limits(
        store,
        run_id,
        tokens=tokens,
        cost=cost,
        model_calls=model_calls,
        deadline=parse_when(deadline, "--deadline") if deadline else None,
        step_attempts=step_attempts,
        resume_budget=resume_budget,
        by=by,
        reason=reason,
        expected_revision=revision,
    )
    chain = f" (its chain goes on in {run.run_id!r})" if run.run_id != run_id else ""
    click.echo(shown(f"run {run_id!r}{chain}: limits now {_limits_line(run, store.now())}"))
    if run.status is RunStatus.PENDING:
        click.echo(
            shown(
                f"now pending, revision {run.state_revision}: a worker carries it on, or"
                f" safepoint resume {shlex.quote(run.run_id)} --import <module>"
            )
        )
    else:
        click.echo(shown(f"now {run.status.value}, revision {run.state_revision}"))


def _limits_line(run: RunRecord, now: int) -> str:
    """The run's limits, each with what it spent: ``tokens 34 of 200, model calls 2 of 10``."""
    parts = []
    for name, limit, spent in (
        ("tokens", run.token_budget, run.tokens_spent),
        ("cost", run.cost_budget, run.cost_spent),
        ("model calls", run.model_call_budget, run.model_calls_spent),
        ("resumes", run.resume_budget, run.resume_count),
    ):
        if limit is not None:
            parts.append(f"{name} {spent:g} of {limit:g}")
    if run.deadline_at is not None:
        parts.append(f"deadline {when(run.deadline_at, now)}")
    if run.step_attempt_limit is not None:
        parts.append(f"step attempts {run.step_attempt_limit}")
    return ", ".join(parts) or "none"


COMMANDS: tuple[click.Command, ...] = (limits,)
