"""Offline replay, measured: how many runs ``check_deploy`` replays a second, on SQLite and on
PostgreSQL side by side, and where a run's time goes — reading it from the store, or replaying it.

``python -m bench.replay [--runs 2000] [--reads 16] [--rounds 3] [--backend both]
[--postgres postgresql://root@127.0.0.1:5432/test]``

Each ledger is made for the measurement — an SQLite file in a temporary directory, a schema of
its own on PostgreSQL, dropped after — and filled through the engine, as an application would,
with ``--runs`` runs of one workflow left waiting: ``--reads`` reads, a pure step, a decision,
an effect (a local one: no owner to call), a value, then a wait for a message (``--reads`` + 5
steps a run). Then, on each ledger in turn:

- ``check_deploy`` over every run, ``--rounds`` times: runs replayed a second (the median);
- every run read (``testing.recorded``: the run, its steps, operations, attempts, the payloads,
  approvals, messages and events) and replayed (``replay_recorded``) apart, each timed: the
  milliseconds a run of each, and the share of reading;
- the store calls a run's read makes and, on PostgreSQL, the statements psycopg sends for it.

One JSON line per backend on stdout, then one with the ratios PostgreSQL / SQLite; a summary
on stderr. docs/benchmarks.md quotes what it gave.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any

import safepoint as sp
from safepoint.testing import check_deploy, recorded, replay_recorded
from safepoint.types import RunStatus

from .common import count_statements, fresh_database, quiet_logging

PG_URL = os.environ.get("BENCH_REPLAY_PG_URL", "postgresql://root@127.0.0.1:5432/test")
WORKFLOW = "bench.replay"
_READS = ("load_ledger", "get_artifact", "approvals", "messages", "events", "get_run")  # counted

_shipments = sp.Effect("bench.replay.ship", execute=lambda payload, key: {"id": f"s-{payload['order']}"})


def _lookup(order: int, i: int) -> dict[str, int]:
    return {"order": order, "line": i, "stock": (order * 7 + i) % 11}


@sp.workflow(WORKFLOW, version="1")
def waiting_run(run: sp.Run, order: int, reads: int) -> dict[str, Any]:
    """An agent-like run left waiting: reads, a pure step, a decision, an effect, a value, a wait."""
    lines = [run.read(f"read.{i}", _lookup, order, i) for i in range(reads)]
    stock = run.pure("stock", lambda found: sum(line["stock"] for line in found), lines)
    route = run.decide("route", lambda total: "ship" if total else "hold", stock)
    sent = run.effect("ship", _shipments, payload={"order": order, "route": route}, operation_id="ship")
    stamp = run.uuid("stamp")
    word = run.wait_for("confirm")
    return {"sent": sent["id"], "stamp": stamp, "word": word}


def _fill(url: str, runs: int, reads: int, threads: int) -> float:
    """Start ``runs`` runs, each left waiting for its message; the seconds it took."""
    began = time.perf_counter()
    store = sp.open_store(url)
    try:

        def one(n: int) -> None:
            with suppress(sp.AwaitingMessage):  # left waiting, as meant
                sp.start(store, waiting_run, n, reads, run_id=f"bench-replay-{n:06d}")

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(runs)))
    finally:
        store.close()
    return time.perf_counter() - began


@contextmanager
def _ledger(backend: str, pg_url: str) -> Iterator[str]:
    """The URL of a fresh, empty ledger, removed afterwards."""
    if backend == "sqlite":
        with fresh_database("sqlite", "replay") as db:
            yield db.sqlite_url
        return
    import psycopg
    from psycopg import sql

    schema = f"bench_replay_{uuid.uuid4().hex[:10]}"
    try:
        yield f"{pg_url}{'&' if '?' in pg_url else '?'}schema={schema}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def _deploy_checks(store: sp.Store, runs: int, rounds: int) -> list[float]:
    """Seconds of each of ``rounds`` ``check_deploy`` over the ledger (each must pass whole)."""
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        check = check_deploy(store, workflows=[WORKFLOW])
        took.append(time.perf_counter() - began)
        if not check.ok or len(check.reports) != runs:
            raise AssertionError(f"check_deploy did not pass on every run: {check.summary()}")
    return took


def _split(store: sp.Store, run_ids: list[str]) -> tuple[list[float], list[float]]:
    """Per run, the seconds to read it and the seconds to replay what was read."""
    reading, replaying = [], []
    for run_id in run_ids:
        began = time.perf_counter()
        found = recorded(store, run_id)
        read = time.perf_counter()
        report = replay_recorded(found)
        reading.append(read - began)
        replaying.append(time.perf_counter() - read)
        if not report.ok:
            raise AssertionError(f"{run_id} did not replay: {report.why}")
    return reading, replaying


def _calls_of_a_read(store: sp.Store, run_id: str, backend: str) -> dict[str, Any]:
    """The store calls one run's read makes, and on PostgreSQL the statements psycopg sends."""
    calls: Counter[str] = Counter()
    for name in _READS:
        method = getattr(store, name)

        def counted(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(store, name, counted)
    sent: Counter[str] = Counter()
    restore = count_statements(sent) if backend == "postgres" else None
    try:
        recorded(store, run_id)
    finally:
        if restore is not None:
            restore()
        for name in _READS:
            store.__dict__.pop(name, None)
    found: dict[str, Any] = {"store_calls": dict(sorted(calls.items()))}
    if restore is not None:
        found["statements"] = dict(sorted(sent.items()))
    return found


def measure(backend: str, runs: int, reads: int, rounds: int, pg_url: str) -> dict[str, Any]:
    """Fill a fresh ledger of ``backend`` with ``runs`` waiting runs and measure their replay."""
    with _ledger(backend, pg_url) as url:
        fill_s = _fill(url, runs, reads, 4 if backend == "postgres" else 1)
        store = sp.open_store(url)
        try:
            run_ids = sorted(run.run_id for run in store.list_runs(RunStatus.WAITING, runs))
            took = _deploy_checks(store, runs, rounds)
            reading, replaying = _split(store, run_ids)
            calls = _calls_of_a_read(store, run_ids[0], backend)
        finally:
            store.close()
    ms = 1000 / runs
    read_ms, replay_ms = sum(reading) * ms, sum(replaying) * ms
    return {
        "backend": backend,
        "runs": runs,
        "steps_a_run": reads + 5,
        "fill_s": round(fill_s, 2),
        "check_deploy_s": [round(t, 3) for t in took],
        "runs_per_s": round(runs / statistics.median(took)),
        "ms_a_run": round(statistics.median(took) * ms, 3),
        "read_ms_a_run": round(read_ms, 3),
        "replay_ms_a_run": round(replay_ms, 3),
        "read_share": round(read_ms / (read_ms + replay_ms), 3),
        "read_ms_median": round(statistics.median(reading) * 1000, 3),
        "replay_ms_median": round(statistics.median(replaying) * 1000, 3),
        **calls,
    }


def ratios(sqlite: dict[str, Any], postgres: dict[str, Any]) -> dict[str, Any]:
    """PostgreSQL's figures over SQLite's."""
    keys = ("runs_per_s", "ms_a_run", "read_ms_a_run", "replay_ms_a_run")
    return {"postgres_over_sqlite": {key: round(postgres[key] / sqlite[key], 2) for key in keys}}


def _summary(figures: dict[str, Any]) -> str:
    return (
        f"{figures['backend']}: {figures['runs_per_s']} runs/s replayed by check_deploy"
        f" ({figures['ms_a_run']} ms a run of {figures['steps_a_run']} steps); apart,"
        f" reading {figures['read_ms_a_run']} ms + replaying {figures['replay_ms_a_run']} ms a run"
        f" ({figures['read_share']:.0%} reading); a read makes {figures['store_calls']}"
        + (f", {figures['statements']}" if "statements" in figures else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000, help="waiting runs in the ledger (2000)")
    parser.add_argument("--reads", type=int, default=16, help="read steps a run (16: 21 steps a run)")
    parser.add_argument("--rounds", type=int, default=3, help="check_deploy passes a ledger (3)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--postgres", default=PG_URL, help=f"a PostgreSQL database ({PG_URL})")
    args = parser.parse_args(argv)
    quiet_logging()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    found = {}
    for backend in backends:
        found[backend] = measure(backend, args.runs, args.reads, args.rounds, args.postgres)
        print(json.dumps(found[backend]), flush=True)
        print(_summary(found[backend]), file=sys.stderr, flush=True)
    if len(found) == 2:
        print(json.dumps(ratios(found["sqlite"], found["postgres"])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
