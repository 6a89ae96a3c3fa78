"""Checked by mypy --strict (``make lint``): the store operations declared in one line each
(``safepoint.storage.operations``: the shared ones, and ``postgres.operations``), and
``SyncOverAsync``'s forwarding, keep the signatures of the plans they run (of the contract), so
their callers are checked as before. The lines marked
``# type: ignore[arg-type]`` are mistakes mypy must keep catching: strict mode warns about an
ignore that has nothing left to ignore, so an operation whose calls went unchecked fails the
check."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from safepoint.storage.base import AsyncStore, ForkRun, Store
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.storage.sqlite import SqliteStore
from safepoint.testing.sync_over_async import SyncOverAsync
from safepoint.types import Claim, RunRecord, StepRecord


def shared_calls(store: SqliteStore, claim: Claim, fork: ForkRun) -> RunRecord:
    as_store: Store = store  # the reads every store shares, and its own methods
    store.fork_run(fork)
    store.fork_run(claim)  # type: ignore[arg-type]
    store.find_run(42)  # type: ignore[arg-type]
    return as_store.get_run(claim.run_id)


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


def forwarded_calls(opened: Callable[[], Awaitable[AsyncStore]], claim: Claim, step: StepRecord) -> RunRecord:
    adapter = SyncOverAsync(opened)
    as_store: Store = adapter
    adapter.record_step(claim, step)
    adapter.record_step(step, claim)  # type: ignore[arg-type]
    adapter.get_run(None)  # type: ignore[arg-type]
    return as_store.get_run(claim.run_id)
