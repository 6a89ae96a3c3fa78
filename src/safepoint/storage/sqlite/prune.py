"""The SQLite store's prune batch (``Store.prune_runs``): the plan every store runs
(``storage.prune``), in one ``BEGIN IMMEDIATE`` transaction — which already locks the ledger
against every other writer, so nothing a batch reads can change before it commits."""

from __future__ import annotations

from ..prune import DryRun, PruneBatch, PruneRequest, prune_runs_plan
from .connection import QUERIES
from .runs import SqliteRuns


class SqlitePrune(SqliteRuns):
    """Finished runs deleted whole, a batch at a time."""

    def prune_runs(self, prune: PruneRequest) -> PruneBatch:
        now = self.now()
        try:
            with self._write() as conn:
                return self._within(conn, prune_runs_plan(QUERIES, prune, now))
        except DryRun as dry:  # rolled back: nothing was deleted
            return dry.batch
