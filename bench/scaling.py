"""How far one PostgreSQL carries: W3 at 1, 2, 4 and 8 worker processes, with the database's share.

``python -m bench.scaling [--workers 1,2,4,8] [--runs 32] [--steps 100] [--repeat 3] [--json FILE]``

Each trial is W3 as ``make bench`` runs it (``sp.Worker(store, concurrency=1)`` in each of N
processes, the runs submitted once every worker is ready, timed until the last step was
recorded) in a fresh database, once with W3's pure steps (written 64 to a commit) and once with
every step durable (``run.read``: one commit per step). Beside the throughput it measures what
the database did for it, so that a bigger server can be sized from per-step costs rather than
from this machine's wall clock:

- statements per step: every ``execute`` the workers' connections sent, counted in the workers;
- transactions per step: ``pg_stat_database.xact_commit`` of the trial's database, less what the
  driver sent (its submits and polls, counted the same way: each one an autocommit statement);
- server CPU per step: user + system time of the server processes serving the workers
  (``pg_stat_activity.application_name = 'safepoint'``), read from ``/proc`` while they live.
  The server's shared processes (WAL writer, checkpointer) are left out: they serve every
  database on the server.

``--claim`` picks the workers' claim statement (``default`` or ``per_run``, see
docs/scaling.md), so the two can be compared on one server.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import safepoint as sp

from . import procs
from .common import Database, fresh_database
from .workloads.safepoint import _add, w3

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
KINDS = ("pure", "durable")


@sp.workflow("bench.w3.durable")
def w3_durable(run: sp.Run, count: int) -> dict[str, Any]:
    """W3 with every step durable before the next (a read step is never written lazily)."""
    total = 0
    for index in range(count):
        total = run.read(f"step.{index}", _add, total, index)
    return {"total": total, "ended": time.time()}


class Counted:
    """Counts the statements this process's psycopg connections send (sync API)."""

    statements = 0

    @classmethod
    def install(cls) -> None:
        import psycopg

        original = (
            psycopg.Cursor.execute
        )  # Connection.execute runs its cursor's, as the store's kept cursor does

        def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            cls.statements += 1
            return original(self, *args, **kwargs)

        psycopg.Cursor.execute = execute  # type: ignore[method-assign, assignment]


def _cpu_of(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


class ServerCPU:
    """Samples the CPU time of the server processes serving one database's workers."""

    def __init__(self, admin_url: str, database: str) -> None:
        import psycopg

        self._conn = psycopg.connect(admin_url, autocommit=True)
        self._database = database
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _pids(self) -> list[int]:
        rows = self._conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name = 'safepoint'",
            (self._database,),
        ).fetchall()
        return [row[0] for row in rows]

    def sample(self) -> None:
        for pid in self._pids():
            cpu = _cpu_of(pid)
            if cpu is None:
                continue
            self._first.setdefault(pid, cpu)
            self._last[pid] = cpu
        for pid in list(self._last):  # a backend that left keeps its last reading
            cpu = _cpu_of(pid)
            if cpu is not None:
                self._last[pid] = cpu

    def start(self) -> None:
        self.sample()
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._conn.close()
        return sum(self._last[pid] - self._first[pid] for pid in self._last)


def _xact_commits(admin_url: str, database: str) -> int:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def trial(kind: str, workers: int, runs: int, steps: int, claim: str) -> dict[str, Any]:
    import psycopg

    from .common import PG_ADMIN_URL

    workflow = w3 if kind == "pure" else w3_durable
    with fresh_database("postgres", "scaling") as db:
        url = _url(db, claim)
        sp.open_store(url).close()  # migrated before any worker opens it
        before = _xact_commits(PG_ADMIN_URL, db.name)
        children = [_spawn({"url": url}) for _ in range(workers)]
        cpu = ServerCPU(PG_ADMIN_URL, db.name)
        driver_statements = 0
        try:
            for child in children:
                procs.wait_ready(child)
            time.sleep(0.5)  # every worker's first claim found nothing and it waits for work
            cpu.start()
            load = os.getloadavg()[0]
            started = time.time()
            store = sp.open_store(f"{db.pg_url}?application_name=spdriver")
            Counted.statements = 0
            for index in range(runs):
                sp.submit(store, workflow, steps, run_id=f"w3.{index}")
            store.close()
            driver_statements += Counted.statements
            with psycopg.connect(db.pg_url, autocommit=True, application_name="spdriver") as poll:
                while True:
                    driver_statements += 1
                    row = poll.execute(
                        "SELECT count(*) FILTER (WHERE status = 'completed'),"
                        " count(*) FILTER (WHERE status = 'failed') FROM safepoint_runs"
                    ).fetchone()
                    assert row is not None
                    if row[1]:
                        raise RuntimeError("a W3 run failed")
                    if row[0] >= runs:
                        break
                    time.sleep(0.05)
                ended = max(
                    json.loads(result)["ended"]
                    for (result,) in poll.execute("SELECT result FROM safepoint_runs").fetchall()
                )
                driver_statements += 1
            cpu.sample()
        finally:
            outputs = _stop(children)
        reports = [_report(out, child) for out, child in zip(outputs, children, strict=True)]
        server_cpu = cpu.stop()
        time.sleep(0.3)  # the backends have exited, so their counters are flushed
        commits = _xact_commits(PG_ADMIN_URL, db.name) - before - driver_statements
    seconds = ended - started
    total = runs * steps
    statements = sum(report["statements"] for report in reports)
    return {
        "kind": kind,
        "claim": claim,
        "workers": workers,
        "runs": runs,
        "steps": steps,
        "seconds": seconds,
        "steps_per_s": total / seconds,
        "runs_per_s": runs / seconds,
        "statements_per_step": statements / total,
        "commits_per_step": commits / total,
        "server_cpu_ms_per_step": 1000 * server_cpu / total,
        "worker_cpu_ms_per_step": 1000 * sum(report["cpu_s"] for report in reports) / total,
        "load_before": load,
    }


def _url(db: Database, claim: str) -> str:
    return db.pg_url if claim == "default" else f"{db.pg_url}?claim={claim}"


def _spawn(args: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.scaling", "worker", json.dumps(args)],
        cwd=procs.ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _stop(children: list[subprocess.Popen[str]]) -> list[str]:
    """SIGTERM drains each worker; what each printed, its report last."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    return [child.communicate(timeout=60)[0] for child in children]


def _report(out: str, child: subprocess.Popen[str]) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"worker {child.pid} printed no report (exit {child.returncode})")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def _worker(args: dict[str, Any]) -> None:
    Counted.install()
    store = sp.open_store(args["url"])
    print("ready", flush=True)
    Counted.statements = 0
    start = resource.getrusage(resource.RUSAGE_SELF)
    sp.Worker(store, concurrency=1).run()
    end = resource.getrusage(resource.RUSAGE_SELF)
    store.close()
    cpu = end.ru_utime + end.ru_stime - start.ru_utime - start.ru_stime
    procs.emit({"statements": Counted.statements, "cpu_s": cpu})


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling")
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--runs", type=int, default=32)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--claim", default="default", choices=("default", "per_run"))
    parser.add_argument("--json", type=Path)
    options = parser.parse_args(argv)
    Counted.install()
    results: list[dict[str, Any]] = []
    counts = [int(value) for value in options.workers.split(",")]
    for _ in range(options.repeat):  # interleaved, so a burst of load elsewhere hits every count
        for kind in options.kinds.split(","):
            for workers in counts:
                result = trial(kind, workers, options.runs, options.steps, options.claim)
                results.append(result)
                print(json.dumps(result), flush=True)
    print(
        f"{'kind':8} {'workers':>7} {'steps/s':>9} {'runs/s':>7} {'stmts/step':>10}"
        f" {'commits/step':>12} {'server ms/step':>14} {'worker ms/step':>14}"
    )
    for kind in options.kinds.split(","):
        for workers in counts:
            mine = [r for r in results if r["kind"] == kind and r["workers"] == workers]

            def med(key: str, rows: list[dict[str, Any]] = mine) -> float:
                return statistics.median(r[key] for r in rows)

            print(
                f"{kind:8} {workers:7d} {med('steps_per_s'):9.0f} {med('runs_per_s'):7.2f}"
                f" {med('statements_per_step'):10.3f} {med('commits_per_step'):12.3f}"
                f" {med('server_cpu_ms_per_step'):14.3f} {med('worker_cpu_ms_per_step'):14.3f}"
            )
    if options.json:
        options.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _worker(json.loads(sys.argv[2]))
    else:
        main(sys.argv[1:])
