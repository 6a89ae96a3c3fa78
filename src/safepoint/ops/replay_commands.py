"""Replaying recorded runs under the code imported now: ``safepoint replay`` and
``safepoint check-deploy``.

Both run ``safepoint.testing.replay`` under the workflows ``--import`` registers: every step is
answered from the record, nothing is called, sent or written, and no ledger is created. Each
run gets one line — its id, the workflow that recorded it and the one that replays it, where the
replay reached, what a resume would do and why — and, where the code parts from the record, the
step and what the code asked against what was recorded. ``--json`` prints the reports instead.

Exit codes, for CI: 0 when the code fits every run (``ReplayReport.fits``: no divergence, and
no change of the workflow that would make a resume block or re-plan it; a run blocked or stopped
for its own reasons is reported as it stands); ``EXIT_DIVERGED`` (6) when it does not fit one,
or one could not be replayed; 1 for an error (``error: …``), as every command.

``cli`` registers every command in ``COMMANDS`` on its group. What is printed of the ledger is
escaped (``render.say`` / ``render.shown``; JSON through ``render.as_json``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from .._engine.workflow import registered
from .._rules.ids import check_run_id
from .._rules.replay import Asked, Reached, ReplayReport
from ..testing import DeployCheck, check_deploy, replay, replay_file
from ..testing.replays import TAKEN_OVER
from ..types import RunStatus
from .cli_support import EXIT_DIVERGED, fail, import_modules, open_cli_store, stdout_console, store_option
from .render import as_json, preview, say

_PREFIX = 12  # characters of a hash or digest shown


def _import_option(command: Any) -> Any:
    return click.option(
        "--import",
        "modules",
        multiple=True,
        required=True,
        metavar="MODULE",
        help="Import MODULE so its @workflow registrations — the code to replay under — exist (repeatable).",
    )(command)


def _json_option(command: Any) -> Any:
    return click.option("--json", "as_document", is_flag=True, help="Print the reports as JSON.")(command)


def _run_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(check_run_id(value) for value in values)


@click.command("replay")
@click.argument("run_ids", metavar="[RUN]...", nargs=-1, callback=_run_ids)
@_import_option
@click.option(
    "--file",
    "files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay the run this file holds (written by `safepoint export`; repeatable).",
)
@_json_option
@store_option
@click.pass_context
def replay_command(
    ctx: click.Context,
    run_ids: tuple[str, ...],
    modules: tuple[str, ...],
    files: tuple[Path, ...],
    as_document: bool,
) -> None:
    """Replay recorded runs under the code --import registers, offline: every step answered
    from the record, nothing called, sent or written.

    Prints a line per run: its id, workflow@version as recorded → as replayed, where the replay
    reached (the run's end, where the run is now, or the step where the code diverged), what a
    resume under this code would do (carry on, replan, block, fail, stop) and why; for a
    divergence, what the code asked against what the run recorded (kind, name, step id, input
    hash, operation id, payload digest). Exit code 0 when the code fits every run (no
    divergence, no change that would block or re-plan it), 6 when it does not fit one, 1 on an
    error (a run that does not exist, a workflow no --import registers).
    """
    if not run_ids and not files:
        raise click.UsageError("name a run (RUN) or a run file (--file run.json) to replay", ctx=ctx)
    import_modules(modules)
    reports: list[ReplayReport] = []
    if run_ids:
        store = open_cli_store(ctx)
        reports += [replay(store, run_id) for run_id in run_ids]
    reports += [replay_file(path) for path in files]
    if as_document:
        click.echo(as_json([report_document(report) for report in reports]))
    else:
        console = stdout_console()
        for report in reports:
            for line in report_lines(report):
                say(console, line)
    if not all(carries_on(report) for report in reports):
        ctx.exit(EXIT_DIVERGED)


@click.command("check-deploy")
@_import_option
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([status.value for status in RunStatus]),
    help="Replay the runs with this status (repeatable; default: the runs a deploy takes over —"
    " " + ", ".join(status.value for status in TAKEN_OVER) + ").",
)
@click.option(
    "--workflow", "workflows", multiple=True, metavar="NAME", help="Only this workflow's runs (repeatable)."
)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="At most this many runs of each status, most recently changed first.",
)
@_json_option
@store_option
@click.pass_context
def check_deploy_command(
    ctx: click.Context,
    modules: tuple[str, ...],
    statuses: tuple[str, ...],
    workflows: tuple[str, ...],
    limit: int,
    as_document: bool,
) -> None:
    """Replay every run this code would take over, offline, and say what a deploy does to each.

    Prints a line per run — would it carry on, replan, block, fail or stop, and why (as
    `replay` does) — then a summary. A run whose workflow no --import registers is listed as not
    replayable; a status with --limit runs or more gets a note on stderr (the rest were not
    checked). Exit code 0 only when the code fits every run, 6 otherwise, 1 on an
    error.
    """
    import_modules(modules)
    for name in workflows:
        if registered(name) is None:
            fail(ctx, f"workflow {name!r} is not registered by the imported modules: pass --import MODULE")
    store = open_cli_store(ctx)
    check = check_deploy(
        store,
        statuses=[RunStatus(status) for status in statuses] or TAKEN_OVER,
        workflows=workflows or None,
        limit=limit,
    )
    if as_document:
        click.echo(as_json(deploy_document(check)))
    else:
        console = stdout_console()
        for report in check.reports:
            for line in report_lines(report):
                say(console, line)
        for run_id, why in check.unreplayable.items():
            say(console, run_id, "  not replayable: ", why)
        say(console, check.summary())
    for status, replayed in Counter(report.status for report in check.reports).items():
        if replayed >= limit:  # list_runs stopped at the limit: more runs may be left unchecked
            click.echo(
                f"note: {replayed} {status} runs replayed, the --limit: raise it to check them all", err=True
            )
    if not check.ok:
        ctx.exit(EXIT_DIVERGED)


def carries_on(report: ReplayReport) -> bool:
    """This code fits the run: it replays without a divergence and nothing changed that would
    block or re-plan it (``ReplayReport.fits``); a run blocked or stopped for its own reasons is
    reported as it stands."""
    return report.fits


def report_lines(report: ReplayReport) -> list[str]:
    """What ``replay`` prints of one report: the run's line, then the divergence's lines."""
    resume = report.resume.value
    divergence = report.divergence
    if divergence is not None and divergence.phase:
        resume += f" ({divergence.phase})"
    ran = f"{report.run_id}  {report.recorded_as} → {report.replayed_as}"
    lines = [f"{ran}  {_reached(report)}  {resume}: {report.why}"]
    if divergence is not None:
        if divergence.reason != report.why:
            lines.append(f"  {divergence.kind}: {divergence.reason}")
        if divergence.asked is not None:
            lines.append(f"  asked:    {asked_text(divergence.asked)}")
        if divergence.recorded is not None:
            lines.append(f"  recorded: {asked_text(divergence.recorded)}")
    if report.changes:
        lines.append("  changes: " + "; ".join(report.changes))
    return lines


def _reached(report: ReplayReport) -> str:
    steps = f"{report.replayed}/{report.recorded} steps replayed"
    if report.reached is Reached.DIVERGED:
        divergence = report.divergence
        assert divergence is not None
        at = f" at step {divergence.step_id!r}" if divergence.step_id is not None else ""
        return f"diverged ({divergence.kind}){at} ({steps})"
    if report.reached is Reached.NOW:
        after = f", next: {report.next.described()}" if report.next is not None else ""
        return f"reached now ({steps}{after})"
    if report.error is not None:
        ended = f"raises {report.error.get('type')}: {report.error.get('message')}"
    else:
        ended = f"returns {preview(report.result)}"
    return f"reached the end ({steps}, {ended})"


def asked_text(asked: Asked) -> str:
    """A step as asked or recorded: kind, name, step id, then the input hash, the operation id
    and the payload digest that set it apart."""
    parts = [asked.described()]
    if asked.input_hash:
        parts.append(f"input {_short(asked.input_hash)}")
    if asked.operation_id:
        parts.append(f"operation {asked.operation_id!r}")
    if asked.payload_digest:
        parts.append(f"payload {_short(asked.payload_digest)}")
    return ", ".join(parts)


def _short(digest: str) -> str:
    """A hash's first characters (after its ``sha256:`` label, if it has one)."""
    label, colon, value = digest.rpartition(":")
    return f"{label}{colon}{value[:_PREFIX]}…" if len(value) > _PREFIX else digest


def report_document(report: ReplayReport) -> dict[str, Any]:
    """The JSON of one report: its fields (enums as their values) and ``ok``."""
    return {**asdict(report), "ok": report.ok, "carries_on": carries_on(report)}


def deploy_document(check: DeployCheck) -> dict[str, Any]:
    """The JSON of a deploy check: whether it passes, its summary, the reports, the runs it
    could not replay."""
    return {
        "ok": check.ok,
        "summary": check.summary(),
        "reports": [report_document(report) for report in check.reports],
        "unreplayable": dict(check.unreplayable),
    }


COMMANDS = (replay_command, check_deploy_command)
