"""CPU time per step of safepoint's own Python, for two source trees, interleaved.

``python -m bench.cpu --base /tmp/base/src --new src`` measures each workload in a fresh process
per measurement, alternating the two trees (the order swapped every round), and prints, per
workload, the median CPU time per step of each tree and the median of the paired ratios
base/new (> 1: the new tree is faster). CPU time (``time.process_time``: this process's user
and system time, SQLite's included) does not count the time the process waited for the disk or
for a core another process held: on a shared, loaded machine it is repeatable where wall time
is not.

The workloads, each on a fresh SQLite file (``durability="process_crash"``, the default):

- ``read``: one run of N ``run.read`` steps, each committed before the next;
- ``pure``: one run of N ``run.pure`` steps (written 64 to a commit);
- ``effect``: one run of N ``run.effect`` steps against the local HTTP effect owner
  (``safepoint.testing.owner.OwnerService``, a process of its own started before the clock
  starts, whose CPU time is not counted), through one kept-alive connection, as W5 sends them:
  the owner client's CPU time (the HTTP request and its answer) is counted with the ledger's;
- ``replay``: W4's replay — a run of N pure steps recorded by one process (stopped just before
  it completes, every step written), then resumed by a fresh process that replays all N and
  completes the run: the CPU time of ``resume`` (the claim, the ledger's load, the replay, the
  completion).

To get a tree of an earlier revision: ``git archive <rev> src | tar -x -C /tmp/base``. The child
processes import safepoint from the tree given (``PYTHONPATH``); each says which it imported.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .procs import ROOT

WORKLOADS = ("read", "pure", "effect", "replay")


# -- the child: one measurement ------------------------------------------------------------------


def _add(total: int, index: int) -> int:
    return total + index


def _workflows() -> dict[str, Any]:
    import safepoint as sp

    @sp.workflow("bench.cpu.pure")
    def pure(run: sp.Run, count: int) -> int:
        total = 0
        for index in range(count):
            total = run.pure(f"step.{index}", _add, total, index)
        return total

    @sp.workflow("bench.cpu.read")
    def read(run: sp.Run, count: int) -> int:
        total = 0
        for index in range(count):
            total = run.read(f"step.{index}", _add, total, index)
        return total

    from safepoint.testing.effects import owner_effect

    tickets = owner_effect("tickets", keep_alive=True)

    @sp.workflow("bench.cpu.effect")
    def effect(run: sp.Run, count: int) -> int:
        total = 0
        for index in range(count):
            run.effect(f"fx.{index}", tickets, payload={"i": index})
            total += index
        return total

    return {"pure": pure, "read": read, "effect": effect}


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import safepoint as sp

    flows = _workflows()
    steps, url = spec["steps"], f"sqlite:///{spec['path']}"
    role = spec["role"]
    if role == "record":  # W4's run, stopped just before it completes: every step is written
        from safepoint._engine.crashpoints import SimulatedCrash, arm

        store = sp.open_store(url)
        arm("run.before_complete", "raise")
        try:
            sp.start(store, flows["pure"], steps, run_id="replayed", lease_ms=0)
        except SimulatedCrash:
            pass
        finally:
            arm(None)
            store.close()
        return {"recorded": steps}
    with contextlib.ExitStack() as stack:
        if role == "effect":
            from safepoint.testing.effects import OWNER_URL_ENV
            from safepoint.testing.owner import OwnerService

            os.environ[OWNER_URL_ENV] = stack.enter_context(OwnerService()).url
        started = time.process_time()
        store = sp.open_store(url)
        opened = time.process_time()
        if role == "replay":
            result = sp.resume(store, "replayed")
        else:
            result = sp.start(store, flows[role], steps, run_id=role)
        ended = time.process_time()
        store.close()
    if result != steps * (steps - 1) // 2:
        raise RuntimeError(f"{role}: wrong result {result}")
    return {
        "imported": str(Path(sp.__file__).resolve().parent.parent),
        "open_cpu_s": opened - started,
        "cpu_s": ended - opened,
        "cpu_us_per_step": (ended - opened) / steps * 1e6,
    }


# -- the parent: interleaved rounds ----------------------------------------------------------------


def _spawn(src: Path, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-m", "bench.cpu", "--child", json.dumps(spec)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"child failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    measured: dict[str, Any] = json.loads(lines[-1])
    if "imported" in measured and Path(measured["imported"]) != src.resolve():
        raise RuntimeError(f"the child imported safepoint from {measured['imported']}, not {src}")
    return measured


def measure_once(src: Path, workload: str, steps: int) -> dict[str, Any]:
    """One measurement of ``workload`` with the tree ``src``, on a fresh SQLite file."""
    with tempfile.TemporaryDirectory(prefix="spcpu-") as tmp:
        path = str(Path(tmp) / "ledger.sqlite")
        if workload == "replay":
            _spawn(src, {"role": "record", "path": path, "steps": steps})
        return _spawn(src, {"role": workload, "path": path, "steps": steps})


def compare(trees: dict[str, Path], workloads: list[str], steps: int, rounds: int) -> dict[str, Any]:
    names = list(trees)
    per: dict[str, dict[str, list[float]]] = {w: {name: [] for name in names} for w in workloads}
    for round_ in range(rounds):
        order = names if round_ % 2 == 0 else names[::-1]
        for workload in workloads:
            for name in order:
                per[workload][name].append(measure_once(trees[name], workload, steps)["cpu_us_per_step"])
        print(f"round {round_ + 1}/{rounds} done", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"steps": steps, "rounds": rounds, "trees": {k: str(v) for k, v in trees.items()}}
    for workload in workloads:
        figures = per[workload]
        row: dict[str, Any] = {f"{name}_us_per_step": statistics.median(figures[name]) for name in names}
        if len(names) == 2:
            first, second = names
            ratios = [a / b for a, b in zip(figures[first], figures[second], strict=True)]
            row[f"{first}_over_{second}"] = statistics.median(ratios)
            row["ratio_range"] = [min(ratios), max(ratios)]
        row["samples"] = figures
        out[workload] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=Path, help="the source tree to compare against (its src/)")
    parser.add_argument("--new", type=Path, default=ROOT / "src", help="the source tree measured")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return 0
    trees = {"base": args.base, "new": args.new} if args.base else {"new": args.new}
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}: choose from {', '.join(WORKLOADS)}")
    result = compare(trees, workloads, args.steps, args.rounds)
    for workload in workloads:
        row = {k: v for k, v in result[workload].items() if k != "samples"}
        print(workload, json.dumps(row), flush=True)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
