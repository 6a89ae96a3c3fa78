"""Transaction steps whose function ends the ledger's transaction itself, on real SQLite files
and a real PostgreSQL (sync and async): a commit of its own, a helper library that commits on
the connection it is handed, a COMMIT hidden from the statement filter. The step may then have
committed without its record, so it is never reported as "nothing committed" and never run
again blindly: the run blocks for a person, who resolves it applied or not applied."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import safepoint as sp
from app_orders import TABLE, delete_orders, orders, q
from safepoint.errors import RetryRefused, RunBlocked
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.types import RunStatus


def save_order(conn: Any, tx: Any, order_id: str, how: str) -> None:
    """A helper library handed a DB-API connection (an ORM session's flush, a dataframe's
    ``to_sql``): it writes, then ends the transaction on its own."""
    conn.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
    if how == "commit()":
        conn.commit()
    else:
        conn.execute("COMMIT")


def _blocked_for_a_person(store: sp.Store, run_id: str) -> dict[str, Any]:
    run = store.get_run(run_id)
    assert run.status is RunStatus.BLOCKED
    record = run.recovery_record
    assert record is not None
    assert (record["phase"], record["step_id"]) == ("transaction_uncertain", "order.insert")
    assert "may have committed" in record["reason"]
    assert "Nothing of it was committed" not in record["reason"]
    return record


def _blocked_by_the_helper(store: sp.Store, name: str, calls: list[str], how: str) -> dict[str, Any]:
    """Run ``r``, whose transaction step hands its connection to a helper that commits (on its
    first call): it blocks for a person. Its recovery record."""

    def insert(tx: Any, order_id: str) -> dict[str, str]:
        calls.append(order_id)
        tx.execute(TABLE)
        if len(calls) == 1:  # the first call hands its connection to a helper that commits
            save_order(tx.driver_connection(), tx, order_id, how)
        else:
            tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), (order_id,))
        return {"order": order_id}

    @sp.workflow(name)
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id)

    with pytest.raises(RunBlocked, match="may have committed"):
        sp.start(store, flow, "o-1", run_id="r")
    return _blocked_for_a_person(store, "r")


@pytest.mark.parametrize("how", ["commit()", "COMMIT"])
def test_a_helper_that_commits_blocks_the_run_and_a_retry_writes_nothing_again(
    store: sp.Store, store_url: str, how: str
) -> None:
    calls: list[str] = []
    _blocked_by_the_helper(store, f"tx-helper-{how}", calls, how)
    assert orders(store_url) == ["o-1"]  # the helper's commit: it is there
    with pytest.raises(RetryRefused):
        sp.retry(store, "r", by="ana")
    with pytest.raises(RunBlocked):  # a resume finds the step as it was left: never run again
        sp.resume(store, "r")
    assert (calls, orders(store_url)) == (["o-1"], ["o-1"])


def test_a_function_that_raises_after_a_commit_of_its_own_blocks_the_run(
    store: sp.Store, store_url: str
) -> None:
    """The helper committed, then the function raised: the rows are committed all the same, so
    the step is not recorded failed (a retry would write them again) — the run blocks."""
    calls: list[str] = []

    def insert(tx: Any, order_id: str) -> None:
        calls.append(order_id)
        tx.execute(TABLE)
        save_order(tx.driver_connection(), tx, order_id, "commit()")
        raise ValueError("the warehouse answered late")

    @sp.workflow("tx-commit-then-raise")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id, retry=sp.Retry(attempts=3, backoff=0))

    with pytest.raises(RunBlocked, match="may have committed"):
        sp.start(store, flow, "o-1", run_id="r")
    _blocked_for_a_person(store, "r")
    with pytest.raises(RunBlocked):
        sp.resume(store, "r")
    assert (calls, orders(store_url)) == (["o-1"], ["o-1"])


def test_resolved_applied_the_step_takes_the_persons_value(store: sp.Store, store_url: str) -> None:
    calls: list[str] = []
    record = _blocked_by_the_helper(store, "tx-helper-applied", calls, "commit()")
    sp.resolve(
        store,
        "r",
        "applied",
        revision=record["state_revision"],
        by="ana",
        receipt={"order": "o-1"},
        evidence="row o-1 is in app_orders",
    )
    assert sp.resume(store, "r") == {"order": "o-1"}
    assert (calls, orders(store_url)) == (["o-1"], ["o-1"])  # the function was not called again
    assert sp.resume(store, "r") == {"order": "o-1"}


def test_resolved_not_applied_the_step_runs_again(store: sp.Store, store_url: str) -> None:
    calls: list[str] = []
    record = _blocked_by_the_helper(store, "tx-helper-not-applied", calls, "COMMIT")
    delete_orders(store_url)  # the person undid what the helper committed
    sp.resolve(store, "r", "not_applied", revision=record["state_revision"], by="ana")
    assert sp.resume(store, "r") == {"order": "o-1"}
    assert (calls, orders(store_url)) == (["o-1", "o-1"], ["o-1"])


def test_the_cursor_hands_out_no_connection(store: sp.Store, store_url: str) -> None:
    """``tx.execute`` returns rows to read, not the driver's cursor: no way from it to the
    driver's connection (and its ``commit``)."""

    def insert(tx: Any) -> bool:
        tx.execute(TABLE)
        cursor = tx.execute(q(tx, "INSERT INTO app_orders (id) VALUES (?)"), ("o-1",))
        return any(hasattr(cursor, name) for name in ("connection", "commit", "close", "execute"))

    @sp.workflow("tx-cursor")
    def flow(run: sp.Run) -> Any:
        return run.transaction("order.insert", insert)

    assert sp.start(store, flow, run_id="r") is False
    assert orders(store_url) == ["o-1"]


@pytest.mark.parametrize(
    "statement",
    [
        "/* /* nested */ */ COMMIT",  # PostgreSQL nests comments: the filter reads past it
        "SELECT 1; COMMIT",  # two statements in one: the simple query protocol runs both
        "SELECT 1; COMMIT; BEGIN",  # and a new transaction opened in its place
    ],
)
def test_a_commit_hidden_from_the_filter_blocks_the_run(pg_url: str, statement: str) -> None:
    url = f"{pg_url}?schema=tx_hidden_{uuid.uuid4().hex[:12]}"
    calls: list[str] = []

    def insert(tx: Any, order_id: str) -> dict[str, str]:
        calls.append(order_id)
        tx.execute(TABLE)
        tx.execute("INSERT INTO app_orders (id) VALUES (%s)", (order_id,))
        tx.execute(statement)
        return {"order": order_id}

    @sp.workflow("tx-hidden")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id)

    store = sp.open_store(url)
    try:
        with pytest.raises(RunBlocked, match="may have committed"):
            sp.start(store, flow, "o-1", run_id="r")
        _blocked_for_a_person(store, "r")
        with pytest.raises(RetryRefused):
            sp.retry(store, "r", by="ana")
        with pytest.raises(RunBlocked):
            sp.resume(store, "r")
    finally:
        store.close()
    assert (calls, orders(url)) == (["o-1"], ["o-1"])


@pytest.mark.parametrize("how", ["commit()", "COMMIT", "SELECT 1; COMMIT"])
def test_an_async_function_that_commits_blocks_the_run(pg_url: str, how: str) -> None:
    url = f"{pg_url}?schema=tx_async_commit_{uuid.uuid4().hex[:12]}"
    calls: list[str] = []

    async def insert(tx: Any, order_id: str) -> dict[str, str]:
        calls.append(order_id)
        await tx.execute(TABLE)
        await tx.execute("INSERT INTO app_orders (id) VALUES (%s)", (order_id,))
        if how == "commit()":
            await (await tx.driver_connection()).commit()
        elif how == "COMMIT":
            await (await tx.driver_connection()).execute("COMMIT")
        else:
            await tx.execute(how)
        return {"order": order_id}

    @sp.workflow("tx-async-commit")
    async def flow(run: sp.AsyncRun, order_id: str) -> Any:
        return await run.transaction("order.insert", insert, order_id)

    async def main() -> dict[str, Any]:
        store = await AsyncPostgresStore.open(url)
        try:
            with pytest.raises(RunBlocked, match="may have committed"):
                await sp.start_async(store, flow, "o-1", run_id="r")
            record = (await store.get_run("r")).recovery_record
            with pytest.raises(RetryRefused):
                await sp.retry_async(store, "r", by="ana")
            with pytest.raises(RunBlocked):
                await sp.resume_async(store, "r")
            return record or {}
        finally:
            await store.close()

    record = asyncio.run(main())
    assert (record["phase"], record["step_id"]) == ("transaction_uncertain", "order.insert")
    assert (calls, orders(url)) == (["o-1"], ["o-1"])
