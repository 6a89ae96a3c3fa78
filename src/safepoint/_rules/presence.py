"""Who holds a run now: the rule the operator tools (CLI, dashboard) show a run's owner by.

A run's status says where its work stands; only its owner and lease say whether a process is
carrying it on. A ``running`` run may be held by a live worker, held by one whose lease expired
(it died, or stalled past its lease: any worker or a resume takes it over), or held by nobody —
released after a person resolved it, or by a worker that stopped gracefully — until a worker
claims it. I/O-free: ``now`` is the store's clock (``store.now()``), the clock leases run on.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..types import RunRecord, RunStatus
from .moments import span

HELD = "held"  # a worker holds the lease, and the lease has not expired
LEASE_EXPIRED = "lease_expired"  # the worker that held it stopped renewing: it is taken over
RELEASED = "released"  # running, but no worker holds it: the next claim carries it on
NONE = "none"  # nobody holds it, and its status says why (pending, ended, …)


@dataclass(frozen=True, slots=True)
class Ownership:
    """A run's ownership as an operator is shown it."""

    state: str  # HELD, LEASE_EXPIRED, RELEASED or NONE
    owner: str | None  # the worker that holds (or held, lease expired) the run
    lease_expires_at: int | None  # epoch ms on the store's clock
    label: str  # a short human text: "held by w-1, lease ends in 25s"


def ownership(run: RunRecord, now: int) -> Ownership:
    """Who holds ``run`` at ``now``. A lease is expired from the instant it ends (the claim
    that takes a run over uses the same comparison)."""
    lease = run.lease_expires_at
    if run.owner is not None:
        if lease is not None and lease <= now:
            return Ownership(
                LEASE_EXPIRED,
                run.owner,
                lease,
                f"lease of {run.owner} expired {span(now - lease)} ago: its worker"
                " is gone or stalled; any worker (or a resume) takes the run over",
            )
        ends = "no lease expiry" if lease is None else f"lease ends in {span(lease - now)}"
        return Ownership(HELD, run.owner, lease, f"held by {run.owner}, {ends}")
    if run.status is RunStatus.RUNNING:
        return Ownership(
            RELEASED, None, None, "released: no worker holds it; a worker (or a resume) carries it on"
        )
    if run.status is RunStatus.PENDING:
        return Ownership(NONE, None, None, "not claimed yet: a worker (or a resume) starts it")
    return Ownership(NONE, None, None, "")


def status_label(run: RunRecord, held: Ownership) -> str:
    """A run's status as an operator should read it where one word stands for the run (a
    dashboard row): never a bare ``running`` when no process is at it."""
    if held.state == RELEASED:
        return f"runnable — {held.label}"
    if held.state == NONE:
        return run.status.value
    return f"{run.status.value} — {held.label}"
