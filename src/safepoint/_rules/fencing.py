"""Fencing and claims: who may write to a run, decided from its record and the store's clock.

Every write of a run is fenced: the store applies it only while the run's ``fence`` still
equals the one the writer's claim was given, in the same statement (PostgreSQL) or the same
serialised transaction (SQLite). A claim is a compare-and-set on ``state_revision`` that bumps
the fence, so a worker that lost its lease — paused, partitioned, or simply slow — can never
write again once another has claimed the run. The decisions are here; the stores carry them
out inside the statements that write.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RunOwned
from ..types import RunRecord


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    dead_owner: str | None = None


def plan_claim(run: RunRecord, now: int, *, owner_gone: bool) -> ClaimPlan:
    """Decide whether a claim may be attempted; raise ``RunOwned`` when a live worker holds it."""
    if run.owner is None or run.lease_expires_at is None or run.lease_expires_at <= now:
        return ClaimPlan()
    if owner_gone:
        return ClaimPlan(dead_owner=run.owner)
    raise RunOwned(run.run_id, run.owner, run.lease_expires_at)
