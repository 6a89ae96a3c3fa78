"""Store conformance: transaction steps (``Store.record_transaction``) — the function's writes
and the step record in one commit, the fence checked before the function is called."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ...errors import Cancelled, ClaimedInFamily, LostOwnership, TransactionUncertain, UsageError
from ...storage.base import ForkRun, Store
from ...types import Claim, RunStatus, StepKind, StepRecord, StepStatus
from ._concerns import ACROSS_RUNS, VALUES, exercises
from ._support import LARGE, SHORT_LEASE_MS, ConformanceBase, _uid, make_step

Statement = tuple[str, tuple[Any, ...]]


def statements(*stmts: Statement, then: Callable[[list[list[Any]] | None], Any] = lambda rows: rows) -> Any:
    """A step's function that runs ``stmts`` (written with ``?``, sent as ``%s`` on
    PostgreSQL) and returns ``then`` of the last one's rows (as lists) — awaited on an async
    store's connection, so the same test runs on every store."""

    def texts(tx: Any) -> list[Statement]:
        return [(q if tx.dialect == "sqlite" else q.replace("?", "%s"), p) for q, p in stmts]

    def shaped(rows: list[Any] | None) -> list[list[Any]] | None:
        return None if rows is None else [list(r.values()) if isinstance(r, dict) else list(r) for r in rows]

    def body(tx: Any) -> Any:
        if inspect.iscoroutinefunction(tx.execute):

            async def run() -> Any:
                rows = None
                for query, params in texts(tx):
                    cur = await tx.execute(query, params)
                    rows = await cur.fetchall() if cur.description is not None else None
                return then(shaped(rows))

            return run()
        rows = None
        for query, params in texts(tx):
            cur = tx.execute(query, params)
            rows = cur.fetchall() if cur.description is not None else None
        return then(shaped(rows))

    return body


def then(
    first: Callable[[Any], Any],
    last: Callable[[Any], Any],
    last_async: Callable[[Any], Awaitable[Any]],
    *,
    swallowed: tuple[type[BaseException], ...] = (),
) -> Callable[[Any], Any]:
    """A step's function that runs ``first`` (a ``statements`` function), then ``last`` with
    the step's connection — ``last_async`` on an async store's — with the errors ``swallowed``
    caught and dropped (as a careless function would)."""

    def body(tx: Any) -> Any:
        if inspect.iscoroutinefunction(tx.execute):

            async def run_async() -> None:
                await first(tx)
                with contextlib.suppress(*swallowed):
                    await last_async(tx)

            return run_async()
        first(tx)
        with contextlib.suppress(*swallowed):
            last(tx)
        return None

    return body


class TransactionTests(ConformanceBase):
    """The conformance tests of transaction steps."""

    def _table(self, store: Store, claim: Claim) -> str:
        """An application table of this test, in the ledger's database (made by a step)."""
        table = f"conformance_orders_{_uid()}"
        store.record_transaction(
            claim,
            self._step(claim, f"make.{table}", 1),
            statements((f"CREATE TABLE {table} (id TEXT NOT NULL)", ())),
        )
        return table

    @staticmethod
    def _step(claim: Claim, step_id: str, seq: int) -> StepRecord:
        return make_step(claim.run_id, step_id, seq, kind=StepKind.TRANSACTION, result=None)

    def _rows(self, store: Store, claim: Claim, table: str, seq: int) -> list[str]:
        counted = store.record_transaction(
            claim,
            self._step(claim, f"count.{seq}", seq),
            statements(
                (f"SELECT id FROM {table} ORDER BY id", ()), then=lambda rows: [r[0] for r in rows or []]
            ),
        )
        return list(counted.result)

    def test_transaction_commits_its_writes_with_its_step(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        recorded = store.record_transaction(
            claim,
            self._step(claim, "insert", 2),
            statements(
                (f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)),
                (f"SELECT count(*) FROM {table}", ()),
                then=lambda rows: {"orders": rows[0][0] if rows else None},
            ),
        )
        assert recorded.result == {"orders": 1}
        step = store.load_ledger(run.run_id).steps["insert"]
        assert (step.kind, step.status, step.result, step.fence) == (
            StepKind.TRANSACTION,
            recorded.status,
            {"orders": 1},
            claim.fence,
        )
        assert self._rows(store, claim, table, 3) == ["o-1"]
        assert store.get_run(run.run_id).step_count == 3

    @exercises(VALUES, ACROSS_RUNS)
    def test_a_large_result_is_kept_whole(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        store.record_transaction(claim, self._step(claim, "large", 1), lambda tx: {"blob": LARGE})
        assert store.load_ledger(run.run_id).steps["large"].result == {"blob": LARGE}

    def test_a_function_that_raises_commits_nothing(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        failure = ValueError("out of stock")

        def then(rows: Any) -> Any:
            raise failure

        with pytest.raises(ValueError, match="out of stock") as raised:
            store.record_transaction(
                claim,
                self._step(claim, "insert", 2),
                statements((f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)), then=then),
            )
        assert raised.value is failure
        assert "insert" not in store.load_ledger(run.run_id).steps
        assert self._rows(store, claim, table, 3) == []  # and the fence still holds

    def test_a_stale_worker_commits_nothing(self) -> None:
        """The fence is the transaction's first statement: a stale worker's function gets no
        further than its first statement (a store may send that one with the fence, in one
        round trip: it is rolled back unseen and ``LostOwnership`` raised in its place)."""
        store = self.store()
        run, stale = self.start(store, lease_ms=SHORT_LEASE_MS)
        table = self._table(store, stale)
        fresh = self.take_over(store, run.run_id)
        passed: list[bool] = []
        insert = statements(
            (f"INSERT INTO {table} (id) VALUES (?)", ("stale",)), then=lambda rows: passed.append(True)
        )

        with pytest.raises(LostOwnership):
            store.record_transaction(stale, self._step(stale, "insert", 2), insert)
        assert passed == []
        assert "insert" not in store.load_ledger(run.run_id).steps
        assert self._rows(store, fresh, table, 3) == []

    def test_no_new_transaction_once_a_cancel_is_asked_for(self) -> None:
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        store.request_cancel(run.run_id, by="ana")
        passed: list[bool] = []
        insert = statements(
            (f"INSERT INTO {table} (id) VALUES (?)", ("late",)), then=lambda rows: passed.append(True)
        )
        with pytest.raises(Cancelled):
            store.record_transaction(claim, self._step(claim, "t", 2), insert)
        with pytest.raises(Cancelled):  # a function with no statement of its own is refused too
            store.record_transaction(claim, self._step(claim, "t", 2), lambda tx: None)
        assert passed == []
        assert "t" not in store.load_ledger(run.run_id).steps
        assert store.get_run(run.run_id).status is RunStatus.RUNNING

    @pytest.mark.parametrize("how", ["commit()", "rollback()", "close()", "COMMIT", "END", "ROLLBACK"])
    def test_the_function_may_not_end_the_transaction(self, how: str) -> None:
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        insert = statements((f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)))

        async def end_async(tx: Any) -> None:
            await tx.execute(how) if how.isupper() else getattr(tx, how[:-2])()

        def end(tx: Any) -> None:
            tx.execute(how) if how.isupper() else getattr(tx, how[:-2])()

        body = then(insert, end, end_async, swallowed=(UsageError,))  # refused all the same
        with pytest.raises(UsageError, match="Nothing of it was committed"):
            store.record_transaction(claim, self._step(claim, "insert", 2), body)
        assert "insert" not in store.load_ledger(run.run_id).steps
        assert self._rows(store, claim, table, 3) == []

    @pytest.mark.parametrize("how", ["commit", "rollback"])
    def test_a_transaction_its_function_ended_is_uncertain(self, how: str) -> None:
        """The function ended the step's transaction through the driver's own connection (as a
        library it hands that connection to may): its writes may have committed without the
        step record. The store says so — ``TransactionUncertain``, never "nothing was
        committed" — and a commit leaves the step recorded as uncertain, never completed."""
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        insert = statements((f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)))

        async def end_async(tx: Any) -> None:
            await getattr(await tx.driver_connection(), how)()

        body = then(insert, lambda tx: getattr(tx.driver_connection(), how)(), end_async)
        with pytest.raises(TransactionUncertain, match="may have committed") as raised:
            store.record_transaction(claim, self._step(claim, "insert", 2), body)
        assert (raised.value.run_id, raised.value.step_id) == (run.run_id, "insert")
        step = store.load_ledger(run.run_id).steps.get("insert")
        if how == "commit":
            assert self._rows(store, claim, table, 3) == ["o-1"]
            assert step is not None
            assert (step.status, (step.error or {}).get("type")) == (
                StepStatus.FAILED,
                "TransactionUncertain",
            )
        else:
            assert self._rows(store, claim, table, 3) == []
            assert step is None

    def test_a_step_already_recorded_is_returned_not_run_again(self) -> None:
        """Asked again for a step it recorded (a commit whose answer this worker never got),
        the store returns the record and does not call the function: its writes committed once."""
        store = self.store()
        _, claim = self.start(store)
        table = self._table(store, claim)
        first = store.record_transaction(
            claim,
            self._step(claim, "insert", 2),
            statements((f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)), then=lambda rows: "first"),
        )
        passed: list[bool] = []
        again = store.record_transaction(
            claim,
            self._step(claim, "insert", 2),
            statements(
                (f"INSERT INTO {table} (id) VALUES (?)", ("o-2",)), then=lambda rows: passed.append(True)
            ),
        )
        assert (again.step_id, again.status, again.result, passed) == ("insert", first.status, "first", [])
        assert self._rows(store, claim, table, 3) == ["o-1"]

    def test_a_transaction_step_its_family_committed_is_refused_to_another_run_of_it(self) -> None:
        """A fork reaches the transaction step its source committed (one family key): the
        family's claim refuses it before the function runs (nothing written, the holder named),
        and the source's record of it stands; under another key it runs."""
        store = self.store()
        run, claim = self.start(store)
        table = self._table(store, claim)
        insert = statements((f"INSERT INTO {table} (id) VALUES (?)", ("o-1",)))
        store.record_transaction(claim, self._step(claim, "insert", 2), insert, "transaction 0 insert")
        store.finish_run(claim, RunStatus.COMPLETED, result={})
        fork = store.fork_run(ForkRun(run.run_id, "insert", f"fork-{_uid()}", by="conformance"))
        assert fork.family_id == (run.family_id or run.run_id)
        fork_claim = store.claim_run(fork.run_id, fork.state_revision, "worker-b", 60_000)
        assert fork_claim is not None
        with pytest.raises(ClaimedInFamily) as held:
            store.record_transaction(
                fork_claim, self._step(fork_claim, "insert", 2), insert, "transaction 0 insert"
            )
        assert (held.value.holder_run_id, held.value.holder_operation_id) == (run.run_id, "insert")
        assert "insert" not in store.load_ledger(fork.run_id).steps  # nothing written
        assert self._rows(store, fork_claim, table, 3) == ["o-1"]
        again = store.record_transaction(
            fork_claim,
            self._step(fork_claim, "insert", 4),
            insert,
            f"transaction 0 insert resent {fork.run_id}",
        )
        assert again.status is StepStatus.COMPLETED
        assert self._rows(store, fork_claim, table, 5) == ["o-1", "o-1"]
