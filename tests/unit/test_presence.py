"""Who holds a run, as the operator tools show it: held, lease expired, released, or nobody."""

from __future__ import annotations

from dataclasses import replace

import pytest

import safepoint as sp
from safepoint._rules.presence import Ownership, ownership
from safepoint.types import RunRecord, RunStatus

NOW = 1_800_000_000_000


@sp.workflow("presence-test")
def noop(run: sp.Run) -> int:
    return 1


@pytest.fixture
def pending(memory_store: sp.Store) -> RunRecord:
    sp.submit(memory_store, noop, run_id="p")
    return memory_store.get_run("p")


def test_a_live_lease_is_held_and_says_until_when(pending: RunRecord) -> None:
    run = replace(pending, status=RunStatus.RUNNING, owner="w-1", lease_expires_at=NOW + 25_000)
    assert ownership(run, NOW) == Ownership("held", "w-1", NOW + 25_000, "held by w-1, lease ends in 25s")


@pytest.mark.parametrize("late_ms", [0, 3 * 60_000])
def test_a_lease_is_expired_from_the_instant_it_ends(pending: RunRecord, late_ms: int) -> None:
    run = replace(pending, status=RunStatus.RUNNING, owner="w-1", lease_expires_at=NOW - late_ms)
    held = ownership(run, NOW)
    assert (held.state, held.owner, held.lease_expires_at) == ("lease_expired", "w-1", NOW - late_ms)
    assert held.label.startswith(
        f"lease of w-1 expired {late_ms // 60_000 or 0}{'m' if late_ms else 's'} ago"
    )


def test_a_running_run_nobody_holds_is_released(pending: RunRecord) -> None:
    run = replace(pending, status=RunStatus.RUNNING, owner=None, lease_expires_at=None)
    held = ownership(run, NOW)
    assert (held.state, held.owner) == ("released", None)
    assert "no worker holds it" in held.label


@pytest.mark.parametrize(
    "status", [RunStatus.PENDING, RunStatus.BLOCKED, RunStatus.WAITING, RunStatus.COMPLETED]
)
def test_a_run_that_is_not_running_is_held_by_none(pending: RunRecord, status: RunStatus) -> None:
    assert ownership(replace(pending, status=status), NOW).state == "none"
