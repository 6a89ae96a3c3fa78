"""Transaction steps end to end, on real SQLite files and a real PostgreSQL (sync and async):
the writes commit with the step record, replay never calls the function again, a crash before
the commit leaves nothing, a failure rolls back, and a stale worker commits nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import safepoint as sp
from app_orders import TABLE, orders, q
from safepoint.errors import LostOwnership, StaleCheckpoint, StepFailed, TransientFailure, UsageError
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.testing import SimulatedCrash
from safepoint.types import StepKind, StepStatus


class Calls:
    def __init__(self) -> None:
        self.count = 0


def insert_order(calls: Calls) -> Any:
    def insert(tx: Any, order_id: str) -> dict[str, Any]:
        calls.count += 1
        tx.execute(TABLE)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        return {"order": order_id, "rows": tx.execute("SELECT count(*) AS n FROM app_orders").fetchone()["n"]}

    return insert


def test_a_transaction_step_commits_its_rows_and_replays(
    store: sp.Store, store_url: str, crash_at: Any
) -> None:
    calls = Calls()
    insert = insert_order(calls)

    @sp.workflow("tx-replay")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id)

    crash_at("transaction.after_commit")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, "o-1", run_id="r", lease_ms=0)
    crash_at(None)
    assert orders(store_url) == ["o-1"]
    step = store.load_ledger("r").steps["order.insert"]
    assert (step.kind, step.status, step.result) == (
        StepKind.TRANSACTION,
        StepStatus.COMPLETED,
        {"order": "o-1", "rows": 1},
    )
    assert sp.resume(store, "r") == {"order": "o-1", "rows": 1}
    assert calls.count == 1  # replayed from the ledger, not called again
    assert orders(store_url) == ["o-1"]


def test_a_crash_before_the_commit_leaves_nothing(store: sp.Store, store_url: str, crash_at: Any) -> None:
    calls = Calls()
    insert = insert_order(calls)

    @sp.workflow("tx-before-commit")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id)

    crash_at("transaction.before_commit")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, "o-1", run_id="r", lease_ms=0)
    crash_at(None)
    assert orders(store_url) == []
    assert "order.insert" not in store.load_ledger("r").steps
    assert sp.resume(store, "r") == {"order": "o-1", "rows": 1}
    assert (calls.count, orders(store_url)) == (2, ["o-1"])


def test_a_function_that_raises_rolls_back_and_fails_the_step(store: sp.Store, store_url: str) -> None:
    calls = Calls()

    def insert(tx: Any, order_id: str) -> None:
        calls.count += 1
        tx.execute(TABLE)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        raise ValueError("out of stock")

    @sp.workflow("tx-fails")
    def flow(run: sp.Run, order_id: str) -> str:
        try:
            run.transaction("order.insert", insert, order_id)
        except StepFailed as failed:
            return f"failed: {failed.error_type}"
        return "inserted"

    assert sp.start(store, flow, "o-1", run_id="r") == "failed: ValueError"
    assert orders(store_url) == []
    step = store.load_ledger("r").steps["order.insert"]
    assert (step.status, step.error["type"]) == (StepStatus.FAILED, "ValueError")
    assert calls.count == 1


def test_a_transient_failure_is_tried_again_from_nothing(store: sp.Store, store_url: str) -> None:
    calls = Calls()

    def insert(tx: Any, order_id: str) -> int:
        calls.count += 1
        tx.execute(TABLE)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        if calls.count == 1:
            raise TransientFailure("the warehouse said: try again")
        return int(tx.execute("SELECT count(*) AS n FROM app_orders").fetchone()["n"])

    @sp.workflow("tx-retry")
    def flow(run: sp.Run, order_id: str) -> int:
        return run.transaction("order.insert", insert, order_id, retry=sp.Retry(attempts=3, backoff=0))

    assert sp.start(store, flow, "o-1", run_id="r") == 1  # the first attempt's row rolled back
    assert (calls.count, orders(store_url)) == (2, ["o-1"])
    assert [a.attempt for a in store.load_ledger("r").attempts.get("order.insert", [])] == [1]


def test_a_stale_worker_commits_nothing(
    store: sp.Store, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another owner claims the run just before this worker's transaction step reaches the
    store: the step raises LostOwnership, its function gets no further than its first
    statement, its rows are absent; the resume writes them once."""
    reached: list[str] = []

    def insert(tx: Any, order_id: str) -> dict[str, Any]:
        tx.execute(TABLE)  # a stale worker gets no further: LostOwnership is raised here
        reached.append(order_id)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        return {"order": order_id, "rows": tx.execute("SELECT count(*) AS n FROM app_orders").fetchone()["n"]}

    record_transaction = store.record_transaction

    def taken_over_first(claim: Any, step: Any, body: Any, family_key: Any = None) -> Any:
        record = store.get_run(claim.run_id)
        if record.fence == 1:  # the first worker: another owner takes the run from it now
            assert store.claim_run(
                claim.run_id, record.state_revision, "worker-b", 1, dead_owner=record.owner
            )
        return record_transaction(claim, step, body, family_key)

    monkeypatch.setattr(store, "record_transaction", taken_over_first)

    @sp.workflow("tx-fenced")
    def flow(run: sp.Run, order_id: str) -> Any:
        run.read("look", lambda: "seen")
        return run.transaction("order.insert", insert, order_id)

    with pytest.raises(LostOwnership):
        sp.start(store, flow, "o-1", run_id="r")
    assert (reached, orders(store_url)) == ([], [])
    ledger = store.load_ledger("r")
    assert "look" in ledger.steps
    assert "order.insert" not in ledger.steps
    assert sp.resume(store, "r") == {"order": "o-1", "rows": 1}
    assert (reached, orders(store_url)) == (["o-1"], ["o-1"])


def test_changed_inputs_block_even_under_replan(store: sp.Store, store_url: str, crash_at: Any) -> None:
    """A recorded transaction asked with other inputs cannot be asked again — its rows are
    committed — so the run blocks under either compatibility policy."""
    calls = Calls()
    insert = insert_order(calls)
    order = {"id": "o-1"}

    @sp.workflow("tx-stale", compatibility="replan")
    def flow(run: sp.Run) -> Any:
        return run.transaction("order.insert", insert, order["id"])

    crash_at("transaction.after_commit")
    with pytest.raises(SimulatedCrash):
        sp.start(store, flow, run_id="r", lease_ms=0)
    crash_at(None)
    order["id"] = "o-2"
    with pytest.raises(StaleCheckpoint):
        sp.resume(store, "r")
    assert (calls.count, orders(store_url)) == (1, ["o-1"])
    assert store.get_run("r").recovery_record["phase"] == "stale_checkpoint"


def test_steps_inside_the_function_and_async_functions_are_refused(store: sp.Store, store_url: str) -> None:
    def nested(tx: Any) -> None:
        tx.execute(TABLE)
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), ("nested",))
        sp.current_run().pure("inner", lambda: 1)

    async def coroutine(tx: Any) -> None:
        return None

    @sp.workflow("tx-nested")
    def flow(run: sp.Run, which: str) -> Any:
        return run.transaction("t", nested if which == "nested" else coroutine)

    with pytest.raises(UsageError, match="inside the function of transaction step 't'"):
        sp.start(store, flow, "nested", run_id="r1")
    with pytest.raises(UsageError, match="which is async"):
        sp.start(store, flow, "async", run_id="r2")
    assert orders(store_url) == []


def test_async_transaction_steps_on_the_async_postgres_store(pg_url: str, crash_at: Any) -> None:
    url = f"{pg_url}?schema=tx_async"
    calls = Calls()

    async def insert(tx: Any, order_id: str) -> int:
        calls.count += 1
        await tx.execute(TABLE)
        await tx.execute("INSERT INTO app_orders (id) VALUES (%s)", (order_id,))
        cur = await tx.execute("SELECT count(*) AS n FROM app_orders")
        return int((await cur.fetchone())["n"])

    @sp.workflow("tx-async")
    async def flow(run: sp.AsyncRun, order_id: str) -> list[int]:
        return [await run.transaction(f"order.{n}", insert, f"{order_id}.{n}") for n in range(3)]

    async def main() -> list[int]:
        store = await AsyncPostgresStore.open(url)
        try:
            crash_at("transaction.after_commit@2")
            with pytest.raises(SimulatedCrash):
                await sp.start_async(store, flow, "o", run_id="r", lease_ms=0)
            crash_at(None)
            assert orders(url) == ["o.0", "o.1"]
            return await sp.resume_async(store, "r")
        finally:
            await store.close()

    assert asyncio.run(main()) == [1, 2, 3]
    assert (calls.count, orders(url)) == (3, ["o.0", "o.1", "o.2"])


def test_an_async_run_on_sqlite_takes_a_plain_function(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    insert = insert_order(Calls())

    async def insert_async(tx: Any, order_id: str) -> None:
        return None

    @sp.workflow("tx-async-sqlite")
    async def flow(run: sp.AsyncRun, which: str) -> Any:
        return await run.transaction("t", insert if which == "plain" else insert_async, "o-1")

    store = sp.open_store(url)
    try:
        assert asyncio.run(sp.start_async(store, flow, "plain", run_id="r1")) == {"order": "o-1", "rows": 1}
        with pytest.raises(UsageError, match="returned an awaitable"):
            asyncio.run(sp.start_async(store, flow, "async", run_id="r2"))
    finally:
        store.close()
    assert orders(url) == ["o-1"]


def test_a_failing_first_statement_is_the_steps_failure(store: sp.Store, store_url: str) -> None:
    """The function's own statement fails — its first, which PostgreSQL sends with the fence —
    as the function's error: the step fails, nothing of it is kept, and the fence still holds."""

    def create(tx: Any) -> None:
        tx.execute("CREATE TABLE app_orders (id TEXT PRIMARY KEY)")
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), ("o-1",))

    def duplicate(tx: Any) -> None:
        tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), ("o-1",))

    @sp.workflow("tx-first-fails")
    def flow(run: sp.Run) -> str:
        run.transaction("create", create)
        try:
            run.transaction("again", duplicate)
        except StepFailed as failed:
            return failed.error_type
        return "inserted twice"

    assert sp.start(store, flow, run_id="r") in ("IntegrityError", "UniqueViolation")
    assert orders(store_url) == ["o-1"]
    assert store.load_ledger("r").steps["again"].status is StepStatus.FAILED
