"""The SQLite store's connections and transactions, its migrations, and the statements every
worker write of it shares: the fence, the event, the stored value.

Concurrency rules (each learned from a double execution somewhere else):
- one connection per thread (and per process: a forked child opens its own);
- every write is one ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock instead
  of failing half-way, with a busy timeout long enough to ride out other writers;
- every worker write starts with ``fence_check``, in the same transaction as the write (see
  ``safepoint._rules.fencing``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..._rules.canonical import digest as content_digest
from ..._rules.canonical import dumps
from ..._rules.fencing import refused_write
from ..._rules.history import history_warning, warning_due
from ...errors import HistoryWarning, LostOwnership, StoreError
from ...types import JSON, Claim, Durability, LedgerIdentity, StepRecord
from .._columns import tolerant_text
from ..base import INLINE_LIMIT, cannot_store, unstorable
from ..codec import Codec, seal_artifact, seal_text
from ..ledger import LedgerOperations, LedgerReads, sealed_event, stored
from ..migrations import to_apply
from ..operations import PlanRunner
from ..plans import Plan, Queries, Row, Stmt, run_plan

QUERIES = Queries("sqlite")
SQL = QUERIES.text
_BUSY_TIMEOUT_S = 30.0

T = TypeVar("T")


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SqliteConnection(PlanRunner, LedgerOperations):
    """What every operation of the SQLite store stands on (``SqliteStore`` adds them)."""

    url: str

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = Durability.PROCESS_CRASH,
        clock: Callable[[], int] = _wall_clock_ms,
        inline_limit: int = INLINE_LIMIT,
        codec: Codec | None = None,
    ) -> None:
        self.durability = Durability(durability)
        self._clock = clock
        self._inline_limit = inline_limit
        self.codec = codec
        self._ledger = LedgerReads(QUERIES, codec=codec, clock=self.now)
        self._local = threading.local()
        self._keeper: sqlite3.Connection | None = None
        # A shared-cache in-memory database answers a second writer with SQLITE_LOCKED, which
        # no busy timeout waits out: in memory, the store's own lock takes turns instead.
        self._turns: threading.RLock | None = None
        if str(path) == ":memory:":
            # A named shared-cache database lives while one connection to it is open.
            self._target = f"file:safepoint-{uuid.uuid4().hex}?mode=memory&cache=shared"
            self._uri = True
            self.url = "memory:"
            self._keeper = self._connect()
            self._turns = threading.RLock()
        else:
            self._target = str(Path(path).absolute())
            self._uri = False
            self.url = f"sqlite:///{self._target}"
        self._migrate()
        self.identity: LedgerIdentity = self._reading(self._ledger.read_identity())
        self._reading(self._ledger.check_sealing(self.now()))  # autocommit: marked at once

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._target,
                timeout=_BUSY_TIMEOUT_S,
                uri=self._uri,
                isolation_level=None,
                check_same_thread=True,
            )
            conn.row_factory = sqlite3.Row
            if not self._uri:
                _enable_wal(conn)
            full = self.durability is Durability.POWER_LOSS
            conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"cannot open SQLite store {self._target}: {exc}; check the path and that it"
                " is a safepoint database",
                path=self._target,
            ) from exc
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = self._connect()
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def memory_copy(self, *, clock: Callable[[], int] | None = None) -> Any:
        """A new in-memory store holding a copy of this one's database as it stands now — a
        template migrated once and cloned per test, or per simulated schedule — on ``clock``
        (this store's, by default). Nothing is migrated again; the copy shares nothing with
        this store after it returns."""
        copy = object.__new__(type(self))
        copy.__dict__.update(self.__dict__)
        copy._clock = clock or self._clock
        copy._ledger = LedgerReads(QUERIES, codec=copy.codec, clock=copy.now)
        copy._local = threading.local()
        copy._turns = threading.RLock()
        copy._target = f"file:safepoint-{uuid.uuid4().hex}?mode=memory&cache=shared"
        copy._uri = True
        copy.url = "memory:"
        copy._keeper = copy._connect()
        with self._turn():
            self._conn().backup(copy._keeper)
        return copy

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.pid == os.getpid():
            conn.close()
        self._local = threading.local()
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None

    @contextmanager
    def _turn(self) -> Iterator[None]:
        if self._turns is None:
            yield
            return
        with self._turns:
            yield

    def _write(self) -> _Write:
        """One atomic write transaction: ``with self._write() as conn:``."""
        return _Write(self)

    def _reading(self, plan: Plan[T]) -> T:
        """Carry out a plan that only reads, outside any write transaction."""
        try:
            with self._turn():
                conn = self._conn()
                return run_plan(lambda stmt: _fetch(conn, stmt), plan)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store: {exc}") from exc
        except UnicodeEncodeError as exc:  # a lookup by an id no record can have
            raise unstorable(exc) or StoreError(f"cannot read the store: {exc}") from exc

    @staticmethod
    def _within(conn: sqlite3.Connection, plan: Plan[T]) -> T:
        """Carry out a plan in the caller's write transaction."""
        return run_plan(lambda stmt: conn.execute(stmt.text, stmt.params or {}).fetchall(), plan)

    # The executor of the operations that only run their plan (``storage.operations``). A
    # write is one ``BEGIN IMMEDIATE`` transaction whatever ``atomic`` says: SQLite commits
    # several statements as cheaply as one, and holds the ledger against other writers
    # meanwhile. A read runs outside any write transaction.

    def _run(self, plan: Plan[T], *, atomic: bool = True) -> T:
        with self._write() as conn:
            return self._within(conn, plan)

    def _read(self, plan: Callable[[], Plan[T]], *, atomic: bool = False) -> T:
        return self._reading(plan())

    def now(self) -> int:
        return self._clock()

    # -- migrations ----------------------------------------------------------------------------

    def _migrate(self) -> None:
        conn = self._conn()
        conn.execute(SQL["create_version_table"])
        if not to_apply("sqlite", _applied(conn)):
            return
        # Foreign keys are off while a migration runs — SQLite's documented way to rebuild a
        # table others refer to (a CHECK constraint cannot change in place) — and checked
        # before the transaction commits. The pragma is a no-op inside a transaction.
        conn.execute("PRAGMA foreign_keys=OFF")
        try:
            with self._write() as conn:  # re-check under the write lock: another process may race us
                for migration in to_apply("sqlite", _applied(conn)):
                    for statement in _split_statements(migration.sql):
                        conn.execute(statement)
                    conn.execute(
                        SQL["record_migration"],
                        {
                            "version": migration.version,
                            "name": migration.name,
                            "checksum": migration.checksum,
                            "applied_at": self.now(),
                        },
                    )
                broken = conn.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise StoreError(
                        f"migrating the ledger left {len(broken)} rows whose run is missing"
                        f" (first: {tuple(broken[0])}); nothing was changed — restore the file"
                        " from a backup, or report it",
                        path=self._target,
                    )
        finally:
            conn.execute("PRAGMA foreign_keys=ON")

    def schema_version(self) -> int:
        row = self._conn().execute(SQL["schema_version"]).fetchone()
        return int(row["version"])

    # -- what the writes share -----------------------------------------------------------------

    def _put_value(
        self, conn: sqlite3.Connection, value: JSON, now: int, *place: Any
    ) -> tuple[str | None, str | None]:
        """Store a JSON value inline, or as an artifact when it is large: (text, ref) — sealed
        for its ``place`` (table, column, the row's key) when the store has a codec."""
        text, ref, data = stored(value, self._inline_limit, self.codec, *place)
        if ref is not None and data is not None:
            conn.execute(
                SQL["insert_artifact"], {"digest": ref, "size": len(data), "content": data, "now": now}
            )
        return text, ref

    def _sealed(self, value: JSON, *place: Any) -> str | None:
        """A JSON column's text (NULL for None), sealed for ``place`` when the store has a codec."""
        if value is None:
            return None
        return dumps(value) if self.codec is None else seal_text(self.codec, dumps(value), *place)

    def _put_artifact(self, conn: sqlite3.Connection, data: bytes, now: int, ref: str | None = None) -> str:
        """Store ``data`` under its digest (``ref``, when the caller computed or checked it)."""
        ref = ref or content_digest(data)
        content = data if self.codec is None else seal_artifact(self.codec, data, ref)
        conn.execute(
            SQL["insert_artifact"], {"digest": ref, "size": len(data), "content": content, "now": now}
        )
        return ref

    def _event(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        now: int,
        kind: str,
        *,
        step_id: str | None = None,
        operation_id: str | None = None,
        fence: int | None = None,
        worker: str | None = None,
        detail: JSON = None,
        clear: bool = False,
    ) -> None:
        """Append an event, its detail sealed for its row when it can quote the caller's data
        (``ledger.sealed_event``); ``clear``: a detail that quotes none of it whatever its kind
        (an effect's name and payload digest), kept in clear."""
        if clear or self.codec is None:
            event_id, text = None, None if detail is None else dumps(detail)
        else:
            event_id, text = self._within(conn, sealed_event(self._ledger, detail, run_id, kind))
        conn.execute(
            SQL["insert_event"],
            {
                "event_id": event_id,
                "run_id": run_id,
                "now": now,
                "kind": kind,
                "step_id": step_id,
                "operation_id": operation_id,
                "fence": fence,
                "worker": worker,
                "detail": text,
            },
        )

    def _fence_check(
        self,
        conn: sqlite3.Connection,
        claim: Claim,
        now: int,
        events: int,
        *,
        step: StepRecord | None = None,
        new_work: bool = False,
        limited: bool = False,
        dispatching: bool = False,
    ) -> HistoryWarning | None:
        """The fence of a worker write, counting the history it adds (``events`` events, and
        ``step`` when it is a new row). ``new_work``: refused once a cancel is asked for;
        ``limited``: also refused past the hard history limit; ``dispatching`` (new work): the
        write also commits its operation's first dispatch, whose event (one of ``events``) is
        never held to that limit. Records the soft limit's warning when it falls due, and
        returns it, to be issued once the transaction committed."""
        params = {
            "run_id": claim.run_id,
            "fence": claim.fence,
            "lease_expires_at": now + claim.lease_ms,
            "events": events,
            "step_id": step.step_id if step else None,
            "new_work": int(new_work),
            "limited": int(limited),
            "dispatching": int(dispatching),
            "now": now,
        }
        if conn.execute(SQL["fence_check"], params).rowcount == 1:
            return None  # the fence held, and the soft limit's warning did not fall due
        row = conn.execute(SQL["fence_check_counted"], params).fetchone()
        if row is None:
            raise self._refused(conn, claim, now, limited=limited)
        return self._soft_limit_warning(conn, claim, row, now)

    def _soft_limit_warning(
        self, conn: sqlite3.Connection, claim: Claim, row: sqlite3.Row, now: int
    ) -> HistoryWarning | None:
        """After a fenced write: record the soft limit's warning once it falls due, and return
        it, to be issued once the transaction committed."""
        if not warning_due(row["history"], row["history_soft_limit"], row["history_warned_at"]):
            return None
        conn.execute(
            SQL["record_history_warning"], {"run_id": claim.run_id, "fence": claim.fence, "now": now}
        )
        size, soft, hard = row["history"] + 1, row["history_soft_limit"], row["history_hard_limit"]
        self._event(
            conn,
            claim.run_id,
            now,
            "run.history_warning",
            fence=claim.fence,
            worker=claim.owner,
            detail={"history": size, "soft": soft, "hard": hard},
        )
        return history_warning(claim.run_id, size, soft, hard)

    @staticmethod
    def _refused(conn: sqlite3.Connection, claim: Claim, now: int, *, limited: bool = False) -> BaseException:
        """Why a fenced statement matched nothing (see ``_rules.fencing.refused_write``)."""
        state = conn.execute(SQL["fence_state"], {"run_id": claim.run_id}).fetchone()
        if state is None:
            return LostOwnership(claim.run_id, claim.fence)
        return refused_write(
            claim,
            state["fence"],
            state["status"],
            state["cancel_requested_at"],
            state["deadline_at"],
            now,
            limited=limited,
            history=state["history"],
            hard_limit=state["history_hard_limit"],
        )


class _Write:
    """One atomic write transaction (``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any error),
    in the store's turn when it keeps turns; driver errors become ``StoreError`` with the cause
    kept. A class, not a generator: it wraps every write the store makes."""

    __slots__ = ("conn", "store", "turns")

    def __init__(self, store: SqliteConnection) -> None:
        self.store = store
        self.turns = store._turns

    def __enter__(self) -> sqlite3.Connection:
        if self.turns is not None:
            self.turns.acquire()
        try:
            self.conn = conn = self.store._conn()
            conn.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            if self.turns is not None:
                self.turns.release()
            if isinstance(exc, sqlite3.Error):
                raise StoreError(f"cannot write to the store: {exc}") from exc
            raise
        # a write reads back a row or two: tolerant of text that is not UTF-8 at no cost
        conn.text_factory = tolerant_text
        return conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        conn = self.conn
        try:
            conn.text_factory = str
            if exc is None:
                try:
                    conn.execute("COMMIT")
                    return
                except BaseException as failed:
                    exc = failed
                    if conn.in_transaction:  # SQLite may already have rolled back on its own
                        conn.execute("ROLLBACK")
                    if not isinstance(exc, (sqlite3.Error, UnicodeError)):
                        raise
            elif conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, (sqlite3.Error, UnicodeError)):
                raise unstorable(exc) or StoreError(f"write to the store failed: {exc}") from exc
        finally:
            if self.turns is not None:
                self.turns.release()


def _applied(conn: sqlite3.Connection) -> list[tuple[int, str, str]]:
    return [tuple(row) for row in conn.execute(SQL["applied_migrations"])]


@contextmanager
def _tolerant(conn: sqlite3.Connection) -> Iterator[None]:
    """Text that is not UTF-8 read as ``Undecodable`` instead of failing the statement, so that
    the row it is in is reported unreadable, column by column (the default factory is C code:
    kept for every statement that reads good text)."""
    conn.text_factory = tolerant_text
    try:
        yield
    finally:
        conn.text_factory = str


def _fetch(conn: sqlite3.Connection, stmt: Stmt) -> list[Row]:
    """One statement of a read: a row whose text is not UTF-8 read again, tolerantly."""
    params: dict[str, Any] = dict(stmt.params or {})
    for value in params.values():  # SQLite would look NUL up; PostgreSQL cannot hold it
        if isinstance(value, str) and "\x00" in value:
            raise cannot_store("text holding NUL")
    try:
        return conn.execute(stmt.text, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode to UTF-8" not in str(exc):
            raise
        with _tolerant(conn):  # a row holds text that is not UTF-8
            return conn.execute(stmt.text, params).fetchall()


def _split_statements(script: str) -> list[str]:
    """Split a migration into statements without breaking ones that contain semicolons."""
    statements, pending = [], ""
    for line in script.splitlines(keepends=True):
        if not pending and (not line.strip() or line.lstrip().startswith("--")):
            continue
        pending += line
        if sqlite3.complete_statement(pending):
            statements.append(pending.strip())
            pending = ""
    if pending.strip():
        statements.append(pending.strip())
    return statements


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch a file to WAL (it stays so). The switch needs the file to itself, and SQLite
    answers "locked" without consulting the busy timeout when two processes create the same
    new file at once: so look first, and retry the switch for as long as a write would wait."""
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
