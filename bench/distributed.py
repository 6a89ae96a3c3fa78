"""A durable step on a distributed ledger beside plain PostgreSQL, in one run.

``python -m bench.distributed --citus postgresql://root@127.0.0.1:9700/ledger [--plain URL]
[--steps 500] [--rounds 4]``

Each round times, on each ledger in turn (the order alternating), one run of ``--steps``
``run.read`` steps in a row, every one a durable write (``record_step``), after a short run that
warms the process and the connections. Each ledger is a schema of its own, made for the
measurement and dropped after it: on the cluster, distributed (``?distributed=citus``). It
prints each round's milliseconds a step and their ratio, then the medians. docs/scaling.md
quotes what it gave.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql

import safepoint as sp

from .common import PG_ADMIN_URL


@sp.workflow("bench.distributed.reads")
def _reads(run: sp.Run, n: int) -> int:
    return sum(run.read(f"r{i}", lambda i=i: i) for i in range(n))


def _ms_a_step(url: str, steps: int, **parameters: str) -> float:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    query = "&".join(f"{k}={v}" for k, v in {"schema": schema, **parameters}.items())
    store = sp.open_store(f"{url}{'&' if '?' in url else '?'}{query}")
    try:
        sp.start(store, _reads, 10, run_id="warm")
        began = time.perf_counter()
        sp.start(store, _reads, steps, run_id="measured")
        return (time.perf_counter() - began) * 1000 / steps
    finally:
        store.close()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def measure(plain: str, citus: str, steps: int, rounds: int) -> dict[str, Any]:
    rows = []
    for round_ in range(rounds):
        sides = [("plain", plain, {}), ("citus", citus, {"distributed": "citus"})]
        found = {
            name: _ms_a_step(url, steps, **extra)
            for name, url, extra in sides[:: 1 if round_ % 2 == 0 else -1]
        }
        rows.append({**found, "ratio": found["citus"] / found["plain"]})
        print(json.dumps({key: round(value, 3) for key, value in rows[-1].items()}))
    return {key: round(statistics.median(row[key] for row in rows), 3) for key in ("plain", "citus", "ratio")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--citus", required=True, help="a database on the cluster's coordinator")
    parser.add_argument("--plain", default=PG_ADMIN_URL, help="a database on plain PostgreSQL")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    print("medians:", json.dumps(measure(args.plain, args.citus, args.steps, args.rounds)))


if __name__ == "__main__":
    main()
