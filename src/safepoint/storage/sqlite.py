"""The embedded store: one SQLite file in WAL mode, shared safely by many processes.

Concurrency rules (each learned from a double execution somewhere else):
- one connection per thread (and per process: a forked child opens its own);
- every write is one ``BEGIN IMMEDIATE`` transaction, so writers queue on SQLite's lock instead
  of failing half-way, with a busy timeout long enough to ride out other writers;
- every worker write starts with ``fence_check``, in the same transaction as the write.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._rules.approvals import approval_detail as approved_detail
from .._rules.approvals import (
    authorizing,
    plan_approval,
    plan_revocation,
    refused_dispatch,
    revocation_detail,
    waiting_record,
)
from .._rules.canonical import digest as content_digest
from .._rules.canonical import dumps, sha256_hex
from .._rules.history import history_warning, warn, warning_due
from .._rules.recovery import refusal
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    HistoryWarning,
    LostOwnership,
    MigrationMismatch,
    ResolutionRefused,
    RunConflict,
    RunNotFound,
    SchemaTooNew,
    StoreError,
)
from ..types import (
    JSON,
    ApprovalGate,
    ApprovalRecord,
    ApprovalRequest,
    ApprovalRevocation,
    AttemptRecord,
    Claim,
    Durability,
    EffectState,
    EventRecord,
    Ledger,
    LedgerIdentity,
    OperationRecord,
    Resolution,
    ResolutionAction,
    RunRecord,
    RunStatus,
    StepRecord,
    UnreadableRun,
)
from ._rows import (
    ARTIFACT_ERRORS,
    Unfetched,
    approval_record,
    event_record,
    ledger,
    listed_run,
    operation_record,
    run_record,
    stored_json,
    tolerant_text,
)
from .base import (
    INLINE_LIMIT,
    NewRun,
    Replan,
    abandoned_error,
    cancelled_error,
    cannot_store,
    check_payload,
    load_migrations,
    load_queries,
    refuse_gated,
    refused_write,
    retry_json,
    unstorable,
)

_Q = load_queries("sqlite")
_BUSY_TIMEOUT_S = 30.0
_WAKE_POLL_S = 0.005


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class SqliteStore:
    """The ledger in one SQLite file (or in memory, for fast unit tests)."""

    def __init__(self, path: str | os.PathLike[str], *,
                 durability: Durability = Durability.PROCESS_CRASH,
                 clock: Callable[[], int] = _wall_clock_ms,
                 inline_limit: int = INLINE_LIMIT) -> None:
        self.durability = Durability(durability)
        self._clock = clock
        self._inline_limit = inline_limit
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
        self.identity = self._identity()

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self._target, timeout=_BUSY_TIMEOUT_S, uri=self._uri,
                                   isolation_level=None, check_same_thread=True)
            conn.row_factory = sqlite3.Row
            if not self._uri:
                _enable_wal(conn)
            full = self.durability is Durability.POWER_LOSS
            conn.execute(f"PRAGMA synchronous={'FULL' if full else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"cannot open SQLite store {self._target}: {exc}; check the path and that it"
                " is a safepoint database", path=self._target) from exc
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():
            conn = self._connect()
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

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

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._turn():
            yield from self._transaction()

    @contextmanager
    def _tolerant(self, conn: sqlite3.Connection) -> Iterator[None]:
        """Text that is not UTF-8 read as ``Undecodable`` instead of failing the statement, so
        that the row it is in is reported unreadable, column by column (the default factory is
        C code: kept for every statement that reads good text)."""
        conn.text_factory = tolerant_text
        try:
            yield
        finally:
            conn.text_factory = str

    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write transaction; driver errors become StoreError with the cause kept."""
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to the store: {exc}") from exc
        try:
            with self._tolerant(conn):  # a write returns a row or two: the cost is nil
                yield conn
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:  # SQLite may already have rolled back on its own
                conn.execute("ROLLBACK")
            if isinstance(exc, (sqlite3.Error, UnicodeError)):
                raise unstorable(exc) or StoreError(f"write to the store failed: {exc}") from exc
            raise

    def _read(self, query: str, params: dict[str, Any]) -> list[sqlite3.Row]:
        for value in params.values():  # SQLite would look NUL up; PostgreSQL cannot hold it
            if isinstance(value, str) and "\x00" in value:
                raise cannot_store("text holding NUL")
        try:
            with self._turn():
                conn = self._conn()
                try:
                    return conn.execute(_Q[query], params).fetchall()
                except sqlite3.OperationalError as exc:
                    if "decode to UTF-8" not in str(exc):
                        raise
                    with self._tolerant(conn):  # a row holds text that is not UTF-8
                        return conn.execute(_Q[query], params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the store: {exc}") from exc
        except UnicodeEncodeError as exc:  # a lookup by an id no record can have
            raise unstorable(exc) or StoreError(f"cannot read the store: {exc}") from exc

    def now(self) -> int:
        return self._clock()

    # -- migrations ----------------------------------------------------------------------------

    def _migrate(self) -> None:
        shipped = load_migrations("sqlite")
        conn = self._conn()
        conn.execute(
            "CREATE TABLE IF NOT EXISTS safepoint_schema_version ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,"
            " applied_at INTEGER NOT NULL)")
        if self._check_applied(conn, shipped) == len(shipped):
            return
        with self._write() as conn:  # re-check under the write lock: another process may race us
            applied = self._check_applied(conn, shipped)
            for version, name, sql in shipped[applied:]:
                for statement in _split_statements(sql):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO safepoint_schema_version VALUES (?, ?, ?, ?)",
                    (version, name, sha256_hex(sql.encode()), self.now()))

    @staticmethod
    def _check_applied(conn: sqlite3.Connection, shipped: list[tuple[int, str, str]]) -> int:
        rows = conn.execute(
            "SELECT version, checksum FROM safepoint_schema_version ORDER BY version").fetchall()
        if rows and rows[-1][0] > len(shipped):
            raise SchemaTooNew(rows[-1][0], len(shipped))
        for version, checksum in rows:
            if checksum != sha256_hex(shipped[version - 1][2].encode()):
                raise MigrationMismatch(version)
        return len(rows)

    def _identity(self) -> LedgerIdentity:
        rows = self._read("ledger_identity", {})
        if len(rows) != 1:
            raise CorruptRecord("safepoint_ledger", "singleton", "the ledger's identity row is"
                                " missing: it is minted once, by migration 9, and never removed")
        return LedgerIdentity(str(rows[0]["ledger_id"]), int(rows[0]["keyed_since"]))

    def schema_version(self) -> int:
        row = self._conn().execute("SELECT MAX(version) FROM safepoint_schema_version").fetchone()
        return int(row[0] or 0)

    # -- values and artifacts ------------------------------------------------------------------

    def _put_value(self, conn: sqlite3.Connection, value: JSON, now: int) -> tuple[str | None, str | None]:
        """Store a JSON value inline, or as an artifact when it is large: (text, ref)."""
        text = dumps(value)
        if len(text) <= self._inline_limit:
            return text, None
        return None, self._put_artifact(conn, text.encode(), now)

    def _put_artifact(self, conn: sqlite3.Connection, data: bytes, now: int,
                      ref: str | None = None) -> str:
        """Store ``data`` under its digest (``ref``, when the caller checked it already)."""
        ref = ref or content_digest(data)
        conn.execute(_Q["insert_artifact"],
                     {"digest": ref, "size": len(data), "content": data, "now": now})
        return ref

    def get_artifact(self, digest: str) -> bytes:
        rows = self._read("get_artifact", {"digest": digest})
        if not rows:
            raise ArtifactMissing(digest)
        data = bytes(rows[0]["content"])
        actual = content_digest(data)
        if actual != digest:
            raise ArtifactCorrupt(digest, actual)
        return data

    def _artifact_values(self, row: sqlite3.Row, *columns: str,
                         listing: bool = False) -> dict[str, Any]:
        """The stored JSON of each of these columns kept in an artifact (``<column>_ref``): for
        a listing, one that cannot be had is a value to show unreadable, not an error."""
        values: dict[str, Any] = {}
        for column in columns:
            ref = row[f"{column}_ref"]
            if ref is not None:
                try:
                    values[column] = self.get_artifact(ref)
                except ARTIFACT_ERRORS as exc:
                    if not listing:
                        raise
                    values[column] = Unfetched(exc)
        return values

    # -- runs ----------------------------------------------------------------------------------

    def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        now = self.now()
        with self._write() as conn:
            created = self._insert_run(conn, new, now)
        return self._created(new, created, now)

    def _insert_run(self, conn: sqlite3.Connection, new: NewRun, now: int, *,
                    parent: Mapping[str, Any] | None = None) -> bool:
        """Insert ``new`` with its first event — a successor of ``parent`` (its chain's row,
        continue as new) or a chain of its own; False when the run id exists."""
        claimed = new.owner is not None
        fence = 1 if claimed else 0
        inputs, inputs_ref = self._put_value(conn, new.inputs, now)
        cursor = conn.execute(_Q["insert_run"], {
            "run_id": new.run_id, "workflow": new.workflow,
            "workflow_version": new.workflow_version,
            "status": (RunStatus.RUNNING if claimed else RunStatus.PENDING).value,
            "input_hash": new.input_hash, "inputs": inputs, "inputs_ref": inputs_ref,
            "owner": new.owner, "lease_expires_at": now + new.lease_ms if claimed else None,
            "fence": fence, "resume_budget": new.resume_budget,
            "workflow_fingerprint": new.workflow_fingerprint,
            "workflow_manifest": _json_or_none(new.workflow_manifest),
            "deadline_at": new.deadline_at, "deadline_ms": new.deadline_ms,
            "token_budget": new.token_budget, "cost_budget": new.cost_budget,
            "step_attempts": retry_json(new.step_attempts),
            "history_soft_limit": new.history_soft_limit,
            "history_hard_limit": new.history_hard_limit,
            "chain_id": parent["chain_id"] if parent else None,
            "chain_index": parent["chain_index"] + 1 if parent else 0,
            "parent_run_id": parent["run_id"] if parent else None, "now": now})
        if cursor.rowcount != 1:
            return False
        detail = {"workflow": new.workflow, "version": new.workflow_version}
        if parent is not None:
            detail["continues"] = parent["run_id"]
        self._event(conn, new.run_id, now, "run.started" if claimed else "run.submitted",
                    fence=fence, worker=new.owner, detail=detail)
        return True

    def _created(self, new: NewRun, created: bool, now: int) -> tuple[RunRecord, Claim | None]:
        run = self.get_run(new.run_id)
        if not (created and new.owner):
            return run, None
        return run, Claim(new.run_id, new.owner, 1, run.state_revision, now + new.lease_ms,
                          new.lease_ms)

    def get_run(self, run_id: str) -> RunRecord:
        return self._run_record(self._run_row(run_id))

    def find_run(self, run_id: str) -> RunRecord | UnreadableRun:
        return self._listed(self._run_row(run_id))

    def _run_row(self, run_id: str) -> sqlite3.Row:
        rows = self._read("get_run", {"run_id": run_id})
        if not rows:
            raise RunNotFound(run_id)
        return rows[0]

    def list_runs(self, status: RunStatus | None = None,
                  limit: int = 100) -> list[RunRecord | UnreadableRun]:
        rows = self._read("list_runs", {"status": status.value if status else None,
                                        "limit": limit})
        return [self._listed(row) for row in rows]

    def _listed(self, row: sqlite3.Row) -> RunRecord | UnreadableRun:
        return listed_run(row, self._artifact_values(row, "inputs", "result", listing=True))

    def _run_record(self, row: sqlite3.Row) -> RunRecord:
        return run_record(row, self._artifact_values(row, "inputs", "result"))

    def claim_run(self, run_id: str, expected_revision: int, owner: str, lease_ms: int,
                  dead_owner: str | None = None) -> Claim | None:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(_Q["claim_run"], {
                "run_id": run_id, "expected_revision": expected_revision, "owner": owner,
                "lease_expires_at": now + lease_ms, "now": now,
                "dead_owner": dead_owner}).fetchone()
            if row is None:
                return None
            self._event(conn, run_id, now, "run.claimed", fence=row["fence"], worker=owner,
                        detail={"took_over_from": dead_owner} if dead_owner else None)
        return Claim(run_id, owner, row["fence"], row["state_revision"],
                     row["lease_expires_at"], lease_ms)

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        now = self.now()
        with self._write() as conn:
            row = conn.execute(_Q["next_runnable"], {"now": now,
                                                     "workflows": dumps(workflows)}).fetchone()
            if row is None:
                return None
            taken = conn.execute(_Q["claim_run"], {
                "run_id": row["run_id"], "expected_revision": row["state_revision"],
                "owner": owner, "lease_expires_at": now + lease_ms,
                "now": now,
                "dead_owner": None}).fetchone()
            self._event(conn, row["run_id"], now, "run.claimed", fence=taken["fence"],
                        worker=owner)
        return Claim(row["run_id"], owner, taken["fence"], taken["state_revision"],
                     taken["lease_expires_at"], lease_ms)

    def wait_for_work(self, timeout: float) -> None:
        """SQLite has no notifications, but ``PRAGMA data_version`` changes whenever another
        connection commits: a cheap in-memory check, polled often, wakes workers promptly."""
        conn = self._conn()
        seen = conn.execute("PRAGMA data_version").fetchone()[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(_WAKE_POLL_S)
            if conn.execute("PRAGMA data_version").fetchone()[0] != seen:
                return

    def load_ledger(self, run_id: str) -> Ledger:
        run = self.get_run(run_id)
        steps = [(row, self._artifact_values(row, "result"))
                 for row in self._read("steps_of_run", {"run_id": run_id})]
        return ledger(run, steps, self._read("operations_of_run", {"run_id": run_id}),
                      self._read("attempts_of_run", {"run_id": run_id}))

    def events(self, run_id: str) -> list[EventRecord]:
        return [event_record(row) for row in self._read("events_of_run", {"run_id": run_id})]

    # -- worker writes -------------------------------------------------------------------------

    def _fence_check(self, conn: sqlite3.Connection, claim: Claim, now: int, events: int,
                     *, step: StepRecord | None = None, new_work: bool = False,
                     limited: bool = False) -> HistoryWarning | None:
        """The fence of a worker write, counting the history it adds (``events`` events, and
        ``step`` when it is a new row). ``new_work``: refused once a cancel is asked for;
        ``limited``: also refused past the hard history limit. Records the soft limit's warning
        when it falls due, and returns it, to be issued once the transaction committed."""
        query = "fence_check_new_work" if new_work else "fence_check"
        row = conn.execute(_Q[query], {
            "run_id": claim.run_id, "fence": claim.fence, "lease_expires_at": now + claim.lease_ms,
            "events": events, "step_id": step.step_id if step else None,
            "limited": int(limited), "now": now}).fetchone()
        if row is None:
            raise self._refused(conn, claim, now, limited=limited)
        return self._soft_limit_warning(conn, claim, row, now)

    def _soft_limit_warning(self, conn: sqlite3.Connection, claim: Claim, row: sqlite3.Row,
                            now: int) -> HistoryWarning | None:
        """After a fenced write: record the soft limit's warning once it falls due, and return
        it, to be issued once the transaction committed."""
        if not warning_due(row["history"], row["history_soft_limit"], row["history_warned_at"]):
            return None
        conn.execute(_Q["record_history_warning"], {"run_id": claim.run_id,
                                                     "fence": claim.fence, "now": now})
        size, soft, hard = row["history"] + 1, row["history_soft_limit"], row["history_hard_limit"]
        self._event(conn, claim.run_id, now, "run.history_warning", fence=claim.fence,
                    worker=claim.owner, detail={"history": size, "soft": soft, "hard": hard})
        return history_warning(claim.run_id, size, soft, hard)

    @staticmethod
    def _refused(conn: sqlite3.Connection, claim: Claim, now: int, *,
                 limited: bool = False) -> BaseException:
        """Why a fenced statement matched nothing (see ``refused_write``)."""
        state = conn.execute(_Q["fence_state"], {"run_id": claim.run_id}).fetchone()
        if state is None:
            return LostOwnership(claim.run_id, claim.fence)
        return refused_write(claim, state["fence"], state["status"],
                             state["cancel_requested_at"], state["deadline_at"], now,
                             limited=limited, history=state["history"],
                             hard_limit=state["history_hard_limit"])

    def _event(self, conn: sqlite3.Connection, run_id: str, now: int, kind: str, *,
               step_id: str | None = None, operation_id: str | None = None,
               fence: int | None = None, worker: str | None = None,
               detail: JSON = None) -> None:
        conn.execute(_Q["insert_event"], {
            "run_id": run_id, "now": now, "kind": kind, "step_id": step_id,
            "operation_id": operation_id, "fence": fence, "worker": worker,
            "detail": None if detail is None else dumps(detail)})

    def _upsert_step(self, conn: sqlite3.Connection, claim: Claim, step: StepRecord,
                     now: int) -> None:
        result, result_ref = self._put_value(conn, step.result, now)
        conn.execute(_Q["upsert_step"], {
            "run_id": claim.run_id, "step_id": step.step_id, "seq": step.seq,
            "kind": step.kind.value, "name": step.name, "input_hash": step.input_hash,
            "status": step.status.value, "result": result, "result_ref": result_ref,
            "error": None if step.error is None else dumps(step.error), "next_step_id": step.next_step_id,
            "attempt": step.attempt, "model_id": step.model_id,
            "prompt_hash": step.prompt_hash, "observed_at": step.observed_at,
            "operation_id": step.operation_id, "fence": claim.fence, "now": now,
            "tokens": step.tokens, "cost": step.cost})

    def record_step(self, claim: Claim, step: StepRecord) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, step=step, new_work=True,
                                    limited=True)
            self._upsert_step(conn, claim, step, now)
            if step.tokens or step.cost:
                conn.execute(_Q["add_usage"], {"run_id": claim.run_id, "tokens": step.tokens,
                                               "cost": step.cost})
        warn(due)

    def record_steps(self, claim: Claim, steps: list[StepRecord]) -> None:
        if not steps:
            return
        now = self.now()
        with self._write() as conn:
            row = conn.execute(_Q["fence_check_steps"], {
                "run_id": claim.run_id, "fence": claim.fence,
                "lease_expires_at": now + claim.lease_ms, "now": now,
                "step_ids": dumps([step.step_id for step in steps])}).fetchone()
            if row is None:
                raise self._refused(conn, claim, now, limited=True)
            due = self._soft_limit_warning(conn, claim, row, now)
            for step in steps:
                self._upsert_step(conn, claim, step, now)
            tokens = sum(step.tokens or 0 for step in steps)
            cost = sum(step.cost or 0 for step in steps)
            if tokens or cost:
                conn.execute(_Q["add_usage"], {"run_id": claim.run_id, "tokens": tokens,
                                               "cost": cost})
        warn(due)

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, new_work=True)
            conn.execute(_Q["insert_attempt"], {
                "run_id": claim.run_id, "step_id": attempt.step_id, "attempt": attempt.attempt,
                "kind": attempt.kind.value, "name": attempt.name,
                "input_hash": attempt.input_hash, "error": dumps(attempt.error),
                "retry_at": attempt.retry_at, "fence": claim.fence, "now": now})
        warn(due)

    def renew_lease(self, claim: Claim) -> None:
        with self._write() as conn:
            cursor = conn.execute(_Q["renew_lease"], {
                "run_id": claim.run_id, "fence": claim.fence,
                "lease_expires_at": self.now() + claim.lease_ms})
            if cursor.rowcount != 1:
                raise LostOwnership(claim.run_id, claim.fence)

    def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        now = self.now()
        with self._write() as conn:
            due = self._prepare(conn, claim, op, payload, now)
        warn(due)

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        now = self.now()
        with self._write() as conn:
            op, due = self._mark_dispatching(conn, claim, operation_id, now)
        warn(due)
        return op

    def prepare_and_mark_dispatching(self, claim: Claim, op: OperationRecord,
                                     payload: bytes) -> OperationRecord:
        refuse_gated(op)
        now = self.now()
        with self._write() as conn:
            prepared_due = self._prepare(conn, claim, op, payload, now)
            dispatching, due = self._mark_dispatching(conn, claim, op.operation_id, now)
        warn(due or prepared_due)  # the soft limit warns once: at most one of them is due
        return dispatching

    def _prepare(self, conn: sqlite3.Connection, claim: Claim, op: OperationRecord,
                 payload: bytes, now: int) -> HistoryWarning | None:
        """``prepare_effect``'s statements, in the caller's transaction."""
        check_payload(op, payload)
        due = self._fence_check(conn, claim, now, events=1, new_work=True, limited=True)
        self._put_artifact(conn, payload, now, op.payload_ref)  # checked above
        conn.execute(_Q["insert_operation"], {
            "run_id": claim.run_id, "operation_id": op.operation_id, "step_id": op.step_id,
            "effect": op.effect, "payload_ref": op.payload_ref,
            "effect_key": op.effect_key, "fence": claim.fence, "now": now})
        if op.approval_required:
            conn.execute(_Q["require_approval"], {
                "run_id": claim.run_id, "operation_id": op.operation_id,
                "target_digest": op.target_digest, "now": now})
        self._event(conn, claim.run_id, now, "effect.prepared", step_id=op.step_id,
                    operation_id=op.operation_id, fence=claim.fence, worker=claim.owner,
                    detail={"effect": op.effect, "payload_ref": op.payload_ref})
        return due

    def _mark_dispatching(self, conn: sqlite3.Connection, claim: Claim, operation_id: str,
                          now: int) -> tuple[OperationRecord, HistoryWarning | None]:
        """``mark_dispatching``'s statements, in the caller's transaction."""
        # an operation already prepared is sent whatever the history: never held to it
        due = self._fence_check(conn, claim, now, events=1, new_work=True)
        row = conn.execute(_Q["mark_dispatching"], {
            "run_id": claim.run_id, "operation_id": operation_id, "fence": claim.fence,
            "now": now}).fetchone()
        if row is None:
            raise StoreError(f"operation {operation_id!r} is not in a dispatchable state",
                             run_id=claim.run_id, operation_id=operation_id)
        op = operation_record(row)
        if op.approval_required:  # the gate, on this transaction's clock: or nothing is written
            approvals = self._approvals_of(conn, claim.run_id, operation_id)
            approval = authorizing(approvals, payload_digest=op.payload_ref,
                                   target_digest=op.target_digest, now=now)
            if approval is None:
                raise refused_dispatch(op, approvals, now)
            conn.execute(_Q["dispatch_approved"], {
                "run_id": claim.run_id, "operation_id": operation_id,
                "approval_id": approval.approval_id})
            op = replace(op, approval_id=approval.approval_id)
        self._event(conn, claim.run_id, now, "effect.dispatching", step_id=op.step_id,
                    operation_id=operation_id, fence=claim.fence, worker=claim.owner,
                    detail={"dispatch": op.dispatch_count})
        return op, due

    def record_outcome(self, claim: Claim, operation_id: str, state: EffectState, *,
                       receipt: JSON = None, error: JSON = None,
                       step: StepRecord | None = None) -> None:
        now = self.now()
        with self._write() as conn:
            # an outcome is never held to the history limit: what happened is always recorded
            due = self._fence_check(conn, claim, now, events=1, step=step)
            cursor = conn.execute(_Q["record_outcome"], {
                "run_id": claim.run_id, "operation_id": operation_id, "state": state.value,
                "receipt": None if receipt is None else dumps(receipt),
                "error": None if error is None else dumps(error), "fence": claim.fence,
                "now": now})
            if cursor.rowcount != 1:
                raise StoreError(f"no operation {operation_id!r} in run {claim.run_id!r}",
                                 run_id=claim.run_id, operation_id=operation_id)
            if step is not None:
                self._upsert_step(conn, claim, step, now)
            self._event(conn, claim.run_id, now, f"effect.{state.value}",
                        step_id=step.step_id if step else None, operation_id=operation_id,
                        fence=claim.fence, worker=claim.owner,
                        detail={"error": error} if error is not None else None)
        warn(due)

    def finish_run(self, claim: Claim, status: RunStatus, *, result: JSON = None,
                   error: dict[str, Any] | None = None,
                   recovery_record: dict[str, Any] | None = None) -> None:
        now = self.now()
        with self._write() as conn:
            result_text, result_ref = self._put_value(conn, result, now)
            cursor = conn.execute(_Q["finish_run"], {
                "run_id": claim.run_id, "fence": claim.fence, "status": status.value,
                "result": result_text, "result_ref": result_ref,
                "error": None if error is None else dumps(error),
                "recovery_record": None if recovery_record is None else dumps(recovery_record),
                "now": now})
            if cursor.rowcount != 1:
                raise LostOwnership(claim.run_id, claim.fence)
            self._event(conn, claim.run_id, now, f"run.{status.value}", fence=claim.fence,
                        worker=claim.owner,
                        detail=error or ({"phase": recovery_record.get("phase")}
                                         if recovery_record else None))

    def resolve(self, run_id: str, expected_revision: int,
                resolution: Resolution) -> RunRecord:
        now = self.now()
        abandon = resolution.action is ResolutionAction.ABANDON
        try:
            with self._write() as conn:
                if conn.execute(_Q["resolve_run"], {
                        "run_id": run_id, "expected_revision": expected_revision, "now": now,
                        "status": (RunStatus.CANCELLED if abandon else RunStatus.RUNNING).value,
                        "error": dumps(abandoned_error(resolution)) if abandon else None,
                        }).rowcount != 1:
                    raise _NotApplicable
                if not abandon and conn.execute(_Q["resolve_operation"], {
                        "run_id": run_id, "operation_id": resolution.operation_id, "now": now,
                        "to_state": (EffectState.ACCEPTED if resolution.action
                                     is ResolutionAction.APPLIED else EffectState.PREPARED).value,
                        "receipt": None if resolution.receipt is None
                        else dumps(resolution.receipt)}).rowcount != 1:
                    raise _NotApplicable  # rolls the run's update back with it
                self._event(conn, run_id, now, "run.resolved",
                            operation_id=resolution.operation_id, worker=resolution.by,
                            detail=resolution.detail())
                return self._read_back(run_id)
        except _NotApplicable:
            last = self._read("last_event", {"run_id": run_id})
            repeated = (bool(last) and last[0]["kind"] == "run.resolved"
                        and stored_json(last[0]["detail"], "safepoint_events",
                                        f"run_id={run_id}") == resolution.detail())
            if not repeated:  # the same decision twice is harmless; anything else is refused
                run = self.get_run(run_id)
                raise ResolutionRefused(
                    run_id, refusal(run, expected_revision, resolution)) from None
        return self.get_run(run_id)

    def request_cancel(self, run_id: str, by: str, reason: str | None = None) -> RunRecord:
        now = self.now()
        detail = {"by": by, "reason": reason}
        with self._write() as conn:
            row = conn.execute(_Q["request_cancel"], {
                "run_id": run_id, "now": now,
                "error": dumps(cancelled_error(by, reason))
            }).fetchone()
            if row is not None:
                self._event(conn, run_id, now, "run.cancelled" if row["status"] == "cancelled"
                            else "run.cancel_requested", worker=by, detail=detail)
            return self._read_back(run_id)

    def _read_back(self, run_id: str) -> RunRecord:
        """The run a person's write just changed, read in that write's transaction: a run whose
        row cannot be read raises ``CorruptRecord`` and the write rolls back — as on every
        store, nothing changes a run nobody can read but the worker that blocks it."""
        return self.get_run(run_id)

    def replan(self, claim: Claim, change: Replan) -> None:
        now = self.now()
        common = {"run_id": claim.run_id, "fence": claim.fence, "now": now}
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=1, new_work=True)
            self._event(conn, claim.run_id, now, "run.replanned", step_id=change.step_id,
                        fence=claim.fence, worker=claim.owner, detail=change.detail())
            if change.workflow_version is not None:
                conn.execute(_Q["adopt_workflow"], {
                    **common, "workflow_version": change.workflow_version,
                    "workflow_fingerprint": change.workflow_fingerprint,
                    "workflow_manifest": _json_or_none(change.workflow_manifest)})
            if change.step_id is not None:
                params = {**common, "step_id": change.step_id, "worker": claim.owner,
                          "through_seq": change.through_seq, "reason": change.reason,
                          "keep": dumps(list(change.keep))}
                moved = conn.execute(_Q["abandon_steps"], params).rowcount
                deleted = conn.execute(_Q["delete_abandoned_steps"], params).rowcount
                conn.execute(_Q["count_events"], {"run_id": claim.run_id, "events": moved,
                                                  "steps": deleted})
        warn(due)

    def release_run(self, claim: Claim) -> None:
        with self._write() as conn:
            conn.execute(_Q["release_run"], {"run_id": claim.run_id, "fence": claim.fence,
                                             "now": self.now()})

    # -- approvals -----------------------------------------------------------------------------

    def _approvals_of(self, conn: sqlite3.Connection, run_id: str,
                      operation_id: str) -> list[ApprovalRecord]:
        rows = conn.execute(_Q["approvals_of_operation"],
                            {"run_id": run_id, "operation_id": operation_id}).fetchall()
        return [approval_record(row) for row in rows]

    def approvals(self, run_id: str) -> list[ApprovalRecord]:
        return [approval_record(row)
                for row in self._read("approvals_of_run", {"run_id": run_id})]

    def reprepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        check_payload(op, payload)
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=1, new_work=True)
            self._put_artifact(conn, payload, now, op.payload_ref)  # checked above
            if conn.execute(_Q["reprepare_operation"], {
                    "run_id": claim.run_id, "operation_id": op.operation_id,
                    "payload_ref": op.payload_ref, "target_digest": op.target_digest,
                    "fence": claim.fence, "now": now}).rowcount != 1:
                raise StoreError(f"operation {op.operation_id!r} is no longer prepared: its"
                                 " payload cannot change (it may have been sent)",
                                 run_id=claim.run_id, operation_id=op.operation_id)
            self._event(conn, claim.run_id, now, "effect.prepared", step_id=op.step_id,
                        operation_id=op.operation_id, fence=claim.fence, worker=claim.owner,
                        detail={"effect": op.effect, "payload_ref": op.payload_ref,
                                "revised": True})
        warn(due)

    def await_approval(self, claim: Claim, operation_id: str,
                       target_digest: str | None) -> ApprovalGate:
        now = self.now()
        with self._write() as conn:
            due = self._fence_check(conn, claim, now, events=0, new_work=True)
            row = conn.execute(_Q["require_approval"], {
                "run_id": claim.run_id, "operation_id": operation_id,
                "target_digest": target_digest, "now": now}).fetchone()
            if row is None:
                raise StoreError(f"operation {operation_id!r} is not in a dispatchable state",
                                 run_id=claim.run_id, operation_id=operation_id)
            op = operation_record(row)
            approvals = self._approvals_of(conn, claim.run_id, operation_id)
            approval = authorizing(approvals, payload_digest=op.payload_ref,
                                   target_digest=target_digest, now=now)
            gate = ApprovalGate(approval)
            if approval is None:
                waiting = waiting_record(op, target_digest=target_digest, approvals=approvals,
                                         now=now)
                conn.execute(_Q["wait_for_approval"], {
                    "run_id": claim.run_id, "fence": claim.fence,
                    "waiting_for": dumps(waiting), "now": now})
                self._event(conn, claim.run_id, now, "run.waiting", step_id=op.step_id,
                            operation_id=operation_id, fence=claim.fence, worker=claim.owner,
                            detail=waiting)
                gate = ApprovalGate(None, waiting)
        warn(due)
        return gate

    def _step_approvals(self, conn: sqlite3.Connection, run_id: str, step_id: str,
                        ) -> tuple[RunRecord, OperationRecord | None, list[ApprovalRecord]]:
        """The run, the operation its step ``step_id`` prepared, and that one's approvals."""
        rows = conn.execute(_Q["get_run"], {"run_id": run_id}).fetchall()
        if not rows:
            raise RunNotFound(run_id)
        run = self._run_record(rows[0])
        found = conn.execute(_Q["operation_of_step"],
                             {"run_id": run_id, "step_id": step_id}).fetchone()
        op = operation_record(found) if found is not None else None
        approvals = self._approvals_of(conn, run_id, op.operation_id) if op else []
        return run, op, approvals

    def approve(self, run_id: str, step_id: str, request: ApprovalRequest) -> ApprovalRecord:
        now = self.now()
        with self._write() as conn:  # BEGIN IMMEDIATE: serialised with await_approval
            run, op, approvals = self._step_approvals(conn, run_id, step_id)
            new, approval, release = plan_approval(run, step_id, op, approvals, request, now)
            if new is not None:
                conn.execute(_Q["insert_approval"], {
                    "approval_id": new.approval_id, "run_id": run_id,
                    "operation_id": new.operation_id, "step_id": new.step_id,
                    "payload_digest": new.payload_digest, "target_digest": new.target_digest,
                    "approved_by": new.approved_by, "evidence": new.evidence,
                    "approved_at": new.approved_at, "expires_at": new.expires_at})
            if new is not None or release:
                conn.execute(_Q["approve_run"], {"run_id": run_id, "release": release,
                                                 "now": now})
                self._event(conn, run_id, now, "effect.approved", step_id=approval.step_id,
                            operation_id=approval.operation_id, worker=approval.approved_by,
                            detail=approved_detail(approval, released=release))
        return approval

    def revoke_approval(self, run_id: str, step_id: str,
                        revocation: ApprovalRevocation) -> list[ApprovalRecord]:
        now = self.now()
        # BEGIN IMMEDIATE: serialised with mark_dispatching, so whichever commits first wins
        with self._write() as conn:
            run, op, approvals = self._step_approvals(conn, run_id, step_id)
            revoked = plan_revocation(run, step_id, op, approvals, revocation, now)
            of = revoked[0]  # never empty: plan_revocation refuses when nothing is in force
            conn.execute(_Q["revoke_approvals"], {
                "run_id": run_id, "operation_id": of.operation_id, "now": now,
                "revoked_by": revocation.by, "revoke_reason": revocation.reason})
            conn.execute(_Q["revoke_run"], {"run_id": run_id, "now": now})
            self._event(conn, run_id, now, "effect.approval_revoked", step_id=of.step_id,
                        operation_id=of.operation_id, worker=revocation.by,
                        detail=revocation_detail(revoked))
        return revoked

    # -- continue as new -----------------------------------------------------------------------

    def continue_as_new(self, claim: Claim, successor: NewRun) -> tuple[RunRecord, Claim | None]:
        now = self.now()
        with self._write() as conn:
            ended = conn.execute(_Q["continue_run"], {
                "run_id": claim.run_id, "fence": claim.fence,
                "successor_run_id": successor.run_id, "now": now}).fetchone()
            if ended is None:
                raise self._refused(conn, claim, now)
            self._event(conn, claim.run_id, now, "run.continued", fence=claim.fence,
                        worker=claim.owner, detail={"successor": successor.run_id})
            parent = {"run_id": claim.run_id, "chain_id": ended["chain_id"],
                      "chain_index": ended["chain_index"]}
            if not self._insert_run(conn, successor, now, parent=parent):
                # Never our own successor: the run would have ended continued with it. Raising
                # rolls the whole continue back.
                raise RunConflict(successor.run_id, f"and does not continue run {claim.run_id!r}")
        return self._created(successor, True, now)

    def chain_operation(self, chain_id: str, operation_id: str) -> OperationRecord | None:
        rows = self._read("chain_operation", {"chain_id": chain_id,
                                              "operation_id": operation_id})
        return operation_record(rows[0]) if rows else None


def _json_or_none(value: JSON) -> str | None:
    return None if value is None else dumps(value)


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


class _NotApplicable(Exception):
    pass


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
