"""The SQLite store's forks: made in one ``BEGIN IMMEDIATE`` transaction, which holds the
ledger while the source's prefix is copied (the plans are every store's:
``safepoint.storage.forks``)."""

from __future__ import annotations

from ...types import OperationRecord, RunRecord
from .. import families, forks
from ..base import ForkRun
from .connection import QUERIES, SqliteConnection


class SqliteForks(SqliteConnection):
    """A fork made, and an operation found in a run's fork ancestry."""

    def fork_run(self, fork: ForkRun) -> RunRecord:
        now = self.now()
        with self._write() as conn:
            return self._within(conn, forks.fork_run(self._reads, fork, now))

    def family_operation(self, run_id: str, family_key: str) -> OperationRecord | None:
        return self._reading(families.family_operation(QUERIES, run_id, family_key, self.codec))
