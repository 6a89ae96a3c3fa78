"""The SQLite store's transaction steps: the user's statements and the step record in one
``BEGIN IMMEDIATE`` transaction, its fence checked first.

The write lock is held from the fence to the commit, so the function runs while every other
writer of the file waits for it (up to the busy timeout): it must be short.

After the fence, the step is recorded as uncertain (``mark_transaction_step``) and a savepoint
is set. After the function, the transaction must still be open (``in_transaction``) and that
savepoint still in it (``RELEASE`` finds it): a commit or rollback ends every savepoint with the
transaction, and a transaction begun since has none of ours (a marker row could not tell: once
committed it is in the next transaction too). Otherwise the function (or a library it handed
``driver_connection()``) ended the step's transaction, and the step may have committed:
``TransactionUncertain``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Literal

from ..._rules.history import warn
from ..._rules.records import revised
from ..._rules.transactions import uncertain_record
from ...types import JSON, Claim, Params, StepRecord
from ..transactions import AlreadyRecorded, FunctionFailed, Rows, StepConnection, call_function, uncertain
from .connection import SQL
from .steps import SqliteSteps

# Set when the step's transaction began, released after the function: a commit or rollback ends
# it with the transaction, and a transaction begun since has none of this name (unless the
# function sets one itself: a name no code means by accident).
_SAVEPOINT = "safepoint_step_transaction_began"


class SqliteTransaction(StepConnection):
    """What a transaction step's function gets on SQLite (``types.Transaction``): statements
    with ``?`` or ``:name`` placeholders; rows to read back, as ``sqlite3.Row``."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, step_id: str, conn: sqlite3.Connection) -> None:
        super().__init__(step_id)
        self._conn = conn

    def execute(self, query: str, params: Params = None) -> Rows:
        """Run one statement in the step's transaction."""
        return Rows(self._conn.execute(self._checked(query), self.params_of(params)))

    def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        self._conn.executemany(self._checked(query), [self.params_of(p) for p in params_seq])

    def driver_connection(self) -> sqlite3.Connection:
        """The ``sqlite3`` connection itself, for a library that needs one: its statements run
        in the step's transaction; a commit or rollback it makes ends it, and the run then
        blocks for a person (the step may have committed)."""
        self._check_bound()
        return self._conn


class SqliteTransactions(SqliteSteps):
    """Transaction steps (``Store.record_transaction``)."""

    def record_transaction(
        self, claim: Claim, step: StepRecord, body: Callable[[Any], JSON], family_key: str | None = None
    ) -> StepRecord:
        now = self.now()
        failure: BaseException | None = None
        try:
            with self._write() as conn:
                due = self._fence_check(conn, claim, now, events=0, step=step, new_work=True, limited=True)
                marker = self._step_row(conn, claim, uncertain_record(step), now)
                if conn.execute(SQL["mark_transaction_step"], marker).rowcount != 1:
                    raise AlreadyRecorded
                self._claim_in_family(conn, claim.run_id, step.step_id, family_key)
                conn.execute(f"SAVEPOINT {_SAVEPOINT}")
                conn.text_factory = str  # the user's rows as the driver reads them
                tx = SqliteTransaction(step.step_id, conn)
                try:
                    value = call_function(body, tx)
                finally:
                    self._still_open(conn, claim, step)
                if (refused := tx.refusal()) is not None:  # refused, and swallowed by the function
                    raise FunctionFailed(refused)
                recorded = revised(step, result=value)
                self._upsert_step(conn, claim, recorded, now)
        except FunctionFailed as failed:  # rolled back: nothing of the function's is kept
            failure = failed.error
        except AlreadyRecorded:  # rolled back: the record an earlier attempt committed stands
            return self._reading(self._ledger.load_ledger(claim.run_id)).steps[step.step_id]
        if failure is not None:
            raise failure
        warn(due)
        return recorded

    @staticmethod
    def _still_open(conn: sqlite3.Connection, claim: Claim, step: StepRecord) -> None:
        """Raise ``TransactionUncertain`` unless the step's transaction is the one open."""
        if not conn.in_transaction:
            how = "after its function no transaction was open: it was committed or rolled back under the step"
        else:
            try:
                conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
                return
            except sqlite3.OperationalError:
                how = "after its function another transaction was open: the step's was ended under it"
        raise uncertain(claim.run_id, step.step_id, how)
