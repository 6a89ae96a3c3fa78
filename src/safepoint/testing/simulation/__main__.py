"""``python -m safepoint.testing.simulation`` (``make simulate``): explore, or replay one seed.

    python -m safepoint.testing.simulation --seconds 3600          # explore, on every core
    python -m safepoint.testing.simulation --seed 123456           # replay one schedule exactly
    python -m safepoint.testing.simulation --tape 0,0,3,1,…        # replay a shrunk tape
    python -m safepoint.testing.simulation --postgres postgresql://…/postgres --seconds 60

Exploring prints a progress line a minute and, last, ``schedules=N requests=M violations=V
seed=S`` (S: the failing schedule's seed, or the first seed tried). The exit status is 1 when an
invariant broke, so a long run can gate a release.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from .explore import Report, decode, explore, fresh_seed, replay
from .runner import Config, close_ledgers


def _config(postgres: str | None) -> Config:
    return Config(postgres=postgres) if postgres else Config()


def _explore_part(seconds: float, first: int, postgres: str | None) -> Report:
    try:
        return explore(_config(postgres), seconds=seconds, seed=first)
    finally:
        close_ledgers()


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m safepoint.testing.simulation", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=float(env.get("SIM_SECONDS") or 60))
    parser.add_argument("--seed", type=int, default=int(env["SIM_SEED"]) if env.get("SIM_SEED") else None)
    parser.add_argument("--tape", default=env.get("SIM_TAPE") or None)
    parser.add_argument(
        "--postgres",
        default=env.get("SIM_POSTGRES") or None,
        help="a PostgreSQL server's URL: schedules on it, a database per process (slower)",
    )
    parser.add_argument("--jobs", type=int, default=int(env.get("SIM_JOBS") or os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if args.seed is not None or args.tape:
        return _replay(args.seed, args.tape, args.postgres)
    return _explore(args.seconds, max(1, args.jobs), args.postgres)


def _replay(seed: int | None, tape: str | None, postgres: str | None) -> int:
    try:
        done = replay(_config(postgres), seed=None if tape else seed, tape=decode(tape) if tape else ())
    finally:
        close_ledgers()
    print(done.story(last=len(done.events)))
    for violation in done.violations:
        print(f"VIOLATION {violation}")
    shown = "-" if tape else seed
    print(f"schedules=1 requests={done.requests} violations={len(done.violations)} seed={shown}")
    return 1 if done.violations else 0


def _explore(seconds: float, jobs: int, postgres: str | None) -> int:
    """Explore on ``jobs`` processes, each from its own block of seeds, in one-minute parts so
    that progress shows; stop everything at the first failure."""
    began, base = time.perf_counter(), fresh_seed()
    part = min(60.0, seconds)
    total = Report(base)
    failed: Report | None = None
    with ProcessPoolExecutor(jobs) as pool:
        next_seed = base
        running: set[Future[Report]] = set()
        while failed is None:
            left = seconds - (time.perf_counter() - began)
            while len(running) < jobs and left > 0.5:
                running.add(pool.submit(_explore_part, min(part, left), next_seed, postgres))
                next_seed += 1_000_000  # a block of seeds no part reaches the end of
            if not running:
                break
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                report = future.result()
                total.schedules += report.schedules
                total.requests += report.requests
                if report.failure is not None and failed is None:
                    failed = report
            elapsed = time.perf_counter() - began
            per_core = elapsed * jobs
            print(
                f"[{elapsed:6.0f}s] schedules={total.schedules} ({total.schedules / per_core:.0f}/s per core)"
                f" requests={total.requests} ({total.requests / per_core:.0f}/s per core)",
                flush=True,
            )
        for future in running:
            future.cancel()
    if failed is not None:
        print(failed.explain())
        total.failure, total.first_seed = failed.failure, base
    print(total.line())
    return 1 if failed is not None else 0


if __name__ == "__main__":
    sys.exit(main())
