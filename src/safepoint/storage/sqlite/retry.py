"""The SQLite store's retry of a failed run (``Store.retry_run``): the plan every store runs
(``storage.retry``), in one ``BEGIN IMMEDIATE`` transaction — which already locks the ledger
against every other writer, a worker's and a person's alike."""

from __future__ import annotations

from ...types import RunRecord, RunRetry
from ..retry import retry_run_plan
from .runs import SqliteRuns


class SqliteRetry(SqliteRuns):
    """A failed run retried by a person."""

    def retry_run(self, run_id: str, expected_revision: int, retry: RunRetry) -> RunRecord:
        now = self.now()
        with self._write() as conn:
            self._within(conn, retry_run_plan(self._reads, run_id, expected_revision, retry, now))
            return self._read_back(run_id)
