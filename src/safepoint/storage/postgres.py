"""The shared store: PostgreSQL, for many workers on many machines.

Concurrency rules (see the header of ``sql/postgres/queries.sql`` for the statements):
- one small ``psycopg_pool.ConnectionPool`` per store object, every connection checked on
  checkout, so a restarted server costs one failed check, not a failed operation;
- every method is one transaction, and every worker write is one statement whose first part is
  the fence: an UPDATE of the runs row conditioned on the claim's fence. The row lock it takes
  orders the write against any claim of the same run;
- "now" is the database clock (``safepoint_now_ms()``), read inside those statements, so workers
  on machines whose clocks disagree still agree on who holds a lease;
- idle workers LISTEN on ``safepoint_work``; a run submitted for workers, or released by one,
  NOTIFYs it in the same transaction.

The URL is a libpq URL plus two safepoint parameters: ``schema=name`` (tables live in that schema,
created if missing; tests use it to isolate themselves) and ``durability=power_loss``.

>>> store = PostgresStore("postgresql://worker@db.internal/app?schema=safepoint")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from .._canonical import digest as content_digest
from .._canonical import dumps, loads, sha256_hex
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    InvalidStoreURL,
    LostOwnership,
    MigrationMismatch,
    RunNotFound,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
)
from ..types import (
    JSON,
    Claim,
    Durability,
    EffectState,
    EventRecord,
    Ledger,
    OperationRecord,
    RunRecord,
    RunStatus,
    StepKind,
    StepRecord,
    StepStatus,
)
from .base import INLINE_LIMIT, NewRun, load_migrations, load_queries

_Q = load_queries("postgres")
_CHANNEL = "safepoint_work"
_OUR_PARAMETERS = ("schema", "durability")

log = logging.getLogger("safepoint.store")

Conn = psycopg.Connection[DictRow]
Row = dict[str, Any]


class PostgresStore:
    """The ledger in a PostgreSQL database, shared by any number of workers."""

    def __init__(self, url: str, *, durability: Durability | str | None = None,
                 inline_limit: int = INLINE_LIMIT, max_connections: int = 8,
                 connect_timeout: float = 5.0, pool_timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {name: query.pop(name) for name in _OUR_PARAMETERS if name in query}
        self.url = _redacted(url)
        chosen = durability or ours.get("durability") or Durability.PROCESS_CRASH
        try:
            self.durability = Durability(chosen)
        except ValueError:
            raise InvalidStoreURL(self.url, f"unknown durability {chosen!r}; use "
                                  + " or ".join(d.value for d in Durability)) from None
        self._schema = ours.get("schema") or None
        if "schema" in ours and not self._schema:
            raise InvalidStoreURL(self.url, "schema= needs a schema name")
        libpq_url = urlunsplit(parts._replace(query=urlencode(query)))
        try:
            given = conninfo_to_dict(libpq_url)
        except psycopg.ProgrammingError as exc:
            raise InvalidStoreURL(self.url, _reason(exc)) from exc
        defaults: dict[str, str | int] = {"connect_timeout": max(1, round(connect_timeout)),
                                          "application_name": "safepoint"}
        self._conninfo = make_conninfo(libpq_url, **{
            key: value for key, value in defaults.items() if key not in given})
        self._inline_limit = inline_limit
        self._pid = os.getpid()
        self._local = threading.local()
        self._listeners: list[psycopg.Connection[Any]] = []
        self._listeners_lock = threading.Lock()

        with self._connect() as conn:  # fails fast, with libpq's reason, when unreachable
            self._migrate(conn)
            if self.durability is Durability.POWER_LOSS:
                fsync = conn.execute("SHOW fsync").fetchone()
                if fsync and fsync["fsync"] != "on":
                    log.warning("durability=power_loss asked, but the server runs with"
                                " fsync=off: commits will not survive a power loss")
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            self._conninfo, connection_class=psycopg.Connection[DictRow],
            kwargs={"row_factory": dict_row}, min_size=1, max_size=max_connections,
            open=False, configure=self._setup, check=ConnectionPool.check_connection,
            timeout=pool_timeout, name=f"safepoint:{self.url}")
        try:
            self._pool.open(wait=True, timeout=pool_timeout)
        except PoolTimeout as exc:
            raise _unreachable(self.url, exc) from exc

    # -- connections ---------------------------------------------------------------------------

    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        """Per-connection settings: the schema, and the stated durability."""
        if self._schema:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(self._schema)))
        if self.durability is Durability.POWER_LOSS:
            conn.execute(_Q["power_loss_durability"])
        if not conn.autocommit:
            conn.commit()

    def _connect(self, *, autocommit: bool = False) -> Conn:
        """A connection outside the pool: for migrating, and for listening."""
        try:
            conn = psycopg.Connection[DictRow].connect(
                self._conninfo, autocommit=autocommit, row_factory=dict_row)
        except psycopg.OperationalError as exc:
            raise _unreachable(self.url, exc) from exc
        except psycopg.Error as exc:
            raise InvalidStoreURL(self.url, _reason(exc)) from exc
        try:
            self._setup(conn)
        except psycopg.Error as exc:
            conn.close()
            raise StoreError(f"cannot prepare a connection to {self.url}: {_reason(exc)}",
                             url=self.url) from exc
        return conn

    @contextmanager
    def _transaction(self) -> Iterator[Conn]:
        """One transaction on a pooled connection; driver errors become StoreError (the
        original kept as ``__cause__``), anything else — LostOwnership — rolls back and passes."""
        if os.getpid() != self._pid:
            raise StoreError("this PostgreSQL store was opened in a parent process; open a new"
                             " store in the child (connections cannot cross a fork)")
        try:
            with self._pool.connection() as conn, conn.transaction():
                yield conn
        except PoolTimeout as exc:
            raise StoreUnavailable(
                f"no usable connection to the store at {self.url} within {self._pool.timeout:g}s"
                f" ({_reason(exc)}): the server is down or unreachable, or every one of the"
                f" {self._pool.max_size} pooled connections stayed busy; try again once it is"
                " back (or open the store with more connections)", url=self.url) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"the connection to the store at {self.url} broke during the operation"
                f" ({_reason(exc)}); it may or may not have committed — try again once the"
                " server is reachable (the ledger tells which)", url=self.url) from exc
        except (psycopg.Error, UnicodeError) as exc:
            raise StoreError(f"the store refused the operation: {_reason(exc)}",
                             url=self.url) from exc

    def _read(self, query: str, params: dict[str, Any]) -> list[Row]:
        with self._transaction() as conn:
            return conn.execute(_Q[query], params).fetchall()

    def now(self) -> int:
        """The database clock, epoch milliseconds: the one "now" of every worker."""
        return int(self._read("now", {})[0]["now"])

    def close(self) -> None:
        self._pool.close()
        with self._listeners_lock:
            listeners, self._listeners = self._listeners, []
        for conn in listeners:
            conn.close()
        self._local = threading.local()

    # -- migrations ----------------------------------------------------------------------------

    def _migrate(self, conn: Conn) -> None:
        shipped = load_migrations("postgres")
        try:
            with conn.transaction():  # the common case: up to date, no lock, no DDL
                if self._check_applied(conn, shipped) == len(shipped):
                    return
            with conn.transaction():
                conn.execute(_Q["migration_lock"])  # concurrent openers queue here
                if self._schema:
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                        sql.Identifier(self._schema)))
                conn.execute(_Q["create_version_table"])
                applied = self._check_applied(conn, shipped)  # again, under the lock
                for version, name, text in shipped[applied:]:
                    conn.execute(text)
                    conn.execute(_Q["record_migration"], {
                        "version": version, "name": name,
                        "checksum": sha256_hex(text.encode())})
        except psycopg.Error as exc:
            raise StoreError(
                f"cannot migrate the store at {self.url}: {_reason(exc)}; check that the schema"
                " exists (or name it with ?schema=, which is created for you) and that this user"
                " may create tables in it, or run `safepoint migrate` as a user who can",
                url=self.url) from exc

    @staticmethod
    def _check_applied(conn: Conn, shipped: list[tuple[int, str, str]]) -> int:
        found = conn.execute(_Q["version_table_exists"]).fetchone()
        if not (found and found["found"]):
            return 0
        rows = conn.execute(_Q["applied_migrations"]).fetchall()
        if rows and rows[-1]["version"] > len(shipped):
            raise SchemaTooNew(rows[-1]["version"], len(shipped))
        for row in rows:
            if row["checksum"] != sha256_hex(shipped[row["version"] - 1][2].encode()):
                raise MigrationMismatch(row["version"])
        return len(rows)

    def schema_version(self) -> int:
        return int(self._read("schema_version", {})[0]["version"])

    # -- values and artifacts ------------------------------------------------------------------

    def _put_value(self, conn: Conn, value: JSON) -> tuple[str | None, str | None]:
        """Store a JSON value inline, or as an artifact when it is large: (text, ref)."""
        text = dumps(value)
        if len(text) <= self._inline_limit:
            return text, None
        return None, self._put_artifact(conn, text.encode())

    @staticmethod
    def _put_artifact(conn: Conn, data: bytes) -> str:
        ref = content_digest(data)
        conn.execute(_Q["insert_artifact"], {"digest": ref, "size": len(data), "content": data})
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

    def _get_value(self, text: str | None, ref: str | None, table: str, key: str) -> JSON:
        if ref is not None:
            text = self.get_artifact(ref).decode()
        if text is None:
            return None
        try:
            return loads(text)
        except ValueError as exc:
            raise CorruptRecord(table, key, f"stored JSON is unreadable ({exc})") from exc

    # -- runs ----------------------------------------------------------------------------------

    def create_run(self, new: NewRun) -> tuple[RunRecord, Claim | None]:
        with self._transaction() as conn:
            inputs, inputs_ref = self._put_value(conn, new.inputs)
            created = conn.execute(_Q["insert_run"], {
                "run_id": new.run_id, "workflow": new.workflow,
                "workflow_version": new.workflow_version, "input_hash": new.input_hash,
                "inputs": inputs, "inputs_ref": inputs_ref, "owner": new.owner,
                "lease_ms": new.lease_ms,
                "detail": dumps({"workflow": new.workflow, "version": new.workflow_version}),
            }).fetchone()
            if created is None:
                row = conn.execute(_Q["get_run"], {"run_id": new.run_id}).fetchone()
            else:
                row = created
                if new.owner is None:
                    conn.execute(_Q["notify_work"], {"workflow": new.workflow})
        if row is None:
            raise RunNotFound(new.run_id)
        run = self._run_record(row)
        if created is None or new.owner is None:
            return run, None
        return run, Claim(run.run_id, new.owner, run.fence, run.state_revision,
                          int(created["lease_expires_at"]), new.lease_ms)

    def get_run(self, run_id: str) -> RunRecord:
        rows = self._read("get_run", {"run_id": run_id})
        if not rows:
            raise RunNotFound(run_id)
        return self._run_record(rows[0])

    def list_runs(self, status: RunStatus | None = None, limit: int = 100) -> list[RunRecord]:
        rows = self._read("list_runs", {"status": status.value if status else None,
                                        "limit": limit})
        return [self._run_record(row) for row in rows]

    def _run_record(self, row: Row) -> RunRecord:
        key = f"run_id={row['run_id']}"

        def get(column: str) -> Any:
            return self._get_value(row[column], None, "safepoint_runs", key)

        try:
            status = RunStatus(row["status"])
        except ValueError as exc:
            raise CorruptRecord("safepoint_runs", key, f"unknown status {row['status']!r}") from exc
        return RunRecord(
            run_id=row["run_id"], workflow=row["workflow"],
            workflow_version=row["workflow_version"], status=status,
            input_hash=row["input_hash"],
            inputs=self._get_value(row["inputs"], row["inputs_ref"], "safepoint_runs", key),
            state_revision=row["state_revision"], owner=row["owner"],
            lease_expires_at=row["lease_expires_at"], fence=row["fence"],
            resume_count=row["resume_count"], event_count=row["event_count"],
            result=self._get_value(row["result"], row["result_ref"], "safepoint_runs", key),
            error=get("error"), recovery_record=get("recovery_record"),
            created_at=row["created_at"], updated_at=row["updated_at"])

    def claim_run(self, run_id: str, expected_revision: int, owner: str, lease_ms: int,
                  dead_owner: str | None = None) -> Claim | None:
        with self._transaction() as conn:
            row = conn.execute(_Q["claim_run"], {
                "run_id": run_id, "expected_revision": expected_revision, "owner": owner,
                "lease_ms": lease_ms, "dead_owner": dead_owner,
                "detail": dumps({"took_over_from": dead_owner}) if dead_owner else None,
            }).fetchone()
        return None if row is None else _claim(row, owner, lease_ms)

    def claim_next(self, owner: str, lease_ms: int, workflows: list[str]) -> Claim | None:
        with self._transaction() as conn:
            row = conn.execute(_Q["claim_next"], {
                "owner": owner, "lease_ms": lease_ms, "workflows": list(workflows)}).fetchone()
        return None if row is None else _claim(row, owner, lease_ms)

    def wait_for_work(self, timeout: float) -> None:
        """Block until a NOTIFY on ``safepoint_work`` (a run was submitted or released) or
        ``timeout`` seconds. Each thread listens on its own connection, kept between calls so
        that a notification sent while the caller was busy still wakes the next wait. Never
        raises: a broken connection is dropped (and the time slept), the next call reconnects,
        and the caller's next claim reports a server that stays away."""
        deadline = time.monotonic() + timeout
        try:
            conn = self._listener()
            for _ in conn.notifies(timeout=max(0.0, timeout), stop_after=1):
                pass
            for _ in conn.notifies(timeout=0.0):  # a burst of news is one wake-up, not many
                pass
        except (psycopg.Error, StoreError) as exc:
            self._drop_listener()
            log.warning("cannot listen for work on %s: %s", self.url, exc)
            time.sleep(max(0.0, deadline - time.monotonic()))

    def _listener(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "listener", None)
        if conn is None or conn.closed:
            conn = self._connect(autocommit=True)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(_CHANNEL)))
            self._local.listener = conn
            with self._listeners_lock:
                self._listeners.append(conn)
        return conn

    def _drop_listener(self) -> None:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "listener", None)
        self._local.listener = None
        if conn is not None:
            with self._listeners_lock:
                if conn in self._listeners:
                    self._listeners.remove(conn)
            conn.close()

    def load_ledger(self, run_id: str) -> Ledger:
        with self._transaction() as conn:  # one snapshot of the run, its steps and operations
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            run_row = conn.execute(_Q["get_run"], {"run_id": run_id}).fetchone()
            step_rows = conn.execute(_Q["steps_of_run"], {"run_id": run_id}).fetchall()
            op_rows = conn.execute(_Q["operations_of_run"], {"run_id": run_id}).fetchall()
        if run_row is None:
            raise RunNotFound(run_id)
        run = self._run_record(run_row)
        steps = {}
        for row in step_rows:
            key = f"run_id={run_id} step_id={row['step_id']}"
            try:
                kind, status = StepKind(row["kind"]), StepStatus(row["status"])
            except ValueError as exc:
                raise CorruptRecord("safepoint_steps", key,
                                    f"unknown kind or status {row['kind']!r}/{row['status']!r}"
                                    ) from exc
            steps[row["step_id"]] = StepRecord(
                run_id=run_id, step_id=row["step_id"], kind=kind, name=row["name"],
                input_hash=row["input_hash"],
                result=self._get_value(row["result"], row["result_ref"], "safepoint_steps", key),
                seq=row["seq"], status=status,
                error=self._get_value(row["error"], None, "safepoint_steps", key),
                next_step_id=row["next_step_id"], attempt=row["attempt"],
                model_id=row["model_id"], prompt_hash=row["prompt_hash"],
                observed_at=row["observed_at"], operation_id=row["operation_id"],
                fence=row["fence"], recorded_at=row["recorded_at"])
        operations = {row["operation_id"]: self._operation_record(row) for row in op_rows}
        return Ledger(run, steps, operations)

    def _operation_record(self, row: Row) -> OperationRecord:
        key = f"run_id={row['run_id']} operation_id={row['operation_id']}"
        try:
            state = EffectState(row["state"])
        except ValueError as exc:
            raise CorruptRecord("safepoint_operations", key,
                                f"unknown state {row['state']!r}") from exc
        return OperationRecord(
            run_id=row["run_id"], operation_id=row["operation_id"], step_id=row["step_id"],
            effect=row["effect"], state=state, payload_ref=row["payload_ref"],
            effect_key=row["effect_key"], dispatch_count=row["dispatch_count"],
            first_dispatched_at=row["first_dispatched_at"],
            receipt=self._get_value(row["receipt"], None, "safepoint_operations", key),
            error=self._get_value(row["error"], None, "safepoint_operations", key),
            fence=row["fence"], prepared_at=row["prepared_at"], updated_at=row["updated_at"])

    def events(self, run_id: str) -> list[EventRecord]:
        return [
            EventRecord(event_id=row["event_id"], run_id=row["run_id"], at=row["at"],
                        kind=row["kind"], step_id=row["step_id"],
                        operation_id=row["operation_id"], fence=row["fence"],
                        worker=row["worker"],
                        detail=self._get_value(row["detail"], None, "safepoint_events",
                                               f"event_id={row['event_id']}"))
            for row in self._read("events_of_run", {"run_id": run_id})]

    # -- worker writes: one statement each, fenced (see queries.sql) -----------------------------

    def _step_params(self, conn: Conn, step: StepRecord | None) -> dict[str, Any]:
        if step is None:
            return dict.fromkeys(_STEP_PARAMS)
        result, result_ref = self._put_value(conn, step.result)
        return {
            "step_id": step.step_id, "seq": step.seq, "kind": step.kind.value, "name": step.name,
            "input_hash": step.input_hash, "step_status": step.status.value, "result": result,
            "result_ref": result_ref,
            "step_error": None if step.error is None else dumps(step.error),
            "next_step_id": step.next_step_id, "attempt": step.attempt,
            "model_id": step.model_id, "prompt_hash": step.prompt_hash,
            "observed_at": step.observed_at, "step_operation_id": step.operation_id}

    def record_step(self, claim: Claim, step: StepRecord) -> None:
        with self._transaction() as conn:
            row = conn.execute(_Q["record_step"], {
                **_fenced(claim), **self._step_params(conn, step)}).fetchone()
            if row is None:
                raise LostOwnership(claim.run_id, claim.fence)

    def renew_lease(self, claim: Claim) -> None:
        with self._transaction() as conn:
            if conn.execute(_Q["renew_lease"], _fenced(claim)).fetchone() is None:
                raise LostOwnership(claim.run_id, claim.fence)

    def prepare_effect(self, claim: Claim, op: OperationRecord, payload: bytes) -> None:
        with self._transaction() as conn:
            ref = self._put_artifact(conn, payload)
            row = conn.execute(_Q["prepare_effect"], {
                **_fenced(claim), "operation_id": op.operation_id, "step_id": op.step_id,
                "effect": op.effect, "payload_ref": op.payload_ref, "effect_key": op.effect_key,
                "detail": dumps({"effect": op.effect, "payload_ref": op.payload_ref}),
            }).fetchone()
            if row is None:
                raise LostOwnership(claim.run_id, claim.fence)
            if ref != op.payload_ref:
                raise ValueError(f"payload digest {op.payload_ref} does not match its bytes")

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        with self._transaction() as conn:
            row = conn.execute(_Q["mark_dispatching"], {
                **_fenced(claim), "operation_id": operation_id}).fetchone()
            if row is None:
                raise LostOwnership(claim.run_id, claim.fence)
            if row["operation_id"] is None:
                raise StoreError(f"operation {operation_id!r} is not in a dispatchable state",
                                 run_id=claim.run_id, operation_id=operation_id)
        return self._operation_record(row)

    def record_outcome(self, claim: Claim, operation_id: str, state: EffectState, *,
                       receipt: JSON = None, error: JSON = None,
                       step: StepRecord | None = None) -> None:
        with self._transaction() as conn:
            row = conn.execute(_Q["record_outcome"], {
                **_fenced(claim), **self._step_params(conn, step),
                "operation_id": operation_id, "state": state.value,
                "receipt": None if receipt is None else dumps(receipt),
                "error": None if error is None else dumps(error),
                "event_kind": f"effect.{state.value}",
                "detail": dumps({"error": error}) if error is not None else None,
            }).fetchone()
            if row is None:
                raise LostOwnership(claim.run_id, claim.fence)
            if row["found"] is None:
                raise StoreError(f"no operation {operation_id!r} in run {claim.run_id!r}",
                                 run_id=claim.run_id, operation_id=operation_id)

    def finish_run(self, claim: Claim, status: RunStatus, *, result: JSON = None,
                   error: dict[str, Any] | None = None,
                   recovery_record: dict[str, Any] | None = None) -> None:
        record = None
        if recovery_record is not None:  # the statement puts in the revision it creates
            record = dumps({k: v for k, v in recovery_record.items() if k != "state_revision"})
        detail = error or ({"phase": recovery_record.get("phase")} if recovery_record else None)
        with self._transaction() as conn:
            result_text, result_ref = self._put_value(conn, result)
            row = conn.execute(_Q["finish_run"], {
                **_fenced(claim), "status": status.value, "result": result_text,
                "result_ref": result_ref, "error": None if error is None else dumps(error),
                "recovery_record": record, "event_kind": f"run.{status.value}",
                "detail": None if detail is None else dumps(detail)}).fetchone()
            if row is None:
                raise LostOwnership(claim.run_id, claim.fence)

    def release_run(self, claim: Claim) -> None:
        with self._transaction() as conn:
            row = conn.execute(_Q["release_run"], _fenced(claim)).fetchone()
            if row is not None:  # the run is claimable again: wake a waiting worker
                conn.execute(_Q["notify_work"], {"workflow": row["workflow"]})


_STEP_PARAMS = ("step_id", "seq", "kind", "name", "input_hash", "step_status", "result",
                "result_ref", "step_error", "next_step_id", "attempt", "model_id",
                "prompt_hash", "observed_at", "step_operation_id")


def _fenced(claim: Claim) -> dict[str, Any]:
    """The parameters every fenced statement takes."""
    return {"run_id": claim.run_id, "fence": claim.fence, "lease_ms": claim.lease_ms,
            "worker": claim.owner}


def _claim(row: Row, owner: str, lease_ms: int) -> Claim:
    return Claim(row["run_id"], owner, row["fence"], row["state_revision"],
                 row["lease_expires_at"], lease_ms)


def _redacted(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _reason(exc: BaseException) -> str:
    """A driver message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _unreachable(url: str, exc: BaseException) -> StoreError:
    reason = _reason(exc)
    return StoreUnavailable(
        f"cannot reach the PostgreSQL store at {url}: {reason}; check that the server is"
        " running and that the URL (SAFEPOINT_URL) names the right host, port, database and"
        " user", url=url, reason=reason)
