"""Pruning finished runs end to end: a pruned run id used again starts from nothing, and the
retention rule keeps a run whose key the effect owner still remembers — the owner on loopback
shows what would happen otherwise.

Every test runs on SQLite and on PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import EffectRejected
from safepoint.testing import OwnerService, owner_effect

calls: list[str] = []
local_sends: list[str] = []


def _send(payload: Any, key: sp.EffectKey) -> dict[str, Any]:
    local_sends.append(str(key))
    return {"sent": payload["n"]}


# An owner that forgets a key after a millisecond: pruning its operations is harmless at once.
forgetful = sp.Effect("prune.forgetful", execute=_send, dedup_retention=timedelta(milliseconds=1))
charges = owner_effect("charges", name="prune.charges")  # the owner remembers keys for 23 h


def _double(n: int) -> int:
    calls.append(f"double:{n}")
    return n * 2


def _read(n: int) -> dict[str, int]:
    calls.append(f"read:{n}")
    return {"n": n}


@sp.workflow("prune.local", version="1")
def local(run: sp.Run, n: int) -> dict[str, Any]:
    doubled = run.pure("double", _double, n)
    seen = run.read("read", _read, n)
    sent = run.effect("send", forgetful, payload={"n": doubled}, operation_id="send")
    return {"doubled": doubled, "seen": seen, "sent": sent}


@sp.workflow("prune.charged", version="1")
def charged(run: sp.Run, amount: int) -> dict[str, Any]:
    return run.effect("charge", charges, payload={"amount": amount}, operation_id="charge")


def _prune(store: sp.Store, workflow: str, **kw: Any) -> Any:
    time.sleep(0.01)  # past the forgetful owner's retention, and finished before the cut-off
    return sp.prune(store, finished_before=timedelta(0), workflow=workflow, **kw)


def test_a_pruned_run_id_used_again_finds_none_of_the_old_runs_steps(store: sp.Store) -> None:
    run_id = f"reused-{uuid.uuid4().hex[:8]}"
    calls.clear()
    local_sends.clear()
    assert sp.start(store, local, 1, run_id=run_id) == {"doubled": 2, "seen": {"n": 1}, "sent": {"sent": 2}}
    old_events = [event.event_id for event in store.events(run_id)]
    pruned = _prune(store, "prune.local")
    assert (pruned.runs, pruned.run_ids, pruned.kept) == (1, (run_id,), ())
    assert pruned.rows["steps"] == 3
    assert pruned.rows["operations"] == 1

    # The same id, other inputs: every step runs again; nothing of the old run replays.
    assert sp.start(store, local, 5, run_id=run_id) == {"doubled": 10, "seen": {"n": 5}, "sent": {"sent": 10}}
    assert calls == ["double:1", "read:1", "double:5", "read:5"]
    assert len(local_sends) == 2
    ledger = store.load_ledger(run_id)
    assert ledger.run.inputs == {"args": [5], "kwargs": {}}
    assert sorted(ledger.steps) == ["double", "read", "send"]
    assert ledger.steps["double"].result == 10
    assert ledger.operations["send"].dispatch_count == 1
    assert not {event.event_id for event in store.events(run_id)} & set(old_events)


def test_a_run_whose_key_the_owner_remembers_is_kept_and_forcing_it_shows_why(
    store: sp.Store, owner_env: OwnerService
) -> None:
    run_id = f"charged-{uuid.uuid4().hex[:8]}"
    first = sp.start(store, charged, 100, run_id=run_id)
    kept = _prune(store, "prune.charged")
    assert kept.runs == 0
    assert [k.run_id for k in kept.kept] == [run_id]
    assert kept.held_by_retention == 1
    assert "inside its owner's dedup retention" in kept.kept[0].reason
    assert store.get_run(run_id).status is sp.types.RunStatus.COMPLETED

    # Forced, the run goes; a run reusing its id mints the same key, and the owner — which still
    # remembers it — refuses the new payload under it (a key reused with other parameters), so
    # reconciliation finds the *old* charge by the key: the new charge is never made, and the
    # new run records the old receipt. This is what the rule keeps from happening unforced.
    forced = _prune(store, "prune.charged", force=True)
    assert forced.run_ids == (run_id,)
    second = sp.start(store, charged, 250, run_id=run_id)
    assert int(owner_env.client.stats()["applied"]) == 1
    assert second == first
    assert second["amount"] == 100


@sp.workflow("prune.resent", version="1")
def resent(run: sp.Run, amount: int) -> dict[str, Any]:
    return run.effect("charge", charges, payload={"amount": amount}, operation_id="charge")


@sp.workflow("prune.resent-async", version="1")
async def resent_async(run: sp.AsyncRun, amount: int) -> dict[str, Any]:
    return await run.effect("charge", charges, payload={"amount": amount}, operation_id="charge")


def test_a_run_cancelled_before_its_resend_went_out_is_kept_while_the_owner_remembers_the_first_key(
    store: sp.Store, owner_env: OwnerService
) -> None:
    """``retry(resend=…)`` clears the operation's dispatch count for its next attempt; the
    first attempt's key still reached the owner, which keeps its refusal under it."""
    run_id = f"resent-{uuid.uuid4().hex[:8]}"
    owner_env.client.set_faults(decline=1)
    with pytest.raises(EffectRejected):
        sp.start(store, resent, 100, run_id=run_id)
    sp.retry(store, run_id, by="ana", reason="the card was updated", resend=["charge"])
    sp.cancel(store, run_id, by="ana", reason="not now")  # before the resend went out
    op = store.load_ledger(run_id).operations["charge"]
    assert (op.dispatch_count, op.first_dispatched_at, op.key_attempt) == (0, None, 2)

    kept = _prune(store, "prune.resent")
    assert (kept.runs, [k.run_id for k in kept.kept]) == (0, [run_id])
    assert kept.kept[0].forced
    assert "inside its owner's dedup retention" in kept.kept[0].reason

    # What the rule keeps from happening: forced, the run goes; a run reusing its id mints the
    # first attempt's key again, and the owner answers it with the refusal it still remembers.
    assert _prune(store, "prune.resent", force=True).run_ids == (run_id,)
    with pytest.raises(EffectRejected):
        sp.start(store, resent, 100, run_id=run_id)
    assert int(owner_env.client.stats()["applied"]) == 0


def test_prune_async_keeps_a_run_cancelled_before_its_resend_went_out(
    store: sp.Store, owner_env: OwnerService
) -> None:
    run_id = f"resent-a-{uuid.uuid4().hex[:8]}"
    owner_env.client.set_faults(decline=1)

    async def main() -> Any:
        with pytest.raises(EffectRejected):
            await sp.start_async(store, resent_async, 100, run_id=run_id)
        await sp.retry_async(store, run_id, by="ana", resend="charge")
        await sp.cancel_async(store, run_id, by="ana")
        await asyncio.sleep(0.01)
        return await sp.prune_async(store, finished_before=timedelta(0), workflow="prune.resent-async")

    kept = asyncio.run(main())
    assert (kept.runs, [k.run_id for k in kept.kept]) == (0, [run_id])
    assert "inside its owner's dedup retention" in kept.kept[0].reason


def test_a_dry_run_deletes_nothing_and_counts_what_would_go(store: sp.Store) -> None:
    run_id = f"dry-{uuid.uuid4().hex[:8]}"
    sp.start(store, local, 3, run_id=run_id)
    dry = _prune(store, "prune.local", dry_run=True)
    assert dry.dry_run
    assert run_id in dry.run_ids
    assert store.load_ledger(run_id).steps
    done = sp.prune(store, finished_before=dry.before, workflow="prune.local")
    assert (done.runs, done.rows) == (dry.runs, dry.rows)


@sp.workflow("prune.local-async", version="1")
async def local_async(run: sp.AsyncRun, n: int) -> dict[str, Any]:
    doubled = await run.pure("double", _double, n)
    sent = await run.effect("send", forgetful, payload={"n": doubled}, operation_id="send")
    return {"doubled": doubled, "sent": sent}


def test_prune_async_on_the_async_postgres_store(pg_url: str) -> None:
    url = f"{pg_url}?schema=a_{uuid.uuid4().hex[:12]}"

    async def main() -> tuple[Any, Any]:
        store = await sp.open_async_store(url)
        try:
            await sp.start_async(store, local_async, 2, run_id="a-1")
            await sp.submit_async(store, local_async, 3, run_id="a-pending")
            await asyncio.sleep(0.01)
            done = await sp.prune_async(store, finished_before=timedelta(0), workflow="prune.local-async")
            return done, [run.run_id for run in await store.list_runs(None, 10)]
        finally:
            await store.close()

    done, left = asyncio.run(main())
    assert (done.runs, done.run_ids, done.rows["steps"], done.rows["operations"]) == (1, ("a-1",), 2, 1)
    assert left == ["a-pending"]
