"""A transaction step whose connection to PostgreSQL is lost while its function runs (a
failover, ``pg_terminate_backend``), sync and async: nothing of it committed, so the step is
tried again, each loss counted as an attempt; when its attempts run out the run stops,
resumably — a lost connection never fails a run for good."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import psycopg
import pytest

import safepoint as sp
from app_orders import TABLE, orders
from safepoint.errors import StepAttemptsExhausted
from safepoint.storage.postgres_async import AsyncPostgresStore
from safepoint.types import RunStatus


def schema_url(pg_url: str) -> str:
    return f"{pg_url}?schema=tx_lost_{uuid.uuid4().hex[:12]}"


def terminate(url: str, pid: int) -> None:
    """End a backend from another connection, as a failover or an operator would."""
    base, _, _ = url.partition("?schema=")
    with psycopg.connect(base, autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _losing_insert(url: str, calls: list[str], lose: int, by: str) -> Any:
    """A function whose connection is lost on its first ``lose`` calls: by itself (``self``)
    or from another connection while it runs (``other``), after it inserted its row."""

    def insert(tx: Any, order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        tx.execute(TABLE)
        tx.execute("INSERT INTO app_orders (id) VALUES (%s)", (order_id,))
        if len(calls) <= lose:
            if by == "self":
                tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            else:
                pid = tx.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"]
                terminate(url, pid)
                tx.execute("SELECT count(*) FROM app_orders")  # meets the closed connection
        return {"order": order_id, "call": len(calls)}

    return insert


@pytest.mark.parametrize("by", ["self", "other"])
def test_a_lost_connection_is_tried_again(pg_url: str, by: str) -> None:
    url, calls = schema_url(pg_url), []
    insert = _losing_insert(url, calls, 1, by)

    @sp.workflow(f"tx-lost-{by}")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id, retry=sp.Retry(attempts=3, backoff=0))

    store = sp.open_store(url)
    try:
        assert sp.start(store, flow, "o-1", run_id="r") == {"order": "o-1", "call": 2}
        ledger = store.load_ledger("r")
        assert [a.error["type"] for a in ledger.attempts["order.insert"]] == ["StoreUnavailable"]
        assert ledger.run.status is RunStatus.COMPLETED
    finally:
        store.close()
    assert orders(url) == ["o-1"]  # the first call's row went with its transaction


def test_a_step_tried_once_is_tried_again_after_a_lost_connection(pg_url: str) -> None:
    """No ``retry=``: the step is tried once for its own failures, but a lost connection is the
    store's, not the step's — it is tried again all the same."""
    url, calls = schema_url(pg_url), []
    insert = _losing_insert(url, calls, 1, "self")

    @sp.workflow("tx-lost-once")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id)

    store = sp.open_store(url)
    try:
        assert sp.start(store, flow, "o-1", run_id="r") == {"order": "o-1", "call": 2}
    finally:
        store.close()
    assert orders(url) == ["o-1"]


def test_when_its_attempts_run_out_the_run_stops_resumably(pg_url: str) -> None:
    url, calls = schema_url(pg_url), []
    insert = _losing_insert(url, calls, 3, "other")

    @sp.workflow("tx-lost-stops")
    def flow(run: sp.Run, order_id: str) -> Any:
        return run.transaction("order.insert", insert, order_id, retry=sp.Retry(attempts=2, backoff=0))

    store = sp.open_store(url)
    try:
        with pytest.raises(StepAttemptsExhausted):
            sp.start(store, flow, "o-1", run_id="r")
        run = store.get_run("r")
        assert (run.status, run.recovery_record["phase"]) == (RunStatus.STOPPED, "limit_reached")
        assert orders(url) == []
        sp.extend_limits(store, "r", step_attempts=4, by="ana", reason="the failover is over")
        assert sp.resume(store, "r") == {"order": "o-1", "call": 4}
    finally:
        store.close()
    assert orders(url) == ["o-1"]


@pytest.mark.parametrize("by", ["self", "other"])
def test_a_lost_connection_is_tried_again_on_the_async_store(pg_url: str, by: str) -> None:
    url, calls = schema_url(pg_url), []

    async def insert(tx: Any, order_id: str) -> dict[str, Any]:
        calls.append(order_id)
        await tx.execute(TABLE)
        await tx.execute("INSERT INTO app_orders (id) VALUES (%s)", (order_id,))
        if len(calls) == 1:
            if by == "self":
                await tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            else:
                cur = await tx.execute("SELECT pg_backend_pid() AS pid")
                await asyncio.to_thread(terminate, url, (await cur.fetchone())["pid"])
                await tx.execute("SELECT count(*) FROM app_orders")
        return {"order": order_id, "call": len(calls)}

    @sp.workflow(f"tx-lost-async-{by}")
    async def flow(run: sp.AsyncRun, order_id: str) -> Any:
        return await run.transaction("order.insert", insert, order_id)

    async def main() -> Any:
        store = await AsyncPostgresStore.open(url)
        try:
            result = await sp.start_async(store, flow, "o-1", run_id="r")
            return result, (await store.get_run("r")).status
        finally:
            await store.close()

    assert asyncio.run(main()) == ({"order": "o-1", "call": 2}, RunStatus.COMPLETED)
    assert orders(url) == ["o-1"]
