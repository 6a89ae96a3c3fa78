"""The async PostgreSQL store beside the sync one run on threads: should ``AsyncPostgresStore``
stay a store of its own, or become ``asyncio.to_thread`` over ``PostgresStore`` (as DBOS runs
its sync engine under asyncio)?

``python -m bench.async_store [--ops 2000] [--tasks 32] [--rounds 5]``

Both sides run the same plans on the same server, with the same pool size (8 connections), in
one process, alternating round by round. Two shapes, each with one fenced write per operation
(``renew_lease``: one statement, one round trip) and one read (``get_run``):

- ``sequential``: one task awaiting ``--ops`` operations one after another (a workflow's steps);
- ``concurrent``: ``--tasks`` tasks at once, ``--ops`` operations between them (many runs in one
  event loop — the reason to use an async store at all).

It prints, per side and shape, the median operations per second and the client's CPU time per
operation (user + system of this process), and the ratio threads/async. The answer it gave is
in docs/benchmarks.md ("The async store").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from safepoint.storage.base import NewRun
from safepoint.storage.postgres import PostgresStore
from safepoint.storage.postgres_async import AsyncPostgresStore

from .common import fresh_database


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(op: Callable[[int], Awaitable[Any]], ops: int, tasks: int) -> tuple[float, float]:
    """(operations per second, client CPU microseconds per operation) of ``ops`` calls of
    ``op`` spread over ``tasks`` concurrent tasks."""
    per_task = ops // tasks

    async def task(first: int) -> None:
        for i in range(first, first + per_task):
            await op(i)

    cpu, began = _cpu(), time.perf_counter()
    await asyncio.gather(*(task(n * per_task) for n in range(tasks)))
    wall = time.perf_counter() - began
    return per_task * tasks / wall, (_cpu() - cpu) / (per_task * tasks) * 1e6


async def _trial(url: str, ops: int, tasks: int, rounds: int) -> dict[str, Any]:
    sync = PostgresStore(url, max_connections=8)
    asynchronous = await AsyncPostgresStore.open(url, max_connections=8)
    new = NewRun("bench", "bench", "1", "h", {}, "bench-worker", lease_ms=60_000)
    run, claim = sync.create_run(new)
    assert claim is not None
    sides: dict[str, Callable[[int], Awaitable[Any]]] = {
        "async": lambda i: asynchronous.renew_lease(claim) if i % 2 else asynchronous.get_run(run.run_id),
        "threads": lambda i: (
            asyncio.to_thread(sync.renew_lease, claim)
            if i % 2
            else asyncio.to_thread(sync.get_run, run.run_id)
        ),
    }
    found: dict[str, dict[str, list[tuple[float, float]]]] = {}
    try:
        for _ in range(rounds):
            for shape, concurrent in (("sequential", 1), ("concurrent", tasks)):
                order = list(sides.items())
                for name, op in order if _ % 2 == 0 else reversed(order):
                    found.setdefault(shape, {}).setdefault(name, []).append(
                        await _measure(op, ops, concurrent)
                    )
    finally:
        sync.close()
        await asynchronous.close()
    report: dict[str, Any] = {}
    for shape, by_side in found.items():
        cells = {
            name: {
                "ops_per_s": round(statistics.median(r[0] for r in results)),
                "cpu_us_per_op": round(statistics.median(r[1] for r in results), 1),
            }
            for name, results in by_side.items()
        }
        ratio = {key: cells["threads"][key] / cells["async"][key] for key in ("ops_per_s", "cpu_us_per_op")}
        cells["threads_over_async"] = {key: round(value, 3) for key, value in ratio.items()}
        report[shape] = cells
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with fresh_database("postgres", "sp_async_store") as db:
        report = asyncio.run(_trial(db.pg_url, args.ops, args.tasks, args.rounds))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
