"""Retention: ``prune`` and ``prune_async``, one flow for both.

The flow asks the store for batch after batch (``Store.prune_runs``: one transaction each, a
run deleted whole or not at all) until none is left, and adds up what they deleted into a
``Pruned`` summary the operator tools print. A chain kept because a fork of it stayed is looked
at again once a pass has deleted forks: a fork goes first, then its source. What may be deleted
is ``_rules.retention``'s decision; the store re-reads it under its locks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from .._rules.ids import check_id
from .._rules.retention import Kept, batch_size, prune_cutoff, prune_statuses
from ..storage.base import Store
from ..storage.prune import TABLES, PruneRequest
from ..types import RunStatus
from .flow import Flow, adrive, drive, io, require_store

if TYPE_CHECKING:
    from ..storage.base import AsyncStore

# Passes that follow forks back to their sources: as deep as fork ancestry is followed.
_PASSES = 100
# Run ids a summary names (the count is always exact).
_NAMED = 50


@dataclass(frozen=True, slots=True)
class Pruned:
    """What a prune deleted (a dry run: what it would have): how many runs, their first run ids,
    the rows of each table, the artifacts and their bytes; the chains it kept and why (by their
    last run); the cut-off; how many batches (transactions) and how long it took."""

    runs: int = 0
    run_ids: tuple[str, ...] = ()
    rows: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TABLES, 0))
    artifacts: int = 0
    artifact_bytes: int = 0
    kept: tuple[Kept, ...] = ()
    before: int = 0
    batches: int = 0
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def held_by_retention(self) -> int:
        """Chains kept only because an owner may still remember a key (``force`` lets them go)."""
        return sum(1 for kept in self.kept if kept.forced)


def prune(
    store: Store,
    *,
    finished_before: datetime | timedelta | int,
    statuses: Iterable[RunStatus | str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    batch: int = 200,
    workflow: str | None = None,
) -> Pruned:
    """Delete finished runs whole, in batches of ``batch`` runs (one transaction each); return
    what went.

    A run goes with its chain (continue-as-new), once the chain's last run ended at one of
    ``statuses`` (default: completed, failed and cancelled) before ``finished_before`` — an
    aware datetime, epoch milliseconds, or a timedelta (that long before the store's clock):
    its steps, events, attempts, approvals, messages and operations, and the artifacts nothing
    else references. Never a run that is not finished, a chain a fork of which stays (the fork
    looks its source's operations up: it goes first), nor — unless ``force`` — a chain holding
    an operation whose owner may still remember its key (inside its effect's
    ``dedup_retention``, or an effect that declares none): a run reusing that run id would mint
    the same key and get the old outcome (``safepoint._rules.retention``). Safe to interrupt
    at any point: each batch commits whole or not at all. ``dry_run``: delete nothing, and say
    what would go. ``workflow``: only the runs of the workflow of that name.

    >>> prune(store, finished_before=timedelta(days=30))  # doctest: +SKIP
    """
    require_store(store, "prune")
    started = time.monotonic()
    done: Pruned = drive(store, prune_flow(finished_before, statuses, force, dry_run, batch, workflow))
    return _timed(done, started)


async def prune_async(
    store: Store | AsyncStore,
    *,
    finished_before: datetime | timedelta | int,
    statuses: Iterable[RunStatus | str] | None = None,
    force: bool = False,
    dry_run: bool = False,
    batch: int = 200,
    workflow: str | None = None,
) -> Pruned:
    """``prune`` from async code."""
    require_store(store, "prune_async")
    started = time.monotonic()
    done: Pruned = await adrive(store, prune_flow(finished_before, statuses, force, dry_run, batch, workflow))
    return _timed(done, started)


def _timed(done: Pruned, started: float) -> Pruned:
    return replace(done, seconds=time.monotonic() - started)


def prune_flow(
    finished_before: datetime | timedelta | int,
    statuses: Iterable[RunStatus | str] | None,
    force: bool,
    dry_run: bool,
    batch: int,
    workflow: str | None = None,
) -> Flow[Pruned]:
    """``prune`` as a flow: batches until none is left, then passes again while forks went."""
    before, older_than_ms = prune_cutoff(finished_before)
    request = PruneRequest(
        statuses=prune_statuses(statuses),
        before=before,
        older_than_ms=older_than_ms,
        limit=batch_size(batch),
        force=bool(force),
        dry_run=bool(dry_run),
        workflow=None if workflow is None else check_id(workflow, "workflow name"),
    )
    runs: list[str] = []
    count = artifacts = freed = batches = 0
    rows = dict.fromkeys(TABLES, 0)
    kept: dict[str, Kept] = {}
    for _ in range(_PASSES):
        cursor: tuple[int, str] | None = None
        deleted_before = count
        while True:
            done = yield from io(Store.prune_runs, replace(request, after=cursor))
            batches += 1
            if request.before is None:  # the first batch fixed the cut-off: every one uses it
                request = replace(request, before=done.before, older_than_ms=None)
            count += len(done.runs)
            runs.extend(done.runs[: max(0, _NAMED - len(runs))])
            for table, n in done.rows.items():
                rows[table] = rows.get(table, 0) + n
            artifacts, freed = artifacts + done.artifacts, freed + done.artifact_bytes
            for run_id in done.runs:
                kept.pop(run_id, None)
            kept.update((why.run_id, why) for why in done.kept)
            cursor = done.after
            if cursor is None:
                break
        forks_went = count > deleted_before and any(why.fork for why in kept.values())
        if dry_run or not forks_went:
            break
    return Pruned(
        runs=count,
        run_ids=tuple(runs),
        rows=rows,
        artifacts=artifacts,
        artifact_bytes=freed,
        kept=tuple(kept.values()),
        before=request.before or 0,
        batches=batches,
        dry_run=bool(dry_run),
    )
