"""What every part of the benchmark shares: sizes, settings, fresh databases, probes, timing.

A *setting* is one (backend, mode) pair. ``mode`` is ``defaults`` (each system as its own
documentation sets it up) or ``equal`` (every system at the same durability: SQLite in WAL mode
with ``synchronous=FULL``, PostgreSQL with ``synchronous_commit=on``). What each system runs with
in each setting is decided in its workload module, and written into the results.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BACKENDS = ("sqlite", "postgres")
MODES = ("defaults", "equal")
SYSTEMS = ("safepoint", "dbos", "langgraph")
# The database every PostgreSQL connection of the benchmark is made from; fresh databases are
# created beside it and dropped afterwards. Trust auth on loopback is assumed.
PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DB_PREFIX = "spbench_"
W2_CHUNK = 200  # bytes each W2 step adds to the state


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. ``full`` is what the issue asks; ``quick`` is for development."""

    w1_steps: int = 1000
    w2_steps: int = 1000
    w2_window: int = 100  # per-step cost of the last `window` steps over the first `window`
    w3_runs: int = 20
    w3_steps: int = 100
    w3_workers: int = 4
    w4_steps: int = 1000
    w4_kill_at: int = 500
    w5_effects: int = 500
    w5_transactions: int = 500  # W5t: transaction steps, one row each
    floor_commits: int = 1000
    http_calls: int = 500
    w6_turns: int = 50  # model turns per SDK, raw and recorded
    w7_turns: int = 200
    w7_window: int = 10  # turns 2 to 11 against the last 10

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            w1_steps=100,
            w2_steps=100,
            w2_window=20,
            w3_runs=4,
            w3_steps=20,
            w3_workers=2,
            # past one batch of pure steps, so that the resume replays some
            w4_steps=300,
            w4_kill_at=200,
            w5_effects=40,
            w5_transactions=40,
            floor_commits=200,
            http_calls=50,
            w6_turns=10,
            w7_turns=40,
            w7_window=5,
        )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Setting:
    backend: str  # "sqlite" | "postgres"
    mode: str  # "defaults" | "equal"

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.mode}"


# -- fresh databases ---------------------------------------------------------------------------


@dataclass
class Database:
    """One fresh database: an SQLite file in a directory of its own, or a PostgreSQL database."""

    backend: str
    path: Path | None = None  # SQLite
    name: str | None = None  # PostgreSQL

    @property
    def sqlite_url(self) -> str:
        assert self.path is not None
        return f"sqlite:///{self.path}"

    @property
    def pg_url(self) -> str:
        assert self.name is not None
        base = PG_ADMIN_URL.rsplit("/", 1)[0]
        return f"{base}/{self.name}"

    def bytes(self) -> int:
        """The database's size now, as another connection sees it (committed data only).

        SQLite: pages in use (``page_count * page_size``), which counts what sits in the WAL
        too. PostgreSQL: every table of the database with its indexes and TOAST.
        """
        if self.backend == "sqlite":
            assert self.path is not None
            if not self.path.exists():
                return 0
            conn = sqlite3.connect(self.path, timeout=30)
            try:
                pages = conn.execute("PRAGMA page_count").fetchone()[0]
                size = conn.execute("PRAGMA page_size").fetchone()[0]
            finally:
                conn.close()
            return int(pages) * int(size)
        import psycopg

        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'r'"
                " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
                " AND n.nspname NOT LIKE 'pg_toast%'"
            ).fetchone()
        return int(row[0]) if row else 0


@contextmanager
def fresh_database(backend: str, tag: str) -> Iterator[Database]:
    """A database no other measurement has touched, removed afterwards."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix=f"{DB_PREFIX}{tag}-") as tmp:
            yield Database("sqlite", path=Path(tmp) / f"{tag}.sqlite")
        return
    import psycopg
    from psycopg import sql

    name = f"{DB_PREFIX}{tag}_{os.getpid()}_{uuid.uuid4().hex[:8]}".lower()
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield Database("postgres", name=name)
    finally:
        drop_database(name)


def drop_database(name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def drop_leftover_databases() -> list[str]:
    """Databases an interrupted benchmark left behind: ours by their prefix, and only those
    whose creating process is gone (another benchmark may be running)."""
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (DB_PREFIX + "%",)
            )
        ]
    dropped = []
    for name in names:
        pid = name.rsplit("_", 2)[-2]
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue
        drop_database(name)
        dropped.append(name)
    return dropped


def prepare_sqlite_file(path: Path, *, wal: bool) -> None:
    """Create an empty SQLite file in the given journal mode (WAL is stored in the file)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute(f"PRAGMA journal_mode={'WAL' if wal else 'DELETE'}")
    finally:
        conn.close()


SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def sqlite_settings(conn: sqlite3.Connection) -> dict[str, str]:
    """What an SQLite connection commits with: its journal mode and ``synchronous`` level."""
    journal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).upper()
    level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
    return {"journal_mode": journal, "synchronous": SYNCHRONOUS.get(level, str(level))}


def postgres_settings(conn: Any) -> dict[str, str]:
    """What a PostgreSQL connection commits with: its ``synchronous_commit``, and the server's
    ``fsync``."""
    found = {}
    for name in ("synchronous_commit", "fsync"):
        row = conn.execute(f"SHOW {name}").fetchone()
        found[name] = str(next(iter(row.values())) if isinstance(row, dict) else row[0])  # dict_row or not
    if not conn.autocommit:
        conn.rollback()
    return found


@contextmanager
def durability_read_back(backend: str) -> Iterator[Callable[[], dict[str, str]]]:
    """Within the block, every connection this process opens is noted; the function yielded
    reads back what the ones still open commit with (each setting's distinct values joined by
    "/"), so that "equal durability" is checked against what the connections ran with rather
    than what the code means to set."""
    opened: list[Any] = []
    if backend == "sqlite":
        original = sqlite3.connect

        def noting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = original(*args, **kwargs)
            opened.append(conn)
            return conn

        sqlite3.connect = noting  # type: ignore[assignment]
        read_one: Callable[[Any], dict[str, str]] = sqlite_settings
    else:
        import psycopg

        # The classmethod itself, not ``psycopg.Connection.connect``: that one is bound to
        # psycopg.Connection, and put back so it would make every subclass's connections
        # (the store's pooled ones) plain psycopg.Connection objects.
        original_pg = psycopg.Connection.__dict__["connect"]

        def noting_pg(cls: Any, *args: Any, **kwargs: Any) -> Any:
            conn = original_pg.__func__(cls, *args, **kwargs)
            opened.append(conn)
            return conn

        psycopg.Connection.connect = classmethod(noting_pg)  # type: ignore[method-assign, assignment]
        read_one = postgres_settings

    def read() -> dict[str, str]:
        seen: dict[str, set[str]] = {}
        for conn in opened:
            try:
                found = read_one(conn)
            except Exception:  # closed, or another thread's: it commits nothing more
                continue
            for key, value in found.items():
                seen.setdefault(key, set()).add(value)
        return {key: "/".join(sorted(values)) for key, values in seen.items()}

    try:
        yield read
    finally:
        if backend == "sqlite":
            sqlite3.connect = original
        else:
            psycopg.Connection.connect = original_pg  # type: ignore[method-assign]


# -- timing ------------------------------------------------------------------------------------


class Stamps:
    """Times at which step bodies began: the per-step cost without any system's cooperation."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def mark(self) -> None:
        self.times.append(time.perf_counter())

    def per_step(self, window: int) -> dict[str, float]:
        """Mean seconds per step over the first and the last ``window`` steps."""
        gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
        if len(gaps) < 2 * window:
            window = max(1, len(gaps) // 2)
        first = statistics.fmean(gaps[:window])
        last = statistics.fmean(gaps[-window:])
        return {"first_ms": first * 1000, "last_ms": last * 1000, "last_over_first": last / first}


def growth(probes: dict[int, int]) -> float:
    """Bytes per step over the last quarter of the steps over bytes per step over the second
    quarter (the first quarter also holds the tables' first pages): 1 is linear; storage that
    grows with the state (quadratic) approaches 7/3."""
    points = sorted(probes)
    if len(points) < 5:
        return float("nan")
    _, quarter, half, three_quarters, end = points[:5]
    second = (probes[half] - probes[quarter]) / (half - quarter)
    last = (probes[end] - probes[three_quarters]) / (end - three_quarters)
    return last / second if second > 0 else float("nan")


def quiet_logging() -> None:
    """The peers log at INFO to the console; the benchmark prints JSON on stdout."""
    import logging

    logging.basicConfig(level=logging.WARNING)
    for name in ("dbos", "langgraph", "httpx", "safepoint"):
        logging.getLogger(name).setLevel(logging.WARNING)


def result(**fields: Any) -> dict[str, Any]:
    return dict(fields)


def count_statements(sent: Counter[str]) -> Callable[[], None]:
    """Count in ``sent`` what psycopg sends from now on — each statement, and each BEGIN /
    COMMIT / SET, is a round trip; the function that stops counting."""
    import psycopg
    from psycopg._connection_base import BaseConnection

    execute, command = psycopg.Cursor.execute, BaseConnection._exec_command

    def counted_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent["statements"] += 1
        return execute(self, query, *args, **kwargs)

    def counted_command(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent["transaction commands (BEGIN, COMMIT, SET)"] += 1
        return command(self, query, *args, **kwargs)

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    BaseConnection._exec_command = counted_command  # type: ignore[method-assign, assignment]

    def restore() -> None:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        BaseConnection._exec_command = command  # type: ignore[method-assign]

    return restore
