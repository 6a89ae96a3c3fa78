"""The commands that carry a stopped run on: raise its limits, retry it, fork it, send it a
message or answer one of its waits (``limits``, ``retry``, ``fork``, ``send``, ``answer``).

``cli`` registers every command in ``COMMANDS`` on its group, so a new command is written here
and added to the tuple; neither ``cli`` nor the other command modules change. Build a command
with ``@click.command()`` and the shared plumbing of ``cli_support`` (``store_option``,
``run_argument``, ``open_cli_store``, ``fail``, ``import_modules``, ``stdout_console``); never
import ``cli`` (it imports this module).
"""

from __future__ import annotations

import shlex

import click

from .._engine.flow import drive
from .._engine.fork import current_code as current_workflow
from .._engine.fork import fork as fork_run
from .._engine.limits import extend_limits
from .._engine.messages import answer as answer_wait
from .._engine.messages import send as send_message
from .._engine.retry import Retried, names, retry_flow
from .._rules.canonical import decode_json
from .._rules.moments import when
from ..storage.base import Store
from ..types import JSON, MessageRecord, RunRecord, RunStatus
from .cli_support import import_modules, open_cli_store, parse_when, run_argument, store_option
from .render import message_line, shown, waiting_summary


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


# -- retry ------------------------------------------------------------------------------------------


@click.command()
@run_argument
@click.option("--by", required=True, help="Who retries the run (recorded).")
@click.option("--reason", help="Why: the service is back, the bug is fixed (recorded).")
@click.option(
    "--resend",
    multiple=True,
    metavar="OP",
    help="Send again an operation its owner rejected — its operation id or step id — as its next"
    " attempt, under a key derived from it (repeatable). Applied and uncertain operations are"
    " never sent again.",
)
@click.option(
    "--step", metavar="STEP", help="The failed step to run again (default: the one the run failed at)."
)
@click.option(
    "--revision",
    type=int,
    help="The state_revision you looked at: refused if the run moved since (default: now).",
)
@store_option
@click.pass_context
def retry(
    ctx: click.Context,
    run_id: str,
    by: str,
    reason: str | None,
    resend: tuple[str, ...],
    step: str | None,
    revision: int | None,
) -> None:
    """Carry a failed run on from its failed step, keeping what it did.

    The failed step's record moves into the run's history and the run becomes pending: a
    worker takes it (or `safepoint resume RUN`). Everything recorded before it replays, the
    step runs again. A run whose workflow itself raised (a bug since fixed and deployed) is
    retried the same way, with no step moved. Nothing that was applied, and nothing whose
    outcome is uncertain, is sent again; an operation its owner rejected only with --resend.
    """
    store = open_cli_store(ctx)
    done: Retried = drive(
        store, retry_flow(store.identity, run_id, by, reason, names(resend), step, revision)
    )
    for line in retried_lines(done):
        click.echo(shown(line))


def retried_lines(done: Retried) -> list[str]:
    """What a retry did, for a person: the run as it now stands, the failed records moved into
    the history, the operations sent again and under which key, and the rejections kept."""
    run, retry = done.run, done.retry
    lines = [
        f"run {run.run_id!r} retried: now {run.status.value}, revision {run.state_revision}"
        f" (a worker takes it, or: safepoint resume {run.run_id})"
    ]
    recorded = {step.step_id: step for step in done.moved}
    for step_id in retry.moved:
        step = recorded.get(step_id)
        error = (step.error or {}) if step is not None else {}
        what = f"failed with {error.get('type')}: {error.get('message')}" if error else "its failed attempts"
        lines.append(f"moved into the history: step {step_id!r} ({what}); it runs again")
    if not retry.moved:
        lines.append(f"no step moved: {_why_none(done)}")
    for again in retry.resend:
        lines.append(
            f"will be sent again: operation {again.operation_id!r} (step {again.step_id!r}),"
            f" attempt {again.key_attempt}, under effect key {again.effect_key}"
        )
    for op in done.kept_rejected:
        lines.append(
            f"kept rejected, not sent again: operation {op.operation_id!r} (step {op.step_id!r})"
            " — the run meets its rejection again; name it with --resend to send it again"
        )
    lines.append("every effect that was applied, or whose outcome is uncertain, is kept: none is sent again")
    return lines


def _why_none(done: Retried) -> str:
    """Why a retry moved no step: where the run had failed, if not at a step."""
    error = done.failed_with or {}
    if error.get("type") == "EffectRejected":
        return (
            f"the run failed at operation {error.get('operation_id')!r}, which its owner rejected"
            " (a rejection is no failed step)"
        )
    return (
        f"the workflow itself raised ({error.get('type')}: {error.get('message')}); it runs again"
        " as the code now deployed says"
    )


# -- send -------------------------------------------------------------------------------------------


_PAYLOAD = click.option(
    "--payload",
    metavar="JSON",
    required=True,
    help="The message: a JSON value (a person's answer, a webhook's body).",
)
_MESSAGE_ID = click.option(
    "--message-id",
    metavar="ID",
    help="The sender's id for it: sent again under this id, it is the same message (kept once).",
)


@click.command()
@run_argument
@click.argument("name")
@_PAYLOAD
@_MESSAGE_ID
@click.option("--by", help="Who sends it (recorded).")
@store_option
@click.pass_context
def send(
    ctx: click.Context, run_id: str, name: str, payload: str, message_id: str | None, by: str | None
) -> None:
    """Send RUN a message NAME, for the run.wait_for(NAME) of its workflow: a mailbox message.

    The message is kept whether the run waits yet or not, and queues: a wait takes the oldest
    message of its name not yet taken, so a second one waits for the next wait (sent twice
    without --message-id, it is two messages). To answer the one wait RUN is parked at, once,
    use `safepoint answer`. A run waiting for it becomes runnable at once: a worker takes it, or
    resume it. A payload that is not JSON, or holds a credential, is refused; so is a message to
    a run that has ended. A run that continued as new passes the message on to the run that
    carries its chain on.
    """
    store = open_cli_store(ctx)
    message = send_message(store, run_id, name, _json(payload), message_id=message_id, by=by)
    _print_kept(store, run_id, message, "sent to")


@click.command()
@run_argument
@click.argument("name")
@_PAYLOAD
@click.option(
    "--wait",
    metavar="STEP",
    help="The wait step it answers, as `safepoint show RUN` names it (NAME#2 for the second wait"
    " of NAME, …).  [default: NAME, the first wait of NAME]",
)
@_MESSAGE_ID
@click.option("--by", help="Who answers (recorded).")
@store_option
@click.pass_context
def answer(
    ctx: click.Context,
    run_id: str,
    name: str,
    payload: str,
    wait: str | None,
    message_id: str | None,
    by: str | None,
) -> None:
    """Answer one wait of RUN, for its run.wait_for(NAME): kept once, for that wait alone.

    That wait takes the answer before any message queued with `safepoint send`, and no other
    wait does; a run parked at it becomes runnable at once. A wait takes one answer: an answer
    to a wait that has one already, took a message or timed out is refused with exit code 5,
    naming who answered it and when, and nothing is kept — so two people answering, or a
    delivery retried without --message-id, release the wait once. To answer the next wait of
    NAME, name it with --wait.
    """
    store = open_cli_store(ctx)
    kept = answer_wait(store, run_id, name, _json(payload), wait=wait, message_id=message_id, by=by)
    _print_kept(store, run_id, kept, "answered")


def _json(payload: str) -> JSON:
    try:
        parsed: JSON = decode_json(payload)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from None
    return parsed


def _print_kept(store: Store, run_id: str, message: MessageRecord, did: str) -> None:
    """What ``send`` and ``answer`` kept, and where the run stands now."""
    run, now = store.get_run(message.run_id), store.now()
    chain = f" (its chain goes on in {message.run_id!r})" if message.run_id != run_id else ""
    if run.status is RunStatus.WAITING:
        state = f"it still waits, for {waiting_summary(run.waiting_for, now)}"
    elif run.status is RunStatus.PENDING:
        state = "it is runnable: a worker takes it, or resume it"
    else:
        which = f"wait {message.for_wait}" if message.for_wait else "a wait of it"
        state = f"it is {run.status.value}; {which} takes the message when it gets there"
    click.echo(shown(f"{did} run {run_id!r}{chain}: {message_line(message, now)}"))
    click.echo(shown(state))


COMMANDS: tuple[click.Command, ...] = (
    limits,
    fork,
    retry,
    send,
    answer,
)
