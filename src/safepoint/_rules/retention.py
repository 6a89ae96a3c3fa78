"""Retention: which finished runs a prune may delete, and which it must keep — I/O-free.

A prune (``safepoint.prune``) deletes a run whole (its row, steps, events, attempts, approvals,
messages and operations, and the artifacts nothing else references) or not at all, in one
transaction per batch. The unit it decides on is a CHAIN: the runs linked by continue-as-new
share one effect ledger (a successor finds an operation an earlier run settled by its chain),
so a chain goes whole, and only once its last run has finished. These functions decide on one
chain as the store read it under its lock (``chain_kept``); the store deletes what they let go.

What keeps a chain:

- **a run not finished.** Only ``completed``, ``failed`` and ``cancelled`` are endings a prune
  deletes at (the chain's last run; the runs before it are ``continued``). A pending, running,
  waiting, blocked or stopped run may still run again.
- **a fork of it.** A fork's effect step takes the outcome of an operation its source already
  sent from the source's record of it (``Store.family_operation``). Deleting the source while
  the fork stays would leave the fork nothing to take it from. So a fork's source stays while
  any fork of it stays; a prune deletes the fork first (when it is finished too), then the
  source (``safepoint.prune`` goes round again). The family's claims (which run sent what) stay
  until no run of the family is left: a member that carries on never sends what a pruned one
  sent — it blocks instead, if it cannot take that outcome.
- **an operation whose key its owner may still remember** (``owner_may_remember``), unless the
  prune is forced. An effect key is derived from the ledger's id, the run (or chain) that names
  the operation and its operation id (``effects.mint_effect_key``): nothing random. While the
  ledger holds the run, that run id cannot be used again (``RunConflict``). Once the run is
  pruned it can be — and a new run under the old id that reaches the same operation id mints
  the *same key*. An owner that still remembers the key answers the new dispatch with the old
  outcome (an idempotent replay: the new change is silently not made, and the new run records
  the old receipt) or refuses it as a key reused with another payload. Once the owner has
  forgotten the key (past its ``dedup_retention``) the key is new to it again, and deleting the
  operation is harmless: neither side remembers it. So the rule is the reverse of what one
  might guess: deleting an operation the owner has *forgotten* is safe; deleting one it *still
  deduplicates* is what can go wrong, and only when a run id is reused. An operation never
  sent (never dispatched under any of its keys) reached no owner and holds nothing. One sent
  once stays sent: a resend (``retry(resend=…)``) clears its dispatch count for its next
  attempt, and a "not applied" resolution puts it back to ``prepared``, but the owner still
  remembers the key it was sent under (``SentKey.last_dispatched_at``, which nothing clears,
  says so). An effect
  that declares no ``dedup_retention`` gives no instant after which the owner is known to have
  forgotten: its operations keep their chain until a prune is forced.

Forcing (``force=True``, ``safepoint prune --force``) lets the last reason go, never the
others: use it when run ids are never reused (generated ids), and otherwise do not reuse the
pruned ids before the owners' windows have passed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from ..errors import PruneRefused
from ..types import RunStatus
from .moments import instant

# The endings a chain's last run may have for a prune to delete it; the runs before it are
# ``continued`` (their chain goes on in the next run), and go with their chain.
PRUNABLE = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class ChainRun:
    """What a prune reads of one run of a chain."""

    run_id: str
    status: RunStatus
    updated_at: int
    successor_run_id: str | None


@dataclass(frozen=True, slots=True)
class SentKey:
    """What a prune reads of one operation: whether a key of it may have reached its owner
    (``dispatch_count`` and ``first_dispatched_at`` count the current attempt, which a resend
    starts again; ``last_dispatched_at``, the last dispatch under any of its keys, is never
    cleared), when it was last written, and how long its effect declared the owner remembers a
    key."""

    run_id: str
    operation_id: str
    effect: str
    dispatch_count: int
    first_dispatched_at: int | None
    updated_at: int
    dedup_retention_ms: int | None
    last_dispatched_at: int | None = None

    @property
    def ever_sent(self) -> bool:
        """Whether a dispatch of it, under any of its keys, was ever committed."""
        return (
            self.dispatch_count > 0
            or self.first_dispatched_at is not None
            or self.last_dispatched_at is not None
        )


@dataclass(frozen=True, slots=True)
class Kept:
    """Why a prune keeps the chain whose last run is ``run_id``. ``forced``: ``force`` would
    let it go (an owner may still remember a key); ``fork``: a fork of it stays."""

    run_id: str
    reason: str
    forced: bool = False
    fork: bool = False


def prune_statuses(statuses: Iterable[RunStatus | str] | None) -> frozenset[RunStatus]:
    """The endings a prune deletes runs at: ``statuses`` checked (None: all of them)."""
    if statuses is None:
        return PRUNABLE
    if isinstance(statuses, str):
        statuses = (statuses,)
    chosen: set[RunStatus] = set()
    for given in statuses:
        try:
            status = RunStatus(given)
        except ValueError:
            status = None
        if status not in PRUNABLE:
            continued = status is RunStatus.CONTINUED
            raise PruneRefused(
                f"{given!r} is not an ending a run is pruned at: give"
                f" {', '.join(sorted(PRUNABLE))}"
                + (" (a continued run goes with its chain, at its last run's ending)" if continued else "")
            )
        chosen.add(status)
    if not chosen:
        raise PruneRefused(f"no status given: give one or more of {', '.join(sorted(PRUNABLE))}")
    return frozenset(chosen)


def prune_cutoff(finished_before: datetime | timedelta | int) -> tuple[int | None, int | None]:
    """``finished_before`` as a prune's cut-off: an instant (an aware datetime, or epoch
    milliseconds), or an age (a timedelta: that long before the store's clock) — as
    ``(before, older_than_ms)``, one of them None."""
    if isinstance(finished_before, timedelta):
        if finished_before < timedelta(0):
            raise PruneRefused(f"finished_before={finished_before!r}: an age is not negative")
        return None, int(finished_before.total_seconds() * 1000)
    if isinstance(finished_before, datetime):
        if finished_before.tzinfo is None:
            raise PruneRefused(
                f"finished_before={finished_before.isoformat()!r} has no time zone: give an aware"
                " datetime (datetime(…, tzinfo=timezone.utc)), so that the cut-off is one instant"
            )
        return int(finished_before.timestamp() * 1000), None
    if isinstance(finished_before, bool) or not isinstance(finished_before, int):
        raise PruneRefused(
            f"finished_before={finished_before!r}: give an aware datetime, epoch milliseconds,"
            " or a timedelta (that long ago on the store's clock)"
        )
    return finished_before, None


def batch_size(batch: object) -> int:
    """The runs a prune deletes per transaction, checked."""
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 10_000:
        raise PruneRefused(f"batch={batch!r}: give the runs per transaction, from 1 to 10000")
    return batch


def owner_may_remember(op: SentKey, now: int) -> str | None:
    """Why the owner of ``op``'s effect may still remember its key at ``now`` (see the module
    docstring), or None when it cannot: never sent under any of its keys, or past the declared
    retention counted from the operation's last write (no earlier than its last dispatch)."""
    if not op.ever_sent:
        return None
    if op.dedup_retention_ms is None:
        return (
            f"operation {op.operation_id!r} of run {op.run_id!r} was sent and its effect"
            f" {op.effect!r} declares no dedup_retention, so its owner may still remember the"
            " key: prune with force if this run id is never used again"
        )
    until = max(op.updated_at, op.last_dispatched_at or 0) + op.dedup_retention_ms
    if now < until:
        return (
            f"operation {op.operation_id!r} of run {op.run_id!r} is inside its owner's dedup"
            f" retention until {instant(until)}: a run reusing this id would get the old outcome"
        )
    return None


def chain_kept(
    chain: Sequence[ChainRun],
    operations: Iterable[SentKey],
    forks: Sequence[str],
    *,
    statuses: frozenset[RunStatus],
    before: int,
    now: int,
    force: bool,
) -> Kept | None:
    """Why a prune keeps this chain, as read under its lock (None: it goes whole). ``chain``:
    its runs; ``operations``: theirs; ``forks``: runs outside it forked from one of its runs;
    ``before``: the instant its last run must have finished before."""
    last = [run for run in chain if run.successor_run_id is None]
    head = last[0].run_id if last else (chain[-1].run_id if chain else "?")
    if len(last) != 1:
        return Kept(head, "its chain has no single last run: look at it with `safepoint show`")
    for run in chain:
        if not run.status.terminal:
            return Kept(head, f"run {run.run_id!r} of its chain is {run.status.value}, not finished")
    if last[0].status not in statuses:
        return Kept(head, f"it is {last[0].status.value}, not one of the statuses asked for")
    if last[0].updated_at >= before:
        return Kept(head, f"it finished at {instant(last[0].updated_at)}, not before the cut-off")
    if forks:
        return Kept(
            head,
            f"run {forks[0]!r} was forked from its chain and looks its operations up there:"
            " it goes once its forks have gone",
            fork=True,
        )
    if not force:
        for op in operations:
            reason = owner_may_remember(op, now)
            if reason is not None:
                return Kept(head, reason, forced=True)
    return None
