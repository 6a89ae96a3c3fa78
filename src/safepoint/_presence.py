"""Who holds a run now, as an operator should read it.

A run's status says where it is in its life; whether a worker is at it is a separate fact: the
owner and its lease, read against the store's clock. ``running`` with an owner whose lease ran
out means the worker is gone (any worker may take the run over); ``running`` with no owner means
the run was released — by a person's resolution or a worker's graceful stop — and waits for
any worker to claim it. Printing ``running`` for either would tell an operator that a process
is at work when none is. The CLI and the dashboard read this one decision, so they never
disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from .types import RunRecord, RunStatus

HELD = "held"                    # a worker holds it and its lease is current
LEASE_EXPIRED = "lease_expired"  # a worker held it; its lease ran out: the worker is gone
RELEASED = "released"            # running, nobody holds it: any worker may claim it
NONE = "none"                    # not a question of ownership (pending, waiting, blocked, ended)


@dataclass(frozen=True, slots=True)
class Ownership:
    """How a run's ownership reads at one moment of the store's clock."""

    state: str                    # HELD, LEASE_EXPIRED, RELEASED or NONE
    owner: str | None
    lease_expires_at: int | None  # epoch ms, store clock
    label: str                    # what to show in place of the bare status


def ownership(run: RunRecord, now: int) -> Ownership:
    """How ``run``'s ownership reads at ``now`` (epoch ms on the store's clock)."""
    status = run.status.value
    owner, lease = run.owner, run.lease_expires_at
    if owner is not None and lease is not None and lease <= now:
        return Ownership(LEASE_EXPIRED, owner, lease, (
            f"{status} — lease expired {_span(now - lease)} ago, owner {owner} (worker gone;"
            " any worker may take it over)"))
    if owner is not None:
        until = f", lease until {_utc(lease)} UTC" if lease is not None else ""
        return Ownership(HELD, owner, lease, f"{status} (owner {owner}{until})")
    if run.status is RunStatus.RUNNING:
        return Ownership(RELEASED, None, None, "runnable (released, no worker holds it)")
    return Ownership(NONE, None, None, status)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _span(ms: int) -> str:
    """A duration as a person says it: the largest whole unit (``0s`` to ``12d``)."""
    seconds = ms // 1000
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
