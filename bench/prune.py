"""Retention, measured: ``python -m bench.prune`` fills a fresh ledger with finished runs (each
with a few steps, their events and one effect operation, through the engine as an application
would), prunes them all with ``safepoint.prune``, and prints the prune's time and the database's
size before and after.

SQLite's size is its pages in use; a DELETE frees pages inside the file without shrinking it,
so ``--vacuum`` also runs VACUUM and prints the file's size then. PostgreSQL's is every table
with its indexes and TOAST (``pg_total_relation_size``); a DELETE leaves dead tuples for VACUUM,
so ``--vacuum`` runs VACUUM FULL and prints the size then. One JSON line per backend on stdout.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import safepoint as sp

from .common import Database, fresh_database, quiet_logging

_forgetful = sp.Effect(
    "bench.prune.notify",
    execute=lambda payload, key: {"id": f"n-{payload['n']}"},
    # the owner forgets a key at once: every run is prunable without --force
    dedup_retention=timedelta(milliseconds=1),
)


@sp.workflow("bench.prune", version="1")
def finished_run(run: sp.Run, n: int) -> dict[str, Any]:
    """A short agent-like run: a read, a model-sized result, a decision and one effect."""
    case = run.read("read.case", lambda: {"case": n, "customer": f"cus_{n % 97}"})
    draft = run.pure("draft", lambda: {"text": f"reply to case {n}: " + "lorem ipsum " * 40})
    route = run.decide("route", lambda: "notify")
    sent = run.effect("notify", _forgetful, payload={"n": n, "route": route}, operation_id="notify")
    return {"case": case["case"], "sent": sent["id"], "chars": len(draft["text"])}


def _fill(url: str, runs: int, threads: int) -> float:
    """Start ``runs`` runs to completion; the seconds it took."""
    started = time.monotonic()
    store = sp.open_store(url)
    try:

        def one(n: int) -> None:
            sp.start(store, finished_run, n, run_id=f"bench-prune-{n:06d}")

        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(one, range(runs)))
    finally:
        store.close()
    return time.monotonic() - started


def _vacuumed(db: Database) -> int:
    """The database's size after giving the freed space back: VACUUM (SQLite: the file's
    size), VACUUM FULL (PostgreSQL)."""
    if db.backend == "sqlite":
        assert db.path is not None
        conn = sqlite3.connect(db.path)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        return db.path.stat().st_size
    import psycopg

    with psycopg.connect(db.pg_url, autocommit=True) as conn:
        conn.execute("VACUUM FULL")
    return db.bytes()


def measure(backend: str, runs: int, batch: int, *, vacuum: bool, threads: int) -> dict[str, Any]:
    """Fill a fresh ledger with ``runs`` finished runs, prune them all, and say what it took."""
    with fresh_database(backend, "prune") as db:
        url = db.sqlite_url if backend == "sqlite" else db.pg_url
        fill_s = _fill(url, runs, threads if backend == "postgres" else 1)
        time.sleep(0.01)  # past the effect's retention, and every run before the cut-off
        size_before = db.bytes()
        store = sp.open_store(url)
        try:
            done = sp.prune(store, finished_before=timedelta(0), batch=batch)
        finally:
            store.close()
        figures: dict[str, Any] = {
            "backend": backend,
            "runs": runs,
            "batch": batch,
            "fill_s": round(fill_s, 2),
            "pruned_runs": done.runs,
            "rows": done.rows,
            "artifacts": done.artifacts,
            "artifact_bytes": done.artifact_bytes,
            "batches": done.batches,
            "kept": len(done.kept),
            "prune_s": round(done.seconds, 3),
            "runs_per_s": round(done.runs / done.seconds) if done.seconds else None,
            "bytes_before": size_before,
            "bytes_after": db.bytes(),
        }
        if vacuum:
            figures["bytes_after_vacuum"] = _vacuumed(db)
        return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prune", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="finished runs to prune (10000)")
    parser.add_argument("--batch", type=int, default=200, help="runs per transaction (200)")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--vacuum", action="store_true", help="also give the freed space back, and measure")
    parser.add_argument("--threads", type=int, default=4, help="threads filling a PostgreSQL ledger (4)")
    args = parser.parse_args(argv)
    quiet_logging()
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    for backend in backends:
        figures = measure(backend, args.runs, args.batch, vacuum=args.vacuum, threads=args.threads)
        print(json.dumps(figures), flush=True)
        print(_summary(figures), file=sys.stderr, flush=True)
    return 0


def _summary(figures: dict[str, Any]) -> str:
    mib = 1024 * 1024
    line = (
        f"{figures['backend']}: pruned {figures['pruned_runs']} runs in {figures['prune_s']} s"
        f" ({figures['batches']} batches of {figures['batch']}); size"
        f" {figures['bytes_before'] / mib:.1f} MiB before, {figures['bytes_after'] / mib:.1f} MiB after"
    )
    if "bytes_after_vacuum" in figures:
        line += f", {figures['bytes_after_vacuum'] / mib:.1f} MiB after vacuum"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
