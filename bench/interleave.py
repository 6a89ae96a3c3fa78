"""Two versions of safepoint, measured alternately: is a change faster, and by how much?

``python -m bench.interleave --old main --new WORKTREE --workload w1d --rounds 15`` runs the
workload once per version per round, each run in a process of its own that imports the
version's ``src`` (``WORKTREE``: this checkout's, uncommitted changes included; anything else:
a git revision, extracted to a temporary directory). The order alternates (old, new; new, old;
…) so that a machine that gets busier or quieter during the measurement weighs on both sides
alike. On a shared machine the wall clock says little; what it prints is, per version, the
median of

- ``cpu_ms``: CPU time of the client process (user + system) over the workload — what the
  library itself costs, whatever else the machine is doing;
- ``server_cpu_ms``: CPU time of the PostgreSQL backends serving the store's connections;
- ``wall_ms``: the elapsed time, as an indication;

and the median of the per-round ratios new/old (each ratio taken between neighbours in time).
Before the rounds, one run of each version counts what it sends: ``round_trips`` (the server's
ReadyForQuery messages, from libpq's protocol trace) and ``statements`` by their name in
``queries.sql``, per step or effect.

Workloads: ``w1d`` (W1 with every step durable: ``n`` sequential ``run.read`` steps) and
``w5`` (``n`` effects against the local HTTP effect owner), on a fresh PostgreSQL database per
run (``BENCH_PG_URL`` names the server, as for the benchmark). ``--old-params`` and
``--new-params`` add URL parameters to one side's store (``prepare_threshold=0``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .procs import ROOT

WORKTREE = "WORKTREE"
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")


# -- the child: one run of one workload ---------------------------------------------------------


def _backend_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a local PostgreSQL backend (``/proc``; 0 when unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) * _TICK_S


def _instrument(count: bool) -> tuple[list[Any], Counter[str], list[str]]:
    """Keep every connection the store opens (for its backend's CPU) and, when ``count``, trace
    its protocol to a file and count the named statements it executes."""
    import psycopg
    from psycopg import pq

    from safepoint.storage.plans import load_queries

    conns: list[Any] = []
    names: Counter[str] = Counter()
    traces: list[str] = []
    by_text = {text: name for name, text in load_queries("postgres").items()}
    original_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
    original_execute = psycopg.Cursor.execute  # Connection.execute runs its cursor's

    def connect(cls: Any, *args: Any, **kwargs: Any) -> Any:
        conn = original_connect(cls, *args, **kwargs)
        conns.append(conn)
        if count:
            fd, path = tempfile.mkstemp(prefix="interleave-trace-")
            traces.append(path)
            conn.pgconn.trace(fd)
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        return conn

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        names[by_text.get(query, "(other)") if isinstance(query, str) else "(composed)"] += 1
        return original_execute(self, query, *args, **kwargs)

    psycopg.Connection.connect = classmethod(connect)  # type: ignore[method-assign, assignment]
    if count:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign, assignment]
    return conns, names, traces


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import safepoint as sp

    from .common import fresh_database, quiet_logging
    from .workloads import safepoint as workloads

    quiet_logging()
    conns, names, traces = _instrument(spec["count"])
    n = spec["n"]
    with fresh_database("postgres", "interleave") as db:
        url = db.pg_url + (f"?{spec['params']}" if spec["params"] else "")
        store = sp.open_store(url)
        owner = None
        try:
            if spec["workload"] == "w5":
                from safepoint.testing.effects import OWNER_URL_ENV
                from safepoint.testing.owner import OwnerService

                owner = OwnerService().start()
                os.environ[OWNER_URL_ENV] = owner.url
            flow = workloads.w5 if spec["workload"] == "w5" else workloads.w1_durable
            names.clear()
            for path in traces:  # what opening the store sent is not the workload's
                os.truncate(path, 0)
            server_before = sum(_backend_cpu_s(conn.info.backend_pid) for conn in conns if not conn.closed)
            cpu_before, wall_before = time.process_time(), time.perf_counter()
            sp.start(store, flow, n, run_id="interleave")
            wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
            # Backends of connections opened during the run started from zero
            server = sum(_backend_cpu_s(conn.info.backend_pid) for conn in conns if not conn.closed)
            server -= server_before
        finally:
            store.close()
            if owner is not None:
                owner.stop()
    out: dict[str, Any] = {"wall_ms": wall * 1000, "cpu_ms": cpu * 1000, "server_cpu_ms": server * 1000}
    if spec["count"]:
        trips = 0
        for path in traces:
            trips += sum(1 for line in Path(path).read_text().splitlines() if "\tReadyForQuery" in line)
            os.unlink(path)
        out["round_trips"] = trips / n
        out["statements"] = {name: times / n for name, times in sorted(names.items())}
    return out


# -- the parent: versions, alternated -----------------------------------------------------------


def source_of(revision: str, into: Path) -> Path:
    """The ``src`` directory of a revision (``WORKTREE``: this checkout's own), extracted into
    the directory ``into``."""
    if revision == WORKTREE:
        return ROOT / "src"
    target = into
    target.mkdir()
    archive = git("archive", revision, "src")
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "src"


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=True)


def run_child(src: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.interleave", "--child", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr.strip()[-3000:]}")
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


def interleave(args: argparse.Namespace) -> dict[str, Any]:
    for side in ("old", "new"):  # a commit, not a name that may move during the rounds
        revision = getattr(args, side)
        if revision != WORKTREE:
            setattr(args, side, git("rev-parse", "--short", revision).stdout.decode().strip())
    sides = {"old": (args.old, args.old_params), "new": (args.new, args.new_params)}
    with tempfile.TemporaryDirectory(prefix="interleave-") as tmp:
        sources = {side: source_of(rev, Path(tmp) / side) for side, (rev, _) in sides.items()}

        def spec(side: str, count: bool) -> dict[str, Any]:
            return {"workload": args.workload, "n": args.n, "count": count, "params": sides[side][1]}

        counted = {side: run_child(sources[side], spec(side, True)) for side in sides}
        runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
        for index in range(args.rounds):
            order = ("old", "new") if index % 2 == 0 else ("new", "old")
            for side in order:
                runs[side].append(run_child(sources[side], spec(side, False)))
            print(
                f"round {index + 1}/{args.rounds}: "
                + ", ".join(f"{s} {runs[s][-1]['cpu_ms']:.0f} cpu ms" for s in ("old", "new")),
                file=sys.stderr,
            )
        shutil.rmtree(tmp, ignore_errors=True)
    metrics = ("cpu_ms", "server_cpu_ms", "wall_ms")
    report: dict[str, Any] = {
        "workload": args.workload,
        "n": args.n,
        "rounds": args.rounds,
        "old": {"revision": args.old, "params": args.old_params},
        "new": {"revision": args.new, "params": args.new_params},
    }
    for side in sides:
        report[side].update({m: statistics.median(r[m] for r in runs[side]) for m in metrics})
        report[side]["round_trips_per_op"] = counted[side]["round_trips"]
        report[side]["statements_per_op"] = counted[side]["statements"]
    report["new_over_old"] = {
        m: statistics.median(
            new[m] / old[m] for old, new in zip(runs["old"], runs["new"], strict=True) if old[m]
        )
        for m in metrics
    }
    report["runs"] = runs
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--old", default="HEAD", help="git revision, or WORKTREE (default HEAD)")
    parser.add_argument("--new", default=WORKTREE, help="git revision, or WORKTREE (the default)")
    parser.add_argument("--old-params", default="", help="URL parameters for the old side's store")
    parser.add_argument("--new-params", default="", help="URL parameters for the new side's store")
    parser.add_argument("--workload", choices=("w1d", "w5"), default="w1d")
    parser.add_argument("-n", type=int, default=None, help="steps (w1d, 1000) or effects (w5, 500)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--out", type=Path, help="also write the full report (every run) here")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    if args.n is None:
        args.n = 500 if args.workload == "w5" else 1000
    report = interleave(args)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    summary = {key: value for key, value in report.items() if key != "runs"}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
