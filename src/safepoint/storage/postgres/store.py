"""The shared store: PostgreSQL, for many workers on many machines.

Concurrency rules (see the header of ``sql/postgres/queries.sql`` for the statements):
- one small ``psycopg_pool.ConnectionPool`` per store object, every connection checked on
  checkout without a round trip unless it rested a while and is wanted for a write (``pool``;
  a read is checked on failure: read again), so a restarted server costs a discarded
  connection, not a failed operation, and a step costs one round trip;
- every method is one transaction (a read, or a single fenced write, is one statement in
  autocommit), and every worker write is one statement whose first part is the fence: an
  UPDATE of the runs row conditioned on the claim's fence. The row lock it takes orders the
  write against any claim of the same run;
- "now" is the database clock (``safepoint_now_ms()``), read inside those statements, so workers
  on machines whose clocks disagree still agree on who holds a lease;
- idle workers LISTEN on the ledger's channel (``work_channel``: one per schema); a run
  submitted for workers, or released by one, NOTIFYs it in the same transaction.

What each operation does is written once, as a plan in ``ledger.PostgresLedger``, shared with
``AsyncPostgresStore`` (``safepoint.storage.postgres_async``); this module is the sync executor
of those plans.

The URL is a libpq URL plus three safepoint parameters: ``schema=name`` (tables live in that
schema, created if missing; tests use it to isolate themselves), ``durability=power_loss``, and
``prepare_threshold=N`` (statements run N times on a connection are prepared on the server;
``none``: never, behind PgBouncer's transaction pooling).

>>> store = PostgresStore("postgresql://worker@db.internal/app?schema=safepoint")  # doctest: +SKIP
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow
from psycopg_pool import ConnectionPool, PoolTimeout

from ..._rules.history import warn
from ..._rules.records import revised
from ..._rules.waking import WorkWait
from ...errors import HistoryWarning, StoreError, StoreUnavailable
from ...types import (
    JSON,
    Claim,
    Durability,
    LedgerIdentity,
    OperationRecord,
    RunStatus,
    StepRecord,
)
from ..base import INLINE_LIMIT, STOP_POLL_S, unstorable
from ..codec import Codec
from ..operations import PlanRunner
from ..plans import Plan
from ..prune import DryRun, PruneBatch, PruneRequest
from ..transactions import AlreadyRecorded, FunctionFailed, call_function
from .clock import ClockEstimate
from .connection import (
    DRIVER_ERRORS,
    PREPARE_THRESHOLD,
    dict_rows,
    listen,
    log,
    run_plan_on,
    run_plan_with,
    unreachable,
)
from .ledger import PostgresLedger
from .operations import PostgresOperations
from .pool import UNPROBED, Checkout, Discarded, Pooled, Resting, connection_lost
from .transactions import (
    COMMIT,
    Opening,
    PostgresTransaction,
    failed_function,
    lost,
    rollback,
    still_open,
    went_on_after_a_failure,
)

__all__ = ["PostgresStore"]

T = TypeVar("T")
Conn = psycopg.Connection[DictRow]


class PostgresStore(PlanRunner, PostgresOperations):
    """The ledger in a PostgreSQL database, shared by any number of workers (sync; see
    ``AsyncPostgresStore`` for asyncio)."""

    def __init__(
        self,
        url: str,
        *,
        durability: Durability | str | None = None,
        inline_limit: int = INLINE_LIMIT,
        max_connections: int = 8,
        connect_timeout: float = 5.0,
        pool_timeout: float = 10.0,
        prepare_threshold: int | None = PREPARE_THRESHOLD,
        create: bool = True,
        codec: Codec | None = None,
    ) -> None:
        self._ledger = ledger = PostgresLedger(
            url,
            durability=durability,
            inline_limit=inline_limit,
            connect_timeout=connect_timeout,
            codec=codec,
            prepare_threshold=prepare_threshold,
        )
        self.url, self.durability = ledger.url, ledger.durability
        self._local = threading.local()
        self._listeners: list[Conn] = []
        self._listeners_lock = threading.Lock()
        self._clock = ClockEstimate()
        self._resting = Resting()

        with self._connect() as conn:  # fails fast, with libpq's reason, when unreachable
            try:
                with conn.transaction():
                    run_plan_on(conn, ledger.prepare(create=create))
            except psycopg.Error as exc:
                raise ledger.migration_failure(exc) from exc
        self._pool: ConnectionPool[Pooled] = ConnectionPool(
            ledger.conninfo,
            connection_class=Pooled,
            kwargs={
                "row_factory": dict_rows,
                "autocommit": True,
                "prepare_threshold": ledger.prepare_threshold,
            },
            min_size=1,
            max_size=max_connections,
            open=False,
            configure=self._configure,
            check=self._check,
            timeout=pool_timeout,
            name=f"safepoint:{self.url}",
        )
        try:
            self._pool.open(wait=True, timeout=pool_timeout)
        except PoolTimeout as exc:
            self._pool.close()  # stop its background attempts to connect
            raise unreachable(self.url, exc) from exc

    @property
    def identity(self) -> LedgerIdentity:
        """This ledger's id (see ``Store.identity``), read when the store was opened."""
        return self._ledger.identity

    # -- the executor: connections and transactions --------------------------------------------

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        run_plan_on(conn, self._ledger.configure())
        if not conn.autocommit:
            conn.commit()
        self._resting.rested(conn)

    def _check(self, conn: Pooled) -> None:
        """The pool's check on checkout, a round trip only for a connection that rested long
        (see ``pool``); raising makes the pool drop the connection and try another."""
        verdict = self._resting.checkout(conn)
        if verdict is Checkout.DISCARD:
            conn.close()  # closed, so that the pool replaces it instead of keeping it
            raise Discarded("the server ended this idle connection")
        if verdict is Checkout.PROBE:
            ConnectionPool.check_connection(conn)

    def _connect(self, *, autocommit: bool = False) -> Conn:
        """A connection outside the pool: for migrating, and for listening."""
        try:
            conn = psycopg.Connection[DictRow].connect(
                self._ledger.conninfo,
                autocommit=autocommit,
                row_factory=dict_rows,
                # a migration is many statements in one text, which cannot be prepared
                prepare_threshold=None,
            )
        except psycopg.Error as exc:
            raise self._ledger.connect_failure(exc) from exc
        try:
            self._configure(conn)
        except psycopg.Error as exc:
            conn.close()
            raise self._ledger.setup_failure(exc) from exc
        return conn

    def _run(self, plan: Plan[T], *, atomic: bool = True) -> T:
        """One plan on a pooled connection: in one transaction, or — ``atomic=False``, for a
        plan whose every statement stands on its own (a read, or one fenced write and its
        follow-ups) — each statement committing by itself, which spares BEGIN and COMMIT their
        round trips.

        A write is never sent twice. Once its statement has left, a broken connection does not
        tell whether it committed: the server may have committed and gone away before its
        answer arrived (a backend terminated at the end of its commit even reports the
        termination for a transaction that is durable). Nor would sending it again be harmless:
        a recorded attempt would collide with itself (a unique violation, which blocks the run)
        and a model step's tokens would be counted twice. So the caller gets
        ``StoreUnavailable``, the run stays resumable, and the next claim's ``load_ledger``
        shows whether the write landed: a recorded step replays, a lost one runs again, and an
        effect's uncertainty is what the dispatch protocol settles. What makes this rare is the
        check on checkout: a connection the server already ended is discarded before anything
        is sent on it, so a restart between two steps fails no write."""
        self._ledger.check_process()
        try:
            # getconn and putconn, not the pool's connection(): its ``with conn`` commits on
            # the way out, a no-op here (autocommit, and any transaction already ended) that
            # still costs a few microseconds per operation; putconn rolls back or discards a
            # connection left in a transaction or mid-statement, as it would anyway.
            conn = self._pool.getconn()
            try:
                if not atomic:
                    return run_plan_with(conn.plans(), plan, self._ledger.routed)
                with conn.transaction():
                    return run_plan_with(conn.plans(), plan, self._ledger.routed)
            finally:
                # Stamped here, not in the pool's reset callback: with one, psycopg_pool
                # hands every returned connection to a worker thread (~0.1 ms a step).
                self._resting.rested(conn)
                self._pool.putconn(conn)
        except DRIVER_ERRORS as exc:
            raise unstorable(exc) or self._ledger.failure(
                exc, self._pool.timeout, self._pool.max_size
            ) from exc

    def _read(self, plan: Callable[[], Plan[T]], *, atomic: bool = False) -> T:
        """A plan that only reads, made by ``plan()``: run once more, on a fresh connection,
        when the server ended the session under it (a restart in the instant after checkout) —
        reading twice changes nothing. So the first attempt takes its connection unprobed
        however long it rested (``pool.UNPROBED``), and only the second is checked as a
        write's connection is."""
        unprobed = UNPROBED.set(True)
        try:
            return self._run(plan(), atomic=atomic)
        except StoreUnavailable as exc:
            if not connection_lost(exc.__cause__):
                raise
            log.info("the connection to %s was lost during a read; reading again", self.url)
        finally:
            UNPROBED.reset(unprobed)
        return self._run(plan(), atomic=atomic)

    def close(self) -> None:
        self._pool.close()
        with self._listeners_lock:
            listeners, self._listeners = self._listeners, []
        for conn in listeners:
            conn.close()
        self._local = threading.local()

    # -- the operations that do more than run one plan (the others: ``PostgresOperations``) --

    def now(self) -> int:
        """The database clock, epoch milliseconds: the one "now" of every worker (estimated
        between readings of the server's, see ``ClockEstimate``)."""
        if self._clock.due():
            before = time.time()
            server = self._read(self._ledger.now)
            self._clock.sample(server, before, time.time())
        return self._clock.now()

    def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], JSON], family_key: str | None = None
    ) -> StepRecord:
        """The function's statements and the step record in one transaction (see
        ``postgres.transactions``): one round trip more than the function's own statements."""
        self._ledger.check_process()
        failure: BaseException | None = None
        try:
            with self._pool.connection() as conn:
                try:
                    recorded, due = self._transact(conn, claim, step, body, family_key)
                except FunctionFailed as failed:  # rolled back: nothing of the function's is kept
                    failure = failed.error
                finally:
                    self._resting.rested(conn)
        except AlreadyRecorded:  # rolled back: the record an earlier attempt committed stands
            return self.load_ledger(claim.run_id).steps[step.step_id]
        except DRIVER_ERRORS as exc:
            raise unstorable(exc) or self._ledger.failure(
                exc, self._pool.timeout, self._pool.max_size
            ) from exc
        if failure is not None:
            raise failure
        warn(due)
        return recorded

    def _transact(
        self, conn: Conn, claim: Claim, step: StepRecord, body: Callable[[Any], JSON], family_key: str | None
    ) -> tuple[StepRecord, HistoryWarning | None]:
        opening = Opening(self._ledger, conn, claim, step, family_key)
        tx = PostgresTransaction(step.step_id, conn, opening)
        try:
            try:
                value = call_function(body, tx)
            except FunctionFailed:
                if opening.started and opening.refused is None and not lost(conn):
                    status = conn.info.transaction_status
                    run_plan_on(conn, still_open(status, claim.run_id, step.step_id))
                raise
            if opening.refused is not None:  # the function swallowed the fence's refusal
                raise opening.refused.error
            recorded = revised(step, result=value)
            if not opening.started:  # no statement of its own: the fenced record alone
                due = run_plan_on(conn, self._ledger.record_steps(claim, [recorded]))
                return recorded, due
            if lost(conn):
                raise psycopg.OperationalError("the connection was lost under the step's function")
            if (status := conn.info.transaction_status) != TransactionStatus.INTRANS:
                run_plan_on(conn, still_open(status, claim.run_id, step.step_id))
                raise went_on_after_a_failure(step.step_id)
            if (refused := tx.refusal()) is not None:  # refused, and swallowed by the function
                raise FunctionFailed(refused)
            with conn.pipeline():  # the check, the step and the commit: one round trip
                for stmt in self._ledger.transaction_record(claim, recorded, opening.now):
                    conn.execute(stmt.text, stmt.params)
                conn.execute(COMMIT)
        except BaseException as exc:
            rollback(conn)
            raised = failed_function(exc, conn, claim, step.step_id)
            if raised is exc:
                raise
            raise raised from None
        return recorded, opening.due

    def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None:
        # a method: the plan's ``detail`` is the ledger's own (``stop_run``), not the store's
        self._run(
            self._ledger.finish_run(
                claim, status, result=result, error=error, recovery_record=recovery_record
            )
        )

    def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        dispatched = self._run(self._ledger.mark_dispatching(claim, operation_id), atomic=False)
        if dispatched is None:  # it needs approval: the gate reads approvals, in a transaction
            dispatched = self._run(self._ledger.mark_dispatching_gated(claim, operation_id))
        op, due = dispatched
        warn(due)
        return op

    def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        try:
            return self._run(self._ledger.prune_runs(prune))
        except DryRun as dry:  # rolled back: nothing was deleted
            return dry.batch

    # -- waiting for work ----------------------------------------------------------------------

    def wait_for_work(
        self, timeout: float, stop: threading.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        """Block until a NOTIFY on the ledger's channel (a run was submitted or released) — one
        heard before ``quiet`` seconds returns at ``quiet`` — the next waiting run falls due,
        ``timeout`` seconds, or ``stop`` is set (looked at every ``STOP_POLL_S``: the socket is
        polled, nothing is sent). Each thread listens on its own connection, kept between
        calls so that a notification sent while the caller was busy still wakes the next wait.
        Never raises: a broken connection is dropped (and the time slept), the next call
        reconnects, and the caller's next claim reports a server that stays away."""
        deadline = time.monotonic() + timeout
        wait: WorkWait | None = None
        try:
            conn = self._listener()
            due_in = self._due_in()  # then the clock: the wait never ends before the due time
            wait = WorkWait.begin(time.monotonic(), timeout, quiet, due_in)
            while not (stop is not None and stop.is_set()):
                now = time.monotonic()
                if wait.rereading(now):
                    due_in = self._due_in()
                    wait.due_read(time.monotonic(), due_in)
                if now >= wait.end():
                    break
                piece = wait.next_look() - now
                if stop is not None:
                    piece = min(piece, STOP_POLL_S)
                if any(True for _ in conn.notifies(timeout=max(0.0, piece), stop_after=1)):
                    for _ in conn.notifies(timeout=0.0):  # a burst of news is one wake-up
                        pass
                    wait.news(time.monotonic())
        except (psycopg.Error, StoreError) as exc:
            self._drop_listener()
            log.warning("cannot listen for work on %s: %s", self.url, exc)
            left = max(0.0, deadline - time.monotonic())
            if stop is None:
                time.sleep(left)
            else:
                stop.wait(left)
        return wait is not None and wait.heard

    def _due_in(self) -> float | None:
        """Seconds until the next waiting run falls due (no NOTIFY announces it)."""
        return self._read(self._ledger.wait_for_work_due)

    def _listener(self) -> Conn:
        conn: Conn | None = getattr(self._local, "listener", None)
        if conn is None or conn.closed:
            conn = self._connect(autocommit=True)
            conn.execute(listen(self._ledger.work_channel))
            self._local.listener = conn
            with self._listeners_lock:
                self._listeners.append(conn)
        return conn

    def _drop_listener(self) -> None:
        conn: Conn | None = getattr(self._local, "listener", None)
        self._local.listener = None
        if conn is not None:
            with self._listeners_lock:
                if conn in self._listeners:
                    self._listeners.remove(conn)
            conn.close()
