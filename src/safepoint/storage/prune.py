"""A prune's batch (``Store.prune_runs``), written once as a plan for every store.

One batch is one transaction. It takes the next finished chains in order — the last runs of
their chains (``successor_run_id`` NULL) that ended at one of the statuses asked for before the
cut-off, oldest first, after the batch before (a keyset cursor: ``(updated_at, run_id)``), at
most ``limit`` of them — and, under their runs' locks (SQLite: ``BEGIN IMMEDIATE`` already
excludes every other writer; PostgreSQL: ``FOR UPDATE``, so a retry or a fork of one of them
waits for the batch, and then finds it gone), reads their runs, operations and the forks made
from them again, three statements for the whole batch, and asks
``_rules.retention.chain_kept`` whether each chain goes (one holding a run whose status this
safepoint does not know stays, as a run it cannot read). The chains that go are deleted in that same
transaction, table by table (approvals, messages, attempts, steps, operations, events, runs),
then the artifacts they referenced that no row references any more — and, where a store keeps
a copy of an artifact per run (PostgreSQL), the deleted runs' own copies of those other runs
still reference (each of those runs holds a copy of its own): a pruned run's data goes. A
crash at any point rolls the whole batch back: a run is deleted whole or not at all, and a run
id used again never finds another run's steps.

A dry run does the same work and rolls it back (``DryRun`` carries the batch out of the
transaction), so what it reports is exactly what that batch would have deleted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .._rules.canonical import dumps
from .._rules.retention import ChainRun, Kept, SentKey, chain_kept
from ..types import RunStatus
from .plans import Plan, Queries, Row

# Deleted in this order: what references a row goes before it (approvals reference operations;
# steps, operations, attempts and messages reference runs). Each table's query, by name.
_DELETES = (
    ("approvals", "prune_delete_approvals"),
    ("messages", "prune_delete_messages"),
    ("attempts", "prune_delete_attempts"),
    ("steps", "prune_delete_steps"),
    ("operations", "prune_delete_operations"),
    ("events", "prune_delete_events"),
    ("runs", "prune_delete_runs"),
)
TABLES = tuple(table for table, _ in _DELETES)
# A run's status as stored: one this safepoint does not know keeps its chain (nothing of a run
# it cannot read is deleted).
_STATUSES = {status.value: status for status in RunStatus}


@dataclass(frozen=True, slots=True)
class PruneRequest:
    """One batch of a prune as the store carries it out (``Store.prune_runs``): the chains whose
    last run ended at one of ``statuses`` before ``before`` (epoch ms; or, when None,
    ``older_than_ms`` before the store's clock), from ``after`` on (the cursor the batch before
    returned; None: from the oldest), at most ``limit`` chains (a chain's earlier runs go with
    its last). ``force``: delete operations whose owner may still remember their key.
    ``dry_run``: delete nothing; report what would go. ``workflow``: only that workflow's runs."""

    statuses: frozenset[RunStatus]
    before: int | None = None
    older_than_ms: int | None = None
    limit: int = 200
    after: tuple[int, str] | None = None
    force: bool = False
    dry_run: bool = False
    workflow: str | None = None


@dataclass(frozen=True, slots=True)
class PruneBatch:
    """What one batch deleted (or, in a dry run, would have): the runs, the rows of each table
    (``TABLES``), the artifacts and their bytes; the chains it kept and why; the cut-off as an
    instant; where the next batch starts (None: nothing left to look at)."""

    runs: tuple[str, ...] = ()
    rows: dict[str, int] = field(default_factory=dict)
    artifacts: int = 0
    artifact_bytes: int = 0
    kept: tuple[Kept, ...] = ()
    before: int = 0
    after: tuple[int, str] | None = None


class DryRun(Exception):
    """Raised at the end of a dry run's batch, to roll its transaction back: carries the batch."""

    def __init__(self, batch: PruneBatch) -> None:
        super().__init__("dry run")
        self.batch = batch


def prune_runs_plan(
    q: Queries, prune: PruneRequest, now: int, *, lock_each_run: bool = False
) -> Plan[PruneBatch]:
    """Carry one batch of ``prune`` out (see the module docstring); ``now``: the store's clock;
    ``lock_each_run``: the chains' runs read, then locked one by one, each by its id (a database
    sharded by run locks rows only in a statement about one run)."""
    before = prune.before if prune.before is not None else now - (prune.older_than_ms or 0)
    after_at, after_id = prune.after if prune.after is not None else (-1, "")
    statuses = dumps(sorted(status.value for status in prune.statuses))
    candidates = yield q(
        "prune_candidates",
        statuses=statuses,
        before=before,
        after_at=after_at,
        after_id=after_id,
        limit=prune.limit,
        workflow=prune.workflow,
    )
    keys = [str(row["chain_id"] or row["run_id"]) for row in candidates]
    heads = {key: str(row["run_id"]) for key, row in zip(keys, candidates, strict=True)}
    chains: dict[str, list[ChainRun]] = {key: [] for key in keys}
    chain_of: dict[str, str] = {}
    unreadable: dict[str, Kept] = {}  # chains with a run whose status this safepoint does not know
    for row in (yield from _locked_chains(q, dumps(keys), lock_each_run)):
        key = str(row["chain_id"] or row["run_id"])
        if key not in chains:
            continue
        status = _STATUSES.get(row["status"])
        if status is None:
            unreadable.setdefault(
                key,
                Kept(
                    heads[key],
                    f"run {row['run_id']!r} of its chain has a status this safepoint does not know"
                    f" ({row['status']!r}): look at it with `safepoint show`",
                ),
            )
            continue
        chains[key].append(
            ChainRun(
                run_id=str(row["run_id"]),
                status=status,
                updated_at=int(row["updated_at"]),
                successor_run_id=row["successor_run_id"],
            )
        )
        chain_of[str(row["run_id"])] = key
    ids = dumps(sorted(chain_of))
    forks: dict[str, list[str]] = {key: [] for key in keys}
    for row in (yield q("prune_forks", run_ids=ids)):
        source = chain_of.get(str(row["source"]))
        if source is not None and chain_of.get(str(row["run_id"])) != source:
            forks[source].append(str(row["run_id"]))
    operations: dict[str, list[SentKey]] = {key: [] for key in keys}
    for row in (yield q("prune_operations", run_ids=ids)):
        operations[chain_of[str(row["run_id"])]].append(
            SentKey(
                run_id=str(row["run_id"]),
                operation_id=str(row["operation_id"]),
                effect=str(row["effect"]),
                dispatch_count=int(row["dispatch_count"]),
                first_dispatched_at=row["first_dispatched_at"],
                updated_at=int(row["updated_at"]),
                dedup_retention_ms=row["dedup_retention_ms"],
                last_dispatched_at=row["last_dispatched_at"],
            )
        )
    going: list[str] = []
    kept: list[Kept] = []
    for key in keys:
        why = unreadable.get(key) or chain_kept(
            chains[key],
            operations[key],
            forks[key],
            statuses=prune.statuses,
            before=before,
            now=now,
            force=prune.force,
        )
        if why is None:
            going.extend(run.run_id for run in chains[key])
        else:
            kept.append(why)
    # every candidate was looked at: the next batch starts after the last, unless none is left
    last = candidates[-1] if len(candidates) == prune.limit else None
    cursor = (int(last["updated_at"]), str(last["run_id"])) if last is not None else None
    batch = yield from _delete(q, going, lock_each_run)
    done = PruneBatch(
        runs=tuple(going),
        rows=batch[0],
        artifacts=batch[1],
        artifact_bytes=batch[2],
        kept=tuple(kept),
        before=before,
        after=cursor,
    )
    if prune.dry_run:
        raise DryRun(done)
    return done


def _locked_chains(q: Queries, chain_ids: str, each_run: bool) -> Plan[list[Row]]:
    """Every run of these chains, read again under its row lock (in chain order)."""
    if not each_run:
        return list((yield q("prune_lock_chains", chain_ids=chain_ids)))
    locked: list[Row] = []
    for row in (yield q("prune_chain_runs", chain_ids=chain_ids)):
        locked.extend((yield q("lock_run", run_id=row["run_id"])))
    return locked


def _delete(q: Queries, run_ids: list[str], each_run: bool) -> Plan[tuple[dict[str, int], int, int]]:
    """Delete ``run_ids`` whole, then the artifacts only they referenced: the rows of each table,
    the artifacts and their bytes (``each_run``: the artifacts locked copy by copy, each by its
    run's id)."""
    rows = dict.fromkeys(TABLES, 0)
    if not run_ids:
        return rows, 0, 0
    ids = dumps(run_ids)
    digests = dumps(sorted({str(row["digest"]) for row in (yield q("prune_artifact_refs", run_ids=ids))}))
    families = sorted({str(row["family_id"]) for row in (yield q("prune_families", run_ids=ids))})
    for table, query in _DELETES:
        rows[table] = len((yield q(query, run_ids=ids)))
    # once a family has no run left, nothing can ask for what its claims hold
    left = {str(row["family_id"]) for row in (yield q("prune_families_left", family_ids=dumps(families)))}
    yield q("prune_delete_family_claims", family_ids=dumps([f for f in families if f not in left]))
    if each_run:
        freed = yield from _delete_artifacts_copy_by_copy(q, digests, set(run_ids))
    else:
        yield q("prune_lock_artifacts", digests=digests)
        freed = yield q("prune_delete_artifacts", digests=digests, run_ids=ids)
    return rows, len(freed), sum(int(row["size"]) for row in freed)


def _delete_artifacts_copy_by_copy(q: Queries, digests: str, going: set[str]) -> Plan[list[Row]]:
    """``prune_delete_artifacts``, decided here from statements about one run (or reads by
    digest) for a store that locks rows only in those: every copy locked, then every copy of
    an artifact no row references any more deleted, and the deleted runs' own copies of the
    others that another run holds a copy of."""
    copies = list((yield q("prune_artifact_copies", digests=digests)))
    for copy in copies:
        yield q("prune_lock_artifact", run_id=copy["run_id"], digest=copy["digest"])
    referenced = {str(row["digest"]) for row in (yield q("prune_artifacts_referenced", digests=digests))}
    holders: dict[str, set[str]] = {}
    for copy in copies:
        holders.setdefault(str(copy["digest"]), set()).add(str(copy["run_id"]))
    freed: list[Row] = []
    for digest, runs in holders.items():
        kept_elsewhere = bool(runs - going)
        for run_id in sorted(runs):
            if digest not in referenced or (run_id in going and kept_elsewhere):
                freed.extend((yield q("prune_delete_artifact", run_id=run_id, digest=digest)))
    return freed
