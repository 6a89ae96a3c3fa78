"""The workloads, written the way a safepoint user writes them.

- steps are ``run.pure`` calls, with step ids built from the loop index: pure steps are written
  lazily, 64 to a commit; W1 also measures ``run.read`` steps, each durable before the next;
- W2: each step is given the whole state so far (an agent's conversation) and returns one
  200-byte message, which the workflow appends to its state. The ledger keeps the step's input
  *hash* and its 200-byte result, never the state itself;
- W3: ``safepoint worker`` semantics — ``sp.Worker(store, concurrency=1)`` in each of N processes;
- W5: ``run.effect`` against the local effect owner, over HTTP on loopback;
- W5t, beside it: ``run.transaction`` steps, each inserting one row into an application table
  of the ledger's own database — the effect with no owner to call, in one commit — over the
  commit floor measured right after it, in the same cell.
- W6 and W7, the integrations' model turns: ``bench/workloads/models.py``.

Settings: ``defaults`` is ``durability="process_crash"`` (SQLite WAL + ``synchronous=NORMAL``;
PostgreSQL: the server's ``synchronous_commit``, ``on`` here); ``equal`` is
``durability="power_loss"`` (SQLite WAL + ``synchronous=FULL``; PostgreSQL
``synchronous_commit=on`` set on every connection).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import safepoint as sp
from safepoint.testing.effects import OWNER_URL_ENV, owner_effect
from safepoint.types import RunStatus

from .. import procs
from ..common import Database, Setting, Sizes, Stamps, durability_read_back, fresh_database, growth
from .shared import chunk, probe_points, recovery_figures

WORKLOADS = ("w1", "w2", "w3", "w4", "w5", "w5tx", "w6", "w7")
STAMPS = Stamps()
PROBE: Callable[[int], None] | None = None
_KILL_AT = int(os.environ.get("BENCH_KILL_AT", "-1"))
_calls: list[tuple[int, float]] = []
_entered: list[float] = []
_first_body_cpu: list[float] = []  # process_time() when W4's first step body ran


def settings(setting: Setting) -> dict[str, Any]:
    equal = setting.mode == "equal"
    if setting.backend == "sqlite":
        return {
            "durability": "power_loss" if equal else "process_crash",
            "journal_mode": "WAL",
            "synchronous": "FULL" if equal else "NORMAL",
            "floor": "wal_full" if equal else "wal_normal",
        }
    return {
        "durability": "power_loss" if equal else "process_crash",
        "synchronous_commit": "on (set on every connection)" if equal else "the server's default (on)",
        "floor": "pg_on",
    }


def _url(db: Database) -> str:
    return db.sqlite_url if db.backend == "sqlite" else db.pg_url


def _open(url: str, durability: str) -> sp.Store:
    return sp.open_store(url, durability=durability)


# -- the workflows -------------------------------------------------------------------------------


def _add(total: int, index: int) -> int:
    return total + index


@sp.workflow("bench.w1")
def w1(run: sp.Run, count: int) -> int:
    total = 0
    for index in range(count):
        total = run.pure(f"step.{index}", _add, total, index)
    return total


@sp.workflow("bench.w1.durable")
def w1_durable(run: sp.Run, count: int) -> int:
    """W1 with every step durable before the next: a read step is never written lazily."""
    total = 0
    for index in range(count):
        total = run.read(f"step.{index}", _add, total, index)
    return total


@sp.workflow("bench.w3")
def w3(run: sp.Run, count: int) -> dict[str, Any]:
    total = 0
    for index in range(count):
        total = run.pure(f"step.{index}", _add, total, index)
    return {"total": total, "ended": time.time()}  # when its last step was recorded


def _grow(state: Sequence[str], index: int) -> str:
    STAMPS.mark()
    return chunk(index)


@sp.workflow("bench.w2")
def w2(run: sp.Run, count: int, as_transcript: bool) -> int:
    """The state as safepoint's users hold a growing conversation — a ``Transcript``, hashed
    by reference — or as a plain list, hashed whole at every step."""
    state: sp.Transcript | list[str] = sp.Transcript() if as_transcript else []
    probes = set(probe_points(count))
    for index in range(count):
        if PROBE is not None and index in probes:
            PROBE(index)
        state.append(run.pure(f"grow.{index}", _grow, state, index))
    return len(state)


def _w4_step(total: int, index: int) -> int:
    _calls.append((index, time.perf_counter()))
    if not _first_body_cpu:
        _first_body_cpu.append(time.process_time())
    if index == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return total + index


@sp.workflow("bench.w4")
def w4(run: sp.Run, count: int) -> int:
    _entered.append(time.perf_counter())
    total = 0
    for index in range(count):
        total = run.pure(f"step.{index}", _w4_step, total, index)
    return total


# The owner's client keeps its connection between effects, as an application's pooled HTTP
# client does (the test suite's effects open one per request).
_tickets = owner_effect("tickets", keep_alive=True)


@sp.workflow("bench.w5")
def w5(run: sp.Run, count: int) -> int:
    for index in range(count):
        run.effect(f"fx.{index}", _tickets, payload={"i": index})
    return count


def _insert_row(tx: Any, index: int) -> int:
    query = "INSERT INTO app_rows (k, v) VALUES (?, ?)"
    tx.execute(query if tx.dialect == "sqlite" else query.replace("?", "%s"), (index, "x" * 16))
    return index


@sp.workflow("bench.w5tx")
def w5tx(run: sp.Run, count: int) -> int:
    for index in range(count):
        run.transaction(f"tx.{index}", _insert_row, index)
    return count


# -- the measurements ----------------------------------------------------------------------------


def measure(workload: str, setting: Setting, sizes: Sizes) -> dict[str, Any]:
    durability = settings(setting)["durability"]
    with fresh_database(setting.backend, f"sp_{workload}") as db:
        url = _url(db)
        return {
            "w1": _w1,
            "w2": _w2,
            "w3": _w3,
            "w4": _w4,
            "w5": _w5,
            "w5tx": _w5tx,
            "w6": _w6,
            "w7": _w7,
        }[workload](db, url, durability, sizes)


def _w1(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    """Pure steps, then (in a database of its own) read steps, each durable before the next,
    with the durability settings safepoint's own connections ran with, read back from them."""
    store = _open(url, durability)
    try:
        started = time.perf_counter()
        sp.start(store, w1, sizes.w1_steps, run_id="w1")
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    with fresh_database(db.backend, "sp_w1durable") as other, durability_read_back(other.backend) as read:
        store = _open(_url(other), durability)
        try:
            started = time.perf_counter()
            sp.start(store, w1_durable, sizes.w1_steps, run_id="w1.durable")
            durable = time.perf_counter() - started
            ran_with = read()
        finally:
            store.close()
    return {
        "steps_per_s": sizes.w1_steps / elapsed,
        "durable_steps_per_s": sizes.w1_steps / durable,
        "durable_ran_with": ran_with,
    }


def _w2(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    """The headline figures with a Transcript; the same with a plain list, prefixed ``list_``,
    each in a database of its own."""
    figures = _w2_once(db, url, durability, sizes, as_transcript=True)
    with fresh_database(db.backend, "sp_w2list") as other:
        plain = _w2_once(other, _url(other), durability, sizes, as_transcript=False)
    return {**figures, **{f"list_{key}": value for key, value in plain.items()}}


def _w2_once(db: Database, url: str, durability: str, sizes: Sizes, *, as_transcript: bool) -> dict[str, Any]:
    global PROBE
    store = _open(url, durability)
    probes: dict[int, int] = {0: db.bytes()}
    PROBE = lambda index: probes.__setitem__(index, db.bytes())  # noqa: E731
    STAMPS.times.clear()
    try:
        sp.start(store, w2, sizes.w2_steps, as_transcript, run_id="w2")
    finally:
        PROBE = None
        store.close()
    probes[sizes.w2_steps] = db.bytes()
    return {
        **STAMPS.per_step(sizes.w2_window),
        "bytes": probes[sizes.w2_steps] - probes[0],
        "probes": probes,
        "growth": growth(probes),
    }


def _w3(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    store = _open(url, durability)  # migrated before any worker opens it
    workers = [
        procs.spawn("safepoint", "worker", {"url": url, "durability": durability})
        for _ in range(sizes.w3_workers)
    ]
    try:
        for worker in workers:
            procs.wait_ready(worker)
        started = time.time()
        for index in range(sizes.w3_runs):
            sp.submit(store, w3, sizes.w3_steps, run_id=f"w3.{index}")
        while True:
            done = store.list_runs(RunStatus.COMPLETED, limit=sizes.w3_runs + 1)
            if len(done) >= sizes.w3_runs:
                break
            failed = store.list_runs(RunStatus.FAILED, limit=1)
            if failed:
                raise RuntimeError(f"W3 run failed: {failed[0].error}")
            time.sleep(0.05)
        ended = max(run.result["ended"] for run in done)
    finally:
        procs.stop(workers)
        store.close()
    seconds = ended - started
    return {
        "steps_per_s": sizes.w3_runs * sizes.w3_steps / seconds,
        "seconds": seconds,
        "workers": sizes.w3_workers,
    }


def _w4(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    _open(url, durability).close()
    args = {"url": url, "durability": durability, "steps": sizes.w4_steps}
    victim = procs.spawn("safepoint", "victim", args, env={"BENCH_KILL_AT": str(sizes.w4_kill_at)})
    victim.communicate(timeout=300)
    if victim.returncode != -signal.SIGKILL:
        raise RuntimeError(f"W4 victim was not killed (exit {victim.returncode})")
    started = time.perf_counter()
    recovered = procs.finish(procs.spawn("safepoint", "recover", {**args, "kill_at": sizes.w4_kill_at}))
    recovered["process_s"] = time.perf_counter() - started
    return recovered


def _w6(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    from .models import measure_w6

    return _with_models(url, durability, lambda store, models: measure_w6(store, models, sizes.w6_turns))


def _w7(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    from .models import measure_w7

    return _with_models(
        url, durability, lambda store, models: measure_w7(store, models, sizes.w7_turns, sizes.w7_window)
    )


def _with_models(
    url: str, durability: str, measure: Callable[[sp.Store, str], dict[str, Any]]
) -> dict[str, Any]:
    """``measure(store, models_url)`` with the store open and the fake model server up."""
    from .models import fake_server

    store = _open(url, durability)
    try:
        with fake_server() as models_url:
            return measure(store, models_url)
    finally:
        store.close()


def _w5(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    from safepoint.testing.owner import OwnerService

    from ..floor import http_floor

    store = _open(url, durability)
    try:
        with OwnerService() as owner:
            os.environ[OWNER_URL_ENV] = owner.url
            http = http_floor(owner.url, sizes.http_calls)
            started = time.perf_counter()
            sp.start(store, w5, sizes.w5_effects, run_id="w5")
            elapsed = time.perf_counter() - started
            created = owner.client.stats()
    finally:
        store.close()
    effects = sizes.w5_effects / elapsed
    # What is left per effect once the HTTP call is paid for: the ledger's own cost.
    ledger_s = max(1 / effects - 1 / http, 1e-9)
    return {
        "effects_per_s": effects,
        "http_per_s": http,
        "ledger_only_per_s": 1 / ledger_s,
        "owner_stats": created,
    }


def _w5tx(db: Database, url: str, durability: str, sizes: Sizes) -> dict[str, Any]:
    """Transaction steps, each one row and one commit with its step record, over the raw
    single-row commit floor of the same driver and durability, measured right after."""
    from ..floor import postgres_floor, sqlite_floor

    store = _open(url, durability)
    try:
        sp.start(store, w5tx_setup, run_id="w5tx.setup")
        started = time.perf_counter()
        sp.start(store, w5tx, sizes.w5_transactions, run_id="w5tx")
        elapsed = time.perf_counter() - started
    finally:
        store.close()
    with fresh_database(db.backend, "sp_w5tx_floor") as floor_db:
        if db.backend == "sqlite":
            full = durability == "power_loss"
            floor = sqlite_floor(floor_db, sizes.floor_commits, "WAL", "FULL" if full else "NORMAL")
        else:
            floor = postgres_floor(floor_db, sizes.floor_commits)
    per_s = sizes.w5_transactions / elapsed
    return {"transactions_per_s": per_s, "floor_per_s": floor, "floor_ratio": per_s / floor}


def _create_rows(tx: Any) -> None:
    tx.execute("CREATE TABLE app_rows (k INTEGER PRIMARY KEY, v TEXT)")


@sp.workflow("bench.w5tx.setup")
def w5tx_setup(run: sp.Run) -> None:
    run.transaction("create", _create_rows)


# -- child processes -----------------------------------------------------------------------------


def _worker(args: dict[str, Any]) -> None:
    store = _open(args["url"], args["durability"])
    print("ready", flush=True)
    sp.Worker(store, concurrency=1).run()
    store.close()


def _victim(args: dict[str, Any]) -> None:
    store = _open(args["url"], args["durability"])
    sp.start(store, w4, args["steps"], run_id="w4")
    raise SystemExit("the victim was meant to be killed at its kill step")


def _recover(args: dict[str, Any]) -> None:
    started = time.perf_counter()
    store = _open(args["url"], args["durability"])
    opened, opened_cpu = time.perf_counter(), time.process_time()
    sp.resume(store, "w4")
    ended = time.perf_counter()
    store.close()
    figures = recovery_figures(started, opened, ended, _entered, _calls, args["kill_at"])
    # The same span in this process's CPU time: what the replay costs, whatever else the machine
    # runs (the database server's share is not in it).
    cpu = _first_body_cpu[0] - opened_cpu
    figures["replay_cpu_s"] = cpu
    figures["replay_cpu_steps_per_s"] = figures["replayed"] / cpu if cpu > 0 else 0.0
    procs.emit(figures)


if __name__ == "__main__":
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    {"worker": _worker, "victim": _victim, "recover": _recover}[role](raw)
