"""The retention rule (``_rules.retention``): which finished chains a prune may delete."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from safepoint._rules.retention import (
    PRUNABLE,
    ChainRun,
    SentKey,
    batch_size,
    chain_kept,
    owner_may_remember,
    prune_cutoff,
    prune_statuses,
)
from safepoint.errors import PruneRefused, UsageError
from safepoint.types import RunStatus

HOUR = 3_600_000
NOW = 1_000 * HOUR


def _op(**fields: object) -> SentKey:
    values: dict[str, object] = {
        "run_id": "r1",
        "operation_id": "charge:1",
        "effect": "charge",
        "dispatch_count": 1,
        "first_dispatched_at": NOW - 3 * HOUR,
        "updated_at": NOW - 2 * HOUR,
        "dedup_retention_ms": HOUR,
    }
    values.update(fields)
    return SentKey(**values)  # type: ignore[arg-type]


def _run(run_id: str = "r1", status: RunStatus = RunStatus.COMPLETED, **fields: object) -> ChainRun:
    values: dict[str, object] = {"updated_at": NOW - 5 * HOUR, "successor_run_id": None}
    values.update(fields)
    return ChainRun(run_id=run_id, status=status, **values)  # type: ignore[arg-type]


def _kept(chain: list[ChainRun], ops: list[SentKey] = [], forks: list[str] = [], **kw: object):  # noqa: B006
    options: dict[str, object] = {"statuses": PRUNABLE, "before": NOW - HOUR, "now": NOW, "force": False}
    options.update(kw)
    return chain_kept(chain, ops, forks, **options)  # type: ignore[arg-type]


# -- what may be asked for --------------------------------------------------------------------


def test_the_default_statuses_are_every_ending_a_run_is_pruned_at() -> None:
    assert prune_statuses(None) == {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    assert prune_statuses(["completed", RunStatus.FAILED]) == {RunStatus.COMPLETED, RunStatus.FAILED}
    assert prune_statuses("cancelled") == {RunStatus.CANCELLED}


@pytest.mark.parametrize("status", ["running", "blocked", "waiting", "stopped", "pending", "done"])
def test_a_status_a_run_may_still_leave_is_refused_naming_the_ones_allowed(status: str) -> None:
    with pytest.raises(PruneRefused) as refused:
        prune_statuses([status])
    assert "cancelled, completed, failed" in refused.value.reason
    assert isinstance(refused.value, UsageError)


def test_continued_is_refused_saying_that_a_continued_run_goes_with_its_chain() -> None:
    with pytest.raises(PruneRefused, match="goes with its chain"):
        prune_statuses(["continued"])
    with pytest.raises(PruneRefused, match="no status given"):
        prune_statuses([])


def test_a_cut_off_is_an_aware_instant_epoch_milliseconds_or_an_age() -> None:
    moment = datetime(2030, 1, 31, 17, 0, tzinfo=UTC)
    assert prune_cutoff(moment) == (int(moment.timestamp() * 1000), None)
    assert prune_cutoff(1_234) == (1_234, None)
    assert prune_cutoff(timedelta(days=30)) == (None, 30 * 24 * HOUR)
    with pytest.raises(PruneRefused, match="no time zone"):
        prune_cutoff(datetime(2030, 1, 31))
    for wrong in (True, "30d", 1.5, timedelta(seconds=-1)):
        with pytest.raises(PruneRefused):
            prune_cutoff(wrong)  # type: ignore[arg-type]


def test_a_batch_is_between_one_and_ten_thousand_runs() -> None:
    assert batch_size(1) == 1
    assert batch_size(10_000) == 10_000
    for wrong in (0, 10_001, True, "5", None):
        with pytest.raises(PruneRefused, match="runs per transaction"):
            batch_size(wrong)


# -- whether an owner may still remember a key ----------------------------------------------------


def test_an_operation_never_sent_holds_nothing_whatever_its_retention() -> None:
    assert owner_may_remember(_op(dispatch_count=0, first_dispatched_at=None), NOW) is None
    assert (
        owner_may_remember(_op(dispatch_count=0, first_dispatched_at=None, dedup_retention_ms=None), NOW)
        is None
    )


def test_an_operation_sent_once_holds_its_key_though_a_resend_cleared_its_count() -> None:
    # a resend (or a "not applied" resolution) cleared the count and the first dispatch of the
    # current attempt; the key of the earlier one was sent half an hour ago
    resent = _op(dispatch_count=0, first_dispatched_at=None, last_dispatched_at=NOW - HOUR // 2)
    reason = owner_may_remember(resent, NOW)
    assert reason is not None
    assert "dedup retention" in reason
    undeclared = _op(
        dispatch_count=0, first_dispatched_at=None, last_dispatched_at=0, dedup_retention_ms=None
    )
    assert owner_may_remember(undeclared, NOW) is not None
    assert (
        owner_may_remember(
            _op(dispatch_count=0, first_dispatched_at=None, last_dispatched_at=NOW - HOUR), NOW
        )
        is None
    )


def test_inside_the_declared_retention_the_owner_may_still_remember_the_key() -> None:
    reason = owner_may_remember(_op(updated_at=NOW - HOUR + 1), NOW)
    assert reason is not None
    assert "'charge:1'" in reason
    assert "dedup retention" in reason


def test_the_retention_counts_from_the_operations_last_write_not_its_first_dispatch() -> None:
    # first sent 3 h ago, with a 1 h window: but sent (or written) again 30 min ago
    assert owner_may_remember(_op(updated_at=NOW - HOUR // 2), NOW) is not None
    assert owner_may_remember(_op(updated_at=NOW - HOUR), NOW) is None  # exactly past it


def test_an_effect_that_declares_no_retention_may_be_remembered_for_ever() -> None:
    reason = owner_may_remember(_op(dedup_retention_ms=None, updated_at=0), NOW)
    assert reason is not None
    assert "declares no dedup_retention" in reason
    assert "force" in reason


# -- whether a chain goes ---------------------------------------------------------------------------


def test_a_finished_chain_before_the_cut_off_with_forgotten_keys_goes() -> None:
    assert _kept([_run()], [_op()]) is None
    first = _run("r0", RunStatus.CONTINUED, successor_run_id="r1")
    assert _kept([first, _run()], [_op(run_id="r0")]) is None


@pytest.mark.parametrize(
    "status",
    [RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING, RunStatus.BLOCKED, RunStatus.STOPPED],
)
def test_a_chain_whose_last_run_may_still_run_is_kept(status: RunStatus) -> None:
    kept = _kept([_run("r0", RunStatus.CONTINUED, successor_run_id="r1"), _run("r1", status)])
    assert kept is not None
    assert kept.run_id == "r1"
    assert f"is {status.value}, not finished" in kept.reason
    assert not kept.forced


def test_a_chain_is_kept_when_its_last_run_is_not_a_status_asked_for_or_too_recent() -> None:
    only_completed = frozenset({RunStatus.COMPLETED})
    assert _kept([_run(status=RunStatus.FAILED)], statuses=only_completed) is not None
    late = _kept([_run(updated_at=NOW - HOUR)])  # not strictly before the cut-off
    assert late is not None
    assert "not before the cut-off" in late.reason


def test_a_chain_without_a_single_last_run_is_kept() -> None:
    looped = [_run("r0", RunStatus.CONTINUED, successor_run_id="r1")]
    assert _kept(looped) is not None
    assert _kept([_run("a"), _run("b")]) is not None


def test_a_fork_of_the_chain_keeps_it_even_when_forced() -> None:
    kept = _kept([_run()], forks=["fork-1"], force=True)
    assert kept is not None
    assert (kept.fork, kept.forced) == (True, False)
    assert "'fork-1'" in kept.reason


def test_an_operation_its_owner_may_remember_keeps_the_chain_unless_forced() -> None:
    recent = _op(run_id="r0", updated_at=NOW - 10)
    chain = [_run("r0", RunStatus.CONTINUED, successor_run_id="r1"), _run("r1")]
    kept = _kept(chain, [recent])
    assert kept is not None
    assert (kept.run_id, kept.forced, kept.fork) == ("r1", True, False)
    assert _kept(chain, [recent], force=True) is None
    # force lets only the owner's memory go: never a run that may still run
    assert _kept([_run(status=RunStatus.RUNNING)], [recent], force=True) is not None
