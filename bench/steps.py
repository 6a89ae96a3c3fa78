"""Per-step cost on SQLite, beside the floor, in one run: `make bench` (or python bench/steps.py).

- floor: raw single-row commits/s (BEGIN IMMEDIATE; INSERT; COMMIT) at the same durability;
- record: one run of N sequential pure steps, each recorded in its own commit → steps/s;
- replay: resuming that run's ledger (every step returned from the ledger) → steps/s;
- effects: N effect steps with an in-process execute (no network) → effects/s.

Medians of --repeat repetitions; ratios are computed within this run, never across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import safepoint as sp
from safepoint import _crashpoints


@sp.workflow("bench.steps")
def many_steps(run: sp.Run, count: int) -> int:
    total = 0
    for index in range(count):
        total = run.pure("add", _add, total, index)
    return total


def _add(a: int, b: int) -> int:
    return a + b


_fx = sp.Effect("bench.fx", execute=lambda payload, key: {"ok": payload["i"]})


@sp.workflow("bench.effects")
def many_effects(run: sp.Run, count: int) -> int:
    for index in range(count):
        run.effect("fx", _fx, payload={"i": index})
    return count


def floor(path: Path, count: int, durability: sp.Durability) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    full = durability is sp.Durability.POWER_LOSS
    conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
    conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    started = time.perf_counter()
    for index in range(count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (index, "x" * 16))
        conn.execute("COMMIT")
    return count / (time.perf_counter() - started)


def once(workdir: Path, count: int, durability: sp.Durability) -> dict[str, float]:
    tag = f"{time.perf_counter_ns()}"
    store = sp.open_store(f"sqlite:///{workdir / f'{tag}.db'}", durability=durability)
    started = time.perf_counter()
    _crashpoints.arm("run.before_complete", mode="raise")
    with contextlib.suppress(_crashpoints.SimulatedCrash):
        sp.start(store, many_steps, count, run_id="r", lease_ms=0)
    recorded = count / (time.perf_counter() - started)
    _crashpoints.arm(None)
    started = time.perf_counter()
    sp.resume(store, "r")
    replayed = count / (time.perf_counter() - started)
    started = time.perf_counter()
    sp.start(store, many_effects, count, run_id="e")
    effects = count / (time.perf_counter() - started)
    return {"floor": floor(workdir / f"{tag}-floor.db", count, durability),
            "record": recorded, "replay": replayed, "effects": effects}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    opts = parser.parse_args()
    report: dict[str, Any] = {"steps": opts.steps, "repeat": opts.repeat, "python": sys.version}
    with tempfile.TemporaryDirectory() as tmp:
        for durability in sp.Durability:
            samples = [once(Path(tmp), opts.steps, durability) for _ in range(opts.repeat)]
            medians = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
            medians["record/floor"] = medians["record"] / medians["floor"]
            medians["effects/(floor/2)"] = medians["effects"] / (medians["floor"] / 2)
            report[durability.value] = medians
    print(f"{opts.steps} steps, median of {opts.repeat}:")
    print(f"{'durability':<15}{'floor c/s':>12}{'record st/s':>13}{'replay st/s':>13}"
          f"{'effects/s':>11}{'rec/floor':>11}{'fx/(fl/2)':>11}")
    for durability in sp.Durability:
        m = report[durability.value]
        print(f"{durability.value:<15}{m['floor']:>12,.0f}{m['record']:>13,.0f}"
              f"{m['replay']:>13,.0f}{m['effects']:>11,.0f}{m['record/floor']:>11.2f}"
              f"{m['effects/(floor/2)']:>11.2f}")
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
