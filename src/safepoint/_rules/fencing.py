"""Fencing and claims: who may write to a run, and why a write was refused — decided from the
run's record and the store's clock, without I/O.

End to end:

1. **A claim takes the run.** ``claim_run`` / ``claim_next`` / ``create_run`` (its starter) is
   a compare-and-set on the run's ``state_revision`` that makes it ``running``, names the
   owner, sets the lease (``lease_expires_at`` = the store's clock + ``lease_ms``) and bumps
   the ``fence``. The worker holds the new fence in its ``Claim``. Whether a live worker's
   lease still holds is the database's to say, on its clock, in the claim itself (a worker's
   reading of "now" is an estimate that may lag by a round trip); ``plan_claim`` only names an
   owner known to be gone (``dead_owner``), whose lease need not run out first.
2. **Every worker write is fenced in the write itself.** It applies only while the run's row
   still has the claim's fence and is ``running`` — ``WHERE run_id = … AND fence = … AND
   status = 'running'`` — in the same statement (PostgreSQL: the ``owned`` CTE of each worker
   write in ``storage/sql/postgres/queries.sql``, whose UPDATE also takes the run's row lock,
   ordering it against any claim) or the same serialised transaction (SQLite: the
   ``fence_check*`` statements of ``storage/sql/sqlite/queries.sql``, first in a ``BEGIN
   IMMEDIATE`` transaction). The same guard renews the lease and counts the history the write
   adds. A check *then* a write would leave a race; there is none.
3. **A write that matched nothing is explained, not retried.** The store reads the run as it
   now stands (``fence_state``) and ``refused_write`` says why: another worker claimed it or
   it ended (``LostOwnership`` — a ``BaseException``, so agent code cannot swallow it); or, the
   fence still holding, the write was new work refused by a cancel request (``Cancelled``), a
   passed deadline (``DeadlineExceeded``) or the hard history limit (``HistoryLimitReached``).
   Outcomes and the run's ending are never new work: what happened is always recorded.
4. **A person's decisions end runs with these errors:** ``cancelled_error``,
   ``abandoned_error``.

A worker that lost its lease — paused, partitioned, or slow — can therefore never write again
once another has claimed the run; its effects are refused at the dispatch boundary, since
``mark_dispatching`` is a fenced write like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import (
    Cancelled,
    DeadlineExceeded,
    HistoryLimitReached,
    LostOwnership,
)
from ..types import Claim, Resolution, RunRecord


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    dead_owner: str | None = None


def plan_claim(run: RunRecord, *, owner_gone: bool) -> ClaimPlan:
    """Whom a claim may take the run from before the lease ran out: its owner, once known to be
    gone. A claim the database refused (a live lease) is the caller's ``RunOwned``."""
    if run.owner is not None and owner_gone:
        return ClaimPlan(dead_owner=run.owner)
    return ClaimPlan()


def fence_holds(claim: Claim, fence: int | None, status: str | None) -> bool:
    """Whether a run's row, as it now stands, still lets ``claim`` write."""
    return fence == claim.fence and status == "running"


def refused_write(
    claim: Claim,
    fence: int | None,
    status: str | None,
    cancel_requested_at: int | None,
    deadline_at: int | None = None,
    now: int | None = None,
    *,
    new_work: bool = True,
    limited: bool = False,
    history: int | None = None,
    hard_limit: int | None = None,
) -> BaseException:
    """Why a fenced worker write matched nothing, from the run's row as it now stands: for new
    work (``new_work``, refused once a cancel is asked for or past the deadline) while this
    worker's fence still holds, a cancel request (``Cancelled``) or its deadline passed
    (``DeadlineExceeded``); for a write held to the history limit (``limited``) whose fence
    holds, the limit (``HistoryLimitReached``); else a stale fence (``LostOwnership``)."""
    if fence_holds(claim, fence, status):
        if new_work and cancel_requested_at is not None:
            return Cancelled(claim.run_id)
        if new_work and deadline_at is not None and now is not None and now >= deadline_at:
            return DeadlineExceeded(claim.run_id, deadline_at)
        if limited:
            return HistoryLimitReached(claim.run_id, history, hard_limit)
    return LostOwnership(claim.run_id, claim.fence)


def cancelled_error(by: str, reason: str | None) -> dict[str, str]:
    """The error a cancelled run ends with."""
    return {"type": "Cancelled", "message": f"cancelled by {by}" + (f": {reason}" if reason else "")}


def abandoned_error(resolution: Resolution) -> dict[str, str]:
    """The error a run ends with when a person abandons it."""
    because = f": {resolution.evidence}" if resolution.evidence else ""
    return {"type": "Abandoned", "message": f"abandoned by {resolution.by}{because}"}
