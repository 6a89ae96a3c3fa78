"""An async workflow on the async PostgreSQL store, killed mid-effect and resumed, end to end."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

import safepoint as sp
from safepoint.errors import RunOwned
from safepoint.testing import OwnerService, SimulatedCrash
from safepoint.types import RunRecord, RunStatus


def test_crash_and_resume_on_the_async_store(pg_url: str, owner_env: OwnerService, crash_at: Any) -> None:
    import flows

    url = f"{pg_url}?schema=a_{uuid.uuid4().hex[:12]}"

    async def main() -> tuple[Any, RunRecord]:
        store = await sp.open_async_store(url)
        try:
            crash_at("effect.after_receiver_commit:effect.charge")
            with pytest.raises(SimulatedCrash):  # the owner committed; the ledger never heard
                await sp.start_async(store, flows.every_kind_async, "c-1", run_id="r", lease_ms=0)
            crash_at(None)
            result = await sp.resume_async(store, "r")
            return result, await store.get_run("r")
        finally:
            await store.close()

    result, run = asyncio.run(main())
    assert result == {"charge": "ch_1", "ticket": "tk_1", "route": "refund", "amount": 2500, "rows": 1}
    assert (run.status, run.fence) == (RunStatus.COMPLETED, 2)
    stats = owner_env.client.stats()
    assert (stats["applied"], stats["duplicates"]) == (2, 0)


def test_a_plain_workflow_cannot_use_an_async_store(pg_url: str) -> None:
    @sp.workflow("plain-on-async")
    def flow(run: sp.Run) -> int:
        return 1

    async def main() -> None:
        store = await sp.open_async_store(f"{pg_url}?schema=b_{uuid.uuid4().hex[:12]}")
        try:
            with pytest.raises(sp.UsageError, match="async store"):
                await sp.start_async(store, flow, run_id="r")
        finally:
            await store.close()

    asyncio.run(main())


def test_a_blocking_step_on_the_loop_keeps_its_lease(pg_url: str) -> None:
    """A plain (sync) SDK call inside an async workflow blocks the event loop for longer than
    the lease; the heartbeat renews without the loop, so a second resumer finds the run held
    and the model is asked once."""
    import threading
    import time

    url = f"{pg_url}?schema=c_{uuid.uuid4().hex[:12]}"
    calls: list[str] = []

    def blocking_model(**kwargs: Any) -> str:
        calls.append(threading.current_thread().name)
        time.sleep(2.0)
        return "answer"

    @sp.workflow("blocking-model")
    async def flow(run: sp.AsyncRun) -> str:
        return str(await run.model("draft", blocking_model, model="m", messages=[]))

    second: dict[str, Any] = {}

    def resume_meanwhile() -> None:
        time.sleep(1.3)  # past the 600 ms lease, had nobody renewed it
        store = sp.open_store(url)
        try:
            second["result"] = sp.resume(store, "r", lease_ms=600)
        except RunOwned as exc:
            second["owned"] = exc.owner
        finally:
            store.close()

    async def main() -> Any:
        store = await sp.open_async_store(url)
        try:
            thread = threading.Thread(target=resume_meanwhile)
            thread.start()
            result = await sp.start_async(store, flow, run_id="r", lease_ms=600)
            thread.join()
            return result
        finally:
            await store.close()

    assert asyncio.run(main()) == "answer"
    assert calls == ["MainThread"]
    assert "owned" in second, second


def test_the_async_store_can_refuse_a_schema_that_holds_no_ledger(pg_url: str) -> None:
    import psycopg

    schema = f"none_{uuid.uuid4().hex[:12]}"

    async def main() -> None:
        with pytest.raises(sp.UsageError, match="holds no safepoint ledger"):
            await sp.open_async_store(f"{pg_url}?schema={schema}", create=False)

    asyncio.run(main())
    with psycopg.connect(pg_url) as conn:
        found = conn.execute(
            "SELECT count(*) FROM information_schema.schemata WHERE schema_name = %s", (schema,)
        ).fetchone()
    assert found == (0,)
