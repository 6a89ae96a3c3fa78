"""The ledger's retention: ``safepoint prune`` deletes finished runs whole, in batches.

``cli`` registers every command in ``COMMANDS`` on its group. Built on ``cli_support`` like
every command module; what it prints of the ledger is escaped (``render.shown``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import click

from .._engine.prune import Pruned, prune
from .._rules.moments import instant
from .._rules.retention import PRUNABLE
from ..storage.prune import TABLES
from .cli_support import fail, open_cli_store, parse_duration, parse_when, store_option
from .render import shown

_LISTED = 20  # kept chains named one by one; the rest are counted


@click.command("prune")
@click.option(
    "--older-than",
    metavar="DURATION",
    help="Prune chains whose last run finished at least this long ago (30d, 12h, 90m).",
)
@click.option(
    "--before",
    metavar="WHEN",
    help="Or: that finished before this instant (ISO 8601 with a time zone).",
)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(sorted(status.value for status in PRUNABLE)),
    help="Only runs that ended so (repeat it; default: completed, failed and cancelled).",
)
@click.option("--workflow", metavar="NAME", help="Only the runs of this workflow.")
@click.option("--dry-run", is_flag=True, help="Delete nothing; print what would go and the counts.")
@click.option(
    "--force",
    is_flag=True,
    help="Also delete operations whose owner may still remember their key (inside the effect's"
    " dedup_retention, or an effect that declares none). Safe only if the pruned run ids are"
    " never used again before those windows pass.",
)
@click.option("--batch", type=int, default=200, show_default=True, metavar="N", help="Runs per transaction.")
@store_option
@click.pass_context
def prune_command(
    ctx: click.Context,
    older_than: str | None,
    before: str | None,
    statuses: tuple[str, ...],
    workflow: str | None,
    dry_run: bool,
    force: bool,
    batch: int,
) -> None:
    """Delete finished runs whole: their steps, events, attempts, approvals, messages,
    operations, and the artifacts nothing else references.

    A continue-as-new chain goes whole once its last run finished; a run that may still run
    again (pending, running, waiting, blocked, stopped) is never touched, nor is a run a fork
    of which stays (the fork goes first). Each batch is one transaction: interrupted at any
    point, every run is either whole or gone, and running prune again finishes the work.
    """
    if (older_than is None) == (before is None):
        fail(ctx, "say which runs are old enough: --older-than DURATION (30d) or --before WHEN")
    cutoff: datetime | timedelta
    if older_than is not None:
        age = parse_duration(older_than)
        if age is None:
            raise click.BadParameter(
                f"{older_than!r} is no duration (30d, 12h, 90m)", param_hint="--older-than"
            )
        cutoff = age
    else:
        moment = parse_when(before or "", "--before")
        if not isinstance(moment, datetime):
            raise click.BadParameter(
                f"{before!r} is a duration: give an instant here, or an age with --older-than",
                param_hint="--before",
            )
        cutoff = moment
    store = open_cli_store(ctx)
    done = prune(
        store,
        finished_before=cutoff,
        statuses=statuses or None,
        force=force,
        dry_run=dry_run,
        batch=batch,
        workflow=workflow,
    )
    for line in summary(done):
        click.echo(line)


def summary(done: Pruned) -> list[str]:
    """What ``safepoint prune`` prints: what went (or would go), the rows, the time, what was
    kept and why."""
    verb = "would prune" if done.dry_run else "pruned"
    lines = [
        f"{verb} {done.runs} run{'s' if done.runs != 1 else ''} finished before"
        f" {instant(done.before)} in {done.seconds:.2f}s ({done.batches} batch"
        f"{'es' if done.batches != 1 else ''})",
        "  rows: " + ", ".join(f"{done.rows.get(table, 0)} {table}" for table in TABLES),
        f"  artifacts: {done.artifacts} ({_size(done.artifact_bytes)})",
    ]
    if done.run_ids:
        named = done.run_ids[:_LISTED]
        more = f" and {done.runs - len(named)} more" if done.runs > len(named) else ""
        lines.append("  runs: " + ", ".join(shown(run_id) for run_id in named) + more)
    if done.kept:
        lines.append(f"kept {len(done.kept)} chain{'s' if len(done.kept) != 1 else ''}:")
        for kept in done.kept[:_LISTED]:
            lines.append(f"  {shown(kept.run_id)}: {shown(kept.reason)}")
        if len(done.kept) > _LISTED:
            lines.append(f"  … and {len(done.kept) - _LISTED} more")
        if done.held_by_retention:
            lines.append(
                f"{done.held_by_retention} of them only because an effect's owner may still remember"
                " a key: --force deletes them (do not reuse their run ids before the owner forgets)"
            )
    return lines


def _size(n: int) -> str:
    """A number of bytes as a person reads it."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.1f} {unit}"


COMMANDS = (prune_command,)
