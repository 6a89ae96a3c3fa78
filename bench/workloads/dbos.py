"""The workloads, written the way a DBOS user writes them: ``@DBOS.workflow()`` calling
``@DBOS.step()`` functions, one system database per measurement.

- W2: each step is given the whole state so far and returns one 200-byte message (DBOS records a
  step's output, not its inputs);
- W3: ``DBOS.register_queue("bench", worker_concurrency=1)`` in each of N worker processes, each
  with its own executor id; the runs are enqueued with ``DBOSClient``;
- W4: the run is started with a fixed workflow id; the recovery process relaunches DBOS with the
  same application version and executor id, which recovers pending workflows on launch.

Settings (looked up in dbos 3.4's source): DBOS opens SQLite with SQLAlchemy over ``sqlite3``
and sets ``busy_timeout`` and ``foreign_keys`` only — no journal mode, no ``synchronous`` — so
its default is SQLite's own: a rollback journal (``journal_mode=DELETE``) and
``synchronous=FULL``. ``equal`` gives it WAL (stored in the file, created before DBOS opens it)
and keeps ``synchronous=FULL``. On PostgreSQL DBOS sets no ``synchronous_commit`` (the server's
default, ``on``); ``equal`` sets ``synchronous_commit=on`` on its connections explicitly.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from dbos import DBOS, DBOSClient, SetWorkflowID

from .. import procs
from ..common import Database, Setting, Sizes, Stamps, fresh_database, growth, prepare_sqlite_file
from .shared import chunk, probe_points, recovery_figures

WORKLOADS = ("w1", "w2", "w3", "w4")
APP = "spbench"
QUEUE = "bench"
# DBOS polls its queues every 1 s by default; W3 would then measure mostly the polling. 50 ms
# is in DBOS's favour, and said so in the results.
QUEUE_POLL_S = 0.05
STAMPS = Stamps()
PROBE: Callable[[int], None] | None = None
_KILL_AT = int(os.environ.get("BENCH_KILL_AT", "-1"))
_calls: list[tuple[int, float]] = []
_entered: list[float] = []


def settings(setting: Setting) -> dict[str, Any]:
    equal = setting.mode == "equal"
    if setting.backend == "sqlite":
        return {
            "journal_mode": "WAL" if equal else "DELETE (SQLite's default)",
            "synchronous": "FULL (SQLite's default)",
            "floor": "wal_full" if equal else "delete_full",
            "w3_queue": f"worker_concurrency=1 per process, polling {QUEUE_POLL_S}s",
        }
    return {
        "synchronous_commit": "on (set on every connection)" if equal else "the server's default (on)",
        "floor": "pg_on",
        "w3_queue": f"worker_concurrency=1 per process, polling {QUEUE_POLL_S}s",
    }


def _url(db: Database) -> str:
    return db.sqlite_url if db.backend == "sqlite" else db.pg_url


def _config(url: str, equal: bool, executor_id: str | None = None) -> Any:
    config: dict[str, Any] = {
        "name": APP,
        "system_database_url": url,
        "log_level": "WARNING",
        "run_admin_server": False,
    }
    if equal and url.startswith("postgresql"):
        config["db_engine_kwargs"] = {"connect_args": {"options": "-c synchronous_commit=on"}}
    if executor_id is not None:
        config["executor_id"] = executor_id
    return config


def _launch(url: str, equal: bool, executor_id: str | None = None) -> None:
    DBOS(config=_config(url, equal, executor_id))
    DBOS.launch()


def _prepare(db: Database, equal: bool) -> None:
    if db.backend == "sqlite" and equal:
        assert db.path is not None
        prepare_sqlite_file(db.path, wal=True)


# -- the workflows -------------------------------------------------------------------------------


@DBOS.step()
def add(total: int, index: int) -> int:
    return total + index


@DBOS.workflow()
def w1(count: int) -> int:
    total = 0
    for index in range(count):
        total = add(total, index)
    return total


@DBOS.workflow()
def w3(count: int) -> dict[str, Any]:
    total = 0
    for index in range(count):
        total = add(total, index)
    return {"total": total, "ended": time.time()}  # when its last step was recorded


@DBOS.step()
def grow(state: list[str], index: int) -> str:
    STAMPS.mark()
    return chunk(index)


@DBOS.workflow()
def w2(count: int) -> int:
    state: list[str] = []
    probes = set(probe_points(count))
    for index in range(count):
        if PROBE is not None and index in probes:
            PROBE(index)
        state.append(grow(state, index))
    return len(state)


@DBOS.step()
def w4_step(total: int, index: int) -> int:
    _calls.append((index, time.perf_counter()))
    if index == _KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    return total + index


@DBOS.workflow()
def w4(count: int) -> int:
    _entered.append(time.perf_counter())
    total = 0
    for index in range(count):
        total = w4_step(total, index)
    return total


# -- the measurements ----------------------------------------------------------------------------


def measure(workload: str, setting: Setting, sizes: Sizes) -> dict[str, Any]:
    equal = setting.mode == "equal"
    with fresh_database(setting.backend, f"dbos_{workload}") as db:
        _prepare(db, equal)
        return {"w1": _w1, "w2": _w2, "w3": _w3, "w4": _w4}[workload](db, equal, sizes)


def _w1(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    _launch(_url(db), equal)
    try:
        started = time.perf_counter()
        w1(sizes.w1_steps)
        elapsed = time.perf_counter() - started
    finally:
        DBOS.destroy()
    return {"steps_per_s": sizes.w1_steps / elapsed}


def _w2(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    global PROBE
    _launch(_url(db), equal)
    probes: dict[int, int] = {0: db.bytes()}
    PROBE = lambda index: probes.__setitem__(index, db.bytes())  # noqa: E731
    STAMPS.times.clear()
    try:
        w2(sizes.w2_steps)
    finally:
        PROBE = None
        DBOS.destroy()
    probes[sizes.w2_steps] = db.bytes()
    return {
        **STAMPS.per_step(sizes.w2_window),
        "bytes": probes[sizes.w2_steps] - probes[0],
        "probes": probes,
        "growth": growth(probes),
    }


def _w3(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    url = _url(db)
    workers = [
        procs.spawn("dbos", "worker", {"url": url, "equal": equal, "executor": f"w{index}"})
        for index in range(sizes.w3_workers)
    ]
    client: DBOSClient | None = None
    try:
        for worker in workers:
            procs.wait_ready(worker)
        client = DBOSClient(system_database_url=url, application_name=APP)
        started = time.time()
        ids = [f"w3.{index}" for index in range(sizes.w3_runs)]
        for workflow_id in ids:
            client.enqueue(
                {"queue_name": QUEUE, "workflow_name": "w3", "workflow_id": workflow_id}, sizes.w3_steps
            )
        while True:
            done = client.list_workflows(workflow_ids=ids, status="SUCCESS", load_input=False)
            if len(done) >= sizes.w3_runs:
                break
            failed = client.list_workflows(workflow_ids=ids, status="ERROR", load_input=False)
            if failed:
                raise RuntimeError(f"W3 workflow failed: {failed[0]}")
            time.sleep(0.05)
        ended = max(status.output["ended"] for status in done)
    finally:
        if client is not None:
            client.destroy()
        procs.stop(workers)
    seconds = ended - started
    return {
        "steps_per_s": sizes.w3_runs * sizes.w3_steps / seconds,
        "seconds": seconds,
        "workers": sizes.w3_workers,
    }


def _w4(db: Database, equal: bool, sizes: Sizes) -> dict[str, Any]:
    args = {"url": _url(db), "equal": equal, "steps": sizes.w4_steps}
    victim = procs.spawn("dbos", "victim", args, env={"BENCH_KILL_AT": str(sizes.w4_kill_at)})
    _, err = victim.communicate(timeout=300)
    if victim.returncode != -signal.SIGKILL:
        raise RuntimeError(f"W4 victim was not killed (exit {victim.returncode}): {err[-1000:]}")
    started = time.perf_counter()
    recovered = procs.finish(procs.spawn("dbos", "recover", {**args, "kill_at": sizes.w4_kill_at}))
    recovered["process_s"] = time.perf_counter() - started
    return recovered


# -- child processes -----------------------------------------------------------------------------


def _worker(args: dict[str, Any]) -> None:
    _launch(args["url"], args["equal"], args["executor"])
    DBOS.register_queue(
        QUEUE, worker_concurrency=1, polling_interval_sec=QUEUE_POLL_S, on_conflict="always_update"
    )
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while not stopping:
        time.sleep(0.05)
    DBOS.destroy()


def _victim(args: dict[str, Any]) -> None:
    _launch(args["url"], args["equal"])
    with SetWorkflowID("w4"):
        w4(args["steps"])
    raise SystemExit("the victim was meant to be killed at its kill step")


def _recover(args: dict[str, Any]) -> None:
    started = time.perf_counter()
    DBOS(config=_config(args["url"], args["equal"]))
    opened = time.perf_counter()
    DBOS.launch()  # opens the system database and recovers this executor's pending workflows
    DBOS.retrieve_workflow("w4").get_result(polling_interval_sec=0.005)
    ended = time.perf_counter()
    DBOS.destroy()
    procs.emit(recovery_figures(started, opened, ended, _entered, _calls, args["kill_at"]))


if __name__ == "__main__":
    from ..common import quiet_logging

    quiet_logging()
    role, raw = sys.argv[1], json.loads(sys.argv[2])
    {"worker": _worker, "victim": _victim, "recover": _recover}[role](raw)
