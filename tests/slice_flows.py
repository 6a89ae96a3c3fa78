"""Workflows the slices tests carry on in slices, in child processes too (importable as
``slice_flows``): a long run of cheap steps with a handful of effects among them, sent to the
local effect owner (``$SAFEPOINT_OWNER_URL``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import safepoint as sp
from safepoint.testing import owner_effect

tickets = owner_effect("tickets")


def add(i: int, total: int) -> int:
    time.sleep(0.001)  # cheap, but not free: a run of 1000 takes more than one short slice
    return total + i


@sp.workflow("slices-long", version="1")
def long_run(run: sp.Run, steps: int, every: int) -> dict[str, Any]:
    """``steps`` cheap steps, a ticket after every ``every`` of them (step ``ticket.<i>``)."""
    total, ids = 0, []
    for i in range(steps):
        total = run.pure(f"add.{i}", add, i, total)
        if i % every == every - 1:
            receipt = run.effect(f"ticket.{i}", tickets, payload={"i": i, "total": total})
            ids.append(receipt["id"])
    return {"total": total, "tickets": ids}


async def add_async(i: int, total: int) -> int:
    await asyncio.sleep(0.001)
    return total + i


@sp.workflow("slices-long-async", version="1")
async def long_run_async(run: sp.AsyncRun, steps: int, every: int) -> dict[str, Any]:
    """``long_run``, as an ``async def`` workflow."""
    total, ids = 0, []
    for i in range(steps):
        total = await run.pure(f"add.{i}", add_async, i, total)
        if i % every == every - 1:
            receipt = await run.effect(f"ticket.{i}", tickets, payload={"i": i, "total": total})
            ids.append(receipt["id"])
    return {"total": total, "tickets": ids}
