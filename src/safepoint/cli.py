"""The ``safepoint`` command: list runs, read a run's ledger, resume it, print its recovery record.

Every command opens the store named by ``--store`` (default ``$SAFEPOINT_URL``, else
``safepoint.db`` in the working directory). An error safepoint raises on purpose is printed as one
line, ``error: <message>``, with exit code 1 — its message already says what to do, so a
traceback would only bury it. ``resume`` exits 3 when the run is blocked and 4 when it waits for
an approval, so a script can tell "a person must decide" from "something is broken".

The renderers (``timeline_table``, ``events_table``, ``print_table``) are shared with the demo.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from ._approvals import approve as approve_step
from ._approvals import at as utc_instant
from ._approvals import revocable
from ._approvals import revoke_approval as revoke_step
from ._recovery import resolve as resolve_run_decision
from ._worker import Worker
from ._workflow import cancel as cancel_run
from ._workflow import resume as resume_run
from .dashboard import DEFAULT_PORT, Dashboard
from .errors import AwaitingApproval, LostOwnership, RunBlocked, SafepointError
from .storage import open_store
from .storage.base import Store
from .types import (
    ApprovalRecord,
    EffectState,
    EventRecord,
    Ledger,
    RunRecord,
    RunStatus,
    StepKind,
    StepStatus,
    UnreadableRun,
)

EXIT_ERROR = 1
EXIT_BLOCKED = 3
EXIT_WAITING = 4

_PREVIEW_WIDTH = 48
_UNBOUNDED_WIDTH = 10_000

RUN_STYLES: dict[RunStatus, str] = {
    RunStatus.PENDING: "blue",
    RunStatus.RUNNING: "cyan",
    RunStatus.COMPLETED: "green",
    RunStatus.FAILED: "red",
    RunStatus.BLOCKED: "bold red",
    RunStatus.CANCELLED: "dim",
    RunStatus.WAITING: "bold magenta",  # a person's approval is awaited
    RunStatus.CONTINUED: "green dim",
}

EFFECT_STYLES: dict[EffectState, str] = {
    EffectState.PREPARED: "blue",
    EffectState.DISPATCHING: "bold yellow",  # "may have happened": the state to notice
    EffectState.APPLIED: "yellow",
    EffectState.REJECTED: "red",
    EffectState.UNKNOWN: "bold red",
    EffectState.ACCEPTED: "green",
}


# -- rendering -----------------------------------------------------------------------------------


def preview(value: Any, width: int = _PREVIEW_WIDTH) -> str:
    """A value as compact one-line JSON, cut to ``width`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def clock(ms: int, *, millis: bool = False) -> str:
    """Epoch milliseconds as local wall-clock time."""
    moment = datetime.fromtimestamp(ms / 1000).astimezone()
    if millis:
        return moment.strftime("%H:%M:%S.%f")[:-3]
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def ago(ms: int, now_ms: int) -> str:
    """How long before ``now_ms`` the moment ``ms`` was, as a person would say it."""
    seconds = max(0, (now_ms - ms) // 1000)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            if unit == "d" and seconds >= 7 * 86_400:
                return clock(ms)[:10]
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def print_table(console: Console, table: Table) -> None:
    """Print a table one line per row.

    On a terminal the table fits the window: the columns marked squeezable are cut with … first.
    Into a pipe or a file it keeps its natural width instead, so that `safepoint show RUN | grep`
    finds whole effect keys and step ids rather than fragments.
    """
    if console.is_terminal:
        console.print(table)
        return
    unbounded = console.options.update_width(_UNBOUNDED_WIDTH)
    needed = console.measure(table, options=unbounded).maximum
    # Console.print(width=) can only narrow the output, so widen the console for this table.
    saved = console.width
    console.width = max(saved, needed)
    try:
        console.print(table)
    finally:
        console.width = saved


def _table(*columns: str, squeeze: tuple[str, ...] = ()) -> Table:
    """A borderless table; only the ``squeeze`` columns give up width on a narrow terminal."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in columns:
        # rich narrows only wrappable columns before cutting every column evenly; cells are
        # never wrapped anyway (see _row), so "wrappable" here just means "may be narrowed".
        table.add_column(name, no_wrap=name not in squeeze, overflow="ellipsis")
    return table


def _row(table: Table, *cells: str | Text) -> None:
    """Add a row whose cells never wrap: one line per row, cut with … when squeezed."""
    texts = []
    for cell in cells:
        text = Text(cell) if isinstance(cell, str) else cell.copy()
        text.no_wrap, text.overflow = True, "ellipsis"
        texts.append(text)
    table.add_row(*texts)


def timeline_table(ledger: Ledger) -> Table:
    """One row per recorded step in ``seq`` order, then every operation still in flight.

    An effect's step row is written only when the effect is accepted, so an operation that is
    prepared, dispatching, unknown, applied or rejected has no step yet: it is listed after the
    steps, because that is exactly what a person resolving a blocked run needs to see.
    """
    table = _table("#", "kind", "step", "result", "operation", "effect", "effect key",
                   squeeze=("result", "effect key"))
    shown: set[str] = set()
    for step in sorted(ledger.steps.values(), key=lambda s: s.seq):
        operation = effect = key = Text("")
        if step.kind is StepKind.EFFECT and step.operation_id:
            shown.add(step.operation_id)
            op = ledger.operations.get(step.operation_id)
            operation = Text(step.operation_id)
            if op is not None:
                effect = Text(op.state.value, style=EFFECT_STYLES[op.state])
                key = Text(op.effect_key, style="dim")
        result: str | Text = preview(step.result)
        if step.status is StepStatus.FAILED:
            # A failed step is recorded and raised again on replay: show why, not a null result.
            error = step.error or {}
            result = Text(f"✗ {error.get('type', 'error')}: {error.get('message', '')}",
                          style="red")
        elif step.kind is StepKind.DECISION and step.next_step_id:
            result = f"→ {step.next_step_id}"
        _row(table, str(step.seq), step.kind.value, step.step_id, result, operation, effect, key)
    for op in sorted(ledger.operations.values(), key=lambda o: o.prepared_at):
        if op.operation_id in shown:
            continue
        evidence = op.error if op.state is EffectState.REJECTED else "(no outcome recorded)"
        if op.state is EffectState.PREPARED and op.approval_required and op.dispatch_count == 0:
            evidence = "(not dispatched: needs approval)"
        _row(table, "…", StepKind.EFFECT.value, op.step_id, preview(evidence),
             op.operation_id, Text(op.state.value, style=EFFECT_STYLES[op.state]),
             Text(op.effect_key, style="dim"))
    _retry_rows(table, ledger)
    return table


def _retry_rows(table: Table, ledger: Ledger) -> None:
    """A step waiting to be tried again has no step row yet: show its last failed attempt."""
    for step_id, tried in sorted(ledger.attempts.items()):
        last, step = tried[-1], ledger.steps.get(step_id)
        if step is not None and step.attempt > last.attempt:
            continue  # it was recorded after this attempt: its row above says how it ended
        error = last.error
        _row(table, "…", last.kind.value, step_id,
             Text(f"⟳ attempt {last.attempt} failed ({error.get('type', 'error')}:"
                  f" {error.get('message', '')}); next at {clock(last.retry_at, millis=True)}",
                  style="yellow"), "", "", "")


def events_table(events: Iterable[EventRecord]) -> Table:
    """What happened to a run, when, by which worker under which fence."""
    table = _table("at", "event", "step", "operation", "worker", "fence", "detail",
                   squeeze=("worker", "detail"))
    for event in events:
        _row(table, clock(event.at, millis=True), event.kind, event.step_id or "",
             event.operation_id or "", event.worker or "",
             "" if event.fence is None else str(event.fence),
             "" if event.detail is None else preview(event.detail))
    return table


def _header(run: RunRecord) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("run", run.run_id)
    grid.add_row("status", Text(run.status.value, style=RUN_STYLES[run.status]))
    grid.add_row("workflow", f"{run.workflow}@{run.workflow_version}")
    grid.add_row("inputs", preview(run.inputs, 200))
    if run.status is RunStatus.COMPLETED:
        grid.add_row("result", preview(run.result, 200))
    if run.error:
        grid.add_row("error", Text(f"{run.error.get('type', 'error')}:"
                                   f" {run.error.get('message', '')}", style="red"))
    if run.parent_run_id:
        grid.add_row("continues", f"{run.parent_run_id} (run {run.chain_index + 1} of chain"
                                  f" {run.chain_id})")
    if run.successor_run_id:
        grid.add_row("continued as", run.successor_run_id)
    grid.add_row("history", _history(run))
    grid.add_row("resumes", str(run.resume_count) + (f" of {run.resume_budget}"
                                                     if run.resume_budget is not None else ""))
    _limit_rows(grid, run)
    grid.add_row("fence", str(run.fence))
    grid.add_row("revision", str(run.state_revision))
    grid.add_row("created", clock(run.created_at))
    grid.add_row("updated", clock(run.updated_at))
    return grid


def _limit_rows(grid: Table, run: RunRecord) -> None:
    """The run's own limits, with what it spent against each."""
    if run.deadline_at is not None:
        grid.add_row("deadline", clock(run.deadline_at))
    if run.token_budget is not None or run.tokens_spent:
        limit = "" if run.token_budget is None else f" of {run.token_budget}"
        grid.add_row("tokens", f"{run.tokens_spent}{limit} spent")
    if run.cost_budget is not None or run.cost_spent:
        limit = "" if run.cost_budget is None else f" of {run.cost_budget:g}"
        grid.add_row("cost", f"{run.cost_spent:g}{limit} spent")
    if run.step_attempts is not None:
        grid.add_row("step attempts", str(run.step_attempts.attempts))
def _history(run: RunRecord) -> Text:
    """``812 of 50000 (soft 10000)``: the run's events and steps against its limits."""
    text = Text(f"{run.history_size} events and steps")
    limits = [f"{name} {value}" for name, value in (("soft", run.history_soft_limit),
                                                     ("hard", run.history_hard_limit))
              if value is not None]
    text.append(f" (limits: {', '.join(limits)})" if limits else " (no limit)")
    if run.history_warned_at is not None:
        text.append(" past the soft limit: continue it as new", style="yellow")
    return text


def _print_blocked(console: Console, run: RunRecord) -> None:
    record = run.recovery_record or {}
    console.rule(Text(f"blocked: {record.get('phase', '?')}", style="bold red"), align="left")
    # Prose is soft-wrapped (never split into new lines) so it reads whole in a pipe too.
    console.print(Text(str(record.get("reason", "no reason recorded")), style="bold"),
                  soft_wrap=True)
    if record.get("operation_id"):
        console.print(f"operation {record['operation_id']} ({record.get('effect')},"
                      f" {record.get('effect_status')}) effect key {record.get('effect_key')}",
                      soft_wrap=True, highlight=False)
    console.print("next actions:", style="bold")
    for action in record.get("next_actions", []):
        console.print(f"  • {_filled_in(action, run.run_id, record)}", soft_wrap=True,
                      highlight=False)
    console.print(f"full recovery record: safepoint record {run.run_id}", highlight=False)


def _filled_in(action: str, run_id: str, record: dict[str, Any]) -> str:
    """A next action as a command to copy: this run's id and the revision the block made."""
    action = action.replace("safepoint resolve RUN ", f"safepoint resolve {shlex.quote(run_id)} ")
    revision = record.get("state_revision")
    return action if revision is None else action.replace("<state_revision>", str(revision))
def _print_waiting(console: Console, store: Store, run: RunRecord) -> None:
    """What a waiting run waits for: the exact payload a person is asked to approve, its
    digest, the approvals given so far, and the command that approves it."""
    waiting = run.waiting_for or {}
    console.rule(Text("waiting for approval", style="bold magenta"), align="left")
    console.print(Text(str(waiting.get("reason", "")), style="bold"), soft_wrap=True)
    step = str(waiting.get("step_id"))
    console.print(f"step {step}, operation {waiting.get('operation_id')}"
                  f" ({waiting.get('effect')})", soft_wrap=True, highlight=False)
    digest = str(waiting.get("payload_digest"))
    console.print(f"payload {digest}:", highlight=False)
    try:
        payload = json.loads(store.get_artifact(digest))
        console.print(json.dumps(payload, indent=2, ensure_ascii=False), soft_wrap=True,
                      highlight=False, markup=False)
    except SafepointError as exc:  # the person must see it: say plainly that it is missing
        console.print(Text(f"(the payload cannot be read: {exc.message})", style="red"),
                      soft_wrap=True)
    target = waiting.get("target_digest")
    console.print(f"target state {target or '(the effect reads none)'}", highlight=False)
    console.print("approve it:", style="bold")
    console.print(f"  safepoint approve {run.run_id} {step} --by <you> --payload-digest"
                  f" {digest} [--expires 2h] [--evidence '<why>']", soft_wrap=True,
                  highlight=False, markup=False)
    console.print("  then a worker carries it on, or: safepoint resume"
                  f" {run.run_id} --import <module>", soft_wrap=True, highlight=False,
                  markup=False)


def approval_line(approval: ApprovalRecord) -> str:
    """One approval as `safepoint show` lists it: who, when, what for — and a revocation."""
    expiry = ("no expiry" if approval.expires_at is None
              else f"expires {utc_instant(approval.expires_at)}")
    line = (f"step {approval.step_id}: approved by {approval.approved_by} at"
            f" {utc_instant(approval.approved_at)}, {expiry}, for payload"
            f" {approval.payload_digest[:19]}… target {(approval.target_digest or 'none')[:19]}")
    if approval.revoked_at is not None:
        line += (f" — REVOKED by {approval.revoked_by} at {utc_instant(approval.revoked_at)}:"
                 f" {approval.revoke_reason}")
    return line


def _print_approvals(console: Console, store: Store, ledger: Ledger) -> None:
    """Every approval given in the run, revoked ones marked, and how to take back one still
    in force of an effect not yet dispatched."""
    given = store.approvals(ledger.run.run_id)
    if not given:
        return
    console.print()
    console.rule("approvals", align="left")
    for approval in given:
        console.print(f"  {approval_line(approval)}", soft_wrap=True, highlight=False,
                      markup=False)
    for step in revocable(ledger.run, ledger.operations, given):
        console.print(f"  take it back: safepoint revoke"
                      f" {shlex.quote(ledger.run.run_id)} {shlex.quote(step)} --by <you>"
                      " --reason '<why>'", soft_wrap=True, highlight=False, markup=False)


def print_run(console: Console, store: Store, run_id: str) -> None:
    """The run header, its step timeline and its events: the body of `safepoint show`."""
    ledger = store.load_ledger(run_id)
    console.print(_header(ledger.run))
    if ledger.run.status is RunStatus.BLOCKED:
        console.print()
        _print_blocked(console, ledger.run)
    if ledger.run.status is RunStatus.WAITING:
        console.print()
        _print_waiting(console, store, ledger.run)
    _print_approvals(console, store, ledger)
    console.print()
    console.rule("steps", align="left")
    print_table(console, timeline_table(ledger))
    console.print()
    console.rule("events", align="left")
    print_table(console, events_table(store.events(run_id)))


# -- commands ------------------------------------------------------------------------------------


class _SafepointGroup(click.Group):
    """Prints safepoint's own errors as one line on stderr instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SafepointError as exc:
            _fail(ctx, exc.message)
        except LostOwnership as exc:  # a BaseException: another worker took the run over
            _fail(ctx, str(exc))


def _fail(ctx: click.Context, message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    ctx.exit(EXIT_ERROR)


def _store(ctx: click.Context) -> Store:
    """The store named by --store, opened (and so migrated) once, closed with the command."""
    store = open_store(ctx.obj)
    ctx.call_on_close(store.close)
    return store


def _stdout() -> Console:
    # Built per command, not at import: the stream may be swapped (tests, redirection).
    return Console(highlight=False)


@click.group(cls=_SafepointGroup)
@click.option("--store", "store_url", envvar="SAFEPOINT_URL", show_envvar=True,
              metavar="URL",
              help="The ledger: sqlite:///file.db or a file path."
                   "  [default: safepoint.db in the working directory]")
@click.version_option(__version__, prog_name="safepoint")
@click.pass_context
def cli(ctx: click.Context, store_url: str | None) -> None:
    """safepoint: a ledger for agent runs; resume after any crash without repeating effects."""
    ctx.obj = store_url


@cli.command()
@click.option("--status", type=click.Choice([s.value for s in RunStatus]),
              help="Only runs with this status.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True,
              help="At most this many runs, most recently changed first.")
@click.pass_context
def runs(ctx: click.Context, status: str | None, limit: int) -> None:
    """List runs, most recently changed first.

    Columns: run id, workflow@version, status, resume count, fence, when it last changed, and
    for a blocked run the phase of its recovery record (for a waiting run: the step whose
    approval it waits for; for a continued run: its successor).
    """
    store = _store(ctx)
    found = store.list_runs(RunStatus(status) if status else None, limit)
    console = _stdout()
    if not found:
        console.print(f"no {status + ' ' if status else ''}runs in {store.url}")
        return
    now = store.now()
    table = _table("run", "workflow", "status", "resumes", "fence", "updated", "phase",
                   squeeze=("workflow", "phase"))
    for run in found:
        if isinstance(run, UnreadableRun):
            _unreadable_row(table, run, now)
            continue
        phase = Text("")
        if run.status is RunStatus.BLOCKED:
            phase = Text(str((run.recovery_record or {}).get("phase", "")), style="red")
        elif run.status is RunStatus.WAITING:
            phase = Text(f"approval of {(run.waiting_for or {}).get('step_id')}",
                         style="magenta")
        elif run.successor_run_id:
            phase = Text(f"→ {run.successor_run_id}")
        _row(table, run.run_id, f"{run.workflow}@{run.workflow_version}",
             Text(run.status.value, style=RUN_STYLES[run.status]), str(run.resume_count),
             str(run.fence), ago(run.updated_at, now), phase)
    print_table(console, table)


def _unreadable_row(table: Table, run: UnreadableRun, now: int) -> None:
    """A run whose row cannot be read: what could, and why the rest cannot (its status, when
    that can be read, leads the reason)."""
    known = "" if run.status is None else f"{run.status.value}: "
    _row(table, run.run_id, f"{run.workflow or '?'}@{run.workflow_version or '?'}",
         Text("unreadable", style="bold red"),
         *("?" if value is None else str(value) for value in (run.resume_count, run.fence)),
         "?" if run.updated_at is None else ago(run.updated_at, now),
         Text(known + run.reason, style="red"))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.pass_context
def show(ctx: click.Context, run_id: str) -> None:
    """Show a run's header, step timeline and events.

    Steps are listed in the order they were recorded; effect steps carry their operation id,
    effect state and effect key (the idempotency key to look up at the effect's owner).
    A blocked run shows its recovery record's reason and next actions first.
    """
    print_run(_stdout(), _store(ctx), run_id)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--import", "modules", multiple=True, metavar="MODULE",
              help="Import MODULE first so its @workflow registrations exist (repeatable).")
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
        click.echo(f"run {run_id!r} is blocked: {exc.message}", err=True)
        click.echo(f"see `safepoint record {run_id}`", err=True)
        ctx.exit(EXIT_BLOCKED)
    except AwaitingApproval as exc:
        click.echo(exc.message, err=True)
        ctx.exit(EXIT_WAITING)
    click.echo(json.dumps(result, indent=2, ensure_ascii=False))


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
            raise click.BadParameter(f"no module named {name!r} (run from the project"
                                     " directory or set PYTHONPATH)",
                                     param_hint="--import") from exc


@cli.command()
@click.option("--import", "modules", multiple=True, required=True, metavar="MODULE",
              help="Import MODULE so its @workflow registrations exist (repeatable).")
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs executed at once by this process.")
@click.option("--lease", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds a claim holds without a heartbeat before others may take over.")
@click.option("--until-idle", is_flag=True, help="Exit once nothing is runnable.")
@click.pass_context
def worker(ctx: click.Context, modules: tuple[str, ...], concurrency: int, lease: float,
           until_idle: bool) -> None:
    """Claim and execute runnable runs until stopped.

    Runnable: submitted runs, and runs whose worker's lease expired (it died). Start one per
    machine against one store; SIGTERM drains (finishes the runs in progress, claims no more).
    """
    _import_modules(modules)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store = _store(ctx)
    found = Worker(store, concurrency=concurrency, lease_ms=int(lease * 1000))
    click.echo(f"worker {found.owner} on {store.url}, concurrency {concurrency}", err=True)
    stats = found.run(until_idle=until_idle)
    click.echo(f"worker stopped: claimed {stats.claimed}, completed {stats.completed},"
               f" blocked {stats.blocked}, waiting {stats.waiting}, failed {stats.failed},"
               f" lost {stats.lost}", err=True)


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.pass_context
def record(ctx: click.Context, run_id: str) -> None:
    """Print a blocked run's recovery record as JSON.

    Exit code 1 (with a note on stderr) when RUN is not blocked.
    """
    run = _store(ctx).find_run(run_id)
    if isinstance(run, UnreadableRun) and run.recovery_record is None:
        _fail(ctx, f"run {run_id!r} cannot be read: {run.reason}")
    if isinstance(run, RunRecord) and run.status is RunStatus.WAITING:
        _fail(ctx, f"run {run_id!r} is not blocked: it waits for approval of step"
                   f" {(run.waiting_for or {}).get('step_id')!r}; see `safepoint show {run_id}`")
    if run.status is not RunStatus.BLOCKED or run.recovery_record is None:
        status = run.status.value if run.status else "unreadable"
        _fail(ctx, f"run {run_id!r} is not blocked (status: {status});"
                   " only a blocked run has a recovery record")
    click.echo(json.dumps(run.recovery_record, indent=2, ensure_ascii=False))


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--applied", "action", flag_value="applied",
              help="The operation happened: give its receipt with --receipt.")
@click.option("--not-applied", "action", flag_value="not_applied",
              help="It did not happen: dispatch it again, under the same key.")
@click.option("--abandon", "action", flag_value="abandon", help="Give the run up (cancelled).")
@click.option("--revision", type=int, required=True,
              help="The state_revision of the recovery record you decided on.")
@click.option("--by", required=True, help="Who decides (recorded).")
@click.option("--receipt", metavar="JSON", help="With --applied: the object the owner holds.")
@click.option("--evidence", help="Why this is known: a link, a ticket, a sentence (recorded).")
@click.option("--operation", "operation_id", metavar="OP",
              help="The operation (default: the one the recovery record names).")
@click.pass_context
def resolve(ctx: click.Context, run_id: str, action: str | None, revision: int, by: str,
            receipt: str | None, evidence: str | None, operation_id: str | None) -> None:
    """Settle a blocked run: --applied, --not-applied or --abandon.

    The decision is checked against --revision (a run that moved since is refused), recorded in
    the run's history with --by and --evidence, and harmless to repeat. An applied or
    not-applied run is released: resume it, or let a worker take it.
    """
    if action is None:
        _fail(ctx, "say what happened: --applied, --not-applied or --abandon")
    try:
        parsed = json.loads(receipt) if receipt is not None else None
    except ValueError as exc:
        _fail(ctx, f"--receipt is not JSON: {exc}")
    run = resolve_run_decision(_store(ctx), run_id, action, revision=revision, by=by,
                               operation_id=operation_id, receipt=parsed, evidence=evidence)
    click.echo(f"run {run_id!r} resolved ({action}): now {run.status.value},"
               f" revision {run.state_revision}")


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
        raise click.BadParameter(f"{text!r} is neither a duration (90s, 15m, 2h, 1d, 1h30m)"
                                 " nor an ISO 8601 instant with a time zone",
                                 param_hint="--expires")
    return moment


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("step_id", metavar="STEP")
@click.option("--by", required=True, help="Who approves (recorded).")
@click.option("--expires", metavar="WHEN",
              help="How long the approval holds (90s, 15m, 2h, 1d) or until when (ISO 8601"
                   " with a time zone).  [default: no expiry]")
@click.option("--evidence", help="Why: a ticket, a link, a sentence (recorded).")
@click.option("--payload-digest", metavar="DIGEST",
              help="Approve only if the effect still carries this payload (as `safepoint show"
                   " RUN` prints it).")
@click.pass_context
def approve(ctx: click.Context, run_id: str, step_id: str, by: str, expires: str | None,
            evidence: str | None, payload_digest: str | None) -> None:
    """Approve the effect STEP of RUN prepared, so that it may be dispatched.

    The approval is bound to the payload it carries and to the state its target was seen in
    when the run started waiting; a change of either, or the expiry, withdraws it. A run
    waiting for it becomes runnable again: a worker takes it, or resume it.
    """
    store = _store(ctx)
    approval = approve_step(store, run_id, step_id, by=by, evidence=evidence,
                            expires=parse_expiry(expires) if expires else None,
                            payload_digest=payload_digest)
    expiry = ("no expiry" if approval.expires_at is None
              else f"until {utc_instant(approval.expires_at)}")
    click.echo(f"approved {approval.operation_id!r} (step {approval.step_id!r}) of run"
               f" {run_id!r} by {approval.approved_by}, {expiry}: payload"
               f" {approval.payload_digest}; run now {store.get_run(run_id).status.value}")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.argument("step_id", metavar="STEP")
@click.option("--by", required=True, help="Who revokes (recorded).")
@click.option("--reason", required=True, help="Why (recorded, shown with the run).")
@click.pass_context
def revoke(ctx: click.Context, run_id: str, step_id: str, by: str, reason: str) -> None:
    """Take back the approval of the effect STEP of RUN prepared, while its outcome is open.

    Every approval of it still in force is revoked: the run dispatches the effect no more (a
    dispatch already made is reconciled, never recalled), and waits again at its gate until
    someone approves it anew. Refused once the effect's outcome is recorded.
    """
    store = _store(ctx)
    revoked = revoke_step(store, run_id, step_id, by=by, reason=reason)
    of = revoked[0]
    given = ", ".join(a.approved_by for a in revoked)
    click.echo(f"revoked {len(revoked)} approval(s) of {of.operation_id!r} (step"
               f" {of.step_id!r}) of run {run_id!r}, given by {given}; it is not dispatched"
               f" unless approved anew (run now {store.get_run(of.run_id).status.value})")


@cli.command()
@click.argument("run_id", metavar="RUN")
@click.option("--by", required=True, help="Who cancels (recorded).")
@click.option("--reason", help="Why (recorded).")
@click.pass_context
def cancel(ctx: click.Context, run_id: str, by: str, reason: str | None) -> None:
    """Cancel a run, for good.

    A pending, waiting or blocked run ends at once; a running one stops before its next step or
    dispatch (an effect in flight is settled first). No resume revives a cancelled run. A run
    that continued as new passes the request on to the run that carries its chain on.
    """
    run = cancel_run(_store(ctx), run_id, by=by, reason=reason)
    state = ("cancel requested: its worker stops before its next step or dispatch"
             if run.status is RunStatus.RUNNING else f"now {run.status.value}")
    chain = f" (its chain goes on in {run.run_id!r})" if run.run_id != run_id else ""
    click.echo(f"run {run_id!r}{chain}: {state}")


@cli.command()
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Migrate the store and print its schema version.

    Opening a store applies any pending numbered migration, so this is also what every other
    command does first; run it on its own before a deploy to migrate ahead of the workers.
    """
    store = _store(ctx)  # opening a store migrates it
    version = store.schema_version()
    click.echo(f"schema version {version} ({store.url})")


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="A loopback address: the dashboard never listens on another.")
@click.option("--port", type=click.IntRange(min=0, max=65535), default=DEFAULT_PORT,
              show_default=True, help="0: any free port.")
@click.option("--token", envvar="SAFEPOINT_DASHBOARD_TOKEN", show_envvar=True,
              help="The token every action needs.  [default: a new random one, printed]")
@click.pass_context
def dashboard(ctx: click.Context, host: str, port: int, token: str | None) -> None:
    """Serve the dashboard: runs, ledgers and recovery records in a browser, with forms to
    cancel, resolve, approve and revoke (each needs the token). Loopback only; Ctrl-C stops
    it."""
    board = Dashboard(_store(ctx), host=host, port=port, token=token)
    click.echo(f"safepoint dashboard on {board.url}  (actions need the token: {board.token})")
    try:
        board.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        board.close()


@cli.command()
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the demo's ledger here (default: a temporary directory).")
@click.option("--keep", is_flag=True, help="Keep the temporary directory and print its path.")
@click.pass_context
def demo(ctx: click.Context, workdir: Path | None, keep: bool) -> None:
    """Kill an agent mid-refund, resume it, count the effects.

    Starts a local effect owner, runs a scripted agent over three tickets in a child process,
    SIGKILLs it just after the owner committed a refund (before the ledger heard back), resumes
    it in a fresh process and prints the ledger and the owner's count of effects and duplicates.
    """
    from .demo import run_demo

    ctx.exit(run_demo(workdir=workdir, keep=keep, console=_stdout()))


def main() -> None:
    """Entry point of the `safepoint` console script."""
    cli(prog_name="safepoint")
