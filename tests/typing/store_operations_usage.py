"""Checked by mypy --strict (``make lint``): the store operations declared in one line each
(``safepoint.storage.postgres.operations``, and ``SyncOverAsync``'s forwarding) keep the
signatures of the plans they run, so their callers are checked as before. The lines marked
``# type: ignore[arg-type]`` are mistakes mypy must keep catching: strict mode warns about an
ignore that has nothing left to ignore, so an operation whose calls went unchecked fails the
check."""

from __future__ import annotations

from safepoint.storage.async_store import AsyncStore
from safepoint.storage.base import Store
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.testing.sync_over_async import SyncOverAsync
from safepoint.types import Claim, RunRecord, StepRecord


def sync_calls(store: PostgresStore, claim: Claim, step: StepRecord) -> RunRecord:
    as_store: Store = store  # the declared operations still make a Store
    store.record_step(claim, step)
    store.record_step(claim, "not a step")  # type: ignore[arg-type]
    store.get_run(42)  # type: ignore[arg-type]
    return as_store.get_run(claim.run_id)


async def async_calls(store: AsyncPostgresStore, claim: Claim, step: StepRecord) -> RunRecord:
    as_store: AsyncStore = store
    await store.record_step(claim, step)
    await store.record_step(claim, [step])  # type: ignore[arg-type]
    await store.get_run(b"run-1")  # type: ignore[arg-type]
    return await as_store.get_run(claim.run_id)


def forwarded_calls(adapter: SyncOverAsync, claim: Claim, step: StepRecord) -> RunRecord:
    as_store: Store = adapter
    adapter.record_step(claim, step)
    adapter.record_step(step, claim)  # type: ignore[arg-type]
    adapter.get_run(None)  # type: ignore[arg-type]
    return as_store.get_run(claim.run_id)
