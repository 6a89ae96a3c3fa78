"""The shared store for asyncio: PostgreSQL through psycopg's ``AsyncConnectionPool``.

Same database, same statements, same semantics as ``PostgresStore``: every operation runs the
plan ``postgres.ledger.PostgresLedger`` has for it (see that module), here on an async connection in
an async transaction. Only the plumbing is this module's own: opening, the executor, and
waiting for work.

Pools must be opened inside a running event loop, so the store is opened by a coroutine::

    store = await AsyncPostgresStore.open("postgresql://worker@db.internal/app")
    ...
    await store.close()

or ``async with AsyncPostgresStore(url) as store: ...`` (``__aenter__`` opens it).

Migrations run on open, asynchronously, on a short-lived connection of their own, with the same
plan as the sync store (advisory lock included): a process that opens several stores, or
several processes opening at once, queue on that lock — awaiting it keeps the event loop free,
where a sync connection would stall every other task for as long as the queue takes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import DictRow
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from .._rules.history import warn
from .._rules.records import revised
from .._rules.waking import WorkWait
from ..errors import HistoryWarning, StoreError, StoreUnavailable, UsageError
from ..types import (
    JSON,
    Claim,
    Durability,
    LedgerIdentity,
    OperationRecord,
    RunStatus,
    StepRecord,
)
from .base import INLINE_LIMIT, unstorable
from .codec import Codec
from .operations import AsyncPlanRunner
from .plans import Plan
from .postgres.clock import ClockEstimate
from .postgres.connection import (
    DRIVER_ERRORS,
    PREPARE_THRESHOLD,
    dict_rows,
    listen,
    log,
    run_plan_on,
    run_plan_on_async,
    run_plan_with_async,
    unreachable,
)
from .postgres.ledger import PostgresLedger
from .postgres.operations import PostgresOperations
from .postgres.pool import UNPROBED, AsyncPooled, Checkout, Discarded, Resting, connection_lost
from .postgres.transactions import (
    COMMIT,
    AsyncOpening,
    AsyncPostgresTransaction,
    failed_function,
    lost,
    rollback_async,
    still_open,
    went_on_after_a_failure,
)
from .prune import DryRun, PruneBatch, PruneRequest
from .transactions import AlreadyRecorded, FunctionFailed, call_function_async

__all__ = ["AsyncPostgresStore"]

T = TypeVar("T")
AsyncConn = psycopg.AsyncConnection[DictRow]


class AsyncPostgresStore(AsyncPlanRunner, PostgresOperations):
    """The ledger in a PostgreSQL database, for asyncio programs (``AsyncStore``).

    >>> store = await AsyncPostgresStore.open("postgresql://worker@db/app")  # doctest: +SKIP
    >>> claim = await store.claim_next("worker-1", 30_000, ["triage"])  # doctest: +SKIP
    """

    def __init__(
        self,
        url: str,
        *,
        durability: Durability | str | None = None,
        inline_limit: int = INLINE_LIMIT,
        max_connections: int = 8,
        connect_timeout: float = 5.0,
        pool_timeout: float = 10.0,
        codec: Codec | None = None,
        prepare_threshold: int | None = PREPARE_THRESHOLD,
    ) -> None:
        """Read the URL only (``InvalidStoreURL`` at once); ``await store.open_pool()`` — or
        ``AsyncPostgresStore.open(url)``, or ``async with`` — connects and migrates."""
        self._clock = ClockEstimate()
        self._resting = Resting()
        self._ledger = PostgresLedger(
            url,
            durability=durability,
            inline_limit=inline_limit,
            connect_timeout=connect_timeout,
            codec=codec,
            prepare_threshold=prepare_threshold,
        )
        self.url, self.durability = self._ledger.url, self._ledger.durability
        self._pool: AsyncConnectionPool[AsyncPooled] = AsyncConnectionPool(
            self._ledger.conninfo,
            connection_class=AsyncPooled,
            kwargs={
                "row_factory": dict_rows,
                "autocommit": True,
                "prepare_threshold": self._ledger.prepare_threshold,
            },
            min_size=1,
            max_size=max_connections,
            open=False,
            configure=self._configure,
            check=self._check,
            timeout=pool_timeout,
            name=f"safepoint-async:{self.url}",
        )
        self._opened = False
        self._beat_conn: psycopg.Connection[DictRow] | None = None
        self._beat_lock = threading.Lock()
        # Waiting for work: one LISTEN connection per store, read by a background task that
        # sets ``_news``; every waiter wakes on it, and news that came while nobody waited
        # wakes the next wait at once (as a thread's listener does in the sync store).
        self._news = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._listen_lock = asyncio.Lock()

    @classmethod
    async def open(
        cls,
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
    ) -> AsyncPostgresStore:
        """Open (and migrate) the store at ``url``; call it inside the event loop that will
        use the store. ``create=False``: a schema that holds no ledger is refused
        (``UsageError``) instead of being set up as one."""
        store = cls(
            url,
            durability=durability,
            inline_limit=inline_limit,
            max_connections=max_connections,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
            codec=codec,
            prepare_threshold=prepare_threshold,
        )
        await store.open_pool(create=create)
        return store

    async def open_pool(self, *, create: bool = True) -> None:
        """Connect, migrate, and open the pool (once; later calls do nothing)."""
        if self._opened:
            return
        conn = await self._connect()  # fails fast, with libpq's reason, when unreachable
        try:
            async with conn.transaction():
                await run_plan_on_async(conn, self._ledger.prepare(create=create))
        except psycopg.Error as exc:
            raise self._ledger.migration_failure(exc) from exc
        finally:
            await conn.close()
        try:
            await self._pool.open(wait=True, timeout=self._pool.timeout)
        except PoolTimeout as exc:
            await self._pool.close()  # stop its background attempts to connect
            raise unreachable(self.url, exc) from exc
        self._opened = True

    async def __aenter__(self) -> AsyncPostgresStore:
        await self.open_pool()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def identity(self) -> LedgerIdentity:
        """This ledger's id (see ``Store.identity``), read when the store was opened."""
        return self._ledger.identity

    # -- the executor: connections and transactions --------------------------------------------

    async def _configure(self, conn: psycopg.AsyncConnection[Any]) -> None:
        await run_plan_on_async(conn, self._ledger.configure())
        if not conn.autocommit:
            await conn.commit()
        self._resting.rested(conn)

    async def _check(self, conn: AsyncPooled) -> None:
        """The pool's check on checkout (see ``PostgresStore._check``)."""
        verdict = self._resting.checkout(conn)
        if verdict is Checkout.DISCARD:
            await conn.close()
            raise Discarded("the server ended this idle connection")
        if verdict is Checkout.PROBE:
            await AsyncConnectionPool.check_connection(conn)

    async def _connect(self, *, autocommit: bool = False) -> AsyncConn:
        """A connection outside the pool: for migrating, and for listening."""
        try:
            conn = await psycopg.AsyncConnection[DictRow].connect(
                self._ledger.conninfo,
                autocommit=autocommit,
                row_factory=dict_rows,
                # a migration is many statements in one text, which cannot be prepared
                prepare_threshold=None,
            )
        except psycopg.Error as exc:
            raise self._ledger.connect_failure(exc) from exc
        try:
            await self._configure(conn)
        except psycopg.Error as exc:
            await conn.close()
            raise self._ledger.setup_failure(exc) from exc
        return conn

    async def _run(self, plan: Plan[T], *, atomic: bool = True) -> T:
        """One plan on a pooled connection: in one transaction, or — ``atomic=False``, for a
        plan whose every statement stands on its own — each statement committing by itself.
        A write is never sent twice (``PostgresStore._run`` says why)."""
        if not self._opened:
            plan.close()
            raise UsageError(
                "this AsyncPostgresStore is not open: use"
                " `await AsyncPostgresStore.open(url)` or `async with`"
            )
        self._ledger.check_process()
        try:
            conn = await self._pool.getconn()  # not connection(): see PostgresStore._run
            try:
                if not atomic:
                    return await run_plan_with_async(conn.plans(), plan, self._ledger.routed)
                async with conn.transaction():
                    return await run_plan_with_async(conn.plans(), plan, self._ledger.routed)
            finally:
                self._resting.rested(conn)  # not a reset callback (see PostgresStore._run)
                await self._pool.putconn(conn)
        except DRIVER_ERRORS as exc:
            raise unstorable(exc) or self._ledger.failure(
                exc, self._pool.timeout, self._pool.max_size
            ) from exc

    async def _read(self, plan: Callable[[], Plan[T]], *, atomic: bool = False) -> T:
        """A plan that only reads, run once more on a fresh connection when the server ended
        the session under it, the first time on a connection taken unprobed (see
        ``PostgresStore._read``)."""
        unprobed = UNPROBED.set(True)
        try:
            return await self._run(plan(), atomic=atomic)
        except StoreUnavailable as exc:
            if not connection_lost(exc.__cause__):
                raise
            log.info("the connection to %s was lost during a read; reading again", self.url)
        finally:
            UNPROBED.reset(unprobed)
        return await self._run(plan(), atomic=atomic)

    def renew_lease_blocking(self, claim: Claim) -> None:
        """The heartbeat's renewal, on a connection of its own and without the event loop:
        a loop busy in a long blocking call (a sync SDK) must not let the lease lapse, and a
        loop-bound renewal queued behind it would fire late, after the run moved on."""
        with self._beat_lock:
            try:
                if self._beat_conn is None or self._beat_conn.closed:
                    self._beat_conn = psycopg.Connection[DictRow].connect(
                        self._ledger.conninfo,
                        row_factory=dict_rows,
                        prepare_threshold=self._ledger.prepare_threshold,
                    )
                    run_plan_on(self._beat_conn, self._ledger.configure())
                    self._beat_conn.commit()
                with self._beat_conn.transaction():
                    run_plan_on(self._beat_conn, self._ledger.renew_lease(claim))
            except DRIVER_ERRORS as exc:
                if self._beat_conn is not None:
                    self._beat_conn.close()
                    self._beat_conn = None
                raise self._ledger.failure(exc, self._pool.timeout, self._pool.max_size) from exc

    async def close(self) -> None:
        with self._beat_lock:
            if self._beat_conn is not None:
                self._beat_conn.close()
                self._beat_conn = None
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.wait({reader})  # it closes its connection as it ends
        await self._pool.close()
        self._opened = False

    # -- the operations that do more than run one plan (the others: ``PostgresOperations``) --

    async def now(self) -> int:
        """The database clock, epoch milliseconds: the one "now" of every worker (estimated
        between readings of the server's, see ``ClockEstimate``)."""
        if self._clock.due():
            before = time.time()
            server = await self._read(self._ledger.now)
            self._clock.sample(server, before, time.time())
        return self._clock.now()

    async def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], Any], family_key: str | None = None
    ) -> StepRecord:
        """See ``Store.record_transaction``: ``body`` may be a coroutine function, awaited
        inside the transaction."""
        if not self._opened:
            raise UsageError(
                "this AsyncPostgresStore is not open: use"
                " `await AsyncPostgresStore.open(url)` or `async with`"
            )
        self._ledger.check_process()
        failure: BaseException | None = None
        try:
            async with self._pool.connection() as conn:
                try:
                    recorded, due = await self._transact(conn, claim, step, body, family_key)
                except FunctionFailed as failed:  # rolled back: nothing of the function's is kept
                    failure = failed.error
                finally:
                    self._resting.rested(conn)
        except AlreadyRecorded:  # rolled back: the record an earlier attempt committed stands
            return (await self.load_ledger(claim.run_id)).steps[step.step_id]
        except DRIVER_ERRORS as exc:
            raise unstorable(exc) or self._ledger.failure(
                exc, self._pool.timeout, self._pool.max_size
            ) from exc
        if failure is not None:
            raise failure
        warn(due)
        return recorded

    async def _transact(
        self,
        conn: AsyncConn,
        claim: Claim,
        step: StepRecord,
        body: Callable[[Any], Any],
        family_key: str | None,
    ) -> tuple[StepRecord, HistoryWarning | None]:
        opening = AsyncOpening(self._ledger, conn, claim, step, family_key)
        tx = AsyncPostgresTransaction(step.step_id, conn, opening)
        try:
            try:
                value = await call_function_async(body, tx)
            except FunctionFailed:
                if opening.started and opening.refused is None and not lost(conn):
                    status = conn.info.transaction_status
                    await run_plan_on_async(conn, still_open(status, claim.run_id, step.step_id))
                raise
            if opening.refused is not None:  # the function swallowed the fence's refusal
                raise opening.refused.error
            recorded = revised(step, result=value)
            if not opening.started:  # no statement of its own: the fenced record alone
                due = await run_plan_on_async(conn, self._ledger.record_steps(claim, [recorded]))
                return recorded, due
            if lost(conn):
                raise psycopg.OperationalError("the connection was lost under the step's function")
            if (status := conn.info.transaction_status) != TransactionStatus.INTRANS:
                await run_plan_on_async(conn, still_open(status, claim.run_id, step.step_id))
                raise went_on_after_a_failure(step.step_id)
            if (refused := tx.refusal()) is not None:  # refused, and swallowed by the function
                raise FunctionFailed(refused)
            async with conn.pipeline():  # the check, the step and the commit: one round trip
                for stmt in self._ledger.transaction_record(claim, recorded, opening.now):
                    await conn.execute(stmt.text, stmt.params)
                await conn.execute(COMMIT)
        except BaseException as exc:
            await rollback_async(conn)
            raised = failed_function(exc, conn, claim, step.step_id)
            if raised is exc:
                raise
            raise raised from None
        return recorded, opening.due

    async def finish_run(
        self,
        claim: Claim,
        status: RunStatus,
        *,
        result: JSON = None,
        error: dict[str, Any] | None = None,
        recovery_record: dict[str, Any] | None = None,
    ) -> None:
        # a method: the plan's ``detail`` is the ledger's own (``stop_run``), not the store's
        await self._run(
            self._ledger.finish_run(
                claim, status, result=result, error=error, recovery_record=recovery_record
            )
        )

    async def mark_dispatching(self, claim: Claim, operation_id: str) -> OperationRecord:
        dispatched = await self._run(self._ledger.mark_dispatching(claim, operation_id), atomic=False)
        if dispatched is None:  # it needs approval: the gate reads approvals, in a transaction
            dispatched = await self._run(self._ledger.mark_dispatching_gated(claim, operation_id))
        op, due = dispatched
        warn(due)
        return op

    async def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        try:
            return await self._run(self._ledger.prune_runs(prune))
        except DryRun as dry:  # rolled back: nothing was deleted
            return dry.batch

    # -- waiting for work ----------------------------------------------------------------------

    async def wait_for_work(
        self, timeout: float, stop: asyncio.Event | None = None, *, quiet: float = 0.0
    ) -> bool:
        """Wait until a NOTIFY on the ledger's channel (a run was submitted or released) — one
        heard before ``quiet`` seconds returns at ``quiet`` — the next waiting run falls due,
        ``stop`` is set, or ``timeout`` seconds, without blocking the loop. Any number of tasks
        may wait at once; a burst of news is one wake-up. Never raises: when the server cannot
        be reached the time is slept, the next call reconnects, and the caller's next claim
        reports a server that stays away."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        stopped = stop.wait if stop is not None else None
        try:
            await self._listen()
            wait = WorkWait.begin(
                loop.time(), timeout, quiet, await self._read(self._ledger.wait_for_work_due)
            )
            while not (stop is not None and stop.is_set()):
                now = loop.time()
                if wait.rereading(now):
                    due_in = await self._read(self._ledger.wait_for_work_due)
                    wait.due_read(loop.time(), due_in)
                if now >= wait.end():
                    break
                news = asyncio.ensure_future(self._news.wait())  # done at once: news came meanwhile
                await _until(wait.next_look(), news, stopped() if stopped else None)
                if news.done() and not news.cancelled():  # every task waiting saw this news
                    self._news.clear()
                    wait.news(loop.time())
        except (psycopg.Error, StoreError) as exc:
            log.warning("cannot listen for work on %s: %s", self.url, exc)
            await _until(deadline, stopped() if stopped else None)
            return False
        return wait.heard

    async def _listen(self) -> None:
        """Start the reader task unless it runs; LISTEN has been executed when this returns,
        so any notification committed afterwards wakes the caller's wait."""
        async with self._listen_lock:  # two first waiters must not open two listeners
            if self._reader is not None and not self._reader.done():
                return
            conn = await self._connect(autocommit=True)
            try:
                await conn.execute(listen(self._ledger.work_channel))
            except BaseException:
                await conn.close()
                raise
            self._reader = asyncio.get_running_loop().create_task(
                self._read_notifications(conn), name=f"safepoint-listen:{self.url}"
            )

    async def _read_notifications(self, conn: AsyncConn) -> None:
        try:
            async for _ in conn.notifies():
                self._news.set()
        except Exception as exc:  # a dead listener is dropped; the next wait reconnects
            log.warning("stopped listening for work on %s: %s", self.url, exc)
        finally:
            await conn.close()


async def _until(deadline: float, *waits: Awaitable[Any] | None) -> None:
    """Wait for the first of ``waits`` to finish, or until ``deadline`` (the loop's clock)."""
    tasks = [asyncio.ensure_future(w) for w in waits if w is not None]
    try:
        if tasks:
            await asyncio.wait(
                tasks,
                timeout=max(0.0, deadline - asyncio.get_running_loop().time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        else:
            await asyncio.sleep(max(0.0, deadline - asyncio.get_running_loop().time()))
    finally:
        for task in tasks:
            task.cancel()
