"""The SQLite store's forks: made in one ``BEGIN IMMEDIATE`` transaction, which holds the
ledger while the source's prefix is copied (the plans are every store's:
``safepoint.storage.forks``)."""

from __future__ import annotations

from ...types import OperationRecord, RunRecord
from .. import forks
from ..base import ForkRun
from .connection import QUERIES, SqliteConnection


class SqliteForks(SqliteConnection):
    """A fork made, and an operation found in a run's fork ancestry."""

    def fork_run(self, fork: ForkRun) -> RunRecord:
        now = self.now()
        with self._write() as conn:
            return self._within(conn, forks.fork_run(self._reads, fork, now))

    def fork_operation(self, run_id: str, operation_id: str, chained: bool) -> OperationRecord | None:
        return self._reading(
            forks.fork_operation(QUERIES, run_id, operation_id, chained=chained, codec=self.codec)
        )
