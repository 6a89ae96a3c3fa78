"""The SQLite store's transaction steps: the user's statements and the step record in one
``BEGIN IMMEDIATE`` transaction, its fence checked first.

The write lock is held from the fence to the commit, so the function runs while every other
writer of the file waits for it (up to the busy timeout): it must be short.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from ..._rules.history import warn
from ...types import JSON, Claim, Params, StepRecord
from ..transactions import FunctionFailed, StepConnection, call_function
from .steps import SqliteSteps


class SqliteTransaction(StepConnection):
    """What a transaction step's function gets on SQLite (``types.Transaction``): statements
    with ``?`` or ``:name`` placeholders; ``sqlite3.Cursor`` back, rows as ``sqlite3.Row``."""

    dialect: Literal["sqlite", "postgres"] = "sqlite"

    def __init__(self, step_id: str, conn: sqlite3.Connection) -> None:
        super().__init__(step_id)
        self._conn = conn

    def execute(self, query: str, params: Params = None) -> sqlite3.Cursor:
        """Run one statement in the step's transaction."""
        return self._conn.execute(self._checked(query), self.params_of(params))

    def executemany(self, query: str, params_seq: Sequence[Params]) -> None:
        """Run one statement once for each set of parameters."""
        self._conn.executemany(self._checked(query), [self.params_of(p) for p in params_seq])


class SqliteTransactions(SqliteSteps):
    """Transaction steps (``Store.record_transaction``)."""

    def record_transaction(self, claim: Claim, step: StepRecord, body: Callable[[Any], JSON]) -> StepRecord:
        now = self.now()
        failure: BaseException | None = None
        try:
            with self._write() as conn:
                due = self._fence_check(conn, claim, now, events=0, step=step, new_work=True, limited=True)
                conn.text_factory = str  # the user's rows as the driver reads them
                recorded = replace(step, result=call_function(body, SqliteTransaction(step.step_id, conn)))
                self._upsert_step(conn, claim, recorded, now)
        except FunctionFailed as failed:  # rolled back: nothing of the function's is kept
            failure = failed.error
        if failure is not None:
            raise failure
        warn(due)
        return recorded
