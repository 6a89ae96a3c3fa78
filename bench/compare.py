"""Before/after, in CPU time: the same workload on two source trees, interleaved.

    python -m bench.compare BEFORE_SRC AFTER_SRC [--reps 7] [--backends sqlite,postgres]

Each repetition runs every (workload, backend) once per tree, one right after the other, each in
a fresh process whose ``PYTHONPATH`` is that tree's ``src``; the process reports the CPU time it
spent in the workload (``time.process_time``: this process's own work, not the database
server's, and far less moved by whatever else the machine runs than wall time) and its wall time.
The medians of each tree are printed side by side, with after/before. This is the judge of a
change to the hot path; ``bench.run`` measures the peers and the floors.

On a busy machine CPU time still moves by ±10-25 %. ``--calls`` adds what does not move: the
Python function calls each tree makes in the workload (counted by ``cProfile`` in one more
process per tree), a deterministic measure of the work a change adds to every step.

The workloads use only the oldest public API (``open_store``, ``workflow``, ``run.read``,
``run.effect``, ``start``, the testing owner), so any two trees of the project can be compared:
- ``w1``: 1000 ``run.read`` steps, each durable before the next, in one run;
- ``w5``: 100 effects against the local effect owner over HTTP on loopback, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

from .common import PG_ADMIN_URL

WORKLOADS = ("w1", "w5")
_CHILD = r"""
import contextlib, json, os, sys, time, uuid
import safepoint as sp
from safepoint.testing.effects import owner_effect
from safepoint.testing.owner import OwnerService

workload, url = sys.argv[1], sys.argv[2]
store = sp.open_store(url)
with contextlib.ExitStack() as stack:
    if workload == "w1":
        @sp.workflow("compare-w1")
        def flow(run):
            return [run.read(f"r{i}", lambda n: n, i) for i in range(1000)][-1]
    else:
        owner = stack.enter_context(OwnerService())
        os.environ["SAFEPOINT_OWNER_URL"] = owner.url
        effect = owner_effect("refunds")

        @sp.workflow("compare-w5")
        def flow(run):
            return [run.effect(f"e{i}", effect, payload={"n": i}) for i in range(100)][-1]
    calls = None
    if os.environ.get("SP_COMPARE_CALLS"):
        import cProfile, pstats
        sp.start(store, flow, run_id="warm-" + uuid.uuid4().hex)  # imports and caches first
        profile = cProfile.Profile()
        profile.enable()
    cpu, wall = time.process_time(), time.perf_counter()
    sp.start(store, flow, run_id=workload + "-" + uuid.uuid4().hex)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if os.environ.get("SP_COMPARE_CALLS"):
        profile.disable()
        calls = pstats.Stats(profile).total_calls
store.close()
print(json.dumps({"cpu_ms": cpu * 1000, "wall_ms": wall * 1000, "calls": calls}))
"""


def _store_url(backend: str, workdir: Path) -> tuple[str, str | None]:
    """A fresh ledger for one process: a new SQLite file, or a new PostgreSQL database."""
    if backend == "sqlite":
        return f"sqlite:///{workdir / (uuid.uuid4().hex + '.db')}", None
    import psycopg  # the postgres extra: only when PostgreSQL is compared

    name = "sp_compare_" + uuid.uuid4().hex[:10]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name, name


def _drop(name: str | None) -> None:
    if name is None:
        return
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(src: Path, workload: str, backend: str, workdir: Path, calls: bool = False) -> dict[str, float]:
    url, database = _store_url(backend, workdir)
    try:
        env = {**os.environ, "PYTHONPATH": str(src), **({"SP_COMPARE_CALLS": "1"} if calls else {})}
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, workload, url],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
        return figures
    finally:
        _drop(database)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="the src directory of the tree before")
    parser.add_argument("after", type=Path, help="the src directory of the tree after")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--calls", action="store_true", help="also count Python function calls")
    args = parser.parse_args(argv)
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / ("sp-compare-" + uuid.uuid4().hex[:8])
    workdir.mkdir(parents=True)
    cells = [(w, b) for w in args.workloads.split(",") for b in args.backends.split(",")]
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for rep in range(args.reps):
        for workload, backend in cells:
            # alternate which tree goes first, so neither always runs on a warmer machine
            order = [("before", args.before), ("after", args.after)]
            for side, src in order if rep % 2 == 0 else order[::-1]:
                figures = measure(src.resolve(), workload, backend, workdir)
                results.setdefault((workload, backend, side), []).append(figures)
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)
    print("| workload | backend | CPU ms before | CPU ms after | after/before", end="")
    print(" | wall ms before | wall ms after |")
    print("|---|---|---|---|---|---|---|")
    for workload, backend in cells:
        med = {
            (side, kind): statistics.median(r[kind] for r in results[(workload, backend, side)])
            for side in ("before", "after")
            for kind in ("cpu_ms", "wall_ms")
        }
        print(
            f"| {workload} | {backend} | {med['before', 'cpu_ms']:.1f} | {med['after', 'cpu_ms']:.1f}"
            f" | {med['after', 'cpu_ms'] / med['before', 'cpu_ms']:.3f}"
            f" | {med['before', 'wall_ms']:.1f} | {med['after', 'wall_ms']:.1f} |"
        )
    if args.calls:
        print("\n| workload | backend | calls before | calls after | after/before |")
        print("|---|---|---|---|---|")
        for workload, backend in cells:
            before, after = (
                measure(src.resolve(), workload, backend, workdir, calls=True)["calls"]
                for src in (args.before, args.after)
            )
            print(f"| {workload} | {backend} | {before:.0f} | {after:.0f} | {after / before:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
