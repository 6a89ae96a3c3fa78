"""The PostgreSQL store's logic, written once for the sync and the async store.

What each store operation does — which named queries (``sql/postgres/queries.sql``), with which
parameters, how rows become records, when to raise ``LostOwnership`` or ``StoreError`` — is a
*plan*: a generator method of ``PostgresLedger`` that yields ``Stmt`` objects and is sent back
each statement's rows. A plan performs no I/O, so it cannot block or await; an executor carries
it out in one transaction:

- ``PostgresStore`` (``postgres.py``): a ``psycopg_pool.ConnectionPool`` connection,
  ``with conn.transaction()``, and ``run_plan`` below;
- ``AsyncPostgresStore`` (``postgres_async.py``): an ``AsyncConnectionPool`` connection,
  ``async with conn.transaction()``, and ``run_plan_async``.

Both translate driver errors with ``PostgresLedger.failure`` (the original kept as
``__cause__``); anything a plan raises itself rolls the transaction back and passes unchanged.
This is the store-level twin of ``safepoint._engine.flow``, where the run logic is written once the
same way.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeAlias, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import PoolTimeout

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
from .._rules.history import history_warning, warning_due
from .._rules.recovery import refusal
from ..errors import (
    ArtifactCorrupt,
    ArtifactMissing,
    CorruptRecord,
    HistoryWarning,
    InvalidStoreURL,
    LostOwnership,
    MigrationMismatch,
    ResolutionRefused,
    RunConflict,
    RunNotFound,
    SafepointError,
    SchemaTooNew,
    StoreError,
    StoreUnavailable,
    UsageError,
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
    NO_VALUES,
    Unfetched,
    approval_record,
    event_record,
    ledger,
    listed_run,
    operation_record,
    run_record,
    stored_json,
)
from .base import (
    INLINE_LIMIT,
    NewRun,
    Replan,
    abandoned_error,
    cancelled_error,
    check_payload,
    fence_holds,
    load_migrations,
    load_queries,
    refuse_gated,
    refused_write,
    retry_json,
)

_Q = load_queries("postgres")
_OUR_PARAMETERS = ("schema", "durability")
LISTEN = sql.SQL("LISTEN {}").format(sql.Identifier("safepoint_work"))
# What an executor translates into StoreError / StoreUnavailable; anything else a plan raises
# (LostOwnership, RunNotFound, ValueError …) rolls the transaction back and passes unchanged.
DRIVER_ERRORS = (PoolTimeout, psycopg.Error, UnicodeError)

log = logging.getLogger("safepoint.store")

T = TypeVar("T")
Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement a plan asks its executor to run; the executor sends back its rows
    (an empty list for a statement that returns none)."""

    text: str | sql.Composed
    params: Mapping[str, Any] | None = None


# A plan yields statements, is sent each one's rows, and returns the operation's value.
Plan: TypeAlias = Generator[Stmt, list[Row], T]
# What a write that marks an operation dispatching returns: the operation as it now stands,
# and the soft limit's warning when the write recorded it.
Dispatched: TypeAlias = tuple[OperationRecord, HistoryWarning | None]


def _q(query: str, /, **params: Any) -> Stmt:
    return Stmt(_Q[query], params)


def run_plan(conn: psycopg.Connection[Any], plan: Plan[T]) -> T:
    """Carry out a plan's statements on ``conn`` (in whatever transaction the caller opened)."""
    try:
        stmt = next(plan)
        while True:
            cur = conn.execute(stmt.text, stmt.params)
            stmt = plan.send(cur.fetchall() if cur.description is not None else [])
    except StopIteration as done:
        result: T = done.value
        return result


class PostgresLedger:
    """Everything the two PostgreSQL stores share: the URL's meaning, and one plan per store
    operation (see the module docstring). Holds no connection."""

    identity: LedgerIdentity  # read by ``prepare``, when the store opens

    def __init__(self, url: str, *, durability: Durability | str | None = None,
                 inline_limit: int = INLINE_LIMIT, connect_timeout: float = 5.0) -> None:
        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        ours = {name: query.pop(name) for name in _OUR_PARAMETERS if name in query}
        self.url = redacted(url)
        chosen = durability or ours.get("durability") or Durability.PROCESS_CRASH
        try:
            self.durability = Durability(chosen)
        except ValueError:
            raise InvalidStoreURL(self.url, f"unknown durability {chosen!r}; use "
                                  + " or ".join(d.value for d in Durability)) from None
        self.schema = ours.get("schema") or None
        if "schema" in ours and not self.schema:
            raise InvalidStoreURL(self.url, "schema= needs a schema name")
        libpq_url = urlunsplit(parts._replace(query=urlencode(query)))
        try:
            given = conninfo_to_dict(libpq_url)
        except psycopg.ProgrammingError as exc:
            raise InvalidStoreURL(self.url, reason(exc)) from exc
        defaults: dict[str, str | int] = {"connect_timeout": max(1, round(connect_timeout)),
                                          "application_name": "safepoint"}
        self.conninfo = make_conninfo(libpq_url, **{
            key: value for key, value in defaults.items() if key not in given})
        self.inline_limit = inline_limit
        self.pid = os.getpid()

    # -- the executors' shared plumbing --------------------------------------------------------

    def check_process(self) -> None:
        if os.getpid() != self.pid:
            raise StoreError("this PostgreSQL store was opened in a parent process; open a new"
                             " store in the child (connections cannot cross a fork)")

    def failure(self, exc: BaseException, pool_timeout: float, pool_size: int) -> StoreError:
        """The StoreError for a driver error raised while running a plan (raise it ``from``
        the original, which is kept as ``__cause__``)."""
        if isinstance(exc, PoolTimeout):
            return StoreUnavailable(
                f"no usable connection to the store at {self.url} within {pool_timeout:g}s"
                f" ({reason(exc)}): the server is down or unreachable, or every one of the"
                f" {pool_size} pooled connections stayed busy; try again once it is back (or"
                " open the store with more connections)", url=self.url)
        if isinstance(exc, psycopg.OperationalError):
            return StoreUnavailable(
                f"the connection to the store at {self.url} broke during the operation"
                f" ({reason(exc)}); it may or may not have committed — try again once the"
                " server is reachable (the ledger tells which)", url=self.url)
        return StoreError(f"the store refused the operation: {reason(exc)}", url=self.url)

    def connect_failure(self, exc: psycopg.Error) -> SafepointError:
        """The error for a connection outside the pool that could not be opened."""
        if isinstance(exc, psycopg.OperationalError):
            return unreachable(self.url, exc)
        return InvalidStoreURL(self.url, reason(exc))

    def setup_failure(self, exc: psycopg.Error) -> StoreError:
        return StoreError(f"cannot prepare a connection to {self.url}: {reason(exc)}",
                          url=self.url)

    def migration_failure(self, exc: psycopg.Error) -> StoreError:
        return StoreError(
            f"cannot migrate the store at {self.url}: {reason(exc)}; check that the schema"
            " exists (or name it with ?schema=, which is created for you) and that this user"
            " may create tables in it, or run `safepoint migrate` as a user who can",
            url=self.url)

    # -- connections and migrations ------------------------------------------------------------

    def configure(self) -> Plan[None]:
        """Per-connection settings: the schema, and the stated durability. (The executor
        commits them unless the connection is in autocommit.)"""
        if self.schema:
            yield Stmt(sql.SQL("SET search_path TO {}").format(sql.Identifier(self.schema)))
        if self.durability is Durability.POWER_LOSS:
            yield _q("power_loss_durability")

    def prepare(self, *, create: bool = True) -> Plan[None]:
        """On open, in one transaction on a connection of its own: migrate, and warn when the
        server cannot keep the stated durability. ``create=False``: a schema that holds no
        ledger is refused (``UsageError``) instead of being made one — for tools that look."""
        shipped = load_migrations("postgres")
        # The common case — up to date — takes no lock and runs no DDL. Otherwise queue on the
        # advisory lock and look again: in READ COMMITTED each statement sees what concurrent
        # openers committed while this one waited.
        applied = yield from self._applied(shipped)
        if applied == 0 and not create:
            where = f"schema {self.schema!r}" if self.schema else "database"
            raise UsageError(f"no ledger at {self.url}: the {where} holds no safepoint ledger;"
                             " check --store (or SAFEPOINT_URL), or create a ledger there with"
                             " `safepoint migrate`", url=self.url)
        if applied < len(shipped):
            yield _q("migration_lock")
            if self.schema:
                yield Stmt(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                    sql.Identifier(self.schema)))
            yield _q("create_version_table")
            applied = yield from self._applied(shipped)
            for version, name, text in shipped[applied:]:
                yield Stmt(text)
                yield _q("record_migration", version=version, name=name,
                         checksum=sha256_hex(text.encode()))
        self.identity = yield from self.read_identity()
        if self.durability is Durability.POWER_LOSS:
            fsync = yield Stmt("SHOW fsync")
            if fsync and fsync[0]["fsync"] != "on":
                log.warning("durability=power_loss asked, but the server runs with"
                            " fsync=off: commits will not survive a power loss")

    @staticmethod
    def read_identity() -> Plan[LedgerIdentity]:
        rows = yield _q("ledger_identity")
        if len(rows) != 1:
            raise CorruptRecord("safepoint_ledger", "singleton", "the ledger's identity row is"
                                " missing: it is minted once, by migration 9, and never removed")
        return LedgerIdentity(str(rows[0]["ledger_id"]), int(rows[0]["keyed_since"]))

    @staticmethod
    def _applied(shipped: list[tuple[int, str, str]]) -> Plan[int]:
        found = yield _q("version_table_exists")
        if not (found and found[0]["found"]):
            return 0
        rows = yield _q("applied_migrations")
        if rows and rows[-1]["version"] > len(shipped):
            raise SchemaTooNew(rows[-1]["version"], len(shipped))
        for row in rows:
            if row["checksum"] != sha256_hex(shipped[row["version"] - 1][2].encode()):
                raise MigrationMismatch(row["version"])
        return len(rows)

    def schema_version(self) -> Plan[int]:
        rows = yield _q("schema_version")
        return int(rows[0]["version"])

    def now(self) -> Plan[int]:
        rows = yield _q("now")
        return int(rows[0]["now"])

    # -- values and artifacts ------------------------------------------------------------------

    def _stored(self, value: JSON) -> tuple[str | None, str | None, bytes | None]:
        """A JSON value as it is stored: (text, None, None) inline, or when it is large
        (None, ref, bytes): the artifact to store it in, for a statement to insert."""
        text = dumps(value)
        if len(text) <= self.inline_limit:
            return text, None, None
        data = text.encode()
        return None, content_digest(data), data

    def _put_value(self, value: JSON) -> Plan[tuple[str | None, str | None]]:
        """Store a JSON value inline, or as an artifact when it is large: (text, ref)."""
        text, ref, data = self._stored(value)
        if ref is not None and data is not None:
            yield from self._put_artifact(ref, data)
        return text, ref

    @staticmethod
    def _put_artifact(ref: str, data: bytes) -> Plan[None]:
        """Store ``data`` under ``ref``, its digest as the caller computed or checked it."""
        yield _q("insert_artifact", digest=ref, size=len(data), content=data)

    def get_artifact(self, digest: str) -> Plan[bytes]:
        rows = yield _q("get_artifact", digest=digest)
        if not rows:
            raise ArtifactMissing(digest)
        data = bytes(rows[0]["content"])
        actual = content_digest(data)
        if actual != digest:
            raise ArtifactCorrupt(digest, actual)
        return data

    def _artifact_values(self, row: Row, *columns: str,
                         listing: bool = False) -> Plan[dict[str, Any]]:
        """The stored JSON of each of these columns kept in an artifact (``<column>_ref``), read
        in the same transaction (the same snapshot in ``load_ledger``): for a listing, one that
        cannot be had is a value to show unreadable, not an error."""
        values: dict[str, Any] = {}
        for column in columns:
            ref = row[f"{column}_ref"]
            if ref is not None:
                try:
                    values[column] = yield from self.get_artifact(ref)
                except ARTIFACT_ERRORS as exc:
                    if not listing:
                        raise
                    values[column] = Unfetched(exc)
        return values

    # -- runs ----------------------------------------------------------------------------------

    def create_run(self, new: NewRun) -> Plan[tuple[RunRecord, Claim | None]]:
        inputs, inputs_ref = yield from self._put_value(new.inputs)
        created = yield _q(
            "insert_run", run_id=new.run_id, workflow=new.workflow,
            workflow_version=new.workflow_version, input_hash=new.input_hash, inputs=inputs,
            inputs_ref=inputs_ref, owner=new.owner, lease_ms=new.lease_ms,
            resume_budget=new.resume_budget, workflow_fingerprint=new.workflow_fingerprint,
            workflow_manifest=_json_or_none(new.workflow_manifest), deadline_at=new.deadline_at,
            deadline_ms=new.deadline_ms, token_budget=new.token_budget,
            cost_budget=new.cost_budget, step_attempts=retry_json(new.step_attempts),
            history_soft_limit=new.history_soft_limit,
            history_hard_limit=new.history_hard_limit,
            detail=dumps({"workflow": new.workflow, "version": new.workflow_version}))
        if created:
            row = created[0]
            if new.owner is None:
                yield _q("notify_work", workflow=new.workflow)
        else:
            row = yield from self._run_row(new.run_id)
        run = yield from self._run_record(row)
        if not created or new.owner is None:
            return run, None
        return run, Claim(run.run_id, new.owner, run.fence, run.state_revision,
                          int(row["lease_expires_at"]), new.lease_ms)

    @staticmethod
    def _run_row(run_id: str) -> Plan[Row]:
        rows = yield _q("get_run", run_id=run_id)
        if not rows:
            raise RunNotFound(run_id)
        return rows[0]

    def get_run(self, run_id: str) -> Plan[RunRecord]:
        return (yield from self._run_record((yield from self._run_row(run_id))))

    def find_run(self, run_id: str) -> Plan[RunRecord | UnreadableRun]:
        return (yield from self._listed((yield from self._run_row(run_id))))

    def list_runs(self, status: RunStatus | None,
                  limit: int) -> Plan[list[RunRecord | UnreadableRun]]:
        runs = []
        for row in (yield _q("list_runs", status=status.value if status else None, limit=limit)):
            runs.append((yield from self._listed(row)))
        return runs

    def _listed(self, row: Row) -> Plan[RunRecord | UnreadableRun]:
        return listed_run(row, (yield from self._artifact_values(row, "inputs", "result",
                                                                 listing=True)))

    def _run_record(self, row: Row) -> Plan[RunRecord]:
        return run_record(row, (yield from self._artifact_values(row, "inputs", "result")))

    @staticmethod
    def claim_run(run_id: str, expected_revision: int, owner: str, lease_ms: int,
                  dead_owner: str | None) -> Plan[Claim | None]:
        rows = yield _q("claim_run", run_id=run_id, expected_revision=expected_revision,
                        owner=owner, lease_ms=lease_ms, dead_owner=dead_owner,
                        detail=dumps({"took_over_from": dead_owner}) if dead_owner else None)
        return _claim(rows[0], owner, lease_ms) if rows else None

    @staticmethod
    def claim_next(owner: str, lease_ms: int, workflows: list[str]) -> Plan[Claim | None]:
        rows = yield _q("claim_next", owner=owner, lease_ms=lease_ms, workflows=list(workflows))
        return _claim(rows[0], owner, lease_ms) if rows else None

    def load_ledger(self, run_id: str) -> Plan[Ledger]:
        # one snapshot of the run, its steps, operations and artifacts
        yield Stmt("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        run_rows = yield _q("get_run", run_id=run_id)
        step_rows = yield _q("steps_of_run", run_id=run_id)
        op_rows = yield _q("operations_of_run", run_id=run_id)
        attempt_rows = yield _q("attempts_of_run", run_id=run_id)
        if not run_rows:
            raise RunNotFound(run_id)
        run = yield from self._run_record(run_rows[0])
        steps = []
        for row in step_rows:  # most results are inline: no generator step for them
            steps.append((row, NO_VALUES if row["result_ref"] is None
                          else (yield from self._artifact_values(row, "result"))))
        return ledger(run, steps, op_rows, attempt_rows)

    def events(self, run_id: str) -> Plan[list[EventRecord]]:
        return [event_record(row) for row in (yield _q("events_of_run", run_id=run_id))]

    # -- worker writes: one statement each, fenced (see queries.sql) ---------------------------

    @staticmethod
    def _step_params(step: StepRecord | None, result: str | None,
                     result_ref: str | None) -> dict[str, Any]:
        """A step's columns as statement parameters, its result stored as ``result`` (inline)
        or ``result_ref`` (an artifact)."""
        if step is None:
            return dict.fromkeys(_STEP_PARAMS)
        return {
            "step_id": step.step_id, "seq": step.seq, "kind": step.kind.value, "name": step.name,
            "input_hash": step.input_hash, "step_status": step.status.value, "result": result,
            "result_ref": result_ref,
            "step_error": None if step.error is None else dumps(step.error),
            "next_step_id": step.next_step_id, "attempt": step.attempt,
            "model_id": step.model_id, "prompt_hash": step.prompt_hash,
            "observed_at": step.observed_at, "step_operation_id": step.operation_id,
            "tokens": step.tokens, "cost": step.cost}

    @staticmethod
    def _fenced(claim: Claim, query: str, /, *, new_work: bool = True, limited: bool = False,
                needs_operation: bool = False, **params: Any) -> Plan[Row]:
        """Run a fenced statement: its one row. When it matched nothing, why, from the run as
        it now stands (``refused_write``): while the fence holds, ``Cancelled`` or
        ``DeadlineExceeded`` for ``new_work``, ``HistoryLimitReached`` for a write held to the
        history limit (``limited``); else ``LostOwnership``. A statement that writes only with
        its operation (``needs_operation``: ``operation_id`` in ``params``) raises ``_Unfit``
        when nothing else explains it: the caller says what the operation lacked."""
        rows = yield _q(query, run_id=claim.run_id, fence=claim.fence, lease_ms=claim.lease_ms,
                        worker=claim.owner, **params)
        if rows:
            return rows[0]
        state = yield _q("fence_state", run_id=claim.run_id,
                         operation_id=params["operation_id"] if needs_operation else None)
        row = state[0] if state else {}
        refused = refused_write(claim, row.get("fence"), row.get("status"),
                                row.get("cancel_requested_at"), row.get("deadline_at"),
                                row.get("now"), new_work=new_work, limited=limited,
                                history=row.get("history"),
                                hard_limit=row.get("history_hard_limit"))
        if (needs_operation and isinstance(refused, LostOwnership)
                and fence_holds(claim, row.get("fence"), row.get("status"))):
            raise _Unfit(bool(row["approval_required"]))
        raise refused

    @staticmethod
    def _history_warning(claim: Claim, row: Row) -> Plan[HistoryWarning | None]:
        """After a fenced write (in its transaction, or in autocommit just after it, fenced
        like it): record the soft limit's warning once it falls due, and return it, for the
        executor to issue once the write committed."""
        if not warning_due(row["history"], row["history_soft_limit"], row["history_warned_at"]):
            return None
        warned = yield _q("record_history_warning", run_id=claim.run_id, fence=claim.fence,
                          worker=claim.owner)
        if not warned:
            return None
        return history_warning(claim.run_id, warned[0]["history"],
                               warned[0]["history_soft_limit"], warned[0]["history_hard_limit"])

    def request_cancel(self, run_id: str, by: str, reason: str | None) -> Plan[RunRecord]:
        rows = yield _q("request_cancel", run_id=run_id, by=by,
                        detail=dumps({"by": by, "reason": reason}),
                        error=dumps(cancelled_error(by, reason)))
        if rows and rows[0]["status"] == RunStatus.PENDING.value:  # to settle: wake a worker
            yield _q("notify_work", workflow=rows[0]["workflow"])
        return (yield from self.get_run(run_id))

    # The worker writes return the soft limit's warning when they recorded it (see warn).

    def record_step(self, claim: Claim, step: StepRecord) -> Plan[HistoryWarning | None]:
        return (yield from self.record_steps(claim, [step]))

    def record_steps(self, claim: Claim,
                     steps: list[StepRecord]) -> Plan[HistoryWarning | None]:
        if not steps:
            return None
        batch, refs, contents = [], [], []
        for step in steps:
            result, result_ref, data = self._stored(step.result)
            if data is not None:  # inserted by the statement itself, past its fence
                refs.append(result_ref)
                contents.append(data)
            batch.append(self._step_params(step, result, result_ref))
        row = yield from self._fenced(claim, "record_steps", limited=True,
                                      steps=dumps(batch), artifact_refs=refs,
                                      artifact_contents=contents)
        return (yield from self._history_warning(claim, row))

    def record_attempt(self, claim: Claim, attempt: AttemptRecord) -> Plan[None]:
        yield from self._fenced(
            claim, "record_attempt", step_id=attempt.step_id, attempt=attempt.attempt,
            kind=attempt.kind.value, name=attempt.name, input_hash=attempt.input_hash,
            error=dumps(attempt.error), retry_at=attempt.retry_at)

    def renew_lease(self, claim: Claim) -> Plan[None]:
        yield from self._fenced(claim, "renew_lease")

    # An effect's writes are one statement each, in autocommit, but for the approval gate:
    # each statement writes only past its fence and only with its operation as it must be.

    def prepare_effect(self, claim: Claim, op: OperationRecord,
                       payload: bytes) -> Plan[HistoryWarning | None]:
        _, due = yield from self._prepare(claim, op, payload, dispatching=False)
        return due

    def prepare_and_mark_dispatching(self, claim: Claim, op: OperationRecord,
                                     payload: bytes) -> Plan[Dispatched]:
        """Both in one statement: the operation is inserted "dispatching", with both events."""
        refuse_gated(op)
        return (yield from self._prepare(claim, op, payload, dispatching=True))

    def _prepare(self, claim: Claim, op: OperationRecord, payload: bytes, *,
                 dispatching: bool) -> Plan[Dispatched]:
        check_payload(op, payload)  # before anything is sent
        row = yield from self._fenced(
            claim, "prepare_effect", limited=True, operation_id=op.operation_id,
            step_id=op.step_id, effect=op.effect, payload_ref=op.payload_ref,
            payload=payload, size=len(payload), effect_key=op.effect_key,
            approval_required=op.approval_required,
            target_digest=op.target_digest if op.approval_required else None,
            dispatching=dispatching,
            detail=dumps({"effect": op.effect, "payload_ref": op.payload_ref}),
            dispatching_detail=dumps({"dispatch": 1}) if dispatching else None)
        prepared = operation_record(row)
        return prepared, (yield from self._history_warning(claim, row))

    def mark_dispatching(self, claim: Claim, operation_id: str) -> Plan[Dispatched | None]:
        """One statement for an operation that needs no approval. None for one that does,
        having written nothing: the store runs ``mark_dispatching_gated`` instead."""
        try:
            row = yield from self._fenced(claim, "mark_dispatching", needs_operation=True,
                                          operation_id=operation_id, gate=False)
        except _Unfit as unfit:
            if unfit.gated:
                return None
            raise not_dispatchable(claim, operation_id) from None
        op = operation_record(row)
        return op, (yield from self._history_warning(claim, row))

    def mark_dispatching_gated(self, claim: Claim, operation_id: str) -> Plan[Dispatched]:
        """``mark_dispatching`` through the approval gate, run atomically: the statement takes
        the runs row lock (an approval being given queues behind it, or committed before), the
        approvals are read, and the one that authorizes the dispatch is kept on the operation
        — or the refusal rolls it all back."""
        try:
            row = yield from self._fenced(claim, "mark_dispatching", needs_operation=True,
                                          operation_id=operation_id, gate=True)
        except _Unfit:
            raise not_dispatchable(claim, operation_id) from None
        op = operation_record(row)
        if op.approval_required:  # the gate, at the dispatch's own instant: or all rolls back
            approvals = yield from self._approvals_of(claim.run_id, operation_id)
            approval = authorizing(approvals, payload_digest=op.payload_ref,
                                   target_digest=op.target_digest, now=op.updated_at)
            if approval is None:
                raise refused_dispatch(op, approvals, op.updated_at)
            yield _q("dispatch_approved", run_id=claim.run_id, operation_id=operation_id,
                     approval_id=approval.approval_id)
            op = replace(op, approval_id=approval.approval_id)
        return op, (yield from self._history_warning(claim, row))

    def record_outcome(self, claim: Claim, operation_id: str, state: EffectState, *,
                       receipt: JSON, error: JSON,
                       step: StepRecord | None) -> Plan[HistoryWarning | None]:
        result, result_ref, content = (None, None, None) if step is None else self._stored(
            step.result)
        try:
            row = yield from self._fenced(
                claim, "record_outcome", new_work=False, needs_operation=True,
                **self._step_params(step, result, result_ref), result_content=content,
                result_size=None if content is None else len(content),
                operation_id=operation_id, state=state.value,
                receipt=None if receipt is None else dumps(receipt),
                error=None if error is None else dumps(error),
                event_kind=f"effect.{state.value}",
                detail=dumps({"error": error}) if error is not None else None)
        except _Unfit:
            raise StoreError(f"no operation {operation_id!r} in run {claim.run_id!r}",
                             run_id=claim.run_id, operation_id=operation_id) from None
        return (yield from self._history_warning(claim, row))

    def finish_run(self, claim: Claim, status: RunStatus, *, result: JSON,
                   error: dict[str, Any] | None,
                   recovery_record: dict[str, Any] | None) -> Plan[None]:
        record = None
        if recovery_record is not None:  # the statement puts in the revision it creates
            record = dumps({k: v for k, v in recovery_record.items() if k != "state_revision"})
        detail = error or ({"phase": recovery_record.get("phase")} if recovery_record else None)
        result_text, result_ref = yield from self._put_value(result)
        yield from self._fenced(
            claim, "finish_run", status=status.value, result=result_text, result_ref=result_ref,
            error=None if error is None else dumps(error), recovery_record=record,
            event_kind=f"run.{status.value}", detail=None if detail is None else dumps(detail))

    def resolve(self, run_id: str, expected_revision: int,
                resolution: Resolution) -> Plan[RunRecord]:
        detail = dumps(resolution.detail())
        common = {"run_id": run_id, "expected_revision": expected_revision,
                  "operation_id": resolution.operation_id, "by": resolution.by,
                  "detail": detail}
        if resolution.action is ResolutionAction.ABANDON:
            rows = yield _q("resolve_abandon", **common,
                            error=dumps(abandoned_error(resolution)))
        else:
            rows = yield _q("resolve_operation", **common, to_state=(
                EffectState.ACCEPTED if resolution.action is ResolutionAction.APPLIED
                else EffectState.PREPARED).value,
                receipt=None if resolution.receipt is None else dumps(resolution.receipt))
            if rows:  # released: wake a waiting worker
                yield _q("notify_work", workflow=rows[0]["workflow"])
        run = yield from self.get_run(run_id)
        if not rows:
            last = yield _q("last_event", run_id=run_id)
            repeated = (bool(last) and last[0]["kind"] == "run.resolved"
                        and stored_json(last[0]["detail"], "safepoint_events",
                                        f"run_id={run_id}") == resolution.detail())
            if not repeated:  # the same decision twice is harmless; anything else is refused
                raise ResolutionRefused(run_id, refusal(run, expected_revision, resolution))
        return run

    def replan(self, claim: Claim, change: Replan) -> Plan[None]:
        yield from self._fenced(
            claim, "replan", workflow_version=change.workflow_version,
            workflow_fingerprint=change.workflow_fingerprint,
            workflow_manifest=_json_or_none(change.workflow_manifest),
            step_id=change.step_id, operation_id=None,
            detail=dumps(change.detail()))
        if change.step_id is not None:
            yield _q("abandon_steps", run_id=claim.run_id, step_id=change.step_id,
                     through_seq=change.through_seq, fence=claim.fence, worker=claim.owner,
                     reason=change.reason, keep=list(change.keep))

    def continue_as_new(self, claim: Claim,
                        successor: NewRun) -> Plan[tuple[RunRecord, Claim | None]]:
        inputs, inputs_ref = yield from self._put_value(successor.inputs)
        row = yield from self._fenced(
            claim, "continue_run", successor_run_id=successor.run_id,
            workflow=successor.workflow, workflow_version=successor.workflow_version,
            input_hash=successor.input_hash, inputs=inputs, inputs_ref=inputs_ref,
            owner=successor.owner, successor_lease_ms=successor.lease_ms,
            resume_budget=successor.resume_budget,
            history_soft_limit=successor.history_soft_limit,
            history_hard_limit=successor.history_hard_limit,
            workflow_fingerprint=successor.workflow_fingerprint,
            workflow_manifest=_json_or_none(successor.workflow_manifest),
            deadline_at=successor.deadline_at, deadline_ms=successor.deadline_ms,
            token_budget=successor.token_budget, cost_budget=successor.cost_budget,
            step_attempts=retry_json(successor.step_attempts),
            parent_detail=dumps({"successor": successor.run_id}),
            detail=dumps({"workflow": successor.workflow, "version": successor.workflow_version,
                          "continues": claim.run_id}))
        if row["successor"] is None:
            # Never our own successor: the run would have ended continued with it. Raising
            # rolls the whole statement back.
            raise RunConflict(successor.run_id, f"and does not continue run {claim.run_id!r}")
        run = yield from self.get_run(successor.run_id)
        if successor.owner is None:  # left for any worker: wake one
            yield _q("notify_work", workflow=successor.workflow)
            return run, None
        return run, Claim(run.run_id, successor.owner, run.fence, run.state_revision,
                          int(row["lease_expires_at"]), successor.lease_ms)

    def chain_operation(self, chain_id: str, operation_id: str) -> Plan[OperationRecord | None]:
        rows = yield _q("chain_operation", chain_id=chain_id, operation_id=operation_id)
        return operation_record(rows[0]) if rows else None

    @staticmethod
    def release_run(claim: Claim) -> Plan[None]:
        rows = yield _q("release_run", run_id=claim.run_id, fence=claim.fence)
        if rows:  # the run is claimable again: wake a waiting worker (a stale release: no-op)
            yield _q("notify_work", workflow=rows[0]["workflow"])

    # -- approvals (the decisions are in safepoint._rules.approvals) ---------------------------------

    def _approvals_of(self, run_id: str, operation_id: str) -> Plan[list[ApprovalRecord]]:
        rows = yield _q("approvals_of_operation", run_id=run_id, operation_id=operation_id)
        return [approval_record(row) for row in rows]

    def approvals(self, run_id: str) -> Plan[list[ApprovalRecord]]:
        rows = yield _q("approvals_of_run", run_id=run_id)
        return [approval_record(row) for row in rows]

    def reprepare_effect(self, claim: Claim, op: OperationRecord,
                         payload: bytes) -> Plan[None]:
        check_payload(op, payload)
        yield from self._put_artifact(op.payload_ref, payload)
        row = yield from self._fenced(
            claim, "reprepare_effect", operation_id=op.operation_id, step_id=op.step_id,
            payload_ref=op.payload_ref, target_digest=op.target_digest,
            detail=dumps({"effect": op.effect, "payload_ref": op.payload_ref, "revised": True}))
        if row["operation_id"] is None:
            raise StoreError(f"operation {op.operation_id!r} is no longer prepared: its payload"
                             " cannot change (it may have been sent)",
                             run_id=claim.run_id, operation_id=op.operation_id)

    def await_approval(self, claim: Claim, operation_id: str,
                       target_digest: str | None) -> Plan[ApprovalGate]:
        # The fence takes the runs row lock first: an approval being given now either
        # committed before (and is read below) or waits for this transaction to end.
        owned = yield from self._fenced(claim, "fence_new_work")
        rows = yield _q("require_approval", run_id=claim.run_id, operation_id=operation_id,
                        target_digest=target_digest)
        if not rows:
            raise StoreError(f"operation {operation_id!r} is not in a dispatchable state",
                             run_id=claim.run_id, operation_id=operation_id)
        op = operation_record(rows[0])
        approvals = yield from self._approvals_of(claim.run_id, operation_id)
        now = int(owned["now"])
        approval = authorizing(approvals, payload_digest=op.payload_ref,
                               target_digest=target_digest, now=now)
        if approval is not None:
            return ApprovalGate(approval)
        waiting = waiting_record(op, target_digest=target_digest, approvals=approvals, now=now)
        yield from self._fenced(claim, "wait_for_approval", waiting_for=dumps(waiting),
                                step_id=op.step_id, operation_id=operation_id)
        return ApprovalGate(None, waiting)

    def _step_approvals(self, run_id: str, step_id: str) -> Plan[
            tuple[RunRecord, OperationRecord | None, list[ApprovalRecord]]]:
        """The run, its row locked until the transaction ends (serialised with the gate and
        the dispatch, which take that lock first), the operation its step ``step_id``
        prepared, and that one's approvals."""
        locked = yield _q("lock_run", run_id=run_id)
        if not locked:
            raise RunNotFound(run_id)
        run = yield from self._run_record(locked[0])
        found = yield _q("operation_of_step", run_id=run_id, step_id=step_id)
        op = operation_record(found[0]) if found else None
        approvals = (yield from self._approvals_of(run_id, op.operation_id)) if op else []
        return run, op, approvals

    def approve(self, run_id: str, step_id: str,
                request: ApprovalRequest) -> Plan[ApprovalRecord]:
        run, op, approvals = yield from self._step_approvals(run_id, step_id)
        now = yield from self.now()
        new, approval, release = plan_approval(run, step_id, op, approvals, request, now)
        if new is not None:
            yield _q("insert_approval", approval_id=new.approval_id, run_id=run_id,
                     operation_id=new.operation_id, step_id=new.step_id,
                     payload_digest=new.payload_digest, target_digest=new.target_digest,
                     approved_by=new.approved_by, evidence=new.evidence,
                     approved_at=new.approved_at, expires_at=new.expires_at)
        if new is not None or release:
            yield _q("approve_run", run_id=run_id, release=release, step_id=approval.step_id,
                     operation_id=approval.operation_id, by=approval.approved_by,
                     detail=dumps(approved_detail(approval, released=release)))
            if release:  # claimable again: wake a waiting worker
                yield _q("notify_work", workflow=run.workflow)
        return approval

    def revoke_approval(self, run_id: str, step_id: str,
                        revocation: ApprovalRevocation) -> Plan[list[ApprovalRecord]]:
        # Under the runs row lock: a dispatch of this operation (whose fenced statement takes
        # the lock first) committed before — it is too late — or waits for this revocation to
        # commit, and then reads the approvals, in a later statement, as revoked.
        run, op, approvals = yield from self._step_approvals(run_id, step_id)
        now = yield from self.now()
        revoked = plan_revocation(run, step_id, op, approvals, revocation, now)
        of = revoked[0]  # never empty: plan_revocation refuses when nothing is in force
        yield _q("revoke_approvals", run_id=run_id, operation_id=of.operation_id,
                 step_id=of.step_id, now=now, revoked_by=revocation.by,
                 revoke_reason=revocation.reason, detail=dumps(revocation_detail(revoked)))
        return revoked


class _Unfit(Exception):
    """A fenced statement that writes only with its operation matched nothing because of the
    operation (the fence holds): the run has none by that id, or not as the statement needs
    it; ``gated``: the operation needs approval."""

    def __init__(self, gated: bool) -> None:
        super().__init__(gated)
        self.gated = gated


def not_dispatchable(claim: Claim, operation_id: str) -> StoreError:
    return StoreError(f"operation {operation_id!r} is not in a dispatchable state",
                      run_id=claim.run_id, operation_id=operation_id)


_STEP_PARAMS = ("step_id", "seq", "kind", "name", "input_hash", "step_status", "result",
                "result_ref", "step_error", "next_step_id", "attempt", "model_id",
                "prompt_hash", "observed_at", "step_operation_id", "tokens", "cost")


def _json_or_none(value: JSON) -> str | None:
    return None if value is None else dumps(value)


class ClockEstimate:
    """The database's clock without a round trip per reading.

    Every worker takes "now" from the database, so that leases, observations and retention
    windows agree across machines. Asking the server each time costs a round trip per read
    step; instead the offset between this machine's clock and the server's is sampled (the
    midpoint of the round trip) at most once per ``resample_s``, and a reading is this
    machine's clock plus that offset — never earlier than the last reading. Leases and every
    fenced write still use the server's own clock, in SQL.
    """

    def __init__(self, resample_s: float = 1.0) -> None:
        self.resample_s = resample_s
        self._offset_ms: float | None = None
        self._sampled_at = 0.0
        self._last = 0
        self._lock = threading.Lock()

    def due(self) -> bool:
        return self._offset_ms is None or time.monotonic() - self._sampled_at >= self.resample_s

    def sample(self, server_ms: int, before_s: float, after_s: float) -> None:
        with self._lock:
            self._offset_ms = server_ms - (before_s + after_s) * 500
            self._sampled_at = time.monotonic()

    def now(self) -> int:
        with self._lock:
            assert self._offset_ms is not None, "sample the server's clock first"
            self._last = max(self._last, round(time.time() * 1000 + self._offset_ms))
            return self._last


def _claim(row: Row, owner: str, lease_ms: int) -> Claim:
    return Claim(row["run_id"], owner, row["fence"], row["state_revision"],
                 row["lease_expires_at"], lease_ms)


def redacted(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def reason(exc: BaseException) -> str:
    """A driver message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def unreachable(url: str, exc: BaseException) -> StoreError:
    why = reason(exc)
    return StoreUnavailable(
        f"cannot reach the PostgreSQL store at {url}: {why}; check that the server is"
        " running and that the URL (SAFEPOINT_URL) names the right host, port, database and"
        " user", url=url, reason=why)
